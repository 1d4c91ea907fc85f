//! `memwall`: will this LLM training run fit, and what is alive at the peak.

mod args;
mod model_source;
mod render;
mod svg;

use anyhow::Result;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            if let Some(h) = model_source::hint_for(&e) {
                eprintln!("hint: {h}");
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
        args::Command::Serve(a) => render::serve(a),
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
