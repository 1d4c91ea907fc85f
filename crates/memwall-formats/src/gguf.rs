//! The header of a GGUF file (versions 2 and 3), read without touching tensor data.
//!
//! Layout: ggml `docs/gguf.md` (ggml-org/ggml at 01f0d4d, the GGUF v3 specification). Checks
//! follow the reference reader, ggml `src/gguf.cpp` at 1312dff (`gguf_init_from_reader`):
//! magic `GGUF`; version 2
//! or 3 (v1 used 32-bit lengths and is refused there too); no repeated key; no nested
//! arrays; `general.alignment` a `u32` power of two of at most 1 MiB (default 32); tensor
//! names shorter than `GGML_MAX_NAME` (64) and unique; at most `GGML_MAX_DIMS` (4)
//! dimensions, each non-negative, element count below `INT64_MAX`; a known tensor type
//! whose block size divides the row; tensors packed in order, each at the running offset
//! padded to the alignment ("tensor '…' has offset …, expected …"); and, as llama.cpp's
//! model loader checks, every tensor's data inside the file.
//!
//! Block sizes and bytes per block: llama.cpp `gguf-py/gguf/constants.py`
//! `GGML_QUANT_SIZES` (ggml-org/llama.cpp at ef035f7, plus `MXFP4 = (32, 1 + 16)` and
//! `NVFP4 = (64, 4 + 32)` from the current table and ggml.h type ids 39 and 40).
//!
//! Hostile input fails fast and allocates nothing in proportion to a claimed count or
//! length: every count and length is checked against the bytes the file can still hold
//! before anything is read, and only small values are kept (numeric arrays up to
//! [`MAX_KEPT_ARRAY`] elements, strings up to [`MAX_KEPT_STRING`] bytes; longer ones are
//! skipped and only their length recorded). The caller passes a prefix of the file; if the
//! header goes on past it, [`FormatError::NeedMoreBytes`] says how much to read.

use crate::error::{FileFormat, FormatError, HeaderProblem};
use memwall_core::quant::{GgmlType, GgufPreset};
use memwall_core::workload::WeightFormat;
use std::collections::{BTreeMap, BTreeSet};

/// Most header bytes (metadata and tensor infos, before the data) this reader accepts.
pub const MAX_HEADER_BYTES: u64 = 256 << 20;
/// Longest string (ggml `GGUF_MAX_STRING_LENGTH`, 64 MiB in current ggml).
pub const MAX_STRING_BYTES: u64 = 64 << 20;
/// Longest key (the GGUF spec: at most 65 535 bytes).
pub const MAX_KEY_BYTES: u64 = 65_535;
/// Longest tensor name (`GGML_MAX_NAME` is 64 including the terminating NUL).
pub const MAX_TENSOR_NAME_BYTES: u64 = 63;
/// Most dimensions of a tensor (`GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Largest alignment (ggml `GGUF_MAX_ALIGNMENT`, 1 MiB).
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// Alignment when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Numeric arrays up to this many elements are kept (per-layer hyper-parameters).
pub const MAX_KEPT_ARRAY: u64 = 1 << 16;
/// Strings up to this many bytes are kept (and must be UTF-8).
pub const MAX_KEPT_STRING: u64 = 1 << 16;

const GG: FileFormat = FileFormat::Gguf;
const HINT_CORRUPT: &str = "the file is not a complete GGUF file: download it again (an interrupted download or a Git LFS pointer file looks like this)";

/// A GGUF metadata value type (`gguf_metadata_value_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufType {
    /// `uint8` (0).
    U8,
    /// `int8` (1).
    I8,
    /// `uint16` (2).
    U16,
    /// `int16` (3).
    I16,
    /// `uint32` (4).
    U32,
    /// `int32` (5).
    I32,
    /// `float32` (6).
    F32,
    /// `bool` (7).
    Bool,
    /// `string` (8).
    String,
    /// `array` (9).
    Array,
    /// `uint64` (10).
    U64,
    /// `int64` (11).
    I64,
    /// `float64` (12).
    F64,
}

impl GgufType {
    fn from_id(id: u32) -> Option<GgufType> {
        use GgufType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes of one value (strings: the 8-byte length only; arrays: the 12-byte prefix).
    fn min_size(self) -> u64 {
        use GgufType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A string value: its length, and its text when short enough to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufStr {
    /// Length in bytes.
    pub len: u64,
    /// The text, when `len ≤ MAX_KEPT_STRING` (checked UTF-8).
    pub text: Option<String>,
}

/// An array value: element type and count, and the elements when kept.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufArray {
    /// Element type.
    pub element_type: GgufType,
    /// Number of elements.
    pub len: u64,
    /// The elements, for numeric and boolean arrays of at most [`MAX_KEPT_ARRAY`] elements.
    pub values: Option<Vec<GgufValue>>,
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // one variant per GGUF value type, named as the type
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(GgufStr),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// A non-negative integer of any integer type.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A number of any numeric type, as `f64`.
    #[allow(clippy::cast_precision_loss)]
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The text of a kept string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => s.text.as_deref(),
            _ => None,
        }
    }

    /// A boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The array, when this is one.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block:literal, $size:expr;)*) => {
        /// A ggml tensor type (`enum ggml_type`, ggml.h) as stored in GGUF tensor infos.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[allow(missing_docs)] // named as in ggml.h
        pub enum GgufTensorType { $($variant),* }

        impl GgufTensorType {
            /// The type with ggml id `id`, if it is one GGUF files may hold.
            pub fn from_id(id: u32) -> Option<GgufTensorType> {
                match id { $($id => Some(GgufTensorType::$variant),)* _ => None }
            }
            /// The ggml id.
            pub fn id(self) -> u32 {
                match self { $(GgufTensorType::$variant => $id),* }
            }
            /// The ggml name (`ggml_type_name`).
            pub fn name(self) -> &'static str {
                match self { $(GgufTensorType::$variant => $name),* }
            }
            /// (weights per block, bytes per block): `GGML_QUANT_SIZES`.
            pub fn block(self) -> (u64, u64) {
                match self { $(GgufTensorType::$variant => ($block, $size)),* }
            }
        }
    };
}

/// `QK_K` (ggml-common.h): weights per super-block of the k-quants.
const QK_K: u64 = 256;

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 2 + 16;
    Q4_1 = 3, "Q4_1", 32, 2 + 2 + 16;
    Q5_0 = 6, "Q5_0", 32, 2 + 4 + 16;
    Q5_1 = 7, "Q5_1", 32, 2 + 2 + 4 + 16;
    Q8_0 = 8, "Q8_0", 32, 2 + 32;
    Q8_1 = 9, "Q8_1", 32, 4 + 4 + 32;
    Q2K = 10, "Q2_K", 256, 2 + 2 + QK_K / 16 + QK_K / 4;
    Q3K = 11, "Q3_K", 256, 2 + QK_K / 4 + QK_K / 8 + 12;
    Q4K = 12, "Q4_K", 256, 2 + 2 + QK_K / 2 + 12;
    Q5K = 13, "Q5_K", 256, 2 + 2 + QK_K / 2 + QK_K / 8 + 12;
    Q6K = 14, "Q6_K", 256, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16;
    Q8K = 15, "Q8_K", 256, 4 + QK_K + QK_K / 8;
    Iq2Xxs = 16, "IQ2_XXS", 256, 2 + QK_K / 4;
    Iq2Xs = 17, "IQ2_XS", 256, 2 + QK_K / 4 + QK_K / 32;
    Iq3Xxs = 18, "IQ3_XXS", 256, 2 + QK_K / 4 + QK_K / 8;
    Iq1S = 19, "IQ1_S", 256, 2 + QK_K / 8 + QK_K / 16;
    Iq4Nl = 20, "IQ4_NL", 32, 2 + 16;
    Iq3S = 21, "IQ3_S", 256, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    Iq2S = 22, "IQ2_S", 256, 2 + QK_K / 4 + QK_K / 16;
    Iq4Xs = 23, "IQ4_XS", 256, 2 + 2 + QK_K / 2 + QK_K / 64;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    Iq1M = 29, "IQ1_M", 256, QK_K / 8 + QK_K / 16 + QK_K / 32;
    Bf16 = 30, "BF16", 1, 2;
    Tq1_0 = 34, "TQ1_0", 256, 2 + 4 * 13;
    Tq2_0 = 35, "TQ2_0", 256, 2 + 64;
    Mxfp4 = 39, "MXFP4", 32, 1 + 16;
    Nvfp4 = 40, "NVFP4", 64, 4 + 32;
}

impl GgufTensorType {
    /// The same type in memwall-core's GGUF size model, where it has one.
    pub fn to_core(self) -> Option<GgmlType> {
        use GgufTensorType as T;
        Some(match self {
            T::F32 => GgmlType::F32,
            T::F16 => GgmlType::F16,
            T::Bf16 => GgmlType::Bf16,
            T::Q4_0 => GgmlType::Q4_0,
            T::Q4_1 => GgmlType::Q4_1,
            T::Q5_0 => GgmlType::Q5_0,
            T::Q5_1 => GgmlType::Q5_1,
            T::Q8_0 => GgmlType::Q8_0,
            T::Q2K => GgmlType::Q2K,
            T::Q3K => GgmlType::Q3K,
            T::Q4K => GgmlType::Q4K,
            T::Q5K => GgmlType::Q5K,
            T::Q6K => GgmlType::Q6K,
            _ => return None,
        })
    }
}

/// One tensor info of a GGUF header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensor {
    name: String,
    dims: Vec<u64>,
    tensor_type: GgufTensorType,
    offset: u64,
    bytes: u64,
}

impl GgufTensor {
    /// The tensor's GGUF name (`blk.0.attn_q.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Dimensions, fastest-varying first (`ne[0]` is the row length).
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// Storage type.
    pub fn tensor_type(&self) -> GgufTensorType {
        self.tensor_type
    }

    /// Offset of the data from the start of the data section.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes of data, exactly (`ggml_nbytes`: rows × blocks per row × bytes per block).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of logical elements (the product of the dimensions).
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A validated GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufHeader {
    version: u32,
    alignment: u64,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensor>,
    data_offset: u64,
    data_bytes: u64,
}

impl GgufHeader {
    /// Format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// All metadata keys and values (long strings and arrays reduced, see the module docs).
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(GgufValue::as_str)
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// File offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Bytes of the data section as ggml sizes it (each tensor padded to the alignment).
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    /// Bytes of tensor data, exactly (the sum of [`GgufTensor::bytes`], without padding).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }

    /// Bytes per tensor type.
    pub fn bytes_by_type(&self) -> BTreeMap<GgufTensorType, u64> {
        let mut m = BTreeMap::new();
        for t in &self.tensors {
            *m.entry(t.tensor_type).or_insert(0) += t.bytes;
        }
        m
    }

    /// `(split.no, split.count)` of a file split by `llama-gguf-split`, when present.
    pub fn split(&self) -> Option<(u64, u64)> {
        let no = self.get("split.no")?.as_u64()?;
        let count = self.get("split.count")?.as_u64()?;
        Some((no, count))
    }

    /// `general.file_type` as one of memwall's weight formats, where one matches
    /// (llama.cpp `llama_ftype`: 0 ALL_F32, 1 MOSTLY_F16, 2 Q4_0, 3 Q4_1, 7 Q8_0, 8 Q5_0,
    /// 9 Q5_1, 10 Q2_K, 15 Q4_K_M, 17 Q5_K_M, 18 Q6_K, 32 BF16). The tensor bytes are exact
    /// whatever this says.
    pub fn weight_format(&self) -> Option<WeightFormat> {
        let uniform = |t| Some(WeightFormat::Gguf(GgufPreset::Uniform(t)));
        match self.get("general.file_type")?.as_u64()? {
            0 => uniform(GgmlType::F32),
            1 => uniform(GgmlType::F16),
            2 => uniform(GgmlType::Q4_0),
            3 => uniform(GgmlType::Q4_1),
            7 => uniform(GgmlType::Q8_0),
            8 => uniform(GgmlType::Q5_0),
            9 => uniform(GgmlType::Q5_1),
            10 => uniform(GgmlType::Q2K),
            15 => Some(WeightFormat::Gguf(GgufPreset::Q4KM)),
            17 => Some(WeightFormat::Gguf(GgufPreset::Q5KM)),
            18 => uniform(GgmlType::Q6K),
            32 => uniform(GgmlType::Bf16),
            _ => None,
        }
    }
}

/// A cursor over the prefix that knows the real file length.
struct Reader<'a> {
    buf: &'a [u8],
    pos: u64,
    file_len: u64,
}

impl<'a> Reader<'a> {
    /// The next `n` bytes, or why not: beyond the file, beyond the header limit, or beyond
    /// the prefix (read more).
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], FormatError> {
        let end = self.pos.saturating_add(n);
        if end > self.file_len {
            return Err(truncated(what(), end, self.file_len));
        }
        if end > MAX_HEADER_BYTES {
            return Err(FormatError::header(
                GG,
                HeaderProblem::TooLarge {
                    what: format!("the header (reading {})", what()),
                    value: end,
                    max: MAX_HEADER_BYTES,
                },
                "real GGUF headers (metadata, vocabulary, tensor infos) are a few tens of MB at most; this file is corrupt or hostile",
            ));
        }
        let (start, stop) = (to_usize(self.pos), to_usize(end));
        match self.buf.get(start..stop) {
            Some(bytes) => {
                self.pos = end;
                Ok(bytes)
            }
            None => Err(FormatError::NeedMoreBytes {
                format: GG,
                have: self.buf.len() as u64,
                needed: end,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], FormatError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Fails unless `count` items of at least `min_each` bytes fit in the rest of the file.
    fn check_count(
        &self,
        count: u64,
        min_each: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), FormatError> {
        let end = self.pos.saturating_add(count.saturating_mul(min_each));
        if end > self.file_len {
            return Err(truncated(
                format!("{} ({count} × at least {min_each} bytes)", what()),
                end,
                self.file_len,
            ));
        }
        Ok(())
    }

    /// A GGUF string: `u64` length + bytes. Returns the length and the bytes when
    /// `len ≤ keep_max` (otherwise they are skipped).
    fn string(
        &mut self,
        max: u64,
        keep_max: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(u64, Option<&'a [u8]>), FormatError> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        if len > max {
            // beyond the file is the more telling error when both hold
            self.check_count(len, 1, what)?;
            return Err(too_large(format!("the length of {}", what()), len, max));
        }
        let bytes = self.take(len, what)?;
        Ok((len, (len <= keep_max).then_some(bytes)))
    }

    /// A string that must be kept and be UTF-8 (keys, tensor names).
    fn utf8(&mut self, max: u64, what: &dyn Fn() -> String) -> Result<String, FormatError> {
        let start = self.pos + 8;
        let (_, bytes) = self.string(max, max, what)?;
        let bytes = bytes.unwrap_or_default();
        decode(bytes, start, what)
    }
}

fn decode(bytes: &[u8], start: u64, what: &dyn Fn() -> String) -> Result<String, FormatError> {
    std::str::from_utf8(bytes).map(str::to_string).map_err(|e| {
        FormatError::header(
            GG,
            HeaderProblem::InvalidUtf8 {
                what: what(),
                offset: start + e.valid_up_to() as u64,
            },
            HINT_CORRUPT,
        )
    })
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

fn truncated(what: String, needed: u64, file_len: u64) -> FormatError {
    FormatError::header(
        GG,
        HeaderProblem::Truncated {
            what,
            needed,
            file_len,
        },
        HINT_CORRUPT,
    )
}

fn too_large(what: String, value: u64, max: u64) -> FormatError {
    FormatError::header(
        GG,
        HeaderProblem::TooLarge { what, value, max },
        "no real GGUF file comes near this limit; the file is corrupt or hostile",
    )
}

fn bad_value(key: &str, reason: String) -> FormatError {
    FormatError::header(
        GG,
        HeaderProblem::Value {
            key: key.into(),
            reason,
        },
        HINT_CORRUPT,
    )
}

fn bad_tensor(tensor: &str, reason: String) -> FormatError {
    FormatError::header(
        GG,
        HeaderProblem::Tensor {
            tensor: tensor.into(),
            reason,
        },
        HINT_CORRUPT,
    )
}

/// Parses and validates a GGUF header from the first bytes of a file (`prefix`) and the real
/// file length. Reads no tensor data. If the header continues past `prefix`, the error is
/// [`FormatError::NeedMoreBytes`] with the length to read.
pub fn parse_header(prefix: &[u8], file_len: u64) -> Result<GgufHeader, FormatError> {
    let mut r = Reader {
        buf: prefix,
        pos: 0,
        file_len,
    };
    let magic = r.array::<4>(&|| "the magic".into())?;
    if &magic != b"GGUF" {
        return Err(FormatError::header(
            GG,
            HeaderProblem::BadMagic {
                found: magic.escape_ascii().to_string(),
                expected: "GGUF".into(),
            },
            "this is not a GGUF file (GGML/GGJT files from before August 2023 must be converted with llama.cpp)",
        ));
    }
    let version = r.u32(&|| "the version".into())?;
    if version != 2 && version != 3 {
        let hint = if version & 0xFFFF == 0 {
            "the version looks byte-swapped: big-endian GGUF files are not supported"
        } else {
            "GGUF v1 files must be converted with a current llama.cpp; newer versions are not known yet"
        };
        return Err(FormatError::header(
            GG,
            HeaderProblem::Version {
                version: version.into(),
                supported: "2, 3".into(),
            },
            hint,
        ));
    }
    let n_tensors = r.u64(&|| "the tensor count".into())?;
    let n_kv = r.u64(&|| "the metadata count".into())?;
    // key (8 + ≥1 bytes) + type (4) + value (≥1 byte)
    r.check_count(n_kv, 14, &|| "the declared metadata key-value pairs".into())?;
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = r.utf8(MAX_KEY_BYTES, &|| format!("metadata key {i}"))?;
        if key.is_empty() {
            return Err(bad_value("", format!("metadata key {i} is empty")));
        }
        let type_id = r.u32(&|| format!("the type of `{key}`"))?;
        let value = read_value(&mut r, &key, type_id)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(FormatError::header(
                GG,
                HeaderProblem::Duplicate {
                    what: "key".into(),
                    name: key,
                },
                HINT_CORRUPT,
            ));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(GgufValue::U32(a)) => {
            let a = u64::from(*a);
            if !a.is_power_of_two() || a > MAX_ALIGNMENT {
                return Err(bad_value(
                    "general.alignment",
                    format!("{a} is not a power of two of at most {MAX_ALIGNMENT}"),
                ));
            }
            a
        }
        Some(other) => {
            return Err(bad_value(
                "general.alignment",
                format!("must be a uint32, found {other:?}"),
            ))
        }
    };
    // name (8) + n_dims (4) + type (4) + offset (8)
    r.check_count(n_tensors, 24, &|| "the declared tensor infos".into())?;
    let mut tensors = Vec::new();
    let mut names = BTreeSet::new();
    for i in 0..n_tensors {
        let t = read_tensor_info(&mut r, i)?;
        if !names.insert(t.name.clone()) {
            return Err(FormatError::header(
                GG,
                HeaderProblem::Duplicate {
                    what: "tensor".into(),
                    name: t.name,
                },
                HINT_CORRUPT,
            ));
        }
        tensors.push(t);
    }
    let data_offset = if tensors.is_empty() {
        r.pos
    } else {
        pad(r.pos, alignment).ok_or_else(|| too_large("the data offset".into(), r.pos, u64::MAX))?
    };
    if data_offset > file_len {
        return Err(truncated("the data section".into(), data_offset, file_len));
    }
    let mut expected = 0u64;
    for t in &tensors {
        if t.offset != expected {
            return Err(bad_tensor(
                &t.name,
                format!("has offset {}, expected {expected} (ggml requires tensors packed in order, each padded to {alignment} bytes)", t.offset),
            ));
        }
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|o| o.checked_add(t.bytes))
            .unwrap_or(u64::MAX);
        if end > file_len {
            return Err(truncated(
                format!("the data of tensor `{}`", t.name),
                end,
                file_len,
            ));
        }
        expected = pad(t.bytes, alignment)
            .and_then(|p| expected.checked_add(p))
            .ok_or_else(|| bad_tensor(&t.name, "the data section size overflows".into()))?;
    }
    Ok(GgufHeader {
        version,
        alignment,
        metadata,
        tensors,
        data_offset,
        data_bytes: expected,
    })
}

/// `x` rounded up to a multiple of `align` (a power of two), `None` on overflow.
fn pad(x: u64, align: u64) -> Option<u64> {
    x.checked_add(align - 1).map(|v| v & !(align - 1))
}

fn read_value(r: &mut Reader, key: &str, type_id: u32) -> Result<GgufValue, FormatError> {
    let ty = GgufType::from_id(type_id)
        .ok_or_else(|| bad_value(key, format!("unknown value type {type_id}")))?;
    if ty != GgufType::Array {
        return read_scalar(r, key, ty, true);
    }
    let elem_id = r.u32(&|| format!("the element type of `{key}`"))?;
    let element_type = GgufType::from_id(elem_id)
        .ok_or_else(|| bad_value(key, format!("unknown array element type {elem_id}")))?;
    if element_type == GgufType::Array {
        return Err(bad_value(
            key,
            "nested arrays are not supported (ggml's reader refuses them too)".into(),
        ));
    }
    let len = r.u64(&|| format!("the length of `{key}`"))?;
    r.check_count(len, element_type.min_size(), &|| {
        format!("the elements of `{key}`")
    })?;
    let keep = element_type != GgufType::String && len <= MAX_KEPT_ARRAY;
    if !keep && element_type != GgufType::String {
        // fixed-size elements: skip them in one step
        let bytes = len.saturating_mul(element_type.min_size());
        r.take(bytes, &|| format!("the elements of `{key}`"))?;
        return Ok(GgufValue::Array(GgufArray {
            element_type,
            len,
            values: None,
        }));
    }
    let mut values = Vec::new();
    for _ in 0..len {
        let v = read_scalar(r, key, element_type, false)?;
        if keep {
            values.push(v);
        }
    }
    Ok(GgufValue::Array(GgufArray {
        element_type,
        len,
        values: keep.then_some(values),
    }))
}

/// One scalar. `keep_string`: keep (and UTF-8-check) short strings; array strings are only
/// skipped (token lists are not needed and llama.cpp does not check their encoding).
fn read_scalar(
    r: &mut Reader,
    key: &str,
    ty: GgufType,
    keep_string: bool,
) -> Result<GgufValue, FormatError> {
    let what = || format!("the value of `{key}`");
    Ok(match ty {
        GgufType::U8 => GgufValue::U8(u8::from_le_bytes(r.array(&what)?)),
        GgufType::I8 => GgufValue::I8(i8::from_le_bytes(r.array(&what)?)),
        GgufType::U16 => GgufValue::U16(u16::from_le_bytes(r.array(&what)?)),
        GgufType::I16 => GgufValue::I16(i16::from_le_bytes(r.array(&what)?)),
        GgufType::U32 => GgufValue::U32(u32::from_le_bytes(r.array(&what)?)),
        GgufType::I32 => GgufValue::I32(i32::from_le_bytes(r.array(&what)?)),
        GgufType::F32 => GgufValue::F32(f32::from_le_bytes(r.array(&what)?)),
        GgufType::U64 => GgufValue::U64(u64::from_le_bytes(r.array(&what)?)),
        GgufType::I64 => GgufValue::I64(i64::from_le_bytes(r.array(&what)?)),
        GgufType::F64 => GgufValue::F64(f64::from_le_bytes(r.array(&what)?)),
        GgufType::Bool => match r.array::<1>(&what)?[0] {
            0 => GgufValue::Bool(false),
            1 => GgufValue::Bool(true),
            b => {
                return Err(bad_value(
                    key,
                    format!("a boolean must be 0 or 1, found {b}"),
                ))
            }
        },
        GgufType::String => {
            let start = r.pos + 8;
            let keep_max = if keep_string { MAX_KEPT_STRING } else { 0 };
            let (len, bytes) = r.string(MAX_STRING_BYTES, keep_max, &what)?;
            let text = match bytes.filter(|_| keep_string) {
                Some(b) => Some(decode(b, start, &what)?),
                None => None,
            };
            GgufValue::String(GgufStr { len, text })
        }
        GgufType::Array => return Err(bad_value(key, "nested arrays are not supported".into())),
    })
}

fn read_tensor_info(r: &mut Reader, i: u64) -> Result<GgufTensor, FormatError> {
    let name = r.utf8(MAX_TENSOR_NAME_BYTES, &|| format!("the name of tensor {i}"))?;
    let n_dims = r.u32(&|| format!("the rank of tensor `{name}`"))?;
    if n_dims > MAX_DIMS {
        return Err(bad_tensor(
            &name,
            format!("has {n_dims} dimensions; ggml allows at most {MAX_DIMS}"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for j in 0..n_dims {
        let d = r.u64(&|| format!("dimension {j} of tensor `{name}`"))?;
        if i64::try_from(d).is_err() {
            return Err(bad_tensor(
                &name,
                format!("dimension {j} is {d}, negative as ggml's int64"),
            ));
        }
        dims.push(d);
    }
    let numel = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n < i64::MAX as u64)
        .ok_or_else(|| {
            bad_tensor(
                &name,
                format!("shape {dims:?} has more than INT64_MAX elements"),
            )
        })?;
    let type_id = r.u32(&|| format!("the type of tensor `{name}`"))?;
    let tensor_type = GgufTensorType::from_id(type_id).ok_or_else(|| {
        bad_tensor(
            &name,
            format!(
                "has ggml type id {type_id}, which is unknown or no longer allowed in GGUF files"
            ),
        )
    })?;
    let (block, type_size) = tensor_type.block();
    let row = dims.first().copied().unwrap_or(1);
    if row % block != 0 {
        return Err(bad_tensor(
            &name,
            format!(
                "rows of {row} elements are not a multiple of the {}-element blocks of {}",
                block,
                tensor_type.name()
            ),
        ));
    }
    // ggml_nbytes for a block type: type_size × numel / block (the row divides exactly)
    let bytes = (numel / block).checked_mul(type_size).ok_or_else(|| {
        bad_tensor(
            &name,
            format!("shape {dims:?} × {} overflows 64 bits", tensor_type.name()),
        )
    })?;
    let offset = r.u64(&|| format!("the offset of tensor `{name}`"))?;
    Ok(GgufTensor {
        name,
        dims,
        tensor_type,
        offset,
        bytes,
    })
}
