//! GGUF `general.architecture` + hyper-parameters → the Hugging Face `config.json` the
//! model was converted from → the one architecture registry.
//!
//! Each mapping inverts llama.cpp's `convert_hf_to_gguf.py` (`set_gguf_parameters` of the
//! architecture's model class; key names from `gguf-py/gguf/constants.py` `Keys`), so a
//! GGUF file is described by the same normaliser as its `config.json`, with one normaliser
//! per family. What GGUF does not store is taken from the tensors (`output.weight` absent:
//! tied embeddings; `blk.0.attn_q.bias` present: attention biases; the rows of
//! `token_embd.weight`: the vocabulary) or left to the transformers config-class default
//! (activation, dropout). Not stored and not recoverable: Mistral's `sliding_window` (llama
//! architecture) and Starcoder2's; such models are described without a window.

use crate::error::FormatError;
use crate::gguf::{GgufHeader, GgufValue};
use crate::{families, raw::HfConfig};
use memwall_core::ModelDesc;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// The `general.architecture` values [`gguf_to_model`] maps, sorted.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "deepseek2",
    "falcon",
    "gemma",
    "gemma2",
    "gemma3",
    "gpt2",
    "gptneox",
    "llama",
    "olmo2",
    "phi3",
    "qwen2",
    "qwen2moe",
    "qwen3",
    "qwen3moe",
    "starcoder2",
];

/// Describes the model in a (single-file) GGUF header.
pub fn gguf_to_model(header: &GgufHeader) -> Result<ModelDesc, FormatError> {
    gguf_shards_to_model(std::slice::from_ref(header))
}

/// Describes the model of a GGUF split into several files (`llama-gguf-split`): metadata
/// from the first split (`split.no = 0`, else the first given), tensor names from all.
pub fn gguf_shards_to_model(shards: &[GgufHeader]) -> Result<ModelDesc, FormatError> {
    let config = gguf_shards_to_hf_config(shards)?;
    if !matches!(config, Value::Object(_)) {
        return Err(FormatError::MissingModelType);
    }
    // through the same parser as a config.json (the built config is small: a few KiB)
    families::normalise(&HfConfig::from_json(&config.to_string(), "")?)
}

/// The Hugging Face `config.json` equivalent to a GGUF header (what [`gguf_to_model`]
/// normalises); useful to show the user what was inferred.
pub fn gguf_to_hf_config(header: &GgufHeader) -> Result<Value, FormatError> {
    gguf_shards_to_hf_config(std::slice::from_ref(header))
}

/// As [`gguf_to_hf_config`] for a split GGUF.
pub fn gguf_shards_to_hf_config(shards: &[GgufHeader]) -> Result<Value, FormatError> {
    let first = shards
        .iter()
        .find(|h| h.split().is_some_and(|(no, _)| no == 0))
        .or_else(|| shards.first())
        .ok_or(FormatError::MissingModelType)?;
    let arch = first
        .architecture()
        .ok_or_else(|| FormatError::MissingField {
            field: "general.architecture".into(),
            model_type: "(GGUF)".into(),
            hint: "every GGUF model file names its architecture; this may be a vocabulary-only or adapter file".into(),
        })?
        .to_string();
    let names: BTreeSet<&str> = shards
        .iter()
        .flat_map(|h| h.tensors().iter().map(|t| t.name()))
        .collect();
    let g = Hparams {
        header: first,
        shards,
        arch: &arch,
        names: &names,
    };
    g.config().map(Value::Object)
}

/// Reads `{arch}.…` keys and tensor facts.
struct Hparams<'a> {
    header: &'a GgufHeader,
    shards: &'a [GgufHeader],
    arch: &'a str,
    names: &'a BTreeSet<&'a str>,
}

impl Hparams<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn model_type(&self) -> String {
        format!("{} (GGUF)", self.arch)
    }

    /// A non-negative integer; arrays (per-layer values) are accepted when all equal.
    fn uint(&self, suffix: &str) -> Result<Option<u64>, FormatError> {
        let key = self.key(suffix);
        let Some(v) = self.header.get(&key) else {
            return Ok(None);
        };
        if let Some(n) = v.as_u64() {
            return Ok(Some(n));
        }
        if let Some(a) = v.as_array() {
            let vals: Option<Vec<u64>> = a
                .values
                .as_ref()
                .map(|vs| vs.iter().filter_map(GgufValue::as_u64).collect());
            return match vals.as_deref() {
                Some([first, rest @ ..]) if rest.iter().all(|x| x == first) => Ok(Some(*first)),
                Some([_, ..]) => Err(FormatError::Unsupported {
                    field: key,
                    value: "per-layer values".into(),
                    reason: "layers of different sizes are not modelled for this architecture"
                        .into(),
                    hint: "use the model's config.json instead".into(),
                }),
                _ => Err(wrong(&key, "a non-negative integer")),
            };
        }
        Err(wrong(&key, "a non-negative integer"))
    }

    fn required(&self, suffix: &str) -> Result<u64, FormatError> {
        self.uint(suffix)?.ok_or_else(|| FormatError::MissingField {
            field: self.key(suffix),
            model_type: self.model_type(),
            hint: "llama.cpp writes this key for every model of the architecture; the file is incomplete".into(),
        })
    }

    fn float(&self, suffix: &str) -> Result<Option<f64>, FormatError> {
        let key = self.key(suffix);
        match self.header.get(&key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| wrong(&key, "a number")),
        }
    }

    fn has(&self, tensor: &str) -> bool {
        self.names.contains(tensor)
    }

    /// `ne[1]` of a tensor (the output features of a linear, the rows of an embedding).
    fn rows(&self, tensor: &str) -> Option<u64> {
        self.shards
            .iter()
            .find_map(|h| h.tensor(tensor))
            .and_then(|t| t.dims().get(1).copied())
    }

    /// Vocabulary: rows of `token_embd.weight`, else `{arch}.vocab_size`, else the length of
    /// `tokenizer.ggml.tokens` (llama.cpp pads the token list to the config's vocab_size).
    fn vocab(&self) -> Result<u64, FormatError> {
        if let Some(v) = self.rows("token_embd.weight") {
            return Ok(v);
        }
        if let Some(v) = self.uint("vocab_size")? {
            return Ok(v);
        }
        match self
            .header
            .get("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
        {
            Some(a) => Ok(a.len),
            None => Err(FormatError::MissingField {
                field: self.key("vocab_size"),
                model_type: self.model_type(),
                hint: "the file has neither token_embd.weight, a vocab_size key nor a token list"
                    .into(),
            }),
        }
    }

    /// Layers holding their own router (`ffn_gate_inp`): the MoE layers.
    fn dense_layers(&self, layers: u64) -> Vec<u64> {
        (0..layers)
            .filter(|i| !self.has(&format!("blk.{i}.ffn_gate_inp.weight")))
            .collect()
    }

    fn config(&self) -> Result<Map<String, Value>, FormatError> {
        let mut c = Map::new();
        let hidden = self.required("embedding_length")?;
        let heads = self.required("attention.head_count")?;
        let kv_heads = self.uint("attention.head_count_kv")?;
        // convert_hf_to_gguf.py writes block_count = num_hidden_layers (+ the MTP layers where
        // it keeps them, counted in nextn_predict_layers).
        let layers = self
            .required("block_count")?
            .saturating_sub(self.uint("nextn_predict_layers")?.unwrap_or(0));
        let vocab = self.vocab()?;
        c.insert("vocab_size".into(), json!(vocab));
        c.insert(
            "tie_word_embeddings".into(),
            json!(!self.has("output.weight")),
        );
        if let Some(ctx) = self.uint("context_length")? {
            c.insert("max_position_embeddings".into(), json!(ctx));
        }
        let ffn = self.uint("feed_forward_length")?;
        let key_length = self.uint("attention.key_length")?;
        let value_length = self.uint("attention.value_length")?;
        let rope_dims = self.uint("rope.dimension_count")?;
        let attn_bias = self.has("blk.0.attn_q.bias") || self.has("blk.0.attn_qkv.bias");
        let mlp_bias = self.has("blk.0.ffn_up.bias") || self.has("blk.0.ffn_down.bias");
        // TextModel.set_gguf_parameters writes key_length/value_length = head_dim when the
        // config has one; standard attention has one head size.
        let head_dim = match (key_length, value_length) {
            (Some(k), Some(v)) if k != v && self.arch != "deepseek2" => {
                return Err(FormatError::Unsupported {
                    field: self.key("attention.value_length"),
                    value: v.to_string(),
                    reason: format!("differs from attention.key_length = {k}; this architecture has one head size"),
                    hint: "use the model's config.json instead".into(),
                })
            }
            (k, _) => k,
        };
        let standard = |c: &mut Map<String, Value>, model_type: &str| {
            c.insert("model_type".into(), json!(model_type));
            c.insert("hidden_size".into(), json!(hidden));
            c.insert("num_hidden_layers".into(), json!(layers));
            c.insert("num_attention_heads".into(), json!(heads));
            c.insert(
                "num_key_value_heads".into(),
                json!(kv_heads.unwrap_or(heads)),
            );
            if let Some(f) = ffn {
                c.insert("intermediate_size".into(), json!(f));
            }
            if let Some(d) = head_dim {
                c.insert("head_dim".into(), json!(d));
            }
        };
        let sliding = self.uint("attention.sliding_window")?;
        match self.arch {
            "llama" => {
                let experts = self.uint("expert_count")?.unwrap_or(0);
                if experts > 0 {
                    // MixtralModel: LlamaModel + expert_count/expert_used_count
                    standard(&mut c, "mixtral");
                    c.insert("num_local_experts".into(), json!(experts));
                    c.insert(
                        "num_experts_per_tok".into(),
                        json!(self.required("expert_used_count")?),
                    );
                } else {
                    standard(&mut c, "llama");
                    c.insert("attention_bias".into(), json!(attn_bias));
                    c.insert("mlp_bias".into(), json!(mlp_bias));
                }
            }
            "qwen2" => standard(&mut c, "qwen2"),
            "qwen3" => {
                standard(&mut c, "qwen3");
                c.insert("attention_bias".into(), json!(attn_bias));
            }
            "qwen2moe" | "qwen3moe" => {
                let moe_type = if self.arch == "qwen2moe" {
                    "qwen2_moe"
                } else {
                    "qwen3_moe"
                };
                standard(&mut c, moe_type);
                c.insert("num_experts".into(), json!(self.required("expert_count")?));
                c.insert(
                    "num_experts_per_tok".into(),
                    json!(self.required("expert_used_count")?),
                );
                c.insert(
                    "moe_intermediate_size".into(),
                    json!(self.required("expert_feed_forward_length")?),
                );
                c.insert("decoder_sparse_step".into(), json!(1));
                c.insert("mlp_only_layers".into(), json!(self.dense_layers(layers)));
                if self.arch == "qwen2moe" {
                    // configuration_qwen2_moe.py qkv_bias (default True): the bias tensors
                    c.insert("qkv_bias".into(), json!(attn_bias));
                    // Qwen2MoeModel writes expert_shared_feed_forward_length; older files
                    // only have the shared expert's tensors.
                    let shared = match self.uint("expert_shared_feed_forward_length")? {
                        Some(s) => s,
                        None => self.rows("blk.0.ffn_up_shexp.weight").unwrap_or(0),
                    };
                    c.insert("shared_expert_intermediate_size".into(), json!(shared));
                } else {
                    c.insert("attention_bias".into(), json!(attn_bias));
                }
                // No GGUF key carries `norm_topk_prob` for these: llama.cpp's graphs fix it
                // (src/models/qwen3moe.cpp `build_moe_ffn(.., norm_w = true, ..)`, qwen2moe.cpp
                // `norm_w = false`), which is what Qwen3-MoE and Qwen1.5/2-MoE checkpoints set
                c.insert("norm_topk_prob".into(), json!(self.arch == "qwen3moe"));
            }
            "gemma" => standard(&mut c, "gemma"),
            "gemma2" => {
                standard(&mut c, "gemma2");
                if let Some(w) = sliding {
                    c.insert("sliding_window".into(), json!(w));
                }
                for k in ["attn_logit_softcapping", "final_logit_softcapping"] {
                    if let Some(v) = self.float(k)? {
                        c.insert(k.into(), json!(v));
                    }
                }
            }
            "gemma3" => {
                standard(&mut c, "gemma3_text");
                if let Some(w) = sliding {
                    c.insert("sliding_window".into(), json!(w));
                }
                if let Some(types) = self.layer_types(layers)? {
                    c.insert("layer_types".into(), json!(types));
                }
            }
            "phi3" => {
                standard(&mut c, "phi3");
                if let Some(w) = sliding {
                    c.insert("sliding_window".into(), json!(w));
                }
                self.partial_rotary(
                    &mut c,
                    "partial_rotary_factor",
                    rope_dims,
                    hidden,
                    heads,
                    head_dim,
                )?;
            }
            "starcoder2" => {
                standard(&mut c, "starcoder2");
                c.insert("use_bias".into(), json!(attn_bias || mlp_bias));
                if let Some(w) = sliding {
                    c.insert("sliding_window".into(), json!(w));
                }
            }
            "olmo2" => standard(&mut c, "olmo2"),
            "gpt2" => {
                c.insert("model_type".into(), json!("gpt2"));
                c.insert("n_embd".into(), json!(hidden));
                c.insert("n_layer".into(), json!(layers));
                c.insert("n_head".into(), json!(heads));
                if let Some(f) = ffn {
                    c.insert("n_inner".into(), json!(f));
                }
                if let Some(ctx) = self.uint("context_length")? {
                    c.insert("n_positions".into(), json!(ctx));
                }
            }
            "gptneox" => {
                standard(&mut c, "gpt_neox");
                self.partial_rotary(&mut c, "rotary_pct", rope_dims, hidden, heads, head_dim)?;
                if let Some(p) = self.header.get(&self.key("use_parallel_residual")) {
                    let p = p
                        .as_bool()
                        .ok_or_else(|| wrong(&self.key("use_parallel_residual"), "a boolean"))?;
                    c.insert("use_parallel_residual".into(), json!(p));
                }
            }
            "falcon" => self.falcon(&mut c, hidden, layers, heads, kv_heads, ffn)?,
            "deepseek2" => self.deepseek(&mut c, hidden, layers, heads, ffn)?,
            other => {
                return Err(FormatError::Unsupported {
                    field: "general.architecture".into(),
                    value: format!("\"{other}\""),
                    reason:
                        "memwall has no mapping from this GGUF architecture to a model description"
                            .into(),
                    hint: format!(
                        "supported GGUF architectures: {}; or pass the model's config.json",
                        SUPPORTED_ARCHITECTURES.join(", ")
                    ),
                })
            }
        }
        Ok(c)
    }

    /// `rope.dimension_count` as a fraction of the head (Phi-3 `partial_rotary_factor`,
    /// GPT-NeoX `rotary_pct`); written only when it is not the whole head.
    #[allow(clippy::cast_precision_loss)]
    fn partial_rotary(
        &self,
        c: &mut Map<String, Value>,
        field: &str,
        rope_dims: Option<u64>,
        hidden: u64,
        heads: u64,
        head_dim: Option<u64>,
    ) -> Result<(), FormatError> {
        let head = head_dim.unwrap_or(hidden.checked_div(heads).unwrap_or(0));
        if let Some(r) = rope_dims.filter(|&r| head > 0 && r != head) {
            // sizes are bounded far below 2^52, so the ratio is exact enough for `int()`.
            c.insert(field.into(), json!(r as f64 / head as f64));
        }
        Ok(())
    }

    /// Gemma 3 `{arch}.attention.sliding_window_pattern` (newer converters write one bool
    /// per layer) as transformers `layer_types`.
    fn layer_types(&self, layers: u64) -> Result<Option<Vec<&'static str>>, FormatError> {
        let key = self.key("attention.sliding_window_pattern");
        let Some(v) = self.header.get(&key) else {
            return Ok(None);
        };
        match v.as_array().and_then(|a| a.values.as_ref()) {
            Some(vs) if vs.len() as u64 == layers => vs
                .iter()
                .map(|b| {
                    b.as_bool()
                        .map(|s| {
                            if s {
                                "sliding_attention"
                            } else {
                                "full_attention"
                            }
                        })
                        .ok_or_else(|| wrong(&key, "an array of booleans"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            // a period (older files): the transformers default pattern applies
            _ if v.as_u64().is_some() => Ok(None),
            _ => Err(wrong(&key, "one boolean per layer")),
        }
    }

    /// FalconModel: `attn_norm_2` tensors mark the new decoder architecture (40B/180B);
    /// otherwise one key/value head means the 7B multi-query layout.
    fn falcon(
        &self,
        c: &mut Map<String, Value>,
        hidden: u64,
        layers: u64,
        heads: u64,
        kv_heads: Option<u64>,
        ffn: Option<u64>,
    ) -> Result<(), FormatError> {
        c.insert("model_type".into(), json!("falcon"));
        c.insert("hidden_size".into(), json!(hidden));
        c.insert("num_hidden_layers".into(), json!(layers));
        c.insert("num_attention_heads".into(), json!(heads));
        if let Some(f) = ffn {
            c.insert("ffn_hidden_size".into(), json!(f));
        }
        let kv = kv_heads.unwrap_or(heads);
        c.insert("bias".into(), json!(self.has("blk.0.attn_qkv.bias")));
        if self.has("blk.0.attn_norm_2.weight") {
            c.insert("new_decoder_architecture".into(), json!(true));
            c.insert("num_kv_heads".into(), json!(kv));
        } else if kv == 1 {
            c.insert("new_decoder_architecture".into(), json!(false));
            c.insert("multi_query".into(), json!(true));
        } else {
            return Err(FormatError::Unsupported {
                field: self.key("attention.head_count_kv"),
                value: kv.to_string(),
                reason: "a Falcon without the new decoder architecture and with several key/value heads (RefinedWeb-1B style) cannot be told apart from the GGUF keys".into(),
                hint: "pass the model's config.json instead".into(),
            });
        }
        Ok(())
    }

    /// DeepseekV2Model (llama.cpp `deepseek2` serves DeepSeek-V2 and V3). Since llama.cpp's
    /// MLA change, `attention.key_length`/`value_length` describe the compressed cache
    /// (`kv_lora_rank + qk_rope_head_dim`, `kv_lora_rank`) and the per-head sizes are in
    /// `key_length_mla`/`value_length_mla`; older files have them in `key_length`/`value_length`.
    fn deepseek(
        &self,
        c: &mut Map<String, Value>,
        hidden: u64,
        layers: u64,
        heads: u64,
        ffn: Option<u64>,
    ) -> Result<(), FormatError> {
        // ExpertGatingFuncType: SOFTMAX = 1 (V2), SIGMOID = 2 (V3)
        let gating = self.uint("expert_gating_func")?;
        if gating != Some(2) {
            return Err(FormatError::Unsupported {
                field: self.key("expert_gating_func"),
                value: gating.map_or("absent".into(), |g| g.to_string()),
                reason: "softmax gating is DeepSeek-V2, which memwall does not model (DeepSeek-V3 uses sigmoid gating, value 2)".into(),
                hint: "supported: DeepSeek-V3-architecture GGUF files".into(),
            });
        }
        let rope = self.required("rope.dimension_count")?;
        let qk_head = match self.uint("attention.key_length_mla")? {
            Some(k) => k,
            None => self.required("attention.key_length")?,
        };
        let v_head = match self.uint("attention.value_length_mla")? {
            Some(v) => v,
            None => self.required("attention.value_length")?,
        };
        let nope = qk_head.checked_sub(rope).filter(|&n| n > 0).ok_or_else(|| {
            FormatError::Inconsistent {
                fields: format!(
                    "`{}`, `{}`",
                    self.key("attention.key_length_mla"),
                    self.key("rope.dimension_count")
                ),
                reason: format!("a query/key head of {qk_head} cannot hold {rope} rotary dimensions and a non-rotary part"),
                hint: "the file is inconsistent; use the model's config.json".into(),
            }
        })?;
        c.insert("model_type".into(), json!("deepseek_v3"));
        // attention_bias puts biases on q_a_proj and kv_a_proj_with_mqa (modeling_deepseek_v3.py)
        let bias = self.has("blk.0.attn_kv_a_mqa.bias") || self.has("blk.0.attn_q_a.bias");
        c.insert("attention_bias".into(), json!(bias));
        c.insert("hidden_size".into(), json!(hidden));
        c.insert("num_hidden_layers".into(), json!(layers));
        c.insert("num_attention_heads".into(), json!(heads));
        if let Some(f) = ffn {
            c.insert("intermediate_size".into(), json!(f));
        }
        c.insert(
            "q_lora_rank".into(),
            json!(self.uint("attention.q_lora_rank")?),
        );
        c.insert(
            "kv_lora_rank".into(),
            json!(self.required("attention.kv_lora_rank")?),
        );
        c.insert("qk_rope_head_dim".into(), json!(rope));
        c.insert("qk_nope_head_dim".into(), json!(nope));
        c.insert("v_head_dim".into(), json!(v_head));
        c.insert(
            "first_k_dense_replace".into(),
            json!(self.uint("leading_dense_block_count")?.unwrap_or(0)),
        );
        c.insert(
            "n_routed_experts".into(),
            json!(self.required("expert_count")?),
        );
        c.insert(
            "n_shared_experts".into(),
            json!(self.uint("expert_shared_count")?.unwrap_or(0)),
        );
        c.insert(
            "num_experts_per_tok".into(),
            json!(self.required("expert_used_count")?),
        );
        c.insert(
            "moe_intermediate_size".into(),
            json!(self.required("expert_feed_forward_length")?),
        );
        // Group-limited routing: files written before llama.cpp added the group keys (and
        // DeepSeek-V2/V2-Lite, which route without groups) have none; llama.cpp reads both as
        // optional (src/llama-model.cpp `load_hparams`: `ml.get_key(LLM_KV_EXPERT_GROUP_COUNT,
        // hparams.n_expert_groups, false)`, default 0: no group selection). No groups is one
        // group keeping one group in the HF config, not DeepseekV3Config's 671B defaults (8
        // groups, keep 4), which would split a small file's experts into groups its router
        // never used (and be refused with fewer than two experts per group).
        for (gguf, hf) in [
            ("expert_group_count", "n_group"),
            ("expert_group_used_count", "topk_group"),
        ] {
            let v = self.uint(gguf)?.unwrap_or(1);
            c.insert(hf.into(), json!(v));
        }
        // llama.cpp's convert_hf_to_gguf.py writes `norm_topk_prob` as `expert_weights_norm`
        // (`add_expert_weights_norm`); absent: the config default (true)
        let key = self.key("expert_weights_norm");
        if let Some(v) = self.header.get(&key) {
            let norm = v.as_bool().ok_or_else(|| wrong(&key, "a boolean"))?;
            c.insert("norm_topk_prob".into(), json!(norm));
        }
        Ok(())
    }
}

fn wrong(key: &str, expected: &str) -> FormatError {
    FormatError::WrongType {
        field: key.into(),
        message: format!("expected {expected}"),
        hint: "the GGUF metadata has an unexpected type; the file was not written by llama.cpp's converter".into(),
    }
}
