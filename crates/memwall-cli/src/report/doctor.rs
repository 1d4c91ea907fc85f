//! `memwall doctor`: where the peak is, and the cheapest fixes in order until one fits. The same
//! report is embedded in `train` and `infer` results that do not fit.

use super::table::{md_text, Align, Table};
use super::text::{category_name, phase_name};
use super::{ModelInfo, Report};
use crate::model_source::ModelSource;
use memwall_core::advice::GpuFit;
use memwall_core::memory::Phase;
use memwall_core::plan::doctor::Doctor;
use memwall_core::Bytes;
use serde::Serialize;
use std::io::{self, Write};

/// Which command the fixes are arguments of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DoctorKind {
    /// `memwall train`.
    Train,
    /// `memwall infer`.
    Infer,
}

/// A line alive at the peak.
#[derive(Debug, Serialize)]
pub struct Line {
    /// Category name (as in `at_peak`).
    pub category: &'static str,
    /// Bytes.
    pub bytes: u64,
}

/// Where the asked configuration peaks.
#[derive(Debug, Serialize)]
pub struct Diagnosis {
    /// Phase of the peak.
    pub phase: Phase,
    /// The largest lines alive at the peak, largest first.
    pub largest: Vec<Line>,
    /// The fit test.
    pub gpu: GpuFit,
}

/// One fix.
#[derive(Debug, Serialize)]
pub struct StepRow {
    /// What changes.
    pub change: String,
    /// Whether it changes the training (or generation) result.
    pub changes_result: bool,
    /// `memwall train` arguments with this and every earlier fix (train doctor only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_args: Option<Vec<String>>,
    /// `memwall infer` arguments with this and every earlier fix (infer doctor only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infer_args: Option<Vec<String>>,
    /// Worst rank's allocator peak after the fix.
    pub peak_bytes: u64,
    /// Everything the GPU must hold after the fix (peak, context, workspace, margin).
    pub required_bytes: u64,
    /// Whether it fits now.
    pub fits: bool,
    /// Seconds per optimizer step after the fix (training only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_s: Option<f64>,
    /// Phase of the new peak.
    pub phase: Phase,
}

/// `memwall doctor` result.
#[derive(Debug, Serialize)]
pub struct DoctorReport {
    /// The model.
    pub model: ModelInfo,
    /// Which command the fixes are for.
    pub kind: DoctorKind,
    /// Whether the asked configuration fits already.
    pub fits: bool,
    /// Whether the fixes reach a configuration that fits.
    pub fixed: bool,
    /// Where it peaks.
    pub diagnosis: Diagnosis,
    /// Fixes, cheapest first, up to the first that fits (empty when it fits).
    pub steps: Vec<StepRow>,
}

impl DoctorReport {
    /// The report of `d` for `model` on `gpu_id`.
    pub fn new(model: &ModelSource, gpu_id: &str, kind: DoctorKind, d: Doctor) -> Self {
        let prefix = |args| {
            let mut a = super::with_model_and_gpu(&model.label, gpu_id, args);
            // the vision-language flags the fix keeps
            if let Some(v) = &model.desc.vision {
                if v.trainable {
                    a.push("--train-vision".to_owned());
                }
                if let Some(n) = v.image_tokens {
                    a.push("--image-tokens".to_owned());
                    a.push(n.to_string());
                }
            }
            a
        };
        let steps = d
            .steps
            .into_iter()
            .map(|s| {
                let args = prefix(s.args);
                StepRow {
                    change: s.change,
                    changes_result: s.changes_result,
                    train_args: (kind == DoctorKind::Train).then(|| args.clone()),
                    infer_args: (kind == DoctorKind::Infer).then_some(args),
                    peak_bytes: s.peak_bytes,
                    required_bytes: s.fit.required_bytes,
                    fits: s.fits,
                    step_s: s.step_s,
                    phase: s.phase,
                }
            })
            .collect();
        DoctorReport {
            model: ModelInfo::new(model, model.counts.total),
            kind,
            fits: d.fits,
            fixed: d.fixed,
            diagnosis: Diagnosis {
                phase: d.diagnosis.phase,
                largest: d
                    .diagnosis
                    .largest
                    .iter()
                    .map(|(c, b)| Line {
                        category: category_name(*c),
                        bytes: *b,
                    })
                    .collect(),
                gpu: d.diagnosis.fit,
            },
            steps,
        }
    }

    fn subject(&self) -> &'static str {
        match self.kind {
            DoctorKind::Train => "train",
            DoctorKind::Infer => "infer",
        }
    }

    fn args(s: &StepRow) -> String {
        s.train_args
            .as_ref()
            .or(s.infer_args.as_ref())
            .map(|a| a.join(" "))
            .unwrap_or_default()
    }

    /// The diagnosis sentence: where it peaks, what dominates, how far it is off.
    fn where_line(&self) -> String {
        let g = &self.diagnosis.gpu;
        let largest: Vec<String> = self
            .diagnosis
            .largest
            .iter()
            .map(|l| format!("{} {}", l.category, Bytes(l.bytes)))
            .collect();
        let state = if g.fits {
            format!(
                "fits: needs {} of {}",
                Bytes(g.required_bytes),
                Bytes(g.memory_bytes)
            )
        } else {
            format!(
                "does NOT fit: needs {} of {}",
                Bytes(g.required_bytes),
                Bytes(g.memory_bytes)
            )
        };
        format!(
            "{state}; the peak is during the {}, dominated by {}",
            phase_name(self.diagnosis.phase),
            largest.join(", ")
        )
    }

    /// Writes the fixes as numbered lines (also used inside `train`/`infer` tables).
    pub fn write_steps(&self, w: &mut dyn Write) -> io::Result<()> {
        if self.steps.is_empty() {
            return Ok(());
        }
        writeln!(w, "fixes, cheapest first (each keeps the ones above it):")?;
        for (i, s) in self.steps.iter().enumerate() {
            let time = s
                .step_s
                .map(|t| format!(", {t:.3} s per step"))
                .unwrap_or_default();
            writeln!(
                w,
                "  {}. {}{} → peak {}, needs {}{} — {}",
                i + 1,
                s.change,
                if s.changes_result {
                    " [changes the result]"
                } else {
                    ""
                },
                Bytes(s.peak_bytes),
                Bytes(s.required_bytes),
                time,
                if s.fits { "fits" } else { "does NOT fit" }
            )?;
        }
        match self.steps.iter().find(|s| s.fits) {
            Some(s) => writeln!(w, "run: memwall {} {}", self.subject(), Self::args(s)),
            None => writeln!(
                w,
                "nothing above fits this GPU: more GPUs (`memwall plan`) or a larger GPU"
            ),
        }
    }
}

impl Report for DoctorReport {
    fn command(&self) -> &'static str {
        "doctor"
    }

    fn write_table(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(
            w,
            "memwall doctor · {} · {} · {}",
            self.model.label,
            self.diagnosis.gpu.id,
            self.subject()
        )?;
        writeln!(w, "{}", self.where_line())?;
        self.write_steps(w)
    }

    fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "# memwall doctor · {}", md_text(&self.model.label))?;
        writeln!(w)?;
        writeln!(w, "{}.", md_text(&self.where_line()))?;
        if let Some(t) = self.csv_table() {
            writeln!(w)?;
            t.write_markdown(w)?;
        }
        Ok(())
    }

    fn csv_table(&self) -> Option<Table> {
        let mut t = Table::new(&[
            ("step", Align::Right),
            ("change", Align::Left),
            ("changes_result", Align::Left),
            ("peak_bytes", Align::Right),
            ("required_bytes", Align::Right),
            ("fits", Align::Left),
            ("step_s", Align::Right),
            ("args", Align::Left),
        ]);
        for (i, s) in self.steps.iter().enumerate() {
            t.push(vec![
                (i + 1).to_string(),
                s.change.clone(),
                s.changes_result.to_string(),
                s.peak_bytes.to_string(),
                s.required_bytes.to_string(),
                s.fits.to_string(),
                s.step_s.map(|x| format!("{x:.4}")).unwrap_or_default(),
                Self::args(s),
            ]);
        }
        Some(t)
    }
}
