//! Llama 4: `llama4_text` (`Llama4ForCausalLM`) and the multimodal `llama4` wrapper
//! (`Llama4ForConditionalGeneration`, its `text_config` plus the vision tower's weights).
//! Sources: transformers 5.23 `models/llama4/configuration_llama4.py` and
//! `models/llama4/modeling_llama4.py`.

use super::common::{Defaults, Dims};
use crate::error::FormatError;
use crate::raw::{HfConfig, Nested};
use crate::resolve::{
    assemble, attention_dropout_only, gated, head, layer, limits::*, llama_names, norm,
    token_embeddings, AttnOpts, Ctx, HeadDimDefault, NormPlacement, Parts,
};
use memwall_core::model::{DenseMlp, Mlp, ModelDesc, MoeMlp, NormKind};

/// `Llama4TextConfig` field defaults.
const LLAMA4_TEXT: Defaults = Defaults {
    vocab_size: 202_048,
    hidden_size: 5120,
    intermediate_size: 8192,
    num_hidden_layers: 48,
    num_attention_heads: 40,
    num_key_value_heads: Some(8),
    head_dim: HeadDimDefault::Fixed(128),
    act: "silu",
    max_position_embeddings: 4096 * 32,
    tie_word_embeddings: false,
    strict_divisible: false,
};

pub(crate) fn llama4_text(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    llama4_named(raw, ctx, "llama4_text")
}

/// Whether each layer uses RoPE (`no_rope_layers[i] == 1`) or is a NoPE layer (0).
/// `Llama4TextConfig.__post_init__`: an absent or empty list defaults to
/// `int((i + 1) % no_rope_layer_interval != 0)` (interval 4: every 4th layer is NoPE).
fn rope_layers(raw: &HfConfig, ctx: &Ctx, layers: u64) -> Result<Vec<bool>, FormatError> {
    match raw.no_rope_layers.as_deref() {
        Some(list) if !list.is_empty() => {
            if (list.len() as u64) < layers {
                return Err(ctx.inconsistent(
                    &["no_rope_layers", "num_hidden_layers"],
                    format!("{} entries for {layers} layers", list.len()),
                    "`no_rope_layers` has one entry per layer: 1 for a RoPE layer, 0 for a NoPE layer",
                ));
            }
            list.iter()
                .take(usize::try_from(layers).unwrap_or(usize::MAX))
                .map(|&v| match v {
                    0 => Ok(false),
                    1 => Ok(true),
                    other => Err(FormatError::OutOfRange {
                        field: ctx.field("no_rope_layers"),
                        value: other.to_string(),
                        reason: "each entry must be 0 (NoPE layer) or 1 (RoPE layer)".into(),
                        hint: "Llama 4 Scout/Maverick leave the list out: every 4th layer is NoPE"
                            .into(),
                    }),
                })
                .collect()
        }
        _ => {
            let interval = raw.no_rope_layer_interval.unwrap_or(4);
            if interval == 0 {
                return Err(FormatError::OutOfRange {
                    field: ctx.field("no_rope_layer_interval"),
                    value: "0".into(),
                    reason: "must be at least 1 (every interval-th layer is a NoPE layer)".into(),
                    hint: "Llama 4 uses 4".into(),
                });
            }
            Ok((0..layers).map(|i| (i + 1) % interval != 0).collect())
        }
    }
}

/// Which layers are MoE: `moe_layers`, or `Llama4TextConfig.__post_init__`'s
/// `range(interleave_moe_layer_step - 1, num_hidden_layers, interleave_moe_layer_step)`;
/// `Llama4TextDecoderLayer`: `is_moe_layer = layer_idx in config.moe_layers`.
fn moe_layers(raw: &HfConfig, ctx: &Ctx, layers: u64) -> Result<Vec<bool>, FormatError> {
    match raw.moe_layers.as_deref() {
        Some(list) => {
            if let Some(bad) = list.iter().find(|&&i| i >= layers) {
                return Err(ctx.inconsistent(
                    &["moe_layers", "num_hidden_layers"],
                    format!("layer index {bad} does not exist in a {layers}-layer model"),
                    "moe_layers lists 0-based indices of the mixture-of-experts layers",
                ));
            }
            Ok((0..layers).map(|i| list.contains(&i)).collect())
        }
        None => {
            let step = raw.interleave_moe_layer_step.unwrap_or(1);
            if step == 0 {
                return Err(FormatError::OutOfRange {
                    field: ctx.field("interleave_moe_layer_step"),
                    value: "0".into(),
                    reason: "must be at least 1 (every step-th layer is a mixture of experts)"
                        .into(),
                    hint: "Scout uses 1 (every layer), Maverick 2 (every other layer)".into(),
                });
            }
            Ok((0..layers).map(|i| (i + 1) % step == 0).collect())
        }
    }
}

/// The attention kind of each layer: chunked (`true`) or full. `Llama4TextConfig.__post_init__`
/// defaults `layer_types` to `"chunked_attention"` on RoPE layers and `"full_attention"` on
/// NoPE layers.
fn chunked_layers(
    raw: &HfConfig,
    ctx: &Ctx,
    layers: u64,
    rope: &[bool],
) -> Result<Vec<bool>, FormatError> {
    match &raw.layer_types {
        None => Ok(rope.to_vec()),
        Some(types) => {
            if types.len() as u64 != layers {
                return Err(ctx.inconsistent(
                    &["layer_types", "num_hidden_layers"],
                    format!("{} layer types for {layers} layers", types.len()),
                    "`layer_types` names the attention kind of every layer, one entry per layer",
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(false),
                    "chunked_attention" => Ok(true),
                    other => Err(FormatError::Unsupported {
                        field: ctx.field("layer_types"),
                        value: format!("\"{other}\""),
                        reason: "Llama 4 only has full and chunked attention".into(),
                        hint: "use \"full_attention\" or \"chunked_attention\"".into(),
                    }),
                })
                .collect()
        }
    }
}

fn llama4_named(raw: &HfConfig, ctx: &Ctx, model_type: &str) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &LLAMA4_TEXT)?;
    let rope = rope_layers(raw, ctx, d.layers)?;
    let moe = moe_layers(raw, ctx, d.layers)?;
    let chunked = chunked_layers(raw, ctx, d.layers, &rope)?;
    // attention_chunk_size: default 8192; null disables it, and then a chunked layer makes
    // masking_utils.create_chunked_causal_mask raise.
    let chunk = match raw.attention_chunk_size {
        None => Some(8192),
        Some(v) => v,
    };
    let chunk = chunk
        .map(|c| ctx.check(c, "attention_chunk_size", MAX_POSITIONS))
        .transpose()?;
    if chunk.is_none() && chunked.contains(&true) {
        return Err(ctx.inconsistent(
            &["attention_chunk_size", "layer_types"],
            "chunked-attention layers need a chunk size".into(),
            "set attention_chunk_size (Llama 4 uses 8192) or make every layer full_attention",
        ));
    }
    let use_qk_norm = raw.use_qk_norm.unwrap_or(true);
    let temperature = raw.attn_temperature_tuning.unwrap_or(true);
    let bias = raw.attention_bias.unwrap_or(false);
    let mlp_i = ctx.size(
        raw.intermediate_size_mlp,
        "intermediate_size_mlp",
        16384,
        MAX_INTERMEDIATE,
    )?;
    let block = if moe.contains(&true) {
        let num_experts = ctx.size(raw.num_local_experts, "num_local_experts", 16, MAX_EXPERTS)?;
        let top_k = ctx.check(
            raw.num_experts_per_tok.unwrap_or(1),
            "num_experts_per_tok",
            MAX_EXPERTS,
        )?;
        if top_k > num_experts {
            return Err(ctx.inconsistent(
                &["num_experts_per_tok", "num_local_experts"],
                format!("each token picks {top_k} of only {num_experts} experts"),
                "num_experts_per_tok must not exceed num_local_experts",
            ));
        }
        // Llama4TextMoe: experts (Llama4TextExperts: gate_up_proj [E, H, 2·I], down_proj
        // [E, I, H], I = intermediate_size), router (Llama4Router: Linear(H, E, bias=False)),
        // shared_expert (Llama4TextMLP(intermediate_size): gate/up/down_proj, no bias).
        Some(MoeMlp {
            num_experts,
            top_k,
            expert: DenseMlp {
                fused_gate_up: true,
                ..gated(d.intermediate, d.act)
            },
            router_bias: false,
            shared: Some(gated(d.intermediate, d.act)),
            shared_gate: false,
            router_extra_params: 0,
            router_fp32: false,
            all_experts: true,
            granite_router: false,
            hunyuan_router: false,
            norm_topk_prob: None,
            router_topk_then_softmax: false,
            router_weights_in_compute_dtype: false,
            router_scores_fp32: false,
            shared_first: false,
            frozen_router_params: 0,
        })
    } else {
        None
    };
    let n = norm(NormKind::RmsNorm, d.hidden);
    let layers = (0..d.num_layers())
        .map(|i| {
            let is_rope = rope.get(i).copied().unwrap_or(true);
            // Llama4TextAttention: q/k/v/o_proj bias=config.attention_bias; RoPE only when
            // use_rope; qk_norm (L2) when use_qk_norm and use_rope; temperature tuning on NoPE
            // layers; eager softmax in the compute dtype ("llama4 doesn't cast attn weights to
            // fp32").
            let attn = AttnOpts {
                qkv_bias: bias,
                o_bias: bias,
                rotary_dim: is_rope.then_some(d.heads.head_dim),
                eager_softmax_fp32: false,
                rope_complex: true,
                l2_qk_norm: use_qk_norm && is_rope,
                temperature_tuning: temperature && !is_rope,
                ..AttnOpts::rope(d.heads.head_dim)
            };
            // A chunked layer's cache is a DynamicSlidingWindowLayer of the chunk size and its
            // SDPA mask is materialised like a sliding window's (cache_utils.py
            // LAYER_CLASS_MAP, masking_utils.create_chunked_causal_mask `local_size`).
            let is_chunked = chunked.get(i).copied().unwrap_or(false);
            let w = if is_chunked { chunk } else { None };
            // Llama4TextDecoderLayer: input_layernorm, post_attention_layernorm
            // (Llama4TextRMSNorm: `_norm(x.float()).type_as(x) * weight`).
            let mlp = match (moe.get(i).copied().unwrap_or(false), block) {
                (true, Some(m)) => Mlp::Moe(m),
                _ => Mlp::Dense(gated(mlp_i, d.act)),
            };
            let attn = AttnOpts {
                chunked: is_chunked,
                ..attn
            };
            // Llama4TextDecoderLayer.forward binds `attention_states` and never rebinds it:
            // the attention output lives until the layer returns
            let mut l = layer(n, NormPlacement::Pre, attn.build(d.heads, w), mlp);
            l.attn_output_outlives_mlp = true;
            l
        })
        .collect();
    let mut desc = assemble(
        ctx,
        model_type,
        Parts {
            hidden_size: d.hidden,
            max_position_embeddings: d.max_position_embeddings,
            embeddings: token_embeddings(d.vocab_size, d.hidden, false),
            layers,
            head: head(Some(n), d.tie_word_embeddings, None),
            dropout: attention_dropout_only(d.attention_dropout),
            // dense MLPs and shared experts are nn.Linear gate/up/down_proj; the routed
            // experts are nn.Parameters
            linear_names: llama_names(true),
        },
    )?;
    // modeling_llama4.py Llama4TextModel.forward: `causal_mask_mapping = {"full_attention":
    // create_causal_mask(..), "chunked_attention": create_chunked_causal_mask(..)}` on every
    // forward whatever the layer types; the one no layer reads lives until the model returns
    // (tools/truth/probes/live_tensors.py on rnd-s89-llama4text-0, one chunked layer, eager:
    // two [B, 1, S, S] masks alive at the MLP)
    desc.builds_both_masks = true;
    Ok(desc)
}

/// Multimodal `llama4` (`Llama4ForConditionalGeneration`): the language model is the
/// `text_config` (a `Llama4TextConfig`, `Llama4Config.sub_configs_defaults`); the vision model
/// and projector are sized by `vision.rs`.
pub(crate) fn llama4(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let inner = match raw.text_config(ctx.prefix)? {
        Nested::Object(inner) => inner,
        Nested::NotObject(found) => {
            return Err(FormatError::WrongType {
                field: ctx.field("text_config"),
                message: format!("expected an object, found {found}"),
                hint: "a llama4 config nests its language model config under `text_config`".into(),
            })
        }
        // Llama4Config: text_config=None → Llama4TextConfig() defaults
        Nested::Absent => Box::default(),
    };
    if let Some(mt) = inner.model_type.as_deref() {
        if mt != "llama4_text" {
            return Err(FormatError::Unsupported {
                field: "text_config.model_type".into(),
                value: format!("\"{mt}\""),
                reason: "a llama4 text_config must be a llama4_text config".into(),
                hint: "remove the key or set it to \"llama4_text\"".into(),
            });
        }
    }
    let nested = Ctx {
        model_type: "llama4_text",
        prefix: "text_config.",
        nested: true,
    };
    let mut desc = llama4_named(&inner, &nested, "llama4")?;
    desc.vision = Some(super::vision::llama4_vision(raw, desc.hidden_size)?);
    // Llama4Config.tie_word_embeddings (default False) decides for the wrapper
    desc.head.tied = raw.tie_word_embeddings.unwrap_or(false);
    Ok(desc)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;
    use memwall_core::model::Mlp;

    const SCOUT_4L: &str = r#"{"model_type":"llama4_text","hidden_size":5120,
        "intermediate_size":8192,"intermediate_size_mlp":16384,"num_hidden_layers":4,
        "num_attention_heads":40,"num_key_value_heads":8,"head_dim":128,"vocab_size":202048,
        "num_local_experts":16,"num_experts_per_tok":1}"#;

    fn with(extra: &str) -> String {
        format!("{},{extra}}}", SCOUT_4L.trim_end_matches('}'))
    }

    #[test]
    fn scout_layers_follow_the_config_defaults() {
        let d = parse_hf_config(SCOUT_4L).unwrap();
        // every 4th layer is NoPE, full attention, temperature-tuned, without qk norm
        for (i, l) in d.layers.iter().enumerate() {
            let nope = i == 3;
            assert_eq!(l.attention.rotary_dim.is_none(), nope, "layer {i}");
            assert_eq!(l.attention.chunked, !nope, "layer {i}");
            assert_eq!(
                l.attention.sliding_window,
                (!nope).then_some(8192),
                "layer {i}"
            );
            assert_eq!(l.attention.temperature_tuning, nope, "layer {i}");
            assert_eq!(l.attention.l2_qk_norm, !nope, "layer {i}");
            assert!(l.attn_output_outlives_mlp);
            let Mlp::Moe(m) = l.mlp else {
                panic!("layer {i} is dense")
            };
            assert!(m.all_experts && m.shared.is_some());
        }
    }

    #[test]
    fn both_masks_are_built_whatever_the_layer_types() {
        // Llama4TextModel.forward builds the full and the chunked mask on every forward
        let all = |t: &str| [t; 4].join(",");
        for types in [all(r#""chunked_attention""#), all(r#""full_attention""#)] {
            let d = parse_hf_config(&with(&format!(r#""layer_types":[{types}]"#))).unwrap();
            assert!(d.builds_both_masks, "{types}");
        }
    }

    #[test]
    fn maverick_interleaves_dense_and_moe_layers() {
        let d = parse_hf_config(&with(
            r#""interleave_moe_layer_step":2,"use_qk_norm":false"#,
        ))
        .unwrap();
        let moe: Vec<bool> = d
            .layers
            .iter()
            .map(|l| matches!(l.mlp, Mlp::Moe(_)))
            .collect();
        assert_eq!(moe, [false, true, false, true]);
        assert!(d.layers.iter().all(|l| !l.attention.l2_qk_norm));
    }

    #[test]
    fn bad_llama4_settings_are_refused_by_name() {
        for (extra, field) in [
            (
                r#""interleave_moe_layer_step":0"#,
                "interleave_moe_layer_step",
            ),
            (r#""no_rope_layers":[1,1,2,1]"#, "no_rope_layers"),
            (r#""no_rope_layers":[1,1]"#, "no_rope_layers"),
            (r#""moe_layers":[7]"#, "moe_layers"),
            (
                r#""layer_types":["sliding_attention","full_attention","full_attention","full_attention"]"#,
                "layer_types",
            ),
            (r#""attention_chunk_size":null"#, "attention_chunk_size"),
            (r#""no_rope_layer_interval":0"#, "no_rope_layer_interval"),
        ] {
            let e = parse_hf_config(&with(extra)).unwrap_err().to_string();
            assert!(e.contains(field), "{extra}: {e}");
        }
    }

    #[test]
    fn vision_configs_are_checked() {
        let base =
            r#"{"model_type":"llama4","text_config":{"num_hidden_layers":2},"vision_config":"#;
        let ok = parse_hf_config(&format!("{base}{{\"image_size\":[336,336]}}}}")).unwrap();
        assert!(ok.vision.is_some_and(|v| v.params() > 0));
        for (v, field) in [
            (r#"{"image_size":[336,448]}"#, "image_size"),
            (r#"{"hidden_size":0}"#, "hidden_size"),
            (r#""none""#, "vision_config"),
        ] {
            let e = parse_hf_config(&format!("{base}{v}}}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{v}: {e}");
        }
    }
}
