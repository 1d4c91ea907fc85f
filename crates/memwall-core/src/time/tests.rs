//! Orderings the measured runs show (docs/time-model.md, "Orderings").
#![allow(clippy::unwrap_used)]

use super::*;
use crate::layout::{Offload, Strategy};
use crate::model::tests::llama2_7b;
use crate::model::LinearRole;
use crate::workload::{Lora, Precision};

fn model() -> ModelDesc {
    let mut m = llama2_7b();
    m.linear_names = vec![
        (LinearRole::Q, "q_proj".into()),
        (LinearRole::K, "k_proj".into()),
        (LinearRole::V, "v_proj".into()),
        (LinearRole::O, "o_proj".into()),
        (LinearRole::Gate, "gate_proj".into()),
        (LinearRole::Up, "up_proj".into()),
        (LinearRole::Down, "down_proj".into()),
    ];
    m
}

fn hw() -> Hardware {
    collective::tests::h100()
}

fn run(w: &TrainWorkload, l: &Layout) -> StepTime {
    let hardware = hw();
    let execution = Execution::defaults(l, w, &hardware);
    let efficiencies = Efficiencies::defaults(&hardware, execution.attention);
    estimate_step_time(&StepTimeInputs {
        model: &model(),
        workload: w,
        layout: l,
        hardware: &hardware,
        efficiencies: &efficiencies,
        execution: &execution,
    })
    .unwrap()
}

fn cluster(gpus: u64, strategy: Strategy) -> Layout {
    Layout {
        gpus,
        gpus_per_node: 8,
        strategy,
        ..Layout::single()
    }
}

#[test]
fn breakdown_sums_to_the_step() {
    let w = TrainWorkload::new(4, 2048);
    let t = run(&w, &cluster(8, Strategy::FsdpFull));
    assert!((t.breakdown.total_s() - t.step_s).abs() < 1e-12 * t.step_s.max(1.0));
    assert!(t.mfu > 0.2 && t.mfu < 0.8, "{t:#?}");
    assert!(t.hfu >= t.mfu);
}

#[test]
fn checkpointing_is_slower() {
    let mut w = TrainWorkload::new(4, 2048);
    let plain = run(&w, &Layout::single());
    w.checkpointing = true;
    let ckpt = run(&w, &Layout::single());
    assert!(
        ckpt.step_s > 1.2 * plain.step_s,
        "{} {}",
        ckpt.step_s,
        plain.step_s
    );
    assert!(ckpt.breakdown.recompute_s > 0.0);
    assert!((ckpt.mfu - plain.mfu).abs() > 0.0 && ckpt.hfu > ckpt.mfu);
}

#[test]
fn zero3_across_two_nodes_is_slower_than_within_one() {
    let w = TrainWorkload::new(1, 2048);
    let mut one = cluster(8, Strategy::Zero3);
    one.gpus_per_node = 8;
    let mut two = cluster(8, Strategy::Zero3);
    two.gpus_per_node = 4;
    let a = run(&w, &one);
    let b = run(&w, &two);
    assert!(b.step_s > a.step_s, "{} {}", b.step_s, a.step_s);
    assert!(b.breakdown.exposed_comm_s > a.breakdown.exposed_comm_s);
}

#[test]
fn lora_is_faster_per_step_than_full_fine_tuning() {
    let mut w = TrainWorkload::new(4, 2048);
    let full = run(&w, &Layout::single());
    w.lora = Some(Lora {
        rank: 16,
        targets: vec!["q_proj".into(), "v_proj".into()],
        qlora: false,
    });
    let lora = run(&w, &Layout::single());
    assert!(
        lora.step_s < 0.85 * full.step_s,
        "{} {}",
        lora.step_s,
        full.step_s
    );
    assert!(lora.breakdown.optimizer_s < 0.01 * full.breakdown.optimizer_s);
}

#[test]
fn tensor_parallel_across_nodes_is_slower() {
    let w = TrainWorkload::new(1, 4096);
    let mut inside = cluster(8, Strategy::Ddp);
    inside.tp = 8;
    let mut across = inside.clone();
    across.gpus_per_node = 4;
    let a = run(&w, &inside);
    let b = run(&w, &across);
    assert!(b.step_s > 1.2 * a.step_s, "{} {}", b.step_s, a.step_s);
}

#[test]
fn more_micro_batches_shrink_the_bubble_share() {
    let mut l = cluster(8, Strategy::Ddp);
    l.pp = 4;
    let mut w = TrainWorkload::new(1, 2048);
    w.grad_accum = 4;
    let few = run(&w, &l);
    w.grad_accum = 32;
    let many = run(&w, &l);
    let share = |t: &StepTime| t.breakdown.bubble_s / t.step_s;
    assert!(
        share(&many) < share(&few) / 4.0,
        "{} {}",
        share(&many),
        share(&few)
    );
    assert!(many.tokens_per_s_per_gpu > few.tokens_per_s_per_gpu);
    // interleaving divides it by the virtual stages
    l.schedule = crate::layout::Schedule::Interleaved;
    l.virtual_stages = 2;
    w.grad_accum = 4;
    let inter = run(&w, &l);
    assert!(inter.breakdown.bubble_s < few.breakdown.bubble_s);
}

#[test]
fn offload_adds_host_time() {
    let w = TrainWorkload::new(1, 2048);
    let plain = run(&w, &cluster(8, Strategy::Zero2));
    let mut l = cluster(8, Strategy::Zero2);
    l.offload = Offload::Optimizer;
    let off = run(&w, &l);
    assert!(off.breakdown.offload_s > 0.0);
    assert!(off.step_s > plain.step_s);
}

#[test]
fn fp32_is_slower_than_bf16() {
    let mut w = TrainWorkload::new(1, 1024);
    let bf16 = run(&w, &Layout::single());
    w.precision = Precision::Fp32;
    let fp32 = run(&w, &Layout::single());
    assert!(fp32.step_s > 4.0 * bf16.step_s);
}

#[test]
fn liger_kernels_are_faster_than_the_eager_modules() {
    // Liger's fused RMSNorm, SwiGLU and RoPE move the fused minimum, the eager modules 9×, 5/3
    // and 3.5× of it; its fused linear cross-entropy replaces the fp32 loss
    let mut w = TrainWorkload::new(4, 2048);
    let l = cluster(8, Strategy::FsdpFull);
    let eager = run(&w, &l);
    w.kernels.loss = crate::workload::LossKernel::FusedLinear;
    let loss_only = run(&w, &l);
    w.kernels.layers = crate::workload::KernelSet::Liger;
    let liger = run(&w, &l);
    assert!(
        liger.step_s < loss_only.step_s && loss_only.step_s < eager.step_s,
        "{} {} {}",
        liger.step_s,
        loss_only.step_s,
        eager.step_s
    );
    // the model FLOPs are the same: MFU rises with the speed
    assert!(liger.mfu > eager.mfu);
}

/// torchtitan's op-level SAC on a Llama layer (q, k, v, o, gate, up, down, none biased): the
/// 2nd, 4th and 6th matmuls (k, o, up) run again, i.e. (2h² + h·i) of (4h² + 3h·i) FLOPs.
#[test]
fn selective_op_recomputes_every_other_unbiased_matmul() {
    let m = model();
    let mut w = TrainWorkload::new(1, 2048);
    w.checkpointing = true;
    w.step_options.checkpointing_policy = crate::workload::CheckpointPolicy::SelectiveOp;
    let r = Recompute::for_model(&w, &m);
    let (h, i) = (4096.0_f64, 11008.0_f64);
    let want = (2.0 * h * h + h * i) / (4.0 * h * h + 3.0 * h * i);
    assert!((r.gemm - want).abs() < 1e-12, "{} vs {want}", r.gemm);
    assert_eq!(r.attention, 0.0);
    assert_eq!(r.elementwise, 1.0);
    // a LoRA adapter's two matmuls take part in the count: q, A, B, k, v, A, B, o, ... shifts
    // the alternation (q, B, v, B, gate, down kept; A, k, A, o, up recomputed)
    w.lora = Some(Lora {
        rank: 16,
        targets: vec!["q_proj".into(), "v_proj".into()],
        qlora: false,
    });
    let r = Recompute::for_model(&w, &m);
    let rk = 16.0;
    let want = (h * h + 2.0 * h * rk + h * h + h * i) / (4.0 * h * h + 3.0 * h * i + 4.0 * h * rk);
    assert!((r.gemm - want).abs() < 1e-12, "{} vs {want}", r.gemm);
    // the step sits between no checkpointing and full recomputation
    let t = |w: &TrainWorkload| run(w, &Layout::single()).step_s;
    let op = t(&w);
    w.step_options.checkpointing_policy = crate::workload::CheckpointPolicy::Full;
    let full = t(&w);
    w.checkpointing = false;
    w.step_options.checkpointing_policy = crate::workload::CheckpointPolicy::Full;
    let none = t(&w);
    assert!(none < op && op < full, "{none} < {op} < {full}");
}

/// `--activation-offload`: the saved tensors cross PCIe twice per micro-batch, on the compute
/// stream (nothing hidden).
#[test]
fn activation_offload_adds_its_pcie_traffic() {
    let mut w = TrainWorkload::new(1, 2048);
    let plain = run(&w, &Layout::single());
    w.step_options.activation_offload = true;
    let off = run(&w, &Layout::single());
    let host = crate::memory::fast::simulate_train(&model(), &w, crate::memory::Kernels::Cuda)
        .unwrap()
        .host_offload_bytes as f64;
    assert!(host > 1e9, "{host}");
    let link =
        hw().host_link() * Efficiencies::defaults(&hw(), AttentionKernel::Flash2).pcie_fraction;
    let want = 2.0 * host / link;
    let added = off.breakdown.offload_s - plain.breakdown.offload_s;
    assert!((added - want).abs() < 1e-9 * want, "{added} vs {want}");
    assert!(off.step_s > plain.step_s);
}
