//! The output edge: where reports and files are written, and what a failed write means.
//!
//! Reports go to one locked, buffered stdout. A closed pipe (`memwall models | head -1`) is a
//! normal end: the reader has what it wanted, so the program stops quietly with status 0, as
//! ripgrep does. Any other write failure (a full disk, a file that cannot be created) is one
//! `error:` line and a `hint:` line with status 1. Nothing here panics on a closed stderr.

use std::fmt;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// A write that failed, to stdout or to a file the user named.
#[derive(Debug)]
pub enum OutputError {
    /// Writing the report to stdout failed.
    Stdout(io::Error),
    /// Writing a file named by a flag failed.
    File {
        /// The flag that named it (`--svg`).
        flag: &'static str,
        /// What the file holds.
        what: &'static str,
        /// The path as given.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

impl fmt::Display for OutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputError::Stdout(e) => write!(f, "cannot write output: {e}"),
            OutputError::File {
                what, path, source, ..
            } => write!(f, "cannot write {what} to {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for OutputError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OutputError::Stdout(e) => Some(e),
            OutputError::File { source, .. } => Some(source),
        }
    }
}

impl OutputError {
    /// Whether the reader of stdout went away (a normal end, not an error).
    pub fn is_closed_pipe(&self) -> bool {
        matches!(self, OutputError::Stdout(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }

    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            OutputError::Stdout(_) => "stdout goes to a file, pipe or device that refused the \
                                       report; check that it has room and is writable"
                .to_owned(),
            OutputError::File { flag, .. } => {
                format!("check that the folder exists and is writable, or give {flag} another path")
            }
        }
    }

    /// Says so on stderr (nothing for a closed pipe) and returns the exit status: 0 for a
    /// closed pipe, 1 otherwise.
    pub fn finish(&self) -> ExitCode {
        if self.is_closed_pipe() {
            return ExitCode::SUCCESS;
        }
        stderr_line(format_args!("error: {self}"));
        stderr_line(format_args!("hint: {}", self.hint()));
        ExitCode::from(1)
    }
}

/// Writes a whole file named by `flag`, mapping a failure to [`OutputError::File`].
pub fn write_file(
    flag: &'static str,
    what: &'static str,
    path: &std::path::Path,
    contents: &[u8],
) -> Result<(), OutputError> {
    std::fs::write(path, contents).map_err(|source| OutputError::File {
        flag,
        what,
        path: path.to_owned(),
        source,
    })
}

/// Writes one line to stderr; a closed or full stderr is ignored (there is nowhere left to say
/// it), where `eprintln!` would panic.
pub fn stderr_line(line: fmt::Arguments<'_>) {
    let mut e = io::stderr().lock();
    let _ = e.write_fmt(line).and_then(|()| e.write_all(b"\n"));
}

/// Writes `text` to stderr without a line break (a progress bar redraws its line); like
/// [`stderr_line`], never panics.
pub fn stderr_partial(text: fmt::Arguments<'_>) {
    let mut e = io::stderr().lock();
    let _ = e.write_fmt(text).and_then(|()| e.flush());
}

/// Runs `f` with the locked, buffered stdout and flushes it; write failures come back as
/// [`OutputError::Stdout`].
pub fn with_stdout<T>(f: impl FnOnce(&mut dyn Write) -> anyhow::Result<T>) -> anyhow::Result<T> {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let value = f(&mut out)?;
    out.flush().map_err(OutputError::Stdout)?;
    Ok(value)
}
