//! Parse-once and limits: hostile configs are refused by name or skipped, never built into a
//! tree; text from the config is shown escaped and cut.

use crate::config;
use memwall_formats::{parse_hf_config, parse_hf_config_with_dtype, FormatError};
use serde_json::{json, Value};

fn llama() -> Value {
    serde_json::from_str(&config("llama-3.2-1b.json")).unwrap()
}

#[test]
fn unknown_keys_of_any_size_are_skipped() {
    let plain = parse_hf_config(&llama().to_string()).unwrap();
    let mut v = llama();
    v["x"] = json!(vec![0u8; 1 << 20]);
    v["deep"] = json!([[[[[[[[{"a": [1, 2, {"b": null}]}]]]]]]]]);
    assert_eq!(parse_hf_config(&v.to_string()).unwrap(), plain);
}

#[test]
fn per_layer_lists_are_capped_while_read() {
    let mut v = llama();
    v["layer_types"] = json!(vec!["full_attention"; 5000]);
    let e = parse_hf_config(&v.to_string()).unwrap_err();
    assert_eq!(e.field(), Some("layer_types"), "{e}");
    assert!(e.to_string().contains("4096"), "{e}");
    let mut v = llama();
    v["model_type"] = json!("qwen2_moe");
    v["mlp_only_layers"] = json!(vec![0u64; 5000]);
    let e = parse_hf_config(&v.to_string()).unwrap_err();
    assert_eq!(e.field(), Some("mlp_only_layers"), "{e}");
}

#[test]
fn a_key_given_twice_is_refused() {
    let text = r#"{"model_type":"llama","vocab_size":10,"vocab_size":20}"#;
    let e = parse_hf_config(text).unwrap_err();
    assert!(matches!(e, FormatError::WrongType { .. }), "{e:?}");
    assert!(e.to_string().contains("vocab_size"), "{e}");
}

#[test]
fn trailing_text_is_a_json_error() {
    let text = format!("{} trailing", llama());
    assert!(matches!(
        parse_hf_config(&text),
        Err(FormatError::Json { .. })
    ));
}

#[test]
fn nesting_is_capped() {
    let deep = format!(
        "{{\"model_type\":\"phi3\",\"rope_scaling\":{}1{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    // skipped or refused, never a stack overflow
    let _ = parse_hf_config(&deep);
    let deep_typed = format!(
        "{{\"model_type\":\"llama\",\"layer_types\":{}1{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    assert!(parse_hf_config(&deep_typed).is_err());
}

#[test]
fn the_checkpoint_dtype_is_read_in_the_same_pass() {
    let c = parse_hf_config_with_dtype(&config("llama-3.2-1b.json")).unwrap();
    assert_eq!(c.checkpoint_dtype.as_deref(), Some("bfloat16"));
    let mut v = llama();
    v.as_object_mut().unwrap().remove("torch_dtype");
    v["dtype"] = json!("float16");
    let c = parse_hf_config_with_dtype(&v.to_string()).unwrap();
    assert_eq!(c.checkpoint_dtype.as_deref(), Some("float16"));
    // a non-string dtype is ignored, as before
    v["dtype"] = json!([1, 2]);
    let c = parse_hf_config_with_dtype(&v.to_string()).unwrap();
    assert_eq!(c.checkpoint_dtype, None);
    // a multimodal wrapper's text_config states it
    let mut g: Value = serde_json::from_str(&config("gemma-3-4b-pt.json")).unwrap();
    g.as_object_mut().unwrap().remove("torch_dtype");
    g["text_config"]["torch_dtype"] = json!("bfloat16");
    let c = parse_hf_config_with_dtype(&g.to_string()).unwrap();
    assert_eq!(c.checkpoint_dtype.as_deref(), Some("bfloat16"));
}

#[test]
fn a_text_config_that_is_not_an_object_is_named() {
    let e = parse_hf_config(&json!({"model_type": "gemma3", "text_config": [1]}).to_string())
        .unwrap_err();
    assert_eq!(e.field(), Some("text_config"));
    assert!(e.to_string().contains("expected an object"), "{e}");
}

#[test]
fn text_from_the_config_is_escaped_and_cut() {
    let hostile = format!("\u{1b}]0;owned\u{7}{}", "A".repeat(1 << 20));
    let mut v = llama();
    v["model_type"] = json!(hostile);
    let shown = parse_hf_config(&v.to_string()).unwrap_err().to_string();
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{7}'),
        "{shown:?}"
    );
    assert!(shown.len() < 2000, "{} bytes", shown.len());
    let mut v = llama();
    v["hidden_act"] = json!(format!("\u{1b}[2J{}", "B".repeat(1 << 20)));
    let shown = parse_hf_config(&v.to_string()).unwrap_err().to_string();
    assert!(
        !shown.contains('\u{1b}') && shown.len() < 2000,
        "{} bytes",
        shown.len()
    );
    let mut v = llama();
    v["num_hidden_layers"] = json!(format!("\u{1b}[2J{}", "C".repeat(1 << 20)));
    let shown = parse_hf_config(&v.to_string()).unwrap_err().to_string();
    assert!(
        !shown.contains('\u{1b}') && shown.len() < 2000,
        "{} bytes",
        shown.len()
    );
}

#[test]
fn message_and_hint_are_separate() {
    let e = parse_hf_config(r#"{"vocab_size": 1}"#).unwrap_err();
    assert!(!e.message().contains("hint:"));
    assert!(!e.hint().is_empty());
    assert_eq!(
        e.to_string(),
        format!("{}\nhint: {}", e.message(), e.hint())
    );
}
