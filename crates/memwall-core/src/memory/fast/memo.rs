//! An evaluation context over one model that remembers what it simulated: the planner's
//! candidates often give a rank the same memory workload (the micro-batch, precision and
//! sharding are what change; the data-parallel degree only changes the gradient
//! accumulation), and an exact memo answers those without replaying.
//!
//! The key is everything the memory simulation of a rank reads besides the model, which the
//! context borrows for its whole life (so it cannot change under it), and the kernels, fixed
//! at construction:
//! - the rank's workload, with `grad_accum` replaced by the micro-batches the step replays
//!   (`hf::micro_batches_replayed`, the only way the simulation reads it: one, or two with
//!   accumulation);
//! - on a data-parallel rank, its whole sharding state ([`ShardSim`]: engine, shard world,
//!   rank, dtypes, offload, buckets).
//!
//! Everything else of an estimate (the checks, which refuse by name before anything is
//! simulated; the rank groups; the global batch) is computed for each call as without the
//! memo. Property tests (`crates/memwall-cli/tests/fast.rs`) hold the memo's answers equal to
//! the replay's, hits included.

use super::Path;
use crate::error::CoreError;
use crate::layout::Layout;
use crate::memory::dist::DistOptions;
use crate::memory::dist_types::ShardSim;
use crate::memory::hf::micro_batches_replayed;
use crate::memory::{DistEstimate, Kernels, TrainEstimate};
use crate::model::ModelDesc;
use crate::workload::TrainWorkload;

/// Entries kept per memo before it starts afresh (a plan search of a large cluster evaluates a
/// few thousand candidates; the memo is scanned linearly, and a key's first fields, batch and
/// sequence, tell most entries apart at once).
const MAX_ENTRIES: usize = 2048;

/// What the memo stores of one rank: its numbers, how they were computed, and the distinct
/// dim-0 sizes of the model's parameters.
pub(crate) type RankValue = (crate::memory::dist::RankRun, Path, Vec<u128>);

/// Remembered ranks of distributed steps.
#[derive(Default)]
pub(crate) struct RankMemo {
    /// The model's layer classes (the context's model; empty outside a context).
    pub classes: Option<super::LayerClasses>,
    entries: Vec<(TrainWorkload, ShardSim, RankValue)>,
    /// Answers given from the memo.
    pub hits: u64,
    /// Answers simulated.
    pub misses: u64,
}

/// `w` as the memory simulation reads it.
fn key(w: &TrainWorkload) -> TrainWorkload {
    let mut k = w.clone();
    k.grad_accum = micro_batches_replayed(w);
    k
}

impl RankMemo {
    /// The rank of workload `w` with sharding `shard`, from the memo or from `run`.
    pub(crate) fn rank(
        &mut self,
        w: &TrainWorkload,
        shard: ShardSim,
        run: impl FnOnce() -> Result<RankValue, CoreError>,
    ) -> Result<RankValue, CoreError> {
        let k = key(w);
        if let Some((_, _, v)) = self
            .entries
            .iter()
            .find(|(kw, ks, _)| *kw == k && *ks == shard)
        {
            self.hits += 1;
            return Ok(v.clone());
        }
        self.misses += 1;
        let v = run()?;
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.clear();
        }
        self.entries.push((k, shard, v.clone()));
        Ok(v)
    }
}

/// The fast evaluator over one model, remembering the estimates it made (see the module
/// documentation for the key). Its answers are those of [`super::simulate_train`] and
/// [`super::simulate_train_dist_with`], byte for byte.
pub struct Evaluator<'m> {
    model: &'m ModelDesc,
    kernels: Kernels,
    single: Vec<(TrainWorkload, (TrainEstimate, Path))>,
    ranks: RankMemo,
    single_hits: u64,
    single_misses: u64,
}

impl<'m> Evaluator<'m> {
    /// A context over `model` with `kernels`.
    pub fn new(model: &'m ModelDesc, kernels: Kernels) -> Self {
        Evaluator {
            model,
            kernels,
            single: Vec::new(),
            ranks: RankMemo {
                classes: Some(super::LayerClasses::new(model)),
                ..RankMemo::default()
            },
            single_hits: 0,
            single_misses: 0,
        }
    }

    /// The model it evaluates.
    pub fn model(&self) -> &'m ModelDesc {
        self.model
    }

    /// [`super::simulate_train`].
    pub fn train(&mut self, w: &TrainWorkload) -> Result<TrainEstimate, CoreError> {
        self.train_traced(w).map(|(e, _)| e)
    }

    /// [`super::simulate_train_traced`].
    pub fn train_traced(&mut self, w: &TrainWorkload) -> Result<(TrainEstimate, Path), CoreError> {
        // the checks run for every call: they read `grad_accum` as given
        let engine = super::check_train(self.model, w)?;
        let k = key(w);
        if let Some((_, v)) = self.single.iter().find(|(kw, _)| *kw == k) {
            self.single_hits += 1;
            return Ok(v.clone());
        }
        self.single_misses += 1;
        let v = super::train_checked(
            self.model,
            w,
            self.kernels,
            engine,
            self.ranks.classes.as_ref(),
        )?;
        if self.single.len() >= MAX_ENTRIES {
            self.single.clear();
        }
        self.single.push((k, v.clone()));
        Ok(v)
    }

    /// [`super::simulate_train_dist_with`].
    pub fn train_dist(
        &mut self,
        w: &TrainWorkload,
        layout: &Layout,
        opts: &DistOptions,
    ) -> Result<DistEstimate, CoreError> {
        self.train_dist_traced(w, layout, opts).map(|(e, _)| e)
    }

    /// [`super::simulate_train_dist_traced`].
    pub fn train_dist_traced(
        &mut self,
        w: &TrainWorkload,
        layout: &Layout,
        opts: &DistOptions,
    ) -> Result<(DistEstimate, Path), CoreError> {
        crate::memory::dist::simulate_memo(
            self.model,
            w,
            layout,
            self.kernels,
            opts,
            &mut self.ranks,
        )
    }

    /// Estimates (single GPU) and ranks (distributed) answered from the memo, and simulated.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (
            self.single_hits + self.ranks.hits,
            self.single_misses + self.ranks.misses,
        )
    }
}
