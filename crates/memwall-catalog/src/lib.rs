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
