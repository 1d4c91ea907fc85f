//! The header of a `.safetensors` file, and `model.safetensors.index.json`, read without
//! touching tensor data.
//!
//! Format (huggingface/safetensors README, crate 0.8.0 `tensor.rs`): 8 bytes little-endian
//! `N`, then `N` bytes of UTF-8 JSON mapping tensor names to `{dtype, shape, data_offsets}`
//! (plus an optional `__metadata__` map of strings), then the data; offsets are relative to
//! the end of the header.
//!
//! **Use of the `safetensors` crate.** `SafeTensors::read_metadata` does not fit: it wants the
//! whole file as one buffer (it checks that the last offset ends exactly at the end of the
//! buffer). Its header types and validator do fit, and are used: the JSON is read into a
//! private struct (each name once, rank bounded), the entries become the crate's own
//! [`TensorInfo`]s sorted by offset, and [`Metadata::new`] runs the crate's validation
//! (offsets contiguous from 0, no overflow, `dtype × shape = end − begin`, sub-byte dtypes
//! ending on a byte boundary). The crate's file-length rule (`8 + N + data = file length`,
//! its `MetadataIncompleteBuffer`) is checked here against the real length. A pre-pass
//! applies the same rules per tensor only so that errors can name the tensor.
//!
//! Memory is bounded by the header: at most [`MAX_HEADER_BYTES`] are read, and what is kept
//! is a few times the header size at most (shapes have at most [`MAX_RANK`] dimensions).

use crate::error::{FileFormat, FormatError, HeaderProblem};
use ::safetensors::tensor::{Metadata, TensorInfo};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

pub use ::safetensors::Dtype;

/// Largest JSON header accepted: the safetensors crate's `MAX_HEADER_SIZE` (100 MB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Bytes of the little-endian header length that starts every file.
pub const LENGTH_BYTES: u64 = 8;

/// Most dimensions a tensor may have (PyTorch's `MAX_DIMS`-style bound; real weights have ≤ 5).
pub const MAX_RANK: usize = 64;

const ST: FileFormat = FileFormat::Safetensors;
const HINT_CORRUPT: &str = "the file is not a complete safetensors file: download it again (an interrupted download or a Git LFS pointer file looks like this)";

/// One tensor of a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

impl TensorEntry {
    /// The tensor's name (e.g. `model.layers.0.self_attn.q_proj.weight`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Element type as stored.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Shape as stored (packed quantised tensors keep their packed shape).
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// `[begin, end)` of the data, relative to the end of the header.
    pub fn data_offsets(&self) -> (u64, u64) {
        self.data_offsets
    }

    /// Bytes of data (`end − begin`, checked equal to `dtype × shape`).
    pub fn bytes(&self) -> u64 {
        self.data_offsets.1 - self.data_offsets.0
    }

    /// Number of stored elements (the product of the shape; fits in `u64` by validation).
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A validated safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsHeader {
    header_len: u64,
    tensors: Vec<TensorEntry>,
    metadata: BTreeMap<String, String>,
}

impl SafetensorsHeader {
    /// Tensors in data order (by offset).
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The `__metadata__` map (e.g. `{"format": "pt"}`).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Length `N` of the JSON header.
    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// File offset of the first data byte (`8 + N`).
    pub fn data_start(&self) -> u64 {
        LENGTH_BYTES + self.header_len
    }

    /// Bytes of tensor data (the sum of every tensor's bytes, exactly).
    pub fn data_bytes(&self) -> u64 {
        self.tensors.last().map_or(0, |t| t.data_offsets.1)
    }

    /// Bytes per stored dtype.
    pub fn bytes_by_dtype(&self) -> BTreeMap<Dtype, u64> {
        let mut m = BTreeMap::new();
        for t in &self.tensors {
            *m.entry(t.dtype).or_insert(0) += t.bytes();
        }
        m
    }
}

/// How many bytes from the start of the file [`parse_header`] needs (`8 + N`), from at least
/// the first 8 bytes. Fails when `N` exceeds [`MAX_HEADER_BYTES`] or the file.
pub fn prefix_len(first_bytes: &[u8], file_len: u64) -> Result<u64, FormatError> {
    let Some(len_bytes) = first_bytes.get(..8) else {
        if file_len < LENGTH_BYTES {
            return Err(truncated(
                "the 8-byte header length",
                LENGTH_BYTES,
                file_len,
            ));
        }
        return Err(FormatError::NeedMoreBytes {
            format: ST,
            have: first_bytes.len() as u64,
            needed: LENGTH_BYTES,
        });
    };
    let mut arr = [0u8; 8];
    arr.copy_from_slice(len_bytes);
    let n = u64::from_le_bytes(arr);
    if n > MAX_HEADER_BYTES {
        return Err(FormatError::header(
            ST,
            HeaderProblem::TooLarge {
                what: "the declared header length".into(),
                value: n,
                max: MAX_HEADER_BYTES,
            },
            "real headers are far smaller (a few MB for the largest checkpoints); this is not a safetensors file, or it is corrupt",
        ));
    }
    // n ≤ 10^8, so the sum cannot overflow.
    let end = LENGTH_BYTES + n;
    if end > file_len {
        return Err(truncated("the declared JSON header", end, file_len));
    }
    Ok(end)
}

/// Parses and validates the header from the first bytes of a file (`prefix`, at least
/// [`prefix_len`] bytes; more are ignored) and the real file length. Reads no tensor data.
pub fn parse_header(prefix: &[u8], file_len: u64) -> Result<SafetensorsHeader, FormatError> {
    let end = prefix_len(prefix, file_len)?;
    let Some(json) = usize::try_from(end).ok().and_then(|e| prefix.get(8..e)) else {
        return Err(FormatError::NeedMoreBytes {
            format: ST,
            have: prefix.len() as u64,
            needed: end,
        });
    };
    let text = std::str::from_utf8(json).map_err(|e| {
        FormatError::header(
            ST,
            HeaderProblem::InvalidUtf8 {
                what: "the JSON header".into(),
                offset: LENGTH_BYTES + e.valid_up_to() as u64,
            },
            HINT_CORRUPT,
        )
    })?;
    let raw: RawHeader = serde_json::from_str(text).map_err(|e| {
        FormatError::header(
            ST,
            HeaderProblem::Json {
                message: e.to_string(),
            },
            "the header must be one JSON object of `name: {dtype, shape, data_offsets}` entries (and an optional `__metadata__` object of strings)",
        )
    })?;
    if let Some(name) = raw.duplicate {
        return Err(FormatError::header(
            ST,
            HeaderProblem::Duplicate {
                what: "tensor".into(),
                name,
            },
            "each tensor name may appear once; the file was not written by the safetensors library",
        ));
    }
    let header_len = end - LENGTH_BYTES;
    validate(raw, header_len, file_len)
}

/// Checks the entries (naming the first bad tensor), then runs the safetensors crate's own
/// validator, then the file-length rule.
fn validate(
    raw: RawHeader,
    header_len: u64,
    file_len: u64,
) -> Result<SafetensorsHeader, FormatError> {
    let mut tensors = raw.tensors;
    // safetensors `TryFrom<HashMetadata> for Metadata`: entries are sorted by offsets, so
    // any key order is accepted.
    tensors.sort_by_key(|(_, t)| t.data_offsets);
    let mut expected_start = 0u64;
    for (name, t) in &tensors {
        let bad = |reason: String| {
            FormatError::header(
                ST,
                HeaderProblem::Tensor {
                    tensor: name.clone(),
                    reason,
                },
                HINT_CORRUPT,
            )
        };
        let (s, e) = (t.data_offsets.0 as u64, t.data_offsets.1 as u64);
        if e < s {
            return Err(bad(format!(
                "data_offsets [{s}, {e}] end before they begin"
            )));
        }
        if s != expected_start {
            return Err(bad(if s < expected_start {
                format!("data_offsets [{s}, {e}] overlap the previous tensor, which ends at {expected_start}")
            } else {
                format!("data_offsets [{s}, {e}] leave a gap after the previous tensor, which ends at {expected_start}")
            }));
        }
        expected_start = e;
        let numel = t
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        let bits = numel.and_then(|n| n.checked_mul(t.dtype.bitsize() as u64));
        let Some(bits) = bits.filter(|b| usize::try_from(*b).is_ok()) else {
            return Err(bad(format!(
                "shape {:?} × {} overflows 64 bits",
                t.shape, t.dtype
            )));
        };
        if bits % 8 != 0 {
            return Err(bad(format!(
                "shape {:?} of sub-byte dtype {} does not end on a byte boundary",
                t.shape, t.dtype
            )));
        }
        if bits / 8 != e - s {
            return Err(bad(format!(
                "dtype {} × shape {:?} is {} bytes, but data_offsets [{s}, {e}] span {} bytes",
                t.dtype,
                t.shape,
                bits / 8,
                e - s
            )));
        }
    }
    // The crate's validator, on the crate's own types: authoritative.
    let infos: Vec<(String, TensorInfo)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                TensorInfo {
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    data_offsets: t.data_offsets,
                },
            )
        })
        .collect();
    let metadata = Metadata::new(None, infos).map_err(|e| {
        FormatError::header(
            ST,
            HeaderProblem::Tensor {
                tensor: "(safetensors validator)".into(),
                reason: e.to_string(),
            },
            HINT_CORRUPT,
        )
    })?;
    let data_bytes = metadata.data_len() as u64;
    // header_len ≤ 10^8 and data_bytes < 2^64 / 8 (bits fitted in u64), so no overflow.
    let data_end = LENGTH_BYTES + header_len + data_bytes;
    if data_end > file_len {
        return Err(truncated("the tensor data", data_end, file_len));
    }
    if data_end < file_len {
        return Err(FormatError::header(
            ST,
            HeaderProblem::TrailingBytes { data_end, file_len },
            "the safetensors library refuses files whose tensors do not end exactly at the end of the file (MetadataIncompleteBuffer); the file is corrupt or not a safetensors file",
        ));
    }
    Ok(SafetensorsHeader {
        header_len,
        tensors: tensors
            .into_iter()
            .map(|(name, t)| TensorEntry {
                name,
                dtype: t.dtype,
                shape: t.shape.iter().map(|&d| d as u64).collect(),
                data_offsets: (t.data_offsets.0 as u64, t.data_offsets.1 as u64),
            })
            .collect(),
        metadata: raw.metadata,
    })
}

fn truncated(what: &str, needed: u64, file_len: u64) -> FormatError {
    FormatError::header(
        ST,
        HeaderProblem::Truncated {
            what: what.into(),
            needed,
            file_len,
        },
        HINT_CORRUPT,
    )
}

/// The JSON header as read: tensors in key order, the first repeated name if any.
#[derive(Debug, Default)]
struct RawHeader {
    metadata: BTreeMap<String, String>,
    tensors: Vec<(String, RawTensor)>,
    duplicate: Option<String>,
}

/// One entry, with the field names and types of safetensors' `TensorInfo`.
#[derive(Debug, Deserialize)]
struct RawTensor {
    dtype: Dtype,
    #[serde(deserialize_with = "bounded_shape")]
    shape: Vec<usize>,
    data_offsets: (usize, usize),
}

impl<'de> Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct HeaderVisitor;
        impl<'de> Visitor<'de> for HeaderVisitor {
            type Value = RawHeader;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
                let mut h = RawHeader::default();
                let mut seen = BTreeSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) && h.duplicate.is_none() {
                        h.duplicate = Some(key.clone());
                    }
                    if key == "__metadata__" {
                        h.metadata = map.next_value()?;
                    } else {
                        let t: RawTensor = map.next_value()?;
                        h.tensors.push((key, t));
                    }
                }
                Ok(h)
            }
        }
        d.deserialize_map(HeaderVisitor)
    }
}

/// A shape of at most [`MAX_RANK`] dimensions (refused before allocating more).
fn bounded_shape<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<usize>, D::Error> {
    struct ShapeVisitor;
    impl<'de> Visitor<'de> for ShapeVisitor {
        type Value = Vec<usize>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "an array of at most {MAX_RANK} non-negative integers")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<usize>, A::Error> {
            let mut v = Vec::new();
            while let Some(d) = seq.next_element::<usize>()? {
                if v.len() == MAX_RANK {
                    return Err(de::Error::custom(format!(
                        "a shape has more than {MAX_RANK} dimensions"
                    )));
                }
                v.push(d);
            }
            Ok(v)
        }
    }
    d.deserialize_seq(ShapeVisitor)
}

/// A parsed `model.safetensors.index.json` (written by transformers `save_pretrained` /
/// huggingface_hub `split_torch_state_dict_into_shards`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsIndex {
    weight_map: BTreeMap<String, String>,
    total_size: Option<u64>,
}

impl SafetensorsIndex {
    /// Tensor name → shard file name.
    pub fn weight_map(&self) -> &BTreeMap<String, String> {
        &self.weight_map
    }

    /// `metadata.total_size`, when present: bytes of tensor data as the writer counted them
    /// (informative; the shard headers give the exact bytes).
    pub fn total_size(&self) -> Option<u64> {
        self.total_size
    }

    /// The shard file names, sorted, each once. Each is a relative path without `..`.
    pub fn shards(&self) -> Vec<&str> {
        let set: BTreeSet<&str> = self.weight_map.values().map(String::as_str).collect();
        set.into_iter().collect()
    }
}

const INDEX: FileFormat = FileFormat::SafetensorsIndex;
const INDEX_HINT: &str = "model.safetensors.index.json is `{\"metadata\": {\"total_size\": …}, \"weight_map\": {tensor: shard file}}` as written by transformers; download it again";

/// Parses `model.safetensors.index.json`: `weight_map` (each tensor once, shard names
/// relative and without `..`) and the optional `metadata.total_size`.
pub fn parse_index(json: &str) -> Result<SafetensorsIndex, FormatError> {
    #[derive(Deserialize)]
    struct RawIndex {
        #[serde(default)]
        metadata: Option<serde_json::Map<String, serde_json::Value>>,
        weight_map: Entries<String>,
    }
    let bad = |problem| FormatError::header(INDEX, problem, INDEX_HINT);
    if json.len() as u64 > MAX_HEADER_BYTES {
        return Err(bad(HeaderProblem::TooLarge {
            what: "the index".into(),
            value: json.len() as u64,
            max: MAX_HEADER_BYTES,
        }));
    }
    let raw: RawIndex = serde_json::from_str(json).map_err(|e| {
        bad(HeaderProblem::Json {
            message: e.to_string(),
        })
    })?;
    let mut weight_map = BTreeMap::new();
    for (tensor, shard) in raw.weight_map.0 {
        if !safe_relative_path(&shard) {
            return Err(bad(HeaderProblem::Value {
                key: format!("weight_map.{tensor}"),
                reason: format!("shard file name {shard:?} is not a plain relative path"),
            }));
        }
        if weight_map.insert(tensor.clone(), shard).is_some() {
            return Err(bad(HeaderProblem::Duplicate {
                what: "tensor".into(),
                name: tensor,
            }));
        }
    }
    let total_size = match raw.metadata.as_ref().and_then(|m| m.get("total_size")) {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(integral(v).ok_or_else(|| {
            bad(HeaderProblem::Value {
                key: "metadata.total_size".into(),
                reason: format!("{v} is not a non-negative whole number of bytes"),
            })
        })?),
    };
    Ok(SafetensorsIndex {
        weight_map,
        total_size,
    })
}

/// A non-negative integer, also when written as an integral float (some writers do).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn integral(v: &serde_json::Value) -> Option<u64> {
    if let Some(u) = v.as_u64() {
        return Some(u);
    }
    let f = v.as_f64()?;
    // below 2^64 and integral: the cast is exact up to f64's precision, enough for a size
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f < 18_446_744_073_709_551_616.0)
        .then_some(f as u64)
}

/// Relative, no `..`, no root, no drive, no NUL: safe to join to the model directory.
fn safe_relative_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.starts_with('\\')
        && !p.contains('\0')
        && !p.contains(':')
        && p.split(['/', '\\'])
            .all(|c| !c.is_empty() && c != ".." && c != ".")
}

/// A JSON object read as ordered `(key, value)` pairs, repeated keys kept (so they can be
/// reported instead of silently overwritten).
#[derive(Debug)]
struct Entries<V>(Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Entries<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EntriesVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for EntriesVisitor<V> {
            type Value = Entries<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<V>, A::Error> {
                let mut v = Vec::new();
                while let Some(k) = map.next_key::<String>()? {
                    v.push((k, map.next_value()?));
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(EntriesVisitor(std::marker::PhantomData))
    }
}

/// Joins the shard headers of a sharded checkpoint, checking them against the index: every
/// shard the index names is given once, every tensor of the index is in the shard it names,
/// and no shard holds a tensor the index does not list. Names the first mismatch.
pub fn check_shards(
    index: &SafetensorsIndex,
    shards: &[(&str, &SafetensorsHeader)],
) -> Result<(), FormatError> {
    let bad = |reason: String, key: String| {
        FormatError::header(
            INDEX,
            HeaderProblem::Value { key, reason },
            "the index and the shard files disagree: download the checkpoint again (all shards and the index from one revision)",
        )
    };
    let mut given: BTreeMap<&str, &SafetensorsHeader> = BTreeMap::new();
    for (name, h) in shards {
        if given.insert(name, h).is_some() {
            return Err(bad(
                format!("shard {name:?} was given twice"),
                "weight_map".into(),
            ));
        }
    }
    for shard in index.shards() {
        if !given.contains_key(shard) {
            return Err(bad(
                format!("shard {shard:?} is named by the index but was not read"),
                "weight_map".into(),
            ));
        }
    }
    // tensor → the shard that holds it (a shard repeating a name was refused by its parser)
    let mut holder: BTreeMap<&str, &str> = BTreeMap::new();
    for (name, h) in shards {
        for t in h.tensors() {
            if let Some(other) = holder.insert(t.name(), name) {
                return Err(bad(
                    format!("tensor `{}` is in both {other:?} and {name:?}", t.name()),
                    format!("weight_map.{}", t.name()),
                ));
            }
        }
    }
    for (tensor, shard) in &index.weight_map {
        if holder.get(tensor.as_str()) != Some(&shard.as_str()) {
            return Err(bad(
                format!("tensor `{tensor}` is not in {shard:?}"),
                format!("weight_map.{tensor}"),
            ));
        }
    }
    if let Some((tensor, shard)) = holder
        .iter()
        .find(|(t, _)| !index.weight_map.contains_key(**t))
    {
        return Err(bad(
            format!("shard {shard:?} holds tensor `{tensor}`, which the index does not list"),
            "weight_map".into(),
        ));
    }
    Ok(())
}
