//! `qwen3_next` (`Qwen3NextForCausalLM`, Qwen3-Next; transformers 5.23
//! `models/qwen3_next/{configuration,modeling}_qwen3_next.py`): gated DeltaNet linear-attention
//! layers and gated full-attention layers (`layer_types`, by default every
//! `full_attention_interval`-th layer is full attention), each followed by a sparse MoE block
//! with a sigmoid-gated shared expert (the Qwen2-MoE block) or a dense MLP.
//!
//! - `Qwen3NextRMSNorm` is zero-centred: `(x.float() · rsqrt(...) · (1 + weight.float()))
//!   .type_as(x)`, the Gemma form ([`NormKind::GemmaRmsNorm`]), for the layer norms, the final
//!   norm and the per-head q/k norms.
//! - `Qwen3NextAttention`: `q_proj` is `2 · heads · head_dim` wide (query and output gate per
//!   head, [`memwall_core::model::Attention::output_gate`]), per-head q/k norms, partial
//!   rotary embedding (`partial_rotary_factor`, 0.25 by default, set in
//!   `Qwen3NextConfig.__post_init__`), `o_proj`.
//! - `Qwen3NextGatedDeltaNet`: [`GatedDeltaNet`] (`in_proj_qkvz`, `in_proj_ba`, depthwise
//!   conv, the chunked gated delta rule, gated RMSNorm, `out_proj`).

use super::common::{Decoder, Defaults, Dims};
use super::llama::{qwen_moe_block, QwenMoeDefaults};
use super::ssm::no_attention;
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{gated, limits::*, llama_names, AttnOpts, Ctx, HeadDimDefault};
use memwall_core::mixer::{GatedDeltaNet, Mixer};
use memwall_core::model::{LinearRole, Mlp, ModelDesc, NormKind, QkNormScope};

/// `Qwen3NextConfig` field defaults.
const QWEN3_NEXT: Defaults = Defaults {
    vocab_size: 151936,
    hidden_size: 2048,
    intermediate_size: 5632,
    num_hidden_layers: 48,
    num_attention_heads: 16,
    num_key_value_heads: Some(2),
    head_dim: HeadDimDefault::Fixed(256),
    act: "silu",
    max_position_embeddings: 32768,
    tie_word_embeddings: false,
    strict_divisible: false,
};

/// The chunk length `Qwen3NextGatedDeltaNet.forward` calls `torch_chunk_gated_delta_rule` with
/// (its default `chunk_size=64`).
const DELTA_CHUNK: u64 = 64;

pub(crate) fn qwen3_next(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &QWEN3_NEXT)?;
    // MoE: num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
    // shared_expert_intermediate_size=512, decoder_sparse_step=1, mlp_only_layers=[].
    // Qwen3NextSparseMoeBlock is Qwen2MoeSparseMoeBlock line for line (shared expert first,
    // router, experts, `sigmoid(shared_expert_gate(x)) * shared_expert_output`, sum).
    let (sparse, block) = qwen_moe_block(
        raw,
        ctx,
        &d,
        &QwenMoeDefaults {
            experts: 512,
            top_k: 10,
            moe_intermediate: 512,
            shared_intermediate: 512,
            // configuration_qwen3_next.py: norm_topk_prob=True
            norm_topk_prob: true,
        },
    )?;
    // Qwen3NextConfig.__post_init__: kwargs.setdefault("partial_rotary_factor", 0.25); the
    // rotary embedding rotates int(head_dim * partial_rotary_factor) dimensions
    let fraction = raw
        .rope_dict_partial_factor(ctx.prefix)?
        .or(raw.partial_rotary_factor)
        .unwrap_or(0.25);
    let rotary = ctx.rotary_dim(d.heads.head_dim, fraction, "partial_rotary_factor")?;
    // Qwen3NextConfig.__post_init__: without layer_types, layer i is "linear_attention" iff
    // (i + 1) % full_attention_interval != 0 (interval 4 by default)
    let types: Vec<bool> = match &raw.layer_types {
        Some(t) => {
            if t.len() as u64 != d.layers {
                return Err(ctx.inconsistent(
                    &["layer_types", "num_hidden_layers"],
                    format!("{} layer types for {} layers", t.len(), d.layers),
                    "`layer_types` names the mixer of every layer, one entry per layer",
                ));
            }
            t.iter()
                .map(|s| match s.as_str() {
                    "linear_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(FormatError::Unsupported {
                        field: ctx.field("layer_types"),
                        value: format!("\"{other}\""),
                        reason: "qwen3_next layers are \"linear_attention\" or \"full_attention\""
                            .into(),
                        hint: "use \"linear_attention\" or \"full_attention\"".into(),
                    }),
                })
                .collect::<Result<_, _>>()?
        }
        None => {
            let interval = raw.full_attention_interval.unwrap_or(4);
            if interval == 0 {
                return Err(FormatError::OutOfRange {
                    field: ctx.field("full_attention_interval"),
                    value: "0".into(),
                    reason: "must be at least 1 (every interval-th layer is full attention)".into(),
                    hint: "Qwen3-Next uses 4".into(),
                });
            }
            (0..d.layers).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    let k_heads = ctx.size(
        raw.linear_num_key_heads,
        "linear_num_key_heads",
        16,
        MAX_HEADS,
    )?;
    let v_heads = ctx.size(
        raw.linear_num_value_heads,
        "linear_num_value_heads",
        32,
        MAX_HEADS,
    )?;
    if v_heads % k_heads != 0 {
        return Err(ctx.inconsistent(
            &["linear_num_value_heads", "linear_num_key_heads"],
            format!("{v_heads} value heads are not a multiple of {k_heads} key heads"),
            "each key head serves linear_num_value_heads / linear_num_key_heads value heads",
        ));
    }
    let mixer = GatedDeltaNet {
        num_k_heads: k_heads,
        num_v_heads: v_heads,
        k_head_dim: ctx.size(
            raw.linear_key_head_dim,
            "linear_key_head_dim",
            128,
            MAX_HEAD_DIM,
        )?,
        v_head_dim: ctx.size(
            raw.linear_value_head_dim,
            "linear_value_head_dim",
            128,
            MAX_HEAD_DIM,
        )?,
        conv_kernel: ctx.size(
            raw.linear_conv_kernel_dim,
            "linear_conv_kernel_dim",
            4,
            1 << 12,
        )?,
        chunk_size: DELTA_CHUNK,
    };
    let bias = raw.attention_bias.unwrap_or(false);
    // the shared expert's gate/up/down_proj are nn.Linear, but peft 0.21.2 maps those target
    // names onto the routed experts' parameters (transformers 5.23 converts qwen3_next like
    // qwen2_moe; memory::check_lora_targets): they are not targets by name
    let mut names = llama_names(false);
    names.extend([
        (LinearRole::SsmIn, "in_proj_qkvz".to_string()),
        (LinearRole::SsmGates, "in_proj_ba".to_string()),
        (LinearRole::SsmOut, "out_proj".to_string()),
    ]);
    let mut desc = Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            qk_norm: Some((QkNormScope::PerHead, NormKind::GemmaRmsNorm)),
            rotary_dim: Some(rotary),
            output_gate: true,
            // modeling_qwen3_next.py Qwen3NextAttention.forward: `self.q_norm(query_states
            // .view(..))`, `self.k_norm(self.k_proj(x).view(..))`, then `self.v_proj(x)`
            qk_norm_inline: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        norm_kind: NormKind::GemmaRmsNorm,
        ..Decoder::new(&d, names)
    }
    .build(ctx, "qwen3_next", &d, |i| {
        Ok(match (sparse.get(i).copied().unwrap_or(false), block) {
            (true, Some(m)) => Mlp::Moe(m),
            _ => Mlp::Dense(gated(d.intermediate, d.act)),
        })
    })?;
    for (layer, linear) in desc.layers.iter_mut().zip(types) {
        if linear {
            layer.attention = no_attention();
            layer.mixer = Mixer::GatedDeltaNet(mixer);
        }
    }
    Ok(desc)
}

#[cfg(test)]
mod tests {
    use crate::parse_hf_config;

    #[test]
    fn qwen3_next_80b_layout() {
        let d = parse_hf_config(
            r#"{"model_type": "qwen3_next", "num_hidden_layers": 8, "vocab_size": 151936,
                "hidden_size": 2048, "num_attention_heads": 16}"#,
        )
        .unwrap();
        let linear: Vec<bool> = d
            .layers
            .iter()
            .map(|l| l.gated_delta_net().is_some())
            .collect();
        assert_eq!(linear, [true, true, true, false, true, true, true, false]);
        let a = d.layers[3].attention_block().unwrap();
        assert!(a.output_gate);
        assert_eq!(a.rotary_dim, Some(64));
    }
}
