//! SmolLM3 (transformers 5.23 `models/smollm3/`): a Llama layer skeleton whose attention skips
//! the rotary embedding on some layers ("NoPE", `no_rope_layers`), with optional sliding
//! windows on those layers.

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::HeadDimDefault;
use crate::resolve::{gated, limits::*, llama_names, sliding_layers, window, AttnOpts, Ctx};
use memwall_core::model::{DenseMlp, Mlp, ModelDesc};

/// `smollm3/configuration_smollm3.py` `SmolLM3Config` field defaults. It has no `head_dim`
/// field: `modeling_smollm3.py` SmolLM3Attention reads `getattr(config, "head_dim",
/// hidden_size // num_attention_heads)`; no `validate_architecture` override.
const SMOLLM3: Defaults = Defaults {
    vocab_size: 128256,
    hidden_size: 2048,
    intermediate_size: 11008,
    num_hidden_layers: 36,
    num_attention_heads: 16,
    num_key_value_heads: Some(4),
    head_dim: HeadDimDefault::Derived,
    act: "silu",
    max_position_embeddings: 32768,
    tie_word_embeddings: true,
    strict_divisible: false,
};

/// Which layers apply the rotary embedding: `no_rope_layers[i]` (truthy = RoPE), else
/// `configuration_smollm3.py` `__post_init__`'s default `int((i + 1) % no_rope_layer_interval
/// != 0)` (interval default 4: every 4th layer is NoPE).
fn rope_layers(raw: &HfConfig, ctx: &Ctx, num_layers: u64) -> Result<Vec<bool>, FormatError> {
    match &raw.no_rope_layers {
        Some(list) => {
            if list.len() as u64 != num_layers {
                return Err(ctx.inconsistent(
                    &["no_rope_layers", "num_hidden_layers"],
                    format!("{} entries for {num_layers} layers", list.len()),
                    "`no_rope_layers` has one entry per layer: 1 where the layer applies rotary embeddings, 0 where it does not",
                ));
            }
            Ok(list.iter().map(|&v| v != 0).collect())
        }
        None => {
            let interval = raw.no_rope_layer_interval.unwrap_or(4);
            let interval = ctx.check(interval, "no_rope_layer_interval", MAX_LAYERS)?;
            Ok((0..num_layers).map(|i| (i + 1) % interval != 0).collect())
        }
    }
}

pub(crate) fn smollm3(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &SMOLLM3)?;
    let rope = rope_layers(raw, ctx, d.layers)?;
    // modeling_smollm3.py SmolLM3Attention: q/k/v/o_proj bias=config.attention_bias;
    // `self.sliding_window = config.sliding_window if config.use_sliding_window and
    // config.layer_types[layer_idx] == "sliding_attention" else None`. The default layer_types
    // (configuration_smollm3.py) make the NoPE layers sliding when use_sliding_window and
    // sliding_window is set.
    let bias = raw.attention_bias.unwrap_or(false);
    let use_sw = raw.use_sliding_window.unwrap_or(false);
    let w = if use_sw {
        window(ctx, raw.sliding_window)?
    } else {
        None
    };
    let sliding = sliding_layers(ctx, raw, d.layers, |i| {
        w.is_some() && !rope.get(i as usize).copied().unwrap_or(true)
    })?;
    // modeling_smollm3.py SmolLM3MLP: gate/up/down_proj bias=config.mlp_bias.
    let mlp = DenseMlp {
        bias: raw.mlp_bias.unwrap_or(false),
        ..gated(d.intermediate, d.act)
    };
    let mut desc = Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        windows: sliding
            .into_iter()
            .map(|s| if s { w } else { None })
            .collect(),
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "smollm3", &d, |_| Ok(Mlp::Dense(mlp)))?;
    // modeling_smollm3.py SmolLM3Attention.forward: `if self.use_rope:` apply_rotary_pos_emb;
    // a NoPE layer attends with the projections' q/k views as they are.
    for (layer, uses_rope) in desc.layers.iter_mut().zip(rope) {
        if !uses_rope {
            layer.attention.rotary_dim = None;
        }
    }
    // modeling_smollm3.py SmolLM3Model.forward lines 398-403: the sliding mask too
    // `if self.has_sliding_layers` (as Qwen 2)
    Ok(super::llama::second_mask_if_sliding(desc))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;

    const BASE: &str = r#""model_type":"smollm3","vocab_size":100,"hidden_size":64,"num_hidden_layers":8,"num_attention_heads":4,"num_key_value_heads":2"#;

    fn rotary(text: &str) -> Vec<Option<u64>> {
        let d = parse_hf_config(text).unwrap();
        d.layers.iter().map(|l| l.attention.rotary_dim).collect()
    }

    #[test]
    fn the_sliding_mask_is_built_with_a_sliding_layer() {
        // SmolLM3Model.forward: the sliding mask `if self.has_sliding_layers`
        let plain = parse_hf_config(&format!("{{{BASE}}}")).unwrap();
        assert!(!plain.builds_both_masks);
        let sw = parse_hf_config(&format!(
            r#"{{{BASE},"use_sliding_window":true,"sliding_window":32}}"#
        ))
        .unwrap();
        assert!(sw.layers[3].attention.sliding_window.is_some());
        assert!(sw.builds_both_masks);
    }

    #[test]
    fn every_fourth_layer_is_nope_by_default() {
        let r = rotary(&format!("{{{BASE}}}"));
        let nope: Vec<usize> = (0..8).filter(|&i| r[i].is_none()).collect();
        assert_eq!(nope, vec![3, 7]);
        assert_eq!(r[0], Some(16));
    }

    #[test]
    fn explicit_no_rope_layers_win_and_must_cover_every_layer() {
        let r = rotary(&format!(
            "{{{BASE},\"no_rope_layers\":[0,1,1,1,1,1,1,0],\"no_rope_layer_interval\":2}}"
        ));
        assert_eq!(r[0], None);
        assert_eq!(r[3], Some(16));
        assert_eq!(r[7], None);
        let e = parse_hf_config(&format!("{{{BASE},\"no_rope_layers\":[1,1]}}")).unwrap_err();
        assert!(e.to_string().contains("no_rope_layers"), "{e}");
        let e = parse_hf_config(&format!("{{{BASE},\"no_rope_layer_interval\":0}}")).unwrap_err();
        assert!(e.to_string().contains("no_rope_layer_interval"), "{e}");
    }

    #[test]
    fn sliding_windows_default_to_the_nope_layers() {
        let d = parse_hf_config(&format!(
            "{{{BASE},\"use_sliding_window\":true,\"sliding_window\":32}}"
        ))
        .unwrap();
        let w: Vec<_> = d
            .layers
            .iter()
            .map(|l| l.attention.sliding_window)
            .collect();
        assert_eq!(
            w,
            vec![None, None, None, Some(32), None, None, None, Some(32)]
        );
    }

    #[test]
    fn use_cache_false_is_kept() {
        let d = parse_hf_config(&format!("{{{BASE},\"use_cache\":false}}")).unwrap();
        assert!(!d.use_cache);
        assert!(parse_hf_config(&format!("{{{BASE}}}")).unwrap().use_cache);
    }
}
