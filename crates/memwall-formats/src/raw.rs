//! The raw `config.json`: Hugging Face field names verbatim, every field optional.
//!
//! Families spell the same quantity differently (`n_embd` in GPT-2, `hidden_size` elsewhere);
//! the raw struct keeps each spelling as its own field and each normaliser reads the spellings
//! its transformers config class accepts (its `attribute_map`), so a key that transformers
//! ignores for a family is ignored here too. `null` is read as "absent" (the config-class
//! default applies), except `q_lora_rank` where `null` means "no query compression" and the
//! Gemma 2 soft-capping keys where `null` turns soft-capping off.
//!
//! The text is parsed once, straight into this struct: keys memwall does not read are skipped
//! without being built (no `serde_json::Value` tree), nested objects that only some families
//! read (`text_config`, `rope_scaling`) are kept as their raw text and parsed when read, and
//! lists are capped at one entry per possible layer. Memory therefore stays within a small
//! multiple of the text's size whatever the text holds; nesting is capped by serde_json's
//! recursion limit (128).

use crate::error::FormatError;
use crate::resolve::limits::MAX_LAYERS;
use memwall_core::error::untrusted;
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;
use std::marker::PhantomData;

/// Raw fields of a transformers `config.json` that matter to the memory model.
#[derive(Debug, Default, Clone, Deserialize)]
#[allow(missing_docs)] // field names are the Hugging Face keys verbatim
pub(crate) struct HfConfig {
    pub model_type: Option<String>,

    // sizes
    pub vocab_size: Option<u64>,
    pub hidden_size: Option<u64>,
    pub n_embd: Option<u64>,
    pub n_embed: Option<u64>,
    pub intermediate_size: Option<u64>,
    pub n_inner: Option<u64>,
    pub ffn_dim: Option<u64>,
    pub ffn_hidden_size: Option<u64>,
    pub num_hidden_layers: Option<u64>,
    pub n_layer: Option<u64>,
    pub num_attention_heads: Option<u64>,
    pub n_head: Option<u64>,
    pub num_key_value_heads: Option<u64>,
    pub num_kv_heads: Option<u64>,
    pub multi_query: Option<bool>,
    pub head_dim: Option<u64>,
    pub max_position_embeddings: Option<u64>,
    pub n_positions: Option<u64>,
    pub tie_word_embeddings: Option<bool>,
    pub use_cache: Option<bool>,

    // activation
    pub hidden_act: Option<String>,
    pub hidden_activation: Option<String>,
    pub activation_function: Option<String>,
    pub activation: Option<String>,

    // positions
    pub rotary_pct: Option<f64>,
    pub partial_rotary_factor: Option<f64>,
    pub rope_parameters: Option<Box<RawValue>>,
    pub rope_scaling: Option<Box<RawValue>>,
    pub alibi: Option<bool>,

    // attention pattern
    #[serde(skip)]
    pub sliding_window: Option<u64>,
    #[serde(
        rename = "sliding_window",
        default,
        deserialize_with = "present_or_null"
    )]
    pub sliding_window_raw: Option<Option<u64>>,
    #[serde(default, deserialize_with = "at_most_one_per_layer")]
    pub layer_types: Option<Vec<String>>,
    pub use_sliding_window: Option<bool>,
    pub max_window_layers: Option<u64>,
    pub sliding_window_pattern: Option<SlidingPattern>,
    pub use_bidirectional_attention: Option<bool>,
    pub query_pre_attn_scalar: Option<f64>,
    #[serde(skip)]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(skip)]
    pub final_logit_softcapping: Option<f64>,
    #[serde(
        rename = "attn_logit_softcapping",
        default,
        deserialize_with = "present_or_null"
    )]
    pub attn_logit_softcapping_raw: Option<Option<f64>>,
    #[serde(
        rename = "final_logit_softcapping",
        default,
        deserialize_with = "present_or_null"
    )]
    pub final_logit_softcapping_raw: Option<Option<f64>>,

    // mixture of experts
    pub num_local_experts: Option<u64>,
    pub num_experts: Option<u64>,
    pub n_routed_experts: Option<u64>,
    pub num_experts_per_tok: Option<u64>,
    #[serde(default, deserialize_with = "one_or_uniform_per_layer")]
    pub moe_intermediate_size: Option<u64>,
    pub shared_expert_intermediate_size: Option<u64>,
    pub n_shared_experts: Option<u64>,
    pub first_k_dense_replace: Option<u64>,
    pub decoder_sparse_step: Option<u64>,
    #[serde(default, deserialize_with = "at_most_one_per_layer")]
    pub mlp_only_layers: Option<Vec<u64>>,
    pub n_group: Option<u64>,
    pub topk_group: Option<u64>,
    pub norm_topk_prob: Option<bool>,

    // multi-head latent attention
    #[serde(default, deserialize_with = "present_or_null")]
    pub q_lora_rank: Option<Option<u64>>,
    pub kv_lora_rank: Option<u64>,
    pub qk_nope_head_dim: Option<u64>,
    pub qk_rope_head_dim: Option<u64>,
    pub v_head_dim: Option<u64>,

    // dropout
    pub attention_dropout: Option<f64>,
    pub attn_pdrop: Option<f64>,
    pub resid_pdrop: Option<f64>,
    pub embd_pdrop: Option<f64>,
    pub hidden_dropout: Option<f64>,
    pub dropout: Option<f64>,
    pub residual_dropout: Option<f64>,
    pub embedding_dropout: Option<f64>,

    // biases
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    pub bias: Option<bool>,
    pub use_bias: Option<bool>,
    pub enable_bias: Option<bool>,
    pub qkv_bias: Option<bool>,

    // OPT
    pub do_layer_norm_before: Option<bool>,
    pub word_embed_proj_dim: Option<u64>,
    #[serde(rename = "_remove_final_layer_norm")]
    pub remove_final_layer_norm: Option<bool>,
    pub layer_norm_elementwise_affine: Option<bool>,

    // Falcon
    pub new_decoder_architecture: Option<bool>,
    pub parallel_attn: Option<bool>,
    pub num_ln_in_parallel_attn: Option<u64>,

    // GPT-NeoX
    pub use_parallel_residual: Option<bool>,

    // GPT-2
    pub add_cross_attention: Option<bool>,

    // multimodal wrappers (gemma3): kept as text, parsed by the family that reads it
    pub text_config: Option<Box<RawValue>>,

    // the checkpoint's dtype: any JSON type is accepted (a non-string is ignored)
    pub torch_dtype: Option<Box<RawValue>>,
    pub dtype: Option<Box<RawValue>>,

    /// Keys whose value is an explicit JSON `null` where `null` differs from absent
    /// (`attn_logit_softcapping`, `final_logit_softcapping`, `sliding_window`).
    #[serde(skip)]
    pub explicit_nulls: Vec<String>,

    // state-space mixers (Mamba2Config)
    pub num_heads: Option<u64>,
    pub state_size: Option<u64>,
    pub n_groups: Option<u64>,
    pub expand: Option<u64>,
    pub conv_kernel: Option<u64>,
    pub chunk_size: Option<u64>,
    pub use_conv_bias: Option<bool>,
    pub residual_in_fp32: Option<bool>,

    // hybrid Mamba-2 + attention (GraniteMoeHybridConfig)
    pub mamba_n_heads: Option<u64>,
    /// A size, or `"auto"` (FalconH1Config: `mamba_intermediate // mamba_n_heads`).
    pub mamba_d_head: Option<RankOrAuto>,
    pub mamba_d_state: Option<u64>,
    pub mamba_n_groups: Option<u64>,
    pub mamba_d_conv: Option<u64>,
    pub mamba_expand: Option<u64>,
    pub mamba_chunk_size: Option<u64>,
    pub mamba_conv_bias: Option<bool>,
    pub mamba_proj_bias: Option<bool>,
    pub shared_intermediate_size: Option<u64>,
    pub position_embedding_type: Option<String>,
    // families of issue 14 (OLMoE, gpt-oss, Granite MoE, ERNIE 4.5 MoE)
    pub clip_qkv: Option<f64>,
    pub swiglu_limit: Option<f64>,
    pub moe_num_experts: Option<u64>,
    pub moe_k: Option<u64>,
    pub moe_num_shared_experts: Option<u64>,
    pub moe_layer_start_index: Option<i64>,
    pub moe_layer_end_index: Option<i64>,
    pub moe_layer_interval: Option<u64>,
    // Llama 4 (`llama4/configuration_llama4.py` Llama4TextConfig)
    pub intermediate_size_mlp: Option<u64>,
    #[serde(default, deserialize_with = "at_most_one_per_layer")]
    pub moe_layers: Option<Vec<u64>>,
    pub interleave_moe_layer_step: Option<u64>,
    pub use_qk_norm: Option<bool>,
    #[serde(default, deserialize_with = "at_most_one_per_layer")]
    pub no_rope_layers: Option<Vec<u64>>,
    pub no_rope_layer_interval: Option<u64>,
    #[serde(default, deserialize_with = "present_or_null")]
    pub attention_chunk_size: Option<Option<u64>>,
    pub attn_temperature_tuning: Option<bool>,

    // multimodal wrappers: the vision tower's config, kept as text, parsed by `vision.rs`
    pub vision_config: Option<Box<RawValue>>,
    pub spatial_merge_size: Option<u64>,
    /// Gemma 3: LLM tokens per image (`Gemma3Config.mm_tokens_per_image`).
    pub mm_tokens_per_image: Option<u64>,
    pub vision_feature_layer: Option<Box<RawValue>>,
    pub multimodal_projector_bias: Option<bool>,
    // Seed-OSS: bias of o_proj (q/k/v follow attention_bias)
    pub attention_out_bias: Option<bool>,
    // Phi (phi-2): LayerNorm on q/k per head
    pub qk_layernorm: Option<bool>,
    // HunYuan MoE (`HunYuanMoEV1Config.moe_topk`: an int, or one entry per layer)
    #[serde(default, deserialize_with = "one_or_per_layer")]
    pub moe_topk: Option<OneOrPerLayer>,
    // Qwen3-Next gated DeltaNet (`qwen3_next/configuration_qwen3_next.py` Qwen3NextConfig)
    pub linear_conv_kernel_dim: Option<u64>,
    pub linear_key_head_dim: Option<u64>,
    pub linear_value_head_dim: Option<u64>,
    pub linear_num_key_heads: Option<u64>,
    pub linear_num_value_heads: Option<u64>,
    pub full_attention_interval: Option<u64>,
    // Mamba-1 (MambaConfig): `time_step_rank` is a number or "auto" (ceil(hidden / 16))
    pub time_step_rank: Option<RankOrAuto>,
    // Jamba (JambaConfig): attention / MoE layer placement, Mamba-1 dt rank
    pub attn_layer_period: Option<u64>,
    pub attn_layer_offset: Option<u64>,
    pub expert_layer_period: Option<u64>,
    pub expert_layer_offset: Option<u64>,
    pub mamba_dt_rank: Option<RankOrAuto>,
    // Falcon-H1 (`falcon_h1/configuration_falcon_h1.py` FalconH1Config): `mamba_d_ssm` absent
    // is the class default 1024, `null` is `mamba_expand * hidden_size`
    #[serde(default, deserialize_with = "present_or_null")]
    pub mamba_d_ssm: Option<Option<u64>>,
    pub mamba_rms_norm: Option<bool>,
    pub mamba_norm_before_gate: Option<bool>,
    pub projectors_bias: Option<bool>,
    #[serde(default, deserialize_with = "at_most_one_per_layer")]
    pub mlp_multipliers: Option<Vec<f64>>,
    #[serde(default, deserialize_with = "at_most_one_per_layer")]
    pub ssm_multipliers: Option<Vec<f64>>,
    #[serde(default, deserialize_with = "present_or_null")]
    pub num_logits_to_keep: Option<Option<u64>>,
}

/// A value given once, or once per layer (HunYuan MoE's `moe_topk`).
#[derive(Debug, Clone)]
pub(crate) enum OneOrPerLayer {
    /// The same value for every layer.
    One(u64),
    /// One value per layer.
    PerLayer(Vec<u64>),
}

/// A size that may be given as `"auto"` (MambaConfig `time_step_rank`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RankOrAuto {
    /// An explicit size.
    Rank(u64),
    /// A word (`"auto"` is the only one transformers accepts).
    Word(String),
}

/// `sliding_window_pattern`: a count (every n-th layer is global: Gemma 3, EXAONE 4) or a
/// letter pattern such as `"LLLG"` (EXAONE 4 configs, which then also list `layer_types`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum SlidingPattern {
    /// Every n-th layer is global.
    Every(u64),
    /// One letter per layer of a repeating block (`L` local, `G` global).
    Letters(String),
}

/// A nested config object (`text_config`), as found.
#[derive(Debug)]
pub(crate) enum Nested {
    /// The key is absent (or `null`).
    Absent,
    /// The key holds something other than an object: its JSON text, made safe to show.
    NotObject(String),
    /// The key holds an object, parsed.
    Object(Box<HfConfig>),
}

/// `Some(None)` for an explicit `null`, `Some(Some(v))` for a value, `None` (via `default`) when absent.
fn present_or_null<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// A list with at most one entry per possible layer ([`MAX_LAYERS`]): a longer one is refused
/// while it is read, before it can take memory. `null` reads as absent.
fn at_most_one_per_layer<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
        type Value = Option<Vec<T>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a list of at most {MAX_LAYERS} entries (one per layer)")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_seq(self)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element()? {
                if out.len() as u64 >= MAX_LAYERS {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_LAYERS} entries; a model has at most {MAX_LAYERS} layers"
                    )));
                }
                out.push(item);
            }
            Ok(Some(out))
        }
    }
    d.deserialize_option(Bounded(PhantomData))
}

/// The `partial_rotary_factor` of a `rope_scaling`/`rope_parameters` object; other keys skipped.
#[derive(Deserialize)]
struct RopeDict {
    partial_rotary_factor: Option<Box<RawValue>>,
}

/// The dtype keys of a nested config; other keys skipped.
#[derive(Deserialize)]
struct DtypeProbe {
    pub torch_dtype: Option<Box<RawValue>>,
    pub dtype: Option<Box<RawValue>>,
}

/// Whether raw JSON text is an object.
fn is_object(raw: &RawValue) -> bool {
    raw.get().trim_start().starts_with('{')
}

/// A JSON string's content, or `None` for any other JSON value.
fn as_string(raw: &RawValue) -> Option<String> {
    serde_json::from_str::<String>(raw.get()).ok()
}

impl HfConfig {
    /// Parses the text of a config object in one pass; unknown keys are skipped (a
    /// config.json carries many that do not shape the model). A key of the wrong type is
    /// reported by name: `prefix` is prepended to it (`"text_config."` for nested configs).
    pub(crate) fn from_json(text: &str, prefix: &str) -> Result<Self, FormatError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let parsed = serde_path_to_error::deserialize::<_, HfConfig>(&mut de)
            .map_err(|e| {
                let path = e.path().to_string();
                (path, e.into_inner())
            })
            .and_then(|c| de.end().map(|()| c).map_err(|e| (String::new(), e)));
        match parsed {
            Ok(mut c) => {
                for (key, raw, value) in [
                    (
                        "attn_logit_softcapping",
                        c.attn_logit_softcapping_raw,
                        &mut c.attn_logit_softcapping,
                    ),
                    (
                        "final_logit_softcapping",
                        c.final_logit_softcapping_raw,
                        &mut c.final_logit_softcapping,
                    ),
                ] {
                    match raw {
                        Some(None) => c.explicit_nulls.push(key.to_owned()),
                        Some(Some(v)) => *value = Some(v),
                        None => {}
                    }
                }
                // `sliding_window: null` differs from absent where the class default is a
                // window (EXAONE 4: 4096)
                match c.sliding_window_raw {
                    Some(None) => c.explicit_nulls.push("sliding_window".to_owned()),
                    Some(Some(w)) => c.sliding_window = Some(w),
                    None => {}
                }
                Ok(c)
            }
            Err((_, e)) if e.is_syntax() || e.is_eof() || e.is_io() => Err(FormatError::Json {
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            }),
            Err((path, e)) => {
                if !text.trim_start().starts_with('{') {
                    return Err(FormatError::WrongType {
                        field: format!("{prefix}(root)"),
                        message: "expected a JSON object".into(),
                        hint: "config.json is one JSON object of `key: value` pairs".into(),
                    });
                }
                if path.is_empty() || path == "." {
                    // an error about the object itself: a key given twice
                    return Err(FormatError::WrongType {
                        field: format!("{prefix}(root)"),
                        message: e.to_string(),
                        hint: "each key of a config.json appears once; remove the repeated key"
                            .into(),
                    });
                }
                let key = format!("{prefix}{path}");
                Err(FormatError::WrongType {
                    hint: format!(
                        "`{}` must have the JSON type its transformers config class declares (sizes are non-negative integers, flags are true/false, probabilities are numbers, per-layer lists have one entry per layer)",
                        untrusted(&key)
                    ),
                    field: key,
                    message: e.to_string(),
                })
            }
        }
    }

    /// The nested `text_config` (multimodal wrappers), parsed now.
    pub(crate) fn text_config(&self, prefix: &str) -> Result<Nested, FormatError> {
        match &self.text_config {
            None => Ok(Nested::Absent),
            Some(raw) if is_object(raw) => Ok(Nested::Object(Box::new(HfConfig::from_json(
                raw.get(),
                &format!("{prefix}text_config."),
            )?))),
            Some(raw) => Ok(Nested::NotObject(untrusted(raw.get()))),
        }
    }

    /// The checkpoint's dtype as the config states it (`torch_dtype`, or transformers ≥ 4.56's
    /// `dtype`; in a multimodal wrapper, its `text_config`'s), when it is a string.
    pub(crate) fn checkpoint_dtype(&self) -> Option<String> {
        let own = self
            .torch_dtype
            .as_deref()
            .and_then(as_string)
            .or_else(|| self.dtype.as_deref().and_then(as_string));
        own.or_else(|| {
            let raw = self.text_config.as_deref().filter(|r| is_object(r))?;
            let probe: DtypeProbe = serde_json::from_str(raw.get()).ok()?;
            probe
                .torch_dtype
                .as_deref()
                .and_then(as_string)
                .or_else(|| probe.dtype.as_deref().and_then(as_string))
        })
    }

    /// `partial_rotary_factor` stored inside `rope_parameters` (transformers ≥ 5) or
    /// `rope_scaling` (older configs); transformers' `convert_rope_params_to_dict` takes
    /// `rope_scaling or rope_parameters` (`modeling_rope_utils.py`).
    pub(crate) fn rope_dict_partial_factor(
        &self,
        prefix: &str,
    ) -> Result<Option<f64>, FormatError> {
        for (name, v) in [
            ("rope_scaling", &self.rope_scaling),
            ("rope_parameters", &self.rope_parameters),
        ] {
            // a non-object is ignored, as transformers ignores it
            let Some(raw) = v.as_deref().filter(|r| is_object(r)) else {
                continue;
            };
            let dict: RopeDict =
                serde_json::from_str(raw.get()).map_err(|e| FormatError::WrongType {
                    field: format!("{prefix}{name}"),
                    message: e.to_string(),
                    hint: format!("`{prefix}{name}` is an object of rotary settings"),
                })?;
            let Some(factor) = dict.partial_rotary_factor else {
                continue;
            };
            match serde_json::from_str::<Option<f64>>(factor.get()) {
                Ok(None) => continue,
                Ok(Some(f)) => return Ok(Some(f)),
                Err(_) => {
                    return Err(FormatError::WrongType {
                        field: format!("{prefix}{name}.partial_rotary_factor"),
                        message: format!("expected a number, found {}", factor.get()),
                        hint: "the rotary fraction is a number in (0, 1]".into(),
                    })
                }
            }
        }
        Ok(None)
    }
}

/// An integer, or a list of at most one integer per layer ([`MAX_LAYERS`]); `null` reads as
/// absent (HunYuan MoE's `moe_topk`, `moe_intermediate_size`).
fn one_or_per_layer<'de, D>(d: D) -> Result<Option<OneOrPerLayer>, D::Error>
where
    D: Deserializer<'de>,
{
    struct OneOrList;
    impl<'de> Visitor<'de> for OneOrList {
        type Value = Option<OneOrPerLayer>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "a non-negative integer or a list of at most {MAX_LAYERS} of them (one per layer)"
            )
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_any(self)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(OneOrPerLayer::One(v)))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element::<u64>()? {
                if out.len() as u64 >= MAX_LAYERS {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_LAYERS} entries; a model has at most {MAX_LAYERS} layers"
                    )));
                }
                out.push(item);
            }
            Ok(Some(OneOrPerLayer::PerLayer(out)))
        }
    }
    d.deserialize_option(OneOrList)
}

/// As [`one_or_per_layer`], for a size the families read once: a list must repeat one value
/// (Hunyuan-A13B's config lists `moe_intermediate_size` per layer, all equal).
fn one_or_uniform_per_layer<'de, D>(d: D) -> Result<Option<u64>, D::Error>
where
    D: Deserializer<'de>,
{
    match one_or_per_layer(d)? {
        None => Ok(None),
        Some(OneOrPerLayer::One(v)) => Ok(Some(v)),
        Some(OneOrPerLayer::PerLayer(v)) => match v.split_first() {
            None => Ok(None),
            Some((first, rest)) if rest.iter().all(|x| x == first) => Ok(Some(*first)),
            Some(_) => Err(serde::de::Error::custom(
                "a per-layer list with different values; memwall reads one value for every layer",
            )),
        },
    }
}
