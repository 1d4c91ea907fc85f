//! Speed estimates from the roofline ([`crate::roofline`]): the step time of a training step
//! and the token rates of decoding.

use crate::error::CoreError;
use crate::gpu::GpuSpec;
use crate::layout::Layout;
use crate::model::ModelDesc;
use crate::roofline::{self, MathDtype, RooflinePhase, RooflineWorkload};
use crate::workload::{Precision, TrainWorkload};
use serde::Serialize;

/// Fractions of the GPU's peaks a run is assumed to reach.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Efficiency {
    /// Model FLOPs utilisation: fraction of dense peak FLOP/s.
    pub flops: f64,
    /// Fraction of peak memory bandwidth.
    pub bandwidth: f64,
}

/// Step-time estimate of a training step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainSpeed {
    /// Roofline lower bound: every op at peak FLOP/s or peak bandwidth.
    pub lower_bound_step_s: f64,
    /// At the assumed efficiencies.
    pub estimated_step_s: f64,
    /// Tokens per second per model replica (one GPU, or the tp·pp·cp GPUs of a Megatron
    /// replica) at the assumed efficiencies; pipeline bubbles and data-parallel communication
    /// are not included.
    pub estimated_tokens_per_s: f64,
    /// Assumed model FLOPs utilisation.
    pub mfu: f64,
    /// Assumed fraction of peak bandwidth.
    pub bandwidth_efficiency: f64,
}

/// The GEMM format a training precision computes in. PyTorch's default float32 matmul
/// precision is "highest" (`torch.get_float32_matmul_precision()`): fp32 runs without TF32.
pub fn train_math_dtype(precision: Precision) -> MathDtype {
    match precision {
        Precision::Bf16 | Precision::AmpBf16 => MathDtype::Bf16,
        Precision::Fp16 | Precision::AmpFp16 => MathDtype::Fp16,
        Precision::Fp32 => MathDtype::Fp32,
    }
}

/// Step time of one micro-batch of `workload` on `gpu`. With a Megatron layout one GPU runs its
/// tensor-parallel share (with TP's all-reduces), and pipeline stages and context-parallel ranks
/// each run 1/(pp·cp) of the micro-batch's work — no bubble, no communication beyond TP's, so
/// the lower bound stays a lower bound.
pub fn train_speed(
    model: &ModelDesc,
    workload: &TrainWorkload,
    layout: Option<&Layout>,
    gpu: &GpuSpec,
    efficiency: Efficiency,
) -> Result<TrainSpeed, CoreError> {
    let dtype = train_math_dtype(workload.precision);
    let mut w = RooflineWorkload {
        phase: RooflinePhase::Train,
        batch: workload.batch,
        seq: workload.seq,
        dtype,
        weight_bytes: dtype.bytes(),
        kv_bytes: dtype.bytes(),
        tp: layout.map_or(1, |l| l.tp),
        flops_efficiency: 1.0,
        bandwidth_efficiency: 1.0,
        loss: workload.kernels.loss,
        kernels: workload.kernels.layers,
    };
    let ceilings = gpu.ceilings();
    let bound = roofline::analyze(model, &w, &ceilings)?;
    w.flops_efficiency = efficiency.flops;
    w.bandwidth_efficiency = efficiency.bandwidth;
    let estimate = roofline::analyze(model, &w, &ceilings)?;
    let split = layout.map_or(1.0, |l| (l.pp * l.cp) as f64);
    Ok(TrainSpeed {
        lower_bound_step_s: bound.time_s / split,
        estimated_step_s: estimate.time_s / split,
        estimated_tokens_per_s: estimate.tokens_per_s * split,
        mfu: efficiency.flops,
        bandwidth_efficiency: efficiency.bandwidth,
    })
}

/// Largest decode batch [`decode_speed`] probes for the compute-bound point.
pub const DECODE_PROBE_MAX_BATCH: u64 = 1 << 16;

/// Decode rates of a roofline analysis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeSpeed {
    /// Tokens per second each sequence sees.
    pub tokens_per_s_per_sequence: f64,
    /// Tokens per second over the batch.
    pub aggregate_tokens_per_s: f64,
    /// Smallest batch at which the MLP GEMMs are compute-bound (None: not below
    /// [`DECODE_PROBE_MAX_BATCH`]).
    pub compute_bound_from_batch: Option<u64>,
}

/// Per-sequence and aggregate rates of the decode step `r` analysed under `w`, and the batch
/// from which decode stops being bandwidth-bound ([`roofline::decode_compute_bound_batch`]).
pub fn decode_speed(
    model: &ModelDesc,
    w: &RooflineWorkload,
    gpu: &GpuSpec,
    r: &roofline::Roofline,
) -> Result<DecodeSpeed, CoreError> {
    Ok(DecodeSpeed {
        tokens_per_s_per_sequence: r.tokens_per_s / w.batch as f64,
        aggregate_tokens_per_s: r.tokens_per_s,
        compute_bound_from_batch: roofline::decode_compute_bound_batch(
            model,
            w,
            &gpu.ceilings(),
            DECODE_PROBE_MAX_BATCH,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advice::tests::gpu;
    use crate::model::tests::llama2_7b;

    const EFF: Efficiency = Efficiency {
        flops: 0.5,
        bandwidth: 0.8,
    };

    #[test]
    fn the_estimate_is_slower_than_the_bound() {
        let s = train_speed(
            &llama2_7b(),
            &TrainWorkload::new(2, 1024),
            None,
            &gpu("h100", 80, "hopper"),
            EFF,
        )
        .unwrap();
        assert!(s.lower_bound_step_s > 0.0 && s.estimated_step_s > s.lower_bound_step_s);
        assert_eq!((s.mfu, s.bandwidth_efficiency), (0.5, 0.8));
        let tokens = 2.0 * 1024.0;
        assert!((s.estimated_tokens_per_s * s.estimated_step_s / tokens - 1.0).abs() < 1e-9);
    }

    #[test]
    fn pipeline_and_context_parallelism_split_the_work() {
        let (m, w, g) = (
            llama2_7b(),
            TrainWorkload::new(2, 1024),
            gpu("h100", 80, "hopper"),
        );
        let one = train_speed(&m, &w, None, &g, EFF).unwrap();
        let mut l = Layout::single();
        (l.gpus, l.pp, l.cp) = (4, 2, 2);
        let split = train_speed(&m, &w, Some(&l), &g, EFF).unwrap();
        assert!((split.estimated_step_s * 4.0 / one.estimated_step_s - 1.0).abs() < 1e-9);
        assert!(
            (split.estimated_tokens_per_s / 4.0 / one.estimated_tokens_per_s - 1.0).abs() < 1e-9
        );
    }

    #[test]
    fn precision_picks_the_gemm_format() {
        assert_eq!(train_math_dtype(Precision::AmpBf16), MathDtype::Bf16);
        assert_eq!(train_math_dtype(Precision::Fp16), MathDtype::Fp16);
        assert_eq!(train_math_dtype(Precision::Fp32), MathDtype::Fp32);
    }
}
