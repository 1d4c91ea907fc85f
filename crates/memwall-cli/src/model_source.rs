//! Finding a model: catalogue id, Hugging Face repo id, config.json path or model directory.
//!
//! Files are untrusted: only regular files are read (after following symbolic links), through
//! a reader bounded at [`MAX_CONFIG_BYTES`] whatever size the file system reports, and the
//! config is parsed once (see `memwall_formats::parse_hf_config_with_dtype`). Text from the
//! file or the command line is shown through [`untrusted`].

use crate::error::UserError;
use anyhow::{Context, Result};
use memwall_core::error::untrusted;
use memwall_core::model::ParamCounts;
use memwall_core::ModelDesc;
use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

/// Largest config.json we read (real ones are a few KiB).
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Longest name worth comparing with the catalogue for "did you mean" (ids are < 64 chars).
const MAX_SUGGEST_CHARS: usize = 256;

/// What to pass instead, for every file problem.
const FILE_HINT: &str = "pass a config.json file, a model directory that contains one, or a catalogue id (`memwall models` lists them)";

/// A resolved model.
#[derive(Debug)]
pub struct ModelSource {
    /// What the user typed, normalised (catalogue id or path), safe to show.
    pub label: String,
    /// Hugging Face repo id when known.
    pub hf_repo: Option<String>,
    /// Where the config came from, safe to show.
    pub origin: String,
    /// The parsed description.
    pub desc: ModelDesc,
    /// Exact parameter counts.
    pub counts: ParamCounts,
    /// `torch_dtype`/`dtype` of the config, if given, safe to show.
    pub checkpoint_dtype: Option<String>,
}

fn from_json(
    label: String,
    hf_repo: Option<String>,
    origin: String,
    json: &str,
) -> Result<ModelSource> {
    let parsed = memwall_formats::parse_hf_config_with_dtype(json)
        .with_context(|| format!("cannot use the config from {origin}"))?;
    let counts = parsed
        .desc
        .param_counts()
        .context("cannot count the parameters")?;
    Ok(ModelSource {
        label,
        hf_repo,
        origin,
        desc: parsed.desc,
        counts,
        checkpoint_dtype: parsed.checkpoint_dtype.map(|d| untrusted(&d)),
    })
}

/// What a non-regular file is, in words.
fn kind_of(meta: &Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if meta.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

fn not_regular(path: &Path, meta: &Metadata) -> UserError {
    UserError::new(
        format!(
            "cannot use model `{}`: it is {}, not a regular file",
            untrusted(&path.display().to_string()),
            kind_of(meta)
        ),
        FILE_HINT,
    )
}

/// Reads a config file: a regular file (checked on the opened handle, after symlinks are
/// followed), at most [`MAX_CONFIG_BYTES`] read whatever size is reported, valid UTF-8.
fn read_config(path: &Path) -> Result<String> {
    let shown = untrusted(&path.display().to_string());
    // checked before opening: opening a FIFO would block until a writer appears
    let meta = std::fs::metadata(path).map_err(|e| {
        UserError::new(
            format!("cannot read model `{shown}`: {e}"),
            "check that the file exists and is readable",
        )
    })?;
    if !meta.is_file() {
        return Err(not_regular(path, &meta).into());
    }
    let file = File::open(path).map_err(|e| {
        UserError::new(
            format!("cannot read model `{shown}`: {e}"),
            "check that the file exists and is readable",
        )
    })?;
    let meta = file.metadata().map_err(|e| {
        UserError::new(
            format!("cannot read model `{shown}`: {e}"),
            "check that the file exists and is readable",
        )
    })?;
    if !meta.is_file() {
        return Err(not_regular(path, &meta).into());
    }
    // never trust the reported size (/proc files report 0, and files change): read one byte
    // past the limit to tell "at the limit" from "over it"
    let mut bytes = Vec::with_capacity(meta.len().min(MAX_CONFIG_BYTES) as usize + 1);
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            UserError::new(
                format!("cannot read model `{shown}`: {e}"),
                "check that the file is readable; a config.json is an ordinary JSON text file",
            )
        })?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(UserError::new(
            format!(
                "model `{shown}` is larger than {} MiB; a config.json is a few KiB",
                MAX_CONFIG_BYTES >> 20
            ),
            "pass the model's config.json, not its weights or another large file",
        )
        .into());
    }
    String::from_utf8(bytes).map_err(|e| {
        UserError::new(
            format!(
                "model `{shown}` is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
            "a config.json is UTF-8 JSON text; pass the model's config.json",
        )
        .into()
    })
}

/// Resolves `spec` to a model.
pub fn load(spec: &str) -> Result<ModelSource> {
    let shown = untrusted(spec);
    let path = Path::new(spec);
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            let cfg = path.join("config.json");
            if std::fs::symlink_metadata(&cfg).is_err() {
                return Err(UserError::new(
                    format!("model directory `{shown}` has no config.json"),
                    "pass the directory of a Hugging Face model snapshot (it holds config.json), or the config.json itself",
                )
                .into());
            }
            let json = read_config(&cfg)?;
            let origin = untrusted(&cfg.display().to_string());
            return from_json(shown, None, origin, &json);
        }
        Ok(meta) if meta.is_file() => {
            let json = read_config(path)?;
            return from_json(shown.clone(), None, shown, &json);
        }
        Ok(meta) => return Err(not_regular(path, &meta).into()),
        Err(e) => {
            if let Ok(link) = std::fs::symlink_metadata(path) {
                if link.file_type().is_symlink() {
                    return Err(UserError::new(
                        format!("model `{shown}` is a symbolic link to nothing ({e})"),
                        FILE_HINT,
                    )
                    .into());
                }
                return Err(UserError::new(
                    format!("cannot read model `{shown}`: {e}"),
                    "check the permissions of the file and its directories",
                )
                .into());
            }
        }
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
    let suggestions = if spec.chars().count() <= MAX_SUGGEST_CHARS {
        memwall_catalog::suggest(spec)
    } else {
        Vec::new()
    };
    let mut msg = if looks_like_path {
        format!("no such file: {shown}")
    } else {
        format!(
            "unknown model `{shown}`: not a catalogue id, Hugging Face repo id, file or directory"
        )
    };
    if !suggestions.is_empty() {
        msg.push_str(&format!(" (did you mean: {}?)", suggestions.join(", ")));
    }
    let hint = if looks_like_path {
        "check the path; a model is a config.json file, a directory that holds one, or a catalogue id (`memwall models` lists them)"
    } else {
        "`memwall models` lists the catalogue; or pass a path to a config.json"
    };
    Err(UserError::new(msg, hint).into())
}
