//! The committed web build (web/pkg/) is the build of the committed sources: the files it was built
//! from hash as recorded in web/pkg/INPUTS.sha256, and its outputs as in web/pkg/OUTPUTS.sha256.
//! Both are `sha256sum` listings, so `cd web/pkg && sha256sum -c OUTPUTS.sha256` and
//! `sha256sum -c web/pkg/INPUTS.sha256` (from the repository root) check them by hand too.
//! tools/web/build.sh rebuilds the page and rewrites both.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const REBUILD: &str =
    "rebuild the page with `bash tools/web/build.sh` (it says what it needs) and commit web/pkg/";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every file under `dir` (relative to the repository), recursively.
fn walk(root: &Path, dir: &str, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.unwrap())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = format!("{dir}/{}", e.file_name().to_string_lossy());
        if e.file_type().unwrap().is_dir() {
            walk(root, &name, out);
        } else {
            out.push(name);
        }
    }
}

/// The inputs of the build, as tools/web/inputs.sh lists them.
fn inputs(root: &Path) -> Vec<String> {
    let mut files = vec![
        "Cargo.toml".to_owned(),
        "Cargo.lock".to_owned(),
        "tools/web/build.sh".to_owned(),
    ];
    walk(root, "data", &mut files);
    for c in [
        "memwall-core",
        "memwall-formats",
        "memwall-catalog",
        "memwall-cli",
        "memwall-wasm",
    ] {
        files.push(format!("crates/{c}/Cargo.toml"));
        if root.join(format!("crates/{c}/build.rs")).is_file() {
            files.push(format!("crates/{c}/build.rs"));
        }
        walk(root, &format!("crates/{c}/src"), &mut files);
    }
    // the server is not compiled into the module (it embeds the module)
    files.retain(|f| f != "crates/memwall-cli/src/web.rs");
    files.sort();
    files
}

/// `sha256sum` lines: path → hash.
fn read_sums(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}; {REBUILD}", path.display()));
    text.lines()
        .map(|l| {
            let (hash, file) = l.split_once("  ").expect("a sha256sum line");
            (file.to_owned(), hash.to_owned())
        })
        .collect()
}

#[test]
fn the_committed_module_is_built_from_these_sources() {
    let root = repo();
    let recorded = read_sums(&root.join("web/pkg/INPUTS.sha256"));
    let now: BTreeMap<String, String> = inputs(&root)
        .into_iter()
        .map(|f| {
            let h = hex(&std::fs::read(root.join(&f)).unwrap());
            (f, h)
        })
        .collect();
    let mut stale = Vec::new();
    for (f, h) in &now {
        match recorded.get(f) {
            None => stale.push(format!("new since the build: {f}")),
            Some(r) if r != h => stale.push(format!("changed since the build: {f}")),
            Some(_) => {}
        }
    }
    for f in recorded.keys().filter(|f| !now.contains_key(*f)) {
        stale.push(format!("gone since the build: {f}"));
    }
    assert!(
        stale.is_empty(),
        "web/pkg/ is out of date with its sources:\n  {}\n{REBUILD}",
        stale.join("\n  ")
    );
}

#[test]
fn the_committed_module_is_the_recorded_build() {
    let pkg = repo().join("web/pkg");
    let recorded = read_sums(&pkg.join("OUTPUTS.sha256"));
    assert_eq!(
        recorded.keys().map(String::as_str).collect::<Vec<_>>(),
        ["memwall_wasm.js", "memwall_wasm_bg.wasm"]
    );
    for (f, h) in recorded {
        let now = hex(&std::fs::read(pkg.join(&f)).unwrap());
        assert_eq!(
            now, h,
            "web/pkg/{f} is not the file tools/web/build.sh wrote; {REBUILD}"
        );
    }
}

#[test]
fn the_inputs_script_lists_the_same_files() {
    // the script and this test must agree on what the build reads; skip where bash is missing
    let root = repo();
    let Ok(out) = std::process::Command::new("bash")
        .arg(root.join("tools/web/inputs.sh"))
        .output()
    else {
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(listed, inputs(&root));
}
