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
use super::ranks::worst_group;
pub use super::ranks::{CommBuffer, DistEstimate, RankGroup, RankSet};
use super::{to_u64, Category, Kernels, Phase};
use crate::engine::Engine;
use crate::error::CoreError;
use crate::layout::{Layout, Offload, OffloadDevice, Strategy};
use crate::memory::fast::memo::RankMemo;
use crate::memory::fast::Path;
use crate::model::ModelDesc;
use crate::workload::{Precision, TrainWorkload};

/// DeepSpeed `reduce_bucket_size` default (deepspeed/runtime/zero/config.py: 5e8 elements).
pub const DEEPSPEED_REDUCE_BUCKET_ELEMS: u64 = 500_000_000;

/// Engine settings that are not part of the layout (by default the root reshards as the
/// layers do, DDP copies gradients into its buckets, and DDP is DDP proper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DistOptions {
    /// FSDP2: the `reshard_after_forward` passed explicitly to the root module's (embeddings,
    /// final norm, head) `fully_shard`; `None`: the layers' value (accelerate's FSDP2 plugin
    /// passes the same one to every call). Given as `True` the root reshards after forward
    /// whatever the layers do, also under `reshard_after_forward=False` layers (measured:
    /// rdist131-017-mistral, whose backward starts by all-gathering the root again: -4.7% at
    /// the backward peak while the root was kept unsharded); `False`, or the default `None`
    /// of a bare `fully_shard`, keeps it unsharded (`_fsdp_state.py` `_lazy_init`).
    pub fsdp_root_reshard: Option<bool>,
    /// DDP `gradient_as_bucket_view` (PyTorch's default is `False`).
    pub ddp_bucket_view: bool,
    /// DDP run as torch's composable `replicate` (`torch.distributed._composable.replicate`,
    /// FSDP2's machinery with a world-size-1 shard group): the full parameters plus an
    /// unsharded copy per unit, which its post-backward frees when the unit's reduced gradient
    /// appears — `ddp_bucket_view`'s accounting — except that the unit's autograd gradients
    /// live until that post-backward (not copied into a bucket as each is ready), and its
    /// post-backward keeps the reduce input until the next unit's (measured:
    /// rdist101-002-gemma2, -2.6% as a bucket view). Implies `ddp_bucket_view`.
    pub replicate: bool,
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
    simulate(model, w, layout, kernels, opts, false).map(|(e, _)| e)
}

/// The fast evaluator's entry points for a distributed step (re-exported by
/// [`crate::memory::fast`]).
pub(crate) mod fast {
    use super::*;
    use crate::memory::fast::Path;

    /// [`super::simulate_train_dist`], fast: the same result.
    pub fn simulate_train_dist(
        model: &ModelDesc,
        w: &TrainWorkload,
        layout: &Layout,
        kernels: Kernels,
    ) -> Result<DistEstimate, CoreError> {
        simulate_train_dist_with(model, w, layout, kernels, &DistOptions::default())
    }

    /// [`super::simulate_train_dist_with`], fast: the same result.
    pub fn simulate_train_dist_with(
        model: &ModelDesc,
        w: &TrainWorkload,
        layout: &Layout,
        kernels: Kernels,
        opts: &DistOptions,
    ) -> Result<DistEstimate, CoreError> {
        simulate(model, w, layout, kernels, opts, true).map(|(e, _)| e)
    }

    /// [`simulate_train_dist_with`], with how it was computed (the first rank that needed the
    /// full replay names why; [`Path::Formula`] for Megatron-LM).
    pub fn simulate_train_dist_traced(
        model: &ModelDesc,
        w: &TrainWorkload,
        layout: &Layout,
        kernels: Kernels,
        opts: &DistOptions,
    ) -> Result<(DistEstimate, Path), CoreError> {
        simulate(model, w, layout, kernels, opts, true)
    }
}

/// [`fast::simulate_train_dist_traced`] with the ranks remembered in `memo` (the fast
/// evaluator's [`crate::memory::fast::Evaluator`]).
pub(crate) fn simulate_memo(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: &Layout,
    kernels: Kernels,
    opts: &DistOptions,
    memo: &mut RankMemo,
) -> Result<(DistEstimate, Path), CoreError> {
    simulate_in(model, w, layout, kernels, opts, true, Some(memo))
}

/// FSDP2 refuses a unit whose trainable parameters have mixed dtypes (torch 2.15
/// torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py `_init_mp_dtypes`: "FSDP expects
/// uniform original parameter dtype"). ERNIE 4.5 MoE keeps its trainable router weight in fp32
/// under a bf16/fp16 model (transformers 5.23 models/ernie4_5_moe/modeling_ernie4_5_moe.py
/// `_keep_in_fp32_modules_strict = ["gate.weight", "moe_statics"]`), so its bf16/fp16 FSDP2 step
/// never runs (measured: `fully_shard` raises on the first forward). With `amp-*` the model is
/// fp32 throughout and MixedPrecisionPolicy casts every parameter alike.
fn check_fsdp2_uniform_dtype(model: &ModelDesc, precision: Precision) -> Result<(), CoreError> {
    // the ERNIE 4.5 router: fp32 weight, routing weights cast back to the compute dtype
    let fp32_router = model.layers.iter().any(|l| match &l.mlp {
        crate::model::Mlp::Moe(m) => m.router_fp32 && m.router_weights_in_compute_dtype,
        _ => false,
    });
    if !fp32_router {
        return Ok(());
    }
    Err(CoreError::Unsupported {
        field: "precision",
        value: precision.to_string(),
        engine: "PyTorch FSDP2",
        reason: "fully_shard expects one parameter dtype per unit (torch 2.15 \
                 _fsdp_param_group.py `_init_mp_dtypes`), and transformers keeps this model's \
                 trainable router weight in fp32 (`_keep_in_fp32_modules_strict`, \
                 modeling_ernie4_5_moe.py): the step raises before it runs",
        hint: "use --precision amp-bf16 (an fp32 model under FSDP2's MixedPrecisionPolicy) or \
               --strategy ddp",
    })
}

/// FSDP2's MixedPrecisionPolicy casts the parameters to `param_dtype` but leaves the buffers
/// in the model's fp32 (torch 2.15 torch/distributed/fsdp/_fully_shard/_fsdp_api.py
/// `MixedPrecisionPolicy`: parameters only), and no autocast runs. Falcon-H1 multiplies the
/// bf16 `in_proj` output by its fp32 `mup_vector` buffer (transformers 5.23
/// models/falcon_h1/modeling_falcon_h1.py `FalconH1Mixer.forward`: `projected_states *
/// self.mup_vector`), so the scan reads an fp32 `zxbcdt` against bf16 convolution weights and
/// biases without autocast: a form neither the bf16 nor the autocast scan describes (measured on
/// the fake process group: falcon-h1-0.5b-4l on 6 ranks -3.5% at the step peak, -1.5% at the
/// forward peak with checkpointing). Refused until it is modelled.
fn check_fsdp2_fp32_buffers(model: &ModelDesc, precision: Precision) -> Result<(), CoreError> {
    if !model.layers.iter().any(|l| l.muls.ssm_proj) {
        return Ok(());
    }
    Err(CoreError::Unsupported {
        field: "precision",
        value: precision.to_string(),
        engine: "PyTorch FSDP2",
        reason: "MixedPrecisionPolicy casts parameters but not buffers, so Falcon-H1's fp32 \
                 `mup_vector` makes the Mamba-2 scan read an fp32 zxbcdt with 16-bit weights \
                 and no autocast, a form not modelled (measured -3.5%)",
        hint: "use --precision bf16 (a bf16 model under FSDP2) or --strategy ddp (autocast)",
    })
}

/// Every rank of a distributed step, by the reference replay or (`fast`) the fast evaluator.
fn simulate(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: &Layout,
    kernels: Kernels,
    opts: &DistOptions,
    fast: bool,
) -> Result<(DistEstimate, Path), CoreError> {
    simulate_in(model, w, layout, kernels, opts, fast, None)
}

/// [`simulate`], the fast evaluator's ranks remembered in `rank_memo` when given.
fn simulate_in(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: &Layout,
    kernels: Kernels,
    opts: &DistOptions,
    fast: bool,
    mut rank_memo: Option<&mut RankMemo>,
) -> Result<(DistEstimate, Path), CoreError> {
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
    if engine == Engine::Megatron {
        super::check_step_options(model, w, true)?;
    } else {
        // the HF model code each rank runs: refused as on one GPU (LoRA targets memwall cannot
        // place, a hybrid cache without attention layers, …)
        super::check_hf_step(model, w, true)?;
    }
    let kind = match engine {
        Engine::Megatron => {
            return super::megatron::simulate(model, w, layout).map(|e| (e, Path::Formula))
        }
        Engine::Ddp => ShardKind::Ddp {
            bucket_view: opts.ddp_bucket_view || opts.replicate,
            replicate: opts.replicate,
        },
        Engine::Fsdp2 => {
            let reshard_after_forward = layout.strategy != Strategy::FsdpGradOp;
            ShardKind::Fsdp2 {
                reshard_after_forward,
                root_reshard: opts.fsdp_root_reshard.unwrap_or(reshard_after_forward),
            }
        }
        Engine::Zero(stage) => ShardKind::Zero {
            stage: stage.number(),
        },
        // torchtitan is named by the user (`memory/titan`), never resolved from a layout
        Engine::Hf | Engine::Vllm | Engine::Torchtitan => {
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
            check_fsdp2_fp32_buffers(model, w.precision)?;
            rank_w.precision = if w.precision == Precision::AmpBf16 {
                Precision::Bf16
            } else {
                Precision::Fp16
            };
            (4, 4, true)
        }
        (ShardKind::Fsdp2 { .. }, Precision::Bf16 | Precision::Fp16) => {
            check_fsdp2_uniform_dtype(model, w.precision)?;
            (2, 2, false)
        }
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
    let shard_for = |rank: u128| ShardSim {
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
    // the fast evaluator: ranks holding the same chunk of every parameter share one
    // evaluation, keyed by their chunk rows of each distinct dim-0 size
    let mut path = Path::Extrapolated;
    let mut dims: Option<Vec<u128>> = None;
    let mut memo: Vec<(Vec<u128>, RankRun)> = Vec::new();
    let mut run = |rank: u128| -> Result<RankRun, CoreError> {
        if !fast {
            let mut b = Builder::train(model, &rank_w, kernels, Some(shard_for(rank)));
            b.run();
            return rank_run(&b);
        }
        // only FSDP2's chunks depend on the rank (ZeRO partitions and DDP replicas do not)
        let key = |dims: &[u128]| -> Vec<u128> {
            if matches!(kind, ShardKind::Fsdp2 { .. }) {
                dims.iter().map(|&d| chunk_rows(d, world, rank)).collect()
            } else {
                Vec::new()
            }
        };
        if let Some(d) = &dims {
            let k = key(d);
            if let Some((_, r)) = memo.iter().find(|(x, _)| *x == k) {
                return Ok(r.clone());
            }
        }
        let shard = shard_for(rank);
        let (r, p, d) = match rank_memo.as_deref_mut() {
            Some(m) => {
                // lent to the closure while the memo is borrowed (no copy)
                let classes = m.classes.take();
                let r = m.rank(&rank_w, shard, || {
                    fast_rank(model, &rank_w, kernels, shard, classes.as_ref())
                });
                m.classes = classes;
                r?
            }
            None => fast_rank(model, &rank_w, kernels, shard, None)?,
        };
        if path == Path::Extrapolated {
            path = p;
        }
        let d = dims.get_or_insert(d);
        memo.push((key(d), r.clone()));
        Ok(r)
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
                ranks: RankSet::new(shard_group, gpus),
                peak_bytes: rr.peak,
                at_peak: rr.at_peak.clone(),
                phase: rr.phase,
                host_bytes: rr.host,
                model_state_bytes: rr.states,
                phase_peaks: rr.phase_peaks.clone(),
            });
        }
    }
    // shard indices in order: a simulated one takes its run's group; those not simulated
    // (large worlds) take rank 0's numbers, since chunks never grow with the rank
    let mut order: Vec<(u64, usize)> = runs
        .iter()
        .enumerate()
        .map(|(k, (r, _))| (u64::try_from(*r).unwrap_or(u64::MAX), k))
        .collect();
    order.sort_unstable();
    let mut next = 0;
    for (index, k) in order {
        if next < index {
            groups[group_of_run[0]].ranks.push_span(next, index - 1);
        }
        groups[group_of_run[k]].ranks.push_index(index);
        next = index + 1;
    }
    if next < shard_group {
        groups[group_of_run[0]]
            .ranks
            .push_span(next, shard_group - 1);
    }
    for g in &mut groups {
        g.label = g.ranks.label();
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
    let estimate = DistEstimate {
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
    };
    Ok((estimate, if fast { path } else { Path::Whole }))
}

/// The phases of a training step, as the rank groups report their peaks.
const STEP_PHASES: [Phase; 4] = [
    Phase::Forward,
    Phase::Loss,
    Phase::Backward,
    Phase::Optimizer,
];

/// Rows of a `dim0`-row parameter in rank `rank`'s chunk (`torch.chunk` over `world` ranks:
/// `ceil(dim0 / world)` rows each, the tail shorter or empty).
fn chunk_rows(dim0: u128, world: u128, rank: u128) -> u128 {
    let chunk = dim0.div_ceil(world.max(1));
    chunk.min(dim0.saturating_sub(rank * chunk))
}

/// What the reference replay says of one rank.
fn rank_run(b: &Builder<'_>) -> Result<RankRun, CoreError> {
    let host = b.offloaded_bytes();
    let states = b.model_state_bytes();
    let t = &b.t;
    let phase_peaks = STEP_PHASES
        .iter()
        .map(|p| Ok((*p, to_u64(t.phase_peak(*p), "phase peak")?)))
        .collect::<Result<Vec<_>, CoreError>>()?;
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
}

/// One rank by the fast evaluator: its numbers, how they were computed, and the distinct
/// dim-0 sizes of the model's parameters (what decides which ranks hold the same chunks).
fn fast_rank(
    model: &ModelDesc,
    w: &TrainWorkload,
    kernels: Kernels,
    shard: ShardSim,
    classes: Option<&crate::memory::fast::LayerClasses>,
) -> Result<(RankRun, Path, Vec<u128>), CoreError> {
    let mut comm: Vec<CommBuffer> = Vec::new();
    let mut dims: Vec<u128> = Vec::new();
    let ev = crate::memory::fast::evaluate(
        model.layers.len(),
        |i, j| {
            crate::memory::fast::LayerClasses::same(classes, model, i, j)
                && w.checkpoints_layer(i) == w.checkpoints_layer(j)
        },
        |red, rec| {
            let mut b = Builder::train(model, w, kernels, Some(shard));
            b.set_reduced(red);
            b.t.start_segments();
            b.run();
            let host = b.offloaded_bytes();
            let states = b.model_state_bytes();
            b.t.take_segments(&mut rec.segs);
            rec.scalars
                .extend([b.param_count as i128, host as i128, states as i128]);
            let lines = b.comm_buffer_lines();
            rec.scalars
                .extend(lines.iter().map(|l| i128::from(l.bytes)));
            if comm.is_empty() && dims.is_empty() {
                comm = lines;
                dims = b.shard_dim0s();
            }
            Ok(())
        },
    )?;
    let ev = match ev {
        Ok(ev) => ev,
        Err(path) => {
            let mut b = Builder::train(model, w, kernels, Some(shard));
            b.run();
            return Ok((rank_run(&b)?, path, b.shard_dim0s()));
        }
    };
    let t = &ev.peaks;
    let phase_peaks = STEP_PHASES
        .iter()
        .map(|p| Ok((*p, to_u64(t.phase_peaks[*p as usize], "phase peak")?)))
        .collect::<Result<Vec<_>, CoreError>>()?;
    let at_peak = super::breakdown(t.at)?;
    let scalar =
        |i: usize, what| u64::try_from(ev.scalars[i]).map_err(|_| CoreError::Overflow { what });
    for (k, line) in comm.iter_mut().enumerate() {
        // a line's bytes are the same in every reduced replay (largest unit, buckets, or a
        // whole-model sum at its full value), saturated as the reference saturates them
        line.bytes = u64::try_from(ev.scalars[3 + k]).unwrap_or(u64::MAX);
    }
    let run = RankRun {
        peak: to_u64(t.peak, "peak bytes")?,
        at_peak,
        phase: t.phase,
        host: scalar(1, "host bytes")?,
        states: scalar(2, "model states")?,
        phase_peaks,
        params: scalar(0, "parameters")?,
        comm,
    };
    Ok((run, Path::Extrapolated, dims))
}

#[derive(Clone)]
pub(crate) struct RankRun {
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
