//! Finding a model, offline, as `huggingface_hub` and transformers do: a local path first
//! (a model directory, a `config.json`, a `.safetensors` file or its
//! `model.safetensors.index.json`, a `.gguf` file), then a Hub repo id (`org/name[@revision]`)
//! in the local Hugging Face cache, then the catalogue (ids, repos, and Instruct/Chat variants
//! of catalogued models whose config is the same architecture).
//!
//! Files are untrusted: only regular files are read (checked on the opened handle, after
//! symbolic links are followed), through bounded readers whatever size the file system
//! reports. Configs and indexes are read whole up to [`MAX_CONFIG_BYTES`]; of a weights file
//! only the header is read: safetensors 8 bytes, then the `N` bytes the first 8 announce
//! (at most `safetensors::MAX_HEADER_BYTES`); GGUF in growing chunks while the parser asks for
//! more (at most `gguf::MAX_HEADER_BYTES`). Tensor data is never read. Text from a file or the
//! command line is shown through [`untrusted`].

use crate::error::UserError;
use crate::given;
use anyhow::{Context, Result};
use memwall_core::error::untrusted;
use memwall_core::model::ParamCounts;
use memwall_core::quant::StoredWeights;
use memwall_core::workload::WeightFormat;
use memwall_core::ModelDesc;
use memwall_formats::checkpoint::{Checkpoint, Storage};
use memwall_formats::gguf::{self, GgufHeader};
use memwall_formats::safetensors::{self, SafetensorsHeader};
use memwall_formats::{hub, FormatError, QuantConfig};
use std::fs::{File, Metadata};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest config.json or index we read (configs are a few KiB; DeepSeek-V3's index is 9 MB).
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// First read of a GGUF file; more is read when the header goes on.
const GGUF_FIRST_READ: u64 = 1 << 20;

/// Most `.gguf` or shard files one model may name (DeepSeek-V3 has 163 shards).
const MAX_FILES: usize = 4096;

/// Longest name worth comparing with the catalogue for "did you mean" (ids are < 64 chars).
const MAX_SUGGEST_CHARS: usize = 256;

/// The safetensors index transformers writes.
const INDEX_NAME: &str = "model.safetensors.index.json";

/// What to pass instead, for every file problem.
const FILE_HINT: &str = "pass a model directory (config.json with its .safetensors shards, or a .gguf), a config.json, a .safetensors file or index, a .gguf file, a Hugging Face repo id in the local cache, or a catalogue id (`memwall models` lists them)";

/// A checkpoint's tensors, read from its files' headers.
#[derive(Debug, Clone)]
pub struct CheckpointInfo {
    /// `safetensors` or `gguf`.
    pub format: &'static str,
    /// Files whose headers were read.
    pub files: usize,
    /// The storage scheme, in words (`bf16 (unquantised)`, `GPTQ (…)`, `GGUF, mostly Q4_K`).
    pub storage: String,
    /// Exact tensor bytes, in and outside the decoder layers.
    pub stored: StoredWeights,
    /// The memwall weight format with the same per-tensor rules, when there is one (used for
    /// what the bytes do not decide: dequantisation temporaries, the compute dtype).
    pub format_equivalent: Option<WeightFormat>,
    /// Layers stored beyond the description (DeepSeek-V3's multi-token-prediction layer).
    pub extra_layers: u64,
}

/// A resolved model.
#[derive(Debug)]
pub struct ModelSource {
    /// What the user typed, normalised (catalogue id, repo id or path), safe to show.
    pub label: String,
    /// Hugging Face repo id when known.
    pub hf_repo: Option<String>,
    /// Where the model came from, safe to show.
    pub origin: String,
    /// The parsed description.
    pub desc: ModelDesc,
    /// Exact parameter counts.
    pub counts: ParamCounts,
    /// `torch_dtype`/`dtype` of the config, if given, safe to show.
    pub checkpoint_dtype: Option<String>,
    /// The config's `quantization_config`, if any.
    pub quant: Option<QuantConfig>,
    /// The checkpoint's tensors, when weight files were found.
    pub checkpoint: Option<CheckpointInfo>,
}

fn parse_config(
    origin: &str,
    json: &str,
) -> Result<(ModelDesc, Option<String>, Option<QuantConfig>)> {
    let parsed = memwall_formats::parse_hf_config_with_dtype(json)
        .with_context(|| format!("cannot use the config from {origin}"))?;
    let quant = memwall_formats::parse_quantization_config(json)
        .with_context(|| format!("cannot use the quantization_config of {origin}"))?;
    Ok((
        parsed.desc,
        parsed.checkpoint_dtype.map(|d| untrusted(&d)),
        quant,
    ))
}

fn source(
    label: String,
    hf_repo: Option<String>,
    origin: String,
    desc: ModelDesc,
    checkpoint_dtype: Option<String>,
    quant: Option<QuantConfig>,
    checkpoint: Option<CheckpointInfo>,
) -> Result<ModelSource> {
    let counts = desc.param_counts().context("cannot count the parameters")?;
    Ok(ModelSource {
        label,
        hf_repo,
        origin,
        desc,
        counts,
        checkpoint_dtype,
        quant,
        checkpoint,
    })
}

fn shown(path: &Path) -> String {
    untrusted(&path.display().to_string())
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
            shown(path),
            kind_of(meta)
        ),
        FILE_HINT,
    )
}

fn unreadable(path: &Path, e: std::io::Error) -> UserError {
    UserError::new(
        format!("cannot read model `{}`: {e}", shown(path)),
        "check that the file exists and is readable",
    )
}

/// An opened file: on disk, or given in memory ([`given`]).
enum Opened {
    Disk(File),
    Given(given::Handle),
}

/// Opens a regular file (checked before opening, since opening a FIFO blocks, and again on
/// the handle) and returns it with its length; among the given files when files are given.
fn open_regular(path: &Path) -> Result<(Opened, u64)> {
    if given::active() {
        return match given::entry(path) {
            given::Entry::File(h) => {
                let len = h.len();
                Ok((Opened::Given(h), len))
            }
            given::Entry::Dir => Err(UserError::new(
                format!(
                    "cannot use model `{}`: it is a directory, not a file",
                    shown(path)
                ),
                GIVEN_HINT,
            )
            .into()),
            given::Entry::Missing => Err(not_given(path)),
        };
    }
    let meta = std::fs::metadata(path).map_err(|e| unreadable(path, e))?;
    if !meta.is_file() {
        return Err(not_regular(path, &meta).into());
    }
    let file = File::open(path).map_err(|e| unreadable(path, e))?;
    let meta = file.metadata().map_err(|e| unreadable(path, e))?;
    if !meta.is_file() {
        return Err(not_regular(path, &meta).into());
    }
    Ok((Opened::Disk(file), meta.len()))
}

/// The hint for a file on disk, or for files given in memory.
fn on_disk_or_given(disk: &'static str, given_files: &'static str) -> &'static str {
    if given::active() {
        given_files
    } else {
        disk
    }
}

/// What to give instead, for every problem with given files.
const GIVEN_HINT: &str = "give the model's files by name: a config.json, with its model.safetensors.index.json and .safetensors shards (their first bytes), or a .gguf file (its first bytes)";

/// `path` is not one of the given files.
fn not_given(path: &Path) -> anyhow::Error {
    UserError::new(
        format!(
            "model file `{}` was not given (given: {})",
            shown(path),
            given::listed()
        ),
        GIVEN_HINT,
    )
    .into()
}

/// Reads up to `limit` bytes from the start of `file`, allocating no more than what arrives
/// (of a given file: fails with [`given::PrefixTooShort`] when they were not given).
fn read_prefix(path: &Path, file: &mut Opened, have: &mut Vec<u8>, limit: u64) -> Result<()> {
    match file {
        Opened::Disk(file) => {
            let more = limit.saturating_sub(have.len() as u64);
            file.take(more)
                .read_to_end(have)
                .map_err(|e| unreadable(path, e))?;
        }
        Opened::Given(h) => h.read_prefix(have, limit)?,
    }
    Ok(())
}

/// Reads a config or index: at most [`MAX_CONFIG_BYTES`] whatever size is reported, UTF-8.
fn read_text(path: &Path) -> Result<String> {
    let s = shown(path);
    let (mut file, len) = open_regular(path)?;
    // never trust the reported size (/proc files report 0, and files change): read one byte
    // past the limit to tell "at the limit" from "over it"
    let mut bytes = Vec::with_capacity(len.min(MAX_CONFIG_BYTES) as usize + 1);
    read_prefix(path, &mut file, &mut bytes, MAX_CONFIG_BYTES + 1)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(UserError::new(
            format!(
                "`{s}` is larger than {} MiB; a config.json is a few KiB",
                MAX_CONFIG_BYTES >> 20
            ),
            "pass the model's config.json (or its directory), not another large file",
        )
        .into());
    }
    String::from_utf8(bytes).map_err(|e| {
        UserError::new(
            format!(
                "`{s}` is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
            "a config.json is UTF-8 JSON text; pass the model's config.json",
        )
        .into()
    })
}

/// Reads and validates a safetensors header: 8 bytes, then the header they announce.
fn read_safetensors(path: &Path) -> Result<SafetensorsHeader> {
    let (mut file, len) = open_regular(path)?;
    let mut buf = Vec::with_capacity(8);
    read_prefix(path, &mut file, &mut buf, 8)?;
    let ctx = || format!("cannot read the safetensors header of `{}`", shown(path));
    let need = safetensors::prefix_len(&buf, len).with_context(ctx)?;
    read_prefix(path, &mut file, &mut buf, need)?;
    safetensors::parse_header(&buf, len).with_context(ctx)
}

/// Reads and validates a GGUF header, in growing chunks while the parser asks for more (of a
/// given file: first what was given, then [`given::PrefixTooShort`] names the next read).
fn read_gguf(path: &Path) -> Result<GgufHeader> {
    let (mut file, len) = open_regular(path)?;
    let ctx = || format!("cannot read the GGUF header of `{}`", shown(path));
    let mut buf = Vec::new();
    let mut want = match &file {
        Opened::Disk(_) => GGUF_FIRST_READ.min(len),
        Opened::Given(h) => h.given(),
    };
    loop {
        read_prefix(path, &mut file, &mut buf, want)?;
        match gguf::parse_header(&buf, len) {
            Err(FormatError::NeedMoreBytes { needed, .. })
                if needed > buf.len() as u64
                    && (buf.len() as u64) < len.min(gguf::MAX_HEADER_BYTES) =>
            {
                // grow at least geometrically, never past the limit or the file
                want = needed
                    .max(buf.len() as u64 * 2)
                    .max(GGUF_FIRST_READ)
                    .min(gguf::MAX_HEADER_BYTES.min(len));
            }
            other => return other.with_context(ctx),
        }
    }
}

/// Lists the file names in `dir` for which `keep` holds, sorted (at most [`MAX_FILES`]).
fn list(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    if given::active() {
        let mut names = given::names();
        names.retain(|n| keep(n));
        return Ok(names);
    }
    let rd = std::fs::read_dir(dir).map_err(|e| unreadable(dir, e))?;
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| unreadable(dir, e))?;
        if let Some(name) = entry.file_name().to_str() {
            if keep(name) {
                names.push(name.to_string());
                if names.len() > MAX_FILES {
                    return Err(UserError::new(
                        format!("`{}` holds more than {MAX_FILES} weight files", shown(dir)),
                        "pass the directory of one model",
                    )
                    .into());
                }
            }
        }
    }
    names.sort();
    Ok(names)
}

fn exists(p: &Path) -> bool {
    if given::active() {
        return !matches!(given::entry(p), given::Entry::Missing);
    }
    std::fs::symlink_metadata(p).is_ok()
}

/// The checkpoint of safetensors headers, cross-checked against `desc`.
fn safetensors_checkpoint(
    headers: &[SafetensorsHeader],
    desc: &ModelDesc,
    quant: Option<&QuantConfig>,
    origin: &str,
) -> Result<CheckpointInfo> {
    let ck = Checkpoint::from_safetensors(headers);
    let check = ck
        .cross_check(desc)
        .with_context(|| format!("the tensors of {origin} do not match its config.json"))?;
    let storage = ck.storage();
    let format_equivalent = match &storage {
        Storage::Float(d) => match d.as_str() {
            "BF16" => Some(WeightFormat::Bf16),
            "F16" => Some(WeightFormat::Fp16),
            "F32" => Some(WeightFormat::Fp32),
            _ => None,
        },
        _ => quant.and_then(QuantConfig::weight_format),
    };
    Ok(info(
        "safetensors",
        headers.len(),
        &ck,
        storage.describe(),
        format_equivalent,
        check.extra_layers,
    ))
}

fn info(
    format: &'static str,
    files: usize,
    ck: &Checkpoint,
    storage: String,
    format_equivalent: Option<WeightFormat>,
    extra_layers: u64,
) -> CheckpointInfo {
    let lb = ck.layer_bytes();
    CheckpointInfo {
        format,
        files,
        storage,
        stored: StoredWeights {
            layer_bytes: lb.per_layer.iter().sum(),
            other_bytes: lb.other,
        },
        format_equivalent,
        extra_layers,
    }
}

/// A model from a config.json and, when given, its safetensors files (an index, or files).
fn from_config_and_weights(
    label: String,
    hf_repo: Option<String>,
    config: &Path,
    index: Option<&Path>,
    files: &[PathBuf],
    origin_prefix: &str,
) -> Result<ModelSource> {
    let config_shown = shown(config);
    let json = read_text(config)?;
    let (desc, dtype, quant) = parse_config(&config_shown, &json)?;
    let dir = config.parent().unwrap_or(Path::new("."));
    let mut shard_paths: Vec<PathBuf> = files.to_vec();
    let mut index_parsed = None;
    if let Some(ip) = index {
        let text = read_text(ip)?;
        let idx = safetensors::parse_index(&text)
            .with_context(|| format!("cannot use the safetensors index `{}`", shown(ip)))?;
        let idx_dir = ip.parent().unwrap_or(Path::new("."));
        shard_paths = idx.shards().iter().map(|s| idx_dir.join(s)).collect();
        if shard_paths.len() > MAX_FILES {
            return Err(UserError::new(
                format!("`{}` names more than {MAX_FILES} shards", shown(ip)),
                "pass the index of one model",
            )
            .into());
        }
        index_parsed = Some(idx);
    }
    let origin_files = match (index, shard_paths.len()) {
        (Some(ip), n) => format!("{}; {n} shard(s) from {}", config_shown, shown(ip)),
        (None, 0) => config_shown.clone(),
        (None, 1) => format!("{config_shown}; {}", shown(&shard_paths[0])),
        (None, n) => format!("{config_shown}; {n} .safetensors files in {}", shown(dir)),
    };
    let origin = format!("{origin_prefix}{origin_files}");
    let checkpoint = if shard_paths.is_empty() {
        None
    } else {
        let mut headers = Vec::with_capacity(shard_paths.len());
        for p in &shard_paths {
            if !exists(p) {
                return Err(UserError::new(
                    format!("shard `{}` is missing", shown(p)),
                    on_disk_or_given(
                        "download every shard the index names (e.g. `huggingface-cli download REPO --include '*.safetensors'`), or pass the config.json alone",
                        "give every shard the index names too (only the first bytes of each are read: its header), or the config.json alone",
                    ),
                )
                .into());
            }
            headers.push(read_safetensors(p)?);
        }
        if let Some(idx) = &index_parsed {
            let named: Vec<(&str, &SafetensorsHeader)> =
                idx.shards().into_iter().zip(headers.iter()).collect();
            safetensors::check_shards(idx, &named)
                .context("the safetensors index and its shards disagree")?;
        }
        Some(safetensors_checkpoint(
            &headers,
            &desc,
            quant.as_ref(),
            &origin,
        )?)
    };
    source(label, hf_repo, origin, desc, dtype, quant, checkpoint)
}

/// The GGUF files of one model: `path` and, for a split (`…-00001-of-00003.gguf`,
/// llama.cpp `llama_split_path`), its siblings.
fn gguf_split_paths(path: &Path, first: &GgufHeader) -> Vec<PathBuf> {
    let Some((_, count)) = first.split() else {
        return vec![path.to_path_buf()];
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    // `{prefix}-{no:05}-of-{count:05}.gguf`
    let tail = format!("-of-{count:05}.gguf");
    let Some(stem) = name.strip_suffix(&tail) else {
        return vec![path.to_path_buf()];
    };
    let Some(prefix) = stem.get(..stem.len().saturating_sub(6)) else {
        return vec![path.to_path_buf()];
    };
    (1..=count)
        .map(|i| path.with_file_name(format!("{prefix}-{i:05}{tail}")))
        .collect()
}

/// A model from a `.gguf` file (and the other files of its split).
fn from_gguf(
    label: String,
    hf_repo: Option<String>,
    path: &Path,
    origin_prefix: &str,
) -> Result<ModelSource> {
    let first = read_gguf(path)?;
    let paths = gguf_split_paths(path, &first);
    if paths.len() > MAX_FILES {
        return Err(UserError::new(
            format!("`{}` claims {} splits", shown(path), paths.len()),
            "pass a GGUF file written by llama.cpp",
        )
        .into());
    }
    let mut headers = Vec::with_capacity(paths.len());
    for p in &paths {
        if p == path {
            headers.push(first.clone());
        } else if exists(p) {
            headers.push(read_gguf(p)?);
        } else {
            return Err(UserError::new(
                format!("GGUF split `{}` is missing", shown(p)),
                on_disk_or_given(
                    "download every split of the model into one directory",
                    "give every split of the model (only the first bytes of each are read)",
                ),
            )
            .into());
        }
    }
    let origin = format!(
        "{origin_prefix}{}{}",
        shown(path),
        if headers.len() > 1 {
            format!(" (+{} split files)", headers.len() - 1)
        } else {
            String::new()
        }
    );
    let desc = memwall_formats::gguf_shards_to_model(&headers)
        .with_context(|| format!("cannot describe the model in {origin}"))?;
    let ck = Checkpoint::from_gguf(&headers);
    let check = ck
        .cross_check(&desc)
        .with_context(|| format!("the tensors of {origin} do not match its metadata"))?;
    let primary = headers
        .iter()
        .find(|h| h.split().is_none_or(|(no, _)| no == 0))
        .unwrap_or(&first);
    let checkpoint = info(
        "gguf",
        headers.len(),
        &ck,
        ck.storage().describe(),
        primary.weight_format(),
        check.extra_layers,
    );
    source(label, hf_repo, origin, desc, None, None, Some(checkpoint))
}

/// A model directory as `huggingface-cli download` leaves it.
fn from_dir(
    label: String,
    hf_repo: Option<String>,
    dir: &Path,
    origin_prefix: &str,
) -> Result<ModelSource> {
    let s = shown(dir);
    let cfg = dir.join("config.json");
    let index = dir.join(INDEX_NAME);
    let has_cfg = exists(&cfg);
    let has_index = exists(&index);
    let singles = list(dir, |n| n.ends_with(".safetensors"))?;
    let ggufs = list(dir, |n| n.ends_with(".gguf"))?;
    if has_cfg {
        if has_index {
            return from_config_and_weights(label, hf_repo, &cfg, Some(&index), &[], origin_prefix);
        }
        if !singles.is_empty() {
            let files: Vec<PathBuf> = singles.iter().map(|n| dir.join(n)).collect();
            return from_config_and_weights(label, hf_repo, &cfg, None, &files, origin_prefix);
        }
        if ggufs.is_empty() {
            return from_config_and_weights(label, hf_repo, &cfg, None, &[], origin_prefix);
        }
    }
    if let Some(first) = ggufs.first() {
        // one model per directory: the first file (of a split: its first part)
        return from_gguf(label, hf_repo, &dir.join(first), origin_prefix);
    }
    let has = if has_index {
        format!("{INDEX_NAME} but no config.json")
    } else if !singles.is_empty() {
        ".safetensors files but no config.json".to_string()
    } else {
        "no config.json, safetensors or GGUF file".to_string()
    };
    Err(UserError::new(
        format!("model directory `{s}` has {has}"),
        "safetensors headers name tensors, not the architecture: download the config too (`huggingface-cli download REPO config.json`), or pass a .gguf file, a config.json or a catalogue id",
    )
    .into())
}

/// A local path: directory, config.json, .safetensors, index, or .gguf.
fn from_path(spec: &str, path: &Path) -> Result<ModelSource> {
    let label = untrusted(spec);
    if given::active() {
        match given::entry(path) {
            given::Entry::Dir => return from_dir(label, None, path, "directory "),
            given::Entry::File(_) => {}
            given::Entry::Missing => return Err(not_given(path)),
        }
    } else {
        let meta = std::fs::metadata(path).map_err(|e| unreadable(path, e))?;
        if meta.is_dir() {
            return from_dir(label, None, path, "directory ");
        }
        if !meta.is_file() {
            return Err(not_regular(path, &meta).into());
        }
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let need_config = |what: &str| -> Result<PathBuf> {
        let cfg = dir.join("config.json");
        if exists(&cfg) {
            Ok(cfg)
        } else {
            Err(UserError::new(
                format!("{what} `{}` has no config.json beside it", shown(path)),
                on_disk_or_given(
                    "safetensors headers name tensors, not the architecture: put the model's config.json in the same directory (`huggingface-cli download REPO config.json`)",
                    "safetensors headers name tensors, not the architecture: give the model's config.json too",
                ),
            )
            .into())
        }
    };
    if name.ends_with(".gguf") {
        from_gguf(label, None, path, "GGUF file ")
    } else if name.ends_with(".safetensors") {
        let cfg = need_config("safetensors file")?;
        from_config_and_weights(label, None, &cfg, None, &[path.to_path_buf()], "")
    } else if name.ends_with(".safetensors.index.json") {
        let cfg = need_config("safetensors index")?;
        from_config_and_weights(label, None, &cfg, Some(path), &[], "")
    } else {
        let json = read_text(path)?;
        let (desc, dtype, quant) = parse_config(&label, &json)?;
        source(label.clone(), None, label, desc, dtype, quant, None)
    }
}

/// The Hub cache root of this environment (huggingface_hub's rules, see [`hub::cache_root`]).
fn cache_root() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    hub::cache_root(|k| std::env::var(k).ok(), home)
}

/// A Hub repo id in the local cache: `Ok(None)` when the cache has no folder for it.
fn from_cache(spec: &str, r: &hub::RepoRef) -> Result<Option<ModelSource>> {
    let Some(root) = cache_root() else {
        return Ok(None);
    };
    let repo_dir = root.join(r.cache_folder());
    if !repo_dir.is_dir() {
        return Ok(None);
    }
    let rev = r.revision_or_main();
    let commit = match r.ref_path() {
        None => rev.to_string(),
        Some(refname) => {
            let ref_file = repo_dir.join("refs").join(refname);
            if !exists(&ref_file) {
                return Err(UserError::new(
                    format!(
                        "`{}` is in the Hugging Face cache ({}), but not at revision `{}`",
                        untrusted(&r.repo_id),
                        shown(&repo_dir),
                        untrusted(rev)
                    ),
                    "download that revision (`huggingface-cli download REPO --revision REV`), or name a revision the cache has (see its refs/ folder)",
                )
                .into());
            }
            let text = read_text(&ref_file)?;
            let commit = text.trim().to_string();
            if !hub::is_commit_hash(&commit) {
                return Err(UserError::new(
                    format!("`{}` does not hold a commit hash", shown(&ref_file)),
                    "the cache's refs/ files hold 40 hex digits; download the model again",
                )
                .into());
            }
            commit
        }
    };
    let snap = repo_dir.join("snapshots").join(&commit);
    if !snap.is_dir() {
        return Err(UserError::new(
            format!(
                "the Hugging Face cache has no snapshot `{}` of `{}`",
                untrusted(&commit),
                untrusted(&r.repo_id)
            ),
            "download the model again (`huggingface-cli download REPO`)",
        )
        .into());
    }
    let prefix = format!(
        "Hugging Face cache ({}@{}): ",
        untrusted(&r.repo_id),
        &commit[..commit.len().min(12)]
    );
    from_dir(untrusted(spec), Some(r.repo_id.clone()), &snap, &prefix).map(Some)
}

thread_local! {
    /// A config.json given as text ([`with_config_text`]); while set, every model resolves to it.
    static CONFIG_TEXT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Where a model given as config text comes from, in reports.
const CONFIG_TEXT_ORIGIN: &str = "config given as JSON text";

/// Runs `f` with every model resolved from `config_json` (the text of a config.json) instead of
/// the `--model` value, which becomes only the model's label: the Python bindings' `model=dict`
/// or `transformers.PretrainedConfig`, with nothing written to disk. The config goes through the
/// same parser as a config.json file. Restored when `f` returns or unwinds.
pub(crate) fn with_config_text<R>(config_json: &str, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<String>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CONFIG_TEXT.with(|c| *c.borrow_mut() = previous);
        }
    }
    let previous = CONFIG_TEXT.with(|c| c.borrow_mut().replace(config_json.to_owned()));
    let _restore = Restore(previous);
    f()
}

/// Resolves `spec` to a model.
pub fn load(spec: &str) -> Result<ModelSource> {
    let s = untrusted(spec);
    if let Some(json) = CONFIG_TEXT.with(|c| c.borrow().clone()) {
        if json.len() as u64 > MAX_CONFIG_BYTES {
            return Err(UserError::new(
                format!(
                    "the config.json given is larger than {} MiB; a config.json is a few KiB",
                    MAX_CONFIG_BYTES >> 20
                ),
                "give the model's config.json, not another large file",
            )
            .into());
        }
        let (desc, dtype, quant) = parse_config(CONFIG_TEXT_ORIGIN, &json)?;
        return source(
            s,
            None,
            CONFIG_TEXT_ORIGIN.to_owned(),
            desc,
            dtype,
            quant,
            None,
        );
    }
    let path = Path::new(spec);
    if given::active() {
        // the given files only: nothing on disk, in the cache or in the catalogue
        return from_path(spec, path);
    }
    match std::fs::metadata(path) {
        Ok(_) => return from_path(spec, path),
        Err(e) => {
            if let Ok(link) = std::fs::symlink_metadata(path) {
                if link.file_type().is_symlink() {
                    return Err(UserError::new(
                        format!("model `{s}` is a symbolic link to nothing ({e})"),
                        FILE_HINT,
                    )
                    .into());
                }
                return Err(UserError::new(
                    format!("cannot read model `{s}`: {e}"),
                    "check the permissions of the file and its directories",
                )
                .into());
            }
        }
    }
    let repo = hub::parse_repo_ref(spec.trim());
    if let Some(r) = &repo {
        if let Some(src) = from_cache(spec, r)? {
            return Ok(src);
        }
    }
    let id = repo.as_ref().map_or(spec, |r| r.repo_id.as_str());
    if let Some(e) = memwall_catalog::find(id) {
        let origin = format!("catalogue ({})", e.source);
        let (desc, dtype, quant) = parse_config(&origin, e.config_json)?;
        return source(
            e.id.to_owned(),
            Some(e.hf_repo.to_owned()),
            origin,
            desc,
            dtype,
            quant,
            None,
        );
    }
    if let Some((var, base)) = memwall_catalog::find_variant(id) {
        let origin = format!(
            "catalogue: {} has the architecture of {} ({}){}",
            var.hf_repo,
            base.id,
            base.source,
            var.max_position_embeddings
                .map_or(String::new(), |m| format!(
                    ", with max_position_embeddings {m}"
                ))
        );
        let (mut desc, dtype, quant) = parse_config(&origin, base.config_json)?;
        if let Some(m) = var.max_position_embeddings {
            desc.max_position_embeddings = m;
        }
        return source(
            var.hf_repo.to_owned(),
            Some(var.hf_repo.to_owned()),
            origin,
            desc,
            dtype,
            quant,
            None,
        );
    }
    let looks_like_path = spec.contains('/')
        && (spec.ends_with(".json")
            || spec.ends_with(".safetensors")
            || spec.ends_with(".gguf")
            || spec.starts_with('.'));
    let suggestions = if spec.chars().count() <= MAX_SUGGEST_CHARS {
        memwall_catalog::suggest(spec)
    } else {
        Vec::new()
    };
    let mut msg = if looks_like_path {
        format!("no such file: {s}")
    } else {
        format!("unknown model `{s}`: not a file or directory, not in the local Hugging Face cache, not a catalogue id")
    };
    if !suggestions.is_empty() {
        msg.push_str(&format!(" (did you mean: {}?)", suggestions.join(", ")));
    }
    let hint = if looks_like_path {
        "check the path; a model is a directory, a config.json, a .safetensors file or index, a .gguf file, or a catalogue id (`memwall models` lists them)".to_string()
    } else {
        "`memwall models` lists the catalogue; a Hub repo id is looked up offline in the local Hugging Face cache (HF_HUB_CACHE, HF_HOME, else ~/.cache/huggingface/hub): `huggingface-cli download REPO config.json` puts its config there".to_string()
    };
    Err(UserError::new(msg, hint).into())
}
