//! Hub ids and the cache layout, as huggingface_hub resolves them offline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_formats::hub::{cache_root, is_commit_hash, parse_repo_ref};
use std::path::PathBuf;

#[test]
fn repo_ids_with_revisions() {
    let r = parse_repo_ref("meta-llama/Llama-3.1-8B@main").unwrap();
    assert_eq!(
        (r.repo_id.as_str(), r.revision_or_main()),
        ("meta-llama/Llama-3.1-8B", "main")
    );
    assert_eq!(r.cache_folder(), "models--meta-llama--Llama-3.1-8B");
    assert_eq!(r.ref_path(), Some("main"));
    let hash = "0123456789abcdef0123456789abcdef01234567";
    let r = parse_repo_ref(&format!("gpt2@{hash}")).unwrap();
    assert_eq!(
        (r.cache_folder().as_str(), r.ref_path()),
        ("models--gpt2", None)
    );
    assert!(
        is_commit_hash(hash) && !is_commit_hash("main") && !is_commit_hash(&hash.to_uppercase())
    );
    let r = parse_repo_ref("Qwen/Qwen3-8B@refs/pr/12").unwrap();
    assert_eq!(r.ref_path(), Some("refs/pr/12"));
    assert_eq!(parse_repo_ref("Qwen/Qwen3-8B").unwrap().revision, None);
}

#[test]
fn paths_and_bad_ids_are_not_repo_ids() {
    for s in [
        "./models/llama",
        "/abs/path",
        "a/b/c",
        "org/../x",
        "org--x/name",
        "-org/name",
        "org/name.",
        "org/na me",
        "org/name@",
        "org/name@../../etc",
        "org/name@a//b",
        "",
        "model.gguf/",
    ] {
        assert!(parse_repo_ref(s).is_none(), "{s}");
    }
    assert!(parse_repo_ref(&"x".repeat(97)).is_none());
}

#[test]
fn cache_root_follows_huggingface_hub_precedence() {
    let home = Some(PathBuf::from("/home/u"));
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(
        cache_root(env(&[]), home.clone()),
        Some("/home/u/.cache/huggingface/hub".into())
    );
    assert_eq!(
        cache_root(env(&[("XDG_CACHE_HOME", "/x")]), home.clone()),
        Some("/x/huggingface/hub".into())
    );
    assert_eq!(
        cache_root(
            env(&[("HF_HOME", "~/hf"), ("XDG_CACHE_HOME", "/x")]),
            home.clone()
        ),
        Some("/home/u/hf/hub".into())
    );
    assert_eq!(
        cache_root(
            env(&[("HF_HUB_CACHE", "/c"), ("HF_HOME", "/h")]),
            home.clone()
        ),
        Some("/c".into())
    );
    assert_eq!(
        cache_root(
            env(&[("HUGGINGFACE_HUB_CACHE", "/legacy"), ("HF_HUB_CACHE", "")]),
            home.clone()
        ),
        Some("/legacy".into())
    );
    assert_eq!(cache_root(env(&[]), None), None);
}
