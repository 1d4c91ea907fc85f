//! Writes every applicable emitter's files for the seed configurations (see `seeds.rs`) under
//! `OUT_DIR/<seed>/<kind>/`, with the estimate memwall computes for each in the headers.
//! `tools/emit_check/check.py` loads them with the engines' own parsers.
//!
//! ```sh
//! cargo run -p memwall-cli --example emit_seeds -- target/emit-seeds
//! ```

mod seeds;

use anyhow::Context;
use memwall_core::emit::{emit, emit_serve, EmitKind};
use std::path::PathBuf;

/// The estimate `command` (a seed's `memwall …` line) prints in the header of its `--emit kind`
/// files: the figures the report quotes are the command's own.
fn command_estimate(command: &str, kind: EmitKind) -> anyhow::Result<String> {
    let text = seeds::run_with_emit(command, kind)?;
    text.lines()
        .find_map(|l| {
            l.split_once("estimate: ")
                .map(|(_, e)| e.trim().to_string())
        })
        .with_context(|| {
            format!(
                "`{command} --emit {}` printed no estimate line",
                kind.name()
            )
        })
}

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "target/emit-seeds".to_string()),
    );
    let mut manifest = serde_json::Map::new();
    for seed in seeds::train_seeds() {
        let estimate = command_estimate(seed.command, seed.kinds[0])?;
        let spec = seeds::launch_spec(&seed, &estimate)?;
        let mut kinds = serde_json::Map::new();
        for kind in seed.kinds {
            let dir = out.join(seed.id).join(kind.name());
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let files = emit(*kind, &spec)?;
            for f in &files {
                std::fs::write(dir.join(&f.name), &f.contents)?;
            }
            kinds.insert(
                kind.name().into(),
                files.iter().map(|f| f.name.clone()).collect(),
            );
        }
        manifest.insert(
            seed.id.into(),
            serde_json::json!({"command": seed.command, "estimate": estimate, "gpus": spec.layout.gpus, "repo": spec.model_id, "kinds": kinds}),
        );
    }
    for seed in seeds::serve_seeds() {
        let estimate = command_estimate(seed.command, EmitKind::Vllm)?;
        let spec = seeds::serve_spec(&seed, &estimate);
        let dir = out.join(seed.id).join(EmitKind::Vllm.name());
        std::fs::create_dir_all(&dir)?;
        let files = emit_serve(EmitKind::Vllm, &spec)?;
        for f in &files {
            std::fs::write(dir.join(&f.name), &f.contents)?;
        }
        manifest.insert(
            seed.id.into(),
            serde_json::json!({"command": seed.command, "estimate": estimate, "gpus": seed.config.tp, "repo": seed.repo,
                "kinds": {"vllm": files.iter().map(|f| f.name.clone()).collect::<Vec<_>>()}}),
        );
    }
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&serde_json::Value::Object(manifest))? + "\n",
    )?;
    println!("wrote {}", out.display());
    Ok(())
}
