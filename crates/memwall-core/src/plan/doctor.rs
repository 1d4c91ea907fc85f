//! The OOM doctor: where the peak is, and the cheapest fixes in order until one fits.
//!
//! Training fixes, cumulative, cheapest first — the order practitioners apply them (the Hugging
//! Face "Methods and tools for efficient training on a single GPU" guide orders them the same
//! way: batch size and gradient accumulation, gradient checkpointing, mixed precision,
//! optimizer choice, then DeepSpeed ZeRO / offload, then PEFT):
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

struct TrainState {
    w: TrainWorkload,
    layout: Option<Layout>,
}

/// The training doctor for `w` on `layout` (`None`: one GPU) on `gpu`.
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
    let diagnosis = diagnose(&m, fit);
    if fit.fits {
        return Ok(Doctor {
            fits: true,
            diagnosis,
            steps: Vec::new(),
        });
    }
    let mut s = TrainState {
        w: w.clone(),
        layout: layout.cloned(),
    };
    let mut steps: Vec<Step> = Vec::new();
    let try_step = |s: &TrainState, change: String, changes_result: bool| -> Option<Step> {
        let m = memory_of(model, &s.w, s.layout.as_ref(), kernels).ok()?;
        let fit = Fit::new(gpu, m.peak_bytes, alloc_margin);
        Some(Step {
            change,
            changes_result,
            args: train_args(&s.w, s.layout.as_ref()),
            peak_bytes: m.peak_bytes,
            fit,
            fits: fit.fits,
            step_s: step_time(model, &s.w, s.layout.as_ref(), gpu)
                .ok()
                .map(|t| t.step_s),
            phase: m.phase,
        })
    };
    // 1. smaller micro-batch, more accumulation
    if s.w.batch > 1 {
        let global = s.w.batch * s.w.grad_accum;
        let mut last: Option<(TrainWorkload, Step)> = None;
        let mut b = s.w.batch;
        while b > 1 {
            // the largest divisor of the batch below b keeps micro-batch × accumulation equal
            b = (1..b)
                .rev()
                .find(|d| s.w.batch.is_multiple_of(*d))
                .unwrap_or(1);
            let mut w = s.w.clone();
            w.batch = b;
            w.grad_accum = global / b;
            let probe = TrainState {
                w: w.clone(),
                layout: s.layout.clone(),
            };
            let change = format!(
                "micro-batch {b} with {} accumulation steps (same {global} sequences per step)",
                w.grad_accum
            );
            if let Some(step) = try_step(&probe, change, false) {
                let fits = step.fits;
                last = Some((w, step));
                if fits {
                    break;
                }
            }
        }
        if let Some((w, step)) = last {
            s.w = w;
            let fits = step.fits;
            steps.push(step);
            if fits {
                return Ok(done(diagnosis, steps));
            }
        }
    }
    // 2. activation checkpointing
    if !s.w.checkpointing {
        s.w.checkpointing = true;
        if push(
            &mut steps,
            try_step(
                &s,
                "activation checkpointing per decoder layer (about 1/3 more compute)".into(),
                false,
            ),
        ) {
            return Ok(done(diagnosis, steps));
        }
    }
    // 3. precision
    let lower = match s.w.precision {
        Precision::Fp32 => Some((Precision::AmpBf16, false)),
        Precision::AmpBf16 | Precision::AmpFp16 => {
            Some((Precision::Bf16, !keeps_master(s.layout.as_ref())))
        }
        Precision::Bf16 | Precision::Fp16 => None,
    };
    if let Some((p, changes)) = lower {
        let before = s.w.precision;
        s.w.precision = p;
        let text = format!("precision {} instead of {}", p.name(), before.name());
        if push(&mut steps, try_step(&s, text, changes)) {
            return Ok(done(diagnosis, steps));
        }
    }
    // 4. 8-bit optimizer (where the engine runs it)
    if matches!(
        s.w.optimizer,
        Optimizer::Adamw | Optimizer::AdamwFused | Optimizer::AdamwForloop
    ) {
        let mut w = s.w.clone();
        w.optimizer = Optimizer::Adamw8bit;
        if crate::engine::Engine::resolve(s.layout.as_ref())
            .check(&w, s.layout.as_ref())
            .is_ok()
        {
            s.w = w;
            if push(
                &mut steps,
                try_step(
                    &s,
                    "8-bit AdamW (bitsandbytes) instead of 32-bit states".into(),
                    true,
                ),
            ) {
                return Ok(done(diagnosis, steps));
            }
        }
    }
    // 5. sharding, when the job has several GPUs
    if let Some(l) = s.layout.clone() {
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
            let mut last: Option<(Layout, TrainWorkload, Step)> = None;
            for &st in &order[start..] {
                let mut nl = l.clone();
                nl.strategy = st;
                nl.offload = Offload::None;
                if nl.validate().is_err() {
                    continue;
                }
                let mut w = s.w.clone();
                if crate::engine::Engine::resolve(Some(&nl))
                    .check(&w, Some(&nl))
                    .is_err()
                {
                    // sharded engines run their own AdamW: fall back from 8-bit
                    w.optimizer = Optimizer::AdamwFused;
                    if crate::engine::Engine::resolve(Some(&nl))
                        .check(&w, Some(&nl))
                        .is_err()
                    {
                        continue;
                    }
                }
                let probe = TrainState {
                    w: w.clone(),
                    layout: Some(nl.clone()),
                };
                let text = format!("shard with {} over the {} GPUs", st.name(), l.gpus);
                if let Some(step) = try_step(&probe, text, false) {
                    let fits = step.fits;
                    last = Some((nl, w, step));
                    if fits {
                        break;
                    }
                }
            }
            if let Some((nl, w, step)) = last {
                s.layout = Some(nl);
                s.w = w;
                if push(&mut steps, Some(step)) {
                    return Ok(done(diagnosis, steps));
                }
            }
        }
    }
    // 6. offload
    {
        let base = s.layout.clone().unwrap_or_else(|| Layout {
            strategy: Strategy::Zero2,
            ..Layout::single()
        });
        if !base.model_parallel() {
            for (strategy, offload, text) in [
                (
                    if base.strategy.is_fsdp() { base.strategy } else if base.strategy == Strategy::Zero3 { Strategy::Zero3 } else { Strategy::Zero2 },
                    if base.strategy.is_fsdp() { Offload::Both } else { Offload::Optimizer },
                    "offload the optimizer states to CPU memory (DeepSpeed ZeRO-Offload; FSDP2 CPUOffloadPolicy moves parameters too)",
                ),
                (Strategy::Zero3, Offload::Both, "offload parameters and optimizer states to CPU memory (ZeRO-3 offload)"),
            ] {
                let mut nl = base.clone();
                nl.strategy = strategy;
                nl.offload = offload;
                if nl.validate().is_err() || s.layout.as_ref() == Some(&nl) {
                    continue;
                }
                let mut w = s.w.clone();
                if crate::engine::Engine::resolve(Some(&nl)).check(&w, Some(&nl)).is_err() {
                    w.optimizer = Optimizer::AdamwFused;
                    if crate::engine::Engine::resolve(Some(&nl)).check(&w, Some(&nl)).is_err() {
                        continue;
                    }
                }
                let probe = TrainState { w: w.clone(), layout: Some(nl.clone()) };
                if let Some(step) = try_step(&probe, text.to_owned(), false) {
                    let fits = step.fits;
                    s.layout = Some(nl);
                    s.w = w;
                    steps.push(step);
                    if fits {
                        return Ok(done(diagnosis, steps));
                    }
                }
            }
        }
    }
    // 7. LoRA, then QLoRA (on the original engine: PEFT runs on one GPU or DDP)
    if s.w.lora.is_none() {
        let mut w = s.w.clone();
        let mut lora = default_lora(model);
        w.lora = Some(lora.clone());
        let layout = layout.cloned().filter(|l| l.gpus > 1).map(|mut l| {
            l.strategy = Strategy::Ddp;
            l.offload = Offload::None;
            l
        });
        let probe = TrainState {
            w: w.clone(),
            layout: layout.clone(),
        };
        let text = format!(
            "LoRA r={} on {} (only the adapters train)",
            lora.rank,
            lora.targets.join(",")
        );
        if let Some(step) = try_step(&probe, text, true) {
            let fits = step.fits;
            steps.push(step);
            if fits {
                return Ok(done(diagnosis, steps));
            }
        }
        lora.qlora = true;
        w.lora = Some(lora.clone());
        let probe = TrainState {
            w: w.clone(),
            layout: layout.clone(),
        };
        if let Some(step) = try_step(
            &probe,
            format!("QLoRA r={} (4-bit NF4 base)", lora.rank),
            true,
        ) {
            let fits = step.fits;
            s.w = w;
            s.layout = layout;
            steps.push(step);
            if fits {
                return Ok(done(diagnosis, steps));
            }
        }
    }
    // 8. shorter sequence
    while s.w.seq > 256 {
        s.w.seq /= 2;
        if let Some(step) = try_step(&s, format!("sequence {} tokens", s.w.seq), true) {
            let fits = step.fits;
            steps.push(step);
            if fits {
                break;
            }
        }
    }
    Ok(done(diagnosis, steps))
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

fn done(diagnosis: Diagnosis, steps: Vec<Step>) -> Doctor {
    Doctor {
        fits: steps.last().is_some_and(|s| s.fits),
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
        let e = memory::simulate_infer(model, w, kernels)?;
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
    let diagnosis = diagnose(&m, fit);
    if fit.fits {
        return Ok(Doctor {
            fits: true,
            diagnosis,
            steps: Vec::new(),
        });
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
            fit,
            fits: fit.fits,
            step_s: None,
            phase: m.phase,
        })
    };
    // 1. smaller batch (halve, down to 1)
    while cur.batch > 1 {
        cur.batch = cur.batch.div_ceil(2);
        if push(
            &mut steps,
            attempt(
                &cur,
                format!("batch {} (fewer sequences at once)", cur.batch),
                false,
            ),
        ) {
            return Ok(done(diagnosis, steps));
        }
    }
    // 2. an 8-bit KV cache
    if matches!(cur.kv_dtype, KvDtype::Auto | KvDtype::Bf16 | KvDtype::Fp16) {
        cur.kv_dtype = KvDtype::Fp8;
        if push(&mut steps, attempt(&cur, "fp8 KV cache".into(), true)) {
            return Ok(done(diagnosis, steps));
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
                return Ok(done(diagnosis, steps));
            }
        }
    }
    // 4. a shorter context
    while cur.prompt > 256 {
        cur.prompt /= 2;
        if push(
            &mut steps,
            attempt(&cur, format!("prompt {} tokens", cur.prompt), true),
        ) {
            break;
        }
    }
    Ok(done(diagnosis, steps))
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
        assert!(d.steps[1].change.starts_with("activation checkpointing"));
        // peaks only go down along the way
        for p in d.steps.windows(2) {
            assert!(p[1].peak_bytes <= p[0].peak_bytes, "{:#?}", d.steps);
        }
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
        assert!(d.steps[0].change.starts_with("batch 32"));
    }
}
