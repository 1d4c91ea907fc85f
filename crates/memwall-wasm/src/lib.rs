//! The web page's bindings: the `memwall` command line, compiled to WebAssembly.
//!
//! There is no second implementation: [`run`] hands an argument vector to
//! [`memwall_cli::run_args`], the same resolution and report builders the binary runs, so every
//! number on the page is the CLI's. The page asks for `--json` and reads the report; a pasted
//! config.json goes through [`memwall_cli::run_args_with_config`], dropped model files (a
//! `config.json`, `model.safetensors.index.json`, the first bytes of `.safetensors` and `.gguf`
//! files) through [`memwall_cli::run_args_with_files`].
//!
//! The answer is one JSON text: `{"ok": REPORT}` (the report as the CLI prints it: JSON when
//! `--json` was asked, else a string holding the table), or `{"error": [LINES]}` with the lines
//! `memwall` prints on stderr (`error: …`, causes, `hint: …`).

use wasm_bindgen::prelude::wasm_bindgen;

/// The `memwall` version these bindings were built from.
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

/// Runs `memwall ARGS…` (without the program name) and returns `{"ok": …}` or `{"error": […]}`.
#[wasm_bindgen]
pub fn run(args: Vec<String>) -> String {
    answer(|out| memwall_cli::run_args(args, out))
}

/// [`run`] with the model given as config.json text: every model the arguments name is this
/// config (its label in the report is `config.json`).
#[wasm_bindgen]
pub fn run_with_config(args: Vec<String>, config_json: &str) -> String {
    answer(|out| memwall_cli::run_args_with_config(args, config_json, out))
}

/// [`run`] with the model's files given in memory (dropped on the page): file `i` is named
/// `names[i]`, is `sizes[i]` bytes long, and its first `prefix_lens[i]` bytes come next in
/// `bytes` (the prefixes one after the other). `--model NAME` names one of them. When a prefix
/// was too short the answer also holds `"more": {"file": NAME, "bytes": N}`: read the first `N`
/// bytes of that file (`file.slice(0, N)`) and call again.
#[wasm_bindgen]
pub fn run_with_files(
    args: Vec<String>,
    names: Vec<String>,
    sizes: Vec<f64>,
    prefix_lens: Vec<u32>,
    bytes: &[u8],
) -> String {
    let files = match given_files(names, &sizes, &prefix_lens, bytes) {
        Ok(files) => files,
        Err(lines) => return serde_json::json!({ "error": lines }).to_string(),
    };
    let mut more = None;
    let text = answer(|out| {
        memwall_cli::run_args_with_files(args, files, out).map_err(|e| {
            more = e.more;
            e.lines
        })
    });
    match more {
        None => text,
        Some(m) => {
            let mut v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            v["more"] = serde_json::json!({ "file": m.file, "bytes": m.needed });
            v.to_string()
        }
    }
}

/// Largest file size a JavaScript number holds exactly (`Number.MAX_SAFE_INTEGER`).
const MAX_SAFE_SIZE: f64 = 9_007_199_254_740_991.0;

/// The files of [`run_with_files`]'s arguments, or the error lines when they do not fit.
fn given_files(
    names: Vec<String>,
    sizes: &[f64],
    prefix_lens: &[u32],
    bytes: &[u8],
) -> Result<Vec<memwall_cli::GivenFile>, Vec<String>> {
    let bad = |what: String| {
        vec![
            format!("error: {what}"),
            "hint: pass one name, size and prefix length per file, and the prefixes one after the other".to_owned(),
        ]
    };
    if sizes.len() != names.len() || prefix_lens.len() != names.len() {
        return Err(bad(format!(
            "{} names, {} sizes and {} prefix lengths were given",
            names.len(),
            sizes.len(),
            prefix_lens.len()
        )));
    }
    let mut files = Vec::with_capacity(names.len());
    let mut at = 0usize;
    for ((name, size), plen) in names.into_iter().zip(sizes).zip(prefix_lens) {
        if !(size.is_finite() && *size >= 0.0 && size.fract() == 0.0 && *size <= MAX_SAFE_SIZE) {
            return Err(bad(format!(
                "the size of a file is {size}, not a byte count"
            )));
        }
        let end = usize::try_from(*plen)
            .ok()
            .and_then(|p| at.checked_add(p))
            .filter(|end| *end <= bytes.len())
            .ok_or_else(|| {
                bad(format!(
                    "{} bytes were given for {} prefix bytes",
                    bytes.len(),
                    at as u64 + u64::from(*plen)
                ))
            })?;
        // exact: a finite non-negative integer up to 2^53 − 1
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let len = *size as u64;
        files.push(memwall_cli::GivenFile::new(
            name,
            bytes[at..end].to_vec(),
            len,
        ));
        at = end;
    }
    if at != bytes.len() {
        return Err(bad(format!(
            "{} bytes were given for {at} prefix bytes",
            bytes.len()
        )));
    }
    Ok(files)
}

/// Runs `f` into a buffer and wraps its report or its error lines.
fn answer(f: impl FnOnce(&mut Vec<u8>) -> Result<(), Vec<String>>) -> String {
    let mut out = Vec::new();
    match f(&mut out) {
        Ok(()) => {
            let text = String::from_utf8_lossy(&out);
            // a JSON report goes in verbatim, so the page reads the very bytes the CLI prints
            if serde_json::from_str::<serde_json::Value>(&text).is_ok() {
                format!("{{\"ok\":{}}}", text.trim_end())
            } else {
                serde_json::json!({ "ok": text }).to_string()
            }
        }
        Err(lines) => serde_json::json!({ "error": lines }).to_string(),
    }
}
