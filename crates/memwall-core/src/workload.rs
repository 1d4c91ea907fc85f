//! What the user runs: a training step's settings, validated.

use crate::error::CoreError;
use serde::Serialize;

pub use crate::dtype::Precision;
pub use crate::optimizer::Optimizer;

crate::names::named_enum! {
    /// Attention implementation (transformers `attn_implementation`).
    pub enum AttentionImpl in "attention" {
        /// `torch.nn.functional.scaled_dot_product_attention` (flash/efficient kernels: saves output + logsumexp).
        Sdpa = "sdpa": "torch SDPA (flash/efficient kernels)",
        /// transformers `eager_attention_forward`: materialises the probabilities.
        Eager = "eager": "transformers eager attention (materialises probabilities)",
        /// `flash_attention_2`: saves q, k, v, output and logsumexp like SDPA's flash kernel.
        Flash = "flash": "flash_attention_2",
    }
}

crate::names::named_enum! {
    /// How the loss is computed from the last hidden states (`--loss`).
    #[derive(Default)]
    pub enum LossKernel in "loss" {
        /// transformers `ForCausalLMLoss`: the LM head's logits, their fp32 upcast and
        /// `cross_entropy` (log-softmax saved, a full fp32 gradient in backward).
        #[default]
        Torch = "torch": "transformers ForCausalLMLoss (fp32 upcast + cross_entropy)",
        /// A fused softmax-cross-entropy over the low-precision logits that writes the gradient
        /// into the logits in place (flash-attn `cross_entropy_loss(inplace_backward=True)`).
        Fused = "fused": "fused cross-entropy over bf16/fp16 logits, gradient in place (flash-attn)",
        /// Fused linear cross-entropy: the logits are never materialised, only one chunk of
        /// rows at a time, gradients computed in the forward (Liger `LigerFusedLinearCrossEntropy`).
        FusedLinear = "fused-linear": "fused linear cross-entropy, no logits tensor (Liger)",
    }
}

crate::names::named_enum! {
    /// Which kernels run the decoder layers' norms, gated activations and rotary embedding
    /// (`--kernels`).
    #[derive(Default)]
    pub enum KernelSet in "kernels" {
        /// transformers' eager modules (`LlamaRMSNorm`, `act_fn(gate) * up`, `apply_rotary_pos_emb`).
        #[default]
        Torch = "torch": "transformers' eager modules",
        /// Liger-Kernel's Triton kernels as transformers' `use_liger_kernel=True` patches them in
        /// (RMSNorm, SwiGLU/GeGLU, RoPE; with Liger's fused linear cross-entropy as the loss).
        Liger = "liger": "Liger-Kernel (use_liger_kernel=True): RMSNorm, SwiGLU/GeGLU, RoPE, fused linear cross-entropy",
        /// Only a fused RMSNorm kernel (Liger's `LigerRMSNormFunction` alone, as
        /// `liger_kernel_config` with only `rms_norm` gives; torchtitan's `fused_rmsnorm` keeps
        /// the same tensors: input, weight and an fp32 rstd per row); activations, RoPE and the
        /// loss stay eager.
        Rmsnorm = "rmsnorm": "a fused RMSNorm kernel only (Liger's, or torchtitan's fused_rmsnorm)",
    }
}

/// The kernels a training step runs where the eager transformers step has alternatives users
/// switch on (TRL/transformers `use_liger_kernel`, `padding_free`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KernelOptions {
    /// The loss computation.
    pub loss: LossKernel,
    /// Padding-free batches (transformers `DataCollatorWithFlattening`, TRL `padding_free`): the
    /// `batch` sequences of `seq` tokens are packed into one row of `batch × seq` tokens with
    /// position ids restarting per sequence, so `seq` is the mean length of the real sequences,
    /// not the longest. No KV cache is built (transformers detects packed sequences only
    /// without one).
    pub padding_free: bool,
    /// The layer kernels (norms, gated activations, rotary embedding).
    pub layers: KernelSet,
}

impl KernelOptions {
    /// The eager transformers defaults (`torch` loss, padded batches).
    pub fn is_default(&self) -> bool {
        *self == KernelOptions::default()
    }
}

crate::names::named_enum! {
    /// How the training loop holds the model's output object (`--loop`).
    #[derive(Default)]
    pub enum TrainLoop in "loop" {
        /// The HF Trainer (`Trainer.compute_loss`): only the loss is kept; the output object
        /// (logits, KV cache) is dropped as soon as the model call returns.
        #[default]
        Trainer = "trainer": "HF Trainer: only the loss is kept, the output object (logits, KV cache) is dropped at once",
        /// The HF `no_trainer` / accelerate examples (`outputs = model(**batch);
        /// loss = outputs.loss; accelerator.backward(loss)`, transformers
        /// `examples/pytorch/language-modeling/run_clm_no_trainer.py`): the output object stays
        /// bound, so its logits and KV cache live through backward, the optimizer step and the
        /// next forward, until the name is rebound when that forward returns.
        KeepOutputs = "keep-outputs": "outputs = model(**batch) kept (HF no_trainer/accelerate examples): logits and KV cache live until the next forward returns",
    }
}

/// Which decoder layers activation checkpointing recomputes (`--checkpointing-policy`; only
/// meaningful with checkpointing on).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum CheckpointPolicy {
    /// Every decoder layer: transformers `gradient_checkpointing_enable()` (non-reentrant),
    /// torchtitan `activation_checkpoint.mode = "full"`, Megatron-LM
    /// `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`.
    #[default]
    Full,
    /// Every k-th decoder layer, layers `k-1, 2k-1, …` (torchtitan's layer-level selective AC,
    /// `selective_ac_option = "<k>"`: `torchtitan/models/llama3/infra/parallelize.py`
    /// `_apply_ac_to_transformer_block` counts the blocks from 1 and wraps those with
    /// `count % k == 0`); the other layers keep their activations. `every-k:1` is `full`.
    EveryK(u64),
    /// Megatron-LM's selective recomputation (`--recompute-granularity selective`,
    /// megatron/core/transformer/attention.py `_checkpointed_attention_forward`; Korthikanti et
    /// al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §5): in every
    /// layer only the core attention (transformers' attention function: `repeat_kv`, the
    /// kernel or softmax(QKᵀ)V, the output's contiguous copy) runs under a non-reentrant
    /// checkpoint that keeps its inputs (q, k, v, the mask) and recomputes it in backward.
    SelectiveAttn,
    /// torchtitan's op-level selective activation checkpointing (torchtitan 0.3.0,
    /// `torchtitan/distributed/activation_checkpoint.py` `SelectiveAC`): every decoder layer
    /// runs under a non-reentrant checkpoint (`early_stop=False`) with PyTorch's SAC
    /// (`torch.utils.checkpoint.create_selective_checkpoint_contexts`); the outputs of the
    /// compute-intensive ops (`mm`, `addmm`, `bmm`, the SDPA kernels, `topk`) are kept and
    /// everything else is recomputed, except that every second unbiased matmul (`mm`/`linear`,
    /// counted per layer call) is recomputed too ("save every other mm"). Simulated on
    /// transformers' decoder layers (`memory/hf/sac.rs`) and on torchtitan's own model
    /// (`--runtime torchtitan`, `memory/titan/`).
    SelectiveOp,
}

impl CheckpointPolicy {
    /// The field name errors use.
    pub const FIELD: &'static str = "checkpointing_policy";
    /// The accepted spellings, for help and errors.
    pub const SYNTAX: &'static str = "full, every-k:K, selective-attn, selective-op";

    /// Whether decoder layer `layer` (0-based, full-model index) is checkpointed whole.
    pub fn covers(self, layer: usize) -> bool {
        match self {
            CheckpointPolicy::Full | CheckpointPolicy::SelectiveOp => true,
            CheckpointPolicy::SelectiveAttn => false,
            CheckpointPolicy::EveryK(k) => {
                let k = usize::try_from(k).unwrap_or(usize::MAX).max(1);
                (layer + 1).is_multiple_of(k)
            }
        }
    }

    /// The CLI name (`full`, `every-k:4`).
    pub fn name(self) -> String {
        match self {
            CheckpointPolicy::Full => "full".into(),
            CheckpointPolicy::EveryK(k) => format!("every-k:{k}"),
            CheckpointPolicy::SelectiveAttn => "selective-attn".into(),
            CheckpointPolicy::SelectiveOp => "selective-op".into(),
        }
    }

    /// Whether only the core attention of every layer is checkpointed.
    pub fn recomputes_attention_only(self) -> bool {
        self == CheckpointPolicy::SelectiveAttn
    }

    /// Whether the checkpointed layers keep the outputs of their compute-intensive ops
    /// (torchtitan's op-level selective AC) instead of recomputing everything.
    pub fn saves_matmuls(self) -> bool {
        self == CheckpointPolicy::SelectiveOp
    }

    /// Fraction of the decoder layers recomputed whole (`covers` over `layers` layers).
    pub fn share(self, layers: usize) -> f64 {
        if layers == 0 {
            return 0.0;
        }
        let n = (0..layers).filter(|&i| self.covers(i)).count();
        n as f64 / layers as f64
    }
}

impl std::fmt::Display for CheckpointPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl std::str::FromStr for CheckpointPolicy {
    type Err = CoreError;

    /// Parses `full` or `every-k:K` with K in `1..=`[`limits::MAX_CHECKPOINT_EVERY`].
    fn from_str(s: &str) -> Result<Self, CoreError> {
        match s {
            "full" => return Ok(CheckpointPolicy::Full),
            "selective-attn" => return Ok(CheckpointPolicy::SelectiveAttn),
            "selective-op" => return Ok(CheckpointPolicy::SelectiveOp),
            _ => {}
        }
        if let Some(k) = s.strip_prefix("every-k:") {
            if let Ok(k) = k.parse::<u64>() {
                if (1..=limits::MAX_CHECKPOINT_EVERY).contains(&k) {
                    return Ok(CheckpointPolicy::EveryK(k));
                }
            }
            return Err(CoreError::invalid_value(
                Self::FIELD,
                s,
                format!(
                    "K must be a whole number of layers in 1..={}",
                    limits::MAX_CHECKPOINT_EVERY
                ),
                "every-k:K checkpoints every K-th decoder layer, e.g. every-k:2",
            ));
        }
        Err(CoreError::invalid_value(
            Self::FIELD,
            s,
            format!("unknown policy (accepted: {})", Self::SYNTAX),
            "use full (every layer), every-k:K (every K-th layer, torchtitan's layer-level selective AC) selective-attn (only the core attention, Megatron-LM's selective recomputation) or selective-op (torchtitan's op-level selective AC: matmul and attention outputs kept)",
        ))
    }
}

impl Serialize for CheckpointPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

/// How the training step is driven around the model: the loop that calls it, the checkpointing
/// policy and the KV cache (left out of JSON when they are the HF Trainer's defaults).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StepOptions {
    /// What the loop keeps of the model's output.
    #[serde(rename = "loop")]
    pub outputs: TrainLoop,
    /// Which layers checkpointing recomputes (with `checkpointing` on).
    pub checkpointing_policy: CheckpointPolicy,
    /// The model's `use_cache` in training (`model.config.use_cache = …`); `None`: the config's
    /// (true when absent). Without checkpointing, a forward with it on builds a `DynamicCache`
    /// whose `torch.cat` copies of k and v are what attention saves; checkpointing forces it off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_cache: Option<bool>,
    /// Activation offloading to host memory: the loop runs the model's forward (loss included)
    /// under `torch.autograd.graph.save_on_cpu(pin_memory=True)` and calls `backward()` outside
    /// it (`--activation-offload`). Every tensor autograd saves is copied to pinned host memory
    /// and copied back when its node's backward runs.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub activation_offload: bool,
}

impl StepOptions {
    /// The HF Trainer's loop, full checkpointing.
    pub fn is_default(&self) -> bool {
        *self == StepOptions::default()
    }

    /// The output object is kept until the next forward returns.
    pub fn keeps_outputs(&self) -> bool {
        self.outputs == TrainLoop::KeepOutputs
    }
}

/// LoRA adapters (peft semantics).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lora {
    /// Adapter rank `r`.
    pub rank: u64,
    /// Target module names as transformers names them (`q_proj`, `c_attn`, …).
    pub targets: Vec<String>,
    /// QLoRA: frozen base quantised to 4-bit NF4 with double quantisation (bitsandbytes).
    pub qlora: bool,
}

/// A training step to simulate (on whichever engine `engine::Engine::resolve` picks).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainWorkload {
    /// Micro-batch size.
    pub batch: u64,
    /// Sequence length.
    pub seq: u64,
    /// Precision.
    pub precision: Precision,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// HF per-decoder-layer activation checkpointing (non-reentrant).
    pub checkpointing: bool,
    /// Attention implementation.
    pub attention: AttentionImpl,
    /// LoRA adapters, if any.
    pub lora: Option<Lora>,
    /// Micro-batches per optimizer step.
    pub grad_accum: u64,
    /// Dropout as the config says (`true`) or disabled (`false`).
    pub dropout: bool,
    /// Fused kernels and padding-free batches (left out of JSON when they are the defaults).
    #[serde(skip_serializing_if = "KernelOptions::is_default")]
    pub kernels: KernelOptions,
    /// The training loop around the model (left out of JSON when it is the HF Trainer's).
    #[serde(skip_serializing_if = "StepOptions::is_default")]
    pub step_options: StepOptions,
}

/// The bounds every front end applies to user input, from one place: counts stay far from
/// overflow in every size computation (see `memory`), and fractions stay in a range where no
/// time or rate can become infinite or NaN.
pub mod limits {
    use crate::error::CoreError;

    /// Largest accepted batch (also `max_num_seqs` for serving).
    pub const MAX_BATCH: u64 = 1 << 16;
    /// Largest accepted sequence length (train, prefill, decode context, prompt + new tokens).
    pub const MAX_SEQ: u64 = 1 << 22;
    /// Largest accepted gradient accumulation.
    pub const MAX_GRAD_ACCUM: u64 = 1 << 16;
    /// Largest accepted LoRA rank.
    pub const MAX_LORA_RANK: u64 = 1 << 16;
    /// Largest accepted K of `--checkpointing-policy every-k:K` (beyond any layer count).
    pub const MAX_CHECKPOINT_EVERY: u64 = 1 << 16;
    /// Largest serving context (`max_model_len`, request lengths): the largest
    /// `max_position_embeddings` a config may state (`memwall_formats::limits::MAX_POSITIONS`).
    pub const MAX_CONTEXT: u64 = 1 << 26;
    /// Largest `max_num_batched_tokens` (vLLM's profile-run size). The profile-run activation
    /// estimate multiplies it by up to 2^37 bytes per token for the largest accepted model, so
    /// 2^24 keeps it below 2^63.
    pub const MAX_BATCHED_TOKENS: u64 = 1 << 24;
    /// Smallest accepted efficiency or memory fraction: below 1 % a time would be 100× the
    /// roofline bound, and at 0 it would be infinite.
    pub const MIN_FRACTION: f64 = 0.01;
    /// Largest accepted efficiency or memory fraction.
    pub const MAX_FRACTION: f64 = 1.0;

    /// `value` of `field` if it lies in `1..=max`.
    pub fn count(field: &'static str, value: u64, max: u64) -> Result<u64, CoreError> {
        if value == 0 || value > max {
            Err(CoreError::out_of_range(field, value, 1, max))
        } else {
            Ok(value)
        }
    }

    /// `value` of `field` if it is a fraction in [`MIN_FRACTION`, `MAX_FRACTION`] (NaN and
    /// infinities are refused).
    pub fn fraction(field: &'static str, value: f64) -> Result<f64, CoreError> {
        if (MIN_FRACTION..=MAX_FRACTION).contains(&value) {
            Ok(value)
        } else {
            // `{:?}` writes 5e-324 as such, not as 324 digits
            Err(CoreError::invalid_value(
                field,
                format!("{value:?}"),
                format!("must be in [{MIN_FRACTION}, {MAX_FRACTION}]"),
                match field {
                    "gpu_memory_utilization" => format!(
                        "`{field}` is the share of the GPU's memory vLLM may take: between {MIN_FRACTION} and {MAX_FRACTION} (vLLM's default is 0.92)"
                    ),
                    _ => format!(
                        "`{field}` is a fraction of the peak between {MIN_FRACTION} and {MAX_FRACTION}: 1 is the roofline bound itself, 0.4–0.8 is typical"
                    ),
                },
            ))
        }
    }
}

impl TrainWorkload {
    /// Whether decoder layer `layer` (full-model index) runs under activation checkpointing:
    /// checkpointing is on and its policy covers the layer.
    pub fn checkpoints_layer(&self, layer: usize) -> bool {
        self.checkpointing && self.step_options.checkpointing_policy.covers(layer)
    }

    /// A default bf16 AdamW step.
    pub fn new(batch: u64, seq: u64) -> Self {
        TrainWorkload {
            batch,
            seq,
            precision: Precision::Bf16,
            optimizer: Optimizer::Adamw,
            checkpointing: false,
            attention: AttentionImpl::Sdpa,
            lora: None,
            grad_accum: 1,
            dropout: true,
            kernels: KernelOptions::default(),
            step_options: StepOptions::default(),
        }
    }

    /// Checks ranges; returns the first offending field.
    pub fn validate(&self) -> Result<(), CoreError> {
        limits::count("batch", self.batch, limits::MAX_BATCH)?;
        limits::count("seq", self.seq, limits::MAX_SEQ)?;
        limits::count("grad_accum", self.grad_accum, limits::MAX_GRAD_ACCUM)?;
        let policy = self.step_options.checkpointing_policy;
        if let CheckpointPolicy::EveryK(k) = policy {
            limits::count(CheckpointPolicy::FIELD, k, limits::MAX_CHECKPOINT_EVERY)?;
        }
        if policy != CheckpointPolicy::Full && !self.checkpointing {
            return Err(CoreError::invalid_value(
                CheckpointPolicy::FIELD,
                policy.name(),
                "a checkpointing policy needs checkpointing on",
                "turn `checkpointing` on, or leave the policy at full",
            ));
        }
        if self.step_options.activation_offload {
            let clash = if self.checkpointing {
                Some("checkpointing")
            } else if self.kernels.loss != LossKernel::Torch {
                Some("a fused loss")
            } else if self.kernels.layers != KernelSet::Torch {
                Some("fused layer kernels")
            } else if self.kernels.padding_free {
                Some("padding-free batches")
            } else if self.lora.as_ref().is_some_and(|l| l.qlora) {
                Some("QLoRA")
            } else {
                None
            };
            if let Some(what) = clash {
                return Err(CoreError::invalid_value(
                    "activation_offload",
                    "true",
                    format!("activation offloading with {what} is not modelled"),
                    "offload activations without checkpointing, fused kernels, padding-free batches or QLoRA (the combinations measured)",
                ));
            }
        }
        if let Some(l) = &self.lora {
            limits::count("lora_rank", l.rank, limits::MAX_LORA_RANK)?;
            if l.targets.is_empty() {
                return Err(CoreError::invalid_value(
                    "lora_targets",
                    "(none)",
                    "LoRA needs at least one target module",
                    "name the linear layers to adapt in `lora_targets`, e.g. q_proj,v_proj",
                ));
            }
        }
        Ok(())
    }
}

/// The GPTQ group size that stands for `group_size: -1` (one group per column: a group is
/// never larger than the input features, so the largest value gives exactly one).
pub const GPTQ_PER_COLUMN: u32 = u32::MAX;

/// Storage format of the weights for inference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeightFormat {
    /// bf16.
    Bf16,
    /// fp16.
    Fp16,
    /// fp32.
    Fp32,
    /// Block-wise fp8 (128×128 scales; transformers `FineGrainedFP8`).
    Fp8,
    /// bitsandbytes LLM.int8 (`load_in_8bit`).
    Int8,
    /// bitsandbytes 4-bit NF4 (`load_in_4bit`, `bnb_4bit_quant_type="nf4"`).
    Nf4 {
        /// `bnb_4bit_use_double_quant`.
        double_quant: bool,
    },
    /// bitsandbytes 4-bit FP4.
    Fp4 {
        /// `bnb_4bit_use_double_quant`.
        double_quant: bool,
    },
    /// GPTQ (AutoGPTQ layout, with `g_idx`).
    Gptq {
        /// Bits per weight.
        bits: u32,
        /// Group size.
        group: u32,
    },
    /// AWQ (AutoAWQ GEMM layout).
    Awq {
        /// Group size.
        group: u32,
    },
    /// A llama.cpp GGUF preset.
    Gguf(crate::quant::GgufPreset),
    /// MXFP4 routed experts (gpt-oss checkpoints, transformers `Mxfp4Config`): e2m1 values two
    /// per byte plus one e8m0 scale byte per 32 values; every `nn.Linear` stays in the compute
    /// dtype (see [`crate::quant::expert_bytes`]).
    Mxfp4,
}

impl WeightFormat {
    /// The measurable formats with their CLI names.
    pub const ALL: [(WeightFormat, &'static str); 3] = [
        (WeightFormat::Bf16, "bf16"),
        (WeightFormat::Fp16, "fp16"),
        (WeightFormat::Fp32, "fp32"),
    ];

    /// The CLI name of this format.
    pub fn name(&self) -> String {
        use crate::quant::{GgmlType as G, GgufPreset as P};
        match self {
            WeightFormat::Bf16 => "bf16".into(),
            WeightFormat::Fp16 => "fp16".into(),
            WeightFormat::Fp32 => "fp32".into(),
            WeightFormat::Fp8 => "fp8".into(),
            WeightFormat::Int8 => "int8".into(),
            WeightFormat::Nf4 { double_quant } => {
                if *double_quant { "nf4-dq" } else { "nf4" }.into()
            }
            WeightFormat::Fp4 { double_quant } => {
                if *double_quant { "fp4-dq" } else { "fp4" }.into()
            }
            WeightFormat::Gptq { bits, group } if *group == GPTQ_PER_COLUMN => {
                format!("gptq-int{bits}-per-column")
            }
            WeightFormat::Gptq { bits, group } => format!("gptq-int{bits}-g{group}"),
            WeightFormat::Awq { group } => format!("awq-int4-g{group}"),
            WeightFormat::Mxfp4 => "mxfp4".into(),
            WeightFormat::Gguf(p) => format!(
                "gguf-{}",
                match p {
                    P::Q4KM => "q4_k_m",
                    P::Q5KM => "q5_k_m",
                    P::Uniform(G::F32) => "f32",
                    P::Uniform(G::F16) => "f16",
                    P::Uniform(G::Bf16) => "bf16",
                    P::Uniform(G::Q4_0) => "q4_0",
                    P::Uniform(G::Q4_1) => "q4_1",
                    P::Uniform(G::Q5_0) => "q5_0",
                    P::Uniform(G::Q5_1) => "q5_1",
                    P::Uniform(G::Q8_0) => "q8_0",
                    P::Uniform(G::Q2K) => "q2_k",
                    P::Uniform(G::Q3K) => "q3_k",
                    P::Uniform(G::Q4K) => "q4_k",
                    P::Uniform(G::Q5K) => "q5_k",
                    P::Uniform(G::Q6K) => "q6_k",
                }
            ),
        }
    }

    /// Parses a CLI name: bf16, fp16, fp32, fp8, int8, nf4, nf4-dq, fp4, fp4-dq,
    /// gptq-int4-g128 (also int3/int8, any group; `gptq-int4-per-column` for `group_size: -1`),
    /// awq-int4-g128, gguf-q4_k_m, gguf-q5_k_m,
    /// gguf-q8_0, gguf-q6_k, gguf-q5_k, gguf-q4_k, gguf-q4_0, gguf-q4_1, gguf-q5_0, gguf-q5_1,
    /// gguf-q3_k, gguf-q2_k, gguf-f16.
    pub fn parse(s: &str) -> Result<WeightFormat, CoreError> {
        use crate::quant::{GgmlType, GgufPreset};
        let s = s.to_ascii_lowercase();
        let simple = match s.as_str() {
            "bf16" => Some(WeightFormat::Bf16),
            "fp16" | "f16" => Some(WeightFormat::Fp16),
            "fp32" | "f32" => Some(WeightFormat::Fp32),
            "fp8" => Some(WeightFormat::Fp8),
            "mxfp4" => Some(WeightFormat::Mxfp4),
            "int8" | "llm.int8" => Some(WeightFormat::Int8),
            "nf4" => Some(WeightFormat::Nf4 {
                double_quant: false,
            }),
            "nf4-dq" => Some(WeightFormat::Nf4 { double_quant: true }),
            "fp4" => Some(WeightFormat::Fp4 {
                double_quant: false,
            }),
            "fp4-dq" => Some(WeightFormat::Fp4 { double_quant: true }),
            _ => None,
        };
        if let Some(f) = simple {
            return Ok(f);
        }
        let grouped = |rest: &str| -> Option<(u32, u32)> {
            let (bits, group) = rest.split_once("-g")?;
            Some((bits.strip_prefix("int")?.parse().ok()?, group.parse().ok()?))
        };
        if let Some(rest) = s.strip_prefix("gptq-") {
            // `group_size: -1` in GPTQ configs: one group spanning each column
            if let Some(bits) = rest
                .strip_suffix("-per-column")
                .and_then(|b| b.strip_prefix("int"))
                .and_then(|b| b.parse::<u32>().ok())
                .filter(|b| [2, 3, 4, 8].contains(b))
            {
                return Ok(WeightFormat::Gptq {
                    bits,
                    group: GPTQ_PER_COLUMN,
                });
            }
            if let Some((bits, group)) =
                grouped(rest).filter(|(b, g)| [2, 3, 4, 8].contains(b) && *g > 0)
            {
                return Ok(WeightFormat::Gptq { bits, group });
            }
        }
        if let Some(rest) = s.strip_prefix("awq-") {
            if let Some((4, group)) = grouped(rest).filter(|(_, g)| *g > 0) {
                return Ok(WeightFormat::Awq { group });
            }
        }
        if let Some(rest) = s.strip_prefix("gguf-") {
            let preset = match rest {
                "q4_k_m" => Some(GgufPreset::Q4KM),
                "q5_k_m" => Some(GgufPreset::Q5KM),
                "f16" => Some(GgufPreset::Uniform(GgmlType::F16)),
                "q8_0" => Some(GgufPreset::Uniform(GgmlType::Q8_0)),
                "q6_k" => Some(GgufPreset::Uniform(GgmlType::Q6K)),
                "q5_k" => Some(GgufPreset::Uniform(GgmlType::Q5K)),
                "q4_k" => Some(GgufPreset::Uniform(GgmlType::Q4K)),
                "q3_k" => Some(GgufPreset::Uniform(GgmlType::Q3K)),
                "q2_k" => Some(GgufPreset::Uniform(GgmlType::Q2K)),
                "q4_0" => Some(GgufPreset::Uniform(GgmlType::Q4_0)),
                "q4_1" => Some(GgufPreset::Uniform(GgmlType::Q4_1)),
                "q5_0" => Some(GgufPreset::Uniform(GgmlType::Q5_0)),
                "q5_1" => Some(GgufPreset::Uniform(GgmlType::Q5_1)),
                _ => None,
            };
            if let Some(p) = preset {
                return Ok(WeightFormat::Gguf(p));
            }
        }
        Err(CoreError::invalid_value(
            "weights",
            &s,
            "unknown weight format",
            "use bf16, fp16, fp32, fp8, int8, nf4, nf4-dq, fp4, fp4-dq, gptq-int4-g128 (int2/3/4/8, any group, or gptq-int4-per-column), awq-int4-g128, or a gguf preset (gguf-q4_k_m, gguf-q5_k_m, gguf-q8_0, gguf-q6_k, gguf-q4_0, …)",
        ))
    }
}

crate::names::named_enum! {
    /// Element type of the KV cache.
    pub enum KvDtype in "kv_dtype" {
        /// Same as the compute dtype (transformers' default DynamicCache).
        Auto = "auto": "the compute dtype",
        /// bf16.
        Bf16 = "bf16": "bf16",
        /// fp16.
        Fp16 = "fp16": "fp16",
        /// fp8 (1 byte).
        Fp8 = "fp8": "fp8",
        /// int8 (1 byte).
        Int8 = "int8": "int8",
    }
}

/// An inference workload: `model.generate`-style prefill + decode (runtime profile `hf`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InferWorkload {
    /// Sequences decoded together.
    pub batch: u64,
    /// Prompt tokens per sequence.
    pub prompt: u64,
    /// New tokens generated per sequence (1 = prefill only).
    pub new_tokens: u64,
    /// Attention implementation.
    pub attention: AttentionImpl,
    /// Weight format.
    pub weights: WeightFormat,
    /// KV cache element type.
    pub kv_dtype: KvDtype,
    /// MoE decode runs transformers' `batched_mm` experts (what `generate` switches to on a
    /// GPU) rather than `grouped_mm`.
    pub moe_decode_batched: bool,
}

impl InferWorkload {
    /// Checks ranges; returns the first offending field.
    pub fn validate(&self) -> Result<(), CoreError> {
        limits::count("batch", self.batch, limits::MAX_BATCH)?;
        limits::count("prompt", self.prompt, limits::MAX_SEQ)?;
        limits::count("new_tokens", self.new_tokens, limits::MAX_SEQ)?;
        if self.prompt + self.new_tokens > limits::MAX_SEQ {
            return Err(CoreError::invalid_value(
                "new_tokens",
                self.new_tokens,
                format!(
                    "`prompt` {} + `new_tokens` {} exceed the sequence limit {}",
                    self.prompt,
                    self.new_tokens,
                    limits::MAX_SEQ
                ),
                format!("keep `prompt` + `new_tokens` at most {}", limits::MAX_SEQ),
            ));
        }
        Ok(())
    }
}
