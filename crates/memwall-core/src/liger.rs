//! Liger-Kernel's layer kernels (`--kernels liger`; transformers `TrainingArguments(
//! use_liger_kernel=True)`): which model families Liger patches, and which of those the
//! simulator models.
//!
//! Source: Liger-Kernel 0.8.5 (PyPI), `liger_kernel/transformers/monkey_patch.py`.
//! transformers' Trainer calls `_apply_liger_kernel_to_instance(model)`, which looks the
//! config's `model_type` up in `MODEL_TYPE_TO_APPLY_LIGER_FN` and runs
//! `apply_liger_kernel_to_<family>(model=model)` with its defaults: `rope=True`, `rms_norm=True`,
//! `swiglu=True` (or `geglu=True`), `fused_linear_cross_entropy=True`. A `model_type` missing from
//! the table gets nothing (Liger only logs "There are currently no Liger kernels supported").
//!
//! What the kernels allocate (modelled in `memory/hf`, measured through CPU references in
//! `tools/truth/kernels.py`):
//! - `LigerRMSNormFunction` (`ops/rms_norm.py`): forward `Y` (input dtype) and `RSTD` (fp32 per
//!   row); saves `X, W, RSTD`; backward writes `dX` over `dY` (`in_place=True`), allocates
//!   `_dW [sm_count, H]` fp32 when the weight trains and returns `_dW.sum(0).to(W.dtype)`.
//! - `LigerSiLUMulFunction` (`ops/swiglu.py`) / `LigerGELUMulFunction` (`ops/geglu.py`): forward
//!   `c = empty_like(a)`, saves `a, b`; backward writes `da`, `db` over `a`, `b`.
//! - `LigerRopeFunction` (`ops/rope.py`): rotates q and k in place (their physical
//!   `[B, S, heads, D]` layout is contiguous), saves `cos, sin`; backward rotates the incoming
//!   gradients in place.
//! - `LigerFusedLinearCrossEntropyFunction`: the loss (`LossKernel::FusedLinear`).

use crate::error::CoreError;
use crate::model::ModelDesc;
use crate::workload::{KernelSet, TrainWorkload};

/// `torch.cuda.get_device_properties(X.device).multi_processor_count` of an H100 SXM5 (132): the
/// rows of `rms_norm_backward`'s fp32 partial weight-gradient buffer `_dW`. 108 on an A100; the
/// difference is at most `24 × H × 4` bytes, alive only inside one norm's backward.
pub const LIGER_SM_COUNT: u128 = 132;

/// How Liger treats a transformers `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LigerFamily {
    /// Liger patches it and the simulator models the patch: every RMSNorm, the gated MLP
    /// (SwiGLU or GeGLU), the rotary embedding and the loss.
    Modelled,
    /// Liger patches it, but with kernels the simulator does not model (named in the string).
    NotModelled(&'static str),
    /// Not in Liger's `MODEL_TYPE_TO_APPLY_LIGER_FN`: `use_liger_kernel=True` changes nothing.
    Unsupported,
}

/// The `model_type`s Liger 0.8.5 patches whose patch is modelled here
/// (`apply_liger_kernel_to_{llama,mistral,qwen2,qwen3,gemma}`: RMSNorm (Gemma: `casting_mode=
/// "gemma"`, `offset=1.0`), SwiGLU (Gemma: GeGLU), RoPE, fused linear cross-entropy; Qwen3 also
/// its per-head q/k norms), sorted.
pub const LIGER_MODELLED: &[&str] = &["gemma", "llama", "mistral", "qwen2", "qwen3"];

/// The family's Liger support.
pub fn liger_family(model_type: &str) -> LigerFamily {
    if LIGER_MODELLED.contains(&model_type) {
        return LigerFamily::Modelled;
    }
    match model_type {
        // apply_liger_kernel_to_gemma2 / gemma3_text: RMSNorm with in_place=False around the
        // extra post-norms, and the softcapped head under the fused linear cross-entropy
        "gemma2" | "gemma3" | "gemma3_text" => LigerFamily::NotModelled(
            "its norms run with in_place=False and its head is softcapped inside the fused loss",
        ),
        "mixtral" | "qwen3_moe" | "deepseek_v3" => {
            LigerFamily::NotModelled("its experts run Liger's fused MoE kernels")
        }
        "phi3" => LigerFamily::NotModelled("its fused gate_up_proj runs LigerPhi3SwiGLUMLP"),
        "olmo2" => LigerFamily::NotModelled(
            "its post-norms and full-width q/k norms are patched (apply_liger_kernel_to_olmo2)",
        ),
        _ => LigerFamily::Unsupported,
    }
}

/// Refuses `--kernels liger` for a model whose Liger patch is not modelled, naming the family.
pub fn check(model: &ModelDesc, w: &TrainWorkload) -> Result<(), CoreError> {
    if w.kernels.layers != KernelSet::Liger {
        return Ok(());
    }
    let mt = model.model_type.as_str();
    let modelled = LIGER_MODELLED.join(", ");
    match liger_family(mt) {
        LigerFamily::Modelled => Ok(()),
        LigerFamily::NotModelled(why) => Err(CoreError::invalid_value(
            "kernels",
            "liger",
            format!(
                "Liger patches `{mt}`, but the simulator does not model that patch: {why}"
            ),
            format!("drop --kernels liger for `{mt}` (it is modelled for {modelled})"),
        )),
        LigerFamily::Unsupported => Err(CoreError::invalid_value(
            "kernels",
            "liger",
            format!(
                "Liger-Kernel 0.8.5 has no patch for `{mt}` (not in MODEL_TYPE_TO_APPLY_LIGER_FN): use_liger_kernel=True leaves the model as it is"
            ),
            format!(
                "drop --kernels liger (Liger supports {modelled} here); --loss fused-linear still applies to any causal LM"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modelled_families_are_sorted_and_classified() {
        let mut sorted = LIGER_MODELLED.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, LIGER_MODELLED);
        for mt in LIGER_MODELLED {
            assert_eq!(liger_family(mt), LigerFamily::Modelled);
        }
        assert!(matches!(
            liger_family("gemma2"),
            LigerFamily::NotModelled(_)
        ));
        assert_eq!(liger_family("gpt2"), LigerFamily::Unsupported);
    }
}
