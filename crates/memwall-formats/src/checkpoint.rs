//! One view of a checkpoint's tensors, whatever the file format: exact bytes (total, per
//! stored type, per decoder layer), the storage scheme recognised from the tensor names, and
//! a cross-check of the tensors against a [`ModelDesc`] that names the first mismatch.

use crate::error::FormatError;
use crate::gguf::GgufHeader;
use crate::safetensors::{Dtype, SafetensorsHeader};
use memwall_core::ModelDesc;
use std::collections::{BTreeMap, BTreeSet};

/// One tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointTensor {
    /// Name as stored.
    pub name: String,
    /// Stored type: a safetensors dtype (`BF16`, `F8_E4M3`, `I32`) or a ggml type (`Q4_K`).
    pub type_name: String,
    /// Shape as stored (safetensors order; GGUF `ne`, fastest-varying first).
    pub shape: Vec<u64>,
    /// Stored elements (GGUF: logical elements; packed safetensors: packed elements).
    pub numel: u64,
    /// Bytes of data, exactly.
    pub bytes: u64,
    /// Whether the type is a plain floating-point type (numel = parameters).
    float: bool,
}

/// Which file format the tensors came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// One or more `.safetensors` files.
    Safetensors,
    /// One or more `.gguf` files.
    Gguf,
}

/// How the weights are stored, recognised from tensor names and types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// Plain floating point (the most common dtype of the matrices).
    Float(String),
    /// fp8 weights with `weight_scale_inv` (transformers FineGrainedFP8, DeepSeek-V3).
    Fp8Block,
    /// fp8 weights with `weight_scale` (compressed-tensors / FBGEMM fp8).
    Fp8Scaled,
    /// GPTQ: `qweight`, `qzeros`, `scales`, `g_idx`.
    Gptq,
    /// AWQ: `qweight`, `qzeros`, `scales`, no `g_idx`.
    Awq,
    /// bitsandbytes 4-bit (`absmax`, `quant_map`, `quant_state.bitsandbytes__nf4|fp4`).
    Bnb4 {
        /// NF4 rather than FP4.
        nf4: bool,
        /// Double quantisation (`nested_absmax`).
        double_quant: bool,
    },
    /// bitsandbytes LLM.int8 (`SCB`).
    BnbInt8,
    /// compressed-tensors packed integers (`weight_packed`).
    CompressedPacked,
    /// MXFP4 (`*_blocks` + `*_scales`, gpt-oss).
    Mxfp4,
    /// GGUF: the most common type of the matrices (by bytes).
    Gguf(String),
}

impl Storage {
    /// A short label for output.
    pub fn describe(&self) -> String {
        match self {
            Storage::Float(d) => format!("{d} (unquantised)"),
            Storage::Fp8Block => "fp8 with block scales (weight_scale_inv)".into(),
            Storage::Fp8Scaled => "fp8 with weight_scale".into(),
            Storage::Gptq => "GPTQ (qweight/qzeros/scales/g_idx)".into(),
            Storage::Awq => "AWQ (qweight/qzeros/scales)".into(),
            Storage::Bnb4 { nf4, double_quant } => format!(
                "bitsandbytes {}{}",
                if *nf4 { "nf4" } else { "fp4" },
                if *double_quant { " + double quant" } else { "" }
            ),
            Storage::BnbInt8 => "bitsandbytes int8".into(),
            Storage::CompressedPacked => "compressed-tensors packed (weight_packed)".into(),
            Storage::Mxfp4 => "mxfp4 (blocks + scales)".into(),
            Storage::Gguf(t) => format!("GGUF, mostly {t}"),
        }
    }
}

/// Bytes per decoder layer and outside the layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerBytes {
    /// Bytes of layer `i` (indices as stored; missing layers have 0).
    pub per_layer: Vec<u64>,
    /// Embeddings, final norm, head, and anything not under a layer prefix.
    pub other: u64,
}

/// What [`Checkpoint::cross_check`] found when nothing contradicts the description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrossCheck {
    /// Decoder layers the description has (all present in the checkpoint).
    pub layers: u64,
    /// Layers stored beyond them (DeepSeek-V3's multi-token-prediction layer 61, which
    /// transformers does not load: `_keys_to_ignore_on_load_unexpected`).
    pub extra_layers: u64,
    /// Whether parameter counts were compared layer by layer (plain floating-point
    /// safetensors only; packed or GGUF tensors do not store parameters one for one).
    pub params_compared: bool,
}

/// A checkpoint's tensors, from all its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    source: Source,
    tensors: Vec<CheckpointTensor>,
}

fn float_dtype(d: Dtype) -> bool {
    matches!(d, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
}

impl Checkpoint {
    /// The tensors of one or more safetensors headers (the shards of one checkpoint, already
    /// checked against the index with [`crate::safetensors::check_shards`]).
    pub fn from_safetensors(headers: &[SafetensorsHeader]) -> Checkpoint {
        let tensors = headers
            .iter()
            .flat_map(|h| h.tensors())
            .map(|t| CheckpointTensor {
                name: t.name().to_string(),
                type_name: t.dtype().to_string(),
                shape: t.shape().to_vec(),
                numel: t.numel(),
                bytes: t.bytes(),
                float: float_dtype(t.dtype()),
            })
            .collect();
        Checkpoint {
            source: Source::Safetensors,
            tensors,
        }
    }

    /// The tensors of one or more GGUF headers (the splits of one model).
    pub fn from_gguf(headers: &[GgufHeader]) -> Checkpoint {
        use crate::gguf::GgufTensorType as T;
        let tensors = headers
            .iter()
            .flat_map(|h| h.tensors())
            .map(|t| CheckpointTensor {
                name: t.name().to_string(),
                type_name: t.tensor_type().name().to_string(),
                shape: t.dims().to_vec(),
                numel: t.numel(),
                bytes: t.bytes(),
                float: matches!(t.tensor_type(), T::F32 | T::F16 | T::Bf16 | T::F64),
            })
            .collect();
        Checkpoint {
            source: Source::Gguf,
            tensors,
        }
    }

    /// Where the tensors came from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// All tensors.
    pub fn tensors(&self) -> &[CheckpointTensor] {
        &self.tensors
    }

    /// Bytes of all tensors: the weights as stored, exactly.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }

    /// Bytes per stored type name.
    pub fn bytes_by_type(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for t in &self.tensors {
            *m.entry(t.type_name.clone()).or_insert(0) += t.bytes;
        }
        m
    }

    /// Bytes per decoder layer (see [`layer_index`]) and outside the layers.
    pub fn layer_bytes(&self) -> LayerBytes {
        let mut per_layer: Vec<u64> = Vec::new();
        let mut other = 0;
        for t in &self.tensors {
            match layer_index(&t.name).and_then(|i| usize::try_from(i).ok()) {
                // indices are bounded by the layer limit below; others count as "other"
                Some(i) if i < crate::limits::MAX_LAYERS as usize * 2 => {
                    if per_layer.len() <= i {
                        per_layer.resize(i + 1, 0);
                    }
                    per_layer[i] += t.bytes;
                }
                _ => other += t.bytes,
            }
        }
        LayerBytes { per_layer, other }
    }

    /// The storage scheme, from the tensor names (the conventions of each library's
    /// serialisation) and, for plain checkpoints, the most common dtype of the matrices.
    pub fn storage(&self) -> Storage {
        let has = |suffix: &str| self.tensors.iter().any(|t| t.name.ends_with(suffix));
        let contains = |part: &str| self.tensors.iter().any(|t| t.name.contains(part));
        if self.source == Source::Gguf {
            return Storage::Gguf(self.dominant_type(|_| true));
        }
        if has("_blocks") && has("_scales") {
            Storage::Mxfp4
        } else if has(".weight_scale_inv") {
            Storage::Fp8Block
        } else if has(".weight_packed") {
            Storage::CompressedPacked
        } else if has(".qweight") {
            if has(".g_idx") {
                Storage::Gptq
            } else {
                Storage::Awq
            }
        } else if has(".weight.absmax") || contains(".weight.quant_state.bitsandbytes__") {
            Storage::Bnb4 {
                nf4: !contains("bitsandbytes__fp4"),
                double_quant: has(".weight.nested_absmax"),
            }
        } else if has(".SCB") {
            Storage::BnbInt8
        } else if has(".weight_scale") && self.tensors.iter().any(|t| t.type_name.starts_with("F8"))
        {
            Storage::Fp8Scaled
        } else {
            Storage::Float(self.dominant_type(|t| t.shape.len() >= 2))
        }
    }

    fn dominant_type(&self, pick: impl Fn(&CheckpointTensor) -> bool) -> String {
        let mut by: BTreeMap<&str, u64> = BTreeMap::new();
        for t in self.tensors.iter().filter(|t| pick(t)) {
            *by.entry(&t.type_name).or_insert(0) += t.bytes;
        }
        by.into_iter()
            .max_by_key(|(_, b)| *b)
            .map_or_else(|| "none".into(), |(n, _)| n.to_string())
    }

    /// Checks the tensors against a description: every decoder layer of `desc` has tensors
    /// (layers beyond them are counted, not refused), and for plain floating-point
    /// safetensors each layer's stored parameters equal the description's
    /// (`LayerSpec::params`; non-parameter buffers such as `rotary_emb.inv_freq`, GPT-2's
    /// causal `attn.bias` and DeepSeek's `e_score_correction_bias` are left out). The error
    /// names the first mismatch.
    pub fn cross_check(&self, desc: &ModelDesc) -> Result<CrossCheck, FormatError> {
        let expected = desc.layers.len() as u64;
        let mut present = BTreeSet::new();
        for t in &self.tensors {
            if let Some(i) = layer_index(&t.name) {
                present.insert(i);
            }
        }
        if let Some(missing) = (0..expected).find(|i| !present.contains(i)) {
            return Err(mismatch(format!(
                "the description has {expected} decoder layers, but the checkpoint has no tensors for layer {missing}{}",
                if present.is_empty() {
                    " (no tensor name has a recognised layer prefix)".to_string()
                } else {
                    format!(" (it has {} layers)", present.len())
                }
            )));
        }
        let extra_layers = present.range(expected..).count() as u64;
        let plain = self.source == Source::Safetensors
            && matches!(self.storage(), Storage::Float(_))
            && self
                .tensors
                .iter()
                .all(|t| t.float || layer_index(&t.name).is_none() || is_buffer(&t.name));
        if plain {
            let mut per_layer = vec![0u128; desc.layers.len()];
            let mut first_name: Vec<Option<&str>> = vec![None; desc.layers.len()];
            for t in &self.tensors {
                if is_buffer(&t.name) {
                    continue;
                }
                if let Some(i) = layer_index(&t.name).and_then(|i| usize::try_from(i).ok()) {
                    if let Some(slot) = per_layer.get_mut(i) {
                        *slot += u128::from(t.numel);
                        first_name[i].get_or_insert(&t.name);
                    }
                }
            }
            for (i, (layer, stored)) in desc.layers.iter().zip(&per_layer).enumerate() {
                let want = layer.params(desc.hidden_size);
                if want != *stored {
                    return Err(mismatch(format!(
                        "layer {i} stores {stored} parameters (e.g. `{}`), the description has {want}",
                        first_name[i].unwrap_or("?")
                    )));
                }
            }
        }
        Ok(CrossCheck {
            layers: expected,
            extra_layers,
            params_compared: plain,
        })
    }
}

/// Non-parameter tensors some checkpoints store inside layers.
fn is_buffer(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
        || name.ends_with(".attn.bias")
            && (name.starts_with("transformer.h.") || name.starts_with("h."))
        || name.ends_with(".attn.masked_bias")
        || name.ends_with("e_score_correction_bias")
}

fn mismatch(reason: String) -> FormatError {
    FormatError::Inconsistent {
        fields: "checkpoint tensors, model description".into(),
        reason,
        hint: "the weights do not belong to this config (or the config was edited): use the config.json that came with the weights".into(),
    }
}

/// The decoder layer a tensor belongs to, from the prefixes transformers and llama.cpp use:
/// `model.layers.N.`, `model.language_model.layers.N.`, `model.decoder.layers.N.`,
/// `gpt_neox.layers.N.`, `transformer.h.N.`, `blk.N.`.
pub fn layer_index(name: &str) -> Option<u64> {
    const PREFIXES: &[&str] = &[
        "model.layers.",
        "model.language_model.layers.",
        "language_model.model.layers.",
        "model.decoder.layers.",
        "gpt_neox.layers.",
        "transformer.h.",
        "h.",
        "blk.",
    ];
    PREFIXES.iter().find_map(|p| {
        let rest = name.strip_prefix(p)?;
        let (index, _) = rest.split_once('.')?;
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        index.parse().ok()
    })
}
