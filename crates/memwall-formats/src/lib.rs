//! Parsers for model files: Hugging Face `config.json` → [`memwall_core::ModelDesc`]; its
//! `quantization_config` ([`quant_config`]); safetensors and GGUF headers
//! ([`safetensors`], [`gguf`]) with exact tensor bytes ([`checkpoint`]); GGUF hyper-parameters
//! → the same description ([`gguf_to_model`]). Everything here is pure: the binary reads the
//! files and passes bytes in.
//!
//! Semantics follow transformers 5.23: each family's normaliser reads the keys its
//! `configuration_*.py` class declares, applies that class's defaults to keys that are absent,
//! and builds the modules its `modeling_*.py` instantiates (every rule cites its source).
//! The only defaults applied are those config-class defaults, with one deliberate exception:
//! a top-level config must state its core sizes (`vocab_size`, hidden size, layers, heads),
//! because a saved config always does and the class default (a 7B-shaped model) would be
//! silently wrong. Nested `text_config`s are saved as diffs against their class defaults,
//! so there the defaults apply to every key.
//!
//! Sizes are bounded (see [`limits`]); anything missing, out of range or inconsistent is a
//! [`FormatError`] naming the field, never a panic.

pub mod checkpoint;
mod error;
mod families;
pub mod gguf;
mod gguf_model;
pub mod hub;
pub mod quant_config;
mod raw;
mod resolve;
pub mod safetensors;

pub use error::{FileFormat, FormatError, HeaderProblem};
pub use gguf_model::{
    gguf_shards_to_hf_config, gguf_shards_to_model, gguf_to_hf_config, gguf_to_model,
    SUPPORTED_ARCHITECTURES as SUPPORTED_GGUF_ARCHITECTURES,
};
pub use quant_config::{parse_quantization_config, QuantConfig, QuantMethod};
pub use resolve::limits;

use memwall_core::ModelDesc;

/// Parses the text of a Hugging Face `config.json` into a fully resolved [`ModelDesc`].
pub fn parse_hf_config(json: &str) -> Result<ModelDesc, FormatError> {
    parse_hf_config_with_dtype(json).map(|c| c.desc)
}

/// A parsed `config.json`: the model, and what the config says about its checkpoint.
#[derive(Debug, Clone)]
pub struct ParsedConfig {
    /// The resolved model.
    pub desc: ModelDesc,
    /// `torch_dtype` (or `dtype`) when the config states it as a string, as written (it is
    /// untrusted text: show it through [`memwall_core::error::untrusted`]).
    pub checkpoint_dtype: Option<String>,
}

/// Parses the text of a `config.json` once into the model and the checkpoint's dtype.
/// Memory stays within a small multiple of the text's size whatever the text holds (see the
/// `raw` module: keys memwall does not read are skipped unbuilt, lists are capped).
pub fn parse_hf_config_with_dtype(json: &str) -> Result<ParsedConfig, FormatError> {
    let raw = raw::HfConfig::from_json(json, "")?;
    let desc = families::normalise(&raw)?;
    Ok(ParsedConfig {
        desc,
        checkpoint_dtype: raw.checkpoint_dtype(),
    })
}

/// The `model_type` values [`parse_hf_config`] accepts, sorted.
pub fn supported_model_types() -> &'static [&'static str] {
    families::SUPPORTED
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use memwall_core::model::{AttentionKind, LinearRole, Mlp};

    fn parse(text: &str) -> ModelDesc {
        match parse_hf_config(text) {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn gemma3_windows_follow_the_pattern() {
        let d = parse(
            r#"{"model_type":"gemma3_text","vocab_size":100,"hidden_size":64,"num_hidden_layers":12,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":16,"sliding_window":512}"#,
        );
        let global: Vec<usize> = (0..12)
            .filter(|&i| d.layers[i].attention.sliding_window.is_none())
            .collect();
        assert_eq!(global, vec![5, 11]);
        assert_eq!(d.layers[0].attention.sliding_window, Some(512));
        assert!(d.embeddings.scaled && d.head.tied);
    }

    #[test]
    fn qwen2_windows_need_use_sliding_window() {
        let base = r#""model_type":"qwen2","vocab_size":100,"hidden_size":64,"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"sliding_window":32,"max_window_layers":2"#;
        let off = parse(&format!("{{{base}}}"));
        assert!(off
            .layers
            .iter()
            .all(|l| l.attention.sliding_window.is_none()));
        let on = parse(&format!("{{{base},\"use_sliding_window\":true}}"));
        let w: Vec<_> = on
            .layers
            .iter()
            .map(|l| l.attention.sliding_window)
            .collect();
        assert_eq!(w, vec![None, None, Some(32), Some(32)]);
    }

    #[test]
    fn deepseek_first_layers_are_dense_and_names_follow_mla() {
        let d = parse(
            r#"{"model_type":"deepseek_v3","vocab_size":100,"hidden_size":64,"num_hidden_layers":4,"num_attention_heads":4,"first_k_dense_replace":2,"n_routed_experts":8,"n_group":2,"topk_group":1,"num_experts_per_tok":2,"q_lora_rank":null}"#,
        );
        let moe: Vec<bool> = d
            .layers
            .iter()
            .map(|l| matches!(l.mlp, Mlp::Moe(_)))
            .collect();
        assert_eq!(moe, vec![false, false, true, true]);
        assert!(matches!(
            d.layers[0].attention.kind,
            AttentionKind::Mla {
                q_lora_rank: None,
                ..
            }
        ));
        assert!(d
            .linear_names
            .iter()
            .any(|(r, n)| *r == LinearRole::Q && n == "q_proj"));
        assert!(!d.linear_names.iter().any(|(r, _)| *r == LinearRole::QA));
    }

    #[test]
    fn gpt2_defaults_n_inner_and_reads_aliases() {
        let d = parse(
            r#"{"model_type":"gpt2","vocab_size":100,"hidden_size":64,"num_hidden_layers":2,"n_head":4}"#,
        );
        let Mlp::Dense(m) = d.layers[0].mlp else {
            panic!("dense")
        };
        assert_eq!(m.intermediate, 256);
        assert_eq!(d.embeddings.learned_positions, Some(1024));
        assert!((d.dropout.embed - 0.1).abs() < 1e-12);
        // GPT-2's positions are `arange(seq)[None]` and its MLP is a module
        assert!(!d.embeddings.positions_from_mask);
        assert!(!d.layers[0].mlp_input_rebound);
    }

    #[test]
    fn opt_positions_come_from_the_mask_and_its_mlp_is_inline() {
        let d = parse(
            r#"{"model_type":"opt","vocab_size":100,"hidden_size":32,"ffn_dim":64,"num_hidden_layers":2,"num_attention_heads":2,"word_embed_proj_dim":32}"#,
        );
        assert_eq!(d.embeddings.learned_positions, Some(2048 + 2));
        assert!(d.embeddings.positions_from_mask);
        assert!(d.layers.iter().all(|l| l.mlp_input_rebound));
    }

    #[test]
    fn legacy_falcon_name_gets_a_specific_hint() {
        let e = parse_hf_config(r#"{"model_type":"RefinedWeb"}"#).unwrap_err();
        assert!(e.to_string().contains("legacy"), "{e}");
    }

    #[test]
    fn supported_types_are_sorted() {
        let t = supported_model_types();
        assert!(t.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(t.len(), 47);
    }
}
