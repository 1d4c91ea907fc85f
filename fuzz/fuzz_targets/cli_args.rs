//! Argument vectors → resolved settings → report → every renderer, for every subcommand.
//! Any vector must print a report or an error with a hint: never a panic or an overflow, and
//! JSON output always parses.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// Flags that write files: the fuzzer must not write to arbitrary paths.
const WRITES_FILES: &[&str] = &["--svg", "--out", "--emit", "--export"];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // one argument per line, so arguments can hold spaces and commas
    let argv: Vec<&str> = text.lines().take(64).collect();
    if argv.iter().any(|a| WRITES_FILES.iter().any(|f| a.starts_with(f))) {
        return;
    }
    // `memwall web` serves until it is stopped
    if argv.first() == Some(&"web") {
        return;
    }
    // the catalogue and the embedded models only: no paths (a path would read this machine's files)
    if argv.iter().any(|a| a.contains('/') || a.starts_with('.')) {
        return;
    }
    let mut out: Vec<u8> = Vec::new();
    match memwall_cli::run_args(argv.iter().copied(), &mut out) {
        Ok(()) => {
            if argv.iter().any(|a| *a == "--json" || *a == "json") {
                let text = String::from_utf8(out).expect("reports are UTF-8");
                if !text.is_empty() {
                    // serde_json writes no NaN or infinity (it would fail), so parsing is the test
                    let _: serde_json::Value =
                        serde_json::from_str(&text).expect("--json output parses");
                }
            }
        }
        Err(lines) => assert!(!lines.is_empty()),
    }
});
