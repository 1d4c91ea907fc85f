//! `memwall`: will this LLM training run fit, and what is alive at the peak.

mod args;
mod error;
mod model_source;
mod render;
mod svg;

use anyhow::Result;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(error::clap_error(&e)),
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `error: …`, each cause, then the `hint: …` attached where the error was made
            for line in error::report(&e) {
                eprintln!("{line}");
            }
            ExitCode::from(2)
        }
    }
}

fn run(cli: args::Cli) -> Result<()> {
    match cli.command {
        args::Command::Train(a) => {
            let settings = args::TrainSettings::resolve(a)?;
            let report = render::train_report(&settings)?;
            render::print_train(&report, settings.json)
        }
        args::Command::Models(a) => render::print_models(a.json),
        args::Command::Inspect(a) => {
            let src = model_source::load(&a.model)?;
            render::print_inspect(&src, a.json)
        }
        args::Command::Gpus(a) => render::print_gpus(a.json),
        args::Command::Serve(a) => {
            a.validate()?;
            render::serve(a)
        }
        args::Command::Infer(a) => {
            let settings = args::InferSettings::resolve(a)?;
            render::infer(&settings)
        }
        args::Command::Roofline(a) => {
            let settings = args::RooflineSettings::resolve(a)?;
            render::roofline(&settings)
        }
    }
}
