//! [`Engine::Torchtitan`]: torchtitan 0.3.0's own training step (`--runtime torchtitan`).
//!
//! torchtitan does not run the transformers model: it builds its own Llama 3, Qwen 3 or
//! DeepSeek-V3 (plain PyTorch, `torchtitan/models/llama3/model.py`, `models/qwen3/model.py`,
//! `models/deepseek_v3/model.py` over
//! `models/common/{decoder,attention,rope,feed_forward,nn_modules}.py`), wraps it with activation checkpointing and FSDP2
//! (`models/llama3/parallelize.py` `parallelize_llama`, `distributed/fsdp.py`
//! `apply_fsdp_to_decoder`, `distributed/activation_checkpoint.py`) and trains it with its own
//! loss (`components/loss.py` `CrossEntropyLoss`) and `OptimizersContainer` (AdamW, foreach).
//! Where its memory differs from the transformers step under FSDP2 ([`Engine::Fsdp2`]):
//! - FSDP units: `tok_embeddings`, every block, and `[norm, lm_head]` together; by default
//!   (`fsdp_reshard_after_forward = "default"`) the last unit is not resharded after forward
//!   ("FSDP would prefetch them immediately", `apply_fsdp_to_decoder`).
//! - The block: fused `wqkv`, complex RoPE over a per-layer `complex64` cache of `seq_len` rows
//!   (`rope.py` `ComplexRoPE`, its `max_seq_len` set to `training.seq_len` by
//!   `Decoder.Config.update_from_config`), FlexAttention (out, logsumexp and row max saved; the
//!   default `attn_backend`; Qwen 3: `CosSinRoPE`, an fp32 cos/sin cache twice the size, and
//!   per-head q/k RMSNorms before RoPE, `models/qwen3/__init__.py`), RMSNorm computed in fp32 (`x.float()` and the fp32 normalised
//!   tensor saved), `w2(silu(w1(x)) * w3(x))`; no KV cache, no dropout, no output object.
//! - The loss: `cross_entropy(pred.float())` summed and divided by the global token count.
//! - Tensor + sequence parallelism (`--tp`, torchtitan's `tensor_parallel_degree` with its
//!   defaults `enable_sequence_parallel = true`, `spmd_backend = "spmd_types"`, no async TP):
//!   the TP plan of `models/llama3/sharding.py` / `models/common/decoder_sharding.py` (colwise
//!   `wqkv`, `w1`, `w3`, vocabulary-parallel `tok_embeddings` and `lm_head`, rowwise `wo`, `w2`,
//!   replicated norms on the sequence shard), FSDP2 over `dp_shard = gpus / tp` on each
//!   TP-local parameter, and the vocabulary-parallel loss (`_LossParallelCrossEntropy`); measured
//!   on a fake 2-D mesh (see `step.rs`).
//! - Pipeline parallelism (`--pp`, torchtitan's `pipeline_parallel_degree` with 1F1B, GPipe or
//!   Interleaved1F1B) of Llama 3 and untied Qwen 3 (dense, MoE): torchtitan's stage split, torch's
//!   schedule orders (each stage's gradient reduction right after its last backward) and FSDP2
//!   without resharding under PP, one pp rank at a time (see `pipeline.rs`); measured on a fake
//!   pp × dp_shard mesh, and with TP + SP on a pp × dp_shard × tp mesh.
//! - Expert parallelism (`--ep`, torchtitan's `expert_parallel_degree`) of the MoE models: the
//!   EP mesh carved out of dp_shard (`efsdp × ep`), `E / ep` routed experts per rank FSDP-sharded
//!   over `efsdp = dp_shard / ep`, the `AllToAllTokenDispatcher`'s saved `permuted_indices`, the
//!   last MoE block's two FSDP groups prefetched at the LM head's backward (see `step.rs`;
//!   refusals: `check_ep`); measured under balanced routing (the harness's split sizes), which every
//!   EP estimate assumes and names.
//! - HSDP (`--strategy hsdp`, `data_parallel_replicate_degree = gpus / gpus_per_node` over
//!   `data_parallel_shard_degree = gpus_per_node`): every rank runs the FSDP2 step of its shard
//!   group, byte for byte (the gradient all-reduce across replicas is in place; see
//!   [`check_hsdp`]); measured on a fake dp_replicate × dp_shard mesh.
//!
//! The step is a timeline of named instants, each summing what is alive then ([`instants`]);
//! the peak is the largest. The tensors saved per block were read off the model with
//! `torch.autograd.graph.saved_tensors_hooks` and every instant's contents off FSDPMemTracker's
//! breakdown at the measured peaks (`tools/truth/titan/`, `tests/truth/titan.jsonl`). This
//! profile is evaluated in closed form (a few dozen instants, no per-op replay), so it has no
//! separate fast path: the fast evaluator is not involved.
//!
//! Refused by name (the capability row [`CAPABILITIES`] and [`check`]): tensor parallelism
//! without sequence parallelism and degrees that do not divide the heads, key/value heads and
//! feed-forward width, context parallelism (not measured here), expert parallelism with TP,
//! PP or SelectiveAC or routed rows that do not spread evenly over the experts, pipeline
//! parallelism with tied embeddings (torchtitan refuses it) or on dp_shard = 1, HSDP with TP or PP, CPU offload, float8 with TP, PP, MoE or tied embeddings and its `tensorwise` recipe and float8 all-gather (not in torchtitan 0.3.0; see `float8.rs`),
//! `torch.compile` (Inductor's generated code cannot run on fake tensors, so a compiled step
//! cannot be measured honestly), LoRA, gradient accumulation, the chunked loss
//! (`ChunkedLossWrapper`, torchtitan's default for `llama3_8b`: FSDPMemTracker refuses its
//! repeated calls of the head unit, so it is not measured), tied embeddings other than Qwen 3's
//! dense ones, for MoE blocks TP and more FSDP ranks than experts, for DeepSeek-V3 also PP and
//! SelectiveAC, and every family but Llama 3, Qwen 3 and DeepSeek-V3 ([`shapes`] maps an HF
//! config onto torchtitan's model arguments).
//!
//! Qwen 3 MoE (`qwen3_moe`): every block's feed-forward is torchtitan's `MoE`
//! (`models/common/moe.py`): the router's gate in fp32 (its `torch.autocast(dtype=float32)`,
//! which CUDA honours), softmax scores, top-k with `route_norm`, `LocalTokenDispatcher` (argsort,
//! gather, fp32-scaled `scatter_add` combine), `GroupedExperts` on `torch._grouped_mm`, the
//! `expert_bias_E` / `tokens_per_expert_E` buffers; the experts are FSDP-sharded on dim 0 as part
//! of their block's unit (measured, `tools/truth/titan/README.md` "Qwen 3 MoE").
//!
//! DeepSeek-V3 (`deepseek_v3`, `models/deepseek_v3/`): multi-head latent attention (q / kv LoRA
//! projections and their fp32 RMSNorms, RoPE on `qk_rope_head_dim` only, FlexAttention over
//! 192-dim query/key and 128-dim value heads), `n_dense_layers` leading dense blocks, then the
//! same `MoE` with a shared-experts `FeedForward`, a sigmoid router with node-limited routing
//! and `route_norm` (671B); each block one FSDP unit, the experts sharded on dim 0 (measured,
//! `tools/truth/titan/README.md` "DeepSeek-V3"; FSDP2, with EP: TP, PP and SelectiveAC are
//! refused).

use super::ranks::{CommBuffer, DistEstimate, RankGroup, RankSet};
use super::{Category, Phase};
use crate::dtype::Precision;
use crate::engine::{Capabilities, Engine, Rule};
use crate::error::CoreError;
use crate::layout::{Layout, Offload, OffloadDevice, Strategy};
use crate::model::{Activation, AttentionKind, Mlp, ModelDesc, NormKind, QkNormScope, Residual};
use crate::optimizer::Optimizer;
use crate::workload::{CheckpointPolicy, KernelSet, LossKernel, TrainLoop, TrainWorkload};

mod float8;
mod pipeline;
mod step;

pub use float8::Float8Recipe;

pub use pipeline::{rank_instants, split, PipeJob, Stage};
pub use step::{instants, Instant, Job};

crate::names::named_enum! {
    /// Whose training code is simulated (`--runtime`): transformers' (the `hf` profile and the
    /// engine a layout resolves to) or torchtitan's own.
    #[derive(Default)]
    pub enum Runtime in "runtime" {
        /// transformers' step, under the engine the layout resolves to (hf, ddp, fsdp,
        /// deepspeed, megatron).
        #[default]
        Hf = "hf": "transformers' model and step (the engine the layout picks)",
        /// torchtitan 0.3.0's Llama 3, Qwen 3 (dense, MoE) or DeepSeek-V3 under FSDP2
        /// ([`Engine::Torchtitan`]).
        Torchtitan = "torchtitan": "torchtitan 0.3.0's own Llama 3 / Qwen 3 / DeepSeek-V3 step under FSDP2 (and its TP + SP, or its PP)",
    }
}

const ENGINE: &str = "torchtitan 0.3.0";
const NOT_MEASURED: &str = "use the hf profile (drop --runtime torchtitan) for this setting";

/// torchtitan's capability row of `engine::TABLE`.
pub const CAPABILITIES: Capabilities = Capabilities {
    engine: Engine::Torchtitan,
    name: "torchtitan",
    title: ENGINE,
    source: "torchtitan 0.3.0's Llama 3, Qwen 3 (dense, MoE) and DeepSeek-V3 steps under FSDP2, \
             with its tensor + sequence parallelism, its pipeline parallelism and its expert \
             parallelism (balanced routing) \
             (torchtitan/models/llama3/, models/qwen3/, models/deepseek_v3/, models/common/, distributed/fsdp.py, distributed/activation_checkpoint.py, \
             distributed/pipeline_parallel.py; measured with FSDPMemTracker on fake tensors and \
             fake dp_shard × tp and pp × dp_shard meshes, tests/truth/titan.jsonl, \
             titan_pp.jsonl; memory/titan/)",
    strategies: Rule {
        allowed: &[Strategy::FsdpFull, Strategy::FsdpGradOp, Strategy::Hsdp],
        note: "fsdp-full = `fsdp_reshard_after_forward = \"default\"` (blocks and embeddings \
               reshard after forward, `[norm, lm_head]` does not); fsdp-grad-op = \"never\"; \
               hsdp = `data_parallel_replicate_degree = gpus / gpus-per-node` with \
               `data_parallel_shard_degree = gpus-per-node` (FSDP2 on the 2-D [\"dp_replicate\", \
               \"fsdp\"] mesh, \"default\" resharding; measured)",
        refused: "torchtitan's data parallelism is FSDP2 (`data_parallel_shard_degree`, and \
                  `data_parallel_replicate_degree` for HSDP); DDP / ZeRO are other runtimes",
        hint: "use --strategy fsdp-full, fsdp-grad-op or hsdp, or drop --runtime torchtitan",
    },
    optimizers: Rule {
        allowed: &[Optimizer::AdamwFused, Optimizer::Adamw],
        note: "adamw-fused = torchtitan 0.3.0's default `optimizer.implementation = \"fused\"` \
               (components/optimizer/optimizer.py `OptimizersContainer`; every fixture), adamw = \
               \"foreach\" (one fp32 list of the shards at the step; measured)",
        refused: "not measured: torchtitan's for-loop AdamW, `fused_opt_states_bf16` and its \
                  other optimizers",
        hint: "use --optimizer adamw-fused (torchtitan's default) or adamw with --runtime \
               torchtitan",
    },
    precisions: Rule {
        allowed: &[Precision::AmpBf16],
        note: "an fp32 model under `MixedPrecisionPolicy(param_dtype=bfloat16, \
               reduce_dtype=float32)`: torchtitan's defaults `training.dtype = \"float32\"`, \
               `mixed_precision_param = \"bfloat16\"`, `mixed_precision_reduce = \"float32\"` \
               (config/configs.py; measured)",
        refused: "not measured: torchtitan with `training.dtype = \"bfloat16\"` or fp32 compute",
        hint: "use --precision amp-bf16 with --runtime torchtitan",
    },
    lora: Rule {
        allowed: &[false],
        note: "",
        refused: "torchtitan has no LoRA/QLoRA trainer",
        hint: "drop --runtime torchtitan for LoRA (the hf profile runs peft)",
    },
    qlora: Rule {
        allowed: &[false],
        note: "",
        refused: "torchtitan has no LoRA/QLoRA trainer",
        hint: "drop --runtime torchtitan for QLoRA (the hf profile runs peft)",
    },
    offload: Rule {
        allowed: &[Offload::None],
        note: "",
        refused: "not measured: torchtitan's `training.enable_cpu_offload` (FSDP2 \
                  CPUOffloadPolicy)",
        hint: "drop --offload, or drop --runtime torchtitan",
    },
    offload_devices: Rule {
        allowed: &[OffloadDevice::Cpu],
        note: "",
        refused: "NVMe offload is DeepSpeed ZeRO-Infinity",
        hint: "drop --offload-device nvme",
    },
    grad_accum: Rule {
        allowed: &[false],
        note: "",
        refused: "not measured: torchtitan's gradient accumulation (global batch > local batch \
                  × dp)",
        hint: NOT_MEASURED,
    },
    losses: Rule {
        allowed: &[LossKernel::Torch],
        note:
            "torchtitan's `CrossEntropyLoss` (components/loss.py: `cross_entropy(pred.float())`, \
               sum / global valid tokens; measured)",
        refused: "torchtitan's own fused-linear-style loss (`ChunkedLossWrapper`, the default of \
                  `llama3_8b()`) calls the head unit once per chunk, which FSDPMemTracker cannot \
                  track, so it is not measured; flash-attn's and Liger's losses are not \
                  torchtitan's",
        hint: "drop --loss (torch = torchtitan's CrossEntropyLoss, set `loss` to it in the job)",
    },
    padding_free: Rule {
        allowed: &[false],
        note: "",
        refused: "not measured: torchtitan's document masking / varlen batches",
        hint: "drop --padding-free with --runtime torchtitan",
    },
    loops: Rule {
        allowed: &[TrainLoop::Trainer],
        note: "torchtitan's `Trainer.train_step` keeps only the loss",
        refused: "torchtitan runs its own loop: the model output is dropped after the loss",
        hint: "drop --loop with --runtime torchtitan",
    },
    checkpoint_policies: Rule {
        allowed: &[true, false],
        note: "full: `FullAC` (ptd checkpoint_wrapper per block); selective-op: `SelectiveAC` \
               (op-level save list, every second matmul recomputed; on MoE blocks the router \
               gate and the grouped-mm experts are recomputed, `topk` saved); every-k:K: `FullAC`'s \
               wrapper on every K-th block (earlier torchtitan's layer-level selective AC; 0.3.0 \
               dropped the option, measured with the same wrapper; under PP each rank counts \
               its own blocks from 1, as its process-wide counter did); selective-attn is \
               refused (Megatron-LM's pattern)",
        refused: "",
        hint: "",
    },
    kernels: Rule {
        allowed: &[KernelSet::Torch],
        note: "torchtitan's own modules (RMSNorm in fp32, FlexAttention, SwiGLU)",
        refused: "Liger-Kernel patches transformers modules, not torchtitan's",
        hint: "drop --kernels with --runtime torchtitan",
    },
    use_cache: Rule {
        allowed: &[false],
        note: "",
        refused: "torchtitan's model has no KV cache: `use_cache` is a transformers config field",
        hint: "drop --use-cache with --runtime torchtitan",
    },
    activation_offload: Rule {
        allowed: &[false],
        note: "",
        refused: "not measured: torchtitan's activation offloading",
        hint: "drop --activation-offload with --runtime torchtitan",
    },
};

/// torchtitan's `parallelism.fsdp_reshard_after_forward` (config/configs.py): which FSDP units
/// free their unsharded parameters after forward (`distributed/fsdp.py`
/// `get_fsdp_reshard_after_forward_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReshardPolicy {
    /// `"default"`: every unit but `[norm, lm_head]` (which backward needs first).
    #[default]
    Default,
    /// `"always"`: every unit, `[norm, lm_head]` too.
    Always,
    /// `"never"`: no unit (parameters stay gathered from forward to the end of backward).
    Never,
}

impl ReshardPolicy {
    /// torchtitan's spelling.
    pub const fn name(self) -> &'static str {
        match self {
            ReshardPolicy::Default => "default",
            ReshardPolicy::Always => "always",
            ReshardPolicy::Never => "never",
        }
    }

    /// The policy a layout's strategy stands for: `fsdp-grad-op` (FSDP's SHARD_GRAD_OP) is
    /// `"never"`, `fsdp-full` torchtitan's `"default"`.
    pub fn for_strategy(s: Strategy) -> ReshardPolicy {
        if s == Strategy::FsdpGradOp {
            ReshardPolicy::Never
        } else {
            ReshardPolicy::Default
        }
    }
}

/// Settings of the torchtitan job that are not in the workload or the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TitanOptions {
    /// `fsdp_reshard_after_forward`; `None` = the layout strategy's ([`ReshardPolicy::for_strategy`]).
    pub reshard: Option<ReshardPolicy>,
    /// `--float8`: torchtitan's float8 linears with this recipe (`None`: bf16 linears).
    pub float8: Option<Float8Recipe>,
    /// `--float8-all-gather`: FSDP2 float8 all-gather (refused: torchtitan 0.3.0 has none).
    pub float8_all_gather: bool,
}

/// Which of torchtitan 0.3.0's decoder models the job runs (`--module`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TitanModel {
    /// `models/llama3/`: `ComplexRoPE` (a complex64 cache of `head_dim / 2` per row), no q/k
    /// norms.
    Llama3,
    /// `models/qwen3/` (dense flavours): `CosSinRoPE` (an fp32 cache of `2 · head_dim` per
    /// row: cos and sin, `models/common/rope.py`) and an RMSNorm of `head_dim` on q and on k
    /// before RoPE (`GQAttention.q_norm` / `k_norm`, `models/common/attention.py`).
    Qwen3,
    /// `models/deepseek_v3/`: multi-head latent attention (`model.py` `Attention`: q and kv
    /// LoRA projections with their RMSNorms, RoPE on `qk_rope_head_dim` by `ComplexRoPE`),
    /// `n_dense_layers` leading dense blocks, then MoE blocks with shared experts
    /// (`models/deepseek_v3/__init__.py` `build_mla_moe_layers`).
    DeepseekV3,
}

impl TitanModel {
    /// torchtitan's module name (`--module`, `torchtitan/models/<module>/`).
    pub const fn module(self) -> &'static str {
        match self {
            TitanModel::Llama3 => "llama3",
            TitanModel::Qwen3 => "qwen3",
            TitanModel::DeepseekV3 => "deepseek_v3",
        }
    }

    /// Whether q and k each pass an RMSNorm of `head_dim` (Qwen3).
    pub const fn qk_norm(self) -> bool {
        matches!(self, TitanModel::Qwen3)
    }

    /// Bytes of one row (one position) of a block's RoPE cache over `rope_dim` rotary
    /// dimensions: `ComplexRoPE`'s `rope_dim / 2` complex64 (`4 · rope_dim`; Llama 3 over
    /// `head_dim`, DeepSeek-V3 over `qk_rope_head_dim`), `CosSinRoPE`'s cos and sin of
    /// `rope_dim` fp32 each (`8 · rope_dim`) (models/common/rope.py `_precompute_cache`).
    pub const fn rope_row_bytes(self, rope_dim: u64) -> u64 {
        match self {
            TitanModel::Llama3 | TitanModel::DeepseekV3 => 4 * rope_dim,
            TitanModel::Qwen3 => 8 * rope_dim,
        }
    }
}

/// The shapes of torchtitan's decoder (Llama 3 or Qwen 3 (dense, MoE)) that its memory depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shapes {
    /// The torchtitan model.
    pub model: TitanModel,
    /// `dim`.
    pub dim: u64,
    /// `n_heads`.
    pub heads: u64,
    /// `n_kv_heads`.
    pub kv_heads: u64,
    /// `head_dim` (`dim / n_heads` for Llama 3; Qwen 3's own, e.g. 128 with dim 5120 and 64
    /// heads for 32B).
    pub head_dim: u64,
    /// The feed-forward's `hidden_dim` (dense blocks; 0 for MoE blocks).
    pub ffn: u64,
    /// Qwen 3 MoE: every block's feed-forward is torchtitan's `MoE` (`models/common/moe.py`).
    pub moe: Option<TitanMoe>,
    /// `vocab_size`.
    pub vocab: u64,
    /// Blocks.
    pub layers: u64,
    /// `enable_weight_tying` (HF `tie_word_embeddings`; Qwen 3 0.6B/1.7B/4B): one parameter
    /// shared by `tok_embeddings` and `lm_head`, in one FSDP unit with the final norm.
    pub tied: bool,
    /// DeepSeek-V3's multi-head latent attention (`None`: `GQAttention` of `heads`, `kv_heads`
    /// and `head_dim`).
    pub mla: Option<TitanMla>,
    /// With `moe`: the leading blocks whose feed-forward is dense (of width `ffn`;
    /// DeepSeek-V3's `n_dense_layers`, HF `first_k_dense_replace`); 0 for Qwen 3 MoE.
    pub dense_layers: u64,
}

impl Shapes {
    /// Bytes of one row of a block's RoPE cache (see [`TitanModel::rope_row_bytes`]).
    pub fn rope_row_bytes(&self) -> u64 {
        let rope_dim = self.mla.map_or(self.head_dim, |m| m.rope_head_dim);
        self.model.rope_row_bytes(rope_dim)
    }

    /// Whether block `i` (0-based) is a MoE block.
    pub fn is_moe_block(&self, i: u64) -> bool {
        self.moe.is_some() && i >= self.dense_layers
    }

    /// MoE blocks among the model's blocks.
    pub fn moe_layers(&self) -> u64 {
        if self.moe.is_some() {
            self.layers.saturating_sub(self.dense_layers)
        } else {
            0
        }
    }
}

/// DeepSeek-V3's multi-head latent attention (`models/deepseek_v3/model.py` `Attention`):
/// `wq` (or `wq_a` → `q_norm` → `wq_b` with a q LoRA rank), `wkv_a` → split → `kv_norm` →
/// `wkv_b`, RoPE on the `rope_head_dim` part of q and of the shared k, FlexAttention over
/// `nope + rope` query/key and `v_head_dim` value heads, `wo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TitanMla {
    /// `q_lora_rank` (0: a plain `wq`).
    pub q_lora_rank: u64,
    /// `kv_lora_rank`.
    pub kv_lora_rank: u64,
    /// `qk_nope_head_dim`.
    pub nope_head_dim: u64,
    /// `qk_rope_head_dim`.
    pub rope_head_dim: u64,
    /// `v_head_dim`.
    pub v_head_dim: u64,
}

/// torchtitan's MoE feed-forward (`models/common/moe.py`: `TokenChoiceTopKRouter` with a
/// softmax score and `route_norm`, `LocalTokenDispatcher` (no EP), `GroupedExperts` on
/// `torch._grouped_mm`, no shared experts in Qwen 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TitanMoe {
    /// `num_experts`.
    pub experts: u64,
    /// `top_k`.
    pub top_k: u64,
    /// One expert's `hidden_dim` (`moe_intermediate_size`).
    pub expert_ffn: u64,
    /// The shared experts' `hidden_dim` (`moe_intermediate_size × n_shared_experts`; one
    /// `FeedForward`, `MoE.shared_experts`); 0 without shared experts (Qwen 3).
    pub shared_ffn: u64,
    /// `route_norm`: the top-k scores divided by their sum (Qwen 3, DeepSeek-V3 671B).
    pub route_norm: bool,
}

fn refuse(
    field: &'static str,
    value: impl ToString,
    reason: &'static str,
    hint: &'static str,
) -> CoreError {
    CoreError::Unsupported {
        field,
        value: value.to_string(),
        engine: ENGINE,
        reason,
        hint,
    }
}

/// torchtitan's model shapes of `model`, or a refusal naming what torchtitan's models are not.
///
/// HF `config.json` → torchtitan model args (`models/llama3/__init__.py`,
/// `models/qwen3/__init__.py` `_build_qwen3_layers`): `hidden_size` → `dim`,
/// `num_attention_heads` → `n_heads`, `num_key_value_heads` → `n_kv_heads`, `head_dim` →
/// `head_dim` (Qwen 3; Llama 3 derives `dim / n_heads`), `intermediate_size` → the
/// feed-forward's `hidden_dim`, `vocab_size`, `num_hidden_layers` → the block count,
/// `tie_word_embeddings` → `enable_weight_tying`; `rope_theta`, `rms_norm_eps` and the RoPE
/// scaling do not change memory (torchtitan's `max_seq_len` is set to `training.seq_len`).
/// What torchtitan's model cannot express is refused by name: biases (`attention_bias`),
/// sliding windows (`use_sliding_window`, `layer_types`), a Qwen 3 config without per-head q/k
/// RMSNorms, MLA configs (`deepseek_v3`), and tied embeddings of Llama models (Llama 3.2; not
/// measured: tied embeddings are measured for Qwen 3).
pub fn shapes(model: &ModelDesc) -> Result<Shapes, CoreError> {
    const ONLY: &str = "torchtitan 0.3.0's llama3, qwen3 (dense and MoE) and deepseek_v3 models \
                        are simulated (models/llama3/, models/qwen3/, models/deepseek_v3/); \
                        its other models are not";
    const HINT: &str = "use a Llama 3 / 3.1, Qwen 3 or DeepSeek-V3 model (e.g. llama-3.1-8b, \
                        qwen3-8b, qwen3-30b-a3b, deepseek-v3), or drop --runtime torchtitan";
    let titan_model = match model.model_type.as_str() {
        "llama" => TitanModel::Llama3,
        "qwen3" | "qwen3_moe" => TitanModel::Qwen3,
        "deepseek_v3" => return deepseek_v3_shapes(model),
        _ => return Err(refuse("model_type", &model.model_type, ONLY, HINT)),
    };
    let first = model
        .layers
        .first()
        .ok_or_else(|| CoreError::invalid("num_hidden_layers", "the model has no layers"))?;
    let (heads, kv_heads, head_dim) = match first.attention.kind {
        AttentionKind::Standard {
            num_heads,
            num_kv_heads,
            head_dim,
        } => (num_heads, num_kv_heads, head_dim),
        AttentionKind::Mla { .. } => return Err(refuse("model_type", "mla", ONLY, HINT)),
    };
    let swiglu = |d: &crate::model::DenseMlp| d.gated && d.act == Activation::Silu && !d.bias;
    let (ffn, moe) = match (&first.mlp, model.model_type.as_str()) {
        (Mlp::Dense(d), "llama" | "qwen3") if swiglu(d) => (d.intermediate, None),
        // Qwen 3 MoE (HF `qwen3_moe`): torchtitan's qwen3 MoE flavours route with a softmax,
        // `route_norm = True` (HF `norm_topk_prob`), no shared expert, every block MoE
        // (`_build_qwen3_moe_layers`; HF `mlp_only_layers = []`, `decoder_sparse_step = 1`)
        (Mlp::Moe(m), "qwen3_moe")
            if swiglu(&m.expert)
                && m.shared.is_none()
                && !m.shared_gate
                && !m.router_bias
                && m.router_extra_params == 0
                && m.frozen_router_params == 0
                && !m.all_experts
                && !m.router_topk_then_softmax =>
        {
            (
                0,
                Some(TitanMoe {
                    experts: m.num_experts,
                    top_k: m.top_k,
                    expert_ffn: m.expert.intermediate,
                    shared_ffn: 0,
                    route_norm: true,
                }),
            )
        }
        _ => return Err(refuse("model_type", &model.model_type, ONLY, HINT)),
    };
    // torchtitan's GQAttention: `qk_norm = RMSNorm(head_dim)` shared by the heads (Qwen 3),
    // none for Llama 3
    let qk_norm = if titan_model.qk_norm() {
        Some((QkNormScope::PerHead, NormKind::RmsNorm))
    } else {
        None
    };
    if let Some(l) = model.layers.iter().find(|l| {
        l.attention.sliding_window.is_some() || l.attention.qkv_bias || l.attention.o_bias
    }) {
        let (field, value) = if l.attention.sliding_window.is_some() {
            ("sliding_window", "set")
        } else {
            ("attention_bias", "true")
        };
        return Err(refuse(
            field,
            value,
            "torchtitan's llama3 / qwen3 attention has no sliding window and no projection \
             biases (models/common/attention.py GQAttention)",
            "use a config without sliding-window layers and attention biases, or drop \
             --runtime torchtitan",
        ));
    }
    let same = model.layers.iter().all(|l| {
        l.attention.kind == first.attention.kind
            && l.mlp == first.mlp
            && l.residual == Residual::Sequential
            && l.attention.qk_norm == qk_norm
            && !l.attention.qk_norm_after_rope
            && l.attn_norm.is_some_and(|n| n.kind == NormKind::RmsNorm)
            && l.mlp_norm.is_some_and(|n| n.kind == NormKind::RmsNorm)
            && l.attn_post_norm.is_none()
            && l.mlp_post_norm.is_none()
            && l.mixer == crate::mixer::Mixer::Attention
    });
    // Llama 3's attention derives head_dim = dim / n_heads (models/llama3/__init__.py passes
    // no head_dim); Qwen 3 passes its own
    let head_dim_ok = titan_model == TitanModel::Qwen3 || head_dim * heads == model.hidden_size;
    if !same || heads == 0 || kv_heads == 0 || !head_dim_ok {
        return Err(refuse(
            "model_type",
            &model.model_type,
            "this config differs from torchtitan's block (uniform pre-norm RMSNorm blocks, no \
             biases, gated SiLU feed-forward; Llama 3: dim = n_heads × head_dim, no q/k norms; \
             Qwen 3: per-head q/k RMSNorms before RoPE)",
            HINT,
        ));
    }
    // tied embeddings: measured on torchtitan's qwen3 tied flavours (0.6B, 1.7B, 4B; the
    // `titan-qwen3tied-*` fixtures); its llama3 tied flavours (Llama 3.2 1B/3B, with their own
    // RoPE scaling) were not measured
    if model.head.tied && titan_model != TitanModel::Qwen3 {
        return Err(refuse(
            "tie_word_embeddings",
            "true",
            "not measured: torchtitan's tied Llama 3 flavours (Llama 3.2 1B/3B; tied \
             embeddings are measured for Qwen 3 0.6B/1.7B/4B only)",
            "use an untied Llama model (Llama 3.1 8B/70B/405B) or a tied Qwen 3 (qwen3-0.6b, \
             qwen3-1.7b), or drop --runtime torchtitan",
        ));
    }
    if model.vision.is_some() {
        return Err(refuse("model_type", "vision", ONLY, HINT));
    }
    Ok(Shapes {
        model: titan_model,
        dim: model.hidden_size,
        heads,
        kv_heads,
        head_dim,
        ffn,
        moe,
        vocab: model.embeddings.vocab_size,
        layers: model.layers.len() as u64,
        tied: model.head.tied,
        mla: None,
        dense_layers: 0,
    })
}

/// torchtitan's deepseek_v3 shapes of an HF `deepseek_v3` config (`models/deepseek_v3/
/// __init__.py` `build_mla_moe_layers`, the 671B flavour's fields): `hidden_size` → `dim`,
/// `num_attention_heads` → `n_heads`, `q_lora_rank` (null → 0: a plain `wq`),
/// `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`,
/// `first_k_dense_replace` → `n_dense_layers` (of `intermediate_size`), `n_routed_experts`,
/// `num_experts_per_tok` → `top_k`, `moe_intermediate_size`, `n_shared_experts` (one
/// `FeedForward` of `moe_intermediate_size × n_shared_experts`). The router's score function
/// (sigmoid or softmax), its node-limited routing (`n_group` / `topk_group`), the expert bias
/// and `routed_scaling_factor` do not change what the step holds (the scores are saved either
/// way; the node-limited selection's autograd nodes are unreachable from the loss once `topk`'s
/// values are dropped, so nothing of it is alive at the backward); `norm_topk_prob` →
/// `route_norm` (true in DeepSeek-V3's config and the 671B flavour, false in the 16B one).
fn deepseek_v3_shapes(model: &ModelDesc) -> Result<Shapes, CoreError> {
    const WHY: &str = "this config differs from torchtitan's deepseek_v3 blocks (multi-head \
                       latent attention without biases, pre-norm RMSNorm, gated SiLU \
                       feed-forward, dense blocks first, then MoE blocks of routed and \
                       shared SiLU experts)";
    const HINT: &str = "use DeepSeek-V3's own config (deepseek-v3), or drop --runtime torchtitan";
    let first = model
        .layers
        .first()
        .ok_or_else(|| CoreError::invalid("num_hidden_layers", "the model has no layers"))?;
    let AttentionKind::Mla {
        num_heads,
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim,
    } = first.attention.kind
    else {
        return Err(refuse("model_type", &model.model_type, WHY, HINT));
    };
    if model.head.tied {
        return Err(refuse(
            "tie_word_embeddings",
            "true",
            "torchtitan's deepseek_v3 flavours are untied (tied embeddings are measured for \
             Qwen 3's dense flavours only)",
            HINT,
        ));
    }
    let swiglu = |d: &crate::model::DenseMlp| d.gated && d.act == Activation::Silu && !d.bias;
    let dense_layers = model
        .layers
        .iter()
        .take_while(|l| matches!(l.mlp, Mlp::Dense(_)))
        .count();
    let ffn = match &first.mlp {
        Mlp::Dense(d) if swiglu(d) => d.intermediate,
        Mlp::Moe(_) => 0,
        _ => return Err(refuse("model_type", &model.model_type, WHY, HINT)),
    };
    let moe = match model.layers.get(dense_layers).map(|l| &l.mlp) {
        None => None,
        Some(Mlp::Moe(m))
            if swiglu(&m.expert)
                && m.shared.is_none_or(|s| swiglu(&s))
                && !m.shared_gate
                && !m.router_bias
                && m.router_extra_params == 0
                && m.frozen_router_params == 0
                && !m.all_experts
                && !m.router_topk_then_softmax
                && !m.shared_first =>
        {
            Some(TitanMoe {
                experts: m.num_experts,
                top_k: m.top_k,
                expert_ffn: m.expert.intermediate,
                shared_ffn: m.shared.map_or(0, |s| s.intermediate),
                route_norm: m.norm_topk_prob.unwrap_or(true),
            })
        }
        Some(_) => return Err(refuse("model_type", &model.model_type, WHY, HINT)),
    };
    let same = model.layers.iter().enumerate().all(|(i, l)| {
        let mlp_ok = if i < dense_layers {
            l.mlp == first.mlp
        } else {
            l.mlp == model.layers[dense_layers].mlp
        };
        mlp_ok
            && l.attention.kind == first.attention.kind
            && !l.attention.qkv_bias
            && !l.attention.o_bias
            && l.attention.sliding_window.is_none()
            && l.attention.qk_norm.is_none()
            && l.residual == Residual::Sequential
            && l.attn_norm.is_some_and(|n| n.kind == NormKind::RmsNorm)
            && l.mlp_norm.is_some_and(|n| n.kind == NormKind::RmsNorm)
            && l.attn_post_norm.is_none()
            && l.mlp_post_norm.is_none()
            && l.mixer == crate::mixer::Mixer::Attention
    });
    if !same || num_heads == 0 || model.vision.is_some() {
        return Err(refuse("model_type", &model.model_type, WHY, HINT));
    }
    Ok(Shapes {
        model: TitanModel::DeepseekV3,
        dim: model.hidden_size,
        heads: num_heads,
        kv_heads: num_heads,
        head_dim: qk_nope_head_dim + qk_rope_head_dim,
        ffn,
        moe,
        vocab: model.embeddings.vocab_size,
        layers: model.layers.len() as u64,
        tied: false,
        mla: Some(TitanMla {
            q_lora_rank: q_lora_rank.unwrap_or(0),
            kv_lora_rank,
            nope_head_dim: qk_nope_head_dim,
            rope_head_dim: qk_rope_head_dim,
            v_head_dim,
        }),
        dense_layers: if moe.is_some() {
            dense_layers as u64
        } else {
            0
        },
    })
}

/// Refuses what the torchtitan profile does not simulate, by name (the capability row, then
/// the layout's model parallelism and the attention / checkpointing policy).
pub fn check(model: &ModelDesc, w: &TrainWorkload, layout: &Layout) -> Result<Shapes, CoreError> {
    w.validate()?;
    if layout.cp > 1 {
        return Err(refuse(
            "cp",
            layout.cp,
            "not measured: torchtitan's context parallelism is not simulated (measured: FSDP2 \
             over `dp_shard`, with tensor + sequence, pipeline or expert parallelism)",
            "use --cp 1 with --runtime torchtitan, or drop --runtime torchtitan (Megatron-LM's \
             profile models it)",
        ));
    }
    check_ep(model, w, layout)?;
    check_deepseek_v3(model, w, layout)?;
    check_hsdp(layout)?;
    check_tp(model, w, layout)?;
    check_pp(model, w, layout)?;
    // the layout's own checks, with torchtitan's TP and PP (checked above) in place of
    // Megatron-LM's (which `Layout::validate` would resolve `tp` or `pp` > 1 to)
    let mut dp_only = layout.clone();
    // torchtitan's EP is carved out of dp_shard (checked by `check_ep`), not Megatron-LM's
    dp_only.ep = 1;
    dp_only.tp = 1;
    dp_only.sequence_parallel = false;
    dp_only.gpus = layout.gpus / layout.pp.max(1);
    dp_only.gpus_per_node = dp_only.gpus_per_node.min(dp_only.gpus).max(1);
    dp_only.pp = 1;
    dp_only.schedule = crate::layout::Schedule::OneFOneB;
    dp_only.virtual_stages = 1;
    dp_only.validate()?;
    // under PP the workload's `grad_accum` is the pipeline's microbatch count (as for
    // Megatron-LM), not torchtitan's gradient accumulation
    let mut per_step = w.clone();
    if layout.pp > 1 {
        per_step.grad_accum = 1;
    }
    Engine::Torchtitan.check(&per_step, Some(&dp_only))?;
    if w.grad_accum > 1 && layout.pp <= 1 {
        // the row refuses it too; kept explicit for the message's field
        return Err(refuse(
            "grad_accum",
            w.grad_accum,
            "not measured: torchtitan's gradient accumulation",
            NOT_MEASURED,
        ));
    }
    if w.checkpointing && w.step_options.checkpointing_policy == CheckpointPolicy::SelectiveAttn {
        return Err(refuse(
            CheckpointPolicy::FIELD,
            "selective-attn",
            "selective-attn is Megatron-LM's selective recomputation; torchtitan's selective AC \
             is op-level (SelectiveAC)",
            "use --checkpointing-policy selective-op, full or every-k:K with --runtime torchtitan",
        ));
    }
    if w.attention == crate::workload::AttentionImpl::Eager {
        return Err(refuse(
            "attention",
            "eager",
            "torchtitan 0.3.0's language models run FlexAttention or varlen (flash) attention \
             (models/common/attention.py); there is no eager path",
            "drop --attention (torchtitan's FlexAttention is simulated)",
        ));
    }
    if w.kernels.padding_free {
        return Err(refuse(
            "padding_free",
            "true",
            "not measured: torchtitan's document masking / varlen batches",
            "drop --padding-free with --runtime torchtitan",
        ));
    }
    let s = shapes(model)?;
    if s.tied && s.moe.is_some() {
        return Err(refuse(
            "tie_word_embeddings",
            "true",
            "not measured: tied embeddings with MoE blocks (torchtitan's qwen3 MoE flavours are \
             untied; the tied unit is measured on the dense 0.6B/1.7B/4B flavours)",
            "use an untied MoE config with --runtime torchtitan",
        ));
    }
    if s.moe.is_some() {
        // measured for the MoE flavours: FSDP2 (dim-0 and dim-1 expert sharding), no / full /
        // every-k AC and SelectiveAC (`titan-qwen3moe-*-selac`, with PP too), the three reshard
        // policies, fused and foreach AdamW
        if layout.tp > 1 {
            return Err(refuse(
                "tp",
                layout.tp,
                "not measured: torchtitan's tensor parallelism of MoE blocks (experts sharded \
                 on their hidden dim, models/common/moe_sharding.py)",
                "use --tp 1 for a MoE model with --runtime torchtitan",
            ));
        }
        if let Some(m) = s.moe {
            // the FSDP mesh: `dp_shard = gpus / (tp · pp)`, the shard group under HSDP
            let dp_shard = if layout.strategy == Strategy::Hsdp {
                layout.shard_group()
            } else {
                layout.gpus / layout.tp.max(1) / layout.pp.max(1)
            };
            if dp_shard > m.experts {
                return Err(refuse(
                    "gpus",
                    layout.gpus,
                    "not measured: with more FSDP ranks than experts torchtitan shards the \
                     experts on their hidden dim (`Shard(1)`, distributed/fsdp.py), whose \
                     gradient re-layout before the reduce-scatter is not simulated",
                    "use at most as many FSDP ranks (gpus / (tp × pp); gpus-per-node under \
                     hsdp) as the model has experts with --runtime torchtitan",
                ));
            }
        }
    }
    Ok(s)
}

/// torchtitan's expert parallelism as measured (`titan-*-ep*`, tools/truth/titan/README.md
/// "Expert parallelism"): `expert_parallel_degree` on a MoE model (Qwen 3 MoE, DeepSeek-V3),
/// carved out of `dp_shard` (the `efsdp × ep` sparse mesh, distributed/parallel_dims.py), with
/// the `AllToAllTokenDispatcher` (the default `moe_comm_backend`), without TP or PP, no AC,
/// FullAC or every-k:K, under balanced routing (the harness's assumption: every rank sends
/// `T·K / ep` routed rows to every rank; real routing is uneven, and the all-to-all buffers
/// and expert activations of a rank grow with the tokens it receives).
fn check_ep(model: &ModelDesc, w: &TrainWorkload, layout: &Layout) -> Result<(), CoreError> {
    let ep = layout.ep;
    if ep <= 1 {
        return Ok(());
    }
    let s = shapes(model)?;
    let Some(m) = s.moe else {
        return Err(refuse(
            "ep",
            ep,
            "expert parallelism shards routed experts, and this model has none",
            "drop --ep for a dense model",
        ));
    };
    if layout.tp > 1 || layout.pp > 1 {
        let (field, value) = if layout.tp > 1 {
            ("tp", layout.tp)
        } else {
            ("pp", layout.pp)
        };
        return Err(refuse(
            field,
            value,
            "not measured: torchtitan's expert parallelism together with tensor or pipeline \
             parallelism (measured: EP over FSDP2's dp_shard only)",
            "use --tp 1 and --pp 1 with --ep and --runtime torchtitan",
        ));
    }
    if w.checkpointing && w.step_options.checkpointing_policy == CheckpointPolicy::SelectiveOp {
        return Err(refuse(
            CheckpointPolicy::FIELD,
            "selective-op",
            "not measured: torchtitan's op-level SelectiveAC with expert parallelism (which of \
             the dispatcher's all-to-all outputs its policy saves)",
            "use --checkpointing-policy full or every-k:K, or no checkpointing, with --ep",
        ));
    }
    if !layout.gpus.is_multiple_of(ep) || !m.experts.is_multiple_of(ep) {
        return Err(refuse(
            "ep",
            ep,
            "torchtitan's EP mesh is carved out of dp_shard (the GPUs) and holds `E / ep` of \
             the routed experts per rank: `ep` must divide both",
            "pick an --ep that divides the GPUs and the routed experts",
        ));
    }
    let routed = w.batch.saturating_mul(w.seq).saturating_mul(m.top_k);
    if !routed.is_multiple_of(m.experts) {
        return Err(refuse(
            "seq",
            w.seq,
            "the EP estimate assumes balanced routing (T·K / E routed rows per expert), and \
             batch × seq × top-k is not a multiple of the routed experts",
            "use a batch × seq whose routed rows divide evenly over the experts with --ep",
        ));
    }
    Ok(())
}

/// torchtitan's deepseek_v3 as measured (`titan-dsv3-*`, tools/truth/titan/README.md
/// "DeepSeek-V3"): FSDP2 over `dp_shard` without TP, PP or EP, no AC, FullAC or every-k:K,
/// the three reshard policies; the rest is refused by name.
fn check_deepseek_v3(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: &Layout,
) -> Result<(), CoreError> {
    if model.model_type != "deepseek_v3" {
        return Ok(());
    }
    if layout.tp > 1 {
        return Err(refuse(
            "tp",
            layout.tp,
            "not measured: torchtitan's tensor parallelism of deepseek_v3 (MLA's and the MoE \
             blocks' TP plans, models/deepseek_v3/sharding.py)",
            "use --tp 1 with deepseek-v3 and --runtime torchtitan (FSDP2 over every GPU), or \
             drop --runtime torchtitan",
        ));
    }
    if layout.pp > 1 {
        return Err(refuse(
            "pp",
            layout.pp,
            "not measured: torchtitan's pipeline parallelism of deepseek_v3",
            "drop --pp with deepseek-v3 and --runtime torchtitan, or drop --runtime torchtitan",
        ));
    }
    if w.checkpointing && w.step_options.checkpointing_policy == CheckpointPolicy::SelectiveOp {
        return Err(refuse(
            CheckpointPolicy::FIELD,
            "selective-op",
            "not measured: torchtitan's op-level SelectiveAC on deepseek_v3 blocks (which of \
             MLA's, the router's and the grouped-mm outputs its policy saves)",
            "use --checkpointing-policy full or every-k:K with deepseek-v3 and --runtime \
             torchtitan",
        ));
    }
    Ok(())
}

/// torchtitan's HSDP as measured (`tests/truth/titan.jsonl`, `titan-hsdp-*`):
/// `data_parallel_replicate_degree = gpus / gpus_per_node` replicas of `data_parallel_shard_degree
/// = gpus_per_node` FSDP2 shards, Llama 3 and Qwen 3 (dense, tied, MoE), bf16 or float8
/// linears; no TP, no PP.
///
/// `fully_shard` on the 2-D `["dp_replicate", "fsdp"]` mesh (torchtitan 0.3.0
/// `models/llama3/parallelize.py`, `distributed/fsdp.py` `apply_fsdp_to_decoder`) shards each
/// parameter within the shard group only, so every buffer of the step is the FSDP2 step's on
/// `dp_shard` ranks: torch 2.15 `distributed/fsdp/_fully_shard/_fsdp_collectives.py`
/// `foreach_reduce` reduce-scatters over the shard group into `reduce_output` (the fp32
/// gradient shard itself, viewed as the sharded gradients), then `dist.all_reduce(reduce_output,
/// group=all_reduce_group)` **in place** (`all_reduce_input = reduce_output` kept in
/// `FSDPParamGroup._all_reduce_state`, the same storage, `_fsdp_param_group.py`); with an fp32
/// `reduce_dtype` `_get_gradient_divide_factors` gives `ReduceOp.AVG` to both collectives, so
/// no division buffer either. Measured: the allocation logs (`--debug`) of dp_replicate 2 ×
/// dp_shard 4 and of FSDP2 on 4 ranks are identical, event for event (and the MoE experts'
/// `efsdp` mesh is replicated the same way: `titan-hsdp-qwen3moe-30b-2l-r2s8-s1024` measures the
/// bytes of `titan-qwen3moe-30b-2l-w8-s1024`).
pub fn check_hsdp(layout: &Layout) -> Result<(), CoreError> {
    if layout.strategy != Strategy::Hsdp {
        return Ok(());
    }
    const HINT: &str = "use --strategy fsdp-full with it (torchtitan's FSDP2 over dp_shard is \
                        measured), or drop --runtime torchtitan";
    for (field, value, reason) in [
        (
            "tp",
            layout.tp,
            "not measured: torchtitan's HSDP combined with tensor parallelism",
        ),
        (
            "pp",
            layout.pp,
            "not measured: torchtitan's HSDP combined with pipeline parallelism",
        ),
        (
            "ep",
            layout.ep,
            "not measured: torchtitan's HSDP combined with expert parallelism",
        ),
    ] {
        if value > 1 {
            return Err(refuse(field, value, reason, HINT));
        }
    }
    Ok(())
}

/// torchtitan's tensor parallelism as measured: `tensor_parallel_degree` with its default
/// `enable_sequence_parallel = true` and `spmd_backend = "spmd_types"` (loss parallel always on
/// with TP), `compile.enable_async_tensor_parallel = false` (async TP needs `torch.compile`,
/// refused), on a 2-D mesh `(dp_shard, tp)`; shapes that split evenly.
fn check_tp(model: &ModelDesc, w: &TrainWorkload, layout: &Layout) -> Result<(), CoreError> {
    if layout.tp <= 1 {
        if layout.sequence_parallel {
            return Err(refuse(
                "sequence_parallel",
                "true",
                "torchtitan's sequence parallelism splits along the tensor-parallel group, and \
                 `tp` is 1",
                "set --tp 2 or more, or drop --sequence-parallel",
            ));
        }
        return Ok(());
    }
    if !layout.sequence_parallel {
        return Err(refuse(
            "sequence_parallel",
            "false",
            "not measured: torchtitan's tensor parallelism without sequence parallelism \
             (`parallelism.enable_sequence_parallel = false`); its default (true) is simulated",
            "add --sequence-parallel with --tp and --runtime torchtitan",
        ));
    }
    if !layout.gpus.is_multiple_of(layout.tp) {
        return Err(CoreError::invalid_value(
            "gpus",
            layout.gpus,
            format!(
                "torchtitan's mesh is dp_shard × tp, and `tp` = {}",
                layout.tp
            ),
            format!("use a multiple of {} GPUs", layout.tp),
        ));
    }
    if !w.seq.is_multiple_of(layout.tp) {
        return Err(CoreError::invalid_value(
            "seq",
            w.seq,
            format!(
                "torchtitan requires `training.seq_len` divisible by `tp` = {} under sequence \
                 parallelism (trainer.py)",
                layout.tp
            ),
            format!("use a `seq` that is a multiple of {}", layout.tp),
        ));
    }
    let s = shapes(model)?;
    if !s.heads.is_multiple_of(layout.tp)
        || !s.kv_heads.is_multiple_of(layout.tp)
        || !s.ffn.is_multiple_of(layout.tp)
    {
        return Err(refuse(
            "tp",
            layout.tp,
            "not measured: a `tp` that does not divide the attention heads, the key/value heads \
             and the feed-forward width (torchtitan's column-parallel shards would be uneven)",
            "use a --tp that divides num_key_value_heads (Llama 3: 8)",
        ));
    }
    Ok(())
}

/// torchtitan's pipeline parallelism as measured (`memory/titan/pipeline.rs`): 1F1B, GPipe or
/// Interleaved1F1B (two stages per rank, torchtitan's default for looped schedules) over
/// `pp × dp_shard (× tp)` ranks, FSDP2 on `dp_shard` ≥ 2, with or without TP + SP (the
/// `titan-pptp-*` fixtures), no AC, FullAC, SelectiveAC or every-k:K
/// (each rank counting its own blocks, see `pipeline.rs`), Llama 3
/// or untied Qwen 3, dense or MoE (any split torchtitan makes, stages without a block included); the
/// workload's `batch` is `pipeline_parallel_microbatch_size` and its `grad_accum` the
/// microbatches per step (`local_batch_size / microbatch_size`).
fn check_pp(model: &ModelDesc, w: &TrainWorkload, layout: &Layout) -> Result<(), CoreError> {
    use crate::layout::Schedule;
    if layout.pp <= 1 {
        return Ok(());
    }
    let sh = shapes(model)?;
    // tests/truth/titan_pp.jsonl measures torchtitan's llama3 and qwen3 (dense and MoE, untied)
    // stages
    if sh.tied {
        // torchtitan 0.3.0 `models/common/decoder.py` `Decoder.Config.update_from_config`:
        // `NotImplementedError("Weight tying is not supported with Pipeline Parallel.")`
        // (measured: `measure_titan.py --model qwen3 --flavor 0.6B --pp 2` raises it)
        return Err(refuse(
            "tie_word_embeddings",
            "true",
            "torchtitan 0.3.0 refuses weight tying with pipeline parallelism (\"Weight tying is \
             not supported with Pipeline Parallel.\", models/common/decoder.py)",
            "use an untied model (e.g. qwen3-8b) with --pp, or drop --pp for a tied Qwen 3",
        ));
    }
    // with TP (+ SP, `check_tp`): measured on pp × dp_shard × tp meshes
    // (`titan-pptp-*`, tests/truth/titan_pp.jsonl)
    // FullAC, SelectiveAC and every-k:K are measured under PP (`tests/truth/titan_pp.jsonl`);
    // selective-attn is refused by `check` for every torchtitan job
    let v_ok = match layout.schedule {
        Schedule::OneFOneB | Schedule::Gpipe => layout.virtual_stages == 1,
        Schedule::Interleaved => layout.virtual_stages == 2,
    };
    if !v_ok {
        return Err(refuse(
            "virtual_stages",
            layout.virtual_stages,
            "not measured: torchtitan's stages per rank other than its defaults (1 for 1F1B and \
             GPipe, 2 for Interleaved1F1B without `pipeline_parallel_layers_per_stage`)",
            "use --virtual-stages 2 with --schedule interleaved (1 otherwise)",
        ));
    }
    let model_parallel = layout.pp * layout.tp.max(1);
    if !layout.gpus.is_multiple_of(model_parallel) || layout.gpus / model_parallel < 2 {
        return Err(refuse(
            "gpus",
            layout.gpus,
            "torchtitan's mesh is pp × dp_shard (× tp); measured with FSDP2 over dp_shard ≥ 2 \
             ranks (gpus a multiple of pp × tp, at least 2 × pp × tp)",
            "use a multiple of --pp × --tp GPUs, at least twice that",
        ));
    }
    if w.grad_accum < layout.pp {
        return Err(CoreError::invalid_value(
            "grad_accum",
            w.grad_accum,
            format!(
                "under --pp the microbatches per step: torch's pipeline schedules need at least \
                 as many microbatches as pipeline ranks ({})",
                layout.pp
            ),
            format!("use --grad-accum {} or more", layout.pp),
        ));
    }
    let s = shapes(model)?;
    pipeline::split(layout.pp * layout.virtual_stages, s.layers)?;
    Ok(())
}

/// Simulates every pp rank of torchtitan's step with pipeline parallelism (one group per pp
/// rank: all its dp_shard ranks hold the same padded shards of the same stages).
fn simulate_pipeline(
    s: Shapes,
    w: &TrainWorkload,
    layout: &Layout,
    opts: &TitanOptions,
) -> Result<DistEstimate, CoreError> {
    if opts.reshard == Some(ReshardPolicy::Always) {
        return Err(refuse(
            "fsdp_reshard_after_forward",
            "always",
            "not measured: resharding after forward under torchtitan's pipeline parallelism \
             (its default there is no reshard)",
            "drop the reshard setting with --pp",
        ));
    }
    let to64 =
        |v: u128, what: &'static str| u64::try_from(v).map_err(|_| CoreError::Overflow { what });
    let mut groups = Vec::new();
    // ranks per pp rank (dp_shard × tp), and the data-parallel degree (dp_shard)
    let per_pp = layout.gpus / layout.pp;
    let dp = per_pp / layout.tp.max(1);
    let mut largest = 0u128;
    let mut params_total = 0u128;
    for rank in 0..layout.pp {
        let job = PipeJob {
            shapes: s,
            world: layout.gpus,
            pp: layout.pp,
            tp: layout.tp,
            rank,
            schedule: layout.schedule,
            stages_per_rank: layout.virtual_stages,
            microbatch_size: w.batch,
            microbatches: w.grad_accum,
            seq: w.seq,
            fused_optimizer: w.optimizer == Optimizer::AdamwFused,
            checkpointing: w
                .checkpointing
                .then_some(w.step_options.checkpointing_policy),
        };
        let all = rank_instants(&job)?;
        let (peak_i, peak) = all
            .iter()
            .enumerate()
            .map(|(i, x)| (i, x.total()))
            .max_by_key(|&(i, t)| (t, std::cmp::Reverse(i)))
            .ok_or(CoreError::Overflow { what: "instants" })?;
        let at = &all[peak_i];
        let at_peak = Category::ALL
            .iter()
            .zip(at.bytes)
            .map(|(c, v)| Ok((*c, to64(v, "breakdown")?)))
            .collect::<Result<Vec<_>, CoreError>>()?;
        let phase_peaks = [Phase::Backward, Phase::Optimizer]
            .iter()
            .map(|p| {
                let m = all
                    .iter()
                    .filter(|x| x.phase == *p)
                    .map(Instant::total)
                    .max()
                    .unwrap_or(0);
                Ok((*p, to64(m, "phase peak")?))
            })
            .collect::<Result<Vec<_>, CoreError>>()?;
        let (states, params) = pipeline::rank_states(&job)?;
        largest = largest.max(peak);
        params_total += params;
        let stages: Vec<String> = (0..layout.virtual_stages)
            .map(|k| (rank + k * layout.pp).to_string())
            .collect();
        groups.push(RankGroup {
            label: if layout.tp > 1 {
                format!(
                    "pp rank {rank} (stage {}, dp_shard {dp} × tp {} ranks)",
                    stages.join(" and "),
                    layout.tp
                )
            } else {
                format!(
                    "pp rank {rank} (stage {}, {dp} dp_shard ranks)",
                    stages.join(" and ")
                )
            },
            ranks: RankSet::span(rank * per_pp, (rank + 1) * per_pp - 1, layout.gpus),
            peak_bytes: to64(peak, "peak bytes")?,
            at_peak,
            phase: at.phase,
            host_bytes: 0,
            model_state_bytes: to64(states, "model states")?,
            phase_peaks,
        });
    }
    let worst = groups
        .iter()
        .enumerate()
        .max_by_key(|(i, g)| (g.peak_bytes, std::cmp::Reverse(*i)))
        .map_or(0, |(i, _)| i);
    Ok(DistEstimate {
        engine: Engine::Torchtitan,
        groups,
        worst,
        peak_bytes: to64(largest, "peak bytes")?,
        host_bytes_per_node: 0,
        nvme_bytes_per_rank: 0,
        comm_buffers: vec![],
        dp,
        global_batch: w.batch.saturating_mul(w.grad_accum).saturating_mul(dp),
        params_total: to64(params_total, "parameters")?,
    })
}

/// Simulates every rank of torchtitan's training step (all ranks of the `dp_shard × tp` mesh
/// hold the same padded shards of equal TP shards, so they form one group).
pub fn simulate_train_titan(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: &Layout,
    opts: &TitanOptions,
) -> Result<DistEstimate, CoreError> {
    let s = check(model, w, layout)?;
    if let Some(recipe) = opts.float8 {
        float8::check(recipe, opts.float8_all_gather, &s, layout.tp, layout.pp)?;
    } else if opts.float8_all_gather {
        return Err(refuse(
            "float8_all_gather",
            "true",
            "float8 all-gather gathers float8 weights, so it needs float8 linears",
            "drop --float8-all-gather, or add --float8 rowwise",
        ));
    }
    if layout.pp > 1 {
        return simulate_pipeline(s, w, layout, opts);
    }
    let reshard = opts
        .reshard
        .unwrap_or_else(|| ReshardPolicy::for_strategy(layout.strategy));
    // HSDP: the step of FSDP2 over the shard group (`check_hsdp`); the replicas add nothing
    let world = if layout.strategy == Strategy::Hsdp {
        layout.shard_group()
    } else {
        layout.gpus
    };
    let job = step::Job {
        shapes: s,
        world,
        tp: layout.tp,
        ep: layout.ep,
        batch: w.batch,
        seq: w.seq,
        checkpointing: w
            .checkpointing
            .then_some(w.step_options.checkpointing_policy),
        reshard,
        fused_optimizer: w.optimizer == Optimizer::AdamwFused,
        float8: opts.float8,
    };
    let all = instants(&job)?;
    let (peak_i, peak) = all
        .iter()
        .enumerate()
        .map(|(i, x)| (i, x.total()))
        .max_by_key(|&(i, t)| (t, std::cmp::Reverse(i)))
        .ok_or(CoreError::Overflow { what: "instants" })?;
    let to64 =
        |v: u128, what: &'static str| u64::try_from(v).map_err(|_| CoreError::Overflow { what });
    let at = &all[peak_i];
    let at_peak = Category::ALL
        .iter()
        .zip(at.bytes)
        .map(|(c, v)| Ok((*c, to64(v, "breakdown")?)))
        .collect::<Result<Vec<_>, CoreError>>()?;
    let phase_peaks = [
        Phase::Forward,
        Phase::Loss,
        Phase::Backward,
        Phase::Optimizer,
    ]
    .iter()
    .map(|p| {
        let m = all
            .iter()
            .filter(|x| x.phase == *p)
            .map(step::Instant::total)
            .max()
            .unwrap_or(0);
        Ok((*p, to64(m, "phase peak")?))
    })
    .collect::<Result<Vec<_>, CoreError>>()?;
    let sizes = step::Sizes::new(&job)?;
    let group = RankGroup {
        label: if layout.gpus == 1 {
            "rank 0 (an FSDP mesh of one)".to_owned()
        } else if layout.ep > 1 {
            format!(
                "all {} ranks (dp_shard {}, experts over ep {} × efsdp {}; balanced routing \
                 assumed)",
                layout.gpus,
                layout.gpus,
                layout.ep,
                layout.gpus / layout.ep
            )
        } else if layout.strategy == Strategy::Hsdp {
            format!(
                "all {} ranks (a dp_replicate {} × dp_shard {world} mesh)",
                layout.gpus,
                layout.gpus / world.max(1)
            )
        } else if layout.tp > 1 {
            format!(
                "all {} ranks (a dp_shard {} × tp {} mesh)",
                layout.gpus,
                layout.gpus / layout.tp,
                layout.tp
            )
        } else {
            format!("all {} ranks (one FSDP mesh)", layout.gpus)
        },
        ranks: RankSet::span(0, layout.gpus.saturating_sub(1), layout.gpus),
        peak_bytes: to64(peak, "peak bytes")?,
        at_peak,
        phase: at.phase,
        host_bytes: 0,
        model_state_bytes: to64(sizes.model_states(), "model states")?,
        phase_peaks,
    };
    Ok(DistEstimate {
        engine: Engine::Torchtitan,
        groups: vec![group],
        worst: 0,
        peak_bytes: to64(peak, "peak bytes")?,
        host_bytes_per_node: 0,
        nvme_bytes_per_rank: 0,
        comm_buffers: vec![
            CommBuffer {
                name: "FSDP2 all-gather output of the largest unit (bf16)".into(),
                bytes: to64(sizes.largest_unsharded(), "all-gather")?,
            },
            CommBuffer {
                name: "FSDP2 reduce-scatter input of the largest unit (fp32)".into(),
                bytes: to64(2 * sizes.largest_unsharded(), "reduce-scatter")?,
            },
        ],
        dp: layout.dp(),
        global_batch: w.batch.saturating_mul(layout.dp()),
        params_total: to64(sizes.params_total(), "parameters")?,
    })
}

#[cfg(test)]
mod tests;
