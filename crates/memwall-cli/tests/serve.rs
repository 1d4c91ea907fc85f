//! vLLM capacity accounting against cases worked by hand from vLLM 0.33.0's source
//! (`tests/serve/vllm_expected.json`, `docs/vllm-accounting.md`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_core::serve::{plan, ServeConfig};
use serde_json::Value;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model(id: &str) -> memwall_core::ModelDesc {
    if let Some(e) = memwall_catalog::find(id) {
        return e.model().expect("catalogue model parses");
    }
    let json = std::fs::read_to_string(root().join(id)).unwrap_or_else(|_| panic!("no model {id}"));
    memwall_formats::parse_hf_config(&json).expect("config parses")
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {}", v["id"]))
}

fn config(c: &Value) -> ServeConfig {
    ServeConfig {
        gpu_memory_bytes: u(c, "gpu_memory_bytes"),
        tp: u(c, "tp"),
        gpu_memory_utilization: c["gpu_memory_utilization"].as_f64().unwrap_or(0.92),
        kv_dtype_bytes: if c["kv_cache_dtype"] == "auto" { 2 } else { 1 },
        block_size: u(c, "block_size"),
        max_model_len: u(c, "max_model_len"),
        max_num_batched_tokens: u(c, "max_num_batched_tokens"),
        kv_cache_memory_bytes: c["kv_cache_memory_bytes"].as_u64(),
        weights_bytes_per_rank: u(c, "weights_bytes_per_rank"),
        non_torch_bytes: u(c, "non_torch_bytes"),
        activation_peak_bytes: u(c, "activation_peak_bytes"),
        cuda_graph_bytes: u(c, "cuda_graph_bytes"),
        enable_prefix_caching: c["enable_prefix_caching"].as_bool(),
        flashinfer_gdn_prefill: c["flashinfer_gdn_prefill"].as_bool().unwrap_or(false),
    }
}

#[test]
fn every_worked_case_matches() {
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/serve/vllm_expected.json")).unwrap(),
    )
    .unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for c in cases {
        let id = c["id"].as_str().unwrap();
        let m = model(c["model"].as_str().unwrap());
        let cfg = config(c);
        let p = plan(&m, &cfg).unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(
            p.requested_memory_bytes,
            u(c, "requested_memory_bytes"),
            "{id}: requested"
        );
        assert_eq!(
            p.available_kv_bytes,
            u(c, "available_kv_bytes"),
            "{id}: available"
        );
        assert_eq!(
            p.num_kv_heads_per_rank,
            u(c, "num_kv_heads_per_rank"),
            "{id}: kv heads per rank"
        );
        assert_eq!(
            p.bytes_per_block,
            u(c, "bytes_per_block"),
            "{id}: bytes per block"
        );
        let groups = c["kv_cache_groups"].as_array().unwrap();
        assert_eq!(p.groups.len(), groups.len(), "{id}: groups");
        assert_eq!(
            p.groups[0].page_size_bytes,
            u(c, "page_size_bytes"),
            "{id}: page size"
        );
        if c.get("hf_config").is_some() {
            // models with state layers: vLLM's block alignment and state pages
            let sc = p.state_cache.as_ref().expect("a state cache");
            assert_eq!(sc.block_size, u(c, "block_size_aligned"), "{id}: block");
            assert_eq!(sc.mamba_cache_mode, c["mamba_cache_mode"], "{id}: mode");
            assert_eq!(sc.state_page_bytes, u(c, "state_page_bytes"), "{id}: state");
            assert_eq!(
                sc.state_blocks_per_request,
                u(c, "state_blocks_per_request"),
                "{id}: state blocks"
            );
            for (g, want) in p.groups.iter().zip(groups) {
                assert_eq!(g.kind, want["type"], "{id}: group kind");
                assert_eq!(g.num_layers, u(want, "num_layers"), "{id}: group layers");
                assert_eq!(
                    g.page_size_bytes,
                    u(want, "page_size_bytes"),
                    "{id}: group page"
                );
            }
            if c["expected_error"].is_null() {
                let mml = u(c, "max_model_len");
                let conc = p.max_concurrency(&cfg, mml);
                assert_eq!(
                    (conc * mml as f64) as u64,
                    u(c, "vllm_log_kv_cache_size_tokens"),
                    "{id}: logged tokens"
                );
            }
        }
        if let Some(err) = c.get("expected_error").filter(|e| !e.is_null()) {
            assert!(!p.fits_max_model_len, "{id}: should not fit");
            assert_eq!(
                p.max_model_len_that_fits,
                u(err, "estimated_max_model_len"),
                "{id}: estimated max len"
            );
            continue;
        }
        assert!(p.fits_max_model_len, "{id}: should fit");
        assert_eq!(p.num_gpu_blocks, u(c, "num_gpu_blocks"), "{id}: blocks");
        assert_eq!(p.kv_tokens, u(c, "kv_tokens"), "{id}: tokens");
        for (len, want) in c["max_concurrency_at"].as_object().unwrap() {
            let got = p.max_concurrency(&cfg, len.parse().unwrap());
            let want = want.as_f64().unwrap();
            assert!(
                (got - want).abs() < 1e-9 * want.max(1.0),
                "{id}: concurrency at {len}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn seed_pagedattention_capacity_for_llama3_8b_with_60_gb() {
    // 60 GB (decimal) of KV for Llama-3-8B: 2 MiB per 16-token block over 32 layers
    let m = model("llama-3-8b");
    let cfg = ServeConfig {
        gpu_memory_bytes: 80 << 30,
        tp: 1,
        gpu_memory_utilization: 0.92,
        kv_dtype_bytes: 2,
        block_size: 16,
        max_model_len: 8192,
        max_num_batched_tokens: 8192,
        kv_cache_memory_bytes: Some(60_000_000_000),
        weights_bytes_per_rank: 0,
        non_torch_bytes: 0,
        activation_peak_bytes: 0,
        cuda_graph_bytes: 0,
        enable_prefix_caching: None,
        flashinfer_gdn_prefill: false,
    };
    let p = plan(&m, &cfg).unwrap();
    assert_eq!(p.bytes_per_block, 2_097_152);
    assert_eq!(p.num_gpu_blocks, 28_610);
    assert_eq!(p.kv_tokens, 457_760);
    assert_eq!(p.max_concurrency(&cfg, 2048), 223.515625);
    assert_eq!(p.max_concurrency(&cfg, 4096), 111.7578125);
    assert_eq!(p.max_concurrency(&cfg, 8192), 55.87890625);
}

#[test]
fn serve_cli_json_and_refusal() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_memwall"))
            .args(args)
            .output()
            .expect("run");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = run(&[
        "serve",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-sxm",
        "--json",
    ]);
    assert_eq!(code, 0);
    let j: Value = serde_json::from_str(&out).unwrap();
    assert!(j["num_gpu_blocks"].as_u64().unwrap() > 0);
    assert_eq!(
        j["kv_tokens"].as_u64().unwrap(),
        j["num_gpu_blocks"].as_u64().unwrap() * 16
    );
    assert!(j["vllm_serve_command"]
        .as_str()
        .unwrap()
        .starts_with("vllm serve meta-llama/Llama-3.1-8B"));
    // 70B on one 80 GB GPU: the weights alone do not fit, nothing is left for the cache
    let (code, out) = run(&[
        "serve",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "h100-sxm",
        "--json",
    ]);
    assert_eq!(code, 0);
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["fits_max_model_len"], false);
    // not one block fits: no launch line (a `--max-model-len 0` one could not start), the reason
    let cmd = j["vllm_serve_command"].as_str().unwrap();
    assert!(cmd.starts_with("# no `vllm serve` command"), "{cmd}");
    assert!(!cmd.contains("--max-model-len"), "{cmd}");
    // and no emitted config either: exit 2 with the reason
    let (code, _) = run(&[
        "serve",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "h100-sxm",
        "--emit",
        "vllm",
    ]);
    assert_eq!(code, 2);
    // heads that do not divide tp: exit 2 naming the field
    let (code, _) = run(&["serve", "--model", "llama-3.1-8b", "--tp", "3"]);
    assert_eq!(code, 2);
}

#[test]
fn falcon_h1_is_served_as_a_hybrid_and_infer_counts_both_caches() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_memwall"))
            .args(args)
            .output()
            .expect("run");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // vLLM's hybrid cache: attention block raised to 800 tokens, the Mamba page padded to it
    let (code, out, err) = run(&["serve", "--model", "falcon-h1-0.5b-instruct", "--json"]);
    assert_eq!(code, 0, "{err}");
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["state_cache"]["block_size"], 800);
    assert_eq!(j["state_cache"]["mamba_cache_mode"], "align");
    assert_eq!(j["groups"].as_array().unwrap().len(), 2);
    // prefix caching off: one state block per request instead of two
    let (code, out, _) = run(&[
        "serve",
        "--model",
        "falcon-h1-0.5b-instruct",
        "--no-enable-prefix-caching",
        "--json",
    ]);
    assert_eq!(code, 0);
    let k: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(k["state_cache"]["mamba_cache_mode"], "none");
    assert!(
        k["max_concurrency"]["2048"].as_f64().unwrap()
            > j["max_concurrency"]["2048"].as_f64().unwrap()
    );
    assert!(k["vllm_serve_command"]
        .as_str()
        .unwrap()
        .ends_with("--no-enable-prefix-caching"));
    // still refused by name: fp8 KV next to states kept in the model dtype, and a GPU whose
    // attention backend (and so the block alignment) memwall does not model
    let (code, _, err) = run(&[
        "serve",
        "--model",
        "falcon-h1-0.5b-instruct",
        "--kv-cache-dtype",
        "fp8",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("mamba-cache-dtype") && err.contains("hint:"),
        "{err}"
    );
    let (code, _, err) = run(&[
        "serve",
        "--model",
        "falcon-h1-0.5b-instruct",
        "--gpu",
        "b200",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("blackwell") && err.contains("hint:"), "{err}");
    // one request: every layer keeps a growing KV cache and the fixed-size Mamba-2 state
    let m = model("falcon-h1-0.5b-instruct");
    let l = &m.layers[0];
    assert!(l.parallel_mixers() && l.attention_block().is_some() && l.mamba2().is_some());
    let infer = |prompt: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_memwall"))
            .args([
                "infer",
                "--model",
                "falcon-h1-0.5b-instruct",
                "--prompt",
                prompt,
                "--new-tokens",
                "2",
                "--json",
            ])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(0));
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        j["kv_cache_bytes"].as_u64().unwrap()
    };
    // 36 layers × (conv state 1792 × 4 bf16 + SSM state 24 × 64 × 128 fp32) per sequence, and
    // 36 × 2 × 2 heads × 64 × 2 bytes per cached token
    let state = 36 * (1792 * 4 * 2 + 24 * 64 * 128 * 4);
    let per_token = 36 * 2 * 2 * 64 * 2;
    assert_eq!(infer("1024") - infer("512"), 512 * per_token);
    assert!(infer("512") >= state + 513 * per_token, "{}", infer("512"));
}

#[test]
fn infer_cli_json_contract() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args([
            "infer",
            "--model",
            "llama-3.1-8b",
            "--batch",
            "4",
            "--prompt",
            "1024",
            "--new-tokens",
            "32",
            "--json",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(j["peak_bytes"].is_u64());
    // 2 · 32 layers · 8 kv heads · 128 · (1024 + 31) tokens · 4 sequences · 2 bytes
    assert_eq!(
        j["kv_cache_bytes"].as_u64().unwrap(),
        2 * 32 * 8 * 128 * (1024 + 31) * 4 * 2
    );
}
