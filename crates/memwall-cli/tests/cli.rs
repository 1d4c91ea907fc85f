//! CLI contract: exit codes, stdout and stderr snapshotted together; JSON output deserialised
//! into strict structs so a schema change fails loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde::Deserialize;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn data(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .display()
        .to_string()
}

/// Runs memwall; returns "exit: N\n--- stdout\n…\n--- stderr\n…" with the data dir path normalised.
fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run memwall");
    let norm = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .replace(&data(""), "<data>/")
            .replace(&repo().display().to_string(), "<repo>")
    };
    (
        out.status.code().unwrap_or(-1),
        norm(&out.stdout),
        norm(&out.stderr),
    )
}

fn transcript(args: &[&str]) -> String {
    let (code, stdout, stderr) = run(args);
    format!("exit: {code}\n--- stdout\n{stdout}--- stderr\n{stderr}")
}

#[test]
fn train_table_for_a_catalogue_model() {
    insta::assert_snapshot!(transcript(&[
        "train",
        "--model",
        "llama-3.1-8b",
        "--batch",
        "4",
        "--seq",
        "2048"
    ]));
}

#[test]
fn train_lora_checkpointing_table() {
    insta::assert_snapshot!(transcript(&[
        "train",
        "--model",
        "qwen2.5-7b",
        "--batch",
        "8",
        "--seq",
        "4096",
        "--checkpointing",
        "--lora-rank",
        "16",
        "--lora-targets",
        "q_proj,k_proj,v_proj,o_proj",
        "--gpu",
        "a100-80gb-sxm",
    ]));
}

#[test]
fn default_invocation_runs_on_the_embedded_default_model() {
    let (code, stdout, _) = run(&["train"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("llama-3.1-8b"), "{stdout}");
}

/// The documented JSON contract of `memwall train --json`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrainJson {
    model: serde_json::Value,
    workload: serde_json::Value,
    runtime_profile: String,
    peak_bytes: u64,
    phase: String,
    at_peak: std::collections::BTreeMap<String, u64>,
    /// Peak of each phase of the step (one GPU).
    phase_peaks: std::collections::BTreeMap<String, u64>,
    gpu: GpuJson,
    speed: SpeedJson,
    /// Present exactly when the peak does not fit.
    doctor: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpeedJson {
    step_s: f64,
    tokens_per_s_per_gpu: f64,
    tokens_per_s: f64,
    mfu: f64,
    hfu: f64,
    breakdown: std::collections::BTreeMap<String, f64>,
    micro_batches: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuJson {
    id: String,
    name: String,
    memory_bytes: u64,
    cuda_context_bytes: u64,
    cublas_workspace_bytes: u64,
    alloc_margin_bytes: u64,
    required_bytes: u64,
    fits: bool,
    headroom_bytes: i64,
}

#[test]
fn train_json_contract_with_a_config_path() {
    let (code, stdout, stderr) = run(&[
        "train",
        "--model",
        "tests/truth/configs/qwen2.5-0.5b.json",
        "--batch",
        "2",
        "--seq",
        "1024",
        "--precision",
        "amp-bf16",
        "--optimizer",
        "adamw-fused",
        "--attention",
        "eager",
        "--grad-accum",
        "2",
        "--gpu",
        "l4",
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let j: TrainJson = serde_json::from_str(&stdout).expect("strict JSON");
    assert_eq!(j.runtime_profile, "hf");
    assert_eq!(j.at_peak.values().sum::<u64>(), j.peak_bytes);
    assert_eq!(
        j.gpu.required_bytes,
        j.peak_bytes
            + j.gpu.cuda_context_bytes
            + j.gpu.cublas_workspace_bytes
            + j.gpu.alloc_margin_bytes
    );
    // the default allocator margin is 5% of the peak
    assert_eq!(
        j.gpu.alloc_margin_bytes,
        (j.peak_bytes as f64 * 0.05).ceil() as u64
    );
    assert_eq!(j.gpu.fits, j.gpu.headroom_bytes >= 0);
    assert_eq!(j.doctor.is_some(), !j.gpu.fits);
    assert_eq!(j.gpu.id, "l4");
    assert!(!j.gpu.name.is_empty() && j.gpu.memory_bytes > 0);
    assert!(["forward", "loss", "backward", "optimizer"].contains(&j.phase.as_str()));
    // the phase peaks: one per phase, the peak's phase holding the peak
    assert_eq!(j.phase_peaks.len(), 4);
    assert_eq!(j.phase_peaks[&j.phase], j.peak_bytes);
    assert_eq!(j.phase_peaks.values().max(), Some(&j.peak_bytes));
    assert_eq!(j.workload["grad_accum"], 2);
    assert_eq!(j.model["model_type"], "qwen2");
    // the speed contract: step time, rates, MFU, and a breakdown that sums to the step
    let parts: f64 = j.speed.breakdown.values().sum();
    assert!(
        (parts - j.speed.step_s).abs() <= 1e-9 * j.speed.step_s,
        "{parts} vs {}",
        j.speed.step_s
    );
    for k in [
        "compute_s",
        "recompute_s",
        "exposed_comm_s",
        "bubble_s",
        "offload_s",
        "optimizer_s",
    ] {
        assert!(j.speed.breakdown.contains_key(k), "{k}");
    }
    assert!(
        j.speed.tokens_per_s_per_gpu > 0.0 && j.speed.tokens_per_s >= j.speed.tokens_per_s_per_gpu
    );
    assert!(j.speed.mfu > 0.0 && j.speed.mfu < 1.0 && j.speed.hfu >= j.speed.mfu);
    assert_eq!(j.speed.micro_batches, 2);
    // top-level peak_bytes is an integer in the raw text too
    let raw: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(raw["peak_bytes"].is_u64());
}

#[test]
fn qlora_needs_less_than_lora_which_needs_less_than_full() {
    let peak = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--model",
            "llama-3.1-8b",
            "--batch",
            "1",
            "--seq",
            "2048",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<TrainJson>(&stdout)
            .unwrap()
            .peak_bytes
    };
    let full = peak(&[]);
    let lora = peak(&["--lora-rank", "16", "--lora-targets", "q_proj,v_proj"]);
    let qlora = peak(&[
        "--lora-rank",
        "16",
        "--lora-targets",
        "q_proj,v_proj",
        "--qlora",
    ]);
    assert!(qlora < lora && lora < full, "{qlora} {lora} {full}");
}

#[test]
fn malformed_and_inconsistent_inputs_exit_2_naming_the_field() {
    for (file, needle) in [
        ("truncated.json", "not valid JSON"),
        ("heads.json", "`num_attention_heads`"),
        ("kv_heads.json", "num_key_value_heads"),
        ("unknown.json", "`model_type`"),
        ("wrongtype.json", "`hidden_size`"),
        ("absurd_layers.json", "num_hidden_layers"),
    ] {
        let (code, stdout, stderr) = run(&["train", "--model", &data(file)]);
        assert_eq!(code, 2, "{file}: {stderr}");
        assert!(stdout.is_empty(), "{file}");
        assert!(stderr.contains(needle), "{file}: {stderr}");
        assert!(!stderr.contains("panicked"), "{file}: {stderr}");
    }
}

#[test]
fn bad_input_snapshots() {
    insta::assert_snapshot!(
        "heads_do_not_divide",
        transcript(&["train", "--model", &data("heads.json")])
    );
    insta::assert_snapshot!(
        "unknown_model_suggests",
        transcript(&["train", "--model", "lama-3-8b"])
    );
    insta::assert_snapshot!("unknown_gpu", transcript(&["train", "--gpu", "h100"]));
    insta::assert_snapshot!(
        "lora_target_not_in_model",
        transcript(&[
            "train",
            "--model",
            "gpt2",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj"
        ])
    );
    // an expert name of a MoE family peft converts: the experts' reason, not "not a linear"
    insta::assert_snapshot!(
        "lora_target_on_converted_experts",
        transcript(&[
            "train",
            "--model",
            "qwen3-30b-a3b",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj,down_proj"
        ])
    );
    insta::assert_snapshot!("zero_batch", transcript(&["train", "--batch", "0"]));
    insta::assert_snapshot!(
        "missing_file",
        transcript(&["train", "--model", "./nope/config.json"])
    );
    insta::assert_snapshot!(
        "image_tokens_refused",
        transcript(&[
            "train",
            "--model",
            "llama-4-scout-17b-16e-instruct",
            "--image-tokens",
            "256"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_llama4_separators_over_seq",
        transcript(&[
            "train",
            "--model",
            "llama-4-scout-17b-16e-instruct",
            "--seq",
            "721",
            "--image-tokens",
            "720"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_llama4_checkpointing",
        transcript(&[
            "train",
            "--model",
            "tests/truth/configs/llama4-xc-small.json",
            "--seq",
            "800",
            "--image-tokens",
            "720",
            "--checkpointing"
        ])
    );
    // every tower's patch embedding is hooked by enable_input_require_grads (issue 14)
    insta::assert_snapshot!(
        "image_tokens_qwen2_vl_checkpointing_policy",
        transcript(&[
            "train",
            "--model",
            "tests/truth/configs/qwen2-vl-xc-small.json",
            "--seq",
            "300",
            "--image-tokens",
            "256",
            "--checkpointing-policy",
            "every-k:2"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_gemma3_checkpointing_ddp",
        transcript(&[
            "train",
            "--model",
            "tests/truth/configs/gemma-3-xc-small.json",
            "--seq",
            "300",
            "--image-tokens",
            "256",
            "--checkpointing",
            "--gpus",
            "2",
            "--strategy",
            "ddp"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_mistral3_rows_over_seq",
        transcript(&[
            "train",
            "--model",
            "mistral-small-3.1-24b-instruct",
            "--seq",
            "1030",
            "--image-tokens",
            "1024"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_mistral3_vision_lora",
        transcript(&[
            "train",
            "--model",
            "mistral-small-3.1-24b-instruct",
            "--image-tokens",
            "256",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj,v_proj"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_over_seq",
        transcript(&[
            "train",
            "--model",
            "qwen2-vl-7b-instruct",
            "--seq",
            "128",
            "--image-tokens",
            "256"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_with_train_vision",
        transcript(&[
            "train",
            "--model",
            "qwen2-vl-7b-instruct",
            "--train-vision",
            "--image-tokens",
            "256"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_with_vision_lora",
        transcript(&[
            "train",
            "--model",
            "qwen2.5-vl-7b-instruct",
            "--image-tokens",
            "64",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj,up_proj"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_gemma3_partial_image",
        transcript(&[
            "train",
            "--model",
            "tests/truth/configs/gemma-3-4b-2l-v2.json",
            "--seq",
            "1024",
            "--image-tokens",
            "300"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_gemma3_vision_lora",
        transcript(&[
            "train",
            "--model",
            "tests/truth/configs/gemma-3-4b-2l-v2.json",
            "--seq",
            "1024",
            "--image-tokens",
            "256",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj,v_proj"
        ])
    );
    // GatedDeltaNet training: autocast at any linear-attention shape is estimated (the delta
    // rule's 16-bit matmul casts traced op by op); refused by name: fp32 with one value head
    // per key head (the `z` view keeps the projection output)
    insta::assert_snapshot!(
        "gated_deltanet_autocast_any_shape",
        transcript(&[
            "train",
            "--model",
            "tests/truth/configs/sw6-qwen3next.json",
            "--seq",
            "64",
            "--precision",
            "amp-bf16"
        ])
    );
    insta::assert_snapshot!(
        "image_tokens_without_vision_tower",
        transcript(&["infer", "--model", "gpt2", "--image-tokens", "64"])
    );
    insta::assert_snapshot!(
        "train_vision_without_vision_tower",
        transcript(&["train", "--model", "gpt2", "--train-vision"])
    );
    insta::assert_snapshot!(
        "train_vision_with_lora",
        transcript(&[
            "train",
            "--model",
            "mistral-small-3.1-24b-instruct",
            "--train-vision",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj"
        ])
    );
}

#[test]
fn bad_flags_exit_2() {
    let (code, _, stderr) = run(&["train", "--precision", "int3"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--precision"), "{stderr}");
}

#[test]
fn models_lists_the_catalogue() {
    let (code, stdout, _) = run(&["models", "--json"]);
    assert_eq!(code, 0);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    assert!(rows.len() >= 30);
    assert!(rows
        .iter()
        .all(|r| r["params_total"].as_u64().unwrap_or(0) > 0 && r["source"].as_str().is_some()));
}

#[test]
fn inspect_prints_exact_counts() {
    insta::assert_snapshot!(transcript(&["inspect", "gpt2"]));
    let (code, stdout, _) = run(&["inspect", "llama-2-7b", "--json"]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(j["params"]["total"], 6_738_415_616u64);
}

#[test]
fn gpus_json_lists_ids_and_bytes() {
    let (code, stdout, _) = run(&["gpus", "--json"]);
    assert_eq!(code, 0);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    assert!(rows
        .iter()
        .any(|g| g["id"] == "h100-sxm" && g["memory_bytes"].is_u64()));
}

#[test]
fn train_70b_on_eight_a100s_table() {
    insta::assert_snapshot!(transcript(&[
        "train",
        "--model",
        "llama-3.1-70b",
        "--gpus",
        "8",
        "--gpu",
        "a100-80gb-sxm",
        "--seq",
        "4096",
    ]));
}

#[test]
fn train_fsdp_uneven_shards_table() {
    insta::assert_snapshot!(transcript(&[
        "train",
        "--model",
        "qwen2.5-7b",
        "--gpus",
        "6",
        "--strategy",
        "fsdp-full",
        "--precision",
        "amp-bf16",
        "--checkpointing",
        "--batch",
        "2",
        "--seq",
        "4096",
    ]));
}

#[test]
fn train_megatron_pipeline_table() {
    insta::assert_snapshot!(transcript(&[
        "train",
        "--model",
        "llama-3.1-70b",
        "--gpus",
        "64",
        "--tp",
        "8",
        "--sequence-parallel",
        "--pp",
        "4",
        "--strategy",
        "zero1",
        "--global-batch",
        "64",
        "--seq",
        "4096",
    ]));
}

#[test]
fn layout_that_does_not_divide() {
    insta::assert_snapshot!(transcript(&["train", "--gpus", "8", "--tp", "3"]));
}

#[test]
fn fused_losses_need_less_than_the_transformers_loss() {
    let run_json = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--model",
            "llama-3.1-8b",
            "--batch",
            "4",
            "--seq",
            "2048",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<TrainJson>(&stdout).unwrap()
    };
    let torch = run_json(&[]);
    assert!(
        torch.workload.get("kernels").is_none(),
        "defaults stay out of the JSON"
    );
    let fused = run_json(&["--loss", "fused"]);
    let linear = run_json(&["--loss", "fused-linear"]);
    assert_eq!(fused.workload["kernels"]["loss"], "fused");
    assert_eq!(linear.workload["kernels"]["loss"], "fused-linear");
    assert!(
        linear.peak_bytes < fused.peak_bytes && fused.peak_bytes < torch.peak_bytes,
        "{} {} {}",
        linear.peak_bytes,
        fused.peak_bytes,
        torch.peak_bytes
    );
    let packed = run_json(&["--padding-free", "--attention", "flash"]);
    assert_eq!(packed.workload["kernels"]["padding_free"], true);
}

#[test]
fn keeping_the_model_outputs_costs_the_logits_and_the_cache() {
    let run_json = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--model",
            "llama-3.1-8b",
            "--batch",
            "2",
            "--seq",
            "4096",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<TrainJson>(&stdout).unwrap()
    };
    let trainer = run_json(&[]);
    assert!(
        trainer.workload.get("step_options").is_none(),
        "the default loop stays out of the JSON"
    );
    assert_eq!(
        run_json(&["--loop", "trainer"]).peak_bytes,
        trainer.peak_bytes
    );
    let keep = run_json(&["--loop", "keep-outputs"]);
    assert_eq!(keep.workload["step_options"]["loop"], "keep-outputs");
    // at least the bf16 logits [2, 4096, 128256] stay alive
    assert!(
        keep.peak_bytes >= trainer.peak_bytes + 2 * 4096 * 128_256 * 2,
        "{} {}",
        keep.peak_bytes,
        trainer.peak_bytes
    );
    // with checkpointing there is no cache, only the logits (and the loss) are kept
    let ckpt = run_json(&["--checkpointing"]);
    let ckpt_keep = run_json(&["--checkpointing", "--loop", "keep-outputs"]);
    assert!(ckpt_keep.peak_bytes > ckpt.peak_bytes);
}

#[test]
fn keep_outputs_loop_is_named_in_the_workload_line() {
    insta::assert_snapshot!(transcript(&[
        "train",
        "--model",
        "smollm2-135m-instruct",
        "--batch",
        "4",
        "--seq",
        "512",
        "--loop",
        "keep-outputs"
    ]));
}

#[test]
fn checkpointing_every_kth_layer_lies_between_none_and_full() {
    let peak = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--model",
            "llama-3.1-8b",
            "--batch",
            "2",
            "--seq",
            "4096",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<TrainJson>(&stdout).unwrap()
    };
    let none = peak(&[]);
    let full = peak(&["--checkpointing"]);
    // `full` is --checkpointing, and every-k:1 is full
    assert_eq!(
        peak(&["--checkpointing-policy", "full"]).peak_bytes,
        full.peak_bytes
    );
    assert_eq!(
        peak(&["--checkpointing", "--checkpointing-policy", "every-k:1"]).peak_bytes,
        full.peak_bytes
    );
    assert!(
        full.workload.get("step_options").is_none(),
        "the default policy stays out of the JSON"
    );
    let every2 = peak(&["--checkpointing-policy", "every-k:2"]);
    let every4 = peak(&["--checkpointing-policy", "every-k:4"]);
    assert_eq!(every2.workload["checkpointing"], true);
    assert_eq!(
        every2.workload["step_options"]["checkpointing_policy"],
        "every-k:2"
    );
    assert!(
        full.peak_bytes < every2.peak_bytes
            && every2.peak_bytes < every4.peak_bytes
            && every4.peak_bytes < none.peak_bytes,
        "{} {} {} {}",
        full.peak_bytes,
        every2.peak_bytes,
        every4.peak_bytes,
        none.peak_bytes
    );
}

#[test]
fn checkpointing_policy_is_named_in_the_workload_line() {
    insta::assert_snapshot!(transcript(&[
        "train",
        "--model",
        "smollm2-135m-instruct",
        "--batch",
        "4",
        "--seq",
        "512",
        "--checkpointing-policy",
        "every-k:3"
    ]));
}

#[test]
fn use_cache_off_drops_the_training_kv_cache() {
    let run_json = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--model",
            "dolly-v2-3b",
            "--batch",
            "4",
            "--seq",
            "1024",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<TrainJson>(&stdout).unwrap()
    };
    let default = run_json(&[]);
    assert!(default.workload.get("step_options").is_none());
    assert_eq!(
        run_json(&["--use-cache", "true"]).peak_bytes,
        default.peak_bytes
    );
    // GPT-NeoX: without the cache's `torch.cat` copies, attention saves v as a view of the
    // fused qkv output, which keeps the whole qkv alive: more memory, not less
    let off = run_json(&["--use-cache", "false"]);
    assert_eq!(off.workload["step_options"]["use_cache"], false);
    assert!(off.peak_bytes > default.peak_bytes);
    // checkpointing turns the cache off on its own
    assert_eq!(
        run_json(&["--checkpointing", "--use-cache", "false"]).peak_bytes,
        run_json(&["--checkpointing"]).peak_bytes
    );
}

#[test]
fn megatron_refuses_the_fused_losses() {
    insta::assert_snapshot!(transcript(&[
        "train",
        "--model",
        "llama-3.1-8b",
        "--gpus",
        "2",
        "--tp",
        "2",
        "--loss",
        "fused-linear"
    ]));
}

/// `run_args_with_config` (the Python bindings' `model=dict`) resolves the model from the text
/// it is given through the config.json path: the same report as the file, under its own label,
/// and the next run resolves `--model` as usual again.
#[test]
fn run_args_with_config_matches_the_config_file() {
    let path = repo().join("data/models/Qwen/Qwen3-0.6B.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let file = path.display().to_string();
    let args = |model: &str| -> Vec<String> {
        ["train", "--model", model, "--batch", "2", "--json"]
            .iter()
            .map(|a| (*a).to_owned())
            .collect()
    };
    let json = |bytes: Vec<u8>| -> serde_json::Value { serde_json::from_slice(&bytes).unwrap() };
    let mut from_file = Vec::new();
    memwall_cli::run_args(args(&file), &mut from_file).unwrap();
    let mut from_text = Vec::new();
    memwall_cli::run_args_with_config(args("my-qwen"), &text, &mut from_text).unwrap();
    let (from_file, from_text) = (json(from_file), json(from_text));
    assert_eq!(from_text["model"]["label"], "my-qwen");
    assert_eq!(from_text["model"]["origin"], "config given as JSON text");
    for key in ["peak_bytes", "phase", "at_peak", "gpu", "speed", "workload"] {
        assert_eq!(from_text[key], from_file[key], "{key}");
    }
    // restored: `my-qwen` is a model name again, and not one the catalogue knows
    let lines = memwall_cli::run_args(args("my-qwen"), &mut Vec::new()).unwrap_err();
    assert!(
        lines[0].starts_with("error: unknown model `my-qwen`"),
        "{lines:?}"
    );
    // a config that does not parse is an error with the config path's hint
    let lines =
        memwall_cli::run_args_with_config(args("x"), "{\"model_type\": 1}", &mut Vec::new())
            .unwrap_err();
    assert!(lines[0].starts_with("error: "), "{lines:?}");
    assert!(lines.last().unwrap().starts_with("hint: "), "{lines:?}");
}

/// A parsing error from `run_args` reads as the binary prints it: clap's lines, then a hint.
#[test]
fn run_args_parsing_errors_end_with_a_hint() {
    let lines =
        memwall_cli::run_args(["train", "--precision", "bf17"], &mut Vec::new()).unwrap_err();
    assert!(
        lines[0].starts_with("error: invalid value 'bf17' for '--precision"),
        "{lines:?}"
    );
    assert_eq!(
        lines.last().unwrap(),
        "hint: `memwall <command> --help` lists every flag with its accepted values"
    );
}

#[test]
fn vlm_reports_state_the_vision_tower_and_the_image_token_assumption() {
    let (code, stdout, _) = run(&[
        "train",
        "--model",
        "qwen2-vl-7b-instruct",
        "-s",
        "512",
        "--json",
    ]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let v = &j["model"]["vision"];
    assert_eq!(v["params"], 675_759_104u64);
    assert_eq!(v["trainable"], false);
    assert!(v["assumption"].as_str().unwrap().contains("image tokens"));
    // frozen by default: the vision tower is not trainable
    assert_eq!(
        j["model"]["params_trainable"].as_u64().unwrap(),
        j["model"]["params_total"].as_u64().unwrap() - 675_759_104
    );
    let (code, stdout, _) = run(&[
        "train",
        "--model",
        "qwen2-vl-7b-instruct",
        "-s",
        "512",
        "--train-vision",
        "--json",
    ]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(j["model"]["vision"]["trainable"], true);
    assert_eq!(j["model"]["params_trainable"], j["model"]["params_total"]);
    let (code, stdout, _) = run(&["infer", "--model", "llama-4-scout-17b-16e-instruct"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("vision tower: llama4_vision_model"),
        "{stdout}"
    );
    assert!(stdout.contains("assumption: image tokens"), "{stdout}");
}

#[test]
fn liger_kernels_need_less_than_its_loss_alone() {
    let run_json = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--model",
            "llama-3.1-8b",
            "--batch",
            "4",
            "--seq",
            "2048",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<TrainJson>(&stdout).unwrap()
    };
    let linear = run_json(&["--loss", "fused-linear"]);
    let liger = run_json(&["--kernels", "liger"]);
    // --kernels liger implies Liger's loss, and --loss fused-linear says the same
    assert_eq!(liger.workload["kernels"]["loss"], "fused-linear");
    assert_eq!(liger.workload["kernels"]["layers"], "liger");
    assert_eq!(
        run_json(&["--kernels", "liger", "--loss", "fused-linear"]).peak_bytes,
        liger.peak_bytes
    );
    assert!(
        liger.peak_bytes < linear.peak_bytes,
        "{} {}",
        liger.peak_bytes,
        linear.peak_bytes
    );
    // a fused RMSNorm alone keeps transformers' loss
    let torch = run_json(&[]);
    let norm = run_json(&["--kernels", "rmsnorm"]);
    assert_eq!(norm.workload["kernels"]["layers"], "rmsnorm");
    assert!(norm.workload["kernels"]
        .get("loss")
        .is_none_or(|l| l == "torch"));
    assert!(norm.peak_bytes < torch.peak_bytes && liger.peak_bytes < norm.peak_bytes);
    // the same kernels on every FSDP2 rank
    let (code, _, stderr) = run(&[
        "train",
        "--model",
        "llama-3.1-8b",
        "--gpus",
        "8",
        "--strategy",
        "fsdp-full",
        "--kernels",
        "liger",
    ]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn liger_kernels_on_train() {
    insta::assert_snapshot!(transcript(&[
        "train",
        "--model",
        "qwen2.5-3b",
        "--batch",
        "4",
        "--seq",
        "2048",
        "--kernels",
        "liger",
        "--gpu",
        "a100-40gb-sxm"
    ]));
}

#[test]
fn attention_sinks_refuse_sdpa_by_name() {
    // transformers 5.23 GptOssPreTrainedModel._supports_sdpa = False: an SDPA estimate would
    // describe a run that cannot happen, so train, plan and infer refuse it with the way out
    for cmd in ["train", "plan", "infer"] {
        let (code, _, stderr) = run(&[cmd, "--model", "gpt-oss-20b", "--attention", "sdpa"]);
        assert_eq!(code, 2, "{cmd}: {stderr}");
        assert!(stderr.contains("--attention sdpa"), "{cmd}: {stderr}");
        assert_eq!(stderr.matches("hint:").count(), 1, "{cmd}: {stderr}");
    }
    let (code, _, stderr) = run(&["train", "--model", "gpt-oss-20b", "--attention", "eager"]);
    assert_eq!(code, 0, "{stderr}");
}

/// `--float8` (torchtitan's `Float8LinearConverter`): the LM head's eager casts raise the
/// torchtitan peak into the forward; what torchtitan 0.3.0 does not offer or was not measured
/// exits 2 naming the flag.
#[test]
fn the_float8_flag_runs_torchtitans_converter_and_refuses_by_name() {
    let base = [
        "train",
        "-m",
        "llama-3.1-8b",
        "--runtime",
        "torchtitan",
        "--precision",
        "amp-bf16",
        "--optimizer",
        "adamw-fused",
        "--gpus",
        "8",
        "--seq",
        "2048",
    ];
    insta::assert_snapshot!(
        "train_torchtitan_float8_rowwise",
        transcript(&[&base[..], &["--float8", "rowwise"]].concat())
    );
    let peak = |extra: &[&str]| {
        let (code, out, err) = run(&[&base[..], extra, &["--json"]].concat());
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        (v["peak_bytes"].as_u64().unwrap(), v["float8"].clone())
    };
    let (bf16, none) = peak(&[]);
    let (rowwise, name) = peak(&["--float8", "rowwise"]);
    let (gw_hp, _) = peak(&["--float8", "rowwise_with_gw_hp"]);
    assert!(none.is_null());
    assert_eq!(name, "rowwise");
    assert!(rowwise > bf16 && gw_hp > bf16, "{bf16} {rowwise} {gw_hp}");
    let refusals = [
        (&["--float8", "tensorwise"][..], "--float8"),
        (
            &["--float8", "rowwise", "--float8-all-gather"][..],
            "--float8-all-gather",
        ),
        (&["--float8-all-gather"][..], "--float8-all-gather"),
        (&["--float8", "rowwise", "--tp", "2"][..], "--tp"),
        (
            &["--float8", "rowwise", "--pp", "2", "--grad-accum", "2"][..],
            "--pp",
        ),
        (
            &["--float8", "rowwise", "--emit", "torchtitan"][..],
            "--float8",
        ),
        (&["--float8", "fp8"][..], "--float8"),
    ];
    let mut transcripts = String::new();
    for (extra, flag) in refusals {
        let (code, _, err) = run(&[&base[..], extra].concat());
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(
            err.contains(flag) && err.contains("hint:"),
            "{extra:?}: {err}"
        );
        transcripts.push_str(&format!("$ … {}\n{err}\n", extra.join(" ")));
    }
    // the transformers runtime, a MoE model and tied embeddings are refused too
    for args in [
        &["train", "-m", "llama-3.1-8b", "--float8", "rowwise"][..],
        &[
            "train",
            "-m",
            "qwen3-30b-a3b",
            "--runtime",
            "torchtitan",
            "--precision",
            "amp-bf16",
            "--gpus",
            "8",
            "--float8",
            "rowwise",
        ][..],
        &[
            "train",
            "-m",
            "qwen3-0.6b",
            "--runtime",
            "torchtitan",
            "--precision",
            "amp-bf16",
            "--gpus",
            "8",
            "--float8",
            "rowwise",
        ][..],
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("--float8") && err.contains("hint:"),
            "{args:?}: {err}"
        );
        transcripts.push_str(&format!("$ {}\n{err}\n", args.join(" ")));
    }
    insta::assert_snapshot!("train_torchtitan_float8_refusals", transcripts);
}

/// `--runtime torchtitan`: the profile names itself, plan emits torchtitan's launch with its
/// own reshard policy and AC subcommand, and what it does not simulate exits 2 naming the flag.
#[test]
fn the_torchtitan_runtime_estimates_plans_and_refuses_by_name() {
    let base = [
        "train",
        "-m",
        "llama-3.1-8b",
        "--runtime",
        "torchtitan",
        "--precision",
        "amp-bf16",
        "--gpus",
        "8",
    ];
    let (code, out, err) = run(&[
        &base[..],
        &["--checkpointing-policy", "selective-op", "--json"],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["runtime_profile"], "torchtitan");
    let (code, out, _) = run(&base);
    assert_eq!(code, 0);
    assert!(out.contains("(runtime profile: torchtitan)"), "{out}");
    assert!(out.contains("attention flex (torchtitan)"), "{out}");
    // torchtitan's tensor parallelism runs with its sequence parallelism (its default), and
    // the emitted job says both
    let (code, out, err) = run(&[&base[..], &["--tp", "2", "--seq", "4096"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("tp 2 + sp") && out.contains("dp_shard 4 × tp 2"),
        "{out}"
    );
    let (code, out, err) = run(&[
        &base[..],
        &["--tp", "4", "--seq", "4096", "--emit", "torchtitan"],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    for line in [
        "--parallelism.tensor-parallel-degree 4",
        "--parallelism.data-parallel-shard-degree 2",
        "--parallelism.enable-sequence-parallel",
        "--training.disable-cuda-graphs",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
    // torchtitan's pipeline parallelism: -b = pipeline_parallel_microbatch_size, --grad-accum
    // = microbatches per step; one group per pp rank; the emitter writes torchtitan's PP keys
    let (code, out, err) = run(&[
        &base[..],
        &[
            "--pp",
            "2",
            "--schedule",
            "interleaved",
            "--virtual-stages",
            "2",
            "--grad-accum",
            "4",
            "--seq",
            "1024",
            "--emit",
            "torchtitan",
        ],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    for line in [
        "--training.local-batch-size 4",
        "--parallelism.data-parallel-shard-degree 4",
        "--parallelism.pipeline-parallel-degree 2",
        "--parallelism.pipeline-parallel-schedule Interleaved1F1B",
        "--parallelism.pipeline-parallel-microbatch-size 1",
        "--parallelism.fsdp-reshard-after-forward default",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
    let (code, out, err) = run(&[&base[..], &["--pp", "2", "--grad-accum", "2"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("pp rank 1 (stage 1"), "{out}");
    // PP with TP + SP (measured on pp × dp_shard × tp meshes): one group per pp rank over its
    // dp_shard × tp ranks; the emitted launch writes both degrees and dp_shard = gpus / (pp · tp)
    let (code, out, err) = run(&[
        &base[..],
        &[
            "--pp",
            "2",
            "--tp",
            "2",
            "--grad-accum",
            "4",
            "--seq",
            "2048",
        ],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("pp rank 1 (stage 1, dp_shard 2 × tp 2 ranks)") && out.contains("tp 2 + sp"),
        "{out}"
    );
    let (code, out, err) = run(&[
        &base[..],
        &[
            "--pp",
            "2",
            "--tp",
            "2",
            "--grad-accum",
            "4",
            "--seq",
            "2048",
            "--emit",
            "torchtitan",
        ],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    for line in [
        "--parallelism.data-parallel-shard-degree 2",
        "--parallelism.tensor-parallel-degree 2",
        "--parallelism.enable-sequence-parallel",
        "--parallelism.pipeline-parallel-degree 2",
        "--training.local-batch-size 4",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
    // every-k:K under PP runs (measured: each rank counts its own blocks)
    let (code, out, err) = run(&[
        &base[..],
        &[
            "--pp",
            "2",
            "--grad-accum",
            "2",
            "--checkpointing-policy",
            "every-k:2",
        ],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("pp rank 1 (stage 1"), "{out}");
    for (extra, flag) in [
        (&["--pp", "2"][..], "grad-accum"),
        // PP with TP runs on dp_shard ≥ 2 (measured); dp_shard 1 is not measured
        (&["--pp", "2", "--grad-accum", "2", "--tp", "4"][..], "gpus"),
        (&["--pp", "8", "--grad-accum", "8"][..], "gpus"),
        (
            &[
                "--pp",
                "2",
                "--grad-accum",
                "2",
                "--schedule",
                "interleaved",
            ][..],
            "virtual",
        ),
        (&["--cp", "2"][..], "--cp 2"),
        (&["--sequence-parallel"][..], "--sequence-parallel"),
        (&["--tp", "2", "--seq", "4095"][..], "--seq"),
        (&["--strategy", "zero3"][..], "--strategy `zero3`"),
        (
            &["--lora-rank", "8", "--lora-targets", "q_proj"][..],
            "--lora-rank",
        ),
        (&["--loss", "fused-linear"][..], "--loss `fused-linear`"),
        (
            &["--checkpointing-policy", "selective-attn"][..],
            "selective-attn",
        ),
    ] {
        let (code, _, err) = run(&[&base[..], extra].concat());
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(
            err.contains(flag) && err.contains("hint:"),
            "{extra:?}: {err}"
        );
    }
    let (code, _, err) = run(&[
        "train",
        "-m",
        "qwen2.5-7b",
        "--runtime",
        "torchtitan",
        "--precision",
        "amp-bf16",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("model_type") && err.contains("torchtitan 0.3.0"),
        "{err}"
    );
    // op-level SAC is also modelled on the transformers step (`memory/hf/sac.rs`), but not on
    // a Megatron-LM layout, whose formula knows full recomputation only.
    let (code, _, err) = run(&["train", "--checkpointing-policy", "selective-op"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&[
        "train",
        "-m",
        "llama-3.1-8b",
        "--gpus",
        "8",
        "--tp",
        "2",
        "--checkpointing-policy",
        "selective-op",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("selective-op") && err.contains("hint:"),
        "{err}"
    );
    let (code, _, err) = run(&[
        "doctor",
        "--runtime",
        "torchtitan",
        "--precision",
        "amp-bf16",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--runtime torchtitan"), "{err}");
    let (code, out, err) = run(&[
        "plan",
        "-m",
        "llama-3.1-8b",
        "--runtime",
        "torchtitan",
        "--gpus",
        "8",
        "--global-batch",
        "16",
        "--checkpointing-policy",
        "selective-op",
        "--emit",
        "torchtitan",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("--runtime torchtitan"), "{out}");
    assert!(
        out.contains("--parallelism.fsdp-reshard-after-forward default")
            || out.contains("--parallelism.fsdp-reshard-after-forward never"),
        "{out}"
    );
}

/// `--runtime torchtitan` on DeepSeek-V3: torchtitan's deepseek_v3 (MLA, three dense blocks,
/// MoE blocks with a shared expert; `titan-dsv3-*` in tests/truth/titan.jsonl) on 256 GPUs,
/// one expert per FSDP rank; the catalogue's fp8 checkpoint trains (torchtitan's state-dict
/// adapter dequantises it), and what was not measured exits 2 naming the flag.
#[test]
fn the_torchtitan_runtime_runs_deepseek_v3_on_256_gpus_and_refuses_by_name() {
    let base = [
        "train",
        "-m",
        "deepseek-v3",
        "--runtime",
        "torchtitan",
        "--precision",
        "amp-bf16",
    ];
    let (code, out, err) = run(&[
        &base[..],
        &[
            "--gpus",
            "256",
            "--checkpointing-policy",
            "full",
            "--seq",
            "4096",
            "--json",
        ],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["runtime_profile"], "torchtitan");
    let with_ac = v["peak_bytes"].as_u64().unwrap();
    let (code, out, err) =
        run(&[&base[..], &["--gpus", "256", "--seq", "4096", "--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let no_ac = v["peak_bytes"].as_u64().unwrap();
    assert!(no_ac > with_ac);
    // "never" resharding (fsdp-grad-op) keeps every block gathered: never less
    let (code, out, err) = run(&[
        &base[..],
        &[
            "--gpus",
            "256",
            "--seq",
            "4096",
            "--strategy",
            "fsdp-grad-op",
            "--json",
        ],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["peak_bytes"].as_u64().unwrap() >= no_ac);
    for (extra, flag) in [
        (&["--gpus", "256", "--tp", "2"][..], "--tp"),
        (&["--gpus", "256", "--pp", "2", "--grad-accum", "2"], "--pp"),
        (
            &["--gpus", "256", "--checkpointing-policy", "selective-op"],
            "--checkpointing-policy",
        ),
        // expert parallelism: with SelectiveAC (not measured), an `ep` that does not divide
        // the 256 experts, or with TP
        (
            &[
                "--gpus",
                "256",
                "--ep",
                "8",
                "--checkpointing-policy",
                "selective-op",
            ],
            "--checkpointing-policy",
        ),
        (&["--gpus", "240", "--ep", "3"], "--ep"),
        (&["--gpus", "256", "--ep", "8", "--tp", "2"], "--tp"),
        // more FSDP ranks than its 256 experts
        (&["--gpus", "512"], "--gpus"),
    ] {
        let (code, _, err) = run(&[&base[..], extra].concat());
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(
            err.contains(flag) && err.contains("hint:"),
            "{extra:?}: {err}"
        );
    }
    // expert parallelism (torchtitan's `expert_parallel_degree`, carved out of dp_shard): each
    // rank gathers `256 / 8` experts per MoE block instead of 256, so the peak drops; the
    // estimate names its balanced-routing assumption
    let (code, out, err) = run(&[
        &base[..],
        &["--gpus", "256", "--ep", "8", "--seq", "4096", "--json"],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let with_ep = v["peak_bytes"].as_u64().unwrap();
    assert!(with_ep < no_ac, "{with_ep} vs {no_ac}");
    assert!(out.contains("balanced routing assumed"), "{out}");
    // a dense model has no experts to shard
    let (code, _, err) = run(&[
        "train",
        "-m",
        "llama-3.1-8b",
        "--runtime",
        "torchtitan",
        "--precision",
        "amp-bf16",
        "--gpus",
        "8",
        "--ep",
        "2",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("ep") && err.contains("hint:"), "{err}");
    // torchtitan's shipped deepseek_v3 configs run EP: no launch is written for them
    let (code, _, err) = run(&[&base[..], &["--gpus", "256", "--emit", "torchtitan"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("deepseek_v3_671b") && err.contains("hint:"),
        "{err}"
    );
    // the hf profile still refuses to fine-tune the fp8 checkpoint (transformers does)
    let (code, _, err) = run(&["train", "-m", "deepseek-v3", "--gpus", "256"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("quantised"), "{err}");
}

/// `--runtime torchtitan --strategy hsdp`: torchtitan's HSDP (`data_parallel_replicate_degree`
/// = gpus / gpus-per-node over `data_parallel_shard_degree` = gpus-per-node) holds the FSDP2
/// step of one shard group (measured: the all-reduce runs in place on the gradient shards);
/// the emitted launch writes both degrees; HSDP with TP or PP exits 2 naming the flag.
#[test]
fn the_torchtitan_runtime_runs_hsdp_across_nodes() {
    let titan = |extra: &[&str]| {
        run(&[
            &[
                "train",
                "-m",
                "llama-3.1-8b",
                "--runtime",
                "torchtitan",
                "--precision",
                "amp-bf16",
                "--seq",
                "2048",
            ][..],
            extra,
        ]
        .concat())
    };
    let peak = |extra: &[&str]| {
        let (code, out, err) = titan(&[extra, &["--json"]].concat());
        assert_eq!(code, 0, "{extra:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["peak_bytes"].as_u64().unwrap()
    };
    let hsdp = peak(&["--strategy", "hsdp", "--gpus", "32", "--gpus-per-node", "8"]);
    assert_eq!(hsdp, peak(&["--gpus", "8"]));
    assert_ne!(hsdp, peak(&["--gpus", "32"]));
    let (code, out, err) = titan(&["--strategy", "hsdp", "--gpus", "16", "--gpus-per-node", "8"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("all 16 ranks (a dp_replicate 2 × dp_shard 8 mesh)"),
        "{out}"
    );
    let (code, out, err) = titan(&[
        "--strategy",
        "hsdp",
        "--gpus",
        "16",
        "--gpus-per-node",
        "8",
        "--emit",
        "torchtitan",
    ]);
    assert_eq!(code, 0, "{err}");
    for line in [
        "--parallelism.data-parallel-replicate-degree 2",
        "--parallelism.data-parallel-shard-degree 8",
        "--parallelism.fsdp-reshard-after-forward default",
        "--nnodes 2 --nproc-per-node 8",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
    let mut transcripts = String::new();
    for (extra, flag) in [
        (&["--tp", "2"][..], "--tp `2`"),
        (&["--pp", "2", "--grad-accum", "2"][..], "--pp `2`"),
    ] {
        let args = [
            &["--strategy", "hsdp", "--gpus", "16", "--gpus-per-node", "8"][..],
            extra,
        ]
        .concat();
        let (code, _, err) = titan(&args);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(
            err.contains(flag) && err.contains("HSDP") && err.contains("hint:"),
            "{extra:?}: {err}"
        );
        transcripts.push_str(&format!("$ … {}\n{err}\n", args.join(" ")));
    }
    insta::assert_snapshot!("train_torchtitan_hsdp_refusals", transcripts);
}

/// `--runtime torchtitan` on Qwen 3: the dense models (tied or not) run torchtitan's own qwen3 model;
/// the emitted launch names the config torchtitan ships for exactly these shapes, and refuses
/// one it has none for instead of writing a wrong flavour; Qwen 3 MoE runs torchtitan's MoE
/// blocks; untied Qwen 3 (dense, MoE) runs torchtitan's pipeline parallelism and emits its PP
/// keys; SelectiveAC and "never" resharding on MoE blocks run; what is not measured (MoE with
/// TP or more FSDP ranks than experts) or torchtitan refuses (a tied model under PP) exits 2
/// naming the field.
#[test]
fn the_torchtitan_runtime_runs_dense_qwen3() {
    let titan = |model: &str, extra: &[&str]| {
        run(&[
            &[
                "train",
                "-m",
                model,
                "--runtime",
                "torchtitan",
                "--precision",
                "amp-bf16",
                "--gpus",
                "8",
            ][..],
            extra,
        ]
        .concat())
    };
    let (code, out, err) = titan("qwen3-14b", &["--tp", "2", "--emit", "torchtitan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("--module qwen3 --config qwen3_14b")
            && out.contains("torchtitan's own qwen3 step"),
        "{out}"
    );
    let (code, _, err) = titan("qwen3-32b", &["--checkpointing-policy", "selective-op"]);
    assert_eq!(code, 0, "{err}");
    // Qwen3-8B runs (torchtitan has its flavour) but 0.3.0 ships no plain training config for it
    let (code, _, err) = titan("qwen3-8b", &[]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = titan("qwen3-8b", &["--emit", "torchtitan"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("ships no config") && err.contains("hint:"),
        "{err}"
    );
    // tied embeddings (Qwen3-0.6B / 1.7B): one FSDP unit `[tok_embeddings, norm, lm_head]`,
    // emitted with torchtitan's shipped `qwen3_0_6b` / `qwen3_1_7b`
    let (code, out, err) = titan("qwen3-0.6b", &["--emit", "torchtitan"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("--module qwen3 --config qwen3_0_6b"), "{out}");
    let (code, out, err) = titan("qwen3-1.7b", &["--tp", "2", "--emit", "torchtitan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("--module qwen3 --config qwen3_1_7b")
            && out.contains("--parallelism.tensor-parallel-degree 2"),
        "{out}"
    );
    // Qwen 3 MoE: torchtitan's MoE blocks (EP 1), emitted with its shipped config
    let (code, out, err) = titan("qwen3-30b-a3b", &["--emit", "torchtitan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("--module qwen3 --config qwen3_30b_a3b")
            && out.contains("--parallelism.expert-parallel-degree 1"),
        "{out}"
    );
    // and with torchtitan's expert parallelism: the degree is written, with the estimate's
    // balanced-routing assumption in the header
    let (code, out, err) = titan("qwen3-30b-a3b", &["--ep", "2", "--emit", "torchtitan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("--parallelism.expert-parallel-degree 2") && out.contains("balanced routing"),
        "{out}"
    );
    // dense Qwen 3 under torchtitan's pipeline parallelism (tests/truth/titan_pp.jsonl): one
    // group per pp rank, and the launch names the shipped config with the PP keys
    let (code, out, err) = titan(
        "qwen3-14b",
        &[
            "--pp",
            "2",
            "--schedule",
            "interleaved",
            "--virtual-stages",
            "2",
            "--grad-accum",
            "4",
            "--seq",
            "1024",
            "--emit",
            "torchtitan",
        ],
    );
    assert_eq!(code, 0, "{err}");
    for line in [
        "--module qwen3 --config qwen3_14b",
        "--parallelism.pipeline-parallel-degree 2",
        "--parallelism.pipeline-parallel-schedule Interleaved1F1B",
        "--parallelism.data-parallel-shard-degree 4",
        "--training.local-batch-size 4",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
    for model in ["qwen3-8b", "qwen3-30b-a3b"] {
        let (code, out, err) = titan(model, &["--pp", "2", "--grad-accum", "2"]);
        assert_eq!(code, 0, "{model}: {err}");
        assert!(out.contains("pp rank 1 (stage 1"), "{model}: {out}");
    }
    // torchtitan's default SelectiveAC on the MoE blocks (measured, with and without PP), and
    // every-k:K under PP (measured on Llama 3 and Qwen 3)
    for (model, policy, extra) in [
        ("qwen3-30b-a3b", "selective-op", &[][..]),
        (
            "qwen3-30b-a3b",
            "selective-op",
            &["--pp", "2", "--grad-accum", "2"][..],
        ),
        (
            "qwen3-8b",
            "every-k:2",
            &["--pp", "2", "--grad-accum", "2"][..],
        ),
    ] {
        let args = [&["--checkpointing-policy", policy][..], extra].concat();
        let (code, _, err) = titan(model, &args);
        assert_eq!(code, 0, "{model} {policy} {extra:?}: {err}");
    }
    for (model, extra, field) in [
        // torchtitan refuses weight tying under PP (models/common/decoder.py)
        (
            "qwen3-0.6b",
            &["--pp", "2", "--grad-accum", "2"][..],
            "Weight tying is not supported with Pipeline Parallel",
        ),
        ("qwen3-30b-a3b", &["--tp", "2"][..], "--tp"),
    ] {
        let (code, _, err) = titan(model, extra);
        assert_eq!(code, 2, "{model}: {err}");
        assert!(
            err.contains(field) && err.contains("torchtitan 0.3.0") && err.contains("hint:"),
            "{model}: {err}"
        );
    }
}

/// `--image-tokens N` on qwen2_vl: the report names N, and the vision tower's forward and the
/// merge add to the forward phase (the tower is frozen: nothing of it outlives the forward).
#[test]
fn image_tokens_simulate_the_vision_forward() {
    let peaks = |extra: &[&str]| -> (u64, u64, serde_json::Value) {
        let mut args = vec![
            "infer",
            "--model",
            "qwen2-vl-7b-instruct",
            "--prompt",
            "1152",
            "--new-tokens",
            "2",
            "--attention",
            "eager",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        let peak = v["peak_bytes"].as_u64().expect("peak");
        let vision = v["model"]["vision"].clone();
        (peak, vision["image_tokens"].as_u64().unwrap_or(0), vision)
    };
    let (text, n0, v0) = peaks(&[]);
    let (image, n, v) = peaks(&["--image-tokens", "1024"]);
    assert_eq!(n0, 0);
    assert_eq!(n, 1024);
    assert!(image > text, "{image} vs {text}");
    assert!(v0["assumption"]
        .as_str()
        .is_some_and(|a| a.contains("counted as text")));
    assert!(v["assumption"]
        .as_str()
        .is_some_and(|a| a.starts_with("1024 of each sequence's tokens")));
}

/// `--image-tokens N` on qwen2_vl and qwen2_5_vl with `--checkpointing`: the tower's patch
/// embeddings require grad (enable_input_require_grads), so its checkpointed blocks are
/// recomputed and run a backward after the text's: the tower-dominated step peaks in the
/// backward, above the same step without checkpointing (whose peak is the tower's forward;
/// measured 770,796,596 B against 516,699,052 B for Qwen2-VL).
#[test]
fn qwen_image_tokens_under_checkpointing_run_the_towers_backward() {
    for config in [
        "tests/truth/configs/qwen2-vl-xc-small.json",
        "tests/truth/configs/qwen2.5-vl-xc-small.json",
    ] {
        let peak = |extra: &[&str]| -> (u64, String) {
            let mut args = vec![
                "train",
                "--model",
                config,
                "--seq",
                "1100",
                "--batch",
                "2",
                "--image-tokens",
                "1024",
                "--optimizer",
                "sgd",
                "--json",
            ];
            args.extend_from_slice(extra);
            let (code, out, err) = run(&args);
            assert_eq!(code, 0, "{config}: {err}");
            let v: serde_json::Value = serde_json::from_str(&out).expect("json");
            (
                v["peak_bytes"].as_u64().expect("peak"),
                v["phase"].as_str().unwrap_or_default().to_string(),
            )
        };
        let (plain, plain_phase) = peak(&[]);
        let (ckpt, ckpt_phase) = peak(&["--checkpointing"]);
        assert_eq!(plain_phase, "forward", "{config}");
        assert_eq!(ckpt_phase, "backward", "{config}");
        assert!(ckpt > plain + plain / 3, "{config}: {ckpt} vs {plain}");
    }
}

/// `--image-tokens N` on gemma3: N / 256 images of 896² pixels run through the SigLIP tower;
/// the report says how many images, and a second image adds its tower forward (eager: the
/// attention weights of 4,096 patches dominate the forward).
#[test]
fn gemma3_image_tokens_simulate_whole_images() {
    let peak = |extra: &[&str]| -> (u64, serde_json::Value) {
        let mut args = vec![
            "infer",
            "--model",
            "tests/truth/configs/gemma-3-4b-2l-v2.json",
            "--prompt",
            "768",
            "--new-tokens",
            "2",
            "--attention",
            "eager",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        (
            v["peak_bytes"].as_u64().expect("peak"),
            v["model"]["vision"].clone(),
        )
    };
    let (text, _) = peak(&[]);
    let (one, v1) = peak(&["--image-tokens", "256"]);
    let (two, v2) = peak(&["--image-tokens", "512"]);
    assert!(text < one && one < two, "{text} {one} {two}");
    // eager SigLIP attention: [images, 16 heads, 4096, 4096] weights, fp32 softmax included
    assert!(two - one > 16 * 4096 * 4096 * 4, "{one} {two}");
    assert!(v1["assumption"]
        .as_str()
        .is_some_and(|a| a.contains("1 image(s) of 256 tokens")));
    assert!(v2["assumption"]
        .as_str()
        .is_some_and(|a| a.contains("2 image(s) of 256 tokens")));
}

/// `--image-tokens N` on mistral3: one image of the most nearly square grid of N tokens runs
/// through the Pixtral tower; the batch's images are one sequence under a block mask, so eager
/// attention weights grow with the square of the batch's patches.
#[test]
fn mistral3_image_tokens_simulate_one_image_per_sequence() {
    let peak = |extra: &[&str]| -> (u64, serde_json::Value) {
        let mut args = vec![
            "infer",
            "--model",
            "tests/truth/configs/mistral-small-3.1-24b-1l-v2.json",
            "--prompt",
            "1152",
            "--new-tokens",
            "2",
            "--attention",
            "eager",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        (
            v["peak_bytes"].as_u64().expect("peak"),
            v["model"]["vision"].clone(),
        )
    };
    let (text, _) = peak(&[]);
    let (small, _) = peak(&["--image-tokens", "256"]);
    let (big, v) = peak(&["--image-tokens", "1024"]);
    assert!(text < small && small < big, "{text} {small} {big}");
    // 1,024 tokens are 4,096 patches: [1, 16, 4096, 4096] eager weights, the fp32 softmax and
    // its fp32 input alive at once (measured: vlm-mistral3-1l-img1024-eager, 2.3 GB over the
    // text-only prefill's peak)
    assert!(big - text > 16 * 4096 * 4096 * (4 + 4), "{text} {big}");
    assert!(v["assumption"].as_str().is_some_and(
        |a| a.starts_with("1024 of each sequence's tokens (--seq/--prompt) are one image's tokens")
    ));
}

/// `--image-tokens N` on llama4: N / 144 tiles of 336 px run through the tower as one batch
/// of [tiles, 577, 1408]; eager attention holds [tiles, 16, 577, 577] weights (the matmul's
/// scaled copy, then the softmax in the model dtype, two at a time).
#[test]
fn llama4_image_tokens_simulate_tiles() {
    let peak = |extra: &[&str]| -> (u64, serde_json::Value) {
        let mut args = vec![
            "infer",
            "--model",
            "tests/truth/configs/llama4-xc-small.json",
            "--prompt",
            "2560",
            "--new-tokens",
            "2",
            "--attention",
            "eager",
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        (
            v["peak_bytes"].as_u64().expect("peak"),
            v["model"]["vision"].clone(),
        )
    };
    let (text, _) = peak(&[]);
    let (one, _) = peak(&["--image-tokens", "144"]);
    let (big, v) = peak(&["--image-tokens", "2448"]);
    assert!(text < one && one < big, "{text} {one} {big}");
    // 17 tiles: two [17, 16, 577, 577] bf16 tensors at once (measured:
    // vlm-l4xc-img2448-b2-eager, the tower's forward sets the prefill's peak)
    assert!(big - text > 2 * 17 * 16 * 577 * 577 * 2, "{text} {big}");
    assert!(v["assumption"].as_str().is_some_and(|a| a.starts_with(
        "2448 of each sequence's tokens (--seq/--prompt) are the <|patch|> tokens of 17 image tile(s) of 144 tokens"
    )));
}

/// Flags whose mechanism an engine does not run are refused by name, never accepted with an
/// unchanged estimate: `--use-cache` and `--activation-offload` off the transformers step,
/// a vision-language model on a Megatron-LM layout (its formula has no vision tower).
#[test]
fn flags_an_engine_does_not_run_are_refused_not_ignored() {
    let titan = [
        "train",
        "-m",
        "llama-3.1-8b",
        "--runtime",
        "torchtitan",
        "--precision",
        "amp-bf16",
        "--gpus",
        "8",
    ];
    let megatron = ["train", "-m", "llama-3.1-8b", "--gpus", "8", "--tp", "2"];
    let fsdp = [
        "train",
        "-m",
        "llama-3.1-8b",
        "--gpus",
        "8",
        "--strategy",
        "fsdp-full",
    ];
    for (base, extra, flag) in [
        (&titan[..], &["--use-cache", "false"][..], "--use-cache"),
        (
            &titan[..],
            &["--activation-offload"][..],
            "--activation-offload",
        ),
        (&megatron[..], &["--use-cache", "false"][..], "--use-cache"),
        (
            &megatron[..],
            &["--activation-offload"][..],
            "--activation-offload",
        ),
        (
            &fsdp[..],
            &["--activation-offload"][..],
            "--activation-offload",
        ),
    ] {
        let (code, out, err) = run(&[base, extra].concat());
        assert_eq!(code, 2, "{extra:?}: {out}");
        assert!(err.contains(flag) && err.contains("hint:"), "{err}");
    }
    // a pure state-space model runs no attention kernel and keeps no KV cache
    for args in [
        &["infer", "-m", "mamba-2.8b", "--kv-dtype", "fp8"][..],
        &["infer", "-m", "mamba-2.8b", "--attention", "eager"][..],
        &["train", "-m", "mamba-2.8b", "--attention", "flash"][..],
        &["serve", "-m", "mamba-2.8b", "--kv-cache-dtype", "fp8"][..],
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}");
        assert!(err.contains(args[3]) && err.contains("hint:"), "{err}");
    }
    // plan tries LoRA only under --allow lora/qlora, so its LoRA flags need it
    let plan = [
        "plan",
        "-m",
        "llama-3.1-8b",
        "--gpus",
        "16",
        "--global-batch",
        "64",
    ];
    let (code, _, err) = run(&[&plan[..], &["--lora-rank", "8"]].concat());
    assert_eq!(code, 2);
    assert!(
        err.contains("--lora-rank") && err.contains("--allow lora"),
        "{err}"
    );
    let (code, out, err) = run(&[&plan[..], &["--lora-rank", "8", "--allow", "lora"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("--lora-rank 8"), "{out}");
    // a node size means nothing to a one-GPU job
    let (code, _, err) = run(&["train", "-m", "gpt2", "--gpus-per-node", "4"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--gpus-per-node") && err.contains("hint:"),
        "{err}"
    );
    // the transformers engines accept --use-cache
    let (code, _, err) = run(&[&fsdp[..], &["--use-cache", "false"]].concat());
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&[
        "train",
        "-m",
        "qwen2-vl-7b-instruct",
        "--gpus",
        "8",
        "--tp",
        "2",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("qwen2_vl") && err.contains("vision") && err.contains("hint:"),
        "{err}"
    );
}

/// Autocast over Mamba-2 scans is estimated (measured forms: `Mamba2Mixer`'s 16-bit projections
/// at 1 or more chunks, Falcon-H1's fp32 `zxbcdt` at one chunk too; `ssm.rs`
/// `Scan::saved_amp16`, `Scan::saved_amp`), on one GPU and sharded, and differs from bf16.
#[test]
fn autocast_over_mamba2_scans_is_estimated() {
    let peak = |args: &[&str]| -> u64 {
        let (code, out, err) = run(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        v["peak_bytes"].as_u64().expect("peak_bytes")
    };
    let amp = peak(&[
        "train",
        "-m",
        "mamba-codestral-7b",
        "--precision",
        "amp-bf16",
        "-b",
        "8",
        "-s",
        "300",
        "--format",
        "json",
    ]);
    let bf16 = peak(&[
        "train",
        "-m",
        "mamba-codestral-7b",
        "--precision",
        "bf16",
        "-b",
        "8",
        "-s",
        "300",
        "--format",
        "json",
    ]);
    assert_ne!(amp, bf16);
    for args in [
        &[
            "train",
            "-m",
            "mamba-codestral-7b",
            "--precision",
            "bf16",
            "--seq",
            "100",
        ][..],
        &[
            "train",
            "-m",
            "falcon-h1-0.5b-instruct",
            "--precision",
            "amp-bf16",
            "--seq",
            "129",
        ][..],
        &[
            "train",
            "-m",
            "falcon-h1-0.5b-instruct",
            "--precision",
            "amp-bf16",
            "--seq",
            "128",
        ][..],
        &[
            "train",
            "-m",
            "mamba-codestral-7b",
            "--precision",
            "amp-fp16",
            "--gpus",
            "8",
            "--strategy",
            "fsdp-full",
        ][..],
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, 0, "{args:?}: {err}");
    }
}

/// `--no-dropout` reaches the Megatron-LM formula: GPT-2 (dropout 0.1) keeps its 1-byte
/// masks with dropout on and none without (`--attention-dropout 0 --hidden-dropout 0`).
#[test]
fn no_dropout_drops_the_megatron_dropout_masks() {
    let peak = |extra: &[&str]| -> u64 {
        let (code, out, err) = run(&[
            &["train", "-m", "gpt2", "--gpus", "8", "--tp", "2", "--json"][..],
            extra,
        ]
        .concat());
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["peak_bytes"].as_u64().unwrap()
    };
    assert!(peak(&["--no-dropout"]) < peak(&[]));
}

/// A training forward with `use_cache` on puts every Mamba-2 layer's state into the model's
/// `DynamicCache` (Granite 4.0-H, Falcon-H1; `Mamba2Model` turns `use_cache` off in training):
/// at Granite 4.0-H micro's 5th Mamba layer, 32 × 16 tokens, the four earlier layers' conv
/// states `[32, 4352, 4]` bf16 and SSM states `[32, 64, 64, 128]` fp32 and this layer's conv
/// state are alive at its scan's peak (measured `ghmicro-6l-b32-s16`).
#[test]
fn mamba2_state_in_the_training_cache() {
    let peak = |model: &str, cache: &str| -> u64 {
        let (code, out, err) = run(&[
            "train",
            "--model",
            model,
            "-b",
            "32",
            "-s",
            "16",
            "--use-cache",
            cache,
            "--format",
            "json",
        ]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        v["peak_bytes"].as_u64().expect("peak_bytes")
    };
    let granite = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/truth/configs/granite-4.0-h-micro-6l.json"
    );
    let conv = 32 * 4352 * 4 * 2;
    let ssm = 32 * 64 * 64 * 128 * 4;
    assert_eq!(
        peak(granite, "true") - peak(granite, "false"),
        4 * (conv + ssm) + conv
    );
    let codestral = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/truth/configs/mamba-codestral-7b-2l.json"
    );
    assert_eq!(peak(codestral, "true"), peak(codestral, "false"));
}
