//! No input can crash or fool memwall: each reported reproduction is held here, every exit-2
//! path prints `error: …` naming the flag and value and ends with one fitting `hint:` line,
//! files are read bounded and only when regular, and untrusted text is shown escaped and cut.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run memwall");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The error contract: exit 2, nothing on stdout, `error:` first, exactly one `hint:` line and
/// it is the last, no panic. Returns stderr.
fn refused(args: &[&str]) -> String {
    let (code, stdout, stderr) = run(args);
    assert_eq!(code, 2, "{args:?}: exit {code}\n{stdout}{stderr}");
    assert!(stdout.is_empty(), "{args:?}: stdout {stdout}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.first().is_some_and(|l| l.starts_with("error: ")),
        "{args:?}: {stderr}"
    );
    let hints = lines.iter().filter(|l| l.starts_with("hint: ")).count();
    assert_eq!(hints, 1, "{args:?}: {stderr}");
    let last = lines.last().copied().unwrap_or("");
    assert!(
        last.starts_with("hint: ") && last.len() > "hint: ".len() + 10,
        "{args:?}: {stderr}"
    );
    stderr
}

/// [`refused`], and stderr contains every needle (the flag and its value, mostly).
fn refused_naming(args: &[&str], needles: &[&str]) -> String {
    let stderr = refused(args);
    for n in needles {
        assert!(stderr.contains(n), "{args:?}: `{n}` not in\n{stderr}");
    }
    stderr
}

/// The hint line of a refusal.
fn hint(stderr: &str) -> &str {
    stderr.lines().last().unwrap_or("")
}

// ---- reproductions: crashes and wrap-arounds ----------------------------------------------

#[test]
fn global_batch_with_a_zero_micro_batch_is_refused_not_a_division_by_zero() {
    refused_naming(
        &["train", "--gpus", "2", "--global-batch", "4", "-b", "0"],
        &["--batch/-b 0"],
    );
}

#[test]
fn serve_max_num_batched_tokens_near_u64_max_is_refused() {
    refused_naming(
        &["serve", "--max-num-batched-tokens", "18446744073709551615"],
        &["--max-num-batched-tokens 18446744073709551615"],
    );
}

#[test]
fn serve_max_num_seqs_near_u64_max_is_refused() {
    refused_naming(
        &["serve", "--max-num-seqs", "18446744073709551615"],
        &["--max-num-seqs 18446744073709551615"],
    );
}

#[test]
fn serve_request_lengths_near_u64_max_are_refused() {
    refused_naming(
        &["serve", "--request-lengths", "2048,18446744073709551615"],
        &["--request-lengths 18446744073709551615"],
    );
}

#[test]
fn serve_zero_request_length_is_refused_not_nan() {
    refused_naming(
        &["serve", "--request-lengths", "0,2048"],
        &["--request-lengths 0"],
    );
    // the smallest accepted length prints a finite waste
    let (code, stdout, stderr) = run(&["serve", "-m", "gpt2", "--request-lengths", "1,16"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stdout.contains("NaN") && !stdout.contains("inf"),
        "{stdout}"
    );
    assert!(stdout.contains("1-token request"), "{stdout}");
}

#[test]
fn train_subnormal_efficiency_is_refused_not_infinite() {
    let e = refused_naming(
        &["train", "--matmul-efficiency", "5e-324"],
        &["--matmul-efficiency 5e-324", "0.01"],
    );
    assert!(e.len() < 600, "the value is shown short: {e}");
    // the smallest accepted efficiency gives a finite time
    let (code, stdout, stderr) = run(&[
        "train",
        "-m",
        "gpt2",
        "--matmul-efficiency",
        "0.01",
        "--bandwidth-efficiency",
        "0.01",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stdout.contains("inf s") && !stdout.contains("NaN"),
        "{stdout}"
    );
}

#[test]
fn roofline_tiny_efficiency_is_refused_not_a_300_digit_time() {
    refused_naming(
        &["roofline", "--flops-efficiency", "1e-300"],
        &["--flops-efficiency 1e-300"],
    );
    refused_naming(
        &["roofline", "--bandwidth-efficiency", "0"],
        &["--bandwidth-efficiency 0.0"],
    );
}

// ---- reproductions: accepted and silently ignored ------------------------------------------

#[test]
fn roofline_tp_must_divide_the_heads() {
    let e = refused_naming(
        &["roofline", "--tp", "7"],
        &["--tp 7", "32 attention heads"],
    );
    assert!(hint(&e).contains("1, 2, 4, 8, 16, 32"), "{e}");
}

#[test]
fn roofline_batch_and_seq_have_the_train_bounds() {
    refused_naming(
        &["roofline", "-b", "100000000"],
        &["--batch/-b 100000000", "65536"],
    );
    refused_naming(
        &["roofline", "-s", "100000000"],
        &["--seq/-s 100000000", "4194304"],
    );
    // the same bounds as train
    refused_naming(&["train", "-b", "65537"], &["--batch/-b 65537", "65536"]);
    refused_naming(&["infer", "-b", "65537"], &["--batch/-b 65537", "65536"]);
}

#[test]
fn serve_zero_limits_are_refused() {
    refused_naming(&["serve", "--max-num-seqs", "0"], &["--max-num-seqs 0"]);
    refused_naming(
        &["serve", "--max-num-batched-tokens", "0"],
        &["--max-num-batched-tokens 0"],
    );
}

#[test]
fn sequence_parallel_needs_tensor_parallelism() {
    for args in [
        &["train", "--sequence-parallel"][..],
        &["train", "--gpus", "2", "--sequence-parallel"][..],
    ] {
        let e = refused_naming(args, &["--sequence-parallel", "--tp"]);
        assert!(hint(&e).contains("--tp"), "{e}");
    }
}

#[test]
fn a_schedule_needs_a_pipeline() {
    let e = refused_naming(
        &["train", "--gpus", "2", "--schedule", "gpipe"],
        &["--schedule gpipe", "--pp"],
    );
    assert!(hint(&e).contains("--pp"), "{e}");
    refused_naming(&["train", "--schedule", "gpipe"], &["--schedule gpipe"]);
    refused_naming(
        &[
            "train",
            "--gpus",
            "2",
            "--pp",
            "2",
            "--schedule",
            "interleaved",
        ],
        &["--virtual-stages 1"],
    );
}

#[test]
fn an_offload_device_needs_offload() {
    let e = refused_naming(
        &["train", "--gpus", "2", "--offload-device", "nvme"],
        &["--offload-device nvme"],
    );
    assert!(hint(&e).contains("--offload"), "{e}");
    refused_naming(
        &[
            "train",
            "--gpus",
            "2",
            "--strategy",
            "zero3",
            "--offload-device",
            "nvme",
        ],
        &["--offload-device nvme"],
    );
}

#[test]
fn sequence_parallel_needs_seq_divisible_by_tp() {
    let e = refused_naming(
        &[
            "train",
            "--gpus",
            "8",
            "--tp",
            "8",
            "--sequence-parallel",
            "-s",
            "7",
        ],
        &["--seq/-s 7", "--tp"],
    );
    assert!(hint(&e).contains("multiple of 8"), "{e}");
}

#[test]
fn serve_ignored_flags_are_refused_or_warned() {
    refused_naming(
        &[
            "serve",
            "--kv-cache-memory-bytes",
            "1000000000",
            "--activation-bytes",
            "5",
        ],
        &["--activation-bytes 5", "--kv-cache-memory-bytes"],
    );
    refused_naming(
        &["serve", "--enforce-eager", "--cuda-graph-bytes", "5"],
        &["--cuda-graph-bytes 5", "--enforce-eager"],
    );
    let (code, _, stderr) = run(&[
        "serve",
        "-m",
        "gpt2",
        "--max-num-seqs",
        "8",
        "--activation-bytes",
        "1000",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.starts_with("warning: --max-num-seqs 8"), "{stderr}");
    refused_naming(
        &["infer", "--moe-grouped-decode"],
        &["--moe-grouped-decode"],
    );
}

// ---- reproductions: errors name the right field, with a fitting hint -------------------------

#[test]
fn serve_block_size_and_max_model_len_blame_themselves() {
    let e = refused_naming(&["serve", "--block-size", "0"], &["--block-size 0"]);
    assert!(!e.contains("--tp"), "{e}");
    let e = refused_naming(&["serve", "--max-model-len", "0"], &["--max-model-len 0"]);
    assert!(!e.contains("--tp"), "{e}");
}

#[test]
fn layout_hints_fit_the_problem() {
    let divisibility = hint(&refused(&["train", "--gpus", "8", "--tp", "3"])).to_owned();
    assert!(divisibility.contains("multiple of 3"), "{divisibility}");
    for args in [
        &["train", "--gpus", "8", "--virtual-stages", "2"][..],
        &["train", "--gpus", "8", "--offload", "params"][..],
        &["train", "--gpus", "8", "--strategy", "hsdp"][..],
        &["train", "--gpus", "8", "--gpus-per-node", "3"][..],
        &["train", "--gpus", "8", "--ep", "3"][..],
    ] {
        let e = refused(args);
        assert_ne!(hint(&e), divisibility, "{args:?}: {e}");
    }
    let e = refused_naming(
        &["train", "--gpus", "8", "--virtual-stages", "2"],
        &["--virtual-stages 2"],
    );
    assert!(hint(&e).contains("--schedule"), "{e}");
    let e = refused_naming(
        &["train", "--gpus", "8", "--offload", "params"],
        &["--offload `params`"],
    );
    assert!(hint(&e).contains("zero3"), "{e}");
}

#[test]
fn lora_and_gpu_errors_have_hints() {
    refused_naming(
        &["train", "--lora-rank", "8"],
        &["--lora-rank 8", "--lora-targets"],
    );
    refused_naming(
        &["train", "--lora-targets", "q_proj"],
        &["--lora-targets q_proj"],
    );
    refused_naming(&["train", "--qlora"], &["--qlora", "--lora-rank"]);
    let e = refused_naming(
        &[
            "train",
            "-m",
            "gpt2",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj",
        ],
        &["--lora-targets `q_proj`"],
    );
    assert!(hint(&e).contains("c_attn"), "{e}");
    refused_naming(&["train", "--gpu", "h100"], &["--gpu h100", "h100-sxm"]);
    refused_naming(&["train", "--gpu", "zzz"], &["--gpu zzz"]);
}

#[test]
fn overflow_and_range_errors_name_the_field() {
    refused_naming(
        &["train", "--gpus", "18446744073709551615"],
        &["--gpus 18446744073709551615"],
    );
    refused_naming(
        &[
            "train",
            "--lora-rank",
            "18446744073709551615",
            "--lora-targets",
            "q_proj",
        ],
        &["--lora-rank 18446744073709551615"],
    );
    refused_naming(
        &["train", "--grad-accum", "18446744073709551615"],
        &["--grad-accum 18446744073709551615"],
    );
    refused_naming(
        &[
            "train",
            "--gpus",
            "1048576",
            "-b",
            "65536",
            "--global-batch",
            "18446744073709551615",
        ],
        &["--global-batch 18446744073709551615"],
    );
    refused_naming(
        &["infer", "--prompt", "4194304", "--new-tokens", "1"],
        &["--new-tokens 1", "--prompt"],
    );
    refused_naming(
        &["serve", "--kv-cache-memory-bytes", "18446744073709551615"],
        &["--kv-cache-memory-bytes 18446744073709551615"],
    );
}

// ---- every exit-2 path prints a hint ---------------------------------------------------------

/// Every refusal found in the binary, the core and the config parser, one argument vector each.
#[test]
fn liger_kernels_are_refused_by_name_where_not_modelled() {
    // Liger has no patch for GPT-2: `use_liger_kernel=True` would change nothing
    let e = refused_naming(
        &["train", "-m", "gpt2", "--kernels", "liger"],
        &["--kernels", "gpt2"],
    );
    assert!(hint(&e).contains("drop --kernels liger"), "{e}");
    // Liger patches Gemma 2, with kernels the simulator does not model
    let e = refused_naming(
        &["train", "-m", "gemma-2-2b", "--kernels", "liger"],
        &["--kernels", "gemma2", "not model"],
    );
    assert!(hint(&e).contains("drop --kernels liger"), "{e}");
    // Liger brings its own loss
    let e = refused_naming(
        &["train", "--kernels", "liger", "--loss", "fused"],
        &["--loss", "fused", "--kernels liger"],
    );
    assert!(hint(&e).contains("drop --loss"), "{e}");
    // Megatron-LM's layers are its own
    refused_naming(
        &["train", "--gpus", "2", "--tp", "2", "--kernels", "liger"],
        &["--kernels", "liger", "Megatron"],
    );
}

#[test]
fn every_exit_2_path_prints_one_hint() {
    let data = |f: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(f)
            .display()
            .to_string()
    };
    let files: Vec<String> = [
        "truncated.json",
        "heads.json",
        "kv_heads.json",
        "unknown.json",
        "wrongtype.json",
        "absurd_layers.json",
    ]
    .iter()
    .map(|f| data(f))
    .collect();
    let mut table: Vec<Vec<String>> = files
        .iter()
        .map(|f| vec!["train".into(), "-m".into(), f.clone()])
        .collect();
    let fixed: &[&[&str]] = &[
        // clap
        &["train", "--precision", "int3"],
        &["train", "--bogus"],
        &["bogus"],
        &["train", "-b", "x"],
        &["train", "-b", "-1"],
        // model source
        &["train", "-m", "lama-3-8b"],
        &["train", "-m", "./nope/config.json"],
        &["inspect", "crates"],
        // train
        &["train", "-b", "0"],
        &["train", "-s", "0"],
        &["train", "-s", "4194305"],
        &["train", "--grad-accum", "0"],
        &["train", "--matmul-efficiency", "0"],
        &["train", "--matmul-efficiency", "nan"],
        &["train", "--matmul-efficiency", "inf"],
        &["train", "--bandwidth-efficiency", "1.5"],
        &["train", "--lora-rank", "0", "--lora-targets", "q_proj"],
        &["train", "--kernels", "triton"],
        &["train", "--kernels", "liger", "--loss", "fused"],
        &["train", "-m", "gpt2", "--kernels", "liger"],
        &["train", "-m", "gemma-2-2b", "--kernels", "liger"],
        &["train", "--gpus", "2", "--tp", "2", "--kernels", "liger"],
        &["plan", "-m", "gpt2", "--kernels", "liger"],
        &["train", "--global-batch", "8"],
        &["train", "--gpus", "2", "--global-batch", "3"],
        &[
            "train",
            "--gpus",
            "2",
            "--grad-accum",
            "2",
            "--global-batch",
            "2",
        ],
        &["train", "--gpus", "0"],
        &["train", "--gpus", "8", "--gpus-per-node", "0"],
        &["train", "--gpus", "8", "--tp", "0"],
        &["train", "--gpus", "8", "--pp", "0"],
        &["train", "--gpus", "8", "--cp", "0"],
        &["train", "--gpus", "8", "--ep", "0"],
        &["train", "--gpus", "8", "--virtual-stages", "0"],
        &["train", "--gpus", "8", "--tp", "2", "--strategy", "zero3"],
        &[
            "train",
            "--gpus",
            "8",
            "--strategy",
            "ddp",
            "--offload",
            "optimizer",
        ],
        &[
            "train",
            "--gpus",
            "8",
            "--strategy",
            "fsdp-full",
            "--offload",
            "params",
        ],
        &[
            "train",
            "--gpus",
            "8",
            "--strategy",
            "zero2",
            "--offload-device",
            "nvme",
            "--offload",
            "optimizer",
        ],
        &[
            "train",
            "--gpus",
            "2",
            "--strategy",
            "zero3",
            "--optimizer",
            "adafactor",
        ],
        &[
            "train",
            "--gpus",
            "2",
            "--strategy",
            "zero3",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj",
            "--qlora",
        ],
        &[
            "train",
            "--gpus",
            "2",
            "--tp",
            "2",
            "--lora-rank",
            "8",
            "--lora-targets",
            "q_proj",
        ],
        &["train", "--gpus", "3", "--pp", "3"],
        &["train", "--gpus", "2", "--cp", "2", "-s", "7"],
        &["train", "--gpus", "16", "--tp", "16", "-m", "gpt2"],
        &["train", "--gpus", "2", "--ep", "2"],
        // infer
        &["infer", "-b", "0"],
        &["infer", "--prompt", "0"],
        &["infer", "--new-tokens", "0"],
        &["infer", "--weights", "q7"],
        &["infer", "--gpu", "nope"],
        // roofline
        &["roofline", "-b", "0"],
        &["roofline", "-s", "0"],
        &["roofline", "--tp", "0"],
        &["roofline", "--dtype", "fp8", "--gpu", "a100-80gb-sxm"],
        &["roofline", "--flops-efficiency", "2"],
        // serve
        &["serve", "--tp", "0"],
        &["serve", "--tp", "3"],
        &["serve", "--gpu-memory-utilization", "0"],
        &["serve", "--gpu-memory-utilization", "1.5"],
        &["serve", "--block-size", "18446744073709551615"],
        &["serve", "--max-model-len", "18446744073709551615"],
        &[
            "serve",
            "--kv-cache-memory-bytes",
            "1",
            "--non-torch-bytes",
            "1",
        ],
        &[
            "serve",
            "--kv-cache-memory-bytes",
            "1",
            "--cuda-graph-bytes",
            "1",
        ],
        &["serve", "--non-torch-bytes", "18446744073709551615"],
        &["serve", "--activation-bytes", "18446744073709551615"],
        &["serve", "--cuda-graph-bytes", "18446744073709551615"],
        &["serve", "--gpu", "nope"],
    ];
    table.extend(
        fixed
            .iter()
            .map(|a| a.iter().map(|s| s.to_string()).collect()),
    );
    for args in &table {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&args);
    }
}

// ---- files --------------------------------------------------------------------------------

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memwall-safety-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[cfg(unix)]
#[test]
fn a_fifo_is_refused_without_blocking() {
    let fifo = scratch("pipe.json");
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("mkfifo unavailable; skipped");
        return;
    }
    refused_naming(
        &["inspect", path_str(&fifo)],
        &["FIFO", "not a regular file"],
    );
    let _ = std::fs::remove_file(&fifo);
}

#[cfg(unix)]
#[test]
fn a_symlink_to_a_device_is_refused_after_following_it() {
    let link = scratch("zero.json");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    refused_naming(
        &["inspect", path_str(&link)],
        &["character device", "not a regular file"],
    );
    let dangling = scratch("dangling.json");
    let _ = std::fs::remove_file(&dangling);
    std::os::unix::fs::symlink(scratch("nothing-here"), &dangling).unwrap();
    refused_naming(&["inspect", path_str(&dangling)], &["symbolic link"]);
    let _ = std::fs::remove_file(&link);
    let _ = std::fs::remove_file(&dangling);
}

#[test]
fn a_proc_file_is_read_bounded() {
    let pagemap = Path::new("/proc/self/pagemap");
    if !pagemap.exists() {
        return;
    }
    let start = std::time::Instant::now();
    refused_naming(&["inspect", "/proc/self/pagemap"], &["/proc/self/pagemap"]);
    assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
}

#[test]
fn a_file_over_the_limit_is_refused_whatever_its_content() {
    // sparse: 17 MiB of zeros cost no disk
    let big = scratch("big.json");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(17 << 20).unwrap();
    refused_naming(&["inspect", path_str(&big)], &["larger than 16 MiB"]);
    let bad = scratch("latin1.json");
    std::fs::write(&bad, b"{\"model_type\": \"caf\xe9\"}").unwrap();
    refused_naming(&["inspect", path_str(&bad)], &["not UTF-8"]);
    let dir = scratch("emptydir");
    std::fs::create_dir_all(&dir).unwrap();
    refused_naming(&["inspect", path_str(&dir)], &["has no config.json"]);
    let _ = std::fs::remove_file(&big);
    let _ = std::fs::remove_file(&bad);
    let _ = std::fs::remove_dir(&dir);
}

/// A 16 MiB config of one unknown key holding `[0,0,…]`: refused quickly, and (where
/// `/usr/bin/time` exists) within a small multiple of the file's size in memory.
#[test]
fn a_16_mib_adversarial_config_stays_small() {
    let path = scratch("adversarial.json");
    let head = "{\"model_type\":\"llama\",\"x\":[";
    let n = ((16 << 20) - head.len() - 2) / 2;
    let mut text = String::with_capacity(16 << 20);
    text.push_str(head);
    for _ in 0..n {
        text.push_str("0,");
    }
    text.pop();
    text.push_str("]}");
    std::fs::write(&path, &text).unwrap();
    drop(text);
    let out = Command::new("/usr/bin/time")
        .args([
            "-f",
            "maxrss_kib=%M",
            env!("CARGO_BIN_EXE_memwall"),
            "inspect",
        ])
        .arg(&path)
        .output();
    match out {
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let kib: u64 = stderr
                .lines()
                .find_map(|l| l.strip_prefix("maxrss_kib="))
                .and_then(|v| v.trim().parse().ok())
                .expect("time's output");
            // file 16 MiB + read buffer; before parse-once this was 1.2 GB
            assert!(kib < 64 * 1024, "peak RSS {kib} KiB\n{stderr}");
            assert!(stderr.contains("vocab_size"), "{stderr}");
        }
        Err(_) => {
            refused(&["inspect", path_str(&path)]);
        }
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn untrusted_text_is_escaped_and_cut() {
    let path = scratch("escapes.json");
    let model_type = format!("\u{1b}[31mRED\u{1b}]0;title\u{7}{}", "A".repeat(1 << 20));
    std::fs::write(
        &path,
        serde_json::json!({ "model_type": model_type }).to_string(),
    )
    .unwrap();
    let e = refused_naming(&["inspect", path_str(&path)], &["\\u{1b}[31mRED"]);
    assert!(!e.contains('\u{1b}') && !e.contains('\u{7}'), "{e:?}");
    let _ = std::fs::remove_file(&path);
    assert!(e.len() < 4000, "{} bytes", e.len());
    // a 131 KB --model
    let long = "x".repeat(131_000);
    let e = refused(&["inspect", &long]);
    assert!(e.len() < 4000, "{} bytes", e.len());
    let e = refused(&["train", "--gpu", &long]);
    assert!(e.len() < 4000, "{} bytes", e.len());
    let e = refused(&[
        "train",
        "--lora-rank",
        "8",
        "--lora-targets",
        &format!("q\u{1b}[2J{long}"),
    ]);
    assert!(e.len() < 4000 && !e.contains('\u{1b}'), "{} bytes", e.len());
    let e = refused(&["infer", "--weights", &format!("\u{1b}[2J{long}")]);
    assert!(e.len() < 4000 && !e.contains('\u{1b}'), "{} bytes", e.len());
    // clap's own messages too
    let e = refused(&["train", "--precision", "\u{1b}[2Jx"]);
    assert!(!e.contains('\u{1b}'), "{e:?}");
}

#[test]
fn the_largest_accepted_model_with_the_largest_inputs_never_panics() {
    let m = largest();
    let m = m.as_str();
    for args in [
        &["inspect", m][..],
        &[
            "serve",
            "-m",
            m,
            "--max-num-batched-tokens",
            "16777216",
            "--max-num-seqs",
            "65536",
            "--request-lengths",
            "67108864,1",
            "--block-size",
            "67108864",
        ][..],
        &[
            "serve",
            "-m",
            m,
            "--block-size",
            "1",
            "--kv-cache-memory-bytes",
            "85899345920",
            "--tp",
            "16384",
        ][..],
        &["train", "-m", m, "-b", "65536", "-s", "4194304"][..],
        &[
            "train",
            "-m",
            m,
            "-b",
            "65536",
            "-s",
            "4194304",
            "--gpus",
            "1048576",
            "--tp",
            "16384",
            "--pp",
            "64",
            "--grad-accum",
            "65536",
        ][..],
        &[
            "train",
            "-m",
            m,
            "-b",
            "65536",
            "-s",
            "4194304",
            "--gpus",
            "1048576",
            "--strategy",
            "zero3",
            "--offload",
            "both",
            "--offload-device",
            "nvme",
            "--gpus-per-node",
            "1048576",
            "--global-batch",
            "68719476736",
        ][..],
        &[
            "infer",
            "-m",
            m,
            "-b",
            "65536",
            "--prompt",
            "4194303",
            "--new-tokens",
            "1",
        ][..],
        &[
            "roofline", "-m", m, "-b", "65536", "-s", "4194304", "--phase", "decode",
        ][..],
        &[
            "roofline",
            "-m",
            m,
            "-b",
            "65536",
            "-s",
            "4194304",
            "--tp",
            "16384",
            "--flops-efficiency",
            "0.01",
            "--bandwidth-efficiency",
            "0.01",
        ][..],
    ] {
        let owned: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        never_panics(&owned).unwrap();
    }
}

// ---- random argument vectors never panic --------------------------------------------------

const VALUES: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "7",
    "8",
    "16",
    "4096",
    "65536",
    "65537",
    "4194305",
    "16777217",
    "18446744073709551615",
    "0.0",
    "1e-300",
    "5e-324",
    "0.005",
    "0.5",
    "1.0",
    "NaN",
    "inf",
];

fn pairs(flags: &'static [&'static str]) -> impl Strategy<Value = Vec<(usize, usize)>> {
    prop::collection::vec((0..flags.len(), 0..VALUES.len()), 0..5)
}

/// Builds `cmd -m model (flag value)* switches*`.
fn argv(
    cmd: &str,
    model: &str,
    flags: &[&str],
    chosen: &[(usize, usize)],
    switches: &[&str],
    on: &[bool],
) -> Vec<String> {
    let mut a = vec![cmd.to_owned(), "-m".to_owned(), model.to_owned()];
    for &(f, v) in chosen {
        a.push(flags[f].to_owned());
        a.push(VALUES[v].to_owned());
    }
    for (s, &o) in switches.iter().zip(on) {
        if o {
            a.push((*s).to_owned());
        }
    }
    a
}

/// Exit 0 with finite output, or exit 2 with the error contract; never a panic.
fn never_panics(args: &[String]) -> Result<(), TestCaseError> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = run(&a);
    prop_assert!(!stderr.contains("panicked"), "{a:?}: {stderr}");
    match code {
        0 => {
            prop_assert!(
                !stdout.contains("NaN") && !stdout.contains("inf s") && !stdout.contains(" inf "),
                "{a:?}: {stdout}"
            );
        }
        2 => {
            let last = stderr.lines().last().unwrap_or("");
            // warnings about ignored flags may come first
            let first = stderr
                .lines()
                .find(|l| !l.starts_with("warning: "))
                .unwrap_or("");
            prop_assert!(first.starts_with("error: "), "{a:?}: {stderr}");
            prop_assert!(last.starts_with("hint: "), "{a:?}: {stderr}");
        }
        other => prop_assert!(false, "{a:?}: exit {other}\n{stderr}"),
    }
    Ok(())
}

/// A MoE model at every size limit of the config parser (one layer, so that its parameter
/// count fits in 64 bits): the largest sizes any input can bring.
fn largest() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/largest.json")
        .display()
        .to_string()
}

fn model(i: usize) -> String {
    match i {
        0 => "gpt2".into(),
        1 => "smollm2-135m-instruct".into(),
        2 => "qwen1.5-moe-a2.7b-chat".into(),
        _ => largest(),
    }
}

const MODELS: usize = 4;

const TRAIN_FLAGS: &[&str] = &[
    "-b",
    "-s",
    "--grad-accum",
    "--matmul-efficiency",
    "--bandwidth-efficiency",
    "--gpus",
    "--gpus-per-node",
    "--tp",
    "--pp",
    "--cp",
    "--ep",
    "--virtual-stages",
    "--global-batch",
    "--lora-rank",
    "--image-tokens",
];
const TRAIN_SWITCHES: &[&str] = &[
    "--sequence-parallel",
    "--checkpointing",
    "--no-dropout",
    "--json",
    "--train-vision",
];
const INFER_FLAGS: &[&str] = &["-b", "--prompt", "--new-tokens", "--image-tokens"];
const INFER_SWITCHES: &[&str] = &["--moe-grouped-decode", "--json"];
const ROOFLINE_FLAGS: &[&str] = &[
    "-b",
    "-s",
    "--tp",
    "--flops-efficiency",
    "--bandwidth-efficiency",
];
const ROOFLINE_SWITCHES: &[&str] = &["--json"];
const SERVE_FLAGS: &[&str] = &[
    "--tp",
    "--gpu-memory-utilization",
    "--block-size",
    "--max-model-len",
    "--max-num-batched-tokens",
    "--max-num-seqs",
    "--kv-cache-memory-bytes",
    "--non-torch-bytes",
    "--activation-bytes",
    "--cuda-graph-bytes",
    "--request-lengths",
];
const SERVE_SWITCHES: &[&str] = &["--enforce-eager", "--json"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn train_never_panics(m in 0..MODELS, chosen in pairs(TRAIN_FLAGS), on in prop::collection::vec(any::<bool>(), TRAIN_SWITCHES.len())) {
        never_panics(&argv("train", &model(m), TRAIN_FLAGS, &chosen, TRAIN_SWITCHES, &on))?;
    }

    #[test]
    fn infer_never_panics(m in 0..MODELS, chosen in pairs(INFER_FLAGS), on in prop::collection::vec(any::<bool>(), INFER_SWITCHES.len())) {
        never_panics(&argv("infer", &model(m), INFER_FLAGS, &chosen, INFER_SWITCHES, &on))?;
    }

    #[test]
    fn roofline_never_panics(m in 0..MODELS, chosen in pairs(ROOFLINE_FLAGS), on in prop::collection::vec(any::<bool>(), ROOFLINE_SWITCHES.len())) {
        never_panics(&argv("roofline", &model(m), ROOFLINE_FLAGS, &chosen, ROOFLINE_SWITCHES, &on))?;
    }

    #[test]
    fn serve_never_panics(m in 0..MODELS, chosen in pairs(SERVE_FLAGS), on in prop::collection::vec(any::<bool>(), SERVE_SWITCHES.len())) {
        never_panics(&argv("serve", &model(m), SERVE_FLAGS, &chosen, SERVE_SWITCHES, &on))?;
    }
}

#[test]
fn training_loop_values_are_checked() {
    // an unknown loop names the flag, the value and the accepted names
    refused_naming(
        &["train", "--loop", "accelerate"],
        &["--loop", "accelerate", "trainer", "keep-outputs"],
    );
    refused_naming(&["plan", "--loop", ""], &["--loop"]);
    refused_naming(&["doctor", "--loop", "keep"], &["--loop", "keep"]);
    // Megatron-LM runs its own loop: refused with the flag named, not ignored
    refused_naming(
        &[
            "train",
            "--gpus",
            "2",
            "--tp",
            "2",
            "--loop",
            "keep-outputs",
        ],
        &["--loop", "keep-outputs", "Megatron"],
    );
}

#[test]
fn checkpointing_policy_values_are_checked() {
    for bad in [
        "every-k:0",
        "every-k:x",
        "every-k:",
        "every-k:65537",
        "selective",
        "",
        "FULL",
    ] {
        let stderr = refused_naming(
            &["train", "--checkpointing-policy", bad],
            &["--checkpointing-policy"],
        );
        assert!(!stderr.contains("checkpointing_policy"), "{stderr}");
    }
    refused_naming(
        &["plan", "--checkpointing-policy", "every-k:0"],
        &["--checkpointing-policy every-k:0"],
    );
    refused_naming(
        &["doctor", "--checkpointing-policy", "every-2"],
        &["--checkpointing-policy every-2"],
    );
    refused_naming(
        &[
            "train",
            "--gpus",
            "2",
            "--tp",
            "2",
            "--checkpointing-policy",
            "every-k:2",
        ],
        &["--checkpointing-policy `every-k:2`", "Megatron"],
    );
}

#[test]
fn use_cache_values_are_checked() {
    for bad in ["yes", "", "2", "on"] {
        refused_naming(&["train", "--use-cache", bad], &["--use-cache"]);
    }
    refused_naming(&["plan", "--use-cache", "maybe"], &["--use-cache"]);
}
