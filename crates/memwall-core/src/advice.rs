//! What a result means on a GPU, and what to change when it does not fit.
//!
//! [`GpuFit`] adds the memory no tensor tracker sees (CUDA context, cuBLAS workspace) to a peak
//! and compares it with the device. [`fitting_alternatives`] searches the neighbouring layouts of
//! a distributed job — deeper sharding, activation checkpointing, offload — and returns the
//! cheapest that fit, each with the peak the simulation gives it.

use crate::gpu::{GpuSpec, CUDA_CONTEXT_BYTES};
use crate::layout::{Layout, Offload, Strategy};
use crate::memory::{self, Kernels};
use crate::model::ModelDesc;
use crate::workload::TrainWorkload;
use serde::Serialize;

/// A peak on a GPU: what the process needs in all, and whether the device holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuFit {
    /// GPU id.
    pub id: String,
    /// GPU name.
    pub name: String,
    /// Device memory.
    pub memory_bytes: u64,
    /// CUDA context (outside PyTorch's allocator; documented default, [`CUDA_CONTEXT_BYTES`]).
    pub cuda_context_bytes: u64,
    /// cuBLAS workspace (PyTorch default for this GPU, [`GpuSpec::cublas_workspace_bytes`]).
    pub cublas_workspace_bytes: u64,
    /// Allocator margin: `alloc_margin · peak`, for what PyTorch's caching allocator reserves
    /// beyond what it has allocated ([`crate::plan::DEFAULT_ALLOC_MARGIN`]).
    pub alloc_margin_bytes: u64,
    /// peak + context + workspace + allocator margin.
    pub required_bytes: u64,
    /// Whether it fits.
    pub fits: bool,
    /// memory − required (negative when it does not fit).
    pub headroom_bytes: i128,
}

impl GpuFit {
    /// The fit of `peak_bytes` (PyTorch allocator peak) on `gpu`, with an allocator margin of
    /// `alloc_margin` (a fraction of the peak, clamped to `0 ..= MAX_ALLOC_MARGIN`).
    pub fn new(gpu: &GpuSpec, peak_bytes: u64, alloc_margin: f64) -> Self {
        let cublas = gpu.cublas_workspace_bytes();
        let fraction = if alloc_margin.is_finite() {
            alloc_margin.clamp(0.0, crate::plan::MAX_ALLOC_MARGIN)
        } else {
            0.0
        };
        // a bounded fraction of a u64: finite, at most the peak itself
        let margin = (peak_bytes as f64 * fraction).ceil() as u64;
        let required = peak_bytes
            .saturating_add(CUDA_CONTEXT_BYTES)
            .saturating_add(cublas)
            .saturating_add(margin);
        GpuFit {
            alloc_margin_bytes: margin,
            id: gpu.id.clone(),
            name: gpu.name.clone(),
            memory_bytes: gpu.memory_bytes,
            cuda_context_bytes: CUDA_CONTEXT_BYTES,
            cublas_workspace_bytes: cublas,
            required_bytes: required,
            fits: required <= gpu.memory_bytes,
            headroom_bytes: i128::from(gpu.memory_bytes) - i128::from(required),
        }
    }
}

/// A change to a distributed job that makes its worst rank fit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alternative {
    /// Data-parallel strategy of the changed layout.
    pub strategy: Strategy,
    /// Whether the change turns activation checkpointing on (it may already be on).
    pub checkpointing: bool,
    /// Offload of the changed layout.
    pub offload: Offload,
    /// The worst rank's peak with that change.
    pub peak_bytes: u64,
    /// Host bytes per node the change needs.
    pub host_bytes_per_node: u64,
}

/// Relative cost of a change, cheapest first. More sharding costs communication (its index in
/// the strategy list: ZeRO-1 < ZeRO-2 < FSDP without reshard < FSDP < ZeRO-3), activation
/// checkpointing about a third more compute (one more forward per backward), offload
/// host-device traffic every step — the parameters' (with `both`) more than the optimizer's.
fn cost(strategy_rank: u32, checkpointing: bool, offload: Offload) -> u32 {
    strategy_rank
        + if checkpointing { 3 } else { 0 }
        + match offload {
            Offload::None => 0,
            Offload::Optimizer => 4,
            _ => 8,
        }
}

/// Up to `max` layouts near `layout` whose worst rank fits `gpu`, cheapest first: deeper
/// sharding, then recomputation, then offload (relative costs: one step along ZeRO-1 < ZeRO-2 <
/// FSDP without reshard < FSDP < ZeRO-3 per unit, checkpointing 3, optimizer offload 4,
/// parameter offload 8). The asked layout itself is skipped; a candidate the layout rules
/// refuse or the simulation cannot run is skipped too.
pub fn fitting_alternatives(
    model: &ModelDesc,
    workload: &TrainWorkload,
    layout: &Layout,
    kernels: Kernels,
    gpu: &GpuSpec,
    alloc_margin: f64,
    max: usize,
) -> Vec<Alternative> {
    // with tensor/pipeline parallelism the engine is Megatron, whose only sharding is its
    // distributed optimizer (ZeRO-1 equivalent)
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
    let mut candidates: Vec<(u32, Layout, bool)> = Vec::new();
    for checkpointing in [false, true] {
        for (rank, &strategy) in (0u32..).zip(strategies) {
            for offload in [Offload::None, Offload::Optimizer, Offload::Both] {
                // parameter offload needs parameter sharding (ZeRO-3, FSDP); FSDP2's
                // CPUOffloadPolicy moves parameters, gradients and states together
                if offload == Offload::Both && strategy != Strategy::Zero3 && !strategy.is_fsdp() {
                    continue;
                }
                if offload == Offload::Optimizer && strategy.is_fsdp() {
                    continue;
                }
                let mut l = layout.clone();
                l.strategy = strategy;
                l.offload = offload;
                if l.validate().is_err() {
                    continue;
                }
                candidates.push((cost(rank, checkpointing, offload), l, checkpointing));
            }
        }
    }
    // stable: equal costs keep the enumeration order
    candidates.sort_by_key(|c| c.0);
    let mut out = Vec::new();
    for (_, l, checkpointing) in candidates {
        if out.len() >= max {
            break;
        }
        if l == *layout && checkpointing == workload.checkpointing {
            continue;
        }
        let mut w = workload.clone();
        w.checkpointing = w.checkpointing || checkpointing;
        let Ok(e) = memory::fast::simulate_train_dist(model, &w, &l, kernels) else {
            continue;
        };
        if GpuFit::new(gpu, e.peak_bytes, alloc_margin).fits {
            out.push(Alternative {
                strategy: l.strategy,
                checkpointing,
                offload: l.offload,
                peak_bytes: e.peak_bytes,
                host_bytes_per_node: e.host_bytes_per_node,
            });
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::tests::llama2_7b;
    use crate::roofline::MathDtype;

    /// An NVIDIA GPU with `gib` GiB (H100-like figures otherwise).
    pub(crate) fn gpu(id: &str, gib: u64, architecture: &str) -> GpuSpec {
        GpuSpec {
            id: id.into(),
            name: id.to_uppercase(),
            vendor: "nvidia".into(),
            architecture: architecture.into(),
            memory_bytes: gib << 30,
            memory_type: "HBM3".into(),
            memory_bandwidth_bytes_per_s: 3.35e12,
            l2_bytes: None,
            peak_flops_per_s: vec![(MathDtype::Bf16, 989e12), (MathDtype::Fp32, 67e12)],
            interconnect: None,
            pcie: None,
            network_bytes_per_s: crate::gpu::DEFAULT_NETWORK_BYTES_PER_S,
            matmul_efficiency: None,
            tdp_w: None,
            sources: Vec::new(),
        }
    }

    #[test]
    fn fit_adds_context_and_workspace_to_the_peak() {
        let g = gpu("h100", 80, "hopper");
        let f = GpuFit::new(&g, 10 << 30, 0.0);
        assert_eq!(
            f.required_bytes,
            (10 << 30) + CUDA_CONTEXT_BYTES + (32 << 20)
        );
        assert!(f.fits);
        assert_eq!(
            f.headroom_bytes,
            i128::from(g.memory_bytes) - i128::from(f.required_bytes)
        );
        let f = GpuFit::new(&g, g.memory_bytes, 0.0);
        assert!(!f.fits && f.headroom_bytes < 0);
        // saturates rather than overflows
        assert_eq!(GpuFit::new(&g, u64::MAX, 0.0).required_bytes, u64::MAX);
    }

    #[test]
    fn alternatives_fit_are_cheapest_first_and_change_something() {
        let model = llama2_7b();
        let w = TrainWorkload::new(1, 2048);
        let mut layout = Layout::single();
        layout.gpus = 8;
        layout.gpus_per_node = 8;
        let g = gpu("l4", 24, "ada");
        let asked = memory::simulate_train_dist(&model, &w, &layout, Kernels::Cuda).unwrap();
        assert!(!GpuFit::new(&g, asked.peak_bytes, 0.0).fits);
        let alts = fitting_alternatives(&model, &w, &layout, Kernels::Cuda, &g, 0.0, 3);
        assert!(!alts.is_empty() && alts.len() <= 3);
        let strategies = [
            Strategy::Zero1,
            Strategy::Zero2,
            Strategy::FsdpGradOp,
            Strategy::FsdpFull,
            Strategy::Zero3,
        ];
        let costs: Vec<u32> = alts
            .iter()
            .map(|a| {
                assert!(GpuFit::new(&g, a.peak_bytes, 0.0).fits);
                let rank = strategies.iter().position(|s| *s == a.strategy).unwrap();
                cost(rank as u32, a.checkpointing, a.offload)
            })
            .collect();
        assert!(costs.windows(2).all(|c| c[0] <= c[1]), "{costs:?}");
        assert!(fitting_alternatives(&model, &w, &layout, Kernels::Cuda, &g, 0.0, 0).is_empty());
    }
}
