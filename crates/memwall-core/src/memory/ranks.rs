//! What a distributed simulation reports: ranks grouped by equal memory, their communication
//! buffers, and the cluster-wide estimate. Shared by the data-parallel replay (`dist.rs`) and
//! Megatron's formulas (`megatron.rs`), so neither imports the other's internals.

use super::timeline::{Category, Phase};
use serde::ser::SerializeSeq;
use serde::{Serialize, Serializer};

/// The global ranks of a group, kept as a pattern rather than a list, so a group of a 10⁵-GPU
/// cluster costs what a group of eight does: the ranks below `total` whose index modulo
/// `period` falls in one of the spans. HSDP repeats a node's shard layout on every node
/// (`period` = the shard group); otherwise `period` is the whole cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankSet {
    period: u64,
    total: u64,
    /// Inclusive spans of indices within a period, ascending and not touching.
    spans: Vec<(u64, u64)>,
}

impl RankSet {
    /// No ranks yet, of a cluster of `total` GPUs whose layout repeats every `period` ranks.
    pub fn new(period: u64, total: u64) -> Self {
        RankSet {
            period: period.clamp(1, total.max(1)),
            total,
            spans: Vec::new(),
        }
    }

    /// The contiguous ranks `lo..=hi` of a cluster of `total` GPUs.
    pub fn span(lo: u64, hi: u64, total: u64) -> Self {
        let mut s = RankSet::new(total, total);
        s.spans.push((lo, hi));
        s
    }

    /// Adds index `i` of the period (indices must come in ascending order).
    pub(crate) fn push_index(&mut self, i: u64) {
        self.push_span(i, i);
    }

    /// Adds indices `lo..=hi` of the period (spans must come in ascending order).
    pub(crate) fn push_span(&mut self, lo: u64, hi: u64) {
        match self.spans.last_mut() {
            Some((_, end)) if *end + 1 >= lo => *end = (*end).max(hi),
            _ => self.spans.push((lo, hi)),
        }
    }

    /// How many ranks.
    pub fn len(&self) -> usize {
        let (p, t) = (self.period, self.total);
        let n: u64 = self
            .spans
            .iter()
            .map(|&(lo, hi)| {
                // ranks lo + k·p .. hi + k·p below t
                let full = t / p;
                let rest = t % p;
                full * (hi - lo + 1) + rest.saturating_sub(lo).min(hi - lo + 1)
            })
            .sum();
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// Whether there is no rank.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `rank` is in the set.
    pub fn contains(&self, rank: &u64) -> bool {
        let i = rank % self.period;
        *rank < self.total && self.spans.iter().any(|&(lo, hi)| lo <= i && i <= hi)
    }

    /// The lowest rank.
    pub fn first(&self) -> Option<u64> {
        self.spans.first().map(|s| s.0).filter(|&r| r < self.total)
    }

    /// The ranks in ascending order (as many as there are: a loop over them is per GPU).
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let (p, t) = (self.period, self.total);
        (0..t.div_ceil(p)).flat_map(move |k| {
            self.spans
                .iter()
                .flat_map(move |&(lo, hi)| (k * p + lo..=k * p + hi).take_while(move |&r| r < t))
        })
    }

    /// Whether a period's last index and the next period's first are both in the set (runs
    /// continue across periods).
    fn wraps(&self) -> bool {
        self.period < self.total
            && self.spans.first().is_some_and(|s| s.0 == 0)
            && self.spans.last().is_some_and(|s| s.1 == self.period - 1)
    }

    /// How many maximal runs of consecutive ranks: one starts at each span of each period
    /// below `total`, except where the previous period's last span runs into it.
    fn run_count(&self) -> u64 {
        let (p, t) = (self.period, self.total);
        let starts: u64 = self
            .spans
            .iter()
            .map(|&(lo, _)| if lo < t { (t - lo - 1) / p + 1 } else { 0 })
            .sum();
        let joined = if self.wraps() { (t - 1) / p } else { 0 };
        starts - joined
    }

    /// The first `limit` maximal runs `(first, last)` of consecutive ranks, in order.
    fn runs(&self, limit: usize) -> Vec<(u64, u64)> {
        let (p, t) = (self.period, self.total);
        let mut out: Vec<(u64, u64)> = Vec::new();
        for k in 0..t.div_ceil(p) {
            for &(lo, hi) in &self.spans {
                let (a, b) = (k * p + lo, (k * p + hi).min(t.saturating_sub(1)));
                if a >= t {
                    continue;
                }
                if let Some(last) = out.last_mut().filter(|l| l.1 + 1 == a) {
                    last.1 = b;
                } else if out.len() < limit {
                    out.push((a, b));
                } else {
                    return out;
                }
            }
        }
        out
    }

    /// "rank 3", "ranks 0-6, 8" (and, past a dozen runs, the first ones, "…" and how many).
    pub fn label(&self) -> String {
        const SHOWN: usize = 12;
        let runs = self.runs(SHOWN + 1);
        let text = |r: &(u64, u64)| {
            if r.0 == r.1 {
                r.0.to_string()
            } else {
                format!("{}-{}", r.0, r.1)
            }
        };
        if self.len() == 1 {
            return format!("rank {}", runs.first().map_or(0, |r| r.0));
        }
        let mut parts: Vec<String> = runs.iter().take(SHOWN).map(text).collect();
        if runs.len() > SHOWN {
            parts.push(format!(
                "… ({} ranks in {} runs)",
                self.len(),
                self.run_count()
            ));
        }
        format!("ranks {}", parts.join(", "))
    }
}

impl<'a> IntoIterator for &'a RankSet {
    type Item = u64;
    type IntoIter = Box<dyn Iterator<Item = u64> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl Serialize for RankSet {
    /// Every rank, as a list (the compact form is for computing, not for exchange).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for r in self.iter() {
            seq.serialize_element(&r)?;
        }
        seq.end()
    }
}

/// Ranks with the same memory, reported once.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankGroup {
    /// What the ranks are (e.g. "dp ranks 0-6", "pp stage 0").
    pub label: String,
    /// Global ranks in the group.
    pub ranks: RankSet,
    /// Peak bytes of each rank of the group.
    pub peak_bytes: u64,
    /// What is alive at the peak, by category (sums to `peak_bytes`).
    pub at_peak: Vec<(Category, u64)>,
    /// Phase of the peak.
    pub phase: Phase,
    /// Host (pinned CPU) bytes each rank of the group needs for offload.
    pub host_bytes: u64,
    /// Model states on each rank's GPU: its (share of the) parameters, gradients and
    /// optimizer states with master weights.
    pub model_state_bytes: u64,
    /// Peak within each phase of the step (forward, loss, backward, optimizer); empty for the
    /// formula-based `megatron` profile.
    pub phase_peaks: Vec<(Phase, u64)>,
}

impl RankGroup {
    /// The highest live bytes within `phase` (`None` for a phase the step does not run).
    pub fn phase_peak(&self, phase: Phase) -> Option<u64> {
        peak_in(&self.phase_peaks, phase)
    }
}

/// The peak of `phase` in a list of per-phase peaks (a step's or a rank group's).
pub(crate) fn peak_in(peaks: &[(Phase, u64)], phase: Phase) -> Option<u64> {
    peaks.iter().find(|(p, _)| *p == phase).map(|&(_, b)| b)
}

/// A named communication buffer and its bytes on one rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CommBuffer {
    /// What it is, in the engine's words.
    pub name: String,
    /// Bytes per rank.
    pub bytes: u64,
}

/// The memory of every rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DistEstimate {
    /// Whose runtime is simulated (its `name()` is the runtime profile: `ddp`, `fsdp`,
    /// `deepspeed` or `megatron`).
    pub engine: crate::engine::Engine,
    /// Rank groups, in rank order.
    pub groups: Vec<RankGroup>,
    /// Index in `groups` of the worst rank.
    pub worst: usize,
    /// The worst rank's peak.
    pub peak_bytes: u64,
    /// Host bytes per node for offload (`gpus_per_node` ranks).
    pub host_bytes_per_node: u64,
    /// Bytes offloaded to NVMe per rank (DeepSpeed ZeRO-Infinity).
    pub nvme_bytes_per_rank: u64,
    /// Communication buffers of one rank.
    pub comm_buffers: Vec<CommBuffer>,
    /// Data-parallel degree.
    pub dp: u64,
    /// Sequences per optimizer step: micro-batch · accumulation · dp.
    pub global_batch: u64,
    /// All parameters.
    pub params_total: u64,
}

/// Index of the group with the highest peak (the first of equals).
pub(crate) fn worst_group(groups: &[RankGroup]) -> usize {
    groups
        .iter()
        .enumerate()
        .max_by_key(|(i, g)| (g.peak_bytes, std::cmp::Reverse(*i)))
        .map_or(0, |(i, _)| i)
}

/// "0-6, 8" style.
#[cfg(test)]
fn compress_ranks(ranks: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let start = ranks[i];
        let mut end = start;
        while i + 1 < ranks.len() && ranks[i + 1] == end + 1 {
            i += 1;
            end = ranks[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(period: u64, total: u64, idx: &[u64]) -> RankSet {
        let mut s = RankSet::new(period, total);
        for &i in idx {
            s.push_index(i);
        }
        s
    }

    #[test]
    fn rank_sets_label_as_the_lists_they_stand_for() {
        for (period, total, idx) in [
            (8u64, 8u64, vec![0u64, 1, 2, 3, 5, 7]),
            (8, 24, vec![0, 1, 2, 3, 4, 5, 6]),
            (8, 24, vec![7]),
            (8, 24, vec![0, 7]),
            (4, 10, vec![1, 2]),
            (3, 3, vec![2]),
        ] {
            let s = set(period, total, &idx);
            let list: Vec<u64> = (0..total).filter(|r| idx.contains(&(r % period))).collect();
            assert_eq!(
                s.iter().collect::<Vec<_>>(),
                list,
                "{period} {total} {idx:?}"
            );
            assert_eq!(s.len(), list.len());
            let label = if list.len() == 1 {
                format!("rank {}", list[0])
            } else {
                format!("ranks {}", compress_ranks(&list))
            };
            assert_eq!(s.label(), label);
            for r in 0..total + 2 {
                assert_eq!(s.contains(&r), list.contains(&r));
            }
            let runs = compress_ranks(&list).split(", ").count() as u64;
            assert_eq!(s.run_count(), runs, "{period} {total} {idx:?}");
        }
    }

    #[test]
    fn a_huge_strided_group_has_a_short_label() {
        let s = set(8, 100_000, &[7]);
        assert_eq!(s.len(), 12_500);
        assert_eq!(
            s.label(),
            "ranks 7, 15, 23, 31, 39, 47, 55, 63, 71, 79, 87, 95, … (12500 ranks in 12500 runs)"
        );
        let whole = set(8, 100_000, &[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(whole.label(), "ranks 0-99999");
        assert_eq!(whole.run_count(), 1);
    }

    #[test]
    fn rank_lists_are_compressed() {
        assert_eq!(compress_ranks(&[0, 1, 2, 3, 5, 7, 8]), "0-3, 5, 7-8");
        assert_eq!(compress_ranks(&[4]), "4");
    }
}
