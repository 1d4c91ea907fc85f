//! HunYuan MoE v1 (Hunyuan-A13B; transformers 5.23 `models/hunyuan_v1_moe/`): the HunYuan
//! dense layer (per-head q/k RMSNorms on the rotated queries and keys) with a mixture of
//! experts whose always-on shared MLP runs first.

use super::common::{Decoder, Defaults, Dims};
use super::llama::moe;
use crate::error::FormatError;
use crate::raw::{HfConfig, OneOrPerLayer};
use crate::resolve::{gated, limits::*, llama_names, AttnOpts, Ctx, HeadDimDefault};
use memwall_core::model::{Mlp, ModelDesc, NormKind, QkNormScope};

/// `hunyuan_v1_moe/configuration_hunyuan_v1_moe.py` `HunYuanMoEV1Config` field defaults.
const HUNYUAN_MOE: Defaults = Defaults {
    vocab_size: 290943,
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

pub(crate) fn hunyuan_v1_moe(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    // HunYuanMoEV1Attention: `getattr(config, "head_dim", hidden_size // num_attention_heads)`,
    // but the config class always has `head_dim` (default None): a config without it cannot
    // be built.
    ctx.core(raw.head_dim, "head_dim", 128, MAX_HEAD_DIM)?;
    let d = Dims::llama(raw, ctx, &HUNYUAN_MOE)?;
    // configuration: attribute_map num_experts_per_tok→moe_topk (int or one per layer, default
    // 1), num_local_experts→num_experts (default 1)
    let top_k: Vec<u64> = match (&raw.moe_topk, raw.num_experts_per_tok) {
        (Some(OneOrPerLayer::PerLayer(v)), _) => {
            if v.len() as u64 != d.layers {
                return Err(ctx.inconsistent(
                    &["moe_topk", "num_hidden_layers"],
                    format!("{} moe_topk entries for {} layers", v.len(), d.layers),
                    "a per-layer moe_topk needs one entry per layer (HunYuanMoEV1Gate reads moe_topk[layer_idx])",
                ));
            }
            v.clone()
        }
        (Some(OneOrPerLayer::One(k)), _) => vec![*k; d.num_layers()],
        (None, k) => vec![k.unwrap_or(1); d.num_layers()],
    };
    let experts = raw.num_experts.or(raw.num_local_experts);
    let mut blocks = Vec::with_capacity(top_k.len());
    for &k in &top_k {
        // HunYuanMoEV1Experts: gate_up_proj [E, 2·I, H], down_proj [E, H, I] with
        // I = intermediate_size (grouped_mm experts interface)
        let mut block = moe(ctx, ("num_experts", experts, 1), k, d.intermediate, &d)?;
        // HunYuanMoEV1Gate: `wg = nn.Linear(hidden, E, bias=False, dtype=torch.float32)`,
        // `hidden_states.float()`, fp32 logits, fp32 softmax over all experts, top-k,
        // renormalised in place, fp32 routing weights (so the weighted expert outputs are
        // fp32 until `.to(hidden_states.dtype)`). memwall stores the router weight in the
        // model dtype (E·H·2 bytes per layer less than the fp32 weight).
        block.hunyuan_router = true;
        // HunYuanMoEV1Moe: `shared_mlp = HunYuanMoEV1MLP(config)` (gate/up/down_proj,
        // intermediate_size, no bias), run before the gate and added at the end
        block.shared = Some(gated(d.intermediate, d.act));
        block.shared_first = true;
        blocks.push(block);
    }
    // HunYuanMoEV1Attention: q/k/v/o_proj bias=config.attention_bias; query_layernorm /
    // key_layernorm = HunYuanMoEV1RMSNorm(head_dim) after apply_rotary_pos_emb
    let bias = raw.attention_bias.unwrap_or(false);
    Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            qk_norm: Some((QkNormScope::PerHead, NormKind::RmsNorm)),
            qk_norm_after_rope: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        // Only attention is a LoRA target by name: the shared MLP is nn.Linear
        // gate/up/down_proj, but peft 0.21 with transformers 5.23 turns those target names
        // into adapters on the routed experts' parameters (a ParamWrapper of rank r·E on
        // `experts.gate_up_proj` / `experts.down_proj`) and leaves the shared MLP alone
        // (measured), which is not modelled: such targets are refused.
        ..Decoder::new(&d, llama_names(false))
    }
    .build(ctx, "hunyuan_v1_moe", &d, |i| {
        blocks
            .get(i)
            .copied()
            .map(Mlp::Moe)
            .ok_or_else(|| ctx.inconsistent(&["num_hidden_layers"], "layer count".into(), ""))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;
    use memwall_core::model::Mlp;

    #[test]
    fn per_layer_top_k_and_a_shared_mlp_first() {
        let base = r#""model_type":"hunyuan_v1_moe","vocab_size":100,"hidden_size":64,"intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"num_experts":4"#;
        let d = parse_hf_config(&format!("{{{base},\"moe_topk\":[1,2]}}")).unwrap();
        let (Mlp::Moe(a), Mlp::Moe(b)) = (d.layers[0].mlp, d.layers[1].mlp) else {
            panic!("not MoE")
        };
        assert_eq!((a.top_k, b.top_k), (1, 2));
        assert!(a.shared_first && a.hunyuan_router && a.shared.is_some());
        let e = parse_hf_config(&format!("{{{base},\"moe_topk\":[1]}}")).unwrap_err();
        assert!(e.to_string().contains("moe_topk"), "{e}");
    }

    #[test]
    fn the_hub_files_per_layer_lists_are_read() {
        // Hunyuan-A13B's config.json lists moe_topk, moe_intermediate_size and
        // num_shared_expert per layer (transformers 5.23 reads intermediate_size for the
        // experts and the shared MLP)
        let base = r#""model_type":"hunyuan_v1_moe","vocab_size":100,"hidden_size":64,"intermediate_size":32,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"num_experts":4,"moe_topk":[2,2],"num_shared_expert":[1,1]"#;
        parse_hf_config(&format!("{{{base},\"moe_intermediate_size\":[32,32]}}")).unwrap();
        let e =
            parse_hf_config(&format!("{{{base},\"moe_intermediate_size\":[32,16]}}")).unwrap_err();
        assert!(e.to_string().contains("per-layer"), "{e}");
    }
}
