//! Command-line arguments and their resolution into settings.

use crate::model_source::{self, ModelSource};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use memwall_core::gpu::{self, Gpu};
use memwall_core::memory::Kernels;
use memwall_core::workload::{AttentionImpl, Lora, Optimizer, Precision, TrainWorkload};

/// Exact peak GPU memory of LLM training steps, before you rent the GPU.
#[derive(Debug, Parser)]
#[command(name = "memwall", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Peak memory of one training step on one GPU.
    Train(TrainArgs),
    /// List the embedded model catalogue.
    Models(ListArgs),
    /// Exact parameter counts of a model, by component and dtype.
    Inspect(InspectArgs),
    /// List the GPUs `--gpu` accepts.
    Gpus(ListArgs),
}

/// `--json` for listings.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `memwall inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Catalogue id, Hugging Face repo id, path to a config.json or a model directory.
    pub model: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Precision as typed.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PrecisionArg {
    /// Model in bf16.
    Bf16,
    /// Model in fp16.
    Fp16,
    /// Model in fp32.
    Fp32,
    /// fp32 weights with bf16 autocast.
    AmpBf16,
    /// fp32 weights with fp16 autocast.
    AmpFp16,
}

/// Optimizer as typed.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OptimizerArg {
    /// torch AdamW, foreach (PyTorch's GPU default).
    Adamw,
    /// torch AdamW, fused=True.
    AdamwFused,
    /// torch AdamW, foreach=False.
    AdamwForloop,
    /// bitsandbytes AdamW8bit.
    #[value(name = "adamw-8bit")]
    Adamw8bit,
    /// torch SGD without momentum.
    Sgd,
    /// torch SGD with momentum 0.9.
    SgdMomentum,
    /// torch Adafactor.
    Adafactor,
    /// Lion (lion-pytorch).
    Lion,
}

/// Attention implementation as typed.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum AttentionArg {
    /// torch SDPA (flash/efficient kernels).
    Sdpa,
    /// transformers eager attention (materialises probabilities).
    Eager,
    /// flash_attention_2.
    Flash,
}

/// `memwall train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Catalogue id, Hugging Face repo id, path to a config.json or a model directory.
    #[arg(long, short = 'm', default_value = "llama-3.1-8b")]
    pub model: String,
    /// Micro-batch size.
    #[arg(long, short = 'b', default_value_t = 1)]
    pub batch: u64,
    /// Sequence length.
    #[arg(long, short = 's', default_value_t = 2048)]
    pub seq: u64,
    /// Precision.
    #[arg(long, value_enum, default_value = "bf16")]
    pub precision: PrecisionArg,
    /// Optimizer.
    #[arg(long, value_enum, default_value = "adamw")]
    pub optimizer: OptimizerArg,
    /// HF activation checkpointing per decoder layer (non-reentrant).
    #[arg(long)]
    pub checkpointing: bool,
    /// Attention implementation.
    #[arg(long, value_enum, default_value = "sdpa")]
    pub attention: AttentionArg,
    /// LoRA rank (frozen base, trainable adapters).
    #[arg(long)]
    pub lora_rank: Option<u64>,
    /// LoRA target modules, comma-separated (e.g. q_proj,v_proj).
    #[arg(long, value_delimiter = ',')]
    pub lora_targets: Vec<String>,
    /// QLoRA: 4-bit NF4 base with double quantisation (needs --lora-rank).
    #[arg(long)]
    pub qlora: bool,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: u64,
    /// Disable dropout (as if every dropout probability were 0).
    #[arg(long)]
    pub no_dropout: bool,
    /// GPU to check the fit against (see `memwall gpus`).
    #[arg(long, default_value = "h100-80gb")]
    pub gpu: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Simulate CPU kernels (as the fake-tensor truth harness runs them) instead of CUDA's.
    #[arg(long, hide = true)]
    pub cpu_kernels: bool,
}

/// Fully resolved `train` settings.
#[derive(Debug)]
pub struct TrainSettings {
    /// The model and where it came from.
    pub model: ModelSource,
    /// The step.
    pub workload: TrainWorkload,
    /// GPU for the fit check.
    pub gpu: &'static Gpu,
    /// JSON output.
    pub json: bool,
    /// Kernel semantics to simulate.
    pub kernels: Kernels,
}

impl TrainSettings {
    /// Turns raw arguments into settings; every field is destructured so a new flag must be handled.
    pub fn resolve(a: TrainArgs) -> Result<Self> {
        let TrainArgs {
            model,
            batch,
            seq,
            precision,
            optimizer,
            checkpointing,
            attention,
            lora_rank,
            lora_targets,
            qlora,
            grad_accum,
            no_dropout,
            gpu,
            json,
            cpu_kernels,
        } = a;
        let model = model_source::load(&model)?;
        let gpu = gpu::find(&gpu).with_context(|| {
            let ids: Vec<&str> = gpu::GPUS.iter().map(|g| g.id).collect();
            let wanted = gpu.to_ascii_lowercase();
            let close: Vec<&str> = ids
                .iter()
                .copied()
                .filter(|id| {
                    id.contains(&wanted) || wanted.contains(id.split('-').next().unwrap_or(id))
                })
                .collect();
            if close.is_empty() {
                format!("unknown --gpu `{gpu}`; known: {}", ids.join(", "))
            } else {
                format!(
                    "unknown --gpu `{gpu}` (did you mean: {}?); known: {}",
                    close.join(", "),
                    ids.join(", ")
                )
            }
        })?;
        let lora = match (lora_rank, qlora) {
            (Some(rank), _) => {
                if lora_targets.is_empty() {
                    bail!("--lora-rank needs --lora-targets (e.g. --lora-targets q_proj,v_proj)");
                }
                let mut known: Vec<&str> = Vec::new();
                for (_, n) in &model.desc.linear_names {
                    if !known.contains(&n.as_str()) {
                        known.push(n.as_str());
                    }
                }
                for t in &lora_targets {
                    if !known.contains(&t.as_str()) {
                        bail!(
                            "--lora-targets: `{t}` is not a linear layer of this {} model; its linear layers are: {}",
                            model.desc.model_type,
                            known.join(", ")
                        );
                    }
                }
                Some(Lora {
                    rank,
                    targets: lora_targets,
                    qlora,
                })
            }
            (None, true) => bail!("--qlora needs --lora-rank and --lora-targets"),
            (None, false) => {
                if !lora_targets.is_empty() {
                    bail!("--lora-targets needs --lora-rank");
                }
                None
            }
        };
        let workload = TrainWorkload {
            batch,
            seq,
            precision: match precision {
                PrecisionArg::Bf16 => Precision::Bf16,
                PrecisionArg::Fp16 => Precision::Fp16,
                PrecisionArg::Fp32 => Precision::Fp32,
                PrecisionArg::AmpBf16 => Precision::AmpBf16,
                PrecisionArg::AmpFp16 => Precision::AmpFp16,
            },
            optimizer: match optimizer {
                OptimizerArg::Adamw => Optimizer::Adamw,
                OptimizerArg::AdamwFused => Optimizer::AdamwFused,
                OptimizerArg::AdamwForloop => Optimizer::AdamwForloop,
                OptimizerArg::Adamw8bit => Optimizer::Adamw8bit,
                OptimizerArg::Sgd => Optimizer::Sgd,
                OptimizerArg::SgdMomentum => Optimizer::SgdMomentum,
                OptimizerArg::Adafactor => Optimizer::Adafactor,
                OptimizerArg::Lion => Optimizer::Lion,
            },
            checkpointing,
            attention: match attention {
                AttentionArg::Sdpa => AttentionImpl::Sdpa,
                AttentionArg::Eager => AttentionImpl::Eager,
                AttentionArg::Flash => AttentionImpl::Flash,
            },
            lora,
            grad_accum,
            dropout: !no_dropout,
        };
        workload.validate().context("invalid training settings")?;
        let kernels = if cpu_kernels {
            Kernels::Cpu
        } else {
            Kernels::Cuda
        };
        Ok(TrainSettings {
            model,
            workload,
            gpu,
            json,
            kernels,
        })
    }
}
