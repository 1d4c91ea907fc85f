//! Runs one fast estimate a fixed number of times, for profilers that count instructions
//! (`valgrind --tool=callgrind`, `perf stat -e instructions`), whose figures do not move with
//! the machine's load: `cargo run --release -p memwall-cli --example estimate_loop -- KIND N`
//! with KIND one of `train-405b`, `zero3-1e5`, `fsdp-15`, `infer-1e5`, `train-32`, `train-4096`
//! (the last two: Llama-3.1-8B's layer repeated 32 and 4,096 times, batch 1 × 2048), and
//! `ctx-32`, `ctx-4096`: the same models in one evaluation context (`fast::Evaluator`, the plan
//! search's) per 16 distinct workloads (micro-batch 1–16), N contexts.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use memwall_core::layout::{Layout, Strategy};
use memwall_core::memory::{fast, Kernels};
use memwall_core::workload::{AttentionImpl, InferWorkload, KvDtype, TrainWorkload, WeightFormat};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kind = args.get(1).map_or("train-405b", String::as_str);
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let model = |id: &str| {
        memwall_catalog::find(id)
            .and_then(|e| e.model().ok())
            .expect("model")
    };
    let cluster = |gpus: u64, strategy| Layout {
        gpus,
        gpus_per_node: if gpus <= 16 { gpus } else { 8 },
        strategy,
        ..Layout::single()
    };
    let mut acc = 0u64;
    match kind {
        "train-405b" | "train-32" | "train-4096" => {
            let mut m = model("llama-3.1-405b");
            let mut w = TrainWorkload::new(8, 4096);
            if kind != "train-405b" {
                m = model("llama-3.1-8b");
                let l = m.layers[0];
                m.layers = vec![l; if kind == "train-32" { 32 } else { 4096 }];
                w = TrainWorkload::new(1, 2048);
            }
            for _ in 0..n {
                acc ^= fast::simulate_train(&m, &w, Kernels::Cuda)
                    .unwrap()
                    .peak_bytes;
            }
        }
        "zero3-1e5" | "fsdp-15" => {
            let m = model("llama-3.1-70b");
            let w = TrainWorkload::new(1, 4096);
            let l = if kind == "fsdp-15" {
                cluster(15, Strategy::FsdpFull)
            } else {
                cluster(100_000, Strategy::Zero3)
            };
            for _ in 0..n {
                acc ^= fast::simulate_train_dist(&m, &w, &l, Kernels::Cuda)
                    .unwrap()
                    .peak_bytes;
            }
        }
        "infer-1e5" => {
            let m = model("llama-3.1-70b");
            let w = InferWorkload {
                batch: 8,
                prompt: 2048,
                new_tokens: 100_000,
                attention: AttentionImpl::Sdpa,
                weights: WeightFormat::Bf16,
                kv_dtype: KvDtype::Auto,
                moe_decode_batched: true,
            };
            for _ in 0..n {
                acc ^= fast::simulate_infer(&m, &w, Kernels::Cuda)
                    .unwrap()
                    .peak_bytes;
            }
        }
        "ctx-32" | "ctx-4096" => {
            let mut m = model("llama-3.1-8b");
            let l = m.layers[0];
            m.layers = vec![l; if kind == "ctx-32" { 32 } else { 4096 }];
            for _ in 0..n {
                let mut ev = fast::Evaluator::new(&m, Kernels::Cuda);
                for batch in 1..=16 {
                    acc ^= ev
                        .train(&TrainWorkload::new(batch, 2048))
                        .unwrap()
                        .peak_bytes;
                }
            }
        }
        other => panic!("unknown kind {other}"),
    }
    println!("{kind} × {n}: {acc}");
}
