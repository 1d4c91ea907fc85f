//! deepseek_v3: multi-head latent attention, dense first layers, routed + shared experts.
//! Rules cite `transformers/models/deepseek_v3/{configuration,modeling}_deepseek_v3.py` (5.23).

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{gated, limits::*, names, Ctx, HeadDimDefault};
use memwall_core::model::{AttentionKind, DenseMlp, LinearRole, Mlp, ModelDesc, MoeMlp};

/// `configuration_deepseek_v3.py` DeepseekV3Config field defaults (sizes of DeepSeek-V3).
const DEEPSEEK_V3: Defaults = Defaults {
    vocab_size: 129280,
    hidden_size: 7168,
    intermediate_size: 18432,
    num_hidden_layers: 61,
    num_attention_heads: 128,
    num_key_value_heads: None,
    // MLA has no single head_dim; Dims only needs a placeholder that never divides hidden.
    head_dim: HeadDimDefault::Fixed(1),
    act: "silu",
    max_position_embeddings: 4096,
    tie_word_embeddings: false,
    strict_divisible: false,
};

pub(crate) fn deepseek_v3(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    // `num_key_value_heads` and `head_dim` do not shape MLA's weights (DeepseekV3Config sets
    // head_dim = qk_rope_head_dim); drop them so they are neither validated nor used.
    let mla_raw = HfConfig {
        num_key_value_heads: None,
        head_dim: None,
        ..raw.clone()
    };
    let d = Dims::llama(&mla_raw, ctx, &DEEPSEEK_V3)?;
    let q_lora_rank = match raw.q_lora_rank {
        None => Some(1536),
        Some(None) => None,
        Some(Some(r)) => Some(r),
    }
    .map(|r| ctx.check(r, "q_lora_rank", MAX_LORA_RANK))
    .transpose()?;
    let kv_lora_rank = ctx.size(raw.kv_lora_rank, "kv_lora_rank", 512, MAX_LORA_RANK)?;
    let qk_nope_head_dim = ctx.size(raw.qk_nope_head_dim, "qk_nope_head_dim", 128, MAX_HEAD_DIM)?;
    let qk_rope_head_dim = ctx.size(raw.qk_rope_head_dim, "qk_rope_head_dim", 64, MAX_HEAD_DIM)?;
    let v_head_dim = ctx.size(raw.v_head_dim, "v_head_dim", 128, MAX_HEAD_DIM)?;
    // modeling_deepseek_v3.py DeepseekV3Attention: q_proj (bias=False) or q_a_proj
    // (bias=attention_bias) + q_a_layernorm + q_b_proj (bias=False); kv_a_proj_with_mqa
    // (bias=attention_bias) + kv_a_layernorm + kv_b_proj (bias=False); o_proj
    // (bias=attention_bias). Rotary on qk_rope_head_dim only.
    let bias = raw.attention_bias.unwrap_or(false);
    let mut dec = Decoder::new(&d, Vec::new());
    dec.attn.qkv_bias = bias;
    dec.attn.o_bias = bias;
    dec.attn.rotary_dim = Some(qk_rope_head_dim);
    let mla = AttentionKind::Mla {
        num_heads: d.heads.num_heads,
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim,
    };

    // modeling_deepseek_v3.py DeepseekV3DecoderLayer: DeepseekV3MoE if layer_idx >=
    // first_k_dense_replace (default 3) else DeepseekV3MLP(intermediate_size).
    let first_dense = raw.first_k_dense_replace.unwrap_or(3);
    let moe = if first_dense < d.layers {
        Some(moe_block(raw, ctx, &d)?)
    } else {
        None
    };

    let mut linear = match q_lora_rank {
        Some(_) => names(&[(LinearRole::QA, "q_a_proj"), (LinearRole::QB, "q_b_proj")]),
        None => names(&[(LinearRole::Q, "q_proj")]),
    };
    linear.extend(names(&[
        (LinearRole::KvA, "kv_a_proj_with_mqa"),
        (LinearRole::KvB, "kv_b_proj"),
        (LinearRole::O, "o_proj"),
        // dense layers and shared_experts are DeepseekV3MLP (nn.Linear gate/up/down_proj), but
        // peft 0.21.2 maps those target names onto the routed experts' fused 3-D parameters
        // (transformers 5.23 converts deepseek_v3 like qwen2_moe; memory::check_lora_targets):
        // not targets by name.
    ]));
    dec.names = linear;
    let mut desc = dec.build(ctx, "deepseek_v3", &d, |i| {
        Ok(match moe {
            Some(m) if i as u64 >= first_dense => Mlp::Moe(m),
            _ => Mlp::Dense(gated(d.intermediate, d.act)),
        })
    })?;
    for l in &mut desc.layers {
        l.attention.kind = mla;
    }
    // Re-check: MLA sizes changed the parameter count after `build`'s overflow check.
    if desc.param_counts().is_err() {
        return Err(FormatError::OutOfRange {
            field: ctx.field("(all sizes)"),
            value: format!("{} layers", desc.layers.len()),
            reason: "the parameter count does not fit in 64 bits".into(),
            hint: "check the sizes; no real model is this large".into(),
        });
    }
    Ok(desc)
}

fn moe_block(raw: &HfConfig, ctx: &Ctx, d: &Dims) -> Result<MoeMlp, FormatError> {
    // configuration_deepseek_v3.py: n_routed_experts=256 (attribute_map
    // num_local_experts→n_routed_experts), num_experts_per_tok=8, moe_intermediate_size=2048,
    // n_shared_experts=1, n_group=8, topk_group=4.
    let (field, experts) = match (raw.n_routed_experts, raw.num_local_experts) {
        (None, Some(n)) => ("num_local_experts", Some(n)),
        (v, _) => ("n_routed_experts", v),
    };
    let num_experts = ctx.size(experts, field, 256, MAX_EXPERTS)?;
    let top_k = ctx.size(
        raw.num_experts_per_tok,
        "num_experts_per_tok",
        8,
        MAX_EXPERTS,
    )?;
    if top_k > num_experts {
        return Err(ctx.inconsistent(
            &["num_experts_per_tok", field],
            format!("each token picks {top_k} of only {num_experts} experts"),
            "num_experts_per_tok must not exceed the number of routed experts",
        ));
    }
    // modeling_deepseek_v3.py DeepseekV3TopkRouter.get_topk_indices: scores are viewed as
    // [n_group, E // n_group] and topk_group groups are kept.
    let n_group = ctx.size(raw.n_group, "n_group", 8, MAX_EXPERTS)?;
    let topk_group = ctx.size(raw.topk_group, "topk_group", 4, MAX_EXPERTS)?;
    if num_experts % n_group != 0 || topk_group > n_group {
        return Err(ctx.inconsistent(
            &["n_group", "topk_group", field],
            format!("{num_experts} experts in {n_group} groups, keeping {topk_group} groups"),
            "n_group must divide the routed experts and topk_group must not exceed n_group",
        ));
    }
    // The same router scores each group by the sum of its two best experts
    // (`scores_for_choice.view(-1, n_group, E // n_group).topk(2, dim=-1)`): with fewer than
    // two experts per group transformers 5.23 fails in the forward ("k not in range for
    // dimension"), so there is no step to estimate.
    if num_experts / n_group < 2 {
        return Err(ctx.inconsistent(
            &["n_group", field],
            format!(
                "{num_experts} experts in {n_group} groups: {} per group",
                num_experts / n_group
            ),
            "DeepseekV3TopkRouter scores each group by its top-2 experts: every group needs at least two experts (n_group ≤ routed experts / 2)",
        ));
    }
    let moe_i = ctx.size(
        raw.moe_intermediate_size,
        "moe_intermediate_size",
        2048,
        MAX_INTERMEDIATE,
    )?;
    let n_shared = raw.n_shared_experts.unwrap_or(1);
    let shared_i = moe_i
        .checked_mul(n_shared)
        .filter(|&w| w <= MAX_INTERMEDIATE)
        .ok_or_else(|| {
            ctx.inconsistent(
                &["moe_intermediate_size", "n_shared_experts"],
                format!("shared expert width {moe_i} × {n_shared} exceeds {MAX_INTERMEDIATE}"),
                "no real model has a shared expert this wide",
            )
        })?;
    Ok(MoeMlp {
        num_experts,
        top_k,
        // DeepseekV3Experts: fused gate_up_proj [E, 2·I, H] and down_proj [E, H, I], no bias.
        expert: DenseMlp {
            fused_gate_up: true,
            ..gated(moe_i, d.act)
        },
        // DeepseekV3TopkRouter: weight [E, H] is a parameter; e_score_correction_bias is an
        // nn.Buffer, so it is not counted among parameters.
        router_bias: false,
        // DeepseekV3MoE: shared_experts = DeepseekV3MLP(moe_intermediate_size × n_shared_experts).
        shared: (shared_i > 0).then(|| gated(shared_i, d.act)),
        shared_gate: false,
        router_extra_params: 0,
        // modeling_deepseek_v3.py DeepseekV3TopkRouter: fp32 linear + sigmoid, fp32 weights
        router_fp32: true,
        router_topk_then_softmax: false,
        router_weights_in_compute_dtype: false,
        router_scores_fp32: false,
        shared_first: false,
        frozen_router_params: 0,
        all_experts: false,
        granite_router: false,
        hunyuan_router: false,
        // configuration_deepseek_v3.py: norm_topk_prob=True; DeepseekV3TopkRouter divides the
        // top-k weights by their sum when set
        norm_topk_prob: Some(raw.norm_topk_prob.unwrap_or(true)),
    })
}
