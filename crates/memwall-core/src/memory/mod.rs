//! Memory simulation: a step replayed as an allocation timeline.
//!
//! The peak is the maximum of live bytes over the timeline, and the breakdown is taken at that
//! instant — never a sum of per-component maxima.

mod hf;
pub mod timeline;

pub use hf::Kernels;
pub use timeline::{Category, Phase};

use crate::error::CoreError;
use crate::model::ModelDesc;
use crate::workload::TrainWorkload;
use serde::Serialize;

/// Result of simulating one steady-state training step on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainEstimate {
    /// Peak bytes PyTorch's allocator holds during the step.
    pub peak_bytes: u64,
    /// What is alive at the peak, by category (sums to `peak_bytes`).
    pub at_peak: Vec<(Category, u64)>,
    /// Phase in which the peak occurs.
    pub phase: Phase,
    /// All parameters.
    pub params_total: u64,
    /// Trainable parameters.
    pub params_trainable: u64,
}

fn to_u64(v: u128, what: &'static str) -> Result<u64, CoreError> {
    u64::try_from(v).map_err(|_| CoreError::Overflow { what })
}

/// Simulates a steady-state (second) training step, runtime profile `hf`.
pub fn simulate_train(
    model: &ModelDesc,
    w: &TrainWorkload,
    kernels: Kernels,
) -> Result<TrainEstimate, CoreError> {
    w.validate()?;
    if model.layers.is_empty() {
        return Err(CoreError::invalid(
            "num_hidden_layers",
            "the model has no layers",
        ));
    }
    let mut b = hf::Builder::new(model, w, kernels);
    b.run();
    let t = &b.t;
    let at_peak = Category::ALL
        .iter()
        .zip(t.peak_breakdown())
        .map(|(c, v)| Ok((*c, to_u64(v, "breakdown")?)))
        .collect::<Result<Vec<_>, CoreError>>()?;
    Ok(TrainEstimate {
        peak_bytes: to_u64(t.peak(), "peak bytes")?,
        at_peak,
        phase: t.peak_phase(),
        params_total: to_u64(b.param_count, "parameters")?,
        params_trainable: to_u64(b.trainable_count, "trainable parameters")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::llama2_7b;

    #[test]
    fn llama_7b_bf16_step_is_plausible() {
        let m = llama2_7b();
        let w = TrainWorkload::new(1, 512);
        let e = simulate_train(&m, &w, Kernels::Cuda).unwrap();
        let p = 6_738_415_616u64;
        // weights 2P + grads 2P + AdamW states 4P + foreach temp 2P at the optimizer step
        assert!(e.peak_bytes >= 10 * p, "{}", e.peak_bytes);
        assert_eq!(e.params_total, p);
    }
}
