//! The fast exact evaluator: the reference replay's results at a cost independent of the
//! number of layers, decode steps and GPUs.
//!
//! The replay ([`super::simulate_train`], [`super::simulate_infer`],
//! [`super::simulate_train_dist_with`]) is the reference. It is deterministic in the layer
//! sequence, and layers repeat: a step's timeline is the same pieces around the same repeated
//! layer segments, each growing by a constant from one repeat to the next. So the evaluator
//!
//! 1. cuts the layers into blocks of a repeated pattern (`blocks.rs`; one comparison per
//!    layer);
//! 2. replays *reduced* models that keep a few repeats of each long block: the base with
//!    three (`blocks::BASE`) and, per long block, the base with one and with two more.
//!    Whole-model sums the replay allocates in one piece (optimizer states and step
//!    temporaries, gradient buckets, shard partitions, parameter counts) take their full-model
//!    value in every reduced replay through the slots' weights, so nothing rounded to the
//!    allocator's blocks is ever extrapolated;
//! 3. records each replay's segments (the `Timeline` cut at every layer boundary, hook point
//!    and phase change, each keeping its highest live bytes and the breakdown there) and
//!    summarises them into candidate instants (`extrapolate.rs`), checking that the interior
//!    repeats step by a constant;
//! 4. checks that every candidate's live bytes and breakdown are affine in each block's repeat
//!    count (zero second difference over the three counts) and extrapolates them exactly, in
//!    integers, to the full counts: the peak is the first highest candidate (the replay's
//!    first instant on ties), a phase's peak its highest.
//!
//! When a check fails the full replay answers ([`Path::Fallback`]); a model with no long block
//! is replayed whole ([`Path::Whole`]). Decode steps cost nothing either way (the replay
//! simulates the first and the last step and carries the caches over the others). Ranks of a
//! distributed step holding the same shard chunks share one evaluation (FSDP2 ranks are keyed
//! by their chunk rows of each distinct dim-0 size; ZeRO and DDP ranks are alike), and rank
//! groups are [`super::RankSet`] patterns, not lists. Megatron-LM's estimate is a
//! formula summed over runs of equal layers ([`Path::Formula`]).
//!
//! The checks cover three repeat counts; that the pattern holds for every larger count is
//! what the property tests (`crates/memwall-cli/tests/fast.rs`, 10⁵ random configurations in
//! release) establish against the replay.

mod blocks;
mod extrapolate;
pub(crate) mod memo;

pub(crate) use super::check_train;
use super::hf::{Builder, Reduced};
use super::timeline::{Phase, Segment};
use super::{
    breakdown, check_infer, run_infer, run_train, to_u64, InferEstimate, Kernels, TrainEstimate,
};
use crate::error::CoreError;
use crate::model::ModelDesc;
use crate::workload::{InferWorkload, TrainWorkload, WeightFormat};
use blocks::{Block, Reduction, BASE};
use extrapolate::{Item, Peaks, Template};
use std::cell::RefCell;

pub use super::dist::fast::{
    simulate_train_dist, simulate_train_dist_traced, simulate_train_dist_with,
};
pub use memo::Evaluator;

/// How an estimate was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Reduced replays extrapolated to the full model.
    Extrapolated,
    /// No block of layers repeats often enough to reduce: the model was replayed whole.
    Whole,
    /// A check of the extrapolation failed, so the full replay answered (the reason).
    Fallback(&'static str),
    /// The engine's estimate is a formula, not a replay (Megatron-LM).
    Formula,
}

/// What one reduced replay hands back.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// Its segments since the steady state's start, in time order.
    pub segs: Vec<Segment>,
    /// End-of-run numbers that are sums over layers (parameter counts, cache bytes, …).
    pub scalars: Vec<i128>,
}

/// What the reduced replays say of the full model.
#[derive(Debug)]
pub(crate) struct Evaluated {
    /// Peak, breakdown, phase and per-phase peaks.
    pub peaks: Peaks,
    /// The records' scalars at the full counts.
    pub scalars: Vec<i128>,
    /// The highest live bytes up to the end of the prefill (forward and prefill phases).
    pub prefill_peak: u128,
}

/// The model's layers numbered by equality, computed once per evaluation context (a
/// [`memo::Evaluator`]), so that finding the repeated blocks compares two integers per layer
/// instead of two [`crate::model::LayerSpec`]s (≈ 235 instructions each; a 4,096-layer model
/// spent 1 M instructions per estimate on them).
#[derive(Debug, Clone, Default)]
pub(crate) struct LayerClasses(Vec<u32>);

impl LayerClasses {
    /// Classes of `model`'s layers: equal layers share a class. Linear in the layers times
    /// the distinct layers (a model has a handful).
    pub(crate) fn new(model: &ModelDesc) -> Self {
        let layers = &model.layers;
        // representatives of the classes so far
        let mut reps: Vec<usize> = Vec::new();
        let mut out: Vec<u32> = Vec::with_capacity(layers.len());
        for (i, l) in layers.iter().enumerate() {
            let class = match (i.checked_sub(1), out.last()) {
                (Some(prev), Some(&c)) if layers[prev] == *l => c,
                _ => match reps.iter().position(|&r| layers[r] == *l) {
                    Some(c) => u32::try_from(c).unwrap_or(u32::MAX),
                    None => {
                        reps.push(i);
                        u32::try_from(reps.len() - 1).unwrap_or(u32::MAX)
                    }
                },
            };
            out.push(class);
        }
        LayerClasses(out)
    }

    /// Whether layers `i` and `j` of `model` are equal: by class when the classes are those
    /// of `model` (same length), else by comparing them.
    #[inline]
    pub(crate) fn same(classes: Option<&Self>, model: &ModelDesc, i: usize, j: usize) -> bool {
        match classes {
            Some(c) if c.0.len() == model.layers.len() => c.0[i] == c.0[j],
            _ => model.layers[i] == model.layers[j],
        }
    }
}

/// Buffers reused from one evaluation to the next on a thread (no allocation once warm).
#[derive(Default)]
struct Scratch {
    blocks: Vec<Block>,
    reduction: Reduction,
    records: Vec<Record>,
    items: Vec<Vec<Item>>,
    templates: Vec<Template>,
    repeats: Vec<usize>,
    steps: Vec<i128>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Evaluates the full model from reduced replays. `same(i, j)`: layers `i` and `j` replay
/// identically; `replay` runs one reduced model into a record (cleared). `Err(path)` when
/// the caller must replay the whole model.
pub(crate) fn evaluate(
    n_layers: usize,
    same: impl Fn(usize, usize) -> bool,
    mut replay: impl FnMut(Reduced<'_>, &mut Record) -> Result<(), CoreError>,
) -> Result<Result<Evaluated, Path>, CoreError> {
    SCRATCH.with(|cell| {
        // a replay never evaluates again, so the scratch is never borrowed twice; should it
        // be, a fresh one serves
        let mut fresh;
        let mut guard = cell.try_borrow_mut();
        let s: &mut Scratch = match guard.as_deref_mut() {
            Ok(s) => s,
            Err(_) => {
                fresh = Scratch::default();
                &mut fresh
            }
        };
        evaluate_in(s, n_layers, same, &mut replay)
    })
}

fn evaluate_in(
    s: &mut Scratch,
    n_layers: usize,
    same: impl Fn(usize, usize) -> bool,
    replay: &mut impl FnMut(Reduced<'_>, &mut Record) -> Result<(), CoreError>,
) -> Result<Result<Evaluated, Path>, CoreError> {
    blocks::blocks(n_layers, same, &mut s.blocks);
    let reduced: usize = s.blocks.iter().filter(|b| b.reduced).count();
    if reduced == 0 {
        return Ok(Err(Path::Whole));
    }
    let n_replays = 1 + 2 * reduced;
    while s.records.len() < n_replays {
        s.records.push(Record::default());
    }
    while s.items.len() < n_replays {
        s.items.push(Vec::new());
    }
    // replay r: 0 = base; 1 + 2k (+1) = the k-th reduced block with one (two) more repeats
    s.steps.clear();
    for r in 0..n_replays {
        s.repeats.clear();
        let mut k = 0;
        for b in &s.blocks {
            if b.reduced {
                let extra = if r > 0 && (r - 1) / 2 == k {
                    1 + (r - 1) % 2
                } else {
                    0
                };
                s.repeats.push(BASE + extra);
                if r == 0 {
                    s.steps.push((b.count - BASE) as i128);
                }
                k += 1;
            } else {
                s.repeats.push(b.count);
            }
        }
        s.reduction.build(&s.blocks, &s.repeats);
        let rec = &mut s.records[r];
        rec.segs.clear();
        rec.scalars.clear();
        replay(
            Reduced {
                layers: &s.reduction.layers,
                weight: &s.reduction.weight,
            },
            rec,
        )?;
        if !extrapolate::summarise(
            &rec.segs,
            &s.reduction.slots,
            &mut s.items[r],
            &mut s.templates,
        ) {
            return Ok(Err(Path::Fallback("interior repeats are not affine")));
        }
    }
    let (base, rest) = s.items.split_at_mut(1);
    let plus: Vec<(&[Item], &[Item])> = rest[..2 * reduced]
        .chunks(2)
        .map(|c| (c[0].as_slice(), c[1].as_slice()))
        .collect();
    let items = &mut base[0];
    if !extrapolate::extrapolate(items, &plus, &s.steps) {
        return Ok(Err(Path::Fallback(
            "candidates are not affine in the repeats",
        )));
    }
    let (base_rec, rest_rec) = s.records.split_at_mut(1);
    let plus_scalars: Vec<(&[i128], &[i128])> = rest_rec[..2 * reduced]
        .chunks(2)
        .map(|c| (c[0].scalars.as_slice(), c[1].scalars.as_slice()))
        .collect();
    let mut scalars = base_rec[0].scalars.clone();
    if !extrapolate::extrapolate_scalars(&mut scalars, &plus_scalars, &s.steps) {
        return Ok(Err(Path::Fallback("totals are not affine in the repeats")));
    }
    let Some(peaks) = extrapolate::peaks(items) else {
        return Ok(Err(Path::Fallback("no candidate instant")));
    };
    let prefill_peak = items
        .iter()
        .filter(|i| i.key.hit && matches!(i.key.phase, Phase::Forward | Phase::Prefill))
        .map(|i| i.v[0])
        .max()
        .unwrap_or(0);
    Ok(Ok(Evaluated {
        peaks,
        scalars,
        prefill_peak: u128::try_from(prefill_peak).unwrap_or(0),
    }))
}

fn scalar(v: i128, what: &'static str) -> Result<u64, CoreError> {
    u64::try_from(v).map_err(|_| CoreError::Overflow { what })
}

/// [`super::simulate_train`], fast: the same result.
pub fn simulate_train(
    model: &ModelDesc,
    w: &TrainWorkload,
    kernels: Kernels,
) -> Result<TrainEstimate, CoreError> {
    simulate_train_traced(model, w, kernels).map(|(e, _)| e)
}

/// [`simulate_train`], with how it was computed.
pub fn simulate_train_traced(
    model: &ModelDesc,
    w: &TrainWorkload,
    kernels: Kernels,
) -> Result<(TrainEstimate, Path), CoreError> {
    let engine = check_train(model, w)?;
    train_checked(model, w, kernels, engine, None)
}

/// [`simulate_train_traced`] of a workload already checked.
pub(crate) fn train_checked(
    model: &ModelDesc,
    w: &TrainWorkload,
    kernels: Kernels,
    engine: crate::engine::Engine,
    classes: Option<&LayerClasses>,
) -> Result<(TrainEstimate, Path), CoreError> {
    let ev = evaluate(
        model.layers.len(),
        |i, j| {
            LayerClasses::same(classes, model, i, j)
                && w.checkpoints_layer(i) == w.checkpoints_layer(j)
        },
        |red, rec| {
            let mut b = Builder::train(model, w, kernels, None);
            b.set_reduced(red);
            b.t.start_segments();
            b.run();
            b.t.take_segments(&mut rec.segs);
            rec.scalars.extend([
                b.param_count as i128,
                b.trainable_count() as i128,
                b.t.host.peak as i128,
            ]);
            Ok(())
        },
    )?;
    let ev = match ev {
        Ok(ev) => ev,
        Err(path) => return Ok((run_train(model, w, kernels, engine)?, path)),
    };
    let at_peak = breakdown(ev.peaks.at)?;
    let phase_peaks = [
        Phase::Forward,
        Phase::Loss,
        Phase::Backward,
        Phase::Optimizer,
    ]
    .iter()
    .map(|p| Ok((*p, to_u64(ev.peaks.phase_peaks[*p as usize], "phase peak")?)))
    .collect::<Result<Vec<_>, CoreError>>()?;
    Ok((
        TrainEstimate {
            engine,
            peak_bytes: to_u64(ev.peaks.peak, "peak bytes")?,
            at_peak,
            phase: ev.peaks.phase,
            phase_peaks,
            params_total: scalar(ev.scalars[0], "parameters")?,
            params_trainable: scalar(ev.scalars[1], "trainable parameters")?,
            host_offload_bytes: scalar(ev.scalars[2], "host offload bytes")?,
        },
        Path::Extrapolated,
    ))
}

/// [`super::simulate_infer`], fast: the same result.
pub fn simulate_infer(
    model: &ModelDesc,
    w: &InferWorkload,
    kernels: Kernels,
) -> Result<InferEstimate, CoreError> {
    simulate_infer_traced(model, w, kernels).map(|(e, _)| e)
}

/// Whether llama.cpp gives layer `i` of `n` more bits in a K-quant preset: the layer's place
/// is part of what it replays (`quant::GgufPreset::tensor_type`).
fn gguf_place(w: &InferWorkload, i: usize, n: usize) -> u8 {
    use crate::quant::{GgufPreset, TensorRole};
    match w.weights {
        WeightFormat::Gguf(p @ (GgufPreset::Q4KM | GgufPreset::Q5KM)) => {
            let t = |role| p.tensor_type(role, i as u128, n as u128, 256, 1, false);
            u8::from(t(TensorRole::AttnV) != t(TensorRole::Attn))
                | (u8::from(t(TensorRole::FfnDown) != t(TensorRole::FfnUpGate)) << 1)
        }
        _ => 0,
    }
}

/// [`simulate_infer`], with how it was computed.
pub fn simulate_infer_traced(
    model: &ModelDesc,
    w: &InferWorkload,
    kernels: Kernels,
) -> Result<(InferEstimate, Path), CoreError> {
    check_infer(model, w)?;
    let n = model.layers.len();
    let ev = evaluate(
        n,
        |i, j| model.layers[i] == model.layers[j] && gguf_place(w, i, n) == gguf_place(w, j, n),
        |red, rec| {
            let mut b = Builder::infer(model, w, kernels);
            b.set_reduced(red);
            b.t.start_segments();
            b.run_inference();
            let kv = b.kv_cache_bytes();
            b.t.take_segments(&mut rec.segs);
            rec.scalars.extend([b.param_count as i128, kv as i128]);
            Ok(())
        },
    )?;
    let ev = match ev {
        Ok(ev) => ev,
        Err(path) => return Ok((run_infer(model, w, kernels)?, path)),
    };
    let at_peak = breakdown(ev.peaks.at)?;
    let weights = at_peak
        .iter()
        .find(|(c, _)| *c == super::Category::Weights)
        .map_or(0, |x| x.1);
    Ok((
        InferEstimate {
            engine: crate::engine::Engine::Hf,
            peak_bytes: to_u64(ev.peaks.peak, "peak bytes")?,
            at_peak,
            phase: ev.peaks.phase,
            params_total: scalar(ev.scalars[0], "parameters")?,
            weights_bytes: weights,
            kv_cache_bytes: scalar(ev.scalars[1], "kv cache bytes")?,
            prefill_peak_bytes: to_u64(ev.prefill_peak, "prefill peak")?,
        },
        Path::Extrapolated,
    ))
}

#[cfg(test)]
mod tests {
    use super::LayerClasses;

    #[test]
    fn layer_classes_number_equal_layers_alike() {
        let mut m = crate::model::tests::llama2_7b();
        let a = m.layers[0];
        let mut b = a;
        b.attn_norm = None;
        let mut c = a;
        c.attn_post_norm = c.attn_norm;
        m.layers = vec![a, a, b, a, c, b, b];
        let classes = LayerClasses::new(&m);
        assert_eq!(classes.0, [0, 0, 1, 0, 2, 1, 1]);
        for i in 0..m.layers.len() {
            for j in 0..m.layers.len() {
                assert_eq!(
                    LayerClasses::same(Some(&classes), &m, i, j),
                    m.layers[i] == m.layers[j],
                    "{i} {j}"
                );
            }
        }
        // classes of another model are not used: its layers are compared
        m.layers.push(a);
        assert!(LayerClasses::same(Some(&classes), &m, 0, 7));
        assert!(!LayerClasses::same(Some(&classes), &m, 2, 7));
    }
}
