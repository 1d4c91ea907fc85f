//! `memwall models` and `memwall gpus`: the embedded catalogues.

use super::table::{md_text, Align, Table};
use super::text::count;
use super::Report;
use anyhow::{Context, Result};
use memwall_core::gpu::GpuSpec;
use memwall_core::roofline::MathDtype;
use memwall_core::Bytes;
use serde::Serialize;
use std::io::{self, Write};

/// One catalogue model.
#[derive(Debug, Serialize)]
pub struct ModelRow {
    /// Catalogue id.
    pub id: &'static str,
    /// Hugging Face repo id.
    pub hf_repo: &'static str,
    /// `model_type`.
    pub model_type: String,
    /// Exact parameter count.
    pub params_total: u64,
    /// The count the publisher states.
    pub published_params: &'static str,
    /// Where the config comes from.
    pub source: &'static str,
}

/// `memwall models` result: the catalogue, in catalogue order.
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct ModelsReport {
    /// The models.
    pub models: Vec<ModelRow>,
}

/// Parses and counts every catalogue model.
pub fn models() -> Result<ModelsReport> {
    let mut models = Vec::new();
    for e in memwall_catalog::models() {
        let desc = e
            .model()
            .with_context(|| format!("catalogue entry {} does not parse", e.id))?;
        let params_total = desc.param_counts()?.total;
        models.push(ModelRow {
            id: e.id,
            hf_repo: e.hf_repo,
            model_type: desc.model_type.clone(),
            params_total,
            published_params: e.published_params,
            source: e.source,
        });
    }
    Ok(ModelsReport { models })
}

impl Report for ModelsReport {
    fn command(&self) -> &'static str {
        "models"
    }

    fn write_table(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(
            w,
            "{:<24} {:<42} {:<12} {:>9} {:>10}",
            "id", "hf repo", "type", "params", "published"
        )?;
        for r in &self.models {
            writeln!(
                w,
                "{:<24} {:<42} {:<12} {:>9} {:>10}",
                r.id,
                r.hf_repo,
                r.model_type,
                count(r.params_total),
                r.published_params
            )?;
        }
        Ok(())
    }

    fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "# memwall models")?;
        writeln!(w)?;
        let mut t = Table::new(&[
            ("id", Align::Left),
            ("hf repo", Align::Left),
            ("type", Align::Left),
            ("params", Align::Right),
            ("published", Align::Right),
        ]);
        for r in &self.models {
            t.push(vec![
                format!("`{}`", r.id),
                format!(
                    "[{}](https://huggingface.co/{})",
                    md_text(r.hf_repo),
                    r.hf_repo
                ),
                r.model_type.clone(),
                count(r.params_total),
                r.published_params.to_owned(),
            ]);
        }
        t.write_markdown(w)
    }

    fn csv_table(&self) -> Option<Table> {
        let mut t = Table::new(&[
            ("id", Align::Left),
            ("hf_repo", Align::Left),
            ("model_type", Align::Left),
            ("params_total", Align::Right),
            ("published_params", Align::Right),
            ("source", Align::Left),
        ]);
        for r in &self.models {
            t.push(vec![
                r.id.to_owned(),
                r.hf_repo.to_owned(),
                r.model_type.clone(),
                r.params_total.to_string(),
                r.published_params.to_owned(),
                r.source.to_owned(),
            ]);
        }
        Some(t)
    }
}

/// `memwall gpus` result: the GPU table, in catalogue order.
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct GpusReport {
    /// The GPUs.
    pub gpus: &'static [GpuSpec],
}

/// The embedded GPU table.
pub fn gpus() -> Result<GpusReport> {
    let gpus = memwall_catalog::gpus().context("the embedded GPU table is unreadable")?;
    Ok(GpusReport { gpus })
}

/// Dense bf16 peak of `g`, if published.
fn bf16_peak(g: &GpuSpec) -> Option<f64> {
    g.peak_flops_per_s
        .iter()
        .find(|(d, _)| *d == MathDtype::Bf16)
        .map(|(_, f)| *f)
}

/// `(bf16 dense, ridge)` cells, `-` where the GPU has no bf16 figure.
fn bf16_cells(g: &GpuSpec) -> (String, String) {
    let bf16 = bf16_peak(g);
    (
        bf16.map_or("-".to_owned(), |f| format!("{:.0} TFLOP/s", f / 1e12)),
        bf16.map_or("-".to_owned(), |f| {
            format!("{:.0}", f / g.memory_bandwidth_bytes_per_s)
        }),
    )
}

/// Every math format with its CSV column.
const PEAKS: [(MathDtype, &str); 7] = [
    (MathDtype::Fp64, "peak_fp64_flops_per_s"),
    (MathDtype::Fp32, "peak_fp32_flops_per_s"),
    (MathDtype::Tf32, "peak_tf32_flops_per_s"),
    (MathDtype::Bf16, "peak_bf16_flops_per_s"),
    (MathDtype::Fp16, "peak_fp16_flops_per_s"),
    (MathDtype::Fp8, "peak_fp8_flops_per_s"),
    (MathDtype::Int8, "peak_int8_ops_per_s"),
];

impl Report for GpusReport {
    fn command(&self) -> &'static str {
        "gpus"
    }

    fn write_table(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(
            w,
            "{:<16} {:<34} {:>10} {:>11} {:>12} {:>8}",
            "id", "name", "memory", "bandwidth", "bf16 dense", "ridge"
        )?;
        for g in self.gpus {
            let (bf16, ridge) = bf16_cells(g);
            writeln!(
                w,
                "{:<16} {:<34} {:>10} {:>8.2} TB/s {:>12} {:>8}",
                g.id,
                g.name,
                Bytes(g.memory_bytes).to_string(),
                g.memory_bandwidth_bytes_per_s / 1e12,
                bf16,
                ridge,
            )?;
        }
        Ok(())
    }

    fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "# memwall gpus")?;
        writeln!(w)?;
        let mut t = Table::new(&[
            ("id", Align::Left),
            ("name", Align::Left),
            ("memory", Align::Right),
            ("bandwidth", Align::Right),
            ("bf16 dense", Align::Right),
            ("ridge (FLOP/byte)", Align::Right),
        ]);
        for g in self.gpus {
            let (bf16, ridge) = bf16_cells(g);
            t.push(vec![
                format!("`{}`", g.id),
                g.name.clone(),
                Bytes(g.memory_bytes).to_string(),
                format!("{:.2} TB/s", g.memory_bandwidth_bytes_per_s / 1e12),
                bf16,
                ridge,
            ]);
        }
        t.write_markdown(w)
    }

    fn csv_table(&self) -> Option<Table> {
        let mut columns = vec![
            ("id", Align::Left),
            ("name", Align::Left),
            ("vendor", Align::Left),
            ("architecture", Align::Left),
            ("memory_bytes", Align::Right),
            ("memory_type", Align::Left),
            ("memory_bandwidth_bytes_per_s", Align::Right),
            ("l2_bytes", Align::Right),
        ];
        columns.extend(PEAKS.iter().map(|(_, c)| (*c, Align::Right)));
        columns.extend([
            ("interconnect", Align::Left),
            ("interconnect_bytes_per_s", Align::Right),
            ("pcie_generation", Align::Right),
            ("pcie_lanes", Align::Right),
            ("pcie_bytes_per_s", Align::Right),
            ("tdp_w", Align::Right),
        ]);
        let mut t = Table::new(&columns);
        let opt = |v: Option<String>| v.unwrap_or_default();
        for g in self.gpus {
            let mut row = vec![
                g.id.clone(),
                g.name.clone(),
                g.vendor.clone(),
                g.architecture.clone(),
                g.memory_bytes.to_string(),
                g.memory_type.clone(),
                g.memory_bandwidth_bytes_per_s.to_string(),
                opt(g.l2_bytes.map(|b| b.to_string())),
            ];
            for (d, _) in PEAKS {
                row.push(opt(g
                    .peak_flops_per_s
                    .iter()
                    .find(|(x, _)| *x == d)
                    .map(|(_, f)| f.to_string())));
            }
            row.extend([
                opt(g.interconnect.as_ref().map(|l| l.kind.clone())),
                opt(g
                    .interconnect
                    .as_ref()
                    .map(|l| l.bandwidth_bytes_per_s.to_string())),
                opt(g.pcie.as_ref().map(|p| p.generation.to_string())),
                opt(g.pcie.as_ref().map(|p| p.lanes.to_string())),
                opt(g.pcie.as_ref().map(|p| p.bandwidth_bytes_per_s.to_string())),
                opt(g.tdp_w.map(|w| w.to_string())),
            ]);
            t.push(row);
        }
        Some(t)
    }
}
