//! The pure half of resolving a Hugging Face Hub id offline: parsing `org/name@revision`,
//! the cache root from the environment, and the cache layout, as huggingface_hub does
//! (`constants.py`, `file_download.py` `repo_folder_name`, `utils/_validators.py`
//! `validate_repo_id`). The caller reads the directories and `refs/` files.
//!
//! Layout: `<cache>/models--{org}--{name}/refs/{revision}` holds a commit hash;
//! `<cache>/models--{org}--{name}/snapshots/{commit}/` holds the files (`config.json`,
//! `model.safetensors.index.json`, shards, `.gguf`).

use std::path::PathBuf;

/// A Hub model id with an optional revision (`meta-llama/Llama-3.1-8B@main`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    /// `org/name` (or a bare `name`).
    pub repo_id: String,
    /// Branch, tag or commit; `None` means `main`.
    pub revision: Option<String>,
}

impl RepoRef {
    /// The revision to resolve (`main` when none was given).
    pub fn revision_or_main(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }

    /// The repository's folder in the cache: `models--{org}--{name}` (huggingface_hub
    /// `repo_folder_name(repo_id, repo_type="model")`).
    pub fn cache_folder(&self) -> String {
        format!("models--{}", self.repo_id.replace('/', "--"))
    }

    /// The revision as a path under `refs/` (`main`, `refs/pr/1`), or `None` when it is a
    /// commit hash, which names `snapshots/{hash}` directly. Components are checked to be
    /// plain names, so joining them to a directory stays inside it.
    pub fn ref_path(&self) -> Option<&str> {
        let rev = self.revision_or_main();
        (!is_commit_hash(rev)).then_some(rev)
    }
}

/// Whether `s` is a full 40-hex-digit commit hash (huggingface_hub `REGEX_COMMIT_HASH`).
pub fn is_commit_hash(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// Parses `org/name[@revision]` when it is a valid Hub model id (huggingface_hub
/// `validate_repo_id`: at most one `/`, parts of `[A-Za-z0-9_.-]`, no `--` or `..`, not
/// starting or ending with `-` or `.`, at most 96 characters). The revision may contain `/`
/// (`refs/pr/1`) but no empty, `.` or `..` component. `None` for anything else. A bare
/// `name` such as `gpt2` (or `config.json`) also parses: check local paths first, as
/// transformers `from_pretrained` does.
pub fn parse_repo_ref(s: &str) -> Option<RepoRef> {
    let (id, revision) = match s.split_once('@') {
        Some((id, rev)) => (id, Some(rev)),
        None => (s, None),
    };
    if id.is_empty() || id.len() > 96 || id.contains("--") || id.contains("..") {
        return None;
    }
    let parts: Vec<&str> = id.split('/').collect();
    if parts.len() > 2 {
        return None;
    }
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
    };
    if !parts.iter().all(|p| part_ok(p)) {
        return None;
    }
    if let Some(rev) = revision {
        let ok = !rev.is_empty()
            && rev
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains(['\\', '\0']));
        if !ok {
            return None;
        }
    }
    Some(RepoRef {
        repo_id: id.to_string(),
        revision: revision.map(str::to_string),
    })
}

/// The Hub cache root from the environment, as huggingface_hub `constants.py` computes it:
/// `HF_HUB_CACHE`, else the legacy `HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`. `env` looks a
/// variable up (empty values count as unset); `home` is the user's home directory.
pub fn cache_root(env: impl Fn(&str) -> Option<String>, home: Option<PathBuf>) -> Option<PathBuf> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(p) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return Some(expand(&p, home.as_ref()));
    }
    if let Some(h) = var("HF_HOME") {
        return Some(expand(&h, home.as_ref()).join("hub"));
    }
    let cache = match var("XDG_CACHE_HOME") {
        Some(x) => expand(&x, home.as_ref()),
        None => home?.join(".cache"),
    };
    Some(cache.join("huggingface").join("hub"))
}

/// `os.path.expanduser`: a leading `~` is the home directory.
fn expand(p: &str, home: Option<&PathBuf>) -> PathBuf {
    match (p.strip_prefix('~'), home) {
        (Some(rest), Some(h)) if rest.is_empty() || rest.starts_with('/') => {
            h.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(p),
    }
}
