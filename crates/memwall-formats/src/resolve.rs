//! Shared resolution helpers: limits, defaults, validation and layer builders used by every
//! family normaliser. Nothing here knows a family; the normalisers pass in what differs.

use crate::error::FormatError;
use crate::raw::HfConfig;
use memwall_core::model::{
    Activation, Attention, AttentionKind, DenseMlp, Dropout, EagerStyle, Embeddings, Head,
    LayerSpec, LinearRole, Mixer, Mlp, ModelDesc, Norm, NormKind, QkNormScope, Residual,
    ScalarMuls,
};

/// Upper bounds on sizes. They are far above any published model (the largest hidden size in
/// 2025 is 16 384, the largest vocabulary 262 208, the most layers 126, the most experts 384)
/// and keep every product of sizes inside `u128` (and almost always inside `u64`).
pub mod limits {
    /// `hidden_size` ≤ 2^18.
    pub const MAX_HIDDEN: u64 = 1 << 18;
    /// Decoder layers ≤ 4096.
    pub const MAX_LAYERS: u64 = 4096;
    /// `vocab_size` ≤ 2^22.
    pub const MAX_VOCAB: u64 = 1 << 22;
    /// Attention (query or key/value) heads ≤ 2^14.
    pub const MAX_HEADS: u64 = 1 << 14;
    /// Per-head dimension (incl. MLA head parts) ≤ 2^14.
    pub const MAX_HEAD_DIM: u64 = 1 << 14;
    /// Routed experts ≤ 2^14.
    pub const MAX_EXPERTS: u64 = 1 << 14;
    /// MLP intermediate width (dense, expert or shared) ≤ 2^20.
    pub const MAX_INTERMEDIATE: u64 = 1 << 20;
    /// Positions (`max_position_embeddings`, sliding windows) ≤ 2^26.
    pub const MAX_POSITIONS: u64 = 1 << 26;
    /// MLA low-rank projections (`q_lora_rank`, `kv_lora_rank`) ≤ 2^18.
    pub const MAX_LORA_RANK: u64 = 1 << 18;
}
use limits::*;

/// Where a config is read from: top level, or nested in a multimodal wrapper.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx {
    /// The family being normalised (for messages).
    pub model_type: &'static str,
    /// `""` or `"text_config."`: prepended to field names in errors.
    pub prefix: &'static str,
    /// Nested sub-configs are saved by transformers as a diff against the sub-config class
    /// defaults (e.g. gemma-3-4b's `text_config` has no `num_attention_heads`), so there the
    /// class defaults apply even to the core sizes; at top level the core sizes are required.
    pub nested: bool,
}

impl Ctx {
    pub fn field(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn out_of_range(&self, field: &str, value: u64, max: u64) -> FormatError {
        FormatError::OutOfRange {
            field: self.field(field),
            value: value.to_string(),
            reason: format!("must be between 1 and {max}"),
            hint: format!(
                "`{}` is a size; a real model has a positive value far below {max} (limits are documented in memwall_formats::limits)",
                self.field(field)
            ),
        }
    }

    /// A size with a config-class default; checked to lie in `1..=max`.
    pub fn size(
        &self,
        v: Option<u64>,
        field: &str,
        default: u64,
        max: u64,
    ) -> Result<u64, FormatError> {
        self.check(v.unwrap_or(default), field, max)
    }

    /// A size that a top-level config must state (vocab, hidden, layers, heads). Nested
    /// configs fall back to the class default (see [`Ctx::nested`]).
    pub fn core(
        &self,
        v: Option<u64>,
        field: &str,
        default: u64,
        max: u64,
    ) -> Result<u64, FormatError> {
        match v {
            Some(v) => self.check(v, field, max),
            None if self.nested => self.check(default, field, max),
            None => Err(FormatError::MissingField {
                field: self.field(field),
                model_type: self.model_type.into(),
                hint: format!(
                    "every saved `{}` config.json states `{field}`; transformers would silently use its class default ({default}), which is almost never the model you mean",
                    self.model_type
                ),
            }),
        }
    }

    /// Checks `1..=max`.
    pub fn check(&self, v: u64, field: &str, max: u64) -> Result<u64, FormatError> {
        if v == 0 || v > max {
            Err(self.out_of_range(field, v, max))
        } else {
            Ok(v)
        }
    }

    /// A probability in `[0, 1]` (dropout).
    pub fn prob(&self, v: Option<f64>, field: &str, default: f64) -> Result<f64, FormatError> {
        let p = v.unwrap_or(default);
        if (0.0..=1.0).contains(&p) {
            Ok(p)
        } else {
            Err(FormatError::OutOfRange {
                field: self.field(field),
                value: p.to_string(),
                reason: "a dropout probability must lie in [0, 1]".into(),
                hint: "use 0.0 to disable dropout".into(),
            })
        }
    }

    /// A positive finite number (softcaps, scalars).
    pub fn positive(&self, v: Option<f64>, field: &str) -> Result<Option<f64>, FormatError> {
        match v {
            Some(x) if !(x.is_finite() && x > 0.0) => Err(FormatError::OutOfRange {
                field: self.field(field),
                value: x.to_string(),
                reason: "must be a positive finite number".into(),
                hint: format!("use null to disable `{}`", self.field(field)),
            }),
            other => Ok(other),
        }
    }

    pub fn inconsistent(&self, fields: &[&str], reason: String, hint: &str) -> FormatError {
        FormatError::Inconsistent {
            fields: fields
                .iter()
                .map(|f| format!("`{}`", self.field(f)))
                .collect::<Vec<_>>()
                .join(", "),
            reason,
            hint: hint.into(),
        }
    }

    /// Rotary dimensions per head: `int(head_dim * partial_rotary_factor)` as in transformers
    /// `modeling_rope_utils.py` (`_compute_default_rope_parameters`).
    pub fn rotary_dim(
        &self,
        head_dim: u64,
        fraction: f64,
        field: &str,
    ) -> Result<u64, FormatError> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(FormatError::OutOfRange {
                field: self.field(field),
                value: fraction.to_string(),
                reason: "the rotary fraction must lie in (0, 1]".into(),
                hint: "1.0 rotates the whole head; GPT-NeoX/Pythia use 0.25".into(),
            });
        }
        // head_dim ≤ 2^14, so the product is exact in f64 and the cast cannot saturate.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let dim = (head_dim as f64 * fraction).floor() as u64;
        if dim == 0 {
            return Err(FormatError::OutOfRange {
                field: self.field(field),
                value: fraction.to_string(),
                reason: format!("rotates int({head_dim} × {fraction}) = 0 dimensions per head"),
                hint: "raise the rotary fraction".into(),
            });
        }
        Ok(dim)
    }
}

/// Maps a transformers `ACT2FN` name (`activations.py`) to [`Activation`].
pub(crate) fn activation(ctx: &Ctx, field: &str, name: &str) -> Result<Activation, FormatError> {
    Ok(match name {
        "silu" | "swish" => Activation::Silu,
        "gelu" | "gelu_python" => Activation::Gelu,
        "gelu_pytorch_tanh" => Activation::GeluTanh,
        "gelu_new" | "gelu_fast" => Activation::GeluNew,
        "relu" => Activation::Relu,
        other => {
            return Err(FormatError::Unsupported {
                field: ctx.field(field),
                value: format!("\"{other}\""),
                reason: "memwall does not model this activation".into(),
                hint: "supported activations: silu, swish, gelu, gelu_python, gelu_pytorch_tanh, gelu_new, gelu_fast, relu".into(),
            })
        }
    })
}

/// The attention-head geometry shared by standard-attention families.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    pub num_heads: u64,
    pub num_kv_heads: u64,
    pub head_dim: u64,
}

/// How a family derives `head_dim` when the config does not state it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HeadDimDefault {
    /// `hidden_size // num_attention_heads` (most families); the division must be exact.
    Derived,
    /// A config-class default (Qwen3: 128, Gemma: 256).
    Fixed(u64),
}

/// Resolves heads: `num_key_value_heads` defaults to the query heads; kv heads must divide
/// the query heads (transformers' `repeat_kv` needs `num_attention_heads % num_kv == 0`).
pub(crate) fn heads(
    ctx: &Ctx,
    hidden: u64,
    num_heads: u64,
    (kv_field, kv): (&str, Option<u64>),
    head_dim: Option<u64>,
    default: HeadDimDefault,
) -> Result<Heads, FormatError> {
    let num_kv_heads = ctx.size(kv, kv_field, num_heads, MAX_HEADS)?;
    if num_kv_heads > num_heads || num_heads.checked_rem(num_kv_heads) != Some(0) {
        return Err(ctx.inconsistent(
            &["num_attention_heads", kv_field],
            format!("{num_kv_heads} key/value heads do not divide {num_heads} query heads"),
            "grouped-query attention shares each key/value head among an equal number of query heads",
        ));
    }
    let head_dim = match (head_dim, default) {
        (Some(d), _) => ctx.check(d, "head_dim", MAX_HEAD_DIM)?,
        (None, HeadDimDefault::Fixed(d)) => d,
        (None, HeadDimDefault::Derived) => divide_hidden(ctx, hidden, num_heads)?,
    };
    Ok(Heads {
        num_heads,
        num_kv_heads,
        head_dim,
    })
}

/// `hidden_size / num_attention_heads`, which must be exact.
pub(crate) fn divide_hidden(ctx: &Ctx, hidden: u64, num_heads: u64) -> Result<u64, FormatError> {
    if hidden.checked_rem(num_heads) != Some(0) {
        return Err(ctx.inconsistent(
            &["hidden_size", "num_attention_heads"],
            format!("{num_heads} heads do not divide hidden size {hidden}"),
            "the per-head dimension is hidden_size / num_attention_heads here; fix either value (or state `head_dim` where the family allows it)",
        ));
    }
    Ok(hidden / num_heads)
}

/// Which layers use sliding-window attention, from an explicit `layer_types` list or the
/// family's default pattern. Only `full_attention` and `sliding_attention` exist in the
/// supported families.
pub(crate) fn sliding_layers(
    ctx: &Ctx,
    raw: &HfConfig,
    num_layers: u64,
    default: impl Fn(u64) -> bool,
) -> Result<Vec<bool>, FormatError> {
    match &raw.layer_types {
        None => Ok((0..num_layers).map(default).collect()),
        Some(types) => {
            if types.len() as u64 != num_layers {
                return Err(ctx.inconsistent(
                    &["layer_types", "num_hidden_layers"],
                    format!("{} layer types for {num_layers} layers", types.len()),
                    "`layer_types` names the attention kind of every layer, one entry per layer",
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(false),
                    "sliding_attention" => Ok(true),
                    other => Err(FormatError::Unsupported {
                        field: ctx.field("layer_types"),
                        value: format!("\"{other}\""),
                        reason: "this family only has full and sliding-window attention".into(),
                        hint: "use \"full_attention\" or \"sliding_attention\"".into(),
                    }),
                })
                .collect()
        }
    }
}

/// A sliding window that is in effect: checked for range.
pub(crate) fn window(ctx: &Ctx, w: Option<u64>) -> Result<Option<u64>, FormatError> {
    w.map(|w| ctx.check(w, "sliding_window", MAX_POSITIONS))
        .transpose()
}

/// Options of a standard (MHA/GQA/MQA) attention block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnOpts {
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub fused_qkv: bool,
    pub qk_norm: Option<(QkNormScope, NormKind)>,
    pub rotary_dim: Option<u64>,
    pub logit_softcap: Option<f64>,
    pub eager_softmax_fp32: bool,
    pub eager_style: EagerStyle,
    pub rope_concat: bool,
    pub sinks: bool,
    pub rope_fp32: bool,
    pub rope_complex: bool,
    pub l2_qk_norm: bool,
    pub temperature_tuning: bool,
    pub chunked: bool,
    pub qk_norm_after_rope: bool,
    pub rope_locals: bool,
    pub rope_upcast_qk: bool,
    /// `Attention::output_gate`.
    pub output_gate: bool,
    /// `Attention::key_scaled`.
    pub key_scaled: bool,
    /// `Attention::clip_qkv`.
    pub clip_qkv: bool,
    /// `Attention::qk_norm_inline`.
    pub qk_norm_inline: bool,
    /// `Attention::qk_norm_bias`.
    pub qk_norm_bias: bool,
    /// `Attention::rope_halves`.
    pub rope_halves: bool,
    /// `Attention::kv_broadcast`.
    pub kv_broadcast: bool,
    /// `Attention::kv_expanded`.
    pub kv_expanded: bool,
    /// `Attention::rope_promotes`.
    pub rope_promotes: bool,
}

impl AttnOpts {
    /// Bias-free, unfused, fully rotary attention (Llama).
    pub fn rope(head_dim: u64) -> Self {
        AttnOpts {
            qkv_bias: false,
            o_bias: false,
            fused_qkv: false,
            qk_norm: None,
            rotary_dim: Some(head_dim),
            logit_softcap: None,
            eager_softmax_fp32: true,
            eager_style: EagerStyle::Shared,
            rope_concat: false,
            sinks: false,
            rope_fp32: false,
            rope_complex: false,
            l2_qk_norm: false,
            temperature_tuning: false,
            chunked: false,
            qk_norm_after_rope: false,
            rope_locals: false,
            rope_upcast_qk: false,
            output_gate: false,
            key_scaled: false,
            clip_qkv: false,
            qk_norm_inline: false,
            qk_norm_bias: false,
            rope_halves: false,
            kv_broadcast: false,
            kv_expanded: false,
            rope_promotes: false,
        }
    }

    pub fn build(self, h: Heads, sliding_window: Option<u64>) -> Attention {
        Attention {
            kind: AttentionKind::Standard {
                num_heads: h.num_heads,
                num_kv_heads: h.num_kv_heads,
                head_dim: h.head_dim,
            },
            qkv_bias: self.qkv_bias,
            o_bias: self.o_bias,
            fused_qkv: self.fused_qkv,
            qk_norm: self.qk_norm,
            rotary_dim: self.rotary_dim,
            sliding_window,
            logit_softcap: self.logit_softcap,
            eager_softmax_fp32: self.eager_softmax_fp32,
            eager_style: self.eager_style,
            rope_concat: self.rope_concat,
            sinks: self.sinks,
            rope_fp32: self.rope_fp32,
            rope_complex: self.rope_complex,
            l2_qk_norm: self.l2_qk_norm,
            temperature_tuning: self.temperature_tuning,
            chunked: self.chunked,
            qk_norm_after_rope: self.qk_norm_after_rope,
            rope_locals: self.rope_locals,
            rope_upcast_qk: self.rope_upcast_qk,
            output_gate: self.output_gate,
            key_scaled: self.key_scaled,
            clip_qkv: self.clip_qkv,
            qk_norm_inline: self.qk_norm_inline,
            qk_norm_bias: self.qk_norm_bias,
            rope_halves: self.rope_halves,
            kv_broadcast: self.kv_broadcast,
            kv_expanded: self.kv_expanded,
            rope_promotes: self.rope_promotes,
        }
    }
}

/// A gated (SwiGLU/GeGLU) MLP without biases.
pub(crate) fn gated(intermediate: u64, act: Activation) -> DenseMlp {
    DenseMlp {
        intermediate,
        gated: true,
        fused_gate_up: false,
        bias: false,
        act,
    }
}

/// A plain two-linear MLP `down(act(up(x)))`.
pub(crate) fn plain(intermediate: u64, bias: bool, act: Activation) -> DenseMlp {
    DenseMlp {
        intermediate,
        gated: false,
        fused_gate_up: false,
        bias,
        act,
    }
}

/// Where a layer's norms sit.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NormPlacement {
    /// `input_layernorm` before attention, `post_attention_layernorm` before the MLP (Llama).
    Pre,
    /// Pre- and post-norms around both sub-blocks (Gemma 2/3).
    Sandwich,
    /// Only post-norms on the sub-block outputs (OLMo 2).
    PostOnly,
}

/// Assembles one sequential-residual decoder layer.
pub(crate) fn layer(norm: Norm, place: NormPlacement, attention: Attention, mlp: Mlp) -> LayerSpec {
    let (a, ap, m, mp) = match place {
        NormPlacement::Pre => (Some(norm), None, Some(norm), None),
        NormPlacement::Sandwich => (Some(norm), Some(norm), Some(norm), Some(norm)),
        NormPlacement::PostOnly => (None, Some(norm), None, Some(norm)),
    };
    LayerSpec {
        attn_norm: a,
        attn_post_norm: ap,
        mlp_norm: m,
        mlp_post_norm: mp,
        residual: Residual::Sequential,
        attention,
        mlp,
        attn_output_outlives_mlp: false,
        mlp_input_rebound: false,
        mixer: Mixer::Attention,
        residual_scaled: false,
        parallel_residual_first: false,
        muls: ScalarMuls::NONE,
    }
}

/// A norm over `dim`.
pub(crate) fn norm(kind: NormKind, dim: u64) -> Norm {
    Norm {
        kind,
        dim,
        bias: matches!(kind, NormKind::LayerNorm),
    }
}

/// Token embeddings only (rotary families).
pub(crate) fn token_embeddings(vocab_size: u64, dim: u64, scaled: bool) -> Embeddings {
    Embeddings {
        vocab_size,
        dim,
        learned_positions: None,
        positions_from_mask: false,
        projections: false,
        scaled,
        norm: None,
        scale_in_module: false,
        dropout_rebinds: false,
    }
}

/// A bias-free head with a final norm.
pub(crate) fn head(final_norm: Option<Norm>, tied: bool, logit_softcap: Option<f64>) -> Head {
    Head {
        final_norm,
        tied,
        bias: false,
        logit_softcap,
        logits_fp32: false,
        logits_scaled: false,
    }
}

/// Dropout with only attention-probability dropout (the Llama-derived families).
pub(crate) fn attention_dropout_only(attention: f64) -> Dropout {
    Dropout {
        attention,
        ..Dropout::default()
    }
}

/// Module names → roles, as owned strings.
pub(crate) fn names(list: &[(LinearRole, &str)]) -> Vec<(LinearRole, String)> {
    list.iter().map(|(r, n)| (*r, (*n).to_string())).collect()
}

/// Llama naming: `q_proj k_proj v_proj o_proj` (+ `gate_proj up_proj down_proj` when the
/// layers have a dense gated MLP built of `nn.Linear` modules).
pub(crate) fn llama_names(dense_mlp: bool) -> Vec<(LinearRole, String)> {
    let mut v = names(&[
        (LinearRole::Q, "q_proj"),
        (LinearRole::K, "k_proj"),
        (LinearRole::V, "v_proj"),
        (LinearRole::O, "o_proj"),
    ]);
    if dense_mlp {
        v.extend(names(&[
            (LinearRole::Gate, "gate_proj"),
            (LinearRole::Up, "up_proj"),
            (LinearRole::Down, "down_proj"),
        ]));
    }
    v
}

/// The parts every normaliser hands to [`assemble`].
pub(crate) struct Parts {
    pub hidden_size: u64,
    pub max_position_embeddings: u64,
    pub embeddings: Embeddings,
    pub layers: Vec<LayerSpec>,
    pub head: Head,
    pub dropout: Dropout,
    pub linear_names: Vec<(LinearRole, String)>,
}

/// Builds the [`ModelDesc`] and rejects models whose parameter count overflows `u64`.
pub(crate) fn assemble(ctx: &Ctx, model_type: &str, p: Parts) -> Result<ModelDesc, FormatError> {
    let desc = ModelDesc {
        model_type: model_type.to_string(),
        hidden_size: p.hidden_size,
        max_position_embeddings: p.max_position_embeddings,
        embeddings: p.embeddings,
        layers: p.layers,
        head: p.head,
        dropout: p.dropout,
        linear_names: p.linear_names,
        vision: None,
        use_cache: true,
        builds_both_masks: false,
        rope_buffers_per_layer_type: false,
    };
    if desc.param_counts().is_err() {
        return Err(FormatError::OutOfRange {
            field: ctx.field("(all sizes)"),
            value: format!("{} layers × hidden {}", desc.layers.len(), desc.hidden_size),
            reason: "the parameter count does not fit in 64 bits".into(),
            hint: "check the sizes; no real model is this large".into(),
        });
    }
    Ok(desc)
}
