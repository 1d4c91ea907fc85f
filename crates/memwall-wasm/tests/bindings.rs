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

#[test]
fn dropped_files_are_the_model_and_a_short_prefix_asks_for_more() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/truth/configs/qwen2.5-0.5b.json"
    );
    let config = std::fs::read(path).unwrap();
    let len = config.len();
    let a = ["infer", "--model", "config.json", "--batch", "4", "--json"];
    let v: Value = serde_json::from_str(&memwall_wasm::run_with_files(
        args(&a),
        args(&["config.json"]),
        vec![len as f64],
        vec![u32::try_from(len).unwrap()],
        &config,
    ))
    .unwrap();
    let by_path: Value =
        serde_json::from_str(&cli(&["infer", "--model", path, "--batch", "4", "--json"])).unwrap();
    assert_eq!(v["ok"]["model"]["label"], "config.json");
    assert_eq!(v["ok"]["model"]["origin"], "config.json");
    for k in ["peak_bytes", "at_peak", "gpu", "kv_cache_bytes", "workload"] {
        assert_eq!(v["ok"][k], by_path[k], "{k}");
    }
    assert!(v.get("more").is_none());

    // the first 24 bytes of a 1 GiB GGUF: its metadata goes on, so read 1 MiB and call again
    let mut gguf = b"GGUF".to_vec();
    gguf.extend_from_slice(&3u32.to_le_bytes());
    gguf.extend_from_slice(&0u64.to_le_bytes());
    gguf.extend_from_slice(&1u64.to_le_bytes());
    let v: Value = serde_json::from_str(&memwall_wasm::run_with_files(
        args(&["inspect", "m.gguf", "--json"]),
        args(&["m.gguf"]),
        vec![(1u64 << 30) as f64],
        vec![24],
        &gguf,
    ))
    .unwrap();
    assert_eq!(
        v["more"],
        serde_json::json!({"file": "m.gguf", "bytes": 1 << 20})
    );
    let first = v["error"][0].as_str().unwrap();
    assert!(
        first.contains("only the first 24 bytes of `m.gguf`"),
        "{first}"
    );
    assert!(v["error"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_str()
        .unwrap()
        .starts_with("hint: give the first 1048576 bytes"));

    // the arguments must describe the bytes
    for (sizes, lens, bytes) in [
        (vec![10.0], vec![4u32], &b"abc"[..]),
        (vec![10.0], vec![2u32], &b"abc"[..]),
        (vec![-1.0], vec![3u32], &b"abc"[..]),
        (vec![1.5], vec![3u32], &b"abc"[..]),
        (vec![], vec![3u32], &b"abc"[..]),
    ] {
        let v: Value = serde_json::from_str(&memwall_wasm::run_with_files(
            args(&["inspect", "x.gguf"]),
            args(&["x.gguf"]),
            sizes,
            lens,
            bytes,
        ))
        .unwrap();
        let lines = v["error"].as_array().unwrap();
        assert!(lines[0].as_str().unwrap().starts_with("error: "), "{v}");
        assert!(
            lines
                .last()
                .unwrap()
                .as_str()
                .unwrap()
                .starts_with("hint: "),
            "{v}"
        );
    }
}
