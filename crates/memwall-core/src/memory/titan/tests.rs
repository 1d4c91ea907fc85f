use super::*;
use crate::layout::Schedule;
use crate::model::tests::llama2_7b;
use crate::workload::{Lora, Precision};

fn model(layers: usize) -> ModelDesc {
    let mut m = llama2_7b();
    m.layers.truncate(layers);
    m
}

fn layout(gpus: u64, strategy: Strategy) -> Layout {
    Layout {
        gpus,
        gpus_per_node: 8,
        strategy,
        tp: 1,
        sequence_parallel: false,
        pp: 1,
        schedule: Schedule::OneFOneB,
        virtual_stages: 1,
        cp: 1,
        ep: 1,
        offload: Offload::None,
        offload_device: OffloadDevice::Cpu,
    }
}

fn workload(batch: u64, seq: u64, ac: Option<CheckpointPolicy>) -> TrainWorkload {
    let mut w = TrainWorkload::new(batch, seq);
    w.precision = Precision::AmpBf16;
    if let Some(p) = ac {
        w.checkpointing = true;
        w.step_options.checkpointing_policy = p;
    }
    w
}

fn peak(m: &ModelDesc, w: &TrainWorkload, l: &Layout, reshard: Option<ReshardPolicy>) -> u64 {
    simulate_train_titan(m, w, l, &TitanOptions { reshard })
        .unwrap()
        .peak_bytes
}

fn field(r: Result<DistEstimate, CoreError>) -> &'static str {
    match r {
        Err(CoreError::Unsupported { field, engine, .. }) => {
            assert_eq!(engine, "torchtitan 0.3.0");
            field
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_breakdown_sums_to_the_peak_and_names_the_engine() {
    let e = simulate_train_titan(
        &model(2),
        &workload(1, 512, None),
        &layout(8, Strategy::FsdpFull),
        &TitanOptions::default(),
    )
    .unwrap();
    assert_eq!(e.engine, Engine::Torchtitan);
    assert_eq!(e.engine.name(), "torchtitan");
    let g = &e.groups[0];
    assert_eq!(g.at_peak.iter().map(|(_, b)| b).sum::<u64>(), e.peak_bytes);
    assert_eq!(g.ranks.len(), 8);
    let max_phase = g.phase_peaks.iter().map(|(_, b)| *b).max().unwrap();
    assert_eq!(max_phase, e.peak_bytes);
}

#[test]
fn more_tokens_never_need_less_and_never_resharding_never_needs_less() {
    // no order between the policies is asserted: under AC a checkpointed block's gathered
    // parameters are alive at its reduce-scatter (measured), so full AC can peak above no AC
    // for short sequences
    let m = model(3);
    let policies = [
        None,
        Some(CheckpointPolicy::SelectiveOp),
        Some(CheckpointPolicy::EveryK(2)),
        Some(CheckpointPolicy::Full),
    ];
    for gpus in [1, 6, 8, 64] {
        let l = layout(gpus, Strategy::FsdpFull);
        for p in policies {
            let mut last = 0;
            for (b, s) in [(1, 128), (1, 512), (2, 512), (2, 2048), (4, 4096)] {
                let w = workload(b, s, p);
                let default = peak(&m, &w, &l, None);
                assert!(default >= last, "{gpus} {p:?} {b} {s}");
                last = default;
                let never = peak(&m, &w, &l, Some(ReshardPolicy::Never));
                assert!(never >= default, "{gpus} {p:?} {b} {s}");
                // fsdp-grad-op stands for "never"
                let grad_op = peak(&m, &w, &layout(gpus, Strategy::FsdpGradOp), None);
                assert_eq!(grad_op, never);
            }
        }
    }
}

#[test]
fn what_torchtitan_does_not_run_is_refused_by_name() {
    let m = model(2);
    let l = layout(8, Strategy::FsdpFull);
    let run =
        |w: &TrainWorkload, l: &Layout| simulate_train_titan(&m, w, l, &TitanOptions::default());
    let mut w = workload(1, 128, None);
    w.precision = Precision::Bf16;
    assert_eq!(field(run(&w, &l)), "precision");
    let mut w = workload(1, 128, None);
    w.lora = Some(Lora {
        rank: 8,
        targets: vec!["q_proj".into()],
        qlora: false,
    });
    assert_eq!(field(run(&w, &l)), "lora_rank");
    let mut w = workload(1, 128, None);
    w.grad_accum = 2;
    assert_eq!(field(run(&w, &l)), "grad_accum");
    let mut w = workload(1, 128, None);
    w.kernels.loss = LossKernel::FusedLinear;
    assert_eq!(field(run(&w, &l)), "loss");
    let w = workload(1, 128, Some(CheckpointPolicy::SelectiveAttn));
    assert_eq!(field(run(&w, &l)), "checkpointing_policy");
    let w = workload(1, 128, None);
    for s in [Strategy::Ddp, Strategy::Zero3, Strategy::Hsdp] {
        assert_eq!(field(run(&w, &layout(16, s))), "strategy", "{s:?}");
    }
    let tp = Layout { tp: 2, ..l.clone() };
    assert_eq!(field(run(&w, &tp)), "tp");
    let pp = Layout { pp: 2, ..l.clone() };
    assert_eq!(field(run(&w, &pp)), "pp");
    let mut tied = model(2);
    tied.head.tied = true;
    assert_eq!(
        field(simulate_train_titan(
            &tied,
            &w,
            &l,
            &TitanOptions::default()
        )),
        "tie_word_embeddings"
    );
    let mut other = model(2);
    other.model_type = "deepseek_v3".into();
    assert_eq!(
        field(simulate_train_titan(
            &other,
            &w,
            &l,
            &TitanOptions::default()
        )),
        "model_type"
    );
}

/// Op-level SAC runs on the transformers model too (`memory/hf/sac.rs`): the hf, DDP and FSDP2
/// engines accept it; Megatron-LM's memory formula knows full recomputation only.
#[test]
fn selective_op_runs_on_hf_engines_and_torchtitan_but_not_megatron() {
    let w = workload(1, 128, Some(CheckpointPolicy::SelectiveOp));
    for e in [Engine::Hf, Engine::Fsdp2, Engine::Ddp, Engine::Torchtitan] {
        assert_eq!(e.check(&w, None), Ok(()), "{e:?}");
    }
    match Engine::Megatron.check(&w, None) {
        Err(CoreError::Unsupported { field, value, .. }) => {
            assert_eq!(
                (field, value.as_str()),
                ("checkpointing_policy", "selective-op")
            );
        }
        other => panic!("megatron: {other:?}"),
    }
}
