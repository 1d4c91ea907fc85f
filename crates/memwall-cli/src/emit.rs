//! `--emit KIND [--out DIR]`: the engine config files of an estimate (core `emit` writes them;
//! this module turns its errors into user errors and puts the files where the user asked).

use crate::args::EmitArgs;
use crate::error::UserError;
use crate::model_source::ModelSource;
use anyhow::Result;
use memwall_core::emit::{self, EmitError, EmittedFile, LaunchSpec, Provenance};
use memwall_core::layout::Layout;
use memwall_core::workload::TrainWorkload;
use std::io::Write;

/// An emitter's refusal as a user error (exit 2 with its hint).
pub fn user_error(e: EmitError) -> anyhow::Error {
    match e {
        EmitError::Invalid(core) => anyhow::Error::new(core),
        other => {
            let hint = other
                .hint()
                .unwrap_or_else(|| "see `memwall train --help` for --emit".to_owned());
            UserError::new(other.to_string(), hint).into()
        }
    }
}

/// The id the emitted files load the model by: its Hub repository when known, else its label.
pub fn model_id(m: &ModelSource) -> String {
    m.hf_repo.clone().unwrap_or_else(|| m.label.clone())
}

/// The files of the training configuration `w` on `layout` for `kind`, estimated with
/// `runtime`.
pub fn train_files(
    kind: memwall_core::emit::EmitKind,
    model: &ModelSource,
    w: &TrainWorkload,
    layout: Option<&Layout>,
    runtime: memwall_core::memory::titan::Runtime,
    command: String,
    estimate: String,
) -> Result<Vec<EmittedFile>> {
    let spec = match (runtime, layout) {
        (memwall_core::memory::titan::Runtime::Torchtitan, Some(l)) => {
            LaunchSpec::from_train_titan(&model.desc, w, l)
        }
        _ => LaunchSpec::from_train(&model.desc, w, layout),
    }
    .map_err(user_error)?
    .with_model_id(model_id(model))
    .with_provenance(Provenance { command, estimate })
    .with_runtime(runtime);
    emit::emit(kind, &spec).map_err(user_error)
}

/// Writes `files` into `--out` (then lists them on stderr) or, without it, to `out` one after
/// the other under `==> name <==` lines. Returns whether the report should still be printed
/// (only when the files went to a directory).
pub fn deliver(files: &[EmittedFile], args: &EmitArgs, out: &mut dyn Write) -> Result<bool> {
    match &args.out {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|source| crate::output::OutputError::File {
                flag: "--out",
                what: "the directory of the emitted files",
                path: dir.clone(),
                source,
            })?;
            for f in files {
                let path = dir.join(&f.name);
                crate::output::write_file(
                    "--out",
                    "an emitted file",
                    &path,
                    f.contents.as_bytes(),
                )?;
                crate::output::stderr_line(format_args!("wrote {}", path.display()));
            }
            Ok(true)
        }
        None => {
            for (i, f) in files.iter().enumerate() {
                if i > 0 {
                    writeln!(out).map_err(crate::output::OutputError::Stdout)?;
                }
                writeln!(out, "==> {} <==", f.name).map_err(crate::output::OutputError::Stdout)?;
                out.write_all(f.contents.as_bytes())
                    .map_err(crate::output::OutputError::Stdout)?;
                if !f.contents.ends_with('\n') {
                    writeln!(out).map_err(crate::output::OutputError::Stdout)?;
                }
            }
            Ok(false)
        }
    }
}

/// The `memwall train` command of `w` on `layout` for `model` on `gpu` (the provenance header).
pub fn train_command(
    model: &ModelSource,
    gpu: &str,
    w: &TrainWorkload,
    layout: Option<&Layout>,
    runtime: memwall_core::memory::titan::Runtime,
) -> String {
    let mut train = memwall_core::plan::train_args(w, layout);
    if runtime != memwall_core::memory::titan::Runtime::Hf {
        train.push("--runtime".to_owned());
        train.push(runtime.to_string());
    }
    let args = crate::report::with_model_and_gpu(&model.label, gpu, train);
    format!("memwall train {}", args.join(" "))
}

/// Refuses `--emit` on a command that has nothing to launch.
pub fn refuse_on(command: &str, args: &EmitArgs) -> Result<()> {
    if args.emit.is_some() {
        return Err(UserError::new(
            format!("--emit is not for `memwall {command}`"),
            "emit from `memwall train`, `memwall plan` or `memwall serve`; the doctor prints the \
             `memwall train` command of its fix, to which --emit can be added",
        )
        .into());
    }
    Ok(())
}
