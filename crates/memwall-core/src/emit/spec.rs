//! What a launch needs to know: the estimated training step ([`LaunchSpec`]) or vLLM deployment
//! ([`ServeLaunchSpec`]), resolved once from the same inputs the estimate used.

use super::EmitError;
use crate::layout::{Layout, Offload, OffloadDevice, Schedule, Strategy};
use crate::memory::dist::DEEPSPEED_REDUCE_BUCKET_ELEMS;
use crate::model::{Activation, AttentionKind, Mlp, ModelDesc, NormKind, Residual};
use crate::serve::ServeConfig;
use crate::workload::{KvDtype, TrainWorkload, WeightFormat};

/// Where the emitted files came from: the memwall command and a one-line estimate. Written into
/// the header comment of every file whose format has comments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Provenance {
    /// The memwall command line that produced the estimate (e.g. `memwall train llama-3.1-70b …`).
    pub command: String,
    /// The estimate in one line (e.g. `peak 71.2 GiB/GPU (ranks 0-7), fits 80 GiB`).
    pub estimate: String,
}

/// Engine settings the simulator assumed. Each value is the engine default the memory model
/// was written against; the emitters write them explicitly so that a launched run cannot drift
/// from the estimate when an engine changes a default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConstants {
    /// DeepSpeed `zero_optimization.reduce_bucket_size` (elements): the ipg gradient bucket
    /// (`crate::memory::dist::DEEPSPEED_REDUCE_BUCKET_ELEMS`).
    pub reduce_bucket_elems: u64,
    /// DeepSpeed `stage3_prefetch_bucket_size` (elements) — `ZERO3_PREFETCH_ELEMS` in
    /// `memory/hf/shard.rs`.
    pub zero3_prefetch_elems: u64,
    /// DeepSpeed `stage3_param_persistence_threshold` (elements) — `ZERO3_PERSISTENCE_ELEMS` in
    /// `memory/hf/shard.rs`.
    pub zero3_persistence_elems: u64,
    /// DeepSpeed `sub_group_size` (elements) — `ZERO3_SUB_GROUP_ELEMS` in `memory/hf/shard.rs`.
    pub zero3_sub_group_elems: u64,
    /// ZeRO-Infinity `offload_param.buffer_count` (`nvme_swap_buffer_bytes` in `memory/dist.rs`).
    pub nvme_param_buffer_count: u64,
    /// ZeRO-Infinity `offload_optimizer.buffer_count` (same source).
    pub nvme_optimizer_buffer_count: u64,
    /// ZeRO-Infinity `offload_param.buffer_size` (elements; same source).
    pub nvme_buffer_elems: u64,
}

impl EngineConstants {
    /// The values `crate::memory` simulates. DeepSpeed 0.19.8 defaults
    /// (`deepspeed/runtime/zero/config.py`, `deepspeed/runtime/zero/offload_config.py`); the
    /// tests in `emit/tests.rs` check each against the simulator's output.
    pub const SIMULATED: EngineConstants = EngineConstants {
        reduce_bucket_elems: DEEPSPEED_REDUCE_BUCKET_ELEMS,
        zero3_prefetch_elems: 50_000_000,
        zero3_persistence_elems: 100_000,
        zero3_sub_group_elems: 1_000_000_000,
        nvme_param_buffer_count: 5,
        nvme_optimizer_buffer_count: 4,
        nvme_buffer_elems: 100_000_000,
    };
}

/// The transformers decoder-layer class of each supported `model_type` (what FSDP auto-wraps
/// and checkpoints): the `_no_split_modules` of each `models/<type>/modeling_<type>.py` in
/// transformers 5.23.0 (`gemma3_text` is `Gemma3ForCausalLM` in `models/gemma3/`).
pub const DECODER_LAYER_CLASSES: &[(&str, &str)] = &[
    ("deepseek_v3", "DeepseekV3DecoderLayer"),
    ("ernie4_5", "Ernie4_5DecoderLayer"),
    ("exaone4", "Exaone4DecoderLayer"),
    ("falcon", "FalconDecoderLayer"),
    ("gemma", "GemmaDecoderLayer"),
    ("gemma2", "Gemma2DecoderLayer"),
    ("gemma3", "Gemma3DecoderLayer"),
    ("gemma3_text", "Gemma3DecoderLayer"),
    ("gpt2", "GPT2Block"),
    ("gpt_neox", "GPTNeoXLayer"),
    ("hunyuan_v1_dense", "HunYuanDenseV1DecoderLayer"),
    ("llama", "LlamaDecoderLayer"),
    ("mistral", "MistralDecoderLayer"),
    ("mixtral", "MixtralDecoderLayer"),
    ("olmo2", "Olmo2DecoderLayer"),
    ("opt", "OPTDecoderLayer"),
    ("phi3", "Phi3DecoderLayer"),
    ("qwen2", "Qwen2DecoderLayer"),
    ("qwen2_moe", "Qwen2MoeDecoderLayer"),
    ("qwen3", "Qwen3DecoderLayer"),
    ("qwen3_moe", "Qwen3MoeDecoderLayer"),
    ("seed_oss", "SeedOssDecoderLayer"),
    ("smollm3", "SmolLM3DecoderLayer"),
    ("starcoder2", "Starcoder2DecoderLayer"),
];

/// The decoder-layer class transformers gives `model_type`, if known.
pub fn decoder_layer_class(model_type: &str) -> Option<&'static str> {
    DECODER_LAYER_CLASSES
        .iter()
        .find(|(t, _)| *t == model_type)
        .map(|(_, c)| *c)
}

/// The architecture facts an engine that builds its own model (Megatron-LM, torchtitan) needs,
/// read once from the [`ModelDesc`]. `None` where the model has no single value (layers differ).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShape {
    /// `model_type` of the source config.
    pub model_type: String,
    /// Decoder layers.
    pub num_layers: u64,
    /// Residual width.
    pub hidden_size: u64,
    /// Vocabulary rows.
    pub vocab_size: u64,
    /// Context the model was built for.
    pub max_position_embeddings: u64,
    /// `(heads, kv heads, head dim)` of standard attention; `None` for MLA or mixed layers.
    pub attention: Option<(u64, u64, u64)>,
    /// Dense MLP intermediate size (`None` when the layers are MoE or differ).
    pub ffn_hidden_size: Option<u64>,
    /// `(experts, top-k, expert intermediate, shared-expert intermediate)` when every layer is MoE.
    pub moe: Option<(u64, u64, u64, Option<u64>)>,
    /// Some layers are MoE and some dense.
    pub mixed_moe: bool,
    /// The MLP is gated (SwiGLU-style) and its activation.
    pub gated: bool,
    /// The MLP activation of the first layer.
    pub activation: Activation,
    /// RMSNorm (any flavour) rather than LayerNorm.
    pub rms_norm: bool,
    /// Learned absolute positions (GPT-2/OPT) rather than rotary.
    pub learned_positions: bool,
    /// Every decoder layer is pre-norm sequential.
    pub sequential_residual: bool,
    /// Biases on the q/k/v projections.
    pub qkv_bias: bool,
    /// Biases on the other linears.
    pub linear_bias: bool,
    /// LM head tied to the token embeddings.
    pub tied_embeddings: bool,
    /// Dropout on attention probabilities as the estimate used it (0 when disabled).
    pub attention_dropout: f64,
    /// Dropout on the sub-block outputs as the estimate used it (0 when disabled).
    pub hidden_dropout: f64,
}

impl ModelShape {
    /// Reads the shape of `model`; `dropout` is the workload's switch (off = every p is 0).
    pub fn of(model: &ModelDesc, dropout: bool) -> ModelShape {
        let first = model.layers.first();
        let uniform = |f: &dyn Fn(&crate::model::LayerSpec) -> Option<u64>| -> Option<u64> {
            let v = f(first?)?;
            model.layers.iter().all(|l| f(l) == Some(v)).then_some(v)
        };
        let attention = first.and_then(|l| match l.attention.kind {
            AttentionKind::Standard {
                num_heads,
                num_kv_heads,
                head_dim,
            } => model
                .layers
                .iter()
                .all(|x| x.attention.kind == l.attention.kind)
                .then_some((num_heads, num_kv_heads, head_dim)),
            AttentionKind::Mla { .. } => None,
        });
        let ffn_hidden_size = uniform(&|l| match &l.mlp {
            Mlp::Dense(d) => Some(d.intermediate),
            Mlp::Moe(_) | Mlp::None => None,
        });
        let moe_layers = model
            .layers
            .iter()
            .filter(|l| matches!(l.mlp, Mlp::Moe(_)))
            .count();
        let moe = match first.map(|l| &l.mlp) {
            Some(Mlp::Moe(m)) if moe_layers == model.layers.len() => Some((
                m.num_experts,
                m.top_k,
                m.expert.intermediate,
                m.shared.as_ref().map(|s| s.intermediate),
            )),
            _ => None,
        };
        let (gated, activation) = match first.map(|l| &l.mlp) {
            Some(Mlp::Dense(d)) => (d.gated, d.act),
            Some(Mlp::Moe(m)) => (m.expert.gated, m.expert.act),
            Some(Mlp::None) | None => (false, Activation::Gelu),
        };
        let rms_norm = first
            .and_then(|l| l.attn_norm.or(l.mlp_norm))
            .is_some_and(|n| !matches!(n.kind, NormKind::LayerNorm | NormKind::CohereLayerNorm));
        let linear_bias = first.is_some_and(|l| {
            l.attention.o_bias
                || match &l.mlp {
                    Mlp::Dense(d) => d.bias,
                    Mlp::Moe(m) => m.expert.bias,
                    Mlp::None => false,
                }
        });
        let p = |x: f64| if dropout { x } else { 0.0 };
        ModelShape {
            model_type: model.model_type.clone(),
            num_layers: model.layers.len() as u64,
            hidden_size: model.hidden_size,
            vocab_size: model.embeddings.vocab_size,
            max_position_embeddings: model.max_position_embeddings,
            attention,
            ffn_hidden_size,
            moe,
            mixed_moe: moe_layers > 0 && moe_layers < model.layers.len(),
            gated,
            activation,
            rms_norm,
            learned_positions: model.embeddings.learned_positions.is_some(),
            sequential_residual: model
                .layers
                .iter()
                .all(|l| l.residual == Residual::Sequential),
            qkv_bias: first.is_some_and(|l| l.attention.qkv_bias),
            linear_bias,
            tied_embeddings: model.head.tied,
            attention_dropout: p(model.dropout.attention),
            hidden_dropout: p(model.dropout.residual),
        }
    }
}

/// One estimated training configuration, everything an emitter writes.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchSpec {
    /// What to load: a Hub id (`meta-llama/Llama-3.1-70B`) or a local path; a placeholder
    /// (`MODEL`) when memwall was given only a config file.
    pub model_id: String,
    /// transformers decoder-layer class (FSDP auto-wrap), from [`DECODER_LAYER_CLASSES`].
    pub decoder_layer_class: Option<&'static str>,
    /// Architecture facts for engines that build their own model.
    pub shape: ModelShape,
    /// The training step as estimated.
    pub workload: TrainWorkload,
    /// The layout as estimated (a single GPU when the estimate had none).
    pub layout: Layout,
    /// Engine constants the estimate assumed.
    pub constants: EngineConstants,
    /// The command and estimate, for the header comments.
    pub provenance: Provenance,
    /// Whose training code the estimate simulated (`--runtime`).
    pub runtime: crate::memory::titan::Runtime,
}

/// The placeholder written where the model id is unknown.
pub const MODEL_PLACEHOLDER: &str = "MODEL";

impl LaunchSpec {
    /// The launch of a `memwall train` estimate: `layout` is `None` for a single GPU. Checks the
    /// inputs as the estimate does (the same `validate`s).
    pub fn from_train(
        model: &ModelDesc,
        workload: &TrainWorkload,
        layout: Option<&Layout>,
    ) -> Result<LaunchSpec, EmitError> {
        workload.validate()?;
        let layout = layout.cloned().unwrap_or_else(Layout::single);
        layout.validate()?;
        Ok(LaunchSpec {
            model_id: MODEL_PLACEHOLDER.to_string(),
            decoder_layer_class: decoder_layer_class(&model.model_type),
            shape: ModelShape::of(model, workload.dropout),
            workload: workload.clone(),
            layout,
            constants: EngineConstants::SIMULATED,
            provenance: Provenance::default(),
            runtime: crate::memory::titan::Runtime::Hf,
        })
    }

    /// The launch of a `memwall train --runtime torchtitan` estimate: checked as
    /// `memory/titan` checks it (its tensor + sequence parallelism is torchtitan's, not the
    /// Megatron-LM layout a `tp` > 1 resolves to under the hf profile).
    pub fn from_train_titan(
        model: &ModelDesc,
        workload: &TrainWorkload,
        layout: &Layout,
    ) -> Result<LaunchSpec, EmitError> {
        crate::memory::titan::check(model, workload, layout)?;
        Ok(LaunchSpec {
            model_id: MODEL_PLACEHOLDER.to_string(),
            decoder_layer_class: decoder_layer_class(&model.model_type),
            shape: ModelShape::of(model, workload.dropout),
            workload: workload.clone(),
            layout: layout.clone(),
            constants: EngineConstants::SIMULATED,
            provenance: Provenance::default(),
            runtime: crate::memory::titan::Runtime::Torchtitan,
        })
    }

    /// Sets the runtime profile the estimate simulated (`--runtime`).
    pub fn with_runtime(mut self, runtime: crate::memory::titan::Runtime) -> Self {
        self.runtime = runtime;
        self
    }

    /// Sets the model id (Hub repository or path) the files load.
    pub fn with_model_id(mut self, id: impl Into<String>) -> Self {
        self.model_id = id.into();
        self
    }

    /// Sets the command and estimate named in the header comments.
    pub fn with_provenance(mut self, provenance: Provenance) -> Self {
        self.provenance = provenance;
        self
    }

    /// Nodes the job spans.
    pub fn num_nodes(&self) -> u64 {
        self.layout.gpus.div_ceil(self.layout.gpus_per_node.max(1))
    }

    /// Processes per node.
    pub fn procs_per_node(&self) -> u64 {
        self.layout.gpus.min(self.layout.gpus_per_node)
    }

    /// Samples per optimizer step over the whole job: micro-batch × accumulation × data-parallel
    /// degree (what the estimate reports as the global batch).
    pub fn global_batch(&self) -> u64 {
        self.workload
            .batch
            .saturating_mul(self.workload.grad_accum)
            .saturating_mul(self.layout.dp())
    }

    /// Whether the estimate ran Megatron-LM's profile (tensor/pipeline/context/expert
    /// parallelism under the hf runtime, as `memory::dist` decides; torchtitan's tensor
    /// parallelism is its own, `memory::titan`).
    pub fn is_megatron(&self) -> bool {
        self.layout.model_parallel() && self.runtime == crate::memory::titan::Runtime::Hf
    }

    /// The offload target, when anything is offloaded.
    pub fn offload_device(&self) -> Option<OffloadDevice> {
        (self.layout.offload != Offload::None).then_some(self.layout.offload_device)
    }

    /// The strategy as the estimate ran it (single GPU = `ddp` with one rank).
    pub fn strategy(&self) -> Strategy {
        self.layout.strategy
    }

    /// The pipeline schedule (only meaningful with `pp > 1`).
    pub fn schedule(&self) -> Schedule {
        self.layout.schedule
    }
}

/// vLLM's KV-cache element type as `--kv-cache-dtype` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VllmKvCacheDtype {
    /// `auto`: the model dtype.
    Auto,
    /// `fp8` (e4m3 on CUDA).
    Fp8,
    /// `fp8_e4m3`.
    Fp8E4m3,
    /// `fp8_e5m2`.
    Fp8E5m2,
}

impl VllmKvCacheDtype {
    /// The flag value (vllm `config/cache.py` `CacheDType`).
    pub fn flag(self) -> &'static str {
        match self {
            VllmKvCacheDtype::Auto => "auto",
            VllmKvCacheDtype::Fp8 => "fp8",
            VllmKvCacheDtype::Fp8E4m3 => "fp8_e4m3",
            VllmKvCacheDtype::Fp8E5m2 => "fp8_e5m2",
        }
    }

    /// From the inference workload's KV dtype (bf16/fp16 are the model dtype: `auto`).
    pub fn from_kv_dtype(kv: KvDtype) -> Result<Self, EmitError> {
        match kv {
            KvDtype::Auto | KvDtype::Bf16 | KvDtype::Fp16 => Ok(VllmKvCacheDtype::Auto),
            KvDtype::Fp8 => Ok(VllmKvCacheDtype::Fp8),
            KvDtype::Int8 => Err(EmitError::unsupported(
                "vllm",
                "vLLM has no int8 KV cache",
                "use --kv-cache-dtype fp8",
            )),
        }
    }
}

/// One estimated vLLM deployment (`memwall serve`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServeLaunchSpec {
    /// Hub id or path passed to `vllm serve`.
    pub model_id: String,
    /// `--tensor-parallel-size`.
    pub tensor_parallel_size: u64,
    /// `--gpu-memory-utilization`.
    pub gpu_memory_utilization: f64,
    /// `--kv-cache-dtype`.
    pub kv_cache_dtype: VllmKvCacheDtype,
    /// `--block-size`.
    pub block_size: u64,
    /// `--max-model-len`.
    pub max_model_len: u64,
    /// `--max-num-batched-tokens` (the profile run's size, so it moves the KV budget).
    pub max_num_batched_tokens: u64,
    /// `--max-num-seqs` (the sampler's part of the profile run).
    pub max_num_seqs: u64,
    /// `--enforce-eager` (no CUDA graphs, none of their memory).
    pub enforce_eager: bool,
    /// `--kv-cache-memory-bytes`, when the estimate used a fixed budget.
    pub kv_cache_memory_bytes: Option<u64>,
    /// `--enable-prefix-caching` / `--no-enable-prefix-caching` when given (it sets
    /// `mamba_cache_mode` for models with state layers).
    pub enable_prefix_caching: Option<bool>,
    /// The weights' storage format (`--quantization` for the quantised ones).
    pub weights: WeightFormat,
    /// The command and estimate, for the header comments.
    pub provenance: Provenance,
}

impl ServeLaunchSpec {
    /// The launch of a `memwall serve` estimate: the flags come from the same [`ServeConfig`].
    pub fn from_serve(
        model_id: impl Into<String>,
        cfg: &ServeConfig,
        kv_cache_dtype: VllmKvCacheDtype,
        max_num_seqs: u64,
        enforce_eager: bool,
    ) -> ServeLaunchSpec {
        ServeLaunchSpec {
            model_id: model_id.into(),
            tensor_parallel_size: cfg.tp,
            gpu_memory_utilization: cfg.gpu_memory_utilization,
            kv_cache_dtype,
            block_size: cfg.block_size,
            max_model_len: cfg.max_model_len,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            max_num_seqs,
            enforce_eager,
            kv_cache_memory_bytes: cfg.kv_cache_memory_bytes,
            enable_prefix_caching: cfg.enable_prefix_caching,
            weights: WeightFormat::Bf16,
            provenance: Provenance::default(),
        }
    }

    /// Sets the weights' format (bf16 unless the model is served quantised).
    pub fn with_weights(mut self, weights: WeightFormat) -> Self {
        self.weights = weights;
        self
    }

    /// Sets the command and estimate named in the header comments.
    pub fn with_provenance(mut self, provenance: Provenance) -> Self {
        self.provenance = provenance;
        self
    }
}
