//! The architecture registry: `model_type` → normaliser. Adding a family = one row here, one
//! normaliser function, one golden row in `tests/golden/param_counts.json`.

mod cohere;
mod common;
mod deepseek;
mod gemma;
mod glm;
mod gpt;
mod granite;
mod llama;
mod phi;

use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::Ctx;
use memwall_core::ModelDesc;

/// A family normaliser: raw config → resolved description.
type Normaliser = fn(&HfConfig, &Ctx) -> Result<ModelDesc, FormatError>;

/// The registry, sorted by `model_type`.
const REGISTRY: &[(&str, Normaliser)] = &[
    ("cohere", cohere::cohere),
    ("cohere2", cohere::cohere2),
    ("deepseek_v3", deepseek::deepseek_v3),
    ("falcon", gpt::falcon),
    ("gemma", gemma::gemma),
    ("gemma2", gemma::gemma2),
    ("gemma3", gemma::gemma3),
    ("gemma3_text", gemma::gemma3_text),
    ("glm", glm::glm),
    ("glm4", glm::glm4),
    ("gpt2", gpt::gpt2),
    ("gpt_neox", gpt::gpt_neox),
    ("granite", granite::granite),
    ("llama", llama::llama),
    ("mistral", llama::mistral),
    ("mixtral", llama::mixtral),
    ("olmo2", llama::olmo2),
    ("opt", gpt::opt),
    ("phi", phi::phi),
    ("phi3", llama::phi3),
    ("qwen2", llama::qwen2),
    ("qwen2_moe", llama::qwen2_moe),
    ("qwen3", llama::qwen3),
    ("qwen3_moe", llama::qwen3_moe),
    ("starcoder2", llama::starcoder2),
];

/// The `model_type`s in [`REGISTRY`], same order.
pub(crate) const SUPPORTED: &[&str] = &[
    "cohere",
    "cohere2",
    "deepseek_v3",
    "falcon",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "glm",
    "glm4",
    "gpt2",
    "gpt_neox",
    "granite",
    "llama",
    "mistral",
    "mixtral",
    "olmo2",
    "opt",
    "phi",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "starcoder2",
];

/// Dispatches on `model_type`.
pub(crate) fn normalise(raw: &HfConfig) -> Result<ModelDesc, FormatError> {
    let model_type = raw
        .model_type
        .as_deref()
        .ok_or(FormatError::MissingModelType)?;
    let (name, normaliser) = REGISTRY
        .iter()
        .find(|(name, _)| *name == model_type)
        .ok_or_else(|| FormatError::UnknownModelType {
            model_type: model_type.to_string(),
            supported: match model_type {
                // Pre-integration Falcon checkpoints (trust_remote_code era) name themselves
                // RefinedWeb/RefinedWebModel with n_head/n_layer keys; transformers 5.23's
                // AutoConfig does not know these names.
                "RefinedWeb" | "RefinedWebModel" => format!(
                    "{}; \"{model_type}\" is the legacy remote-code name of Falcon, which transformers 5.23 does not recognise: use the repository's current config.json (model_type \"falcon\", num_attention_heads/num_hidden_layers/num_kv_heads)",
                    SUPPORTED.join(", ")
                ),
                _ => SUPPORTED.join(", "),
            },
        })?;
    let ctx = Ctx {
        model_type: name,
        prefix: "",
        nested: false,
    };
    normaliser(raw, &ctx)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn registry_and_supported_list_agree_and_are_sorted() {
        let names: Vec<&str> = REGISTRY.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, SUPPORTED);
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, names);
    }
}
