//! Accuracy against measured truth: every case in `tests/truth/train.jsonl` (measured by
//! `tools/truth/measure.py` with PyTorch's MemTracker) must be within 3% of its measured peak,
//! the median |error| within 1%, and `docs/accuracy.md` must be the report of exactly these
//! numbers (regenerate with `MEMWALL_UPDATE_ACCURACY=1 cargo test --test truth`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_core::memory::{simulate_train, Kernels};
use memwall_core::workload::{
    AttentionImpl, CheckpointPolicy, InferWorkload, KernelOptions, KernelSet, Lora, LossKernel,
    Optimizer, Precision, StepOptions, TrainLoop, TrainWorkload,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

/// One measured case, strictly typed so a schema change fails loudly.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    id: String,
    kind: String,
    config: String,
    model_type: String,
    batch: u64,
    seq: u64,
    precision: String,
    optimizer: String,
    checkpointing: bool,
    attention: String,
    lora: Option<LoraCase>,
    qlora: bool,
    grad_accum: u64,
    dropout: String,
    /// `fused` / `fused-linear` (absent: transformers' own loss)
    #[serde(default)]
    loss: Option<String>,
    /// the batch packed into one row (absent: padded batches)
    #[serde(default)]
    padding_free: bool,
    /// `keep-outputs` (absent: the HF Trainer's loop)
    #[serde(default)]
    r#loop: Option<String>,
    /// `every-k:K` (absent: every layer when checkpointing)
    #[serde(default)]
    checkpointing_policy: Option<String>,
    /// `model.config.use_cache` as set (absent: the config's)
    #[serde(default)]
    use_cache: Option<bool>,
    /// `liger` (absent: transformers' eager modules)
    #[serde(default)]
    kernels: Option<String>,
    /// image tokens per sequence run through the vision tower (absent: text only)
    #[serde(default)]
    image_tokens: Option<u64>,
    /// `real`: measured on real CPU tensors (absent: fake tensors)
    #[serde(default)]
    #[allow(dead_code)]
    tensors: Option<String>,
    /// the forward under `save_on_cpu(pin_memory=True)` (absent: no offloading)
    #[serde(default)]
    activation_offload: bool,
    measured: Measured,
    versions: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct LoraCase {
    rank: u64,
    #[allow(dead_code)]
    alpha: f64,
    targets: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Measured {
    peak_bytes: u64,
    at_peak: BTreeMap<String, u64>,
    phase: String,
    params_total: u64,
    params_trainable: u64,
    #[serde(default)]
    #[allow(dead_code)]
    first_step_peak_bytes: Option<u64>,
    /// activation offloading: the most host bytes the packed saved tensors held at once
    #[serde(default)]
    host_peak_bytes: Option<u64>,
    /// the forward phase's own peak (the steady step's running peak when the LM head starts);
    /// rows measured before helper 53, and gradient-accumulation rows, have none
    #[serde(default)]
    forward_peak_bytes: Option<u64>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The precision a fixture names.
fn precision(id: &str, name: &str) -> Precision {
    Precision::ALL
        .iter()
        .find(|(_, n)| *n == name)
        .unwrap_or_else(|| panic!("{id}: unknown precision {name}"))
        .0
}

/// The optimizer a fixture names.
fn optimizer(id: &str, name: &str) -> Optimizer {
    Optimizer::ALL
        .iter()
        .find(|(_, n)| *n == name)
        .unwrap_or_else(|| panic!("{id}: unknown optimizer {name}"))
        .0
}

/// A phase as the fixtures spell it.
fn phase_name(p: memwall_core::memory::Phase) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The attention a case ran: the harness records its `attn_implementation` also for models
/// without attention layers (pure state-space cases set "eager"), where no attention kernel
/// runs and memwall refuses an explicit choice, so those cases are estimated with the default.
fn attention_of(desc: &memwall_core::model::ModelDesc, recorded: AttentionImpl) -> AttentionImpl {
    if desc.layers.iter().all(|l| l.attention_block().is_none()) {
        AttentionImpl::Sdpa
    } else {
        recorded
    }
}

fn workload(c: &Case) -> TrainWorkload {
    let precision = precision(&c.id, &c.precision);
    let optimizer = optimizer(&c.id, &c.optimizer);
    let attention = match c.attention.as_str() {
        "sdpa" => AttentionImpl::Sdpa,
        "eager" => AttentionImpl::Eager,
        "flash" => AttentionImpl::Flash,
        other => panic!("{}: unknown attention {other}", c.id),
    };
    TrainWorkload {
        batch: c.batch,
        seq: c.seq,
        precision,
        optimizer,
        checkpointing: c.checkpointing,
        attention,
        lora: c.lora.as_ref().map(|l| Lora {
            rank: l.rank,
            targets: l.targets.clone(),
            qlora: c.qlora,
        }),
        grad_accum: c.grad_accum,
        dropout: c.dropout == "config",
        kernels: KernelOptions {
            loss: c.loss.as_deref().map_or(LossKernel::Torch, |l| {
                l.parse().unwrap_or_else(|e| panic!("{}: {e}", c.id))
            }),
            padding_free: c.padding_free,
            layers: c.kernels.as_deref().map_or(KernelSet::Torch, |k| {
                k.parse().unwrap_or_else(|e| panic!("{}: {e}", c.id))
            }),
        },
        step_options: StepOptions {
            outputs: c.r#loop.as_deref().map_or(TrainLoop::Trainer, |l| {
                l.parse().unwrap_or_else(|e| panic!("{}: {e}", c.id))
            }),
            checkpointing_policy: c
                .checkpointing_policy
                .as_deref()
                .map_or(CheckpointPolicy::Full, |p| {
                    p.parse().unwrap_or_else(|e| panic!("{}: {e}", c.id))
                }),
            use_cache: c.use_cache,
            activation_offload: c.activation_offload,
        },
    }
}

struct Row {
    id: String,
    model_type: String,
    category: String,
    measured: u64,
    estimated: u64,
    error_pct: f64,
    phase_measured: String,
    phase_estimated: String,
}

impl Row {
    fn new(
        id: &str,
        model_type: &str,
        category: String,
        (measured, estimated): (u64, u64),
        phase_measured: &str,
        phase_estimated: memwall_core::memory::Phase,
    ) -> Row {
        Row {
            id: id.to_owned(),
            model_type: model_type.to_owned(),
            category,
            measured,
            estimated,
            error_pct: (estimated as f64 - measured as f64) / measured as f64 * 100.0,
            phase_measured: phase_measured.to_owned(),
            phase_estimated: phase_name(phase_estimated),
        }
    }
}

/// `--image-tokens N` as the CLI applies it: the vision tower runs over N tokens' patches.
fn with_image_tokens(desc: &mut memwall_core::model::ModelDesc, n: Option<u64>) {
    if let Some(n) = n {
        let v = desc
            .vision
            .as_mut()
            .expect("image tokens need a vision tower");
        assert!(
            v.forward.is_some(),
            "image tokens need a simulated vision forward"
        );
        v.image_tokens = Some(n);
    }
}

fn category(c: &Case) -> String {
    if c.image_tokens.is_some() {
        "image tokens".into()
    } else if c.activation_offload {
        "activation offload".into()
    } else if let Some(k) = &c.kernels {
        format!("kernels {k}")
    } else if c.use_cache.is_some() {
        "use_cache".into()
    } else if let Some(p) = c
        .checkpointing_policy
        .as_deref()
        .filter(|&p| p == "selective-op")
    {
        format!("checkpointing policy {p}")
    } else if c.checkpointing_policy.is_some() {
        "checkpointing policy".into()
    } else if let Some(l) = &c.r#loop {
        format!("loop {l}")
    } else if let Some(loss) = &c.loss {
        format!("loss {loss}")
    } else if c.padding_free {
        "padding-free".into()
    } else if c.lora.is_some() {
        "lora".into()
    } else if c.checkpointing {
        "checkpointing".into()
    } else if c.attention == "eager" {
        "eager attention".into()
    } else if c.precision.starts_with("amp") {
        "autocast".into()
    } else if c.optimizer != "adamw" {
        "optimizers".into()
    } else if c.grad_accum > 1 {
        "grad accumulation".into()
    } else {
        format!("{} sdpa", c.precision)
    }
}

fn rows() -> Vec<Row> {
    train_rows_of("tests/truth/train.jsonl")
}

/// The random training sample (`tests/truth/random_train.jsonl`, cases drawn by
/// `tools/truth/sample_cases.py`); empty when not measured.
fn random_rows() -> Vec<Row> {
    if !root().join("tests/truth/random_train.jsonl").exists() {
        return Vec::new();
    }
    train_rows_of("tests/truth/random_train.jsonl")
}

/// The random inference sample (`tests/truth/random_infer.jsonl`); empty when not measured.
fn random_infer_rows() -> Vec<Row> {
    infer_rows_of("tests/truth/random_infer.jsonl")
}

fn train_rows_of(file: &str) -> Vec<Row> {
    train_rows_and_forward_phases_of(file).0
}

/// The rows of training fixtures `file`, and the forward phase of each row that measured it.
fn train_rows_and_forward_phases_of(file: &str) -> (Vec<Row>, Vec<PhaseRow>) {
    let text = std::fs::read_to_string(root().join(file)).expect("read training fixtures");
    let mut out = Vec::new();
    let mut forward = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let c: Case =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad fixture line: {e}\n{line}"));
        assert_eq!(c.kind, "train");
        assert!(c.versions.contains_key("torch") && c.versions.contains_key("transformers"));
        let json = std::fs::read_to_string(root().join(&c.config)).expect("read config");
        let refused = refused_cases();
        let mut desc = match (memwall_formats::parse_hf_config(&json), refused.get(&c.id)) {
            (Ok(d), _) => d,
            // a config field refused by name by its normaliser (the toml gives the reason)
            (Err(_), Some(_)) => continue,
            (Err(e), None) => panic!("{}: {e}", c.id),
        };
        assert_eq!(desc.model_type, c.model_type, "{}", c.id);
        with_image_tokens(&mut desc, c.image_tokens);
        let mut w = workload(&c);
        w.attention = attention_of(&desc, w.attention);
        let Some(e) = unless_refused(simulate_train(&desc, &w, Kernels::Cpu), &c.id, &refused)
        else {
            continue;
        };
        // the fast evaluator (what the CLI runs) gives the replay's result exactly
        assert_eq!(
            memwall_core::memory::fast::simulate_train(&desc, &w, Kernels::Cpu).as_ref(),
            Ok(&e),
            "{}: fast path",
            c.id
        );
        assert_eq!(
            e.params_total, c.measured.params_total,
            "{}: parameter count",
            c.id
        );
        assert_eq!(
            e.params_trainable, c.measured.params_trainable,
            "{}: trainable parameters",
            c.id
        );
        if let Some(host) = c.measured.host_peak_bytes {
            // activation offloading: the host bytes the packed saved tensors hold, within 3% too
            let err = (e.host_offload_bytes as f64 - host as f64) / host as f64 * 100.0;
            assert!(
                err.abs() <= 3.0,
                "{}: host bytes {:+.2}% (measured {host}, estimated {})",
                c.id,
                err,
                e.host_offload_bytes
            );
        }
        if let Some(measured) = c.measured.forward_peak_bytes {
            let estimated = e
                .phase_peak(memwall_core::memory::Phase::Forward)
                .unwrap_or_else(|| panic!("{}: no forward phase", c.id));
            forward.push(PhaseRow {
                id: format!("{} forward", c.id),
                measured,
                estimated,
                error_pct: (estimated as f64 - measured as f64) / measured as f64 * 100.0,
            });
        }
        out.push(Row::new(
            &c.id,
            &c.model_type,
            category(&c),
            (c.measured.peak_bytes, e.peak_bytes),
            &c.measured.phase,
            e.phase,
        ));
    }
    (out, forward)
}

/// One measured inference case (`tests/truth/infer.jsonl`, `tools/truth/measure_infer.py`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InferCase {
    id: String,
    kind: String,
    config: String,
    model_type: String,
    batch: u64,
    prompt: u64,
    new_tokens: u64,
    weights: String,
    attention: String,
    /// transformers `experts_implementation` used for decode steps (MoE only)
    #[serde(default)]
    decode_experts: Option<String>,
    /// image tokens per sequence run through the vision tower in the prefill
    #[serde(default)]
    image_tokens: Option<u64>,
    /// `real`: measured on real CPU tensors (absent: fake tensors)
    #[serde(default)]
    #[allow(dead_code)]
    tensors: Option<String>,
    measured: InferMeasured,
    versions: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct InferMeasured {
    peak_bytes: u64,
    at_peak: BTreeMap<String, u64>,
    phase: String,
    prefill_peak_bytes: u64,
    #[allow(dead_code)]
    final_bytes: u64,
    params_total: u64,
    #[serde(default)]
    #[allow(dead_code)]
    after_prefill_bytes: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    cache_after_prefill_bytes: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    final_cache_bytes: Option<u64>,
}

fn infer_rows() -> Vec<Row> {
    infer_rows_of("tests/truth/infer.jsonl")
}

/// The workload an inference case recorded (attention as the model runs it).
fn infer_workload(c: &InferCase, desc: &memwall_core::model::ModelDesc) -> InferWorkload {
    use memwall_core::workload::{KvDtype, WeightFormat};
    InferWorkload {
        batch: c.batch,
        prompt: c.prompt,
        new_tokens: c.new_tokens,
        attention: attention_of(
            desc,
            match c.attention.as_str() {
                "eager" => AttentionImpl::Eager,
                _ => AttentionImpl::Sdpa,
            },
        ),
        weights: WeightFormat::ALL
            .iter()
            .find(|(_, n)| *n == c.weights)
            .unwrap_or_else(|| panic!("{}: weights {}", c.id, c.weights))
            .0,
        kv_dtype: KvDtype::Auto,
        moe_decode_batched: c.decode_experts.as_deref() != Some("grouped_mm"),
    }
}

fn infer_rows_of(file: &str) -> Vec<Row> {
    use memwall_core::memory::simulate_infer;
    let Ok(text) = std::fs::read_to_string(root().join(file)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let refused = refused_cases();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let c: InferCase =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad fixture line: {e}\n{line}"));
        assert_eq!(c.kind, "infer");
        assert!(c.versions.contains_key("torch"));
        let json = std::fs::read_to_string(root().join(&c.config)).expect("read config");
        let mut desc =
            memwall_formats::parse_hf_config(&json).unwrap_or_else(|e| panic!("{}: {e}", c.id));
        assert_eq!(desc.model_type, c.model_type, "{}", c.id);
        with_image_tokens(&mut desc, c.image_tokens);
        let w = infer_workload(&c, &desc);
        let Some(e) = unless_refused(simulate_infer(&desc, &w, Kernels::Cpu), &c.id, &refused)
        else {
            continue;
        };
        assert_eq!(
            memwall_core::memory::fast::simulate_infer(&desc, &w, Kernels::Cpu).as_ref(),
            Ok(&e),
            "{}: fast path",
            c.id
        );
        assert_eq!(
            e.params_total, c.measured.params_total,
            "{}: parameter count",
            c.id
        );
        let _ = c.measured.prefill_peak_bytes;
        out.push(Row::new(
            &c.id,
            &c.model_type,
            if c.image_tokens.is_some() {
                format!("inference image tokens {}", c.attention)
            } else {
                format!("inference {}", c.attention)
            },
            (c.measured.peak_bytes, e.peak_bytes),
            &c.measured.phase,
            e.phase,
        ));
    }
    out
}

/// One measured distributed case (`tests/truth/dist.jsonl`, `tools/truth/measure_dist.py`):
/// rank 0 of a fake process group, FSDP2 / DDP on the same transformers step.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DistCase {
    id: String,
    kind: String,
    config: String,
    model_type: String,
    strategy: String,
    world_size: u64,
    replicate: u64,
    reshard_after_forward: bool,
    mixed_precision: Option<BTreeMap<String, String>>,
    batch: u64,
    seq: u64,
    precision: String,
    optimizer: String,
    checkpointing: bool,
    attention: String,
    grad_accum: u64,
    measured: DistMeasured,
    versions: BTreeMap<String, String>,
    /// FSDP2 root `reshard_after_forward` (the harness records it; FSDP2 never reshards the root)
    #[serde(default)]
    root_reshard_after_forward: Option<bool>,
    dropout: String,
    /// DDP only
    #[serde(default)]
    gradient_as_bucket_view: Option<bool>,
    #[serde(default)]
    bucket_cap_mb: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    ddp_buckets: Option<serde_json::Value>,
    /// FSDP2 unit sizes as the harness saw them
    #[serde(default)]
    #[allow(dead_code)]
    fsdp_layout: Option<serde_json::Value>,
    /// peft LoRA applied before sharding
    #[serde(default)]
    lora: Option<LoraCase>,
}

#[derive(Debug, Deserialize)]
struct DistMeasured {
    peak_bytes: u64,
    at_peak: BTreeMap<String, u64>,
    phase: String,
    params_total: u64,
    #[serde(default)]
    #[allow(dead_code)]
    first_step_peak_bytes: Option<u64>,
    /// the FSDP/DDP hook event after which the peak happened
    #[serde(default)]
    #[allow(dead_code)]
    peak_after_event: Option<String>,
    /// the peak within each phase of the steady step
    phase_peaks: BTreeMap<String, u64>,
}

/// The peak within one phase of a distributed case: (case and phase, measured, estimated).
struct PhaseRow {
    id: String,
    measured: u64,
    estimated: u64,
    error_pct: f64,
}

/// Every distributed case (its step peak on rank 0) and every phase's own peak.
fn dist_rows() -> (Vec<Row>, Vec<PhaseRow>) {
    let Ok(text) = std::fs::read_to_string(root().join("tests/truth/dist.jsonl")) else {
        return (Vec::new(), Vec::new());
    };
    dist_rows_of(&text, None)
}

/// The rows of distributed cases `text` (JSON lines). With `refusals`, a case the estimator
/// refuses is recorded there (a scratch sweep) instead of failing the test.
fn dist_rows_of(
    text: &str,
    mut refusals: Option<&mut Vec<(String, String)>>,
) -> (Vec<Row>, Vec<PhaseRow>) {
    use memwall_core::layout::{Layout, Strategy};
    use memwall_core::memory::{simulate_train_dist_with, DistOptions};
    let mut out = Vec::new();
    let mut phases = Vec::new();
    let refused = refused_cases();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let c: DistCase =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad fixture line: {e}\n{line}"));
        assert_eq!(c.kind, "dist");
        assert!(c.versions.contains_key("torch"));
        assert!(
            c.bucket_cap_mb.is_none_or(|mb| mb == 25),
            "{}: bucket size",
            c.id
        );
        let json = std::fs::read_to_string(root().join(&c.config)).expect("read config");
        let desc =
            memwall_formats::parse_hf_config(&json).unwrap_or_else(|e| panic!("{}: {e}", c.id));
        assert_eq!(desc.model_type, c.model_type, "{}", c.id);
        let mut w = TrainWorkload::new(c.batch, c.seq);
        w.optimizer = optimizer(&c.id, &c.optimizer);
        w.precision = match (c.precision.as_str(), &c.mixed_precision) {
            // FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on an fp32 model
            // (composable `replicate` with a MixedPrecisionPolicy casts parameters without
            // autocast, which no CLI layout describes: DDP amp is autocast; measured +10.7%)
            (_, Some(_)) if c.strategy == "replicate" => {
                panic!("{}: replicate with mixed_precision has no CLI layout", c.id)
            }
            ("fp32", Some(mp)) if mp.get("param_dtype").map(String::as_str) == Some("bf16") => {
                Precision::AmpBf16
            }
            (p, None) => precision(&c.id, p),
            (p, mp) => panic!("{}: precision {p} with {mp:?} not mapped", c.id),
        };
        w.checkpointing = c.checkpointing;
        w.grad_accum = c.grad_accum;
        w.dropout = c.dropout == "config";
        w.lora = c.lora.as_ref().map(|l| Lora {
            rank: l.rank,
            targets: l.targets.clone(),
            qlora: false,
        });
        w.attention = attention_of(
            &desc,
            match c.attention.as_str() {
                "eager" => AttentionImpl::Eager,
                _ => AttentionImpl::Sdpa,
            },
        );
        let strategy = match (c.strategy.as_str(), c.reshard_after_forward) {
            // torch's composable `replicate`: DDP with bucket views, but a unit's gradients
            // live until its post-backward (`DistOptions::replicate`)
            ("ddp" | "replicate", _) => Strategy::Ddp,
            ("fsdp", true) => Strategy::FsdpFull,
            ("fsdp", false) => Strategy::FsdpGradOp,
            ("hsdp", _) => Strategy::Hsdp,
            (s, _) => panic!("{}: strategy {s}", c.id),
        };
        let layout = Layout {
            gpus: c.world_size,
            gpus_per_node: c.world_size / c.replicate.max(1),
            strategy,
            ..Layout::single()
        };
        let opts = DistOptions {
            fsdp_root_reshard: Some(c.root_reshard_after_forward.unwrap_or(false)),
            ddp_bucket_view: c.gradient_as_bucket_view.unwrap_or(false)
                || c.strategy == "replicate",
            replicate: c.strategy == "replicate",
        };
        let e = match (
            simulate_train_dist_with(&desc, &w, &layout, Kernels::Cpu, &opts),
            refused.get(&c.id),
        ) {
            (Ok(_), Some(_)) => panic!(
                "{} is listed under [[refused]] in known_gaps.toml but is estimated now: remove it",
                c.id
            ),
            (Ok(e), None) => e,
            // refused by name, with the reason the toml gives
            (Err(_), Some(_)) => continue,
            (Err(err), None) => match refusals.as_deref_mut() {
                Some(r) => {
                    r.push((c.id.clone(), err.to_string()));
                    continue;
                }
                None => panic!("{}: {err}", c.id),
            },
        };
        assert_eq!(
            memwall_core::memory::fast::simulate_train_dist_with(
                &desc,
                &w,
                &layout,
                Kernels::Cpu,
                &opts
            )
            .as_ref(),
            Ok(&e),
            "{}: fast path",
            c.id
        );
        assert_eq!(
            e.params_total, c.measured.params_total,
            "{}: parameters",
            c.id
        );
        // the harness measures rank 0
        let g = e
            .groups
            .iter()
            .find(|g| g.ranks.contains(&0))
            .expect("rank 0 is reported");
        // The distributed harness tracks its batch tensor too (measure_dist.py registers `ids`,
        // [batch, seq] int64, as "Inputs", alive through the whole step: tools/truth/README.md
        // `inputs`); memwall simulates the model's step, not the loop's batch (the single-GPU
        // harness leaves `ids` untracked, so its fixtures hold none). The comparison adds it to
        // every estimate of the distributed fixtures. It matters on tiny phases: the optimizer
        // phase of a small model is its sharded parameters, gradients and this tensor.
        let input_bytes = c.batch * c.seq * 8;
        assert_eq!(
            c.measured.at_peak.get("inputs").copied(),
            Some(input_bytes),
            "{}: the harness's batch tensor",
            c.id
        );
        // every phase's own peak, not only the step's: forward, loss, backward, optimizer
        for (phase, est) in &g.phase_peaks {
            let name = phase_name(*phase);
            let measured = *c
                .measured
                .phase_peaks
                .get(&name)
                .unwrap_or_else(|| panic!("{}: no measured {name} peak", c.id));
            let est = *est + input_bytes;
            phases.push(PhaseRow {
                id: format!("{} {name}", c.id),
                measured,
                estimated: est,
                error_pct: (est as f64 - measured as f64) / measured as f64 * 100.0,
            });
        }
        out.push(Row::new(
            &c.id,
            &c.model_type,
            format!("{} world {}", c.strategy, c.world_size),
            (c.measured.peak_bytes, g.peak_bytes + input_bytes),
            &c.measured.phase,
            g.phase,
        ));
    }
    (out, phases)
}

/// The `[[TABLE]]` entries of `tests/truth/known_gaps.toml`: case id → reason.
fn gaps_table(table: &str) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("tests/truth/known_gaps.toml"))
        .expect("tests/truth/known_gaps.toml exists (it may hold no entries)");
    let v: toml::Value = text.parse().expect("known_gaps.toml parses");
    v.get(table)
        .and_then(|g| g.as_array())
        .map(|list| {
            list.iter()
                .map(|g| {
                    let field = |k: &str| {
                        g.get(k)
                            .and_then(|x| x.as_str())
                            .unwrap_or_else(|| {
                                panic!("known_gaps.toml: a [[{table}]] without `{k}`")
                            })
                            .to_owned()
                    };
                    (field("id"), field("reason"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Cases listed in `tests/truth/known_gaps.toml` (`[[gap]]`) with their reason.
fn known_gaps() -> BTreeMap<String, String> {
    gaps_table("gap")
}

/// The estimate of case `id`, or `None` when it is refused by name and listed under `[[refused]]`
/// (with the reason the toml gives; the error names the field). Panics when a listed case is
/// estimated now (remove it from the list) or an unlisted one is refused.
fn unless_refused<T, E: std::fmt::Display>(
    result: Result<T, E>,
    id: &str,
    refused: &BTreeMap<String, String>,
) -> Option<T> {
    match (result, refused.get(id)) {
        (Ok(_), Some(_)) => panic!(
            "{id} is listed under [[refused]] in known_gaps.toml but is estimated now: remove it"
        ),
        (Ok(e), None) => Some(e),
        (Err(_), Some(_)) => None,
        (Err(err), None) => panic!("{id}: {err}"),
    }
}

/// Measured cases the estimator refuses by name (`[[refused]]` in `tests/truth/known_gaps.toml`)
/// with the reason: a combination found wrong and refused rather than estimated wrong. The
/// test fails when a listed case is estimated again (remove it then).
fn refused_cases() -> BTreeMap<String, String> {
    gaps_table("refused")
}

/// Asserts every case within 3% except listed known gaps, which must stay within 10% and
/// must still be gaps (a fixed gap has to leave the list).
fn check(rows: &[Row], what: &str) {
    let gaps = known_gaps();
    let mut bad = Vec::new();
    for r in rows {
        let err = r.error_pct.abs();
        match gaps.get(&r.id) {
            Some(_) if err > 10.0 => bad.push(format!(
                "{} (known gap) drifted to {:+.2}%",
                r.id, r.error_pct
            )),
            Some(_) if err <= 3.0 => bad.push(format!(
                "{} is listed as a known gap but is within 3% now: remove it",
                r.id
            )),
            Some(_) => {}
            None if err > 3.0 => bad.push(format!(
                "{}: {:+.2}% (measured {}, estimated {})",
                r.id, r.error_pct, r.measured, r.estimated
            )),
            None => {}
        }
    }
    assert!(
        bad.is_empty(),
        "{} {what} cases outside 3%:\n{}",
        bad.len(),
        bad.join("\n")
    );
    if !rows.is_empty() {
        let med = median(rows.iter().map(|r| r.error_pct.abs()).collect());
        assert!(med <= 1.0, "median |error| {med:.3}% > 1%");
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The random sample's rows: training, inference, distributed (with its phase peaks).
struct RandomRows {
    train: Vec<Row>,
    infer: Vec<Row>,
    dist: Vec<Row>,
    dist_phases: Vec<PhaseRow>,
}

/// The random distributed sample (`tests/truth/random_dist.jsonl`, cases drawn by
/// `tools/truth/sample_dist_cases.py`).
fn random_dist_rows() -> (Vec<Row>, Vec<PhaseRow>) {
    match std::fs::read_to_string(root().join("tests/truth/random_dist.jsonl")) {
        Ok(text) => dist_rows_of(&text, None),
        Err(_) => (Vec::new(), Vec::new()),
    }
}

/// Phase peaks of the random distributed sample are held within the hand-picked fixtures'
/// bound, every phase of every case, however small (an optimizer phase of 14 KB included).
const RANDOM_DIST_PHASE_BOUND_PCT: f64 = 3.0;

fn random_rows_all() -> RandomRows {
    let (dist, dist_phases) = random_dist_rows();
    RandomRows {
        train: random_rows(),
        infer: random_infer_rows(),
        dist,
        dist_phases,
    }
}

fn report(
    rows: &[Row],
    infer: &[Row],
    dist: &[Row],
    phases: &[PhaseRow],
    random: &RandomRows,
) -> String {
    let mut s = section_report(
        rows,
        "# Accuracy against measured PyTorch peaks\n\n## Training steps",
    );
    if !infer.is_empty() {
        s.push('\n');
        s.push_str(&section_report(infer, "## Inference (prefill + decode)"));
    }
    if !dist.is_empty() {
        s.push('\n');
        s.push_str(&section_report(
            dist,
            "## Distributed training, rank 0 (FSDP2 / DDP on a fake process group; `tests/truth/dist.jsonl`)",
        ));
        let worst = phases
            .iter()
            .max_by(|a, b| a.error_pct.abs().total_cmp(&b.error_pct.abs()));
        let _ = writeln!(
            s,
            "\n### Peak of every phase\n\nEach case's forward, loss, backward and optimizer phases, each against its own \
             measured peak: {} phase peaks, median |error| {:.3}%, worst {}.\n",
            phases.len(),
            median(phases.iter().map(|p| p.error_pct.abs()).collect()),
            worst.map_or("-".to_owned(), |w| format!(
                "{:+.3}% ({}: measured {}, estimated {})",
                w.error_pct, w.id, w.measured, w.estimated
            ))
        );
    }
    if !random.train.is_empty() {
        s.push('\n');
        s.push_str(&section_report(
            &random.train,
            "## Random sample, training steps (`tests/truth/random_train.jsonl`; cases drawn by \
             `tools/truth/sample_cases.py`: seeds 17, 71, 73, 97, 107, 127, 149, 157, 173, 191, 197, 211, 227 and 233 over the older families, \
             `tools/truth/cases/random_train.toml`; seeds 29, 53, 61, 67, 79, 89, 103, 113, 139, 151, 167, 181, 193, 199, 223, 229 and 239 over the issue-14 families, \
             `tools/truth/cases/random_new_train.toml`)",
        ));
    }
    if !random.infer.is_empty() {
        s.push('\n');
        s.push_str(&section_report(
            &random.infer,
            "## Random sample, inference (`tests/truth/random_infer.jsonl`; cases drawn by \
             `tools/truth/sample_cases.py`: seeds 17, 71, 73, 97, 107, 127, 149, 157, 173, 191, 197, 211, 227 and 233, `tools/truth/cases/random_infer.toml`; \
             seeds 29, 53, 61, 67, 79, 89, 103, 113, 139, 151, 167, 181, 193, 199, 223, 229 and 239, `tools/truth/cases/random_new_infer.toml`)",
        ));
    }
    if !random.dist.is_empty() {
        s.push('\n');
        s.push_str(&section_report(
            &random.dist,
            "## Random sample, distributed training, rank 0 (`tests/truth/random_dist.jsonl`; cases \
             drawn by `tools/truth/sample_dist_cases.py`: seeds 41, 101, 131, 179, 193 and 199 over the older families, 83, 109, 137, 163, 191, 197 and 211 over the issue-14 families)",
        ));
        let phases = &random.dist_phases;
        let outside: Vec<&PhaseRow> = phases
            .iter()
            .filter(|p| p.error_pct.abs() > RANDOM_DIST_PHASE_BOUND_PCT)
            .collect();
        let worst = phases
            .iter()
            .max_by(|a, b| a.error_pct.abs().total_cmp(&b.error_pct.abs()));
        let _ = writeln!(
            s,
            "\n### Peak of every phase\n\nEach case's forward, loss, backward and optimizer phases, each against its own \
             measured peak: {} phase peaks, median |error| {:.3}%, worst {}; {} outside \
             {RANDOM_DIST_PHASE_BOUND_PCT}%.\n",
            phases.len(),
            median(phases.iter().map(|p| p.error_pct.abs()).collect()),
            worst.map_or("-".to_owned(), |w| format!(
                "{:+.3}% ({}: measured {}, estimated {})",
                w.error_pct, w.id, w.measured, w.estimated
            )),
            outside.len(),
        );
        for p in outside {
            let _ = writeln!(
                s,
                "- `{}`: {:+.3}% (measured {}, estimated {})",
                p.id, p.error_pct, p.measured, p.estimated
            );
        }
    }
    let gaps = known_gaps();
    if !gaps.is_empty() {
        let _ = writeln!(
            s,
            "\n## Known gaps\n\nListed in `tests/truth/known_gaps.toml`: excluded from the 3% bound, still held \
             within 10%, and the test fails once one is back within 3%.\n"
        );
        for (id, reason) in &gaps {
            let err = rows
                .iter()
                .chain(infer)
                .chain(dist)
                .chain(&random.train)
                .chain(&random.infer)
                .chain(&random.dist)
                .find(|r| &r.id == id)
                .map_or_else(
                    || "not measured".to_owned(),
                    |r| format!("{:+.2}%", r.error_pct),
                );
            let _ = writeln!(s, "- `{id}` ({err}): {}", reason.replace('\n', " "));
        }
    }
    let refused = refused_cases();
    if !refused.is_empty() {
        let _ = writeln!(
            s,
            "\n## Refused\n\nMeasured cases the estimator refuses by name (`[[refused]]` in \
             `tests/truth/known_gaps.toml`): not in the figures above; the test fails once one is \
             estimated again.\n"
        );
        for (id, reason) in &refused {
            let _ = writeln!(s, "- `{id}`: {}", reason.replace('\n', " "));
        }
    }
    s
}

fn section_report(rows: &[Row], title: &str) -> String {
    let abs: Vec<f64> = rows.iter().map(|r| r.error_pct.abs()).collect();
    let worst = rows
        .iter()
        .max_by(|a, b| a.error_pct.abs().total_cmp(&b.error_pct.abs()));
    let mut s = String::new();
    let _ = writeln!(s, "{title}\n");
    if title.starts_with("# ") {
        let _ = writeln!(
        s,
        "Generated by `MEMWALL_UPDATE_ACCURACY=1 cargo test -p memwall-cli --test truth`; do not edit.\n\
         Truth: `tests/truth/train.jsonl`, measured by `tools/truth/measure.py` (PyTorch MemTracker on fake\n\
         CPU tensors; see `tools/truth/README.md`). Estimates: `memwall` runtime profile `hf` with CPU\n\
         kernel semantics (the only difference from the CUDA default is dropout's mask and CPU SDPA's\n\
         math fallback under attention dropout). Error = (estimate − measured) / measured.\n"
        );
    }
    let _ = writeln!(s, "- cases: {}", rows.len());
    let _ = writeln!(s, "- median |error|: {:.3}%", median(abs.clone()));
    if let Some(w) = worst {
        let _ = writeln!(s, "- worst |error|: {:.3}% ({})", w.error_pct.abs(), w.id);
    }
    let phase_ok = rows
        .iter()
        .filter(|r| r.phase_measured == r.phase_estimated)
        .count();
    let _ = writeln!(s, "- peak phase agrees: {phase_ok} of {}\n", rows.len());
    let mut by_cat: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in rows {
        by_cat
            .entry(&r.category)
            .or_default()
            .push(r.error_pct.abs());
        by_cat
            .entry(&r.model_type)
            .or_default()
            .push(r.error_pct.abs());
    }
    let sub = "###";
    let _ = writeln!(s, "{sub} By category and family\n\n| group | cases | median abs error | worst abs error |\n|---|---:|---:|---:|");
    for (k, v) in &by_cat {
        let worst = v.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            s,
            "| {k} | {} | {:.3}% | {:.3}% |",
            v.len(),
            median(v.clone()),
            worst
        );
    }
    let _ = writeln!(s, "\n{sub} Every case\n\n| case | measured bytes | estimated bytes | error | phase (measured / estimated) |\n|---|---:|---:|---:|---|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:+.3}% | {} / {} |",
            r.id, r.measured, r.estimated, r.error_pct, r.phase_measured, r.phase_estimated
        );
    }
    s
}

#[test]
fn every_training_case_within_three_percent() {
    let rows = rows();
    assert!(
        rows.len() >= 100,
        "expected the committed fixtures, found {}",
        rows.len()
    );
    check(&rows, "training");
}

#[test]
fn every_inference_case_within_three_percent() {
    let rows = infer_rows();
    assert!(
        rows.len() >= 40,
        "expected the committed fixtures, found {}",
        rows.len()
    );
    check(&rows, "inference");
}

#[test]
fn every_distributed_case_within_three_percent() {
    let (rows, phases) = dist_rows();
    assert!(
        rows.len() >= 20,
        "expected the committed distributed fixtures, found {}",
        rows.len()
    );
    check(&rows, "distributed");
    // and every phase's own peak, which exercises the forward all-gathers and the sharded
    // optimizer step that the step peaks (all in backward) do not
    let bad: Vec<String> = phases
        .iter()
        .filter(|p| p.error_pct.abs() > 3.0)
        .map(|p| {
            format!(
                "{}: {:+.2}% (measured {}, estimated {})",
                p.id, p.error_pct, p.measured, p.estimated
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "phase peaks outside 3%:\n{}",
        bad.join("\n")
    );
}

/// Every row of `picked` within `bound` percent, naming all that are not.
fn assert_rows_within(picked: &[&Row], bound: f64) {
    let bad: Vec<String> = picked
        .iter()
        .filter(|r| r.error_pct.abs() > bound)
        .map(|r| format!("{}: {:+.3}%", r.id, r.error_pct))
        .collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Every phase in `set` within its `bound` (percent), naming the first one outside it.
fn assert_phases_within<'a>(
    set: impl IntoIterator<Item = &'a PhaseRow>,
    bound: impl Fn(&PhaseRow) -> f64,
) {
    for p in set {
        assert!(
            p.error_pct.abs() <= bound(p),
            "{}: {:+.3}% (measured {}, estimated {})",
            p.id,
            p.error_pct,
            p.measured,
            p.estimated
        );
    }
}

/// The forward phases of the distributed fixtures whose id `pick`s: `n` of them (`what`), each
/// within 0.05%.
fn dist_forward_phases_within(pick: impl Fn(&str) -> bool, n: usize, what: &str) {
    let (_, phases) = dist_rows();
    let set: Vec<&PhaseRow> = phases
        .iter()
        .filter(|p| p.id.ends_with(" forward") && pick(&p.id))
        .collect();
    assert_eq!(set.len(), n, "{what}");
    assert_phases_within(set, |_| 0.05);
}

/// Mamba-2's one-head mixer in bf16 (`ddp-mamba2-s139-*`, helper 46): `Mamba2Mixer.torch_forward`
/// keeps its locals `hidden_states_B_C` (the convolution's silu output) and `scan_output` (the
/// gated norm's fp32 output) through `out_proj`, where one sequence of one head peaks (the scan's
/// own instants are low: its `bmm` operands are views). The forward phase of 1 × 100 tokens was
/// -0.61% without them; every forward phase of the set within 0.05% now.
#[test]
fn mamba2_one_head_forward_phases_hold_out_projs_locals() {
    dist_forward_phases_within(
        |id| id.starts_with("ddp-mamba2-s139-"),
        3,
        "the ddp-mamba2-s139-* fixtures",
    );
}

/// Eager attention with one kv head (`*-mqa-*`, helper 53): repeat_kv's expand + reshape is a
/// view and matmul copies the expanded key and value at each bmm (a batch above one). In a
/// checkpointed layer's first forward nothing saves those copies; with a gradient bmm saves them,
/// the value's only from the second matmul on. The forward phases were +2.48% and +8.64%
/// (checkpointed: both copies kept through the softmax) and +1.19% and +1.39% (the value's copy
/// made at repeat_kv); each within 0.05% now.
#[test]
fn eager_mqa_forward_phases_copy_at_each_matmul() {
    dist_forward_phases_within(
        |id| id.contains("-mqa-"),
        6,
        "the ddp-mqa-* and fsdp-mqa-* fixtures",
    );
}

/// Every single-GPU training row that measured its forward phase's own peak
/// (`forward_peak_bytes`) holds it within the 3% bound; the helper-53 rows (`h53-*`: eager
/// attention with one kv head, plain, checkpointed and under autocast, and a grouped-query one
/// under autocast; Phi with its embedding dropout, plain and checkpointed) within 0.05%. Their
/// forward phases were +10.4% (one kv head under amp-bf16: fp32 repeat_kv copies and the
/// softmax's fp32 copy of an input the fp32 mask had made fp32 already), +2.1% (checkpointed:
/// both copies kept), +2.5% (Phi checkpointed: the embedding lookup kept past the dropout that
/// rebinds it) and the like.
#[test]
fn training_forward_phases_where_measured() {
    let (_, phases) = train_rows_and_forward_phases_of("tests/truth/train.jsonl");
    let h53 = phases.iter().filter(|p| p.id.starts_with("h53-")).count();
    assert_eq!(h53, 8, "the h53-* fixtures");
    assert_phases_within(
        &phases,
        |p| if p.id.starts_with("h53-") { 0.05 } else { 3.0 },
    );
}

/// FSDP2's MixedPrecisionPolicy with LoRA (`mplora-*`, issue h35): every step and every phase
/// within 0.5%. Each mechanism the set was built to find shows here: the adapters cast to bf16
/// with the base (forward phases were up to +46% with fp32 adapters), the final norm's output
/// bound until after the loss (loss phases -0.6% to -3.6% under checkpointing), the eager query
/// copied for the scores' bmm (-0.68%), the activation before up_proj (-0.83%). The phases listed are still off (each names why); one
/// that comes within 0.5% must leave the list.
#[test]
fn mixed_precision_lora_within_half_a_percent() {
    // none now. (glm4's attention-only sdpa forward was 8,296 B short; with the base model's
    // int64 position ids, 2,048 B, it is 6,248 B short, -0.41%, not traced.) olmo2's was
    // 24,736 B short until FSDP2's MixedPrecisionPolicy(cast_forward_inputs=True) casting the
    // fp32 cos/sin to bf16 copies at every decoder layer's pre-forward was modelled
    // (`Builder::unit_cast_inputs`, h52: -0.518% -> -0.003%); with it, mlp-eager-b2s256's
    // +0.54% forward showed the value's single-head copy made by `probs @ value`, after the
    // softmax (`mqa_copy` in attention.rs)
    const OFF: [&str; 0] = [];
    let (rows, phases) = dist_rows();
    let steps: Vec<&Row> = rows
        .iter()
        .filter(|r| r.id.starts_with("mplora-"))
        .collect();
    assert!(steps.len() >= 20, "{} mplora cases", steps.len());
    let mut bad: Vec<String> = steps
        .iter()
        .filter(|r| r.error_pct.abs() > 0.5)
        .map(|r| format!("{}: {:+.3}%", r.id, r.error_pct))
        .collect();
    for p in phases.iter().filter(|p| p.id.starts_with("mplora-")) {
        let off = OFF.contains(&p.id.as_str());
        if off && p.error_pct.abs() <= 0.5 {
            bad.push(format!("{} is within 0.5% now: remove it from OFF", p.id));
        } else if !off && p.error_pct.abs() > 0.5 {
            bad.push(format!(
                "{}: {:+.3}% (measured {}, estimated {})",
                p.id, p.error_pct, p.measured, p.estimated
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Helper 52's mechanisms, each held at the phase it moved: Qwen 2 MoE's unread sliding mask
/// under SDPA, FSDP2 MixedPrecisionPolicy's per-layer casts of fp32 rotary tables (OLMo 2,
/// ERNIE 4.5, whose rotation keeps both fp32 sums), Phi's embeddings rebound to their dropout
/// and the parallel residual's branches alive through both adds (Phi, GPT-NeoX), a single
/// key/value head's copies made by each matmul at a batch above one (eager), Falcon's
/// list-indexed key and value heads in the new decoder architecture: every phase
/// of the `h52-` fixtures and the random rows that showed them, forward phases within 0.1%
/// (they were -4.5% to +3.2%), the others within 0.2%.
#[test]
fn helper_52_mechanisms_hold_their_phases() {
    const RANDOM: [&str; 7] = [
        "rdist179-016-qwen2moe forward",
        "rdist131-020-olmo2 forward",
        "rdist137-002-phi forward",
        "rdist109-026-phi forward",
        "rdist163-012-phi forward",
        "rdist83-034-ernie45moe backward",
        "rdist-035-falcon forward",
    ];
    let (_, phases) = dist_rows();
    let (_, random) = random_dist_rows();
    let set: Vec<_> = phases
        .iter()
        .filter(|p| p.id.starts_with("h52-"))
        .chain(random.iter().filter(|p| RANDOM.contains(&p.id.as_str())))
        .collect();
    assert_eq!(set.len(), 15 * 4 + RANDOM.len(), "the h52 fixtures' phases");
    let bad: Vec<String> = set
        .iter()
        .filter(|p| p.error_pct.abs() > if p.id.ends_with(" forward") { 0.1 } else { 0.2 })
        .map(|p| {
            format!(
                "{}: {:+.3}% (measured {}, estimated {})",
                p.id, p.error_pct, p.measured, p.estimated
            )
        })
        .collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Falcon multi_query's `_split_heads` indexes the single key and value heads with a list
/// (`fused_qkv[..., [-2], :]`, `fused_qkv[..., [-1], :]`, models/falcon/modeling_falcon.py): the
/// value matmul saves that copy, not the fused qkv output (h47). Without it the checkpointed
/// LoRA fixtures at a batch of one and two were +1.3% and +1.6% (the fused output kept per
/// layer through the recompute), rnd-t149-014-falcon +1.39%.
#[test]
fn falcon_multi_query_index_copies_within_a_tenth_of_a_percent() {
    let rows = rows();
    let mut picked: Vec<&Row> = rows
        .iter()
        .filter(|r| r.id.starts_with("falcon-mqidx-"))
        .collect();
    assert!(picked.len() >= 5, "{} falcon-mqidx cases", picked.len());
    let random = random_rows();
    picked.extend(random.iter().filter(|r| r.id == "rnd-t149-014-falcon"));
    assert_rows_within(&picked, 0.1);
}

#[test]
fn every_random_case_within_three_percent() {
    // the random sample (issue 17): the same bounds as the hand-picked fixtures
    let random = random_rows_all();
    check(&random.train, "random training");
    check(&random.infer, "random inference");
    check(&random.dist, "random distributed");
    let bad: Vec<String> = random
        .dist_phases
        .iter()
        .filter(|p| p.error_pct.abs() > RANDOM_DIST_PHASE_BOUND_PCT)
        .map(|p| {
            format!(
                "{}: {:+.2}% (measured {}, estimated {})",
                p.id, p.error_pct, p.measured, p.estimated
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "phase peaks outside {RANDOM_DIST_PHASE_BOUND_PCT}%:\n{}",
        bad.join("\n")
    );
}

#[test]
fn accuracy_report_is_current() {
    let (dist, phases) = dist_rows();
    let random = random_rows_all();
    let mut text = report(&rows(), &infer_rows(), &dist, &phases, &random);
    let titan = titan_rows();
    if !titan.is_empty() {
        text.push_str(&titan_section(&titan));
        let pp = titan_pp_rows();
        if !pp.is_empty() {
            text.push_str(&titan_pp_section(&pp));
        }
    }
    let path = root().join("docs/accuracy.md");
    if std::env::var_os("MEMWALL_UPDATE_ACCURACY").is_some() {
        std::fs::write(&path, &text).expect("write docs/accuracy.md");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == text,
        "docs/accuracy.md is out of date: run `MEMWALL_UPDATE_ACCURACY=1 cargo test -p memwall-cli --test truth`"
    );
}

/// One measured torchtitan case (`tests/truth/titan.jsonl`, `tools/truth/titan/measure_titan.py`):
/// torchtitan 0.3.0's Llama 3, Qwen 3 or DeepSeek-V3 step under FSDP2 on a fake process group,
/// FSDPMemTracker.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TitanCase {
    id: String,
    kind: String,
    /// torchtitan's model module (absent: llama3)
    #[serde(default)]
    model: Option<String>,
    flavor: String,
    layers: usize,
    world_size: u64,
    batch: u64,
    seq: u64,
    /// none, full, selective (op-level SelectiveAC) or every-k:K
    activation_checkpoint: String,
    loss: String,
    attention: String,
    /// `fsdp_reshard_after_forward` (absent: "default")
    #[serde(default)]
    reshard_after_forward: Option<String>,
    /// `optimizer.implementation` (absent: "fused", torchtitan 0.3.0's default)
    #[serde(default)]
    optimizer_implementation: Option<String>,
    /// `tensor_parallel_degree` (absent: 1)
    #[serde(default)]
    tp: Option<u64>,
    /// `expert_parallel_degree` (absent: 1)
    #[serde(default)]
    ep: Option<u64>,
    /// the routing the EP case ran under (the harness's balanced split sizes)
    #[serde(default)]
    #[allow(dead_code)]
    ep_routing: Option<String>,
    /// `enable_sequence_parallel` (present with `tp`)
    #[serde(default)]
    sequence_parallel: Option<bool>,
    /// `data_parallel_replicate_degree` (absent: 1): HSDP, dp_shard = world / dp_replicate
    #[serde(default)]
    dp_replicate: Option<u64>,
    /// MoE flavours: the router gate ran in fp32, as CUDA autocast runs it (emulated on CPU)
    #[serde(default)]
    #[allow(dead_code)]
    router_gate: Option<String>,
    /// torchtitan's `Float8LinearConverter` recipe (absent: bf16 linears)
    #[serde(default)]
    float8: Option<String>,
    /// `pipeline_parallel_degree` (absent: 1; `tests/truth/titan_pp.jsonl`)
    #[serde(default)]
    pp: Option<u64>,
    /// the pp rank measured
    #[serde(default)]
    pp_rank: Option<u64>,
    /// `pipeline_parallel_schedule`
    #[serde(default)]
    schedule: Option<String>,
    /// `pipeline_parallel_microbatch_size`
    #[serde(default)]
    microbatch_size: Option<u64>,
    /// `local_batch_size / microbatch_size`
    #[serde(default)]
    microbatches: Option<u64>,
    measured: TitanMeasured,
    versions: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TitanMeasured {
    peak_bytes: u64,
    #[allow(dead_code)]
    at_peak: BTreeMap<String, u64>,
    #[allow(dead_code)]
    first_step_peak_bytes: u64,
}

/// A torchtitan case: its row and the instant memwall puts the peak at.
struct TitanRow {
    row: Row,
    instant: String,
}

fn titan_rows() -> Vec<TitanRow> {
    use memwall_core::layout::{Layout, Offload, OffloadDevice, Schedule, Strategy};
    use memwall_core::memory::titan::{
        instants, simulate_train_titan, Float8Recipe, Instant, Job, ReshardPolicy, TitanOptions,
    };
    let Ok(text) = std::fs::read_to_string(root().join("tests/truth/titan.jsonl")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let c: TitanCase =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad fixture line: {e}\n{line}"));
        assert_eq!(c.kind, "torchtitan-train");
        assert_eq!((c.loss.as_str(), c.attention.as_str()), ("ce", "flex"));
        assert_eq!(
            c.versions.get("torchtitan").map(String::as_str),
            Some("0.3.0")
        );
        // torchtitan's flavours and the HF configs whose shapes they are
        let config = match (c.model.as_deref().unwrap_or("llama3"), c.flavor.as_str()) {
            ("llama3", "8B") => "data/models/meta-llama/Llama-3.1-8B.json",
            ("llama3", "70B") => "data/models/meta-llama/Llama-3.1-70B.json",
            ("llama3", "405B") => "data/models/meta-llama/Llama-3.1-405B.json",
            ("qwen3", "0.6B") => "data/models/Qwen/Qwen3-0.6B.json",
            ("qwen3", "1.7B" | "4B") => "data/models/Qwen/Qwen3-1.7B.json",
            ("qwen3", "8B") => "data/models/Qwen/Qwen3-8B.json",
            ("qwen3", "14B") => "data/models/Qwen/Qwen3-14B.json",
            ("qwen3", "32B") => "data/models/Qwen/Qwen3-32B.json",
            ("qwen3", "30B-A3B") => "data/models/Qwen/Qwen3-30B-A3B.json",
            ("qwen3", "235B-A22B") => "data/models/Qwen/Qwen3-235B-A22B.json",
            ("deepseek_v3", "671B" | "16B") => "data/models/deepseek-ai/DeepSeek-V3.json",
            (m, f) => panic!("{}: model {m} flavour {f}", c.id),
        };
        let mut json = std::fs::read_to_string(root().join(config)).expect("read config");
        if (c.model.as_deref(), c.flavor.as_str()) == (Some("qwen3"), "4B") {
            // torchtitan's qwen3 "4B" flavour (models/qwen3/__init__.py `_4b`: dim 2560, 32
            // heads, 8 kv heads of 128, hidden_dim 9728, vocab 151936, tied), Qwen3-4B's
            // config.json shapes; no Qwen3-4B config is in the catalogue, so the 1.7B's (the
            // same family, vocabulary, head_dim, kv heads and tying) with those fields set
            let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
            v["hidden_size"] = 2560.into();
            v["num_attention_heads"] = 32.into();
            v["intermediate_size"] = 9728.into();
            v["num_hidden_layers"] = 36.into();
            json = v.to_string();
        }
        if (c.model.as_deref(), c.flavor.as_str()) == (Some("deepseek_v3"), "16B") {
            // torchtitan's deepseek_v3 "16B" flavour (models/deepseek_v3/__init__.py `_16b`:
            // DeepSeek-V2-Lite's shapes: dim 2048, 16 heads, no q LoRA, kv_lora_rank 512, 1
            // dense block of 10944, 64 experts of 1408, top 6, 2 shared experts, vocab
            // 102400); the catalogue has no DeepSeek-V2-Lite config (model_type deepseek_v2),
            // so DeepSeek-V3's with those fields set (its router: softmax, no node-limited
            // routing, `route_norm = False` = `norm_topk_prob: false`)
            let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
            v["hidden_size"] = 2048.into();
            v["num_attention_heads"] = 16.into();
            v["num_key_value_heads"] = 16.into();
            v["q_lora_rank"] = serde_json::Value::Null;
            v["intermediate_size"] = 10944.into();
            v["moe_intermediate_size"] = 1408.into();
            v["n_routed_experts"] = 64.into();
            v["num_experts_per_tok"] = 6.into();
            v["n_shared_experts"] = 2.into();
            v["first_k_dense_replace"] = 1.into();
            v["n_group"] = 1.into();
            v["topk_group"] = 1.into();
            v["norm_topk_prob"] = false.into();
            v["scoring_func"] = "softmax".into();
            v["routed_scaling_factor"] = 1.0.into();
            v["vocab_size"] = 102400.into();
            v["num_hidden_layers"] = 27.into();
            json = v.to_string();
        }
        let mut desc = memwall_formats::parse_hf_config(&json).unwrap();
        desc.layers.truncate(c.layers);
        let mut w = TrainWorkload::new(c.batch, c.seq);
        w.precision = Precision::AmpBf16;
        w.optimizer = match c.optimizer_implementation.as_deref() {
            None | Some("fused") => Optimizer::AdamwFused,
            Some("foreach") => Optimizer::Adamw,
            Some(o) => panic!("{}: optimizer {o}", c.id),
        };
        let policy = match c.activation_checkpoint.as_str() {
            "none" => None,
            "full" => Some(CheckpointPolicy::Full),
            "selective" => Some(CheckpointPolicy::SelectiveOp),
            p => Some(p.parse::<CheckpointPolicy>().unwrap()),
        };
        if let Some(p) = policy {
            w.checkpointing = true;
            w.step_options.checkpointing_policy = p;
        }
        let reshard = match c.reshard_after_forward.as_deref() {
            None | Some("default") => ReshardPolicy::Default,
            Some("always") => ReshardPolicy::Always,
            Some("never") => ReshardPolicy::Never,
            Some(r) => panic!("{}: reshard {r}", c.id),
        };
        let float8 = c.float8.as_deref().map(|r| {
            r.parse::<Float8Recipe>()
                .unwrap_or_else(|e| panic!("{}: {e}", c.id))
        });
        // HSDP: `--strategy hsdp` with `--gpus-per-node` = the shard group
        let replicas = c.dp_replicate.unwrap_or(1);
        let dp_shard = c.world_size / replicas;
        let layout = Layout {
            gpus: c.world_size,
            gpus_per_node: dp_shard,
            strategy: if replicas > 1 {
                Strategy::Hsdp
            } else {
                Strategy::FsdpFull
            },
            tp: c.tp.unwrap_or(1),
            sequence_parallel: c.sequence_parallel.unwrap_or(false),
            pp: 1,
            schedule: Schedule::OneFOneB,
            virtual_stages: 1,
            cp: 1,
            ep: c.ep.unwrap_or(1),
            offload: Offload::None,
            offload_device: OffloadDevice::Cpu,
        };
        let e = simulate_train_titan(
            &desc,
            &w,
            &layout,
            &TitanOptions {
                reshard: Some(reshard),
                float8,
                float8_all_gather: false,
            },
        )
        .unwrap_or_else(|err| panic!("{}: {err}", c.id));
        let job = Job {
            shapes: memwall_core::memory::titan::shapes(&desc).unwrap(),
            world: dp_shard,
            tp: c.tp.unwrap_or(1),
            ep: c.ep.unwrap_or(1),
            batch: c.batch,
            seq: c.seq,
            checkpointing: policy,
            reshard,
            fused_optimizer: c.optimizer_implementation.as_deref() != Some("foreach"),
            float8,
        };
        let all = instants(&job).unwrap();
        let at = all
            .iter()
            .max_by_key(|x| (x.total(), std::cmp::Reverse(x.name.clone())))
            .map(Instant::total)
            .unwrap();
        let instant = all.iter().find(|x| x.total() == at).unwrap().name.clone();
        assert_eq!(u128::from(e.peak_bytes), at, "{}", c.id);
        out.push(TitanRow {
            row: Row::new(
                &c.id,
                &desc.model_type,
                format!("ac {}", c.activation_checkpoint),
                (c.measured.peak_bytes, e.peak_bytes),
                "-",
                e.groups[0].phase,
            ),
            instant,
        });
    }
    out
}

/// torchtitan cases with pipeline parallelism (`tests/truth/titan_pp.jsonl`): each fixture is
/// one pp rank's peak; memwall's group of that rank is compared.
fn titan_pp_rows() -> Vec<TitanRow> {
    use memwall_core::layout::{Layout, Offload, OffloadDevice, Schedule, Strategy};
    use memwall_core::memory::titan::{simulate_train_titan, TitanOptions};
    let Ok(text) = std::fs::read_to_string(root().join("tests/truth/titan_pp.jsonl")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let c: TitanCase =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad fixture line: {e}\n{line}"));
        assert_eq!(c.kind, "torchtitan-train");
        assert_eq!((c.loss.as_str(), c.attention.as_str()), ("ce", "flex"));
        let policy = match c.activation_checkpoint.as_str() {
            "none" => None,
            "full" => Some(CheckpointPolicy::Full),
            "selective" => Some(CheckpointPolicy::SelectiveOp),
            p => Some(
                p.parse::<CheckpointPolicy>()
                    .unwrap_or_else(|e| panic!("{}: AC {p}: {e}", c.id)),
            ),
        };
        let config = match (c.model.as_deref().unwrap_or("llama3"), c.flavor.as_str()) {
            ("llama3", "8B") => "data/models/meta-llama/Llama-3.1-8B.json",
            ("llama3", "70B") => "data/models/meta-llama/Llama-3.1-70B.json",
            ("qwen3", "8B") => "data/models/Qwen/Qwen3-8B.json",
            ("qwen3", "14B") => "data/models/Qwen/Qwen3-14B.json",
            ("qwen3", "32B") => "data/models/Qwen/Qwen3-32B.json",
            ("qwen3", "30B-A3B") => "data/models/Qwen/Qwen3-30B-A3B.json",
            ("qwen3", "235B-A22B") => "data/models/Qwen/Qwen3-235B-A22B.json",
            (m, f) => panic!("{}: model {m} flavour {f}", c.id),
        };
        let json = std::fs::read_to_string(root().join(config)).expect("read config");
        let mut desc = memwall_formats::parse_hf_config(&json).unwrap();
        desc.layers.truncate(c.layers);
        let (pp, rank) = (c.pp.expect("pp"), c.pp_rank.expect("pp_rank"));
        let mbs = c.microbatch_size.expect("microbatch_size");
        let n = c.microbatches.expect("microbatches");
        assert_eq!(mbs * n, c.batch, "{}", c.id);
        let mut w = TrainWorkload::new(mbs, c.seq);
        w.grad_accum = n;
        w.precision = Precision::AmpBf16;
        w.optimizer = match c.optimizer_implementation.as_deref() {
            None | Some("fused") => Optimizer::AdamwFused,
            Some("foreach") => Optimizer::Adamw,
            Some(o) => panic!("{}: optimizer {o}", c.id),
        };
        if let Some(p) = policy {
            w.checkpointing = true;
            w.step_options.checkpointing_policy = p;
        }
        let (schedule, virtual_stages) = match c.schedule.as_deref() {
            Some("1F1B") => (Schedule::OneFOneB, 1),
            Some("GPipe") => (Schedule::Gpipe, 1),
            Some("Interleaved1F1B") => (Schedule::Interleaved, 2),
            s => panic!("{}: schedule {s:?}", c.id),
        };
        let layout = Layout {
            gpus: c.world_size,
            gpus_per_node: c.world_size,
            strategy: Strategy::FsdpFull,
            tp: c.tp.unwrap_or(1),
            sequence_parallel: c.sequence_parallel.unwrap_or(false),
            pp,
            schedule,
            virtual_stages,
            cp: 1,
            ep: 1,
            offload: Offload::None,
            offload_device: OffloadDevice::Cpu,
        };
        let e = simulate_train_titan(&desc, &w, &layout, &TitanOptions::default())
            .unwrap_or_else(|err| panic!("{}: {err}", c.id));
        let g = &e.groups[usize::try_from(rank).unwrap()];
        let job = memwall_core::memory::titan::PipeJob {
            shapes: memwall_core::memory::titan::shapes(&desc).unwrap(),
            world: c.world_size,
            pp,
            tp: c.tp.unwrap_or(1),
            rank,
            schedule,
            stages_per_rank: virtual_stages,
            microbatch_size: mbs,
            microbatches: n,
            seq: c.seq,
            fused_optimizer: w.optimizer == Optimizer::AdamwFused,
            checkpointing: policy,
        };
        let all = memwall_core::memory::titan::rank_instants(&job).unwrap();
        let at = all.iter().map(|x| x.total()).max().unwrap();
        assert_eq!(u128::from(g.peak_bytes), at, "{}", c.id);
        let instant = all.iter().find(|x| x.total() == at).unwrap().name.clone();
        out.push(TitanRow {
            row: Row::new(
                &c.id,
                &desc.model_type,
                format!(
                    "pp {pp} rank {rank} {}",
                    c.schedule.as_deref().unwrap_or("")
                ),
                (c.measured.peak_bytes, g.peak_bytes),
                "-",
                g.phase,
            ),
            instant,
        });
    }
    out
}

#[test]
fn every_torchtitan_pipeline_case_within_three_percent() {
    let rows = titan_pp_rows();
    assert!(
        rows.len() >= 12,
        "expected the committed torchtitan pipeline fixtures, found {}",
        rows.len()
    );
    for r in &rows {
        eprintln!(
            "{} {} {} {:+.3}%",
            r.row.id, r.row.measured, r.row.estimated, r.row.error_pct
        );
    }
    let plain: Vec<Row> = rows.into_iter().map(|r| r.row).collect();
    check(&plain, "torchtitan pipeline");
}

fn titan_section(rows: &[TitanRow]) -> String {
    titan_section_with(
        rows,
        "\n## torchtitan runtime profile (`--runtime torchtitan`; `tests/truth/titan.jsonl`)\n\n\
         torchtitan 0.3.0's own Llama 3, Qwen 3 (dense, MoE) and DeepSeek-V3 steps (its models, \
         FSDP2 units and reshard policy, FullAC / SelectiveAC, CrossEntropyLoss, fused or foreach \
         AdamW, TP + SP, float8 linears: `titan-fp8-*`, torchtitan's Float8LinearConverter over \
         torchao 0.18.0; HSDP: `*-hsdp-*`, dp_replicate R × dp_shard S as `-rRsS`; expert \
         parallelism: `titan-*-ep*`, the all-to-all dispatch under balanced routing) \
         on a fake process group, measured by \
         `tools/truth/titan/measure_titan.py` with FSDPMemTracker (rank 0, steady step); \
         estimates: `memory/titan` (`--runtime torchtitan --precision amp-bf16 --strategy \
         fsdp-full`, or `--strategy hsdp --gpus-per-node S`).\n",
    )
}

fn titan_pp_section(rows: &[TitanRow]) -> String {
    titan_section_with(
        rows,
        "\n### torchtitan pipeline parallelism (`--runtime torchtitan --pp N`; \
         `tests/truth/titan_pp.jsonl`)\n\n\
         One pp rank per case (torchtitan's Llama 3 and Qwen 3, dense and MoE; 1F1B, GPipe, \
         Interleaved1F1B; FSDP2 over dp_shard, without TP or, `titan-pptp-*`, with TP + SP on a \
         pp × dp_shard × tp mesh; no AC, FullAC or SelectiveAC; splits \
         that leave a stage the embeddings or `[norm, lm_head]` alone included), \
         measured by `measure_titan.py --pp-cases` on a fake pp × dp_shard mesh; estimates: \
         `memory/titan/pipeline.rs`, the group of that pp rank. The model follows real tensors \
         where they differ from fake ones (`tests/truth/titan_crosscheck.jsonl`: one \
         `[mb, seq, dim]` bf16, `[mb, seq/tp, dim]` with TP, per in-flight microbatch fewer on \
         stages before the last), hence \
         the small negative errors.\n",
    )
}

fn titan_section_with(rows: &[TitanRow], header: &str) -> String {
    let abs: Vec<f64> = rows.iter().map(|r| r.row.error_pct.abs()).collect();
    let mut s = String::new();
    let _ = writeln!(s, "{header}");
    let _ = writeln!(s, "- cases: {}", rows.len());
    let _ = writeln!(s, "- median |error|: {:.3}%", median(abs.clone()));
    if let Some(w) = rows
        .iter()
        .max_by(|a, b| a.row.error_pct.abs().total_cmp(&b.row.error_pct.abs()))
    {
        let _ = writeln!(
            s,
            "- worst |error|: {:.3}% ({})",
            w.row.error_pct.abs(),
            w.row.id
        );
    }
    let _ = writeln!(
        s,
        "\n| case | measured bytes | estimated bytes | error | memwall's peak instant |\n|---|---:|---:|---:|---|"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:+.3}% | {} |",
            r.row.id, r.row.measured, r.row.estimated, r.row.error_pct, r.instant
        );
    }
    s
}

#[test]
fn every_torchtitan_case_within_three_percent() {
    let rows = titan_rows();
    assert!(
        rows.len() >= 12,
        "expected the committed torchtitan fixtures, found {}",
        rows.len()
    );
    let plain: Vec<Row> = rows.into_iter().map(|r| r.row).collect();
    check(&plain, "torchtitan");
}

/// Fake must equal real (`tests/truth/titan_crosscheck.jsonl`, `measure_titan.py --crosscheck`):
/// every torchtitan crosscheck ran its step once on fake and once on real CPU tensors, and the
/// two peaks and breakdowns are the same bytes (llama3 and qwen3 debug models), except on the
/// pipeline stages before the last, where the one difference is exactly what the docs say.
#[test]
fn every_torchtitan_crosscheck_measures_the_same_on_fake_and_real_tensors() {
    let text = std::fs::read_to_string(root().join("tests/truth/titan_crosscheck.jsonl"))
        .expect("read titan_crosscheck.jsonl");
    let mut models = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("crosscheck row");
        let id = v["id"].as_str().expect("id");
        assert!(v["fake"]["peak_bytes"].as_u64().unwrap_or(0) > 0, "{id}");
        let args: Vec<&str> = v["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        let arg = |name: &str| {
            args.iter()
                .position(|a| *a == name)
                .map(|i| args[i + 1].parse::<i64>().expect("a number"))
        };
        // torchtitan's default split gives stage 0 `(layers + 2) / stages` "layers" (one more
        // for the first `(layers + 2) % stages`), the embeddings counting one: with one, it
        // holds the embeddings alone and peaks at its gradient reduce-scatter, after every
        // microbatch's backward (nothing in flight, no difference)
        let embeddings_alone = |pp: i64| {
            let effective = arg("--layers").expect("--layers") + 2;
            effective / pp == 1 && effective % pp == 0
        };
        // a peak inside the stage's gradient reduction after its last microbatch (nothing in
        // flight): some units already resharded, so the bf16 gathered parameters are less than
        // they are with every unit gathered (`2 · dp_shard · ceil(n / dp_shard)` bytes against
        // `4 · ceil(n / dp_shard)` of fp32 shards: `unsharded · 2 = sharded · dp_shard`); seen on
        // the MoE stage 0 under SelectiveAC, whose saved microbatches weigh less than the
        // reduction's fp32 buffers
        let in_reduction = |pp: i64| {
            let dp = arg("--world").expect("--world") / pp / arg("--tp").unwrap_or(1);
            let at = &v["fake"]["at_peak"];
            let (sharded, unsharded) = (
                at["sharded_param"].as_i64().expect("sharded_param"),
                at["unsharded_param"].as_i64().expect("unsharded_param"),
            );
            unsharded * 2 < sharded * dp
        };
        let expected = match (arg("--pp"), arg("--pp-rank")) {
            (Some(pp), Some(0)) if !args.contains(&"Interleaved1F1B") && embeddings_alone(pp) => 0,
            (Some(pp), Some(_)) if in_reduction(pp) => 0,
            // a pipeline stage before the last: real tensors keep one `[mb, seq, dim]` bf16
            // fewer per microbatch in flight at the peak than fake ones (tools/truth/titan/
            // README.md; the model follows real tensors). In flight: every microbatch under
            // GPipe, min(n, pp - rank) under 1F1B; the debug model's dim is 256, mb 1; with TP
            // + SP the boundary tensor is the sequence shard, `[mb, seq / tp, dim]`.
            (Some(pp), Some(rank)) if rank < pp - 1 => {
                let n = arg("--batch").expect("--batch");
                let in_flight = if args.contains(&"GPipe") {
                    n
                } else {
                    n.min(pp - rank)
                };
                -in_flight * arg("--seq").expect("--seq") / arg("--tp").unwrap_or(1) * 256 * 2
            }
            _ => 0,
        };
        assert_eq!(v["difference_bytes"], expected, "{id}");
        if expected == 0 {
            assert_eq!(v["fake"], v["real"], "{id}");
        }
        let model = args
            .iter()
            .position(|a| *a == "--model")
            .map_or("llama3", |i| args[i + 1]);
        models.insert(model.to_owned());
    }
    assert_eq!(
        models.into_iter().collect::<Vec<_>>(),
        ["deepseek_v3", "llama3", "qwen3"],
        "a crosscheck per simulated torchtitan model"
    );
}

/// A sweep of scratch measurements (not fixtures): `MEMWALL_SWEEP_TRAIN=file.jsonl`,
/// `MEMWALL_SWEEP_INFER=file.jsonl` and/or `MEMWALL_SWEEP_DIST=file.jsonl` (rows of
/// `tools/truth/measure_dist.py --out file.jsonl`) print every case's error (refusals by name
/// included) without asserting (`MEMWALL_SWEEP_BREAKDOWN=1`: the breakdowns at the peak too;
/// `MEMWALL_SWEEP_PHASE_MIN=0.3`: distributed phases off by more than 0.3%, default 1);
/// `cargo test -p memwall-cli --test truth sweep -- --ignored --nocapture`.
#[test]
#[ignore = "prints a scratch sweep named by MEMWALL_SWEEP_TRAIN / MEMWALL_SWEEP_INFER"]
fn sweep() {
    use memwall_core::memory::simulate_infer;
    let mut errs = Vec::new();
    let mut print = |id: &str, measured: u64, r: Result<(u64, String), String>, mphase: &str| {
        match r {
            Ok((est, phase)) => {
                let e = (est as f64 - measured as f64) / measured as f64 * 100.0;
                errs.push(e.abs());
                println!(
                    "SWEEP {id:<40} {e:+8.3}%  measured {measured:>14} estimated {est:>14} {mphase}/{phase}"
                );
            }
            Err(msg) => println!("SWEEP {id:<40} REFUSED {}", msg.replace('\n', " | ")),
        }
    };
    if let Ok(file) = std::env::var("MEMWALL_SWEEP_TRAIN") {
        for line in std::fs::read_to_string(file).unwrap().lines() {
            let c: Case = serde_json::from_str(line).unwrap();
            let json = std::fs::read_to_string(root().join(&c.config)).unwrap();
            let mut desc = match memwall_formats::parse_hf_config(&json) {
                Ok(d) => d,
                Err(e) => {
                    print(&c.id, c.measured.peak_bytes, Err(e.to_string()), "");
                    continue;
                }
            };
            with_image_tokens(&mut desc, c.image_tokens);
            let mut w = workload(&c);
            w.attention = attention_of(&desc, w.attention);
            let r = simulate_train(&desc, &w, Kernels::Cpu);
            if let (Ok(e), true) = (&r, std::env::var_os("MEMWALL_SWEEP_BREAKDOWN").is_some()) {
                // what is alive at the peak, estimated then measured (by MemTracker's names)
                println!("  estimated {:?}", e.at_peak);
                println!("  measured  {:?}", c.measured.at_peak);
                println!("  estimated phase peaks {:?}", e.phase_peaks);
            }
            let r = r
                .map(|e| (e.peak_bytes, phase_name(e.phase)))
                .map_err(|e| e.to_string());
            print(&c.id, c.measured.peak_bytes, r, &c.measured.phase);
        }
    }
    if let Ok(file) = std::env::var("MEMWALL_SWEEP_INFER") {
        for line in std::fs::read_to_string(file).unwrap().lines() {
            let c: InferCase = serde_json::from_str(line).unwrap();
            let json = std::fs::read_to_string(root().join(&c.config)).unwrap();
            let mut desc = match memwall_formats::parse_hf_config(&json) {
                Ok(d) => d,
                Err(e) => {
                    print(&c.id, c.measured.peak_bytes, Err(e.to_string()), "");
                    continue;
                }
            };
            with_image_tokens(&mut desc, c.image_tokens);
            let w = infer_workload(&c, &desc);
            let r = simulate_infer(&desc, &w, Kernels::Cpu);
            if let (Ok(e), true) = (&r, std::env::var_os("MEMWALL_SWEEP_BREAKDOWN").is_some()) {
                println!(
                    "  estimated {:?} prefill {}",
                    e.at_peak, e.prefill_peak_bytes
                );
                println!(
                    "  measured  {:?} prefill {}",
                    c.measured.at_peak, c.measured.prefill_peak_bytes
                );
            }
            let r = r
                .map(|e| (e.peak_bytes, phase_name(e.phase)))
                .map_err(|e| e.to_string());
            print(&c.id, c.measured.peak_bytes, r, &c.measured.phase);
        }
    }
    if let Ok(file) = std::env::var("MEMWALL_SWEEP_DIST") {
        let text = std::fs::read_to_string(file).unwrap();
        let mut refusals = Vec::new();
        let (rows, phases) = dist_rows_of(&text, Some(&mut refusals));
        for r in rows {
            print(
                &r.id,
                r.measured,
                Ok((r.estimated, r.phase_estimated.clone())),
                &r.phase_measured,
            );
        }
        for p in phases.iter().filter(|p| {
            p.error_pct.abs()
                > std::env::var("MEMWALL_SWEEP_PHASE_MIN")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1.0)
        }) {
            println!(
                "SWEEP phase {:<40} {:+8.3}%  measured {:>14} estimated {:>14}",
                p.id, p.error_pct, p.measured, p.estimated
            );
        }
        for (id, msg) in refusals {
            print(&id, 0, Err(msg), "");
        }
    }
    if !errs.is_empty() {
        let worst = errs.iter().copied().fold(0.0, f64::max);
        println!(
            "SWEEP {} estimated: median |error| {:.3}%, worst {:.3}%",
            errs.len(),
            median(errs),
            worst
        );
    }
}

/// GatedDeltaNet in fp32 over several unpadded chunks (h55, `deltanet.rs`
/// `Sizes::multi_chunk_fold_copies` / `Sizes::loop_fold`): matmul's batch fold copies the
/// chunked query, key and `k_beta` (their strided layout survives the fp32 `.to`), at batch > 1
/// the chunk loop's slices too — rdist197-003-qwen3next's single-GPU twin was -10.1%, the
/// fixtures here -9% to -12% without it; and under autocast the gated norm returns the rule's
/// 16-bit dtype, so `out_proj` casts nothing (`qwen3next-rnd53-b1-s256-ampbf16` and `-s255-`
/// were +1.48% with the training cache).
#[test]
fn qwen3next_multi_chunk_fp32_within_a_tenth_of_a_percent() {
    const IDS: &[&str] = &[
        "qwen3next-rnd53-b1-s128-fp32",
        "qwen3next-rnd53-b2-s256-fp32-sdpa-sgd",
        "qwen3next-rnd53-b2-s192-fp32-nocache",
        "qwen3next-rnd53-b1-s256-fp32-lora",
        "qwen3next-rnd53-b1-s255-fp32",
        "qwen3next-rnd53-b1-s256-ampbf16",
        "qwen3next-rnd53-b1-s255-ampbf16",
        "qwen3next-rnd53-b2-s128-ampfp16-sgd",
        "qwen3next-rnd53-b2-s128-fp16",
        "qwen3next-h128-r1-s256-fp32",
        "qwen3next-h128-r1-s128-b2-fp32-sgd",
    ];
    let rows = rows();
    let picked: Vec<&Row> = rows
        .iter()
        .filter(|r| IDS.contains(&r.id.as_str()))
        .collect();
    assert_eq!(picked.len(), IDS.len(), "h55 fixtures present");
    assert_rows_within(&picked, 0.1);
}
