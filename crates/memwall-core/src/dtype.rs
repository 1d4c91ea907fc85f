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
