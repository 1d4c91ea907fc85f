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
    /// The checkpoint's tensors, when weight files were read (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSummary>,
}

/// What the headers of a model's weight files say.
#[derive(Debug, Serialize)]
pub struct CheckpointSummary {
    /// `safetensors` or `gguf`.
    pub format: &'static str,
    /// Files whose headers were read.
    pub files: usize,
    /// The storage scheme, in words (`BF16 (unquantised)`, `GGUF, mostly Q4_K`).
    pub storage: String,
    /// Bytes of all tensors, exactly.
    pub tensor_bytes: u64,
    /// Layers stored beyond the description (not loaded by transformers).
    pub extra_layers: u64,
    /// The weight format estimates simulate for it (the `--weights` name), as `infer` picks it.
    pub weights: String,
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
        checkpoint: m.checkpoint.as_ref().map(|c| CheckpointSummary {
            format: c.format,
            files: c.files,
            storage: c.storage.clone(),
            tensor_bytes: c.stored.total_bytes(),
            extra_layers: c.extra_layers,
            weights: crate::weights::choose(m, None)
                .map_or_else(|_| "bf16".to_owned(), |w| w.format.name()),
        }),
    }
}

impl CheckpointSummary {
    /// `1 gguf file(s), GGUF, mostly Q4_K: 1.02 MiB exactly; estimates use --weights gguf-q4_k_m`.
    fn line(&self) -> String {
        format!(
            "{} {} file(s), {}: {} of tensors exactly{}; estimates use --weights {}",
            self.files,
            self.format,
            self.storage,
            Bytes(self.tensor_bytes),
            if self.extra_layers > 0 {
                format!(
                    " (incl. {} layer(s) transformers does not load)",
                    self.extra_layers
                )
            } else {
                String::new()
            },
            self.weights
        )
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
        if let Some(c) = &self.checkpoint {
            writeln!(w, "checkpoint: {}", c.line())?;
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
        if let Some(c) = &self.checkpoint {
            writeln!(w, "Checkpoint: {}.", md_text(&c.line()))?;
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
