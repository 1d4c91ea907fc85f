//! Engines through the CLI: every optimizer with `--tp 2` (Megatron-LM) keeps the states
//! ZeRO keeps per parameter, or is refused by the engine's capability row (issue 9).
#![allow(clippy::unwrap_used, clippy::expect_used)]

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

/// (runtime profile, optimizer-state bytes per parameter) of the worst rank: bf16 weights are
/// 2 bytes per parameter, so states · 2 / weights.
fn states_per_param(args: &[&str]) -> Result<(String, f64), String> {
    let mut all = vec!["train", "-m", "gpt2", "-s", "256", "--json"];
    all.extend_from_slice(args);
    let (code, out, err) = run(&all);
    if code != 0 {
        return Err(err);
    }
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let d = &v["distributed"];
    let g = &d["groups"][d["worst"].as_u64().unwrap() as usize]["at_peak"];
    let states = g["optimizer_states"].as_f64().unwrap();
    let weights = g["weights"].as_f64().unwrap();
    Ok((
        v["runtime_profile"].as_str().unwrap().to_string(),
        states * 2.0 / weights,
    ))
}

#[test]
fn tensor_parallel_optimizer_states_match_zero_or_are_refused() {
    for opt in [
        "adamw",
        "adamw-fused",
        "adamw-forloop",
        "adamw-8bit",
        "sgd",
        "sgd-momentum",
        "adafactor",
        "lion",
    ] {
        let tp = states_per_param(&["--gpus", "8", "--tp", "2", "--optimizer", opt]);
        let zero = states_per_param(&["--gpus", "1", "--strategy", "zero1", "--optimizer", opt]);
        match (tp, zero) {
            (Ok((mp, m)), Ok((zp, z))) => {
                assert_eq!((mp.as_str(), zp.as_str()), ("megatron", "deepspeed"));
                assert_eq!(m, z, "{opt}: {m} B/param with --tp 2, {z} with zero1");
            }
            (Err(tp), Err(zero)) => {
                // refused by both capability rows, naming the engine and the optimizer
                for (err, engine) in [(tp, "Megatron-LM"), (zero, "DeepSpeed ZeRO-1")] {
                    assert!(
                        err.contains(&format!("{engine} does not support --optimizer `{opt}`")),
                        "{opt}: {err}"
                    );
                }
            }
            (tp, zero) => panic!("{opt}: --tp 2 {tp:?} but zero1 {zero:?}"),
        }
    }
}
