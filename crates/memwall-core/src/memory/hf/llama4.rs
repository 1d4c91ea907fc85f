//! Llama 4's own attention and MoE code paths (transformers 5.23
//! `models/llama4/modeling_llama4.py`): the complex-valued rotary embedding, the weightless L2
//! q/k norm, attention temperature tuning on NoPE layers, and `Llama4TextMoe`, which runs every
//! token through every expert.

use super::{Builder, LayerParams, LinearP, LIN_ZERO, P};
use crate::memory::timeline::{Category, Ids, Node, TensorId};
use crate::model::{Attention, MoeMlp};

impl Builder<'_> {
    /// The rotary table of one forward: `Llama4TextRotaryEmbedding.forward` under `no_grad`
    /// returns `freqs_cis`, complex64 `[1, S, D/2]` (`position_ids` is `arange(S)[None]`), made
    /// from fp32 `freqs` and `ones_like(freqs)` by `torch.polar`, then multiplied by
    /// `attention_scaling` (a new tensor). Returns the table (kept until the forward returns).
    pub(super) fn llama4_rope_table(&mut self, dim: u128) -> TensorId {
        let s = self.seq;
        // `position_ids = arange(S) + past_seen_tokens` (int64), a local of the model's forward
        let pos = self.act(s * 8, false);
        self.out_refs.push(pos);
        // freqs (fp32) + polar (complex64) alive while the scaled copy is made
        self.t
            .transient(s * dim / 2 * 4 + s * dim * 4, Category::Activations);
        let table = self.act(s * dim * 4, false);
        self.out_refs.push(table);
        table
    }

    /// `apply_rotary_emb`, the L2 q/k norm and temperature tuning, in `Llama4TextAttention`'s
    /// order, on q `[rows, heads·dim]` and k `[rows, kv_heads·dim]` of `x_size`-byte elements.
    /// Returns the new q and k (the inputs keep their references; the caller drops them).
    pub(super) fn llama4_qk(
        &mut self,
        (q, k): (TensorId, TensorId),
        x_size: u128,
        (heads, kv_heads, dim): (u128, u128, u128),
        a: &Attention,
    ) -> (TensorId, TensorId) {
        let rows = self.tokens;
        let nq = rows * heads * dim;
        let nk = rows * kv_heads * dim;
        let (mut q, mut k) = (self.retain_id(q), self.retain_id(k));
        if a.rotary_dim.is_some() {
            let table = self.rope_tables.map_or(0, |(t, _)| t);
            // xq_ = view_as_complex(xq.float()...), xk_ likewise; products with freqs_cis
            // (complex64, same bytes as the fp32 copies; `mul` saves the table); `type_as` casts
            // back. All four fp32/complex tensors are locals until the function returns.
            let q32 = self.cast(q, nq * 4);
            let k32 = self.cast(k, nk * 4);
            let qc = self.op(nq * 4, &[q32], &[table], &[], &[nq * 4]);
            let kc = self.op(nk * 4, &[k32], &[table], &[], &[nk * 4]);
            let qo = self.cast(qc, nq * x_size);
            let ko = self.cast(kc, nk * x_size);
            for t in [q32, k32, qc, kc, q, k] {
                self.drop_(t);
            }
            (q, k) = (qo, ko);
        }
        if a.l2_qk_norm {
            let qn = self.l2_norm(q, x_size, rows * heads, dim);
            self.drop_(q);
            let kn = self.l2_norm(k, x_size, rows * kv_heads, dim);
            self.drop_(k);
            (q, k) = (qn, kn);
        }
        if a.temperature_tuning {
            let s = self.seq;
            // positions = arange(S) + past_seen_tokens (int64), then fp32 steps down to
            // attn_scales [S]; both are locals of the attention forward
            let pos = self.act(s * 8, false);
            self.t.transient(2 * s * 4, Category::Activations);
            let scales = self.act(s * 4, false);
            self.attn_locals.push(pos);
            self.attn_locals.push(scales);
            // (query_states * attn_scales) promotes to fp32, then `.to(query_states.dtype)`
            let q32 = self.op(nq * 4, &[q], &[scales], &[], &[]);
            let qt = self.cast(q32, nq * x_size);
            self.drop_(q32);
            self.drop_(q);
            q = qt;
        }
        (q, k)
    }

    /// `Llama4TextL2Norm`: `x.float()`, `x * rsqrt(x.pow(2).mean(-1) + eps)`, `type_as(x)`,
    /// over `rows` rows of `dim`. `pow` and `mul` save the fp32 copy, `rsqrt` its output.
    fn l2_norm(&mut self, x: TensorId, x_size: u128, rows: u128, dim: u128) -> TensorId {
        let n = rows * dim;
        let x32 = if x_size != 4 {
            self.cast(x, n * 4)
        } else {
            self.retain_id(x)
        };
        self.t.transient(n * 4, Category::Activations); // pow(2), freed after mean
        let rs = self.op(rows * 4, &[x32], &[x32], &[], &[]);
        let h32 = self.op(n * 4, &[x32, rs], &[x32, rs], &[], &[2 * n * 4]);
        self.drop_(rs);
        self.drop_(x32);
        if x_size != 4 {
            let y = self.cast(h32, n * x_size);
            self.drop_(h32);
            y
        } else {
            h32
        }
    }

    /// `Llama4TextMoe.forward`: the router (`Llama4Router`: logits, top-k, a `-inf` tensor
    /// scattered with the top values, sigmoid in fp32, cast back), `hidden.repeat(E, 1)` scaled
    /// by each expert's score, `Llama4TextExperts` (`bmm` gate_up, `up * act(gate)`, `bmm` down
    /// over all E experts), the shared expert, and the sum over experts added in place into
    /// the shared expert's output. The router logits are returned to the decoder layer, which
    /// binds them to `_` until it returns.
    pub(super) fn llama4_moe(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        moe: &MoeMlp,
    ) -> TensorId {
        let rows = self.tokens;
        let c = self.compute_size;
        let h = self.hidden;
        let e = u128::from(moe.num_experts);
        let k = u128::from(moe.top_k);
        let i = u128::from(moe.expert.intermediate);
        let router = lp.router.as_ref().unwrap_or(&LIN_ZERO);
        let (logits, _) = self.linear(x, x_size, rows, router);
        // topk: values and int64 indices (saved)
        let idx = self.act(rows * k * 8, false);
        let vals = self.op(rows * k * c, &[logits], &[idx], &[], &[]);
        // full_like(logits, -inf).scatter_(1, indices, values): in place, saves the indices
        let full = self.act(rows * e * c, false);
        if self.rg(vals) {
            self.t.set_requires_grad(full, true);
            self.t.record(Node {
                saved: Ids::of(&[idx]),
                inputs: Ids::of(&[vals]),
                outputs: Ids::of(&[full]),
                ..Node::default()
            });
        }
        self.drop_(idx);
        let f32s = self.cast(full, rows * e * 4);
        self.drop_(full);
        let sig = self.op_saving_output(rows * e * 4, f32s);
        self.drop_(f32s);
        let scores = self.cast(sig, rows * e * c);
        self.drop_(sig);
        self.drop_(vals);
        self.layer_locals.push(logits);
        // routed_in = hidden.repeat(E, 1) * scores.transpose(0, 1).reshape(-1, 1)
        let ek = e * rows;
        let rep = self.op(ek * h * x_size, &[x], &[], &[], &[]);
        let col = self.op(ek * c, &[scores], &[], &[], &[]);
        let routed_in = self.mul(rep, col, ek * h * x_size);
        self.drop_(rep);
        self.drop_(col);
        // Llama4TextExperts: bmm saves its input for the weight's gradient. `bmm` is on
        // autocast's lower-precision list (aten/src/ATen/autocast_mode.cpp, CUDA and CPU), so
        // under autocast it runs as `linear` does: the fp32 expert weight is cast once and
        // cached (saved for the input's gradient), the fp32 `routed_in` is cast per call and the
        // copy saved, and the weight's 16-bit gradient is converted to the fp32 `.grad` by the
        // cast's ToCopyBackward (measured: sw6-llama4 at hidden 64, llama4-tiny-*-ampfp16-sgd).
        let experts_trainable = self.trainable(&lp.experts[0]);
        let gu = if self.amp {
            let gate_up = expert_linear(lp.experts[0], h, 2 * i);
            self.linear(routed_in, x_size, ek, &gate_up).0
        } else {
            let saved_in: &[TensorId] = if experts_trainable { &[routed_in] } else { &[] };
            self.op(
                ek * 2 * i * c,
                &[routed_in],
                saved_in,
                &[lp.experts[0].id],
                &[],
            )
        };
        // `gate, up = gate_up.chunk(2)` are views: `silu(gate)` saves gate and `up * act` saves
        // up and act, i.e. the gate_up storage and act. In backward the two half-size gradients
        // (and the activation's) are cat into one gate_up-sized gradient (SplitBackward): one
        // node whose input gradient is gate_up-sized, with one half-size transient.
        let act = self.act(ek * i * c, false);
        let m = self.op(ek * i * c, &[gu], &[gu, act], &[], &[]);
        self.drop_(act);
        let routed_out = if self.amp {
            let down = expert_linear(lp.experts[1], i, h);
            self.linear(m, c, ek, &down).0
        } else {
            let saved_m: &[TensorId] = if experts_trainable { &[m] } else { &[] };
            self.op(ek * h * c, &[m], saved_m, &[lp.experts[1].id], &[])
        };
        self.drop_(m);
        self.drop_(gu);
        let Some(shared) = &moe.shared else {
            let out = self.op(rows * h * c, &[routed_out], &[], &[], &[]);
            for t in [scores, routed_in, routed_out] {
                self.drop_(t);
            }
            return out;
        };
        let out = self.dense_mlp(x, x_size, rows, shared, &lp.shared);
        // routed_out.reshape(E, T, H).sum(0), added in place into `out`
        let summed = self.op(rows * h * c, &[routed_out], &[], &[], &[]);
        if self.rg(summed) {
            // `add_`'s backward hands the output's gradient on; the output's gradient stays for
            // the shared expert's down projection
            self.t.record(Node {
                inputs: Ids::of(&[summed]),
                ..Node::default()
            });
        }
        self.drop_(summed);
        for t in [scores, routed_in, routed_out] {
            self.drop_(t);
        }
        let _ = k;
        out
    }
}

/// One fused expert weight `[E, in, out]` as the `bmm` operand [`Builder::linear`] models under
/// autocast: `rows` of the call are `E · tokens`, the weight's numel is all experts'.
fn expert_linear(w: P, in_f: u128, out_f: u128) -> LinearP {
    LinearP {
        w,
        nf4: false,
        quantized: false,
        b: None,
        lora: None,
        in_f,
        out_f,
    }
}
