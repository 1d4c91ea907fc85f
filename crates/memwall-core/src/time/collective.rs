//! Cost of one NCCL collective on the links it crosses.
//!
//! Bandwidth term: NCCL's bus-bandwidth definitions (nccl-tests `doc/PERFORMANCE.md`, "Bus
//! bandwidth"): a ring all-reduce of `S` bytes over `n` ranks moves `2(n−1)/n·S` through every
//! rank's link, all-gather and reduce-scatter (`S` = the gathered / scattered total) and
//! all-to-all `(n−1)/n·S`, a point-to-point send `S`. The time is those bus bytes over the
//! slowest link a rank uses, plus a per-call latency (the α–β model):
//!
//! `t = α + bus_bytes / (link_bytes_per_s · efficiency)`.
//!
//! Placement: ranks are numbered with tensor parallelism innermost (Megatron-LM's default
//! `tp-cp-ep-dp-pp` order, `megatron/core/parallel_state.py`; torchtitan's device mesh has the
//! same nesting), so a group is `size` ranks `stride` apart. A group inside one node runs on
//! NVLink/xGMI. A group spanning nodes runs a ring over both links; NCCL opens one channel per
//! NIC, so a node's share of the ring crosses on the NICs of the group's members in that node
//! (one NIC per GPU): its ceiling is `min(intra-node link, members per node × per-GPU network)`.
//! Stas Bekman's measurements (ml-engineering `network/README.md`, "Inter-node speed depends on
//! intra-node speed": 4 × 8 B200 nodes, all-reduce busbw 377 GB/s against 8 × 50 GB/s of NICs)
//! fit this ring model within 6%.

use super::efficiency::Efficiencies;
use super::hardware::Hardware;
use serde::Serialize;

/// A collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    /// All-reduce (`S` = the buffer).
    AllReduce,
    /// All-gather (`S` = the gathered output).
    AllGather,
    /// Reduce-scatter (`S` = the input before scattering).
    ReduceScatter,
    /// All-to-all (`S` = what one rank sends in total).
    AllToAll,
    /// Point-to-point send/receive between neighbours (`S` = the message).
    SendRecv,
}

impl CollectiveKind {
    /// Bytes through each rank's link per byte of `S` (nccl-tests PERFORMANCE.md).
    pub fn bus_factor(self, n: u64) -> f64 {
        let n = n.max(1) as f64;
        match self {
            CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollectiveKind::AllGather
            | CollectiveKind::ReduceScatter
            | CollectiveKind::AllToAll => (n - 1.0) / n,
            CollectiveKind::SendRecv => 1.0,
        }
    }
}

/// Which link a collective is limited by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    /// NVLink / xGMI (or PCIe between GPUs without one) inside a node.
    IntraNode,
    /// The inter-node network (InfiniBand / RoCE / EFA).
    Network,
    /// The host link (offload traffic).
    Pcie,
}

/// `size` ranks `stride` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// Ranks in the group.
    pub size: u64,
    /// Distance between consecutive members' global ranks.
    pub stride: u64,
}

impl Group {
    /// Members of the group that share one node.
    pub fn members_per_node(self, gpus_per_node: u64) -> u64 {
        let gpn = gpus_per_node.max(1);
        if self.stride >= gpn {
            1
        } else {
            (gpn / self.stride.max(1)).clamp(1, self.size.max(1))
        }
    }

    /// Whether the group crosses a node boundary.
    pub fn spans_nodes(self, gpus_per_node: u64) -> bool {
        self.size > self.members_per_node(gpus_per_node)
    }
}

/// The time of one collective call of `bytes` over `group`, and the link that limits it.
pub fn collective_time(
    kind: CollectiveKind,
    bytes: f64,
    group: Group,
    gpus_per_node: u64,
    hw: &Hardware,
    eff: &Efficiencies,
) -> (LinkKind, f64) {
    if group.size <= 1 || bytes <= 0.0 {
        return (LinkKind::IntraNode, 0.0);
    }
    let intra = hw.intra_node_link() * eff.intra_node_link_fraction;
    let net = hw.network_bytes_per_s * eff.network_fraction;
    let factor = kind.bus_factor(group.size);
    if !group.spans_nodes(gpus_per_node) {
        return (
            LinkKind::IntraNode,
            eff.intra_node_latency_s + factor * bytes / intra,
        );
    }
    let m = group.members_per_node(gpus_per_node) as f64;
    let n = group.size as f64;
    let seconds = match kind {
        // each rank's own share to the other nodes leaves through its own NIC; the rest
        // stays on NVLink; both run at once
        CollectiveKind::AllToAll => {
            let off_node = (n - m) / n * bytes / net;
            let on_node = (m - 1.0) / n * bytes / intra;
            off_node.max(on_node)
        }
        // neighbours on different nodes: one NIC each way
        CollectiveKind::SendRecv => bytes / net,
        _ => factor * bytes / intra.min(m * net),
    };
    (LinkKind::Network, eff.network_latency_s + seconds)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::roofline::{Ceilings, MathDtype};

    pub(crate) fn h100() -> Hardware {
        Hardware {
            ceilings: Ceilings {
                memory_bandwidth_bytes_per_s: 3.35e12,
                peak_flops_per_s: vec![(MathDtype::Bf16, 989.5e12), (MathDtype::Fp32, 67e12)],
                interconnect_bytes_per_s: Some(900e9),
            },
            vendor: "nvidia".into(),
            architecture: "hopper".into(),
            intra_node_bytes_per_s: Some(450e9),
            intra_node_kind: "nvlink4".into(),
            pcie_bytes_per_s: Some(64e9),
            network_bytes_per_s: 50e9,
            matmul_efficiency: Some(0.803),
        }
    }

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert!((CollectiveKind::AllReduce.bus_factor(8) - 1.75).abs() < 1e-12);
        assert!((CollectiveKind::AllGather.bus_factor(8) - 0.875).abs() < 1e-12);
        assert_eq!(CollectiveKind::AllReduce.bus_factor(1), 0.0);
    }

    #[test]
    fn placement_by_stride() {
        let tp = Group { size: 8, stride: 1 };
        assert!(!tp.spans_nodes(8));
        let dp = Group { size: 4, stride: 8 };
        assert_eq!(dp.members_per_node(8), 1);
        assert!(dp.spans_nodes(8));
        let dp16 = Group {
            size: 16,
            stride: 1,
        };
        assert_eq!(dp16.members_per_node(8), 8);
        assert!(dp16.spans_nodes(8));
    }

    #[test]
    fn crossing_nodes_is_slower_and_one_nic_is_slowest() {
        let hw = h100();
        let e = Efficiencies::for_hardware(&hw);
        let s = 1e9;
        let (l1, inside) = collective_time(
            CollectiveKind::AllReduce,
            s,
            Group { size: 8, stride: 1 },
            8,
            &hw,
            &e,
        );
        let (l2, across) = collective_time(
            CollectiveKind::AllReduce,
            s,
            Group {
                size: 16,
                stride: 1,
            },
            8,
            &hw,
            &e,
        );
        let (_, one_nic) = collective_time(
            CollectiveKind::AllReduce,
            s,
            Group { size: 2, stride: 8 },
            8,
            &hw,
            &e,
        );
        assert_eq!((l1, l2), (LinkKind::IntraNode, LinkKind::Network));
        assert!(
            inside < across && across < one_nic,
            "{inside} {across} {one_nic}"
        );
        // 1 GB over 8 H100s: 1.75 GB at 0.8 × 450 GB/s ≈ 4.9 ms
        assert!((inside - 4.9e-3).abs() < 0.3e-3, "{inside}");
    }
}
