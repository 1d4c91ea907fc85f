//! Layers whose token mixer is attention and a Mamba-2 mixer side by side
//! ([`crate::mixer::Mixer::AttentionAndMamba2`]), as `FalconH1DecoderLayer.forward` runs them
//! (transformers 5.23 `models/falcon_h1/modeling_falcon_h1.py`):
//!
//! ```text
//! h = input_layernorm(x)
//! m = mamba(h)                       # FalconH1Mixer: h * ssm_in_multiplier, in_proj, * mup_vector, …
//! m = m * ssm_out_multiplier
//! a = self_attn(h * attention_in_multiplier)
//! a = a * attn_out_multiplier
//! x = x + (m + a)
//! ```
//!
//! The two branches reuse the Mamba-2 replay (`ssm.rs`) and the attention replay
//! (`attention.rs`); the µP multiplications ([`crate::model::ScalarMuls`]) are scalar `mul`s,
//! each a new tensor that saves nothing.

use super::{Builder, LayerParams};
use crate::memory::timeline::TensorId;
use crate::mixer::Mamba2;
use crate::model::LayerSpec;

impl Builder<'_> {
    /// `y * scalar` when `on` (a new tensor of `bytes`; the input is dropped), else `y`.
    fn scalar_mul(&mut self, y: TensorId, bytes: u128, on: bool) -> TensorId {
        if !on {
            return y;
        }
        let z = self.op(bytes, &[y], &[], &[], &[]);
        self.drop_(y);
        z
    }

    /// Both mixers of one layer on the normed input `n` (kept by the caller); returns
    /// `mamba_out + attn_out`, the tensor the residual add reads.
    pub(super) fn parallel_mixers(
        &mut self,
        n: TensorId,
        n_size: u128,
        lp: &LayerParams,
        m: &Mamba2,
        spec: &LayerSpec,
        ckpt: bool,
    ) -> TensorId {
        let rows = self.tokens;
        let h = self.hidden;
        let c = self.compute_size;
        let muls = spec.muls;
        // FalconH1Mixer.forward: `hidden_states = hidden_states * self.ssm_in_multiplier`, bound
        // to the mixer's local until the split rebinds it (`mamba2_mixer` drops it after
        // `in_proj`, which saves it in training)
        let y = if muls.ssm_in {
            let xin = self.op(rows * h * n_size, &[n], &[], &[], &[]);
            self.mamba2_mixer(xin, n_size, lp, m)
        } else {
            self.mamba2_mixer(n, n_size, lp, m)
        };
        let y = self.scalar_mul(y, rows * h * c, muls.ssm_out);
        // `self.self_attn(hidden_states=hidden_states * self.attention_in_multiplier, …)`: the
        // argument is a temporary of the call (its projections save it)
        let ain = if muls.attn_in {
            self.op(rows * h * n_size, &[n], &[], &[], &[])
        } else {
            self.retain_id(n)
        };
        let a = self.attention(ain, n_size, &spec.attention, lp, ckpt);
        self.drop_(ain);
        let a = self.scalar_mul(a, rows * h * c, muls.attn_out);
        // `hidden_states = mamba_hidden_states + attention_hidden_states`
        let sum = self.op(rows * h * c, &[y, a], &[], &[], &[]);
        self.drop_(y);
        self.drop_(a);
        sum
    }
}
