//! Megatron-LM: `pretrain_gpt.py` arguments and the `torchrun` line that runs them.
//!
//! Arguments: Megatron-LM `megatron/training/arguments.py` (megatron-core 0.19.2, whose wheel
//! ships `megatron.training`; most flags are generated from the config dataclasses —
//! `TransformerConfig`, `ModelParallelConfig` in `megatron/core/model_parallel_config.py`,
//! `DistributedDataParallelConfig`, `OptimizerConfig`, `TrainingConfig`). The memory model
//! they must match is `memory/megatron.rs`: `--use-distributed-optimizer` for `zero1`,
//! full recomputation of every layer for `--checkpointing`, the 1F1B or interleaved schedule,
//! flash/fused attention without the s² terms unless `--attention eager`.

use super::{hash_comment, header_lines, shell, EmitError, EmittedFile, LaunchSpec};
use crate::layout::{Schedule, Strategy};
use crate::model::Activation;
use crate::workload::{AttentionImpl, Optimizer, Precision};

const KIND: &str = "megatron";

type Args = Vec<(String, Option<String>)>;

fn push(a: &mut Args, flag: &str, value: impl ToString) {
    a.push((flag.to_string(), Some(value.to_string())));
}

fn switch(a: &mut Args, flag: &str) {
    a.push((flag.to_string(), None));
}

/// A float as Megatron's argparse reads it (`0.1`, `0`).
fn float(x: f64) -> String {
    format!("{x}")
}

/// The `pretrain_gpt.py` arguments of `spec`, or why Megatron-LM cannot run it as estimated.
pub(super) fn args(spec: &LaunchSpec) -> Result<Args, EmitError> {
    if !spec.is_megatron() {
        return Err(EmitError::unsupported(
            KIND,
            format!(
                "this configuration (strategy `{}`, no tensor/pipeline/context/expert parallelism) was estimated as a transformers model under {}, not Megatron-LM's layers",
                spec.strategy().name(),
                if spec.strategy().is_fsdp() { "FSDP2" } else if spec.strategy() == Strategy::Ddp { "PyTorch DDP" } else { "DeepSpeed ZeRO" }
            ),
            if spec.strategy().is_fsdp() {
                "use --emit accelerate, trainer or torchtitan for FSDP2, or plan with --tp/--pp for Megatron-LM"
            } else {
                "use --emit deepspeed, accelerate or trainer, or plan with --tp/--pp for Megatron-LM"
            },
        ));
    }
    let s = &spec.shape;
    let w = &spec.workload;
    let l = &spec.layout;
    let refuse = |reason: String, hint: &str| Err(EmitError::unsupported(KIND, reason, hint));
    let Some((heads, kv_heads, head_dim)) = s.attention else {
        return refuse(
            format!("model_type `{}` uses multi-latent or per-layer attention, which memwall does not map to Megatron-LM arguments", s.model_type),
            "convert the model with Megatron-Bridge and add its --multi-latent-attention arguments by hand",
        );
    };
    if !s.sequential_residual {
        return refuse(
            format!("model_type `{}` has parallel or post-norm residuals, which Megatron-LM's GPT model does not build", s.model_type),
            "plan this model with FSDP2 or ZeRO instead (--strategy fsdp-full / zero3)",
        );
    }
    if s.mixed_moe {
        return refuse(
            "the model mixes dense and MoE layers, which memwall does not map to --moe-layer-freq"
                .to_string(),
            "write --moe-layer-freq by hand from the model config",
        );
    }
    if s.gated && s.activation != Activation::Silu {
        return refuse(
            "a gated MLP with a non-SiLU activation has no Megatron-LM flag (only --swiglu)"
                .to_string(),
            "plan this model with FSDP2 or ZeRO instead",
        );
    }
    if l.schedule == Schedule::Gpipe && l.pp > 1 {
        return refuse(
            "Megatron-LM has no GPipe schedule (1F1B or interleaved 1F1B)".to_string(),
            "plan with --schedule 1f1b or interleaved",
        );
    }
    let optimizer = match w.optimizer {
        Optimizer::Adamw | Optimizer::AdamwFused | Optimizer::AdamwForloop => ("adam", None),
        Optimizer::Sgd => ("sgd", Some(0.0)),
        Optimizer::SgdMomentum => ("sgd", Some(0.9)),
        o => {
            return refuse(
                format!(
                    "Megatron-LM's --optimizer is adam or sgd; `{}` is not available",
                    Optimizer::ALL
                        .iter()
                        .find(|(x, _)| *x == o)
                        .map_or("?", |(_, n)| n)
                ),
                "plan with --optimizer adamw or sgd",
            )
        }
    };
    let mut a: Args = Vec::new();
    // model shape (TransformerConfig; GPT model arguments)
    push(&mut a, "--num-layers", s.num_layers);
    push(&mut a, "--hidden-size", s.hidden_size);
    match (s.ffn_hidden_size, s.moe) {
        (Some(f), _) => push(&mut a, "--ffn-hidden-size", f),
        (None, Some((_, _, f, _))) => push(&mut a, "--ffn-hidden-size", f),
        (None, None) => {}
    }
    push(&mut a, "--num-attention-heads", heads);
    if kv_heads != heads {
        switch(&mut a, "--group-query-attention");
        push(&mut a, "--num-query-groups", kv_heads);
    }
    push(&mut a, "--kv-channels", head_dim);
    push(&mut a, "--seq-length", w.seq);
    push(
        &mut a,
        "--max-position-embeddings",
        s.max_position_embeddings.max(w.seq),
    );
    push(
        &mut a,
        "--position-embedding-type",
        if s.learned_positions {
            "learned_absolute"
        } else {
            "rope"
        },
    );
    push(
        &mut a,
        "--normalization",
        if s.rms_norm { "RMSNorm" } else { "LayerNorm" },
    );
    if s.gated {
        switch(&mut a, "--swiglu");
    }
    if !s.linear_bias {
        switch(&mut a, "--disable-bias-linear");
    }
    if s.qkv_bias && !s.linear_bias {
        switch(&mut a, "--add-qkv-bias");
    }
    if !s.tied_embeddings {
        switch(&mut a, "--untie-embeddings-and-output-weights");
    }
    if let Some((experts, top_k, expert_ffn, shared)) = s.moe {
        push(&mut a, "--num-experts", experts);
        push(&mut a, "--moe-router-topk", top_k);
        push(&mut a, "--moe-ffn-hidden-size", expert_ffn);
        if let Some(sh) = shared {
            push(&mut a, "--moe-shared-expert-intermediate-size", sh);
        }
    }
    // dropout as the estimate used it (Megatron's defaults are 0.1)
    push(&mut a, "--attention-dropout", float(s.attention_dropout));
    push(&mut a, "--hidden-dropout", float(s.hidden_dropout));
    // the vocabulary: memwall counts the config's rows; padding only to a multiple of tp
    push(&mut a, "--make-vocab-size-divisible-by", 1);
    push(&mut a, "--tokenizer-type", "HuggingFaceTokenizer");
    push(&mut a, "--tokenizer-model", &spec.model_id);
    // parallelism (ModelParallelConfig)
    push(&mut a, "--tensor-model-parallel-size", l.tp);
    if l.sequence_parallel && l.tp > 1 {
        switch(&mut a, "--sequence-parallel");
    }
    push(&mut a, "--pipeline-model-parallel-size", l.pp);
    if l.schedule == Schedule::Interleaved && l.virtual_stages > 1 {
        push(
            &mut a,
            "--num-virtual-stages-per-pipeline-rank",
            l.virtual_stages,
        );
    }
    push(&mut a, "--context-parallel-size", l.cp);
    push(&mut a, "--expert-model-parallel-size", l.ep);
    if l.strategy == Strategy::Zero1 {
        switch(&mut a, "--use-distributed-optimizer");
    }
    // batch: micro-batches per step per pipeline = global / (micro × dp)
    push(&mut a, "--micro-batch-size", w.batch);
    push(&mut a, "--global-batch-size", spec.global_batch());
    // full recomputation of every layer's input (memory/megatron.rs keeps 2sbh per layer)
    if w.checkpointing {
        push(&mut a, "--recompute-granularity", "full");
        push(&mut a, "--recompute-method", "uniform");
        push(&mut a, "--recompute-num-layers", 1);
    }
    match w.precision {
        Precision::Bf16 | Precision::AmpBf16 => switch(&mut a, "--bf16"),
        Precision::Fp16 | Precision::AmpFp16 => switch(&mut a, "--fp16"),
        Precision::Fp32 => {}
    }
    // attention kernel: flash keeps output + logsumexp; unfused materialises the probabilities
    push(
        &mut a,
        "--attention-backend",
        match w.attention {
            AttentionImpl::Sdpa | AttentionImpl::Flash => "flash",
            AttentionImpl::Eager => "unfused",
        },
    );
    push(&mut a, "--optimizer", optimizer.0);
    if let Some(m) = optimizer.1 {
        push(&mut a, "--sgd-momentum", float(m));
    }
    Ok(a)
}

pub(super) fn emit(spec: &LaunchSpec) -> Result<Vec<EmittedFile>, EmitError> {
    let a = args(spec)?;
    let mut lines = header_lines(
        &spec.provenance,
        "Megatron-LM pretrain_gpt.py (arguments of megatron-core 0.19.2 megatron/training/arguments.py)",
    );
    lines.push(String::new());
    lines.push(
        "Add what memwall does not decide: data (--data-path or --mock-data), --lr, --train-iters,"
            .to_string(),
    );
    lines.push("checkpoint paths. Architecture flags that do not change memory (rotary base, norm epsilon)".to_string());
    lines.push(
        "come from your checkpoint converter. The vocabulary comes from the tokenizer; memwall"
            .to_string(),
    );
    lines.push(format!("counted {} rows.", spec.shape.vocab_size));
    lines.push(format!(
        "Run on every node (NODE_RANK 0..{}); MEGATRON_LM is your Megatron-LM checkout.",
        spec.num_nodes().saturating_sub(1)
    ));
    let mut sh = String::from("#!/usr/bin/env bash\n");
    sh.push_str(&hash_comment(&lines));
    sh.push_str("set -euo pipefail\n");
    // Megatron-LM asserts it with tensor or context parallelism (arguments.py validate_args)
    sh.push_str("export CUDA_DEVICE_MAX_CONNECTIONS=1\n");
    sh.push_str(&shell::array("MEGATRON_ARGS", &a));
    sh.push_str(&format!(
        "exec {} {}/pretrain_gpt.py \"${{MEGATRON_ARGS[@]}}\" \"$@\"\n",
        super::torchrun::command(spec),
        shell::var("MEGATRON_LM", ".")
    ));
    Ok(vec![EmittedFile::new("launch_megatron.sh", sh)])
}
