//! A small table of GPUs for fit checks (the full catalogue with bandwidth and FLOP/s is separate).

use serde::Serialize;

/// A GPU model, as far as capacity is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Gpu {
    /// Identifier users pass to `--gpu`.
    pub id: &'static str,
    /// Marketing name.
    pub name: &'static str,
    /// Device memory in bytes (nominal capacity of the HBM/GDDR stacks).
    pub memory_bytes: u64,
    /// Datasheet the capacity comes from.
    pub source: &'static str,
}

const GIB: u64 = 1 << 30;

/// Memory that PyTorch's allocator never sees but the process holds: the CUDA context
/// (driver state, kernels of torch/cuBLAS/cuDNN loaded lazily). Typical measured values
/// are 300–600 MiB on Ampere/Hopper with CUDA 12 lazy loading (`CUDA_MODULE_LOADING=LAZY`,
/// the default since CUDA 11.7); we report 500 MiB as a named line, never folded into the peak.
pub const CUDA_CONTEXT_BYTES: u64 = 500 << 20;

/// cuBLAS workspace PyTorch allocates per handle/stream through its caching allocator:
/// `CUBLAS_WORKSPACE_CONFIG` default ":4096:8" on Hopper (8 × 4 MiB = 32 MiB) and
/// ":4096:2:16:8" elsewhere (2 × 4 MiB + 8 × 16 KiB ≈ 8.1 MiB) — PyTorch
/// `aten/src/ATen/cuda/CublasHandlePool.cpp`, `getChainedCublasWorkspaceSize`.
pub fn cublas_workspace_bytes(gpu: &Gpu) -> u64 {
    if gpu.id.starts_with("h100") || gpu.id.starts_with("h200") {
        32 << 20
    } else {
        (2 * 4096 + 8 * 16) << 10
    }
}

/// The GPUs known to `--gpu`, sorted by id.
pub const GPUS: &[Gpu] = &[
    Gpu {
        id: "a100-40gb",
        name: "NVIDIA A100 40GB",
        memory_bytes: 40 * GIB,
        source: "NVIDIA A100 Tensor Core GPU datasheet (2021)",
    },
    Gpu {
        id: "a100-80gb",
        name: "NVIDIA A100 80GB",
        memory_bytes: 80 * GIB,
        source: "NVIDIA A100 Tensor Core GPU datasheet (2021)",
    },
    Gpu {
        id: "h100-80gb",
        name: "NVIDIA H100 SXM5 80GB",
        memory_bytes: 80 * GIB,
        source: "NVIDIA H100 Tensor Core GPU datasheet (2023)",
    },
    Gpu {
        id: "h200-141gb",
        name: "NVIDIA H200 SXM 141GB",
        memory_bytes: 141 * GIB,
        source: "NVIDIA H200 Tensor Core GPU datasheet (2024)",
    },
    Gpu {
        id: "l4-24gb",
        name: "NVIDIA L4 24GB",
        memory_bytes: 24 * GIB,
        source: "NVIDIA L4 Tensor Core GPU datasheet (2023)",
    },
    Gpu {
        id: "rtx-4090-24gb",
        name: "NVIDIA GeForce RTX 4090",
        memory_bytes: 24 * GIB,
        source: "NVIDIA Ada Lovelace GPU architecture whitepaper v1.1",
    },
];

/// Looks a GPU up by id (case-insensitive).
pub fn find(id: &str) -> Option<&'static Gpu> {
    GPUS.iter().find(|g| g.id.eq_ignore_ascii_case(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_unique_sorted_sourced() {
        for w in GPUS.windows(2) {
            assert!(w[0].id < w[1].id, "{} !< {}", w[0].id, w[1].id);
        }
        assert!(GPUS
            .iter()
            .all(|g| g.memory_bytes > 0 && !g.source.is_empty()));
        assert_eq!(find("h100-80gb").map(|g| g.memory_bytes), Some(80 * GIB));
    }
}
