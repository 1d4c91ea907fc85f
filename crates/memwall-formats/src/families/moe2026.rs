//! Mixture-of-experts families added for issue 14: olmoe (more follow). Each normaliser
//! states the transformers 5.23 source it follows (paths relative to `transformers/models/`).

use super::common::{Decoder, Defaults, Dims};
use super::llama::moe;
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{llama_names, AttnOpts, Ctx, HeadDimDefault};
use memwall_core::model::{Mlp, ModelDesc, NormKind, QkNormScope};

/// `olmoe/configuration_olmoe.py` `OlmoeConfig` field defaults.
const OLMOE: Defaults = Defaults {
    vocab_size: 50304,
    hidden_size: 2048,
    intermediate_size: 2048,
    num_hidden_layers: 16,
    num_attention_heads: 16,
    num_key_value_heads: None,
    head_dim: HeadDimDefault::Derived,
    act: "silu",
    max_position_embeddings: 4096,
    tie_word_embeddings: false,
    strict_divisible: false,
};

pub(crate) fn olmoe(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &OLMOE)?;
    // modeling_olmoe.py OlmoeAttention.forward: with `clip_qkv` set, q/k/v are clamped in
    // place (`clamp_`), which autograd handles by saving extra copies; not modelled.
    if let Some(c) = raw.clip_qkv {
        return Err(FormatError::OutOfRange {
            field: ctx.field("clip_qkv"),
            value: c.to_string(),
            reason: "OLMoE's in-place q/k/v clipping is not modelled".into(),
            hint: "the released OLMoE checkpoints have clip_qkv null; remove the key to estimate without clipping".into(),
        });
    }
    // configuration_olmoe.py: num_experts=64 (attribute_map num_local_experts→num_experts),
    // num_experts_per_tok=8. modeling_olmoe.py OlmoeExperts: fused gate_up_proj [E, 2·I, H] and
    // down_proj [E, H, I] with I = intermediate_size, no biases; OlmoeTopKRouter: weight
    // [E, H], softmax(dtype=float), top-k, weights cast back to the logits' dtype (the
    // Qwen3-MoE router).
    let (field, experts) = match (raw.num_experts, raw.num_local_experts) {
        (None, Some(n)) => ("num_local_experts", Some(n)),
        (n, _) => ("num_experts", n),
    };
    let block = moe(
        ctx,
        (field, experts, 64),
        raw.num_experts_per_tok.unwrap_or(8),
        d.intermediate,
        &d,
    )?;
    // modeling_olmoe.py OlmoeAttention: q/k/v/o bias=config.attention_bias; q_norm =
    // OlmoeRMSNorm(hidden_size), k_norm = OlmoeRMSNorm(hidden/heads · kv_heads) over the whole
    // projections; OlmoeRMSNorm is `weight * x.to(input_dtype)` (the Llama form).
    let bias = raw.attention_bias.unwrap_or(false);
    Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            qk_norm: Some((QkNormScope::Full, NormKind::RmsNorm)),
            ..AttnOpts::rope(d.heads.head_dim)
        },
        // Experts are nn.Parameters, not nn.Linear: only attention is a LoRA target by name.
        ..Decoder::new(&d, llama_names(false))
    }
    .build(ctx, "olmoe", &d, |_| Ok(Mlp::Moe(block)))
}
