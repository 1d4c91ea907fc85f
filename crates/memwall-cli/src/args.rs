//! Command-line arguments and their resolution into settings.

use crate::error::UserError;
use crate::model_source::{self, ModelSource};
use crate::report::Format;
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use memwall_core::error::untrusted;
use memwall_core::gpu::GpuSpec;
use memwall_core::layout::{Layout, Offload, OffloadDevice, Schedule, Strategy};
use memwall_core::memory::titan::{Float8Recipe, Runtime};
use memwall_core::memory::Kernels;
use memwall_core::names::{parse_named, Named};
use memwall_core::plan::AllowItem;
use memwall_core::roofline::{MathDtype, RooflinePhase, RooflineWorkload};
use memwall_core::workload::limits::{self, count, fraction};
use memwall_core::workload::{
    AttentionImpl, CheckpointPolicy, KernelOptions, KernelSet, KvDtype, Lora, LossKernel,
    Optimizer, Precision, StepOptions, TrainLoop, TrainWorkload,
};

/// The value parser of a core enum: its accepted names and their help come from the enum's one
/// table (`memwall_core::names`), so no CLI enum mirrors a core enum by hand.
fn named<T: Named + Send + Sync>() -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        T::VALUES
            .iter()
            .map(|v| PossibleValue::new(v.name()).help(v.help())),
    )
    .try_map(|s| parse_named::<T>(&s))
}

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
    /// The fastest training configuration that fits a cluster, ranked by tokens/s per GPU.
    Plan(PlanArgs),
    /// Where the peak is and the cheapest fixes, in order, until it fits (`memwall doctor
    /// [train flags]`, or `memwall doctor infer [infer flags]`).
    Doctor(DoctorArgs),
    /// List the embedded model catalogue.
    Models(ListArgs),
    /// Exact parameter counts of a model, by component and dtype.
    Inspect(InspectArgs),
    /// List the GPUs `--gpu` accepts.
    Gpus(ListArgs),
    /// Roofline of a training step, prefill or decode on a GPU: FLOPs, bytes, bound, time.
    Roofline(RooflineArgs),
    /// Peak memory of `generate`-style inference (prefill + decode) on one GPU.
    Infer(InferArgs),
    /// KV-cache capacity of a vLLM deployment, following vLLM's own accounting.
    Serve(ServeArgs),
    /// The web page (this CLI compiled to WebAssembly), served on 127.0.0.1, or written out
    /// as static files with --export.
    Web(WebArgs),
}

/// `memwall web`.
#[derive(Debug, Args)]
pub struct WebArgs {
    /// Port on 127.0.0.1 (default 8787; 0 takes any free port).
    #[arg(long, conflicts_with = "export")]
    pub port: Option<u16>,
    /// Write the page's static files to this directory (for any static web server) instead
    /// of serving them.
    #[arg(long, value_name = "DIR")]
    pub export: Option<std::path::PathBuf>,
}

/// `memwall serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Catalogue id, Hugging Face repo id, path to a config.json or a model directory.
    #[arg(long, short = 'm', default_value = "llama-3.1-8b")]
    pub model: String,
    /// GPU.
    #[arg(long, default_value = "h100-sxm")]
    pub gpu: String,
    /// `--tensor-parallel-size`.
    #[arg(long, default_value_t = 1)]
    pub tp: u64,
    /// `--gpu-memory-utilization` (vLLM 0.33 default).
    #[arg(long, default_value_t = 0.92)]
    pub gpu_memory_utilization: f64,
    /// `--kv-cache-dtype`.
    #[arg(long, value_enum, default_value = "auto")]
    pub kv_cache_dtype: ServeKvArg,
    /// `--quantization`: vLLM's method name (fp8, fp8_per_tensor, fp8_per_block, gptq, awq,
    /// compressed-tensors). Default: the checkpoint's own, as vLLM reads it from the config.
    #[arg(long)]
    pub quantization: Option<String>,
    /// Weight format as memwall names it (bf16, fp8, gptq-int4-g128, awq-int4-g128, …), for
    /// what-ifs; overrides the checkpoint's bytes and its quantization_config.
    #[arg(long)]
    pub weights: Option<String>,
    /// `--block-size`.
    #[arg(long, default_value_t = 16)]
    pub block_size: u64,
    /// `--max-model-len` (default: the model's max_position_embeddings).
    #[arg(long)]
    pub max_model_len: Option<u64>,
    /// `--max-num-batched-tokens` (default as `vllm serve`: 8192 on GPUs with ≥ 70 GiB other than A100, 16384 with ≥ 160 GiB, else 2048).
    #[arg(long)]
    pub max_num_batched_tokens: Option<u64>,
    /// `--max-num-seqs` (default as `vllm serve`: 1024 where max-num-batched-tokens is 8192+, else 256).
    #[arg(long)]
    pub max_num_seqs: Option<u64>,
    /// `--enforce-eager` (no CUDA graphs).
    #[arg(long)]
    pub enforce_eager: bool,
    /// `--kv-cache-memory-bytes`: a fixed KV budget instead of the profiled one.
    #[arg(long)]
    pub kv_cache_memory_bytes: Option<u64>,
    /// Measured non-torch memory growth, if you have it (vLLM logs it).
    #[arg(long)]
    pub non_torch_bytes: Option<u64>,
    /// Measured profile-run activation peak, if you have it (vLLM logs it).
    #[arg(long)]
    pub activation_bytes: Option<u64>,
    /// Measured CUDA-graph memory, if you have it (vLLM logs it).
    #[arg(long)]
    pub cuda_graph_bytes: Option<u64>,
    /// `--enable-prefix-caching` (vLLM's default, except for models without attention layers);
    /// on models with Mamba or gated-DeltaNet layers it sets `mamba_cache_mode=align`.
    #[arg(long, conflicts_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// `--no-enable-prefix-caching` (`mamba_cache_mode=none`: one state block per request).
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Request lengths for the concurrency table and the fragmentation comparison.
    #[arg(long, value_delimiter = ',', default_value = "2048,4096,8192,32768")]
    pub request_lengths: Vec<u64>,
    /// --emit vllm / --out.
    #[command(flatten)]
    pub emit: EmitArgs,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

impl ServeArgs {
    /// Checks every flag against the shared limits before the deployment is planned (the
    /// planner computes with them), and refuses flags that would be silently ignored. The
    /// model-dependent checks (`--tp` against the heads, byte counts against the GPU) are the
    /// core planner's. Every field is destructured, so a new flag must be considered here.
    pub fn validate(&self) -> Result<()> {
        let ServeArgs {
            model: _,
            gpu,
            tp,
            gpu_memory_utilization,
            kv_cache_dtype: _,
            quantization: _,
            weights: _,
            block_size,
            max_model_len,
            max_num_batched_tokens,
            max_num_seqs,
            enforce_eager,
            kv_cache_memory_bytes,
            non_torch_bytes,
            activation_bytes,
            cuda_graph_bytes,
            enable_prefix_caching: _,
            no_enable_prefix_caching: _,
            request_lengths,
            emit: _,
            output: _,
        } = self;
        count("tp", *tp, memwall_core::layout::MAX_GPUS)?;
        fraction("gpu_memory_utilization", *gpu_memory_utilization)?;
        count("block_size", *block_size, limits::MAX_CONTEXT)?;
        if let Some(v) = max_model_len {
            count("max_model_len", *v, limits::MAX_CONTEXT)?;
        }
        if let Some(v) = max_num_batched_tokens {
            count("max_num_batched_tokens", *v, limits::MAX_BATCHED_TOKENS)?;
        }
        if let Some(v) = max_num_seqs {
            count("max_num_seqs", *v, limits::MAX_BATCH)?;
        }
        for &n in request_lengths {
            count("request_lengths", n, limits::MAX_CONTEXT)?;
        }
        // measured byte counts are parts of one GPU's memory
        let gpu = resolve_gpu(gpu)?;
        for (flag, given) in [
            ("--kv-cache-memory-bytes", kv_cache_memory_bytes),
            ("--non-torch-bytes", non_torch_bytes),
            ("--activation-bytes", activation_bytes),
            ("--cuda-graph-bytes", cuda_graph_bytes),
        ] {
            if let Some(v) = given.filter(|&v| v > gpu.memory_bytes) {
                return Err(UserError::flag(
                    flag,
                    v,
                    format!("more than the {} bytes of one {}", gpu.memory_bytes, gpu.id),
                    format!(
                        "{flag} is a part of one GPU's memory: give the bytes vLLM reports, at most {}",
                        gpu.memory_bytes
                    ),
                )
                .into());
            }
        }
        if kv_cache_memory_bytes.is_some() {
            for (flag, given) in [
                ("--non-torch-bytes", non_torch_bytes),
                ("--activation-bytes", activation_bytes),
                ("--cuda-graph-bytes", cuda_graph_bytes),
            ] {
                if let Some(v) = given {
                    return Err(UserError::flag(
                        flag,
                        v,
                        "it would be ignored: --kv-cache-memory-bytes fixes the KV budget, so nothing is subtracted from the GPU's memory",
                        format!("drop {flag}, or drop --kv-cache-memory-bytes to have the budget profiled"),
                    )
                    .into());
                }
            }
        }
        if let (true, Some(v)) = (enforce_eager, cuda_graph_bytes) {
            return Err(UserError::flag(
                "--cuda-graph-bytes",
                v,
                "it would be ignored: --enforce-eager captures no CUDA graphs",
                "drop one of --cuda-graph-bytes and --enforce-eager",
            )
            .into());
        }
        if let Some(v) = max_num_seqs {
            if activation_bytes.is_some() || kv_cache_memory_bytes.is_some() {
                // a real vLLM flag (the scheduler's limit): warned about, not refused
                eprintln!(
                    "warning: --max-num-seqs {v} only shapes memwall's estimate of the profile-run activations, which --{} replaces; it does not change this report",
                    if activation_bytes.is_some() {
                        "activation-bytes"
                    } else {
                        "kv-cache-memory-bytes"
                    }
                );
            }
        }
        Ok(())
    }
}

/// KV dtype for serving.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ServeKvArg {
    /// The model dtype (bf16/fp16).
    Auto,
    /// fp16.
    Float16,
    /// bf16.
    Bfloat16,
    /// fp8 (e4m3).
    Fp8,
    /// fp8 e4m3.
    #[value(name = "fp8_e4m3")]
    Fp8E4m3,
    /// fp8 e5m2.
    #[value(name = "fp8_e5m2")]
    Fp8E5m2,
}

/// `memwall infer`.
#[derive(Debug, Args)]
pub struct InferArgs {
    /// Catalogue id, Hugging Face repo id, path to a config.json or a model directory.
    #[arg(long, short = 'm', default_value = "llama-3.1-8b")]
    pub model: String,
    /// Sequences generated together.
    #[arg(long, short = 'b', default_value_t = 1)]
    pub batch: u64,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 2048)]
    pub prompt: u64,
    /// New tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub new_tokens: u64,
    /// Attention implementation.
    #[arg(long, value_parser = named::<AttentionImpl>(), default_value = "sdpa")]
    pub attention: AttentionImpl,
    /// Weight format: bf16, fp16, fp32, fp8, int8 (LLM.int8), nf4, nf4-dq, fp4, fp4-dq,
    /// gptq-int4-g128, awq-int4-g128, gguf-q4_k_m, gguf-q5_k_m, gguf-q8_0, gguf-q6_k, gguf-q4_0, …
    /// (default: the checkpoint's own bytes when its files are given, else its
    /// quantization_config, else bf16; an explicit format overrides them).
    #[arg(long)]
    pub weights: Option<String>,
    /// KV cache dtype.
    #[arg(long, value_parser = named::<KvDtype>(), default_value = "auto")]
    pub kv_dtype: KvDtype,
    /// GPU to check the fit against.
    #[arg(long, default_value = "h100-sxm")]
    pub gpu: String,
    /// MoE decode with `grouped_mm` experts instead of the `batched_mm` that `generate`
    /// switches to on GPUs (which copies each selected expert's weights).
    #[arg(long)]
    pub moe_grouped_decode: bool,
    /// Allocator margin added to the peak in the fit test, as a fraction of the peak (see
    /// `memwall train --help`).
    #[arg(long, default_value_t = memwall_core::plan::DEFAULT_ALLOC_MARGIN)]
    pub alloc_margin: f64,
    /// Simulate CPU kernels (as the fake-tensor truth harness runs them).
    #[arg(long, hide = true)]
    pub cpu_kernels: bool,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
    /// Vision-language models: N of the --prompt tokens of every sequence are image tokens;
    /// the vision tower's forward, the projector and the merge into the embeddings are
    /// simulated in the prefill (qwen2_vl, qwen2_5_vl, mistral3: one image of the most nearly
    /// square a × b = N tokens, N·merge² patches; gemma3: N / 256 images; llama4: N / 144
    /// tiles of 336 px, plus tiles + 2 separator tokens in the prompt; other families refuse
    /// it). Without it, image tokens count as text tokens.
    #[arg(long, help_heading = "Vision-language models")]
    pub image_tokens: Option<u64>,
}

/// Resolved `infer` settings.
#[derive(Debug)]
pub struct InferSettings {
    /// Model.
    pub model: ModelSource,
    /// Workload.
    pub workload: memwall_core::workload::InferWorkload,
    /// The weights used and where their bytes come from.
    pub weights: crate::weights::WeightsChoice,
    /// GPU.
    pub gpu: &'static GpuSpec,
    /// Kernel semantics.
    pub kernels: Kernels,
    /// Output format.
    pub format: Format,
    /// Allocator margin of the fit test (fraction of the peak).
    pub alloc_margin: f64,
}

impl InferSettings {
    /// Resolves raw arguments (every field destructured).
    pub fn resolve(a: InferArgs) -> Result<Self> {
        use memwall_core::workload::{InferWorkload, WeightFormat};
        let InferArgs {
            model,
            batch,
            prompt,
            new_tokens,
            attention,
            weights,
            kv_dtype,
            gpu,
            moe_grouped_decode,
            alloc_margin,
            cpu_kernels,
            output,
            image_tokens,
        } = a;
        let format = output.resolve()?;
        // numbers first: they need neither the model nor the GPU
        count("batch", batch, limits::MAX_BATCH)?;
        count("prompt", prompt, limits::MAX_SEQ)?;
        count("new_tokens", new_tokens, limits::MAX_SEQ)?;
        let explicit = weights.as_deref().map(WeightFormat::parse).transpose()?;
        let mut model = model_source::load(&model)?;
        crate::vision::apply(
            &mut model,
            false,
            image_tokens,
            false,
            crate::vision::ImageContext {
                seq: prompt,
                seq_flag: "--prompt",
                amp: false,
                padding_free: false,
                lora_targets: &[],
                megatron: false,
            },
        )?;
        let choice = crate::weights::choose(&model, explicit)?;
        let weights = choice.format;
        let gpu = resolve_gpu(&gpu)?;
        if moe_grouped_decode
            && !model
                .desc
                .layers
                .iter()
                .any(|l| matches!(l.mlp, memwall_core::model::Mlp::Moe(_)))
        {
            return Err(UserError::new(
                format!(
                    "--moe-grouped-decode has no effect: {} ({}) has no mixture-of-experts layers",
                    model.label, model.desc.model_type
                ),
                "drop --moe-grouped-decode; it chooses how MoE experts run during decode",
            )
            .into());
        }
        let workload = InferWorkload {
            batch,
            prompt,
            new_tokens,
            attention,
            weights,
            kv_dtype,
            moe_decode_batched: !moe_grouped_decode,
        };
        workload.validate()?;
        let kernels = if cpu_kernels {
            Kernels::Cpu
        } else {
            Kernels::Cuda
        };
        memwall_core::plan::check_alloc_margin(alloc_margin)?;
        Ok(InferSettings {
            model,
            workload,
            weights: choice,
            gpu,
            kernels,
            format,
            alloc_margin,
        })
    }
}

/// Phase as typed.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PhaseArg {
    /// One training step.
    Train,
    /// Prefill of the prompts.
    Prefill,
    /// One decode step at the given context.
    Decode,
}

/// GEMM format as typed.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DtypeArg {
    /// fp32 (CUDA cores).
    Fp32,
    /// tf32 tensor cores.
    Tf32,
    /// bf16.
    Bf16,
    /// fp16.
    Fp16,
    /// fp8.
    Fp8,
    /// int8.
    Int8,
}

/// `memwall roofline`.
#[derive(Debug, Args)]
pub struct RooflineArgs {
    /// Catalogue id, Hugging Face repo id, path to a config.json or a model directory.
    #[arg(long, short = 'm', default_value = "llama-3.1-8b")]
    pub model: String,
    /// GPU (see `memwall gpus`).
    #[arg(long, default_value = "h100-sxm")]
    pub gpu: String,
    /// Phase to analyse.
    #[arg(long, value_enum, default_value = "train")]
    pub phase: PhaseArg,
    /// Sequences.
    #[arg(long, short = 'b', default_value_t = 1)]
    pub batch: u64,
    /// Sequence length (train, prefill) or context length (decode).
    #[arg(long, short = 's', default_value_t = 2048)]
    pub seq: u64,
    /// Format of the matrix multiplications (weights stored in the same format).
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: DtypeArg,
    /// Tensor-parallel degree.
    #[arg(long, default_value_t = 1)]
    pub tp: u64,
    /// Fraction of peak FLOP/s reached by GEMMs (1.0 = the roofline bound; 0.4–0.6 is typical MFU).
    #[arg(long, default_value_t = 1.0)]
    pub flops_efficiency: f64,
    /// Fraction of peak memory bandwidth reached (1.0 = the roofline bound; ~0.8 is typical).
    #[arg(long, default_value_t = 1.0)]
    pub bandwidth_efficiency: f64,
    /// Write the roofline plot as SVG to this path.
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Resolved `roofline` settings.
#[derive(Debug)]
pub struct RooflineSettings {
    /// Model.
    pub model: ModelSource,
    /// GPU.
    pub gpu: &'static GpuSpec,
    /// Workload.
    pub workload: RooflineWorkload,
    /// SVG output path.
    pub svg: Option<std::path::PathBuf>,
    /// Output format.
    pub format: Format,
}

/// Looks a GPU up in the catalogue, with "did you mean".
pub fn resolve_gpu(id: &str) -> Result<&'static GpuSpec> {
    if let Some(g) = memwall_catalog::find_gpu(id) {
        return Ok(g);
    }
    let all = memwall_catalog::gpus().context("the embedded GPU table is unreadable")?;
    let ids: Vec<&str> = all.iter().map(|g| g.id.as_str()).collect();
    // no GPU id is long: a long value is not worth comparing
    let close = if id.chars().count() <= 64 {
        memwall_catalog::suggest_gpu(id)
    } else {
        Vec::new()
    };
    let reason = if close.is_empty() {
        "not a GPU of the catalogue".to_owned()
    } else {
        format!(
            "not a GPU of the catalogue (did you mean: {}?)",
            close.join(", ")
        )
    };
    let hint = if close.is_empty() {
        format!("known GPUs: {}", ids.join(", "))
    } else {
        format!(
            "`memwall gpus` lists all {} with their memory and peaks",
            ids.len()
        )
    };
    Err(UserError::flag("--gpu", id, reason, hint).into())
}

impl RooflineSettings {
    /// Resolves raw arguments.
    pub fn resolve(a: RooflineArgs) -> Result<Self> {
        let RooflineArgs {
            model,
            gpu,
            phase,
            batch,
            seq,
            dtype,
            tp,
            flops_efficiency,
            bandwidth_efficiency,
            svg,
            output,
        } = a;
        let format = output.resolve()?;
        let dtype = match dtype {
            DtypeArg::Fp32 => MathDtype::Fp32,
            DtypeArg::Tf32 => MathDtype::Tf32,
            DtypeArg::Bf16 => MathDtype::Bf16,
            DtypeArg::Fp16 => MathDtype::Fp16,
            DtypeArg::Fp8 => MathDtype::Fp8,
            DtypeArg::Int8 => MathDtype::Int8,
        };
        let workload = RooflineWorkload {
            phase: match phase {
                PhaseArg::Train => RooflinePhase::Train,
                PhaseArg::Prefill => RooflinePhase::Prefill,
                PhaseArg::Decode => RooflinePhase::Decode,
            },
            batch,
            seq,
            dtype,
            weight_bytes: dtype.bytes(),
            kv_bytes: dtype.bytes().max(1.0),
            tp,
            flops_efficiency,
            bandwidth_efficiency,
            loss: LossKernel::Torch,
            kernels: KernelSet::Torch,
        };
        // the bounds that need no model first, then the model (`tp` must divide its heads)
        workload.validate_numbers()?;
        let model = model_source::load(&model)?;
        let gpu = resolve_gpu(&gpu)?;
        workload.validate(&model.desc)?;
        Ok(RooflineSettings {
            model,
            gpu,
            workload,
            svg,
            format,
        })
    }
}

/// Arguments of the listings (`models`, `gpus`).
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `memwall inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Catalogue id, Hugging Face repo id, path to a config.json or a model directory.
    pub model: String,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
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
    #[arg(long, value_parser = named::<Precision>(), default_value = "bf16")]
    pub precision: Precision,
    /// Optimizer.
    #[arg(long, value_parser = named::<Optimizer>(), default_value = "adamw")]
    pub optimizer: Optimizer,
    /// HF activation checkpointing per decoder layer (non-reentrant).
    #[arg(long)]
    pub checkpointing: bool,
    /// Which decoder layers checkpointing recomputes (turns checkpointing on): `full` (every
    /// layer, as --checkpointing), `every-k:K` (every K-th layer, torchtitan's layer-level
    /// selective AC), `selective-attn` (only the core attention, Megatron-LM's selective
    /// recomputation) or `selective-op` (torchtitan 0.3.0 `SelectiveAC`: PyTorch SAC keeps the
    /// matmul and attention outputs, every second unbiased matmul and the rest recomputed).
    #[arg(long, value_name = "POLICY")]
    pub checkpointing_policy: Option<String>,
    /// Attention implementation.
    #[arg(long, value_parser = named::<AttentionImpl>(), default_value = "sdpa")]
    pub attention: AttentionImpl,
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
    /// Loss kernel: how the cross-entropy is computed from the last hidden states.
    #[arg(long, value_parser = named::<LossKernel>(), default_value = "torch")]
    pub loss: LossKernel,
    /// Padding-free batches (TRL `padding_free`, transformers `DataCollatorWithFlattening`): the
    /// batch's sequences packed into one row; --seq is then their mean length.
    #[arg(long)]
    pub padding_free: bool,
    /// Training loop: `trainer` keeps only the loss (HF Trainer); `keep-outputs` keeps the
    /// model's output object (logits, KV cache) until the next forward returns
    /// (`outputs = model(**batch)` in HF's no_trainer / accelerate examples).
    #[arg(long = "loop", value_name = "LOOP", value_parser = named::<TrainLoop>(), default_value = "trainer")]
    pub train_loop: TrainLoop,
    /// The model's `use_cache` while training (`model.config.use_cache = false`): without
    /// checkpointing, a forward with it on builds a KV cache (default: the config's, true when
    /// absent).
    #[arg(long, value_name = "BOOL")]
    pub use_cache: Option<bool>,
    /// Layer kernels: `liger` runs Liger-Kernel's RMSNorm, SwiGLU/GeGLU and RoPE as
    /// transformers' `use_liger_kernel=True` patches them in, and implies --loss fused-linear;
    /// `rmsnorm` only a fused RMSNorm (Liger's alone, or torchtitan's `fused_rmsnorm`).
    #[arg(long, value_parser = named::<KernelSet>(), default_value = "torch")]
    pub kernels: KernelSet,
    /// GPU to check the fit against (see `memwall gpus`).
    #[arg(long, default_value = "h100-sxm")]
    pub gpu: String,
    /// Output format.
    #[command(flatten)]
    pub emit: EmitArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Simulate CPU kernels (as the fake-tensor truth harness runs them) instead of CUDA's.
    #[arg(long, hide = true)]
    pub cpu_kernels: bool,
    /// Step-time model: fraction of the GPU's dense peak a large GEMM reaches (default: the
    /// GPU's measured maximum achievable matmul; docs/time-model.md).
    #[arg(long)]
    pub matmul_efficiency: Option<f64>,
    /// Step-time model: fraction of peak memory bandwidth memory-bound kernels reach (default:
    /// docs/time-model.md).
    #[arg(long)]
    pub bandwidth_efficiency: Option<f64>,
    /// Allocator margin added to the peak in the fit test, as a fraction of the peak: what
    /// PyTorch's caching allocator reserves beyond what it allocates. memwall's default, not a
    /// measurement: measure yours as max_memory_reserved() / max_memory_allocated() − 1.
    #[arg(long, default_value_t = memwall_core::plan::DEFAULT_ALLOC_MARGIN)]
    pub alloc_margin: f64,
    /// GPUs in the cluster (reports every rank when > 1 or with --strategy).
    #[arg(long, default_value_t = 1, help_heading = "Distributed")]
    pub gpus: u64,
    /// GPUs per node (host memory per node; HSDP shards within a node) [default: 8].
    #[arg(long, help_heading = "Distributed")]
    pub gpus_per_node: Option<u64>,
    /// Data-parallel sharding strategy (default ddp when --gpus > 1).
    #[arg(long, value_parser = named::<Strategy>(), help_heading = "Distributed")]
    pub strategy: Option<Strategy>,
    /// Tensor-parallel degree (Megatron-LM).
    #[arg(long, default_value_t = 1, help_heading = "Distributed")]
    pub tp: u64,
    /// Megatron sequence parallelism (with --tp > 1).
    #[arg(long, help_heading = "Distributed")]
    pub sequence_parallel: bool,
    /// Pipeline-parallel degree (Megatron-LM).
    #[arg(long, default_value_t = 1, help_heading = "Distributed")]
    pub pp: u64,
    /// Pipeline schedule.
    #[arg(long, value_parser = named::<Schedule>(), default_value = "1f1b", help_heading = "Distributed")]
    pub schedule: Schedule,
    /// Virtual stages per pipeline rank (--schedule interleaved).
    #[arg(long, default_value_t = 1, help_heading = "Distributed")]
    pub virtual_stages: u64,
    /// Context-parallel degree (Megatron-LM).
    #[arg(long, default_value_t = 1, help_heading = "Distributed")]
    pub cp: u64,
    /// Expert-parallel degree (Megatron-LM, MoE models).
    #[arg(long, default_value_t = 1, help_heading = "Distributed")]
    pub ep: u64,
    /// Offload to host memory.
    #[arg(long, value_parser = named::<Offload>(), default_value = "none", help_heading = "Distributed")]
    pub offload: Offload,
    /// Where offloaded bytes go.
    #[arg(long, value_parser = named::<OffloadDevice>(), default_value = "cpu", help_heading = "Distributed")]
    pub offload_device: OffloadDevice,
    /// Global batch in sequences (= micro-batch × grad-accum × data-parallel ranks); checked,
    /// or used to derive --grad-accum when that is left at 1.
    #[arg(long, help_heading = "Distributed")]
    pub global_batch: Option<u64>,
    /// Vision-language models: train the vision tower and projector too (default: frozen, as
    /// most VLM fine-tuning recipes do; their weights are counted either way).
    #[arg(long, help_heading = "Vision-language models")]
    pub train_vision: bool,
    /// Vision-language models: N of the --seq tokens of every sequence are image tokens; the
    /// frozen vision tower's forward, the projector and the merge into the embeddings are
    /// simulated (qwen2_vl, qwen2_5_vl, mistral3: one image of the most nearly square
    /// a × b = N tokens, N·merge² patches; gemma3: N / 256 images; llama4: N / 144 tiles of
    /// 336 px, plus tiles + 2 separator tokens in --seq; other families, --train-vision, amp-*
    /// precisions, --padding-free, Megatron layouts (TP/PP/CP/EP) and --checkpointing
    /// refuse it). Without it, image tokens count as text tokens.
    #[arg(long, help_heading = "Vision-language models")]
    pub image_tokens: Option<u64>,
    /// Whose training code runs: `hf` (transformers' model under the engine the layout picks)
    /// or `torchtitan` (torchtitan 0.3.0's own Llama 3, Qwen 3 (dense, MoE) or DeepSeek-V3 under
    /// FSDP2, with its tensor + sequence parallelism for --tp > 1 (--tp implies
    /// --sequence-parallel, torchtitan's default) or, for Llama 3 and Qwen 3, its pipeline
    /// parallelism for --pp > 1, with or without --tp (-b = microbatch size, --grad-accum =
    /// microbatches), or its HSDP with --strategy hsdp (replicas across nodes of FSDP2 over
    /// --gpus-per-node); needs --precision amp-bf16, defaults --strategy to fsdp-full).
    #[arg(long, value_parser = named::<Runtime>(), default_value = "hf")]
    pub runtime: Runtime,
    /// Activation offloading to host: the model's forward (loss included) runs under
    /// `torch.autograd.graph.save_on_cpu(pin_memory=True)` and backward outside it; every saved
    /// tensor is copied to pinned host memory and back when its backward runs (one GPU, without
    /// checkpointing, fused kernels or QLoRA).
    #[arg(long)]
    pub activation_offload: bool,
    /// With --runtime torchtitan: torchtitan 0.3.0's float8 linear layers
    /// (`Float8LinearConverter` over torchao 0.18.0: every projection and the LM head) with this
    /// recipe: `rowwise` (torchtitan's default) or `rowwise_with_gw_hp`; `tensorwise` is not
    /// offered by torchtitan 0.3.0 (refused). FSDP2 (or HSDP) only: TP, PP, MoE and tied
    /// embeddings are refused. The step time is not changed (the time model counts bf16
    /// GEMMs).
    #[arg(long, value_parser = named::<Float8Recipe>(), value_name = "RECIPE")]
    pub float8: Option<Float8Recipe>,
    /// With --float8: FSDP2 float8 all-gather (torchao's `enable_fsdp_float8_all_gather`);
    /// torchtitan 0.3.0 has none, so it is refused by name.
    #[arg(long)]
    pub float8_all_gather: bool,
}

/// The gradient accumulation that makes `global` = micro-batch × accumulation × dp: derived
/// when `grad_accum` is left at 1, else checked. Inputs are already bounded; the arithmetic is
/// checked all the same.
/// The loss kernel of `--loss` under `--kernels`: Liger brings its fused linear cross-entropy
/// (`apply_liger_kernel_to_*` default `fused_linear_cross_entropy=True`), so `--kernels liger`
/// turns the default `torch` loss into `fused-linear` and refuses flash-attn's `fused`.
fn loss_with(kernels: KernelSet, loss: LossKernel) -> Result<LossKernel> {
    match (kernels, loss) {
        (KernelSet::Torch | KernelSet::Rmsnorm, l) => Ok(l),
        (KernelSet::Liger, LossKernel::Torch | LossKernel::FusedLinear) => {
            Ok(LossKernel::FusedLinear)
        }
        (KernelSet::Liger, l) => Err(UserError::flag(
            "--loss",
            l,
            "--kernels liger computes the loss with Liger's fused linear cross-entropy",
            "drop --loss (--kernels liger implies --loss fused-linear), or drop --kernels liger",
        )
        .into()),
    }
}

fn grad_accum_for_global_batch(global: u64, batch: u64, grad_accum: u64, dp: u64) -> Result<u64> {
    use memwall_core::error::checked_mul;
    let per_step = checked_mul("batch", batch, dp)?;
    let mismatch = |product: u64| {
        UserError::flag(
            "--global-batch",
            global,
            format!(
                "≠ micro-batch {batch} × grad-accum {grad_accum} × data-parallel ranks {dp} = {product}"
            ),
            format!(
                "the global batch must be a positive multiple of micro-batch × dp = {per_step}; leave --grad-accum at 1 to derive it"
            ),
        )
    };
    if grad_accum == 1 && global >= per_step && global.is_multiple_of(per_step) {
        let derived = global / per_step;
        if derived > limits::MAX_GRAD_ACCUM {
            return Err(UserError::flag(
                "--global-batch",
                global,
                format!(
                    "needs {derived} accumulation steps of {per_step} sequences, more than the {} accepted",
                    limits::MAX_GRAD_ACCUM
                ),
                "raise --batch/-b or --gpus, or lower --global-batch",
            )
            .into());
        }
        return Ok(derived);
    }
    let product = checked_mul("grad_accum", per_step, grad_accum)?;
    if global != product {
        return Err(mismatch(product).into());
    }
    Ok(grad_accum)
}

/// torchtitan's context parallelism is not simulated: refused by flag before the layout is
/// resolved. Its expert parallelism is (`--ep` on a MoE model: the EP mesh carved out of
/// dp_shard, balanced routing; checked by `memory/titan` `check_ep`), and so are its pipeline
/// parallelism (`--pp` with `--schedule 1f1b|gpipe|interleaved`, `-b` the microbatch size and
/// `--grad-accum` the microbatches per step, as for Megatron-LM; checked by `memory/titan`)
/// and its tensor parallelism: `--tp` > 1 runs with sequence parallelism, torchtitan's default
/// (`parallelism.enable_sequence_parallel = true`), so `--tp` implies `--sequence-parallel`
/// there; `--sequence-parallel` alone needs a `--tp`. Returns whether sequence parallelism is
/// on.
fn titan_model_parallel(tp: u64, pp: u64, cp: u64, ep: u64, sp: bool) -> Result<bool> {
    let _ = (pp, ep);
    if cp > 1 {
        return Err(UserError::flag(
            "--cp",
            cp,
            "torchtitan's context parallelism is not simulated (--runtime torchtitan models \
             FSDP2 with tensor + sequence, pipeline or expert parallelism, as measured on fake \
             meshes)",
            "drop it with --runtime torchtitan, or drop --runtime torchtitan (Megatron-LM's \
             profile models it)",
        )
        .into());
    }
    if sp && tp < 2 {
        return Err(UserError::flag(
            "--sequence-parallel",
            "true",
            "torchtitan's sequence parallelism splits along its tensor-parallel group, and --tp is 1",
            "add --tp 2 or more, or drop --sequence-parallel",
        )
        .into());
    }
    Ok(tp > 1)
}

/// What a torchtitan plan cannot search, refused up front by name (the search would otherwise
/// find no plan without saying why): the model, the base workload, and `--allow` items that
/// need what torchtitan does not run.
fn check_titan_plan(model: &ModelSource, base: &TrainWorkload, allow: &[AllowItem]) -> Result<()> {
    memwall_core::memory::titan::shapes(&model.desc)?;
    let mut probe = base.clone();
    probe.precision = Precision::AmpBf16;
    probe.optimizer = Optimizer::Adamw;
    memwall_core::Engine::Torchtitan.check(&probe, None)?;
    for (what, flag, value) in [
        (
            base.precision != Precision::AmpBf16,
            "--precision",
            base.precision.name(),
        ),
        (
            !matches!(base.optimizer, Optimizer::Adamw | Optimizer::AdamwFused),
            "--optimizer",
            base.optimizer.name(),
        ),
    ] {
        if what {
            return Err(UserError::flag(
                flag,
                value,
                "torchtitan's profile runs an fp32 model under bf16 MixedPrecisionPolicy with \
                 fused or foreach AdamW (the measured configurations)",
                "drop it with --runtime torchtitan (plan's defaults are amp-bf16 and adamw)",
            )
            .into());
        }
    }
    for item in allow {
        let refused = matches!(
            item,
            AllowItem::Lora | AllowItem::Qlora | AllowItem::Offload | AllowItem::Adamw8bit
        );
        if refused {
            return Err(UserError::flag(
                "--allow",
                item.name(),
                "torchtitan's profile simulates no LoRA/QLoRA, offload or 8-bit AdamW",
                "drop it from --allow with --runtime torchtitan",
            )
            .into());
        }
    }
    Ok(())
}

/// Fully resolved `train` settings.
#[derive(Debug)]
pub struct TrainSettings {
    /// The model and where it came from.
    pub model: ModelSource,
    /// The step.
    pub workload: TrainWorkload,
    /// GPU for the fit check.
    pub gpu: &'static GpuSpec,
    /// Output format.
    pub format: Format,
    /// Kernel semantics to simulate.
    pub kernels: Kernels,
    /// Overrides of the step-time model's efficiencies.
    pub speed: memwall_core::time::Overrides,
    /// Allocator margin of the fit test (fraction of the peak).
    pub alloc_margin: f64,
    /// `--emit`/`--out`.
    pub emit: EmitArgs,
    /// The cluster layout, when the job is distributed.
    pub layout: Option<Layout>,
    /// `--runtime`: whose training code is simulated.
    pub runtime: Runtime,
    /// `--float8` and `--float8-all-gather` (torchtitan runtime only).
    pub titan: memwall_core::memory::titan::TitanOptions,
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
            checkpointing_policy,
            attention,
            lora_rank,
            lora_targets,
            qlora,
            grad_accum,
            no_dropout,
            loss,
            padding_free,
            train_loop,
            use_cache,
            kernels,
            gpu,
            output,
            emit,
            cpu_kernels,
            matmul_efficiency,
            bandwidth_efficiency,
            alloc_margin,
            gpus,
            gpus_per_node,
            strategy,
            tp,
            sequence_parallel,
            pp,
            schedule,
            virtual_stages,
            cp,
            ep,
            offload,
            offload_device,
            global_batch,
            train_vision,
            image_tokens,
            runtime,
            activation_offload,
            float8,
            float8_all_gather,
        } = a;
        let format = output.resolve()?;
        // numbers first (shared bounds from the core): they need neither the model nor the GPU
        if let Some(m) = matmul_efficiency {
            fraction("matmul_efficiency", m)?;
        }
        if let Some(b) = bandwidth_efficiency {
            fraction("bandwidth_efficiency", b)?;
        }
        memwall_core::plan::check_alloc_margin(alloc_margin)?;
        count("batch", batch, limits::MAX_BATCH)?;
        count("seq", seq, limits::MAX_SEQ)?;
        count("grad_accum", grad_accum, limits::MAX_GRAD_ACCUM)?;
        if let Some(rank) = lora_rank {
            count("lora_rank", rank, limits::MAX_LORA_RANK)?;
        }
        // a policy names what checkpointing recomputes, so it turns checkpointing on
        let checkpointing_policy = checkpointing_policy
            .as_deref()
            .map(str::parse::<CheckpointPolicy>)
            .transpose()?;
        let checkpointing = checkpointing || checkpointing_policy.is_some();
        let checkpointing_policy = checkpointing_policy.unwrap_or_default();
        // a layout-only setting makes the job a layout, so that a setting that does nothing
        // on one GPU (sequence parallelism, a schedule, NVMe) is refused rather than ignored
        if let Some(n) = gpus_per_node {
            count("gpus_per_node", n, memwall_core::layout::MAX_GPUS)?;
        }
        // torchtitan always shards with FSDP2 (one rank too: `apply_fsdp_to_decoder` runs with
        // shard degree 1), so its job is always a layout, fsdp-full unless named
        let titan = runtime == Runtime::Torchtitan;
        float8_flags(titan, float8, float8_all_gather, emit.emit.is_some())?;
        let distributed = titan
            || gpus != 1
            || strategy.is_some()
            || tp != 1
            || pp != 1
            || cp != 1
            || ep != 1
            || offload != Offload::None
            || sequence_parallel
            || schedule != Schedule::OneFOneB
            || virtual_stages != 1
            || offload_device == OffloadDevice::Nvme;
        let sequence_parallel = if titan {
            titan_model_parallel(tp, pp, cp, ep, sequence_parallel)?
        } else {
            sequence_parallel
        };
        if let (Some(n), false) = (gpus_per_node, distributed) {
            return Err(UserError::flag(
                "--gpus-per-node",
                n,
                "the node size shapes a cluster's layout, and this job runs on one GPU",
                "drop --gpus-per-node, or give the cluster with --gpus N",
            )
            .into());
        }
        let layout = if distributed {
            let l = Layout {
                gpus,
                gpus_per_node: gpus_per_node.unwrap_or(8),
                strategy: strategy.unwrap_or(if titan {
                    Strategy::FsdpFull
                } else {
                    Strategy::Ddp
                }),
                tp,
                sequence_parallel,
                pp,
                schedule,
                virtual_stages,
                cp,
                ep,
                offload,
                offload_device,
            };
            if titan {
                // torchtitan's TP is checked by `memory/titan` (a `tp` > 1 layout would
                // otherwise be validated as Megatron-LM's)
                // and so is its PP (validated as Megatron-LM's otherwise); HSDP with either is
                // refused first, by name (not measured)
                memwall_core::memory::titan::check_hsdp(&l)?;
                // and its EP (carved out of dp_shard, checked by `memory/titan` `check_ep`;
                // Megatron-LM's otherwise)
                let mut dp_only = l.clone();
                dp_only.tp = 1;
                dp_only.ep = 1;
                dp_only.sequence_parallel = false;
                if l.pp > 1 && l.gpus.is_multiple_of(l.pp) {
                    dp_only.gpus = l.gpus / l.pp;
                    dp_only.gpus_per_node = dp_only.gpus_per_node.min(dp_only.gpus);
                    dp_only.pp = 1;
                    dp_only.schedule = Schedule::OneFOneB;
                    dp_only.virtual_stages = 1;
                }
                dp_only.validate()?;
            } else {
                l.validate()?;
            }
            Some(l)
        } else {
            if let Some(g) = global_batch {
                return Err(UserError::flag(
                    "--global-batch",
                    g,
                    "a global batch is counted over data-parallel ranks, and this job runs on one GPU",
                    "on one GPU use --batch/-b and --grad-accum; or give the cluster with --gpus N",
                )
                .into());
            }
            None
        };
        let mut model = model_source::load(&model)?;
        crate::vision::apply(
            &mut model,
            train_vision,
            image_tokens,
            lora_rank.is_some(),
            crate::vision::ImageContext {
                seq,
                seq_flag: "--seq",
                amp: precision.autocast(),
                padding_free,
                lora_targets: if lora_rank.is_some() {
                    &lora_targets
                } else {
                    &[]
                },
                megatron: matches!(
                    memwall_core::engine::Engine::resolve(layout.as_ref()),
                    memwall_core::engine::Engine::Megatron
                ),
            },
        )?;
        let gpu = resolve_gpu(&gpu)?;
        let lora = match (lora_rank, qlora) {
            (Some(rank), _) => {
                if lora_targets.is_empty() {
                    return Err(UserError::flag(
                        "--lora-rank",
                        rank,
                        "LoRA needs target modules, and --lora-targets is empty",
                        "add --lora-targets with the linear layers to adapt, e.g. --lora-targets q_proj,v_proj",
                    )
                    .into());
                }
                check_lora_targets(&model, &lora_targets)?;
                Some(Lora {
                    rank,
                    targets: lora_targets,
                    // a bitsandbytes 4-bit checkpoint is a QLoRA base as loaded
                    qlora: qlora || crate::weights::is_bnb_4bit(&model),
                })
            }
            (None, true) => {
                return Err(UserError::new(
                    "invalid --qlora: QLoRA trains LoRA adapters, and --lora-rank is not given",
                    "add --lora-rank R and --lora-targets (e.g. --lora-rank 16 --lora-targets q_proj,v_proj)",
                )
                .into())
            }
            (None, false) => {
                if !lora_targets.is_empty() {
                    return Err(UserError::flag(
                        "--lora-targets",
                        lora_targets.join(","),
                        "LoRA targets need an adapter rank, and --lora-rank is not given",
                        "add --lora-rank R (e.g. 16), or drop --lora-targets",
                    )
                    .into());
                }
                None
            }
        };
        if titan {
            crate::weights::check_trainable_titan(&model)?;
        } else {
            crate::weights::check_trainable(&model, lora.as_ref())?;
        }
        let mut workload = TrainWorkload {
            batch,
            seq,
            precision,
            optimizer,
            checkpointing,
            attention,
            lora,
            grad_accum,
            dropout: !no_dropout,
            kernels: KernelOptions {
                loss: loss_with(kernels, loss)?,
                padding_free,
                layers: kernels,
            },
            step_options: StepOptions {
                outputs: train_loop,
                checkpointing_policy,
                use_cache,
                activation_offload,
            },
        };
        workload.validate()?;
        if let Some(l) = &layout {
            if titan {
                memwall_core::memory::titan::check(&model.desc, &workload, l)?;
            } else {
                l.validate_with(&workload)?;
            }
        }
        if let (Some(g), Some(l)) = (global_batch, &layout) {
            workload.grad_accum = grad_accum_for_global_batch(g, batch, grad_accum, l.dp())?;
        }
        let kernels = if cpu_kernels {
            Kernels::Cpu
        } else {
            Kernels::Cuda
        };
        Ok(TrainSettings {
            model,
            workload,
            gpu,
            format,
            kernels,
            speed: memwall_core::time::Overrides {
                matmul: matmul_efficiency,
                memory_bandwidth: bandwidth_efficiency,
            },
            alloc_margin,
            emit,
            layout,
            runtime,
            titan: memwall_core::memory::titan::TitanOptions {
                reshard: None,
                float8,
                float8_all_gather,
            },
        })
    }
}

/// `--float8` and `--float8-all-gather` are torchtitan's (its `Float8LinearConverter`): refused
/// with the hf runtime, and with `--emit` (torchtitan 0.3.0 sets converters in the model
/// registry, `model_registry(flavor, converters=[…])`, not on its command line, so the emitted
/// launch would silently train in bf16). The core refuses the rest (`memory/titan/float8.rs`).
fn float8_flags(
    titan: bool,
    float8: Option<Float8Recipe>,
    all_gather: bool,
    emit: bool,
) -> Result<()> {
    let flag = match (float8, all_gather) {
        (Some(r), _) => ("--float8", r.to_string()),
        (None, true) => ("--float8-all-gather", "true".to_owned()),
        (None, false) => return Ok(()),
    };
    if !titan {
        return Err(UserError::flag(
            flag.0,
            flag.1,
            "float8 linears are simulated for torchtitan's step only (its Float8LinearConverter \
             over torchao); transformers' Trainer has no float8 training here",
            "add --runtime torchtitan, or drop the float8 flags",
        )
        .into());
    }
    if emit {
        return Err(UserError::flag(
            flag.0,
            flag.1,
            "torchtitan 0.3.0 sets the float8 converter in the model registry \
             (`model_registry(flavor, converters=[Float8LinearConverter.Config(...)])`), not on \
             its command line, so --emit torchtitan cannot launch it",
            "drop --emit, or drop --float8 to emit the bf16 launch",
        )
        .into());
    }
    Ok(())
}

/// `--format` and its `--json` alias, on every subcommand.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format (csv only for tabular reports: models, gpus, inspect, serve, roofline,
    /// and train with --gpus N).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<Format>,
    /// Print JSON (same as --format json).
    #[arg(long)]
    pub json: bool,
}

impl OutputArgs {
    /// The format asked for; `--json` with another `--format` is an error, not a choice.
    pub fn resolve(self) -> Result<Format> {
        let OutputArgs { format, json } = self;
        match (format, json) {
            (Some(f), true) if f != Format::Json => Err(crate::error::UserError::new(
                format!("--json and --format {} ask for two formats", f.name()),
                "--json is short for --format json; pass one of them",
            )
            .into()),
            (Some(f), _) => Ok(f),
            (None, true) => Ok(Format::Json),
            (None, false) => Ok(Format::Table),
        }
    }
}

/// Resolved `serve` settings.
#[derive(Debug)]
pub struct ServeSettings {
    /// Model.
    pub model: ModelSource,
    /// GPU.
    pub gpu: &'static GpuSpec,
    /// The deployment as asked (unset flags take vLLM's defaults in core).
    pub request: memwall_core::serve::ServeRequest,
    /// Request lengths for the concurrency table and the fragmentation comparison.
    pub request_lengths: Vec<u64>,
    /// Where the weight bytes come from, in words.
    pub weights_from: String,
    /// `--kv-cache-dtype` as the vLLM emitter writes it (`None`: float16/bfloat16, which it
    /// does not emit).
    pub vllm_kv: Option<memwall_core::emit::VllmKvCacheDtype>,
    /// `--emit`/`--out`.
    pub emit: EmitArgs,
    /// `--quantization` as validated, for the `vllm serve` command line.
    pub vllm_quantization: Option<String>,
    /// Output format.
    pub format: Format,
}

impl ServeSettings {
    /// Resolves raw arguments (every field destructured).
    pub fn resolve(a: ServeArgs) -> Result<Self> {
        let ServeArgs {
            model,
            gpu,
            tp,
            gpu_memory_utilization,
            kv_cache_dtype,
            quantization,
            weights,
            block_size,
            max_model_len,
            max_num_batched_tokens,
            max_num_seqs,
            enforce_eager,
            kv_cache_memory_bytes,
            non_torch_bytes,
            activation_bytes,
            cuda_graph_bytes,
            enable_prefix_caching,
            no_enable_prefix_caching,
            request_lengths,
            emit,
            output,
        } = a;
        let format = output.resolve()?;
        let model = model_source::load(&model)?;
        let gpu = resolve_gpu(&gpu)?;
        // checkpoints in bf16/fp16; `--kv-cache-dtype auto` stores the KV cache in that dtype
        let dtype_bytes = 2;
        let explicit = weights
            .as_deref()
            .map(memwall_core::workload::WeightFormat::parse)
            .transpose()?;
        let (serve_weights, weights_from) =
            crate::weights::choose_serve(&model, quantization.as_deref(), explicit)?;
        let request = memwall_core::serve::ServeRequest {
            tp,
            gpu_memory_utilization,
            kv_dtype_bytes: match kv_cache_dtype {
                ServeKvArg::Auto | ServeKvArg::Float16 | ServeKvArg::Bfloat16 => dtype_bytes,
                ServeKvArg::Fp8 | ServeKvArg::Fp8E4m3 | ServeKvArg::Fp8E5m2 => 1,
            },
            dtype_bytes,
            weights: serve_weights,
            block_size,
            max_model_len,
            max_num_batched_tokens,
            max_num_seqs,
            enforce_eager,
            kv_cache_memory_bytes,
            non_torch_bytes,
            activation_bytes,
            cuda_graph_bytes,
            enable_prefix_caching: match (enable_prefix_caching, no_enable_prefix_caching) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
        };
        use memwall_core::emit::VllmKvCacheDtype as V;
        let vllm_kv = match kv_cache_dtype {
            ServeKvArg::Auto => Some(V::Auto),
            ServeKvArg::Fp8 => Some(V::Fp8),
            ServeKvArg::Fp8E4m3 => Some(V::Fp8E4m3),
            ServeKvArg::Fp8E5m2 => Some(V::Fp8E5m2),
            ServeKvArg::Float16 | ServeKvArg::Bfloat16 => None,
        };
        Ok(ServeSettings {
            model,
            gpu,
            request,
            request_lengths,
            vllm_kv,
            emit,
            weights_from,
            vllm_quantization: quantization.map(|q| untrusted(&q.trim().to_ascii_lowercase())),
            format,
        })
    }
}

/// `memwall plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Catalogue id, Hugging Face repo id, path to a config.json or a model directory.
    #[arg(long, short = 'm', default_value = "llama-3.1-8b")]
    pub model: String,
    /// GPU (see `memwall gpus`).
    #[arg(long, default_value = "h100-sxm")]
    pub gpu: String,
    /// GPUs in the cluster.
    #[arg(long, default_value_t = 8)]
    pub gpus: u64,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u64,
    /// Tokens per sequence.
    #[arg(long, short = 's', default_value_t = 2048)]
    pub seq: u64,
    /// Sequences per optimizer step (micro-batch × accumulation × data-parallel ranks).
    #[arg(long, default_value_t = 32)]
    pub global_batch: u64,
    /// Host memory per node for offload, bytes (unchecked when absent).
    #[arg(long)]
    pub host_memory_per_node: Option<u64>,
    /// Changes the search may make, comma-separated. Those that change the training result are
    /// labelled in every plan that uses them.
    #[arg(long, value_delimiter = ',', value_parser = named::<AllowItem>())]
    pub allow: Vec<AllowItem>,
    /// Drop plans slower than this many seconds per optimizer step.
    #[arg(long)]
    pub max_step_s: Option<f64>,
    /// Plans to show.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Precision of the training as asked (the search may also try pure bf16; see --allow).
    #[arg(long, value_parser = named::<Precision>(), default_value = "amp-bf16")]
    pub precision: Precision,
    /// Optimizer as asked (the search also tries its fused twin).
    #[arg(long, value_parser = named::<Optimizer>(), default_value = "adamw")]
    pub optimizer: Optimizer,
    /// Attention implementation.
    #[arg(long, value_parser = named::<AttentionImpl>(), default_value = "sdpa")]
    pub attention: AttentionImpl,
    /// Loss kernel.
    #[arg(long, value_parser = named::<LossKernel>(), default_value = "torch")]
    pub loss: LossKernel,
    /// What checkpointing recomputes in the plans that checkpoint (as `memwall train
    /// --checkpointing-policy`): `full`, `every-k:K`, `selective-attn` or `selective-op`.
    #[arg(long, value_name = "POLICY", default_value = "full")]
    pub checkpointing_policy: String,
    /// The model's `use_cache` while training (as `memwall train --use-cache`).
    #[arg(long, value_name = "BOOL")]
    pub use_cache: Option<bool>,
    /// Training loop (as `memwall train --loop`): every plan keeps it.
    #[arg(long = "loop", value_name = "LOOP", value_parser = named::<TrainLoop>(), default_value = "trainer")]
    pub train_loop: TrainLoop,
    /// Layer kernels (`liger`: Liger-Kernel, implies --loss fused-linear; see `memwall train --help`).
    #[arg(long, value_parser = named::<KernelSet>(), default_value = "torch")]
    pub kernels: KernelSet,
    /// Disable dropout.
    #[arg(long)]
    pub no_dropout: bool,
    /// LoRA rank when --allow lora/qlora [default: 16].
    #[arg(long)]
    pub lora_rank: Option<u64>,
    /// LoRA targets when --allow lora/qlora (default: the attention projections).
    #[arg(long, value_delimiter = ',')]
    pub lora_targets: Vec<String>,
    /// Allocator margin of the fit test (fraction of the peak; see `memwall train --help`).
    #[arg(long, default_value_t = memwall_core::plan::DEFAULT_ALLOC_MARGIN)]
    pub alloc_margin: f64,
    /// With --emit: which plan to emit (1 = the fastest).
    #[arg(long, default_value_t = 1, requires = "emit", help_heading = "Launch")]
    pub plan_rank: usize,
    /// --emit/--out for the plan of --plan-rank.
    #[command(flatten)]
    pub emit: EmitArgs,
    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
    /// Whose training code the plans run (as `memwall train --runtime`): `torchtitan` plans
    /// are FSDP2 layouts of torchtitan's own Llama 3, Qwen 3 (dense, MoE) or DeepSeek-V3 (with its tensor + sequence parallelism,
    /// tp 1/2/4/8 within a node), one micro-batch per rank per step, and --emit torchtitan
    /// launches them.
    #[arg(long, value_parser = named::<Runtime>(), default_value = "hf")]
    pub runtime: Runtime,
}

/// Resolved `plan` settings.
#[derive(Debug)]
pub struct PlanSettings {
    /// Model.
    pub model: ModelSource,
    /// GPU.
    pub gpu: &'static GpuSpec,
    /// The search.
    pub request: memwall_core::plan::PlanRequest,
    /// The plan `--emit` writes (1 = the fastest).
    pub plan_rank: usize,
    /// `--emit`/`--out`.
    pub emit: EmitArgs,
    /// Output format.
    pub format: Format,
    /// `--runtime`: whose training code the plans run.
    pub runtime: Runtime,
}

impl PlanSettings {
    /// Resolves raw arguments (every field destructured).
    pub fn resolve(a: PlanArgs) -> Result<Self> {
        let PlanArgs {
            model,
            gpu,
            gpus,
            gpus_per_node,
            seq,
            global_batch,
            host_memory_per_node,
            allow,
            max_step_s,
            top,
            precision,
            optimizer,
            attention,
            loss,
            checkpointing_policy,
            train_loop,
            use_cache,
            kernels,
            no_dropout,
            lora_rank,
            lora_targets,
            alloc_margin,
            plan_rank,
            emit,
            output,
            runtime,
        } = a;
        let format = output.resolve()?;
        count("plan_rank", plan_rank as u64, top as u64)?;
        count("gpus", gpus, memwall_core::layout::MAX_GPUS)?;
        count(
            "gpus_per_node",
            gpus_per_node,
            memwall_core::layout::MAX_GPUS,
        )?;
        count("seq", seq, limits::MAX_SEQ)?;
        count(
            "global_batch",
            global_batch,
            limits::MAX_BATCH.saturating_mul(limits::MAX_GRAD_ACCUM),
        )?;
        count("top", top as u64, 1000)?;
        if let Some(r) = lora_rank {
            count("lora_rank", r, limits::MAX_LORA_RANK)?;
        }
        let lora_allowed = allow
            .iter()
            .any(|a| matches!(a, AllowItem::Lora | AllowItem::Qlora));
        if !lora_allowed && (lora_rank.is_some() || !lora_targets.is_empty()) {
            let (flag, value) = match lora_rank {
                Some(r) => ("--lora-rank", r.to_string()),
                None => ("--lora-targets", lora_targets.join(",")),
            };
            return Err(UserError::flag(
                flag,
                value,
                "the search tries LoRA only when --allow admits it (LoRA changes the training result)",
                "add --allow lora (or qlora) to let plans use these adapters, or drop the LoRA flags",
            )
            .into());
        }
        let lora_rank = lora_rank.unwrap_or(16);
        memwall_core::plan::check_alloc_margin(alloc_margin)?;
        if let Some(t) = max_step_s {
            if !(t.is_finite() && t > 0.0) {
                return Err(UserError::new(
                    format!(
                        "invalid --max-step-s {}: must be a positive number of seconds",
                        untrusted(&t.to_string())
                    ),
                    "give the slowest acceptable optimizer step in seconds, e.g. --max-step-s 10",
                )
                .into());
            }
        }
        if gpus > gpus_per_node && !gpus.is_multiple_of(gpus_per_node) {
            return Err(UserError::new(
                format!(
                    "invalid --gpus {gpus}: not whole nodes of --gpus-per-node {gpus_per_node}"
                ),
                "make --gpus a multiple of --gpus-per-node",
            )
            .into());
        }
        let model = model_source::load(&model)?;
        let gpu = resolve_gpu(&gpu)?;
        let lora = if lora_targets.is_empty() {
            memwall_core::plan::default_lora(&model.desc)
        } else {
            check_lora_targets(&model, &lora_targets)?;
            Lora {
                rank: lora_rank,
                targets: lora_targets,
                qlora: false,
            }
        };
        let mut base = TrainWorkload::new(1, seq);
        base.precision = precision;
        base.optimizer = optimizer;
        base.attention = attention;
        base.dropout = !no_dropout;
        base.kernels.loss = loss_with(kernels, loss)?;
        base.kernels.layers = kernels;
        base.step_options.outputs = train_loop;
        base.step_options.use_cache = use_cache;
        base.step_options.checkpointing_policy = checkpointing_policy.parse()?;
        // refused up front: the search would otherwise find no plan without saying why
        memwall_core::liger::check(&model.desc, &base)?;
        memwall_core::memory::check_attention(&model.desc, base.attention)?;
        if runtime == Runtime::Torchtitan {
            check_titan_plan(&model, &base, &allow)?;
        }
        let request = memwall_core::plan::PlanRequest {
            gpus,
            gpus_per_node,
            seq,
            global_batch,
            host_memory_per_node,
            allow: memwall_core::plan::Allow::from_items(&allow),
            base,
            lora: Lora {
                rank: lora_rank,
                ..lora
            },
            max_step_s,
            top,
            alloc_margin,
            kernels: Kernels::Cuda,
            runtime,
        };
        Ok(PlanSettings {
            runtime,
            model,
            gpu,
            request,
            plan_rank,
            emit,
            format,
        })
    }
}

/// `memwall doctor`: the train doctor on train's flags, or `doctor infer` on infer's.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DoctorArgs {
    /// `infer`: the inference doctor.
    #[command(subcommand)]
    pub infer: Option<DoctorInfer>,
    /// The training configuration (as `memwall train`).
    #[command(flatten)]
    pub train: TrainArgs,
}

/// `memwall doctor infer`.
#[derive(Debug, Subcommand)]
pub enum DoctorInfer {
    /// The inference doctor (flags as `memwall infer`).
    Infer(InferArgs),
}

/// Refuses LoRA targets that are not linear layers of `model`, naming them and the choices.
fn check_lora_targets(model: &ModelSource, targets: &[String]) -> Result<()> {
    let mut known: Vec<&str> = Vec::new();
    for (_, n) in &model.desc.linear_names {
        if !known.contains(&n.as_str()) {
            known.push(n.as_str());
        }
    }
    for t in targets {
        if !known.contains(&t.as_str()) {
            // a MoE family whose expert names peft maps onto the routed experts: say so
            if let Some(e) = memwall_core::memory::expert_target_refusal(&model.desc, t) {
                return Err(crate::error::from_core(&e).into());
            }
            return Err(UserError::flag(
                "--lora-targets",
                format!("`{}`", untrusted(t)),
                format!("not a linear layer of this {} model", model.desc.model_type),
                format!("pick from its linear layers: {}", known.join(", ")),
            )
            .into());
        }
    }
    Ok(())
}

/// `--emit KIND [--out DIR]`: the config files that launch the estimated configuration.
#[derive(Debug, Clone, Args)]
pub struct EmitArgs {
    /// Write the config files of this engine for the estimated configuration: deepspeed,
    /// accelerate, trainer, torchrun, megatron, torchtitan (train and plan), vllm (serve).
    #[arg(long, value_parser = emit_kind(), help_heading = "Launch")]
    pub emit: Option<memwall_core::emit::EmitKind>,
    /// Directory to write the emitted files into (created if missing); without it the files are
    /// printed to stdout instead of the report.
    #[arg(long, requires = "emit", help_heading = "Launch")]
    pub out: Option<std::path::PathBuf>,
}

/// The value parser of `--emit`: the kinds' names from the emitters' own table.
fn emit_kind() -> impl clap::builder::TypedValueParser<Value = memwall_core::emit::EmitKind> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(memwall_core::emit::EmitKind::ALL.map(|(_, n)| n))
        .try_map(|s| memwall_core::emit::EmitKind::parse(&s))
}
