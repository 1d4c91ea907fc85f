//! `memwall._native`: the Python module under `import memwall`. It holds no estimate of its
//! own: it hands an argument vector to the `memwall` command line's library
//! ([`memwall_cli::run_args`]) and gives back the report it wrote, JSON text, or the error
//! lines the binary would print (`error: …`, causes, `hint: …`). The Python package
//! (`python/memwall`) builds the vector from keyword arguments and turns the JSON into typed
//! results.

use pyo3::prelude::*;

/// Runs one `memwall` argument vector (without the program name). `config_json`, when given,
/// is the text of a config.json every model of the command is resolved from (the `--model`
/// value is then only its label). Returns `(True, report)` with what the command wrote, or
/// `(False, lines)` with its error report, one line per `\n`. The GIL is released meanwhile.
#[pyfunction]
#[pyo3(signature = (argv, config_json=None))]
fn run(py: Python<'_>, argv: Vec<String>, config_json: Option<String>) -> (bool, String) {
    py.detach(|| run_argv(&argv, config_json.as_deref()))
}

/// `run` without Python: the report, or the error lines joined by `\n`.
pub fn run_argv(argv: &[String], config_json: Option<&str>) -> (bool, String) {
    let mut out = Vec::new();
    let result = match config_json {
        Some(json) => memwall_cli::run_args_with_config(argv, json, &mut out),
        None => memwall_cli::run_args(argv, &mut out),
    };
    match result {
        Ok(()) => (true, String::from_utf8_lossy(&out).into_owned()),
        Err(lines) => (false, lines.join("\n")),
    }
}

/// The module: `run` and `__version__` (the workspace version).
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_or_the_error_lines() {
        let argv = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let (ok, text) = run_argv(&argv(&["train", "--model", "gpt2", "--json"]), None);
        assert!(ok);
        assert!(text.contains("\"peak_bytes\""));
        let (ok, text) = run_argv(&argv(&["train", "--batch", "0"]), None);
        assert!(!ok);
        assert!(text.starts_with("error: "));
        assert!(text.lines().last().is_some_and(|l| l.starts_with("hint: ")));
    }
}
