//! Linear-attention layers: `Qwen3NextGatedDeltaNet` (transformers 5.23
//! `models/qwen3_next/modeling_qwen3_next.py`) on the path transformers takes without
//! flash-linear-attention and `causal_conv1d` — `causal_conv1d_fn`'s `F.conv1d` fallback and
//! `torch_chunk_gated_delta_rule` (chunks of 64, everything in fp32) in training and prefill,
//! `causal_conv1d_update` and `torch_recurrent_gated_delta_rule` in decode. That is what the
//! fake-tensor truth harness runs (the kernels need CUDA).
//!
//! The three projections (`in_proj_qkvz`, `in_proj_ba`, `out_proj`) are ordinary linears
//! replayed op by op. Between them — head reordering copies, convolution, `beta`/`g`, the
//! chunked delta rule (l2 norms, the `[chunk, chunk]` decay and UT-transform matrices, two
//! triangular solves, a loop over chunks that saves every chunk's recurrent state) and the gated
//! RMSNorm — the mixer runs about 150 tensor ops; they are replayed as one composite autograd
//! node whose bytes come from the closed forms below, read off allocation traces of one mixer
//! under `FakeTensorMode` (`tools/truth/probes/deltanet_mixer.py`, every storage allocation and
//! free). [`Sizes::saved`] holds byte for byte in bf16 for batch 1–4, 128–1024 tokens, padded
//! and unpadded; the forward transients are exact in bf16 at batch ≤ 2 and one
//! `[tokens, value_dim]` tensor low at batch 4 × 128; the backward, no-grad and fp32 forms are
//! fitted to the probed cases (within a few MiB per layer; `docs/ssm.md` lists them).

use super::{Builder, LayerParams};
use crate::memory::timeline::{Category, Ids, Node, TensorId};
use crate::mixer::GatedDeltaNet;
use crate::model::LinearRole;

/// fp32: the delta rule casts everything to fp32.
const F: u128 = 4;

/// The sizes of one mixer call (`b` sequences of `s` tokens), in elements.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    b: u128,
    s: u128,
    /// tokens `b·s`
    t: u128,
    /// tokens after padding to whole chunks
    tp: u128,
    /// chunks per sequence
    c: u128,
    /// chunk length
    l: u128,
    /// value heads
    hv: u128,
    /// key head width
    dk: u128,
    /// value head width
    dv: u128,
    /// `value_dim`
    vd: u128,
    /// convolution channels
    cd: u128,
    /// convolution kernel
    k: u128,
}

impl Sizes {
    fn new(m: &GatedDeltaNet, b: u128, s: u128) -> Self {
        let l = u128::from(m.chunk_size).max(1);
        let c = s.div_ceil(l);
        Sizes {
            b,
            s,
            t: b * s,
            tp: b * c * l,
            c,
            l,
            hv: u128::from(m.num_v_heads),
            dk: u128::from(m.k_head_dim),
            dv: u128::from(m.v_head_dim),
            vd: u128::from(m.value_dim()),
            cd: u128::from(m.conv_dim()),
            k: u128::from(m.conv_kernel),
        }
    }

    /// One sequence batch's recurrent states `[B, Hv, dk, dv]` in fp32.
    fn state(&self) -> u128 {
        self.b * self.hv * self.dk * self.dv * F
    }

    /// Bytes autograd keeps after the mixer's forward, `out_proj`'s input excluded (the
    /// projections' outputs are not saved: the head reordering copies them); `z` = bytes per
    /// element of the projections' output.
    fn saved(&self, z: u128) -> u128 {
        let Sizes {
            b,
            s,
            t,
            tp,
            c,
            l,
            hv,
            dk,
            dv,
            vd,
            cd,
            k,
        } = *self;
        let mut v = t * cd * z // cat(q, k, v): the convolution's input
            + b * cd * (s + k - 1) * z // convolution output (silu's input)
            + t * hv * z // beta = sigmoid(b)
            + 2 * t * hv * F + 2 * hv * F // softplus input and output, -exp(A_log)
            + 2 * b * hv * s * dk * F + 2 * b * hv * s * F // fp32 q, k and their l2 rsqrt
            // padded v, beta, k, q; k_beta; 3 decay exps; new_values, k_cumdecay (solves);
            // decayed q and k; every chunk's v_new
            + tp * hv * (3 * dv + 6 * dk + 4) * F
            + 5 * b * hv * c * l * l * F // pairwise decay, UT system and intra-chunk scores
            + l * l // the causal mask (bool)
            + c * self.state() // the recurrent state entering every chunk
            + b * hv * c * F // chunk decays
            // gated RMSNorm: fp32 input, normalised (bf16), weighted, fp32 gate, silu; rsqrt
            + t * vd * (F + 2 + 2 + F + F)
            + t * hv * F;
        if z == F {
            // fp32: the casts are no-ops, and the tensors they would copy are saved instead
            v += 5 * t * vd * F;
        }
        if c == 1 {
            // One chunk: the loop's last state update (`last_recurrent_state * chunk_decay[i] +
            // key[i]ᵀ @ v_new`) is unreachable from the output (`output_final_state=False`),
            // so autograd frees it with what it saved; the decayed query is read only against
            // the zero initial state, which needs no gradient. Nothing else holds the decayed
            // query and key `[B, Hv, L, dk]`, the key's decay `exp` `[B, Hv, L]` and
            // `chunk_decay` `[B, Hv, 1]` (from two chunks on, the earlier chunks' reads of the
            // state keep them). Traced with tools/truth/probes/deltanet_mixer.py at 1, 63, 64,
            // 65 and 128 tokens.
            v -= b * hv * l * (2 * dk + 1) * F + b * hv * F;
        }
        v
    }

    /// Highest bytes alive during the forward above the saved tensors, the projections'
    /// outputs and the output (`out_proj`'s input): at the gated norm's last cast — the `z`
    /// and `b`/`a` copies, the convolution's silu output (bound to `query`/`key`/`value`),
    /// `g`, the variance, the fp32 product, the norm's input.
    fn forward_extra(&self, z: u128) -> u128 {
        let Sizes {
            b,
            s,
            t,
            hv,
            vd,
            cd,
            ..
        } = *self;
        let v = 2 * t * vd * z + 2 * t * hv * z + b * cd * s * z + 2 * t * hv * F + t * vd * F;
        if z == F {
            v.saturating_sub(7 * t * vd * F / 2 + t * hv * F)
        } else {
            v
        }
    }

    /// Highest bytes of a forward that saves nothing (`torch.no_grad()`, a checkpointed
    /// layer's first pass), above the projections' outputs: the chunked rule's fp32 locals —
    /// the `[tokens, value_dim]`-sized ones (fitted at Qwen3-Next's widths) and, traced with
    /// `tools/truth/probes/deltanet_mixer.py … infer` at 1 and 2 tokens, `pairwise_decay`,
    /// `ut_system` and `intra_chunk_attn` `[B, Hv, chunks, L, L]` (fp32) and the bool `[L, L]`
    /// chunk mask, alive through the chunk loop. At real widths the `L × L` locals are ~1% of
    /// the layer's locals; at hidden 64 they are most of them (prefill -21% without them).
    /// At 2+ chunks the peak's moment in the loop differs (measured +2.9% at 3 × 65 tokens,
    /// -0.5% at 150 tokens in fp32, hidden 64): the closed form is not exact there.
    fn forward_unsaved(&self) -> u128 {
        13 * self.tp * self.vd * F
            + self.state()
            + 3 * self.b * self.hv * self.c * self.l * self.l * F
            + self.l * self.l
    }

    /// Transient bytes of the composite's backward above its input and parameter gradients:
    /// the chunk loop's gradient accumulators (`select_backward` buffers over all chunks) less
    /// the gated norm's saved tensors already freed (bf16; none left over in fp32).
    fn backward_temps(&self, z: u128) -> u128 {
        if z == F {
            return 0;
        }
        (2 * self.tp * self.vd * F).saturating_sub(self.state() / 2)
    }

    /// Transient bytes of one decode step (`torch_recurrent_gated_delta_rule`): the decayed
    /// state, the outer-product update and the new state.
    fn decode_peak(&self) -> u128 {
        3 * self.state()
    }
}

impl Builder<'_> {
    /// The mixer's parameters as `Qwen3NextGatedDeltaNet.__init__` registers them: the
    /// projections (linears), then `conv1d.weight` `[conv_dim, 1, kernel]`, `dt_bias`, `A_log`
    /// and the gated norm's weight.
    pub(super) fn deltanet_params(&mut self, m: &GatedDeltaNet, lp: &mut LayerParams) {
        for shape in m.linears(self.model.hidden_size) {
            let lin = self.new_linear(
                Some(shape.role),
                u128::from(shape.in_features),
                u128::from(shape.out_features),
                shape.bias,
            );
            lp.linears.push((shape.role, lin));
        }
        let cd = u128::from(m.conv_dim());
        let k = u128::from(m.conv_kernel);
        let hv = u128::from(m.num_v_heads);
        lp.ssm.push(self.new_matrix(cd * k, cd, k, true));
        lp.ssm.push(self.new_param(hv, true));
        lp.ssm.push(self.new_param(hv, true));
        lp.ssm.push(self.new_param(u128::from(m.v_head_dim), true));
    }

    /// `Qwen3NextGatedDeltaNet.forward`: `in_proj_qkvz`, `in_proj_ba`, the composite, then
    /// `out_proj`; the projections' outputs are locals until the forward returns.
    pub(super) fn deltanet_mixer(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        m: &GatedDeltaNet,
    ) -> TensorId {
        let rows = self.tokens;
        let lin = |role: LinearRole| {
            lp.linears
                .iter()
                .find(|(r, _)| *r == role)
                .map_or_else(super::lin_zero, |(_, l)| *l)
        };
        let (qkvz, zs) = self.linear(x, x_size, rows, lin(LinearRole::SsmIn));
        let (ba, _) = self.linear(x, x_size, rows, lin(LinearRole::SsmGates));
        let inner = self.deltanet_inner(qkvz, ba, zs, x_size, lp, m);
        let (y, _) = self.linear(inner, x_size, rows, lin(LinearRole::SsmOut));
        self.drop_(inner);
        self.drop_(qkvz);
        self.drop_(ba);
        y
    }

    /// Head reordering, convolution, delta rule and gated norm as one node: returns the gated
    /// norm's output (`out_proj`'s input) in the mixer input's dtype.
    fn deltanet_inner(
        &mut self,
        qkvz: TensorId,
        ba: TensorId,
        zs: u128,
        out_size: u128,
        lp: &LayerParams,
        m: &GatedDeltaNet,
    ) -> TensorId {
        let d = Sizes::new(m, self.batch, self.seq);
        let out_bytes = d.t * d.vd * out_size;
        if self.mode.is_infer() {
            return self.deltanet_infer(zs, out_bytes, &d);
        }
        let params: Vec<TensorId> = lp.ssm.iter().map(|p| p.id).collect();
        let rg = self.rg(qkvz) || params.iter().any(|&p| self.t.requires_grad(p));
        if !self.t.recording {
            // a checkpointed layer's first pass: nothing is saved
            self.t.transient(d.forward_unsaved(), Category::Activations);
            return self.act(out_bytes, rg);
        }
        let kept = self.act(d.saved(zs), false);
        self.t
            .transient(d.forward_extra(zs) + out_bytes, Category::Activations);
        let out = self.act(out_bytes, rg);
        if rg {
            self.t.record(Node {
                saved: Ids::of(&[kept]),
                inputs: Ids::of(&[qkvz, ba]),
                params: Ids::of(&params),
                outputs: Ids::of(&[out]),
                backward_temps: d.backward_temps(zs),
                ..Node::default()
            });
        }
        self.drop_(kept);
        out
    }

    /// Inference: the prefill allocates the layer's fixed-size state (conv state
    /// `[B, conv_dim, kernel]` in the projections' dtype, then the fp32 recurrent state
    /// `[B, Hv, dk, dv]`, `LinearAttentionLayer` in transformers `cache_utils.py`); decode
    /// steps update both in place.
    fn deltanet_infer(&mut self, zs: u128, out_bytes: u128, d: &Sizes) -> TensorId {
        let layer = self.cur_layer;
        let has_state = self.cache.get(layer).is_some_and(Option::is_some);
        if has_state && d.s == 1 {
            self.t.transient(d.decode_peak(), Category::Activations);
        } else {
            let conv = self.act(d.b * d.cd * d.k * zs, false);
            // the prefill asks for the final state (`output_final_state=True`): one more
            // state alive besides the chunk loop's (fitted on batch 1–4, 256–512 tokens)
            self.t
                .transient(d.forward_unsaved() + d.state(), Category::Activations);
            let state = self.act(d.state(), false);
            if let Some(slot) = self.cache.get_mut(layer) {
                if let Some((oc, os, _)) = slot.replace((conv, state, 0)) {
                    self.t.release(oc);
                    self.t.release(os);
                }
            }
        }
        self.act(out_bytes, false)
    }
}
