//! Cohere (Command R, `cohere`) and Cohere 2 (Command R7B, `cohere2`): one bias-free
//! `CohereLayerNorm` feeding a parallel attention + MLP block summed as `residual + attn + mlp`,
//! fp32 interleaved RoPE, tied embeddings and `logits * logit_scale`; Cohere 2 alternates
//! sliding-window layers (with RoPE) and global layers (no positional encoding) (transformers
//! 5.23 `models/cohere{,2}/{configuration,modeling}_cohere{,2}.py`).

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::{HfConfig, SlidingPattern};
use crate::resolve::{gated, llama_names, sliding_layers, window, AttnOpts, Ctx, HeadDimDefault};
use memwall_core::error::untrusted;
use memwall_core::model::{Mlp, ModelDesc, NormKind, QkNormScope, Residual};

/// `cohere/configuration_cohere.py` `CohereConfig` and `cohere2/configuration_cohere2.py`
/// `Cohere2Config` field defaults (identical sizes).
const COHERE: Defaults = Defaults {
    vocab_size: 256000,
    hidden_size: 8192,
    intermediate_size: 22528,
    num_hidden_layers: 40,
    num_attention_heads: 64,
    num_key_value_heads: None,
    head_dim: HeadDimDefault::Derived,
    act: "silu",
    max_position_embeddings: 8192,
    tie_word_embeddings: true,
    strict_divisible: false,
};

pub(crate) fn cohere(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &COHERE)?;
    // modeling_cohere.py CohereAttention: with use_qk_norm, q_norm/k_norm are
    // CohereLayerNorm((heads, head_dim)) / ((kv_heads, head_dim)): weights over the whole
    // projection, normalised per head. memwall's Full scope counts the same weights and
    // elements (its per-row mean/rsqrt are per token rather than per head: a few bytes per
    // token and head, not modelled).
    let qk_norm = raw
        .use_qk_norm
        .unwrap_or(false)
        .then_some((QkNormScope::Full, NormKind::CohereLayerNorm));
    build(
        raw,
        ctx,
        ("cohere", false),
        &d,
        qk_norm,
        vec![None; d.num_layers()],
    )
}

pub(crate) fn cohere2(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &COHERE)?;
    // configuration_cohere2.py __post_init__: layer_types default to "sliding_attention"
    // unless (i + 1) % sliding_window_pattern == 0 (pattern default 4); sliding_window
    // defaults to 4096. modeling_cohere2.py Cohere2Attention: sliding_window only on sliding
    // layers.
    let pattern = match &raw.sliding_window_pattern {
        None => 4,
        Some(SlidingPattern::Every(n)) => (*n).max(1),
        Some(SlidingPattern::Letters(s)) => {
            return Err(FormatError::Unsupported {
                field: ctx.field("sliding_window_pattern"),
                value: format!("\"{}\"", untrusted(s)),
                reason: "Cohere 2 counts layers here (every n-th layer is global)".into(),
                hint: "use an integer, e.g. 4 (three sliding layers, then one global)".into(),
            });
        }
    };
    let sliding = sliding_layers(ctx, raw, d.layers, |i| (i + 1) % pattern != 0)?;
    let w = window(ctx, raw.sliding_window.or(Some(4096)))?;
    let windows = sliding.iter().map(|&s| if s { w } else { None }).collect();
    let mut desc = build(raw, ctx, ("cohere2", true), &d, None, windows)?;
    // modeling_cohere2.py Cohere2Model.forward: `causal_mask_mapping = {"full_attention":
    // create_causal_mask(..), "sliding_attention": create_sliding_window_causal_mask(..)}`,
    // both built on every forward whatever the layer types (as Gemma 2 / 3)
    desc.builds_both_masks = true;
    Ok(desc)
}

fn build(
    raw: &HfConfig,
    ctx: &Ctx,
    (model_type, nope_on_global): (&'static str, bool),
    d: &Dims,
    qk_norm: Option<(QkNormScope, NormKind)>,
    windows: Vec<Option<u64>>,
) -> Result<ModelDesc, FormatError> {
    // modeling_cohere{,2}.py: q/k/v/o_proj bias=config.attention_bias (default False).
    let bias = raw.attention_bias.unwrap_or(false);
    let mut desc = Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            qk_norm,
            // apply_rotary_pos_emb: q.float(), k.float(), interleaved rotate_half, cast back
            rope_upcast_qk: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        windows,
        // input_layernorm and the final norm are CohereLayerNorm (no bias)
        norm_kind: NormKind::CohereLayerNorm,
        ..Decoder::new(d, llama_names(true))
    }
    // modeling_cohere{,2}.py Cohere{,2}MLP: down(act(gate(x)) * up(x)), no biases.
    .build(ctx, model_type, d, |_| {
        Ok(Mlp::Dense(gated(d.intermediate, d.act)))
    })?;
    for l in &mut desc.layers {
        // Cohere{,2}DecoderLayer.forward: one input_layernorm read by attention and the MLP,
        // `hidden_states = residual + hidden_states_attention + hidden_states_mlp`
        l.mlp_norm = None;
        l.residual = Residual::Parallel;
        l.parallel_residual_first = true;
        // modeling_cohere2.py Cohere2Attention.forward: `if self.sliding_window is not None:
        // apply_rotary_pos_emb(...)`: global layers have no positional encoding
        if nope_on_global && l.attention.sliding_window.is_none() {
            l.attention.rotary_dim = None;
        }
    }
    // Cohere{,2}ForCausalLM.forward: `logits = logits * self.logit_scale`
    desc.head.logits_scaled = true;
    Ok(desc)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::parse_hf_config;
    use memwall_core::model::{NormKind, Residual};

    #[test]
    fn cohere2_alternates_sliding_rope_layers_and_global_nope_layers() {
        let d = parse_hf_config(
            r#"{"model_type":"cohere2","hidden_size":256,"intermediate_size":512,
                "num_hidden_layers":8,"num_attention_heads":4,"num_key_value_heads":2,
                "vocab_size":1000,"sliding_window":64}"#,
        )
        .unwrap();
        for (i, l) in d.layers.iter().enumerate() {
            let global = (i + 1) % 4 == 0;
            assert_eq!(
                l.attention.sliding_window,
                (!global).then_some(64),
                "layer {i}"
            );
            assert_eq!(l.attention.rotary_dim, (!global).then_some(64), "layer {i}");
            assert_eq!(l.residual, Residual::Parallel);
            assert!(l.parallel_residual_first && l.mlp_norm.is_none());
            assert_eq!(l.attn_norm.unwrap().kind, NormKind::CohereLayerNorm);
            assert!(!l.attn_norm.unwrap().bias);
        }
        assert!(d.head.tied && d.head.logits_scaled);
        // Cohere2Model.forward builds the full and the sliding mask unconditionally
        assert!(d.builds_both_masks);
    }
}
