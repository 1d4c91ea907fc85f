//! One malformed input per error class: the error names the field and carries a hint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_formats::{parse_hf_config, FormatError};
use serde_json::{json, Value};

/// A valid small llama config to mutate.
fn llama() -> Value {
    json!({
        "model_type": "llama", "vocab_size": 1000, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8
    })
}

fn with(mut v: Value, key: &str, value: Value) -> String {
    v[key] = value;
    v.to_string()
}

fn without(mut v: Value, key: &str) -> String {
    v.as_object_mut().unwrap().remove(key);
    v.to_string()
}

fn err(text: &str) -> FormatError {
    match parse_hf_config(text) {
        Ok(d) => panic!("expected an error, parsed {}", d.model_type),
        Err(e) => {
            assert!(e.to_string().contains("\nhint: "), "no hint in: {e}");
            e
        }
    }
}

#[test]
fn the_base_config_parses() {
    parse_hf_config(&llama().to_string()).unwrap();
}

#[test]
fn malformed_json_reports_line_and_column() {
    let e = err("{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,,\n}");
    assert!(matches!(e, FormatError::Json { line: 3, .. }), "{e:?}");
    assert!(e.to_string().contains("line 3"), "{e}");
}

#[test]
fn non_object_root_is_a_wrong_type() {
    assert!(matches!(err("[1, 2]"), FormatError::WrongType { .. }));
}

#[test]
fn missing_model_type() {
    assert_eq!(
        err(&without(llama(), "model_type")),
        FormatError::MissingModelType
    );
}

#[test]
fn unknown_model_type_lists_the_supported_ones() {
    let e = err(&with(llama(), "model_type", json!("nemotron_h")));
    let msg = e.to_string();
    assert!(
        msg.contains("\"nemotron_h\"") && msg.contains("qwen3_moe") && msg.contains("llama"),
        "{msg}"
    );
}

#[test]
fn missing_required_size() {
    let e = err(&without(llama(), "hidden_size"));
    assert!(
        matches!(&e, FormatError::MissingField { field, .. } if field == "hidden_size"),
        "{e:?}"
    );
}

#[test]
fn wrong_type_names_the_field() {
    let e = err(&with(llama(), "num_hidden_layers", json!("32")));
    assert_eq!(e.field(), Some("num_hidden_layers"), "{e}");
    let e = err(&with(llama(), "num_attention_heads", json!(-8)));
    assert_eq!(e.field(), Some("num_attention_heads"), "{e}");
    let e = err(&with(llama(), "hidden_size", json!(256.5)));
    assert_eq!(e.field(), Some("hidden_size"), "{e}");
    let e = err(&with(llama(), "model_type", json!(7)));
    assert_eq!(e.field(), Some("model_type"), "{e}");
}

#[test]
fn zero_and_absurd_sizes() {
    for (key, value) in [
        ("hidden_size", json!(0)),
        ("hidden_size", json!(1u64 << 19)),
        ("num_hidden_layers", json!(4097)),
        ("vocab_size", json!(1u64 << 23)),
        ("num_attention_heads", json!(0)),
        ("intermediate_size", json!(1u64 << 21)),
        ("head_dim", json!(0)),
        ("max_position_embeddings", json!(u64::MAX)),
    ] {
        let e = err(&with(llama(), key, value.clone()));
        assert!(
            matches!(&e, FormatError::OutOfRange { field, .. } if field == key),
            "{key}={value}: {e:?}"
        );
    }
}

#[test]
fn heads_must_divide_hidden_when_head_dim_is_implied() {
    let mut v = llama();
    v["model_type"] = json!("mistral");
    v["num_attention_heads"] = json!(7);
    v["num_key_value_heads"] = json!(7);
    let e = err(&v.to_string());
    assert!(matches!(e, FormatError::Inconsistent { .. }), "{e:?}");
    // An explicit head_dim lifts the requirement for Mistral (its config does not validate it).
    v["head_dim"] = json!(32);
    parse_hf_config(&v.to_string()).unwrap();
}

#[test]
fn kv_heads_must_divide_heads() {
    let e = err(&with(llama(), "num_key_value_heads", json!(3)));
    assert!(e.to_string().contains("num_key_value_heads"), "{e}");
    let e = err(&with(llama(), "num_key_value_heads", json!(16)));
    assert!(matches!(e, FormatError::Inconsistent { .. }), "{e:?}");
}

#[test]
fn top_k_cannot_exceed_experts() {
    let mut v = llama();
    v["model_type"] = json!("mixtral");
    v["num_local_experts"] = json!(4);
    v["num_experts_per_tok"] = json!(5);
    let e = err(&v.to_string());
    assert!(e.to_string().contains("num_experts_per_tok"), "{e}");
}

#[test]
fn rotary_fraction_must_lie_in_zero_one() {
    let neox = json!({"model_type": "gpt_neox", "vocab_size": 100, "hidden_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128});
    for bad in [json!(0.0), json!(1.5), json!(-0.25)] {
        let e = err(&with(neox.clone(), "rotary_pct", bad));
        assert!(
            matches!(&e, FormatError::OutOfRange { field, .. } if field == "rotary_pct"),
            "{e:?}"
        );
    }
    parse_hf_config(&with(neox, "rotary_pct", json!(1.0))).unwrap();
}

#[test]
fn unknown_activation() {
    let e = err(&with(llama(), "hidden_act", json!("quick_gelu")));
    assert!(
        matches!(&e, FormatError::Unsupported { field, .. } if field == "hidden_act"),
        "{e:?}"
    );
}

#[test]
fn dropout_must_be_a_probability() {
    let e = err(&with(llama(), "attention_dropout", json!(1.5)));
    assert_eq!(e.field(), Some("attention_dropout"));
}

#[test]
fn layer_types_must_match_layers_and_be_known() {
    let e = err(&with(
        llama_as("qwen2"),
        "layer_types",
        json!(["full_attention"]),
    ));
    assert!(matches!(e, FormatError::Inconsistent { .. }), "{e:?}");
    let e = err(&with(
        llama_as("qwen2"),
        "layer_types",
        json!(["full_attention", "chunked_attention"]),
    ));
    assert_eq!(e.field(), Some("layer_types"));
}

fn llama_as(model_type: &str) -> Value {
    let mut v = llama();
    v["model_type"] = json!(model_type);
    v["num_key_value_heads"] = json!(8);
    v
}

#[test]
fn mlp_only_layers_must_exist_and_sparse_step_be_positive() {
    let mut v = llama_as("qwen3_moe");
    v["mlp_only_layers"] = json!([5]);
    assert!(matches!(
        err(&v.to_string()),
        FormatError::Inconsistent { .. }
    ));
    v["mlp_only_layers"] = json!([]);
    v["decoder_sparse_step"] = json!(0);
    assert_eq!(err(&v.to_string()).field(), Some("decoder_sparse_step"));
}

#[test]
fn falcon_variants_transformers_cannot_run_are_refused() {
    let v = json!({"model_type": "falcon", "vocab_size": 100, "hidden_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4,
        "new_decoder_architecture": true, "parallel_attn": false});
    assert_eq!(err(&v.to_string()).field(), Some("parallel_attn"));
}

#[test]
fn gemma3_needs_a_text_config_and_prefixes_its_fields() {
    let e = err(&json!({"model_type": "gemma3"}).to_string());
    assert_eq!(e.field(), Some("text_config"));
    let e =
        err(&json!({"model_type": "gemma3", "text_config": {"hidden_size": "big"}}).to_string());
    assert_eq!(e.field(), Some("text_config.hidden_size"), "{e}");
    let e =
        err(&json!({"model_type": "gemma3", "text_config": {"num_hidden_layers": 0}}).to_string());
    assert_eq!(e.field(), Some("text_config.num_hidden_layers"), "{e}");
}

#[test]
fn mla_group_routing_needs_two_experts_per_group() {
    // transformers' router takes each group's top-2 experts: one expert per group cannot run
    // (measured: `RuntimeError: k not in range for dimension`, random sample seed 73)
    let v = json!({"model_type": "deepseek_v3", "vocab_size": 100, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "first_k_dense_replace": 0,
        "n_routed_experts": 2, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 1});
    match err(&v.to_string()) {
        FormatError::Inconsistent { fields, reason, .. } => {
            assert!(fields.contains("n_group"), "{fields}");
            assert!(reason.contains("1 per group"), "{reason}");
        }
        e => panic!("{e:?}"),
    }
    // two per group is fine
    let ok = json!({"model_type": "deepseek_v3", "vocab_size": 100, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "first_k_dense_replace": 0,
        "n_routed_experts": 4, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 1});
    assert!(parse_hf_config(&ok.to_string()).is_ok());
}

#[test]
fn mla_group_routing_must_divide_experts() {
    let v = json!({"model_type": "deepseek_v3", "vocab_size": 100, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "first_k_dense_replace": 1,
        "n_routed_experts": 10, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 2});
    assert!(matches!(
        err(&v.to_string()),
        FormatError::Inconsistent { .. }
    ));
}
