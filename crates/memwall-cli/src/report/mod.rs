//! Reports: one typed, serialisable value per command, and the renderers over it.
//!
//! Each command builds its report from resolved settings by calling core (`build` in each
//! submodule); the renderers only format. In the manner of hyperfine's exporters, every output
//! format is one function over the same value writing to any [`Write`]: JSON is the report's
//! `Serialize`, the table (the default) and Markdown are [`Report`] methods, and CSV is the
//! report's [`Table`] where it has one.

pub mod catalog;
pub mod doctor;
pub mod infer;
pub mod inspect;
pub mod plan;
pub mod roofline;
pub mod serve;
pub mod table;
pub mod text;
pub mod train;

use crate::model_source::ModelSource;
use anyhow::Result;
use serde::Serialize;
use std::io::{self, Write};
pub use table::Table;

/// Output format of a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned text for a terminal.
    Table,
    /// Pretty-printed JSON: the report's documented schema.
    Json,
    /// GitHub-flavoured Markdown.
    Markdown,
    /// Comma-separated values (only reports that are a table).
    Csv,
}

impl Format {
    /// The name `--format` takes.
    pub fn name(self) -> &'static str {
        match self {
            Format::Table => "table",
            Format::Json => "json",
            Format::Markdown => "markdown",
            Format::Csv => "csv",
        }
    }
}

/// A command's result, renderable in every [`Format`].
pub trait Report: Serialize {
    /// The command that produced it (`train`), for messages.
    fn command(&self) -> &'static str;

    /// Writes the aligned text table.
    fn write_table(&self, w: &mut dyn Write) -> io::Result<()>;

    /// Writes GitHub-flavoured Markdown.
    fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()>;

    /// The report as one table, when it is tabular (CSV writes it); `None` refuses CSV.
    fn csv_table(&self) -> Option<Table> {
        None
    }

    /// Which reports CSV is for, said when this one refuses it.
    fn csv_hint(&self) -> &'static str {
        "CSV is for the tabular reports: models, gpus, inspect, serve, roofline and a \
         distributed train (--gpus N)"
    }
}

/// `--model MODEL --gpu GPU` followed by `args`: the whole argument list of a command that
/// reproduces a plan, a doctor's step or an emitted configuration.
pub fn with_model_and_gpu(model: &str, gpu: &str, args: Vec<String>) -> Vec<String> {
    let mut a = vec![
        "--model".to_owned(),
        model.to_owned(),
        "--gpu".to_owned(),
        gpu.to_owned(),
    ];
    a.extend(args);
    a
}

/// Writes `report` to `w` in `format`. A write failure comes back as
/// [`crate::output::OutputError`]; a format the report cannot take is an ordinary error.
pub fn emit<R: Report>(report: &R, format: Format, w: &mut dyn Write) -> Result<()> {
    let written = match format {
        Format::Json => {
            let text = serde_json::to_string_pretty(report)?;
            writeln!(w, "{text}")
        }
        Format::Table => report.write_table(w),
        Format::Markdown => report.write_markdown(w),
        Format::Csv => match report.csv_table() {
            Some(t) => t.write_csv(w),
            None => {
                return Err(crate::error::UserError::new(
                    format!(
                        "`memwall {}` has no table to write as CSV (--format csv)",
                        report.command()
                    ),
                    format!(
                        "use --format table, json or markdown; {}",
                        report.csv_hint()
                    ),
                )
                .into())
            }
        },
    };
    written.map_err(|e| crate::output::OutputError::Stdout(e).into())
}

/// Model identity in reports.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfo {
    /// Catalogue id or path.
    pub label: String,
    /// Hugging Face repo id when known.
    pub hf_repo: Option<String>,
    /// `model_type`.
    pub model_type: String,
    /// Where the config came from.
    pub origin: String,
    /// Decoder layers.
    pub num_layers: usize,
    /// All parameters.
    pub params_total: u64,
    /// Trainable parameters in this workload.
    pub params_trainable: u64,
    /// A vision-language model's vision tower: its weights, whether they train, and the
    /// estimate's assumption about image tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionInfo>,
}

/// The vision tower of a vision-language model, as reports state it.
#[derive(Debug, Clone, Serialize)]
pub struct VisionInfo {
    /// `model_type` of the vision config.
    pub model_type: String,
    /// Vision encoder + projector parameters (included in `params_total`).
    pub params: u64,
    /// Whether the step trains them (`--train-vision`); frozen by default.
    pub trainable: bool,
    /// How image tokens enter the estimate.
    pub assumption: String,
    /// Image tokens per sequence simulated through the vision tower (`--image-tokens`);
    /// absent: image tokens count as text tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_tokens: Option<u64>,
}

impl VisionInfo {
    /// The one line text and Markdown reports print under the model line.
    pub fn line(&self) -> String {
        format!(
            "vision tower: {} ({} params, {}) · assumption: {}",
            self.model_type,
            text::count(self.params),
            if self.trainable {
                "trained (--train-vision)"
            } else {
                "frozen; --train-vision trains it"
            },
            self.assumption
        )
    }
}

impl ModelInfo {
    /// The identity of `m`, with `trainable` parameters in this workload.
    pub fn new(m: &ModelSource, trainable: u64) -> Self {
        ModelInfo {
            label: m.label.clone(),
            hf_repo: m.hf_repo.clone(),
            model_type: m.desc.model_type.clone(),
            origin: m.origin.clone(),
            num_layers: m.desc.num_layers(),
            params_total: m.counts.total,
            params_trainable: trainable,
            vision: m.desc.vision.as_ref().map(|v| VisionInfo {
                model_type: v.model_type.clone(),
                params: v.params(),
                trainable: v.trainable,
                assumption: v.image_tokens.map_or_else(
                    || crate::vision::IMAGE_TOKENS_ASSUMPTION.to_string(),
                    |n| {
                        crate::vision::image_tokens_note(
                            n,
                            v.forward.as_ref().map_or(0, |f| f.per_image),
                            v.forward.as_ref().map(|f| f.kind),
                        )
                    },
                ),
                image_tokens: v.image_tokens,
            }),
        }
    }
}

/// The fit line every memory report ends with, in Markdown.
fn markdown_fit(w: &mut dyn Write, g: &memwall_core::advice::GpuFit) -> io::Result<()> {
    use memwall_core::Bytes;
    let verdict = if g.fits {
        format!(
            "**fits**, {} free",
            Bytes(u64::try_from(g.headroom_bytes).unwrap_or(0))
        )
    } else {
        format!(
            "**does NOT fit**, short by {}",
            Bytes(u64::try_from(-g.headroom_bytes).unwrap_or(0))
        )
    };
    writeln!(
        w,
        "On **{}** ({}): needs {} of {} (incl. {} CUDA context, {} cuBLAS workspace, {} allocator \
         margin) — {verdict}.",
        table::md_text(&g.id),
        table::md_text(&g.name),
        Bytes(g.required_bytes),
        Bytes(g.memory_bytes),
        Bytes(g.cuda_context_bytes),
        Bytes(g.cublas_workspace_bytes),
        Bytes(g.alloc_margin_bytes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::OutputError;

    /// A writer whose every write fails with `kind`.
    struct Failing(io::ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(self.0.into())
        }
    }

    #[test]
    fn a_failed_write_is_an_output_error_in_every_format() {
        let models = catalog::models().unwrap();
        for format in [Format::Table, Format::Json, Format::Markdown, Format::Csv] {
            for kind in [io::ErrorKind::BrokenPipe, io::ErrorKind::StorageFull] {
                let e = emit(&models, format, &mut Failing(kind)).unwrap_err();
                let o = e.downcast_ref::<OutputError>().expect("an OutputError");
                assert_eq!(o.is_closed_pipe(), kind == io::ErrorKind::BrokenPipe);
            }
        }
    }

    #[test]
    fn csv_is_refused_before_anything_is_written() {
        let src = crate::model_source::load("gpt2").unwrap();
        let inspect = inspect::build(&src);
        let mut out = Vec::new();
        emit(&inspect, Format::Csv, &mut out).unwrap();
        assert!(out.starts_with(b"component,params\n"));
        // a report without a table: an ordinary (user) error, and no bytes
        struct NoTable;
        impl Serialize for NoTable {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_unit()
            }
        }
        impl Report for NoTable {
            fn command(&self) -> &'static str {
                "none"
            }
            fn write_table(&self, _: &mut dyn Write) -> io::Result<()> {
                Ok(())
            }
            fn write_markdown(&self, _: &mut dyn Write) -> io::Result<()> {
                Ok(())
            }
        }
        let mut out = Vec::new();
        let e = emit(&NoTable, Format::Csv, &mut out).unwrap_err();
        assert!(e.downcast_ref::<OutputError>().is_none());
        let u = e
            .downcast_ref::<crate::error::UserError>()
            .expect("a user error");
        assert!(u.message.contains("--format csv") && u.hint.contains("--format table"));
        assert!(out.is_empty());
    }
}
