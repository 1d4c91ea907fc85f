//! `memwall plan`: the fastest configurations that fit, ranked by tokens/s per GPU.

use super::table::{md_text, Align, Table};
use super::{ModelInfo, Report};
use crate::args::PlanSettings;
use anyhow::{Context, Result};
use memwall_core::layout::{Layout, Offload};
use memwall_core::plan::{self, Plan, SearchSpace};
use memwall_core::Bytes;
use serde::Serialize;
use std::io::{self, IsTerminal, Write};
use std::time::Instant;

/// The cluster and the search as asked.
#[derive(Debug, Serialize)]
pub struct Asked {
    /// GPU id.
    pub gpu: String,
    /// Device memory.
    pub gpu_memory_bytes: u64,
    /// GPUs.
    pub gpus: u64,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// Tokens per sequence.
    pub seq: u64,
    /// Sequences per optimizer step.
    pub global_batch: u64,
    /// Allowed result-changing options.
    pub allow: plan::Allow,
    /// Allocator margin of the fit test.
    pub alloc_margin: f64,
}

/// One plan as printed.
#[derive(Debug, Serialize)]
pub struct PlanRow {
    /// 1 = fastest.
    pub rank: usize,
    /// Always true (kept for the JSON contract).
    pub fits: bool,
    /// Worst rank's allocator peak.
    pub peak_bytes: u64,
    /// Device memory left after the peak, CUDA context, cuBLAS workspace and allocator margin.
    pub headroom_bytes: i128,
    /// Host bytes per node (offload).
    pub host_bytes_per_node: u64,
    /// Seconds per optimizer step.
    pub step_s: f64,
    /// Tokens per second per GPU.
    pub tokens_per_s_per_gpu: f64,
    /// Model FLOPs utilisation.
    pub mfu: f64,
    /// Seconds per component of the step.
    pub breakdown: memwall_core::time::Breakdown,
    /// The layout (`null`: one GPU).
    pub layout: Option<Layout>,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
    /// Micro-batches per optimizer step.
    pub grad_accum: u64,
    /// Tokens per sequence.
    pub seq: u64,
    /// Activation checkpointing.
    pub checkpointing: bool,
    /// Precision.
    pub precision: &'static str,
    /// Optimizer.
    pub optimizer: &'static str,
    /// LoRA rank, when the plan trains adapters.
    pub lora_rank: Option<u64>,
    /// QLoRA.
    pub qlora: bool,
    /// What in the plan changes the training result (empty: the training as asked).
    pub changes_result: Vec<String>,
    /// `memwall train` arguments that reproduce the plan.
    pub train_args: Vec<String>,
}

/// What one more allowance gives when nothing fits.
#[derive(Debug, Serialize)]
pub struct WouldFit {
    /// The `--allow` value.
    pub allow: &'static str,
    /// Fitting configurations with it.
    pub fitting: u64,
    /// The fastest of them, tokens/s per GPU.
    pub best_tokens_per_s_per_gpu: f64,
}

/// `memwall plan` result.
#[derive(Debug, Serialize)]
pub struct PlanReport {
    /// The model.
    pub model: ModelInfo,
    /// What was asked.
    pub asked: Asked,
    /// The fastest fitting plans, fastest first.
    pub plans: Vec<PlanRow>,
    /// Fitting configurations found in all.
    pub fitting: u64,
    /// Configurations simulated or timed.
    pub candidates_evaluated: u64,
    /// The space searched.
    pub search_space: SearchSpace,
    /// When nothing fits: what each further `--allow` would give.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_fit_with: Vec<WouldFit>,
    /// Wall time of the search, seconds (not in the JSON: it varies run to run).
    #[serde(skip)]
    pub elapsed_s: f64,
    /// The plans as the core returned them (for `--emit`).
    #[serde(skip)]
    pub found: Vec<Plan>,
}

fn layout_text(l: Option<&Layout>) -> String {
    let Some(l) = l else {
        return "1 GPU".to_owned();
    };
    let mut parts = vec![l.strategy.name().to_owned()];
    for (name, v) in [("tp", l.tp), ("pp", l.pp), ("cp", l.cp), ("ep", l.ep)] {
        if v > 1 {
            parts.push(format!("{name}{v}"));
        }
    }
    if l.sequence_parallel {
        parts.push("sp".to_owned());
    }
    if l.virtual_stages > 1 {
        parts.push(format!("v{}", l.virtual_stages));
    }
    if l.offload != Offload::None {
        parts.push(format!("offload-{}", l.offload.name()));
    }
    parts.join(" ")
}

fn row(p: Plan, model: &str, gpu: &str) -> PlanRow {
    let train_args = super::with_model_and_gpu(model, gpu, p.train_args);
    PlanRow {
        rank: p.rank,
        fits: p.fits,
        peak_bytes: p.peak_bytes,
        headroom_bytes: p.headroom_bytes,
        host_bytes_per_node: p.host_bytes_per_node,
        step_s: p.step_s,
        tokens_per_s_per_gpu: p.tokens_per_s_per_gpu,
        mfu: p.mfu,
        breakdown: p.breakdown,
        layout: p.layout,
        micro_batch: p.micro_batch,
        grad_accum: p.grad_accum,
        seq: p.seq,
        checkpointing: p.checkpointing,
        precision: p.precision.name(),
        optimizer: p.optimizer.name(),
        lora_rank: p.lora.as_ref().map(|l| l.rank),
        qlora: p.lora.as_ref().is_some_and(|l| l.qlora),
        changes_result: p.changes_result,
        train_args,
    }
}

/// The wall clock, where there is one: none in WebAssembly without WASI (the web page), where
/// `Instant::now` panics.
fn clock() -> Option<Instant> {
    if cfg!(all(target_arch = "wasm32", target_os = "unknown")) {
        None
    } else {
        Some(Instant::now())
    }
}

/// Runs the search for `s`; draws a progress bar on a terminal's stderr once it has run for a
/// second.
pub fn build(s: &PlanSettings) -> Result<PlanReport> {
    let start = clock();
    let tty = io::stderr().is_terminal();
    let mut drawn = false;
    let mut progress = |done: usize, total: usize| {
        let late = start.is_some_and(|t| t.elapsed().as_secs_f64() >= 1.0);
        if !tty || !late || total == 0 {
            return;
        }
        drawn = true;
        let width = 30;
        let filled = done * width / total;
        crate::output::stderr_partial(format_args!(
            "\rsearching [{}{}] {done}/{total} layouts",
            "#".repeat(filled),
            " ".repeat(width - filled)
        ));
    };
    let r = plan::search_with_progress(&s.model.desc, s.gpu, &s.request, &mut progress)
        .context("cannot search the plans")?;
    let q = &s.request;
    // nothing fits: what would each allowance not given yet change?
    let mut would_fit_with = Vec::new();
    if r.plans.is_empty() {
        use memwall_core::names::Named;
        for &item in plan::AllowItem::VALUES {
            if q.allow.contains(item) {
                continue;
            }
            let mut more = q.clone();
            let mut items: Vec<plan::AllowItem> = plan::AllowItem::VALUES
                .iter()
                .copied()
                .filter(|i| q.allow.contains(*i))
                .collect();
            items.push(item);
            more.allow = plan::Allow::from_items(&items);
            more.top = 1;
            let Ok(alt) = plan::search_with_progress(&s.model.desc, s.gpu, &more, &mut progress)
            else {
                continue;
            };
            if let Some(best) = alt.plans.first() {
                would_fit_with.push(WouldFit {
                    allow: item.name(),
                    fitting: alt.fitting,
                    best_tokens_per_s_per_gpu: best.tokens_per_s_per_gpu,
                });
            }
        }
    }
    if drawn {
        crate::output::stderr_partial(format_args!("\r{}\r", " ".repeat(60)));
    }
    Ok(PlanReport {
        model: ModelInfo::new(&s.model, s.model.counts.total),
        asked: Asked {
            gpu: s.gpu.id.clone(),
            gpu_memory_bytes: s.gpu.memory_bytes,
            gpus: q.gpus,
            gpus_per_node: q.gpus_per_node,
            seq: q.seq,
            global_batch: q.global_batch,
            allow: q.allow,
            alloc_margin: q.alloc_margin,
        },
        found: r.plans.clone(),
        plans: r
            .plans
            .into_iter()
            .map(|p| row(p, &s.model.label, &s.gpu.id))
            .collect(),
        fitting: r.fitting,
        candidates_evaluated: r.candidates_evaluated,
        search_space: r.search_space,
        would_fit_with,
        elapsed_s: start.map_or(0.0, |t| t.elapsed().as_secs_f64()),
    })
}

impl PlanReport {
    fn table(&self) -> Table {
        let mut t = Table::new(&[
            ("rank", Align::Right),
            ("tokens/s/GPU", Align::Right),
            ("step s", Align::Right),
            ("MFU", Align::Right),
            ("peak", Align::Right),
            ("headroom", Align::Right),
            ("layout", Align::Left),
            ("mb×acc", Align::Left),
            ("ckpt", Align::Left),
            ("precision", Align::Left),
            ("optimizer", Align::Left),
            ("changes result", Align::Left),
        ]);
        for p in &self.plans {
            t.push(vec![
                p.rank.to_string(),
                format!("{:.0}", p.tokens_per_s_per_gpu),
                format!("{:.3}", p.step_s),
                format!("{:.1}%", p.mfu * 100.0),
                Bytes(p.peak_bytes).to_string(),
                Bytes(u64::try_from(p.headroom_bytes).unwrap_or(0)).to_string(),
                layout_text(p.layout.as_ref()),
                format!("{}×{}", p.micro_batch, p.grad_accum),
                if p.checkpointing { "on" } else { "off" }.to_owned(),
                p.precision.to_owned(),
                p.optimizer.to_owned(),
                if p.changes_result.is_empty() {
                    "no".to_owned()
                } else {
                    p.changes_result.join("; ")
                },
            ]);
        }
        t
    }

    fn header(&self) -> String {
        let a = &self.asked;
        format!(
            "{} on {} × {} ({} per node) · seq {} · global batch {}",
            self.model.label, a.gpus, a.gpu, a.gpus_per_node, a.seq, a.global_batch
        )
    }

    fn searched(&self) -> String {
        let s = &self.search_space;
        format!(
            "searched {} layouts × {} checkpointing × {} precisions × {} optimizers × {} LoRA × {} \
             sequence lengths = {} combinations, each over up to {} micro-batch sizes: {} candidates \
             evaluated, {} fit (allocator margin {:.0}%)",
            s.layouts,
            s.checkpointing,
            s.precisions,
            s.optimizers,
            s.lora,
            s.seqs,
            s.combinations,
            s.micro_batches,
            self.candidates_evaluated,
            self.fitting,
            self.asked.alloc_margin * 100.0
        )
    }
}

impl Report for PlanReport {
    fn command(&self) -> &'static str {
        "plan"
    }

    fn write_table(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "memwall plan · {}", self.header())?;
        writeln!(w, "{}", self.searched())?;
        writeln!(w)?;
        if self.plans.is_empty() {
            writeln!(w, "no configuration fits as asked.")?;
            for x in &self.would_fit_with {
                writeln!(
                    w,
                    "  with --allow {}: {} configurations fit, the fastest at {:.0} tokens/s per GPU",
                    x.allow, x.fitting, x.best_tokens_per_s_per_gpu
                )?;
            }
            if self.would_fit_with.is_empty() {
                writeln!(
                    w,
                    "  no single --allow makes one fit: add GPUs, or pick a larger GPU"
                )?;
            }
        } else {
            let t = self.table();
            let widths: Vec<usize> = (0..t.columns.len())
                .map(|c| {
                    t.rows
                        .iter()
                        .map(|r| r[c].chars().count())
                        .chain(std::iter::once(t.columns[c].0.chars().count()))
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let line = |cells: Vec<&str>| -> String {
                cells
                    .iter()
                    .zip(&widths)
                    .zip(&t.columns)
                    .map(|((c, wd), (_, a))| match a {
                        Align::Right => format!("{c:>wd$}"),
                        Align::Left => format!("{c:<wd$}"),
                    })
                    .collect::<Vec<_>>()
                    .join("  ")
                    .trim_end()
                    .to_owned()
            };
            writeln!(w, "{}", line(t.columns.iter().map(|(c, _)| *c).collect()))?;
            for r in &t.rows {
                writeln!(w, "{}", line(r.iter().map(String::as_str).collect()))?;
            }
            if let Some(p) = self.plans.first() {
                writeln!(w)?;
                writeln!(w, "fastest: memwall train {}", p.train_args.join(" "))?;
            }
        }
        writeln!(w, "(search took {:.2} s)", self.elapsed_s)
    }

    fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "# memwall plan · {}", md_text(&self.header()))?;
        writeln!(w)?;
        writeln!(w, "{}.", md_text(&self.searched()))?;
        writeln!(w)?;
        if self.plans.is_empty() {
            return writeln!(w, "No configuration fits.");
        }
        self.table().write_markdown(w)?;
        if let Some(p) = self.plans.first() {
            writeln!(w)?;
            writeln!(w, "```sh\nmemwall train {}\n```", p.train_args.join(" "))?;
        }
        Ok(())
    }

    fn csv_table(&self) -> Option<Table> {
        Some(self.table())
    }
}
