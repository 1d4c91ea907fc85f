//! The raw `config.json`: Hugging Face field names verbatim, every field optional.
//!
//! Families spell the same quantity differently (`n_embd` in GPT-2, `hidden_size` elsewhere);
//! the raw struct keeps each spelling as its own field and each normaliser reads the spellings
//! its transformers config class accepts (its `attribute_map`), so a key that transformers
//! ignores for a family is ignored here too. `null` is read as "absent" (the config-class
//! default applies), except `q_lora_rank` where `null` means "no query compression".

use crate::error::FormatError;
use serde::Deserialize;
use serde_json::{Map, Value};

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

    // activation
    pub hidden_act: Option<String>,
    pub hidden_activation: Option<String>,
    pub activation_function: Option<String>,
    pub activation: Option<String>,

    // positions
    pub rotary_pct: Option<f64>,
    pub partial_rotary_factor: Option<f64>,
    pub rope_parameters: Option<Value>,
    pub rope_scaling: Option<Value>,
    pub alibi: Option<bool>,

    // attention pattern
    pub sliding_window: Option<u64>,
    pub layer_types: Option<Vec<String>>,
    pub use_sliding_window: Option<bool>,
    pub max_window_layers: Option<u64>,
    pub sliding_window_pattern: Option<u64>,
    pub use_bidirectional_attention: Option<bool>,
    pub query_pre_attn_scalar: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,

    // mixture of experts
    pub num_local_experts: Option<u64>,
    pub num_experts: Option<u64>,
    pub n_routed_experts: Option<u64>,
    pub num_experts_per_tok: Option<u64>,
    pub moe_intermediate_size: Option<u64>,
    pub shared_expert_intermediate_size: Option<u64>,
    pub n_shared_experts: Option<u64>,
    pub first_k_dense_replace: Option<u64>,
    pub decoder_sparse_step: Option<u64>,
    pub mlp_only_layers: Option<Vec<u64>>,
    pub n_group: Option<u64>,
    pub topk_group: Option<u64>,

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

    // multimodal wrappers (gemma3)
    pub text_config: Option<Value>,

    /// Keys whose value is an explicit JSON `null` (where `null` differs from absent).
    #[serde(skip)]
    pub explicit_nulls: Vec<String>,
}

/// `Some(None)` for an explicit `null`, `Some(Some(v))` for a value, `None` (via `default`) when absent.
fn present_or_null<'de, D>(d: D) -> Result<Option<Option<u64>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Option::<u64>::deserialize(d).map(Some)
}

impl HfConfig {
    /// Reads the known keys of a JSON object; unknown keys are ignored (a config.json carries
    /// many that do not shape the model). A key of the wrong type is reported by name:
    /// `prefix` is prepended to it (`"text_config."` for nested configs).
    pub(crate) fn from_object(obj: &Map<String, Value>, prefix: &str) -> Result<Self, FormatError> {
        match serde_json::from_value::<HfConfig>(Value::Object(obj.clone())) {
            Ok(mut c) => {
                c.explicit_nulls = obj
                    .iter()
                    .filter(|(_, v)| v.is_null())
                    .map(|(k, _)| k.clone())
                    .collect();
                Ok(c)
            }
            Err(whole) => {
                // serde does not say which key failed; retry key by key to name it.
                for (key, value) in obj {
                    let mut one = Map::new();
                    one.insert(key.clone(), value.clone());
                    if let Err(e) = serde_json::from_value::<HfConfig>(Value::Object(one)) {
                        return Err(FormatError::WrongType {
                            field: format!("{prefix}{key}"),
                            message: e.to_string(),
                            hint: format!(
                                "`{prefix}{key}` must have the JSON type its transformers config class declares (sizes are non-negative integers, flags are true/false, probabilities are numbers)"
                            ),
                        });
                    }
                }
                Err(FormatError::WrongType {
                    field: prefix.trim_end_matches('.').to_string(),
                    message: whole.to_string(),
                    hint:
                        "check the config against the transformers config class of its model_type"
                            .into(),
                })
            }
        }
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
            let Some(Value::Object(map)) = v else {
                continue;
            };
            match map.get("partial_rotary_factor") {
                None | Some(Value::Null) => continue,
                Some(Value::Number(n)) => return Ok(n.as_f64()),
                Some(other) => {
                    return Err(FormatError::WrongType {
                        field: format!("{prefix}{name}.partial_rotary_factor"),
                        message: format!("expected a number, found {other}"),
                        hint: "the rotary fraction is a number in (0, 1]".into(),
                    })
                }
            }
        }
        Ok(None)
    }
}
