//! Speed of one estimate: `cargo bench -p memwall-cli`.
//!
//! One group per estimate kind, the fast evaluator (`memory::fast`, what the CLI runs) next
//! to the reference replay where the comparison says something: single-GPU training,
//! ZeRO-3 / FSDP2 with uneven shards, Megatron 3-D, inference with 10⁵ new tokens, vLLM
//! serving, the layer-count scaling (32 vs 4,096 layers), and the planner's inner loop
//! (candidates per second on one and on two cores).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use memwall_core::layout::{Layout, Strategy};
use memwall_core::memory::{self, fast, DistOptions, Kernels};
use memwall_core::model::ModelDesc;
use memwall_core::workload::{
    AttentionImpl, InferWorkload, KvDtype, Optimizer, Precision, TrainWorkload, WeightFormat,
};

fn model(id: &str) -> ModelDesc {
    memwall_catalog::find(id)
        .and_then(|e| e.model().ok())
        .expect("catalogue model")
}

/// `base` with its decoder layers repeated to `n`.
fn with_layers(base: &ModelDesc, n: usize) -> ModelDesc {
    let mut m = base.clone();
    let l = m.layers[0];
    m.layers = vec![l; n];
    m
}

fn cluster(gpus: u64, strategy: Strategy) -> Layout {
    Layout {
        gpus,
        // one node up to 16 GPUs (15 ranks shard unevenly), else nodes of 8
        gpus_per_node: if gpus <= 16 { gpus } else { 8 },
        strategy,
        ..Layout::single()
    }
}

fn train_single(c: &mut Criterion) {
    let mut g = c.benchmark_group("train single GPU");
    let w = TrainWorkload::new(8, 4096);
    for id in [
        "llama-3.1-8b",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "deepseek-v3",
    ] {
        let m = model(id);
        g.bench_function(BenchmarkId::new("fast", id), |b| {
            b.iter(|| fast::simulate_train(black_box(&m), black_box(&w), Kernels::Cuda))
        });
        g.bench_function(BenchmarkId::new("reference", id), |b| {
            b.iter(|| memory::simulate_train(black_box(&m), black_box(&w), Kernels::Cuda))
        });
    }
    let mut ck = w.clone();
    ck.checkpointing = true;
    let m = model("llama-3.1-405b");
    g.bench_function(
        BenchmarkId::new("fast", "llama-3.1-405b checkpointing"),
        |b| b.iter(|| fast::simulate_train(black_box(&m), black_box(&ck), Kernels::Cuda)),
    );
    g.finish();
}

fn layer_scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer scaling");
    let base = model("llama-3.1-8b");
    let w = TrainWorkload::new(1, 2048);
    for n in [32, 4096] {
        let m = with_layers(&base, n);
        g.bench_function(BenchmarkId::new("fast train", n), |b| {
            b.iter(|| fast::simulate_train(black_box(&m), black_box(&w), Kernels::Cuda))
        });
        let l = cluster(15, Strategy::FsdpFull);
        g.bench_function(BenchmarkId::new("fast fsdp 15 uneven ranks", n), |b| {
            b.iter(|| fast::simulate_train_dist(black_box(&m), black_box(&w), &l, Kernels::Cuda))
        });
        // an evaluation context (the plan search's) finds the repeated layers once per model:
        // 16 distinct workloads per context, so every estimate is simulated (no memo hit)
        g.throughput(Throughput::Elements(16));
        g.bench_function(
            BenchmarkId::new("evaluation context, 16 workloads", n),
            |b| {
                b.iter(|| {
                    let mut ev = fast::Evaluator::new(black_box(&m), Kernels::Cuda);
                    (1..=16)
                        .map(|batch| {
                            ev.train(&TrainWorkload::new(batch, 2048))
                                .map_or(0, |e| e.peak_bytes)
                        })
                        .max()
                })
            },
        );
        g.throughput(Throughput::Elements(1));
    }
    g.finish();
}

fn train_dist(c: &mut Criterion) {
    let mut g = c.benchmark_group("train distributed");
    let m = model("llama-3.1-70b");
    let w = TrainWorkload::new(1, 4096);
    let megatron = |gpus: u64| Layout {
        gpus,
        gpus_per_node: 8,
        strategy: Strategy::Zero1,
        tp: 8,
        pp: 4,
        sequence_parallel: true,
        ..Layout::single()
    };
    let layouts = [
        ("fsdp-full 8 GPUs", cluster(8, Strategy::FsdpFull)),
        ("fsdp-full 15 GPUs uneven", cluster(15, Strategy::FsdpFull)),
        ("zero3 64 GPUs", cluster(64, Strategy::Zero3)),
        ("zero3 100000 GPUs", cluster(100_000, Strategy::Zero3)),
        (
            "fsdp-full 100000 GPUs",
            cluster(100_000, Strategy::FsdpFull),
        ),
        ("megatron tp8 pp4 dp2", megatron(64)),
        ("megatron tp8 pp4 dp3125", megatron(100_000)),
    ];
    for (name, l) in &layouts {
        g.bench_function(BenchmarkId::new("fast", name), |b| {
            b.iter(|| fast::simulate_train_dist(black_box(&m), black_box(&w), l, Kernels::Cuda))
        });
    }
    for (name, l) in &layouts[..3] {
        g.bench_function(BenchmarkId::new("reference", name), |b| {
            b.iter(|| memory::simulate_train_dist(black_box(&m), black_box(&w), l, Kernels::Cuda))
        });
    }
    g.finish();
}

fn infer(c: &mut Criterion) {
    let mut g = c.benchmark_group("infer");
    let w = InferWorkload {
        batch: 8,
        prompt: 2048,
        new_tokens: 100_000,
        attention: AttentionImpl::Sdpa,
        weights: WeightFormat::Bf16,
        kv_dtype: KvDtype::Auto,
        moe_decode_batched: true,
    };
    for id in ["llama-3.1-8b", "llama-3.1-70b"] {
        let m = model(id);
        g.bench_function(BenchmarkId::new("fast 1e5 new tokens", id), |b| {
            b.iter(|| fast::simulate_infer(black_box(&m), black_box(&w), Kernels::Cuda))
        });
        g.bench_function(BenchmarkId::new("reference 1e5 new tokens", id), |b| {
            b.iter(|| memory::simulate_infer(black_box(&m), black_box(&w), Kernels::Cuda))
        });
    }
    g.finish();
}

fn serve(c: &mut Criterion) {
    let mut g = c.benchmark_group("serve");
    let gpu = memwall_catalog::find_gpu("h100-sxm")
        .or_else(|| memwall_catalog::gpus().ok().and_then(|g| g.first()))
        .expect("a gpu");
    for id in ["llama-3.1-70b", "gemma-2-27b-it"] {
        let m = model(id);
        let req = memwall_core::serve::ServeRequest {
            tp: 8,
            gpu_memory_utilization: 0.92,
            kv_dtype_bytes: 2,
            dtype_bytes: 2,
            weights: memwall_core::serve::ServeWeights::Dtype,
            block_size: 16,
            max_model_len: None,
            max_num_batched_tokens: None,
            max_num_seqs: None,
            enforce_eager: false,
            kv_cache_memory_bytes: None,
            non_torch_bytes: None,
            activation_bytes: None,
            cuda_graph_bytes: None,
            enable_prefix_caching: None,
        };
        g.bench_function(BenchmarkId::new("vllm plan", id), |b| {
            b.iter(|| {
                let r = memwall_core::serve::resolve(black_box(&m), gpu, &req).unwrap();
                memwall_core::serve::plan(&m, &r.config)
            })
        });
    }
    g.finish();
}

/// The planner's inner loop: one fast estimate per candidate of micro-batch × checkpointing ×
/// precision × optimizer × sharding over a model, on one thread and split over two; each
/// without and with an evaluation context ([`fast::Evaluator`], the plan search's: an exact
/// memo of rank simulations, made afresh for every sweep so that only candidates of the same
/// sweep share a simulation).
fn planner(c: &mut Criterion) {
    let m = model("llama-3.1-70b");
    let mut candidates: Vec<(TrainWorkload, Option<Layout>)> = Vec::new();
    for batch in [1, 2, 4, 8] {
        for ckpt in [false, true] {
            for precision in [Precision::Bf16, Precision::AmpBf16] {
                for optimizer in [Optimizer::Adamw, Optimizer::Sgd] {
                    for layout in [
                        None,
                        Some(cluster(8, Strategy::FsdpFull)),
                        Some(cluster(64, Strategy::Zero3)),
                        Some(cluster(16, Strategy::Zero2)),
                    ] {
                        let mut w = TrainWorkload::new(batch, 4096);
                        w.checkpointing = ckpt;
                        w.precision = precision;
                        w.optimizer = optimizer;
                        candidates.push((w, layout));
                    }
                }
            }
        }
    }
    let eval = |(w, l): &(TrainWorkload, Option<Layout>)| -> u64 {
        match l {
            None => fast::simulate_train(&m, w, Kernels::Cuda).map_or(0, |e| e.peak_bytes),
            Some(l) => {
                fast::simulate_train_dist_with(&m, w, l, Kernels::Cuda, &DistOptions::default())
                    .map_or(0, |e| e.peak_bytes)
            }
        }
    };
    let sweep = |cands: &[(TrainWorkload, Option<Layout>)]| -> Option<u64> {
        let mut ev = fast::Evaluator::new(&m, Kernels::Cuda);
        cands
            .iter()
            .map(|(w, l)| match l {
                None => ev.train(w).map_or(0, |e| e.peak_bytes),
                Some(l) => ev
                    .train_dist(w, l, &DistOptions::default())
                    .map_or(0, |e| e.peak_bytes),
            })
            .max()
    };
    let mut g = c.benchmark_group("planner inner loop");
    g.throughput(Throughput::Elements(candidates.len() as u64));
    g.bench_function("candidates, 1 core", |b| {
        b.iter(|| candidates.iter().map(eval).max())
    });
    g.bench_function("candidates, 2 cores", |b| {
        b.iter(|| {
            let (left, right) = candidates.split_at(candidates.len() / 2);
            std::thread::scope(|s| {
                let h = s.spawn(|| left.iter().map(eval).max());
                let r = right.iter().map(eval).max();
                h.join().ok().flatten().max(r)
            })
        })
    });
    g.bench_function("candidates, 1 core, evaluation context", |b| {
        b.iter(|| sweep(&candidates))
    });
    g.bench_function("candidates, 2 cores, evaluation context", |b| {
        b.iter(|| {
            let (left, right) = candidates.split_at(candidates.len() / 2);
            std::thread::scope(|s| {
                let h = s.spawn(|| sweep(left));
                let r = sweep(right);
                h.join().ok().flatten().max(r)
            })
        })
    });
    g.finish();
}

/// The plan search end to end (`memwall plan -m llama-3.1-70b --gpus 64 --global-batch 512`
/// without its output): its candidates per second, step-time model included.
fn plan_search(c: &mut Criterion) {
    use memwall_core::plan::{default_lora, search, Allow, PlanRequest};
    let m = model("llama-3.1-70b");
    let gpu = memwall_catalog::find_gpu("h100-sxm").expect("h100");
    let r = PlanRequest {
        gpus: 64,
        gpus_per_node: 8,
        seq: 2048,
        global_batch: 512,
        host_memory_per_node: None,
        allow: Allow::default(),
        base: {
            let mut w = TrainWorkload::new(1, 2048);
            w.precision = Precision::AmpBf16;
            w
        },
        lora: default_lora(&m),
        max_step_s: None,
        top: 10,
        alloc_margin: memwall_core::plan::DEFAULT_ALLOC_MARGIN,
        kernels: Kernels::Cuda,
        runtime: memwall_core::memory::titan::Runtime::Hf,
    };
    let evaluated = search(&m, gpu, &r).expect("plan").candidates_evaluated;
    let mut g = c.benchmark_group("plan search");
    g.throughput(Throughput::Elements(evaluated));
    g.sample_size(10);
    g.bench_function("llama-3.1-70b on 64 GPUs, candidates", |b| {
        b.iter(|| search(black_box(&m), gpu, &r).map(|p| p.plans.len()))
    });
    g.finish();
}

criterion_group!(
    benches,
    train_single,
    layer_scaling,
    train_dist,
    infer,
    serve,
    planner,
    plan_search
);
criterion_main!(benches);
