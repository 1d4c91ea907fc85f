//! The inference driver: `generate`'s prefill and decode forwards under `torch.no_grad()`, the
//! growing KV cache (MLA's latent cache included) and its size.

use super::{find_linear, Builder, LayerParams, LIN_ZERO, P};
use crate::memory::timeline::{Category, Phase, SegKind, TensorId};
use crate::model::{Attention, AttentionKind, LinearRole, Norm, NormKind, VisionKind};
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
        if self.builds_position_ids() {
            self.position_ids(q_len);
        }
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

    /// Bytes of the model's buffers that the model modules register, made with it and alive to
    /// the end (MemTracker's `buffer`): the rotary embedding's `inv_freq` and its
    /// `original_inv_freq = nn.Buffer(inv_freq.clone())`, fp32 `[ceil(rotary_dim / 2)]` each
    /// (transformers 5.23 models/llama/modeling_llama.py `LlamaRotaryEmbedding.__init__`, the
    /// same in every family's rotary; one pair per layer type in Gemma 3,
    /// [`ModelDesc::rope_buffers_per_layer_type`]), and Gemma's `embed_scale =
    /// nn.Buffer(torch.tensor(scale))` in the weights' dtype (`*TextScaledWordEmbedding`).
    /// Measured: rnd-i71-001-olmo2 64 B (16 rotary dims), rnd-i17-018-gemma3text 34 B (8 dims,
    /// one layer type, bf16 scale). Other buffers (Falcon-H1's µP vectors, DeepSeek-V3's router
    /// bias and YaRN tables, the vision towers') are not modelled.
    ///
    /// [`ModelDesc::rope_buffers_per_layer_type`]: crate::model::ModelDesc::rope_buffers_per_layer_type
    fn buffer_bytes(&self) -> u128 {
        let rot = self
            .complex_rope_head_dim()
            .unwrap_or_else(|| self.rope_table_dim());
        let types = if self.model.rope_buffers_per_layer_type {
            let attn = || self.model.layers.iter().filter_map(|l| l.attention_block());
            let sliding = attn().any(|a| a.sliding_window.is_some());
            let full = attn().any(|a| a.sliding_window.is_none());
            u128::from(sliding) + u128::from(full)
        } else {
            1
        };
        let rope = rot.div_ceil(2) * 4 * 2 * types;
        let e = &self.model.embeddings;
        let scale = if e.scaled && e.scale_in_module {
            self.param_size
        } else {
            0
        };
        rope + scale
    }

    /// `position_ids = torch.arange(inputs_embeds.shape[1]) + past_seen_tokens`, then
    /// `.unsqueeze(0)` (int64 [1, q_len]; the arange freed once the sum exists), a local of the
    /// base model's forward until it returns (transformers 5.23 models/llama/modeling_llama.py
    /// `LlamaModel.forward`, the same lines in every family's base model). Traced with
    /// tools/truth/probes: the `aten.add` of `(27,) int64` alive at the MLP peak of
    /// rnd-i71-001-olmo2.
    pub(super) fn position_ids(&mut self, q_len: u128) -> TensorId {
        let arange = self.act(q_len * 8, false);
        let positions = self.act(q_len * 8, false);
        self.drop_(arange);
        self.out_refs.push(positions);
        positions
    }

    /// Whether the base model's forward makes its own int64 `position_ids` from the cache
    /// length (`torch.arange(q_len) + past_seen_tokens`, every family with attention in
    /// transformers 5.23). Not: OPT, whose positions come from a mask
    /// ([`Builder::positions_from_mask`] models them); Llama 4, whose rotary table models its
    /// positions (memory/hf/llama4.rs); the Qwen2-VL wrappers, which hand the language model
    /// 3-D positions of their own (models/qwen2_vl/modeling_qwen2_vl.py
    /// `compute_3d_position_ids`, not modelled); state-space models without attention.
    pub(super) fn builds_position_ids(&self) -> bool {
        let qwen_vl = self
            .model
            .vision
            .as_ref()
            .and_then(|v| v.forward.as_ref())
            .is_some_and(|f| matches!(f.kind, VisionKind::Qwen2Vl | VisionKind::Qwen25Vl));
        !self.model.embeddings.positions_from_mask
            && self.complex_rope_head_dim().is_none()
            && !qwen_vl
            && self.layer_specs().any(|l| l.attention_block().is_some())
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
        let buffers = self.buffer_bytes();
        let buffers = self.t.alloc(buffers, Category::Buffers, false);
        self.cache = vec![None; self.n_layers()];
        self.ssm_cache = vec![None; self.n_layers()];
        self.t.reset_peak();
        self.t.set_phase(Phase::Prefill);
        // `DynamicCache(config=...)`, made by generate before the prefill: every
        // `DynamicSlidingWindowLayer.__init__` keeps `torch.tensor(sliding_window,
        // dtype=torch.long)` (transformers 5.23 cache_utils.py), 8 bytes per sliding (or
        // chunked) attention layer of the whole model, alive to the end (the `lift_fresh` int64
        // scalars traced with tools/truth/probes on rnd-i17-018-gemma3text)
        let sliding_layers = self
            .model
            .layers
            .iter()
            .filter(|l| {
                l.attention_block()
                    .is_some_and(|a| a.sliding_window.is_some())
            })
            .count();
        let window_scalars = self
            .t
            .alloc(8 * sliding_layers as u128, Category::Activations, false);
        let mut ids = self.grow_ids(None, prompt);
        // `_sample`'s `unfinished_sequences = torch.ones(batch, dtype=torch.long)`, alive to
        // the end (generation/utils.py)
        let unfinished = self.t.alloc(self.batch * 8, Category::Activations, false);
        let mut logits = self.forward_of_generate(prompt);
        // `_sample`'s `next_tokens = torch.argmax(next_token_scores, dim=-1)` (int64 [batch]),
        // bound until the next step's argmax rebinds it (generation/utils.py); traced with
        // tools/truth/probes on rnd-i17-069-gemma3text: the previous step's [3] int64 alive
        // at the decode peak
        let mut next_tokens = self.argmax_tokens(None);
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
                // jump: each full-attention layer cache now holds prompt + steps - 1 tokens, each
                // sliding one as many up to its window
                let before_last = prompt + steps - 1;
                for i in 0..self.cache.len() {
                    self.seg(Some(i), SegKind::CacheJump);
                    if let Some((k, v, kept)) = self.cache[i] {
                        // state-space layers keep a fixed-size state: nothing grows
                        let Some(a) = self.spec(i).attention_block() else {
                            continue;
                        };
                        // (tokens in the storage now, tokens in it after step `steps - 1`, the
                        // tokens the layer keeps then)
                        let (now, grown, keeps) = match a.sliding_window {
                            None => (kept, before_last, before_last),
                            Some(win) => {
                                // a sliding layer's cache (cache_update) grows with the
                                // sequence until the window is full: after step s the
                                // concatenated storage holds min(prompt + s, window) tokens
                                // and its view keeps min(prompt + s, window - 1); traced on
                                // rnd-i17-069-gemma3text (window 62, 37 + 10 tokens at the
                                // last step: 47-token k/v in both sliding layers)
                                let win = u128::from(win);
                                (
                                    (prompt + 1).min(win),
                                    before_last.min(win),
                                    before_last.min(win.saturating_sub(1)),
                                )
                            }
                        };
                        if now < grown {
                            let (kb, vb) = (self.t.bytes(k), self.t.bytes(v));
                            let nk =
                                self.t
                                    .alloc(kb / now.max(1) * grown, Category::Activations, false);
                            let nv =
                                self.t
                                    .alloc(vb / now.max(1) * grown, Category::Activations, false);
                            self.drop_(k);
                            self.drop_(v);
                            self.cache[i] = Some((nk, nv, keeps));
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
            next_tokens = self.argmax_tokens(Some(next_tokens));
        }
        self.drop_(next_tokens);
        self.drop_(logits);
        self.drop_(ids);
        self.drop_(unfinished);
        self.drop_(window_scalars);
        self.drop_(buffers);
        prefill_peak
    }

    /// The greedy pick of one step: a new int64 `[batch]`, the previous one freed after it.
    fn argmax_tokens(&mut self, previous: Option<TensorId>) -> TensorId {
        let next = self.t.alloc(self.batch * 8, Category::Activations, false);
        if let Some(p) = previous {
            self.drop_(p);
        }
        next
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
