//! The page's entry points answer with the CLI's own reports, byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

fn cli(args: &[&str]) -> String {
    let mut out = Vec::new();
    memwall_cli::run_args(args.iter().copied(), &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn ok_wraps_the_json_report_verbatim() {
    let a = ["train", "--model", "gpt2", "--batch", "2", "--json"];
    let answer = memwall_wasm::run(args(&a));
    assert_eq!(answer, format!("{{\"ok\":{}}}", cli(&a).trim_end()));
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert!(v["ok"]["peak_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn a_table_comes_back_as_a_string() {
    let v: Value = serde_json::from_str(&memwall_wasm::run(args(&["gpus"]))).unwrap();
    assert!(v["ok"].as_str().unwrap().contains("h100-sxm"));
}

#[test]
fn errors_come_back_as_the_cli_lines() {
    let v: Value = serde_json::from_str(&memwall_wasm::run(args(&[
        "train", "--gpu", "h1000", "--json",
    ])))
    .unwrap();
    let lines: Vec<&str> = v["error"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(lines[0].starts_with("error: invalid --gpu"), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("hint: ")), "{lines:?}");
}

#[test]
fn a_pasted_config_is_the_model() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/truth/configs/qwen2.5-0.5b.json"
    );
    let config = std::fs::read_to_string(path).unwrap();
    // the page names the pasted model `config.json` (the `--model` value is only its label)
    let pasted = ["infer", "--model", "config.json", "--batch", "4", "--json"];
    let a = ["infer", "--batch", "4", "--json"];
    let v: Value =
        serde_json::from_str(&memwall_wasm::run_with_config(args(&pasted), &config)).unwrap();
    let by_path: Value =
        serde_json::from_str(&cli(&["infer", "--model", path, "--batch", "4", "--json"])).unwrap();
    assert_eq!(v["ok"]["model"]["label"], "config.json");
    assert_eq!(v["ok"]["model"]["model_type"], "qwen2");
    for k in ["peak_bytes", "at_peak", "gpu", "kv_cache_bytes", "workload"] {
        assert_eq!(v["ok"][k], by_path[k], "{k}");
    }
    // the config stands for this run only
    let after: Value = serde_json::from_str(&memwall_wasm::run(args(&a))).unwrap();
    assert_eq!(after["ok"]["model"]["label"], "llama-3.1-8b");
    // a broken config is the CLI's error
    let bad: Value = serde_json::from_str(&memwall_wasm::run_with_config(args(&a), "{")).unwrap();
    assert!(bad["error"][0]
        .as_str()
        .unwrap()
        .contains("config given as JSON text"));
}
