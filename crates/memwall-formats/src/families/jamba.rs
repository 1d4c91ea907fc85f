//! Jamba: `jamba` (`JambaForCausalLM`, transformers 5.23
//! `models/jamba/{configuration,modeling}_jamba.py`). A hybrid of Mamba-1 layers
//! (`JambaMambaDecoderLayer`: [`Mixer::Mamba1`] with RMSNorms on `dt`, `B` and `C`) and
//! attention layers (`JambaAttentionDecoderLayer`: GQA **without positional embeddings**), every
//! layer pre-norm with a feed-forward block that is a routed MoE (`JambaSparseMoeBlock`) every
//! `expert_layer_period` layers at `expert_layer_offset` and a dense SwiGLU (`JambaMLP`)
//! otherwise. Attention sits at `i % attn_layer_period == attn_layer_offset`
//! (`JambaConfig.layers_block_type`).
//!
//! `use_mamba_kernels` is read by nothing in transformers 5.23 (`JambaMambaMixer.__init__`
//! warns that `False` "is deprecated and has no effect"): without the CUDA kernels the mixer
//! runs its torch path, which is what memwall models (see `memory/hf/mamba1.rs`).

use super::ssm::no_attention;
use crate::error::FormatError;
use crate::raw::{HfConfig, RankOrAuto};
use crate::resolve::{
    activation, assemble, heads, limits::*, names, norm, token_embeddings, AttnOpts, Ctx,
    HeadDimDefault, Parts,
};
use memwall_core::mixer::{Mamba1, Mixer};
use memwall_core::model::{
    DenseMlp, Dropout, Head, LayerSpec, LinearRole, Mlp, ModelDesc, MoeMlp, NormKind, Residual,
    ScalarMuls,
};

/// `jamba`: `JambaConfig` defaults: vocab 65536, hidden 4096, intermediate 14336, 32 layers,
/// 32/8 heads, 16 experts top-2 every 2nd layer from 1, attention every 8th layer from 4, Mamba
/// state 16, conv 4, expand 2, `mamba_dt_rank` "auto" = `ceil(hidden / 16)`, conv bias, no
/// projection bias, untied head.
pub(crate) fn jamba(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let vocab = ctx.core(raw.vocab_size, "vocab_size", 65536, MAX_VOCAB)?;
    let hidden = ctx.core(raw.hidden_size, "hidden_size", 4096, MAX_HIDDEN)?;
    let layers = ctx.core(raw.num_hidden_layers, "num_hidden_layers", 32, MAX_LAYERS)?;
    let num_heads = ctx.core(
        raw.num_attention_heads,
        "num_attention_heads",
        32,
        MAX_HEADS,
    )?;
    let intermediate = ctx.size(
        raw.intermediate_size,
        "intermediate_size",
        14336,
        MAX_INTERMEDIATE,
    )?;
    let act_name = raw.hidden_act.as_deref().unwrap_or("silu");
    let act = activation(ctx, "hidden_act", act_name)?;
    // JambaConfig.validate_architecture: offsets smaller than their periods
    let attn_period = ctx.size(raw.attn_layer_period, "attn_layer_period", 8, MAX_LAYERS)?;
    let attn_offset = raw.attn_layer_offset.unwrap_or(4);
    let expert_period = ctx.size(
        raw.expert_layer_period,
        "expert_layer_period",
        2,
        MAX_LAYERS,
    )?;
    let expert_offset = raw.expert_layer_offset.unwrap_or(1);
    for (off, per, f) in [
        (
            attn_offset,
            attn_period,
            ["attn_layer_offset", "attn_layer_period"],
        ),
        (
            expert_offset,
            expert_period,
            ["expert_layer_offset", "expert_layer_period"],
        ),
    ] {
        if off >= per {
            return Err(ctx.inconsistent(
                &f,
                format!("offset {off} is not smaller than the period {per}"),
                "JambaConfig.validate_architecture requires offset < period",
            ));
        }
    }
    // JambaAttention: q/k/v/o_proj without bias, head_dim = hidden / heads, no RoPE
    let h = heads(
        ctx,
        hidden,
        num_heads,
        ("num_key_value_heads", raw.num_key_value_heads),
        None,
        HeadDimDefault::Derived,
    )?;
    let attention = AttnOpts {
        rotary_dim: None,
        ..AttnOpts::rope(h.head_dim)
    }
    .build(h, None);
    // JambaMambaMixer: MambaMixer's layout plus dt/B/C RMSNorms
    let expand = ctx.size(raw.mamba_expand, "mamba_expand", 2, 64)?;
    let time_step_rank = match &raw.mamba_dt_rank {
        None => hidden.div_ceil(16),
        Some(RankOrAuto::Word(w)) if w == "auto" => hidden.div_ceil(16),
        Some(RankOrAuto::Word(w)) => {
            return Err(FormatError::Unsupported {
                field: ctx.field("mamba_dt_rank"),
                value: format!("\"{w}\""),
                reason: "JambaConfig accepts a number or \"auto\"".into(),
                hint: "use \"auto\" (ceil(hidden_size / 16)) or the rank".into(),
            })
        }
        Some(RankOrAuto::Rank(r)) => ctx.check(*r, "mamba_dt_rank", MAX_HIDDEN)?,
    };
    let mixer = Mamba1 {
        intermediate: expand * hidden,
        state_size: ctx.size(raw.mamba_d_state, "mamba_d_state", 16, 1 << 12)?,
        time_step_rank,
        conv_kernel: ctx.size(raw.mamba_d_conv, "mamba_d_conv", 4, 1 << 12)?,
        proj_bias: raw.mamba_proj_bias.unwrap_or(false),
        conv_bias: raw.mamba_conv_bias.unwrap_or(true),
        // JambaMambaDecoderLayer: `residual + hidden_states` in the model dtype
        residual_in_fp32: false,
        bcdt_norms: true,
    };
    // JambaMLP: gate_proj, up_proj, down_proj (no bias), act(gate) · up
    let dense = DenseMlp {
        intermediate,
        gated: true,
        fused_gate_up: false,
        bias: false,
        act,
    };
    // JambaSparseMoeBlock: JambaTopKRouter (weight [E, H], softmax in fp32, top-k, weights
    // cast back to the hidden dtype, not renormalised) and JambaExperts (fused 3-D
    // gate_up_proj [E, 2·I, H], down_proj [E, H, I], the experts interface)
    let num_experts = ctx.size(raw.num_experts, "num_experts", 16, MAX_EXPERTS)?;
    let top_k = ctx.check(
        raw.num_experts_per_tok.unwrap_or(2),
        "num_experts_per_tok",
        MAX_EXPERTS,
    )?;
    if top_k > num_experts {
        return Err(ctx.inconsistent(
            &["num_experts_per_tok", "num_experts"],
            format!("each token picks {top_k} of only {num_experts} experts"),
            "num_experts_per_tok must not exceed the number of experts",
        ));
    }
    let moe = MoeMlp {
        num_experts,
        top_k,
        expert: DenseMlp {
            fused_gate_up: true,
            ..dense
        },
        router_bias: false,
        shared: None,
        shared_gate: false,
        router_extra_params: 0,
        router_fp32: false,
        router_topk_then_softmax: false,
        router_weights_in_compute_dtype: false,
        router_scores_fp32: false,
        shared_first: false,
        frozen_router_params: 0,
        all_experts: false,
        granite_router: false,
        hunyuan_router: false,
        norm_topk_prob: None,
    };
    let rms = norm(NormKind::RmsNorm, hidden);
    let mut specs = Vec::with_capacity(usize::try_from(layers).unwrap_or(0));
    for i in 0..layers {
        let (attn, mix) = if i % attn_period == attn_offset {
            (attention, Mixer::Attention)
        } else {
            (no_attention(), Mixer::Mamba1(mixer))
        };
        // layers_num_experts: `num_experts` at the expert layers, 1 (a dense JambaMLP) elsewhere
        let mlp = if num_experts > 1 && i % expert_period == expert_offset {
            Mlp::Moe(moe)
        } else {
            Mlp::Dense(dense)
        };
        specs.push(LayerSpec {
            attn_norm: Some(rms),
            attn_post_norm: None,
            mlp_norm: Some(rms),
            mlp_post_norm: None,
            residual: Residual::Sequential,
            attention: attn,
            mlp,
            attn_output_outlives_mlp: false,
            mlp_input_rebound: false,
            mixer: mix,
            residual_scaled: false,
            parallel_residual_first: false,
            muls: ScalarMuls::NONE,
        });
    }
    assemble(
        ctx,
        "jamba",
        Parts {
            hidden_size: hidden,
            max_position_embeddings: ctx.size(
                raw.max_position_embeddings,
                "max_position_embeddings",
                262144,
                MAX_POSITIONS,
            )?,
            embeddings: token_embeddings(vocab, hidden, false),
            layers: specs,
            head: Head {
                final_norm: Some(rms),
                tied: raw.tie_word_embeddings.unwrap_or(false),
                bias: false,
                logit_softcap: None,
                logits_fp32: false,
                logits_scaled: false,
            },
            dropout: Dropout {
                attention: ctx.prob(raw.attention_dropout, "attention_dropout", 0.0)?,
                ..Dropout::default()
            },
            // experts and the router are parameters, not nn.Linear; peft's Mamba check does not
            // cover `jamba`, so `in_proj` and `out_proj` are both targets
            linear_names: names(&[
                (LinearRole::Q, "q_proj"),
                (LinearRole::K, "k_proj"),
                (LinearRole::V, "v_proj"),
                (LinearRole::O, "o_proj"),
                (LinearRole::Gate, "gate_proj"),
                (LinearRole::Up, "up_proj"),
                (LinearRole::Down, "down_proj"),
                (LinearRole::SsmIn, "in_proj"),
                (LinearRole::SsmOut, "out_proj"),
            ]),
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;

    /// ai21labs/AI21-Jamba-1.5-Mini's published hyper-parameters.
    const JAMBA_MINI: &str = r#"{"model_type":"jamba","hidden_size":4096,"num_hidden_layers":32,
        "intermediate_size":14336,"num_attention_heads":32,"num_key_value_heads":8,
        "attn_layer_offset":4,"attn_layer_period":8,"expert_layer_offset":1,
        "expert_layer_period":2,"mamba_d_conv":4,"mamba_d_state":16,"mamba_dt_rank":256,
        "mamba_expand":2,"num_experts":16,"num_experts_per_tok":2,"vocab_size":65536}"#;

    #[test]
    fn jamba_mini_layout() {
        let d = parse_hf_config(JAMBA_MINI).unwrap();
        let attn: Vec<usize> = (0..32)
            .filter(|&i| d.layers[i].attention_block().is_some())
            .collect();
        assert_eq!(attn, vec![4, 12, 20, 28]);
        use memwall_core::model::Mlp;
        assert!(matches!(d.layers[1].mlp, Mlp::Moe(_)));
        assert!(matches!(d.layers[0].mlp, Mlp::Dense(_)));
        // transformers 5.23 JambaForCausalLM: 51,570,323,328 parameters
        assert_eq!(d.param_counts().unwrap().total, 51_570_323_328);
    }

    #[test]
    fn offsets_past_their_period_are_refused() {
        let bad = JAMBA_MINI.replace(r#""attn_layer_offset":4"#, r#""attn_layer_offset":8"#);
        let e = parse_hf_config(&bad).unwrap_err();
        assert!(e.to_string().contains("attn_layer_offset"), "{e}");
    }
}
