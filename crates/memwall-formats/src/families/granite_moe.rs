//! Granite MoE (IBM granite-3.x `…-a400m` / `…-a800m`, PowerMoE) and Granite MoE with shared
//! experts: the Granite µP decoder (multipliers on the embeddings, every residual branch and
//! the logits) with a top-k mixture of experts in place of the MLP (transformers 5.23
//! `models/granitemoe/{configuration,modeling}_granitemoe.py`,
//! `models/granitemoeshared/{configuration,modeling}_granitemoeshared.py`).

use super::common::{Decoder, Defaults, Dims};
use super::llama::moe;
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{gated, limits::*, names, AttnOpts, Ctx, HeadDimDefault};
use memwall_core::model::{DenseMlp, LinearRole, Mlp, ModelDesc, MoeMlp};

/// `GraniteMoeConfig` / `GraniteMoeSharedConfig` field defaults (the two classes share them).
const GRANITE_MOE: Defaults = Defaults {
    vocab_size: 32000,
    hidden_size: 4096,
    intermediate_size: 11008,
    num_hidden_layers: 32,
    num_attention_heads: 32,
    num_key_value_heads: None,
    head_dim: HeadDimDefault::Derived,
    act: "silu",
    max_position_embeddings: 2048,
    tie_word_embeddings: false,
    strict_divisible: false,
};

/// The routed experts of a Granite MoE layer.
///
/// `GraniteMoeMoE`: `GraniteMoeTopKRouter` (weight `[E, H]`, no bias: `F.linear(x, w).float()`,
/// top-k of the fp32 logits, softmax over those k, cast back to the hidden dtype) and
/// `GraniteMoeExperts` (`gate_up_proj [E, 2·I, H]`, `down_proj [E, H, I]` with
/// I = `intermediate_size`, no biases; run through transformers' `grouped_mm` experts
/// interface, `@use_experts_implementation`). Defaults `num_local_experts` 8,
/// `num_experts_per_tok` 2.
fn routed(raw: &HfConfig, ctx: &Ctx, d: &Dims) -> Result<MoeMlp, FormatError> {
    let mut block = moe(
        ctx,
        ("num_local_experts", raw.num_local_experts, 8),
        raw.num_experts_per_tok.unwrap_or(2),
        d.intermediate,
        d,
    )?;
    block.granite_router = true;
    Ok(block)
}

/// The Granite decoder around `mlp`: Llama's attention (q/k/v/o bias = `attention_bias`, the
/// attention scale `attention_multiplier` is a kernel argument), `inputs_embeds *
/// embedding_multiplier`, `residual + h * residual_multiplier` after attention and after the
/// MoE, `logits / logits_scaling` (each a new tensor whatever the multiplier's value).
fn granite_decoder(
    ctx: &Ctx,
    model_type: &str,
    raw: &HfConfig,
    d: &Dims,
    mlp: Mlp,
    linear_names: Vec<(LinearRole, String)>,
) -> Result<ModelDesc, FormatError> {
    let bias = raw.attention_bias.unwrap_or(false);
    let mut desc = Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        // GraniteMoeModel.forward: `inputs_embeds = inputs_embeds * self.embedding_multiplier`
        scaled_embeddings: true,
        ..Decoder::new(d, linear_names)
    }
    .build(ctx, model_type, d, |_| Ok(mlp))?;
    // GraniteMoeDecoderLayer.forward: `residual + hidden_states * self.residual_multiplier`
    for l in &mut desc.layers {
        l.residual_scaled = true;
    }
    // GraniteMoeForCausalLM.forward: `logits = logits / self.config.logits_scaling`
    desc.head.logits_scaled = true;
    Ok(desc)
}

/// The attention projections: the experts are `nn.Parameter`s, not `nn.Linear`, so only
/// attention (and Granite MoE Shared's shared MLP) are LoRA targets by name.
fn attention_names() -> Vec<(LinearRole, String)> {
    names(&[
        (LinearRole::Q, "q_proj"),
        (LinearRole::K, "k_proj"),
        (LinearRole::V, "v_proj"),
        (LinearRole::O, "o_proj"),
    ])
}

pub(crate) fn granitemoe(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &GRANITE_MOE)?;
    let block = routed(raw, ctx, &d)?;
    granite_decoder(
        ctx,
        "granitemoe",
        raw,
        &d,
        Mlp::Moe(block),
        attention_names(),
    )
}

pub(crate) fn granitemoeshared(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &GRANITE_MOE)?;
    let mut block = routed(raw, ctx, &d)?;
    // GraniteMoeSharedDecoderLayer: `shared_mlp = None if shared_intermediate_size == 0 else
    // GraniteMoeSharedMLP(config)` (input_linear hidden → 2·S, chunk, act(first) · second,
    // output_linear; no biases), run after the routed experts on the same input and added:
    // `moe_hidden_states + self.shared_mlp(hidden_states)`. Default 0.
    let s = match raw.shared_intermediate_size.unwrap_or(0) {
        0 => 0,
        s => ctx.check(s, "shared_intermediate_size", MAX_INTERMEDIATE)?,
    };
    block.shared = (s > 0).then(|| DenseMlp {
        fused_gate_up: true,
        ..gated(s, d.act)
    });
    let mut linear_names = attention_names();
    linear_names.extend(names(&[
        (LinearRole::GateUp, "input_linear"),
        (LinearRole::Down, "output_linear"),
    ]));
    granite_decoder(
        ctx,
        "granitemoeshared",
        raw,
        &d,
        Mlp::Moe(block),
        linear_names,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;
    use memwall_core::model::Mlp;

    #[test]
    fn granite_moe_has_the_mup_flags_and_a_router_of_its_own() {
        let base = r#""vocab_size":100,"hidden_size":64,"intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"num_local_experts":4,"num_experts_per_tok":2"#;
        let d = parse_hf_config(&format!("{{\"model_type\":\"granitemoe\",{base}}}")).unwrap();
        assert!(d.embeddings.scaled && d.head.logits_scaled && d.layers[0].residual_scaled);
        let Mlp::Moe(m) = d.layers[1].mlp else {
            panic!("not MoE")
        };
        assert!(m.granite_router && m.shared.is_none());
        let s = parse_hf_config(&format!(
            "{{\"model_type\":\"granitemoeshared\",{base},\"shared_intermediate_size\":48}}"
        ))
        .unwrap();
        let Mlp::Moe(m) = s.layers[0].mlp else {
            panic!("not MoE")
        };
        assert_eq!(m.shared.map(|s| s.intermediate), Some(48));
    }
}
