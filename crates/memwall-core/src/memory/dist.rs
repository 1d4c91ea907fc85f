//! Distributed training: the memory of every rank of a cluster.
//!
//! The engine is resolved once from the layout ([`Engine::resolve`]) and the combination checked
//! against its capability row ([`Engine::check`]) before anything is simulated:
//! - [`Engine::Ddp`], [`Engine::Fsdp2`] and [`Engine::Zero`] (PyTorch DDP / FSDP2, DeepSpeed
//!   ZeRO-1/2/3): the rank replays the same transformers step as [`super::simulate_train`], with
//!   the sharding hooks of `hf/shard.rs` (sharded model states, all-gather and reduce-scatter
//!   buffers, buckets);
//! - [`Engine::Megatron`] (tensor / sequence / pipeline / context / expert parallelism):
//!   Megatron-LM's own layers, so activations follow Korthikanti et al. 2022 and the model
//!   states `megatron/training/theoretical_memory_usage.py` (see `memory/megatron.rs`).

use super::dist_types::{ShardKind, ShardSim};
use super::hf::Builder;
use super::ranks::{compress_ranks, worst_group};
pub use super::ranks::{CommBuffer, DistEstimate, RankGroup};
use super::{to_u64, Category, Kernels, Phase};
use crate::engine::Engine;
use crate::error::CoreError;
use crate::layout::{Layout, Offload, OffloadDevice, Strategy};
use crate::model::ModelDesc;
use crate::workload::{Precision, TrainWorkload};

/// DeepSpeed `reduce_bucket_size` default (deepspeed/runtime/zero/config.py: 5e8 elements).
pub const DEEPSPEED_REDUCE_BUCKET_ELEMS: u64 = 500_000_000;

/// Engine settings that are not part of the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DistOptions {
    /// FSDP2: the root module (embeddings, final norm, head) reshards after forward too. That
    /// is what happens when `reshard_after_forward=True` is passed explicitly to the root's
    /// `fully_shard` (accelerate's FSDP2 plugin does); with the default `None` the root stays
    /// unsharded (`_fsdp_state.py` `_lazy_init`).
    pub fsdp_root_reshard: bool,
    /// DDP `gradient_as_bucket_view` (PyTorch's default is `False`).
    pub ddp_bucket_view: bool,
}

impl Default for DistOptions {
    fn default() -> Self {
        DistOptions {
            fsdp_root_reshard: true,
            ddp_bucket_view: false,
        }
    }
}

/// Simulates every rank of a distributed training step with default engine settings.
pub fn simulate_train_dist(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: &Layout,
    kernels: Kernels,
) -> Result<DistEstimate, CoreError> {
    simulate_train_dist_with(model, w, layout, kernels, &DistOptions::default())
}

/// Simulates every rank of a distributed training step.
pub fn simulate_train_dist_with(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: &Layout,
    kernels: Kernels,
    opts: &DistOptions,
) -> Result<DistEstimate, CoreError> {
    w.validate()?;
    layout.validate()?;
    if model.layers.is_empty() {
        return Err(CoreError::invalid(
            "num_hidden_layers",
            "the model has no layers",
        ));
    }
    // the one place a distributed step is checked: anything the engine does not run is refused
    // here, by name (engine::TABLE)
    let engine = Engine::resolve(Some(layout));
    engine.check(w, Some(layout))?;
    let kind = match engine {
        Engine::Megatron => return super::megatron::simulate(model, w, layout),
        Engine::Ddp => ShardKind::Ddp {
            bucket_view: opts.ddp_bucket_view,
        },
        Engine::Fsdp2 if layout.strategy == Strategy::FsdpGradOp => ShardKind::Fsdp2 {
            reshard_after_forward: false,
            root_reshard: false,
        },
        Engine::Fsdp2 => ShardKind::Fsdp2 {
            reshard_after_forward: true,
            root_reshard: opts.fsdp_root_reshard,
        },
        Engine::Zero(stage) => ShardKind::Zero {
            stage: stage.number(),
        },
        Engine::Hf | Engine::Vllm => {
            return Err(CoreError::invalid(
                "strategy",
                format!(
                    "{} does not run a distributed training step",
                    engine.title()
                ),
            ))
        }
    };
    let dp = layout.dp();
    let world = u128::from(layout.shard_group());
    // Precision per runtime. FSDP2: `amp-*` is MixedPrecisionPolicy(param_dtype=bf16/fp16,
    // reduce_dtype=fp32) over an fp32 model, the FSDP2 idiom (no autocast). DeepSpeed: bf16 and
    // fp16 keep an fp32 master partition (`bf16`/`fp16` config sections with ZeRO).
    let mut rank_w = w.clone();
    let (master_size, reduce_size, cast_params) = match (kind, w.precision) {
        (ShardKind::Ddp { .. }, _) => (0, 0, false),
        (ShardKind::Fsdp2 { .. }, Precision::AmpBf16 | Precision::AmpFp16) => {
            rank_w.precision = if w.precision == Precision::AmpBf16 {
                Precision::Bf16
            } else {
                Precision::Fp16
            };
            (4, 4, true)
        }
        (ShardKind::Fsdp2 { .. }, Precision::Bf16 | Precision::Fp16) => (2, 2, false),
        (ShardKind::Fsdp2 { .. }, Precision::Fp32) => (4, 4, false),
        (ShardKind::Zero { .. }, Precision::Fp32) => (4, 4, false),
        (ShardKind::Zero { .. }, p) => {
            rank_w.precision = p.half();
            (4, 2, false)
        }
    };
    let offload_states = layout.offload != Offload::None;
    let offload_params = match kind {
        // FSDP2's CPUOffloadPolicy moves sharded parameters, gradients and states together
        ShardKind::Fsdp2 { .. } => offload_states,
        _ => matches!(layout.offload, Offload::Params | Offload::Both),
    };
    let offload_states = match kind {
        ShardKind::Zero { .. } => matches!(layout.offload, Offload::Optimizer | Offload::Both),
        _ => offload_states,
    };
    let run = |rank: u128| -> Result<RankRun, CoreError> {
        let shard = ShardSim {
            kind,
            world,
            rank,
            master_size,
            reduce_size,
            cast_params,
            offload_states,
            offload_params,
            bucket_elems: u128::from(DEEPSPEED_REDUCE_BUCKET_ELEMS),
        };
        let mut b = Builder::train(model, &rank_w, kernels, Some(shard));
        b.run();
        let host = b.offloaded_bytes();
        let states = b.model_state_bytes();
        let t = &b.t;
        let phase_peaks = super::train_phase_peaks(t)?;
        let at_peak = super::breakdown_at_peak(t)?;
        Ok(RankRun {
            peak: to_u64(t.peak(), "peak bytes")?,
            at_peak,
            phase: t.peak_phase(),
            host: to_u64(host, "host bytes")?,
            states: to_u64(states, "model states")?,
            phase_peaks,
            params: to_u64(b.param_count, "parameters")?,
            comm: b.comm_buffer_lines(),
        })
    };
    // Ranks differ only through uneven tail chunks, and every parameter's chunk is
    // non-increasing in the rank: if the first and the last rank keep the same model-state
    // bytes, every parameter's chunk is the same on all ranks and one run stands for all.
    // Otherwise every rank runs (up to 16; beyond, the others take rank 0's numbers, an upper
    // bound since no rank holds more than rank 0).
    let sharded_per_param = !matches!(kind, ShardKind::Ddp { .. });
    let mut runs: Vec<(u128, RankRun)> = vec![(0, run(0)?)];
    if sharded_per_param && world > 1 {
        let last = run(world - 1)?;
        if last.states != runs[0].1.states || last.host != runs[0].1.host {
            if world <= 16 {
                for r in 1..world - 1 {
                    runs.push((r, run(r)?));
                }
            }
            runs.push((world - 1, last));
        }
    }
    // Expand to global ranks: shard index r = global rank mod shard group (HSDP replicates
    // shard groups across nodes; plain sharding has one group of all ranks).
    let gpus = layout.gpus;
    let shard_group = layout.shard_group();
    let run_for = |r: u128| -> usize {
        // ranks not simulated (large worlds) take rank 0's numbers: chunks never grow with rank
        runs.iter().position(|(x, _)| *x == r).unwrap_or(0)
    };
    // runs with the same numbers form one group (ranks ascending, so no sort is needed)
    let mut groups: Vec<RankGroup> = Vec::new();
    let mut group_of_run: Vec<usize> = Vec::with_capacity(runs.len());
    for (_, rr) in &runs {
        let same = groups.iter().position(|g| {
            g.peak_bytes == rr.peak && g.host_bytes == rr.host && g.model_state_bytes == rr.states
        });
        group_of_run.push(same.unwrap_or(groups.len()));
        if same.is_none() {
            groups.push(RankGroup {
                label: String::new(),
                ranks: Vec::new(),
                peak_bytes: rr.peak,
                at_peak: rr.at_peak.clone(),
                phase: rr.phase,
                host_bytes: rr.host,
                model_state_bytes: rr.states,
                phase_peaks: rr.phase_peaks.clone(),
            });
        }
    }
    for g in 0..gpus {
        groups[group_of_run[run_for(u128::from(g % shard_group))]]
            .ranks
            .push(g);
    }
    for g in &mut groups {
        g.label = if g.ranks.len() == 1 {
            format!("rank {}", g.ranks[0])
        } else {
            format!("ranks {}", compress_ranks(&g.ranks))
        };
    }
    let worst = worst_group(&groups);
    let first = &runs[0].1;
    let max_host = groups.iter().map(|g| g.host_bytes).max().unwrap_or(0);
    let per_node = layout.gpus_per_node.min(gpus);
    let (host_per_node, nvme) = match layout.offload_device {
        OffloadDevice::Cpu => (max_host.saturating_mul(per_node), 0),
        // ZeRO-Infinity: the offloaded bytes live on NVMe; the host keeps the swap buffers
        OffloadDevice::Nvme => (
            nvme_swap_buffer_bytes(layout).saturating_mul(per_node),
            max_host,
        ),
    };
    Ok(DistEstimate {
        engine,
        peak_bytes: groups[worst].peak_bytes,
        worst,
        groups,
        host_bytes_per_node: host_per_node,
        nvme_bytes_per_rank: nvme,
        comm_buffers: first.comm.clone(),
        dp,
        global_batch: w.batch.saturating_mul(w.grad_accum).saturating_mul(dp),
        params_total: first.params,
    })
}

struct RankRun {
    peak: u64,
    at_peak: Vec<(Category, u64)>,
    phase: Phase,
    host: u64,
    states: u64,
    phase_peaks: Vec<(Phase, u64)>,
    params: u64,
    comm: Vec<CommBuffer>,
}

/// Pinned host swap buffers of ZeRO-Infinity: `offload_param.buffer_count` (5) ×
/// `buffer_size` (1e8 elements, fp16) and `offload_optimizer.buffer_count` (4) × the same
/// size in fp32 (deepspeed/runtime/zero/offload_config.py defaults).
fn nvme_swap_buffer_bytes(layout: &Layout) -> u64 {
    let params = 5 * 100_000_000 * 2;
    let optim = 4 * 100_000_000 * 4;
    match layout.offload {
        Offload::Params => params,
        Offload::Optimizer => optim,
        Offload::Both => params + optim,
        Offload::None => 0,
    }
}
