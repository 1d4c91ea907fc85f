//! Vision-language wrappers whose language model is an existing family: `qwen2_vl`,
//! `qwen2_5_vl` (a Qwen2 decoder) and `mistral3` (a Mistral decoder). The text tower is
//! normalised by its family; the vision tower and projector are sized by `vision.rs`.

use super::{llama, vision};
use crate::error::FormatError;
use crate::raw::{HfConfig, Nested};
use crate::resolve::Ctx;
use memwall_core::ModelDesc;
use serde::Deserialize;

/// The text part of a wrapper: its `text_config` (nested: class defaults apply to absent
/// keys), or, for the flat configs Qwen2-VL/Qwen2.5-VL were published with, the top level
/// (transformers 5.23 `Qwen2VLConfig.__post_init__` builds `text_config` from the top-level
/// keys).
fn text_part(raw: &HfConfig, ctx: &Ctx) -> Result<(HfConfig, bool), FormatError> {
    match raw.text_config(ctx.prefix)? {
        Nested::Object(inner) => {
            let mut inner = *inner;
            // tie_word_embeddings may sit on the wrapper
            if inner.tie_word_embeddings.is_none() {
                inner.tie_word_embeddings = raw.tie_word_embeddings;
            }
            Ok((inner, true))
        }
        Nested::NotObject(found) => Err(FormatError::WrongType {
            field: ctx.field("text_config"),
            message: format!("expected an object, found {found}"),
            hint: "a vision-language config nests its language model under `text_config`".into(),
        }),
        Nested::Absent => Ok((raw.clone(), false)),
    }
}

fn qwen_vl(
    raw: &HfConfig,
    ctx: &Ctx,
    model_type: &'static str,
    text_type: &'static str,
) -> Result<ModelDesc, FormatError> {
    let (text, nested) = text_part(raw, ctx)?;
    if nested {
        if let Some(mt) = text.model_type.as_deref() {
            if mt != text_type {
                return Err(FormatError::Unsupported {
                    field: "text_config.model_type".into(),
                    value: format!("\"{}\"", memwall_core::error::untrusted(mt)),
                    reason: format!("a {model_type} text_config must be a {text_type} config"),
                    hint: format!("remove the key or set it to \"{text_type}\""),
                });
            }
        }
    }
    let tctx = Ctx {
        model_type,
        prefix: if nested { "text_config." } else { "" },
        nested,
    };
    // modeling_qwen2_vl.py / modeling_qwen2_5_vl.py: the text model is Qwen2's decoder
    // (q/k/v_proj bias=True, o_proj bias=False, gate/up/down_proj, RMSNorm); M-RoPE only changes
    // how positions index the rotary table.
    let mut desc = llama::qwen2(&text, &tctx)?;
    desc.model_type = model_type.to_string();
    // Qwen2VLConfig/Qwen2_5_VLConfig: tie_word_embeddings (default False) on the wrapper, set
    // also when a pre-v5 text_config states True (`__post_init__` BC)
    desc.head.tied = raw.tie_word_embeddings.unwrap_or(false)
        || (nested && text.tie_word_embeddings == Some(true));
    desc.vision = Some(match model_type {
        "qwen2_vl" => vision::qwen2_vl_vision(raw)?,
        _ => vision::qwen2_5_vl_vision(raw)?,
    });
    Ok(desc)
}

/// `qwen2_vl` (`Qwen2VLForConditionalGeneration`).
pub(crate) fn qwen2_vl(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    qwen_vl(raw, ctx, "qwen2_vl", "qwen2_vl_text")
}

/// `qwen2_5_vl` (`Qwen2_5_VLForConditionalGeneration`).
pub(crate) fn qwen2_5_vl(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    qwen_vl(raw, ctx, "qwen2_5_vl", "qwen2_5_vl_text")
}

/// Whether a config object states `"sliding_window": null` (MistralConfig's default is 4096;
/// an explicit null turns the window off).
#[derive(Deserialize)]
struct WindowProbe {
    #[serde(default, deserialize_with = "null_or_value")]
    sliding_window: Option<Option<serde_json::Value>>,
}

fn null_or_value<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<serde_json::Value>>, D::Error> {
    Option::<serde_json::Value>::deserialize(d).map(Some)
}

/// `mistral3` (`Mistral3ForConditionalGeneration`): `text_config` is a Mistral (or Llama)
/// config (`Mistral3Config.sub_configs_defaults`: AutoConfig, default `mistral`).
pub(crate) fn mistral3(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let (text, nested) = match raw.text_config(ctx.prefix)? {
        Nested::Object(inner) => (*inner, true),
        Nested::NotObject(found) => {
            return Err(FormatError::WrongType {
                field: ctx.field("text_config"),
                message: format!("expected an object, found {found}"),
                hint: "a mistral3 config nests its language model under `text_config`".into(),
            })
        }
        Nested::Absent => (HfConfig::default(), true),
    };
    let text_type = text.model_type.clone().unwrap_or_else(|| "mistral".into());
    let tctx = Ctx {
        model_type: "mistral",
        prefix: "text_config.",
        nested,
    };
    let mut desc = match text_type.as_str() {
        "mistral" => {
            let mut d = llama::mistral(&text, &tctx)?;
            let null_window = raw
                .text_config
                .as_deref()
                .and_then(|t| serde_json::from_str::<WindowProbe>(t.get()).ok())
                .is_some_and(|p| matches!(p.sliding_window, Some(None)));
            if null_window {
                for l in &mut d.layers {
                    l.attention.sliding_window = None;
                }
            }
            d
        }
        "llama" => llama::llama(
            &text,
            &Ctx {
                model_type: "llama",
                ..tctx
            },
        )?,
        other => {
            return Err(FormatError::Unsupported {
                field: "text_config.model_type".into(),
                value: format!("\"{}\"", memwall_core::error::untrusted(other)),
                reason: "memwall reads mistral3 wrappers around a mistral or llama text model"
                    .into(),
                hint: "use \"mistral\" (Mistral Small 3.1) or \"llama\"".into(),
            })
        }
    };
    desc.model_type = "mistral3".into();
    // Mistral3Config.tie_word_embeddings (default True in transformers 5.23) decides for the
    // wrapper
    desc.head.tied = raw.tie_word_embeddings.unwrap_or(true);
    desc.vision = Some(vision::pixtral_mistral3(raw, desc.hidden_size)?);
    Ok(desc)
}
