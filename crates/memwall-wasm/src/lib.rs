//! The web page's bindings: the `memwall` command line, compiled to WebAssembly.
//!
//! There is no second implementation: [`run`] hands an argument vector to
//! [`memwall_cli::run_args`], the same resolution and report builders the binary runs, so every
//! number on the page is the CLI's. The page asks for `--json` and reads the report; a pasted
//! config.json goes through [`memwall_cli::run_args_with_config`].
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
