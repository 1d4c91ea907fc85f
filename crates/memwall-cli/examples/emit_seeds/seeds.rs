//! The seed configurations every emitter is snapshot-tested and engine-checked on: the
//! issue's 70B-on-8×A100 ZeRO-3 plan, the same model under FSDP2 full shard, a single-GPU QLoRA
//! of Llama-3.1-8B, a Megatron-LM tp8 × pp2 layout, torchtitan's own Llama 3 step
//! (`--runtime torchtitan`, FSDP2 × TP/SP, op-level selective AC) and its Qwen 3 14B under
//! pipeline parallelism (pp 2, Interleaved1F1B, FullAC), and a vLLM tp4 deployment.
//! Shared by `examples/emit_seeds` (what `tools/emit_check` validates) and `tests/emit.rs`.

use memwall_core::emit::{EmitKind, LaunchSpec, Provenance, ServeLaunchSpec, VllmKvCacheDtype};
use memwall_core::layout::{Layout, Offload, Schedule, Strategy};
use memwall_core::memory::titan::Runtime;
use memwall_core::optimizer::Optimizer;
use memwall_core::serve::ServeConfig;
use memwall_core::workload::{CheckpointPolicy, Lora, StepOptions, TrainWorkload};
use memwall_core::{ModelDesc, Precision};

/// A training seed.
pub struct TrainSeed {
    /// Directory name of its files.
    pub id: &'static str,
    /// Catalogue id.
    pub model: &'static str,
    /// The step.
    pub workload: TrainWorkload,
    /// The layout (`None` = one GPU).
    pub layout: Option<Layout>,
    /// The memwall command that estimates it (`tests/emit.rs` runs it with `--emit KIND` and
    /// checks it writes the files this seed's spec writes).
    pub command: &'static str,
    /// The kinds that can launch it.
    pub kinds: &'static [EmitKind],
    /// Whose training code the estimate simulates (`--runtime`).
    pub runtime: Runtime,
}

/// A serving seed.
pub struct ServeSeed {
    /// Directory name of its files.
    pub id: &'static str,
    /// Hugging Face repository.
    pub repo: &'static str,
    /// The deployment.
    pub config: ServeConfig,
    /// `--max-num-seqs`.
    pub max_num_seqs: u64,
    /// The memwall command that estimates it.
    pub command: &'static str,
}

fn node8(gpus: u64, strategy: Strategy) -> Layout {
    Layout {
        gpus,
        gpus_per_node: 8,
        strategy,
        ..Layout::single()
    }
}

/// The training seeds.
pub fn train_seeds() -> Vec<TrainSeed> {
    let ckpt = |batch, seq, grad_accum| TrainWorkload {
        checkpointing: true,
        grad_accum,
        ..TrainWorkload::new(batch, seq)
    };
    vec![
        TrainSeed {
            id: "llama-3.1-70b-zero3-offload",
            model: "llama-3.1-70b",
            workload: ckpt(1, 4096, 8),
            layout: Some(Layout {
                offload: Offload::Optimizer,
                ..node8(8, Strategy::Zero3)
            }),
            command: "memwall train --model llama-3.1-70b --gpu a100-80gb-sxm --gpus 8 --strategy zero3 --offload optimizer --checkpointing --batch 1 --seq 4096 --grad-accum 8",
            kinds: &[EmitKind::Deepspeed, EmitKind::Accelerate, EmitKind::Trainer, EmitKind::Torchrun],
            runtime: Runtime::Hf,
        },
        TrainSeed {
            id: "llama-3.1-70b-fsdp2",
            model: "llama-3.1-70b",
            workload: ckpt(1, 4096, 8),
            layout: Some(node8(8, Strategy::FsdpFull)),
            command: "memwall train --model llama-3.1-70b --gpu a100-80gb-sxm --gpus 8 --strategy fsdp-full --checkpointing --batch 1 --seq 4096 --grad-accum 8",
            kinds: &[EmitKind::Accelerate, EmitKind::Trainer, EmitKind::Torchtitan, EmitKind::Torchrun],
            runtime: Runtime::Hf,
        },
        TrainSeed {
            id: "llama-3.1-8b-qlora",
            model: "llama-3.1-8b",
            workload: TrainWorkload {
                lora: Some(Lora {
                    rank: 16,
                    targets: ["q_proj", "k_proj", "v_proj", "o_proj"].map(String::from).to_vec(),
                    qlora: true,
                }),
                ..ckpt(4, 2048, 4)
            },
            layout: None,
            command: "memwall train --model llama-3.1-8b --gpu a100-80gb-sxm --qlora --lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj --checkpointing --batch 4 --seq 2048 --grad-accum 4",
            kinds: &[EmitKind::Trainer, EmitKind::Accelerate, EmitKind::Torchrun],
            runtime: Runtime::Hf,
        },
        TrainSeed {
            id: "llama-3.1-70b-megatron-tp8-pp2",
            model: "llama-3.1-70b",
            workload: ckpt(1, 8192, 16),
            layout: Some(Layout {
                tp: 8,
                sequence_parallel: true,
                pp: 2,
                schedule: Schedule::Interleaved,
                virtual_stages: 2,
                ..node8(16, Strategy::Zero1)
            }),
            command: "memwall train --model llama-3.1-70b --gpu h100-sxm --gpus 16 --gpus-per-node 8 --tp 8 --sequence-parallel --pp 2 --schedule interleaved --virtual-stages 2 --strategy zero1 --checkpointing --batch 1 --seq 8192 --grad-accum 16",
            kinds: &[EmitKind::Megatron, EmitKind::Torchrun],
            runtime: Runtime::Hf,
        },
        TrainSeed {
            id: "llama-3.1-8b-titan-fsdp4-tp2",
            model: "llama-3.1-8b",
            workload: TrainWorkload {
                optimizer: Optimizer::AdamwFused,
                precision: Precision::AmpBf16,
                step_options: StepOptions {
                    checkpointing_policy: CheckpointPolicy::SelectiveOp,
                    ..StepOptions::default()
                },
                ..ckpt(2, 8192, 1)
            },
            layout: Some(Layout {
                tp: 2,
                sequence_parallel: true,
                ..node8(8, Strategy::FsdpFull)
            }),
            command: "memwall train --model llama-3.1-8b --runtime torchtitan --gpu h100-sxm --gpus 8 --strategy fsdp-full --tp 2 --sequence-parallel --checkpointing-policy selective-op --precision amp-bf16 --optimizer adamw-fused --batch 2 --seq 8192",
            kinds: &[EmitKind::Torchtitan],
            runtime: Runtime::Torchtitan,
        },
        TrainSeed {
            id: "qwen3-14b-titan-pp2-interleaved",
            model: "qwen3-14b",
            workload: TrainWorkload {
                optimizer: Optimizer::AdamwFused,
                precision: Precision::AmpBf16,
                step_options: StepOptions {
                    checkpointing_policy: CheckpointPolicy::Full,
                    ..StepOptions::default()
                },
                ..ckpt(1, 4096, 8)
            },
            layout: Some(Layout {
                pp: 2,
                schedule: Schedule::Interleaved,
                virtual_stages: 2,
                ..node8(8, Strategy::FsdpFull)
            }),
            command: "memwall train --model qwen3-14b --runtime torchtitan --gpu h100-sxm --gpus 8 --strategy fsdp-full --pp 2 --schedule interleaved --virtual-stages 2 --checkpointing-policy full --precision amp-bf16 --optimizer adamw-fused --batch 1 --seq 4096 --grad-accum 8",
            kinds: &[EmitKind::Torchtitan],
            runtime: Runtime::Torchtitan,
        },
    ]
}

/// The serving seeds.
pub fn serve_seeds() -> Vec<ServeSeed> {
    vec![ServeSeed {
        id: "llama-3.1-70b-vllm-tp4",
        repo: "meta-llama/Llama-3.1-70B",
        config: ServeConfig {
            gpu_memory_bytes: 85_045_870_592,
            tp: 4,
            gpu_memory_utilization: 0.92,
            kv_dtype_bytes: 2,
            block_size: 16,
            max_model_len: 131_072,
            max_num_batched_tokens: 8192,
            kv_cache_memory_bytes: None,
            weights_bytes_per_rank: 0,
            non_torch_bytes: 0,
            activation_peak_bytes: 0,
            cuda_graph_bytes: 0,
            enable_prefix_caching: None,
            flashinfer_gdn_prefill: false,
        },
        max_num_seqs: 1024,
        command: "memwall serve --model llama-3.1-70b --gpu h100-sxm --tp 4",
    }]
}

/// The catalogue model and its Hugging Face repository.
pub fn model(id: &str) -> anyhow::Result<(ModelDesc, &'static str)> {
    let e = memwall_catalog::find(id).ok_or_else(|| anyhow::anyhow!("{id} is not catalogued"))?;
    Ok((e.model()?, e.hf_repo))
}

/// The launch spec of a training seed, with `estimate` in its header.
pub fn launch_spec(seed: &TrainSeed, estimate: &str) -> anyhow::Result<LaunchSpec> {
    let (m, repo) = model(seed.model)?;
    let spec = match (seed.runtime, &seed.layout) {
        (Runtime::Torchtitan, Some(l)) => LaunchSpec::from_train_titan(&m, &seed.workload, l)?,
        _ => LaunchSpec::from_train(&m, &seed.workload, seed.layout.as_ref())?,
    };
    Ok(spec.with_model_id(repo).with_provenance(Provenance {
        command: seed.command.to_string(),
        estimate: estimate.to_string(),
    }))
}

/// The launch spec of a serving seed.
pub fn serve_spec(seed: &ServeSeed, estimate: &str) -> ServeLaunchSpec {
    ServeLaunchSpec::from_serve(
        seed.repo,
        &seed.config,
        VllmKvCacheDtype::Auto,
        seed.max_num_seqs,
        false,
    )
    .with_provenance(Provenance {
        command: seed.command.to_string(),
        estimate: estimate.to_string(),
    })
}

/// What `command` (a seed's `memwall …` line) prints with `--emit kind`: its files, one after
/// the other under `==> name <==` lines, the way a user runs it.
pub fn run_with_emit(command: &str, kind: EmitKind) -> anyhow::Result<String> {
    let argv: Vec<&str> = command
        .strip_prefix("memwall ")
        .ok_or_else(|| anyhow::anyhow!("a seed command starts with `memwall `: {command}"))?
        .split_whitespace()
        .chain(["--emit", kind.name()])
        .collect();
    let mut out = Vec::new();
    memwall_cli::run_args(argv, &mut out).map_err(|e| {
        anyhow::anyhow!(
            "`{command} --emit {}` failed: {}",
            kind.name(),
            e.join("\n")
        )
    })?;
    Ok(String::from_utf8(out)?)
}
