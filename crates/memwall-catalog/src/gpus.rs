//! The embedded GPU catalogue (`data/gpus.toml`): datasheet figures with their sources.

use memwall_core::gpu::{GpuSpec, Link, Pcie};
use memwall_core::roofline::MathDtype;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use thiserror::Error;

const GPUS_TOML: &str = include_str!(concat!(env!("OUT_DIR"), "/gpus.toml"));

/// The embedded GPU table could not be read (caught by this crate's tests, never at run time
/// in a released build).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("data/gpus.toml: {0}")]
pub struct GpuTableError(String);

#[derive(Debug, Deserialize)]
struct RawFile {
    gpu: Vec<RawGpu>,
}

#[derive(Debug, Deserialize)]
struct RawGpu {
    id: String,
    name: String,
    vendor: String,
    #[serde(default)]
    architecture: String,
    memory_bytes: u64,
    #[serde(default)]
    memory_type: String,
    memory_bandwidth_bytes_per_s: f64,
    l2_bytes: Option<u64>,
    peak_flops_per_s: BTreeMap<String, f64>,
    interconnect: Option<RawLink>,
    pcie: Option<RawPcie>,
    network_bytes_per_s: Option<f64>,
    matmul_efficiency: Option<f64>,
    tdp_w: Option<f64>,
    #[serde(default)]
    sources: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct RawLink {
    kind: String,
    bandwidth_bytes_per_s: f64,
}

#[derive(Debug, Deserialize)]
struct RawPcie {
    generation: u32,
    #[serde(default = "sixteen")]
    lanes: u32,
    bandwidth_bytes_per_s: f64,
}

fn sixteen() -> u32 {
    16
}

fn dtype(name: &str) -> Option<MathDtype> {
    Some(match name {
        "fp64" => MathDtype::Fp64,
        "fp32" => MathDtype::Fp32,
        "tf32" => MathDtype::Tf32,
        "bf16" => MathDtype::Bf16,
        "fp16" => MathDtype::Fp16,
        "fp8" => MathDtype::Fp8,
        "int8" => MathDtype::Int8,
        _ => return None,
    })
}

fn parse() -> Result<Vec<GpuSpec>, GpuTableError> {
    let raw: RawFile = toml::from_str(GPUS_TOML).map_err(|e| GpuTableError(e.to_string()))?;
    raw.gpu
        .into_iter()
        .map(|g| {
            let mut flops = Vec::new();
            for (k, v) in g.peak_flops_per_s {
                let d = dtype(&k)
                    .ok_or_else(|| GpuTableError(format!("{}: unknown dtype `{k}`", g.id)))?;
                flops.push((d, v));
            }
            flops.sort_by_key(|f| f.0);
            Ok(GpuSpec {
                id: g.id,
                name: g.name,
                vendor: g.vendor,
                architecture: g.architecture,
                memory_bytes: g.memory_bytes,
                memory_type: g.memory_type,
                memory_bandwidth_bytes_per_s: g.memory_bandwidth_bytes_per_s,
                l2_bytes: g.l2_bytes,
                peak_flops_per_s: flops,
                interconnect: g.interconnect.map(|l| Link {
                    kind: l.kind,
                    bandwidth_bytes_per_s: l.bandwidth_bytes_per_s,
                }),
                pcie: g.pcie.map(|p| Pcie {
                    generation: p.generation,
                    lanes: p.lanes,
                    bandwidth_bytes_per_s: p.bandwidth_bytes_per_s,
                }),
                network_bytes_per_s: g
                    .network_bytes_per_s
                    .unwrap_or(memwall_core::gpu::DEFAULT_NETWORK_BYTES_PER_S),
                matmul_efficiency: g.matmul_efficiency,
                tdp_w: g.tdp_w.map(|w| w.round() as u32),
                sources: g.sources,
            })
        })
        .collect()
}

/// Every GPU in the catalogue, sorted by id.
pub fn gpus() -> Result<&'static [GpuSpec], GpuTableError> {
    static TABLE: OnceLock<Result<Vec<GpuSpec>, GpuTableError>> = OnceLock::new();
    TABLE.get_or_init(parse).as_deref().map_err(Clone::clone)
}

/// Looks a GPU up by id, case-insensitively.
pub fn find_gpu(id: &str) -> Option<&'static GpuSpec> {
    gpus().ok()?.iter().find(|g| g.id.eq_ignore_ascii_case(id))
}

/// Ids close to `id` for "did you mean" (substring either way, or edit distance ≤ 3).
pub fn suggest_gpu(id: &str) -> Vec<&'static str> {
    let want = id.to_ascii_lowercase();
    let Ok(all) = gpus() else { return vec![] };
    let by_substring: Vec<&str> = all
        .iter()
        .filter(|g| g.id.contains(&want) || want.contains(&g.id))
        .map(|g| g.id.as_str())
        .collect();
    if !by_substring.is_empty() {
        return by_substring;
    }
    all.iter()
        .filter(|g| crate::levenshtein(&g.id, &want) <= 3)
        .map(|g| g.id.as_str())
        .take(5)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_parses_with_unique_sorted_ids_and_sources() {
        let g = gpus().unwrap();
        assert!(g.len() >= 15, "{}", g.len());
        for w in g.windows(2) {
            assert!(
                w[0].id < w[1].id,
                "ids not sorted/unique: {} {}",
                w[0].id,
                w[1].id
            );
        }
        for x in g {
            assert!(!x.sources.is_empty(), "{} has no source", x.id);
            assert!(
                x.memory_bytes > 0 && x.memory_bandwidth_bytes_per_s > 0.0,
                "{}",
                x.id
            );
            assert!(x.peak_flops_per_s.iter().all(|(_, f)| *f > 0.0), "{}", x.id);
            assert!(!x.peak_flops_per_s.is_empty(), "{}", x.id);
            assert!(x.network_bytes_per_s > 0.0, "{}", x.id);
            if let Some(m) = x.matmul_efficiency {
                assert!(m > 0.0 && m <= 1.0, "{}: matmul_efficiency {m}", x.id);
            }
        }
        let h100 = find_gpu("h100-sxm").unwrap();
        assert_eq!(h100.network_bytes_per_s, 50e9);
        assert_eq!(find_gpu("a100-80gb-sxm").unwrap().network_bytes_per_s, 25e9);
        assert_eq!(h100.matmul_efficiency, Some(0.803));
    }
}
