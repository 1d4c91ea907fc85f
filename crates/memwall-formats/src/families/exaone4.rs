//! EXAONE 4 (transformers 5.23 `models/exaone4/`): post-norm layers (norms on the attention and
//! MLP outputs only), per-head q/k RMSNorms, and in the hybrid models sliding-window layers
//! with RoPE between global layers without it.

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::{HfConfig, SlidingPattern};
use crate::resolve::{
    gated, llama_names, sliding_layers, window, AttnOpts, Ctx, HeadDimDefault, NormPlacement,
};
use memwall_core::error::untrusted;
use memwall_core::model::{Mlp, ModelDesc, NormKind, QkNormScope};

/// `exaone4/configuration_exaone4.py` `Exaone4Config` field defaults. It has no `head_dim`
/// field: `modeling_exaone4.py` Exaone4Attention reads `getattr(config, "head_dim",
/// hidden_size // num_attention_heads)`.
const EXAONE4: Defaults = Defaults {
    vocab_size: 102400,
    hidden_size: 4096,
    intermediate_size: 16384,
    num_hidden_layers: 32,
    num_attention_heads: 32,
    num_key_value_heads: Some(32),
    head_dim: HeadDimDefault::Derived,
    act: "silu",
    max_position_embeddings: 2048,
    tie_word_embeddings: false,
    strict_divisible: false,
};

pub(crate) fn exaone4(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &EXAONE4)?;
    // configuration_exaone4.py: sliding_window defaults to 4096 (an explicit null means none),
    // sliding_window_pattern to 4; __post_init__ sets the pattern to 0 without a window and,
    // without layer_types, makes layer i sliding iff (i + 1) % pattern != 0 (a letter pattern
    // or 0 cannot make that list: transformers raises, so such a config must list layer_types).
    let w = if raw.explicit_nulls.iter().any(|k| k == "sliding_window") {
        None
    } else {
        window(ctx, raw.sliding_window.or(Some(4096)))?
    };
    let every = match (&raw.sliding_window_pattern, w) {
        (_, None) => None,
        (None, Some(_)) => Some(4),
        (Some(SlidingPattern::Every(n)), Some(_)) => Some(*n).filter(|&n| n > 0),
        (Some(SlidingPattern::Letters(_)), Some(_)) => None,
    };
    if raw.layer_types.is_none() && every.is_none() {
        let value = match &raw.sliding_window_pattern {
            Some(SlidingPattern::Letters(s)) => format!("\"{}\"", untrusted(s)),
            Some(SlidingPattern::Every(n)) => n.to_string(),
            None => "null".into(),
        };
        return Err(FormatError::Unsupported {
            field: ctx.field("sliding_window_pattern"),
            value,
            reason: "without `layer_types`, Exaone4Config derives the layer kinds as (i + 1) % sliding_window_pattern, which needs a positive integer pattern and a sliding_window".into(),
            hint: "state `layer_types` (one \"sliding_attention\"/\"full_attention\" per layer), as the published EXAONE 4 configs do".into(),
        });
    }
    let sliding = sliding_layers(ctx, raw, d.layers, |i| {
        every.is_some_and(|n| (i + 1) % n != 0)
    })?;
    // modeling_exaone4.py Exaone4Attention: `sliding_window=self.sliding_window if
    // self.is_sliding else None`; RoPE only `if self.sliding_window is None or self.is_sliding`
    // ("global NoPE for hybrid attention"): with a window, the global layers skip the rotation.
    // q/k/v/o_proj bias=False; q_norm/k_norm = Exaone4RMSNorm(head_dim) on q/k before RoPE.
    let mut desc = Decoder {
        attn: AttnOpts {
            qk_norm: Some((QkNormScope::PerHead, NormKind::RmsNorm)),
            ..AttnOpts::rope(d.heads.head_dim)
        },
        windows: sliding.iter().map(|&s| if s { w } else { None }).collect(),
        // Exaone4DecoderLayer: post_attention_layernorm and post_feedforward_layernorm on the
        // sub-block outputs, no input norms; Exaone4RMSNorm is LlamaRMSNorm.
        placement: NormPlacement::PostOnly,
        ..Decoder::new(&d, llama_names(true))
    }
    // Exaone4MLP: gate/up/down_proj bias=False.
    .build(ctx, "exaone4", &d, |_| {
        Ok(Mlp::Dense(gated(d.intermediate, d.act)))
    })?;
    if w.is_some() {
        for (layer, &s) in desc.layers.iter_mut().zip(&sliding) {
            if !s {
                layer.attention.rotary_dim = None;
            }
        }
    }
    // Exaone4Model.forward builds the full-attention mask always and the sliding-window one
    // `if "sliding_attention" in self.config.layer_types` (modeling_exaone4.py lines 391-395,
    // transformers 5.23), like Qwen 2 / 3: with a sliding layer both masks exist (measured:
    // rnd-i113-001-exaone4, one sliding layer, eager prefill, the unread full mask alive).
    Ok(super::llama::second_mask_if_sliding(desc))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;

    const BASE: &str = r#""model_type":"exaone4","vocab_size":100,"hidden_size":64,"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16"#;

    #[test]
    fn hybrid_layers_slide_with_rope_and_global_layers_have_none() {
        let d = parse_hf_config(&format!(
            "{{{BASE},\"sliding_window\":32,\"sliding_window_pattern\":\"LLLG\",\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"sliding_attention\",\"full_attention\"]}}"
        ))
        .unwrap();
        let w: Vec<_> = d
            .layers
            .iter()
            .map(|l| l.attention.sliding_window)
            .collect();
        assert_eq!(w, vec![Some(32), Some(32), Some(32), None]);
        let r: Vec<_> = d.layers.iter().map(|l| l.attention.rotary_dim).collect();
        assert_eq!(r, vec![Some(16), Some(16), Some(16), None]);
        assert!(d.layers[0].attn_norm.is_none() && d.layers[0].mlp_post_norm.is_some());
        assert!(d.builds_both_masks);
    }

    #[test]
    fn without_a_window_every_layer_rotates() {
        let d = parse_hf_config(&format!(
            "{{{BASE},\"sliding_window\":null,\"sliding_window_pattern\":null,\"layer_types\":[\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\"]}}"
        ))
        .unwrap();
        assert!(d
            .layers
            .iter()
            .all(|l| l.attention.rotary_dim == Some(16) && l.attention.sliding_window.is_none()));
        assert!(!d.builds_both_masks);
    }

    #[test]
    fn integer_patterns_default_the_layer_types_and_letters_need_them() {
        let d = parse_hf_config(&format!("{{{BASE},\"sliding_window\":32}}")).unwrap();
        let w: Vec<_> = d
            .layers
            .iter()
            .map(|l| l.attention.sliding_window)
            .collect();
        assert_eq!(w, vec![Some(32), Some(32), Some(32), None]);
        let e = parse_hf_config(&format!("{{{BASE},\"sliding_window_pattern\":\"LLLG\"}}"))
            .unwrap_err();
        assert!(e.to_string().contains("layer_types"), "{e}");
    }
}
