//! The attention block: projections, q/k norms, rotary embedding, the training-time cache
//! concatenation, the attention kernels (SDPA math, flash / efficient, eager) and the
//! model-level causal mask.

use super::sac::SacOp;
use super::{find_linear, Builder, CoreCall, Kernels, LayerParams, LIN_ZERO};
use crate::memory::timeline::{Category, Ids, Node, TensorId};
use crate::model::{Attention, AttentionKind, LinearRole, Norm, NormKind, QkNormScope};
use crate::workload::AttentionImpl;

impl Builder<'_> {
    /// Rotary embedding on a [rows, heads*dim] tensor (`(heads, dim, rot)`), `rot` of each head's `dim` rotated
    /// (`apply_rotary_pos_emb`, `rotate_half`): q*cos + rotate_half(q)*sin; nothing large saved.
    /// `halves`: gpt-oss's half-width form (`Attention::rope_halves`).
    pub(super) fn rope(
        &mut self,
        x: TensorId,
        x_size: u128,
        (heads, dim, rot): (u128, u128, u128),
        keep_rotated: bool,
        halves: bool,
    ) -> (TensorId, u128) {
        if self.liger() {
            return self.liger_rope(x, x_size);
        }
        let rows = self.tokens;
        // cos/sin are fp32 under autocast (computed outside autocast's matmul list): the result promotes
        let out_size = if self.amp { 4 } else { x_size };
        let full = rows * heads * dim;
        let part = rows * heads * rot;
        let (cos, sin) = self.rope_tables.unwrap_or((0, 0));
        // transients, in the order `x * cos + rotate_half(x) * sin` makes them: x*cos, then
        // the negated half and the cat (`cat((-x2, x1))`, the half freed when cat returns),
        // then cat*sin (the cat freed when the product returns), then the sum allocated
        // while both products are alive; the largest of the three moments
        // (Phi's bound `query_rot` with every dimension rotated goes the partial way: the
        // rotated tensor is a local and the query its `cat` with the empty pass-through)
        let y = if rot == dim && !keep_rotated {
            let top = if halves {
                // gpt-oss: `first_half * cos`, `second_half * sin` and their difference (three
                // halves), the two products freed; then `second_half * cos`, `first_half * sin`
                // and their sum beside `first_` (four halves), the products freed; then the
                // cat beside `first_` and `second_` (traced: tools/truth/probes/live_tensors.py
                // on rnd-s79-gptoss-0, the peak at the cat with the sub and add halves alive)
                2 * part * out_size
            } else {
                let with_neg = part * out_size + part * x_size / 2 + part * x_size;
                let with_cat = 2 * part * out_size + part * x_size;
                let with_sum = 2 * part * out_size + full * out_size;
                with_neg.max(with_cat).max(with_sum)
            };
            self.t.transient(top, Category::Activations);
            self.op(
                full * out_size,
                &[x],
                &[cos, sin],
                &[],
                &[3 * part * out_size],
            )
        } else {
            // partial rotary: rotate the first `rot` dims, then cat with the pass-through part
            let r = self.op(
                part * out_size,
                &[x],
                &[cos, sin],
                &[],
                &[3 * part * out_size],
            );
            let y = self.op(full * out_size, &[r, x], &[], &[], &[]);
            if keep_rotated {
                // bound to a local of the attention function (Phi's `query_rot`)
                self.attn_locals.push(r);
            } else {
                self.drop_(r);
            }
            y
        };
        (y, out_size)
    }

    /// ERNIE 4.5's rotation (modeling_ernie4_5.py `apply_rotary_pos_emb`, `rotate_half`): new
    /// `[S, D]` tables `cos[..., :D/2].repeat_interleave(2)` (and sin) in the tables' dtype
    /// (fp32, or FSDP2's 16-bit copies: [`Builder::rope_tables_cast`]), saved by the
    /// multiplications of q and of k; per tensor `q.float() * cos` and
    /// `stack((-x2, x1)).flatten().float() * sin` in fp32 and their fp32 sum, a local
    /// (`q_embed`, `k_embed`) until `return q_embed.to(original_dtype),
    /// k_embed.to(original_dtype)`: both sums are alive through k's rotation, both casts made
    /// before the function's locals go (the tables, then the sums), and the unrotated q and k
    /// go when the caller rebinds them (measured: h52-fsdp-mp-ernie45moe-s61-b2-s128-ckpt, the
    /// forward peak in layer 2's k rotation with q's fp32 sum alive, -1.5% when each sum was
    /// cast at once). Returns the rotated q and k (same dtypes as given).
    #[allow(clippy::too_many_arguments)]
    fn rope_fp32(
        &mut self,
        q: TensorId,
        qs: u128,
        k: TensorId,
        ks: u128,
        heads: u128,
        kv_heads: u128,
        dim: u128,
    ) -> (TensorId, TensorId) {
        let elem = if self.rope_tables_cast() {
            self.param_size
        } else {
            4
        };
        let table = self.seq * dim * elem;
        let cos = self.act(table, false);
        let sin = self.act(table, false);
        let mut sums = [q, k];
        for (slot, (x, xs, h)) in [(q, qs, heads), (k, ks, kv_heads)].into_iter().enumerate() {
            let n = self.tokens * h * dim;
            // q.float() * cos (the fp32 copy is a temporary of the expression)
            let xf = if xs != 4 {
                self.cast(x, n * 4)
            } else {
                self.retain_id(x)
            };
            let t1 = self.op(n * 4, &[xf], &[cos], &[], &[]);
            self.drop_(xf);
            // rotate_half: -x2 (half width), stack (full width), then .float() * sin
            let neg = self.op(n / 2 * xs, &[x], &[], &[], &[]);
            let st = self.op(n * xs, &[neg], &[], &[], &[]);
            self.drop_(neg);
            let rf = if xs != 4 {
                self.cast(st, n * 4)
            } else {
                self.retain_id(st)
            };
            self.drop_(st);
            let t2 = self.op(n * 4, &[rf], &[sin], &[], &[]);
            self.drop_(rf);
            sums[slot] = self.op(n * 4, &[t1, t2], &[], &[], &[]);
            self.drop_(t1);
            self.drop_(t2);
        }
        let mut out = sums;
        for (slot, (xs, h)) in [(qs, heads), (ks, kv_heads)].into_iter().enumerate() {
            let n = self.tokens * h * dim;
            out[slot] = if xs != 4 {
                self.cast(sums[slot], n * xs)
            } else {
                self.retain_id(sums[slot])
            };
        }
        self.drop_(cos);
        self.drop_(sin);
        for t in sums {
            self.drop_(t);
        }
        self.drop_(q);
        self.drop_(k);
        (out[0], out[1])
    }

    /// Cohere's `apply_rotary_pos_emb` on q and k together (models/cohere/modeling_cohere.py):
    /// `q = q.float(); k = k.float()` (locals until it returns), `q * cos + rotate_half(q) *
    /// sin` with `rotate_half = stack([-x2, x1], -1).flatten(-2)`, the same for k, then both
    /// cast back to the input dtype. `q_width`/`k_width` are elements per token.
    fn rope_upcast_qk(
        &mut self,
        q: TensorId,
        qs: u128,
        k: TensorId,
        ks: u128,
        q_width: u128,
        k_width: u128,
    ) -> (TensorId, TensorId, u128, u128) {
        let rows = self.tokens;
        let (nq, nk) = (rows * q_width, rows * k_width);
        let q32 = if qs != 4 {
            self.cast(q, nq * 4)
        } else {
            self.retain_id(q)
        };
        let k32 = if ks != 4 {
            self.cast(k, nk * 4)
        } else {
            self.retain_id(k)
        };
        let qe = self.rotate_fp32(q32, nq);
        let ke = self.rotate_fp32(k32, nk);
        let qo = if qs != 4 {
            self.cast(qe, nq * qs)
        } else {
            self.retain_id(qe)
        };
        let ko = if ks != 4 {
            self.cast(ke, nk * ks)
        } else {
            self.retain_id(ke)
        };
        for t in [q32, k32, qe, ke, q, k] {
            self.drop_(t);
        }
        (qo, ko, qs, ks)
    }

    /// Whether `a`'s rotation runs on fp32 tables that promote q and k
    /// ([`Attention::rope_promotes`]). Not with Liger's rotary kernel, nor under FSDP2's
    /// MixedPrecisionPolicy, whose `cast_forward_inputs` casts the layer's floating-point
    /// inputs, cos and sin included, to `param_dtype` at every decoder layer's pre-forward
    /// (torch 2.15 distributed/fsdp/_fully_shard/_fsdp_state.py `_pre_forward`,
    /// `_cast_forward_inputs`): the layer rotates on 16-bit copies
    /// ([`Builder::unit_cast_inputs`]).
    ///
    /// [`Attention::rope_promotes`]: crate::model::Attention::rope_promotes
    fn rope_promotes(&self, a: &Attention) -> bool {
        a.rope_promotes && !self.liger() && !self.train.shard.is_some_and(|s| s.cast_params)
    }

    /// OLMo 2's `apply_rotary_pos_emb` on fp32 tables ([`Attention::rope_promotes`];
    /// models/olmo2/modeling_olmo2.py): per tensor `q * cos` promotes to fp32 (saving cos),
    /// `rotate_half(q)` negates the upper half and concatenates in q's dtype (the half freed
    /// when the cat returns), `* sin` promotes (saving sin, the cat freed), the fp32 sum
    /// outlives the products; then `q_embed.to(q_type)` and `k_embed.to(k_type)` while both
    /// fp32 sums are alive. Traced with tools/truth/probes on rnd-i73-012-olmo2 (fp16, b5 x
    /// 190): the fp32 q and k sums and the fp16 copy alive at the peak's `aten._to_copy`.
    /// `q_width`/`k_width` are elements per token. Returns the rotated q and k (their dtypes
    /// as given).
    ///
    /// [`Attention::rope_promotes`]: crate::model::Attention::rope_promotes
    fn rope_promoted(
        &mut self,
        (q, qs): (TensorId, u128),
        (k, ks): (TensorId, u128),
        q_width: u128,
        k_width: u128,
    ) -> (TensorId, TensorId) {
        let (cos, sin) = self.rope_tables.unwrap_or((0, 0));
        let rows = self.tokens;
        let mut sums = [q, k];
        for (slot, (x, xs, n)) in [(q, qs, rows * q_width), (k, ks, rows * k_width)]
            .into_iter()
            .enumerate()
        {
            let xc = self.op(n * 4, &[x], &[cos], &[], &[]);
            let neg = self.op(n / 2 * xs, &[x], &[], &[], &[]);
            let cat = self.op(n * xs, &[neg, x], &[], &[], &[]);
            self.drop_(neg);
            let rsn = self.op(n * 4, &[cat], &[sin], &[], &[]);
            self.drop_(cat);
            sums[slot] = self.op(n * 4, &[xc, rsn], &[], &[], &[]);
            self.drop_(xc);
            self.drop_(rsn);
        }
        let [qe, ke] = sums;
        let qo = if qs != 4 {
            self.cast(qe, rows * q_width * qs)
        } else {
            self.retain_id(qe)
        };
        let ko = if ks != 4 {
            self.cast(ke, rows * k_width * ks)
        } else {
            self.retain_id(ke)
        };
        for t in [qe, ke, q, k] {
            self.drop_(t);
        }
        (qo, ko)
    }

    /// `(x * cos) + (rotate_half(x) * sin)` on an fp32 `x` of `n` elements: `x * cos` and
    /// `r * sin` save the (shared) cos/sin tables; the negated half and the stacked rotation
    /// are freed as soon as they are consumed.
    fn rotate_fp32(&mut self, x: TensorId, n: u128) -> TensorId {
        let (cos, sin) = self.rope_tables.unwrap_or((0, 0));
        let xc = self.op(n * 4, &[x], &[cos], &[], &[]);
        let neg = self.op(n * 2, &[x], &[], &[], &[]);
        let st = self.op(n * 4, &[neg, x], &[], &[], &[]);
        self.drop_(neg);
        let rsn = self.op(n * 4, &[st], &[sin], &[], &[]);
        self.drop_(st);
        let y = self.op(n * 4, &[xc, rsn], &[], &[], &[]);
        self.drop_(xc);
        self.drop_(rsn);
        y
    }

    /// Liger's `LigerRopeFunction` (Liger-Kernel 0.8.5 `ops/rope.py`): q (or k) is transposed
    /// back to its physical `[B, S, heads, D]` layout, which is contiguous for a projection's
    /// output, and rotated in place; `cos, sin` are saved. The output is the input's storage, and
    /// backward rotates the incoming gradient in place, so the gradient reaches the projection
    /// as it left attention.
    fn liger_rope(&mut self, x: TensorId, x_size: u128) -> (TensorId, u128) {
        if self.rg(x) {
            if let Some((cos, sin)) = self.rope_tables {
                self.t.record(Node {
                    saved: Ids::of(&[cos, sin]),
                    ..Node::default()
                });
            }
        }
        (self.retain_id(x), x_size)
    }

    /// The attention block. Tensors bound to locals of the attention function (the fused qkv
    /// output: Falcon's `fused_qkv`, NeoX/Phi-3 `qkv`, GPT-2's query view) live until it returns.
    pub(super) fn attention(
        &mut self,
        x: TensorId,
        x_size: u128,
        a: &Attention,
        lp: &LayerParams,
        ckpt: bool,
    ) -> TensorId {
        let y = self.attention_inner(x, x_size, a, lp, ckpt);
        self.drop_list(|b| &mut b.attn_locals);
        y
    }

    fn attention_inner(
        &mut self,
        x: TensorId,
        x_size: u128,
        a: &Attention,
        lp: &LayerParams,
        ckpt: bool,
    ) -> TensorId {
        let rows = self.tokens;
        let lin = |role: LinearRole| find_linear(&lp.linears, role);
        let c = self.compute_size;
        // the q/k norms already ran between the projections (`Attention::qk_norm_inline`)
        let mut normed_inline = false;
        let mut qkv_size = c;
        let (heads, kv_heads, qk_dim, v_dim, rot, q, k, v, qs, ks) = match a.kind {
            AttentionKind::Standard {
                num_heads,
                num_kv_heads,
                head_dim,
            } => {
                let (heads, kvh, hd) = (
                    u128::from(num_heads),
                    u128::from(num_kv_heads),
                    u128::from(head_dim),
                );
                let (q, k, v) = if let Some(qkv) = lin(LinearRole::Qkv) {
                    let (y, ys) = self.linear(x, x_size, rows, qkv);
                    // q, k, v are views in the fused output's dtype (fp32 for Falcon's biased
                    // projection under autocast, `Builder::bias_fp32`)
                    qkv_size = ys;
                    if a.kv_expanded {
                        // (before the index copies: the expanded split makes its own)
                        self.falcon_expanded_split(y, ys, (heads, kvh, hd))
                    } else if (a.kv_broadcast || a.kv_index_copies)
                        && a.eager_style == crate::model::EagerStyle::Falcon
                    {
                        // Falcon multi_query (models/falcon/modeling_falcon.py `_split_heads`):
                        // `fused_qkv[..., :-2, :]` is a view, but `fused_qkv[..., [-2], :]` and
                        // `fused_qkv[..., [-1], :]` index with a list, so the single key and
                        // value heads are new tensors (`aten.index`, whose backward keeps only
                        // the indices and scatters into a zero gradient of the fused size,
                        // derivatives.yaml `index.Tensor`). The value matmul saves that copy,
                        // not the fused output, which dies with the attention's locals (traced
                        // on torch 2.15 CPU: an `aten.index` [1, 234, 1, 64] alive at
                        // rnd-t149-014-falcon's backward peak, no [1, 234, 576] fused output;
                        // it was +1.39%, the fused output kept for its value view). The new
                        // architecture's `qkv[:, :, :, [-2]]` too, one head per key/value group
                        // (`Attention::kv_index_copies`; measured: rdist-035-falcon, one head,
                        // the value's copy alive through SDPA, forward -2.0% as a view).
                        let kv_bytes = rows * kvh * hd * ys;
                        let k = self.op(kv_bytes, &[y], &[], &[], &[]);
                        let v = self.op(kv_bytes, &[y], &[], &[], &[]);
                        self.t.retain(y);
                        self.attn_locals.push(y);
                        (y, k, v)
                    } else {
                        // q, k, v are views of the fused output; keep it alive through each
                        // view, and through the attention function (a local)
                        self.t.retain(y);
                        self.t.retain(y);
                        self.t.retain(y);
                        self.attn_locals.push(y);
                        (y, y, y)
                    }
                } else {
                    let inline = a.qk_norm_inline && !a.qk_norm_after_rope;
                    normed_inline = inline;
                    let dims = (rows, heads, kvh, hd);
                    let (q, _) =
                        self.linear(x, x_size, rows, lin(LinearRole::Q).unwrap_or(&LIN_ZERO));
                    if a.output_gate {
                        // Qwen3NextAttention.forward: `torch.chunk(q_proj(x).view(..., 2·hd))`,
                        // then `gate.reshape(*input_shape, -1)` copies the strided gate half;
                        // the query half stays a view of the projection's output
                        let g = self.op(rows * heads * hd * c, &[q], &[], &[], &[]);
                        self.attn_locals.push(g);
                        self.attn_gate = Some(g);
                    }
                    // Qwen 3 / OLMo 2: the query's norm runs before the key projection
                    // (Qwen3-Next: after the gate's copy, `self.q_norm(query_states.view(..))`
                    // rebinds the query, releasing the projection's output)
                    let (q, _) = if inline {
                        self.qk_norm(a, lp, false, (q, c), dims)
                    } else {
                        (q, c)
                    };
                    let (k, _) =
                        self.linear(x, x_size, rows, lin(LinearRole::K).unwrap_or(&LIN_ZERO));
                    let k = if a.key_scaled {
                        // FalconH1Attention.forward: `k_proj(x).view(..).transpose(1, 2) *
                        // self.key_multiplier`, a new tensor (the projection's output is freed)
                        let ks = self.op(rows * kvh * hd * c, &[k], &[], &[], &[]);
                        self.drop_(k);
                        ks
                    } else {
                        k
                    };
                    let (k, _) = if inline {
                        self.qk_norm(a, lp, true, (k, c), dims)
                    } else {
                        (k, c)
                    };
                    let (v, _) =
                        self.linear(x, x_size, rows, lin(LinearRole::V).unwrap_or(&LIN_ZERO));
                    (q, k, v)
                };
                let rot = a.rotary_dim.map_or(0, u128::from);
                // from `_split_heads` on, Falcon's new architecture has a key and a value for
                // every query head (`num_kv_heads = self.num_heads if
                // self.new_decoder_architecture`, FalconAttention.forward)
                let kvh = if a.kv_expanded { heads } else { kvh };
                (heads, kvh, hd, hd, rot, q, k, v, qkv_size, qkv_size)
            }
            AttentionKind::Mla {
                num_heads,
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
            } => {
                let heads = u128::from(num_heads);
                let nope = u128::from(qk_nope_head_dim);
                let ropd = u128::from(qk_rope_head_dim);
                let kvr = u128::from(kv_lora_rank);
                let mla_norm = |dim: u64| Norm {
                    kind: NormKind::RmsNorm,
                    dim,
                    bias: false,
                };
                let q = match q_lora_rank {
                    Some(r) => {
                        let (qa, _) =
                            self.linear(x, x_size, rows, lin(LinearRole::QA).unwrap_or(&LIN_ZERO));
                        let np = (lp.mla_norms[0], None);
                        // (the norm's output is fp32 under autocast: `weight * x.to(dtype)`
                        // with the fp32 weight; the next linear casts it, see `Builder::norm`)
                        let (qn, qns) = self.norm(qa, c, rows, &mla_norm(r), np);
                        self.drop_(qa);
                        let (qb, _) =
                            self.linear(qn, qns, rows, lin(LinearRole::QB).unwrap_or(&LIN_ZERO));
                        self.drop_(qn);
                        qb
                    }
                    None => {
                        self.linear(x, x_size, rows, lin(LinearRole::Q).unwrap_or(&LIN_ZERO))
                            .0
                    }
                };
                let (kva, _) =
                    self.linear(x, x_size, rows, lin(LinearRole::KvA).unwrap_or(&LIN_ZERO));
                // split: latent part normalised, rope part rotated and expanded to all heads
                let np = (lp.mla_norms[lp.mla_norms.len() - 1], None);
                if self.mode.is_infer() {
                    return self.mla_infer(a, lp, q, kva, np);
                }
                // DeepseekV3Attention.forward (models/deepseek_v3/modeling_deepseek_v3.py,
                // transformers 5.23), in its order: `compressed_kv` and `q_states` (its
                // `q_pass` view) stay bound until it returns (as in `mla_infer`); the latent
                // part is normalised, then the query's and the key's rotary parts rotated
                // (`q_rot`, `k_rot`, new tensors, locals until return)
                let (kvn, kvns) = self.norm(kva, c, rows, &mla_norm(kv_lora_rank), np);
                self.attn_locals.push(kva);
                let (qr, qrs) = self.rope(q, c, (heads, ropd, ropd), false, false);
                let (kr, krs) = self.rope(kva, c, (1, ropd, ropd), false, false);
                self.attn_locals.push(q);
                self.attn_locals.push(qr);
                // A training forward with `use_cache` on (no checkpointing) builds a DynamicCache:
                // `past_key_values.update(kv_nope, k_rot)` concatenates both latents into it
                // (cache_utils.py DynamicLayer.update: `torch.cat` onto an empty tensor of the
                // first one's dtype) and rebinds the names to the cache's copies, which the model
                // output keeps until it is dropped; kv_b_proj then saves the latent's copy, and the
                // normalised latent and the rotated key go
                // (tools/truth/probes/h51_live_storages.py, torch 2.15 CPU: rnd-s197-deepseekv3-0
                // b2 × 30, the [2, 1, 30, 17] and [2, 1, 30, 16] `cat`s alive at the end of the
                // forward, the norm's output and the first rotated key freed; its forward and loss
                // phases were 5,760 B short per layer with the value copy)
                let cache =
                    !ckpt && self.mode.use_cache(self.model) && !self.mode.kernels().padding_free;
                let (kvn, kr) = if cache {
                    let kc = self.op(rows * kvr * kvns, &[kvn], &[], &[], &[]);
                    let rc = self.op(rows * ropd * kvns.max(krs), &[kr], &[], &[], &[]);
                    self.drop_(kvn);
                    self.drop_(kr);
                    self.t.retain(kc);
                    self.t.retain(rc);
                    self.cache_refs.push(kc);
                    self.cache_refs.push(rc);
                    (kc, rc)
                } else {
                    (kvn, kr)
                };
                // `kv_nope` and `k_rot` are locals until return too
                self.attn_locals.push(kvn);
                self.attn_locals.push(kr);
                // q = cat(q_pass, q_rot), promoted to the rotated part's dtype (fp32 under
                // autocast, with the fp32 rotary tables)
                let qfs = c.max(qrs);
                let qf = self.op(rows * heads * (nope + ropd) * qfs, &[q, qr], &[], &[], &[]);
                // expand_kv: kv_b_proj over the latent, then `new_empty` in its dtype with
                // k_nope and the expanded k_rot copied in
                let (kvb, kvbs) =
                    self.linear(kvn, kvns, rows, lin(LinearRole::KvB).unwrap_or(&LIN_ZERO));
                let kf = self.op(
                    rows * heads * (nope + ropd) * kvbs,
                    &[kvb, kr],
                    &[],
                    &[],
                    &[],
                );
                (
                    heads,
                    heads,
                    nope + ropd,
                    u128::from(v_head_dim),
                    0,
                    qf,
                    kf,
                    kvb,
                    qfs,
                    kvbs,
                )
            }
        };
        // q/k norms (Qwen3, Gemma 3 per head; OLMo 2 over the whole projection), before the
        // rotation or, in HunYuan, after it
        let (mut q, mut k, mut qs, mut ks) = (q, k, qs, ks);
        let norm_dims = (rows, heads, kv_heads, qk_dim);
        if !a.qk_norm_after_rope && !normed_inline {
            (q, k, qs, ks) = self.qk_norms(a, lp, (q, qs), (k, ks), norm_dims);
        }
        let v = if a.clip_qkv {
            q = self.clamp_in_place(q, rows * heads * qk_dim, qs);
            k = self.clamp_in_place(k, rows * kv_heads * qk_dim, ks);
            self.clamp_in_place(v, rows * kv_heads * v_dim, c)
        } else {
            v
        };
        self.q_bhsd = matches!(a.kind, AttentionKind::Mla { .. })
            || (rot > 0 && (rot < qk_dim || a.rope_concat));
        if a.rope_complex {
            let (q2, k2) = self.llama4_qk((q, k), qs, (heads, kv_heads, qk_dim), a);
            self.drop_(q);
            self.drop_(k);
            (q, k) = (q2, k2);
        } else if rot > 0 && a.rope_fp32 {
            (q, k) = self.rope_fp32(q, qs, k, ks, heads, kv_heads, qk_dim);
        } else if rot > 0 && a.rope_upcast_qk {
            (q, k, qs, ks) = self.rope_upcast_qk(q, qs, k, ks, heads * qk_dim, kv_heads * qk_dim);
        } else if rot == qk_dim && self.rope_promotes(a) && (qs != 4 || ks != 4) {
            (q, k) = self.rope_promoted((q, qs), (k, ks), heads * qk_dim, kv_heads * qk_dim);
        } else if rot > 0 {
            let keep = a.rope_locals;
            let (q2, s2) = self.rope(q, qs, (heads, qk_dim, rot), keep, a.rope_halves);
            let (k2, s3) = self.rope(k, ks, (kv_heads, qk_dim, rot), keep, a.rope_halves);
            if keep {
                // the pass-through views keep the projection outputs alive until return (empty
                // views when every dimension rotates, holding the storage all the same)
                self.attn_locals.push(q);
                self.attn_locals.push(k);
            } else {
                self.drop_(q);
                self.drop_(k);
            }
            (q, k, qs, ks) = (q2, k2, s2, s3);
        }
        if a.qk_norm_after_rope {
            (q, k, qs, ks) = self.qk_norms(a, lp, (q, qs), (k, ks), norm_dims);
        }
        let mut vs = qkv_size;
        if self.mode.is_infer() {
            let (kc, ks, vc, vs) = self.cache_update((k, ks), (v, vs), kv_heads, qk_dim, v_dim, a);
            return self
                .attention_core(q, qs, kc, ks, vc, vs, heads, kv_heads, qk_dim, v_dim, a, lp);
        }
        // DynamicCache.update (transformers cache_utils.py) concatenates k/v into the cache,
        // which the model output keeps; there is none with `use_cache` off (the config's, or
        // `model.config.use_cache = False`), HF disables it under gradient checkpointing, and a
        // padding-free step runs without one (`use_cache=False`: masking_utils detects packed
        // sequences only when there is no cache), as does a model whose config says
        // `use_cache: false` (SmolLM3-3B's config.json).
        if !ckpt
            && self.mode.use_cache(self.model)
            && !self.mode.kernels().padding_free
            && !matches!(a.kind, AttentionKind::Mla { .. })
        {
            let cache_size = ks.max(vs);
            let kc = self.op(rows * kv_heads * qk_dim * cache_size, &[k], &[], &[], &[]);
            let vc = self.op(rows * kv_heads * v_dim * cache_size, &[v], &[], &[], &[]);
            self.drop_(k);
            self.drop_(v);
            self.t.retain(kc);
            self.t.retain(vc);
            // the model output's `past_key_values` holds them
            self.cache_refs.push(kc);
            self.cache_refs.push(vc);
            k = kc;
            ks = cache_size;
            vs = cache_size;
            let _ = &mut k;
            return self
                .attention_core(q, qs, kc, ks, vc, vs, heads, kv_heads, qk_dim, v_dim, a, lp);
        }
        self.attention_core(q, qs, k, ks, v, vs, heads, kv_heads, qk_dim, v_dim, a, lp)
    }

    /// Falcon's new decoder architecture with fewer key/value heads than query heads
    /// (`Attention::kv_expanded`), `FalconAttention._split_heads` (transformers 5.23
    /// models/falcon/modeling_falcon.py): `fused_qkv.view(B, S, G, H/G + 2, D)`, the query
    /// `qkv[:, :, :, :-2]` a view, the key `qkv[:, :, :, [-2]]` and the value `[-1]` indexed
    /// with a list (`aten.index`: new [B, S, G, 1, D] tensors, their backward keeping only the
    /// indices), `torch.broadcast_to(key, query.shape)` (a stride-0 view), then `flatten(2, 3)`
    /// of all three. With more than one group the flatten cannot merge the group dim with the
    /// heads in a group (the query's group stride is (H/G + 2)·D, not (H/G)·D; the broadcast
    /// ones have stride 0), so `reshape` clones each into a contiguous [B, S, H, D] tensor
    /// (`aten.clone` + `_unsafe_view`, nothing saved), and the indexed copies die when
    /// `_split_heads` returns. With one group the size-1 group dim merges: the query stays a
    /// view of the fused output and the key and value stay stride-0 views of the one-head
    /// copies, which the rotation (key) and the cache's `cat` (both) then expand to every head.
    /// Traced on torch 2.15 CPU (tools/truth/probes: 8 heads over 2 groups, `aten.index`
    /// [2, 5, 2, 1, 16] twice, then three `aten.clone` [2, 5, 2, 4, 16]; over one group no
    /// clone, SDPA saving the [2, 8, 5, 16] value with strides (80, 0, 16, 1)). The fused
    /// output stays bound (`fused_qkv`) until the attention returns. Returns q, k and v.
    fn falcon_expanded_split(
        &mut self,
        y: TensorId,
        ys: u128,
        (heads, groups, hd): (u128, u128, u128),
    ) -> (TensorId, TensorId, TensorId) {
        let per_head = self.tokens * hd * ys;
        let ki = self.op(per_head * groups, &[y], &[], &[], &[]);
        let vi = self.op(per_head * groups, &[y], &[], &[], &[]);
        self.attn_locals.push(y);
        if groups > 1 {
            let q = self.op(per_head * heads, &[y], &[], &[], &[]);
            let k = self.op(per_head * heads, &[ki], &[], &[], &[]);
            let v = self.op(per_head * heads, &[vi], &[], &[], &[]);
            self.drop_(ki);
            self.drop_(vi);
            (q, k, v)
        } else {
            // the broadcast views have no storage of their own, but their gradients have every
            // head: autograd passes the full-size gradient down the views' backward nodes
            // (made here, so run late in backward) until `broadcast_to`'s ExpandBackward sums it
            // to one head (traced on torch 2.15 CPU, one group, b2 eager without a cache: the
            // [16, 256, 32] gradient of matmul's value copy alive through the softmax's
            // backward; falcon-gqa-8h1kv-fp32-eager-nocache-b2-s256 was -1.0% with one-head
            // gradients)
            let full = per_head * heads;
            let k = self.broadcast_view(ki, full);
            let v = self.broadcast_view(vi, full);
            self.expanded_value = Some(v);
            (self.retain_id(y), k, v)
        }
    }

    /// A stride-0 view of `x` over `bytes` (`expand`, `broadcast_to`): no storage, a gradient
    /// of `bytes` that its backward node sums into `x`'s. Takes `x`'s reference.
    fn broadcast_view(&mut self, x: TensorId, bytes: u128) -> TensorId {
        let e = self.expand_view(x, bytes);
        self.drop_(x);
        e
    }

    /// `x.clamp_(min, max)` on `elems` elements of `size` bytes (OLMoE `clip_qkv`). Autograd
    /// saves a copy of the input before overwriting it (`clamp_backward(grad, self, ..)` reads
    /// `self`; traced on torch 2.15 CPU: `aten.clone` then `aten.clamp_`), so with a gradient
    /// the clamped tensor and the saved copy are both alive until this node's backward, which
    /// builds two bool masks (`gt`, `lt`, then `logical_and_`), a 0-dim `scalar_tensor(0)` and
    /// the input gradient by `where`. Modelled as a new output with the input saved (the same
    /// bytes at every instant). Without a gradient (inference, a frozen prefix) it is in place.
    fn clamp_in_place(&mut self, x: TensorId, elems: u128, size: u128) -> TensorId {
        if self.mode.is_infer() || !self.rg(x) {
            return x;
        }
        let y = self.op(elems * size, &[x], &[x], &[], &[2 * elems, size]);
        self.drop_(x);
        y
    }

    /// The q/k norms of `a` (none: q and k unchanged): each a new tensor, the input freed.
    /// `dims` = (rows, heads, kv heads, q/k head dim).
    fn qk_norms(
        &mut self,
        a: &Attention,
        lp: &LayerParams,
        (q, qs): (TensorId, u128),
        (k, ks): (TensorId, u128),
        dims: (u128, u128, u128, u128),
    ) -> (TensorId, TensorId, u128, u128) {
        let (q2, s2) = self.qk_norm(a, lp, false, (q, qs), dims);
        let (k2, s3) = self.qk_norm(a, lp, true, (k, ks), dims);
        (q2, k2, s2, s3)
    }

    /// The query's (`key` false) or key's norm of `a` on `x` (none: `x` unchanged); a new
    /// tensor, `x` freed once normalised: the raw query dies before the key's norm runs
    /// (Gemma 3 rebinds `query_states`; Qwen 3 / OLMo 2 normalise the projection's temporary).
    fn qk_norm(
        &mut self,
        a: &Attention,
        lp: &LayerParams,
        key: bool,
        (x, xs): (TensorId, u128),
        (rows, heads, kv_heads, qk_dim): (u128, u128, u128, u128),
    ) -> (TensorId, u128) {
        let (Some((scope, kind)), Some((qn, kn))) = (a.qk_norm, lp.qk_norms) else {
            return (x, xs);
        };
        let h = if key { kv_heads } else { heads };
        let (nrows, dim) = match scope {
            QkNormScope::PerHead => (rows * h, qk_dim as u64),
            QkNormScope::Full => (rows, (h * qk_dim) as u64),
        };
        let bias = lp.qk_norm_biases.map(|(qb, kb)| if key { kb } else { qb });
        let norm = Norm {
            kind,
            dim,
            bias: bias.is_some(),
        };
        let (y, ys) = self.norm(x, xs, nrows, &norm, (if key { kn } else { qn }, bias));
        self.drop_(x);
        (y, ys)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_core(
        &mut self,
        q: TensorId,
        qs: u128,
        k: TensorId,
        ks: u128,
        v: TensorId,
        vs: u128,
        heads: u128,
        kv_heads: u128,
        qk_dim: u128,
        v_dim: u128,
        a: &Attention,
        lp: &LayerParams,
    ) -> TensorId {
        let rows = self.tokens;
        let c = self.compute_size;
        let lin = |role: LinearRole| find_linear(&lp.linears, role);
        let call = CoreCall {
            slot: self.cur_layer,
            q: (q, qs),
            k: (k, ks),
            v: (v, vs),
            heads,
            kv_heads,
            qk_dim,
            v_dim,
            q_bhsd: self.q_bhsd,
            v_broadcast: self.expanded_value.take() == Some(v),
        };
        let selective = self.mode.train().is_some_and(|w| {
            w.checkpointing
                && w.step_options
                    .checkpointing_policy
                    .recomputes_attention_only()
        });
        let out = if selective {
            self.checkpointed_kernel(call, a)
        } else {
            self.attention_kernel(call, a)
        };
        self.drop_(q);
        self.drop_(k);
        self.drop_(v);
        let out = match self.attn_gate.take() {
            Some(g) => {
                // `attn_output * torch.sigmoid(gate)`: sigmoid saves its output, the product
                // both operands
                let bytes = rows * heads * v_dim * c;
                let sg = self.op_saving_output(bytes, g);
                let y = self.mul(out, sg, bytes);
                self.drop_(sg);
                self.drop_(out);
                y
            }
            None => out,
        };
        let (y, _) = self.linear(out, c, rows, lin(LinearRole::O).unwrap_or(&LIN_ZERO));
        self.drop_(out);
        y
    }

    /// transformers' attention function without the output projection: `repeat_kv`, the
    /// kernel (SDPA, eager softmax(QKᵀ)V, flash) and the output's layout copy. The caller keeps
    /// q, k and v.
    fn attention_kernel(&mut self, call: CoreCall, a: &Attention) -> TensorId {
        let CoreCall {
            q: (q, qs),
            k: (k, ks),
            v: (v, vs),
            heads,
            kv_heads,
            qk_dim,
            v_dim,
            v_broadcast,
            ..
        } = call;
        let (b, s, kv) = (self.batch, self.seq, self.kv_len);
        let rows = self.tokens;
        let c = self.compute_size;
        let attn_dropout = if self.mode.dropout() {
            self.model.dropout.attention
        } else {
            0.0
        };
        // The CPU flash kernel needs dropout 0 and equal q/k and v head dims (MLA has 192 vs
        // 128); otherwise CPU SDPA runs the math kernel. On CUDA, flash or mem-efficient
        // attention covers both.
        let cpu_math = self.kernels == Kernels::Cpu
            && self.mode.attention() == AttentionImpl::Sdpa
            && (attn_dropout > 0.0 || qk_dim != v_dim);
        match self.mode.attention() {
            AttentionImpl::Sdpa if cpu_math => {
                // On CPU, SDPA with dropout has no fused kernel and runs
                // `_scaled_dot_product_attention_math` (aten/src/ATen/native/transformers/attention.cpp):
                // bf16/fp16 q, k, v are upcast to fp32, q and k scaled, k^T made contiguous,
                // scores and `_safe_softmax` in fp32, dropout noise of the same size, probs @ v,
                // result cast back. Saved: scaled q, k^T copy, probs, noise, dropped probs, v.
                let x = b * heads * s * kv;
                let w = 4;
                let nq = rows * heads * qk_dim;
                let nk = b * kv * kv_heads * qk_dim;
                let nv = b * kv * kv_heads * v_dim;
                let (q32, k32, v32) = (
                    if qs != w {
                        self.cast(q, nq * w)
                    } else {
                        self.retain_id(q)
                    },
                    if ks != w {
                        self.cast(k, nk * w)
                    } else {
                        self.retain_id(k)
                    },
                    if vs != w {
                        self.cast(v, nv * w)
                    } else {
                        self.retain_id(v)
                    },
                );
                // the fp32 casts are locals of the C++ math function: alive until it returns
                let qsc = self.op(nq * w, &[q32], &[], &[], &[]);
                // grouped-query attention: the math kernel repeats k and v to every head
                // (`repeat_interleave` under `enable_gqa`)
                let (k32, v32) = if heads > kv_heads {
                    let kr = self.op(b * kv * heads * qk_dim * w, &[k32], &[], &[], &[]);
                    let vr = self.op(b * kv * heads * v_dim * w, &[v32], &[], &[], &[]);
                    self.drop_(k32);
                    self.drop_(v32);
                    (kr, vr)
                } else {
                    (k32, v32)
                };
                let nk = b * kv * heads * qk_dim;
                // `is_causal` becomes an additive [q, kv] bias in the upcast dtype
                // (`convert_boolean_attn_mask` on a `tril` of ones), a local until return
                let bias = (s > 1).then(|| self.act(s * kv * w, false));
                let ksc = self.op(nk * w, &[k32], &[], &[], &[]);
                let kt = self.op(nk * w, &[ksc], &[], &[], &[]);
                self.drop_(ksc);
                let keep = self.sac_pre(SacOp::Saved);
                let scores = self.mul(qsc, kt, x * w);
                self.sac_keep(keep, &[scores]);
                self.drop_(kt);
                let masked = self.op(x * w, &[scores], &[], &[], &[]);
                self.drop_(scores);
                let probs = self.op_saving_output(x * w, masked);
                self.drop_(masked);
                let dropped = self.dropout(probs, x * w, w, attn_dropout);
                // The math kernel returns `std::make_tuple(at::matmul(attn, value_acc)
                // .to(origin_dtype), attn.to(origin_dtype))` and SDPA keeps only the first
                // (`std::get<0>`): the probabilities are cast back to the query's dtype too, a
                // [B, H, S, kv] tensor built before the product (GCC evaluates the arguments
                // right to left) and freed with the tuple, after the function's locals. None
                // when the query is fp32 (`.to` returns the tensor itself). Measured:
                // rdist-042-opt (fp16, attention dropout), its forward 4.2 MB short without it.
                let attn_cast = (qs != w).then(|| self.act(x * qs, false));
                // MLA's value slice, uncast (fp32): `matmul` copies it for bmm when B, H and the
                // key length all exceed 1, as in eager attention (`mla_v_copy` there); a cast
                // copy is contiguous already
                let mla_v_copy = matches!(a.kind, AttentionKind::Mla { .. })
                    && b > 1
                    && heads > 1
                    && kv > 1
                    && v32 == v;
                let v32 = if mla_v_copy {
                    let vc = self.op(nv * w, &[v32], &[], &[], &[]);
                    self.drop_(v32);
                    vc
                } else {
                    v32
                };
                // `attn @ value_acc` saves each operand only when the other needs a gradient
                // (derivatives.yaml `bmm`, as in eager attention): with a frozen value path
                // (layer 0 of a LoRA model without checkpointing and without a v_proj adapter)
                // the dropped probabilities are not kept (traced on torch 2.15 CPU with
                // rnd-s53-granite-0 b5 × 32 bf16, LoRA on q/k/o: layer 0 keeps `_safe_softmax`
                // and the dropout noise but no dropped [5, 8, 32, 32] fp32 product, layer 1 all
                // three; rnd-t53-019-granite was +1.32%, one fp32 [b, h, s, s] over)
                let keep = self.sac_pre(SacOp::Saved);
                let o32 = self.mul(dropped, v32, rows * heads * v_dim * w);
                self.sac_keep(keep, &[o32]);
                self.drop_(dropped);
                self.drop_(v32);
                let o = if c != w {
                    self.cast(o32, rows * heads * v_dim * c)
                } else {
                    self.retain_id(o32)
                };
                self.drop_(o32);
                // the scaled query is a local of the C++ function too (`query = query_ *
                // scaling_factor`); the scaled key is a temporary of the matmul call
                self.drop_(qsc);
                if let Some(m) = bias {
                    self.drop_(m);
                }
                self.drop_(q32);
                self.drop_(k32);
                if let Some(t) = attn_cast {
                    self.drop_(t);
                }
                // [B, H, S, D] -> [B, S, H*D] contiguous copy
                self.heads_contiguous(o, rows * heads * v_dim * c, heads)
            }
            AttentionImpl::Sdpa | AttentionImpl::Flash => {
                // flash kernel: saves q, k, v, output and logsumexp (fp32, B*H*S)
                // (aten `_scaled_dot_product_flash_attention[_for_cpu]`, derivatives.yaml).
                //
                // A sliding-window layer shorter than the sequence gets an explicit boolean mask
                // (transformers masking_utils `sliding_window_causal_mask`; a full causal layer
                // uses `is_causal` and no mask). SDPA converts it to an additive float mask in
                // the query's dtype per call (`convert_boolean_attn_mask`,
                // aten/src/ATen/native/transformers/attention.cpp) and saves it for backward.
                //
                // Falcon always passes its materialised boolean causal mask to SDPA
                // (models/falcon/modeling_falcon.py: `create_causal_mask(...,
                // allow_is_causal_skip=False)`), decode steps included; the flash-attention-2
                // path gets no 4-D mask. Converted the same way: `where(mask, 0, -inf)` makes a
                // [B, 1, q, kv] tensor in the query's dtype for the duration of the call.
                //
                // Packed sequences (padding-free) get the same: `find_packed_sequence_indices`
                // finds the sequence boundaries in the position ids and `sdpa_mask` materialises a
                // block-diagonal causal boolean mask (masking_utils.py `packed_sequence_mask_function`).
                let falcon = a.eager_style == crate::model::EagerStyle::Falcon;
                let falcon_mask = (falcon || self.mode.kernels().padding_free)
                    && self.mode.attention() == AttentionImpl::Sdpa;
                // (transformers `_ignore_causal_mask_sdpa`: no skip once `kv_length >=
                // local_attention_size`, so a training sequence exactly as long as the window gets
                // one; measured: kern-mistral7b-4l-liger-b2s4096, mix-gemma3-1b-fp32-sgdmom-lora-r16.
                // Inference keeps the strict bound its prefill fixtures were measured with.)
                let train = !self.mode.is_infer();
                let masked = match a.sliding_window {
                    Some(win)
                        if (u128::from(win) < kv || (train && u128::from(win) == kv)) && s > 1 =>
                    {
                        true
                    }
                    // Gemma 3 image tokens: every layer type's mask is materialised (siglip.rs)
                    _ if self.image_blocks
                        && s > 1
                        && self.mode.attention() == AttentionImpl::Sdpa =>
                    {
                        true
                    }
                    _ => falcon_mask,
                };
                // With a mask, transformers does not use SDPA's `enable_gqa`
                // (integrations/sdpa_attention.py `use_gqa_in_sdpa`: "no mask"): `repeat_kv`
                // expands k and v to every head, a copy unless there is a single kv head (then
                // `expand(...).reshape(...)` is a view), and SDPA saves the copies.
                let (k, v, ks, vs, repeated) = if masked
                    && self.mode.attention() == AttentionImpl::Sdpa
                    && heads > kv_heads
                    && kv_heads > 1
                    && !falcon
                {
                    let kr = self.op(b * kv * heads * qk_dim * ks, &[k], &[], &[], &[]);
                    let vr = self.op(b * kv * heads * v_dim * vs, &[v], &[], &[], &[]);
                    (kr, vr, ks, vs, true)
                } else {
                    (k, v, ks, vs, false)
                };
                // With a single kv head the expanded view has a zero stride over the heads; under
                // autocast SDPA's cast of it (`_to_copy`, which keeps the strides of dense tensors
                // only) is a full [B, H, S, D] tensor, which SDPA saves (traced on torch 2.15 CPU
                // with tools/truth/probes/h51_live_storages.py: rnd-s197-gemma3text-0 under
                // amp-bf16, b6 × 169, 7 heads over one, sliding-window mask: two bf16 [6, 7, 169,
                // 32] `_to_copy`s per layer alive after the attention; rnd-t197-018-gemma3text was
                // -1.26%, cast at one head)
                let viewed = masked
                    && self.mode.attention() == AttentionImpl::Sdpa
                    && heads > kv_heads
                    && kv_heads == 1
                    && !falcon;
                let kv_store = if repeated || viewed { heads } else { kv_heads };
                let (q2, k2, v2) = if self.amp {
                    let q2 = if qs != c {
                        self.cast(q, rows * heads * qk_dim * c)
                    } else {
                        q
                    };
                    let k2 = if ks != c {
                        self.cast(k, rows * kv_store * qk_dim * c)
                    } else {
                        k
                    };
                    let v2 = if vs != c {
                        self.cast(v, rows * kv_store * v_dim * c)
                    } else {
                        v
                    };
                    (q2, k2, v2)
                } else {
                    (q, k, v)
                };
                let keep = self.sac_pre(SacOp::Saved);
                let lse = self.act(b * heads * s * 4, false);
                let mask = masked.then(|| self.act(b * s * kv * c, false));
                // autograd records the kernel (and it saves anything) only when q, k or v
                // requires grad (`compute_requires_grad`, torch/csrc/autograd/
                // VariableTypeUtils.h): before the first trainable module of a LoRA model
                // (frozen embeddings, no checkpointing) nothing does
                let rg = self.rg(q2) || self.rg(k2) || self.rg(v2);
                let o = self.act(rows * heads * v_dim * c, rg);
                // torchtitan's SAC keeps both outputs of the flash kernel (`sac.rs`)
                self.sac_keep(keep, &[o, lse]);
                if rg {
                    let mut saved = Ids::of(&[q2, k2, v2, o, lse]);
                    if let Some(m) = mask {
                        saved.push(m);
                    }
                    self.t.record(Node {
                        saved,
                        inputs: Ids::of(&[q2, k2, v2]),
                        outputs: Ids::of(&[o]),
                        ..Node::default()
                    });
                }
                self.drop_(lse);
                if let Some(m) = mask {
                    self.drop_(m);
                }
                for (new, old) in [(q2, q), (k2, k), (v2, v)] {
                    if new != old {
                        self.drop_(new);
                    }
                }
                if repeated {
                    self.drop_(k);
                    self.drop_(v);
                }
                // The kernel's output takes q's memory layout. A q made by `cat` (partial
                // rotary, MLA) is laid out [B, H, S, D], so `transpose(1, 2).contiguous()` in
                // `sdpa_attention_forward` (integrations/sdpa_attention.py) copies it; a q that
                // is a transposed view of a projection is [B, S, H, D] already and is not copied.
                if self.q_bhsd {
                    self.heads_contiguous(o, rows * heads * v_dim * c, heads)
                } else {
                    o
                }
            }
            AttentionImpl::Eager => {
                // eager_attention_forward (models/llama/modeling_llama.py): repeat_kv copies
                // k/v when kv_heads < heads; scores in the compute dtype; softmax in fp32;
                // probabilities cast back and saved by the second matmul; output made contiguous.
                let n_rep = heads / kv_heads.max(1);
                // keys and values span the cache (kv tokens), queries the new rows
                let kv_rows = b * kv;
                let falcon = a.eager_style == crate::model::EagerStyle::Falcon;
                // With a single kv head, `repeat_kv`'s `expand(...).reshape(...)` is a view (the
                // expanded dim merges with the size-1 head dim). Under no_grad the copies matmul
                // then makes for bmm are temporaries of each call. With autograd, matmul's
                // reshape to [B·H, ., .] (aten/src/ATen/native/LinearAlgebra.cpp `matmul`) is
                // still a view when B = 1 — bmm saves the stride-0 views — but must copy when
                // B > 1 (the stride-0 head dim cannot merge with the batch dim), and bmm saves
                // those copies, which costs the same as keeping repeat_kv copies. A pass that
                // records no graph (inference, or a checkpointed layer's first forward, whose
                // saved-tensor pack hook keeps a holder, not the tensor: torch/utils/checkpoint.py
                // `_checkpoint_hook`) saves none of them, so they are temporaries there too
                // (traced on torch 2.15 CPU with a TorchDispatchMode on rnd-s29-granitemoehybrid-1
                // b2 × 128 fp16 eager, checkpointed: `aten.clone` of the query and of the
                // expanded key before the scores' bmm, both gone at the `mul` that scales them,
                // and of the expanded value before the second bmm; rdist191-017-granitemoehybrid
                // forward was +1.93%, two [b, h, s, d] fp16 copies over at the softmax).
                let mqa_view = n_rep > 1
                    && kv_heads == 1
                    && !falcon
                    && (self.mode.is_infer() || self.batch == 1 || !self.t.recording);
                // (a pass that records no graph, a checkpointed layer's first forward, makes
                // matmul's copies as temporaries of each bmm, as at inference: traced on torch
                // 2.15 CPU, rdist191-017-granitemoehybrid's forward peak without the two copies)
                // Training with a batch above one (outside autocast, whose cast of the expanded
                // view is the copy): matmul copies the single key head for the scores' bmm and
                // the single value head only for `probs @ value`, after the softmax, each saved
                // by its bmm (measured: mplora-olmo2-mlp-eager-b2s256, 5 heads over 1, b2: the
                // value's [2, 5, 256, 16] copy made after the softmax, its forward +0.54% with
                // both copies made by repeat_kv). repeat_kv's `expand` stays an early node: in
                // backward the copies' full-width gradients wait for it until the scores'
                // backward is done (the engine runs the later nodes first), and only then sum
                // over the heads (rnd-t173-031-llama's backward peak holds the value's).
                let mqa_copy = n_rep > 1 && kv_heads == 1 && !falcon && !mqa_view && !self.amp;
                let (kr, vr) = if mqa_copy {
                    (
                        self.expand_view(k, kv_rows * heads * qk_dim * ks),
                        self.expand_view(v, kv_rows * heads * v_dim * vs),
                    )
                } else if n_rep > 1 && !falcon && !mqa_view {
                    // repeat_kv: expand + reshape copies kept through attention
                    let kr = self.op(kv_rows * heads * qk_dim * ks, &[k], &[], &[], &[]);
                    let vr = self.op(kv_rows * heads * v_dim * vs, &[v], &[], &[], &[]);
                    (kr, vr)
                } else {
                    self.t.retain(k);
                    self.t.retain(v);
                    (k, v)
                };
                let x = b * heads * s * kv;
                // A query that is still a strided view of a fused qkv output (no rotary copy in
                // between, GPT-2) is copied by matmul's reshape to [B*H, S, D].
                // So is a query whose storage is laid out [B, S, H, D] (a transposed projection,
                // and the rotary's elementwise ops keep that layout) when B, H and S all exceed
                // 1: B cannot merge with H (aten/src/ATen/native/LinearAlgebra.cpp `matmul`:
                // `expand(...).reshape({B·H, S, D})`). With a gradient, bmm saves the copy while
                // the attention's caller keeps the query bound until it returns, so both are
                // alive through the softmax (traced on torch 2.15 CPU: `aten.clone` of a
                // [2, 2, 128, 64] query with strides (16384, 64, 128, 1) before the scores'
                // bmm; measured: mplora-llama-attn-eager-b2s128, forward -0.68%). The keys and
                // values here are the cache's contiguous copies or repeat_kv's, or single-headed.
                // Not under autocast (its casts keep the layout and are not traced here).
                let layout_copy = !self.q_bhsd
                    && !self.amp
                    && b > 1
                    && heads > 1
                    && s > 1
                    && self.t.recording
                    && !self.mode.is_infer()
                    && (self.rg(q) || self.rg(kr));
                // The fused query view [B, H, S, D] has strides (S·3E, D, 3E, 1): B merges with H
                // only when one of them is 1 (a size-1 dim merges with any stride), so a batch of
                // one or a single head reshapes to a view and bmm saves that view (traced on
                // torch 2.15 CPU: rnd-s17-gpt2-1 b1 × 411, no `aten.clone` before the scores'
                // bmm; rdist101-031-gpt2 forward was -3.3%, the copy kept in place of the
                // cache's k, v the c_attn output it freed).
                let fused_view_copy = a.fused_qkv && a.rotary_dim.is_none() && b > 1 && heads > 1;
                let qcopy = fused_view_copy || layout_copy;
                let q = if qcopy {
                    self.op(rows * heads * qk_dim * qs, &[q], &[], &[], &[])
                } else {
                    q
                };
                // Falcon multi_query with a batch above one: matmul's expand + reshape of the
                // single key head copies it, and bmm saves that copy (with a gradient) until
                // backward (`Attention::kv_broadcast`; traced on torch 2.15 CPU: `aten.clone` of
                // the expanded [6, 4, 32, 54] key, and of the [6, 4, 54, 32] value before the
                // second bmm, none with a batch of one; rnd-t107-023-falcon b6 x 54 fp32 was
                // -2.87%, two [b, h, s, d] per layer short from the forward on). Under autocast the
                // cast is of the single head, made before matmul expands it.
                let bcast_copy = a.kv_broadcast && n_rep > 1 && b > 1;
                // Keys and values that are still views of the fused qkv output (no KV cache to
                // copy them into: checkpointing, `use_cache` off; no rotary): `key.transpose(-1,
                // -2)` [B, H, D, S] and `value` [B, H, S, D] have batch stride S·3E against a
                // head stride of D, so matmul's reshape to [B·H, ., .] copies them as it copies
                // the query, and bmm saves those copies (with a gradient) instead of the fused
                // output, which then dies with the attention's locals (traced on torch 2.15
                // CPU, rnd-s17-gpt2-1 b4 × 60 checkpointed: `aten.clone` of the [4, 2, 60, 64]
                // query, the [4, 2, 64, 60] key and the [4, 2, 60, 64] value alive at the
                // MLP's recomputed backward, no [4, 60, 384] c_attn output; rnd-t17-058-gpt2
                // was +1.67%, one [b, s, E] per layer over). The same key and value (one id)
                // means both are the fused output's views.
                let kv_view_copy = fused_view_copy && !falcon && n_rep == 1 && k == v;
                let kv_copy = bcast_copy || kv_view_copy || mqa_copy;
                // the heads autocast's cast of k spans: Falcon's shared key and value heads
                // are cast before matmul expands them, whatever the batch (measured:
                // rnd-t107-027-falcon, a batch of one with fp32 q/k/v, was +0.74% with the cast
                // spanning every head, 2 × [s, h - 1, d] bf16 per layer over in the forward)
                let k_cast_heads = if bcast_copy || (a.kv_broadcast && falcon) {
                    kv_heads
                } else {
                    heads
                };
                let (qm, km) = if self.amp {
                    (
                        if qs != c {
                            self.cast(q, rows * heads * qk_dim * c)
                        } else {
                            q
                        },
                        if ks != c {
                            self.cast(kr, rows * k_cast_heads * qk_dim * c)
                        } else {
                            kr
                        },
                    )
                } else {
                    (q, kr)
                };
                if falcon {
                    // `query @ key.transpose(-1, -2)` broadcasts the shared k over the heads:
                    // matmul materialises contiguous copies of q and the expanded k for bmm
                    let copies = rows * heads * qk_dim * c
                        + if n_rep > 1 && !bcast_copy {
                            kv_rows * heads * qk_dim * c
                        } else {
                            0
                        };
                    self.t.transient(copies + x * c, Category::Activations);
                }
                if mqa_view {
                    // autocast's cast of the expanded key is contiguous already: no copy then
                    let k_copy = if km == kr {
                        kv_rows * heads * qk_dim * ks
                    } else {
                        0
                    };
                    self.t.transient(k_copy + x * c, Category::Activations);
                }
                let kb = if kv_copy {
                    self.op(kv_rows * heads * qk_dim * c, &[km], &[], &[], &[])
                } else {
                    km
                };
                let keep = self.sac_pre(SacOp::Saved);
                let scores = self.mul(qm, kb, x * c);
                self.sac_keep(keep, &[scores]);
                // Nothing saves the query's copy when no graph is recorded (`torch.no_grad()`
                // at inference; a checkpointed layer's first forward, whose saved-tensor pack
                // hook keeps a holder, not the tensor, torch/utils/checkpoint.py
                // `_checkpoint_hook`): it is a local of `matmul` (aten/src/ATen/native/
                // LinearAlgebra.cpp `_matmul_impl`, the reshaped `tensor1`) freed once bmm
                // returns (traced on torch 2.15 CPU with tools/truth/probes/live_tensors.py on
                // rnd-s17-gpt2-0 b5 × 140 bf16: no [b, h, s, d] copy alive at the scores'
                // scaling; rnd-i17-050-gpt2 was +1.96%, one [b, s, E] per layer over)
                let q_freed_early = qcopy && !self.t.recording;
                if q_freed_early {
                    self.drop_(q);
                }
                if kb != km {
                    self.drop_(kb);
                }
                if qm != q {
                    self.drop_(qm);
                }
                if km != kr {
                    self.drop_(km);
                }
                // Falcon scales in place (`attention_scores /= sqrt(d)`) and keeps the scores
                // bound until `softmax(scores + mask)` returns
                let held_scores = if falcon { Some(scores) } else { None };
                let scaled = if falcon {
                    self.retain_id(scores)
                } else {
                    self.op(x * c, &[scores], &[], &[], &[])
                };
                if !falcon {
                    self.drop_(scores);
                }
                let mut cur = scaled;
                if a.logit_softcap.is_some() {
                    // Gemma 2: scores / cap; tanh (saves its output); * cap
                    let d = self.op(x * c, &[cur], &[], &[], &[]);
                    self.drop_(cur);
                    let th = self.op_saving_output(x * c, d);
                    self.drop_(d);
                    let m = self.op(x * c, &[th], &[], &[], &[]);
                    self.drop_(th);
                    cur = m;
                }
                // Falcon under autocast: `scores + attention_mask` promotes to the fp32 mask's
                // dtype and `softmax(..., dtype=hidden_states.dtype)` stays fp32 (the hidden
                // states are fp32); `probs @ value` then makes autocast's compute-dtype copy
                // (models/falcon/modeling_falcon.py `FalconAttention.forward`)
                let falcon_amp = falcon && self.amp;
                // gpt-oss and Llama 4 under autocast: the same promotion (`attn_weights +
                // causal_mask`, an fp32 mask), and their softmax keeps the scores' dtype
                // (gpt-oss `dtype=combined_logits.dtype`, after the fp32 sink logits and the
                // shift; Llama 4 `softmax(attn_weights, dim=-1)`, "llama4 doesn't cast attn
                // weights to fp32"), so the probabilities stay fp32 and `probs @ value` makes
                // autocast's compute-dtype copy (of the slice without the sink column) (traced on
                // torch 2.15 CPU; models/gpt_oss/modeling_gpt_oss.py and models/llama4/
                // modeling_llama4.py `eager_attention_forward`; rnd-t29-080-llama4text -2.5%
                // was b·s²·8 bytes short, one fp32 [b, 1, s, s] per layer)
                let sink_amp = (a.sinks || a.rope_complex) && self.amp;
                // GPT-2 under autocast: the same promotion (the eager mask is built in the fp32
                // `inputs_embeds` dtype, `attn_weights + attention_mask` is fp32), the softmax
                // keeps it (`nn.functional.softmax(attn_weights, dim=-1)`, saved in fp32) and
                // `attn_weights.type(value.dtype)` makes the compute-dtype copy that dropout and
                // `attn_weights @ value` use (transformers 5.23 models/gpt2/modeling_gpt2.py
                // `eager_attention_forward`; traced on torch 2.15 CPU: add → fp32, _softmax fp32,
                // _to_copy fp16; rnd-t71-028-gpt2 -9.5% was one fp32 [b, h, s, s], 12,904,960 B)
                // Llama-style `softmax(attn_weights, dim=-1, dtype=torch.float32)` under autocast
                // meets the same fp32 sum: its input is fp32 already, so the softmax makes no
                // fp32 copy of it (traced on torch 2.15 CPU, rnd-s67-granite-0 b2 × 400
                // amp-bf16: `aten.add` → fp32 [2, 6, 400, 400], `aten._softmax` fp32, no
                // `_to_copy` between; the single-GPU forward phase was +5.8%, one bf16
                // [b, h, s, s] over at the softmax, 3,840,000 B, whatever the kv heads)
                let promote_amp = falcon_amp || sink_amp || self.amp;
                let msz = if promote_amp { 4 } else { c };
                let masked = self.op(x * msz, &[cur], &[], &[], &[]);
                self.drop_(cur);
                // with sinks, the masked scores stay bound to `attn_weights` until the
                // dropout rebinds that name, i.e. through the softmax
                let x_scores = x;
                let (masked, x, held_masked) = if a.sinks {
                    let (shifted, x1) = self.sink_logits(masked, x, msz);
                    (shifted, x1, Some(masked))
                } else {
                    (masked, x, None)
                };

                // softmax saves its output; llama-style upcasts to fp32 and casts back
                let sm = if a.eager_softmax_fp32 || promote_amp {
                    4
                } else {
                    c
                };
                let f32in = if msz != sm {
                    self.cast(masked, x * sm)
                } else {
                    masked
                };
                let probs32 = self.op_saving_output(x * sm, f32in);
                if f32in != masked {
                    self.drop_(f32in);
                }
                // `.to(query.dtype)`: under autocast the query is fp32 once the fp32 rotary
                // tables multiplied it (`q * cos`, the rotary embedding returns `cos.to(x.dtype)`
                // of the fp32 hidden states), so the probabilities stay fp32, dropout runs on
                // them in fp32 and `probs @ value` makes autocast's compute-dtype copy
                // (transformers 5.23 `eager_attention_forward`, e.g. models/seed_oss)
                // Falcon under autocast: `attention_scores = F.softmax(..., dtype=hidden_states.
                // dtype)` is fp32 and stays bound (the layer returns it as `attn_weights`); the
                // compute-dtype copy is autocast's, inside `attention_scores @ value_layer`, made
                // after the softmax's temporary input and the rebound scores are gone (traced with
                // tools/truth/probes on rnd-s97-falcon-0 under amp-fp16: the fp32 softmax alive
                // through the MLP, no fp16 probabilities outside the matmul; rnd-t97-014-falcon
                // was one fp16 [b, h, s, s] over, falcon-rnd97-b2-s200-ampfp16-lora-4h one fp32
                // [b, h, s, s] short)
                let pdt = if sink_amp || falcon_amp {
                    4
                } else if a.eager_softmax_fp32 && self.amp {
                    qs
                } else {
                    c
                };
                let probs = if pdt != sm {
                    self.cast(probs32, x * pdt)
                } else {
                    probs32
                };
                self.drop_(masked);
                if let Some(m) = held_masked {
                    self.drop_(m);
                }
                if let Some(sc) = held_scores {
                    // rebinding `attention_scores` to the softmax frees the scores
                    self.drop_(sc);
                }
                if probs != probs32 {
                    self.drop_(probs32);
                }
                let probs = self.dropout(probs, x * pdt, pdt, self.model.dropout.attention);
                if falcon && n_rep > 1 && !bcast_copy {
                    // `probs @ value` broadcasts the shared v: a transient expanded copy
                    self.t.transient(
                        kv_rows * heads * v_dim * c + rows * heads * v_dim * c,
                        Category::Activations,
                    );
                }
                let vm = if self.amp && vs != c {
                    self.cast(vr, kv_rows * k_cast_heads * v_dim * c)
                } else {
                    vr
                };
                if mqa_view {
                    let v_copy = if vm == vr {
                        kv_rows * heads * v_dim * vs
                    } else {
                        0
                    };
                    self.t
                        .transient(v_copy + rows * heads * v_dim * c, Category::Activations);
                }
                // `probs @ value` saves each operand only when the other needs a gradient
                // (derivatives.yaml `bmm`, as `mul`): a frozen value path (layer 0 of a LoRA
                // model without checkpointing and without a v_proj adapter) keeps no probs
                let pm = if pdt != c {
                    // with sinks the copy is of the slice without the sink column
                    self.cast(probs, if a.sinks { x_scores } else { x } * c)
                } else {
                    probs
                };
                // MLA's value is a strided slice of kv_b_proj's output (`kv_b_proj(..).view(B, S,
                // H, nope + v).transpose(1, 2)` split into k_nope and value,
                // DeepseekV3Attention.expand_kv): matmul's reshape to [B·H, S, v] cannot merge B
                // with H when B > 1, so it copies the slice and bmm saves that copy, not the
                // projection output (aten/src/ATen/native/LinearAlgebra.cpp `matmul`; traced on
                // torch 2.15 CPU: an `aten.clone` [3, 7, 288, 32] per layer alive at
                // rnd-t17-209-deepseekv3's backward peak, no [3, 288, 7·40] kv_b_proj output). With
                // a batch of one the reshape is a view and bmm keeps the whole output. A single
                // head or a single key merges with the batch (a size-1 dim merges with any stride),
                // so the reshape is a view then and bmm saves the projection output
                // (tools/truth/probes/h51_live_storages.py, torch 2.15 CPU: rnd-s197-deepseekv3-0,
                // one head, b2 × 30: no `aten.clone` before the value's bmm, the [60, 48] kv_b_proj
                // `mm` alive after the attention returns; rnd-t197-029-deepseekv3 was -1.19%, the
                // copy kept in place of the projection output it freed).
                let mla_v_copy = matches!(a.kind, AttentionKind::Mla { .. })
                    && b > 1
                    && heads > 1
                    && kv > 1
                    && vm == vr;
                // Falcon's new architecture over one key/value group without a KV cache: the
                // value is still `_split_heads`' stride-0 view over every head
                // (`Attention::kv_expanded`), which matmul's reshape to [B·H, S, D] cannot merge
                // when B > 1, so it copies it and bmm saves the copy (traced on torch 2.15 CPU:
                // 8 heads over one group, b2: `aten.clone` [2, 8, 5, 16] saved as [16, 5, 16];
                // b1: the [8, 5, 16] view with strides (0, 16, 1) saved). A cast under autocast
                // is dense already (`_to_copy` of a non-dense tensor allocates contiguous).
                let v_bcast_copy = v_broadcast && b > 1 && vm == vr;
                // the expanded value's copy, saved by bmm as the key's above
                let vb = if kv_copy || mla_v_copy || v_bcast_copy {
                    self.op(kv_rows * heads * v_dim * c, &[vm], &[], &[], &[])
                } else {
                    vm
                };
                let keep = self.sac_pre(SacOp::Saved);
                let o = self.mul(pm, vb, rows * heads * v_dim * c);
                self.sac_keep(keep, &[o]);
                if vb != vm {
                    self.drop_(vb);
                }
                if vm != vr {
                    self.drop_(vm);
                }
                if pm != probs {
                    self.drop_(pm);
                }
                // eager attention returns the probabilities too; the decoder layer binds them to
                // a local (`self_attn_weights` in GPT-2/OPT, `_` in Llama's
                // `hidden_states, _ = self.self_attn(...)`) that lives until the layer returns
                self.layer_locals.push(probs);
                // `attn_output.transpose(1, 2).contiguous()` runs inside eager_attention_forward,
                // where `key_states`/`value_states` (repeat_kv's copies) are still bound: under
                // no_grad they are freed only when it returns (traced with
                // tools/truth/probes on rnd-i17-051-qwen3, b5 x 28, 4 heads over 2: q, both
                // copies, the output and its contiguous copy alive at the `aten.clone`;
                // -0.81% without)
                let oc = self.heads_contiguous(o, rows * heads * v_dim * c, heads);
                self.drop_(kr);
                self.drop_(vr);
                if qcopy && !q_freed_early {
                    self.drop_(q);
                }
                oc
            }
        }
    }

    /// `x.expand(...)` to `bytes` (repeat_kv of a single key/value head): no storage of its own,
    /// and an ExpandBackward node that receives a gradient of the expanded size and sums it
    /// into `x`'s (`sum_to_size`, tools/autograd/derivatives.yaml `expand`).
    fn expand_view(&mut self, x: TensorId, bytes: u128) -> TensorId {
        let rg = self.rg(x);
        let e = self.t.view(x, bytes, rg);
        if rg {
            self.t.record(Node {
                inputs: Ids::of(&[x]),
                outputs: Ids::of(&[e]),
                ..Node::default()
            });
        }
        e
    }

    /// `o.transpose(1, 2).contiguous()` of an attention output laid out `[B, H, S, D]`
    /// (`bytes` in all), consuming `o`: a copy, unless the transposed view is contiguous
    /// already, which it is when one of the swapped dims has size 1 — one head, or one query
    /// row (a decode step) — since `is_contiguous` ignores the strides of size-1 dims
    /// (c10/core/Contiguity.h `compute_contiguous`); `contiguous()` then returns the tensor
    /// itself (measured: a one-head GPT-NeoX, b1 x 695, one [S, D] tensor fewer alive after
    /// the attention than a copy would leave).
    fn heads_contiguous(&mut self, o: TensorId, bytes: u128, heads: u128) -> TensorId {
        if heads <= 1 || self.seq <= 1 {
            return o;
        }
        let oc = self.op(bytes, &[o], &[], &[], &[]);
        self.drop_(o);
        oc
    }

    /// The attention function under a non-reentrant checkpoint (`selective-attn`): run without
    /// saving (torch/utils/checkpoint.py `_checkpoint_without_reentrant_generator`), then one
    /// node that keeps the function's tensor inputs (`_NoopSaveInputs` saves q, k, v and the
    /// mask) and recomputes it when backward reaches it ([`Builder::recompute_kernel`]).
    fn checkpointed_kernel(&mut self, call: CoreCall, a: &Attention) -> TensorId {
        let recording = self.t.recording;
        self.t.recording = false;
        let y = self.attention_kernel(call, a);
        self.t.recording = recording;
        let mut saved = Ids::of(&[call.q.0, call.k.0, call.v.0]);
        if let Some(m) = self.layer_mask(self.cur_layer) {
            saved.push(m);
        }
        let index = u32::try_from(self.core_calls.len()).unwrap_or(u32::MAX);
        self.core_calls.push(call);
        self.t.record(Node {
            saved,
            outputs: Ids::of(&[y]),
            recompute_attention: Some(index),
            ..Node::default()
        });
        y
    }

    /// Attention sinks in eager attention (gpt-oss `eager_attention_forward`,
    /// models/gpt_oss/modeling_gpt_oss.py): the per-head sink logits are expanded (a view) and
    /// concatenated as one more key column, `combined - combined.max(-1, keepdim).values`
    /// (max saves its int64 indices for backward), then the softmax runs in the compute dtype
    /// (`dtype=combined_logits.dtype`) and its output, with the sink column sliced off as a
    /// view, is what the value matmul uses and saves. Returns the logits the softmax gets and
    /// their element count (`x` with one more column per query row); `masked` stays the
    /// caller's (it is still bound to `attn_weights`).
    fn sink_logits(&mut self, masked: TensorId, x: u128, c: u128) -> (TensorId, u128) {
        let rows_q = x / self.kv_len.max(1);
        let x1 = rows_q * (self.kv_len + 1);
        let cat = self.op(x1 * c, &[masked], &[], &[], &[]);
        let idx = self.act(rows_q * 8, false);
        let mx = self.op(rows_q * c, &[cat], &[idx], &[], &[]);
        self.drop_(idx);
        let shifted = self.op(x1 * c, &[cat, mx], &[], &[], &[]);
        self.drop_(cat);
        self.drop_(mx);
        (shifted, x1)
    }

    /// Backward reached a checkpointed attention function: keep its inputs until its backward
    /// is done, re-run it with saving on, and hand the output's gradient to the recomputed twin.
    /// What the re-run returns is dropped (the eager probabilities too: the recomputation's
    /// outputs are not bound to any local).
    pub(super) fn recompute_kernel(&mut self, node: &Node, index: u32) {
        let Some(call) = self.core_calls.get(index as usize).copied() else {
            return;
        };
        let out = node.outputs.as_slice()[0];
        self.t.tape.push(Node {
            saved: node.saved,
            ..Node::default()
        });
        let a = &self.spec(call.slot).attention;
        let q_bhsd = std::mem::replace(&mut self.q_bhsd, call.q_bhsd);
        let locals = self.layer_locals.len();
        let y = self.attention_kernel(call, a);
        self.q_bhsd = q_bhsd;
        for t in self.layer_locals.split_off(locals) {
            self.drop_(t);
        }
        self.drop_list(|b| &mut b.attn_locals);
        self.t.move_grad(out, y);
        self.drop_(y);
    }

    /// The model-level causal mask, built once per forward by transformers' `create_causal_mask`
    /// and held by the model's forward until it returns. Eager attention gets an additive mask
    /// `[B, 1, q, kv]` in the compute dtype (masking_utils.py `eager_mask`). SDPA with a plain
    /// causal mask needs none (`is_causal`), except in Falcon, which asks for it materialised
    /// (`allow_is_causal_skip=False`, models/falcon/modeling_falcon.py): `sdpa_mask` builds a
    /// boolean `[1, 1, q, kv]` by broadcasting the index comparison and only `expand`s it to the
    /// batch (a view), since no padding mask is passed.
    pub(super) fn causal_mask(&mut self, q_len: u128, kv_len: u128) -> Option<TensorId> {
        // a model without attention layers builds none (Mamba2Model only makes the 2-D padding
        // mask of `create_recurrent_attention_mask`, None without padding)
        if !self.any_layer(|l| l.attention_block().is_some()) {
            return None;
        }
        // (flash-attention-2 gets no 4-D mask: `flash_attention_mask` returns the 2-D padding
        // mask or None)
        if self.image_blocks && q_len > 1 && self.mode.attention() != AttentionImpl::Flash {
            // Gemma 3 with image tokens: `create_masks_for_vision_model` builds the full and the
            // sliding mask with the image blocks OR-ed in (no causal skip, no early exit), one
            // [B, 1, q, kv] each: boolean for SDPA (`sdpa_mask` over the per-row block ids),
            // additive in the embeddings' dtype for eager (`eager_mask`)
            let size = match self.mode.attention() {
                AttentionImpl::Eager => self.compute_size,
                _ => 1,
            };
            return Some(self.act(2 * self.batch * q_len * kv_len * size, false));
        }
        match self.mode.attention() {
            AttentionImpl::Eager => {
                // Models that mix sliding-window and full layers (Gemma 2/3) build one mask per
                // layer type (`causal_mask_mapping` in modeling_gemma2.py / modeling_gemma3.py).
                let sliding = |l: &crate::model::LayerSpec| {
                    l.attention
                        .sliding_window
                        .is_some_and(|w| u128::from(w) < kv_len)
                };
                let masks =
                    if q_len > 1 && self.any_layer(sliding) && self.any_layer(|l| !sliding(l)) {
                        2
                    } else {
                        1
                    };
                // in the embeddings' dtype (`create_causal_mask(..., dtype=inputs_embeds.dtype)`):
                // fp32 under autocast, whose lists do not cover the mask construction
                let mask_size = if self.amp { 4 } else { self.compute_size };
                let one = self.batch * q_len * kv_len * mask_size;
                // Gemma 2 / 3 build both whatever the layers are (`ModelDesc::builds_both_masks`):
                // the one no layer reads lives until the base model returns, while a mask the
                // layers read is also held by checkpointing for the recomputation (measured:
                // rdist-017-gemma3text, two sliding layers, both masks alive through the final
                // norm; rdist-008-gemma2, checkpointed, only the read one held into backward)
                let built = self.model.builds_both_masks && q_len > 1;
                // Each layer reads the mask of its type (`causal_mask_mapping[layer_type]`), the
                // window's length aside: with a window at least as long as the keys the sliding
                // layers still read their own (equal) mask, so both are read, and both are held
                // by checkpointing (measured: rnd-t61-050-cohere2, window 120 over 113 tokens,
                // checkpointed, the second mask alive through the backward)
                let typed = |l: &crate::model::LayerSpec| {
                    l.attention.sliding_window.is_some() && !l.attention.chunked
                };
                let both_read = self.any_layer(typed) && self.any_layer(|l| !typed(l));
                let masks = if built && both_read { 2 } else { masks };
                self.unused_mask = (built && masks == 1).then(|| self.act(one, false));
                // two separate tensors: a checkpoint keeps only the mask its layer reads, so
                // each goes once the last layer of its type has been recomputed (measured:
                // qwen2-sw128-b3-s120-ckpt-fp32-sgd, layers [full, sliding, sliding], the
                // sliding mask gone before layer 0's backward). Llama 4's chunked and full masks
                // too (measured: rnd-t61-053-llama4text, one [B, 1, S, S] mask alive at layer 0's
                // recompute; the block of both held to the end had hidden the checkpoint's tail,
                // `Timeline::take_tail`: +0.495%, now +0.033%).
                if masks == 2 {
                    let full = self.act(one, false);
                    self.sliding_mask = Some(self.act(one, false));
                    return Some(full);
                }
                Some(self.act(masks * one, false))
            }
            AttentionImpl::Sdpa
                if self.mode.kernels().padding_free
                    || self.any_layer(|l| {
                        l.attention.eager_style == crate::model::EagerStyle::Falcon
                            || (q_len > 1
                                && l.attention.sliding_window.is_some_and(|w| {
                                    u128::from(w) < kv_len
                                        || (!self.mode.is_infer() && u128::from(w) == kv_len)
                                }))
                    }) =>
            {
                // Llama 4's chunked mask does not broadcast over the batch: its mask function
                // reads `left_padding[batch_idx]` (transformers 5.23 masking_utils.py
                // `chunked_overlay`), so `sdpa_mask` materialises [B, 1, q, kv] (measured:
                // rdist83-012-llama4text, batch 2, one [2, 1, 691, 691] bool alive through the
                // forward, forward -5.3% with [1, 1, q, kv])
                let per_row = q_len > 1
                    && self.any_layer(|l| {
                        l.attention.chunked
                            && l.attention
                                .sliding_window
                                .is_some_and(|w| u128::from(w) < kv_len)
                    });
                let rows = if per_row { self.batch } else { 1 };
                Some(self.act(rows * q_len * kv_len, false))
            }
            // A sliding-window mask the model builds but no layer reads
            // (`ModelDesc::sliding_mask_window`): `sdpa_mask` cannot skip it once the keys
            // reach its window (`_ignore_causal_mask_sdpa` returns False when `kv_length >=
            // local_attention_size`, before the `is_causal` test), so it materialises the
            // broadcast boolean [1, 1, q, kv] (no padding mask is passed), a local of the base
            // model's forward until it returns, decode steps included. Qwen 2 MoE without
            // `use_sliding_window` builds it with a window of 0 (configuration_qwen2_moe.py
            // line 113), so on every forward (measured: rdist179-016-qwen2moe, one [1, 1, 256,
            // 256] bool alive through the decoder stack, forward -2.09% without it;
            // rnd-i17-011-qwen2moe's prefill 625 B = 25 × 25 short, qwen2moe-4l-base's decode
            // 527 B = 512 + 15 keys short)
            AttentionImpl::Sdpa
                if self.model.builds_both_masks
                    && !self.any_layer(|l| l.attention.sliding_window.is_some())
                    && self
                        .model
                        .sliding_mask_window
                        .is_some_and(|w| kv_len >= u128::from(w)) =>
            {
                self.unused_mask = Some(self.act(q_len * kv_len, false));
                None
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::dtype::Precision;
    use crate::memory::{simulate_train, Kernels, Phase};
    use crate::model::tests::llama2_7b;
    use crate::model::{Mlp, ModelDesc, NormKind, QkNormScope};
    use crate::workload::{AttentionImpl, TrainWorkload};

    fn peak(m: &ModelDesc, w: &TrainWorkload, phase: Phase) -> u64 {
        let e = simulate_train(m, w, Kernels::Cuda).unwrap();
        e.phase_peak(phase).unwrap()
    }

    /// Llama-2-7B's first two layers.
    fn two_layers() -> ModelDesc {
        let mut m = llama2_7b();
        m.layers.truncate(2);
        m
    }

    /// A sliding-window mask the model builds and no layer reads (Qwen 2 MoE): SDPA
    /// materialises it once the keys reach its window, one broadcast [1, 1, S, S] bool alive
    /// through the forward, and skips it below (rdist179-016-qwen2moe, h52 fixtures).
    #[test]
    fn an_unread_sliding_mask_is_materialised_from_its_window_on() {
        let (batch, seq) = (3u64, 256u64);
        let forward = |window: Option<u64>| {
            let mut m = two_layers();
            m.builds_both_masks = true;
            m.sliding_mask_window = window;
            peak(&m, &TrainWorkload::new(batch, seq), Phase::Forward)
        };
        let none = forward(None);
        let mask = seq * seq;
        assert_eq!(forward(Some(0)), none + mask);
        assert_eq!(forward(Some(seq)), none + mask);
        assert_eq!(forward(Some(seq + 1)), none);
        assert_eq!(forward(Some(4096)), none);
        // a layer that reads the sliding mask makes it the read one (no second mask)
        let mut m = two_layers();
        m.layers[0].attention.sliding_window = Some(64);
        m.builds_both_masks = true;
        let read = peak(&m, &TrainWorkload::new(batch, seq), Phase::Forward);
        m.sliding_mask_window = Some(64);
        assert_eq!(
            peak(&m, &TrainWorkload::new(batch, seq), Phase::Forward),
            read
        );
    }

    /// Llama 4's chunked mask under SDPA is one [B, 1, q, kv] bool (its mask function indexes
    /// the per-sequence left padding), a sliding window's one broadcast [1, 1, q, kv].
    #[test]
    fn the_sdpa_chunked_mask_is_per_sequence() {
        use crate::memory::hf::Builder;
        let mask_bytes = |chunked: bool, batch: u64| {
            let mut m = two_layers();
            for l in &mut m.layers {
                l.attention.sliding_window = Some(64);
                l.attention.chunked = chunked;
            }
            let w = TrainWorkload::new(batch, 256);
            let mut b = Builder::train(&m, &w, Kernels::Cpu, None);
            let id = b.causal_mask(256, 256).unwrap();
            b.t.bytes(id)
        };
        assert_eq!(mask_bytes(true, 3), 3 * 256 * 256);
        assert_eq!(mask_bytes(true, 1), 256 * 256);
        assert_eq!(mask_bytes(false, 3), 256 * 256);
    }

    #[test]
    fn a_dtype_keeping_softmax_saves_fp32_probabilities_under_autocast() {
        // GPT-2's eager softmax keeps its input's dtype, but under autocast the fp32 mask has
        // made that input fp32: the softmax output is saved in fp32 beside the compute-dtype
        // copy, as with an explicit fp32 upcast (measured: rnd-t71-028-gpt2, -9.5% with the
        // compute-dtype probabilities only); outside autocast it saves the compute dtype only
        let mut m = two_layers();
        for l in &mut m.layers {
            l.attention.rotary_dim = None;
        }
        let (batch, seq) = (2u64, 256u64);
        let mut w = TrainWorkload::new(batch, seq);
        w.attention = AttentionImpl::Eager;
        let at_loss = |m: &mut ModelDesc, w: &TrainWorkload, upcast: bool| {
            for l in &mut m.layers {
                l.attention.eager_softmax_fp32 = upcast;
            }
            peak(m, w, Phase::Loss)
        };
        w.precision = Precision::AmpFp16;
        let keep = at_loss(&mut m, &w, false);
        let upcast = at_loss(&mut m, &w, true);
        assert_eq!(keep, upcast);
        w.precision = Precision::Fp16;
        let keep = at_loss(&mut m, &w, false);
        let upcast = at_loss(&mut m, &w, true);
        let heads = m.layers[0].attention.num_heads();
        let fp32_probs = batch * heads * seq * seq * 4;
        assert_eq!(upcast - keep, m.layers.len() as u64 * fp32_probs);
    }

    #[test]
    fn falcons_biased_projection_is_fp32_under_autocast() {
        // `FalconLinear.forward`: `x @ W.T` (16-bit under autocast) then `+ self.bias` (fp32):
        // the output is fp32 and the 16-bit product is freed; other models' biased linears
        // (`F.linear`, one autocast op) and Falcon outside autocast keep the compute dtype
        use crate::memory::hf::Builder;
        use crate::model::EagerStyle;
        let out = |falcon: bool, precision: Precision| {
            let mut m = two_layers();
            for l in &mut m.layers {
                l.attention.o_bias = true;
                if falcon {
                    l.attention.eager_style = EagerStyle::Falcon;
                }
            }
            let mut w = TrainWorkload::new(2, 16);
            w.precision = precision;
            let mut b = Builder::train(&m, &w, Kernels::Cpu, None);
            b.build_params();
            let lin = b.layers[0]
                .linears
                .iter()
                .find(|(r, _)| *r == crate::model::LinearRole::O)
                .map(|(_, l)| *l)
                .unwrap();
            assert!(lin.b.is_some());
            let rows = 32u128;
            let x = b.act(rows * lin.in_f * 2, true);
            let (y, ys) = b.linear(x, 2, rows, &lin);
            (ys, b.t.bytes(y), rows * lin.out_f)
        };
        let (ys, bytes, n) = out(true, Precision::AmpBf16);
        assert_eq!((ys, bytes), (4, n * 4));
        let (ys, bytes, n) = out(false, Precision::AmpBf16);
        assert_eq!((ys, bytes), (2, n * 2));
        let (ys, bytes, n) = out(true, Precision::Bf16);
        assert_eq!((ys, bytes), (2, n * 2));
    }

    #[test]
    fn falcon_multi_query_keeps_matmuls_broadcast_copies_past_a_batch_of_one() {
        // Falcon multi_query: one k/v head that matmul broadcasts; with a batch above one the
        // expand + reshape copies it and bmm saves the copy (two [B, H, S, D] per layer kept
        // into the loss), with a batch of one the reshape is a view and nothing is copied
        use crate::model::{AttentionKind, EagerStyle};
        let (heads, hd, seq) = (8u64, 64u64, 128u64);
        let mut m = two_layers();
        for l in &mut m.layers {
            l.attention.kind = AttentionKind::Standard {
                num_heads: heads,
                num_kv_heads: 1,
                head_dim: hd,
            };
            l.attention.eager_style = EagerStyle::Falcon;
            l.attention.eager_softmax_fp32 = false;
        }
        let at_loss = |m: &mut ModelDesc, batch: u64, on: bool| {
            for l in &mut m.layers {
                l.attention.kv_broadcast = on;
            }
            let mut w = TrainWorkload::new(batch, seq);
            w.attention = AttentionImpl::Eager;
            w.precision = Precision::Fp32;
            peak(m, &w, Phase::Loss)
        };
        assert_eq!(at_loss(&mut m, 1, true), at_loss(&mut m, 1, false));
        let batch = 3;
        let (on, off) = (at_loss(&mut m, batch, true), at_loss(&mut m, batch, false));
        let layers = m.layers.len() as u64;
        let copy = batch * heads * seq * hd * 4;
        let single = batch * seq * hd * 4;
        // the copies, less at most the single-head k and v they no longer keep
        assert!(
            on >= off + 2 * layers * (copy - single),
            "on {on}, off {off}"
        );
        assert!(on <= off + 2 * layers * copy, "on {on}, off {off}");
    }

    /// A CPU training builder over `m`, its parameters built.
    fn kernel_builder<'a>(
        m: &'a ModelDesc,
        w: &'a TrainWorkload,
    ) -> crate::memory::hf::Builder<'a> {
        let mut b = crate::memory::hf::Builder::train(m, w, Kernels::Cpu, None);
        b.build_params();
        b
    }

    /// The live bytes left once the attention kernel of `a` has run on `q`, `k`, `v` (`size`
    /// bytes per element, `heads` heads of `hd`) and every tensor of the call is dropped.
    fn kernel_leaves(
        b: &mut crate::memory::hf::Builder<'_>,
        (q, k, v): (
            crate::memory::timeline::TensorId,
            crate::memory::timeline::TensorId,
            crate::memory::timeline::TensorId,
        ),
        size: u128,
        (heads, hd): (u128, u128),
        a: &crate::model::Attention,
    ) -> u128 {
        let call = crate::memory::hf::CoreCall {
            slot: 0,
            q: (q, size),
            k: (k, size),
            v: (v, size),
            heads,
            kv_heads: heads,
            qk_dim: hd,
            v_dim: hd,
            q_bhsd: false,
            v_broadcast: false,
        };
        let o = b.attention_kernel(call, a);
        for t in [o, q, k, v] {
            b.drop_(t);
        }
        b.t.live()
    }

    #[test]
    fn the_math_kernels_value_product_keeps_the_dropped_probabilities_for_a_grad_value_only() {
        // CPU SDPA with attention dropout (the math kernel): `attn @ value` saves the dropped
        // fp32 probabilities only when the value needs a gradient (a frozen v path, layer 0 of
        // a LoRA model without a v_proj adapter, keeps none; measured: rnd-t53-019-granite)
        let (batch, seq) = (2u64, 64u64);
        let mut m = two_layers();
        m.dropout.attention = 0.1;
        let mut w = TrainWorkload::new(batch, seq);
        w.attention = AttentionImpl::Sdpa;
        w.precision = Precision::Bf16;
        w.dropout = true;
        let a = m.layers[0].attention;
        let heads = u128::from(a.num_heads());
        let hd = 128u128;
        let rows = u128::from(batch * seq);
        let kept = |value_grad: bool| {
            let mut b = kernel_builder(&m, &w);
            let n = rows * heads * hd * 2;
            let qkv = (b.act(n, true), b.act(n, true), b.act(n, value_grad));
            kernel_leaves(&mut b, qkv, 2, (heads, hd), &a)
        };
        let probs = u128::from(batch * seq * seq) * heads * 4;
        assert_eq!(kept(true) - kept(false), probs);
    }

    #[test]
    fn eager_mqa_copies_the_single_kv_head_at_each_matmul() {
        // One kv head: repeat_kv is a view; with a batch above one matmul copies the expanded
        // key for the scores and the expanded value for `probs @ value`, and bmm saves each
        // copy. With a gradient only the key's copy is alive at the softmax (the kernel's peak),
        // one [B, H, S, D] more than with every head's k and v given; without one (a
        // checkpointed layer's first pass) the copies are temporaries of each matmul and the
        // peak is the multi-head one (measured: rdist191-017-granitemoehybrid, forward +1.93%
        // with both copies kept from repeat_kv on)
        let (batch, seq) = (2u64, 128u64);
        let m = two_layers();
        let mut w = TrainWorkload::new(batch, seq);
        w.attention = AttentionImpl::Eager;
        w.precision = Precision::Fp16;
        let a = m.layers[0].attention;
        let heads = u128::from(a.num_heads());
        // a head dim well below the sequence, so that the softmax is the kernel's peak (not
        // the output's copy, where bmm has saved both copies)
        let hd = 16u128;
        let rows = u128::from(batch * seq);
        let full = rows * heads * hd * 2;
        let peak_above_start = |kv_heads: u128, recording: bool| {
            let mut b = kernel_builder(&m, &w);
            let kv = full / heads * kv_heads;
            let (q, k, v) = (b.act(full, true), b.act(kv, true), b.act(kv, true));
            b.t.recording = recording;
            b.t.reset_peak();
            let start = b.t.live();
            let call = crate::memory::hf::CoreCall {
                slot: 0,
                q: (q, 2),
                k: (k, 2),
                v: (v, 2),
                heads,
                kv_heads,
                qk_dim: hd,
                v_dim: hd,
                q_bhsd: false,
                v_broadcast: false,
            };
            b.attention_kernel(call, &a);
            b.t.peak() - start
        };
        assert_eq!(
            peak_above_start(1, true),
            peak_above_start(heads, true) + full
        );
        assert_eq!(peak_above_start(1, false), peak_above_start(heads, false));
    }

    #[test]
    fn gpt2s_fused_key_and_value_views_are_copied_for_bmm_without_a_cache() {
        // GPT-2 without a KV cache: q, k and v are strided views of c_attn's output, which
        // matmul copies for bmm when the batch and the heads exceed one; bmm saves the three
        // copies and the fused output goes with the attention's locals, so the eager kernel
        // keeps what it keeps for contiguous (cached) keys and values (measured:
        // rnd-t17-058-gpt2, one [B, S, E] per layer over while the fused output was kept)
        let (batch, seq) = (2u64, 64u64);
        let mut m = two_layers();
        for l in &mut m.layers {
            l.attention.fused_qkv = true;
            l.attention.rotary_dim = None;
        }
        let mut w = TrainWorkload::new(batch, seq);
        w.attention = AttentionImpl::Eager;
        w.precision = Precision::Fp32;
        let a = m.layers[0].attention;
        let heads = u128::from(a.num_heads());
        let hd = 128u128;
        let n = u128::from(batch * seq) * heads * hd * 4;
        let kept = |views: bool| {
            let mut b = kernel_builder(&m, &w);
            let qkv = if views {
                let y = b.act(3 * n, true);
                b.t.retain(y);
                b.t.retain(y);
                (y, y, y)
            } else {
                (b.act(n, true), b.act(n, true), b.act(n, true))
            };
            kernel_leaves(&mut b, qkv, 4, (heads, hd), &a)
        };
        assert_eq!(kept(true), kept(false));
    }

    #[test]
    fn inline_qk_norms_run_before_the_next_projection() {
        // Qwen 3: `q_norm(q_proj(x))`, then `k_norm(k_proj(x))`, then `v_proj(x)`; inside a
        // checkpointed region nothing is saved, so the raw projections die at their norms and
        // the value projection does not exist yet while they run
        // a narrow MLP, so that the attention block holds the checkpointed forward's peak
        let mut m = two_layers();
        for l in &mut m.layers {
            l.attention.qk_norm = Some((QkNormScope::PerHead, NormKind::RmsNorm));
            if let Mlp::Dense(d) = &mut l.mlp {
                d.intermediate = 512;
            }
        }
        let mut w = TrainWorkload::new(2, 256);
        w.checkpointing = true;
        let separate = peak(&m, &w, Phase::Forward);
        for l in &mut m.layers {
            l.attention.qk_norm_inline = true;
        }
        let inline = peak(&m, &w, Phase::Forward);
        assert!(inline < separate, "inline {inline}, separate {separate}");
    }

    #[test]
    fn an_unread_causal_mask_lives_through_the_forward_only() {
        // every layer sliding: one mask read by the layers; Gemma 2/3 build the full one too,
        // alive until the base model returns, never held into the loss or the backward
        let mut m = two_layers();
        for l in &mut m.layers {
            l.attention.sliding_window = Some(16);
        }
        let (batch, seq) = (2, 64);
        let mut w = TrainWorkload::new(batch, seq);
        w.attention = AttentionImpl::Eager;
        for checkpointing in [false, true] {
            w.checkpointing = checkpointing;
            m.builds_both_masks = false;
            let one = [Phase::Forward, Phase::Loss, Phase::Backward].map(|p| peak(&m, &w, p));
            m.builds_both_masks = true;
            let both = [Phase::Forward, Phase::Loss, Phase::Backward].map(|p| peak(&m, &w, p));
            // one [B, 1, S, S] additive mask in the bf16 compute dtype
            let mask = batch * seq * seq * 2;
            assert_eq!(both[0], one[0] + mask, "checkpointing {checkpointing}");
            assert_eq!(both[1..], one[1..], "checkpointing {checkpointing}");
        }
    }

    #[test]
    fn each_mask_goes_with_the_last_checkpoint_of_its_type() {
        // two masks, each held by the checkpoints of its type's layers only: once the last
        // layer reading one has been recomputed and differentiated, that mask is gone, so
        // layer 0's backward (the backward peak: the eager scores of a long sequence, a small
        // vocabulary) holds only its own type's mask (measured:
        // qwen2-sw128-b3-s120-ckpt-fp32-sgd, +0.37% with both held to the end)
        let (batch, seq) = (2, 1024);
        let mut w = TrainWorkload::new(batch, seq);
        w.attention = AttentionImpl::Eager;
        w.checkpointing = true;
        let mask = batch * seq * seq * 2;
        for sliding_first in [false, true] {
            let mut m = two_layers();
            m.embeddings.vocab_size = 64;
            m.layers[usize::from(!sliding_first)]
                .attention
                .sliding_window = Some(2048);
            m.builds_both_masks = false;
            let one = [Phase::Forward, Phase::Backward].map(|p| peak(&m, &w, p));
            m.builds_both_masks = true;
            let both = [Phase::Forward, Phase::Backward].map(|p| peak(&m, &w, p));
            assert_eq!(both[0], one[0] + mask, "sliding first {sliding_first}");
            assert_eq!(both[1], one[1], "sliding first {sliding_first}");
        }
    }

    #[test]
    fn both_layer_types_read_both_masks_whatever_the_window() {
        // Cohere 2 / Gemma with a sliding layer and a global one: each layer reads its type's
        // mask, so with a window longer than the sequence both masks are still read, and a
        // checkpointed step holds both until the recompute (measured: rnd-t61-050-cohere2)
        let mut m = two_layers();
        m.layers[0].attention.sliding_window = Some(128);
        let (batch, seq) = (2, 64);
        let mut w = TrainWorkload::new(batch, seq);
        w.attention = AttentionImpl::Eager;
        w.checkpointing = true;
        m.builds_both_masks = false;
        let one = peak(&m, &w, Phase::Loss);
        m.builds_both_masks = true;
        let both = peak(&m, &w, Phase::Loss);
        // at the loss, after the base model has returned, only the checkpoint holds masks
        let mask = batch * seq * seq * 2;
        assert_eq!(both, one + mask);
    }

    /// The bytes a training forward of layer 0's attention leaves saved (its output and input
    /// dropped), for an MLA attention of `heads` heads (no q LoRA, latent 32, nope 32, rope 16,
    /// value 32) over `batch` × 16 tokens in bf16 eager attention, with or without a training
    /// KV cache (whose copies the model output holds).
    fn mla_attention_leaves(heads: u64, batch: u64, cache: bool) -> u128 {
        use crate::model::AttentionKind;
        let mut m = two_layers();
        for l in &mut m.layers {
            l.attention.kind = AttentionKind::Mla {
                num_heads: heads,
                q_lora_rank: None,
                kv_lora_rank: 32,
                qk_nope_head_dim: 32,
                qk_rope_head_dim: 16,
                v_head_dim: 32,
            };
            l.attention.qk_norm = None;
        }
        let mut w = TrainWorkload::new(batch, 16);
        w.attention = AttentionImpl::Eager;
        w.precision = Precision::Bf16;
        w.step_options.use_cache = Some(cache);
        let mut b = kernel_builder(&m, &w);
        let a = m.layers[0].attention;
        let lp = b.layers[0].clone();
        let before = b.t.live();
        let x = b.act(u128::from(batch * 16 * m.hidden_size) * 2, true);
        let y = b.attention(x, 2, &a, &lp, false);
        b.drop_(y);
        b.drop_(x);
        b.t.live() - before
    }

    #[test]
    fn mla_values_copy_for_bmm_only_with_batch_heads_and_keys_above_one() {
        // The value is a strided slice of kv_b_proj's output; matmul's reshape to [B·H, S, v]
        // is a view when B or H is one (a size-1 dim merges with any stride), and bmm then
        // saves the projection output itself (traced: rnd-s197-deepseekv3-0, one head, b2);
        // otherwise it saves a [B, H, S, v] copy and the output goes. With one head the saved
        // bytes are linear in the batch; with two, the second sequence swaps the output's
        // non-value part (B·S·H·nope) for nothing.
        let (l1, l2) = (
            mla_attention_leaves(1, 1, false),
            mla_attention_leaves(1, 2, false),
        );
        assert_eq!(l2, 2 * l1);
        let (l1, l2) = (
            mla_attention_leaves(2, 1, false),
            mla_attention_leaves(2, 2, false),
        );
        let rows2 = 2 * 16;
        assert_eq!(2 * l1 - l2, rows2 * 2 * 32 * 2);
    }

    #[test]
    fn an_mla_training_cache_holds_the_rotated_keys_copy_beside_the_saved_latent() {
        // `past_key_values.update(kv_nope, k_rot)` copies both latents into the DynamicCache;
        // kv_b_proj saves the latent's copy in place of the norm's output (same bytes), and the
        // rotated key's copy (B·S·rope, bf16) is held by the cache alone (traced:
        // rnd-s197-deepseekv3-0 b2 × 30, the [2, 1, 30, 16] `cat` alive after the forward)
        for (heads, batch) in [(1, 2), (2, 3)] {
            let on = mla_attention_leaves(heads, batch, true);
            let off = mla_attention_leaves(heads, batch, false);
            assert_eq!(on - off, u128::from(batch) * 16 * 16 * 2);
        }
    }

    #[test]
    fn autocast_casts_a_single_kv_heads_repeat_view_to_every_head() {
        // A sliding-window mask turns transformers' SDPA GQA into `repeat_kv`, a zero-stride
        // view for one kv head; under autocast SDPA casts it to bf16 as a full [B, H, S, D]
        // tensor and saves that (traced: rnd-s197-gemma3text-0 under amp-bf16). Saved: q, k
        // and v at every head, the output, the logsumexp and the additive mask.
        let (batch, seq, heads, hd) = (2u64, 64u64, 4u128, 32u128);
        let mut m = two_layers();
        m.layers[0].attention.sliding_window = Some(8);
        let mut w = TrainWorkload::new(batch, seq);
        w.attention = AttentionImpl::Sdpa;
        w.precision = Precision::AmpBf16;
        let a = m.layers[0].attention;
        let mut b = kernel_builder(&m, &w);
        let rows = u128::from(batch * seq);
        let before = b.t.live();
        let q = b.act(rows * heads * hd * 4, true);
        let k = b.act(rows * hd * 4, true);
        let v = b.act(rows * hd * 4, true);
        let call = crate::memory::hf::CoreCall {
            slot: 0,
            q: (q, 4),
            k: (k, 4),
            v: (v, 4),
            heads,
            kv_heads: 1,
            qk_dim: hd,
            v_dim: hd,
            q_bhsd: false,
            v_broadcast: false,
        };
        let o = b.attention_kernel(call, &a);
        for t in [o, q, k, v] {
            b.drop_(t);
        }
        let full = rows * heads * hd * 2;
        let lse = rows * heads * 4;
        let mask = u128::from(batch * seq * seq) * 2;
        assert_eq!(b.t.live() - before, 4 * full + lse + mask);
    }
}
