//! The architecture registry: `model_type` → normaliser. Adding a family = one row here, one
//! normaliser function, one golden row in `tests/golden/param_counts.json`.

mod cohere;
mod common;
mod deepseek;
mod ernie;
mod exaone4;
mod falcon_h1;
mod gemma;
mod glm;
mod gpt;
mod granite;
mod granite_hybrid;
mod granite_moe;
mod hunyuan;
mod hunyuan_moe;
mod jamba;
mod llama;
mod llama4;
mod mamba;
mod moe2026;
mod phi;
mod qwen3_next;
mod seed_oss;
mod smollm3;
mod ssm;
mod vision;
mod vlm;

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
    ("ernie4_5", ernie::ernie4_5),
    ("ernie4_5_moe", moe2026::ernie4_5_moe),
    ("exaone4", exaone4::exaone4),
    ("falcon", gpt::falcon),
    ("falcon_h1", falcon_h1::falcon_h1),
    ("gemma", gemma::gemma),
    ("gemma2", gemma::gemma2),
    ("gemma3", gemma::gemma3),
    ("gemma3_text", gemma::gemma3_text),
    ("glm", glm::glm),
    ("glm4", glm::glm4),
    ("gpt2", gpt::gpt2),
    ("gpt_neox", gpt::gpt_neox),
    ("gpt_oss", moe2026::gpt_oss),
    ("granite", granite::granite),
    ("granitemoe", granite_moe::granitemoe),
    ("granitemoehybrid", granite_hybrid::granitemoehybrid),
    ("granitemoeshared", granite_moe::granitemoeshared),
    ("hunyuan_v1_dense", hunyuan::hunyuan_v1_dense),
    ("hunyuan_v1_moe", hunyuan_moe::hunyuan_v1_moe),
    ("jamba", jamba::jamba),
    ("llama", llama::llama),
    ("llama4", llama4::llama4),
    ("llama4_text", llama4::llama4_text),
    ("mamba", mamba::mamba),
    ("mamba2", ssm::mamba2),
    ("mistral", llama::mistral),
    ("mistral3", vlm::mistral3),
    ("mixtral", llama::mixtral),
    ("olmo2", llama::olmo2),
    ("olmoe", moe2026::olmoe),
    ("opt", gpt::opt),
    ("phi", phi::phi),
    ("phi3", llama::phi3),
    ("qwen2", llama::qwen2),
    ("qwen2_5_vl", vlm::qwen2_5_vl),
    ("qwen2_moe", llama::qwen2_moe),
    ("qwen2_vl", vlm::qwen2_vl),
    ("qwen3", llama::qwen3),
    ("qwen3_moe", llama::qwen3_moe),
    ("qwen3_next", qwen3_next::qwen3_next),
    ("seed_oss", seed_oss::seed_oss),
    ("smollm3", smollm3::smollm3),
    ("starcoder2", llama::starcoder2),
];

/// The `model_type`s in [`REGISTRY`], same order.
pub(crate) const SUPPORTED: &[&str] = &[
    "cohere",
    "cohere2",
    "deepseek_v3",
    "ernie4_5",
    "ernie4_5_moe",
    "exaone4",
    "falcon",
    "falcon_h1",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "glm",
    "glm4",
    "gpt2",
    "gpt_neox",
    "gpt_oss",
    "granite",
    "granitemoe",
    "granitemoehybrid",
    "granitemoeshared",
    "hunyuan_v1_dense",
    "hunyuan_v1_moe",
    "jamba",
    "llama",
    "llama4",
    "llama4_text",
    "mamba",
    "mamba2",
    "mistral",
    "mistral3",
    "mixtral",
    "olmo2",
    "olmoe",
    "opt",
    "phi",
    "phi3",
    "qwen2",
    "qwen2_5_vl",
    "qwen2_moe",
    "qwen2_vl",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "seed_oss",
    "smollm3",
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
    let mut desc = normaliser(raw, &ctx)?;
    // configuration_utils.py PreTrainedConfig: use_cache defaults to True
    desc.use_cache = raw.use_cache.unwrap_or(true);
    Ok(desc)
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
