//! GPU specifications (the data itself is embedded by `memwall-catalog` from `data/gpus.toml`).

use crate::roofline::{Ceilings, MathDtype};
use serde::{Serialize, Serializer};

/// A GPU-to-GPU link.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Link {
    /// NVLink generation, xGMI, ICI, …
    pub kind: String,
    /// Total bandwidth per GPU as the vendor publishes it, bytes/s.
    pub bandwidth_bytes_per_s: f64,
}

/// The host link.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pcie {
    /// PCIe generation.
    pub generation: u32,
    /// Lanes.
    pub lanes: u32,
    /// Bandwidth per direction, bytes/s.
    pub bandwidth_bytes_per_s: f64,
}

/// One GPU model, every figure from its datasheet (`sources`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSpec {
    /// Identifier users pass to `--gpu`.
    pub id: String,
    /// Marketing name.
    pub name: String,
    /// nvidia, amd, google, apple.
    pub vendor: String,
    /// Architecture (ampere, hopper, …).
    pub architecture: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// HBM3, GDDR6X, …
    pub memory_type: String,
    /// Memory bandwidth, bytes/s.
    pub memory_bandwidth_bytes_per_s: f64,
    /// Last-level cache, bytes.
    pub l2_bytes: Option<u64>,
    /// Dense peak FLOP/s by math format (no 2:4 sparsity).
    #[serde(serialize_with = "flops_as_object")]
    pub peak_flops_per_s: Vec<(MathDtype, f64)>,
    /// GPU-to-GPU link.
    pub interconnect: Option<Link>,
    /// Host link.
    pub pcie: Option<Pcie>,
    /// Inter-node network bandwidth per GPU, per direction, bytes/s: the reference system's NIC
    /// (e.g. DGX H100: one 400 Gb/s ConnectX-7 per GPU = 50e9), or
    /// [`DEFAULT_NETWORK_BYTES_PER_S`] when the catalogue names none.
    pub network_bytes_per_s: f64,
    /// Measured maximum achievable bf16 matmul FLOP/s as a fraction of the dense peak (Stas
    /// Bekman's MAMF table, `ml-engineering/compute/accelerator/README.md`); `None` = unmeasured.
    pub matmul_efficiency: Option<f64>,
    /// Board power, watts.
    pub tdp_w: Option<u32>,
    /// Datasheets and pages the figures come from.
    pub sources: Vec<String>,
}

fn flops_as_object<S: Serializer>(v: &[(MathDtype, f64)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(v.len()))?;
    for (d, f) in v {
        m.serialize_entry(d, f)?;
    }
    m.end()
}

impl GpuSpec {
    /// The roofline ceilings of this GPU.
    pub fn ceilings(&self) -> Ceilings {
        Ceilings {
            memory_bandwidth_bytes_per_s: self.memory_bandwidth_bytes_per_s,
            peak_flops_per_s: self.peak_flops_per_s.clone(),
            interconnect_bytes_per_s: self.interconnect.as_ref().map(|l| l.bandwidth_bytes_per_s),
        }
    }

    /// cuBLAS workspace PyTorch allocates per handle/stream through its caching allocator:
    /// `CUBLAS_WORKSPACE_CONFIG` default ":4096:8" on Hopper and newer (8 × 4 MiB = 32 MiB) and
    /// ":4096:2:16:8" elsewhere (2 × 4 MiB + 8 × 16 KiB ≈ 8.1 MiB) — PyTorch
    /// `aten/src/ATen/cuda/CublasHandlePool.cpp`, `getChainedCublasWorkspaceSize`.
    /// Non-NVIDIA devices report 0 here.
    pub fn cublas_workspace_bytes(&self) -> u64 {
        if self.vendor != "nvidia" {
            return 0;
        }
        match self.architecture.as_str() {
            "hopper" | "blackwell" => 32 << 20,
            _ => (2 * 4096 + 8 * 16) << 10,
        }
    }
}

/// Inter-node network per GPU when the catalogue names no reference system: one 400 Gb/s
/// InfiniBand/RoCE NIC per GPU (DGX H100 / HGX H200 / MI300X platforms) = 50e9 bytes/s per
/// direction.
pub const DEFAULT_NETWORK_BYTES_PER_S: f64 = 400e9 / 8.0;

/// Memory that PyTorch's allocator never sees but the process holds: the CUDA context
/// (driver state, kernels of torch/cuBLAS/cuDNN loaded lazily). Typical measured values
/// are 300–600 MiB on Ampere/Hopper with CUDA 12 lazy loading (`CUDA_MODULE_LOADING=LAZY`,
/// the default since CUDA 11.7); we report 500 MiB as a named line, never folded into the peak.
pub const CUDA_CONTEXT_BYTES: u64 = 500 << 20;
