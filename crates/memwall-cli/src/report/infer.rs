//! `memwall infer`: peak memory of `generate`-style inference (prefill + decode) on one GPU.

use super::table::md_text;
use super::text::{category_name, count, percent, serde_name, Entries, NamedBytes};
use super::{markdown_fit, ModelInfo, Report};
use crate::args::InferSettings;
use anyhow::{Context, Result};
use memwall_core::advice::GpuFit;
use memwall_core::memory::{self, Category, Phase};
use memwall_core::workload::InferWorkload;
use memwall_core::Bytes;
use serde::Serialize;
use std::io::{self, Write};

/// `memwall infer` result.
#[derive(Debug, Serialize)]
pub struct InferReport {
    /// The model.
    pub model: ModelInfo,
    /// The run as simulated.
    pub workload: InferWorkload,
    /// Where the weight bytes come from: `--weights`, the checkpoint's headers (exact), its
    /// quantization_config, or the bf16 default.
    pub weights_from: String,
    /// Whose behaviour is simulated.
    pub runtime_profile: &'static str,
    /// Peak bytes of PyTorch's allocator (`torch.cuda.max_memory_allocated()`).
    pub peak_bytes: u64,
    /// Phase of the peak (prefill or decode).
    pub phase: Phase,
    /// What is alive at the peak, in bytes by category.
    pub at_peak: NamedBytes,
    /// Bytes of the weights.
    pub weights_bytes: u64,
    /// KV cache at its largest (prompt + new tokens − 1 cached per sequence).
    pub kv_cache_bytes: u64,
    /// Peak of the prefill alone.
    pub prefill_peak_bytes: u64,
    /// Fit on the GPU.
    pub gpu: GpuFit,
    /// When the peak does not fit: the OOM doctor's fixes, cheapest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub doctor: Option<super::doctor::DoctorReport>,
}

/// A category as the infer report names it (activations include the KV cache; the loss
/// buffers are the logits).
fn infer_category_name(c: Category) -> &'static str {
    match c {
        Category::Activations => "activations_and_kv_cache",
        Category::LossBuffers => "logits",
        other => category_name(other),
    }
}

/// Runs the inference simulation for `s`.
pub fn build(s: &InferSettings) -> Result<InferReport> {
    let est = memory::fast::simulate_infer(&s.model.desc, &s.workload, s.kernels)
        .context("cannot simulate this run")?;
    let est = crate::weights::apply(est, &s.weights);
    Ok(InferReport {
        model: ModelInfo::new(&s.model, 0),
        workload: s.workload.clone(),
        weights_from: s.weights.from.clone(),
        runtime_profile: est.engine.name(),
        peak_bytes: est.peak_bytes,
        phase: est.phase,
        at_peak: Entries(
            est.at_peak
                .iter()
                .map(|(c, b)| (infer_category_name(*c), *b))
                .collect(),
        ),
        weights_bytes: est.weights_bytes,
        kv_cache_bytes: est.kv_cache_bytes,
        prefill_peak_bytes: est.prefill_peak_bytes,
        gpu: GpuFit::new(s.gpu, est.peak_bytes, s.alloc_margin),
        doctor: None,
    }
    .with_doctor(s))
}

impl InferReport {
    /// Adds the doctor's fixes when the peak does not fit.
    fn with_doctor(mut self, s: &InferSettings) -> Self {
        if !self.gpu.fits {
            self.doctor = doctor(s).ok();
        }
        self
    }
}

impl InferReport {
    fn model_line(&self) -> String {
        format!(
            "{} ({}, {} layers, {} params)",
            self.model.label,
            self.model.model_type,
            self.model.num_layers,
            count(self.model.params_total)
        )
    }

    fn workload_line(&self) -> String {
        let w = &self.workload;
        format!(
            "batch {} · prompt {} · {} new tokens · weights {} · kv {} · attention {}",
            w.batch,
            w.prompt,
            w.new_tokens,
            w.weights.name(),
            serde_name(&w.kv_dtype),
            serde_name(&w.attention),
        )
    }

    fn phase_name(&self) -> &'static str {
        match self.phase {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
            _ => "forward",
        }
    }
}

impl Report for InferReport {
    fn command(&self) -> &'static str {
        "infer"
    }

    fn write_table(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "memwall infer · {}", self.model_line())?;
        if let Some(v) = &self.model.vision {
            writeln!(w, "  {}", v.line())?;
        }
        writeln!(w, "  {}", self.workload_line())?;
        writeln!(w, "  model from: {}", self.model.origin)?;
        writeln!(w, "  weights from: {}", self.weights_from)?;
        writeln!(w)?;
        writeln!(
            w,
            "peak {} during the {} (runtime profile: {})",
            Bytes(self.peak_bytes),
            self.phase_name(),
            self.runtime_profile
        )?;
        for (k, b) in &self.at_peak.0 {
            if *b > 0 {
                writeln!(
                    w,
                    "  {:<26}{:>12}  {:>5.1}%",
                    k,
                    Bytes(*b).to_string(),
                    percent(*b, self.peak_bytes)
                )?;
            }
        }
        writeln!(
            w,
            "  {:<26}{:>12}  (at its largest)",
            "kv_cache",
            Bytes(self.kv_cache_bytes).to_string()
        )?;
        writeln!(
            w,
            "  {:<26}{:>12}",
            "prefill_peak",
            Bytes(self.prefill_peak_bytes).to_string()
        )?;
        let gf = &self.gpu;
        writeln!(
            w,
            "on {} ({}): needs {} of {} (incl. {} CUDA context, {} cuBLAS workspace, {} allocator margin) — {}",
            gf.id,
            gf.name,
            Bytes(gf.required_bytes),
            Bytes(gf.memory_bytes),
            Bytes(gf.cuda_context_bytes),
            Bytes(gf.cublas_workspace_bytes),
            Bytes(gf.alloc_margin_bytes),
            if gf.fits { "fits" } else { "does NOT fit" }
        )?;
        if let Some(d) = &self.doctor {
            d.write_steps(w)?;
        }
        Ok(())
    }

    fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "# memwall infer · {}", md_text(&self.model.label))?;
        writeln!(w)?;
        writeln!(w, "{}  ", md_text(&self.model_line()))?;
        if let Some(v) = &self.model.vision {
            writeln!(w, "{}  ", md_text(&v.line()))?;
        }
        writeln!(w, "{}  ", md_text(&self.workload_line()))?;
        writeln!(w, "Model from: {}  ", md_text(&self.model.origin))?;
        writeln!(w, "Weights from: {}", md_text(&self.weights_from))?;
        writeln!(w)?;
        writeln!(w, "## Peak")?;
        writeln!(w)?;
        writeln!(
            w,
            "**{}** during the {} (runtime profile: {}).",
            Bytes(self.peak_bytes),
            self.phase_name(),
            self.runtime_profile
        )?;
        writeln!(w)?;
        super::table::at_peak_table(&self.at_peak, self.peak_bytes).write_markdown(w)?;
        writeln!(w)?;
        writeln!(
            w,
            "KV cache at its largest: {}; prefill peak: {}.",
            Bytes(self.kv_cache_bytes),
            Bytes(self.prefill_peak_bytes)
        )?;
        writeln!(w)?;
        markdown_fit(w, &self.gpu)
    }
}

/// The inference doctor for `s` (`memwall doctor infer`).
pub fn doctor(s: &InferSettings) -> Result<super::doctor::DoctorReport> {
    let d = memwall_core::plan::doctor::infer(
        &s.model.desc,
        &s.workload,
        s.gpu,
        s.alloc_margin,
        s.kernels,
    )
    .context("cannot run the doctor")?;
    Ok(super::doctor::DoctorReport::new(
        &s.model,
        &s.gpu.id,
        super::doctor::DoctorKind::Infer,
        d,
    ))
}
