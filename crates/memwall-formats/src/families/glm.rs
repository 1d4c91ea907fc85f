//! GLM (glm-4-9b-chat-hf, `glm`) and GLM-4-0414 (`glm4`): Llama's skeleton with biased q/k/v,
//! a bias-free `o_proj`, half-rotary interleaved RoPE rebuilt by `cat`, and a fused
//! `gate_up_proj`; `glm4` adds post-norms on both sub-block outputs (transformers 5.23
//! `models/glm{,4}/{configuration,modeling}_glm{,4}.py`).

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{gated, names, AttnOpts, Ctx, HeadDimDefault, NormPlacement};
use memwall_core::model::{DenseMlp, LinearRole, Mlp, ModelDesc};

/// `glm/configuration_glm.py` `GlmConfig` and `glm4/configuration_glm4.py` `Glm4Config`
/// field defaults (identical).
const GLM: Defaults = Defaults {
    vocab_size: 151552,
    hidden_size: 4096,
    intermediate_size: 13696,
    num_hidden_layers: 40,
    num_attention_heads: 32,
    num_key_value_heads: Some(2),
    head_dim: HeadDimDefault::Fixed(128),
    act: "silu",
    max_position_embeddings: 131072,
    tie_word_embeddings: false,
    strict_divisible: false,
};

pub(crate) fn glm(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    build(raw, ctx, "glm", NormPlacement::Pre)
}

pub(crate) fn glm4(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    // modeling_glm4.py Glm4DecoderLayer: input_layernorm → attn → post_self_attn_layernorm →
    // residual add; post_attention_layernorm → mlp → post_mlp_layernorm → residual add.
    build(raw, ctx, "glm4", NormPlacement::Sandwich)
}

fn build(
    raw: &HfConfig,
    ctx: &Ctx,
    model_type: &'static str,
    placement: NormPlacement,
) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &GLM)?;
    // configuration_glm{,4}.py __post_init__: kwargs.setdefault("partial_rotary_factor", 0.5);
    // the rotary embedding rotates int(head_dim * partial_rotary_factor) dimensions.
    let fraction = raw
        .rope_dict_partial_factor(ctx.prefix)?
        .or(raw.partial_rotary_factor)
        .unwrap_or(0.5);
    let rotary = ctx.rotary_dim(d.heads.head_dim, fraction, "partial_rotary_factor")?;
    // modeling_glm{,4}.py Glm{,4}Attention: q/k/v_proj bias=config.attention_bias (default
    // True), o_proj bias=False.
    let bias = raw.attention_bias.unwrap_or(true);
    Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: false,
            rotary_dim: Some(rotary),
            // apply_rotary_pos_emb: `torch.cat([q_embed, q_pass], dim=-1)` always
            rope_concat: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        placement,
        ..Decoder::new(
            &d,
            names(&[
                (LinearRole::Q, "q_proj"),
                (LinearRole::K, "k_proj"),
                (LinearRole::V, "v_proj"),
                (LinearRole::O, "o_proj"),
                (LinearRole::GateUp, "gate_up_proj"),
                (LinearRole::Down, "down_proj"),
            ]),
        )
    }
    // modeling_glm{,4}.py Glm{,4}MLP: gate_up_proj = Linear(hidden, 2·intermediate, bias=False),
    // `up_states * act(gate)`, down_proj bias=False.
    .build(ctx, model_type, &d, |_| {
        Ok(Mlp::Dense(DenseMlp {
            fused_gate_up: true,
            ..gated(d.intermediate, d.act)
        }))
    })
}
