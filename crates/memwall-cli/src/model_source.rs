//! Finding a model: catalogue id, Hugging Face repo id, config.json path or model directory.

use anyhow::{anyhow, bail, Context, Result};
use memwall_core::model::ParamCounts;
use memwall_core::ModelDesc;
use std::path::Path;

/// Largest config.json we read (real ones are a few KiB).
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A resolved model.
#[derive(Debug)]
pub struct ModelSource {
    /// What the user typed, normalised (catalogue id or path).
    pub label: String,
    /// Hugging Face repo id when known.
    pub hf_repo: Option<String>,
    /// Where the config came from.
    pub origin: String,
    /// The parsed description.
    pub desc: ModelDesc,
    /// Exact parameter counts.
    pub counts: ParamCounts,
    /// `torch_dtype`/`dtype` of the config, if given.
    pub checkpoint_dtype: Option<String>,
}

fn config_dtype(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let pick = |v: &serde_json::Value| {
        v.get("torch_dtype")
            .or_else(|| v.get("dtype"))
            .and_then(|d| d.as_str())
            .map(str::to_owned)
    };
    pick(&v).or_else(|| v.get("text_config").and_then(pick))
}

fn from_json(
    label: String,
    hf_repo: Option<String>,
    origin: String,
    json: &str,
) -> Result<ModelSource> {
    let desc = memwall_formats::parse_hf_config(json)
        .with_context(|| format!("cannot use the config from {origin}"))?;
    let counts = desc.param_counts().context("cannot count the parameters")?;
    Ok(ModelSource {
        label,
        hf_repo,
        origin,
        desc,
        counts,
        checkpoint_dtype: config_dtype(json),
    })
}

fn read_config(path: &Path) -> Result<String> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if meta.len() > MAX_CONFIG_BYTES {
        bail!(
            "{} is {} bytes; a config.json is a few KiB (limit {MAX_CONFIG_BYTES})",
            path.display(),
            meta.len()
        );
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Resolves `spec` to a model.
pub fn load(spec: &str) -> Result<ModelSource> {
    let path = Path::new(spec);
    if path.is_dir() {
        let cfg = path.join("config.json");
        if !cfg.is_file() {
            bail!("{} is a directory without a config.json", path.display());
        }
        let json = read_config(&cfg)?;
        return from_json(spec.to_owned(), None, cfg.display().to_string(), &json);
    }
    if path.is_file() {
        let json = read_config(path)?;
        return from_json(spec.to_owned(), None, path.display().to_string(), &json);
    }
    if let Some(e) = memwall_catalog::find(spec) {
        return from_json(
            e.id.to_owned(),
            Some(e.hf_repo.to_owned()),
            format!("catalogue ({})", e.source),
            e.config_json,
        );
    }
    let looks_like_path = spec.contains('/') && (spec.ends_with(".json") || spec.starts_with('.'));
    let suggestions = memwall_catalog::suggest(spec);
    let mut msg = if looks_like_path {
        format!("no such file: {spec}")
    } else {
        format!(
            "unknown model `{spec}`: not a catalogue id, Hugging Face repo id, file or directory"
        )
    };
    if !suggestions.is_empty() {
        msg.push_str(&format!(" (did you mean: {}?)", suggestions.join(", ")));
    }
    Err(anyhow!(msg))
}

/// A hint line for errors users commonly hit.
pub fn hint_for(e: &anyhow::Error) -> Option<String> {
    let text = format!("{e:#}");
    if text.contains("unknown model") {
        return Some(
            "`memwall models` lists the catalogue; or pass a path to a config.json".into(),
        );
    }
    if text.contains("invalid cluster layout") {
        return Some(
            "--gpus must equal dp × --tp × --pp × --cp (dp ≥ 1); --ep must divide dp × --cp; see docs/distributed.md"
                .into(),
        );
    }
    None
}
