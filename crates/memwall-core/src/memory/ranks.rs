//! What a distributed simulation reports: ranks grouped by equal memory, their communication
//! buffers, and the cluster-wide estimate. Shared by the data-parallel replay (`dist.rs`) and
//! Megatron's formulas (`megatron.rs`), so neither imports the other's internals.

use super::timeline::{Category, Phase};
use serde::Serialize;

/// Ranks with the same memory, reported once.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankGroup {
    /// What the ranks are (e.g. "dp ranks 0-6", "pp stage 0").
    pub label: String,
    /// Global ranks in the group.
    pub ranks: Vec<u64>,
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
pub(crate) fn compress_ranks(ranks: &[u64]) -> String {
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

    #[test]
    fn rank_lists_are_compressed() {
        assert_eq!(compress_ranks(&[0, 1, 2, 3, 5, 7, 8]), "0-3, 5, 7-8");
        assert_eq!(compress_ranks(&[4]), "4");
    }
}
