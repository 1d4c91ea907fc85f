//! Runtime profile `hf`: one training step of PyTorch eager + transformers
//! `AutoModelForCausalLM` with the loss computed inside the model, or one `generate` run of the
//! same model, replayed op by op.
//!
//! Each helper below mirrors a piece of transformers 5.x / PyTorch 2.x code and cites it.
//! What a helper allocates and what autograd saves was read from those sources and checked
//! against allocation traces of the truth harness (`tools/truth/`).
//!
//! The builder is split by concern, one `impl Builder` block per file:
//! - `mod.rs`: the builder's state and the autograd-aware op helpers every module uses;
//! - `params.rs`: parameter construction (stored dtypes, quantised formats, LoRA adapters);
//! - `modules.rs`: `nn.Linear`, the norms, dropout;
//! - `attention.rs`: the attention block, its kernels and the causal mask;
//! - `mlp.rs`: activations, dense MLPs and mixtures of experts;
//! - `forward.rs`: embeddings, one decoder layer, the tail before the LM head;
//! - `train.rs`: the training step (forward with loss, backward, optimizer);
//! - `infer.rs`: `generate` (prefill, decode, the KV cache);
//! - `ssm.rs`: state-space (Mamba-2) mixers and their fixed-size inference state;
//! - `parallel.rs`: layers that run attention and a Mamba-2 mixer side by side (Falcon-H1);
//! - `mamba1.rs`: Mamba-1 mixers (the sequential selective scan) and their inference state;
//! - `shard.rs`: the data-parallel sharding hooks (FSDP2, ZeRO, DDP).

mod attention;
mod deltanet;
mod forward;
mod infer;
mod llama4;
mod llama4_vision;
mod mamba1;
mod mlp;
mod modules;
mod parallel;
mod params;
mod pixtral;
mod sac;
mod shard;
mod siglip;
mod ssm;
mod train;
mod vision;

use super::dist_types::{ShardSim, Unit};
use super::timeline::{Category, Ids, Node, SegKind, SegTag, TensorId, Timeline};
use crate::model::{AttentionKind, LinearRole, ModelDesc};
use crate::workload::{
    AttentionImpl, InferWorkload, KernelOptions, Lora, Precision, TrainWorkload, WeightFormat,
};
pub(crate) use sac::check as sac_check;
pub(crate) use train::micro_batches_replayed;
pub use vision::image_grid;

/// Which device's kernels the simulation follows where CPU and CUDA differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// CUDA: `native_dropout` keeps a 1-byte mask; the caching allocator rounds blocks to 512 bytes.
    Cuda,
    /// CPU (what the fake-tensor truth harness runs): dropout keeps a noise tensor of the input's
    /// dtype, SDPA with dropout falls back to the math kernel, and sizes are not rounded.
    Cpu,
}

/// A replay of some of the model's decoder layers that stands for all of them (the fast
/// evaluator's reduced models, `memory/fast.rs`). Each replayed slot runs one full-model
/// layer; whole-model sums (optimizer states, gradient buckets, shard partitions, parameter
/// counts) count each slot `weight` times, so they take their full-model values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reduced<'a> {
    /// Full-model index of the layer each slot runs.
    pub layers: &'a [usize],
    /// How many full-model layers each slot stands for in whole-model sums.
    pub weight: &'a [u128],
}

/// A parameter tensor with its trainability.
#[derive(Debug, Clone, Copy)]
struct P {
    id: TensorId,
    numel: u128,
    /// Size of the last dimension (1 for vectors): Adafactor factors matrices as
    /// `row_var` (numel / cols elements) and `col_var` (`cols` elements per leading index).
    cols: u128,
    /// Size of the second-to-last dimension (0 for vectors).
    rows: u128,
    /// The sharding unit the parameter belongs to (0 = root, 1 + i = decoder layer slot i).
    unit: usize,
}

/// One linear layer's parameters and adapters.
#[derive(Debug, Clone, Copy)]
struct LinearP {
    w: P,
    /// Base weight stored as bitsandbytes NF4 (QLoRA).
    nf4: bool,
    /// Weight stored in a quantised inference format.
    quantized: bool,
    b: Option<P>,
    lora: Option<(P, P)>,
    in_f: u128,
    out_f: u128,
}

/// What the builder replays, with the workload that shapes it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Mode<'a> {
    /// One steady-state training step (`train.rs`).
    Train(&'a TrainWorkload),
    /// `generate`-style inference under `torch.no_grad()` with a DynamicCache (`infer.rs`).
    Infer(&'a InferWorkload),
}

impl<'a> Mode<'a> {
    /// The training workload; `None` in inference.
    fn train(self) -> Option<&'a TrainWorkload> {
        match self {
            Mode::Train(w) => Some(w),
            Mode::Infer(_) => None,
        }
    }

    /// The inference workload; `None` in training.
    fn infer(self) -> Option<&'a InferWorkload> {
        match self {
            Mode::Train(_) => None,
            Mode::Infer(w) => Some(w),
        }
    }

    /// Inference: `torch.no_grad()`, nothing trainable, a DynamicCache.
    fn is_infer(self) -> bool {
        matches!(self, Mode::Infer(_))
    }

    /// The attention implementation the model was loaded with.
    fn attention(self) -> AttentionImpl {
        match self {
            Mode::Train(w) => w.attention,
            Mode::Infer(w) => w.attention,
        }
    }

    /// Dropout is active: a training step with dropout on (`generate` runs the model in
    /// `eval()` mode, where dropout is the identity).
    fn dropout(self) -> bool {
        self.train().is_some_and(|w| w.dropout)
    }

    /// The training loop keeps the model's output object (`--loop keep-outputs`).
    fn keeps_outputs(self) -> bool {
        self.train().is_some_and(|w| w.step_options.keeps_outputs())
    }

    /// A training forward builds a KV cache: `use_cache` as the workload sets it, else the
    /// config's (checkpointing and padding-free batches turn it off on their own).
    fn use_cache(self, model: &ModelDesc) -> bool {
        self.train()
            .is_some_and(|w| w.step_options.use_cache.unwrap_or(model.use_cache))
    }

    /// HF gradient checkpointing (training only).
    fn checkpointing(self) -> bool {
        self.train().is_some_and(|w| w.checkpointing)
    }

    /// The LoRA / QLoRA adapters (training only).
    fn lora(self) -> Option<&'a Lora> {
        self.train().and_then(|w| w.lora.as_ref())
    }

    /// The fused kernels and padding-free batches of a training step (the defaults in inference).
    fn kernels(self) -> KernelOptions {
        self.train().map(|w| w.kernels).unwrap_or_default()
    }

    /// The storage format of the weights in inference; `None` in training.
    fn weights(self) -> Option<WeightFormat> {
        self.infer().map(|w| w.weights)
    }
}

/// What only a training step has: the parameters the optimizer updates and, on a data-parallel
/// rank, the sharding state. Empty in inference, where nothing requires grad.
#[derive(Debug, Default)]
struct TrainState {
    /// every trainable parameter (for the optimizer)
    trainable: Vec<P>,
    /// elements of the trainable parameters
    trainable_count: u128,
    /// data-parallel sharding simulated on this rank (FSDP2 / DeepSpeed ZeRO / DDP)
    shard: Option<ShardSim>,
    /// the sharding state of each unit (0 = root, 1 + i = decoder layer i)
    units: Vec<Unit>,
    /// the unit whose parameters are being built
    cur_unit: usize,
    /// FSDP2: the unit whose all-gather was issued ahead (backward prefetch), with its buffer
    prefetched: Option<(usize, TensorId)>,
    /// FSDP2: the reduce-scatter input kept alive until the next unit's post-backward
    rs_in_flight: Option<TensorId>,
    /// FSDP2: the forward all-gather output kept until the next unit's all-gather
    ag_held: Option<TensorId>,
    /// a unit's gradients while it reduces them (reused from unit to unit)
    grad_scratch: Vec<TensorId>,
    /// units an earlier builder left, reused by new units for their lists' capacity
    spare_units: Vec<Unit>,
}

/// The timeline of one training step or one inference run, built op by op.
pub(crate) struct Builder<'a> {
    pub(crate) t: Timeline,
    model: &'a ModelDesc,
    /// The decoder layers replayed, when not all of them (fast evaluator).
    reduced: Option<Reduced<'a>>,
    /// training step or inference run, with its workload
    mode: Mode<'a>,
    kernels: Kernels,
    /// bytes per element of parameters
    param_size: u128,
    /// bytes per element of matmul outputs (autocast dtype under AMP)
    compute_size: u128,
    /// autocast active (fp32 weights, low-precision matmuls)
    amp: bool,
    /// Falcon under autocast: `FalconLinear.forward` is `hidden_states @ self.weight.T` then
    /// `+ self.bias`, so a biased projection's 16-bit matmul output is summed with the fp32
    /// bias into an fp32 output (transformers 5.23 models/falcon/modeling_falcon.py
    /// `FalconLinear.forward`)
    bias_fp32: bool,
    /// bytes per element of LoRA adapters (peft upcasts bf16/fp16 adapters to fp32)
    adapter_size: u128,
    batch: u128,
    /// tokens per sequence in the current forward (the prompt, then 1 per decode step)
    seq: u128,
    tokens: u128,
    hidden: u128,
    /// Per layer: parameters by role, norms, experts.
    layers: Vec<LayerParams>,
    embed: P,
    pos_embed: Option<P>,
    /// OPT `project_in` / `project_out`
    projections: Option<(LinearP, LinearP)>,
    final_norm: Option<(P, Option<P>)>,
    lm_head: Option<P>,
    /// all parameter elements
    pub(crate) param_count: u128,
    /// tensors whose Python reference lives until the model outputs are dropped
    out_refs: Vec<TensorId>,
    /// autocast's weight-cast cache, cleared when the autocast region exits
    autocast_cache: Vec<TensorId>,
    /// A checkpointed layer's forward is being recomputed in backward (non-reentrant
    /// checkpoint: the recomputed saved tensors are held only while their node runs).
    recomputing: bool,
    /// Per checkpointed layer (by slot): the nodes its first pass ends with that save nothing,
    /// run before its recompute, and how many of its nodes save a tensor, after which the
    /// recompute stops (`Timeline::take_tail`, `Timeline::stop_after`).
    ckpt_tails: Vec<(Vec<Node>, u32)>,
    /// rotary cos/sin (shared by all layers, saved by the rotary multiplications)
    rope_tables: Option<(TensorId, TensorId)>,
    /// the current layer's query is laid out [B, H, S, D] (made by `cat`)
    q_bhsd: bool,
    /// the current layer's value when it is a stride-0 view of one key/value group over every
    /// query head (Falcon's new architecture with one group, `Builder::falcon_expanded_split`)
    expanded_value: Option<TensorId>,
    /// keys visible to the current forward (= `seq` in training; cache + new tokens in inference)
    kv_len: u128,
    /// index of the layer being built
    cur_layer: usize,
    /// tensors bound to Python locals of the decoder layer, released when it returns
    layer_locals: Vec<TensorId>,
    /// tensors bound to Python locals of the attention function, released when it returns
    attn_locals: Vec<TensorId>,
    /// the last block's returned extras, bound by the model's loop until the forward returns
    block_outputs: Vec<TensorId>,
    /// training only: trainable parameters and sharding
    train: TrainState,
    /// inference only: per layer, the cached (k, v) storages and the tokens the cache layer keeps
    cache: Vec<Option<(TensorId, TensorId, u128)>>,
    /// inference only: per layer, the (conv, ssm) state of a Mamba-2 mixer that runs beside
    /// the layer's attention (whose KV cache is in `cache`)
    ssm_cache: Vec<Option<(TensorId, TensorId)>>,
    /// the running layer's MLP multiplies its gate projection and its output by scalars
    /// (`ScalarMuls::mlp_gate`, `ScalarMuls::mlp_down`)
    mlp_muls: (bool, bool),
    /// The next dense MLP owns its input's reference and drops it after the first projection
    /// ([`crate::model::LayerSpec::mlp_input_rebound`]).
    mlp_input_rebound: bool,
    /// tensors bound to Python locals of the MoE block, released when it returns
    mlp_locals: Vec<TensorId>,
    /// a causal mask the model builds but no layer reads (`ModelDesc::builds_both_masks`),
    /// released when the base model's forward returns
    unused_mask: Option<TensorId>,
    /// the sliding-window mask when the model builds two masks and each layer reads its type's
    /// (`causal_mask_mapping[layer_type]`): the layers with a window read this one, the others
    /// the full mask ([`Builder::layer_mask`]); released when the base model's forward returns
    sliding_mask: Option<TensorId>,
    /// training: the KV cache's (k, v) storages the model output holds (`past_key_values`)
    cache_refs: Vec<TensorId>,
    /// training: what the model output of the running forward holds (logits, cache, loss)
    /// when the loop keeps it (`--loop keep-outputs`)
    outputs_kept: Vec<TensorId>,
    /// training: the previous forward's kept output object, freed when the next forward returns
    outputs_prev: Vec<TensorId>,
    /// training: the model-level attention mask passed to every layer's attention function
    attn_mask: Option<TensorId>,
    /// training: the checkpointed core-attention calls (`selective-attn`), by tape index
    core_calls: Vec<CoreCall>,
    /// the LM head's bias (Phi-2 `lm_head = nn.Linear(..., bias=True)`), also when the weight is tied
    lm_head_bias: Option<P>,
    /// the running attention's output gate (`Attention::output_gate`): the contiguous copy of
    /// the gate half of `q_proj`'s output, a local of the attention function
    attn_gate: Option<TensorId>,
    /// image inputs: the vision tower's outputs and the placeholder masks, locals of the
    /// wrapper's forward until the language model returns (memory/hf/vision.rs)
    vision_refs: Vec<TensorId>,
    /// training: grad-requiring leaves reached by backward and their `.grad`, held by the
    /// graph (the leaf's AccumulateGrad node) until it is freed with the loss after backward
    leaves_held: Vec<TensorId>,
    /// inference: the prefill has run the vision tower (decode steps carry no pixels)
    images_done: bool,
    /// the running forward carries Gemma 3 image tokens with their `token_type_ids`: the
    /// wrapper builds bidirectional image-block masks for every layer type (memory/hf/siglip.rs)
    image_blocks: bool,
    /// training: torchtitan's op-level SAC state of the checkpointed layer being run (`sac.rs`)
    sac: sac::Sac,
    /// Decoder layers whose parameters are built so far.
    layers_built: usize,
}

/// One core-attention call under a checkpoint (`--checkpointing-policy selective-attn`): what
/// its recomputation in backward needs.
#[derive(Debug, Clone, Copy)]
struct CoreCall {
    slot: usize,
    q: (TensorId, u128),
    k: (TensorId, u128),
    v: (TensorId, u128),
    heads: u128,
    kv_heads: u128,
    qk_dim: u128,
    v_dim: u128,
    q_bhsd: bool,
    /// `v` is a stride-0 view of one head over all `heads` (`Builder::expanded_value`)
    v_broadcast: bool,
}

impl Drop for Builder<'_> {
    fn drop(&mut self) {
        std::mem::replace(&mut self.t, Timeline::empty()).recycle();
        Spare::recycle(self);
    }
}

/// Layer parameter tables a spare keeps at most (a replay of thousands of layers does not keep
/// its memory for good).
const SPARE_LAYERS: usize = 256;

/// Entries a spare list keeps room for.
const SPARE_LIST: usize = 1 << 10;

/// The buffers of a finished builder, kept per thread for the next one (the fast evaluator
/// runs its reduced replays one after the other): the next replay reuses them instead of
/// allocating its lists and layer tables again. Only capacity is kept, never contents.
#[derive(Default)]
struct Spare {
    /// Layer tables as the last builder left them: `build_params` empties each
    /// ([`LayerParams::reset`]) before filling it, so their own lists keep their capacity.
    layers: Vec<LayerParams>,
    trainable: Vec<P>,
    out_refs: Vec<TensorId>,
    autocast_cache: Vec<TensorId>,
    layer_locals: Vec<TensorId>,
    attn_locals: Vec<TensorId>,
    block_outputs: Vec<TensorId>,
    mlp_locals: Vec<TensorId>,
    leaves_held: Vec<TensorId>,
    core_calls: Vec<CoreCall>,
    units: Vec<Unit>,
}

thread_local! {
    static SPARE: std::cell::RefCell<Option<Spare>> = const { std::cell::RefCell::new(None) };
}

impl Spare {
    /// The spare buffers of this thread, or new ones.
    fn take() -> Self {
        SPARE
            .with(|s| s.try_borrow_mut().ok().and_then(|mut v| v.take()))
            .unwrap_or_default()
    }

    /// Keeps `b`'s buffers (emptied) for the next builder on this thread.
    fn recycle(b: &mut Builder<'_>) {
        fn list<T>(v: &mut Vec<T>) -> Vec<T> {
            let mut v = std::mem::take(v);
            v.clear();
            v.shrink_to(SPARE_LIST);
            v
        }
        let mut layers = std::mem::take(&mut b.layers);
        layers.truncate(SPARE_LAYERS);
        layers.shrink_to(SPARE_LAYERS);
        let spare = Spare {
            layers,
            trainable: list(&mut b.train.trainable),
            out_refs: list(&mut b.out_refs),
            autocast_cache: list(&mut b.autocast_cache),
            layer_locals: list(&mut b.layer_locals),
            attn_locals: list(&mut b.attn_locals),
            block_outputs: list(&mut b.block_outputs),
            mlp_locals: list(&mut b.mlp_locals),
            leaves_held: list(&mut b.leaves_held),
            core_calls: list(&mut b.core_calls),
            units: {
                let mut units = std::mem::take(&mut b.train.spare_units);
                units.append(&mut b.train.units);
                units.truncate(SPARE_LAYERS);
                units
            },
        };
        SPARE.with(|s| {
            if let Ok(mut v) = s.try_borrow_mut() {
                if v.is_none() {
                    *v = Some(spare);
                }
            }
        });
    }
}

/// One decoder layer's parameters.
#[derive(Debug, Clone, Default)]
struct LayerParams {
    linears: Vec<(LinearRole, LinearP)>,
    norms: [Option<(P, Option<P>)>; 4],
    qk_norms: Option<(P, P)>,
    /// The q/k norms' biases (`Attention::qk_norm_bias`).
    qk_norm_biases: Option<(P, P)>,
    /// MoE: router, fused experts (all experts' weights of one kind in one parameter)
    router: Option<LinearP>,
    experts: Vec<P>,
    shared: Vec<(LinearRole, LinearP)>,
    shared_gate: Option<LinearP>,
    mla_norms: Vec<P>,
    /// State-space mixer parameters other than its projections (`ssm.rs`).
    ssm: Vec<P>,
    /// Attention sinks (one logit per query head), when the attention has them.
    sinks: Option<P>,
}

impl LayerParams {
    /// Empties the table for another layer, keeping its lists' capacity.
    fn reset(&mut self) {
        let LayerParams {
            linears,
            norms,
            qk_norms,
            qk_norm_biases,
            router,
            experts,
            shared,
            shared_gate,
            mla_norms,
            ssm,
            sinks,
        } = self;
        linears.clear();
        *norms = [None; 4];
        *qk_norms = None;
        *qk_norm_biases = None;
        *router = None;
        experts.clear();
        shared.clear();
        *shared_gate = None;
        mla_norms.clear();
        ssm.clear();
        *sinks = None;
    }
}

impl<'a> Builder<'a> {
    /// A training step of `w`, on a data-parallel rank when `shard` is given.
    pub(crate) fn train(
        model: &'a ModelDesc,
        w: &'a TrainWorkload,
        kernels: Kernels,
        shard: Option<ShardSim>,
    ) -> Self {
        // A padding-free batch is one row of all its tokens (transformers
        // `DataCollatorWithFlattening`: `input_ids` [1, sum of lengths], position ids restarting
        // per sequence).
        let (batch, seq) = if w.kernels.padding_free {
            (1, w.batch.saturating_mul(w.seq))
        } else {
            (w.batch, w.seq)
        };
        let mut b = Builder::new(model, Mode::Train(w), w.precision, batch, seq, kernels);
        if shard.is_some_and(|s| s.cast_params) {
            // FSDP2's MixedPrecisionPolicy casts every parameter of a unit, peft's fp32 adapters
            // included, to `param_dtype` at the all-gather (torch 2.15
            // `distributed/fsdp/_fully_shard/_fsdp_param.py`: `all_gather_inputs` casts the fp32
            // shard, `init_all_gather_outputs` and `init_unsharded_param` build the unsharded
            // parameter in `param_dtype`): in forward `lora_A.weight.dtype` is the
            // base's bf16, so peft's `_cast_input_dtype` is a no-op and the adapter path runs in
            // bf16 (peft 0.21.2 `tuners/lora/layer.py` `Linear.forward`). Their fp32 shards are
            // the sharding's (`shard.rs` `sharded_elem`).
            b.adapter_size = b.param_size;
        }
        b.train.shard = shard;
        b
    }

    /// A `generate` run of `w`.
    pub(crate) fn infer(model: &'a ModelDesc, w: &'a InferWorkload, kernels: Kernels) -> Self {
        let precision = match w.weights {
            WeightFormat::Fp16 => Precision::Fp16,
            WeightFormat::Fp32 => Precision::Fp32,
            // quantised formats compute in bf16 (bnb_4bit_compute_dtype / torch_dtype=bfloat16)
            _ => Precision::Bf16,
        };
        Builder::new(model, Mode::Infer(w), precision, w.batch, w.prompt, kernels)
    }

    fn new(
        model: &'a ModelDesc,
        mode: Mode<'a>,
        precision: Precision,
        batch: u64,
        seq: u64,
        kernels: Kernels,
    ) -> Self {
        let param_size = u128::from(precision.param_dtype().size());
        let compute_size = u128::from(precision.compute_dtype().size());
        let amp = precision.autocast();
        // peft `_cast_adapter_dtype(autocast_adapter_dtype=True)` upcasts fp16/bf16 adapters to fp32
        // (peft `tuners/tuners_utils.py`).
        let adapter_size = 4;
        let tokens = u128::from(batch) * u128::from(seq);
        let mut t = Timeline::pooled();
        if kernels == Kernels::Cuda {
            t.granularity = 512;
        }
        let Spare {
            layers,
            trainable,
            out_refs,
            autocast_cache,
            layer_locals,
            attn_locals,
            block_outputs,
            mlp_locals,
            leaves_held,
            core_calls,
            units,
        } = Spare::take();
        Builder {
            t,
            model,
            reduced: None,
            mode,
            kernels,
            param_size,
            compute_size,
            amp,
            bias_fp32: amp
                && model
                    .layers
                    .iter()
                    .any(|l| l.attention.eager_style == crate::model::EagerStyle::Falcon),
            adapter_size,
            batch: u128::from(batch),
            seq: u128::from(seq),
            tokens,
            hidden: u128::from(model.hidden_size),
            layers,
            embed: P {
                id: 0,
                numel: 0,
                rows: 0,
                cols: 1,
                unit: 0,
            },
            pos_embed: None,
            projections: None,
            final_norm: None,
            lm_head: None,
            param_count: 0,
            out_refs,
            autocast_cache,
            recomputing: false,
            ckpt_tails: Vec::new(),
            rope_tables: None,
            q_bhsd: false,
            expanded_value: None,
            kv_len: u128::from(seq),
            cur_layer: 0,
            layer_locals,
            attn_locals,
            block_outputs,
            train: TrainState {
                trainable,
                spare_units: units,
                ..TrainState::default()
            },
            cache: Vec::new(),
            ssm_cache: Vec::new(),
            mlp_muls: (false, false),
            mlp_input_rebound: false,
            mlp_locals,
            unused_mask: None,
            sliding_mask: None,
            cache_refs: Vec::new(),
            outputs_kept: Vec::new(),
            outputs_prev: Vec::new(),
            attn_mask: None,
            core_calls,
            lm_head_bias: None,
            attn_gate: None,
            vision_refs: Vec::new(),
            leaves_held,
            images_done: false,
            image_blocks: false,
            sac: sac::Sac::default(),
            layers_built: 0,
        }
    }

    /// Elements of the trainable parameters.
    pub(crate) fn trainable_count(&self) -> u128 {
        self.train.trainable_count
    }

    /// Replays only `r`'s slots (set before running).
    pub(crate) fn set_reduced(&mut self, r: Reduced<'a>) {
        self.reduced = Some(r);
    }

    /// Cuts the timeline's segment here (fast evaluator; nothing otherwise): what follows
    /// belongs to decoder-layer slot `slot` (or to none), as part `kind` of the step.
    fn seg(&mut self, slot: Option<usize>, kind: SegKind) {
        self.t.cut(SegTag {
            slot: slot.map(|s| u32::try_from(s).unwrap_or(u32::MAX)),
            kind,
        });
    }

    /// Whether any decoder layer satisfies `f` (the replayed slots include every distinct
    /// layer of the model, so a reduced replay answers as the whole model does).
    /// The causal mask layer slot `i` reads: its type's when the model built two
    /// (`causal_mask_mapping[self.config.layer_types[i]]`), else the one mask.
    fn layer_mask(&self, i: usize) -> Option<TensorId> {
        match self.sliding_mask {
            Some(m) if self.spec(i).attention.sliding_window.is_some() => Some(m),
            _ => self.attn_mask,
        }
    }

    fn any_layer(&self, f: impl Fn(&crate::model::LayerSpec) -> bool) -> bool {
        (0..self.n_layers()).any(|i| f(self.spec(i)))
    }

    /// The replayed layers in model order. A reduced replay's slots include the first
    /// repeat of every block, so the first replayed layer with a property is equal to the
    /// model's first layer with it, and any layer has it exactly when a replayed one does: the
    /// model-level answers below read the slots (a few) instead of every layer of the model.
    fn layer_specs(&self) -> impl Iterator<Item = &'a crate::model::LayerSpec> + '_ {
        (0..self.n_layers()).map(|i| self.spec(i))
    }

    /// Width of the model-level rotary cos/sin tables (`*RotaryEmbedding.forward`, run once per
    /// forward and passed to every layer): the rotary dims of the first layer that rotates (MLA:
    /// `qk_rope_head_dim`), 0 when none does. Layers that skip the rotation (SmolLM3's NoPE
    /// layers, modeling_smollm3.py `if self.use_rope:`) still receive the tables.
    fn rope_table_dim(&self) -> u128 {
        self.layer_specs()
            .filter_map(|l| l.attention_block())
            .map(|a| match a.kind {
                AttentionKind::Standard { .. } => a.rotary_dim.map_or(0, u128::from),
                AttentionKind::Mla {
                    qk_rope_head_dim, ..
                } => u128::from(qk_rope_head_dim),
            })
            .find(|&d| d > 0)
            .unwrap_or(0)
    }

    /// Llama 4's rotary embedding by complex multiplication ([`Attention::rope_complex`]): the
    /// per-head width of its one `freqs_cis` table, when any layer rotates that way.
    ///
    /// [`Attention::rope_complex`]: crate::model::Attention::rope_complex
    fn complex_rope_head_dim(&self) -> Option<u128> {
        if !self.any_layer(|l| l.attention.rope_complex) {
            return None;
        }
        let a = self.layer_specs().find_map(|l| l.attention_block())?;
        Some(match a.kind {
            AttentionKind::Standard { head_dim, .. } => u128::from(head_dim),
            AttentionKind::Mla {
                qk_rope_head_dim, ..
            } => u128::from(qk_rope_head_dim),
        })
    }

    /// The fp32 temporaries of building the rotary cos/sin tables for `positions` positions of
    /// `dim` rotary dims: `*RotaryEmbedding.forward` (transformers 5.23
    /// models/llama/modeling_llama.py `LlamaRotaryEmbedding.forward`, copied by the other
    /// families: `freqs = position_ids[..., None].float() * inv_freq`, `emb = cat((freqs,
    /// freqs), -1)`, `cos = emb.cos() * attention_scaling`, the same for sin, then
    /// `.to(x.dtype)`). While `sin` is scaled, the half-width freqs, emb, the scaled cos, the raw
    /// sin and the scaled sin are alive: 4.5 fp32 tables on top of what was live before (and no
    /// more while the casts run). Traced: rnd-s29-phi-0 b1 × 484, 69,696 B above the rotary's
    /// entry; rdist109-014-phi reaches its forward peak there, the FSDP root's all-gather
    /// buffer still alive, and was -2.86% without it.
    fn rope_table_transient(&mut self, positions: u128, dim: u128) {
        let t32 = positions * dim * 4;
        self.t.transient(t32 / 2 + 4 * t32, Category::Activations);
    }

    /// The rotary tables stay fp32 whatever the model dtype (ERNIE 4.5, [`Attention::rope_fp32`]).
    ///
    /// [`Attention::rope_fp32`]: crate::model::Attention::rope_fp32
    fn rope_tables_fp32(&self) -> bool {
        self.any_layer(|l| l.attention.rope_fp32 || l.attention.rope_promotes)
    }

    /// Decoder layers replayed.
    fn n_layers(&self) -> usize {
        self.reduced
            .map_or(self.model.layers.len(), |r| r.layers.len())
    }

    /// Full-model index of the layer slot `slot` runs.
    fn orig_layer(&self, slot: usize) -> usize {
        self.reduced.map_or(slot, |r| r.layers[slot])
    }

    /// Whether layer slot `slot` runs under activation checkpointing (the policy covers its
    /// full-model layer).
    fn checkpoints_slot(&self, slot: usize) -> bool {
        let layer = self.orig_layer(slot);
        self.mode
            .train()
            .is_some_and(|w| w.checkpoints_layer(layer))
    }

    /// The layer slot `slot` runs.
    fn spec(&self, slot: usize) -> &'a crate::model::LayerSpec {
        let model: &'a ModelDesc = self.model;
        &model.layers[self.orig_layer(slot)]
    }

    /// How many full-model units sharding unit `unit` stands for (1 unless reduced).
    fn unit_weight(&self, unit: usize) -> u128 {
        match (unit, self.reduced) {
            (0, _) | (_, None) => 1,
            (u, Some(r)) => r.weight.get(u - 1).copied().unwrap_or(1),
        }
    }

    /// Liger's layer kernels replace the norms, the gated activation and the rotary embedding
    /// (`--kernels liger`; `crate::liger` refuses the families whose patch is not modelled).
    fn liger(&self) -> bool {
        self.mode.kernels().layers == crate::workload::KernelSet::Liger
    }

    /// A fused RMSNorm kernel replaces the eager norm (`--kernels liger` or `rmsnorm`).
    fn fused_norm(&self) -> bool {
        self.mode.kernels().layers != crate::workload::KernelSet::Torch
    }

    #[inline]
    fn act(&mut self, bytes: u128, requires_grad: bool) -> TensorId {
        self.t.alloc(bytes, Category::Activations, requires_grad)
    }

    fn rg(&self, x: TensorId) -> bool {
        self.t.requires_grad(x)
    }

    fn trainable(&self, p: &P) -> bool {
        self.t.requires_grad(p.id)
    }

    /// An elementwise op producing a new tensor: `saved` kept for backward, gradient flows to `inputs`.
    fn op(
        &mut self,
        out_bytes: u128,
        inputs: &[TensorId],
        saved: &[TensorId],
        params: &[TensorId],
        temps: &[u128],
    ) -> TensorId {
        // the inputs that need a gradient (the first six), in one pass
        let mut needing = [0; 6];
        let mut n = 0;
        let mut any_input = false;
        for &i in inputs {
            if self.rg(i) {
                any_input = true;
                if n < 6 {
                    needing[n] = i;
                    n += 1;
                }
            }
        }
        let rg = any_input || params.iter().any(|&p| self.t.requires_grad(p));
        let y = self.act(out_bytes, rg);
        if rg {
            let backward_temps: u128 = temps.iter().sum();
            if !self.t.recording && !self.t.tracking_tail() {
                // `record` would drop the node: it is not built at all
                return y;
            }
            self.t.record(Node {
                saved: Ids::of(saved),
                inputs: Ids::of(&needing[..n]),
                params: Ids::of(params),
                outputs: Ids::of(&[y]),
                backward_temps,
                ..Node::default()
            });
        }
        y
    }

    /// `a + b` of two tensors: nothing saved, and each operand's gradient is the sum's own
    /// gradient tensor where the dtypes and shapes agree (`AddBackward0`,
    /// tools/autograd/derivatives.yaml `add.Tensor`; [`Node::input_grads_alias_output`]).
    fn add(&mut self, a: TensorId, b: TensorId, out_bytes: u128) -> TensorId {
        let rg = self.rg(a) || self.rg(b);
        let y = self.act(out_bytes, rg);
        if rg {
            let mut inputs = Ids::default();
            for i in [a, b] {
                if self.rg(i) {
                    inputs.push(i);
                }
            }
            self.t.record(Node {
                inputs,
                outputs: Ids::of(&[y]),
                input_grads_alias_output: true,
                ..Node::default()
            });
        }
        y
    }

    /// `a * b` of two tensors: each operand is saved only if the other needs a gradient
    /// (`tools/autograd/derivatives.yaml`, `mul.Tensor`).
    fn mul(&mut self, a: TensorId, b: TensorId, out_bytes: u128) -> TensorId {
        let mut saved = Ids::default();
        if self.rg(b) {
            saved.push(a);
        }
        if self.rg(a) {
            saved.push(b);
        }
        self.op(out_bytes, &[a, b], saved.as_slice(), &[], &[])
    }

    /// An op that saves its own output for backward (softmax, log_softmax, tanh, relu:
    /// `result` in `tools/autograd/derivatives.yaml`); gradient flows to `x`.
    fn op_saving_output(&mut self, out_bytes: u128, x: TensorId) -> TensorId {
        let rg = self.rg(x);
        let y = self.act(out_bytes, rg);
        if rg {
            self.t.record(Node {
                saved: Ids::of(&[y]),
                inputs: Ids::of(&[x]),
                outputs: Ids::of(&[y]),
                ..Node::default()
            });
        }
        y
    }

    /// A cast (`.to(dtype)`): new tensor, nothing saved; gradient cast back.
    fn cast(&mut self, x: TensorId, out_bytes: u128) -> TensorId {
        self.op(out_bytes, &[x], &[], &[], &[])
    }

    /// Another reference to the same tensor (a view).
    fn retain_id(&mut self, x: TensorId) -> TensorId {
        self.t.retain(x);
        x
    }

    #[inline]
    fn drop_(&mut self, x: TensorId) {
        self.t.release(x);
    }

    /// Drops the tensors of the list `list` picks, in order, and empties it (its buffer stays
    /// for the next use).
    fn drop_list(&mut self, list: fn(&mut Self) -> &mut Vec<TensorId>) {
        let mut k = 0;
        while let Some(&t) = list(self).get(k) {
            self.drop_(t);
            k += 1;
        }
        list(self).clear();
    }

    /// `x` made a leaf that requires grad by a forward hook (`output.requires_grad_(True)`:
    /// transformers' `enable_input_require_grads` on a vision tower's `get_input_embeddings()`
    /// under gradient checkpointing): its AccumulateGrad node holds it, and its `.grad` is
    /// kept until the graph is freed after backward (`Node::leaf_keeps_grad`).
    fn input_grad_leaf(&mut self, x: TensorId) {
        self.t.set_requires_grad(x, true);
        self.t.record(Node {
            saved: Ids::of(&[x]),
            outputs: Ids::of(&[x]),
            leaf_keeps_grad: true,
            ..Node::default()
        });
    }
}

/// `a * b` as `*` computes it (a product past `u128::MAX` panics as `*` does under the
/// workspace's overflow checks), with the common case, two factors below 2⁶⁴, done as one
/// 64 × 64 → 128-bit multiplication, which cannot overflow and so needs no check (the
/// checked 128-bit product costs some thirty instructions; the replay computes many sizes).
#[inline]
pub(crate) fn mul(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(x), Ok(y)) => u128::from(x) * u128::from(y),
        _ => a * b,
    }
}

/// `a / b` as `/` computes it (a zero divisor panics as `/` does), in 64 bits when both fit
/// (the 128-bit division is a library call of some hundred instructions).
#[inline]
pub(crate) fn div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(x), Ok(y)) => u128::from(x / y),
        _ => a / b,
    }
}

/// `a.div_ceil(b)` as `u128::div_ceil` computes it, in 64 bits when both fit.
#[inline]
pub(crate) fn div_ceil(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(x), Ok(y)) => u128::from(x.div_ceil(y)),
        _ => a.div_ceil(b),
    }
}

/// The linear of `role` in a layer's table (none when the layer has no such projection).
fn find_linear(linears: &[(LinearRole, LinearP)], role: LinearRole) -> Option<&LinearP> {
    linears.iter().find(|(r, _)| *r == role).map(|(_, l)| l)
}

/// A stand-in for a linear the layer does not have (its role is absent from the table).
const LIN_ZERO: LinearP = LinearP {
    nf4: false,
    quantized: false,
    w: P {
        id: 0,
        numel: 0,
        rows: 0,
        cols: 1,
        unit: 0,
    },
    b: None,
    lora: None,
    in_f: 0,
    out_f: 0,
};
