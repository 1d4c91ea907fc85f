//! Step-time model of a training step: per rank, the compute of every op class at
//! shape-dependent efficiencies (the roofline's FLOP and byte counts), recomputation, every
//! collective the engine issues on the link it crosses with the overlap the engine achieves,
//! the pipeline bubble, offload traffic and the optimizer step. Generic over `LayerSpec`.
//!
//! The step of the slowest pipeline stage, for `m` micro-batches per data-parallel rank:
//!
//! `step = m·(compute + recompute + exposed per-micro-batch communication)
//!        + bubble + exposed step-level communication + optimizer + offload`
//!
//! with `bubble = (p − 1)/v` micro-batch times for 1F1B, `v` virtual stages interleaved
//! (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
//! Using Megatron-LM", §2.2). `docs/time-model.md` lists every default with its source and
//! the published runs the model is held to.

mod act_offload;
mod collective;
mod comm;
mod compute;
mod efficiency;
mod hardware;

pub use collective::{collective_time, CollectiveKind, Group, LinkKind};
pub use comm::optimizer_bytes_per_param;
pub use efficiency::{
    attention_peak_fraction, AttentionKernel, Efficiencies, Execution, Recompute,
    DEFAULT_MATMUL_EFFICIENCY,
};
pub use hardware::Hardware;

use crate::error::CoreError;
use crate::gpu::GpuSpec;
use crate::layout::{Layout, Offload, Schedule, Strategy};
use crate::model::ModelDesc;
use crate::workload::TrainWorkload;
use comm::Comm;
use compute::{math_dtype, ComputeContext, LayerCost};
use serde::Serialize;

/// Everything a step-time estimate depends on.
#[derive(Debug, Clone, Copy)]
pub struct StepTimeInputs<'a> {
    /// The model.
    pub model: &'a ModelDesc,
    /// Micro-batch, sequence, precision, optimizer, accumulation, LoRA.
    pub workload: &'a TrainWorkload,
    /// GPUs, sharding strategy and parallel degrees.
    pub layout: &'a Layout,
    /// GPU ceilings and links.
    pub hardware: &'a Hardware,
    /// Achieved fractions of the ceilings.
    pub efficiencies: &'a Efficiencies,
    /// Kernels, recomputation and overlap switches.
    pub execution: &'a Execution,
}

/// Where the step's time goes (seconds; they sum to the step time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Breakdown {
    /// Forward and backward compute of the slowest stage (GEMMs, attention, elementwise).
    pub compute_s: f64,
    /// Forward compute run again in the backward (activation checkpointing).
    pub recompute_s: f64,
    /// Communication not hidden under compute, plus the slowdown of compute that hides it.
    pub exposed_comm_s: f64,
    /// Pipeline fill and drain.
    pub bubble_s: f64,
    /// Host↔device offload traffic not hidden.
    pub offload_s: f64,
    /// The optimizer step (on the GPU, or on the host when offloaded).
    pub optimizer_s: f64,
}

impl Breakdown {
    /// Sum of the components.
    pub fn total_s(&self) -> f64 {
        self.compute_s
            + self.recompute_s
            + self.exposed_comm_s
            + self.bubble_s
            + self.offload_s
            + self.optimizer_s
    }
}

/// One collective (or transfer) of the step, as the slowest stage's rank issues it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Collective {
    /// What it is, in the engine's words.
    pub name: String,
    /// The operation.
    pub kind: CollectiveKind,
    /// Ranks taking part.
    pub group_size: u64,
    /// Bytes of one call (the buffer; a bucket for bucketed reductions).
    pub bytes_per_call: f64,
    /// Calls per step.
    pub calls_per_step: f64,
    /// The link that limits it.
    pub link: LinkKind,
    /// Seconds per step it takes.
    pub seconds: f64,
    /// Of which not hidden under compute.
    pub exposed_seconds: f64,
}

/// A step-time estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepTime {
    /// Seconds per optimizer step.
    pub step_s: f64,
    /// Tokens per second per GPU.
    pub tokens_per_s_per_gpu: f64,
    /// Tokens per second over the whole cluster.
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation: model FLOPs of the step (forward + backward, attention counted
    /// unmasked as PaLM App. B, Megatron and torchtitan count it; no recomputation) over
    /// `step_s × gpus × dense peak`.
    pub mfu: f64,
    /// Hardware FLOPs utilisation: as `mfu` plus the recomputed forward FLOPs.
    pub hfu: f64,
    /// Where the time goes.
    pub breakdown: Breakdown,
    /// Every collective of the slowest stage's rank.
    pub collectives: Vec<Collective>,
    /// Tokens per optimizer step over the cluster.
    pub tokens_per_step: f64,
    /// Model FLOPs per optimizer step over the cluster.
    pub model_flops_per_step: f64,
    /// Micro-batches per step on each data-parallel rank.
    pub micro_batches: u64,
}

/// Checks what the time model needs of a layout: degrees at least 1 that divide the cluster.
/// (Unlike [`Layout::validate`], it times combinations the memory model does not simulate,
/// such as FSDP2 with tensor parallelism, torchtitan's 2-D layout.)
fn check_layout(l: &Layout) -> Result<(), CoreError> {
    for (field, v) in [
        ("gpus", l.gpus),
        ("gpus_per_node", l.gpus_per_node),
        ("tp", l.tp),
        ("pp", l.pp),
        ("cp", l.cp),
        ("ep", l.ep),
        ("virtual_stages", l.virtual_stages),
    ] {
        if v == 0 || v > crate::layout::MAX_GPUS {
            return Err(CoreError::invalid(
                field,
                format!("{v} is outside 1..={}", crate::layout::MAX_GPUS),
            ));
        }
    }
    let mp = l.tp * l.pp * l.cp;
    if !l.gpus.is_multiple_of(mp) {
        return Err(CoreError::invalid(
            "gpus",
            format!("{} GPUs are not a multiple of tp·pp·cp = {mp}", l.gpus),
        ));
    }
    if !(l.dp() * l.cp).is_multiple_of(l.ep) {
        return Err(CoreError::invalid(
            "ep",
            format!(
                "expert parallelism {} must divide dp·cp = {}",
                l.ep,
                l.dp() * l.cp
            ),
        ));
    }
    Ok(())
}

/// Estimates the time of one optimizer step.
pub fn estimate_step_time(inp: &StepTimeInputs<'_>) -> Result<StepTime, CoreError> {
    let StepTimeInputs {
        model,
        workload: w,
        layout: l,
        hardware: hw,
        efficiencies: eff,
        execution: exec,
    } = *inp;
    w.validate()?;
    check_layout(l)?;
    if model.layers.is_empty() {
        return Err(CoreError::invalid(
            "num_hidden_layers",
            "the model has no layers",
        ));
    }
    let peak = hw.ceilings.peak(math_dtype(w.precision)).ok_or_else(|| {
        CoreError::invalid("precision", "this GPU publishes no peak for that precision")
    })?;
    let cc = ComputeContext {
        model,
        workload: w,
        layout: l,
        hw,
        eff,
        exec,
    };
    let mb = cc.micro_batch()?;
    let m = w.grad_accum as f64;
    let pp = l.pp.max(1) as usize;
    let n_layers = model.layers.len();
    let stages: Vec<Vec<usize>> = (0..pp)
        .map(|k| (0..n_layers).filter(|i| i * pp / n_layers == k).collect())
        .collect();
    let rc = exec.recompute;
    let recompute_of = |c: &LayerCost| {
        rc.gemm * c.fwd.gemm + rc.attention * c.fwd.attention + rc.elementwise * c.fwd.elementwise
    };

    struct StageTime {
        compute: f64,
        recompute: f64,
        fwd: f64,
        bwd: f64,
        exposed: f64,
        comm: Vec<Collective>,
    }
    let mut per_stage = Vec::with_capacity(pp);
    for (k, layers) in stages.iter().enumerate() {
        let costs: Vec<LayerCost> = layers
            .iter()
            .filter_map(|&i| mb.layers.get(i).copied())
            .collect();
        let mut fwd: f64 = costs.iter().map(|c| c.fwd.total()).sum();
        let mut bwd: f64 = costs.iter().map(|c| c.bwd.total()).sum();
        let recompute: f64 = costs.iter().map(recompute_of).sum();
        let mut root = 0.0;
        if k == 0 {
            fwd += mb.pre.fwd.total();
            bwd += mb.pre.bwd.total();
            root += mb.pre.step_s();
        }
        if k + 1 == pp {
            fwd += mb.post.fwd.total();
            bwd += mb.post.bwd.total();
            root += mb.post.step_s();
        }
        let mut comm = Comm {
            model,
            workload: w,
            layout: l,
            hw,
            eff,
            exec,
            micro_batches: m,
            out: Vec::new(),
        };
        let exposed = comm.tensor_parallel(layers, &costs, k == 0)
            + comm.context_parallel(layers, &costs)
            + comm.expert_parallel(layers)
            + comm.fully_sharded(layers, &costs, root / 2.0);
        per_stage.push(StageTime {
            compute: fwd + bwd,
            recompute,
            fwd,
            bwd,
            exposed,
            comm: comm.out,
        });
    }
    let micro = |s: &StageTime| s.compute + s.recompute + s.exposed;
    let critical = (0..per_stage.len())
        .max_by(|&a, &b| micro(&per_stage[a]).total_cmp(&micro(&per_stage[b])))
        .unwrap_or(0);
    let Some(crit) = per_stage.get(critical) else {
        return Err(CoreError::invalid("pp", "no pipeline stage"));
    };
    let t_micro = micro(crit);
    let mut comm = Comm {
        model,
        workload: w,
        layout: l,
        hw,
        eff,
        exec,
        micro_batches: m,
        out: crit.comm.clone(),
    };
    let stage_layers = stages.get(critical).cloned().unwrap_or_default();
    let p2p = comm.pipeline();
    let dp = comm.data_parallel(&stage_layers, crit.bwd + crit.recompute, crit.fwd);
    let (offload_s, host_optimizer_s) = comm.offload(&stage_layers, crit.bwd + crit.recompute);
    let offload_s = offload_s + comm.activation_offload();
    let optimizer_s = if matches!(l.offload, Offload::Optimizer | Offload::Both) {
        host_optimizer_s
    } else {
        gpu_optimizer_s(&comm, &stage_layers, critical == 0 || critical + 1 == pp)
    };
    let v = if l.schedule == Schedule::Interleaved {
        l.virtual_stages.max(1) as f64
    } else {
        1.0
    };
    let bubble_s = if pp > 1 {
        (pp as f64 - 1.0) / v * t_micro
    } else {
        0.0
    };
    let hidden: f64 = comm
        .out
        .iter()
        .filter(|c| c.link != LinkKind::Pcie)
        .map(|c| c.seconds - c.exposed_seconds)
        .sum();
    let contention = eff.overlap_slowdown * hidden;
    let breakdown = Breakdown {
        compute_s: m * crit.compute,
        recompute_s: m * crit.recompute,
        exposed_comm_s: m * crit.exposed + p2p + dp + contention,
        bubble_s,
        offload_s,
        optimizer_s,
    };
    let step_s = breakdown.total_s();

    // FLOPs over the cluster: one rank's share × the ranks sharing each micro-batch
    let share = (l.tp * l.cp) as f64;
    let replicas = l.dp() as f64;
    let per_rank_model: f64 = mb.layers.iter().map(|c| c.model_flops).sum::<f64>()
        + mb.pre.model_flops
        + mb.post.model_flops;
    let per_rank_recompute: f64 = mb
        .layers
        .iter()
        .map(|c| rc.gemm * c.fwd_gemm_flops + rc.attention * c.fwd_attention_flops)
        .sum();
    let model_flops = per_rank_model * share * replicas * m;
    let recompute_flops = per_rank_recompute * share * replicas * m;
    let gpus = l.gpus as f64;
    let tokens = (w.batch * w.seq) as f64 * m * replicas;
    let utilisation = |flops: f64| {
        if step_s > 0.0 {
            flops / (step_s * gpus * peak)
        } else {
            0.0
        }
    };
    Ok(StepTime {
        step_s,
        tokens_per_s_per_gpu: tokens / step_s / gpus,
        tokens_per_s: tokens / step_s,
        mfu: utilisation(model_flops),
        hfu: utilisation(model_flops + recompute_flops),
        breakdown,
        collectives: comm.out,
        tokens_per_step: tokens,
        model_flops_per_step: model_flops,
        micro_batches: w.grad_accum,
    })
}

/// The optimizer step on the GPU: every trainable parameter the rank owns (sharded over the
/// data-parallel group by ZeRO, FSDP and Megatron's distributed optimizer) streamed through
/// HBM once per [`optimizer_bytes_per_param`], plus one read of the gradients for the norm
/// clip.
fn gpu_optimizer_s(comm: &Comm<'_>, stage: &[usize], holds_root: bool) -> f64 {
    let (d, e) = comm.trainable_params(stage);
    let root = if holds_root {
        comm.root_params(true)
    } else {
        0.0
    };
    let l = comm.layout;
    let shard = match l.strategy {
        Strategy::Ddp => 1.0,
        Strategy::Hsdp => l.shard_group() as f64,
        _ => (l.dp() * l.cp) as f64,
    };
    let params = (d + e + root) / shard;
    let fused = comm.exec.megatron;
    let bytes = params
        * (optimizer_bytes_per_param(
            comm.workload.optimizer,
            comm.workload.precision,
            fused,
            comm.exec.megatron,
        ) + comm.grad_bytes());
    bytes / (comm.hw.ceilings.memory_bandwidth_bytes_per_s * comm.eff.memory_bandwidth)
}

/// The estimate with every default: the engine the layout resolves to, its kernels and
/// overlap switches ([`Execution::defaults`]) and the documented efficiencies for the GPU.
pub fn estimate_step_time_defaults(
    model: &ModelDesc,
    workload: &TrainWorkload,
    layout: &Layout,
    gpu: &GpuSpec,
) -> Result<StepTime, CoreError> {
    let hardware = Hardware::from_gpu(gpu);
    let mut execution = Execution::defaults(layout, workload, &hardware);
    if !execution.megatron {
        // the exact share of the model's layers the checkpointing policy recomputes
        execution.recompute = Recompute::for_model(workload, model);
    }
    let efficiencies = Efficiencies::defaults(&hardware, execution.attention);
    estimate_step_time(&StepTimeInputs {
        model,
        workload,
        layout,
        hardware: &hardware,
        efficiencies: &efficiencies,
        execution: &execution,
    })
}

/// User overrides of the two efficiencies people most often know for their stack (`None`
/// keeps the documented default).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    /// [`Efficiencies::matmul`]: fraction of the dense peak a large GEMM reaches.
    pub matmul: Option<f64>,
    /// [`Efficiencies::memory_bandwidth`]: fraction of HBM bandwidth memory-bound kernels reach.
    pub memory_bandwidth: Option<f64>,
}

/// [`estimate_step_time_defaults`] with `overrides` applied, for `layout` (`None`: one GPU).
pub fn estimate_step_time_with(
    model: &ModelDesc,
    workload: &TrainWorkload,
    layout: Option<&Layout>,
    gpu: &GpuSpec,
    overrides: Overrides,
) -> Result<StepTime, CoreError> {
    let single = Layout::single();
    let layout = layout.unwrap_or(&single);
    let hardware = Hardware::from_gpu(gpu);
    let mut execution = Execution::defaults(layout, workload, &hardware);
    if !execution.megatron {
        // the exact share of the model's layers the checkpointing policy recomputes
        execution.recompute = Recompute::for_model(workload, model);
    }
    let mut efficiencies = Efficiencies::defaults(&hardware, execution.attention);
    if let Some(m) = overrides.matmul {
        efficiencies.matmul = m;
    }
    if let Some(b) = overrides.memory_bandwidth {
        efficiencies.memory_bandwidth = b;
    }
    estimate_step_time(&StepTimeInputs {
        model,
        workload,
        layout,
        hardware: &hardware,
        efficiencies: &efficiencies,
        execution: &execution,
    })
}

#[cfg(test)]
mod tests;
