//! Token mixers other than attention: the layer kinds of state-space (Mamba-1, Mamba-2) and
//! linear-attention (gated DeltaNet) layers.
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
    /// A gated DeltaNet linear-attention mixer (Qwen3-Next) instead of attention; the layer's
    /// `attention` field is unused.
    GatedDeltaNet(GatedDeltaNet),
    /// A Mamba-1 mixer (selective scan with a per-channel, per-state decay, `MambaMixer`)
    /// instead of attention; the layer's `attention` field is unused.
    Mamba1(Mamba1),
    /// The layer's attention block **and** a Mamba-2 mixer, run in parallel on the same normed
    /// input, their outputs summed into the residual (Falcon-H1 `FalconH1DecoderLayer.forward`,
    /// transformers 5.23 `models/falcon_h1/modeling_falcon_h1.py`: `mamba(h) * ssm_out +
    /// self_attn(h * attn_in) * attn_out`). The Mamba-2 mixer runs first; the layer keeps both
    /// a KV cache and a fixed-size state at inference.
    AttentionAndMamba2(Mamba2),
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
    /// Bias on `in_proj` (`use_bias`; Falcon-H1 `mamba_proj_bias`).
    pub proj_bias: bool,
    /// Bias on `out_proj` (`use_bias`; Falcon-H1 `projectors_bias`).
    pub out_bias: bool,
    /// The scan output goes through the gated RMSNorm (`MambaRMSNormGated`, weight `[I]`);
    /// without it the output is `scan_output * silu(gate)` (Falcon-H1 with
    /// `mamba_rms_norm = false`: `self.norm = nn.Identity()`).
    pub gated_norm: bool,
    /// The gated norm normalises first and gates after (Falcon-H1 `mamba_norm_before_gate`:
    /// `FalconH1RMSNormGated` computes `(weight · rmsnorm(x)) · silu(gate.float())`); otherwise
    /// it gates first (`MambaRMSNormGated`: `rmsnorm(x · silu(gate.float())) · weight`). The
    /// saved tensors and the forward's bytes are the same; the backward's first instant differs.
    pub norm_before_gate: bool,
    /// Bias on the convolution (`use_conv_bias`).
    pub conv_bias: bool,
    /// The block keeps its residual in fp32 (`residual_in_fp32`: `residual.to(torch.float32)`
    /// in `Mamba2Block.forward`).
    pub residual_in_fp32: bool,
    /// A training forward with `use_cache` on writes the layer's state into the `DynamicCache`
    /// the model builds (`if use_cache and past_key_values is None`: Granite 4.0-H, Falcon-H1);
    /// `Mamba2Model` turns `use_cache` off in training (`config.use_cache if not self.training
    /// else False`, transformers 5.23 `models/mamba2/modeling_mamba2.py`).
    pub state_in_training_cache: bool,
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
                bias: self.out_bias,
            },
        ]
    }

    /// The mixer's parameters that are not projections, as transformers registers them:
    /// `dt_bias`, `A_log`, `D` (one per head), `conv1d.weight` (`conv_dim × 1 × kernel`),
    /// `conv1d.bias`, and the gated norm's weight (`I`) when there is one.
    pub fn other_params(&self) -> u128 {
        let h = u128::from(self.num_heads);
        let conv = u128::from(self.conv_dim());
        let mut p = 3 * h + conv * u128::from(self.conv_kernel);
        if self.gated_norm {
            p += u128::from(self.intermediate);
        }
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

/// A gated DeltaNet mixer, `Qwen3NextGatedDeltaNet` in transformers
/// `models/qwen3_next/modeling_qwen3_next.py` (5.23):
///
/// ```text
/// qkvz = in_proj_qkvz(x)                    # [B, S, 2·Kd + 2·Vd], Kd = Hk·dk, Vd = Hv·dv
/// ba = in_proj_ba(x)                        # [B, S, 2·Hv]
/// q, k, v = silu(depthwise causal conv1d(cat(q, k, v)))   # conv_dim = 2·Kd + Vd channels
/// beta = sigmoid(b); g = -exp(A_log) · softplus(a + dt_bias)
/// y = chunked gated delta rule(l2norm(q), l2norm(k), v, g, beta)   # chunks of 64, fp32
/// out = out_proj(gated_rms_norm(y, z))      # Qwen3NextRMSNormGated over dv per head
/// ```
///
/// The recurrent state per sequence is `[Hv, dk, dv]` plus the convolution state
/// `[conv_dim, kernel]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GatedDeltaNet {
    /// Query/key heads (`linear_num_key_heads`).
    pub num_k_heads: u64,
    /// Value heads (`linear_num_value_heads`), a multiple of the key heads.
    pub num_v_heads: u64,
    /// Query/key head width (`linear_key_head_dim`).
    pub k_head_dim: u64,
    /// Value head width (`linear_value_head_dim`).
    pub v_head_dim: u64,
    /// Depthwise convolution width (`linear_conv_kernel_dim`).
    pub conv_kernel: u64,
    /// Chunk length of `torch_chunk_gated_delta_rule` (its default, 64).
    pub chunk_size: u64,
}

impl GatedDeltaNet {
    /// `key_dim = Hk · dk`.
    pub fn key_dim(&self) -> u64 {
        self.num_k_heads * self.k_head_dim
    }

    /// `value_dim = Hv · dv`.
    pub fn value_dim(&self) -> u64 {
        self.num_v_heads * self.v_head_dim
    }

    /// Channels of the convolution: `2·key_dim + value_dim` (q, k, v).
    pub fn conv_dim(&self) -> u64 {
        2 * self.key_dim() + self.value_dim()
    }

    /// The three projections, in forward order (`in_proj_qkvz`, `in_proj_ba`, `out_proj`),
    /// all without bias.
    pub fn linears(&self, hidden: u64) -> Vec<LinearShape> {
        vec![
            LinearShape {
                role: LinearRole::SsmIn,
                in_features: hidden,
                out_features: 2 * self.key_dim() + 2 * self.value_dim(),
                bias: false,
            },
            LinearShape {
                role: LinearRole::SsmGates,
                in_features: hidden,
                out_features: 2 * self.num_v_heads,
                bias: false,
            },
            LinearShape {
                role: LinearRole::SsmOut,
                in_features: self.value_dim(),
                out_features: hidden,
                bias: false,
            },
        ]
    }

    /// Parameters that are not projections: `conv1d.weight` (`conv_dim × 1 × kernel`, no
    /// bias), `dt_bias` and `A_log` (one per value head), the gated norm's weight (`dv`).
    pub fn other_params(&self) -> u128 {
        u128::from(self.conv_dim()) * u128::from(self.conv_kernel)
            + 2 * u128::from(self.num_v_heads)
            + u128::from(self.v_head_dim)
    }

    /// Parameters of the mixer.
    pub fn params(&self, hidden: u64) -> u128 {
        let linears: u128 = self.linears(hidden).iter().map(LinearShape::params).sum();
        linears + self.other_params()
    }

    /// Elements of one sequence's inference state: the convolution state
    /// (`conv_dim × kernel`) and the recurrent state (`Hv × dk × dv`).
    pub fn state_elems(&self) -> (u128, u128) {
        let conv = u128::from(self.conv_dim()) * u128::from(self.conv_kernel);
        let rec = u128::from(self.num_v_heads)
            * u128::from(self.k_head_dim)
            * u128::from(self.v_head_dim);
        (conv, rec)
    }
}

/// A Mamba-1 mixer, `MambaMixer` in transformers `models/mamba/modeling_mamba.py` (5.23):
///
/// ```text
/// x, z = chunk(in_proj(h), 2)                 # [B, I, S] each
/// x = silu(depthwise causal conv1d(x))        # I channels, kernel `conv_kernel`
/// dt, B, C = split(x_proj(x), [R, N, N])
/// dt = dt_proj.weight @ dt                    # [B, I, S]; dt_proj.bias added in the scan
/// y = selective_scan(x, dt, -exp(A_log), B, C, D) · silu(z)
/// out = out_proj(y)
/// ```
///
/// with `I = intermediate_size = int(expand · hidden)`, `N = state_size`,
/// `R = time_step_rank`; `A_log` is `[I, N]` (a decay per channel and state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mamba1 {
    /// Inner width `I` (`int(expand · hidden_size)`).
    pub intermediate: u64,
    /// SSM state size per channel (`state_size`, `N`).
    pub state_size: u64,
    /// Rank of the time-step projection (`time_step_rank`, `R`).
    pub time_step_rank: u64,
    /// Depthwise convolution width (`conv_kernel`).
    pub conv_kernel: u64,
    /// Biases on `in_proj` / `out_proj` (`use_bias`).
    pub proj_bias: bool,
    /// Bias on the convolution (`use_conv_bias`).
    pub conv_bias: bool,
    /// The block keeps its residual in fp32 (`residual_in_fp32` in `MambaBlock.forward`).
    pub residual_in_fp32: bool,
    /// RMSNorms on `dt`, `B` and `C` after `x_proj` (Jamba's `JambaMambaMixer`:
    /// `dt_layernorm`, `b_layernorm`, `c_layernorm`, weights of `R`, `N`, `N`).
    pub bcdt_norms: bool,
}

impl Mamba1 {
    /// Output width of `x_proj`: `R + 2·N` (dt, B, C).
    pub fn x_proj_width(&self) -> u64 {
        self.time_step_rank + 2 * self.state_size
    }

    /// The two projections LoRA can target, in forward order (`in_proj` to `2·I`,
    /// `out_proj`). `x_proj` and `dt_proj` are counted by [`Mamba1::other_params`]: the
    /// forward uses `dt_proj.weight` directly (`self.dt_proj.weight @ time_step`), not the
    /// module.
    pub fn linears(&self, hidden: u64) -> Vec<LinearShape> {
        vec![
            LinearShape {
                role: LinearRole::SsmIn,
                in_features: hidden,
                out_features: 2 * self.intermediate,
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

    /// The mixer's other parameters, as `MambaMixer.__init__` registers them:
    /// `conv1d.weight` (`I × 1 × kernel`), `conv1d.bias`, `x_proj.weight` (`(R + 2N) × I`, no
    /// bias), `dt_proj.weight` (`I × R`) and `dt_proj.bias`, `A_log` (`I × N`), `D` (`I`).
    pub fn other_params(&self) -> u128 {
        let i = u128::from(self.intermediate);
        let r = u128::from(self.time_step_rank);
        let mut p = i * u128::from(self.conv_kernel)
            + u128::from(self.x_proj_width()) * i
            + i * r
            + i
            + i * u128::from(self.state_size)
            + i;
        if self.conv_bias {
            p += i;
        }
        if self.bcdt_norms {
            p += u128::from(self.x_proj_width());
        }
        p
    }

    /// Parameters of the mixer.
    pub fn params(&self, hidden: u64) -> u128 {
        let linears: u128 = self.linears(hidden).iter().map(LinearShape::params).sum();
        linears + self.other_params()
    }

    /// Elements of one sequence's inference state in transformers: the convolution state
    /// (`I × conv_kernel`) and the SSM state (`I × N`).
    pub fn state_elems(&self) -> (u128, u128) {
        let i = u128::from(self.intermediate);
        (
            i * u128::from(self.conv_kernel),
            i * u128::from(self.state_size),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
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
            out_bias: false,
            gated_norm: true,
            norm_before_gate: false,
            conv_bias: true,
            residual_in_fp32: true,
            state_in_training_cache: false,
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

    #[test]
    fn falcon_h1_mixer_params() {
        // Falcon-H1-0.5B: d_ssm 1536 (24 heads of 64), 1 group, state 128, no gated norm,
        // in_proj without bias and out_proj with `projectors_bias`
        let m = Mamba2 {
            num_heads: 24,
            head_dim: 64,
            n_groups: 1,
            state_size: 128,
            conv_kernel: 4,
            intermediate: 1536,
            chunk_size: 128,
            proj_bias: false,
            out_bias: true,
            gated_norm: false,
            norm_before_gate: false,
            conv_bias: true,
            residual_in_fp32: false,
            state_in_training_cache: true,
        };
        assert_eq!((m.conv_dim(), m.in_proj_width()), (1792, 3352));
        assert_eq!(
            m.params(1024),
            1024 * 3352 + 1536 * 1024 + 1024 + 1792 * 5 + 3 * 24
        );
        let with_norm = Mamba2 {
            gated_norm: true,
            norm_before_gate: false,
            ..m
        };
        assert_eq!(with_norm.params(1024) - m.params(1024), 1536);
    }

    #[test]
    fn qwen3_next_mixer_params() {
        // Qwen3-Next-80B-A3B: 16 key heads, 32 value heads, 128 wide, conv 4
        let d = GatedDeltaNet {
            num_k_heads: 16,
            num_v_heads: 32,
            k_head_dim: 128,
            v_head_dim: 128,
            conv_kernel: 4,
            chunk_size: 64,
        };
        assert_eq!(d.conv_dim(), 8192);
        assert_eq!(
            d.params(2048),
            2048 * 12288 + 2048 * 64 + 4096 * 2048 + 8192 * 4 + 64 + 128
        );
        assert_eq!(d.state_elems(), (32768, 32 * 128 * 128));
    }

    #[test]
    fn mamba_2_8b_mixer_params() {
        // state-spaces/mamba-2.8b-hf: hidden 2560, inner 5120, state 16, dt rank 160, kernel 4
        let m = Mamba1 {
            intermediate: 5120,
            state_size: 16,
            time_step_rank: 160,
            conv_kernel: 4,
            proj_bias: false,
            conv_bias: true,
            residual_in_fp32: true,
            bcdt_norms: false,
        };
        assert_eq!(
            m.params(2560),
            2560 * 10240 + 5120 * 2560 + 5120 * 5 + 192 * 5120 + 5120 * 161 + 5120 * 17
        );
        assert_eq!(m.state_elems(), (20480, 81920));
    }
}
