//! Reports: one serialisable value per command, rendered as a table or JSON.

use crate::args::TrainSettings;
use crate::model_source::ModelSource;
use anyhow::{Context, Result};
use memwall_core::gpu::CUDA_CONTEXT_BYTES;
use memwall_core::layout::Layout;
use memwall_core::memory::{self, Category, Phase};
use memwall_core::roofline::{self, Bound};
use memwall_core::workload::TrainWorkload;
use memwall_core::Bytes;
use serde::Serialize;

/// Model identity in reports.
#[derive(Debug, Serialize)]
pub struct ModelInfo {
    /// Catalogue id or path.
    pub label: String,
    /// Hugging Face repo id when known.
    pub hf_repo: Option<String>,
    /// `model_type`.
    pub model_type: String,
    /// Where the config came from.
    pub origin: String,
    /// Decoder layers.
    pub num_layers: usize,
    /// All parameters.
    pub params_total: u64,
    /// Trainable parameters in this workload.
    pub params_trainable: u64,
}

/// Fit on the chosen GPU.
#[derive(Debug, Serialize)]
pub struct GpuFit {
    /// GPU id.
    pub id: String,
    /// GPU name.
    pub name: String,
    /// Device memory.
    pub memory_bytes: u64,
    /// CUDA context (outside PyTorch's allocator; documented default).
    pub cuda_context_bytes: u64,
    /// cuBLAS workspace (PyTorch default for this GPU).
    pub cublas_workspace_bytes: u64,
    /// peak + context + workspace.
    pub required_bytes: u64,
    /// Whether it fits.
    pub fits: bool,
    /// memory − required (negative when it does not fit).
    pub headroom_bytes: i128,
}

/// `memwall train` result.
#[derive(Debug, Serialize)]
pub struct TrainReport {
    /// The model.
    pub model: ModelInfo,
    /// The step as simulated.
    pub workload: TrainWorkload,
    /// Whose behaviour is simulated.
    pub runtime_profile: &'static str,
    /// Peak bytes of PyTorch's allocator during the steady-state step
    /// (`torch.cuda.max_memory_allocated()`).
    pub peak_bytes: u64,
    /// Phase of the peak.
    pub phase: Phase,
    /// What is alive at the peak, in bytes by category.
    pub at_peak: serde_json::Map<String, serde_json::Value>,
    /// Fit on the GPU.
    pub gpu: GpuFit,
    /// Step time on this GPU from the roofline (`memwall roofline` shows the per-op table).
    pub speed: Speed,
    /// The cluster, when distributed: per-rank-group breakdowns, buffers, host memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distributed: Option<DistReport>,
    /// Every rank's peak (distributed only); the top-level `peak_bytes` is the worst of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<Vec<RankRow>>,
}

/// One rank of a distributed job.
#[derive(Debug, Serialize)]
pub struct RankRow {
    /// Global rank.
    pub rank: u64,
    /// Peak bytes of PyTorch's allocator on this rank.
    pub peak_bytes: u64,
    /// Host bytes this rank pins for offload.
    pub host_bytes: u64,
    /// Index into `distributed.groups`.
    pub group: usize,
}

/// A group of identical ranks.
#[derive(Debug, Serialize)]
pub struct GroupRow {
    /// Which ranks.
    pub label: String,
    /// How many.
    pub count: usize,
    /// Peak per rank.
    pub peak_bytes: u64,
    /// Phase of the peak.
    pub phase: Phase,
    /// Breakdown at the peak.
    pub at_peak: serde_json::Map<String, serde_json::Value>,
    /// Host bytes per rank.
    pub host_bytes: u64,
    /// Model states (parameters, gradients, optimizer states) per rank.
    pub model_state_bytes: u64,
    /// Peak of each phase of the step (empty for the formula-based `megatron` profile).
    pub phase_peaks: serde_json::Map<String, serde_json::Value>,
    /// peak + CUDA context + cuBLAS workspace fits the GPU.
    pub fits: bool,
}

/// A layout that fits when the asked one does not.
#[derive(Debug, Serialize)]
pub struct Alternative {
    /// What to change, as flags.
    pub flags: String,
    /// The worst rank's peak with that change.
    pub peak_bytes: u64,
    /// Host bytes per node it needs.
    pub host_bytes_per_node: u64,
}

/// The distributed part of a train report.
#[derive(Debug, Serialize)]
pub struct DistReport {
    /// The layout as resolved.
    pub layout: memwall_core::layout::Layout,
    /// Data-parallel degree.
    pub dp: u64,
    /// Sequences per optimizer step.
    pub global_batch: u64,
    /// Rank groups; `worst` indexes the worst.
    pub groups: Vec<GroupRow>,
    /// Index of the worst group.
    pub worst: usize,
    /// Host memory per node for offload.
    pub host_bytes_per_node: u64,
    /// NVMe bytes per rank (ZeRO-Infinity).
    pub nvme_bytes_per_rank: u64,
    /// Communication buffers of one rank, named.
    pub comm_buffers: Vec<memory::CommBuffer>,
    /// When the worst rank does not fit: the cheapest changes that do, cheapest first.
    pub fits_with: Vec<Alternative>,
}

/// Step-time estimate of a training step.
#[derive(Debug, Serialize)]
pub struct Speed {
    /// Roofline lower bound: every op at peak FLOP/s or peak bandwidth.
    pub lower_bound_step_s: f64,
    /// At the assumed efficiencies.
    pub estimated_step_s: f64,
    /// Tokens per second per model replica (one GPU, or the tp·pp·cp GPUs of a Megatron
    /// replica) at the assumed efficiencies; pipeline bubbles and data-parallel communication
    /// are not included.
    pub estimated_tokens_per_s: f64,
    /// Assumed model FLOPs utilisation.
    pub mfu: f64,
    /// Assumed fraction of peak bandwidth.
    pub bandwidth_efficiency: f64,
}

fn train_speed(s: &TrainSettings) -> Result<Speed> {
    use memwall_core::workload::Precision;
    let dtype = match s.workload.precision {
        Precision::Bf16 | Precision::AmpBf16 => roofline::MathDtype::Bf16,
        Precision::Fp16 | Precision::AmpFp16 => roofline::MathDtype::Fp16,
        // PyTorch's default float32 matmul precision is "highest" (no TF32)
        Precision::Fp32 => roofline::MathDtype::Fp32,
    };
    let mut w = roofline::RooflineWorkload {
        phase: roofline::RooflinePhase::Train,
        batch: s.workload.batch,
        seq: s.workload.seq,
        dtype,
        weight_bytes: dtype.bytes(),
        kv_bytes: dtype.bytes(),
        // Megatron layouts: one GPU runs its tensor-parallel share (with TP's all-reduces);
        // pipeline and context parallelism divide the rest below
        tp: s.layout.as_ref().map_or(1, |l| l.tp),
        flops_efficiency: 1.0,
        bandwidth_efficiency: 1.0,
    };
    let ceil = s.gpu.ceilings();
    let bound =
        roofline::analyze(&s.model.desc, &w, &ceil).context("cannot estimate the step time")?;
    (w.flops_efficiency, w.bandwidth_efficiency) = s.efficiency;
    let est =
        roofline::analyze(&s.model.desc, &w, &ceil).context("cannot estimate the step time")?;
    // pipeline stages and context-parallel ranks each run 1/(pp·cp) of the micro-batch's work
    // (no bubble, no communication beyond TP's: a lower bound)
    let split = s.layout.as_ref().map_or(1.0, |l| (l.pp * l.cp) as f64);
    Ok(Speed {
        lower_bound_step_s: bound.time_s / split,
        estimated_step_s: est.time_s / split,
        estimated_tokens_per_s: est.tokens_per_s * split,
        mfu: s.efficiency.0,
        bandwidth_efficiency: s.efficiency.1,
    })
}

fn category_name(c: Category) -> &'static str {
    match c {
        Category::Weights => "weights",
        Category::Buffers => "buffers",
        Category::Gradients => "gradients",
        Category::OptimizerStates => "optimizer_states",
        Category::Activations => "activations",
        Category::LossBuffers => "logits_and_loss",
        Category::Temporaries => "backward_temporaries",
        Category::OptimizerTemporaries => "optimizer_temporaries",
        Category::CommBuffers => "communication_buffers",
    }
}

fn breakdown(at_peak: &[(Category, u64)]) -> serde_json::Map<String, serde_json::Value> {
    at_peak
        .iter()
        .map(|(c, b)| (category_name(*c).to_owned(), serde_json::Value::from(*b)))
        .collect()
}

fn gpu_fit(g: &memwall_core::gpu::GpuSpec, peak: u64) -> GpuFit {
    let cublas = g.cublas_workspace_bytes();
    let required = peak
        .saturating_add(CUDA_CONTEXT_BYTES)
        .saturating_add(cublas);
    GpuFit {
        id: g.id.clone(),
        name: g.name.clone(),
        memory_bytes: g.memory_bytes,
        cuda_context_bytes: CUDA_CONTEXT_BYTES,
        cublas_workspace_bytes: cublas,
        required_bytes: required,
        fits: required <= g.memory_bytes,
        headroom_bytes: i128::from(g.memory_bytes) - i128::from(required),
    }
}

/// Candidate fixes, cheapest first: sharding deeper, then recomputation, then offload.
fn alternatives(s: &TrainSettings, layout: &Layout) -> Vec<Alternative> {
    use memwall_core::layout::{Offload, Strategy};
    let mut out = Vec::new();
    let strategies: &[Strategy] = if layout.model_parallel() {
        &[Strategy::Zero1]
    } else {
        &[
            Strategy::Zero1,
            Strategy::Zero2,
            Strategy::FsdpGradOp,
            Strategy::FsdpFull,
            Strategy::Zero3,
        ]
    };
    // cost of a change, cheapest first: more sharding costs communication (rank in
    // `strategies`), recomputation ~1/3 more compute, offload host-device traffic (the
    // parameters' every step more than the optimizer's)
    let mut candidates: Vec<(u32, Layout, bool, String)> = Vec::new();
    for ckpt in [false, true] {
        for (rank, &st) in (0u32..).zip(strategies) {
            for off in [Offload::None, Offload::Optimizer, Offload::Both] {
                if off == Offload::Both && st != Strategy::Zero3 && !st.is_fsdp() {
                    continue;
                }
                if off == Offload::Optimizer && st.is_fsdp() {
                    continue;
                }
                let mut l = layout.clone();
                l.strategy = st;
                l.offload = off;
                if l.validate().is_err() {
                    continue;
                }
                let mut flags = format!("--strategy {}", st.name());
                if ckpt {
                    flags.push_str(" --checkpointing");
                }
                if off != Offload::None {
                    flags.push_str(match off {
                        Offload::Optimizer => " --offload optimizer",
                        _ => " --offload both",
                    });
                }
                let cost = rank
                    + if ckpt { 3 } else { 0 }
                    + match off {
                        Offload::None => 0,
                        Offload::Optimizer => 4,
                        _ => 8,
                    };
                candidates.push((cost, l, ckpt, flags));
            }
        }
    }
    candidates.sort_by_key(|c| c.0);
    for (_, l, ckpt, flags) in candidates {
        if l == *layout && ckpt == s.workload.checkpointing {
            continue;
        }
        let mut w = s.workload.clone();
        w.checkpointing = w.checkpointing || ckpt;
        let Ok(e) = memory::simulate_train_dist(&s.model.desc, &w, &l, s.kernels) else {
            continue;
        };
        if gpu_fit(s.gpu, e.peak_bytes).fits {
            out.push(Alternative {
                flags,
                peak_bytes: e.peak_bytes,
                host_bytes_per_node: e.host_bytes_per_node,
            });
            if out.len() >= 3 {
                break;
            }
        }
    }
    out
}

fn dist_report(s: &TrainSettings, layout: &Layout) -> Result<TrainReport> {
    let e = memory::simulate_train_dist(&s.model.desc, &s.workload, layout, s.kernels)
        .context("cannot simulate this distributed step")?;
    let worst = &e.groups[e.worst];
    let fit = gpu_fit(s.gpu, e.peak_bytes);
    let mut ranks: Vec<RankRow> = Vec::new();
    for (gi, g) in e.groups.iter().enumerate() {
        for &r in &g.ranks {
            ranks.push(RankRow {
                rank: r,
                peak_bytes: g.peak_bytes,
                host_bytes: g.host_bytes,
                group: gi,
            });
        }
    }
    ranks.sort_by_key(|r| r.rank);
    let groups = e
        .groups
        .iter()
        .map(|g| GroupRow {
            label: g.label.clone(),
            count: g.ranks.len(),
            peak_bytes: g.peak_bytes,
            phase: g.phase,
            at_peak: breakdown(&g.at_peak),
            host_bytes: g.host_bytes,
            model_state_bytes: g.model_state_bytes,
            phase_peaks: g
                .phase_peaks
                .iter()
                .map(|(p, b)| {
                    (
                        phase_name(*p).split(' ').next().unwrap_or("").to_owned(),
                        serde_json::Value::from(*b),
                    )
                })
                .collect(),
            fits: gpu_fit(s.gpu, g.peak_bytes).fits,
        })
        .collect();
    let fits_with = if fit.fits {
        Vec::new()
    } else {
        alternatives(s, layout)
    };
    let trainable = s.model.counts.total;
    Ok(TrainReport {
        model: info(
            &s.model,
            if s.workload.lora.is_some() {
                memory::simulate_train(&s.model.desc, &s.workload, s.kernels)
                    .map(|x| x.params_trainable)
                    .unwrap_or(trainable)
            } else {
                trainable
            },
        ),
        workload: s.workload.clone(),
        runtime_profile: e.engine.name(),
        peak_bytes: e.peak_bytes,
        phase: worst.phase,
        at_peak: breakdown(&worst.at_peak),
        gpu: fit,
        speed: train_speed(s)?,
        distributed: Some(DistReport {
            layout: layout.clone(),
            dp: e.dp,
            global_batch: e.global_batch,
            groups,
            worst: e.worst,
            host_bytes_per_node: e.host_bytes_per_node,
            nvme_bytes_per_rank: e.nvme_bytes_per_rank,
            comm_buffers: e.comm_buffers,
            fits_with,
        }),
        ranks: Some(ranks),
    })
}

/// Runs the simulation for `s`.
pub fn train_report(s: &TrainSettings) -> Result<TrainReport> {
    if let Some(layout) = &s.layout {
        return dist_report(s, layout);
    }
    let est = memory::simulate_train(&s.model.desc, &s.workload, s.kernels)
        .context("cannot simulate this step")?;
    let at_peak = est
        .at_peak
        .iter()
        .map(|(c, b)| (category_name(*c).to_owned(), serde_json::Value::from(*b)))
        .collect();
    Ok(TrainReport {
        model: info(&s.model, est.params_trainable),
        workload: s.workload.clone(),
        runtime_profile: "hf",
        peak_bytes: est.peak_bytes,
        phase: est.phase,
        at_peak,
        gpu: gpu_fit(s.gpu, est.peak_bytes),
        speed: train_speed(s)?,
        distributed: None,
        ranks: None,
    })
}

fn info(m: &ModelSource, trainable: u64) -> ModelInfo {
    ModelInfo {
        label: m.label.clone(),
        hf_repo: m.hf_repo.clone(),
        model_type: m.desc.model_type.clone(),
        origin: m.origin.clone(),
        num_layers: m.desc.num_layers(),
        params_total: m.counts.total,
        params_trainable: trainable,
    }
}

/// Human-friendly parameter count.
pub fn count(n: u64) -> String {
    let f = n as f64;
    if f >= 1e9 {
        format!("{:.2}B", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.1}M", f / 1e6)
    } else {
        n.to_string()
    }
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Forward => "forward",
        Phase::Loss => "loss (logits + cross-entropy)",
        Phase::Backward => "backward",
        Phase::Optimizer => "optimizer step",
        Phase::Prefill => "prefill",
        Phase::Decode => "decode",
    }
}

/// Prints a train report.
pub fn print_train(r: &TrainReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
        return Ok(());
    }
    let w = &r.workload;
    println!(
        "memwall train · {} ({}, {} layers, {} params, {} trainable)",
        r.model.label,
        r.model.model_type,
        r.model.num_layers,
        count(r.model.params_total),
        count(r.model.params_trainable)
    );
    println!(
        "  batch {} × seq {} · {} · {} · attention {} · checkpointing {} · grad-accum {}{}",
        w.batch,
        w.seq,
        serde_json::to_value(w.precision)?.as_str().unwrap_or("?"),
        serde_json::to_value(w.optimizer)?.as_str().unwrap_or("?"),
        serde_json::to_value(w.attention)?.as_str().unwrap_or("?"),
        if w.checkpointing { "on" } else { "off" },
        w.grad_accum,
        match &w.lora {
            Some(l) => format!(
                " · {} r={} on {}",
                if l.qlora { "QLoRA" } else { "LoRA" },
                l.rank,
                l.targets.join(",")
            ),
            None => String::new(),
        }
    );
    println!();
    if let Some(d) = &r.distributed {
        print_dist(d, r.runtime_profile);
    }
    println!(
        "peak {}{} during the {} (runtime profile: {})",
        Bytes(r.peak_bytes),
        if r.distributed.is_some() {
            " on the worst rank"
        } else {
            ""
        },
        phase_name(r.phase),
        r.runtime_profile
    );
    for (k, v) in &r.at_peak {
        let b = v.as_u64().unwrap_or(0);
        if b == 0 {
            continue;
        }
        let pct = 100.0 * b as f64 / r.peak_bytes.max(1) as f64;
        println!("  {:<24}{:>12}  {:>5.1}%", k, Bytes(b).to_string(), pct);
    }
    let g = &r.gpu;
    println!("outside PyTorch's allocator:");
    println!(
        "  {:<24}{:>12}  (documented default; driver-dependent)",
        "cuda_context",
        Bytes(g.cuda_context_bytes).to_string()
    );
    println!(
        "  {:<24}{:>12}",
        "cublas_workspace",
        Bytes(g.cublas_workspace_bytes).to_string()
    );
    let verdict = if g.fits {
        format!(
            "fits, {} free",
            Bytes(u64::try_from(g.headroom_bytes).unwrap_or(0))
        )
    } else {
        format!(
            "does NOT fit, short by {}",
            Bytes(u64::try_from(-g.headroom_bytes).unwrap_or(0))
        )
    };
    println!();
    let sp = &r.speed;
    println!(
        "speed on {}: ≥ {:.3} s per micro-step (roofline bound); ≈ {:.3} s at {:.0}% MFU and {:.0}% bandwidth → {:.0} tokens/s",
        g.id,
        sp.lower_bound_step_s,
        sp.estimated_step_s,
        sp.mfu * 100.0,
        sp.bandwidth_efficiency * 100.0,
        sp.estimated_tokens_per_s
    );
    println!(
        "on {} ({}): needs {} of {} — {}",
        g.id,
        g.name,
        Bytes(g.required_bytes),
        Bytes(g.memory_bytes),
        verdict
    );
    Ok(())
}

fn print_dist(d: &DistReport, profile: &str) {
    let l = &d.layout;
    let mut parts = vec![format!(
        "{} GPUs ({} per node) · {} · dp {}",
        l.gpus,
        l.gpus_per_node,
        l.strategy.name(),
        d.dp
    )];
    if l.tp > 1 {
        parts.push(format!(
            "tp {}{}",
            l.tp,
            if l.sequence_parallel { " + sp" } else { "" }
        ));
    }
    if l.pp > 1 {
        parts.push(format!(
            "pp {} ({}{})",
            l.pp,
            serde_json::to_value(l.schedule)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            if l.virtual_stages > 1 {
                format!(", {} virtual stages", l.virtual_stages)
            } else {
                String::new()
            }
        ));
    }
    if l.cp > 1 {
        parts.push(format!("cp {}", l.cp));
    }
    if l.ep > 1 {
        parts.push(format!("ep {}", l.ep));
    }
    println!(
        "cluster: {} · global batch {} · profile {profile}",
        parts.join(" · "),
        d.global_batch
    );
    println!(
        "  {:<28}{:>12}  {:>13}  {:>10}  {:<10}  fits",
        "ranks", "peak", "model states", "host", "phase"
    );
    for (i, g) in d.groups.iter().enumerate() {
        println!(
            "{} {:<28}{:>12}  {:>13}  {:>10}  {:<10}  {}",
            if i == d.worst { "▶" } else { " " },
            g.label,
            Bytes(g.peak_bytes).to_string(),
            Bytes(g.model_state_bytes).to_string(),
            Bytes(g.host_bytes).to_string(),
            phase_name(g.phase).split(' ').next().unwrap_or(""),
            if g.fits { "yes" } else { "NO" }
        );
    }
    if !d.comm_buffers.is_empty() {
        println!("communication buffers (per rank, inside the peak's accounting):");
        for b in &d.comm_buffers {
            println!("  {:>12}  {}", Bytes(b.bytes).to_string(), b.name);
        }
    }
    if d.host_bytes_per_node > 0 {
        println!(
            "host memory for offload: {} per node{}",
            Bytes(d.host_bytes_per_node),
            if d.nvme_bytes_per_rank > 0 {
                format!(
                    " (swap buffers) + {} NVMe per rank",
                    Bytes(d.nvme_bytes_per_rank)
                )
            } else {
                " (pinned)".to_string()
            }
        );
    }
    if !d.fits_with.is_empty() {
        println!("fits with:");
        for a in &d.fits_with {
            println!(
                "  {:<48} worst rank {}{}",
                a.flags,
                Bytes(a.peak_bytes),
                if a.host_bytes_per_node > 0 {
                    format!(", host {} per node", Bytes(a.host_bytes_per_node))
                } else {
                    String::new()
                }
            );
        }
    }
    println!();
}

#[derive(Debug, Serialize)]
struct ModelRow<'a> {
    id: &'a str,
    hf_repo: &'a str,
    model_type: String,
    params_total: u64,
    published_params: &'a str,
    source: &'a str,
}

/// Prints the catalogue.
pub fn print_models(json: bool) -> Result<()> {
    let mut rows = Vec::new();
    for e in memwall_catalog::models() {
        let desc = e
            .model()
            .with_context(|| format!("catalogue entry {} does not parse", e.id))?;
        let params_total = desc.param_counts()?.total;
        rows.push(ModelRow {
            id: e.id,
            hf_repo: e.hf_repo,
            model_type: desc.model_type.clone(),
            params_total,
            published_params: e.published_params,
            source: e.source,
        });
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<24} {:<42} {:<12} {:>9} {:>10}",
        "id", "hf repo", "type", "params", "published"
    );
    for r in rows {
        println!(
            "{:<24} {:<42} {:<12} {:>9} {:>10}",
            r.id,
            r.hf_repo,
            r.model_type,
            count(r.params_total),
            r.published_params
        );
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct Inspect<'a> {
    model: ModelInfo,
    checkpoint_dtype: Option<&'a str>,
    params: memwall_core::model::ParamCounts,
    bytes_by_dtype: serde_json::Map<String, serde_json::Value>,
}

/// Prints exact parameter counts.
pub fn print_inspect(m: &ModelSource, json: bool) -> Result<()> {
    let c = m.counts;
    let mut by_dtype = serde_json::Map::new();
    for (name, size) in [("fp32", 4u64), ("bf16", 2), ("fp16", 2), ("int8", 1)] {
        by_dtype.insert(
            name.into(),
            serde_json::Value::from(c.total.saturating_mul(size)),
        );
    }
    let r = Inspect {
        model: info(m, c.total),
        checkpoint_dtype: m.checkpoint_dtype.as_deref(),
        params: c,
        bytes_by_dtype: by_dtype,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "{} ({}, {} layers) from {}",
        m.label,
        m.desc.model_type,
        m.desc.num_layers(),
        m.origin
    );
    println!("  {:<14}{:>16}", "embeddings", c.embeddings);
    println!("  {:<14}{:>16}", "layers", c.layers);
    println!("  {:<14}{:>16}", "final_norm", c.final_norm);
    println!(
        "  {:<14}{:>16}{}",
        "lm_head",
        c.lm_head,
        if m.desc.head.tied {
            "  (tied to embeddings)"
        } else {
            ""
        }
    );
    println!("  {:<14}{:>16}  ({})", "total", c.total, count(c.total));
    if let Some(d) = &m.checkpoint_dtype {
        println!("checkpoint dtype: {d}");
    }
    for (k, v) in &r.bytes_by_dtype {
        println!(
            "  weights in {:<6}{:>12}",
            k,
            Bytes(v.as_u64().unwrap_or(0)).to_string()
        );
    }
    Ok(())
}

/// Prints the GPU table.
pub fn print_gpus(json: bool) -> Result<()> {
    let gpus = memwall_catalog::gpus().context("the embedded GPU table is unreadable")?;
    if json {
        println!("{}", serde_json::to_string_pretty(gpus)?);
        return Ok(());
    }
    println!(
        "{:<16} {:<34} {:>10} {:>11} {:>12} {:>8}",
        "id", "name", "memory", "bandwidth", "bf16 dense", "ridge"
    );
    for g in gpus {
        let bf16 = g
            .peak_flops_per_s
            .iter()
            .find(|(d, _)| *d == roofline::MathDtype::Bf16)
            .map(|(_, f)| *f);
        println!(
            "{:<16} {:<34} {:>10} {:>8.2} TB/s {:>12} {:>8}",
            g.id,
            g.name,
            Bytes(g.memory_bytes).to_string(),
            g.memory_bandwidth_bytes_per_s / 1e12,
            bf16.map_or("-".to_owned(), |f| format!("{:.0} TFLOP/s", f / 1e12)),
            bf16.map_or("-".to_owned(), |f| format!(
                "{:.0}",
                f / g.memory_bandwidth_bytes_per_s
            )),
        );
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct RooflineReport<'a> {
    model: ModelInfo,
    gpu: &'a str,
    workload: &'a roofline::RooflineWorkload,
    #[serde(flatten)]
    result: roofline::Roofline,
    /// Decode only: per-sequence and aggregate rates, and where decode stops being bandwidth-bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    decode: Option<DecodeSpeed>,
}

#[derive(Debug, Serialize)]
struct DecodeSpeed {
    tokens_per_s_per_sequence: f64,
    aggregate_tokens_per_s: f64,
    /// Smallest batch at which the MLP GEMMs are compute-bound (None: not below 65536).
    compute_bound_from_batch: Option<u64>,
}

fn si(v: f64) -> String {
    let (d, u) = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(d, _)| v >= *d)
        .unwrap_or((1.0, ""));
    format!("{:.2} {u}", v / d)
}

/// Runs and prints a roofline analysis (and writes the SVG when asked).
pub fn roofline(s: &crate::args::RooflineSettings) -> Result<()> {
    let ceil = s.gpu.ceilings();
    let r = roofline::analyze(&s.model.desc, &s.workload, &ceil)
        .context("cannot analyse this workload")?;
    let phase = serde_json::to_value(s.workload.phase)?
        .as_str()
        .unwrap_or("?")
        .to_owned();
    if let Some(path) = &s.svg {
        let title = format!(
            "{} · {} · {} batch {} × {} on {}",
            s.model.label,
            phase,
            serde_json::to_value(s.workload.dtype)?
                .as_str()
                .unwrap_or("?"),
            s.workload.batch,
            s.workload.seq,
            s.gpu.name
        );
        std::fs::write(path, crate::svg::roofline_svg(&r, s.gpu, &title))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let decode = if s.workload.phase == roofline::RooflinePhase::Decode {
        Some(DecodeSpeed {
            tokens_per_s_per_sequence: r.tokens_per_s / s.workload.batch as f64,
            aggregate_tokens_per_s: r.tokens_per_s,
            compute_bound_from_batch: roofline::decode_compute_bound_batch(
                &s.model.desc,
                &s.workload,
                &ceil,
                1 << 16,
            )?,
        })
    } else {
        None
    };
    if s.json {
        let rep = RooflineReport {
            model: info(&s.model, 0),
            gpu: &s.gpu.id,
            workload: &s.workload,
            result: r,
            decode,
        };
        println!("{}", serde_json::to_string_pretty(&rep)?);
        return Ok(());
    }
    println!(
        "memwall roofline · {} · {} · batch {} × {} · tp {} on {} (ridge {:.0} FLOP/byte)",
        s.model.label,
        phase,
        s.workload.batch,
        s.workload.seq,
        s.workload.tp,
        s.gpu.name,
        r.ridge_flops_per_byte
    );
    println!(
        "{:<30} {:>12} {:>12} {:>10} {:>8} {:>11}",
        "op", "FLOPs", "bytes", "FLOP/byte", "bound", "time"
    );
    for o in &r.ops {
        let bound = match o.bound {
            Bound::Memory => "memory",
            Bound::Compute => "compute",
            Bound::Network => "network",
        };
        println!(
            "{:<30} {:>12} {:>11}B {:>10.1} {:>8} {:>9.3} ms",
            o.name,
            si(o.flops),
            si(o.bytes),
            o.intensity,
            bound,
            o.time_s * 1e3
        );
    }
    println!(
        "total {} FLOPs, {}B moved; lower bound {:.3} ms per {} → {:.0} tokens/s",
        si(r.total_flops),
        si(r.total_bytes),
        r.time_s * 1e3,
        if phase == "decode" {
            "token step"
        } else {
            "step"
        },
        r.tokens_per_s
    );
    if let Some(d) = &decode {
        println!(
            "decode: {:.1} tokens/s per sequence, {:.0} tokens/s aggregate; {}",
            d.tokens_per_s_per_sequence,
            d.aggregate_tokens_per_s,
            match d.compute_bound_from_batch {
                Some(b) => format!("the weight GEMMs turn compute-bound from batch {b}"),
                None => "memory-bound at every batch up to 65536".to_owned(),
            }
        );
    }
    if let Some(p) = &s.svg {
        println!("roofline plot written to {}", p.display());
    }
    Ok(())
}

/// `memwall infer` result.
#[derive(Debug, Serialize)]
pub struct InferReport {
    /// The model.
    pub model: ModelInfo,
    /// The run as simulated.
    pub workload: memwall_core::workload::InferWorkload,
    /// Whose behaviour is simulated.
    pub runtime_profile: &'static str,
    /// Peak bytes of PyTorch's allocator (`torch.cuda.max_memory_allocated()`).
    pub peak_bytes: u64,
    /// Phase of the peak (prefill or decode).
    pub phase: Phase,
    /// What is alive at the peak, in bytes by category.
    pub at_peak: serde_json::Map<String, serde_json::Value>,
    /// Bytes of the weights.
    pub weights_bytes: u64,
    /// KV cache at its largest (prompt + new tokens − 1 cached per sequence).
    pub kv_cache_bytes: u64,
    /// Peak of the prefill alone.
    pub prefill_peak_bytes: u64,
    /// Fit on the GPU.
    pub gpu: GpuFit,
}

/// Runs and prints an inference estimate.
pub fn infer(s: &crate::args::InferSettings) -> Result<()> {
    let est = memory::simulate_infer(&s.model.desc, &s.workload, s.kernels)
        .context("cannot simulate this run")?;
    let at_peak = est
        .at_peak
        .iter()
        .map(|(c, b)| {
            let name = match c {
                Category::Activations => "activations_and_kv_cache",
                Category::LossBuffers => "logits",
                other => category_name(*other),
            };
            (name.to_owned(), serde_json::Value::from(*b))
        })
        .collect();
    let r = InferReport {
        model: info(&s.model, 0),
        workload: s.workload.clone(),
        runtime_profile: "hf",
        peak_bytes: est.peak_bytes,
        phase: est.phase,
        at_peak,
        weights_bytes: est.weights_bytes,
        kv_cache_bytes: est.kv_cache_bytes,
        prefill_peak_bytes: est.prefill_peak_bytes,
        gpu: gpu_fit(s.gpu, est.peak_bytes),
    };
    if s.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let w = &r.workload;
    println!(
        "memwall infer · {} ({}, {} layers, {} params)",
        r.model.label,
        r.model.model_type,
        r.model.num_layers,
        count(r.model.params_total)
    );
    println!(
        "  batch {} · prompt {} · {} new tokens · weights {} · kv {} · attention {}",
        w.batch,
        w.prompt,
        w.new_tokens,
        w.weights.name(),
        serde_json::to_value(w.kv_dtype)?.as_str().unwrap_or("?"),
        serde_json::to_value(w.attention)?.as_str().unwrap_or("?"),
    );
    println!();
    let phase = match r.phase {
        Phase::Prefill => "prefill",
        Phase::Decode => "decode",
        _ => "forward",
    };
    println!(
        "peak {} during the {} (runtime profile: {})",
        Bytes(r.peak_bytes),
        phase,
        r.runtime_profile
    );
    for (k, v) in &r.at_peak {
        let b = v.as_u64().unwrap_or(0);
        if b > 0 {
            println!(
                "  {:<26}{:>12}  {:>5.1}%",
                k,
                Bytes(b).to_string(),
                100.0 * b as f64 / r.peak_bytes.max(1) as f64
            );
        }
    }
    println!(
        "  {:<26}{:>12}  (at its largest)",
        "kv_cache",
        Bytes(r.kv_cache_bytes).to_string()
    );
    println!(
        "  {:<26}{:>12}",
        "prefill_peak",
        Bytes(r.prefill_peak_bytes).to_string()
    );
    let gf = &r.gpu;
    println!(
        "on {} ({}): needs {} of {} (incl. {} CUDA context, {} cuBLAS workspace) — {}",
        gf.id,
        gf.name,
        Bytes(gf.required_bytes),
        Bytes(gf.memory_bytes),
        Bytes(gf.cuda_context_bytes),
        Bytes(gf.cublas_workspace_bytes),
        if gf.fits { "fits" } else { "does NOT fit" }
    );
    Ok(())
}

#[derive(Debug, Serialize)]
struct ServeReport {
    model: ModelInfo,
    gpu: String,
    runtime_profile: &'static str,
    config: memwall_core::serve::ServeConfig,
    /// Which inputs are memwall's estimates (vLLM measures them at start-up).
    estimated_inputs: Vec<&'static str>,
    #[serde(flatten)]
    plan: memwall_core::serve::ServePlan,
    max_concurrency: serde_json::Map<String, serde_json::Value>,
    fragmentation: Vec<Fragmentation>,
    vllm_serve_command: String,
}

#[derive(Debug, Serialize)]
struct Fragmentation {
    request_tokens: u64,
    /// Fraction of a contiguous `max_model_len` reservation left unused by this request.
    contiguous_waste: f64,
    /// Fraction of its blocks a paged request leaves unused (only the last block is partial).
    paged_waste: f64,
}

/// `memwall serve`: vLLM's KV capacity for a deployment.
pub fn serve(a: crate::args::ServeArgs) -> Result<()> {
    use crate::args::{ServeArgs, ServeKvArg};
    use memwall_core::serve;
    let ServeArgs {
        model,
        gpu,
        tp,
        gpu_memory_utilization,
        kv_cache_dtype,
        block_size,
        max_model_len,
        max_num_batched_tokens,
        max_num_seqs,
        enforce_eager,
        kv_cache_memory_bytes,
        non_torch_bytes,
        activation_bytes,
        cuda_graph_bytes,
        request_lengths,
        json,
    } = a;
    let src = crate::model_source::load(&model)?;
    let g = crate::args::resolve_gpu(&gpu)?;
    let m = &src.desc;
    if tp == 0 {
        anyhow::bail!("--tp must be at least 1");
    }
    // vLLM `vllm serve` defaults by device (docs/vllm-accounting.md §2)
    let gib = g.memory_bytes >> 30;
    let default_batched = if gib >= 160 {
        16384
    } else if gib >= 70 && !g.id.starts_with("a100") {
        8192
    } else {
        2048
    };
    let batched = max_num_batched_tokens.unwrap_or(default_batched);
    let seqs = max_num_seqs.unwrap_or(if batched >= 8192 { 1024 } else { 256 });
    let dtype_bytes = 2u64;
    let kv_bytes = match kv_cache_dtype {
        ServeKvArg::Auto => dtype_bytes,
        _ => 1,
    };
    let mut estimated = Vec::new();
    let weights = serve::weights_bytes_per_rank(m, tp, dtype_bytes as f64)?;
    estimated.push("weights_bytes_per_rank");
    // profile-run activation peak: residual stream, q/k/v and MLP intermediates of one layer for
    // the dummy batch, plus the sampler's fp32 logits for max_num_seqs sequences — an estimate
    let activation = activation_bytes.unwrap_or_else(|| {
        estimated.push("activation_peak_bytes");
        let h = m.hidden_size;
        let inter = m
            .layers
            .iter()
            .map(|l| match &l.mlp {
                memwall_core::model::Mlp::Dense(d) => d.intermediate * if d.gated { 2 } else { 1 },
                memwall_core::model::Mlp::Moe(x) => x.expert.intermediate * 2 * x.top_k,
            })
            .max()
            .unwrap_or(0)
            / tp;
        let v = m.embeddings.vocab_size.div_ceil(64) * 64 / tp;
        batched * (4 * h + 2 * inter) * dtype_bytes + seqs * v * 4 * 2
    });
    let non_torch = non_torch_bytes.unwrap_or_else(|| {
        estimated.push("non_torch_bytes");
        if tp > 1 {
            512 << 20
        } else {
            256 << 20
        }
    });
    let graphs = if enforce_eager {
        0
    } else {
        cuda_graph_bytes.unwrap_or_else(|| {
            estimated.push("cuda_graph_bytes");
            512 << 20
        })
    };
    let cfg = serve::ServeConfig {
        gpu_memory_bytes: g.memory_bytes,
        tp,
        gpu_memory_utilization,
        kv_dtype_bytes: kv_bytes,
        block_size,
        max_model_len: max_model_len.unwrap_or(m.max_position_embeddings),
        max_num_batched_tokens: batched,
        kv_cache_memory_bytes,
        weights_bytes_per_rank: weights,
        non_torch_bytes: non_torch,
        activation_peak_bytes: activation,
        cuda_graph_bytes: graphs,
    };
    if kv_cache_memory_bytes.is_some() {
        estimated.clear();
    }
    let plan = serve::plan(m, &cfg).context("cannot plan this deployment")?;
    let mut conc = serde_json::Map::new();
    let mut frag = Vec::new();
    for &n in &request_lengths {
        conc.insert(
            n.to_string(),
            serde_json::Value::from(plan.max_concurrency(&cfg, n)),
        );
        let reserved = cfg.max_model_len.max(n) as f64;
        let blocks = n.div_ceil(block_size) * block_size;
        frag.push(Fragmentation {
            request_tokens: n,
            contiguous_waste: 1.0 - n as f64 / reserved,
            paged_waste: 1.0 - n as f64 / blocks as f64,
        });
    }
    let max_len = if plan.fits_max_model_len {
        cfg.max_model_len
    } else {
        plan.max_model_len_that_fits
    };
    let mut cmd = format!(
        "vllm serve {} --tensor-parallel-size {tp} --gpu-memory-utilization {gpu_memory_utilization} --max-model-len {max_len}",
        src.hf_repo.clone().unwrap_or_else(|| src.label.clone())
    );
    if kv_bytes == 1 {
        cmd.push_str(" --kv-cache-dtype fp8");
    }
    if enforce_eager {
        cmd.push_str(" --enforce-eager");
    }
    if block_size != 16 {
        cmd.push_str(&format!(" --block-size {block_size}"));
    }
    let report = ServeReport {
        model: info(&src, 0),
        gpu: g.id.clone(),
        runtime_profile: "vllm",
        config: cfg.clone(),
        estimated_inputs: estimated,
        plan,
        max_concurrency: conc,
        fragmentation: frag,
        vllm_serve_command: cmd,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let p = &report.plan;
    println!(
        "memwall serve · {} on {} × {} (tp {tp}) · runtime profile vllm (vLLM 0.33 accounting)",
        report.model.label,
        g.id,
        tp,
        tp = tp
    );
    println!(
        "  requested {} × {} = {}; weights/rank {}; activations {}; non-torch {}; CUDA graphs {}",
        Bytes(g.memory_bytes),
        gpu_memory_utilization,
        Bytes(p.requested_memory_bytes),
        Bytes(cfg.weights_bytes_per_rank),
        Bytes(cfg.activation_peak_bytes),
        Bytes(cfg.non_torch_bytes),
        Bytes(cfg.cuda_graph_bytes)
    );
    if !report.estimated_inputs.is_empty() {
        println!(
            "  (estimated by memwall, measured by vLLM at start-up: {})",
            report.estimated_inputs.join(", ")
        );
    }
    println!(
        "KV cache: {} available → {} blocks of {} tokens ({} per block, {} KV heads/rank, {} group(s)) = {} tokens",
        Bytes(p.available_kv_bytes),
        p.num_gpu_blocks,
        block_size,
        Bytes(p.bytes_per_block),
        p.num_kv_heads_per_rank,
        p.groups.len(),
        p.kv_tokens
    );
    for (n, c) in &report.max_concurrency {
        println!(
            "  max concurrency at {n:>6} tokens/request: {:.2}",
            c.as_f64().unwrap_or(0.0)
        );
    }
    if p.fits_max_model_len {
        println!(
            "max-model-len {} fits (largest that fits: {})",
            cfg.max_model_len, p.max_model_len_that_fits
        );
    } else {
        println!(
            "max-model-len {} does NOT fit: vLLM would refuse to start; the largest that fits is {}",
            cfg.max_model_len, p.max_model_len_that_fits
        );
    }
    for f in &report.fragmentation {
        println!(
            "  {:>6}-token request: contiguous pre-allocation wastes {:.0}%, paged {:.1}%",
            f.request_tokens,
            f.contiguous_waste * 100.0,
            f.paged_waste * 100.0
        );
    }
    println!("{}", report.vllm_serve_command);
    Ok(())
}
