//! Speed of one estimate: `cargo bench -p memwall-cli`.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use memwall_core::memory::{simulate_train, Kernels};
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
