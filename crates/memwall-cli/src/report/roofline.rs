//! `memwall roofline`: FLOPs, bytes, bound and time per op class of a step on a GPU.

use super::table::{md_text, Align, Table};
use super::text::{serde_name, si};
use super::{ModelInfo, Report};
use crate::args::RooflineSettings;
use anyhow::{Context, Result};
use memwall_core::roofline::{self, Bound, OpCost, RooflinePhase, RooflineWorkload};
use memwall_core::speed::{self, DecodeSpeed, DECODE_PROBE_MAX_BATCH};
use serde::Serialize;
use std::io::{self, Write};
use std::path::PathBuf;

/// `memwall roofline` result.
#[derive(Debug, Serialize)]
pub struct RooflineReport {
    /// The model.
    pub model: ModelInfo,
    /// GPU id.
    pub gpu: String,
    /// The workload analysed.
    pub workload: RooflineWorkload,
    /// The analysis.
    #[serde(flatten)]
    pub result: roofline::Roofline,
    /// Decode only: per-sequence and aggregate rates, and where decode stops being bandwidth-bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode: Option<DecodeSpeed>,
    /// GPU name (for the heading; not part of the JSON schema).
    #[serde(skip)]
    pub gpu_name: String,
    /// Where the SVG plot was written, if asked (not part of the JSON schema).
    #[serde(skip)]
    pub svg: Option<PathBuf>,
}

/// Analyses the workload of `s`.
pub fn build(s: &RooflineSettings) -> Result<RooflineReport> {
    let r = roofline::analyze(&s.model.desc, &s.workload, &s.gpu.ceilings())
        .context("cannot analyse this workload")?;
    let decode = if s.workload.phase == RooflinePhase::Decode {
        Some(speed::decode_speed(&s.model.desc, &s.workload, s.gpu, &r)?)
    } else {
        None
    };
    Ok(RooflineReport {
        model: ModelInfo::new(&s.model, 0),
        gpu: s.gpu.id.clone(),
        workload: s.workload.clone(),
        result: r,
        decode,
        gpu_name: s.gpu.name.clone(),
        svg: s.svg.clone(),
    })
}

fn bound_name(b: Bound) -> &'static str {
    match b {
        Bound::Memory => "memory",
        Bound::Compute => "compute",
        Bound::Network => "network",
    }
}

impl RooflineReport {
    fn phase(&self) -> String {
        serde_name(&self.workload.phase)
    }

    /// The plot's title.
    pub fn svg_title(&self) -> String {
        format!(
            "{} · {} · {} batch {} × {} on {}",
            self.model.label,
            self.phase(),
            serde_name(&self.workload.dtype),
            self.workload.batch,
            self.workload.seq,
            self.gpu_name
        )
    }

    fn heading(&self) -> String {
        format!(
            "{} · {} · batch {} × {} · tp {} on {} (ridge {:.0} FLOP/byte)",
            self.model.label,
            self.phase(),
            self.workload.batch,
            self.workload.seq,
            self.workload.tp,
            self.gpu_name,
            self.result.ridge_flops_per_byte
        )
    }

    fn total_line(&self) -> String {
        let r = &self.result;
        format!(
            "total {} FLOPs, {}B moved; lower bound {:.3} ms per {} → {:.0} tokens/s",
            si(r.total_flops),
            si(r.total_bytes),
            r.time_s * 1e3,
            if self.workload.phase == RooflinePhase::Decode {
                "token step"
            } else {
                "step"
            },
            r.tokens_per_s
        )
    }

    fn decode_line(d: &DecodeSpeed) -> String {
        format!(
            "decode: {:.1} tokens/s per sequence, {:.0} tokens/s aggregate; {}",
            d.tokens_per_s_per_sequence,
            d.aggregate_tokens_per_s,
            match d.compute_bound_from_batch {
                Some(b) => format!("the weight GEMMs turn compute-bound from batch {b}"),
                None => format!("memory-bound at every batch up to {DECODE_PROBE_MAX_BATCH}"),
            }
        )
    }

    fn op_table(&self, csv: bool) -> Table {
        let mut t = Table::new(&[
            ("op", Align::Left),
            (if csv { "flops" } else { "FLOPs" }, Align::Right),
            ("bytes", Align::Right),
            (if csv { "intensity" } else { "FLOP/byte" }, Align::Right),
            ("bound", Align::Left),
            (if csv { "time_s" } else { "time" }, Align::Right),
        ]);
        for o in &self.result.ops {
            t.push(op_row(o, csv));
        }
        t
    }
}

fn op_row(o: &OpCost, csv: bool) -> Vec<String> {
    if csv {
        vec![
            o.name.clone(),
            o.flops.to_string(),
            o.bytes.to_string(),
            o.intensity.to_string(),
            bound_name(o.bound).to_owned(),
            o.time_s.to_string(),
        ]
    } else {
        vec![
            format!("`{}`", o.name),
            si(o.flops).trim_end().to_owned(),
            format!("{}B", si(o.bytes)),
            format!("{:.1}", o.intensity),
            bound_name(o.bound).to_owned(),
            format!("{:.3} ms", o.time_s * 1e3),
        ]
    }
}

impl Report for RooflineReport {
    fn command(&self) -> &'static str {
        "roofline"
    }

    fn write_table(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "memwall roofline · {}", self.heading())?;
        writeln!(
            w,
            "{:<30} {:>12} {:>12} {:>10} {:>8} {:>11}",
            "op", "FLOPs", "bytes", "FLOP/byte", "bound", "time"
        )?;
        for o in &self.result.ops {
            writeln!(
                w,
                "{:<30} {:>12} {:>11}B {:>10.1} {:>8} {:>9.3} ms",
                o.name,
                si(o.flops),
                si(o.bytes),
                o.intensity,
                bound_name(o.bound),
                o.time_s * 1e3
            )?;
        }
        writeln!(w, "{}", self.total_line())?;
        if let Some(d) = &self.decode {
            writeln!(w, "{}", Self::decode_line(d))?;
        }
        if let Some(p) = &self.svg {
            writeln!(w, "roofline plot written to {}", p.display())?;
        }
        Ok(())
    }

    fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "# memwall roofline · {}", md_text(&self.heading()))?;
        writeln!(w)?;
        self.op_table(false).write_markdown(w)?;
        writeln!(w)?;
        writeln!(w, "{}.", md_text(&self.total_line()))?;
        if let Some(d) = &self.decode {
            writeln!(w)?;
            writeln!(w, "{}.", md_text(&Self::decode_line(d)))?;
        }
        if let Some(p) = &self.svg {
            writeln!(w)?;
            writeln!(
                w,
                "Roofline plot written to `{}`.",
                p.display().to_string().replace('`', "'")
            )?;
        }
        Ok(())
    }

    fn csv_table(&self) -> Option<Table> {
        Some(self.op_table(true))
    }
}
