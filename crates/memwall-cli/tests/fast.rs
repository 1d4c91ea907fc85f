//! The fast evaluator (`memwall_core::memory::fast`) against the reference replay.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_core::memory::{self, fast, Kernels};
use memwall_core::workload::{Optimizer, Precision, TrainWorkload};

#[test]
fn smoke_catalogue_train() {
    let mut paths = std::collections::BTreeMap::new();
    for entry in memwall_catalog::models() {
        let Ok(m) = entry.model() else { continue };
        for (p, o, ck) in [
            (Precision::Bf16, Optimizer::Adamw, false),
            (Precision::AmpBf16, Optimizer::Adafactor, true),
        ] {
            let mut w = TrainWorkload::new(2, 256);
            w.precision = p;
            w.optimizer = o;
            w.checkpointing = ck;
            w.grad_accum = 2;
            for k in [Kernels::Cuda, Kernels::Cpu] {
                let r = memory::simulate_train(&m, &w, k);
                let f = fast::simulate_train_traced(&m, &w, k);
                match (r, f) {
                    (Ok(r), Ok((f, path))) => {
                        *paths.entry(format!("{path:?}")).or_insert(0) += 1;
                        assert_eq!(r, f, "{} {p} {o} {ck} {path:?}", entry.id);
                    }
                    (Err(a), Err(b)) => assert_eq!(a, b),
                    (a, b) => panic!("{}: {a:?} vs {b:?}", entry.id),
                }
            }
        }
    }
    eprintln!("{paths:?}");
}

#[test]
fn smoke_catalogue_infer_and_dist() {
    use memwall_core::layout::{Layout, Strategy};
    use memwall_core::workload::{AttentionImpl, InferWorkload, KvDtype, WeightFormat};
    let mut paths = std::collections::BTreeMap::new();
    for entry in memwall_catalog::models() {
        let Ok(m) = entry.model() else { continue };
        for (weights, new_tokens) in [
            ("bf16", 1),
            ("bf16", 7),
            ("gguf-q4_k_m", 100_000),
            ("nf4", 3),
        ] {
            let w = InferWorkload {
                batch: 2,
                prompt: 100,
                new_tokens,
                attention: AttentionImpl::Sdpa,
                weights: WeightFormat::parse(weights).unwrap(),
                kv_dtype: KvDtype::Auto,
                moe_decode_batched: true,
            };
            let r = memory::simulate_infer(&m, &w, Kernels::Cuda);
            let f = fast::simulate_infer_traced(&m, &w, Kernels::Cuda);
            match (r, f) {
                (Ok(r), Ok((f, path))) => {
                    *paths.entry(format!("infer {path:?}")).or_insert(0) += 1;
                    if path != fast::Path::Extrapolated {
                        eprintln!("FB {} {weights} {new_tokens} {path:?}", entry.id);
                    }
                    assert_eq!(r, f, "{} {weights} {path:?}", entry.id);
                }
                (Err(a), Err(b)) => assert_eq!(a, b),
                (a, b) => panic!("{}: {a:?} vs {b:?}", entry.id),
            }
        }
        for (gpus, strategy) in [
            (2, Strategy::Ddp),
            (15, Strategy::FsdpFull),
            (8, Strategy::Zero1),
            (6, Strategy::Zero3),
        ] {
            let l = Layout {
                gpus,
                gpus_per_node: 8,
                strategy,
                ..Layout::single()
            };
            let w = TrainWorkload::new(1, 128);
            let r = memory::simulate_train_dist(&m, &w, &l, Kernels::Cuda);
            let f = fast::simulate_train_dist_traced(
                &m,
                &w,
                &l,
                Kernels::Cuda,
                &memory::DistOptions::default(),
            );
            match (r, f) {
                (Ok(r), Ok((f, path))) => {
                    *paths.entry(format!("dist {path:?}")).or_insert(0) += 1;
                    assert_eq!(r, f, "{} {strategy} {path:?}", entry.id);
                }
                (Err(a), Err(b)) => assert_eq!(a, b),
                (a, b) => panic!("{}: {a:?} vs {b:?}", entry.id),
            }
        }
    }
    eprintln!("{paths:?}");
}

#[test]
fn dbg_gguf() {
    use memwall_core::workload::{AttentionImpl, InferWorkload, KvDtype, WeightFormat};
    let m = memwall_catalog::find("llama-3.1-8b")
        .unwrap()
        .model()
        .unwrap();
    let w = InferWorkload {
        batch: 2,
        prompt: 100,
        new_tokens: 7,
        attention: AttentionImpl::Sdpa,
        weights: WeightFormat::parse("gguf-q4_k_m").unwrap(),
        kv_dtype: KvDtype::Auto,
        moe_decode_batched: true,
    };
    let f = fast::simulate_infer_traced(&m, &w, Kernels::Cuda).unwrap();
    eprintln!("{:?}", f.1);
}
