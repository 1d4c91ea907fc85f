//! Llama-derived families: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe,
//! olmo2, phi3, starcoder2. They share one layer skeleton (pre-norm or post-norm residual
//! around `self_attn` and `mlp`) and differ in a few flags, which each normaliser states with
//! the transformers 5.23 source it comes from (paths relative to `transformers/models/`).

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{
    gated, limits::*, llama_names, names, plain, sliding_layers, window, AttnOpts, Ctx,
    HeadDimDefault, NormPlacement,
};
use memwall_core::model::{
    DenseMlp, Dropout, LinearRole, Mlp, ModelDesc, MoeMlp, NormKind, QkNormScope,
};

/// `llama/configuration_llama.py` `LlamaConfig` field defaults.
const LLAMA: Defaults = Defaults {
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
    // LlamaConfig.validate_architecture: hidden_size % num_attention_heads == 0, always.
    strict_divisible: true,
};

pub(crate) fn llama(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &LLAMA)?;
    // modeling_llama.py LlamaAttention: q/k/v/o_proj bias=config.attention_bias (default False).
    let bias = raw.attention_bias.unwrap_or(false);
    // modeling_llama.py LlamaMLP: gate/up/down_proj bias=config.mlp_bias (default False).
    let mlp_bias = raw.mlp_bias.unwrap_or(false);
    let mlp = DenseMlp {
        bias: mlp_bias,
        ..gated(d.intermediate, d.act)
    };
    Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "llama", &d, |_| Ok(Mlp::Dense(mlp)))
}

/// `mistral/configuration_mistral.py` `MistralConfig` field defaults.
const MISTRAL: Defaults = Defaults {
    intermediate_size: 14336,
    num_key_value_heads: Some(8),
    max_position_embeddings: 4096 * 32,
    strict_divisible: false,
    ..LLAMA
};

pub(crate) fn mistral(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &MISTRAL)?;
    // configuration_mistral.py: sliding_window defaults to 4096; modeling_mistral.py passes
    // `sliding_window=getattr(self.config, "sliding_window", None)` to every layer.
    let w = window(ctx, raw.sliding_window.or(Some(4096)))?;
    // modeling_mistral.py MistralAttention/MistralMLP: every linear bias=False.
    Decoder {
        windows: vec![w; d.num_layers()],
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "mistral", &d, |_| {
        Ok(Mlp::Dense(gated(d.intermediate, d.act)))
    })
}

pub(crate) fn mixtral(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    // configuration_mixtral.py: same size defaults as Mistral, rms eps aside.
    let d = Dims::llama(raw, ctx, &MISTRAL)?;
    // configuration_mixtral.py: sliding_window defaults to None; modeling_mixtral.py passes
    // `getattr(self.config, "sliding_window", None)` to every layer.
    let w = window(ctx, raw.sliding_window)?;
    // configuration_mixtral.py: num_local_experts=8 (attribute_map num_experts→num_local_experts),
    // num_experts_per_tok=2. modeling_mixtral.py MixtralExperts: fused 3-D gate_up_proj
    // [E, 2·I, H] and down_proj [E, H, I] parameters with I = intermediate_size, no biases;
    // MixtralTopKRouter: weight [E, H], no bias.
    let experts = raw.num_local_experts.or(raw.num_experts);
    let field = if raw.num_local_experts.is_some() || raw.num_experts.is_none() {
        "num_local_experts"
    } else {
        "num_experts"
    };
    let mut moe = moe(
        ctx,
        (field, experts, 8),
        raw.num_experts_per_tok.unwrap_or(2),
        d.intermediate,
        &d,
    )?;
    // MixtralTopKRouter returns its fp32 top-k weights as they are (no cast back to the
    // logits' dtype), so the weighted expert outputs are fp32 in a 16-bit model.
    moe.router_scores_fp32 = true;
    Decoder {
        windows: vec![w; d.num_layers()],
        // Experts are nn.Parameters, not nn.Linear: only attention is a LoRA target by name.
        ..Decoder::new(&d, llama_names(false))
    }
    .build(ctx, "mixtral", &d, |_| Ok(Mlp::Moe(moe)))
}

/// A routed MoE block without shared experts; `experts` = (field, value, class default).
pub(crate) fn moe(
    ctx: &Ctx,
    (field, experts, default): (&str, Option<u64>, u64),
    top_k: u64,
    intermediate: u64,
    d: &Dims,
) -> Result<MoeMlp, FormatError> {
    let num_experts = ctx.size(experts, field, default, MAX_EXPERTS)?;
    let top_k = ctx.check(top_k, "num_experts_per_tok", MAX_EXPERTS)?;
    if top_k > num_experts {
        return Err(ctx.inconsistent(
            &["num_experts_per_tok", field],
            format!("each token picks {top_k} of only {num_experts} experts"),
            "num_experts_per_tok must not exceed the number of routed experts",
        ));
    }
    Ok(MoeMlp {
        num_experts,
        top_k,
        expert: DenseMlp {
            fused_gate_up: true,
            ..gated(intermediate, d.act)
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
    })
}

/// `qwen2/configuration_qwen2.py` `Qwen2Config` field defaults.
const QWEN2: Defaults = Defaults {
    vocab_size: 151936,
    intermediate_size: 22016,
    num_key_value_heads: Some(32),
    max_position_embeddings: 32768,
    strict_divisible: false,
    ..LLAMA
};

/// Qwen2/Qwen3 sliding windows (`configuration_qwen2.py`/`configuration_qwen3.py`
/// `__post_init__`): the window exists only with `use_sliding_window` (default False,
/// `sliding_window` default 4096); default `layer_types` make layers `i >= max_window_layers`
/// (default 28) sliding; `modeling_qwen2.py` Qwen2Attention: `config.sliding_window if
/// layer_type == "sliding_attention" else None`.
fn qwen_windows(raw: &HfConfig, ctx: &Ctx, d: &Dims) -> Result<Vec<Option<u64>>, FormatError> {
    let w = if raw.use_sliding_window.unwrap_or(false) {
        window(ctx, raw.sliding_window.or(Some(4096)))?
    } else {
        None
    };
    let max_window_layers = raw.max_window_layers.unwrap_or(28);
    let sliding = sliding_layers(ctx, raw, d.layers, |i| {
        w.is_some() && i >= max_window_layers
    })?;
    Ok(sliding
        .into_iter()
        .map(|s| if s { w } else { None })
        .collect())
}

pub(crate) fn qwen2(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &QWEN2)?;
    // modeling_qwen2.py Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False (fixed).
    Decoder {
        attn: AttnOpts {
            qkv_bias: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        windows: qwen_windows(raw, ctx, &d)?,
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "qwen2", &d, |_| {
        Ok(Mlp::Dense(gated(d.intermediate, d.act)))
    })
    .map(second_mask_if_sliding)
}

/// Qwen 2 / Qwen 3 / SmolLM 3 build the full-attention mask always and the sliding-window one
/// `if self.has_sliding_layers` (`"sliding_attention" in config.layer_types`):
/// modeling_qwen2.py Qwen2Model.forward lines 369-374, modeling_qwen3.py Qwen3Model.forward
/// lines 394-399, modeling_smollm3.py SmolLM3Model.forward lines 398-403 (transformers 5.23).
/// With a sliding layer both masks exist, each layer reading its type's, whatever the window.
pub(crate) fn second_mask_if_sliding(mut desc: ModelDesc) -> ModelDesc {
    desc.builds_both_masks = desc
        .layers
        .iter()
        .any(|l| l.attention.sliding_window.is_some());
    desc
}

/// `qwen2_moe/configuration_qwen2_moe.py` `Qwen2MoeConfig` field defaults.
const QWEN2_MOE: Defaults = Defaults {
    hidden_size: 2048,
    intermediate_size: 5632,
    num_hidden_layers: 24,
    num_attention_heads: 16,
    num_key_value_heads: Some(16),
    ..QWEN2
};

/// Which layers are sparse, from `modeling_qwen2_moe.py`/`modeling_qwen3_moe.py`
/// DecoderLayer: `layer_idx not in mlp_only_layers and num_experts > 0 and
/// (layer_idx + 1) % decoder_sparse_step == 0` (defaults: `[]`, 1).
pub(crate) fn sparse_layers(
    raw: &HfConfig,
    ctx: &Ctx,
    d: &Dims,
    num_experts: u64,
) -> Result<Vec<bool>, FormatError> {
    let step = raw.decoder_sparse_step.unwrap_or(1);
    if step == 0 {
        return Err(FormatError::OutOfRange {
            field: ctx.field("decoder_sparse_step"),
            value: "0".into(),
            reason: "must be at least 1 (every step-th layer is sparse)".into(),
            hint: "use 1 to make every layer a mixture of experts".into(),
        });
    }
    let only = raw.mlp_only_layers.clone().unwrap_or_default();
    if let Some(bad) = only.iter().find(|&&i| i >= d.layers) {
        return Err(ctx.inconsistent(
            &["mlp_only_layers", "num_hidden_layers"],
            format!(
                "layer index {bad} does not exist in a {}-layer model",
                d.layers
            ),
            "mlp_only_layers lists 0-based indices of layers that keep a dense MLP",
        ));
    }
    Ok((0..d.layers)
        .map(|i| !only.contains(&i) && num_experts > 0 && (i + 1) % step == 0)
        .collect())
}

/// `num_experts` for the Qwen MoE families: 0 is allowed (every layer dense).
pub(crate) fn qwen_num_experts(
    raw: &HfConfig,
    ctx: &Ctx,
    v: Option<u64>,
    default: u64,
) -> Result<u64, FormatError> {
    let _ = raw;
    let n = v.unwrap_or(default);
    if n > MAX_EXPERTS {
        return Err(FormatError::OutOfRange {
            field: ctx.field("num_experts"),
            value: n.to_string(),
            reason: format!("must be between 0 and {MAX_EXPERTS}"),
            hint: "no real model has this many experts".into(),
        });
    }
    Ok(n)
}

/// `Qwen2MoeSparseMoeBlock`'s config defaults of one family: experts, experts per token,
/// `moe_intermediate_size`, `shared_expert_intermediate_size`.
pub(crate) struct QwenMoeDefaults {
    pub experts: u64,
    pub top_k: u64,
    pub moe_intermediate: u64,
    pub shared_intermediate: u64,
    /// The config's `norm_topk_prob` default (qwen2_moe False, qwen3_next True).
    pub norm_topk_prob: bool,
}

/// Which layers are sparse and the sparse block they share: modeling_qwen2_moe.py
/// Qwen2MoeSparseMoeBlock (router, experts, then shared_expert = Qwen2MoeMLP(intermediate_size=
/// shared_expert_intermediate_size) (gate/up/down, no bias) weighted by
/// `sigmoid(shared_expert_gate(x))`, shared_expert_gate = Linear(hidden, 1, bias=False); a
/// shared width of 0 has no parameters). Qwen3-Next's block is the same line for line.
pub(crate) fn qwen_moe_block(
    raw: &HfConfig,
    ctx: &Ctx,
    d: &Dims,
    defaults: &QwenMoeDefaults,
) -> Result<(Vec<bool>, Option<MoeMlp>), FormatError> {
    let num_experts = qwen_num_experts(raw, ctx, raw.num_experts, defaults.experts)?;
    let sparse = sparse_layers(raw, ctx, d, num_experts)?;
    if !sparse.contains(&true) {
        return Ok((sparse, None));
    }
    let moe_i = ctx.size(
        raw.moe_intermediate_size,
        "moe_intermediate_size",
        defaults.moe_intermediate,
        MAX_INTERMEDIATE,
    )?;
    let shared_i = raw
        .shared_expert_intermediate_size
        .unwrap_or(defaults.shared_intermediate);
    if shared_i > MAX_INTERMEDIATE {
        return Err(ctx.inconsistent(
            &["shared_expert_intermediate_size"],
            format!("{shared_i} exceeds {MAX_INTERMEDIATE}"),
            "no real model has a shared expert this wide",
        ));
    }
    let mut m = moe(
        ctx,
        ("num_experts", Some(num_experts), defaults.experts),
        raw.num_experts_per_tok.unwrap_or(defaults.top_k),
        moe_i,
        d,
    )?;
    m.shared = (shared_i > 0).then(|| gated(shared_i, d.act));
    m.shared_gate = true;
    // Qwen2MoeTopKRouter / Qwen3NextTopKRouter are OLMoE's router (softmax, top-k, `/= sum`
    // under norm_topk_prob, `.to(router_logits.dtype)`), modelled op by op
    m.norm_topk_prob = Some(raw.norm_topk_prob.unwrap_or(defaults.norm_topk_prob));
    Ok((sparse, Some(m)))
}

pub(crate) fn qwen2_moe(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &QWEN2_MOE)?;
    // configuration_qwen2_moe.py: num_experts=60, num_experts_per_tok=4,
    // moe_intermediate_size=1408, shared_expert_intermediate_size=5632, qkv_bias=True.
    let (sparse, block) = qwen_moe_block(
        raw,
        ctx,
        &d,
        &QwenMoeDefaults {
            experts: 60,
            top_k: 4,
            moe_intermediate: 1408,
            shared_intermediate: 5632,
            norm_topk_prob: false,
        },
    )?;
    // configuration_qwen2_moe.py __post_init__: sliding_window kept only with
    // use_sliding_window (else 0); default layer_types: sliding iff (i+1) % 2 == 1 and
    // i < max_window_layers and use_sliding_window. modeling_qwen2_moe.py Qwen2MoeAttention
    // sets self.sliding_window = config.sliding_window on sliding layers.
    let use_sw = raw.use_sliding_window.unwrap_or(false);
    let w = if use_sw {
        window(ctx, raw.sliding_window.or(Some(4096)))?
    } else {
        None
    };
    let mwl = raw.max_window_layers.unwrap_or(28);
    let sliding = sliding_layers(ctx, raw, d.layers, |i| {
        (i + 1) % 2 == 1 && i < mwl && use_sw
    })?;
    // modeling_qwen2_moe.py Qwen2MoeAttention: q/k/v bias=config.qkv_bias, o_proj bias=False.
    let qkv_bias = raw.qkv_bias.unwrap_or(true);
    Decoder {
        attn: AttnOpts {
            qkv_bias,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        windows: sliding
            .into_iter()
            .map(|s| if s { w } else { None })
            .collect(),
        // Dense layers and the shared expert are nn.Linear gate/up/down_proj, but peft 0.21.2
        // maps those target names onto the routed experts' parameters (transformers 5.23
        // `_MODEL_TO_CONVERSION_PATTERN`; memory::check_lora_targets): not targets by name.
        ..Decoder::new(&d, llama_names(false))
    }
    .build(ctx, "qwen2_moe", &d, |i| {
        Ok(match (sparse.get(i).copied().unwrap_or(false), block) {
            (true, Some(m)) => Mlp::Moe(m),
            _ => Mlp::Dense(gated(d.intermediate, d.act)),
        })
    })
    .map(|mut desc| {
        // modeling_qwen2_moe.py Qwen2MoeModel.forward lines 485-488 (transformers 5.23): both
        // masks on every forward; without `use_sliding_window` the config sets
        // `sliding_window = 0` (configuration_qwen2_moe.py line 113) and the sliding mask is
        // still built, read by no layer
        desc.builds_both_masks = true;
        desc.sliding_mask_window = if use_sw { w } else { Some(0) };
        desc
    })
}

/// `qwen3/configuration_qwen3.py` `Qwen3Config` field defaults (head_dim=128).
const QWEN3: Defaults = Defaults {
    head_dim: HeadDimDefault::Fixed(128),
    ..QWEN2
};

/// Qwen3 attention: q/k/v/o bias=config.attention_bias (default False) and per-head
/// `q_norm`/`k_norm` RMSNorm(head_dim) (`modeling_qwen3.py` Qwen3Attention,
/// `modeling_qwen3_moe.py` Qwen3MoeAttention).
fn qwen3_attn(raw: &HfConfig, d: &Dims) -> AttnOpts {
    let bias = raw.attention_bias.unwrap_or(false);
    AttnOpts {
        qkv_bias: bias,
        o_bias: bias,
        qk_norm: Some((QkNormScope::PerHead, NormKind::RmsNorm)),
        // `self.q_norm(self.q_proj(x)..)`, `self.k_norm(self.k_proj(x)..)`, then `v_proj`
        qk_norm_inline: true,
        ..AttnOpts::rope(d.heads.head_dim)
    }
}

pub(crate) fn qwen3(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &QWEN3)?;
    Decoder {
        attn: qwen3_attn(raw, &d),
        // configuration_qwen3.py __post_init__: same window rule as Qwen2.
        windows: qwen_windows(raw, ctx, &d)?,
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "qwen3", &d, |_| {
        Ok(Mlp::Dense(gated(d.intermediate, d.act)))
    })
    .map(second_mask_if_sliding)
}

/// `qwen3_moe/configuration_qwen3_moe.py` `Qwen3MoeConfig` field defaults. It has no
/// `head_dim` field: `modeling_qwen3_moe.py` reads `getattr(config, "head_dim",
/// hidden_size // num_attention_heads)`.
const QWEN3_MOE: Defaults = Defaults {
    hidden_size: 2048,
    intermediate_size: 6144,
    num_hidden_layers: 24,
    num_attention_heads: 32,
    num_key_value_heads: Some(4),
    head_dim: HeadDimDefault::Derived,
    ..QWEN2
};

pub(crate) fn qwen3_moe(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &QWEN3_MOE)?;
    // configuration_qwen3_moe.py: num_experts=128 (attribute_map num_experts→num_local_experts),
    // num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1, mlp_only_layers=[].
    let field = if raw.num_experts.is_none() && raw.num_local_experts.is_some() {
        "num_local_experts"
    } else {
        "num_experts"
    };
    let num_experts = qwen_num_experts(raw, ctx, raw.num_experts.or(raw.num_local_experts), 128)?;
    let sparse = sparse_layers(raw, ctx, &d, num_experts)?;
    let block = if sparse.contains(&true) {
        let moe_i = ctx.size(
            raw.moe_intermediate_size,
            "moe_intermediate_size",
            768,
            MAX_INTERMEDIATE,
        )?;
        // modeling_qwen3_moe.py Qwen3MoeSparseMoeBlock: experts + gate only, no shared expert.
        // Qwen3MoeTopKRouter is OLMoE's router (softmax, top-k, `/= sum` under
        // norm_topk_prob, default False, `.to(router_logits.dtype)`), modelled op by op.
        let mut m = moe(
            ctx,
            (field, Some(num_experts), 128),
            raw.num_experts_per_tok.unwrap_or(8),
            moe_i,
            &d,
        )?;
        m.norm_topk_prob = Some(raw.norm_topk_prob.unwrap_or(false));
        Some(m)
    } else {
        None
    };
    // configuration_qwen3_moe.py: sliding_window kept only with use_sliding_window;
    // modeling_qwen3_moe.py Qwen3MoeAttention: getattr(config, "sliding_window") on every layer.
    let w = if raw.use_sliding_window.unwrap_or(false) {
        window(ctx, raw.sliding_window.or(Some(4096)))?
    } else {
        None
    };
    Decoder {
        attn: qwen3_attn(raw, &d),
        windows: vec![w; d.num_layers()],
        // dense layers' gate/up/down_proj are nn.Linear, but peft 0.21.2 maps those target
        // names onto the experts' parameters (memory::check_lora_targets): not targets by name
        ..Decoder::new(&d, llama_names(false))
    }
    .build(ctx, "qwen3_moe", &d, |i| {
        Ok(match (sparse.get(i).copied().unwrap_or(false), block) {
            (true, Some(m)) => Mlp::Moe(m),
            _ => Mlp::Dense(gated(d.intermediate, d.act)),
        })
    })
}

/// `olmo2/configuration_olmo2.py` `Olmo2Config` field defaults.
const OLMO2: Defaults = Defaults {
    vocab_size: 50304,
    strict_divisible: false,
    ..LLAMA
};

pub(crate) fn olmo2(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &OLMO2)?;
    // modeling_olmo2.py Olmo2Attention: q/k/v/o bias=config.attention_bias; q_norm over
    // num_heads·head_dim and k_norm over num_kv_heads·head_dim (whole projection, RMSNorm).
    let bias = raw.attention_bias.unwrap_or(false);
    Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            qk_norm: Some((QkNormScope::Full, NormKind::Olmo2RmsNorm)),
            // `self.q_norm(self.q_proj(x))`, `self.k_norm(self.k_proj(x))`, then `v_proj`
            qk_norm_inline: true,
            // modeling_olmo2.py Olmo2RotaryEmbedding.forward returns the fp32 cos/sin as is;
            // apply_rotary_pos_emb casts the rotated q and k back to their dtype
            rope_promotes: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        // modeling_olmo2.py Olmo2DecoderLayer: only post_attention_layernorm and
        // post_feedforward_layernorm, applied to the sub-block outputs.
        placement: NormPlacement::PostOnly,
        // modeling_olmo2.py Olmo2RMSNorm: `(self.weight * hidden_states).to(input_dtype)`
        norm_kind: NormKind::Olmo2RmsNorm,
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "olmo2", &d, |_| {
        Ok(Mlp::Dense(gated(d.intermediate, d.act)))
    })
}

/// `phi3/configuration_phi3.py` `Phi3Config` field defaults.
const PHI3: Defaults = Defaults {
    vocab_size: 32064,
    hidden_size: 3072,
    intermediate_size: 8192,
    max_position_embeddings: 4096,
    strict_divisible: false,
    ..LLAMA
};

pub(crate) fn phi3(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &PHI3)?;
    // configuration_phi3.py convert_rope_params_to_dict: partial_rotary_factor from
    // rope_scaling/rope_parameters, else the top-level key, else 1.0; modeling_phi3.py
    // Phi3RotaryEmbedding: dim = int(head_dim * partial_rotary_factor).
    let fraction = raw
        .rope_dict_partial_factor(ctx.prefix)?
        .or(raw.partial_rotary_factor)
        .unwrap_or(1.0);
    let rotary = ctx.rotary_dim(d.heads.head_dim, fraction, "partial_rotary_factor")?;
    // configuration_phi3.py: sliding_window default None; modeling_phi3.py passes
    // getattr(config, "sliding_window", None) to every layer.
    let w = window(ctx, raw.sliding_window)?;
    // modeling_phi3.py Phi3DecoderLayer: resid_attn_dropout/resid_mlp_dropout = resid_pdrop;
    // embd_pdrop is a config field that Phi3Model never uses.
    let dropout = Dropout {
        attention: d.attention_dropout,
        residual: ctx.prob(raw.resid_pdrop, "resid_pdrop", 0.0)?,
        ..Dropout::default()
    };
    Decoder {
        // modeling_phi3.py Phi3Attention: qkv_proj = Linear(hidden, (heads + 2·kv)·head_dim,
        // bias=False), o_proj bias=False.
        attn: AttnOpts {
            fused_qkv: true,
            rotary_dim: Some(rotary),
            // modeling_phi3.py apply_rotary_pos_emb: cat([q_rot·cos + rotate_half(q_rot)·sin, q_pass])
            rope_concat: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        windows: vec![w; d.num_layers()],
        dropout,
        ..Decoder::new(
            &d,
            names(&[
                (LinearRole::Qkv, "qkv_proj"),
                (LinearRole::O, "o_proj"),
                (LinearRole::GateUp, "gate_up_proj"),
                (LinearRole::Down, "down_proj"),
            ]),
        )
    }
    // modeling_phi3.py Phi3MLP: gate_up_proj = Linear(hidden, 2·intermediate, bias=False).
    .build(ctx, "phi3", &d, |_| {
        Ok(Mlp::Dense(DenseMlp {
            fused_gate_up: true,
            ..gated(d.intermediate, d.act)
        }))
    })
}

/// `starcoder2/configuration_starcoder2.py` `Starcoder2Config` field defaults.
const STARCODER2: Defaults = Defaults {
    vocab_size: 49152,
    hidden_size: 3072,
    intermediate_size: 12288,
    num_hidden_layers: 30,
    num_attention_heads: 24,
    num_key_value_heads: Some(2),
    act: "gelu_pytorch_tanh",
    max_position_embeddings: 4096,
    tie_word_embeddings: true,
    strict_divisible: false,
    ..LLAMA
};

pub(crate) fn starcoder2(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &STARCODER2)?;
    // modeling_starcoder2.py: q/k/v/o_proj and c_fc/c_proj bias=config.use_bias (default True).
    let bias = raw.use_bias.unwrap_or(true);
    // modeling_starcoder2.py: getattr(config, "sliding_window", None) on every layer (default None).
    let w = window(ctx, raw.sliding_window)?;
    // modeling_starcoder2.py: embedding_dropout after embed_tokens, residual_dropout on the
    // attention and MLP outputs, attention_dropout on probabilities (all default 0.0).
    let dropout = Dropout {
        embed: ctx.prob(raw.embedding_dropout, "embedding_dropout", 0.0)?,
        attention: d.attention_dropout,
        residual: ctx.prob(raw.residual_dropout, "residual_dropout", 0.0)?,
        activation: 0.0,
    };
    Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        windows: vec![w; d.num_layers()],
        dropout,
        // modeling_starcoder2.py: input_layernorm/post_attention_layernorm/norm are nn.LayerNorm.
        norm_kind: NormKind::LayerNorm,
        ..Decoder::new(
            &d,
            names(&[
                (LinearRole::Q, "q_proj"),
                (LinearRole::K, "k_proj"),
                (LinearRole::V, "v_proj"),
                (LinearRole::O, "o_proj"),
                (LinearRole::Up, "c_fc"),
                (LinearRole::Down, "c_proj"),
            ]),
        )
    }
    // modeling_starcoder2.py Starcoder2MLP: c_proj(act(c_fc(x))), not gated.
    .build(ctx, "starcoder2", &d, |_| {
        Ok(Mlp::Dense(plain(d.intermediate, bias, d.act)))
    })
}

#[cfg(test)]
mod tests {
    use crate::parse_hf_config;

    #[test]
    fn only_olmo2_rotates_on_fp32_tables_that_promote() {
        let base = r#""vocab_size":100,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2"#;
        for (mt, promotes) in [("olmo2", true), ("llama", false), ("qwen3", false)] {
            let d = parse_hf_config(&format!(r#"{{"model_type":"{mt}",{base}}}"#)).unwrap();
            for l in &d.layers {
                assert_eq!(l.attention.rope_promotes, promotes, "{mt}");
            }
        }
    }

    #[test]
    fn qwen_models_build_the_sliding_mask_with_a_sliding_layer() {
        // Qwen2Model / Qwen3Model.forward: the sliding mask `if self.has_sliding_layers`;
        // Qwen2MoeModel.forward: always (a window of 0 without `use_sliding_window`)
        let base = r#""vocab_size":100,"hidden_size":64,"intermediate_size":32,"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"max_window_layers":2"#;
        for mt in ["qwen2", "qwen3"] {
            let plain = parse_hf_config(&format!(r#"{{"model_type":"{mt}",{base}}}"#)).unwrap();
            assert!(!plain.builds_both_masks, "{mt}");
            let sw = parse_hf_config(&format!(
                r#"{{"model_type":"{mt}",{base},"use_sliding_window":true,"sliding_window":32}}"#
            ))
            .unwrap();
            assert!(sw.builds_both_masks, "{mt}");
        }
        let moe = r#""moe_intermediate_size":16,"shared_expert_intermediate_size":16,"num_experts":4,"num_experts_per_tok":2"#;
        let d = parse_hf_config(&format!(r#"{{"model_type":"qwen2_moe",{base},{moe}}}"#)).unwrap();
        assert!(d
            .layers
            .iter()
            .all(|l| l.attention.sliding_window.is_none()));
        assert!(d.builds_both_masks);
        // the window the unread mask is built with: 0 without `use_sliding_window`, the
        // config's with it (configuration_qwen2_moe.py line 113); the dense Qwens record none
        assert_eq!(d.sliding_mask_window, Some(0));
        let no_window_layers = base.replace(r#""max_window_layers":2"#, r#""max_window_layers":0"#);
        let sw = parse_hf_config(&format!(
            r#"{{"model_type":"qwen2_moe",{no_window_layers},{moe},"use_sliding_window":true,"sliding_window":32}}"#
        ))
        .unwrap();
        assert!(sw
            .layers
            .iter()
            .all(|l| l.attention.sliding_window.is_none()));
        assert_eq!(sw.sliding_mask_window, Some(32));
        let qwen2 = parse_hf_config(&format!(r#"{{"model_type":"qwen2",{base}}}"#)).unwrap();
        assert_eq!(qwen2.sliding_mask_window, None);
    }
}
