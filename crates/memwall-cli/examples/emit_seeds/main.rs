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
use memwall_core::memory::{dist::simulate_train_dist, simulate_train, Kernels};
use std::path::PathBuf;

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "target/emit-seeds".to_string()),
    );
    let mut manifest = serde_json::Map::new();
    for seed in seeds::train_seeds() {
        let (m, _) = seeds::model(seed.model)?;
        let estimate = match &seed.layout {
            Some(l) => {
                let e = simulate_train_dist(&m, &seed.workload, l, Kernels::Cuda)?;
                format!(
                    "peak {} per GPU ({}), {} host per node, global batch {}",
                    gib(e.peak_bytes),
                    e.groups[e.worst].label,
                    gib(e.host_bytes_per_node),
                    e.global_batch
                )
            }
            None => {
                let e = simulate_train(&m, &seed.workload, Kernels::Cuda)?;
                format!("peak {} on one GPU", gib(e.peak_bytes))
            }
        };
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
        let (m, _) = seeds::model("llama-3.1-70b")?;
        let plan = memwall_core::serve::plan(&m, &seed.config)?;
        let estimate = format!(
            "{} KV-cache tokens per rank budget, {} blocks",
            plan.kv_tokens, plan.num_gpu_blocks
        );
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
