//! Validation of the embedded catalogue: identity, provenance, parsing, exact counts.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use memwall_catalog::{find, models, suggest};
use serde::Deserialize;
use std::collections::BTreeMap;

/// `tests/transformers_counts.json`, written by `tests/make_golden.py` (transformers 5.23,
/// meta device); `null` where transformers itself cannot build the config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Golden {
    transformers: String,
    counts: BTreeMap<String, Option<u64>>,
}

fn golden() -> Golden {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/transformers_counts.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn catalogue_is_not_empty() {
    assert!(!models().is_empty());
}

#[test]
fn ids_are_unique_sorted_and_lower_case() {
    let ids: Vec<&str> = models().iter().map(|m| m.id).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(ids, sorted, "ids must be unique and sorted");
    for id in ids {
        assert_eq!(id, id.to_ascii_lowercase(), "ids are lower-case");
        assert!(!id.contains(char::is_whitespace), "{id:?}");
    }
}

#[test]
fn repos_are_unique_case_insensitively_and_findable() {
    let mut repos: Vec<String> = models()
        .iter()
        .map(|m| m.hf_repo.to_ascii_lowercase())
        .collect();
    repos.sort();
    let n = repos.len();
    repos.dedup();
    assert_eq!(n, repos.len(), "an hf_repo appears twice");
    for m in models() {
        assert_eq!(find(m.id).map(|e| e.id), Some(m.id));
        assert_eq!(find(&m.hf_repo.to_uppercase()).map(|e| e.id), Some(m.id));
        assert!(
            suggest(&m.id[..m.id.len() - 1]).contains(&m.id),
            "suggest misses {}",
            m.id
        );
    }
}

#[test]
fn every_entry_has_a_source_and_provenance() {
    for m in models() {
        assert!(
            m.source.starts_with("https://"),
            "{}: source {:?}",
            m.id,
            m.source
        );
        assert!(
            m.source.contains(m.hf_repo),
            "{}: source does not name {}",
            m.id,
            m.hf_repo
        );
        assert!(!m.found_via.trim().is_empty(), "{}: found_via", m.id);
    }
}

#[test]
fn every_entry_parses() {
    let failures: Vec<String> = models()
        .iter()
        .filter_map(|m| {
            m.model()
                .err()
                .map(|e| format!("{} ({}): {e}", m.id, m.file))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn index_transformers_params_match_exactly() {
    for m in models() {
        let (Some(want), Ok(desc)) = (m.transformers_params, m.model()) else {
            continue;
        };
        assert_eq!(desc.param_counts().unwrap().total, want, "{}", m.id);
    }
}

#[test]
fn every_entry_matches_the_transformers_count_to_the_parameter() {
    let g = golden();
    assert_eq!(g.transformers, "5.23.0");
    let mut failures = Vec::new();
    for m in models() {
        let Ok(desc) = m.model() else { continue }; // reported by every_entry_parses
        match g.counts.get(m.id) {
            None => failures.push(format!(
                "{}: no golden count; rerun crates/memwall-catalog/tests/make_golden.py",
                m.id
            )),
            Some(None) => failures.push(format!(
                "{}: transformers 5.23 cannot build it but memwall parsed it",
                m.id
            )),
            Some(Some(want)) => {
                let got = desc.param_counts().unwrap().total;
                if got != *want {
                    failures.push(format!("{}: memwall {got}, transformers {want}", m.id));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The first number in `published_params` with its unit (`"671B total / 37B active"` → 671e9).
fn published(text: &str) -> Option<f64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let rest = &text[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let value: f64 = rest[..end].parse().ok()?;
    let unit = match rest[end..].trim_start().chars().next()? {
        'T' => 1e12,
        'B' => 1e9,
        'M' => 1e6,
        'K' | 'k' => 1e3,
        _ => return None,
    };
    Some(value * unit)
}

#[test]
fn published_counts_are_within_a_sane_ratio_of_the_exact_count() {
    // Model cards round (and some count without embeddings): 0.8 ≤ exact / published ≤ 1.25.
    for m in models() {
        let Ok(desc) = m.model() else { continue };
        let exact = desc.param_counts().unwrap().total as f64;
        let published = published(m.published_params).unwrap_or_else(|| {
            panic!(
                "{}: cannot read published_params {:?}",
                m.id, m.published_params
            )
        });
        let ratio = exact / published;
        assert!(
            (0.8..=1.25).contains(&ratio),
            "{}: exact {exact:.4e} vs published {:?} (ratio {ratio:.3})",
            m.id,
            m.published_params
        );
    }
}

#[test]
fn published_parser() {
    assert_eq!(published("671B total / 37B active"), Some(671e9));
    assert_eq!(published("124M"), Some(124e6));
    assert_eq!(published("6.74B"), Some(6.74e9));
    assert_eq!(published("n/a"), None);
}
