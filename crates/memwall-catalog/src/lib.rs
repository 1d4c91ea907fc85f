//! Embedded catalogue of real model configs and GPU datasheets.
//!
//! `data/models/index.toml` lists verbatim Hugging Face `config.json` copies with their
//! provenance; `build.rs` embeds them (checked at build time), so the binary needs no files.
//! Look-ups accept the short id (`llama-3.1-8b`) or the Hugging Face repo
//! (`meta-llama/Llama-3.1-8B`), case-insensitively.

mod gpus;

pub use gpus::{find_gpu, gpus, suggest_gpu, GpuTableError};
use memwall_core::ModelDesc;
use memwall_formats::FormatError;

/// One catalogued model: the index fields plus the embedded `config.json` text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogEntry {
    /// Short id, unique, lower-case (`llama-3.1-8b`).
    pub id: &'static str,
    /// Hugging Face repository (`meta-llama/Llama-3.1-8B`).
    pub hf_repo: &'static str,
    /// Path of the config under `data/models/`.
    pub file: &'static str,
    /// Parameter count as published by the model card or paper (free text, e.g. "671B total / 37B active").
    pub published_params: &'static str,
    /// Where the config comes from (the Hugging Face URL).
    pub source: &'static str,
    /// How the copy was obtained.
    pub found_via: &'static str,
    /// Exact parameter count from transformers (meta-device instantiation), when recorded.
    pub transformers_params: Option<u64>,
    /// Free-form remark.
    pub note: Option<&'static str>,
    /// The verbatim `config.json` text.
    pub config_json: &'static str,
}

impl CatalogEntry {
    /// Parses the embedded config into a [`ModelDesc`].
    pub fn model(&self) -> Result<ModelDesc, FormatError> {
        memwall_formats::parse_hf_config(self.config_json)
    }
}

include!(concat!(env!("OUT_DIR"), "/catalog.rs"));

/// All catalogued models, sorted by id.
pub fn models() -> &'static [CatalogEntry] {
    ENTRIES
}

/// The entry whose id or Hugging Face repo equals `id_or_repo`, ignoring ASCII case.
pub fn find(id_or_repo: &str) -> Option<&'static CatalogEntry> {
    let q = id_or_repo.trim();
    ENTRIES
        .iter()
        .find(|e| e.id.eq_ignore_ascii_case(q) || e.hf_repo.eq_ignore_ascii_case(q))
}

/// A fine-tuned variant (Instruct, Chat) of a catalogued base model whose `config.json`
/// describes the same architecture: the same sizes, layers, heads, vocabulary and tying. Such
/// configs differ only in generation fields (`bos_token_id`/`eos_token_id`, `torch_dtype`,
/// `transformers_version`) and, where noted, in `max_position_embeddings`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The variant's Hugging Face repository.
    pub hf_repo: &'static str,
    /// The catalogue id of its base model.
    pub base_id: &'static str,
    /// The variant's `max_position_embeddings` where it differs from the base's.
    pub max_position_embeddings: Option<u64>,
}

/// Widely used variants of catalogued models. The Llama 3/3.1 and Llama 2 chat models,
/// Mistral/Mixtral Instruct, Gemma 2 `-it` and DeepSeek-V3's re-releases (V3-0324, R1) are
/// listed as changing no architecture field, from their published model cards and configs as
/// known when this list was written (not re-fetched here; a config.json in the local cache
/// always wins over this list). Qwen2.5 Instruct models are published with
/// `max_position_embeddings: 32768` (their bases say 131072), as copies of the 7B Instruct
/// config show (e.g. huggingface.co/osllmai-community/Qwen2.5-7B-Instruct config.json).
pub const VARIANTS: &[Variant] = &[
    v("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", None),
    v(
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
        "llama-3.1-8b",
        None,
    ),
    v("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b", None),
    v(
        "meta-llama/Meta-Llama-3.1-70B-Instruct",
        "llama-3.1-70b",
        None,
    ),
    v("meta-llama/Llama-3.1-405B-Instruct", "llama-3.1-405b", None),
    v("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b", None),
    v("meta-llama/Meta-Llama-3-70B-Instruct", "llama-3-70b", None),
    v("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b", None),
    v("meta-llama/Llama-2-13b-chat-hf", "llama-2-13b", None),
    v("meta-llama/Llama-2-70b-chat-hf", "llama-2-70b", None),
    v(
        "mistralai/Mistral-7B-Instruct-v0.1",
        "mistral-7b-v0.1",
        None,
    ),
    v(
        "mistralai/Mistral-7B-Instruct-v0.3",
        "mistral-7b-v0.3",
        None,
    ),
    v("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b", None),
    v(
        "mistralai/Mixtral-8x22B-Instruct-v0.1",
        "mixtral-8x22b",
        None,
    ),
    v("google/gemma-2-9b-it", "gemma-2-9b", None),
    v("google/gemma-2-2b-it", "gemma-2-2b", None),
    v("deepseek-ai/DeepSeek-V3-0324", "deepseek-v3", None),
    v("deepseek-ai/DeepSeek-R1", "deepseek-v3", None),
    v("Qwen/Qwen2.5-3B-Instruct", "qwen2.5-3b", Some(32768)),
    v("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b", Some(32768)),
    v("Qwen/Qwen2.5-14B-Instruct", "qwen2.5-14b", Some(32768)),
    v("Qwen/Qwen2.5-32B-Instruct", "qwen2.5-32b", Some(32768)),
];

const fn v(hf_repo: &'static str, base_id: &'static str, max_pos: Option<u64>) -> Variant {
    Variant {
        hf_repo,
        base_id,
        max_position_embeddings: max_pos,
    }
}

/// The variant named `repo` (ignoring ASCII case) with its base entry.
pub fn find_variant(repo: &str) -> Option<(&'static Variant, &'static CatalogEntry)> {
    let q = repo.trim();
    let var = VARIANTS
        .iter()
        .find(|v| v.hf_repo.eq_ignore_ascii_case(q))?;
    let base = ENTRIES.iter().find(|e| e.id == var.base_id)?;
    Some((var, base))
}

/// "Did you mean" candidates for an unknown name: ids whose id, repo or repo name is within a
/// small edit distance of `name` (or contains it), closest first, at most five.
pub fn suggest(name: &str) -> Vec<&'static str> {
    let q = name.trim().to_ascii_lowercase();
    if q.is_empty() {
        return Vec::new();
    }
    let max = (q.chars().count() / 3).max(2);
    let mut scored: Vec<(usize, &'static str)> = ENTRIES
        .iter()
        .filter_map(|e| {
            let repo = e.hf_repo.to_ascii_lowercase();
            let repo_name = repo.rsplit('/').next().unwrap_or(&repo).to_string();
            let d = [e.id.to_ascii_lowercase(), repo, repo_name]
                .iter()
                .map(|c| {
                    if c.contains(&q) {
                        1
                    } else {
                        levenshtein(&q, c)
                    }
                })
                .min()
                .unwrap_or(usize::MAX);
            (d <= max).then_some((d, e.id))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(5).map(|(_, id)| id).collect()
}

/// Edit distance (insertions, deletions, substitutions) over chars.
fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    #[test]
    fn every_variant_names_a_catalogued_base() {
        for var in super::VARIANTS {
            assert!(
                super::find_variant(var.hf_repo).is_some(),
                "{} → {}",
                var.hf_repo,
                var.base_id
            );
            assert!(
                super::find(var.hf_repo).is_none(),
                "{} is catalogued",
                var.hf_repo
            );
        }
    }

    use super::*;

    #[test]
    fn levenshtein_basics() {
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("llama", "llama"), 0);
    }

    #[test]
    fn find_is_case_insensitive_on_id_and_repo() {
        let Some(first) = models().first() else {
            return;
        };
        assert_eq!(find(&first.id.to_uppercase()), Some(first));
        assert_eq!(find(&first.hf_repo.to_lowercase()), Some(first));
        assert_eq!(find("no-such-model-anywhere"), None);
    }

    #[test]
    fn suggest_finds_near_misses() {
        let Some(first) = models().first() else {
            return;
        };
        let typo = format!("{}x", first.id);
        assert!(suggest(&typo).contains(&first.id), "{:?}", suggest(&typo));
        assert!(suggest("").is_empty());
    }
}
