//! The inference driver: `generate`'s prefill and decode forwards under `torch.no_grad()`, the
//! growing KV cache (MLA's latent cache included) and its size.

use super::{find_linear, Builder, LayerParams, LIN_ZERO, P};
use crate::memory::timeline::{Category, Phase, SegKind, TensorId};
use crate::model::{Attention, AttentionKind, LinearRole, Norm, NormKind};
use crate::workload::KvDtype;

impl Builder<'_> {
    /// One layer's KV-cache update at inference, with a DynamicCache (transformers
    /// cache_utils.py): `DynamicLayer.update` replaces the cache by `torch.cat([cache, new])`
    /// (new storage, the old one freed); `DynamicSlidingWindowLayer.update` does the same cat,
    /// returns the full states and keeps a *view* of the last `window - 1` tokens, so the
    /// concatenated storage stays alive until the next update. MLA caches the per-head k and v,
    /// not the latent. Returns the cached keys and values (and their element sizes) that
    /// attention runs over.
    pub(super) fn cache_update(
        &mut self,
        (k, ks): (TensorId, u128),
        (v, vs): (TensorId, u128),
        kv_heads: u128,
        qk_dim: u128,
        v_dim: u128,
        a: &Attention,
    ) -> (TensorId, u128, TensorId, u128) {
        let layer = self.cur_layer;
        let prev = self.cache.get_mut(layer).and_then(Option::take);
        let kept = prev.map_or(0, |(_, _, n)| n);
        let q_len = self.seq;
        let total = kept + q_len;
        // a cache in another dtype stores converted k/v (`--kv-dtype`)
        let (ks, vs) = match self.kv_elem_bytes() {
            Some(e) => (e, e),
            None => (ks, vs),
        };
        let kc = self.op(
            self.batch * total * kv_heads * qk_dim * ks,
            &[k],
            &[],
            &[],
            &[],
        );
        // `DynamicLayer.update` rebinds `self.keys` before concatenating the values, so the
        // old keys are gone by then; the sliding layer builds both full states first.
        let prev = match (prev, a.sliding_window) {
            (Some((pk, pv, n)), None) => {
                self.drop_(pk);
                Some((None, pv, n))
            }
            (Some((pk, pv, n)), Some(_)) => Some((Some(pk), pv, n)),
            (None, _) => None,
        };
        let vc = self.op(
            self.batch * total * kv_heads * v_dim * vs,
            &[v],
            &[],
            &[],
            &[],
        );
        if let Some((pk, pv, _)) = prev {
            if let Some(pk) = pk {
                self.drop_(pk);
            }
            self.drop_(pv);
        }
        self.drop_(k);
        self.drop_(v);
        let keeps = match a.sliding_window {
            Some(win) => total.min(u128::from(win).saturating_sub(1)),
            None => total,
        };
        self.t.retain(kc);
        self.t.retain(vc);
        if let Some(slot) = self.cache.get_mut(layer) {
            *slot = Some((kc, vc, keeps));
        }
        self.kv_len = total;
        (kc, ks, vc, vs)
    }

    /// MLA at inference, transformers 5.23 `DeepseekV3Attention.forward`: the cache stores the
    /// normalised latent `kv_nope` and the rotated `k_rot` (one "head" of kv_lora_rank + rope
    /// dims); every step `expand_kv` runs `kv_b_proj` over all cached tokens and builds
    /// per-head keys in a new tensor, values as a view of the projection.
    pub(super) fn mla_infer(
        &mut self,
        a: &Attention,
        lp: &LayerParams,
        q: TensorId,
        kva: TensorId,
        np: (P, Option<P>),
    ) -> TensorId {
        let AttentionKind::Mla {
            num_heads,
            kv_lora_rank,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            ..
        } = a.kind
        else {
            return q;
        };
        let lin = |role: LinearRole| find_linear(&lp.linears, role);
        let (b, rows, c) = (self.batch, self.tokens, self.compute_size);
        let heads = u128::from(num_heads);
        let (nope, ropd, vd, kvr) = (
            u128::from(qk_nope_head_dim),
            u128::from(qk_rope_head_dim),
            u128::from(v_head_dim),
            u128::from(kv_lora_rank),
        );
        let norm = Norm {
            kind: NormKind::RmsNorm,
            dim: kv_lora_rank,
            bias: false,
        };
        let (kvn, _) = self.norm(kva, c, rows, &norm, np);
        let (kr, _) = self.rope(kva, c, (1, ropd, ropd), false, false);
        // `compressed_kv` (the kv_a_proj_with_mqa output) stays bound as a local of
        // DeepseekV3Attention.forward until it returns (modeling_deepseek_v3.py; traced on
        // torch 2.15 CPU: the [tokens, kv_lora_rank + rope] `mm` alive at rnd-i17-034's prefill
        // peak, the eager softmax)
        self.attn_locals.push(kva);
        let layer = self.cur_layer;
        let prev = self.cache.get_mut(layer).and_then(Option::take);
        let total = prev.map_or(0, |(_, _, n)| n) + self.seq;
        let kc = self.op(b * total * kvr * c, &[kvn], &[], &[], &[]);
        let rc = self.op(b * total * ropd * c, &[kr], &[], &[], &[]);
        if let Some((pk, pr, _)) = prev {
            self.drop_(pk);
            self.drop_(pr);
        }
        self.drop_(kvn);
        self.drop_(kr);
        if let Some(slot) = self.cache.get_mut(layer) {
            *slot = Some((kc, rc, total));
        }
        self.kv_len = total;
        let (qr, _) = self.rope(q, c, (heads, ropd, ropd), false, false);
        let qf = self.op(rows * heads * (nope + ropd) * c, &[q, qr], &[], &[], &[]);
        // `q_pass` (a view of the q_b_proj output) and the rotated `q_rot` stay bound as locals
        // of DeepseekV3Attention.forward until it returns (modeling_deepseek_v3.py)
        self.attn_locals.push(q);
        self.attn_locals.push(qr);
        // expand_kv over every cached token
        let kv_rows = b * total;
        let (kvb, _) = self.linear(kc, c, kv_rows, lin(LinearRole::KvB).unwrap_or(&LIN_ZERO));
        let kf = self.op(
            kv_rows * heads * (nope + ropd) * c,
            &[kvb, rc],
            &[],
            &[],
            &[],
        );
        self.q_bhsd = true;
        self.attention_core(qf, c, kf, c, kvb, c, heads, heads, nope + ropd, vd, a, lp)
    }

    /// One inference forward of `q_len` new tokens per sequence under `torch.no_grad()`
    /// (nothing is saved), with logits for the last position only (`logits_to_keep=1`) and
    /// `generate`'s fp32 copy of them (generation/utils.py `_sample`:
    /// `outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)`). Returns the logits,
    /// which the model output keeps alive until the next forward returns.
    fn infer_forward(&mut self, q_len: u128) -> TensorId {
        self.seq = q_len;
        self.tokens = self.batch * q_len;
        let rows = self.tokens;
        let (mut x, xs) = self.embeddings();
        if let Some(head_dim) = self.complex_rope_head_dim() {
            // Llama 4: one complex64 freqs_cis table of head_dim per forward, whatever the
            // first layer is (Llama4TextModel always runs its rotary embedding;
            // memory/hf/llama4.rs)
            let t = self.llama4_rope_table(head_dim);
            self.rope_tables = Some((t, t));
        } else {
            let dim = self.rope_table_dim();
            if dim > 0 {
                let sz = if self.rope_tables_fp32() {
                    4
                } else {
                    self.param_size
                };
                // [1, q_len, dim]: the positions `arange(q_len) + past`, unsqueezed, shared
                // by the batch
                self.rope_table_transient(q_len, dim);
                let cos = self.act(q_len * dim * sz, false);
                let sin = self.act(q_len * dim * sz, false);
                self.rope_tables = Some((cos, sin));
                self.out_refs.push(cos);
                self.out_refs.push(sin);
            }
        }
        let kv_total = q_len
            + self
                .cache
                .iter()
                .flatten()
                .map(|(_, _, n)| *n)
                .max()
                .unwrap_or(0);
        let mask = self.causal_mask(q_len, kv_total);
        let mut xs = xs;
        for i in 0..self.n_layers() {
            self.seg(Some(i), SegKind::Forward);
            let y = self.layer(i, x, xs, false);
            self.drop_(x);
            x = y;
            xs = self.layer_out_size(i, xs);
        }
        self.seg(None, SegKind::Fixed);
        let (fx, fs) = self.body_tail(x, xs, rows, mask);
        self.drop_image_locals();
        // the base model returns: its locals go, the causal LM keeps `hidden_states` through
        // the LM head (as in training, train.rs)
        self.drop_list(|b| &mut b.out_refs);
        // logits_to_keep=1: the LM head sees the last position of each sequence
        let v = u128::from(self.model.embeddings.vocab_size);
        let head = self.lm_head_linear();
        let c = self.compute_size;
        let (mut logits, _) = self.linear(fx, fs, self.batch, &head);
        if self.model.head.logits_fp32 && c != 4 {
            // `lm_head(...).float()` in the model's forward (Mamba2ForCausalLM)
            let l32 = self.cast(logits, self.batch * v * 4);
            self.drop_(logits);
            logits = l32;
        }
        if self.model.head.logits_scaled {
            // Granite: `logits / self.config.logits_scaling`, a new tensor
            let d = self.op(self.batch * v * c, &[logits], &[], &[], &[]);
            self.drop_(logits);
            logits = d;
        }
        if self.model.head.logit_softcap.is_some() {
            let d = self.op(self.batch * v * c, &[logits], &[], &[], &[]);
            self.drop_(logits);
            let th = self.op(self.batch * v * c, &[d], &[], &[], &[]);
            self.drop_(d);
            logits = self.op(self.batch * v * c, &[th], &[], &[], &[]);
            self.drop_(th);
        }
        self.t.retag(logits, Category::LossBuffers);
        // the causal LM's forward returns
        self.drop_(fx);
        // generate (generation/utils.py `_sample`): `next_token_logits = outputs.logits[:, -1, :]
        // .to(copy=True, dtype=torch.float32)` stays bound until the next step replaces it; the
        // model output is deleted before the next forward
        for t in std::mem::take(&mut self.block_outputs) {
            self.drop_(t);
        }
        let f32 = self
            .t
            .alloc(self.batch * v * 4, Category::LossBuffers, false);
        self.drop_(logits);
        f32
    }

    /// Bytes per cached element when `--kv-dtype` stores the cache in another dtype than the
    /// compute dtype; `None` for the compute dtype.
    fn kv_elem_bytes(&self) -> Option<u128> {
        match self.mode.infer()?.kv_dtype {
            KvDtype::Auto => None,
            KvDtype::Bf16 | KvDtype::Fp16 => Some(2),
            KvDtype::Fp8 | KvDtype::Int8 => Some(1),
        }
    }

    /// `generate`'s `input_ids` and all-ones attention mask (int64, rebuilt with `torch.cat`
    /// each step, the old ones freed after the new exist).
    fn grow_ids(&mut self, ids: Option<TensorId>, len: u128) -> TensorId {
        let new = self
            .t
            .alloc(2 * self.batch * len * 8, Category::Activations, false);
        if let Some(old) = ids {
            self.drop_(old);
        }
        new
    }

    /// Prefill of `prompt` tokens, then `new_tokens - 1` decode steps (`generate` makes its
    /// first new token from the prefill). Decode steps grow every full-attention cache by one
    /// token, so the last step dominates all earlier ones; the first decode step is where
    /// sliding-window caches shrink from the prompt's concatenation to the window. Those two
    /// steps are simulated exactly and the caches in between are jumped over.
    /// Returns the peak of the prefill alone (0 while recording segments: the fast evaluator
    /// finds it among them).
    pub(crate) fn run_inference(&mut self) -> u128 {
        let Some(w) = self.mode.infer() else { return 0 };
        let (prompt, new_tokens) = (u128::from(w.prompt), u128::from(w.new_tokens));
        // torch.no_grad(): autograd records nothing, so nothing is saved
        self.t.recording = false;
        self.build_params();
        self.cache = vec![None; self.n_layers()];
        self.ssm_cache = vec![None; self.n_layers()];
        self.t.reset_peak();
        self.t.set_phase(Phase::Prefill);
        let mut ids = self.grow_ids(None, prompt);
        // `_sample`'s `unfinished_sequences = torch.ones(batch, dtype=torch.long)`, alive to
        // the end (generation/utils.py)
        let unfinished = self.t.alloc(self.batch * 8, Category::Activations, false);
        let mut logits = self.forward_of_generate(prompt);
        // (the fast evaluator, which records segments, finds it among them)
        let prefill_peak = if self.t.segmenting() {
            0
        } else {
            self.t.peak()
        };
        self.t.set_phase(Phase::Decode);
        let steps = new_tokens.saturating_sub(1);
        // the steps simulated: the first, and the last (the ones between are jumped over)
        let simulated = [Some(1), (steps >= 2).then_some(steps)];
        for step in simulated.into_iter().flatten().filter(|&s| s <= steps) {
            if step > 2 {
                // jump: each full-attention layer cache now holds prompt + steps - 1 tokens
                let before_last = prompt + steps - 1;
                for i in 0..self.cache.len() {
                    self.seg(Some(i), SegKind::CacheJump);
                    if let Some((k, v, kept)) = self.cache[i] {
                        // state-space layers keep a fixed-size state: nothing grows
                        let full = self
                            .spec(i)
                            .attention_block()
                            .is_some_and(|a| a.sliding_window.is_none());
                        if full && kept < before_last {
                            let (kb, vb) = (self.t.bytes(k), self.t.bytes(v));
                            let nk = self.t.alloc(
                                kb / kept.max(1) * before_last,
                                Category::Activations,
                                false,
                            );
                            let nv = self.t.alloc(
                                vb / kept.max(1) * before_last,
                                Category::Activations,
                                false,
                            );
                            self.drop_(k);
                            self.drop_(v);
                            self.cache[i] = Some((nk, nv, before_last));
                        }
                    }
                }
                self.seg(None, SegKind::Fixed);
            }
            let len = prompt + step;
            ids = self.grow_ids(Some(ids), len);
            let next = self.forward_of_generate(1);
            // the previous step's fp32 logits are rebound to the new ones
            self.drop_(logits);
            logits = next;
        }
        self.drop_(logits);
        self.drop_(ids);
        self.drop_(unfinished);
        prefill_peak
    }

    /// One forward as `generate` calls it: `prepare_inputs_for_generation` hands the model
    /// `input_ids.clone(memory_format=torch.contiguous_format)` of the `q_len` new tokens
    /// (generation/utils.py `GenerationMixin.prepare_inputs_for_generation`), an int64 copy
    /// freed once the forward has returned.
    fn forward_of_generate(&mut self, q_len: u128) -> TensorId {
        let model_in = self
            .t
            .alloc(self.batch * q_len * 8, Category::Activations, false);
        let logits = self.infer_forward(q_len);
        self.drop_(model_in);
        logits
    }

    /// Bytes held by the KV cache now.
    pub(crate) fn kv_cache_bytes(&self) -> u128 {
        self.cache
            .iter()
            .flatten()
            .map(|(k, v, _)| self.t.bytes(*k) + self.t.bytes(*v))
            .chain(
                self.ssm_cache
                    .iter()
                    .flatten()
                    .map(|(c, s)| self.t.bytes(*c) + self.t.bytes(*s)),
            )
            .sum()
    }
}
