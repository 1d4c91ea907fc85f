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
    simulate_train_titan(
        m,
        w,
        l,
        &TitanOptions {
            reshard,
            ..TitanOptions::default()
        },
    )
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
    for s in [Strategy::Ddp, Strategy::Zero3] {
        assert_eq!(field(run(&w, &layout(16, s))), "strategy", "{s:?}");
    }
    // tensor parallelism runs with sequence parallelism (torchtitan's default) only
    let tp = Layout { tp: 2, ..l.clone() };
    assert_eq!(field(run(&w, &tp)), "sequence_parallel");
    let sp = Layout {
        sequence_parallel: true,
        ..l.clone()
    };
    assert_eq!(field(run(&w, &sp)), "sequence_parallel");
    // a degree that does not divide the heads (32) is not measured
    let tp3 = Layout {
        gpus: 6,
        tp: 3,
        sequence_parallel: true,
        ..l.clone()
    };
    assert_eq!(field(run(&workload(1, 129, None), &tp3)), "tp");
    for (name, mp) in [
        ("cp", Layout { cp: 2, ..l.clone() }),
        ("ep", Layout { ep: 2, ..l.clone() }),
    ] {
        assert_eq!(field(run(&w, &mp)), name);
    }
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

/// HSDP (`--strategy hsdp`): replicas of the FSDP2 step over the shard group (`gpus_per_node`),
/// byte for byte (measured: the all-reduce runs in place on the reduce-scatter output); every
/// rank in one group; HSDP with TP or PP is refused by name.
#[test]
fn hsdp_is_the_fsdp2_step_of_its_shard_group() {
    let m = model(2);
    let w = workload(1, 1024, Some(CheckpointPolicy::Full));
    let run = |l: &Layout| simulate_train_titan(&m, &w, l, &TitanOptions::default());
    let hsdp = run(&layout(32, Strategy::Hsdp)).unwrap();
    let one_node = run(&layout(8, Strategy::FsdpFull)).unwrap();
    let all = run(&layout(32, Strategy::FsdpFull)).unwrap();
    assert_eq!(hsdp.peak_bytes, one_node.peak_bytes);
    assert_eq!(hsdp.groups[0].at_peak, one_node.groups[0].at_peak);
    assert!(all.peak_bytes < hsdp.peak_bytes);
    assert_eq!(hsdp.groups.len(), 1);
    assert_eq!(hsdp.groups[0].ranks.len(), 32);
    assert_eq!(
        hsdp.groups[0].label,
        "all 32 ranks (a dp_replicate 4 × dp_shard 8 mesh)"
    );
    assert_eq!((hsdp.dp, hsdp.global_batch), (32, 32));
    let tp = Layout {
        tp: 2,
        sequence_parallel: true,
        ..layout(32, Strategy::Hsdp)
    };
    assert_eq!(field(run(&tp)), "tp");
    let pp = Layout {
        pp: 2,
        ..layout(32, Strategy::Hsdp)
    };
    let mut wpp = w.clone();
    wpp.grad_accum = 2;
    assert_eq!(
        field(simulate_train_titan(
            &m,
            &wpp,
            &pp,
            &TitanOptions::default()
        )),
        "pp"
    );
    // one node is not HSDP (the layout's own rule)
    assert!(run(&layout(8, Strategy::Hsdp)).is_err());
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

#[test]
fn tensor_parallelism_shards_the_states_and_the_vocabulary() {
    let m = model(2);
    let w = workload(1, 2048, None);
    let run = |l: &Layout| simulate_train_titan(&m, &w, l, &TitanOptions::default()).unwrap();
    let dp8 = run(&layout(8, Strategy::FsdpFull));
    let tp2 = Layout {
        tp: 2,
        sequence_parallel: true,
        ..layout(8, Strategy::FsdpFull)
    };
    let e = run(&tp2);
    assert_eq!((e.dp, e.global_batch), (4, 4));
    assert!(e.groups[0].label.contains("dp_shard 4 × tp 2"));
    // the states are sharded over all 8 ranks either way (FSDP over 4 × TP 2)
    let (a, b) = (
        e.groups[0].model_state_bytes as f64,
        dp8.groups[0].model_state_bytes as f64,
    );
    assert!((a / b - 1.0).abs() < 0.01, "{a} {b}");
    // 4 data-parallel ranks without TP hold twice the states and the whole vocabulary's
    // logits: TP 2 on 8 GPUs needs less than FSDP on 4
    let dp4 = run(&layout(4, Strategy::FsdpFull));
    assert!(e.peak_bytes < dp4.peak_bytes);
    // a sequence not divisible by tp is refused (torchtitan's trainer.py check)
    let odd = workload(1, 2047, None);
    assert!(simulate_train_titan(&m, &odd, &tp2, &TitanOptions::default()).is_err());
    // more TP never needs more on the same GPUs
    let tp4 = Layout {
        tp: 4,
        sequence_parallel: true,
        ..layout(8, Strategy::FsdpFull)
    };
    assert!(run(&tp4).peak_bytes <= e.peak_bytes);
}

#[test]
fn fused_adamw_has_no_step_temporaries_and_foreach_one_list() {
    let m = model(2);
    let l = layout(1, Strategy::FsdpFull);
    let mut w = workload(1, 128, None);
    let sim = |w: &TrainWorkload| simulate_train_titan(&m, w, &l, &TitanOptions::default());
    w.optimizer = Optimizer::AdamwFused;
    let fused = sim(&w).unwrap();
    w.optimizer = Optimizer::Adamw;
    let foreach = sim(&w).unwrap();
    let opt = |e: &DistEstimate| e.groups[0].phase_peak(Phase::Optimizer).unwrap();
    // foreach: one fp32 list the size of the shards (the fp32 weights' bytes)
    let weights = fused.groups[0].model_state_bytes / 4;
    let d = opt(&foreach) - opt(&fused);
    assert!(d.abs_diff(weights) < 1024, "{d} {weights}");
    w.optimizer = Optimizer::AdamwForloop;
    assert_eq!(field(sim(&w)), "optimizer");
}

/// A Qwen 3-shaped description of `layers` blocks (Llama 2 7B's widths with Qwen 3's per-head
/// q/k RMSNorms), as the qwen3 normaliser describes one.
fn qwen3(layers: usize) -> ModelDesc {
    let mut m = model(layers);
    m.model_type = "qwen3".into();
    for l in &mut m.layers {
        l.attention.qk_norm = Some((QkNormScope::PerHead, NormKind::RmsNorm));
    }
    m
}

/// torchtitan's qwen3 block saves its q/k norms' fp32 tensors and reads a cos/sin RoPE cache
/// twice the size of llama3's complex one; it holds two `head_dim` norm weights more.
#[test]
fn qwen3_adds_its_qk_norms_and_a_cos_sin_rope_cache() {
    let (seq, layers) = (512u64, 2usize);
    let w = workload(1, seq, None);
    let job = |m: &ModelDesc| Job {
        shapes: shapes(m).unwrap(),
        world: 1,
        tp: 1,
        ep: 1,
        batch: 1,
        seq,
        checkpointing: None,
        reshard: ReshardPolicy::Default,
        fused_optimizer: true,
        float8: None,
    };
    let (llama, qwen) = (model(layers), qwen3(layers));
    assert_eq!(shapes(&qwen).unwrap().model, TitanModel::Qwen3);
    let logits = |m: &ModelDesc| instants(&job(m)).unwrap()[0].clone();
    let (a, b) = (logits(&llama), logits(&qwen));
    let cat =
        |x: &Instant, c: Category| x.bytes[Category::ALL.iter().position(|y| *y == c).unwrap()];
    // 32 heads × 128 = 4096, 32 kv heads: per token 8q + 4·heads + 8kv + 4·kv_heads for the
    // norms, 4·head_dim more RoPE cache read per token
    let per_token: u128 = 8 * 4096 + 4 * 32 + 8 * 4096 + 4 * 32 + 4 * 128;
    assert_eq!(
        cat(&b, Category::Activations) - cat(&a, Category::Activations),
        layers as u128 * per_token * u128::from(seq)
    );
    // the caches: seq rows of 8·head_dim (cos, sin) against 4·head_dim (complex64)
    assert_eq!(
        cat(&b, Category::Buffers) - cat(&a, Category::Buffers),
        layers as u128 * u128::from(seq) * 4 * 128
    );
    // fp32 shard, gradient and two AdamW states of the two head_dim weights, and their steps
    let l = layout(1, Strategy::FsdpFull);
    let states = |m: &ModelDesc| {
        simulate_train_titan(m, &w, &l, &TitanOptions::default())
            .unwrap()
            .groups[0]
            .model_state_bytes
    };
    assert_eq!(
        states(&qwen) - states(&llama),
        layers as u64 * (16 * 2 * 128 + 4 * 2)
    );
}

/// What torchtitan's qwen3 model cannot express is refused by the config field that says so.
#[test]
fn qwen3_configs_torchtitan_cannot_express_are_refused_by_name() {
    let w = workload(1, 128, None);
    let l = layout(8, Strategy::FsdpFull);
    let run = |m: &ModelDesc| simulate_train_titan(m, &w, &l, &TitanOptions::default());
    assert!(run(&qwen3(2)).is_ok());
    let mut m = qwen3(2);
    m.layers[1].attention.sliding_window = Some(4096);
    assert_eq!(field(run(&m)), "sliding_window");
    let mut m = qwen3(2);
    m.layers[0].attention.qkv_bias = true;
    assert_eq!(field(run(&m)), "attention_bias");
    // a qwen3 without its q/k norms, and a llama with them, are not torchtitan's blocks
    let mut m = qwen3(2);
    m.layers[0].attention.qk_norm = None;
    assert_eq!(field(run(&m)), "model_type");
    let mut m = model(2);
    m.layers[0].attention.qk_norm = Some((QkNormScope::PerHead, NormKind::RmsNorm));
    assert_eq!(field(run(&m)), "model_type");
    // tied embeddings: measured for Qwen 3 (dense); a tied MoE config is not
    let mut m = qwen3(2);
    m.head.tied = true;
    assert!(run(&m).is_ok());
    for t in ["qwen3_moe", "deepseek_v3"] {
        let mut m = qwen3(2);
        m.model_type = t.into();
        assert_eq!(field(run(&m)), "model_type", "{t}");
    }
}

/// A Qwen 3 MoE-shaped description: [`qwen3`] with every feed-forward torchtitan's MoE of
/// `experts` SwiGLU experts of width 768, top 8.
fn qwen3_moe(layers: usize, experts: u64) -> ModelDesc {
    use crate::model::{DenseMlp, MoeMlp};
    let mut m = qwen3(layers);
    m.model_type = "qwen3_moe".into();
    for l in &mut m.layers {
        l.mlp = Mlp::Moe(MoeMlp {
            num_experts: experts,
            top_k: 8,
            expert: DenseMlp {
                intermediate: 768,
                gated: true,
                fused_gate_up: false,
                bias: false,
                act: Activation::Silu,
            },
            router_bias: false,
            shared: None,
            shared_gate: false,
            router_extra_params: 0,
            router_fp32: false,
            router_topk_then_softmax: false,
            router_weights_in_compute_dtype: false,
            router_scores_fp32: false,
            shared_first: false,
            frozen_router_params: 0,
            all_experts: false,
            granite_router: false,
            hunyuan_router: false,
            norm_topk_prob: None,
        });
    }
    m
}

/// torchtitan's MoE block: its parameters (gate and three `[E, F, D]` expert tensors) are
/// FSDP-sharded on the expert dim; what was not measured is refused by name.
#[test]
fn qwen3_moe_runs_torchtitans_moe_blocks_and_refuses_what_was_not_measured() {
    let m = qwen3_moe(2, 128);
    let s = shapes(&m).unwrap();
    assert_eq!(
        s.moe,
        Some(TitanMoe {
            experts: 128,
            top_k: 8,
            expert_ffn: 768,
            shared_ffn: 0,
            route_norm: true,
        })
    );
    let w = workload(1, 1024, None);
    let l = layout(8, Strategy::FsdpFull);
    let e = simulate_train_titan(&m, &w, &l, &TitanOptions::default()).unwrap();
    // the peak is inside the MoE backward: the three bf16 expert gradients alone
    assert!(e.peak_bytes > 2 * 3 * 128 * 768 * 4096);
    // parameters: attention + norms as the dense block, the gate and the experts
    let dense_attention = 4096 * (4096 + 2 * 4096) + 4096 * 4096 + 2 * 4096 + 2 * 128;
    let moe = 128 * 4096 + 3 * 128 * 768 * 4096;
    let embeddings = 2 * 32000 * 4096 + 4096;
    assert_eq!(e.params_total, 2 * (dense_attention + moe) + embeddings);
    // 12 ranks pad the 128 experts to 11 per rank (132)
    let e12 = simulate_train_titan(
        &m,
        &w,
        &Layout {
            gpus_per_node: 4,
            ..layout(12, Strategy::FsdpFull)
        },
        &TitanOptions::default(),
    )
    .unwrap();
    assert!(e12.groups[0].model_state_bytes * 12 > e.groups[0].model_state_bytes * 8);
    let run = |w: &TrainWorkload, l: &Layout, r: Option<ReshardPolicy>| {
        simulate_train_titan(
            &m,
            w,
            l,
            &TitanOptions {
                reshard: r,
                ..TitanOptions::default()
            },
        )
    };
    let tp = Layout {
        tp: 2,
        sequence_parallel: true,
        ..l.clone()
    };
    assert_eq!(field(run(&w, &tp, None)), "tp");
    // "never" (fsdp-grad-op) is measured on MoE blocks (`titan-qwen3moe-*-never`)
    let never = run(&w, &l, Some(ReshardPolicy::Never)).unwrap();
    assert!(never.peak_bytes >= e.peak_bytes);
    assert_eq!(
        run(&w, &layout(8, Strategy::FsdpGradOp), None)
            .unwrap()
            .peak_bytes,
        never.peak_bytes
    );
    // more FSDP ranks than experts: torchtitan's Shard(1) experts
    assert_eq!(
        field(simulate_train_titan(
            &qwen3_moe(2, 4),
            &w,
            &l,
            &TitanOptions::default()
        )),
        "gpus"
    );
    // SelectiveAC on a MoE block (measured, `titan-qwen3moe-*-selac`): its cache holds the
    // block input, `wqkv`'s output (matmul 1), the attention HOP's out + logsumexp + max and
    // `topk`'s fp32 values and int64 ids; `wo` (matmul 2), the router gate (forced by shape),
    // the grouped-mm experts and everything else are recomputed
    let sel = workload(1, 1024, Some(CheckpointPolicy::SelectiveOp));
    let full = workload(1, 1024, Some(CheckpointPolicy::Full));
    let (d, t) = (4096u128, 1024u128);
    assert_eq!(
        step::block_saved(&s, 1, t, Some(CheckpointPolicy::SelectiveOp)),
        2 * d * t + 2 * (3 * d) * t + (2 * d + 8 * 32) * t + 12 * 8 * t
    );
    assert_eq!(
        step::block_saved(&s, 1, t, Some(CheckpointPolicy::Full)),
        2 * d * t
    );
    assert!(run(&sel, &l, None).is_ok() && run(&full, &l, None).is_ok());
    // block 7's backward holds blocks 0–6's caches: SelectiveAC's minus FullAC's inputs, seven
    // times
    let m8 = qwen3_moe(8, 128);
    let at = |p: CheckpointPolicy| {
        let job = Job {
            shapes: shapes(&m8).unwrap(),
            world: 8,
            tp: 1,
            ep: 1,
            batch: 1,
            seq: 1024,
            checkpointing: Some(p),
            reshard: ReshardPolicy::Default,
            fused_optimizer: true,
            float8: None,
        };
        instants(&job)
            .unwrap()
            .into_iter()
            .find(|x| x.name == "backward: block 7 feed-forward input gradient")
            .unwrap()
            .total()
    };
    assert_eq!(
        at(CheckpointPolicy::SelectiveOp) - at(CheckpointPolicy::Full),
        7 * (2 * (3 * d) * t + (2 * d + 8 * 32) * t + 12 * 8 * t)
    );
    // a MoE config under the dense model type, and a dense one under qwen3_moe, are refused
    let mut odd = qwen3_moe(2, 128);
    odd.model_type = "qwen3".into();
    assert_eq!(field(run_model(&odd)), "model_type");
}

fn run_model(m: &ModelDesc) -> Result<DistEstimate, CoreError> {
    simulate_train_titan(
        m,
        &workload(1, 128, None),
        &layout(8, Strategy::FsdpFull),
        &TitanOptions::default(),
    )
}

fn pp_layout(gpus: u64, pp: u64, schedule: Schedule, virtual_stages: u64) -> Layout {
    Layout {
        pp,
        schedule,
        virtual_stages,
        ..layout(gpus, Strategy::FsdpFull)
    }
}

#[test]
fn pipeline_parallelism_is_simulated_per_pp_rank_by_its_schedule() {
    let m = model(6);
    let mut w = workload(1, 512, None);
    for n in [4u64, 8] {
        w.grad_accum = n;
        for (schedule, v) in [
            (Schedule::OneFOneB, 1),
            (Schedule::Gpipe, 1),
            (Schedule::Interleaved, 2),
        ] {
            let e = simulate_train_titan(
                &m,
                &w,
                &pp_layout(8, 2, schedule, v),
                &TitanOptions::default(),
            )
            .unwrap();
            assert_eq!(e.groups.len(), 2);
            assert_eq!(e.dp, 4);
            assert_eq!(e.global_batch, 4 * n);
            for g in &e.groups {
                assert_eq!(g.at_peak.iter().map(|(_, b)| b).sum::<u64>(), g.peak_bytes);
                assert_eq!(g.ranks.len(), 4);
            }
            assert_eq!(
                e.peak_bytes,
                e.groups.iter().map(|g| g.peak_bytes).max().unwrap()
            );
        }
        // GPipe keeps every microbatch of a step alive, 1F1B at most pp - rank of them
        let one = |s| {
            simulate_train_titan(&m, &w, &pp_layout(8, 2, s, 1), &TitanOptions::default()).unwrap()
        };
        let (a, b) = (one(Schedule::OneFOneB), one(Schedule::Gpipe));
        for (x, y) in a.groups.iter().zip(&b.groups) {
            assert!(y.peak_bytes >= x.peak_bytes, "{} {}", x.label, y.label);
        }
    }
    // 1F1B's first stage holds min(n, pp) microbatches: once its second backward also has
    // pp of them in flight (n > pp), more microbatches cost only their token ids and labels
    // (int64, the whole local batch is loaded)
    let peak0 = |n: u64| {
        let mut w = workload(1, 512, None);
        w.grad_accum = n;
        simulate_train_titan(
            &m,
            &w,
            &pp_layout(8, 2, Schedule::OneFOneB, 1),
            &TitanOptions::default(),
        )
        .unwrap()
        .groups[0]
            .peak_bytes
    };
    assert_eq!(peak0(8) - peak0(4), 16 * 4 * 512);
    assert!(peak0(4) > peak0(2));
}

#[test]
fn what_torchtitan_pipelines_do_not_run_is_refused_by_name() {
    // (PP with TP is simulated since h26: see `pipeline_with_tp_shards_the_stages`)
    let m = model(6);
    let run = |w: &TrainWorkload, l: &Layout, o: TitanOptions| simulate_train_titan(&m, w, l, &o);
    let mut w = workload(1, 512, None);
    w.grad_accum = 4;
    let l = pp_layout(8, 2, Schedule::OneFOneB, 1);
    let tp = Layout {
        tp: 2,
        sequence_parallel: true,
        gpus: 16,
        ..l.clone()
    };
    // PP with TP + SP is measured (`titan-pptp-*`); dp_shard 1 under it is not
    assert!(run(&w, &tp, TitanOptions::default()).is_ok());
    let tp_dp1 = Layout {
        gpus: 8,
        tp: 4,
        ..tp.clone()
    };
    assert_eq!(field(run(&w, &tp_dp1, TitanOptions::default())), "gpus");
    // Llama 3 and Qwen 3 (dense, MoE) stages were measured
    assert!(simulate_train_titan(&qwen3(6), &w, &l, &TitanOptions::default()).is_ok());
    assert!(simulate_train_titan(&qwen3_moe(6, 16), &w, &l, &TitanOptions::default()).is_ok());
    // the FSDP mesh under PP is gpus / pp: 16 experts on 64 / 2 = 32 FSDP ranks are refused
    assert_eq!(
        field(simulate_train_titan(
            &qwen3_moe(6, 16),
            &w,
            &pp_layout(64, 2, Schedule::OneFOneB, 1),
            &TitanOptions::default()
        )),
        "gpus"
    );
    let mut ac = w.clone();
    ac.checkpointing = true;
    // FullAC, SelectiveAC and every-k:K are measured under PP
    for p in [
        CheckpointPolicy::Full,
        CheckpointPolicy::SelectiveOp,
        CheckpointPolicy::EveryK(2),
    ] {
        ac.step_options.checkpointing_policy = p;
        let with = run(&ac, &l, TitanOptions::default()).unwrap().peak_bytes;
        let without = run(&w, &l, TitanOptions::default()).unwrap().peak_bytes;
        assert!(with < without, "{p:?}");
    }
    let v1 = pp_layout(8, 2, Schedule::Interleaved, 1);
    assert_eq!(
        field(run(&w, &v1, TitanOptions::default())),
        "virtual_stages"
    );
    assert_eq!(
        field(run(
            &w,
            &pp_layout(2, 2, Schedule::OneFOneB, 1),
            TitanOptions::default()
        )),
        "gpus"
    );
    assert_eq!(
        field(run(
            &w,
            &l,
            TitanOptions {
                reshard: Some(ReshardPolicy::Always),
                ..TitanOptions::default()
            }
        )),
        "fsdp_reshard_after_forward"
    );
    // fewer microbatches than pipeline ranks: torch's schedules refuse them
    let mut few = w.clone();
    few.grad_accum = 1;
    assert!(matches!(
        run(&few, &l, TitanOptions::default()),
        Err(CoreError::Invalid {
            field: "grad_accum",
            ..
        })
    ));
    // 5 layers in 8 stages: too many stages (7 "layers" with the embeddings and the head)
    let deep = pp_layout(16, 4, Schedule::Interleaved, 2);
    let mut w8 = w.clone();
    w8.grad_accum = 8;
    assert!(matches!(
        simulate_train_titan(&model(5), &w8, &deep, &TitanOptions::default()),
        Err(CoreError::Invalid { field: "pp", .. })
    ));
    // 6 layers in 8 stages: the first stage holds the embeddings alone, the last the head
    // alone (measured, no longer refused)
    assert!(run(&w8, &deep, TitanOptions::default()).is_ok());
}

/// torch's `_add_reduce_grad` reduces a stage's gradients right after its last backward: under
/// Interleaved1F1B the rank's last stage (holding the head) reduces while its other stage still
/// has microbatches in flight, and the other stage's later backwards hold the reduced stage's
/// gradient shards, not its accumulated gradients; a stage of the embeddings alone peaks at
/// its reduce-scatter (its fp32 accumulated gradient, the reduce-scatter input and the shard).
#[test]
fn a_stage_reduces_its_gradients_after_its_own_last_backward() {
    let job = |layers: usize, rank: u64, pp: u64, schedule: Schedule, v: u64, n: u64| PipeJob {
        shapes: shapes(&qwen3(layers)).unwrap(),
        world: 4 * pp,
        pp,
        tp: 1,
        rank,
        schedule,
        stages_per_rank: v,
        microbatch_size: 1,
        microbatches: n,
        seq: 512,
        fused_optimizer: true,
        checkpointing: None,
    };
    let all = rank_instants(&job(6, 1, 2, Schedule::Interleaved, 2, 8)).unwrap();
    let reduce = all
        .iter()
        .position(|x| x.name.starts_with("stage 3 gradient reduce-scatter"))
        .unwrap();
    assert!(all[reduce].name.contains("unit 1 of 2: head unit"));
    let later: Vec<&Instant> = all[reduce..]
        .iter()
        .filter(|x| x.name.starts_with("stage 1 microbatch"))
        .collect();
    assert!(!later.is_empty());
    // microbatches of stage 1 are in flight at the reduction
    let act = |x: &Instant| {
        x.bytes[Category::ALL
            .iter()
            .position(|c| *c == Category::Activations)
            .unwrap()]
    };
    let last = all
        .iter()
        .rposition(|x| x.name.starts_with("stage 1 gradient reduce-scatter"))
        .unwrap();
    assert!(act(&all[reduce]) > act(&all[last]));
    // an embeddings-only first stage (2 layers in 4 stages): its peak is the reduce-scatter of
    // its only unit
    let first = rank_instants(&job(2, 0, 4, Schedule::OneFOneB, 1, 4)).unwrap();
    let top = first.iter().max_by_key(|x| x.total()).unwrap();
    assert!(top.name.contains("unit 1 of 1: embeddings"), "{}", top.name);
}

/// Qwen 3 with tied embeddings (`enable_weight_tying`): one parameter, one gradient shard and
/// one set of AdamW states for `tok_embeddings` and `lm_head` (one fp32 shard, its gradient,
/// two states and a step scalar fewer than untied), but one FSDP unit `[tok_embeddings, norm,
/// lm_head]` kept gathered from the embeddings' forward to the loss that gathers the shared
/// weight twice (the two FSDP parameters `fully_shard` made before `init_weights` re-tied
/// them); a tied MoE config and tied Llama 3 are refused (not measured), and so is PP
/// (torchtitan refuses tying with PP itself, models/common/decoder.py).
#[test]
fn tied_qwen3_holds_one_embedding_state_and_gathers_it_twice() {
    let (gpus, seq, layers) = (8u64, 512u64, 2usize);
    let w = workload(1, seq, None);
    let l = layout(gpus, Strategy::FsdpFull);
    let untied = qwen3(layers);
    let mut tied = qwen3(layers);
    tied.head.tied = true;
    let (su, st) = (shapes(&untied).unwrap(), shapes(&tied).unwrap());
    assert!(st.tied && !su.tied);
    let (v, d) = (u128::from(st.vocab), u128::from(st.dim));
    let shard = v.div_ceil(u128::from(gpus)) * d;
    let padded = shard * u128::from(gpus);
    let e = |m: &ModelDesc| simulate_train_titan(m, &w, &l, &TitanOptions::default()).unwrap();
    let (eu, et) = (e(&untied), e(&tied));
    assert_eq!(
        u128::from(eu.groups[0].model_state_bytes - et.groups[0].model_state_bytes),
        16 * shard + 4
    );
    assert_eq!(u128::from(eu.params_total - et.params_total), v * d);
    let job = |s: Shapes| Job {
        shapes: s,
        world: gpus,
        tp: 1,
        ep: 1,
        batch: 1,
        seq,
        checkpointing: None,
        reshard: ReshardPolicy::Default,
        fused_optimizer: true,
        float8: None,
    };
    let (iu, it) = (instants(&job(su)).unwrap(), instants(&job(st)).unwrap());
    let cat =
        |x: &Instant, c: Category| x.bytes[Category::ALL.iter().position(|y| *y == c).unwrap()];
    // at the logits: the tied unit holds the embeddings gathered (twice, bf16) besides the head
    // the untied step holds; their fp32 shard is gone
    assert_eq!(
        cat(&it[0], Category::Weights) + 4 * shard,
        cat(&iu[0], Category::Weights) + 2 * padded
    );
    // the embeddings' re-gather (the copy-out instant): the whole tied unit twice (unsharded
    // parameters and the all-gather output), the head's weight counted there
    let name = "backward: embeddings re-gathered (all-gather copy-out)";
    let find = |xs: &[Instant]| xs.iter().find(|x| x.name == name).unwrap().clone();
    let (gu, gt) = (find(&iu), find(&it));
    assert_eq!(
        cat(&gt, Category::CommBuffers) - cat(&gu, Category::CommBuffers),
        cat(&gt, Category::Weights) + 4 * shard - cat(&gu, Category::Weights)
    );
    // refused: tied MoE, tied Llama 3, tied Qwen 3 under PP
    let mut moe = qwen3_moe(2, 16);
    moe.head.tied = true;
    assert_eq!(field(run_model(&moe)), "tie_word_embeddings");
    let mut llama = model(2);
    llama.head.tied = true;
    assert_eq!(field(run_model(&llama)), "tie_word_embeddings");
    let pp = pp_layout(8, 2, Schedule::OneFOneB, 1);
    let mut wpp = workload(1, seq, None);
    wpp.grad_accum = 2;
    assert_eq!(
        field(simulate_train_titan(
            &tied,
            &wpp,
            &pp,
            &TitanOptions::default()
        )),
        "tie_word_embeddings"
    );
}

/// every-k:K under PP counts each rank's own blocks from 1 (earlier torchtitan's process-wide
/// `_layer_sac_count`, one process per pp rank): 6 layers on 2 ranks put blocks 3, 4, 5 on rank
/// 1, whose second block (block 4) is wrapped under every-k:2, not blocks 3 and 5 as the model's
/// own numbering would have it.
#[test]
fn every_k_under_pp_counts_the_ranks_own_blocks() {
    let m = model(6);
    let at_loss = |p: Option<CheckpointPolicy>| {
        let job = PipeJob {
            shapes: shapes(&m).unwrap(),
            world: 8,
            pp: 2,
            tp: 1,
            rank: 1,
            schedule: Schedule::Gpipe,
            stages_per_rank: 1,
            microbatch_size: 1,
            microbatches: 2,
            seq: 512,
            fused_optimizer: true,
            checkpointing: p,
        };
        rank_instants(&job)
            .unwrap()
            .into_iter()
            .find(|x| x.name == "stage 1 microbatch 0 backward: loss (log-softmax gradient)")
            .unwrap()
            .total()
    };
    let tm = 512u128;
    let d = 4096u128;
    let no_ac = step::block_saved_no_ac(&shapes(&m).unwrap(), 1, tm);
    // two microbatches held (GPipe), each with one block's no-AC set replaced by its input
    assert_eq!(
        at_loss(None) - at_loss(Some(CheckpointPolicy::EveryK(2))),
        2 * (no_ac - 2 * d * tm)
    );
    // every-k:1 is FullAC
    assert_eq!(
        at_loss(Some(CheckpointPolicy::EveryK(1))),
        at_loss(Some(CheckpointPolicy::Full))
    );
}
/// torchtitan's deepseek_v3 671B flavour's shapes (models/deepseek_v3/__init__.py `_671b`),
/// `layers` blocks of which the first three are dense.
fn dsv3_671b_shapes(layers: u64, moe: bool) -> Shapes {
    Shapes {
        model: TitanModel::DeepseekV3,
        dim: 7168,
        heads: 128,
        kv_heads: 128,
        head_dim: 192,
        ffn: 18432,
        moe: moe.then_some(TitanMoe {
            experts: 256,
            top_k: 8,
            expert_ffn: 2048,
            shared_ffn: 2048,
            route_norm: true,
        }),
        vocab: 129280,
        layers,
        tied: false,
        mla: Some(TitanMla {
            q_lora_rank: 1536,
            kv_lora_rank: 512,
            nope_head_dim: 128,
            rope_head_dim: 64,
            v_head_dim: 128,
        }),
        dense_layers: 3,
    }
}

/// What an MLA block and its MoE keep, against `measure_titan.py --model deepseek_v3 --flavor
/// 671B --layers 4 --seq 1024 --saved` (the bytes autograd saves per block, less the gathered
/// weights and the flex `BlockMask`'s int32 tensors, 1152 B, shared by every block).
#[test]
fn deepseek_v3_blocks_save_what_the_saved_tensor_probe_read() {
    let tokens = 1024u128;
    // the dense block (layers.0): 509,200 B per token
    assert_eq!(
        step::block_saved_no_ac(&dsv3_671b_shapes(4, false), 1, tokens),
        509_200 * tokens
    );
    // the MoE block (layers.3): the probe read 883,324 B per token besides the per-block fp32
    // gate weight copy (`4 E D`) and the int32 offsets (`4 E`); of it the node-limited
    // routing's group indices and mask (`16 G + 8 G_kept + G` = 168 B with 8 groups, 4 kept)
    // are saved by nodes the loss does not reach (freed after the forward), while the top-k
    // ids (`8 K` = 64 B), which the probe missed, are held by the scores' gather
    // (the `titan-dsv3-671b-*` fixtures match memwall this way to within 33 kB)
    assert_eq!(
        step::block_saved_no_ac(&dsv3_671b_shapes(4, true), 1, tokens),
        (883_324 - 168 + 64) * tokens + 4 * 256 * 7168 + 4 * 256
    );
}

/// A DeepSeek-V3 description (MLA, a leading dense block, MoE blocks with a shared expert).
fn deepseek_v3(layers: usize, experts: u64) -> ModelDesc {
    use crate::model::DenseMlp;
    let mut m = qwen3_moe(layers, experts);
    m.model_type = "deepseek_v3".into();
    for (i, l) in m.layers.iter_mut().enumerate() {
        l.attention.kind = AttentionKind::Mla {
            num_heads: 32,
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
        };
        l.attention.qk_norm = None;
        if let Mlp::Moe(moe) = &mut l.mlp {
            moe.shared = Some(DenseMlp {
                intermediate: 1536,
                gated: true,
                fused_gate_up: false,
                bias: false,
                act: Activation::Silu,
            });
        }
        if i == 0 {
            l.mlp = Mlp::Dense(DenseMlp {
                intermediate: 11008,
                gated: true,
                fused_gate_up: false,
                bias: false,
                act: Activation::Silu,
            });
        }
    }
    m
}

/// torchtitan's deepseek_v3 runs under FSDP2 (dense blocks first, MoE blocks after, MLA), and
/// what was not measured is refused by name.
#[test]
fn deepseek_v3_runs_torchtitans_model_and_refuses_what_was_not_measured() {
    let m = deepseek_v3(3, 16);
    let s = shapes(&m).unwrap();
    assert_eq!(s.model, TitanModel::DeepseekV3);
    assert_eq!((s.dense_layers, s.moe_layers(), s.ffn), (1, 2, 11008));
    assert_eq!(s.moe.map(|x| x.shared_ffn), Some(1536));
    assert_eq!(s.rope_row_bytes(), 4 * 64);
    let e = run_model(&m).unwrap();
    assert_eq!(e.engine, Engine::Torchtitan);
    // a dense block instead of a MoE one holds fewer states
    let mut dense = deepseek_v3(3, 16);
    dense.layers[1].mlp = dense.layers[0].mlp;
    dense.layers[2].mlp = dense.layers[0].mlp;
    let d = run_model(&dense).unwrap();
    assert!(d.groups[0].model_state_bytes < e.groups[0].model_state_bytes);
    // not measured
    let w = workload(1, 1024, None);
    let mut l = layout(8, Strategy::FsdpFull);
    l.tp = 2;
    l.sequence_parallel = true;
    assert_eq!(
        field(simulate_train_titan(&m, &w, &l, &TitanOptions::default())),
        "tp"
    );
    let l = pp_layout(8, 2, Schedule::OneFOneB, 1);
    let mut wp = workload(1, 1024, None);
    wp.grad_accum = 2;
    assert_eq!(
        field(simulate_train_titan(&m, &wp, &l, &TitanOptions::default())),
        "pp"
    );
    let sel = workload(1, 1024, Some(CheckpointPolicy::SelectiveOp));
    assert_eq!(
        field(simulate_train_titan(
            &m,
            &sel,
            &layout(8, Strategy::FsdpFull),
            &TitanOptions::default()
        )),
        CheckpointPolicy::FIELD
    );
    // "never" resharding (fsdp-grad-op) is measured (`titan-dsv3-*-never`): it never needs
    // less than the default policy
    let never = simulate_train_titan(
        &m,
        &w,
        &layout(8, Strategy::FsdpGradOp),
        &TitanOptions::default(),
    )
    .unwrap();
    let default = simulate_train_titan(
        &m,
        &w,
        &layout(8, Strategy::FsdpFull),
        &TitanOptions::default(),
    )
    .unwrap();
    assert!(never.peak_bytes >= default.peak_bytes);
    assert_eq!(
        field(simulate_train_titan(
            &m,
            &w,
            &layout(32, Strategy::FsdpFull),
            &TitanOptions::default()
        )),
        "gpus"
    );
    // a DeepSeek-V3 config whose blocks torchtitan's do not express: a MoE block before a
    // dense one
    let mut odd = deepseek_v3(3, 16);
    odd.layers.swap(0, 1);
    assert_eq!(field(run_model(&odd)), "model_type");
}

/// PP with TP + SP (`titan-pptp-*`): every stage's FSDP units hold TP-local shards over
/// `dp_shard = gpus / (pp · tp)`, the residual stream crosses stage boundaries on the sequence
/// shard (`[mb, seq/tp, dim]`), the last stage's logits and loss are vocabulary-parallel; one
/// group per pp rank, labelled with its dp_shard × tp mesh; the data-parallel degree is
/// dp_shard.
#[test]
fn pipeline_with_tp_shards_the_stages() {
    let m = model(6);
    let mut w = workload(1, 1024, None);
    w.grad_accum = 4;
    let run = |l: &Layout| simulate_train_titan(&m, &w, l, &TitanOptions::default()).unwrap();
    let pp_only = run(&pp_layout(8, 2, Schedule::OneFOneB, 1));
    let pp_tp = run(&Layout {
        gpus: 16,
        tp: 2,
        sequence_parallel: true,
        ..pp_layout(8, 2, Schedule::OneFOneB, 1)
    });
    // the same dp_shard (4): TP halves the stages' states and saved tensors
    for (a, b) in pp_only.groups.iter().zip(&pp_tp.groups) {
        assert!(
            b.peak_bytes < a.peak_bytes,
            "{} {}",
            a.peak_bytes,
            b.peak_bytes
        );
        assert!(2 * b.model_state_bytes <= a.model_state_bytes + (1 << 20));
        assert!(2 * b.model_state_bytes > a.model_state_bytes);
    }
    assert_eq!(
        pp_tp.groups[1].label,
        "pp rank 1 (stage 1, dp_shard 4 × tp 2 ranks)"
    );
    assert_eq!(pp_tp.groups[1].ranks.len(), 8);
    assert_eq!((pp_tp.dp, pp_tp.global_batch), (4, 16));
}

/// torchtitan's expert parallelism (`expert_parallel_degree`, measured: `titan-*-ep*`): each
/// rank holds `E / ep` routed experts, FSDP-sharded over `efsdp = dp_shard / ep` (the same
/// shard size), so a MoE block gathers `E / ep` experts; the dispatcher saves its
/// `permuted_indices` and the offsets of the local experts; the estimate names its
/// balanced-routing assumption, and what was not measured is refused by name.
#[test]
fn expert_parallelism_gathers_the_local_experts_and_refuses_what_was_not_measured() {
    let m = qwen3_moe(2, 128);
    let w = workload(1, 1024, None);
    let l = layout(16, Strategy::FsdpFull);
    let ep = Layout { ep: 4, ..l.clone() };
    let run = |m: &ModelDesc, w: &TrainWorkload, l: &Layout| {
        simulate_train_titan(m, w, l, &TitanOptions::default())
    };
    let (a, b) = (run(&m, &w, &l).unwrap(), run(&m, &w, &ep).unwrap());
    assert!(b.peak_bytes < a.peak_bytes);
    // the shards are the same size: 128 / 16 = (128 / 4) / (16 / 4) experts per rank
    assert_eq!(a.groups[0].model_state_bytes, b.groups[0].model_state_bytes);
    // the MoE block gathered: 32 experts instead of 128 (bf16)
    let gathered = |e: &DistEstimate| e.comm_buffers[0].bytes;
    assert_eq!(gathered(&a) - gathered(&b), 2 * 3 * (128 - 32) * 768 * 4096);
    assert!(b.groups[0].label.contains("balanced routing assumed"));
    // per MoE block: + the int64 `permuted_indices` of the T·K routed rows, − the int32
    // offsets of the experts not held
    let job = |ep: u64| Job {
        shapes: shapes(&m).unwrap(),
        world: 16,
        tp: 1,
        ep,
        batch: 1,
        seq: 1024,
        checkpointing: None,
        reshard: ReshardPolicy::Default,
        fused_optimizer: true,
        float8: None,
    };
    let logits = |ep: u64| {
        instants(&job(ep))
            .unwrap()
            .into_iter()
            .find(|x| x.name == "forward: logits")
            .unwrap()
            .total()
    };
    assert_eq!(logits(4) - logits(1), 2 * (8 * 8 * 1024 - 4 * (128 - 32)));
    // refused by name: a dense model, an `ep` that does not divide the experts, EP with TP,
    // EP with SelectiveAC, routed rows that do not spread evenly over the experts
    assert_eq!(field(run(&model(2), &w, &ep)), "ep");
    assert_eq!(
        field(run(
            &m,
            &w,
            &Layout {
                ep: 3,
                gpus: 24,
                ..l.clone()
            }
        )),
        "ep"
    );
    let tp = Layout {
        tp: 2,
        sequence_parallel: true,
        ..ep.clone()
    };
    assert_eq!(field(run(&m, &w, &tp)), "tp");
    let sel = workload(1, 1024, Some(CheckpointPolicy::SelectiveOp));
    assert_eq!(field(run(&m, &sel, &ep)), CheckpointPolicy::FIELD);
    assert_eq!(field(run(&m, &workload(1, 1000, None), &ep)), "seq");
    // FullAC runs (measured) and, on 8 blocks at seq 4096, holds less than no AC
    let m8 = qwen3_moe(8, 128);
    let full = workload(1, 4096, Some(CheckpointPolicy::Full));
    assert!(
        run(&m8, &full, &ep).unwrap().peak_bytes
            < run(&m8, &workload(1, 4096, None), &ep).unwrap().peak_bytes
    );
}
