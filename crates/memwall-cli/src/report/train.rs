//! `memwall train`: peak memory of a training step, on one GPU or every rank of a cluster.

use super::table::{md_text, Align, Table};
use super::text::{
    breakdown, count, percent, phase_name, phase_word, serde_name, Entries, NamedBytes,
};
use super::{markdown_fit, ModelInfo, Report};
use crate::args::TrainSettings;
use anyhow::{Context, Result};
use memwall_core::advice::{self, GpuFit};
use memwall_core::layout::{Layout, Offload};
use memwall_core::memory::{self, Phase};
use memwall_core::time::{self, Breakdown, StepTime};
use memwall_core::workload::TrainWorkload;
use memwall_core::{Bytes, Engine};
use serde::Serialize;
use std::io::{self, Write};

/// How many fitting alternatives a report lists.
const MAX_ALTERNATIVES: usize = 3;

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
    pub at_peak: NamedBytes,
    /// Peak of each phase of the step, on one GPU (distributed: per rank group, in
    /// `distributed.groups`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_peaks: Option<NamedBytes>,
    /// Fit on the GPU.
    pub gpu: GpuFit,
    /// Step time from the step-time model (docs/time-model.md): compute, recomputation, the
    /// engine's exposed communication, pipeline bubble, offload and the optimizer step.
    pub speed: Speed,
    /// The cluster, when distributed: per-rank-group breakdowns, buffers, host memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distributed: Option<DistReport>,
    /// Every rank's peak (distributed only); the top-level `peak_bytes` is the worst of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<Vec<RankRow>>,
    /// When the (worst rank's) peak does not fit: the OOM doctor's fixes, cheapest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub doctor: Option<super::doctor::DoctorReport>,
    /// `--activation-offload`: pinned host bytes the offloaded saved tensors hold at once (also
    /// what each micro-batch copies to the host and back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_offload_bytes: Option<u64>,
    /// `--float8`: torchtitan's float8 recipe (its `Float8LinearConverter`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub float8: Option<&'static str>,
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
    pub at_peak: NamedBytes,
    /// Host bytes per rank.
    pub host_bytes: u64,
    /// Model states (parameters, gradients, optimizer states) per rank.
    pub model_state_bytes: u64,
    /// Peak of each phase of the step (empty for the formula-based `megatron` profile).
    pub phase_peaks: NamedBytes,
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

impl Alternative {
    /// The advice as the flags that ask for it.
    fn from_advice(a: &advice::Alternative) -> Self {
        let mut flags = format!("--strategy {}", a.strategy.name());
        if a.checkpointing {
            flags.push_str(" --checkpointing");
        }
        match a.offload {
            Offload::None => {}
            Offload::Optimizer => flags.push_str(" --offload optimizer"),
            Offload::Params => flags.push_str(" --offload params"),
            Offload::Both => flags.push_str(" --offload both"),
        }
        Alternative {
            flags,
            peak_bytes: a.peak_bytes,
            host_bytes_per_node: a.host_bytes_per_node,
        }
    }
}

/// The distributed part of a train report.
#[derive(Debug, Serialize)]
pub struct DistReport {
    /// The layout as resolved.
    pub layout: Layout,
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

/// The speed part of a train report (the `speed.*` JSON contract).
#[derive(Debug, Serialize)]
pub struct Speed {
    /// Seconds per optimizer step (all micro-batches).
    pub step_s: f64,
    /// Tokens per second per GPU.
    pub tokens_per_s_per_gpu: f64,
    /// Tokens per second over the cluster.
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation (6·N·tokens plus attention, over the dense peak).
    pub mfu: f64,
    /// Hardware FLOPs utilisation (recomputation counted).
    pub hfu: f64,
    /// Seconds per component; they sum to `step_s`.
    pub breakdown: Breakdown,
    /// Micro-batches per step on each data-parallel rank.
    pub micro_batches: u64,
}

impl Speed {
    fn from_model(t: &StepTime) -> Self {
        Speed {
            step_s: t.step_s,
            tokens_per_s_per_gpu: t.tokens_per_s_per_gpu,
            tokens_per_s: t.tokens_per_s,
            mfu: t.mfu,
            hfu: t.hfu,
            breakdown: t.breakdown,
            micro_batches: t.micro_batches,
        }
    }
}

fn train_speed(s: &TrainSettings) -> Result<Speed> {
    let t = time::estimate_step_time_with(
        &s.model.desc,
        &s.workload,
        s.layout.as_ref(),
        s.gpu,
        s.speed,
    )
    .context("cannot estimate the step time")?;
    Ok(Speed::from_model(&t))
}

fn dist_report(s: &TrainSettings, layout: &Layout) -> Result<TrainReport> {
    let titan = s.runtime == memory::titan::Runtime::Torchtitan;
    let e = if titan {
        memory::titan::simulate_train_titan(&s.model.desc, &s.workload, layout, &s.titan)
            .context("cannot simulate this torchtitan step")?
    } else {
        memory::fast::simulate_train_dist(&s.model.desc, &s.workload, layout, s.kernels)
            .context("cannot simulate this distributed step")?
    };
    let worst = &e.groups[e.worst];
    let fit = GpuFit::new(s.gpu, e.peak_bytes, s.alloc_margin);
    let mut ranks: Vec<RankRow> = Vec::new();
    for (gi, g) in e.groups.iter().enumerate() {
        for r in g.ranks.iter() {
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
            phase_peaks: Entries(
                g.phase_peaks
                    .iter()
                    .map(|(p, b)| (phase_word(*p), *b))
                    .collect(),
            ),
            fits: GpuFit::new(s.gpu, g.peak_bytes, s.alloc_margin).fits,
        })
        .collect();
    // the alternatives are searched with the hf profile's engines: not offered for torchtitan
    let fits_with = if fit.fits || titan {
        Vec::new()
    } else {
        advice::fitting_alternatives(
            &s.model.desc,
            &s.workload,
            layout,
            s.kernels,
            s.gpu,
            s.alloc_margin,
            MAX_ALTERNATIVES,
        )
        .iter()
        .map(Alternative::from_advice)
        .collect()
    };
    let total = s.model.counts.total;
    let trainable = if s.workload.lora.is_some() {
        memory::fast::simulate_train(&s.model.desc, &s.workload, s.kernels)
            .map(|x| x.params_trainable)
            .unwrap_or(total)
    } else {
        total
    };
    Ok(TrainReport {
        model: ModelInfo::new(&s.model, trainable),
        workload: s.workload.clone(),
        runtime_profile: e.engine.name(),
        peak_bytes: e.peak_bytes,
        phase: worst.phase,
        at_peak: breakdown(&worst.at_peak),
        phase_peaks: None,
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
        doctor: None,
        host_offload_bytes: None,
        float8: s.titan.float8.map(|r| r.name()),
    }
    .with_doctor(s))
}

/// Runs the simulation for `s`: one GPU, or every rank of the cluster.
pub fn build(s: &TrainSettings) -> Result<TrainReport> {
    if let Some(layout) = &s.layout {
        return dist_report(s, layout);
    }
    let est = memory::fast::simulate_train(&s.model.desc, &s.workload, s.kernels)
        .context("cannot simulate this step")?;
    Ok(TrainReport {
        model: ModelInfo::new(&s.model, est.params_trainable),
        workload: s.workload.clone(),
        runtime_profile: est.engine.name(),
        peak_bytes: est.peak_bytes,
        phase: est.phase,
        at_peak: breakdown(&est.at_peak),
        phase_peaks: Some(Entries(
            est.phase_peaks
                .iter()
                .map(|(p, b)| (phase_word(*p), *b))
                .collect(),
        )),
        gpu: GpuFit::new(s.gpu, est.peak_bytes, s.alloc_margin),
        speed: train_speed(s)?,
        distributed: None,
        ranks: None,
        doctor: None,
        host_offload_bytes: s
            .workload
            .step_options
            .activation_offload
            .then_some(est.host_offload_bytes),
        float8: None,
    }
    .with_doctor(s))
}

impl TrainReport {
    /// Adds the doctor's fixes when the peak does not fit (`doctor` is `None` otherwise).
    /// The workload line; torchtitan runs its own attention (FlexAttention, its default
    /// backend), whatever `--attention` names (memory/titan).
    fn workload_text(&self) -> String {
        let line = workload_line(&self.workload);
        if self.runtime_profile == Engine::Torchtitan.name() {
            let name = serde_name(&self.workload.attention);
            let line = line.replacen(
                &format!("attention {name}"),
                "attention flex (torchtitan)",
                1,
            );
            match self.float8 {
                Some(recipe) => format!("{line} · float8 {recipe} linears"),
                None => line,
            }
        } else {
            line
        }
    }

    fn with_doctor(mut self, s: &TrainSettings) -> Self {
        // the doctor's fixes are searched with the hf profile's engines
        if !self.gpu.fits && s.runtime == memory::titan::Runtime::Hf {
            self.doctor = doctor(s).ok();
        }
        self
    }
}

/// The workload line: `batch 4 × seq 2048 · bf16 · adamw · …`.
fn workload_line(w: &TrainWorkload) -> String {
    format!(
        "batch {} × seq {} · {} · {} · attention {} · checkpointing {} · grad-accum {}{}{}",
        w.batch,
        w.seq,
        serde_name(&w.precision),
        serde_name(&w.optimizer),
        serde_name(&w.attention),
        match (w.checkpointing, w.step_options.checkpointing_policy) {
            (false, _) => "off".to_owned(),
            (true, memwall_core::workload::CheckpointPolicy::Full) => "on".to_owned(),
            (true, policy) => policy.name(),
        },
        w.grad_accum,
        match &w.lora {
            Some(l) => format!(
                " · {} r={} on {}",
                if l.qlora { "QLoRA" } else { "LoRA" },
                l.rank,
                l.targets.join(",")
            ),
            None => String::new(),
        },
        kernels_part(w),
    )
}

/// ` · kernels liger · loss fused-linear · padding-free · loop keep-outputs` when the kernels and
/// the loop are not transformers' and the HF Trainer's defaults.
fn kernels_part(w: &TrainWorkload) -> String {
    let mut s = String::new();
    if w.kernels.layers != memwall_core::workload::KernelSet::Torch {
        s.push_str(&format!(" · kernels {}", w.kernels.layers));
    }
    if w.kernels.loss != memwall_core::workload::LossKernel::Torch {
        s.push_str(&format!(" · loss {}", w.kernels.loss));
    }
    if w.kernels.padding_free {
        s.push_str(" · padding-free");
    }
    if w.step_options.keeps_outputs() {
        s.push_str(&format!(" · loop {}", w.step_options.outputs));
    }
    if let Some(c) = w.step_options.use_cache {
        s.push_str(if c {
            " · use_cache on"
        } else {
            " · use_cache off"
        });
    }
    if w.step_options.activation_offload {
        s.push_str(" · activation offload");
    }
    s
}

/// The layout line: `8 GPUs (8 per node) · zero3 · dp 8 · tp 2 + sp · …`.
fn layout_line(d: &DistReport) -> String {
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
            serde_name(&l.schedule),
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
    parts.join(" · ")
}

/// `fits, X free` or `does NOT fit, short by X`.
fn verdict(g: &GpuFit) -> String {
    if g.fits {
        format!(
            "fits, {} free",
            Bytes(u64::try_from(g.headroom_bytes).unwrap_or(0))
        )
    } else {
        format!(
            "does NOT fit, short by {}",
            Bytes(u64::try_from(-g.headroom_bytes).unwrap_or(0))
        )
    }
}

fn host_line(d: &DistReport) -> String {
    format!(
        "{} per node{}",
        Bytes(d.host_bytes_per_node),
        if d.nvme_bytes_per_rank > 0 {
            format!(
                " (swap buffers) + {} NVMe per rank",
                Bytes(d.nvme_bytes_per_rank)
            )
        } else {
            " (pinned)".to_string()
        }
    )
}

fn alternative_extra(a: &Alternative) -> String {
    if a.host_bytes_per_node > 0 {
        format!(", host {} per node", Bytes(a.host_bytes_per_node))
    } else {
        String::new()
    }
}

fn write_dist_table(w: &mut dyn Write, d: &DistReport, profile: &str) -> io::Result<()> {
    writeln!(
        w,
        "cluster: {} · global batch {} · profile {profile}",
        layout_line(d),
        d.global_batch
    )?;
    writeln!(
        w,
        "  {:<28}{:>12}  {:>13}  {:>10}  {:<10}  fits",
        "ranks", "peak", "model states", "host", "phase"
    )?;
    for (i, g) in d.groups.iter().enumerate() {
        writeln!(
            w,
            "{} {:<28}{:>12}  {:>13}  {:>10}  {:<10}  {}",
            if i == d.worst { "▶" } else { " " },
            g.label,
            Bytes(g.peak_bytes).to_string(),
            Bytes(g.model_state_bytes).to_string(),
            Bytes(g.host_bytes).to_string(),
            phase_word(g.phase),
            if g.fits { "yes" } else { "NO" }
        )?;
    }
    if !d.comm_buffers.is_empty() {
        writeln!(
            w,
            "communication buffers (per rank, inside the peak's accounting):"
        )?;
        for b in &d.comm_buffers {
            writeln!(w, "  {:>12}  {}", Bytes(b.bytes).to_string(), b.name)?;
        }
    }
    if d.host_bytes_per_node > 0 {
        writeln!(w, "host memory for offload: {}", host_line(d))?;
    }
    if !d.fits_with.is_empty() {
        writeln!(w, "fits with:")?;
        for a in &d.fits_with {
            writeln!(
                w,
                "  {:<48} worst rank {}{}",
                a.flags,
                Bytes(a.peak_bytes),
                alternative_extra(a)
            )?;
        }
    }
    writeln!(w)
}

fn speed_line(r: &TrainReport) -> String {
    let sp = &r.speed;
    let b = &sp.breakdown;
    let mut parts = vec![format!("compute {:.3}", b.compute_s)];
    for (name, v) in [
        ("recompute", b.recompute_s),
        ("exposed comm", b.exposed_comm_s),
        ("bubble", b.bubble_s),
        ("offload", b.offload_s),
        ("optimizer", b.optimizer_s),
    ] {
        if v > 0.0 {
            parts.push(format!("{name} {v:.3}"));
        }
    }
    // `--float8`: the time model prices every GEMM at the bf16 peak; torchao's `_scaled_mm`
    // at the fp8 peak and its eager casts' memory traffic are not modelled (not measured)
    let float8 = if r.float8.is_some() {
        " (GEMMs timed as bf16: float8's scaled GEMMs and casts are not in the time model)"
    } else {
        ""
    };
    format!(
        "{:.3} s per step ({} s) → {:.0} tokens/s per GPU, MFU {:.1}%{float8}",
        sp.step_s,
        parts.join(", "),
        sp.tokens_per_s_per_gpu,
        sp.mfu * 100.0
    )
}

impl TrainReport {
    fn model_line(&self) -> String {
        format!(
            "{} ({}, {} layers, {} params, {} trainable)",
            self.model.label,
            self.model.model_type,
            self.model.num_layers,
            count(self.model.params_total),
            count(self.model.params_trainable)
        )
    }

    fn worst_rank(&self) -> &'static str {
        if self.distributed.is_some() {
            " on the worst rank"
        } else {
            ""
        }
    }
}

impl Report for TrainReport {
    fn command(&self) -> &'static str {
        "train"
    }

    fn write_table(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "memwall train · {}", self.model_line())?;
        if let Some(v) = &self.model.vision {
            writeln!(w, "  {}", v.line())?;
        }
        writeln!(w, "  {}", self.workload_text())?;
        writeln!(w)?;
        if let Some(d) = &self.distributed {
            write_dist_table(w, d, self.runtime_profile)?;
        }
        writeln!(
            w,
            "peak {}{} during the {} (runtime profile: {})",
            Bytes(self.peak_bytes),
            self.worst_rank(),
            phase_name(self.phase),
            self.runtime_profile
        )?;
        for (k, b) in &self.at_peak.0 {
            if *b == 0 {
                continue;
            }
            let pct = percent(*b, self.peak_bytes);
            writeln!(w, "  {:<24}{:>12}  {:>5.1}%", k, Bytes(*b).to_string(), pct)?;
        }
        let g = &self.gpu;
        writeln!(w, "outside PyTorch's allocator:")?;
        writeln!(
            w,
            "  {:<24}{:>12}  (documented default; driver-dependent)",
            "cuda_context",
            Bytes(g.cuda_context_bytes).to_string()
        )?;
        writeln!(
            w,
            "  {:<24}{:>12}",
            "cublas_workspace",
            Bytes(g.cublas_workspace_bytes).to_string()
        )?;
        writeln!(
            w,
            "  {:<24}{:>12}  (allocator margin: memwall default, --alloc-margin)",
            "allocator_margin",
            Bytes(g.alloc_margin_bytes).to_string()
        )?;
        if let Some(h) = self.host_offload_bytes {
            writeln!(
                w,
                "host (pinned) for the offloaded activations: {} (save_on_cpu; copied over PCIe twice per micro-batch)",
                Bytes(h)
            )?;
        }
        writeln!(w)?;
        writeln!(w, "speed on {}: {}", g.id, speed_line(self))?;
        writeln!(
            w,
            "on {} ({}): needs {} of {} — {}",
            g.id,
            g.name,
            Bytes(g.required_bytes),
            Bytes(g.memory_bytes),
            verdict(g)
        )?;
        if let Some(d) = &self.doctor {
            d.write_steps(w)?;
        }
        Ok(())
    }

    fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "# memwall train · {}", md_text(&self.model.label))?;
        writeln!(w)?;
        writeln!(w, "{}  ", md_text(&self.model_line()))?;
        if let Some(v) = &self.model.vision {
            writeln!(w, "{}  ", md_text(&v.line()))?;
        }
        writeln!(w, "{}", md_text(&self.workload_text()))?;
        writeln!(w)?;
        if let Some(d) = &self.distributed {
            writeln!(w, "## Cluster")?;
            writeln!(w)?;
            writeln!(
                w,
                "{} · global batch {} · profile {}",
                md_text(&layout_line(d)),
                d.global_batch,
                self.runtime_profile
            )?;
            writeln!(w)?;
            let mut t = Table::new(&[
                ("ranks", Align::Left),
                ("peak", Align::Right),
                ("model states", Align::Right),
                ("host", Align::Right),
                ("phase", Align::Left),
                ("fits", Align::Left),
            ]);
            for (i, g) in d.groups.iter().enumerate() {
                t.push(vec![
                    if i == d.worst {
                        format!("**{}** (worst)", g.label)
                    } else {
                        g.label.clone()
                    },
                    Bytes(g.peak_bytes).to_string(),
                    Bytes(g.model_state_bytes).to_string(),
                    Bytes(g.host_bytes).to_string(),
                    phase_word(g.phase).to_owned(),
                    (if g.fits { "yes" } else { "**NO**" }).to_owned(),
                ]);
            }
            t.write_markdown(w)?;
            writeln!(w)?;
            if !d.comm_buffers.is_empty() {
                writeln!(
                    w,
                    "Communication buffers (per rank, inside the peak's accounting):"
                )?;
                writeln!(w)?;
                for b in &d.comm_buffers {
                    writeln!(w, "- {} — {}", Bytes(b.bytes), md_text(&b.name))?;
                }
                writeln!(w)?;
            }
            if d.host_bytes_per_node > 0 {
                writeln!(w, "Host memory for offload: {}.", host_line(d))?;
                writeln!(w)?;
            }
            if !d.fits_with.is_empty() {
                writeln!(w, "### Fits with")?;
                writeln!(w)?;
                for a in &d.fits_with {
                    writeln!(
                        w,
                        "- `{}` — worst rank {}{}",
                        a.flags,
                        Bytes(a.peak_bytes),
                        alternative_extra(a)
                    )?;
                }
                writeln!(w)?;
            }
        }
        writeln!(w, "## Peak")?;
        writeln!(w)?;
        writeln!(
            w,
            "**{}**{} during the {} (runtime profile: {}).",
            Bytes(self.peak_bytes),
            self.worst_rank(),
            phase_name(self.phase),
            self.runtime_profile
        )?;
        writeln!(w)?;
        super::table::at_peak_table(&self.at_peak, self.peak_bytes).write_markdown(w)?;
        writeln!(w)?;
        let g = &self.gpu;
        writeln!(
            w,
            "Outside PyTorch's allocator: CUDA context {} (documented default; driver-dependent), \
             cuBLAS workspace {}; allocator margin {} (memwall default, `--alloc-margin`).",
            Bytes(g.cuda_context_bytes),
            Bytes(g.cublas_workspace_bytes),
            Bytes(g.alloc_margin_bytes)
        )?;
        writeln!(w)?;
        writeln!(w, "## Speed and fit")?;
        writeln!(w)?;
        writeln!(w, "Speed on **{}**: {}.", md_text(&g.id), speed_line(self))?;
        writeln!(w)?;
        markdown_fit(w, g)
    }

    fn csv_table(&self) -> Option<Table> {
        let (ranks, d) = (self.ranks.as_ref()?, self.distributed.as_ref()?);
        let mut t = Table::new(&[
            ("rank", Align::Right),
            ("group", Align::Right),
            ("group_label", Align::Left),
            ("peak_bytes", Align::Right),
            ("host_bytes", Align::Right),
            ("phase", Align::Left),
            ("fits", Align::Left),
        ]);
        for r in ranks {
            let g = d.groups.get(r.group);
            t.push(vec![
                r.rank.to_string(),
                r.group.to_string(),
                g.map_or(String::new(), |g| g.label.clone()),
                r.peak_bytes.to_string(),
                r.host_bytes.to_string(),
                g.map_or(String::new(), |g| phase_word(g.phase).to_owned()),
                g.map_or(String::new(), |g| g.fits.to_string()),
            ]);
        }
        Some(t)
    }

    fn csv_hint(&self) -> &'static str {
        "a train report is a table (one row per rank) only for a cluster: add --gpus N"
    }
}

/// The training doctor for `s` (`memwall doctor`).
pub fn doctor(s: &TrainSettings) -> Result<super::doctor::DoctorReport> {
    if s.runtime == memory::titan::Runtime::Torchtitan {
        return Err(crate::error::UserError::flag(
            "--runtime",
            "torchtitan",
            "the doctor's fixes (checkpointing, kernels, LoRA, offload, other engines) are \
             searched with the hf profile; a torchtitan doctor is not implemented",
            "run `memwall train --runtime torchtitan …` for the estimate, or `memwall plan \
             --runtime torchtitan …` for the torchtitan configurations that fit",
        )
        .into());
    }
    let d = memwall_core::plan::doctor::train(
        &s.model.desc,
        &s.workload,
        s.layout.as_ref(),
        s.gpu,
        s.alloc_margin,
        s.kernels,
    )
    .context("cannot run the doctor")?;
    Ok(super::doctor::DoctorReport::new(
        &s.model,
        &s.gpu.id,
        super::doctor::DoctorKind::Train,
        d,
    ))
}

/// The estimate in one line, for the header of emitted files.
pub fn estimate_line(r: &TrainReport) -> String {
    format!(
        "peak {}{} during the {}; needs {} of {} on {} ({}); {:.3} s per step, {:.0} tokens/s per GPU",
        Bytes(r.peak_bytes),
        r.worst_rank(),
        phase_name(r.phase),
        Bytes(r.gpu.required_bytes),
        Bytes(r.gpu.memory_bytes),
        r.gpu.id,
        if r.gpu.fits { "fits" } else { "does NOT fit" },
        r.speed.step_s,
        r.speed.tokens_per_s_per_gpu
    )
}
