//! `memwall plan` and `memwall doctor` through the CLI: the JSON contracts other tooling reads,
//! the seeds' scenarios, and that every plan and every fix reproduces with `memwall train`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde::Deserialize;
use std::path::PathBuf;
use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .output()
        .expect("run memwall");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[derive(Debug, Deserialize)]
struct PlanJson {
    plans: Vec<PlanRowJson>,
    candidates_evaluated: u64,
    search_space: serde_json::Value,
}

#[derive(Debug, Deserialize)]
struct PlanRowJson {
    rank: usize,
    fits: bool,
    peak_bytes: u64,
    headroom_bytes: i64,
    step_s: f64,
    tokens_per_s_per_gpu: f64,
    layout: Option<serde_json::Value>,
    micro_batch: u64,
    grad_accum: u64,
    checkpointing: bool,
    precision: String,
    optimizer: String,
    changes_result: Vec<String>,
    train_args: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct DoctorJson {
    fits: bool,
    fixed: bool,
    steps: Vec<DoctorStepJson>,
}

#[derive(Debug, Deserialize)]
struct DoctorStepJson {
    change: String,
    train_args: Option<Vec<String>>,
    infer_args: Option<Vec<String>>,
    peak_bytes: u64,
    fits: bool,
    step_s: Option<f64>,
}

/// The worst rank's peak and the fit verdict `memwall train` gives for `args`.
fn train_peak(args: &[String]) -> (u64, bool) {
    let mut a: Vec<&str> = vec!["train", "--json"];
    a.extend(args.iter().map(String::as_str));
    let (code, out, err) = run(&a);
    assert_eq!(code, 0, "{a:?}: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    (
        v["peak_bytes"].as_u64().unwrap(),
        v["gpu"]["fits"].as_bool().unwrap(),
    )
}

#[test]
fn seventy_b_on_eight_a100s_plans_fit_and_reproduce() {
    let (code, out, err) = run(&[
        "plan",
        "-m",
        "llama-3-70b",
        "--gpu",
        "a100-80gb-sxm",
        "--gpus",
        "8",
        "--seq",
        "2048",
        "--global-batch",
        "32",
        "--allow",
        "offload,lora,qlora",
        "--top",
        "4",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: PlanJson = serde_json::from_str(&out).unwrap();
    assert!(!j.plans.is_empty() && j.candidates_evaluated > 0);
    assert!(j.search_space["layouts"].as_u64().unwrap() > 1);
    for w in j.plans.windows(2) {
        assert!(w[0].tokens_per_s_per_gpu >= w[1].tokens_per_s_per_gpu);
        assert_eq!(w[0].rank + 1, w[1].rank);
    }
    for p in &j.plans {
        assert!(p.fits && p.headroom_bytes >= 0 && p.step_s > 0.0);
        let dp = p.layout.as_ref().map_or(1, |l| {
            l["gpus"].as_u64().unwrap()
                / (l["tp"].as_u64().unwrap()
                    * l["pp"].as_u64().unwrap()
                    * l["cp"].as_u64().unwrap())
        });
        assert_eq!(p.micro_batch * p.grad_accum * dp, 32);
        assert!(!p.precision.is_empty() && !p.optimizer.is_empty());
        // a 70B full fine-tune cannot fit 8 × 80 GB without offload: LoRA/QLoRA plans say so
        if p.layout.as_ref().is_some_and(|l| l["offload"] == "none") {
            assert!(!p.changes_result.is_empty(), "{p:?}");
        }
        // the train arguments reproduce the plan's peak exactly and it fits there too
        let (peak, fits) = train_peak(&p.train_args);
        assert_eq!(peak, p.peak_bytes, "{:?}", p.train_args);
        assert!(fits);
        let _ = p.checkpointing;
    }
}

#[test]
fn nothing_fits_says_which_allowance_would() {
    let (code, out, err) = run(&[
        "plan",
        "-m",
        "llama-3-70b",
        "--gpu",
        "a100-80gb-sxm",
        "--gpus",
        "8",
        "--global-batch",
        "32",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no configuration fits as asked"), "{out}");
    assert!(out.contains("with --allow lora"), "{out}");
}

#[test]
fn plan_refuses_unknown_allowances_by_name() {
    let (code, _, err) = run(&["plan", "--allow", "fp8"]);
    assert_eq!(code, 2);
    assert!(err.contains("fp8") && err.contains("hint:"), "{err}");
}

#[test]
fn doctor_seven_b_on_40gb_and_80gb_follows_the_order_and_fits() {
    for gpu in ["a100-40gb-sxm", "a100-80gb-sxm"] {
        let (code, out, err) = run(&[
            "doctor",
            "-m",
            "llama-2-7b",
            "-b",
            "4",
            "-s",
            "2048",
            "--precision",
            "amp-bf16",
            "--gpu",
            gpu,
            "--json",
        ]);
        assert_eq!(code, 0, "{err}");
        let d: DoctorJson = serde_json::from_str(&out).unwrap();
        assert!(!d.fits && d.fixed, "{gpu}: {out}");
        assert!(d.steps[0].change.starts_with("micro-batch"), "{gpu}: {out}");
        assert!(d.steps.last().unwrap().fits);
        for s in &d.steps {
            assert!(s.step_s.is_some_and(|t| t > 0.0) && s.infer_args.is_none());
        }
        // the last fix reproduces with memwall train
        let last = d.steps.last().unwrap();
        let (peak, fits) = train_peak(last.train_args.as_ref().unwrap());
        assert_eq!(peak, last.peak_bytes);
        assert!(fits);
    }
}

#[test]
fn doctor_of_a_fitting_run_has_no_steps() {
    let (code, out, _) = run(&["doctor", "-m", "gpt2", "--json"]);
    assert_eq!(code, 0);
    let d: DoctorJson = serde_json::from_str(&out).unwrap();
    assert!(d.fits && d.steps.is_empty());
}

#[test]
fn inference_doctor_steps_are_infer_arguments() {
    let (code, out, err) = run(&[
        "doctor",
        "infer",
        "-m",
        "llama-3.1-70b",
        "-b",
        "16",
        "--prompt",
        "8192",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let d: DoctorJson = serde_json::from_str(&out).unwrap();
    assert!(!d.fits && d.fixed);
    assert!(d.steps[0].change.starts_with("batch"));
    for s in &d.steps {
        assert!(s.train_args.is_none() && s.infer_args.is_some() && s.step_s.is_none());
        assert!(s.peak_bytes > 0);
    }
}

#[test]
fn emit_writes_the_estimated_configuration() {
    // to stdout: the files, not the report
    let (code, out, err) = run(&[
        "train",
        "-m",
        "llama-3.1-70b",
        "--gpu",
        "a100-80gb-sxm",
        "--gpus",
        "8",
        "--strategy",
        "zero3",
        "--checkpointing",
        "--offload",
        "optimizer",
        "--emit",
        "deepspeed",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("==> ds_config.json <=="), "{out}");
    assert!(
        out.contains("\"stage\": 3") && out.contains("\"offload_optimizer\""),
        "{out}"
    );
    // into a directory: the files, and the report on stdout
    let dir = std::env::temp_dir().join(format!("memwall-emit-test-{}", std::process::id()));
    let (code, out, err) = run(&[
        "serve",
        "-m",
        "llama-3.1-70b",
        "--tp",
        "4",
        "--emit",
        "vllm",
        "--out",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let _: serde_json::Value = serde_json::from_str(&out).unwrap();
    let yaml = std::fs::read_to_string(dir.join("vllm_config.yaml")).unwrap();
    assert!(yaml.contains("tensor-parallel-size: 4"), "{yaml}");
    assert!(err.contains("wrote "), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    // a plan emits its train arguments' configuration: the fastest plan of an 8B model on
    // 8 H100s is a Megatron layout, so megatron's arguments; an FSDP engine's refuses it by name
    let plan = [
        "plan",
        "-m",
        "llama-3.1-8b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "8",
        "--global-batch",
        "64",
    ];
    let (code, out, err) = run(&[&plan[..], &["--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let j: PlanJson = serde_json::from_str(&out).unwrap();
    let l = j.plans[0].layout.as_ref().unwrap();
    let megatron = l["tp"].as_u64() > Some(1) || l["pp"].as_u64() > Some(1);
    let kind = if megatron { "megatron" } else { "accelerate" };
    let (code, out, err) = run(&[&plan[..], &["--emit", kind]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("==> "), "{out}");
}

#[test]
fn emit_refusals_name_the_problem_and_hint() {
    for args in [
        &[
            "train",
            "--gpus",
            "8",
            "--strategy",
            "fsdp-full",
            "--emit",
            "megatron",
        ][..],
        &["train", "--emit", "vllm"][..],
        &["serve", "--emit", "deepspeed"][..],
        &["doctor", "--emit", "deepspeed"][..],
        &[
            "plan",
            "--gpus",
            "8",
            "--emit",
            "deepspeed",
            "--plan-rank",
            "11",
        ][..],
        &["train", "--out", "x"][..],
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.lines().last().unwrap_or("").starts_with("hint: "),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn plans_keep_the_loop_and_the_checkpointing_policy_and_reproduce() {
    let (code, out, err) = run(&[
        "plan",
        "-m",
        "llama-3.1-8b",
        "--gpus",
        "8",
        "--seq",
        "4096",
        "--global-batch",
        "64",
        "--loop",
        "keep-outputs",
        "--checkpointing-policy",
        "every-k:2",
        "--top",
        "6",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: PlanJson = serde_json::from_str(&out).unwrap();
    assert!(!j.plans.is_empty());
    for p in &j.plans {
        let args = p.train_args.join(" ");
        assert!(args.contains("--loop keep-outputs"), "{args}");
        assert_eq!(
            args.contains("--checkpointing-policy every-k:2"),
            p.checkpointing,
            "{args}"
        );
        assert!(!args.contains("--checkpointing "), "{args}");
        let (peak, _) = train_peak(&p.train_args);
        assert_eq!(peak, p.peak_bytes, "{args}");
    }
}

/// `plan --runtime torchtitan` searches torchtitan's pipeline parallelism (pp 2/4/8 with
/// 1F1B, GPipe and Interleaved1F1B, the pipeline microbatch size): its PP plans keep at least
/// pp microbatches per step and reproduce with `memwall train`.
#[test]
fn torchtitan_plans_search_pipeline_parallelism_and_reproduce() {
    let (code, out, err) = run(&[
        "plan",
        "-m",
        "llama-3.1-8b",
        "--runtime",
        "torchtitan",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "16",
        "--seq",
        "2048",
        "--global-batch",
        "128",
        "--top",
        "40",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: PlanJson = serde_json::from_str(&out).unwrap();
    let pp: Vec<&PlanRowJson> = j
        .plans
        .iter()
        .filter(|p| {
            p.layout
                .as_ref()
                .is_some_and(|l| l["pp"].as_u64().unwrap() > 1)
        })
        .collect();
    assert!(!pp.is_empty(), "no PP plan: {out}");
    let schedules: std::collections::BTreeSet<String> = pp
        .iter()
        .map(|p| p.layout.as_ref().unwrap()["schedule"].to_string())
        .collect();
    assert!(schedules.len() >= 2, "{schedules:?}");
    // PP with TP + SP too (measured: `titan-pptp-*`)
    assert!(
        pp.iter()
            .any(|p| p.layout.as_ref().unwrap()["tp"].as_u64().unwrap() > 1),
        "no PP × TP plan: {out}"
    );
    for p in pp {
        let l = p.layout.as_ref().unwrap();
        let (gpus, degree) = (l["gpus"].as_u64().unwrap(), l["pp"].as_u64().unwrap());
        let tp = l["tp"].as_u64().unwrap();
        assert!(p.grad_accum >= degree, "{p:?}");
        assert_eq!(p.micro_batch * p.grad_accum * (gpus / degree / tp), 128);
        assert!(p.train_args.iter().any(|a| a == "--runtime"));
        let (peak, fits) = train_peak(&p.train_args);
        assert_eq!(peak, p.peak_bytes, "{:?}", p.train_args);
        assert!(fits && p.fits);
    }
}

/// `plan --runtime torchtitan` across nodes searches torchtitan's HSDP (`--strategy hsdp`:
/// replicas across nodes of FSDP2 within a node, measured in `tests/truth/titan.jsonl`); its
/// plans reproduce with `memwall train` and hold the FSDP2 step of one node's shard group.
#[test]
fn torchtitan_plans_search_hsdp_across_nodes_and_reproduce() {
    let (code, out, err) = run(&[
        "plan",
        "-m",
        "llama-3.1-8b",
        "--runtime",
        "torchtitan",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "16",
        "--gpus-per-node",
        "8",
        "--seq",
        "2048",
        "--global-batch",
        "64",
        "--top",
        "40",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let j: PlanJson = serde_json::from_str(&out).unwrap();
    let hsdp: Vec<&PlanRowJson> = j
        .plans
        .iter()
        .filter(|p| p.layout.as_ref().is_some_and(|l| l["strategy"] == "hsdp"))
        .collect();
    assert!(!hsdp.is_empty(), "no HSDP plan: {out}");
    for p in hsdp {
        assert!(p.train_args.windows(2).any(|a| a == ["--strategy", "hsdp"]));
        let (peak, fits) = train_peak(&p.train_args);
        assert_eq!(peak, p.peak_bytes, "{:?}", p.train_args);
        assert!(fits && p.fits);
        // the same step as FSDP2 on one node's 8 ranks with the same micro-batch
        let mut one_node: Vec<String> = p.train_args.clone();
        let at = one_node.iter().position(|a| a == "--strategy").unwrap();
        one_node[at + 1] = "fsdp-full".into();
        let g = one_node.iter().position(|a| a == "--gpus").unwrap();
        one_node[g + 1] = "8".into();
        let (peak8, _) = train_peak(&one_node);
        assert_eq!(peak8, p.peak_bytes, "{one_node:?}");
    }
}
