//! What one GPU and its links can do, as the step-time model needs it.

use crate::gpu::GpuSpec;
use crate::roofline::Ceilings;
use serde::Serialize;

/// The compute, memory and link ceilings of the GPUs a job runs on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hardware {
    /// Dense peak FLOP/s by format and HBM bandwidth.
    pub ceilings: Ceilings,
    /// `nvidia`, `amd`, …
    pub vendor: String,
    /// `ampere`, `hopper`, … (picks attention-kernel efficiencies).
    pub architecture: String,
    /// The GPU-to-GPU link inside a node (NVLink, xGMI), per GPU and per direction, bytes/s:
    /// the catalogue's total bidirectional figure halved. `None`: GPUs talk over PCIe.
    pub intra_node_bytes_per_s: Option<f64>,
    /// Name of that link (`nvlink4`, `infinity-fabric`, or `pcie` when there is none).
    pub intra_node_kind: String,
    /// Host link per direction, bytes/s (offload traffic; GPU-to-GPU traffic without NVLink).
    pub pcie_bytes_per_s: Option<f64>,
    /// Inter-node network per GPU, per direction, bytes/s.
    pub network_bytes_per_s: f64,
    /// Measured maximum achievable matmul throughput as a fraction of the dense peak, if known.
    pub matmul_efficiency: Option<f64>,
}

/// PCIe Gen4 x16 per direction, for GPUs whose catalogue entry names no host link.
const FALLBACK_PCIE_BYTES_PER_S: f64 = 32e9;

impl Hardware {
    /// The hardware of one catalogued GPU.
    pub fn from_gpu(g: &GpuSpec) -> Self {
        Hardware {
            ceilings: g.ceilings(),
            vendor: g.vendor.clone(),
            architecture: g.architecture.clone(),
            // the catalogue stores the vendor's total bidirectional figure (gpus.toml header);
            // a ring sends in one direction on each link, so half of it is the ceiling
            intra_node_bytes_per_s: g
                .interconnect
                .as_ref()
                .map(|l| l.bandwidth_bytes_per_s / 2.0),
            intra_node_kind: g
                .interconnect
                .as_ref()
                .map_or_else(|| "pcie".to_owned(), |l| l.kind.clone()),
            pcie_bytes_per_s: g.pcie.as_ref().map(|p| p.bandwidth_bytes_per_s),
            network_bytes_per_s: g.network_bytes_per_s,
            matmul_efficiency: g.matmul_efficiency,
        }
    }

    /// The GPU-to-GPU bandwidth inside a node per direction: NVLink/xGMI, else PCIe.
    pub fn intra_node_link(&self) -> f64 {
        self.intra_node_bytes_per_s
            .or(self.pcie_bytes_per_s)
            .unwrap_or(FALLBACK_PCIE_BYTES_PER_S)
    }

    /// The host link per direction.
    pub fn host_link(&self) -> f64 {
        self.pcie_bytes_per_s.unwrap_or(FALLBACK_PCIE_BYTES_PER_S)
    }
}
