//! `granitemoehybrid` (`GraniteMoeHybridForCausalLM`, IBM Granite 4.0-H; transformers 5.23
//! `models/granitemoehybrid/{configuration,modeling}_granitemoehybrid.py`): Mamba-2 layers
//! and a few attention layers (`layer_types`), each followed by a shared MLP, with muP
//! multipliers on the embeddings, every residual branch and the logits.
//!
//! `GraniteMoeHybridMambaLayer.forward` is `Mamba2Mixer.forward` line for line (same
//! `mamba2_chunk_scan`), so its layers reuse [`Mixer::Mamba2`]. With routed experts
//! (`num_local_experts > 0`, `GraniteMoeHybridMoE`: Granite MoE's top-k router and grouped-mm
//! experts, Granite 4.0-H tiny/small) the layer's feed-forward is `block_sparse_moe(x) +
//! shared_mlp(x)`, the Granite MoE Shared block.

use super::ssm::no_attention;
use crate::error::FormatError;
use crate::raw::{HfConfig, RankOrAuto};
use crate::resolve::{
    activation, assemble, heads, limits::*, names, norm, token_embeddings, AttnOpts, Ctx,
    HeadDimDefault, Parts,
};
use memwall_core::mixer::{Mamba2, Mixer};
use memwall_core::model::{
    DenseMlp, Dropout, Head, LayerSpec, LinearRole, Mlp, ModelDesc, MoeMlp, NormKind, Residual,
    ScalarMuls,
};

/// `granitemoehybrid`. Defaults from `GraniteMoeHybridConfig`: vocab 32000, hidden 4096, 32
/// layers, 32 heads, `shared_intermediate_size` 1024, `mamba_n_heads` 128, `mamba_d_state` 256,
/// `mamba_n_groups` 1, `mamba_d_conv` 4, `mamba_expand` 2, chunk 256, conv bias, no projection
/// bias, multipliers 1, no position embedding type (no RoPE), untied head, 8 routed experts.
pub(crate) fn granitemoehybrid(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let vocab = ctx.core(raw.vocab_size, "vocab_size", 32000, MAX_VOCAB)?;
    let hidden = ctx.core(raw.hidden_size, "hidden_size", 4096, MAX_HIDDEN)?;
    let layers = ctx.core(raw.num_hidden_layers, "num_hidden_layers", 32, MAX_LAYERS)?;
    let num_heads = ctx.core(
        raw.num_attention_heads,
        "num_attention_heads",
        32,
        MAX_HEADS,
    )?;
    let experts = raw.num_local_experts.unwrap_or(8);
    let act_name = raw.hidden_act.as_deref().unwrap_or("silu");
    let act = activation(ctx, "hidden_act", act_name)?;
    // attention: q/k/v/o_proj with `attention_bias`; RoPE only with
    // `position_embedding_type == "rope"` (GraniteMoeHybridModel.__init__)
    let h = heads(
        ctx,
        hidden,
        num_heads,
        ("num_key_value_heads", raw.num_key_value_heads),
        None,
        HeadDimDefault::Derived,
    )?;
    let rope = raw.position_embedding_type.as_deref() == Some("rope");
    let bias = raw.attention_bias.unwrap_or(false);
    let attention = AttnOpts {
        qkv_bias: bias,
        o_bias: bias,
        rotary_dim: rope.then_some(h.head_dim),
        ..AttnOpts::rope(h.head_dim)
    }
    .build(h, None);
    // Mamba-2 mixer (GraniteMoeHybridMambaLayer): `mamba_d_head` defaults to
    // `mamba_expand · hidden / mamba_n_heads`; `validate_architecture` requires
    // `mamba_d_head · mamba_n_heads == mamba_expand · hidden`
    let m_heads = ctx.size(raw.mamba_n_heads, "mamba_n_heads", 128, MAX_HEADS)?;
    let expand = ctx.size(raw.mamba_expand, "mamba_expand", 2, 64)?;
    let intermediate = expand * hidden;
    let d_head = match &raw.mamba_d_head {
        Some(RankOrAuto::Rank(d)) => ctx.check(*d, "mamba_d_head", MAX_HEAD_DIM)?,
        Some(RankOrAuto::Word(w)) => {
            return Err(FormatError::Unsupported {
                field: ctx.field("mamba_d_head"),
                value: format!("\"{}\"", memwall_core::error::untrusted(w)),
                reason: "GraniteMoeHybridConfig takes an integer mamba_d_head".into(),
                hint: "give the head width as a number, or leave it out (mamba_expand · hidden_size / mamba_n_heads)".into(),
            })
        }
        None => intermediate / m_heads,
    };
    if d_head * m_heads != intermediate {
        return Err(ctx.inconsistent(
            &["mamba_d_head", "mamba_n_heads", "mamba_expand", "hidden_size"],
            format!(
                "{m_heads} heads × {d_head} ≠ mamba_expand × hidden_size = {intermediate}"
            ),
            "GraniteMoeHybridConfig.validate_architecture requires mamba_d_head * mamba_n_heads == mamba_expand * hidden_size",
        ));
    }
    let n_groups = ctx.size(raw.mamba_n_groups, "mamba_n_groups", 1, MAX_HEADS)?;
    if m_heads % n_groups != 0 {
        return Err(ctx.inconsistent(
            &["mamba_n_heads", "mamba_n_groups"],
            format!("{n_groups} groups do not divide {m_heads} heads"),
            "each group's B and C are shared by mamba_n_heads / mamba_n_groups heads",
        ));
    }
    let mixer = Mamba2 {
        num_heads: m_heads,
        head_dim: d_head,
        n_groups,
        state_size: ctx.size(raw.mamba_d_state, "mamba_d_state", 256, 1 << 12)?,
        conv_kernel: ctx.size(raw.mamba_d_conv, "mamba_d_conv", 4, 1 << 12)?,
        intermediate,
        chunk_size: ctx.size(raw.mamba_chunk_size, "mamba_chunk_size", 256, MAX_POSITIONS)?,
        proj_bias: raw.mamba_proj_bias.unwrap_or(false),
        out_bias: raw.mamba_proj_bias.unwrap_or(false),
        gated_norm: true,
        norm_before_gate: false,
        conv_bias: raw.mamba_conv_bias.unwrap_or(true),
        // GraniteMoeHybridDecoderLayer keeps the residual in the model dtype
        residual_in_fp32: false,
        // GraniteMoeHybridModel builds a DynamicCache when `use_cache` (the config's) is on, in
        // training too
        state_in_training_cache: true,
    };
    // GraniteMoeHybridMLP (the shared MLP): `input_linear` (hidden → 2·I, no bias), chunk,
    // act(first) · second, `output_linear`; the Phi-3 fused gate/up layout
    let shared = DenseMlp {
        intermediate: ctx.size(
            raw.shared_intermediate_size,
            "shared_intermediate_size",
            1024,
            MAX_INTERMEDIATE,
        )?,
        gated: true,
        fused_gate_up: true,
        bias: false,
        act,
    };
    // GraniteMoeHybridDecoderLayer: `block_sparse_moe = GraniteMoeHybridMoE(config) if
    // config.num_local_experts > 0`; then `moe_hidden_states + self.shared_mlp(hidden_states)`.
    // GraniteMoeHybridTopKRouter is GraniteMoeTopKRouter; GraniteMoeHybridExperts:
    // gate_up_proj [E, 2·I, H], down_proj [E, H, I] with I = intermediate_size (default 11008),
    // num_experts_per_tok default 2
    let mlp = if experts > 0 {
        let intermediate = ctx.size(
            raw.intermediate_size,
            "intermediate_size",
            11008,
            MAX_INTERMEDIATE,
        )?;
        let top_k = ctx.check(
            raw.num_experts_per_tok.unwrap_or(2),
            "num_experts_per_tok",
            MAX_EXPERTS,
        )?;
        let num_experts = ctx.check(experts, "num_local_experts", MAX_EXPERTS)?;
        if top_k > num_experts {
            return Err(ctx.inconsistent(
                &["num_experts_per_tok", "num_local_experts"],
                format!("each token picks {top_k} of only {num_experts} experts"),
                "num_experts_per_tok must not exceed the number of routed experts",
            ));
        }
        Mlp::Moe(MoeMlp {
            num_experts,
            top_k,
            expert: DenseMlp {
                intermediate,
                ..shared
            },
            router_bias: false,
            shared: Some(shared),
            shared_gate: false,
            router_extra_params: 0,
            router_fp32: false,
            router_topk_then_softmax: false,
            router_weights_in_compute_dtype: false,
            router_scores_fp32: false,
            shared_first: false,
            frozen_router_params: 0,
            all_experts: false,
            granite_router: true,
            hunyuan_router: false,
            norm_topk_prob: None,
        })
    } else {
        Mlp::Dense(shared)
    };
    let rms = norm(NormKind::RmsNorm, hidden);
    // the multipliers are applied whatever their value (`inputs_embeds * embedding_multiplier`,
    // `residual + hidden_states * residual_multiplier`, `logits / logits_scaling`): each is a
    // new tensor even at 1.0
    let residual_scaled = true;
    let types: Vec<String> = match &raw.layer_types {
        // GraniteMoeHybridConfig: no layer_types = every layer Mamba
        None => vec!["mamba".into(); usize::try_from(layers).unwrap_or(0)],
        Some(t) => t.clone(),
    };
    if types.len() as u64 != layers {
        return Err(ctx.inconsistent(
            &["layer_types", "num_hidden_layers"],
            format!("{} layer types for {layers} layers", types.len()),
            "`layer_types` names the mixer of every layer, one entry per layer",
        ));
    }
    let mut specs = Vec::with_capacity(types.len());
    for t in &types {
        let (attention, mixer) = match t.as_str() {
            "mamba" | "linear_attention" => (no_attention(), Mixer::Mamba2(mixer)),
            "attention" | "full_attention" => (attention, Mixer::Attention),
            other => {
                return Err(FormatError::Unsupported {
                    field: ctx.field("layer_types"),
                    value: format!("\"{other}\""),
                    reason: "granitemoehybrid layers are \"mamba\" or \"attention\"".into(),
                    hint: "use \"mamba\" or \"attention\"".into(),
                })
            }
        };
        specs.push(LayerSpec {
            attn_norm: Some(rms),
            attn_post_norm: None,
            mlp_norm: Some(rms),
            mlp_post_norm: None,
            residual: Residual::Sequential,
            attention,
            mlp,
            attn_output_outlives_mlp: false,
            mlp_input_rebound: false,
            mixer,
            residual_scaled,
            parallel_residual_first: false,
            muls: ScalarMuls::NONE,
        });
    }
    let embeddings = token_embeddings(vocab, hidden, true);
    let mut desc = assemble(
        ctx,
        "granitemoehybrid",
        Parts {
            hidden_size: hidden,
            max_position_embeddings: ctx.size(
                raw.max_position_embeddings,
                "max_position_embeddings",
                2048,
                MAX_POSITIONS,
            )?,
            embeddings,
            layers: specs,
            head: Head {
                final_norm: Some(rms),
                tied: raw.tie_word_embeddings.unwrap_or(false),
                bias: false,
                logit_softcap: None,
                logits_fp32: false,
                logits_scaled: true,
            },
            dropout: Dropout {
                attention: ctx.prob(raw.attention_dropout, "attention_dropout", 0.0)?,
                ..Dropout::default()
            },
            linear_names: names(&[
                (LinearRole::Q, "q_proj"),
                (LinearRole::K, "k_proj"),
                (LinearRole::V, "v_proj"),
                (LinearRole::O, "o_proj"),
                (LinearRole::GateUp, "input_linear"),
                (LinearRole::Down, "output_linear"),
                (LinearRole::SsmIn, "in_proj"),
                (LinearRole::SsmOut, "out_proj"),
            ]),
        },
    )?;
    // GraniteMoeHybridModel.forward calls each decoder layer without `position_ids` (the
    // attention layers get `position_embeddings` only), so no checkpoint keeps them
    desc.layers_without_position_ids = true;
    Ok(desc)
}

#[cfg(test)]
mod tests {
    use crate::parse_hf_config;

    #[test]
    fn granite_hybrid_layers_are_called_without_position_ids() {
        // GraniteMoeHybridModel.forward passes no `position_ids` to its layers (a checkpoint
        // keeps none); Llama's does
        let d =
            parse_hf_config(include_str!("../../tests/configs/granite-4.0-h-micro.json")).unwrap();
        assert!(d.layers_without_position_ids);
        let llama = parse_hf_config(
            r#"{"model_type":"llama","hidden_size":64,"intermediate_size":128,
                "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100}"#,
        )
        .unwrap();
        assert!(!llama.layers_without_position_ids);
    }
}
