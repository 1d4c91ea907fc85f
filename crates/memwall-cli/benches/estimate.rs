//! Speed of one estimate: `cargo bench -p memwall-cli`.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use memwall_core::layout::{Layout, Strategy};
use memwall_core::memory::{simulate_train, simulate_train_dist, Kernels};
use memwall_core::workload::TrainWorkload;

fn bench(c: &mut Criterion) {
    for id in ["llama-3.1-70b", "llama-3.1-8b", "deepseek-v3"] {
        let Some(entry) = memwall_catalog::find(id) else {
            continue;
        };
        let Ok(desc) = entry.model() else {
            continue;
        };
        let w = TrainWorkload::new(8, 4096);
        c.bench_function(&format!("train estimate {id} b8 s4096 bf16 adamw"), |b| {
            b.iter(|| simulate_train(black_box(&desc), black_box(&w), Kernels::Cuda))
        });
        let mut ck = TrainWorkload::new(8, 4096);
        ck.checkpointing = true;
        c.bench_function(
            &format!("train estimate {id} b8 s4096 bf16 adamw checkpointing"),
            |b| b.iter(|| simulate_train(black_box(&desc), black_box(&ck), Kernels::Cuda)),
        );
    }
    // every rank of a cluster: FSDP2 over 8 GPUs (two rank runs: rank 0 and the last),
    // ZeRO-3 over 64, and a Megatron 3-D layout (formula per stage)
    if let Some(desc) = memwall_catalog::find("llama-3.1-70b").and_then(|e| e.model().ok()) {
        let w = TrainWorkload::new(1, 4096);
        for (name, l) in [
            (
                "fsdp-full 8 GPUs",
                Layout {
                    gpus: 8,
                    gpus_per_node: 8,
                    strategy: Strategy::FsdpFull,
                    ..Layout::single()
                },
            ),
            (
                "zero3 64 GPUs",
                Layout {
                    gpus: 64,
                    gpus_per_node: 8,
                    strategy: Strategy::Zero3,
                    ..Layout::single()
                },
            ),
            (
                "megatron tp8 pp4 dp2",
                Layout {
                    gpus: 64,
                    gpus_per_node: 8,
                    strategy: Strategy::Zero1,
                    tp: 8,
                    pp: 4,
                    sequence_parallel: true,
                    ..Layout::single()
                },
            ),
        ] {
            c.bench_function(&format!("cluster estimate llama-3.1-70b {name}"), |b| {
                b.iter(|| {
                    simulate_train_dist(
                        black_box(&desc),
                        black_box(&w),
                        black_box(&l),
                        Kernels::Cuda,
                    )
                })
            });
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
