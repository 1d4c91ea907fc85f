//! Integration tests of memwall-formats: one binary, one module per area.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod checkpoint;
mod errors;
mod gguf;
mod golden;
mod headers_never_panic;
mod hub;
mod limits;
mod never_panics;
mod quant_config;
mod safetensors;

use std::path::PathBuf;

/// `tests/` of this crate.
pub fn tests_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// The text of `tests/configs/<name>`.
pub fn config(name: &str) -> String {
    let path = tests_dir().join("configs").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
