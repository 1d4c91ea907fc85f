//! Element types and their sizes.

use serde::Serialize;

/// A tensor element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE float32.
    F32,
    /// IEEE float16.
    F16,
    /// bfloat16.
    BF16,
    /// 8-bit float (e4m3/e5m2).
    F8,
    /// 8-bit integer.
    I8,
    /// 8-bit unsigned integer (bitsandbytes packs 4-bit pairs and 8-bit states in it).
    U8,
    /// 64-bit integer (token ids, labels).
    I64,
    /// Boolean (one byte per element in PyTorch).
    Bool,
}

impl DType {
    /// Bytes per element, as `torch.dtype.itemsize`.
    pub fn size(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8 | DType::I8 | DType::U8 | DType::Bool => 1,
            DType::I64 => 8,
        }
    }
}

crate::names::named_enum! {
    /// Numeric precision of a training step: the dtype of the model's weights and of its
    /// compute. What an engine makes of each value (master copies, reduce dtype) is in its row of
    /// [`crate::engine::Capabilities`].
    pub enum Precision in "precision" {
        /// Model cast to bf16; grads and optimizer states bf16.
        Bf16 = "bf16": "model in bf16 (grads and optimizer states bf16)",
        /// Model cast to fp16; grads and optimizer states fp16 (no master copy).
        Fp16 = "fp16": "model in fp16 (grads and optimizer states fp16)",
        /// Everything fp32.
        Fp32 = "fp32": "model in fp32",
        /// fp32 weights, `torch.autocast(dtype=bfloat16)` forward.
        AmpBf16 = "amp-bf16": "fp32 weights with bf16 autocast",
        /// fp32 weights, `torch.autocast(dtype=float16)` forward.
        AmpFp16 = "amp-fp16": "fp32 weights with fp16 autocast",
    }
}

impl Precision {
    /// Element type of the model's weights (and of their gradients and optimizer states on the
    /// single-GPU `hf` path).
    pub const fn param_dtype(self) -> DType {
        match self {
            Precision::Bf16 => DType::BF16,
            Precision::Fp16 => DType::F16,
            Precision::Fp32 | Precision::AmpBf16 | Precision::AmpFp16 => DType::F32,
        }
    }

    /// Element type the forward and backward compute in (autocast's dtype under `amp-*`).
    pub const fn compute_dtype(self) -> DType {
        match self {
            Precision::Bf16 | Precision::AmpBf16 => DType::BF16,
            Precision::Fp16 | Precision::AmpFp16 => DType::F16,
            Precision::Fp32 => DType::F32,
        }
    }

    /// Whether the forward runs under `torch.autocast` (fp32 weights, 16-bit compute).
    pub const fn autocast(self) -> bool {
        matches!(self, Precision::AmpBf16 | Precision::AmpFp16)
    }

    /// The 16-bit mode a mixed-precision engine runs this precision in (DeepSpeed's `bf16` /
    /// `fp16` config sections, Megatron-LM's `--bf16` / `--fp16`): `fp16` and `amp-fp16` run
    /// in fp16, the others in bf16 (`fp32` is no mixed precision at all; callers check it
    /// first).
    pub const fn half(self) -> Precision {
        match self {
            Precision::Fp16 | Precision::AmpFp16 => Precision::Fp16,
            _ => Precision::Bf16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_dtypes_match_the_hf_builder() {
        // memory/hf.rs `Builder::new`: (param bytes, compute bytes, autocast)
        let expect = [
            (Precision::Bf16, 2, 2, false),
            (Precision::Fp16, 2, 2, false),
            (Precision::Fp32, 4, 4, false),
            (Precision::AmpBf16, 4, 2, true),
            (Precision::AmpFp16, 4, 2, true),
        ];
        for (p, param, compute, amp) in expect {
            assert_eq!(p.param_dtype().size(), param, "{p}");
            assert_eq!(p.compute_dtype().size(), compute, "{p}");
            assert_eq!(p.autocast(), amp, "{p}");
        }
    }
}
