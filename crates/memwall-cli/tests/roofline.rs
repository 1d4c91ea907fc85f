//! Bandwidth contract and published anchors, computed from the embedded GPU catalogue.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde::Deserialize;
use std::collections::BTreeMap;
use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("run memwall");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[derive(Debug, Deserialize)]
struct GpuJson {
    id: String,
    memory_bytes: u64,
    memory_bandwidth_bytes_per_s: f64,
    peak_flops_per_s: BTreeMap<String, f64>,
    pcie: Option<PcieJson>,
    sources: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct PcieJson {
    generation: u32,
    bandwidth_bytes_per_s: f64,
}

fn gpus() -> Vec<GpuJson> {
    let (code, stdout, stderr) = run(&["gpus", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).expect("gpus --json is an array of GPU objects")
}

fn gpu(id: &str) -> GpuJson {
    gpus()
        .into_iter()
        .find(|g| g.id == id)
        .unwrap_or_else(|| panic!("{id} not in the catalogue"))
}

#[test]
fn gpus_json_contract() {
    let all = gpus();
    assert!(all.len() >= 20);
    for g in &all {
        assert!(
            g.memory_bytes > 0 && g.memory_bandwidth_bytes_per_s > 0.0,
            "{}",
            g.id
        );
        assert!(
            !g.peak_flops_per_s.is_empty() && !g.sources.is_empty(),
            "{}",
            g.id
        );
    }
}

#[test]
fn seed_hierarchy_numbers_come_from_the_catalogue() {
    // H100 SXM HBM3 3.35 TB/s (NVIDIA H100 datasheet)
    assert_eq!(gpu("h100-sxm").memory_bandwidth_bytes_per_s, 3.35e12);
    // PCIe per direction: Gen4 x16 ~32 GB/s (A100), Gen5 x16 ~64 GB/s (H100)
    let a = gpu("a100-80gb-sxm").pcie.expect("a100 pcie");
    assert_eq!((a.generation, a.bandwidth_bytes_per_s), (4, 32e9));
    let h = gpu("h100-sxm").pcie.expect("h100 pcie");
    assert_eq!((h.generation, h.bandwidth_bytes_per_s), (5, 64e9));
}

#[test]
fn a100_ridge_is_about_156() {
    // seed: 312 TFLOP/s ÷ 2.0 TB/s = 156; the datasheet's 2.039 TB/s (80GB SXM) gives 153
    let g = gpu("a100-80gb-sxm");
    let ridge = g.peak_flops_per_s["bf16"] / g.memory_bandwidth_bytes_per_s;
    assert!((ridge - 156.0).abs() / 156.0 < 0.03, "{ridge}");
    // intensity 3 FLOP/byte is far below it: memory-bound
    assert!(3.0 < ridge);
}

#[derive(Debug, Deserialize)]
struct RooflineJson {
    ridge_flops_per_byte: f64,
    ops: Vec<OpJson>,
    tokens_per_s: f64,
}

#[derive(Debug, Deserialize)]
struct OpJson {
    name: String,
    flops: f64,
    bytes: f64,
    intensity: f64,
    bound: String,
}

fn roofline(args: &[&str]) -> RooflineJson {
    let mut a = vec!["roofline", "--json"];
    a.extend_from_slice(args);
    let (code, stdout, stderr) = run(&a);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).expect("roofline JSON contract")
}

#[test]
fn llama2_7b_decode_on_h100_is_bandwidth_bound_near_250_tokens_per_s() {
    // anchor: 3.35 TB/s ÷ 13.5 GB of bf16 weights ≈ 250 tokens/s (batch 1)
    let r = roofline(&[
        "--model",
        "llama-2-7b",
        "--gpu",
        "h100-sxm",
        "--phase",
        "decode",
        "--batch",
        "1",
        "--seq",
        "512",
    ]);
    assert!(r
        .ops
        .iter()
        .filter(|o| o.name.contains("proj") || o.name.starts_with("mlp."))
        .all(|o| o.bound == "memory"));
    assert!((r.tokens_per_s - 250.0).abs() < 20.0, "{}", r.tokens_per_s);
    assert!(r.ops.iter().all(|o| o.flops >= 0.0 && o.bytes >= 0.0));
}

#[test]
fn large_gemms_are_compute_bound_and_elementwise_ops_memory_bound() {
    let r = roofline(&[
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-sxm",
        "--phase",
        "train",
        "--batch",
        "8",
        "--seq",
        "4096",
    ]);
    assert!((r.ridge_flops_per_byte - 989.5e12 / 3.35e12).abs() < 1.0);
    let op = |n: &str| {
        r.ops
            .iter()
            .find(|o| o.name == n)
            .unwrap_or_else(|| panic!("{n}"))
    };
    assert_eq!(op("mlp.up_gate").bound, "compute");
    assert!(op("mlp.up_gate").intensity > r.ridge_flops_per_byte);
    assert_eq!(op("norm").bound, "memory");
    assert_eq!(op("residual_add").bound, "memory");
}

#[test]
fn svg_is_written() {
    let path = std::env::temp_dir().join(format!("memwall-roofline-{}.svg", std::process::id()));
    let p = path.display().to_string();
    let (code, _, stderr) = run(&[
        "roofline",
        "--model",
        "gpt2",
        "--gpu",
        "a100-80gb-sxm",
        "--phase",
        "prefill",
        "--svg",
        &p,
    ]);
    assert_eq!(code, 0, "{stderr}");
    let svg = std::fs::read_to_string(&path).expect("svg written");
    assert!(svg.starts_with("<svg") && svg.contains("HBM") && svg.contains("ridge"));
    let _ = std::fs::remove_file(path);
}
