//! Emitters on the seed configurations (`examples/emit_seeds/seeds.rs`): a snapshot of every
//! emitted file, and every value the estimate depends on present in the emitted files.

#[path = "../examples/emit_seeds/seeds.rs"]
#[allow(dead_code)]
mod seeds;

use memwall_core::emit::{emit, emit_serve, EmitKind, EmittedFile, LaunchSpec};
use memwall_core::layout::Offload;
use memwall_core::memory::titan::Runtime;
use memwall_core::workload::CheckpointPolicy;
use memwall_core::Optimizer;

const ESTIMATE: &str = "(estimate as printed by the command)";

fn all_files(files: &[EmittedFile]) -> String {
    files
        .iter()
        .map(|f| format!("==> {} <==\n{}", f.name, f.contents))
        .collect()
}

#[test]
fn every_emitter_on_the_seeds() {
    for seed in seeds::train_seeds() {
        let spec = seeds::launch_spec(&seed, ESTIMATE).unwrap();
        for kind in seed.kinds {
            let files = emit(*kind, &spec).unwrap();
            insta::assert_snapshot!(format!("{}__{}", seed.id, kind.name()), all_files(&files));
        }
    }
    for seed in seeds::serve_seeds() {
        let files = emit_serve(EmitKind::Vllm, &seeds::serve_spec(&seed, ESTIMATE)).unwrap();
        insta::assert_snapshot!(format!("{}__vllm", seed.id), all_files(&files));
    }
}

/// The estimate's inputs as `(what, token that must appear)` per kind.
fn estimate_values(kind: EmitKind, spec: &LaunchSpec) -> Vec<(&'static str, String)> {
    let w = &spec.workload;
    let l = &spec.layout;
    let mut v = vec![];
    match kind {
        EmitKind::Deepspeed | EmitKind::Accelerate | EmitKind::Trainer
            if l.strategy.name().starts_with("zero") =>
        {
            v.push((
                "micro-batch",
                format!("\"train_micro_batch_size_per_gpu\": {}", w.batch),
            ));
            v.push((
                "accumulation",
                format!("\"gradient_accumulation_steps\": {}", w.grad_accum),
            ));
            v.push((
                "global batch",
                format!("\"train_batch_size\": {}", spec.global_batch()),
            ));
            v.push(("stage", format!("\"stage\": {}", &l.strategy.name()[4..])));
            v.push((
                "reduce bucket",
                format!(
                    "\"reduce_bucket_size\": {}",
                    spec.constants.reduce_bucket_elems
                ),
            ));
            if l.strategy.name() == "zero3" {
                v.push((
                    "prefetch",
                    format!(
                        "\"stage3_prefetch_bucket_size\": {}",
                        spec.constants.zero3_prefetch_elems
                    ),
                ));
                v.push((
                    "persistence",
                    format!(
                        "\"stage3_param_persistence_threshold\": {}",
                        spec.constants.zero3_persistence_elems
                    ),
                ));
                v.push((
                    "sub-group",
                    format!(
                        "\"sub_group_size\": {}",
                        spec.constants.zero3_sub_group_elems
                    ),
                ));
            }
            if l.offload == Offload::Optimizer {
                v.push(("offload", "\"offload_optimizer\"".into()));
                v.push(("pinned", "\"pin_memory\": true".into()));
            }
            v.push(("precision", "\"bf16\"".into()));
        }
        _ => {}
    }
    match kind {
        EmitKind::Trainer => {
            v.push((
                "micro-batch",
                format!("\"per_device_train_batch_size\": {}", w.batch),
            ));
            v.push((
                "accumulation",
                format!("\"gradient_accumulation_steps\": {}", w.grad_accum),
            ));
            v.push(("model dtype", "\"dtype\": \"bfloat16\"".into()));
            v.push(("attention", "\"attn_implementation\": \"sdpa\"".into()));
            v.push((
                "checkpointing",
                format!("\"activation_checkpointing\": {}", w.checkpointing),
            ));
            if let Some(lora) = &w.lora {
                v.push(("lora rank", format!("\"r\": {}", lora.rank)));
                for t in &lora.targets {
                    v.push(("lora target", format!("\"{t}\"")));
                }
                v.push(("lora dropout", "\"lora_dropout\": 0.0".into()));
                if lora.qlora {
                    v.push(("nf4", "\"bnb_4bit_quant_type\": \"nf4\"".into()));
                    v.push(("double quant", "\"bnb_4bit_use_double_quant\": true".into()));
                }
            }
        }
        EmitKind::Accelerate => {
            v.push(("processes", format!("num_processes: {}", l.gpus)));
            v.push(("machines", format!("num_machines: {}", spec.num_nodes())));
            if l.strategy.is_fsdp() {
                v.push(("fsdp2", "fsdp_version: 2".into()));
                v.push(("reshard", "fsdp_reshard_after_forward: true".into()));
                v.push((
                    "wrap",
                    "fsdp_transformer_layer_cls_to_wrap: \"LlamaDecoderLayer\"".into(),
                ));
                v.push((
                    "checkpointing",
                    format!("fsdp_activation_checkpointing: {}", w.checkpointing),
                ));
                v.push((
                    "offload",
                    format!("fsdp_offload_params: {}", l.offload != Offload::None),
                ));
            }
        }
        EmitKind::Torchrun => {
            v.push(("nodes", format!("--nnodes {}", spec.num_nodes())));
            v.push((
                "procs",
                format!("--nproc-per-node {}", spec.procs_per_node()),
            ));
        }
        EmitKind::Megatron => {
            for (flag, val) in [
                ("--tensor-model-parallel-size", l.tp),
                ("--pipeline-model-parallel-size", l.pp),
                ("--num-virtual-stages-per-pipeline-rank", l.virtual_stages),
                ("--context-parallel-size", l.cp),
                ("--expert-model-parallel-size", l.ep),
                ("--micro-batch-size", w.batch),
                ("--global-batch-size", spec.global_batch()),
                ("--seq-length", w.seq),
            ] {
                v.push(("megatron", format!("{flag} {val}")));
            }
            v.push(("sp", "--sequence-parallel\n".into()));
            v.push((
                "distributed optimizer",
                "--use-distributed-optimizer\n".into(),
            ));
            v.push(("recompute", "--recompute-granularity full\n".into()));
            v.push(("precision", "--bf16\n".into()));
        }
        EmitKind::Torchtitan => {
            // under PP the local batch is `grad_accum` pipeline microbatches of `batch`
            let pp = l.pp.max(1);
            let local = if pp > 1 {
                w.batch * w.grad_accum
            } else {
                w.batch
            };
            v.push((
                "local batch",
                format!("--training.local-batch-size {local}"),
            ));
            if pp > 1 {
                v.push((
                    "pipeline",
                    format!("--parallelism.pipeline-parallel-degree {pp}"),
                ));
                v.push((
                    "microbatch",
                    format!(
                        "--parallelism.pipeline-parallel-microbatch-size {}",
                        w.batch
                    ),
                ));
            }
            v.push((
                "global batch",
                format!("--training.global-batch-size {}", spec.global_batch()),
            ));
            v.push(("seq", format!("--training.seq-len {}", w.seq)));
            v.push((
                "shard",
                format!(
                    "--parallelism.data-parallel-shard-degree {}",
                    l.gpus / l.tp / l.pp.max(1)
                ),
            ));
            v.push((
                "tensor parallel",
                format!("--parallelism.tensor-parallel-degree {}", l.tp),
            ));
            if spec.runtime == Runtime::Torchtitan {
                // the torchtitan profile: torchtitan's own reshard default, its optimizer
                // implementation, and what the estimate does not model turned off
                v.push((
                    "reshard",
                    "--parallelism.fsdp-reshard-after-forward default".into(),
                ));
                v.push((
                    "optimizer",
                    format!(
                        "--optimizer.implementation {}",
                        if w.optimizer == Optimizer::AdamwFused {
                            "fused"
                        } else {
                            "foreach"
                        }
                    ),
                ));
                v.push(("cuda graphs", "--training.disable-cuda-graphs".into()));
            } else {
                v.push((
                    "reshard",
                    "--parallelism.fsdp-reshard-after-forward always".into(),
                ));
            }
            if l.tp > 1 {
                v.push((
                    "sequence parallel",
                    "--parallelism.enable-sequence-parallel".into(),
                ));
            }
            v.push((
                "checkpointing",
                match w.step_options.checkpointing_policy {
                    CheckpointPolicy::SelectiveOp => "activation-checkpoint:selective",
                    _ => "activation-checkpoint:full",
                }
                .into(),
            ));
        }
        _ => {}
    }
    v
}

#[test]
fn every_value_the_estimate_used_appears_in_the_emitted_files() {
    for seed in seeds::train_seeds() {
        let spec = seeds::launch_spec(&seed, ESTIMATE).unwrap();
        for kind in seed.kinds {
            let text = all_files(&emit(*kind, &spec).unwrap());
            for (what, token) in estimate_values(*kind, &spec) {
                assert!(
                    text.contains(&token),
                    "{} {}: {what} `{token}` missing:\n{text}",
                    seed.id,
                    kind.name()
                );
            }
        }
    }
    for seed in seeds::serve_seeds() {
        let text =
            all_files(&emit_serve(EmitKind::Vllm, &seeds::serve_spec(&seed, ESTIMATE)).unwrap());
        let c = &seed.config;
        for token in [
            format!("--tensor-parallel-size {}", c.tp),
            format!("--gpu-memory-utilization {}", c.gpu_memory_utilization),
            format!("--max-model-len {}", c.max_model_len),
            format!("--block-size {}", c.block_size),
            format!("--max-num-batched-tokens {}", c.max_num_batched_tokens),
            format!("--max-num-seqs {}", seed.max_num_seqs),
            "--kv-cache-dtype auto".to_string(),
            format!("tensor-parallel-size: {}", c.tp),
            format!("max-model-len: {}", c.max_model_len),
        ] {
            assert!(text.contains(&token), "vllm: `{token}` missing:\n{text}");
        }
    }
}

/// The emitted files without the two header lines that quote the command and its estimate
/// (the seed's are placeholders).
fn without_provenance(text: &str) -> String {
    text.lines()
        .filter(|l| {
            let l = l.trim_start_matches(['#', '/', ' ']);
            !(l.starts_with("command:") || l.starts_with("estimate:"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each seed's `command` is a real memwall command: run with `--emit KIND` it writes the same
/// files as the seed's spec (so `tools/emit_check/REPORT.md` checks what a user's command writes).
#[test]
fn every_seed_command_writes_the_seed_files() {
    let run = |command: &str, kind: EmitKind| -> String {
        // the command line separates the printed files by an empty line
        seeds::run_with_emit(command, kind)
            .unwrap()
            .replace("\n\n==> ", "\n==> ")
    };
    for seed in seeds::train_seeds() {
        let spec = seeds::launch_spec(&seed, ESTIMATE).unwrap();
        for kind in seed.kinds {
            let want = without_provenance(&all_files(&emit(*kind, &spec).unwrap()));
            let got = without_provenance(&run(seed.command, *kind));
            assert_eq!(got, want, "{} {}", seed.id, kind.name());
        }
    }
    for seed in seeds::serve_seeds() {
        let want = without_provenance(&all_files(
            &emit_serve(EmitKind::Vllm, &seeds::serve_spec(&seed, ESTIMATE)).unwrap(),
        ));
        let got = without_provenance(&run(seed.command, EmitKind::Vllm));
        assert_eq!(got, want, "{} vllm", seed.id);
    }
}

/// A `--runtime torchtitan` estimate is of torchtitan's own step: only `--emit torchtitan`
/// launches it; every other engine refuses by name instead of writing a transformers or
/// Megatron-LM launch for a step it does not run.
#[test]
fn a_torchtitan_estimate_is_launched_by_torchtitan_only() {
    let seed = seeds::train_seeds()
        .into_iter()
        .find(|s| s.runtime == Runtime::Torchtitan)
        .expect("a torchtitan seed");
    let spec = seeds::launch_spec(&seed, ESTIMATE).unwrap();
    assert!(emit(EmitKind::Torchtitan, &spec).is_ok());
    for kind in [
        EmitKind::Deepspeed,
        EmitKind::Accelerate,
        EmitKind::Trainer,
        EmitKind::Torchrun,
        EmitKind::Megatron,
    ] {
        let e = emit(kind, &spec).unwrap_err().to_string();
        assert!(
            e.contains("torchtitan's own training step"),
            "{}: {e}",
            kind.name()
        );
    }
}
