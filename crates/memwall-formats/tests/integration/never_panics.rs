//! Property: parsing never panics, whatever is done to a real config.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_formats::parse_hf_config;
use proptest::prelude::*;
use serde_json::{json, Value};

const BASES: &[&str] = &[
    "llama-3.2-1b.json",
    "deepseek-v3.json",
    "gemma-3-4b-pt.json",
    "gpt2.json",
    "falcon-40b.json",
    "opt-350m.json",
    "qwen1.5-moe-a2.7b.json",
    "qwen3-30b-a3b.json",
    "phi-3-mini-4k.json",
    "gemma-2-2b.json",
];

fn any_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (0u64..70_000).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-z_]{0,12}".prop_map(Value::from),
        Just(json!([])),
        Just(json!({})),
        Just(json!(["sliding_attention", "full_attention"])),
        Just(json!({"partial_rotary_factor": 0.0})),
    ]
}

/// Keys worth hitting: the ones the normalisers read.
const KEYS: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "n_embd",
    "num_hidden_layers",
    "n_layer",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "ffn_hidden_size",
    "max_position_embeddings",
    "n_positions",
    "hidden_act",
    "hidden_activation",
    "activation_function",
    "activation",
    "rotary_pct",
    "partial_rotary_factor",
    "rope_scaling",
    "rope_parameters",
    "sliding_window",
    "layer_types",
    "use_sliding_window",
    "max_window_layers",
    "sliding_window_pattern",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    "decoder_sparse_step",
    "mlp_only_layers",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "n_group",
    "topk_group",
    "attention_dropout",
    "word_embed_proj_dim",
    "new_decoder_architecture",
    "parallel_attn",
    "num_ln_in_parallel_attn",
    "multi_query",
    "text_config",
    "tie_word_embeddings",
    "attn_logit_softcapping",
    "do_layer_norm_before",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn mutated_configs_never_panic(
        base in 0..BASES.len(),
        edits in proptest::collection::vec((0..KEYS.len(), proptest::option::of(any_json())), 1..6),
        nested in any::<bool>(),
    ) {
        let mut v: Value = serde_json::from_str(&super::config(BASES[base])).unwrap();
        for (k, val) in edits {
            let target = if nested && v.get("text_config").is_some_and(Value::is_object) {
                &mut v["text_config"]
            } else {
                &mut v
            };
            let Some(obj) = target.as_object_mut() else { continue };
            match val {
                Some(val) => { obj.insert(KEYS[k].to_string(), val); }
                None => { obj.remove(KEYS[k]); }
            }
        }
        let _ = parse_hf_config(&v.to_string());
    }

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,200}") {
        let _ = parse_hf_config(&s);
    }

    #[test]
    fn truncated_configs_never_panic(base in 0..BASES.len(), cut in 0usize..4000) {
        let text = super::config(BASES[base]);
        let cut = cut.min(text.len());
        if text.is_char_boundary(cut) {
            let _ = parse_hf_config(&text[..cut]);
        }
    }
}
