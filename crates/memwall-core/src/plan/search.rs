//! `memwall plan`: every layout × checkpointing × precision × optimizer × offload × LoRA ×
//! micro-batch that the request allows, kept when every rank fits, ranked by tokens/s per GPU.
//!
//! Exhaustive over the stated space, with one proven prune: the peak is non-decreasing in the
//! micro-batch (more sequences keep more activations and larger loss buffers alive; the
//! property test `peak_is_monotone_in_micro_batch` holds the simulator to it), so for each
//! combination a binary search over the micro-batches that divide the global batch finds the
//! largest that fits, and every smaller one fits too. The step-time model then ranks the fitting
//! micro-batches of that combination (a smaller micro-batch means more accumulation steps, and
//! with pipeline parallelism more micro-batches in flight).

use super::{keeps_master, memory_in, memory_of_titan, step_time, train_args, Fit};
use crate::error::CoreError;
use crate::gpu::GpuSpec;
use crate::layout::{Layout, Offload, Schedule, Strategy};
use crate::memory::fast::Evaluator;
use crate::memory::titan::Runtime;
use crate::memory::Kernels;
use crate::model::{LinearRole, Mlp, ModelDesc};
use crate::optimizer::Optimizer;
use crate::workload::{Lora, Precision, TrainWorkload};
use serde::Serialize;

/// Changes that alter the training result, considered only when allowed; and offload, which
/// does not alter it but needs host memory and PCIe time, so it is opt-in too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Allow {
    /// LoRA adapters on a frozen base (rank and targets from [`PlanRequest::lora`]).
    pub lora: bool,
    /// QLoRA: LoRA on a 4-bit NF4 base.
    pub qlora: bool,
    /// bitsandbytes 8-bit AdamW instead of 32-bit states.
    pub adamw_8bit: bool,
    /// Offload of optimizer states (and parameters) to host memory.
    pub offload: bool,
    /// Shorter sequences (halved, down to a quarter of the asked length).
    pub shorter_seq: bool,
    /// Pure 16-bit weights without an fp32 master copy on engines that have none (HF, DDP,
    /// FSDP2): it changes the result there; on ZeRO and Megatron `bf16` keeps the master.
    pub pure_bf16: bool,
}

crate::names::named_enum! {
    /// One change `--allow` admits into a plan.
    pub enum AllowItem in "allow" {
        /// LoRA adapters on a frozen base.
        Lora = "lora": "LoRA adapters on a frozen base (changes the result)",
        /// QLoRA.
        Qlora = "qlora": "QLoRA: LoRA on a 4-bit NF4 base (changes the result)",
        /// 8-bit AdamW.
        Adamw8bit = "adamw-8bit": "bitsandbytes 8-bit AdamW states (changes the result)",
        /// Offload to host memory.
        Offload = "offload": "optimizer/parameter offload to host memory (same result, slower)",
        /// Shorter sequences.
        ShorterSeq = "shorter-seq": "sequences of 1/2 and 1/4 the length (changes the result)",
        /// Pure bf16 weights without an fp32 master.
        PureBf16 = "pure-bf16": "bf16 weights and states without an fp32 master copy (changes the result)",
    }
}

impl Allow {
    /// Whether `item` is allowed.
    pub fn contains(&self, item: AllowItem) -> bool {
        match item {
            AllowItem::Lora => self.lora,
            AllowItem::Qlora => self.qlora,
            AllowItem::Adamw8bit => self.adamw_8bit,
            AllowItem::Offload => self.offload,
            AllowItem::ShorterSeq => self.shorter_seq,
            AllowItem::PureBf16 => self.pure_bf16,
        }
    }

    /// The allowances `items` name.
    pub fn from_items(items: &[AllowItem]) -> Self {
        let has = |x: AllowItem| items.contains(&x);
        Allow {
            lora: has(AllowItem::Lora),
            qlora: has(AllowItem::Qlora),
            adamw_8bit: has(AllowItem::Adamw8bit),
            offload: has(AllowItem::Offload),
            shorter_seq: has(AllowItem::ShorterSeq),
            pure_bf16: has(AllowItem::PureBf16),
        }
    }
}

/// What to plan for.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRequest {
    /// GPUs in the cluster.
    pub gpus: u64,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// Tokens per sequence.
    pub seq: u64,
    /// Sequences per optimizer step.
    pub global_batch: u64,
    /// Host memory per node available for offload (None: not checked).
    pub host_memory_per_node: Option<u64>,
    /// What may change the result.
    pub allow: Allow,
    /// The workload's fixed choices (attention, dropout, base optimizer, base precision); its
    /// batch, seq and accumulation are chosen by the search.
    pub base: TrainWorkload,
    /// The adapters `allow.lora` / `allow.qlora` plan with.
    pub lora: Lora,
    /// Plans slower than this are dropped.
    pub max_step_s: Option<f64>,
    /// Plans to return.
    pub top: usize,
    /// Allocator margin (fraction of the peak).
    pub alloc_margin: f64,
    /// Kernel semantics to simulate.
    pub kernels: Kernels,
    /// Whose training code the plans run (`--runtime`): torchtitan plans are FSDP2 layouts
    /// (fsdp-full, fsdp-grad-op, hsdp across nodes) simulated by `memory/titan`, one micro-batch per rank per step.
    pub runtime: crate::memory::titan::Runtime,
}

/// One configuration that fits, with its cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// 1 = fastest.
    pub rank: usize,
    /// Always true for a returned plan (kept for the JSON contract).
    pub fits: bool,
    /// Worst rank's allocator peak.
    pub peak_bytes: u64,
    /// Device memory left after the peak, CUDA context, cuBLAS workspace and allocator margin.
    pub headroom_bytes: i128,
    /// Host bytes per node (offload).
    pub host_bytes_per_node: u64,
    /// Seconds per optimizer step.
    pub step_s: f64,
    /// Tokens per second per GPU.
    pub tokens_per_s_per_gpu: f64,
    /// Model FLOPs utilisation.
    pub mfu: f64,
    /// Seconds per component of the step.
    pub breakdown: crate::time::Breakdown,
    /// The layout (`None`: one GPU, no distributed engine).
    pub layout: Option<Layout>,
    /// Sequences per micro-batch per data-parallel rank.
    pub micro_batch: u64,
    /// Micro-batches per optimizer step.
    pub grad_accum: u64,
    /// Tokens per sequence.
    pub seq: u64,
    /// Activation checkpointing.
    pub checkpointing: bool,
    /// Precision.
    pub precision: Precision,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// LoRA / QLoRA.
    pub lora: Option<Lora>,
    /// What in this plan changes the training result (empty: the same training as asked).
    pub changes_result: Vec<String>,
    /// `memwall train` arguments that reproduce the plan (without `--model`/`--gpu`).
    pub train_args: Vec<String>,
}

impl Plan {
    /// The training step of this plan, on the fixed choices of `base` (attention, dropout,
    /// kernels).
    pub fn workload(&self, base: &TrainWorkload) -> TrainWorkload {
        let mut w = base.clone();
        w.batch = self.micro_batch;
        w.grad_accum = self.grad_accum;
        w.seq = self.seq;
        w.checkpointing = self.checkpointing;
        if !self.checkpointing {
            // the asked policy applies to the plans that checkpoint (as in the search)
            w.step_options.checkpointing_policy = Default::default();
        }
        w.precision = self.precision;
        w.optimizer = self.optimizer;
        w.lora = self.lora.clone();
        w
    }
}

/// How many values each dimension took.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SearchSpace {
    /// Layouts (strategy × TP × PP × schedule × CP × EP × offload).
    pub layouts: usize,
    /// Checkpointing settings.
    pub checkpointing: usize,
    /// Precisions.
    pub precisions: usize,
    /// Optimizers.
    pub optimizers: usize,
    /// LoRA settings.
    pub lora: usize,
    /// Sequence lengths.
    pub seqs: usize,
    /// Micro-batch sizes per data-parallel degree (largest over the layouts).
    pub micro_batches: usize,
    /// Combinations before micro-batch: layouts × checkpointing × precisions × optimizers ×
    /// LoRA × sequence lengths (minus the ones an engine refuses).
    pub combinations: u64,
}

/// The result of a search.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanResult {
    /// Fitting plans, fastest first, at most `top`.
    pub plans: Vec<Plan>,
    /// Fitting configurations found (before `top`).
    pub fitting: u64,
    /// Configurations whose memory was simulated or whose time was estimated.
    pub candidates_evaluated: u64,
    /// The space searched.
    pub search_space: SearchSpace,
}

fn divisors(n: u64) -> Vec<u64> {
    let mut d: Vec<u64> = (1..=n.min(1 << 20))
        .take_while(|i| i * i <= n)
        .filter(|i| n.is_multiple_of(*i))
        .flat_map(|i| [i, n / i])
        .collect();
    d.sort_unstable();
    d.dedup();
    d
}

fn powers_of_two_up_to(n: u64) -> impl Iterator<Item = u64> {
    (0..20).map(|e| 1u64 << e).take_while(move |v| *v <= n)
}

/// The layouts the search tries: data parallelism alone over every strategy, and Megatron
/// layouts (TP within a node with sequence parallelism, PP over divisors of the layer count,
/// CP for long sequences, EP over the experts) with Megatron's DDP or distributed optimizer.
fn layouts(model: &ModelDesc, r: &PlanRequest) -> Vec<Option<Layout>> {
    let mut out: Vec<Option<Layout>> = Vec::new();
    let offloads: &[Offload] = if r.allow.offload {
        &[Offload::None, Offload::Optimizer, Offload::Both]
    } else {
        &[Offload::None]
    };
    let base = Layout {
        gpus: r.gpus,
        gpus_per_node: r.gpus_per_node.min(r.gpus),
        ..Layout::single()
    };
    if r.runtime == Runtime::Torchtitan {
        // torchtitan shards with FSDP2 on one GPU too (`apply_fsdp_to_decoder` always runs);
        // its tensor parallelism (with sequence parallelism, its default) within a node, in
        // the degrees `memory/titan` simulates (dividing the heads, key/value heads and the
        // feed-forward width); the layout's own checks without Megatron-LM's TP rules
        let shapes = crate::memory::titan::shapes(model).ok();
        let mut out: Vec<Option<Layout>> = Vec::new();
        for tp in [1u64, 2, 4, 8] {
            let even = shapes.is_some_and(|s| {
                s.heads.is_multiple_of(tp)
                    && s.kv_heads.is_multiple_of(tp)
                    && s.ffn.is_multiple_of(tp)
            });
            if tp > 1 && (!even || tp > base.gpus_per_node || !r.gpus.is_multiple_of(tp)) {
                continue;
            }
            for strategy in [Strategy::FsdpFull, Strategy::FsdpGradOp] {
                let l = Layout {
                    strategy,
                    tp,
                    sequence_parallel: tp > 1,
                    ..base.clone()
                };
                let mut dp_only = l.clone();
                dp_only.tp = 1;
                dp_only.sequence_parallel = false;
                if dp_only.validate().is_ok() {
                    out.push(Some(l));
                }
            }
        }
        // its HSDP as measured (`memory/titan` `check_hsdp`): replicas across nodes of FSDP2
        // within a node, without TP or PP
        if r.gpus > base.gpus_per_node && r.gpus.is_multiple_of(base.gpus_per_node) {
            out.push(Some(Layout {
                strategy: Strategy::Hsdp,
                ..base.clone()
            }));
        }
        // its pipeline parallelism as measured (`memory/titan/pipeline.rs`): FSDP2 over
        // dp_shard ≥ 2 ranks per stage, 1F1B, GPipe or Interleaved1F1B with its two
        // stages per rank, stage splits torchtitan accepts
        // (with its TP + SP as well: `titan-pptp-*`, dp_shard ≥ 2 ranks, tp within a node)
        let layers = model.layers.len() as u64;
        for (pp, tp) in [2u64, 4, 8]
            .into_iter()
            .flat_map(|pp| [1u64, 2, 4, 8].map(move |tp| (pp, tp)))
        {
            let even = shapes.is_some_and(|s| {
                s.heads.is_multiple_of(tp)
                    && s.kv_heads.is_multiple_of(tp)
                    && s.ffn.is_multiple_of(tp)
                    && s.moe.is_none()
            });
            if tp > 1 && (!even || tp > base.gpus_per_node || !r.seq.is_multiple_of(tp)) {
                continue;
            }
            if !r.gpus.is_multiple_of(pp * tp) || r.gpus / (pp * tp) < 2 {
                continue;
            }
            for (schedule, virtual_stages) in [
                (Schedule::OneFOneB, 1u64),
                (Schedule::Gpipe, 1),
                (Schedule::Interleaved, 2),
            ] {
                if crate::memory::titan::split(pp * virtual_stages, layers).is_err() {
                    continue;
                }
                let l = Layout {
                    strategy: Strategy::FsdpFull,
                    pp,
                    tp,
                    sequence_parallel: tp > 1,
                    schedule,
                    virtual_stages,
                    ..base.clone()
                };
                let mut dp_only = l.clone();
                dp_only.gpus = l.gpus / pp;
                dp_only.gpus_per_node = dp_only.gpus_per_node.min(dp_only.gpus);
                dp_only.tp = 1;
                dp_only.sequence_parallel = false;
                dp_only.pp = 1;
                dp_only.schedule = Schedule::OneFOneB;
                dp_only.virtual_stages = 1;
                if dp_only.validate().is_ok() {
                    out.push(Some(l));
                }
            }
        }
        return out;
    }
    if r.gpus == 1 {
        out.push(None);
        if r.allow.offload {
            // DeepSpeed ZeRO-Offload on one GPU (ZeRO-2 with the optimizer on the CPU)
            for (strategy, offload) in [
                (Strategy::Zero2, Offload::Optimizer),
                (Strategy::Zero3, Offload::Both),
            ] {
                out.push(Some(Layout {
                    strategy,
                    offload,
                    ..base.clone()
                }));
            }
        }
        return out;
    }
    let mut strategies = vec![
        Strategy::Ddp,
        Strategy::Zero1,
        Strategy::Zero2,
        Strategy::Zero3,
        Strategy::FsdpFull,
        Strategy::FsdpGradOp,
    ];
    if r.gpus > r.gpus_per_node && r.gpus.is_multiple_of(r.gpus_per_node) {
        strategies.push(Strategy::Hsdp);
    }
    for &strategy in &strategies {
        for &offload in offloads {
            out.push(Some(Layout {
                strategy,
                offload,
                ..base.clone()
            }));
        }
    }
    let layers = model.layers.len() as u64;
    let experts = model
        .layers
        .iter()
        .filter_map(|l| match &l.mlp {
            Mlp::Moe(m) => Some(m.num_experts),
            Mlp::Dense(_) | Mlp::None => None,
        })
        .max();
    let tps: Vec<u64> = powers_of_two_up_to(r.gpus_per_node.min(r.gpus).min(8)).collect();
    let pps: Vec<u64> = divisors(layers).into_iter().filter(|p| *p <= 16).collect();
    let cps: Vec<u64> = powers_of_two_up_to(if r.seq >= 16384 { 8 } else { 1 }).collect();
    let eps: Vec<u64> = match experts {
        Some(e) => divisors(e).into_iter().filter(|x| *x <= 64).collect(),
        None => vec![1],
    };
    for &tp in &tps {
        for &pp in &pps {
            for &cp in &cps {
                let mp = tp * pp * cp;
                if mp == 1 || !r.gpus.is_multiple_of(mp) {
                    continue;
                }
                for &ep in &eps {
                    let mut schedules = vec![(Schedule::OneFOneB, 1)];
                    if pp > 1 && (layers / pp).is_multiple_of(2) {
                        schedules.push((Schedule::Interleaved, 2));
                    }
                    for (schedule, virtual_stages) in schedules {
                        for strategy in [Strategy::Ddp, Strategy::Zero1] {
                            out.push(Some(Layout {
                                strategy,
                                tp,
                                sequence_parallel: tp > 1,
                                pp,
                                schedule,
                                virtual_stages,
                                cp,
                                ep,
                                ..base.clone()
                            }));
                        }
                    }
                }
            }
        }
    }
    out.retain(|l| l.as_ref().is_none_or(|l| l.validate().is_ok()));
    out
}

/// The LoRA settings the search tries.
fn lora_options(r: &PlanRequest) -> Vec<Option<Lora>> {
    let mut v = vec![None];
    if r.allow.lora {
        v.push(Some(Lora {
            qlora: false,
            ..r.lora.clone()
        }));
    }
    if r.allow.qlora {
        v.push(Some(Lora {
            qlora: true,
            ..r.lora.clone()
        }));
    }
    v
}

/// The default adapters a plan uses when LoRA is allowed: rank 16 on the attention
/// projections, as PEFT's examples and most recipes do.
pub fn default_lora(model: &ModelDesc) -> Lora {
    let mut targets: Vec<String> = Vec::new();
    for (role, name) in &model.linear_names {
        if matches!(
            role,
            LinearRole::Q | LinearRole::K | LinearRole::V | LinearRole::O | LinearRole::Qkv
        ) && !targets.contains(name)
        {
            targets.push(name.clone());
        }
    }
    if targets.is_empty() {
        targets = model
            .linear_names
            .first()
            .map(|(_, n)| vec![n.clone()])
            .unwrap_or_default();
    }
    Lora {
        rank: 16,
        targets,
        qlora: false,
    }
}

struct Combo {
    layout: Option<Layout>,
    w: TrainWorkload,
    changes: Vec<String>,
}

/// Searches the space `r` describes and returns the fastest fitting plans.
pub fn search(model: &ModelDesc, gpu: &GpuSpec, r: &PlanRequest) -> Result<PlanResult, CoreError> {
    search_with_progress(model, gpu, r, &mut |_, _| {})
}

/// [`search`], calling `progress(done, total)` after each layout (a front end draws a progress
/// bar from it; the core does no I/O).
pub fn search_with_progress(
    model: &ModelDesc,
    gpu: &GpuSpec,
    r: &PlanRequest,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<PlanResult, CoreError> {
    search_on(model, gpu, r, progress, 2)
}

/// [`search_with_progress`] on up to `max_threads` threads (1 or 2; the result is the same).
fn search_on(
    model: &ModelDesc,
    gpu: &GpuSpec,
    r: &PlanRequest,
    progress: &mut dyn FnMut(usize, usize),
    max_threads: usize,
) -> Result<PlanResult, CoreError> {
    if r.gpus == 0 || r.gpus > crate::layout::MAX_GPUS {
        return Err(CoreError::invalid(
            "gpus",
            format!("{} is outside 1..={}", r.gpus, crate::layout::MAX_GPUS),
        ));
    }
    if r.global_batch == 0 {
        return Err(CoreError::invalid("global_batch", "0 sequences per step"));
    }
    if r.top == 0 {
        return Err(CoreError::invalid("top", "asks for no plans"));
    }
    super::check_alloc_margin(r.alloc_margin)?;
    let layouts = layouts(model, r);
    let precisions: Vec<Precision> = {
        // the asked precision, and pure bf16 (halves weights, gradients and states; on
        // engines without an fp32 master it is labelled as changing the result)
        let mut p = vec![r.base.precision];
        if matches!(r.base.precision, Precision::AmpBf16 | Precision::Fp32) {
            p.push(Precision::Bf16);
        }
        p
    };
    let optimizers: Vec<Optimizer> = {
        let mut o = vec![r.base.optimizer];
        if matches!(r.base.optimizer, Optimizer::Adamw | Optimizer::AdamwForloop) {
            o.push(Optimizer::AdamwFused);
        }
        if r.allow.adamw_8bit && r.base.optimizer != Optimizer::Adamw8bit {
            o.push(Optimizer::Adamw8bit);
        }
        o
    };
    let loras = lora_options(r);
    let seqs: Vec<u64> = if r.allow.shorter_seq {
        [r.seq, r.seq / 2, r.seq / 4]
            .into_iter()
            .filter(|s| *s >= 128)
            .collect()
    } else {
        vec![r.seq]
    };
    let mut space = SearchSpace {
        layouts: layouts.len(),
        checkpointing: 2,
        precisions: precisions.len(),
        optimizers: optimizers.len(),
        lora: loras.len(),
        seqs: seqs.len(),
        ..SearchSpace::default()
    };
    let titan = r.runtime == Runtime::Torchtitan;
    let total = layouts.len();
    // the candidates of one layout, into `found` (fitting plans, in the search's order)
    let search_layout = |layout: &Option<Layout>,
                         ev: &mut Evaluator<'_>,
                         evaluated: &mut u64,
                         (micro_batches, combinations): (&mut usize, &mut u64),
                         found: &mut Vec<Plan>| {
        let dp = layout.as_ref().map_or(1, Layout::dp);
        if !r.global_batch.is_multiple_of(dp) {
            return;
        }
        let per_rank = r.global_batch / dp;
        let pp = layout.as_ref().map_or(1, |l| l.pp);
        let mbs = if titan && pp > 1 {
            // torchtitan's pipeline microbatches (`pipeline_parallel_microbatch_size`): at
            // least as many per step as pipeline ranks (torch's schedules refuse fewer)
            divisors(per_rank)
                .into_iter()
                .filter(|mb| per_rank / mb >= pp)
                .collect()
        } else if titan {
            vec![per_rank]
        } else {
            divisors(per_rank)
        };
        if mbs.is_empty() {
            return;
        }
        *micro_batches = (*micro_batches).max(mbs.len());
        for &seq in &seqs {
            for checkpointing in [false, true] {
                for &precision in &precisions {
                    for &optimizer in &optimizers {
                        for lora in &loras {
                            let mut w = r.base.clone();
                            w.seq = seq;
                            w.checkpointing = checkpointing;
                            if !checkpointing {
                                // the asked policy applies to the plans that checkpoint
                                w.step_options.checkpointing_policy = Default::default();
                            }
                            w.precision = precision;
                            w.optimizer = optimizer;
                            w.lora = lora.clone();
                            if precision == Precision::Bf16
                                && r.base.precision != Precision::Bf16
                                && !keeps_master(layout.as_ref())
                                && !r.allow.pure_bf16
                            {
                                continue;
                            }
                            let engine = if titan {
                                crate::engine::Engine::Torchtitan
                            } else {
                                crate::engine::Engine::resolve(layout.as_ref())
                            };
                            // torchtitan's gradient accumulation is not simulated: its plans
                            // run the whole per-rank batch as one micro-batch
                            // (under PP its microbatches are the pipeline's, `grad_accum`
                            // as for Megatron-LM: checked by `memory/titan`)
                            (w.batch, w.grad_accum) = if titan && pp == 1 {
                                (per_rank, 1)
                            } else {
                                (1, per_rank)
                            };
                            let mut probe = w.clone();
                            if titan {
                                probe.grad_accum = 1;
                            }
                            if engine.check(&probe, layout.as_ref()).is_err() {
                                continue;
                            }
                            *combinations += 1;
                            let combo = Combo {
                                layout: layout.clone(),
                                changes: changes(r, &w, layout.as_ref(), seq),
                                w,
                            };
                            best_micro_batch(model, gpu, r, &combo, &mbs, (ev, evaluated), found);
                        }
                    }
                }
            }
        }
    };
    // The layouts are independent: they are searched on up to two threads (the plan search's
    // machine, CI's and the issue's, has two cores), each thread with its own evaluation
    // context (an exact memo: the answers do not depend on what it remembers). Each layout's
    // plans are kept apart and joined in layout order, so the result is the one-thread
    // search's, byte for byte. Where threads cannot be started (WebAssembly) the calling
    // thread searches alone.
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(max_threads));
    let (next, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    // layouts taken one at a time from a shared counter (the threads balance themselves: one
    // layout can cost many others), each thread with one context, each layout's plans into
    // its own slot of `out`; the calling thread reports progress (layouts done by both)
    let share = |out: &mut [Vec<Plan>], report: &mut dyn FnMut(usize, usize)| {
        let mut ev = Evaluator::new(model, r.kernels);
        let mut tally = (0u64, 0usize, 0u64);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(layout) = layouts.get(i) else { break };
            report(done.load(Ordering::Relaxed), total);
            let (e, m, c) = &mut tally;
            search_layout(layout, &mut ev, e, (m, c), &mut out[i]);
            done.fetch_add(1, Ordering::Relaxed);
        }
        tally
    };
    let mut per_layout: Vec<Vec<Plan>> = vec![Vec::new(); total];
    let mut other: Vec<Vec<Plan>> = vec![Vec::new(); total];
    let tallies = std::thread::scope(|scope| {
        let helper = (threads > 1)
            .then(|| {
                std::thread::Builder::new()
                    .spawn_scoped(scope, || share(&mut other, &mut |_, _| {}))
                    .ok()
            })
            .flatten();
        let mine = share(&mut per_layout, progress);
        match helper.map(|h| h.join()) {
            Some(Ok(theirs)) => vec![mine, theirs],
            Some(Err(p)) => std::panic::resume_unwind(p),
            None => vec![mine],
        }
    });
    let mut evaluated = 0u64;
    for (e, m, c) in tallies {
        evaluated += e;
        space.micro_batches = space.micro_batches.max(m);
        space.combinations += c;
    }
    for (i, plans) in other.into_iter().enumerate() {
        if !plans.is_empty() {
            per_layout[i] = plans;
        }
    }
    let mut found: Vec<Plan> = per_layout.into_iter().flatten().collect();
    progress(total, total);
    let fitting = found.len() as u64;
    found.sort_by(|a, b| {
        b.tokens_per_s_per_gpu
            .total_cmp(&a.tokens_per_s_per_gpu)
            .then(a.peak_bytes.cmp(&b.peak_bytes))
    });
    // engines that run one AdamW whatever its torch flavour (DeepSpeed's fused Adam, Megatron's)
    // give identical plans for adamw and adamw-fused: keep the first of each such twin
    found.dedup_by(|b, a| {
        a.layout == b.layout
            && a.micro_batch == b.micro_batch
            && a.checkpointing == b.checkpointing
            && a.precision == b.precision
            && a.lora == b.lora
            && a.seq == b.seq
            && a.peak_bytes == b.peak_bytes
            && a.step_s == b.step_s
    });
    found.truncate(r.top);
    for (i, p) in found.iter_mut().enumerate() {
        p.rank = i + 1;
    }
    Ok(PlanResult {
        plans: found,
        fitting,
        candidates_evaluated: evaluated,
        search_space: space,
    })
}

fn changes(r: &PlanRequest, w: &TrainWorkload, layout: Option<&Layout>, seq: u64) -> Vec<String> {
    let mut c = Vec::new();
    if let Some(l) = &w.lora {
        c.push(if l.qlora {
            format!(
                "QLoRA r={} on a 4-bit NF4 base (only the adapters train)",
                l.rank
            )
        } else {
            format!("LoRA r={} (only the adapters train)", l.rank)
        });
    }
    if w.optimizer == Optimizer::Adamw8bit && r.base.optimizer != Optimizer::Adamw8bit {
        c.push("8-bit AdamW states (bitsandbytes)".to_owned());
    }
    if seq < r.seq {
        c.push(format!("sequence {seq} instead of {}", r.seq));
    }
    if w.precision == Precision::Bf16
        && r.base.precision != Precision::Bf16
        && !keeps_master(layout)
    {
        c.push("bf16 weights and optimizer states without an fp32 master copy".to_owned());
    }
    c
}

/// Finds the largest fitting micro-batch by binary search (the peak is monotone in it), then
/// keeps the fastest of the fitting ones.
fn best_micro_batch(
    model: &ModelDesc,
    gpu: &GpuSpec,
    r: &PlanRequest,
    c: &Combo,
    mbs: &[u64],
    (ev, evaluated): (&mut Evaluator<'_>, &mut u64),
    found: &mut Vec<Plan>,
) {
    // the per-rank batch of the combination (micro-batch × accumulation steps)
    let per_rank = c.w.batch.saturating_mul(c.w.grad_accum).max(1);
    let eval_mem = |mb: u64, evaluated: &mut u64, ev: &mut Evaluator<'_>| {
        *evaluated += 1;
        let mut w = c.w.clone();
        w.batch = mb;
        w.grad_accum = per_rank / mb;
        let m = match (r.runtime, c.layout.as_ref()) {
            (Runtime::Torchtitan, Some(l)) => memory_of_titan(model, &w, l).ok()?,
            _ => memory_in(ev, &w, c.layout.as_ref()).ok()?,
        };
        let fit = Fit::new(gpu, m.peak_bytes, r.alloc_margin);
        let host_ok = r
            .host_memory_per_node
            .is_none_or(|h| m.host_bytes_per_node <= h);
        (fit.fits && host_ok).then_some((w, m, fit))
    };
    // largest index whose micro-batch fits
    let (mut lo, mut hi) = (0usize, mbs.len());
    let mut best: Option<usize> = None;
    let mut fitting_at: Vec<Option<(TrainWorkload, super::Memory, Fit)>> = vec![None; mbs.len()];
    while lo < hi {
        let mid = (lo + hi) / 2;
        match eval_mem(mbs[mid], evaluated, ev) {
            Some(v) => {
                fitting_at[mid] = Some(v);
                best = Some(mid);
                lo = mid + 1;
            }
            None => hi = mid,
        }
    }
    let Some(best) = best else { return };
    let mut fastest: Option<Plan> = None;
    for i in 0..=best {
        *evaluated += 1;
        let mut w = c.w.clone();
        w.batch = mbs[i];
        w.grad_accum = per_rank / mbs[i];
        let Ok(t) = step_time(model, &w, c.layout.as_ref(), gpu) else {
            continue;
        };
        if r.max_step_s.is_some_and(|m| t.step_s > m) {
            continue;
        }
        if fastest
            .as_ref()
            .is_some_and(|f| f.tokens_per_s_per_gpu >= t.tokens_per_s_per_gpu)
        {
            continue;
        }
        // memory of this micro-batch: simulated during the search, or simulated now (it fits:
        // it is at most the largest fitting one)
        let mem = match fitting_at[i].take() {
            Some(v) => Some(v),
            None => eval_mem(mbs[i], evaluated, ev),
        };
        let Some((w, m, fit)) = mem else { continue };
        fastest = Some(Plan {
            rank: 0,
            fits: true,
            peak_bytes: m.peak_bytes,
            headroom_bytes: fit.headroom_bytes,
            host_bytes_per_node: m.host_bytes_per_node,
            step_s: t.step_s,
            tokens_per_s_per_gpu: t.tokens_per_s_per_gpu,
            mfu: t.mfu,
            breakdown: t.breakdown,
            layout: c.layout.clone(),
            micro_batch: w.batch,
            grad_accum: w.grad_accum,
            seq: w.seq,
            checkpointing: w.checkpointing,
            precision: w.precision,
            optimizer: w.optimizer,
            lora: w.lora.clone(),
            changes_result: c.changes.clone(),
            train_args: {
                let mut a = train_args(&w, c.layout.as_ref());
                if r.runtime != Runtime::Hf {
                    a.push("--runtime".to_owned());
                    a.push(r.runtime.name().to_owned());
                }
                a
            },
        });
    }
    if let Some(p) = fastest {
        found.push(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::test_model as llama2_7b;

    fn request(gpus: u64, global_batch: u64) -> PlanRequest {
        let model = llama2_7b();
        PlanRequest {
            gpus,
            gpus_per_node: 8,
            seq: 2048,
            global_batch,
            host_memory_per_node: None,
            allow: Allow::default(),
            base: {
                let mut w = TrainWorkload::new(1, 2048);
                w.precision = Precision::AmpBf16;
                w
            },
            lora: default_lora(&model),
            max_step_s: None,
            top: 5,
            alloc_margin: super::super::DEFAULT_ALLOC_MARGIN,
            kernels: Kernels::Cuda,
            runtime: Runtime::Hf,
        }
    }

    #[test]
    fn two_threads_find_what_one_finds() {
        let gpu = crate::advice::tests::gpu("a100-80gb", 80, "ampere");
        let mut lora_offload = request(16, 64);
        lora_offload.allow = Allow {
            lora: true,
            offload: true,
            adamw_8bit: true,
            shorter_seq: true,
            ..Allow::default()
        };
        lora_offload.top = 1000;
        let mut fitting = 0;
        for r in [request(8, 32), request(1, 4), lora_offload] {
            let mut seen = Vec::new();
            let one = search_on(&llama2_7b(), &gpu, &r, &mut |d, t| seen.push((d, t)), 1);
            let mut seen2 = Vec::new();
            let two = search_on(&llama2_7b(), &gpu, &r, &mut |d, t| seen2.push((d, t)), 2);
            assert_eq!(one, two, "{} GPUs", r.gpus);
            let one = one.unwrap();
            assert!(one.search_space.layouts > 0 && one.candidates_evaluated > 0);
            fitting += one.fitting;
            // progress ends at the total on both, never going back
            assert_eq!(seen.last(), seen2.last());
            assert!(seen2.windows(2).all(|w| w[0].0 <= w[1].0), "{seen2:?}");
        }
        assert!(fitting > 100, "{fitting}");
    }

    #[test]
    fn divisors_are_sorted_and_complete() {
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(49), vec![1, 7, 49]);
    }

    #[test]
    fn seven_b_on_eight_80gb_gpus_has_fitting_plans_sorted_by_speed() {
        let gpu = crate::advice::tests::gpu("a100-80gb", 80, "ampere");
        let r = request(8, 32);
        let res = search(&llama2_7b(), &gpu, &r).unwrap();
        assert!(!res.plans.is_empty());
        for w in res.plans.windows(2) {
            assert!(w[0].tokens_per_s_per_gpu >= w[1].tokens_per_s_per_gpu);
        }
        for p in &res.plans {
            assert!(p.fits && p.headroom_bytes >= 0);
            assert_eq!(
                p.micro_batch * p.grad_accum * p.layout.as_ref().map_or(1, Layout::dp),
                32
            );
            assert!(p.changes_result.is_empty(), "{:?}", p.changes_result);
        }
        assert!(res.candidates_evaluated > 0);
    }

    #[test]
    fn nothing_fits_a_tiny_gpu_without_allowances() {
        let gpu = crate::advice::tests::gpu("tiny", 8, "ampere");
        let r = request(1, 4);
        let res = search(&llama2_7b(), &gpu, &r).unwrap();
        assert!(res.plans.is_empty());
        let mut r = r;
        r.allow.qlora = true;
        let res = search(&llama2_7b(), &gpu, &r).unwrap();
        assert!(!res.plans.is_empty());
        assert!(res.plans.iter().all(|p| !p.changes_result.is_empty()));
    }

    #[test]
    fn every_plan_reproduces_with_its_train_args_knobs() {
        let gpu = crate::advice::tests::gpu("h100", 80, "hopper");
        let res = search(&llama2_7b(), &gpu, &request(16, 64)).unwrap();
        for p in &res.plans {
            let a = p.train_args.join(" ");
            assert!(a.contains(&format!("--batch {}", p.micro_batch)), "{a}");
            if p.checkpointing {
                assert!(a.contains("--checkpointing"));
            }
        }
    }
}

#[cfg(test)]
mod monotone {
    use super::{Kernels, Layout, Optimizer, Precision, TrainWorkload};
    use crate::layout::Strategy as S;
    use crate::plan::test_model;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The prune `best_micro_batch` relies on: the worst rank's peak never falls when the
        /// micro-batch grows, on one GPU and sharded.
        #[test]
        fn peak_is_monotone_in_micro_batch(
            b in 1u64..8,
            extra in 1u64..8,
            seq in 64u64..3000,
            ckpt in any::<bool>(),
            p in 0usize..4,
            o in 0usize..4,
            a in 0usize..3,
            l in 0usize..5,
        ) {
            let model = test_model();
            let mut w = TrainWorkload::new(b, seq);
            w.checkpointing = ckpt;
            w.precision = [Precision::Bf16, Precision::AmpBf16, Precision::Fp32, Precision::Fp16][p];
            w.optimizer = [Optimizer::Adamw, Optimizer::AdamwFused, Optimizer::Sgd, Optimizer::Lion][o];
            w.attention = [crate::workload::AttentionImpl::Sdpa, crate::workload::AttentionImpl::Eager, crate::workload::AttentionImpl::Flash][a];
            let layout = [
                None,
                Some(S::Ddp),
                Some(S::Zero2),
                Some(S::Zero3),
                Some(S::FsdpFull),
            ][l]
            .map(|strategy| Layout { gpus: 4, gpus_per_node: 4, strategy, ..Layout::single() });
            let small = crate::plan::memory_of(&model, &w, layout.as_ref(), Kernels::Cuda);
            w.batch = b + extra;
            let large = crate::plan::memory_of(&model, &w, layout.as_ref(), Kernels::Cuda);
            if let (Ok(s), Ok(lg)) = (small, large) {
                prop_assert!(s.peak_bytes <= lg.peak_bytes, "{} > {}", s.peak_bytes, lg.peak_bytes);
            }
        }
    }
}
