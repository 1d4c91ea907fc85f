//! The `memwall` command line as a library: argument resolution, the typed reports and their
//! renderers, and one entry point ([`main`]) the binary calls. [`run_args`] runs an argument
//! vector against any writer (the fuzz target and tests use it).

mod args;
mod emit;
mod error;
mod given;
mod model_source;
mod output;
mod report;
mod svg;
mod vision;
#[cfg(not(target_arch = "wasm32"))]
mod web;
mod weights;

use anyhow::Result;
use clap::Parser;
pub use given::{GivenFile, PrefixTooShort};
use report::emit;
use std::io::Write;
use std::process::ExitCode;

/// Runs `memwall` on the process's arguments: the report on stdout, errors on stderr; the exit
/// status (0 ok, 1 a failed write, 2 bad input).
pub fn main() -> ExitCode {
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(error::clap_error(&e)),
    };
    match output::with_stdout(|out| run(cli, out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // a failed write (stdout or a named file): one line, or nothing for a closed pipe
            if let Some(o) = e.downcast_ref::<output::OutputError>() {
                return o.finish();
            }
            // `error: …`, each cause, then the `hint: …` attached where the error was made;
            // never `eprintln!`: it panics when stderr is closed
            for line in error::report(&e) {
                output::stderr_line(format_args!("{line}"));
            }
            ExitCode::from(2)
        }
    }
}

fn run(cli: args::Cli, out: &mut dyn Write) -> Result<()> {
    match cli.command {
        args::Command::Train(a) => {
            let s = args::TrainSettings::resolve(a)?;
            let r = report::train::build(&s)?;
            if let Some(kind) = s.emit.emit {
                let estimate = report::train::estimate_line(&r);
                let command = emit::train_command(
                    &s.model,
                    &s.gpu.id,
                    &s.workload,
                    s.layout.as_ref(),
                    s.runtime,
                );
                let files = emit::train_files(
                    kind,
                    &s.model,
                    &s.workload,
                    s.layout.as_ref(),
                    s.runtime,
                    command,
                    estimate,
                )?;
                if !emit::deliver(&files, &s.emit, out)? {
                    return Ok(());
                }
            }
            emit(&r, s.format, out)
        }
        args::Command::Plan(a) => {
            let s = args::PlanSettings::resolve(a)?;
            let r = report::plan::build(&s)?;
            if let Some(kind) = s.emit.emit {
                let Some(p) = r.found.get(s.plan_rank - 1) else {
                    return Err(error::UserError::new(
                        format!(
                            "invalid --plan-rank {}: the search found {} fitting plan(s)",
                            s.plan_rank,
                            r.plans.len()
                        ),
                        "pick a rank from the plan table, or widen the search with --allow",
                    )
                    .into());
                };
                let w = p.workload(&s.request.base);
                let estimate = format!(
                    "plan {} of `memwall plan`: peak {} on the worst rank, {:.3} s per step, {:.0} tokens/s per GPU",
                    p.rank,
                    memwall_core::Bytes(p.peak_bytes),
                    p.step_s,
                    p.tokens_per_s_per_gpu
                );
                let command =
                    emit::train_command(&s.model, &s.gpu.id, &w, p.layout.as_ref(), s.runtime);
                let files = emit::train_files(
                    kind,
                    &s.model,
                    &w,
                    p.layout.as_ref(),
                    s.runtime,
                    command,
                    estimate,
                )?;
                if !emit::deliver(&files, &s.emit, out)? {
                    return Ok(());
                }
            }
            emit(&r, s.format, out)
        }
        args::Command::Doctor(a) => match a.infer {
            Some(args::DoctorInfer::Infer(i)) => {
                let s = args::InferSettings::resolve(i)?;
                emit(&report::infer::doctor(&s)?, s.format, out)
            }
            None => {
                let s = args::TrainSettings::resolve(a.train)?;
                emit::refuse_on("doctor", &s.emit)?;
                emit(&report::train::doctor(&s)?, s.format, out)
            }
        },
        args::Command::Models(a) => {
            let format = a.output.resolve()?;
            emit(&report::catalog::models()?, format, out)
        }
        args::Command::Inspect(a) => {
            let format = a.output.resolve()?;
            let src = model_source::load(&a.model)?;
            emit(&report::inspect::build(&src), format, out)
        }
        args::Command::Gpus(a) => {
            let format = a.output.resolve()?;
            emit(&report::catalog::gpus()?, format, out)
        }
        args::Command::Serve(a) => {
            a.validate()?;
            let s = args::ServeSettings::resolve(a)?;
            if let Some(kind) = s.emit.emit {
                let files = report::serve::emit_files(&s, kind)?;
                if !emit::deliver(&files, &s.emit, out)? {
                    return Ok(());
                }
            }
            emit(&report::serve::build(&s)?, s.format, out)
        }
        args::Command::Infer(a) => {
            let s = args::InferSettings::resolve(a)?;
            emit(&report::infer::build(&s)?, s.format, out)
        }
        args::Command::Roofline(a) => {
            let s = args::RooflineSettings::resolve(a)?;
            let r = report::roofline::build(&s)?;
            if let Some(path) = &s.svg {
                let plot = svg::roofline_svg(&r.result, s.gpu, &r.svg_title());
                output::write_file("--svg", "the roofline plot", path, plot.as_bytes())?;
            }
            emit(&r, s.format, out)
        }
        #[cfg(not(target_arch = "wasm32"))]
        args::Command::Web(a) => web::run(a, out),
        // the page itself runs this code: it has no page to serve
        #[cfg(target_arch = "wasm32")]
        args::Command::Web(_) => Err(error::UserError::new(
            "`memwall web` serves the page; the page cannot serve itself",
            "run `memwall web` from the command line",
        )
        .into()),
    }
}

/// Runs one argument vector (without the program name) and writes the report to `out`. On
/// failure returns the lines `memwall` prints on stderr (`error: …`, causes, `hint: …`).
pub fn run_args<I, T>(argv: I, out: &mut dyn Write) -> std::result::Result<(), Vec<String>>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv = std::iter::once(std::ffi::OsString::from("memwall"))
        .chain(argv.into_iter().map(Into::into));
    let cli = args::Cli::try_parse_from(argv).map_err(|e| error::clap_lines(&e))?;
    run(cli, out).map_err(|e| error::report(&e))
}

/// Why [`run_args_with_files`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesError {
    /// The lines `memwall` prints on stderr (`error: …`, causes, `hint: …`).
    pub lines: Vec<String>,
    /// When a given file's prefix was too short to read: which file, and how many of its first
    /// bytes to give next (give them and run again).
    pub more: Option<PrefixTooShort>,
}

/// [`run_args`] with the model's files given in memory ([`GivenFile`]: name, first bytes, real
/// length), the web page's dropped files: they form one directory of their own, and `--model
/// NAME` (one of them, or `.` for the directory) resolves there by the same code and bounds as
/// `memwall … --model NAME` run in a directory holding those files, so the report is the one the
/// command line prints. Nothing on disk is read for the model. A `config.json` or index is given
/// whole; of a `.safetensors` or `.gguf` file only its first bytes are needed, and when they were
/// too few, [`FilesError::more`] says how many to give.
pub fn run_args_with_files<I, T>(
    argv: I,
    files: Vec<GivenFile>,
    out: &mut dyn Write,
) -> std::result::Result<(), FilesError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv = std::iter::once(std::ffi::OsString::from("memwall"))
        .chain(argv.into_iter().map(Into::into));
    let cli = args::Cli::try_parse_from(argv).map_err(|e| FilesError {
        lines: error::clap_lines(&e),
        more: None,
    })?;
    given::with_files(files, || run(cli, out)).map_err(|e| FilesError {
        lines: error::report(&e),
        more: e
            .chain()
            .find_map(|c| c.downcast_ref::<PrefixTooShort>().cloned()),
    })
}

/// [`run_args`] with the model given as the text of a config.json (a Python `dict` or
/// `transformers.PretrainedConfig`): every model the command resolves is parsed from
/// `config_json` by the same path as a config.json file, and the `--model` value is only its
/// label. Nothing is read from or written to disk for the model.
pub fn run_args_with_config<I, T>(
    argv: I,
    config_json: &str,
    out: &mut dyn Write,
) -> std::result::Result<(), Vec<String>>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    model_source::with_config_text(config_json, || run_args(argv, out))
}
