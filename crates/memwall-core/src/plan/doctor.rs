//! The OOM doctor: where the peak is, and the cheapest fixes in order until one fits.
//!
//! Training fixes, cumulative, cheapest first — the order practitioners apply them (the Hugging
//! Face "Methods and tools for efficient training on a single GPU" guide orders them the same
//! way: batch size and gradient accumulation, gradient checkpointing, mixed precision,
//! optimizer choice, then DeepSpeed ZeRO / offload, then PEFT):
//! 0. a loop that keeps the model output (`--loop keep-outputs`) drops it (same result, no
//!    compute: the logits and KV cache no longer outlive the forward);
//! 1. a smaller micro-batch with more accumulation (same global batch, same result);
//! 2. activation checkpointing (same result, about a third more compute);
//! 3. lower precision (`fp32` → `amp-bf16`; `amp-*` → `bf16` changes the result where no fp32
//!    master is kept);
//! 4. an 8-bit optimizer (changes the result);
//! 5. ZeRO/FSDP sharding when the job has more than one GPU;
//! 6. offload of the optimizer (and parameters) to host memory;
//! 7. LoRA, then QLoRA (change the result: only adapters train);
//! 8. a shorter sequence (changes the result).
//!
//! Inference fixes: a smaller batch, a shorter context, an 8-bit KV cache, quantised weights
//! (8-bit, then 4-bit NF4).

use super::search::default_lora;
use super::{keeps_master, memory_of, step_time, train_args, Fit, Memory};
use crate::error::CoreError;
use crate::gpu::GpuSpec;
use crate::layout::{Layout, Offload, Strategy};
use crate::memory::{self, Category, Kernels, Phase};
use crate::model::ModelDesc;
use crate::optimizer::Optimizer;
use crate::workload::{InferWorkload, KvDtype, Precision, TrainWorkload, WeightFormat};
use serde::Serialize;

/// One fix and what it gives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// What changes, in words.
    pub change: String,
    /// Whether this step changes the training (or generation) result.
    pub changes_result: bool,
    /// The command's arguments with this and every earlier fix applied (without `--model` and
    /// `--gpu`).
    pub args: Vec<String>,
    /// Worst rank's allocator peak after the fix.
    pub peak_bytes: u64,
    /// The fit test after the fix.
    pub fit: Fit,
    /// Whether it fits now.
    pub fits: bool,
    /// Seconds per optimizer step after the fix (training only).
    pub step_s: Option<f64>,
    /// Phase of the new peak.
    pub phase: Phase,
}

/// Where the peak is and what dominates it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    /// Phase of the peak.
    pub phase: Phase,
    /// The largest lines alive at the peak, largest first (at most three).
    pub largest: Vec<(Category, u64)>,
    /// The fit test of the asked configuration.
    pub fit: Fit,
}

/// The doctor's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Doctor {
    /// Whether the asked configuration fits already.
    pub fits: bool,
    /// Whether the last step fits (the fixes found a configuration that fits).
    pub fixed: bool,
    /// Where its peak is.
    pub diagnosis: Diagnosis,
    /// The fixes tried, cheapest first, up to the first that fits (empty when it fits).
    pub steps: Vec<Step>,
}

fn diagnose(m: &Memory, fit: Fit) -> Diagnosis {
    let mut largest: Vec<(Category, u64)> =
        m.at_peak.iter().copied().filter(|(_, b)| *b > 0).collect();
    largest.sort_by_key(|e| std::cmp::Reverse(e.1));
    largest.truncate(3);
    Diagnosis {
        phase: m.phase,
        largest,
        fit,
    }
}

#[derive(Debug, Clone)]
struct TrainState {
    w: TrainWorkload,
    layout: Option<Layout>,
}

/// The training doctor for `w` on `layout` (`None`: one GPU) on `gpu`. A fix that does not
/// lower the peak (checkpointing when the peak is in the optimizer step, say) is skipped, not
/// applied.
pub fn train(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: Option<&Layout>,
    gpu: &GpuSpec,
    alloc_margin: f64,
    kernels: Kernels,
) -> Result<Doctor, CoreError> {
    super::check_alloc_margin(alloc_margin)?;
    let m = memory_of(model, w, layout, kernels)?;
    let fit = Fit::new(gpu, m.peak_bytes, alloc_margin);
    let fits = fit.fits;
    let diagnosis = diagnose(&m, fit);
    if fits {
        return Ok(done(true, diagnosis, Vec::new()));
    }
    let mut t = Treatment {
        model,
        gpu,
        alloc_margin,
        kernels,
        cur: TrainState {
            w: w.clone(),
            layout: layout.cloned(),
        },
        peak: m.peak_bytes,
        steps: Vec::new(),
    };
    // 0. a loop that keeps the model output: drop it (same result, no compute)
    if t.cur.w.step_options.keeps_outputs() {
        let mut probe = t.cur.clone();
        probe.w.step_options.outputs = crate::workload::TrainLoop::Trainer;
        if t.try_fix(
            probe,
            "drop the model output before backward: `loss = model(**batch).loss`, or `del outputs` \
             after taking the loss (the HF Trainer's loop; logits and KV cache no longer outlive the forward)"
                .into(),
            false,
        ) {
            return Ok(t.finish(diagnosis));
        }
    }
    // 1. smaller micro-batch, more accumulation: the largest divisor of the batch that fits,
    // else micro-batch 1
    if t.cur.w.batch > 1 {
        let global = t.cur.w.batch * t.cur.w.grad_accum;
        let divisors: Vec<u64> = (1..t.cur.w.batch)
            .rev()
            .filter(|d| t.cur.w.batch.is_multiple_of(*d))
            .collect();
        let mut chosen: Option<(TrainState, Step)> = None;
        for b in divisors {
            let mut probe = t.cur.clone();
            probe.w.batch = b;
            probe.w.grad_accum = global / b;
            let text = format!(
                "micro-batch {b} with {} accumulation steps (same {global} sequences per step)",
                probe.w.grad_accum
            );
            if let Some(step) = t.evaluate(&probe, text, false) {
                let fits = step.fits;
                chosen = Some((probe, step));
                if fits {
                    break;
                }
            }
        }
        if let Some((probe, step)) = chosen {
            if t.accept(probe, step) {
                return Ok(t.finish(diagnosis));
            }
        }
    }
    // 2. activation checkpointing
    if !t.cur.w.checkpointing {
        let mut probe = t.cur.clone();
        probe.w.checkpointing = true;
        if t.try_fix(
            probe,
            "activation checkpointing per decoder layer (about 1/3 more compute)".into(),
            false,
        ) {
            return Ok(t.finish(diagnosis));
        }
    }
    // 3. precision
    let lower = match t.cur.w.precision {
        Precision::Fp32 => Some((Precision::AmpBf16, false)),
        Precision::AmpBf16 | Precision::AmpFp16 => {
            Some((Precision::Bf16, !keeps_master(t.cur.layout.as_ref())))
        }
        Precision::Bf16 | Precision::Fp16 => None,
    };
    if let Some((p, changes)) = lower {
        let mut probe = t.cur.clone();
        let text = format!(
            "precision {} instead of {}",
            p.name(),
            probe.w.precision.name()
        );
        probe.w.precision = p;
        if t.try_fix(probe, text, changes) {
            return Ok(t.finish(diagnosis));
        }
    }
    // 4. 8-bit optimizer (where the engine runs it)
    if matches!(
        t.cur.w.optimizer,
        Optimizer::Adamw | Optimizer::AdamwFused | Optimizer::AdamwForloop
    ) {
        let mut probe = t.cur.clone();
        probe.w.optimizer = Optimizer::Adamw8bit;
        if runs(&probe)
            && t.try_fix(
                probe,
                "8-bit AdamW (bitsandbytes) instead of 32-bit states".into(),
                true,
            )
        {
            return Ok(t.finish(diagnosis));
        }
    }
    // 5. sharding, when the job has several GPUs: the first strategy (cheapest first) that fits,
    // else the deepest
    if let Some(l) = t.cur.layout.clone() {
        if l.gpus > 1 && !l.model_parallel() {
            let order = [
                Strategy::Zero1,
                Strategy::Zero2,
                Strategy::FsdpFull,
                Strategy::Zero3,
            ];
            let start = order
                .iter()
                .position(|x| *x == l.strategy)
                .map_or(0, |i| i + 1);
            let mut chosen: Option<(TrainState, Step)> = None;
            for &st in &order[start..] {
                let mut nl = l.clone();
                nl.strategy = st;
                nl.offload = Offload::None;
                let Some((probe, note)) = on_engine(&t.cur, nl) else {
                    continue;
                };
                let text = format!("shard with {} over the {} GPUs{note}", st.name(), l.gpus);
                if let Some(step) = t.evaluate(&probe, text, false) {
                    let fits = step.fits;
                    chosen = Some((probe, step));
                    if fits {
                        break;
                    }
                }
            }
            if let Some((probe, step)) = chosen {
                if t.accept(probe, step) {
                    return Ok(t.finish(diagnosis));
                }
            }
        }
    }
    // 6. offload: the optimizer first, then parameters too
    let base = t.cur.layout.clone().unwrap_or_else(|| Layout {
        strategy: Strategy::Zero2,
        ..Layout::single()
    });
    if !base.model_parallel() {
        let optimizer_only = if base.strategy.is_fsdp() {
            (base.strategy, Offload::Both, "offload parameters, gradients and optimizer states to CPU memory (FSDP2 CPUOffloadPolicy)")
        } else {
            (
                if base.strategy == Strategy::Zero3 {
                    Strategy::Zero3
                } else {
                    Strategy::Zero2
                },
                Offload::Optimizer,
                "offload the optimizer states to CPU memory (DeepSpeed ZeRO-Offload)",
            )
        };
        for (strategy, offload, text) in [
            optimizer_only,
            (
                Strategy::Zero3,
                Offload::Both,
                "offload parameters and optimizer states to CPU memory (DeepSpeed ZeRO-3 offload)",
            ),
        ] {
            let mut nl = base.clone();
            nl.strategy = strategy;
            nl.offload = offload;
            if t.cur.layout.as_ref() == Some(&nl) {
                continue;
            }
            let Some((probe, note)) = on_engine(&t.cur, nl) else {
                continue;
            };
            if t.try_fix(probe, format!("{text}{note}"), false) {
                return Ok(t.finish(diagnosis));
            }
        }
    }
    // 7. LoRA, then QLoRA, on the asked layout (PEFT runs on one GPU or DDP)
    if t.cur.w.lora.is_none() {
        let lora_layout = layout.cloned().filter(|l| l.gpus > 1).map(|mut l| {
            l.strategy = Strategy::Ddp;
            l.offload = Offload::None;
            l
        });
        let mut lora = default_lora(model);
        for qlora in [false, true] {
            lora.qlora = qlora;
            let mut probe = TrainState {
                w: t.cur.w.clone(),
                layout: lora_layout.clone(),
            };
            probe.w.lora = Some(lora.clone());
            if !runs(&probe) {
                probe.w.optimizer = Optimizer::AdamwFused;
            }
            let text = if qlora {
                format!("QLoRA r={} (a 4-bit NF4 base)", lora.rank)
            } else {
                format!(
                    "LoRA r={} on {} (only the adapters train)",
                    lora.rank,
                    lora.targets.join(",")
                )
            };
            if runs(&probe) && t.try_fix(probe, text, true) {
                return Ok(t.finish(diagnosis));
            }
        }
    }
    // 8. shorter sequence, never below what the sequence's image tokens need
    let image_tokens = model
        .vision
        .as_ref()
        .map_or(0, |v| v.image_sequence_tokens());
    while t.cur.w.seq > 256 && u128::from(t.cur.w.seq / 2) >= image_tokens {
        let mut probe = t.cur.clone();
        probe.w.seq /= 2;
        let text = format!("sequence {} tokens", probe.w.seq);
        let before = t.steps.len();
        if t.try_fix(probe, text, true) || t.steps.len() == before {
            // it fits, or the shorter sequence did not lower the peak
            break;
        }
    }
    Ok(t.finish(diagnosis))
}

/// Whether the engine of `s` runs its optimizer, precision and adapters.
fn runs(s: &TrainState) -> bool {
    crate::engine::Engine::resolve(s.layout.as_ref())
        .check(&s.w, s.layout.as_ref())
        .is_ok()
}

/// `cur` moved onto `layout`; a sharded engine that does not run the 8-bit (or another)
/// optimizer gets its own fused AdamW, and the returned note says so.
fn on_engine(cur: &TrainState, layout: Layout) -> Option<(TrainState, &'static str)> {
    if layout.validate().is_err() {
        return None;
    }
    let mut probe = TrainState {
        w: cur.w.clone(),
        layout: Some(layout),
    };
    if runs(&probe) {
        return Some((probe, ""));
    }
    probe.w.optimizer = Optimizer::AdamwFused;
    runs(&probe).then_some((
        probe,
        " (its engine runs its own AdamW: the 8-bit optimizer is dropped)",
    ))
}

/// The doctor's running state: the configuration so far, its peak, the steps taken.
struct Treatment<'a> {
    model: &'a ModelDesc,
    gpu: &'a GpuSpec,
    alloc_margin: f64,
    kernels: Kernels,
    cur: TrainState,
    peak: u64,
    steps: Vec<Step>,
}

impl Treatment<'_> {
    fn evaluate(&self, s: &TrainState, change: String, changes_result: bool) -> Option<Step> {
        let m = memory_of(self.model, &s.w, s.layout.as_ref(), self.kernels).ok()?;
        let fit = Fit::new(self.gpu, m.peak_bytes, self.alloc_margin);
        Some(Step {
            change,
            changes_result,
            args: train_args(&s.w, s.layout.as_ref()),
            peak_bytes: m.peak_bytes,
            fits: fit.fits,
            fit,
            step_s: step_time(self.model, &s.w, s.layout.as_ref(), self.gpu)
                .ok()
                .map(|t| t.step_s),
            phase: m.phase,
        })
    }

    /// Takes `step` (reached by `s`) when it lowers the peak; true when it fits.
    fn accept(&mut self, s: TrainState, step: Step) -> bool {
        if step.peak_bytes >= self.peak {
            return false;
        }
        self.peak = step.peak_bytes;
        self.cur = s;
        let fits = step.fits;
        self.steps.push(step);
        fits
    }

    fn try_fix(&mut self, s: TrainState, change: String, changes_result: bool) -> bool {
        match self.evaluate(&s, change, changes_result) {
            Some(step) => self.accept(s, step),
            None => false,
        }
    }

    fn finish(self, diagnosis: Diagnosis) -> Doctor {
        done(false, diagnosis, self.steps)
    }
}

fn push(steps: &mut Vec<Step>, step: Option<Step>) -> bool {
    match step {
        Some(s) => {
            let fits = s.fits;
            steps.push(s);
            fits
        }
        None => false,
    }
}

fn done(fits: bool, diagnosis: Diagnosis, steps: Vec<Step>) -> Doctor {
    Doctor {
        fits,
        fixed: steps.last().is_some_and(|s| s.fits),
        diagnosis,
        steps,
    }
}

/// The `memwall infer` arguments (without `--model`/`--gpu`) of `w`.
pub fn infer_args(w: &InferWorkload) -> Vec<String> {
    let mut a = vec![
        "--batch".to_owned(),
        w.batch.to_string(),
        "--prompt".to_owned(),
        w.prompt.to_string(),
        "--new-tokens".to_owned(),
        w.new_tokens.to_string(),
        "--weights".to_owned(),
        w.weights.name(),
        "--attention".to_owned(),
        w.attention.name().to_owned(),
    ];
    if w.kv_dtype != KvDtype::Auto {
        a.push("--kv-dtype".to_owned());
        a.push(w.kv_dtype.name().to_owned());
    }
    a
}

/// The inference doctor for `w` on one `gpu`.
pub fn infer(
    model: &ModelDesc,
    w: &InferWorkload,
    gpu: &GpuSpec,
    alloc_margin: f64,
    kernels: Kernels,
) -> Result<Doctor, CoreError> {
    super::check_alloc_margin(alloc_margin)?;
    let run = |w: &InferWorkload| -> Result<(Memory, Fit), CoreError> {
        let e = memory::fast::simulate_infer(model, w, kernels)?;
        let m = Memory {
            peak_bytes: e.peak_bytes,
            phase: e.phase,
            at_peak: e.at_peak.clone(),
            host_bytes_per_node: 0,
        };
        let fit = Fit::new(gpu, e.peak_bytes, alloc_margin);
        Ok((m, fit))
    };
    let (m, fit) = run(w)?;
    let fits = fit.fits;
    let diagnosis = diagnose(&m, fit);
    if fits {
        return Ok(done(true, diagnosis, Vec::new()));
    }
    let mut cur = w.clone();
    let mut steps: Vec<Step> = Vec::new();
    let attempt = |cur: &InferWorkload, change: String, changes_result: bool| -> Option<Step> {
        let (m, fit) = run(cur).ok()?;
        Some(Step {
            change,
            changes_result,
            args: infer_args(cur),
            peak_bytes: m.peak_bytes,
            fits: fit.fits,
            fit,
            step_s: None,
            phase: m.phase,
        })
    };
    // 1. smaller batch: the largest of batch/2, batch/4, … that fits, else 1
    if cur.batch > 1 {
        let mut chosen: Option<(InferWorkload, Step)> = None;
        let mut b = cur.batch;
        while b > 1 {
            b = b.div_ceil(2);
            let mut probe = cur.clone();
            probe.batch = b;
            if let Some(step) = attempt(
                &probe,
                format!("batch {b} (fewer sequences at once)"),
                false,
            ) {
                let fits = step.fits;
                chosen = Some((probe, step));
                if fits {
                    break;
                }
            }
        }
        if let Some((probe, step)) = chosen {
            cur = probe;
            if push(&mut steps, Some(step)) {
                return Ok(done(false, diagnosis, steps));
            }
        }
    }
    // 2. an 8-bit KV cache
    if matches!(cur.kv_dtype, KvDtype::Auto | KvDtype::Bf16 | KvDtype::Fp16) {
        cur.kv_dtype = KvDtype::Fp8;
        if push(&mut steps, attempt(&cur, "fp8 KV cache".into(), true)) {
            return Ok(done(false, diagnosis, steps));
        }
    }
    // 3. quantised weights
    for wf in [WeightFormat::Int8, WeightFormat::Nf4 { double_quant: true }] {
        if matches!(
            cur.weights,
            WeightFormat::Bf16 | WeightFormat::Fp16 | WeightFormat::Fp32 | WeightFormat::Int8
        ) && cur.weights != wf
        {
            cur.weights = wf;
            if push(
                &mut steps,
                attempt(&cur, format!("{} weights", wf.name()), true),
            ) {
                return Ok(done(false, diagnosis, steps));
            }
        }
    }
    // 4. a shorter context, never below what the prompt's image tokens need
    let image_tokens = model
        .vision
        .as_ref()
        .map_or(0, |v| v.image_sequence_tokens());
    while cur.prompt > 256 && u128::from(cur.prompt / 2) >= image_tokens {
        cur.prompt /= 2;
        if push(
            &mut steps,
            attempt(&cur, format!("prompt {} tokens", cur.prompt), true),
        ) {
            break;
        }
    }
    Ok(done(false, diagnosis, steps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::test_model as llama2_7b;

    #[test]
    fn seven_b_full_fine_tune_on_40gb_follows_the_order_until_it_fits() {
        let gpu = crate::advice::tests::gpu("a100-40gb", 40, "ampere");
        let w = TrainWorkload::new(4, 2048);
        let d = train(&llama2_7b(), &w, None, &gpu, 0.05, Kernels::Cuda).unwrap();
        assert!(!d.diagnosis.fit.fits);
        assert!(!d.steps.is_empty());
        assert!(d.steps.last().unwrap().fits, "{:#?}", d.steps);
        assert!(d.steps[..d.steps.len() - 1].iter().all(|s| !s.fits));
        assert!(
            d.steps[0].change.starts_with("micro-batch"),
            "{}",
            d.steps[0].change
        );
        // the seeds' order, and every step lowers the peak
        let order = [
            "micro-batch",
            "activation checkpointing",
            "precision",
            "8-bit AdamW",
            "shard",
            "offload",
            "LoRA",
            "QLoRA",
            "sequence",
        ];
        let rank = |c: &str| order.iter().position(|p| c.starts_with(p)).unwrap();
        for p in d.steps.windows(2) {
            assert!(rank(&p[0].change) < rank(&p[1].change), "{:#?}", d.steps);
            assert!(p[1].peak_bytes < p[0].peak_bytes, "{:#?}", d.steps);
        }
        assert!(d.fixed && !d.fits);
    }

    #[test]
    fn a_loop_that_keeps_the_outputs_drops_them_first() {
        let gpu = crate::advice::tests::gpu("a100-40gb", 40, "ampere");
        let mut w = TrainWorkload::new(4, 2048);
        w.step_options.outputs = crate::workload::TrainLoop::KeepOutputs;
        let d = train(&llama2_7b(), &w, None, &gpu, 0.05, Kernels::Cuda).unwrap();
        assert!(
            d.steps[0].change.starts_with("drop the model output"),
            "{:#?}",
            d.steps
        );
        assert!(d.steps[0].args.iter().all(|a| a != "--loop"));
        assert!(d.steps[1].change.starts_with("micro-batch"));
    }

    #[test]
    fn a_fitting_config_needs_no_steps() {
        let gpu = crate::advice::tests::gpu("h100", 80, "hopper");
        let mut w = TrainWorkload::new(1, 512);
        w.lora = Some(default_lora(&llama2_7b()));
        let d = train(&llama2_7b(), &w, None, &gpu, 0.05, Kernels::Cuda).unwrap();
        assert!(d.fits && d.steps.is_empty());
    }

    #[test]
    fn inference_doctor_shrinks_the_batch_first() {
        let gpu = crate::advice::tests::gpu("l4", 24, "ada");
        let w = InferWorkload {
            batch: 64,
            prompt: 4096,
            new_tokens: 256,
            attention: crate::workload::AttentionImpl::Sdpa,
            weights: WeightFormat::Bf16,
            kv_dtype: KvDtype::Auto,
            moe_decode_batched: true,
        };
        let d = infer(&llama2_7b(), &w, &gpu, 0.05, Kernels::Cuda).unwrap();
        assert!(!d.diagnosis.fit.fits);
        assert!(
            d.steps[0].change.starts_with("batch "),
            "{}",
            d.steps[0].change
        );
        assert!(d.steps[0].fit.required_bytes < d.diagnosis.fit.required_bytes);
    }

    #[test]
    fn a_shorter_prompt_keeps_room_for_the_image_tokens() {
        use crate::model::{VisionForward, VisionKind, VisionTower};
        // a GPU nothing fits: the prompt is halved down to 256 tokens, but with 2,448 image
        // tokens (17 Llama 4 tiles, 19 separators) never below 2,467
        let gpu = crate::advice::tests::gpu("l4", 2, "ada");
        let w = InferWorkload {
            batch: 1,
            prompt: 2600,
            new_tokens: 16,
            attention: crate::workload::AttentionImpl::Sdpa,
            weights: WeightFormat::Bf16,
            kv_dtype: KvDtype::Auto,
            moe_decode_batched: true,
        };
        let prompts = |m: &ModelDesc| -> Vec<String> {
            let d = infer(m, &w, &gpu, 0.05, Kernels::Cuda).unwrap();
            d.steps
                .iter()
                .filter(|s| s.change.starts_with("prompt "))
                .map(|s| s.change.clone())
                .collect()
        };
        let text = llama2_7b();
        assert!(prompts(&text).contains(&"prompt 1300 tokens".to_string()));
        let mut m = text.clone();
        m.vision = Some(VisionTower {
            model_type: "llama4_vision_model".into(),
            encoder_params: 1000,
            projector_params: 100,
            trainable: false,
            linears: Vec::new(),
            forward: Some(VisionForward {
                patch_in: 3 * 14 * 14,
                width: 1408,
                heads: 16,
                mlp: 5632,
                depth: 2,
                merge: 2,
                out: 4096,
                kind: VisionKind::Llama4,
                window: 0,
                full_blocks: Vec::new(),
                per_image: 144,
                adapter: 4096,
            }),
            image_tokens: Some(2448),
        });
        assert_eq!(m.vision.as_ref().unwrap().image_sequence_tokens(), 2467);
        assert!(prompts(&m).is_empty(), "{:?}", prompts(&m));
    }
}
