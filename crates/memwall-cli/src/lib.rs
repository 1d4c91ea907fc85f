//! The `memwall` command line as a library: argument resolution, the typed reports and their
//! renderers, and one entry point ([`main`]) the binary calls. [`run_args`] runs an argument
//! vector against any writer (the fuzz target and tests use it).

mod args;
mod error;
mod model_source;
mod output;
mod report;
mod svg;
mod weights;

use anyhow::Result;
use clap::Parser;
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
            emit(&report::train::build(&s)?, s.format, out)
        }
        args::Command::Plan(a) => {
            let s = args::PlanSettings::resolve(a)?;
            emit(&report::plan::build(&s)?, s.format, out)
        }
        args::Command::Doctor(a) => match a.infer {
            Some(args::DoctorInfer::Infer(i)) => {
                let s = args::InferSettings::resolve(i)?;
                emit(&report::infer::doctor(&s)?, s.format, out)
            }
            None => {
                let s = args::TrainSettings::resolve(a.train)?;
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
    let cli = args::Cli::try_parse_from(argv).map_err(|e| vec![e.to_string()])?;
    run(cli, out).map_err(|e| error::report(&e))
}
