//! The output contract: every subcommand in every format it takes, a closed pipe as a normal
//! end, write failures as one `error:` line with a `hint:`, and renderers that never panic or
//! print a non-finite number over random valid settings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn memwall() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memwall"));
    c.current_dir(repo());
    c
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = memwall().args(args).output().expect("run memwall");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn transcript(args: &[&str]) -> String {
    let (code, stdout, stderr) = run(args);
    format!("exit: {code}\n--- stdout\n{stdout}--- stderr\n{stderr}")
}

/// One invocation of every subcommand (a distributed train too: its CSV is the rank table).
const COMMANDS: &[(&str, &[&str])] = &[
    ("models", &["models"]),
    ("gpus", &["gpus"]),
    ("inspect", &["inspect", "gemma-2-9b"]),
    (
        "train",
        &[
            "train",
            "--model",
            "qwen2.5-7b",
            "--batch",
            "2",
            "--seq",
            "1024",
        ],
    ),
    (
        "train_dist",
        &[
            "train",
            "--model",
            "llama-3.1-70b",
            "--gpus",
            "16",
            "--tp",
            "4",
            "--pp",
            "2",
            "--gpu",
            "a100-40gb-sxm",
        ],
    ),
    (
        "train_offload",
        &[
            "train",
            "--model",
            "llama-3.1-8b",
            "--gpus",
            "8",
            "--strategy",
            "zero3",
            "--offload",
            "both",
            "--offload-device",
            "nvme",
        ],
    ),
    (
        "infer",
        &[
            "infer",
            "--model",
            "llama-3.1-8b",
            "--batch",
            "4",
            "--weights",
            "nf4",
        ],
    ),
    (
        "serve",
        &[
            "serve",
            "--model",
            "gemma-2-9b",
            "--gpu",
            "l4",
            "--kv-cache-dtype",
            "fp8",
        ],
    ),
    (
        "serve_hybrid",
        &[
            "serve",
            "--model",
            "qwen3-next-80b-a3b-instruct",
            "--tp",
            "4",
        ],
    ),
    (
        "roofline",
        &[
            "roofline", "--model", "gpt2", "--phase", "decode", "--batch", "8",
        ],
    ),
];

/// Subcommands whose report is not a table: CSV is refused.
const NOT_TABULAR: &[&str] = &["train", "infer"];

fn with(args: &[&str], extra: &[&'static str]) -> Vec<String> {
    args.iter().chain(extra).map(|s| (*s).to_owned()).collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn json_parses_and_format_json_is_byte_identical_to_the_json_alias() {
    for (name, args) in COMMANDS {
        let (code, alias, err) = run(&strs(&with(args, &["--json"])));
        assert_eq!(code, 0, "{name}: {err}");
        let (code, format, err) = run(&strs(&with(args, &["--format", "json"])));
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!(alias, format, "{name}");
        let (_, both, _) = run(&strs(&with(args, &["--json", "--format", "json"])));
        assert_eq!(alias, both, "{name}");
        let v: serde_json::Value = serde_json::from_str(&alias).expect(name);
        assert!(v.is_object() || v.is_array(), "{name}");
    }
}

#[test]
fn table_is_the_default_format() {
    for (name, args) in COMMANDS {
        let (code, plain, err) = run(args);
        assert_eq!(code, 0, "{name}: {err}");
        let (_, table, _) = run(&strs(&with(args, &["--format", "table"])));
        assert_eq!(plain, table, "{name}");
    }
}

#[test]
fn markdown_of_every_subcommand() {
    for (name, args) in COMMANDS {
        insta::assert_snapshot!(
            format!("{name}_markdown"),
            transcript(&strs(&with(args, &["--format", "markdown"])))
        );
    }
}

#[test]
fn csv_of_every_tabular_subcommand() {
    for (name, args) in COMMANDS {
        if NOT_TABULAR.contains(name) {
            continue;
        }
        insta::assert_snapshot!(
            format!("{name}_csv"),
            transcript(&strs(&with(args, &["--format", "csv"])))
        );
    }
}

#[test]
fn csv_rows_have_as_many_fields_as_the_header() {
    for (name, args) in COMMANDS {
        if NOT_TABULAR.contains(name) {
            continue;
        }
        let (code, out, err) = run(&strs(&with(args, &["--format", "csv"])));
        assert_eq!(code, 0, "{name}: {err}");
        // no field of these reports holds a quote: splitting outside quotes is enough
        let fields = |line: &str| {
            let mut n = 1;
            let mut quoted = false;
            for c in line.chars() {
                match c {
                    '"' => quoted = !quoted,
                    ',' if !quoted => n += 1,
                    _ => {}
                }
            }
            n
        };
        let mut lines = out.lines();
        let header = fields(lines.next().expect(name));
        assert!(header >= 2, "{name}");
        for l in lines {
            assert_eq!(fields(l), header, "{name}: {l}");
        }
    }
}

#[test]
fn csv_of_a_report_that_is_not_a_table_is_refused_with_a_hint() {
    for (name, args) in COMMANDS {
        if !NOT_TABULAR.contains(name) {
            continue;
        }
        insta::assert_snapshot!(
            format!("{name}_csv_refused"),
            transcript(&strs(&with(args, &["--format", "csv"])))
        );
    }
}

#[test]
fn json_alias_with_another_format_is_an_error() {
    insta::assert_snapshot!(transcript(&["models", "--json", "--format", "csv"]));
    let (code, out, err) = run(&["train", "--format", "markdown", "--json"]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert!(err.contains("hint:"), "{err}");
}

/// `memwall models | head -1`: the reader goes away; that is a normal end, quietly.
#[test]
fn a_closed_pipe_ends_quietly_with_status_0() {
    for (name, args) in COMMANDS {
        let mut child = memwall()
            .args(*args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // close the read end before the report is written
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}");
        assert!(
            out.stderr.is_empty(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// More than a pipe buffer of output, of which the reader takes one line: the writer is
/// certainly mid-report when the pipe closes.
#[test]
fn a_pipe_closed_after_the_first_line_of_a_long_report_ends_quietly() {
    let mut child = memwall()
        .args([
            "train",
            "--model",
            "smollm2-135m-instruct",
            "--gpus",
            "8192",
            "--strategy",
            "zero1",
            "--format",
            "csv",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("rank,"), "{first}");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `memwall train > /dev/full`: one error line, one hint, status 1.
#[test]
fn a_full_disk_is_one_error_line_and_a_hint() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return; // not Linux
    };
    let out = memwall().arg("train").stdout(full).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with("error: cannot write output: "),
        "{err}"
    );
    assert!(lines[1].starts_with("hint: "), "{err}");
}

#[test]
fn an_unwritable_svg_path_is_one_error_line_naming_it_and_a_hint() {
    let dir = std::env::temp_dir().join(format!("memwall-no-such-dir-{}", std::process::id()));
    let path = dir.join("roofline.svg");
    let p = path.display().to_string();
    let (code, out, err) = run(&["roofline", "--model", "gpt2", "--svg", &p]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with(&format!("error: cannot write the roofline plot to {p}: ")),
        "{err}"
    );
    assert!(
        lines[1].starts_with("hint: ") && lines[1].contains("--svg"),
        "{err}"
    );
}

/// A closed stderr must not turn a user error into a panic (exit 101).
#[test]
fn a_closed_stderr_does_not_panic() {
    let mut child = memwall()
        .args(["train", "--gpu", "h100"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(2));
}

/// Keys whose JSON value may be `null` (an absent option, never a non-finite number).
const NULLABLE: &[&str] = &["hf_repo", "lora", "checkpoint_dtype"];

fn assert_finite_json(v: &serde_json::Value, path: &str) {
    match v {
        serde_json::Value::Null => {
            let key = path.rsplit('.').next().unwrap_or("");
            assert!(NULLABLE.contains(&key), "null (NaN or inf?) at {path}");
        }
        serde_json::Value::Number(n) => {
            assert!(n.as_f64().is_some_and(f64::is_finite), "{path}: {n}")
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                assert_finite_json(x, &format!("{path}[{i}]"));
            }
        }
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                assert_finite_json(x, &format!("{path}.{k}"));
            }
        }
        _ => {}
    }
}

/// Runs `args` in every format: table, JSON and Markdown succeed without a non-finite number;
/// CSV succeeds exactly when `tabular`, and is refused with status 2 otherwise. Settings the
/// model refuses (status 2 with an `error:` line, never a panic) are skipped.
fn check_every_format(args: &[String], tabular: bool) {
    let (code, _, err) = run(&strs(args));
    assert!(code == 0 || code == 2, "{args:?}: {err}");
    if code == 2 {
        assert!(
            err.starts_with("error: ") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
        return;
    }
    for format in ["table", "json", "markdown", "csv"] {
        let mut a = strs(args);
        a.extend(["--format", format]);
        let (code, out, err) = run(&a);
        if format == "csv" && !tabular {
            assert_eq!(code, 2, "{a:?}: {err}");
            assert!(out.is_empty() && err.contains("hint:"), "{a:?}: {err}");
            continue;
        }
        assert_eq!(code, 0, "{a:?}: {err}");
        assert!(err.is_empty(), "{a:?}: {err}");
        assert!(!out.is_empty(), "{a:?}");
        if format == "json" {
            let v: serde_json::Value = serde_json::from_str(&out).expect("JSON parses");
            assert_finite_json(&v, "");
        } else {
            let non_finite = out
                .split(|c: char| !c.is_alphanumeric())
                .find(|w| ["NaN", "inf"].contains(w));
            assert!(non_finite.is_none(), "{a:?}: {non_finite:?} in\n{out}");
        }
    }
}

const MODELS: &[&str] = &[
    "gpt2",
    "opt-125m",
    "smollm2-135m-instruct",
    "qwen3-0.6b",
    "gemma-3-1b-it",
    "gemma-2-2b",
    "llama-3.1-8b",
    "mixtral-8x7b",
    "qwen3-30b-a3b",
    "deepseek-v3",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn train_renders_in_every_format(
        model in prop::sample::select(MODELS),
        batch in 1u64..16,
        seq in prop::sample::select(&[1u64, 7, 128, 2048, 8192][..]),
        precision in prop::sample::select(&["bf16", "fp16", "fp32", "amp-bf16", "amp-fp16"][..]),
        optimizer in prop::sample::select(&["adamw", "adamw-fused", "adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion"][..]),
        checkpointing in any::<bool>(),
        attention in prop::sample::select(&["sdpa", "eager", "flash"][..]),
        grad_accum in 1u64..4,
        gpu in prop::sample::select(&["h100-sxm", "a100-80gb-sxm", "l4"][..]),
        cluster in prop::sample::select(&[
            "", "--gpus 2", "--gpus 8 --strategy zero3", "--gpus 4 --strategy fsdp-full",
            "--gpus 8 --strategy zero2 --offload optimizer", "--gpus 8 --tp 2 --pp 2",
        ][..]),
    ) {
        let mut args: Vec<String> = [
            "train", "--model", model, "--batch", &batch.to_string(), "--seq", &seq.to_string(),
            "--precision", precision, "--optimizer", optimizer, "--attention", attention,
            "--grad-accum", &grad_accum.to_string(), "--gpu", gpu,
        ].iter().map(|s| (*s).to_owned()).collect();
        if checkpointing {
            args.push("--checkpointing".into());
        }
        args.extend(cluster.split_whitespace().map(str::to_owned));
        check_every_format(&args, !cluster.is_empty());
    }

    #[test]
    fn infer_renders_in_every_format(
        model in prop::sample::select(MODELS),
        batch in 1u64..64,
        prompt in prop::sample::select(&[1u64, 17, 512, 4096][..]),
        new_tokens in prop::sample::select(&[1u64, 16, 256][..]),
        attention in prop::sample::select(&["sdpa", "eager", "flash"][..]),
        weights in prop::sample::select(&["bf16", "fp16", "fp8", "int8", "nf4", "gptq-int4-g128", "gguf-q4_k_m"][..]),
        kv in prop::sample::select(&["auto", "bf16", "fp8", "int8"][..]),
        gpu in prop::sample::select(&["h100-sxm", "l4"][..]),
    ) {
        let args: Vec<String> = [
            "infer", "--model", model, "--batch", &batch.to_string(), "--prompt",
            &prompt.to_string(), "--new-tokens", &new_tokens.to_string(), "--attention",
            attention, "--weights", weights, "--kv-dtype", kv, "--gpu", gpu,
        ].iter().map(|s| (*s).to_owned()).collect();
        check_every_format(&args, false);
    }
}
