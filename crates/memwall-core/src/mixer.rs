//! Token mixers other than attention: the layer kind of state-space (Mamba-2) layers.
//!
//! A decoder layer mixes information across positions with its *token mixer* and then applies
//! its feed-forward block. Every attention family uses [`Mixer::Attention`] (the layer's
//! [`crate::model::LayerSpec::attention`] block); state-space families replace it with a
//! recurrent mixer whose inference state has a fixed size instead of a growing KV cache.
//! Sizes, parameter counts and memory events are computed from these descriptions generically,
//! like the attention block's.

use crate::model::{LinearRole, LinearShape};
use serde::Serialize;

/// The token mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mixer {
    /// The layer's attention block ([`crate::model::LayerSpec::attention`]).
    Attention,
    /// A Mamba-2 mixer (selective state space with scalar-per-head decay) instead of attention;
    /// the layer's `attention` field is unused.
    Mamba2(Mamba2),
}

impl Mixer {
    /// Whether the mixer is the layer's attention block (the default of every attention family).
    pub fn is_attention(&self) -> bool {
        matches!(self, Mixer::Attention)
    }
}

/// A Mamba-2 mixer, `Mamba2Mixer` in transformers `models/mamba2/modeling_mamba2.py` (5.23):
///
/// ```text
/// zxbcdt = in_proj(x)                       # [B, S, I + conv_dim + H]
/// z, xBC, dt = split(zxbcdt, [I, conv_dim, H])
/// xBC = silu(depthwise causal conv1d(xBC))  # conv_dim channels, kernel `conv_kernel`
/// x, B, C = split(xBC, [I, G·N, G·N])
/// y = ssd_scan(x, dt + dt_bias, -exp(A_log), B, C, D, chunk_size)
/// out = out_proj(gated_rms_norm(y, z))       # MambaRMSNormGated, groups of I / G
/// ```
///
/// with `I = expand · hidden` (= `num_heads · head_dim`), `G = n_groups`, `N = state_size`,
/// `conv_dim = I + 2·G·N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mamba2 {
    /// SSM heads (`num_heads`); each has a scalar decay `A`, a `dt` and a skip `D`.
    pub num_heads: u64,
    /// Channels per head (`head_dim`).
    pub head_dim: u64,
    /// Groups sharing one `B` and `C` (`n_groups`).
    pub n_groups: u64,
    /// SSM state size per channel (`state_size`, `N`).
    pub state_size: u64,
    /// Depthwise convolution width (`conv_kernel`).
    pub conv_kernel: u64,
    /// Inner width `I` (`int(expand · hidden_size)`).
    pub intermediate: u64,
    /// Chunk length of the chunked scan (`chunk_size`).
    pub chunk_size: u64,
    /// Biases on `in_proj` / `out_proj` (`use_bias`).
    pub proj_bias: bool,
    /// Bias on the convolution (`use_conv_bias`).
    pub conv_bias: bool,
    /// The block keeps its residual in fp32 (`residual_in_fp32`: `residual.to(torch.float32)`
    /// in `Mamba2Block.forward`).
    pub residual_in_fp32: bool,
}

impl Mamba2 {
    /// Channels of the convolution: `I + 2·G·N` (x, B and C).
    pub fn conv_dim(&self) -> u64 {
        self.intermediate + 2 * self.n_groups * self.state_size
    }

    /// Output width of `in_proj`: `I + conv_dim + H` (z, xBC, dt).
    pub fn in_proj_width(&self) -> u64 {
        self.intermediate + self.conv_dim() + self.num_heads
    }

    /// The two projections, in forward order (`in_proj`, `out_proj`).
    pub fn linears(&self, hidden: u64) -> Vec<LinearShape> {
        vec![
            LinearShape {
                role: LinearRole::SsmIn,
                in_features: hidden,
                out_features: self.in_proj_width(),
                bias: self.proj_bias,
            },
            LinearShape {
                role: LinearRole::SsmOut,
                in_features: self.intermediate,
                out_features: hidden,
                bias: self.proj_bias,
            },
        ]
    }

    /// The mixer's parameters that are not projections, as transformers registers them:
    /// `dt_bias`, `A_log`, `D` (one per head), `conv1d.weight` (`conv_dim × 1 × kernel`),
    /// `conv1d.bias`, and the gated norm's weight (`I`).
    pub fn other_params(&self) -> u128 {
        let h = u128::from(self.num_heads);
        let conv = u128::from(self.conv_dim());
        let mut p = 3 * h + conv * u128::from(self.conv_kernel) + u128::from(self.intermediate);
        if self.conv_bias {
            p += conv;
        }
        p
    }

    /// Parameters of the mixer.
    pub fn params(&self, hidden: u64) -> u128 {
        let linears: u128 = self.linears(hidden).iter().map(LinearShape::params).sum();
        linears + self.other_params()
    }

    /// Elements of one sequence's inference state: the convolution state
    /// (`conv_dim × conv_kernel`, `LinearAttentionLayer.lazy_initialization` in transformers
    /// `cache_utils.py`) and the SSM state (`H × head_dim × N`).
    pub fn state_elems(&self) -> (u128, u128) {
        let conv = u128::from(self.conv_dim()) * u128::from(self.conv_kernel);
        let ssm =
            u128::from(self.num_heads) * u128::from(self.head_dim) * u128::from(self.state_size);
        (conv, ssm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mistralai/Mamba-Codestral-7B-v0.1's mixer.
    pub(crate) fn codestral() -> Mamba2 {
        Mamba2 {
            num_heads: 128,
            head_dim: 64,
            n_groups: 8,
            state_size: 128,
            conv_kernel: 4,
            intermediate: 8192,
            chunk_size: 256,
            proj_bias: false,
            conv_bias: true,
            residual_in_fp32: true,
        }
    }

    #[test]
    fn codestral_mixer_params() {
        // in_proj 4096 × 18560, out_proj 8192 × 4096, conv 10240 × 4 + 10240, 3 × 128, norm 8192
        let m = codestral();
        assert_eq!(m.conv_dim(), 10240);
        assert_eq!(m.in_proj_width(), 18560);
        assert_eq!(
            m.params(4096),
            4096 * 18560 + 8192 * 4096 + 10240 * 5 + 3 * 128 + 8192
        );
        assert_eq!(m.state_elems(), (40960, 128 * 64 * 128));
    }
}
