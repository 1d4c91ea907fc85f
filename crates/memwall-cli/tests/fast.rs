//! The fast evaluator (`memwall_core::memory::fast`) against the reference replay: random
//! valid configurations over every family of the catalogue and the truth fixtures (their
//! layer patterns cut, repeated and shrunk), every training option, distributed layouts with
//! uneven shards, and inference with up to 10⁵ new tokens. The fast path must give exactly
//! the replay's result (or its error).
//!
//! `PROPTEST_CASES` sets the cases per property (by default 2,000 configurations in all, about
//! 15 s in a debug build); `cargo test --release -p memwall-cli --test fast -- --ignored` runs
//! 10⁵ configurations and prints how many took each path (219 s on the shared 2-core machine:
//! 57,998 extrapolated, 20,797 replayed whole, 59 Megatron formulas, 21,146 refused alike — most
//! of them engine options the layout's engine refuses by name, e.g. activation offloading under
//! sharding —, no fallback, no difference).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_core::layout::{Layout, Offload, Schedule, Strategy as Sharding};
use memwall_core::memory::{self, fast, DistOptions, Kernels};
use memwall_core::model::{AttentionKind, LayerSpec, Mlp, ModelDesc};
use memwall_core::workload::{
    AttentionImpl, CheckpointPolicy, InferWorkload, KvDtype, Lora, Optimizer, Precision, TrainLoop,
    TrainWorkload, WeightFormat,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// Every model of the catalogue and of the truth fixtures.
fn bases() -> &'static [(String, ModelDesc)] {
    static BASES: OnceLock<Vec<(String, ModelDesc)>> = OnceLock::new();
    BASES.get_or_init(|| {
        let mut out: Vec<(String, ModelDesc)> = memwall_catalog::models()
            .iter()
            .filter_map(|e| Some((e.id.to_string(), e.model().ok()?)))
            .collect();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/truth/configs");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("fixture configs")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        for p in files {
            let json = std::fs::read_to_string(&p).expect("read config");
            if let Ok(m) = memwall_formats::parse_hf_config(&json) {
                out.push((format!("fixture {}", p.display()), m));
            }
        }
        out
    })
}

/// A model made from `base`: its layers re-sequenced to `n` (cycled, extended by its last
/// layer, or as alternating runs of its distinct layers), optionally shrunk to small odd
/// widths so the allocator's 512-byte rounding bites.
#[derive(Debug, Clone)]
struct Shape {
    base: usize,
    layers: usize,
    how: u8,
    run: usize,
    shrink: Option<(u64, u64, u64)>,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        0..bases().len(),
        prop_oneof![1usize..12, 1usize..80, 60usize..200],
        0u8..3,
        1usize..9,
        prop::option::of((1u64..5, 100u64..3000, 1u64..9)),
    )
        .prop_map(|(base, layers, how, run, shrink)| Shape {
            base,
            layers,
            how,
            run,
            shrink,
        })
}

fn build(s: &Shape) -> (String, ModelDesc) {
    let (name, base) = &bases()[s.base];
    let mut m = base.clone();
    let src = &base.layers;
    let mut distinct: Vec<LayerSpec> = Vec::new();
    for l in src {
        if !distinct.contains(l) {
            distinct.push(*l);
        }
    }
    m.layers = (0..s.layers)
        .map(|i| match s.how {
            0 => src[i % src.len()],
            1 => src[i.min(src.len() - 1)],
            _ => distinct[(i / s.run) % distinct.len()],
        })
        .collect();
    if let Some((k, vocab, seed)) = s.shrink {
        shrink(&mut m, 64 * k + 32 * (seed % 2), vocab, seed);
    }
    // vision-language models with a simulated vision forward: image tokens on every other
    // shape (`--image-tokens`; 1 to 40, odd grids and partial Qwen2.5-VL windows included)
    if let Some(v) = m.vision.as_mut() {
        if let Some(f) = v.forward.as_ref().filter(|_| s.run % 2 == 1) {
            let n = 1 + (s.layers as u64 * 7 + s.run as u64) % 40;
            // Gemma 3: whole images of `per_image` tokens (1 or 2 per sequence)
            v.image_tokens = Some(match f.per_image {
                0 => n,
                per => per * (1 + n % 2),
            });
        }
    }
    (format!("{name} {s:?}"), m)
}

/// Small widths, applied to each distinct layer the same way (the pattern is kept).
fn shrink(m: &mut ModelDesc, hidden: u64, vocab: u64, seed: u64) {
    let old_hidden = m.hidden_size;
    m.hidden_size = hidden;
    if m.embeddings.dim == old_hidden || !m.embeddings.projections {
        m.embeddings.dim = hidden;
    } else {
        m.embeddings.dim = hidden / 2;
    }
    m.embeddings.vocab_size = vocab;
    if let Some(n) = m.embeddings.norm.as_mut() {
        n.dim = hidden;
    }
    if let Some(n) = m.head.final_norm.as_mut() {
        n.dim = hidden;
    }
    if let Some(p) = m.embeddings.learned_positions.as_mut() {
        *p = (*p).min(4096 + seed);
    }
    for l in &mut m.layers {
        for n in [
            &mut l.attn_norm,
            &mut l.attn_post_norm,
            &mut l.mlp_norm,
            &mut l.mlp_post_norm,
        ]
        .into_iter()
        .flatten()
        {
            n.dim = hidden;
        }
        match &mut l.attention.kind {
            AttentionKind::Standard {
                num_heads,
                num_kv_heads,
                head_dim,
            } => {
                let ratio = (*num_heads / (*num_kv_heads).max(1)).clamp(1, 4);
                *num_heads = 4;
                *num_kv_heads = 4 / ratio;
                let old = *head_dim;
                *head_dim = hidden / 4 + 8 * (seed % 3);
                if let Some(r) = l.attention.rotary_dim.as_mut() {
                    // keep a partial rotary partial, rounded to an even width
                    *r = if *r >= old {
                        *head_dim
                    } else {
                        (*head_dim / 2) & !1
                    };
                }
            }
            AttentionKind::Mla {
                num_heads,
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
            } => {
                *num_heads = 4;
                *q_lora_rank = q_lora_rank.map(|_| 48);
                *kv_lora_rank = 32;
                *qk_nope_head_dim = 16;
                *qk_rope_head_dim = 8;
                *v_head_dim = 16;
            }
        }
        if let Some(w) = l.attention.sliding_window.as_mut() {
            *w = (*w).min(48 + seed);
        }
        match &mut l.mlp {
            Mlp::None => {}
            Mlp::Dense(d) => d.intermediate = 3 * hidden + 16 * seed,
            Mlp::Moe(moe) => {
                moe.num_experts = 4 + seed % 5;
                moe.top_k = moe.top_k.min(2);
                moe.expert.intermediate = hidden / 2 + 8 * seed;
                if let Some(s) = moe.shared.as_mut() {
                    s.intermediate = hidden;
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Train {
    batch: u64,
    seq: u64,
    precision: usize,
    optimizer: usize,
    checkpointing: bool,
    attention: usize,
    lora: Option<(u64, u8, bool)>,
    grad_accum: u64,
    dropout: bool,
    cpu: bool,
    /// `--loop keep-outputs`
    keep_outputs: bool,
    /// `--checkpointing-policy every-k:K` when 1..=4, `selective-attn` when 5, `selective-op`
    /// when 6 (0: full)
    every: u64,
}

fn train() -> impl Strategy<Value = Train> {
    (
        (1u64..6, prop_oneof![1u64..64, 1u64..2049]),
        (0..Precision::ALL.len(), 0..Optimizer::ALL.len()),
        (any::<bool>(), 0usize..3),
        prop::option::of((1u64..33, any::<u8>(), any::<bool>())),
        (1u64..5, any::<bool>(), any::<bool>(), any::<bool>()),
        0u64..7,
    )
        .prop_map(
            |(
                (batch, seq),
                (precision, optimizer),
                (checkpointing, attention),
                lora,
                (grad_accum, dropout, cpu, keep_outputs),
                every,
            )| Train {
                batch,
                seq,
                precision,
                optimizer,
                checkpointing,
                attention,
                lora,
                grad_accum,
                dropout,
                cpu,
                keep_outputs,
                every,
            },
        )
}

fn attention(i: usize) -> AttentionImpl {
    [
        AttentionImpl::Sdpa,
        AttentionImpl::Eager,
        AttentionImpl::Flash,
    ][i % 3]
}

fn workload(t: &Train, m: &ModelDesc) -> TrainWorkload {
    let mut w = TrainWorkload::new(t.batch, t.seq);
    w.precision = Precision::ALL[t.precision].0;
    w.optimizer = Optimizer::ALL[t.optimizer].0;
    w.checkpointing = t.checkpointing;
    w.attention = attention(t.attention);
    w.grad_accum = t.grad_accum;
    w.dropout = t.dropout;
    if t.keep_outputs {
        w.step_options.outputs = TrainLoop::KeepOutputs;
    }
    if t.every == 0 && !t.checkpointing {
        // the cache-less step (`model.config.use_cache = False`) on some of the others
        w.step_options.use_cache = Some(t.batch.is_multiple_of(2));
    }
    if !t.checkpointing && t.every >= 4 {
        // activation offloading (`save_on_cpu`) on some of the checkpoint-free steps
        w.step_options.activation_offload = true;
    }
    if t.checkpointing && t.every > 0 {
        w.step_options.checkpointing_policy = match t.every {
            5 => CheckpointPolicy::SelectiveAttn,
            6 => CheckpointPolicy::SelectiveOp,
            k => CheckpointPolicy::EveryK(k),
        };
    }
    if let Some((rank, pick, qlora)) = t.lora {
        let names: Vec<String> = m.linear_names.iter().map(|(_, n)| n.clone()).collect();
        if !names.is_empty() {
            let k = 1 + usize::from(pick) % names.len();
            let targets = names.into_iter().take(k).collect();
            w.lora = Some(Lora {
                rank,
                targets,
                qlora,
            });
        }
    }
    w
}

fn kernels(cpu: bool) -> Kernels {
    if cpu {
        Kernels::Cpu
    } else {
        Kernels::Cuda
    }
}

#[derive(Debug, Clone)]
struct Dist {
    gpus: u64,
    per_node: u64,
    strategy: usize,
    offload: usize,
    megatron: Option<(u64, u64, bool, usize, u64)>,
    root_reshard: bool,
    bucket_view: bool,
}

fn dist() -> impl Strategy<Value = Dist> {
    (
        prop_oneof![1u64..17, 1u64..40, Just(100_000u64)],
        prop_oneof![1 => Just(8u64), 3 => Just(0u64)],
        (0..Sharding::ALL.len(), 0..Offload::ALL.len()),
        prop::option::weighted(0.15, (1u64..5, 1u64..5, any::<bool>(), 0usize..3, 1u64..3)),
        (any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |(gpus, per_node, (strategy, offload), megatron, (root_reshard, bucket_view))| Dist {
                gpus,
                per_node,
                strategy,
                offload,
                megatron,
                root_reshard,
                bucket_view,
            },
        )
}

fn layout(d: &Dist) -> Layout {
    let per_node = if d.per_node == 0 { d.gpus } else { d.per_node };
    let mut l = Layout {
        gpus: d.gpus,
        gpus_per_node: per_node,
        strategy: Sharding::ALL[d.strategy].0,
        offload: Offload::ALL[d.offload].0,
        ..Layout::single()
    };
    if let Some((tp, pp, sp, schedule, v)) = d.megatron {
        l.tp = tp;
        l.pp = pp;
        l.sequence_parallel = sp;
        l.schedule = Schedule::ALL[schedule].0;
        l.virtual_stages = if l.schedule == Schedule::Interleaved {
            v
        } else {
            1
        };
        l.gpus = d.gpus * tp * pp;
    }
    l
}

#[derive(Debug, Clone)]
struct Infer {
    batch: u64,
    prompt: u64,
    new_tokens: u64,
    attention: usize,
    weights: usize,
    kv: usize,
    batched: bool,
    cpu: bool,
}

const WEIGHTS: [&str; 14] = [
    "bf16",
    "fp16",
    "fp32",
    "fp8",
    "int8",
    "nf4",
    "fp4-dq",
    "gptq-int4-g128",
    "awq-int4-g128",
    "gguf-q4_k_m",
    "gguf-q5_k_m",
    "gguf-q8_0",
    "gguf-q4_0",
    "gguf-f16",
];

fn infer() -> impl Strategy<Value = Infer> {
    (
        (1u64..6, prop_oneof![1u64..64, 1u64..3000]),
        prop_oneof![1u64..5, 1u64..300, Just(100_000u64)],
        (0usize..3, 0..WEIGHTS.len(), 0..KvDtype::ALL.len()),
        (any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |((batch, prompt), new_tokens, (attention, weights, kv), (batched, cpu))| Infer {
                batch,
                prompt,
                new_tokens,
                attention,
                weights,
                kv,
                batched,
                cpu,
            },
        )
}

fn infer_workload(i: &Infer) -> InferWorkload {
    InferWorkload {
        batch: i.batch,
        prompt: i.prompt,
        new_tokens: i.new_tokens,
        attention: attention(i.attention),
        weights: WeightFormat::parse(WEIGHTS[i.weights]).unwrap(),
        kv_dtype: KvDtype::ALL[i.kv].0,
        moe_decode_batched: i.batched,
    }
}

/// How many configurations took each path.
fn tally() -> &'static Mutex<BTreeMap<String, u64>> {
    static T: OnceLock<Mutex<BTreeMap<String, u64>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(BTreeMap::new()))
}

fn count(kind: &str, path: Option<fast::Path>) {
    let key = match path {
        Some(p) => format!("{kind} {p:?}"),
        None => format!("{kind} refused"),
    };
    *tally().lock().unwrap().entry(key).or_insert(0) += 1;
}

/// `w` with more micro-batches accumulated when it accumulates (the step replays two either
/// way), else `w` itself.
fn accumulated_more(w: &TrainWorkload) -> TrainWorkload {
    let mut w2 = w.clone();
    if w.grad_accum >= 2 {
        w2.grad_accum = w.grad_accum + 3;
    }
    w2
}

fn check_train(s: &Shape, t: &Train) -> Result<(), TestCaseError> {
    let (name, m) = build(s);
    let w = workload(t, &m);
    let k = kernels(t.cpu);
    let reference = memory::simulate_train(&m, &w, k);
    let fast = fast::simulate_train_traced(&m, &w, k);
    match (reference, fast) {
        (Ok(r), Ok((f, path))) => {
            count("train", Some(path));
            prop_assert_eq!(&r, &f, "{} {:?} {:?}", name, t, path);
            // the evaluation context's memo: a second workload that differs only in how
            // many micro-batches are accumulated beyond the second (a hit) is the replay's
            let mut ev = fast::Evaluator::new(&m, k);
            prop_assert_eq!(ev.train(&w).ok(), Some(f));
            let w2 = accumulated_more(&w);
            let r2 = memory::simulate_train(&m, &w2, k);
            prop_assert_eq!(ev.train(&w2), r2, "{} memo {:?}", name, t);
            prop_assert_eq!(ev.hits_and_misses(), (1, 1));
        }
        (Err(a), Err(b)) => {
            count("train", None);
            prop_assert_eq!(a, b);
        }
        (a, b) => prop_assert!(false, "{name} {t:?}: {a:?} vs {b:?}"),
    }
    Ok(())
}

fn check_dist(s: &Shape, t: &Train, d: &Dist) -> Result<(), TestCaseError> {
    let (name, m) = build(s);
    let mut w = workload(t, &m);
    let mut l = layout(d);
    // mostly what the engine runs (a refused combination is checked too, less often)
    if d.gpus % 4 != 3 {
        let engine = memwall_core::Engine::resolve(Some(&l));
        let c = engine.capabilities();
        if engine == memwall_core::Engine::Megatron {
            l.strategy = c.strategies.allowed[d.strategy % c.strategies.allowed.len()];
        }
        if l.gpus > l.gpus_per_node && !l.gpus.is_multiple_of(l.gpus_per_node) {
            l.gpus_per_node = l.gpus;
        }
        if l.strategy == Sharding::Hsdp {
            // nodes of the largest divisor up to 16 (uneven shards within a node)
            if let Some(n) = (2..l.gpus.min(17))
                .rev()
                .find(|n| l.gpus.is_multiple_of(*n))
            {
                l.gpus_per_node = n;
            }
        }
        if !c.optimizers.allowed.contains(&w.optimizer) {
            w.optimizer = c.optimizers.allowed[t.optimizer % c.optimizers.allowed.len()];
        }
        if !c.precisions.allowed.contains(&w.precision) {
            w.precision = c.precisions.allowed[t.precision % c.precisions.allowed.len()];
        }
        if !c.offload.allowed.contains(&l.offload) {
            l.offload = c.offload.allowed[d.offload % c.offload.allowed.len()];
        }
        if w.lora.is_some() && !c.lora.allowed.contains(&true) {
            w.lora = None;
        }
        if let Some(lora) = w.lora.as_mut() {
            lora.qlora &= c.qlora.allowed.contains(&true);
        }
    }
    let k = kernels(t.cpu);
    let opts = DistOptions {
        fsdp_root_reshard: Some(d.root_reshard),
        ddp_bucket_view: d.bucket_view,
        // composable `replicate` on a share of the bucket-view draws
        replicate: d.bucket_view && d.root_reshard,
    };
    let reference = memory::simulate_train_dist_with(&m, &w, &l, k, &opts);
    let fast = fast::simulate_train_dist_traced(&m, &w, &l, k, &opts);
    match (reference, fast) {
        (Ok(r), Ok((f, path))) => {
            count("dist", Some(path));
            prop_assert_eq!(&r, &f, "{} {:?} {:?} {:?}", name, t, l, path);
            if path != fast::Path::Formula {
                let mut ev = fast::Evaluator::new(&m, k);
                prop_assert_eq!(ev.train_dist(&w, &l, &opts).ok(), Some(f));
                let w2 = accumulated_more(&w);
                let r2 = memory::simulate_train_dist_with(&m, &w2, &l, k, &opts);
                prop_assert_eq!(ev.train_dist(&w2, &l, &opts), r2, "{} memo {:?}", name, t);
                let (hits, misses) = ev.hits_and_misses();
                prop_assert!(hits >= 1 && hits == misses, "{hits} hits, {misses} misses");
            }
        }
        (Err(a), Err(b)) => {
            count("dist", None);
            if std::env::var("FAST_DEBUG_REFUSALS").is_ok() {
                eprintln!("refused: {a}");
            }
            prop_assert_eq!(a, b);
        }
        (a, b) => prop_assert!(false, "{name} {t:?} {l:?}: {a:?} vs {b:?}"),
    }
    Ok(())
}

fn check_infer(s: &Shape, i: &Infer) -> Result<(), TestCaseError> {
    let (name, m) = build(s);
    let w = infer_workload(i);
    let k = kernels(i.cpu);
    let reference = memory::simulate_infer(&m, &w, k);
    let fast = fast::simulate_infer_traced(&m, &w, k);
    match (reference, fast) {
        (Ok(r), Ok((f, path))) => {
            count("infer", Some(path));
            prop_assert_eq!(r, f, "{} {:?} {:?}", name, i, path);
        }
        (Err(a), Err(b)) => {
            count("infer", None);
            prop_assert_eq!(a, b);
        }
        (a, b) => prop_assert!(false, "{name} {i:?}: {a:?} vs {b:?}"),
    }
    Ok(())
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

fn run_train(n: u32) {
    runner(n)
        .run(&(shape(), train()), |(s, t)| check_train(&s, &t))
        .unwrap();
}

fn run_dist(n: u32) {
    runner(n)
        .run(&(shape(), train(), dist()), |(s, t, d)| {
            check_dist(&s, &t, &d)
        })
        .unwrap();
}

fn run_infer(n: u32) {
    runner(n)
        .run(&(shape(), infer()), |(s, i)| check_infer(&s, &i))
        .unwrap();
}

#[test]
fn fast_train_equals_the_replay() {
    run_train(cases(800));
}

#[test]
fn fast_dist_equals_the_replay() {
    run_dist(cases(500));
}

#[test]
fn fast_infer_equals_the_replay() {
    run_infer(cases(700));
}

/// 10⁵ configurations (40% training, 30% distributed, 30% inference): run in release.
#[test]
#[ignore = "10^5 configurations: cargo test --release -p memwall-cli --test fast -- --ignored"]
fn fast_equals_the_replay_on_100k_configurations() {
    let total = cases(100_000);
    let start = std::time::Instant::now();
    run_train(total * 4 / 10);
    run_dist(total * 3 / 10);
    run_infer(total - total * 4 / 10 - total * 3 / 10);
    eprintln!(
        "{total} configurations in {:.1} s: {:#?}",
        start.elapsed().as_secs_f64(),
        tally().lock().unwrap()
    );
}

/// Every catalogue model's defaults take the fast path and agree.
#[test]
fn catalogue_models_take_the_fast_path() {
    for (name, m) in bases() {
        let w = TrainWorkload::new(1, 512);
        let r = memory::simulate_train(m, &w, Kernels::Cuda);
        let f = fast::simulate_train_traced(m, &w, Kernels::Cuda);
        match (r, f) {
            (Ok(r), Ok((f, path))) => {
                assert_eq!(r, f, "{name}");
                assert!(
                    !matches!(path, fast::Path::Fallback(_)),
                    "{name} fell back: {path:?}"
                );
            }
            (Err(a), Err(b)) => assert_eq!(a, b),
            (a, b) => panic!("{name}: {a:?} vs {b:?}"),
        }
    }
}

/// Thousands of layers (the extrapolation far beyond the replayed counts), alike, alternating
/// and after a few different ones, on one GPU, over uneven FSDP2 ranks and at inference.
#[test]
fn long_models_agree() {
    let model = |id: &str| {
        bases()
            .iter()
            .find(|(n, _)| n == id)
            .map(|(_, m)| m.clone())
            .expect("catalogue model")
    };
    let stretch = |m: &ModelDesc, n: usize| {
        let mut m = m.clone();
        let src = m.layers.clone();
        m.layers = (0..n).map(|i| src[i % src.len()]).collect();
        m
    };
    let mut dense_then_moe = model("deepseek-v3");
    let last = *dense_then_moe.layers.last().unwrap();
    dense_then_moe.layers.resize(503, last);
    let cases = [
        stretch(&model("llama-3.1-8b"), 2048),
        stretch(&model("gemma-2-2b"), 600),
        dense_then_moe,
    ];
    for m in &cases {
        let mut w = TrainWorkload::new(2, 1024);
        w.checkpointing = true;
        let r = memory::simulate_train(m, &w, Kernels::Cuda).unwrap();
        let (f, path) = fast::simulate_train_traced(m, &w, Kernels::Cuda).unwrap();
        assert_eq!(r, f, "{} layers", m.layers.len());
        assert_eq!(path, fast::Path::Extrapolated);
        let l = Layout {
            gpus: 15,
            gpus_per_node: 15,
            strategy: Sharding::FsdpFull,
            ..Layout::single()
        };
        let w = TrainWorkload::new(1, 512);
        let r = memory::simulate_train_dist(m, &w, &l, Kernels::Cuda).unwrap();
        let f = fast::simulate_train_dist(m, &w, &l, Kernels::Cuda).unwrap();
        assert_eq!(r, f, "fsdp {} layers", m.layers.len());
        let i = InferWorkload {
            batch: 4,
            prompt: 1000,
            new_tokens: 100_000,
            attention: AttentionImpl::Sdpa,
            weights: WeightFormat::parse("gguf-q4_k_m").unwrap(),
            kv_dtype: KvDtype::Auto,
            moe_decode_batched: true,
        };
        let r = memory::simulate_infer(m, &i, Kernels::Cuda).unwrap();
        let f = fast::simulate_infer(m, &i, Kernels::Cuda).unwrap();
        assert_eq!(r, f, "infer {} layers", m.layers.len());
    }
}

/// The loop, the checkpointing policies and the cache switch keep the fast path (no fallback
/// to the full replay), so the planner's cost does not grow with the layers for them either.
#[test]
fn step_options_take_the_fast_path() {
    let mut options: Vec<(&str, TrainWorkload)> = Vec::new();
    let mut w = TrainWorkload::new(1, 512);
    w.step_options.outputs = TrainLoop::KeepOutputs;
    options.push(("keep-outputs", w.clone()));
    w.step_options.outputs = TrainLoop::Trainer;
    w.step_options.use_cache = Some(false);
    options.push(("use_cache off", w.clone()));
    w.step_options.use_cache = None;
    w.step_options.activation_offload = true;
    options.push(("activation offload", w.clone()));
    w.step_options.activation_offload = false;
    w.checkpointing = true;
    for (name, policy) in [
        ("every-k:2", CheckpointPolicy::EveryK(2)),
        ("every-k:3", CheckpointPolicy::EveryK(3)),
        ("selective-attn", CheckpointPolicy::SelectiveAttn),
        ("selective-op", CheckpointPolicy::SelectiveOp),
    ] {
        w.step_options.checkpointing_policy = policy;
        options.push((name, w.clone()));
    }
    for (name, m) in bases() {
        if m.layers.len() < 24 {
            continue;
        }
        for (what, w) in &options {
            let r = memory::simulate_train(m, w, Kernels::Cuda);
            let f = fast::simulate_train_traced(m, w, Kernels::Cuda);
            match (r, f) {
                (Ok(r), Ok((f, path))) => {
                    assert_eq!(r, f, "{name} {what}");
                    assert!(
                        !matches!(path, fast::Path::Fallback(_)),
                        "{name} {what} fell back: {path:?}"
                    );
                }
                (Err(a), Err(b)) => assert_eq!(a, b),
                (a, b) => panic!("{name} {what}: {a:?} vs {b:?}"),
            }
        }
    }
}

/// Qwen3-Next (gated DeltaNet + gated attention + MoE) is among the drawn bases, takes the fast
/// path in training (with checkpointing and LoRA too) and agrees with the replay at inference,
/// where its linear-attention layers keep a fixed-size state.
#[test]
fn gated_deltanet_takes_the_fast_path() {
    let (name, m) = bases()
        .iter()
        .find(|(n, m)| n == "qwen3-next-80b-a3b-instruct" && !m.layers.is_empty())
        .expect("Qwen3-Next in the catalogue");
    assert!(m.layers.iter().any(|l| l.gated_delta_net().is_some()));
    let mut plain = TrainWorkload::new(2, 300);
    plain.precision = Precision::Bf16;
    let mut ckpt = plain.clone();
    ckpt.checkpointing = true;
    for w in [plain, ckpt] {
        let r = memory::simulate_train(m, &w, Kernels::Cpu).unwrap();
        let (f, path) = fast::simulate_train_traced(m, &w, Kernels::Cpu).unwrap();
        assert_eq!(r, f, "{name}");
        assert!(!matches!(path, fast::Path::Fallback(_)), "{path:?}");
    }
    let i = InferWorkload {
        batch: 2,
        prompt: 300,
        new_tokens: 50,
        attention: AttentionImpl::Sdpa,
        weights: WeightFormat::parse("bf16").unwrap(),
        kv_dtype: KvDtype::Auto,
        moe_decode_batched: true,
    };
    let r = memory::simulate_infer(m, &i, Kernels::Cpu).unwrap();
    let f = fast::simulate_infer(m, &i, Kernels::Cpu).unwrap();
    assert_eq!(r, f, "infer {name}");
}

/// Every model with a simulated vision forward, with image tokens (odd grids, partial
/// Qwen2.5-VL windows), long enough to be extrapolated: the fast path equals the replay.
#[test]
fn fast_equals_the_replay_with_image_tokens() {
    let mut seen = 0;
    for (i, (_, base)) in bases().iter().enumerate() {
        if base.vision.as_ref().is_none_or(|v| v.forward.is_none()) {
            continue;
        }
        for (n, attention, cpu) in [(7u64, 0usize, true), (100, 1, true), (64, 0, false)] {
            let s = Shape {
                base: i,
                layers: 9,
                how: 0,
                run: 1,
                shrink: None,
            };
            let (name, mut m) = build(&s);
            let v = m.vision.as_mut().unwrap();
            // Gemma 3: whole images of `per_image` tokens (1 or 2 per sequence)
            let n = match v.forward.as_ref().map_or(0, |f| f.per_image) {
                0 => n,
                per => per * (1 + n % 2),
            };
            v.image_tokens = Some(n);
            // image tokens under checkpointing are simulated for the Qwen, SigLIP, Pixtral and
            // Llama 4 towers (memory::check_image_checkpointing), by both evaluators
            let simulated = v.forward.as_ref().is_some_and(|f| {
                matches!(
                    f.kind,
                    memwall_core::model::VisionKind::Qwen2Vl
                        | memwall_core::model::VisionKind::Qwen25Vl
                        | memwall_core::model::VisionKind::Gemma3Siglip
                        | memwall_core::model::VisionKind::Pixtral
                        | memwall_core::model::VisionKind::Llama4
                )
            });
            for lora in [None, Some((16, 3, false))] {
                let t = Train {
                    batch: 2,
                    seq: n + 9,
                    precision: 0,
                    optimizer: 0,
                    checkpointing: false,
                    attention,
                    lora,
                    grad_accum: 1,
                    dropout: false,
                    cpu,
                    keep_outputs: false,
                    every: 0,
                };
                let w = workload(&t, &m);
                let k = kernels(cpu);
                let r = memory::simulate_train(&m, &w, k);
                let f = fast::simulate_train(&m, &w, k);
                assert!(r.is_ok(), "{name} train {n}: {r:?}");
                assert_eq!(r, f, "{name} train {n}");
                let mut ckpt = t;
                ckpt.checkpointing = true;
                let w = workload(&ckpt, &m);
                let r = memory::simulate_train(&m, &w, k);
                let f = fast::simulate_train(&m, &w, k);
                if simulated {
                    // the tower's backward is simulated (memory/hf/vision.rs, siglip.rs,
                    // pixtral.rs)
                    assert!(r.is_ok(), "{name} train {n} checkpointing: {r:?}");
                } else {
                    assert_eq!(
                        r.as_ref().err().and_then(|e| e.field()),
                        Some("image_tokens"),
                        "{name} train {n} checkpointing: {r:?}"
                    );
                }
                assert_eq!(r, f, "{name} train {n} checkpointing");
            }
            let inf = Infer {
                batch: 2,
                prompt: n + 5,
                new_tokens: 3,
                attention,
                weights: 0,
                kv: 0,
                batched: true,
                cpu,
            };
            let w = infer_workload(&inf);
            let k = kernels(cpu);
            assert!(
                memory::simulate_infer(&m, &w, k).is_ok(),
                "{name} infer {n}"
            );
            assert_eq!(
                memory::simulate_infer(&m, &w, k),
                fast::simulate_infer(&m, &w, k),
                "{name} infer {n}"
            );
            seen += 1;
        }
    }
    assert!(seen >= 6, "{seen}");
}
