//! `memwall inspect`: exact parameter counts of a model, by component, and weight bytes by dtype.

use super::table::{md_text, Align, Table};
use super::text::{count, Entries};
use super::{ModelInfo, Report};
use crate::model_source::ModelSource;
use memwall_core::model::ParamCounts;
use memwall_core::Bytes;
use serde::Serialize;
use std::io::{self, Write};

/// `memwall inspect` result.
#[derive(Debug, Serialize)]
pub struct InspectReport {
    /// The model.
    pub model: ModelInfo,
    /// `torch_dtype`/`dtype` of the config, if given.
    pub checkpoint_dtype: Option<String>,
    /// Exact parameter counts by component.
    pub params: ParamCounts,
    /// Bytes of all weights in each dtype.
    pub bytes_by_dtype: Entries<&'static str, u64>,
    /// Whether the LM head shares the embedding matrix (for the table; not in the JSON).
    #[serde(skip)]
    pub tied_head: bool,
}

/// Counts the parameters of `m`.
pub fn build(m: &ModelSource) -> InspectReport {
    let c = m.counts;
    InspectReport {
        model: ModelInfo::new(m, c.total),
        checkpoint_dtype: m.checkpoint_dtype.clone(),
        params: c,
        bytes_by_dtype: Entries(
            [("fp32", 4u64), ("bf16", 2), ("fp16", 2), ("int8", 1)]
                .into_iter()
                .map(|(name, size)| (name, c.total.saturating_mul(size)))
                .collect(),
        ),
        tied_head: m.desc.head.tied,
    }
}

impl InspectReport {
    /// `(component, params)` rows, the total last.
    fn components(&self) -> [(&'static str, u64); 5] {
        let c = &self.params;
        [
            ("embeddings", c.embeddings),
            ("layers", c.layers),
            ("final_norm", c.final_norm),
            ("lm_head", c.lm_head),
            ("total", c.total),
        ]
    }

    fn tied_note(&self) -> &'static str {
        if self.tied_head {
            "tied to embeddings"
        } else {
            ""
        }
    }
}

impl Report for InspectReport {
    fn command(&self) -> &'static str {
        "inspect"
    }

    fn write_table(&self, w: &mut dyn Write) -> io::Result<()> {
        let m = &self.model;
        writeln!(
            w,
            "{} ({}, {} layers) from {}",
            m.label, m.model_type, m.num_layers, m.origin
        )?;
        let c = &self.params;
        writeln!(w, "  {:<14}{:>16}", "embeddings", c.embeddings)?;
        writeln!(w, "  {:<14}{:>16}", "layers", c.layers)?;
        writeln!(w, "  {:<14}{:>16}", "final_norm", c.final_norm)?;
        writeln!(
            w,
            "  {:<14}{:>16}{}",
            "lm_head",
            c.lm_head,
            if self.tied_head {
                "  (tied to embeddings)"
            } else {
                ""
            }
        )?;
        writeln!(w, "  {:<14}{:>16}  ({})", "total", c.total, count(c.total))?;
        if let Some(d) = &self.checkpoint_dtype {
            writeln!(w, "checkpoint dtype: {d}")?;
        }
        for (k, v) in &self.bytes_by_dtype.0 {
            writeln!(w, "  weights in {:<6}{:>12}", k, Bytes(*v).to_string())?;
        }
        Ok(())
    }

    fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()> {
        let m = &self.model;
        writeln!(w, "# memwall inspect · {}", md_text(&m.label))?;
        writeln!(w)?;
        writeln!(
            w,
            "{} ({}, {} layers) from {}.",
            md_text(&m.label),
            md_text(&m.model_type),
            m.num_layers,
            md_text(&m.origin)
        )?;
        writeln!(w)?;
        let mut t = Table::new(&[
            ("component", Align::Left),
            ("params", Align::Right),
            ("note", Align::Left),
        ]);
        for (name, n) in self.components() {
            let note = match name {
                "lm_head" => self.tied_note().to_owned(),
                "total" => count(n),
                _ => String::new(),
            };
            t.push(vec![name.to_owned(), n.to_string(), note]);
        }
        t.write_markdown(w)?;
        writeln!(w)?;
        if let Some(d) = &self.checkpoint_dtype {
            writeln!(w, "Checkpoint dtype: `{d}`.")?;
            writeln!(w)?;
        }
        let mut t = Table::new(&[("weights in", Align::Left), ("bytes", Align::Right)]);
        for (k, v) in &self.bytes_by_dtype.0 {
            t.push(vec![(*k).to_owned(), Bytes(*v).to_string()]);
        }
        t.write_markdown(w)
    }

    fn csv_table(&self) -> Option<Table> {
        let mut t = Table::new(&[("component", Align::Left), ("params", Align::Right)]);
        for (name, n) in self.components() {
            t.push(vec![name.to_owned(), n.to_string()]);
        }
        Some(t)
    }
}
