//! Mixture-of-experts families added for issue 14: olmoe, gpt_oss, ernie4_5_moe. Each normaliser
//! states the transformers 5.23 source it follows (paths relative to `transformers/models/`).

use super::common::{Decoder, Defaults, Dims};
use super::llama::moe;
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{
    gated, limits::*, llama_names, sliding_layers, window, AttnOpts, Ctx, HeadDimDefault,
};
use memwall_core::model::{Activation, DenseMlp, Mlp, ModelDesc, NormKind, QkNormScope};

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
    // place (`clamp_`) after the q/k norms; autograd saves a copy of each (Attention::clip_qkv).
    // The bound's value does not change any size.
    // configuration_olmoe.py: num_experts=64 (attribute_map num_local_experts→num_experts),
    // num_experts_per_tok=8. modeling_olmoe.py OlmoeExperts: fused gate_up_proj [E, 2·I, H] and
    // down_proj [E, H, I] with I = intermediate_size, no biases; OlmoeTopKRouter: weight
    // [E, H], softmax(dtype=float), top-k, weights cast back to the logits' dtype (the
    // Qwen3-MoE router).
    let (field, experts) = match (raw.num_experts, raw.num_local_experts) {
        (None, Some(n)) => ("num_local_experts", Some(n)),
        (n, _) => ("num_experts", n),
    };
    let mut block = moe(
        ctx,
        (field, experts, 64),
        raw.num_experts_per_tok.unwrap_or(8),
        d.intermediate,
        &d,
    )?;
    // configuration_olmoe.py: norm_topk_prob=False; OlmoeTopKRouter divides the top-k weights
    // by their sum in place when it is set (the router is modelled op by op from this field)
    block.norm_topk_prob = Some(raw.norm_topk_prob.unwrap_or(false));
    // modeling_olmoe.py OlmoeAttention: q/k/v/o bias=config.attention_bias; q_norm =
    // OlmoeRMSNorm(hidden_size), k_norm = OlmoeRMSNorm(hidden/heads · kv_heads) over the whole
    // projections; OlmoeRMSNorm is `weight * x.to(input_dtype)` (the Llama form).
    let bias = raw.attention_bias.unwrap_or(false);
    Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            qk_norm: Some((QkNormScope::Full, NormKind::RmsNorm)),
            clip_qkv: raw.clip_qkv.is_some(),
            ..AttnOpts::rope(d.heads.head_dim)
        },
        // Experts are nn.Parameters, not nn.Linear: only attention is a LoRA target by name.
        ..Decoder::new(&d, llama_names(false))
    }
    .build(ctx, "olmoe", &d, |_| Ok(Mlp::Moe(block)))
}

/// `gpt_oss/configuration_gpt_oss.py` `GptOssConfig` field defaults (gpt-oss-120b's sizes).
const GPT_OSS: Defaults = Defaults {
    vocab_size: 201088,
    hidden_size: 2880,
    intermediate_size: 2880,
    num_hidden_layers: 36,
    num_attention_heads: 64,
    num_key_value_heads: Some(8),
    head_dim: HeadDimDefault::Fixed(64),
    act: "silu",
    max_position_embeddings: 131072,
    tie_word_embeddings: false,
    strict_divisible: false,
};

pub(crate) fn gpt_oss(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &GPT_OSS)?;
    // configuration_gpt_oss.py: swiglu_limit=7.0, swiglu_alpha=1.702 (memory-neutral constants)
    ctx.positive(raw.swiglu_limit, "swiglu_limit")?;
    // configuration_gpt_oss.py: num_local_experts=128, num_experts_per_tok=4.
    // modeling_gpt_oss.py GptOssExperts: gate_up_proj [E, H, 2·I] (interleaved gate/up columns),
    // gate_up_proj_bias [E, 2·I], down_proj [E, I, H], down_proj_bias [E, H]; `_apply_gate` is
    // the clamped SwiGLU. GptOssTopKRouter: weight [E, H] and bias [E]; top-k of the logits,
    // then a softmax over the k in the compute dtype.
    let mut block = moe(
        ctx,
        ("num_local_experts", raw.num_local_experts, 128),
        raw.num_experts_per_tok.unwrap_or(4),
        d.intermediate,
        &d,
    )?;
    block.expert.bias = true;
    block.expert.act = Activation::ClampedSwiglu;
    block.router_bias = true;
    block.router_topk_then_softmax = true;
    // configuration_gpt_oss.py __post_init__: default layer_types alternate sliding (even
    // layers) and full; sliding_window default 128. modeling_gpt_oss.py GptOssAttention:
    // `config.sliding_window if layer_type == "sliding_attention" else None`.
    let w = window(ctx, raw.sliding_window.or(Some(128)))?;
    let sliding = sliding_layers(ctx, raw, d.layers, |i| (i + 1) % 2 == 1)?;
    let bias = raw.attention_bias.unwrap_or(true);
    Decoder {
        attn: AttnOpts {
            // modeling_gpt_oss.py GptOssAttention: q/k/v/o bias=config.attention_bias
            qkv_bias: bias,
            o_bias: bias,
            // eager_attention_forward: softmax(dtype=combined_logits.dtype), no fp32 upcast
            eager_softmax_fp32: false,
            // apply_rotary_pos_emb → _apply_rotary_emb: chunk, then torch.cat of the halves
            rope_concat: true,
            rope_halves: true,
            // GptOssAttention.sinks = nn.Parameter(torch.empty(num_attention_heads))
            sinks: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        windows: sliding
            .into_iter()
            .map(|s| if s { w } else { None })
            .collect(),
        // GptOssRMSNorm: `(self.weight * hidden_states).to(input_dtype)` (the OLMo 2 form)
        norm_kind: NormKind::Olmo2RmsNorm,
        // Experts are nn.Parameters, not nn.Linear: only attention is a LoRA target by name.
        ..Decoder::new(&d, llama_names(false))
    }
    .build(ctx, "gpt_oss", &d, |_| Ok(Mlp::Moe(block)))
    .map(|mut desc| {
        // modeling_gpt_oss.py GptOssModel.forward (transformers 5.23, lines 466-469):
        // `causal_mask_mapping = {"full_attention": create_causal_mask(..), "sliding_attention":
        // create_sliding_window_causal_mask(..)}` on every forward whatever the layer types
        desc.builds_both_masks = true;
        desc
    })
}

/// `ernie4_5_moe/configuration_ernie4_5_moe.py` `Ernie4_5_MoeConfig` field defaults
/// (ERNIE-4.5-21B-A3B's sizes). The class has no `head_dim`: `modeling_ernie4_5_moe.py` reads
/// `getattr(config, "head_dim", hidden_size // num_attention_heads)`.
const ERNIE45_MOE: Defaults = Defaults {
    vocab_size: 103424,
    hidden_size: 2560,
    intermediate_size: 12288,
    num_hidden_layers: 28,
    num_attention_heads: 20,
    num_key_value_heads: Some(4),
    head_dim: HeadDimDefault::Derived,
    act: "silu",
    max_position_embeddings: 131072,
    tie_word_embeddings: true,
    strict_divisible: false,
};

pub(crate) fn ernie4_5_moe(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &ERNIE45_MOE)?;
    // configuration_ernie4_5_moe.py: attribute_map num_experts→moe_num_experts,
    // num_experts_per_tok→moe_k; moe_num_experts=64, moe_k=6, moe_intermediate_size=1536,
    // moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_end_index=-1 (→ last
    // layer), moe_layer_interval=1, use_bias=False.
    let bias = raw.use_bias.unwrap_or(false);
    let moe_i = ctx.size(
        raw.moe_intermediate_size,
        "moe_intermediate_size",
        1536,
        MAX_INTERMEDIATE,
    )?;
    let interval = raw.moe_layer_interval.unwrap_or(1);
    if interval == 0 {
        return Err(FormatError::OutOfRange {
            field: ctx.field("moe_layer_interval"),
            value: "0".into(),
            reason: "must be at least 1 (every interval-th layer is sparse)".into(),
            hint: "use 1 to make every layer from moe_layer_start_index on a mixture of experts"
                .into(),
        });
    }
    let last = i64::try_from(d.layers).unwrap_or(i64::MAX) - 1;
    let start = raw.moe_layer_start_index.unwrap_or(1);
    let end = match raw.moe_layer_end_index.unwrap_or(-1) {
        -1 => last,
        e => e,
    };
    // modeling_ernie4_5_moe.py Ernie4_5_MoeDecoderLayer: sparse iff (i + 1) % interval == 0
    // and start <= i <= end
    let sparse: Vec<bool> = (0..d.layers)
        .map(|i| {
            let ii = i64::try_from(i).unwrap_or(i64::MAX);
            (i + 1) % interval == 0 && ii >= start && ii <= end
        })
        .collect();
    let mut block = moe(
        ctx,
        ("moe_num_experts", raw.moe_num_experts, 64),
        raw.moe_k.unwrap_or(6),
        moe_i,
        &d,
    )?;
    // Ernie4_5_MoeTopKRouter: fp32 weight [E, H] (no bias), `F.linear(x.float(), w.float())`,
    // fp32 softmax, top-k on the softmax plus `moe_statics.e_score_correction_bias`
    // (a frozen fp32 [1, E] parameter), gather, renormalise, cast back to the hidden dtype.
    block.router_fp32 = true;
    block.router_weights_in_compute_dtype = true;
    block.frozen_router_params = block.num_experts;
    // Ernie4_5_MoeSparseMoeBlock: shared_experts = Ernie4_5_MoeMLP(intermediate =
    // moe_intermediate_size · moe_num_shared_experts) (gate/up/down, bias=use_bias), run
    // before the router and added after the experts.
    let shared = raw.moe_num_shared_experts.unwrap_or(2);
    let shared_i = moe_i.checked_mul(shared).filter(|&w| w <= MAX_INTERMEDIATE);
    let Some(shared_i) = shared_i else {
        return Err(ctx.inconsistent(
            &["moe_intermediate_size", "moe_num_shared_experts"],
            format!("{shared} shared experts of width {moe_i} exceed {MAX_INTERMEDIATE}"),
            "no real model has shared experts this wide",
        ));
    };
    block.shared = (shared > 0).then(|| DenseMlp {
        bias,
        ..gated(shared_i, d.act)
    });
    block.shared_first = true;
    let dense = DenseMlp {
        bias,
        ..gated(d.intermediate, d.act)
    };
    Decoder {
        attn: AttnOpts {
            // Ernie4_5_MoeAttention: q/k/v/o bias=config.use_bias
            qkv_bias: bias,
            o_bias: bias,
            // apply_rotary_pos_emb: fp32 cos/sin, `q.float()`, cast back
            rope_fp32: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        // Dense layers and shared experts are nn.Linear gate/up/down_proj, but peft 0.21.2
        // maps those target names onto the routed experts' parameters (transformers 5.23 converts
        // ernie4_5_moe like qwen2_moe; memory::check_lora_targets): only attention is a target.
        ..Decoder::new(&d, llama_names(false))
    }
    .build(ctx, "ernie4_5_moe", &d, |i| {
        Ok(if sparse.get(i).copied().unwrap_or(false) {
            Mlp::Moe(block)
        } else {
            Mlp::Dense(dense)
        })
    })
    .map(|mut desc| {
        // Ernie4_5_MoeForCausalLM: `lm_head = nn.Linear(hidden, vocab, bias=config.use_bias)`
        // (the dense Ernie4_5ForCausalLM's has bias=False); a tied head shares only the weight
        desc.head.bias = bias;
        desc
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;

    #[test]
    fn gpt_oss_builds_both_masks_whatever_its_layers() {
        // GptOssModel.forward: the full and the sliding mask on every forward, even with only
        // sliding layers
        for types in [
            r#"["sliding_attention","full_attention"]"#,
            r#"["sliding_attention"]"#,
        ] {
            let n = types.matches("attention").count();
            let d = parse_hf_config(&format!(
                r#"{{"model_type":"gpt_oss","vocab_size":100,"hidden_size":64,"intermediate_size":32,"num_hidden_layers":{n},"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"num_local_experts":4,"num_experts_per_tok":2,"layer_types":{types}}}"#
            ))
            .unwrap();
            assert!(d.builds_both_masks, "{types}");
        }
    }

    #[test]
    fn olmoe_clip_qkv_is_modelled_not_refused() {
        let base = r#""model_type":"olmoe","vocab_size":100,"hidden_size":64,"intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":4,"num_experts":4,"num_experts_per_tok":2"#;
        let plain = parse_hf_config(&format!("{{{base}}}")).unwrap();
        assert!(plain.layers.iter().all(|l| !l.attention.clip_qkv));
        let clipped = parse_hf_config(&format!("{{{base},\"clip_qkv\":8.0}}")).unwrap();
        assert!(clipped.layers.iter().all(|l| l.attention.clip_qkv));
        // MLP names are not LoRA targets (peft maps them onto the experts' parameters)
        assert!(!clipped.linear_names.iter().any(|(_, n)| n == "down_proj"));
    }

    #[test]
    fn olmoe_and_qwen_moe_routers_record_norm_topk_prob_with_their_config_defaults() {
        use memwall_core::model::Mlp;
        let norm = |json: &str| match parse_hf_config(json).unwrap().layers[0].mlp {
            Mlp::Moe(m) => m.norm_topk_prob,
            _ => None,
        };
        let olmoe = r#""model_type":"olmoe","vocab_size":100,"hidden_size":64,"intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":4,"num_experts":4,"num_experts_per_tok":2"#;
        // configuration_olmoe.py / configuration_qwen3_moe.py: norm_topk_prob=False
        assert_eq!(norm(&format!("{{{olmoe}}}")), Some(false));
        assert_eq!(
            norm(&format!("{{{olmoe},\"norm_topk_prob\":true}}")),
            Some(true)
        );
        let qwen3 = r#""model_type":"qwen3_moe","vocab_size":100,"hidden_size":64,"intermediate_size":32,"moe_intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"num_experts":4,"num_experts_per_tok":2"#;
        assert_eq!(norm(&format!("{{{qwen3}}}")), Some(false));
        assert_eq!(
            norm(&format!("{{{qwen3},\"norm_topk_prob\":true}}")),
            Some(true)
        );
    }

    #[test]
    fn ernie_moe_lm_head_has_the_projections_bias() {
        let base = r#""model_type":"ernie4_5_moe","vocab_size":100,"hidden_size":64,"intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"moe_num_experts":4,"moe_k":2,"moe_intermediate_size":32,"tie_word_embeddings":false"#;
        let with_bias = parse_hf_config(&format!("{{{base},\"use_bias\":true}}")).unwrap();
        let without = parse_hf_config(&format!("{{{base},\"use_bias\":false}}")).unwrap();
        assert!(with_bias.head.bias && !without.head.bias);
        assert!(!with_bias.linear_names.iter().any(|(_, n)| n == "gate_proj"));
    }
}
