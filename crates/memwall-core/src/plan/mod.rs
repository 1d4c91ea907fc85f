//! What to run: the fastest configuration that fits ([`search`]), and the cheapest fix when a
//! configuration does not ([`doctor`]).
//!
//! Both evaluate candidates with the same two models every other command uses — the memory
//! simulation ([`crate::memory`]) for the peak of every rank, and the step-time model
//! ([`step_time`]) for the speed — and the same fit test ([`Fit`]): the allocator peak plus
//! the lines no tensor tracker sees (CUDA context, cuBLAS workspace) plus an allocator margin,
//! against the device's memory.

pub mod doctor;
mod search;

pub use search::{
    default_lora, search, search_with_progress, Allow, AllowItem, Plan, PlanRequest, PlanResult,
    SearchSpace,
};

use crate::error::CoreError;
use crate::gpu::GpuSpec;
#[cfg(test)]
use crate::gpu::CUDA_CONTEXT_BYTES;
use crate::layout::{Layout, Offload, Strategy};
use crate::memory::{self, Category, Kernels, Phase};
use crate::model::ModelDesc;
use crate::workload::TrainWorkload;
use serde::Serialize;

/// Default allocator margin: the fraction of the allocator peak added for what PyTorch's
/// caching allocator reserves beyond what is allocated (block rounding and fragmentation; see
/// "CUDA memory management" in the PyTorch docs, `torch.cuda.memory_reserved` versus
/// `memory_allocated`). This is memwall's default, not a measurement: an OOM happens against
/// reserved memory, and how far reserved exceeds allocated depends on the allocation pattern
/// and `PYTORCH_CUDA_ALLOC_CONF`. Measure yours as `max_memory_reserved() /
/// max_memory_allocated() - 1` and pass it with `--alloc-margin`.
pub const DEFAULT_ALLOC_MARGIN: f64 = 0.05;

/// Largest allocator margin accepted (the reserved pool at twice the allocated peak).
pub const MAX_ALLOC_MARGIN: f64 = 1.0;

pub use crate::advice::GpuFit as Fit;

/// Checks an allocator margin given by the user.
pub fn check_alloc_margin(v: f64) -> Result<f64, CoreError> {
    if (0.0..=MAX_ALLOC_MARGIN).contains(&v) {
        Ok(v)
    } else {
        Err(CoreError::invalid(
            "alloc_margin",
            format!("{v} is outside 0..={MAX_ALLOC_MARGIN} (a fraction of the peak)"),
        ))
    }
}

/// The memory of one candidate: the worst rank's peak and what is alive then.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Memory {
    /// Worst rank's allocator peak.
    pub peak_bytes: u64,
    /// Phase of that peak.
    pub phase: Phase,
    /// What is alive at the peak, by category.
    pub at_peak: Vec<(Category, u64)>,
    /// Host bytes per node (offload), 0 without offload.
    pub host_bytes_per_node: u64,
}

/// Simulates `w` on `layout` (`None`: one GPU, the `hf` engine) with the fast exact evaluator
/// ([`memory::fast`], equal to the replay) and returns the worst rank.
pub fn memory_of(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: Option<&Layout>,
    kernels: Kernels,
) -> Result<Memory, CoreError> {
    memory_in(&mut memory::fast::Evaluator::new(model, kernels), w, layout)
}

/// [`memory_of`] in an evaluation context that remembers the ranks it simulated
/// ([`memory::fast::Evaluator`]: an exact memo, the same answers).
pub fn memory_in(
    ev: &mut memory::fast::Evaluator<'_>,
    w: &TrainWorkload,
    layout: Option<&Layout>,
) -> Result<Memory, CoreError> {
    match layout {
        None => {
            let e = ev.train(w)?;
            Ok(Memory {
                peak_bytes: e.peak_bytes,
                phase: e.phase,
                at_peak: e.at_peak,
                host_bytes_per_node: 0,
            })
        }
        Some(l) => {
            let e = ev.train_dist(w, l, &memory::DistOptions::default())?;
            let worst = e.groups.get(e.worst);
            Ok(Memory {
                peak_bytes: e.peak_bytes,
                phase: worst.map_or(Phase::Forward, |g| g.phase),
                at_peak: worst.map(|g| g.at_peak.clone()).unwrap_or_default(),
                host_bytes_per_node: e.host_bytes_per_node,
            })
        }
    }
}

/// [`memory_of`] with torchtitan's runtime profile (`memory/titan`, closed form: there is no
/// separate fast path to agree with).
pub fn memory_of_titan(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: &Layout,
) -> Result<Memory, CoreError> {
    let e = memory::titan::simulate_train_titan(
        model,
        w,
        layout,
        &memory::titan::TitanOptions::default(),
    )?;
    let worst = e.groups.get(e.worst);
    Ok(Memory {
        peak_bytes: e.peak_bytes,
        phase: worst.map_or(Phase::Forward, |g| g.phase),
        at_peak: worst.map(|g| g.at_peak.clone()).unwrap_or_default(),
        host_bytes_per_node: 0,
    })
}

/// Step time of one optimizer step of `w` on `layout` (`None`: one GPU) with every default of
/// the step-time model ([`crate::time::estimate_step_time_defaults`]: compute, recomputation,
/// the engine's collectives and their overlap, pipeline bubble, offload, optimizer).
pub fn step_time(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: Option<&Layout>,
    gpu: &GpuSpec,
) -> Result<StepTime, CoreError> {
    let single = Layout::single();
    crate::time::estimate_step_time_defaults(model, w, layout.unwrap_or(&single), gpu)
}

pub use crate::time::StepTime;

/// The `memwall train` arguments (without `--model` and `--gpu`, which the caller knows) that
/// reproduce `w` on `layout`.
pub fn train_args(w: &TrainWorkload, layout: Option<&Layout>) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |k: &str, v: String| {
        a.push(k.to_owned());
        a.push(v);
    };
    push("--batch", w.batch.to_string());
    push("--seq", w.seq.to_string());
    push("--precision", w.precision.name().to_owned());
    push("--optimizer", w.optimizer.name().to_owned());
    push("--attention", w.attention.name().to_owned());
    if w.grad_accum > 1 {
        push("--grad-accum", w.grad_accum.to_string());
    }
    let liger = w.kernels.layers == crate::workload::KernelSet::Liger;
    if w.kernels.layers != crate::workload::KernelSet::Torch {
        push("--kernels", w.kernels.layers.name().to_owned());
    }
    // `--kernels liger` implies its fused linear cross-entropy
    let implied = liger && w.kernels.loss == crate::workload::LossKernel::FusedLinear;
    if w.kernels.loss != crate::workload::LossKernel::Torch && !implied {
        push("--loss", w.kernels.loss.name().to_owned());
    }
    if w.step_options.keeps_outputs() {
        push("--loop", w.step_options.outputs.name().to_owned());
    }
    if let Some(c) = w.step_options.use_cache {
        push("--use-cache", c.to_string());
    }
    if let Some(l) = &w.lora {
        push("--lora-rank", l.rank.to_string());
        push("--lora-targets", l.targets.join(","));
    }
    if let Some(l) = layout {
        push("--gpus", l.gpus.to_string());
        push("--gpus-per-node", l.gpus_per_node.to_string());
        push("--strategy", l.strategy.name().to_owned());
        for (flag, v) in [
            ("--tp", l.tp),
            ("--pp", l.pp),
            ("--cp", l.cp),
            ("--ep", l.ep),
        ] {
            if v > 1 {
                push(flag, v.to_string());
            }
        }
        if l.pp > 1 {
            push("--schedule", l.schedule.name().to_owned());
        }
        if l.virtual_stages > 1 {
            push("--virtual-stages", l.virtual_stages.to_string());
        }
        if l.offload != Offload::None {
            push("--offload", l.offload.name().to_owned());
            push("--offload-device", l.offload_device.name().to_owned());
        }
    }
    if w.lora.as_ref().is_some_and(|l| l.qlora) {
        a.push("--qlora".to_owned());
    }
    if w.checkpointing {
        let policy = w.step_options.checkpointing_policy;
        if policy == crate::workload::CheckpointPolicy::Full {
            a.push("--checkpointing".to_owned());
        } else {
            a.push("--checkpointing-policy".to_owned());
            a.push(policy.name());
        }
    }
    if let Some(l) = layout {
        if l.sequence_parallel {
            a.push("--sequence-parallel".to_owned());
        }
    }
    if !w.dropout {
        a.push("--no-dropout".to_owned());
    }
    if w.kernels.padding_free {
        a.push("--padding-free".to_owned());
    }
    a
}

/// Whether an engine keeps an fp32 master copy under `bf16`/`fp16`: DeepSpeed ZeRO and
/// Megatron-LM do (`bf16` mode keeps fp32 master weights: deepspeed/runtime/bf16_optimizer.py,
/// megatron/core/optimizer/distrib_optimizer.py), so there pure 16-bit precision does not
/// change the training result; HF, DDP and FSDP2 then train bf16 weights directly.
pub(crate) fn keeps_master(layout: Option<&Layout>) -> bool {
    layout.is_some_and(|l| {
        l.model_parallel()
            || matches!(
                l.strategy,
                Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3
            )
    })
}

/// The test model of the plan tests: Llama-2-7B with transformers' linear names.
#[cfg(test)]
pub(crate) fn test_model() -> ModelDesc {
    use crate::model::LinearRole as R;
    let mut m = crate::model::tests::llama2_7b();
    m.linear_names = [
        (R::Q, "q_proj"),
        (R::K, "k_proj"),
        (R::V, "v_proj"),
        (R::O, "o_proj"),
        (R::Gate, "gate_proj"),
        (R::Up, "up_proj"),
        (R::Down, "down_proj"),
    ]
    .into_iter()
    .map(|(r, n)| (r, n.to_owned()))
    .collect();
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Optimizer, Precision};

    fn gpu() -> GpuSpec {
        crate::advice::tests::gpu("h100", 80, "hopper")
    }

    #[test]
    fn fit_adds_context_workspace_and_margin() {
        let g = gpu();
        let f = Fit::new(&g, 10 << 30, 0.05);
        assert_eq!(
            f.alloc_margin_bytes,
            ((10u64 << 30) as f64 * 0.05).ceil() as u64
        );
        assert_eq!(
            f.required_bytes,
            (10 << 30) + CUDA_CONTEXT_BYTES + g.cublas_workspace_bytes() + f.alloc_margin_bytes
        );
        assert!(f.fits);
        let over = Fit::new(&g, 79 << 30, 0.05);
        assert!(!over.fits);
        assert!(over.headroom_bytes < 0);
    }

    #[test]
    fn alloc_margin_range() {
        assert!(check_alloc_margin(0.0).is_ok());
        assert!(check_alloc_margin(1.5).is_err());
        assert!(check_alloc_margin(f64::NAN).is_err());
    }

    #[test]
    fn train_args_round_trip_the_knobs() {
        let mut w = TrainWorkload::new(4, 2048);
        w.grad_accum = 8;
        w.checkpointing = true;
        w.optimizer = Optimizer::AdamwFused;
        w.precision = Precision::AmpBf16;
        let mut l = Layout::single();
        l.gpus = 8;
        l.gpus_per_node = 8;
        l.strategy = Strategy::Zero3;
        l.offload = Offload::Optimizer;
        let a = train_args(&w, Some(&l)).join(" ");
        assert_eq!(
            a,
            "--batch 4 --seq 2048 --precision amp-bf16 --optimizer adamw-fused --attention sdpa \
             --grad-accum 8 --gpus 8 --gpus-per-node 8 --strategy zero3 --offload optimizer \
             --offload-device cpu --checkpointing"
        );
    }
}
