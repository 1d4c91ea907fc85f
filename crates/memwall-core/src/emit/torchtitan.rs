//! torchtitan: `torchrun … -m torchtitan.train --module M --config C` with CLI overrides.
//!
//! torchtitan 0.3.0 dropped TOML job files: a job is a `config_registry` function
//! (`torchtitan/models/<module>/config_registry.py`) overridden by `--section.key value` flags
//! parsed by tyro (`torchtitan/config/manager.py` `ConfigManager.parse_args`). Keys:
//! `torchtitan/config/configs.py` (`TrainingConfig`: `local_batch_size`, `global_batch_size`,
//! `seq_len`, `dtype`, `mixed_precision_param`, `mixed_precision_reduce`,
//! `enable_cpu_offload`; `ParallelismConfig`: the degrees and `fsdp_reshard_after_forward`),
//! `components/optimizer/optimizer.py` (`implementation`), and the `activation-checkpoint:*`
//! subcommands of `distributed/activation_checkpoint.py` (`FullAC`, `SelectiveAC`, none).
//!
//! torchtitan builds its own model (not transformers'), so only the FSDP2 layouts memwall
//! simulates are emitted (with `--runtime torchtitan` also its tensor + sequence
//! parallelism: `--parallelism.tensor-parallel-degree`), for the model sizes torchtitan ships a
//! config for.

use super::{hash_comment, header_lines, shell, EmitError, EmittedFile, LaunchSpec};
use crate::layout::{Offload, Strategy};
use crate::memory::titan::{ReshardPolicy, Runtime};
use crate::workload::{CheckpointPolicy, Optimizer, Precision};

const KIND: &str = "torchtitan";

/// One model torchtitan 0.3.0 ships a job config for: its `config_registry` function
/// (`--module M --config C`) and the shapes of the flavour that function builds
/// (`models/llama3/__init__.py`, `models/qwen3/__init__.py` `qwen3_configs`). torchtitan's model
/// arguments are not CLI flags (`Trainer.Config.model_spec` is suppressed from tyro's parsing,
/// trainer.py), so a config whose shapes differ from every flavour cannot be launched without
/// writing a Python config function: the emitter refuses it instead of naming a wrong flavour.
struct Flavour {
    model_type: &'static str,
    module: &'static str,
    config: &'static str,
    hidden: u64,
    layers: u64,
    /// `(n_heads, n_kv_heads, head_dim)`.
    attention: (u64, u64, u64),
    /// The dense feed-forward's `hidden_dim`.
    ffn: Option<u64>,
    /// `(experts, top_k, expert hidden_dim)`.
    moe: Option<(u64, u64, u64)>,
    vocab: u64,
    tied: bool,
}

/// A dense flavour: `(model_type, module, config)`, `(hidden, layers)`, the attention, the
/// feed-forward width, the vocabulary and whether embeddings are tied.
const fn dense(
    (model_type, module, config): (&'static str, &'static str, &'static str),
    (hidden, layers): (u64, u64),
    attention: (u64, u64, u64),
    ffn: u64,
    vocab: u64,
    tied: bool,
) -> Flavour {
    Flavour {
        model_type,
        module,
        config,
        hidden,
        layers,
        attention,
        ffn: Some(ffn),
        moe: None,
        vocab,
        tied,
    }
}

/// The shipped configs of torchtitan 0.3.0 (`models/llama3/config_registry.py` `llama3_8b`,
/// `llama3_70b`, `llama3_405b`; `models/qwen3/config_registry.py` `qwen3_0_6b`, `qwen3_1_7b`,
/// `qwen3_14b`, `qwen3_32b`, `qwen3_30b_a3b`; Qwen 3 8B and 4B have model flavours but no plain
/// training config there, only `qwen3_8b_first_85_pct_layers_nvfp4` and `sft_qwen3_8b_math`).
const CONFIGS: &[Flavour] = &[
    dense(
        ("llama", "llama3", "llama3_8b"),
        (4096, 32),
        (32, 8, 128),
        14336,
        128256,
        false,
    ),
    dense(
        ("llama", "llama3", "llama3_70b"),
        (8192, 80),
        (64, 8, 128),
        28672,
        128256,
        false,
    ),
    dense(
        ("llama", "llama3", "llama3_405b"),
        (16384, 126),
        (128, 8, 128),
        53248,
        128256,
        false,
    ),
    dense(
        ("qwen3", "qwen3", "qwen3_0_6b"),
        (1024, 28),
        (16, 8, 128),
        3072,
        151936,
        true,
    ),
    dense(
        ("qwen3", "qwen3", "qwen3_1_7b"),
        (2048, 28),
        (16, 8, 128),
        6144,
        151936,
        true,
    ),
    dense(
        ("qwen3", "qwen3", "qwen3_14b"),
        (5120, 40),
        (40, 8, 128),
        17408,
        151936,
        false,
    ),
    dense(
        ("qwen3", "qwen3", "qwen3_32b"),
        (5120, 64),
        (64, 8, 128),
        25600,
        151936,
        false,
    ),
    Flavour {
        model_type: "qwen3_moe",
        module: "qwen3",
        config: "qwen3_30b_a3b",
        hidden: 2048,
        layers: 48,
        attention: (32, 4, 128),
        ffn: None,
        moe: Some((128, 8, 768)),
        vocab: 151936,
        tied: false,
    },
];

impl Flavour {
    fn matches(&self, s: &super::ModelShape) -> bool {
        self.model_type == s.model_type
            && self.hidden == s.hidden_size
            && self.layers == s.num_layers
            && Some(self.attention) == s.attention
            && self.ffn == s.ffn_hidden_size
            && self.moe == s.moe.map(|(e, k, f, _)| (e, k, f))
            && s.moe.is_none_or(|(_, _, _, shared)| shared.is_none())
            && !s.mixed_moe
            && self.vocab == s.vocab_size
            && self.tied == s.tied_embeddings
    }
}

type Args = Vec<(String, Option<String>)>;

fn push(a: &mut Args, flag: &str, value: impl ToString) {
    a.push((flag.to_string(), Some(value.to_string())));
}

/// `(module, config, overrides, activation-checkpoint subcommand)`.
pub(super) fn args(
    spec: &LaunchSpec,
) -> Result<(&'static str, &'static str, Args, &'static str), EmitError> {
    let l = &spec.layout;
    let w = &spec.workload;
    let s = &spec.shape;
    let titan = spec.runtime == Runtime::Torchtitan;
    // torchtitan's own tensor + sequence parallelism is simulated by `memory/titan` (cp is
    // refused there, and pp or tp with ep); under the hf profile a model-parallel layout is
    // Megatron-LM's
    let titan_tp = titan && l.tp > 1 && l.cp == 1 && l.ep == 1;
    // and its pipeline parallelism (`memory/titan/pipeline.rs`: FSDP2, with or without TP)
    let titan_pp = titan && l.pp > 1 && l.cp == 1 && l.ep == 1;
    if !spec.strategy().is_fsdp() || (spec.is_megatron() && !titan_tp && !titan_pp) {
        return Err(EmitError::unsupported(
            KIND,
            format!(
                "memwall estimated this configuration with {}; torchtitan is emitted for FSDP2 layouts (fsdp-full, fsdp-grad-op, hsdp)",
                if spec.is_megatron() { "Megatron-LM" } else { spec.strategy().name() }
            ),
            if spec.is_megatron() { "use --emit megatron" } else { "use --emit deepspeed, accelerate or trainer, or plan with --strategy fsdp-full" },
        ));
    }
    if w.lora.is_some() {
        return Err(EmitError::unsupported(
            KIND,
            "torchtitan has no LoRA/QLoRA trainer",
            "use --emit accelerate or trainer",
        ));
    }
    if s.model_type == "deepseek_v3" {
        // models/deepseek_v3/config_registry.py ships `deepseek_v3_16b` and `deepseek_v3_671b`
        // with expert parallelism (`expert_parallel_degree` 8 and 2), SelectiveAC and a
        // compiled loss; the hint's two overrides were parsed with torchtitan 0.3.0's
        // `ConfigManager.parse_args` (EP 1, compile off, flavour 671B), but a whole launch was
        // not, so none is written
        return Err(EmitError::unsupported(
            KIND,
            "torchtitan 0.3.0's deepseek_v3 configs (deepseek_v3_16b, deepseek_v3_671b) run expert \
             parallelism, SelectiveAC and a compiled loss; a launch overriding them to the FSDP2 \
             step memwall simulates is not written (not checked against torchtitan's parser)",
            "launch `--module deepseek_v3 --config deepseek_v3_671b` with \
             --parallelism.expert-parallel-degree 1 and --compile.no-enable yourself, or use --emit \
             accelerate or trainer",
        ));
    }
    let Some(&Flavour { module, config, .. }) = CONFIGS.iter().find(|f| f.matches(s)) else {
        return Err(EmitError::unsupported(
            KIND,
            format!(
                "torchtitan 0.3.0 ships no config for this model_type `{}` (hidden {} × {} layers): \
                 its model arguments are fixed per flavour in Python (models/<module>/__init__.py) \
                 and cannot be set from the command line, so a custom config needs its own \
                 config_registry function",
                s.model_type, s.hidden_size, s.num_layers
            ),
            "use --emit accelerate or trainer (they load the transformers model), or write a \
             torchtitan config function for these shapes",
        ));
    };
    // training.dtype = the weights' dtype; mixed precision via fully_shard's MixedPrecisionPolicy
    let (dtype, param) = match w.precision {
        Precision::Bf16 => ("bfloat16", "bfloat16"),
        Precision::AmpBf16 => ("float32", "bfloat16"),
        Precision::Fp32 => ("float32", "float32"),
        Precision::Fp16 | Precision::AmpFp16 => {
            return Err(EmitError::unsupported(
                KIND,
                "torchtitan trains in bfloat16 or float32 only",
                "plan with --precision bf16 or amp-bf16",
            ))
        }
    };
    let implementation = match w.optimizer {
        Optimizer::Adamw => "foreach",
        Optimizer::AdamwFused => "fused",
        Optimizer::AdamwForloop => "for-loop",
        _ => {
            return Err(EmitError::unsupported(
                KIND,
                "torchtitan's optimizers are Adam/AdamW (and Muon)",
                "plan with --optimizer adamw, adamw-fused or adamw-forloop",
            ))
        }
    };
    let mut a: Args = Vec::new();
    push(
        &mut a,
        "--hf-assets-path",
        format!(
            "./assets/hf/{}",
            spec.model_id.rsplit('/').next().unwrap_or(&spec.model_id)
        ),
    );
    // under PP the local batch is split into `grad_accum` pipeline microbatches of `batch`
    // (`pipeline_parallel_microbatch_size`, written below)
    push(
        &mut a,
        "--training.local-batch-size",
        if titan_pp {
            w.batch.saturating_mul(w.grad_accum)
        } else {
            w.batch
        },
    );
    push(&mut a, "--training.global-batch-size", spec.global_batch());
    push(&mut a, "--training.seq-len", w.seq);
    push(&mut a, "--training.dtype", dtype);
    push(&mut a, "--training.mixed-precision-param", param);
    push(&mut a, "--training.mixed-precision-reduce", "float32");
    a.push((
        if l.offload != Offload::None {
            "--training.enable-cpu-offload"
        } else {
            "--training.no-enable-cpu-offload"
        }
        .to_string(),
        None,
    ));
    if titan {
        // memory/titan simulates the eager step with gradients freed between steps (measured
        // so); torchtitan 0.3.0's default `training.disable_cuda_graphs = false` captures the
        // forward + backward in a CUDA graph and zeroes gradients in place
        // (`zero_grad(set_to_none=disable_cuda_graphs)`, trainer.py), which it does not simulate
        a.push(("--training.disable-cuda-graphs".to_string(), None));
    }
    let (replicate, shard) = match spec.strategy() {
        Strategy::Hsdp => (l.gpus / l.shard_group().max(1), l.shard_group()),
        _ => (1, l.gpus / l.tp.max(1) / if titan_pp { l.pp } else { 1 }),
    };
    push(
        &mut a,
        "--parallelism.data-parallel-replicate-degree",
        replicate,
    );
    push(&mut a, "--parallelism.data-parallel-shard-degree", shard);
    // the hf profile's FSDP2 reshards the root after forward too ("always"); the torchtitan
    // profile simulates torchtitan's own "default" policy (memory/titan)
    push(
        &mut a,
        "--parallelism.fsdp-reshard-after-forward",
        if titan {
            ReshardPolicy::for_strategy(spec.strategy()).name()
        } else if spec.strategy() == Strategy::FsdpGradOp {
            "never"
        } else {
            "always"
        },
    );
    // memory/titan's TP: sequence parallelism on (torchtitan's default, written out), loss
    // parallel (automatic with TP under the default `spmd_backend`), async TP off (it needs
    // torch.compile)
    push(
        &mut a,
        "--parallelism.tensor-parallel-degree",
        if titan_tp { l.tp } else { 1 },
    );
    if titan_tp {
        a.push(("--parallelism.enable-sequence-parallel".to_string(), None));
        a.push((
            "--compile.no-enable-async-tensor-parallel".to_string(),
            None,
        ));
    }
    if titan_pp {
        // config/configs.py `ParallelismConfig`: the schedule by torch's class name
        // (`get_schedule_class`), torchtitan's default stage split and stages per rank (2 for
        // looped schedules: `pipeline_parallel_layers_per_stage` left unset)
        push(&mut a, "--parallelism.pipeline-parallel-degree", l.pp);
        push(
            &mut a,
            "--parallelism.pipeline-parallel-schedule",
            match l.schedule {
                crate::layout::Schedule::OneFOneB => "1F1B",
                crate::layout::Schedule::Gpipe => "GPipe",
                crate::layout::Schedule::Interleaved => "Interleaved1F1B",
            },
        );
        push(
            &mut a,
            "--parallelism.pipeline-parallel-microbatch-size",
            w.batch,
        );
    } else {
        push(&mut a, "--parallelism.pipeline-parallel-degree", 1);
    }
    push(&mut a, "--parallelism.context-parallel-degree", 1);
    // memory/titan's EP (`check_ep`: MoE models, no TP or PP), carved out of dp_shard; the
    // registry configs' `moe_comm_backend` default "standard" is the measured
    // `AllToAllTokenDispatcher` (models/common/config_utils.py)
    push(
        &mut a,
        "--parallelism.expert-parallel-degree",
        if titan { l.ep.max(1) } else { 1 },
    );
    push(&mut a, "--optimizer.implementation", implementation);
    let ac = match (w.checkpointing, w.step_options.checkpointing_policy) {
        (false, _) => "activation-checkpoint:none",
        (true, CheckpointPolicy::Full) => "activation-checkpoint:full",
        (true, CheckpointPolicy::SelectiveOp) => "activation-checkpoint:selective",
        (true, p) => {
            return Err(EmitError::unsupported(
                KIND,
                format!(
                    "torchtitan 0.3.0's activation checkpointing is none, full, selective (op-level) or memory-budget (distributed/activation_checkpoint.py); it has no `{p}` policy"
                ),
                "plan with --checkpointing-policy full or selective-op",
            ))
        }
    };
    Ok((module, config, a, ac))
}

pub(super) fn emit(spec: &LaunchSpec) -> Result<Vec<EmittedFile>, EmitError> {
    let (module, config, a, ac) = args(spec)?;
    let mut lines = header_lines(
        &spec.provenance,
        "torchtitan 0.3.0 (config_registry + CLI overrides; torchtitan/config/configs.py)",
    );
    lines.push(String::new());
    if spec.runtime == Runtime::Torchtitan {
        lines.push(format!(
            "memwall's estimate is of torchtitan's own {module} step (--runtime torchtitan) with its"
        ));
        lines.push(
            "CrossEntropyLoss; the registry config's default loss (ChunkedLossWrapper) needs less."
                .to_string(),
        );
        if spec.layout.ep > 1 {
            lines.push(format!(
                "Expert parallelism {}: the estimate assumes balanced routing (every rank receives as many routed tokens as it sends); uneven routing holds more.",
                spec.layout.ep
            ));
        }
        lines.push("Download the HF assets to --hf-assets-path.".to_string());
    } else {
        lines.push(
            "torchtitan runs its own model implementation, not transformers': memwall's estimate is of"
                .to_string(),
        );
        lines.push("the transformers model under the same FSDP2 layout (--runtime torchtitan simulates torchtitan's own). Download the HF assets to --hf-assets-path.".to_string());
    }
    let mut sh = String::from("#!/usr/bin/env bash\n");
    sh.push_str(&hash_comment(&lines));
    sh.push_str("set -euo pipefail\n");
    sh.push_str(&shell::array("TORCHTITAN_ARGS", &a));
    sh.push_str(&format!(
        "exec {} -m torchtitan.train --module {module} --config {config} \"${{TORCHTITAN_ARGS[@]}}\" \"$@\" {ac}\n",
        super::torchrun::command(spec)
    ));
    Ok(vec![EmittedFile::new("launch_torchtitan.sh", sh)])
}
