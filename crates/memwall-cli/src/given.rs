//! Model files given in memory instead of on disk: the web page's dropped `config.json`,
//! `model.safetensors.index.json`, `.safetensors` and `.gguf` files. Each is its name, its
//! first bytes and its real length; the given files form one directory, the current one (`.`),
//! and [`crate::model_source`] resolves `--model NAME` in it by the very code that reads files
//! from disk, with the same bounds: only the reads change.
//!
//! A weights file is given as a prefix (the page reads it with `File.slice`, never whole): a
//! `.safetensors` needs its first `8 + N` bytes (`N` is the little-endian `u64` of its first 8),
//! a `.gguf` its fixed header, metadata (in practice dominated by the tokenizer's vocabulary and
//! merges: a few MiB, at most `gguf::MAX_HEADER_BYTES`) and tensor infos, a length only known by
//! walking it. When a read goes past the bytes given, the error is [`PrefixTooShort`]: it names
//! the file and how many of its first bytes to give next (for GGUF, growing at least
//! geometrically, as the command line reads a file), so a caller re-reads and runs again.

use crate::error::UserError;
use anyhow::Result;
use memwall_core::error::untrusted;
use std::cell::RefCell;
use std::path::{Component, Path};
use std::rc::Rc;

/// Most files one call may give (as many as a model directory may hold weight files).
const MAX_GIVEN_FILES: usize = 4096;

/// One file given in memory: its name, its first bytes, and the length of the whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenFile {
    name: String,
    prefix: Vec<u8>,
    len: u64,
}

impl GivenFile {
    /// A file named `name` (a plain file name, no directory) of `len` bytes, whose first
    /// `prefix.len()` bytes are `prefix` (all of them for a config or an index; a prefix of a
    /// weights file). Checked when a run starts, so that a bad file is reported as the command
    /// line reports errors.
    pub fn new(name: impl Into<String>, prefix: Vec<u8>, len: u64) -> GivenFile {
        GivenFile {
            name: name.into(),
            prefix,
            len,
        }
    }

    /// The file's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bytes given (the start of the file).
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The length of the whole file.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the whole file is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A read went past the bytes given of a file that goes on: give more of it and run again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("only the first {have} bytes of `{file}` ({len} bytes) were given; reading it needs its first {needed} bytes")]
pub struct PrefixTooShort {
    /// The file's name (as given; shown through `untrusted` in reports).
    pub file: String,
    /// Bytes given.
    pub have: u64,
    /// Bytes to give next: at least what the reader needs, at most the file's length.
    pub needed: u64,
    /// The whole file's length.
    pub len: u64,
}

impl PrefixTooShort {
    /// The error's message, safe to show.
    pub fn message(&self) -> String {
        format!(
            "only the first {} bytes of `{}` ({} bytes) were given; reading it needs its first {} bytes",
            self.have,
            untrusted(&self.file),
            self.len,
            self.needed
        )
    }

    /// What to do about it.
    pub fn hint(&self) -> String {
        format!(
            "give the first {} bytes of the file (in a browser: `file.slice(0, {})`) and run again; the tensor data is never needed",
            self.needed, self.needed
        )
    }
}

thread_local! {
    /// The files given ([`with_files`]); while set, models resolve among them only.
    static GIVEN: RefCell<Option<Rc<[GivenFile]>>> = const { RefCell::new(None) };
}

/// Checks `files` (names plain, unique; prefixes no longer than the files).
fn check(files: &[GivenFile]) -> Result<()> {
    const HINT: &str = "give each file once, by its own name (`config.json`, `model.safetensors.index.json`, `model-00001-of-00002.safetensors`, `model.gguf`), with its real length";
    if files.len() > MAX_GIVEN_FILES {
        return Err(UserError::new(
            format!(
                "{} files were given; one model has at most {MAX_GIVEN_FILES}",
                files.len()
            ),
            HINT,
        )
        .into());
    }
    for (i, f) in files.iter().enumerate() {
        let plain = {
            let mut c = Path::new(&f.name).components();
            matches!((c.next(), c.next()), (Some(Component::Normal(n)), None) if n.to_str() == Some(f.name.as_str()))
        };
        if !plain || f.name.contains(['/', '\\']) {
            return Err(UserError::new(
                format!(
                    "given file name `{}` is not a plain file name",
                    untrusted(&f.name)
                ),
                HINT,
            )
            .into());
        }
        if f.prefix.len() as u64 > f.len {
            return Err(UserError::new(
                format!(
                    "given file `{}` has {} bytes given but a length of {}",
                    untrusted(&f.name),
                    f.prefix.len(),
                    f.len
                ),
                HINT,
            )
            .into());
        }
        if files[..i].iter().any(|g| g.name == f.name) {
            return Err(UserError::new(
                format!("file `{}` was given twice", untrusted(&f.name)),
                HINT,
            )
            .into());
        }
    }
    Ok(())
}

/// Runs `f` with every model resolved among `files` (a directory of its own, `.`): `--model
/// NAME` is one of them (or `.`, the directory), read through the same code and bounds as a
/// file on disk. Nothing on disk is read for a model. Restored when `f` returns or unwinds.
pub(crate) fn with_files<R>(files: Vec<GivenFile>, f: impl FnOnce() -> Result<R>) -> Result<R> {
    struct Restore(Option<Rc<[GivenFile]>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            GIVEN.with(|g| *g.borrow_mut() = previous);
        }
    }
    check(&files)?;
    let previous = GIVEN.with(|g| g.borrow_mut().replace(Rc::from(files)));
    let _restore = Restore(previous);
    f()
}

/// Whether files are given (models resolve among them only).
pub(crate) fn active() -> bool {
    GIVEN.with(|g| g.borrow().is_some())
}

/// What a path names among the given files.
pub(crate) enum Entry {
    /// The directory of the given files (`.`).
    Dir,
    /// One given file.
    File(Handle),
    /// Nothing given.
    Missing,
}

/// A given file, opened.
#[derive(Debug, Clone)]
pub(crate) struct Handle {
    files: Rc<[GivenFile]>,
    index: usize,
}

impl Handle {
    fn file(&self) -> &GivenFile {
        &self.files[self.index]
    }

    /// The whole file's length.
    pub(crate) fn len(&self) -> u64 {
        self.file().len
    }

    /// The bytes given.
    pub(crate) fn given(&self) -> u64 {
        self.file().prefix.len() as u64
    }

    /// Appends to `have` the file's bytes up to offset `limit` (or its end), as a bounded read
    /// of a file on disk does, or fails with [`PrefixTooShort`] when they were not all given.
    pub(crate) fn read_prefix(&self, have: &mut Vec<u8>, limit: u64) -> Result<()> {
        let f = self.file();
        let want = limit.min(f.len);
        if want > f.prefix.len() as u64 {
            return Err(PrefixTooShort {
                file: f.name.clone(),
                have: f.prefix.len() as u64,
                needed: want,
                len: f.len,
            }
            .into());
        }
        let from = have.len().min(f.prefix.len());
        let to = usize::try_from(want).unwrap_or(usize::MAX).max(from);
        have.extend_from_slice(f.prefix.get(from..to).unwrap_or_default());
        Ok(())
    }
}

/// The given file or directory `path` names: `.` (or empty) is their directory, `NAME` or
/// `./NAME` one of them; any other path names nothing.
pub(crate) fn entry(path: &Path) -> Entry {
    GIVEN.with(|g| {
        let Some(files) = g.borrow().clone() else {
            return Entry::Missing;
        };
        let mut parts = path.components().filter(|c| *c != Component::CurDir);
        match (parts.next(), parts.next()) {
            (None, _) => Entry::Dir,
            (Some(Component::Normal(name)), None) => {
                match files
                    .iter()
                    .position(|f| name.to_str() == Some(f.name.as_str()))
                {
                    Some(index) => Entry::File(Handle { files, index }),
                    None => Entry::Missing,
                }
            }
            _ => Entry::Missing,
        }
    })
}

/// The names of the given files, sorted.
pub(crate) fn names() -> Vec<String> {
    let mut names: Vec<String> = GIVEN.with(|g| {
        g.borrow()
            .as_ref()
            .map(|f| f.iter().map(|f| f.name.clone()).collect())
            .unwrap_or_default()
    });
    names.sort();
    names
}

/// The names of the given files, for messages: `a.gguf, config.json` (or `none`).
pub(crate) fn listed() -> String {
    let names = names();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names
            .iter()
            .map(|n| format!("`{}`", untrusted(n)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(path: &str) -> &'static str {
        match entry(Path::new(path)) {
            Entry::Dir => "dir",
            Entry::File(_) => "file",
            Entry::Missing => "missing",
        }
    }

    #[test]
    fn the_given_files_are_one_directory_and_nothing_else() {
        let files = vec![GivenFile::new("a.gguf", vec![1, 2, 3], 10)];
        assert_eq!(kind("a.gguf"), "missing", "nothing given yet");
        with_files(files, || {
            assert!(active());
            for (path, want) in [
                ("a.gguf", "file"),
                ("./a.gguf", "file"),
                (".", "dir"),
                ("", "dir"),
                ("b.gguf", "missing"),
                ("../a.gguf", "missing"),
                ("/a.gguf", "missing"),
                ("x/a.gguf", "missing"),
            ] {
                assert_eq!(kind(path), want, "{path}");
            }
            let Entry::File(h) = entry(Path::new("a.gguf")) else {
                unreachable!()
            };
            let mut buf = Vec::new();
            h.read_prefix(&mut buf, 2)?;
            h.read_prefix(&mut buf, 3)?;
            assert_eq!(buf, [1, 2, 3]);
            let e = h.read_prefix(&mut buf, 8).unwrap_err();
            let p = e.downcast_ref::<PrefixTooShort>().unwrap();
            assert_eq!((p.have, p.needed, p.len), (3, 8, 10));
            // beyond the bytes given, however far
            assert!(h.read_prefix(&mut buf, 100).is_err());
            Ok(())
        })
        .unwrap();
        assert!(!active(), "restored");
        let whole = vec![GivenFile::new("c.json", b"{}".to_vec(), 2)];
        with_files(whole, || {
            let Entry::File(h) = entry(Path::new("c.json")) else {
                unreachable!()
            };
            let mut buf = Vec::new();
            h.read_prefix(&mut buf, 100)?;
            assert_eq!(buf, b"{}");
            Ok(())
        })
        .unwrap();
    }
}
