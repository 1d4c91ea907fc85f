//! Gemma families: gemma, gemma2, gemma3_text and the multimodal gemma3 wrapper (its
//! `text_config`). All use `GemmaRMSNorm` (`(1 + weight)`, fp32), scaled embeddings and tied
//! embeddings by default.

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::{HfConfig, Nested, SlidingPattern};
use crate::resolve::{
    gated, llama_names, sliding_layers, window, AttnOpts, Ctx, HeadDimDefault, NormPlacement,
};
use memwall_core::error::untrusted;
use memwall_core::model::{Activation, Mlp, ModelDesc, NormKind, QkNormScope};

/// `gemma/configuration_gemma.py` `GemmaConfig` field defaults.
const GEMMA: Defaults = Defaults {
    vocab_size: 256000,
    hidden_size: 3072,
    intermediate_size: 24576,
    num_hidden_layers: 28,
    num_attention_heads: 16,
    num_key_value_heads: Some(16),
    head_dim: HeadDimDefault::Fixed(256),
    act: "gelu_pytorch_tanh",
    max_position_embeddings: 8192,
    tie_word_embeddings: true,
    strict_divisible: false,
};

/// Gemma attention: q/k/v/o bias=config.attention_bias (default False) in
/// `modeling_gemma.py`/`modeling_gemma2.py`/`modeling_gemma3.py` *Attention.
fn gemma_attn(raw: &HfConfig, d: &Dims) -> AttnOpts {
    let bias = raw.attention_bias.unwrap_or(false);
    AttnOpts {
        qkv_bias: bias,
        o_bias: bias,
        ..AttnOpts::rope(d.heads.head_dim)
    }
}

pub(crate) fn gemma(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let mut d = Dims::llama(raw, ctx, &GEMMA)?;
    // configuration_gemma.py __post_init__: hidden_act="gelu" is a legacy value meant as the
    // tanh approximation and is rewritten to "gelu_pytorch_tanh".
    if d.act == Activation::Gelu {
        d.act = Activation::GeluTanh;
    }
    Decoder {
        attn: gemma_attn(raw, &d),
        // modeling_gemma.py: GemmaRMSNorm everywhere; GemmaTextScaledWordEmbedding.
        norm_kind: NormKind::GemmaRmsNorm,
        scaled_embeddings: true,
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "gemma", &d, |_| {
        Ok(Mlp::Dense(gated(d.intermediate, d.act)))
    })
    .map(scale_in_module)
}

/// `gemma2/configuration_gemma2.py` `Gemma2Config` field defaults.
const GEMMA2: Defaults = Defaults {
    hidden_size: 2304,
    intermediate_size: 9216,
    num_hidden_layers: 26,
    num_attention_heads: 8,
    num_key_value_heads: Some(4),
    // Gemma2Config.validate_architecture: hidden_size % num_attention_heads == 0.
    strict_divisible: true,
    ..GEMMA
};

pub(crate) fn gemma2(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    // modeling_gemma2.py Gemma2MLP: ACT2FN[config.hidden_activation].
    let d = Dims::with_act(
        raw,
        ctx,
        &GEMMA2,
        ("hidden_activation", raw.hidden_activation.as_deref()),
    )?;
    // configuration_gemma2.py: sliding_window=4096; default layer_types alternate, layer i
    // sliding iff (i + 1) % 2 != 0; modeling_gemma2.py Gemma2Attention: window only on
    // sliding layers.
    let w = window(ctx, raw.sliding_window.or(Some(4096)))?;
    let sliding = sliding_layers(ctx, raw, d.layers, |i| (i + 1) % 2 != 0)?;
    // configuration_gemma2.py: attn_logit_softcapping=50.0, final_logit_softcapping=30.0;
    // an explicit null disables them (the raw struct reads null as absent, so only a present
    // key can disable: configs that null them spell it out).
    let attn_cap = softcap(ctx, raw, "attn_logit_softcapping", Some(50.0))?;
    // configuration_gemma2.py: query_pre_attn_scalar=256 (scaling = scalar ** -0.5).
    ctx.positive(raw.query_pre_attn_scalar, "query_pre_attn_scalar")?;
    let final_cap = softcap(ctx, raw, "final_logit_softcapping", Some(30.0))?;
    Decoder {
        attn: AttnOpts {
            logit_softcap: attn_cap,
            ..gemma_attn(raw, &d)
        },
        windows: sliding
            .into_iter()
            .map(|s| if s { w } else { None })
            .collect(),
        // modeling_gemma2.py Gemma2DecoderLayer: input_layernorm, post_attention_layernorm,
        // pre_feedforward_layernorm, post_feedforward_layernorm.
        placement: NormPlacement::Sandwich,
        norm_kind: NormKind::GemmaRmsNorm,
        scaled_embeddings: true,
        final_logit_softcap: final_cap,
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "gemma2", &d, |_| {
        Ok(Mlp::Dense(gated(d.intermediate, d.act)))
    })
    .map(scale_in_module)
    .map(both_masks)
}

/// A softcap with a class default, where JSON `null` disables it. The raw struct folds
/// `null` into "absent", so the presence of the key is checked on the original text via
/// [`HfConfig`]'s `Option<f64>` plus `raw_nulls`.
fn softcap(
    ctx: &Ctx,
    raw: &HfConfig,
    field: &str,
    default: Option<f64>,
) -> Result<Option<f64>, FormatError> {
    let (value, null) = match field {
        "attn_logit_softcapping" => (raw.attn_logit_softcapping, raw_null(raw, field)),
        _ => (raw.final_logit_softcapping, raw_null(raw, field)),
    };
    let v = if null { None } else { value.or(default) };
    ctx.positive(v, field)
}

fn raw_null(raw: &HfConfig, field: &str) -> bool {
    raw.explicit_nulls.iter().any(|k| k == field)
}

/// `gemma3/configuration_gemma3.py` `Gemma3TextConfig` field defaults.
const GEMMA3: Defaults = Defaults {
    vocab_size: 262_208,
    max_position_embeddings: 131_072,
    ..GEMMA2
};

pub(crate) fn gemma3_text(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    gemma3_named(raw, ctx, "gemma3_text")
}

fn gemma3_named(raw: &HfConfig, ctx: &Ctx, model_type: &str) -> Result<ModelDesc, FormatError> {
    let d = Dims::with_act(
        raw,
        ctx,
        &GEMMA3,
        ("hidden_activation", raw.hidden_activation.as_deref()),
    )?;
    // configuration_gemma3.py Gemma3TextConfig.__post_init__: with use_bidirectional_attention
    // the window becomes sliding_window // 2 + 1; default layer_types: layer i sliding iff
    // (i + 1) % sliding_window_pattern != 0 (pattern default 6).
    let mut w = raw.sliding_window.or(Some(4096));
    if raw.use_bidirectional_attention.unwrap_or(false) {
        w = w.map(|w| w / 2 + 1);
    }
    let w = window(ctx, w)?;
    let pattern = match &raw.sliding_window_pattern {
        None => 6,
        Some(SlidingPattern::Every(n)) => *n,
        Some(SlidingPattern::Letters(s)) => {
            return Err(FormatError::Unsupported {
                field: ctx.field("sliding_window_pattern"),
                value: format!("\"{}\"", untrusted(s)),
                reason: "Gemma 3 counts layers here (every n-th layer is global)".into(),
                hint: "use an integer, e.g. 6 (five local layers, then one global)".into(),
            })
        }
    };
    if pattern == 0 {
        return Err(FormatError::OutOfRange {
            field: ctx.field("sliding_window_pattern"),
            value: "0".into(),
            reason: "must be at least 1 (every pattern-th layer is global)".into(),
            hint: "Gemma 3 uses 6 (five local layers, then one global)".into(),
        });
    }
    let sliding = sliding_layers(ctx, raw, d.layers, |i| (i + 1) % pattern != 0)?;
    // configuration_gemma3.py: both softcaps default to None.
    let attn_cap = softcap(ctx, raw, "attn_logit_softcapping", None)?;
    // configuration_gemma3.py: query_pre_attn_scalar=256 (scaling = scalar ** -0.5).
    ctx.positive(raw.query_pre_attn_scalar, "query_pre_attn_scalar")?;
    let final_cap = softcap(ctx, raw, "final_logit_softcapping", None)?;
    Decoder {
        // modeling_gemma3.py Gemma3Attention: q_norm/k_norm = Gemma3RMSNorm(head_dim).
        attn: AttnOpts {
            logit_softcap: attn_cap,
            qk_norm: Some((QkNormScope::PerHead, NormKind::GemmaRmsNorm)),
            ..gemma_attn(raw, &d)
        },
        windows: sliding
            .into_iter()
            .map(|s| if s { w } else { None })
            .collect(),
        // modeling_gemma3.py Gemma3DecoderLayer: the four Gemma 2 norms.
        placement: NormPlacement::Sandwich,
        norm_kind: NormKind::GemmaRmsNorm,
        scaled_embeddings: true,
        final_logit_softcap: final_cap,
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, model_type, &d, |_| {
        Ok(Mlp::Dense(gated(d.intermediate, d.act)))
    })
    .map(scale_in_module)
    .map(both_masks)
    .map(|mut m| {
        // modeling_gemma3.py Gemma3RotaryEmbedding: an inv_freq buffer pair per layer type
        m.rope_buffers_per_layer_type = true;
        m
    })
}

/// Gemma 2 / Gemma 3 build the full and the sliding-window causal mask on every forward
/// (`causal_mask_mapping` in modeling_gemma2.py / modeling_gemma3.py, transformers 5.23), even
/// when every layer is of one type.
fn both_masks(mut d: ModelDesc) -> ModelDesc {
    d.builds_both_masks = true;
    d
}

/// Multimodal `gemma3` (`Gemma3ForConditionalGeneration`): the language model is the
/// `text_config` (a `Gemma3TextConfig`, `configuration_gemma3.py` Gemma3Config
/// sub_configs_defaults); the SigLIP vision tower and the projector are sized by `vision.rs`
/// (`Gemma3ForConditionalGeneration`).
pub(crate) fn gemma3(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let inner = match raw.text_config(ctx.prefix)? {
        Nested::Object(inner) => inner,
        Nested::NotObject(found) => {
            return Err(FormatError::WrongType {
                field: ctx.field("text_config"),
                message: format!("expected an object, found {found}"),
                hint: "a gemma3 config nests its language model config under `text_config`".into(),
            })
        }
        Nested::Absent => {
            return Err(FormatError::MissingField {
                field: ctx.field("text_config"),
                model_type: "gemma3".into(),
                hint: "a multimodal gemma3 config.json nests its language model under `text_config`; pass that, or a `gemma3_text` config".into(),
            })
        }
    };
    if let Some(mt) = inner.model_type.as_deref() {
        if mt != "gemma3_text" {
            return Err(FormatError::Unsupported {
                field: "text_config.model_type".into(),
                value: format!("\"{mt}\""),
                reason: "a gemma3 text_config must be a gemma3_text config".into(),
                hint: "remove the key or set it to \"gemma3_text\"".into(),
            });
        }
    }
    let nested = Ctx {
        model_type: "gemma3_text",
        prefix: "text_config.",
        nested: true,
    };
    let mut desc = gemma3_named(&inner, &nested, "gemma3")?;
    desc.vision = Some(super::vision::siglip_gemma3(raw, desc.hidden_size)?);
    // Gemma3Config.tie_word_embeddings (default True) decides for the wrapper
    desc.head.tied = raw.tie_word_embeddings.unwrap_or(true);
    Ok(desc)
}

/// `*TextScaledWordEmbedding.forward` (models/gemma*/modeling_gemma*.py, transformers 5.23):
/// `super().forward(input_ids) * self.embed_scale`, the scale inside the embedding module.
fn scale_in_module(mut m: ModelDesc) -> ModelDesc {
    m.embeddings.scale_in_module = true;
    m
}

#[cfg(test)]
mod tests {
    use crate::parse_hf_config;

    #[test]
    fn only_gemma3_keeps_a_rotary_buffer_pair_per_layer_type() {
        let base = r#""vocab_size":100,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16"#;
        for (mt, per_type) in [("gemma3_text", true), ("gemma2", false), ("gemma", false)] {
            let d = parse_hf_config(&format!(r#"{{"model_type":"{mt}",{base}}}"#)).unwrap();
            assert_eq!(d.rope_buffers_per_layer_type, per_type, "{mt}");
        }
    }
}
