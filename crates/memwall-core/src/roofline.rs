//! Roofline analysis: FLOPs and minimum HBM traffic per op class, arithmetic intensity against
//! the GPU's ridge point, and lower-bound times.
//!
//! Model (Williams, Waterman & Patterson, "Roofline: an insightful visual performance model",
//! CACM 2009): an op takes at least `max(flops / peak_flops, bytes / memory_bandwidth)`; it is
//! memory-bound when its intensity `flops / bytes` is below the ridge point
//! `peak_flops / memory_bandwidth`.
//!
//! FLOP counts: a GEMM `[m×k]·[k×n]` is `2mkn` (one multiply and one add per MAC). Bytes are the
//! minimum traffic: every operand read once and the result written once (perfect on-chip
//! reuse), which is what makes the estimate a lower bound. Training counts backward as twice the
//! forward GEMMs (grad of the input and of the weight; Kaplan et al. 2020, "Scaling laws",
//! C ≈ 6N per token) and attention per FlashAttention (Dao 2022): `4·b·h·s²·d` forward,
//! halved for causal masking, 2.5× that for backward.

use crate::error::CoreError;
use crate::model::{AttentionKind, LayerSpec, LinearRole, Mlp, ModelDesc, NormKind};
use crate::workload::{KernelSet, LossKernel};
use serde::Serialize;

/// Which part of the workload is analysed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RooflinePhase {
    /// One training step (forward + backward + optimizer update).
    Train,
    /// Prefill of `batch` prompts of `seq` tokens (logits for the last position only).
    Prefill,
    /// One decode step: `batch` sequences each adding one token to a context of `seq`.
    Decode,
}

/// Numeric format the math runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MathDtype {
    /// fp64.
    Fp64,
    /// fp32 (no tensor cores).
    Fp32,
    /// tf32 tensor cores.
    Tf32,
    /// bf16 tensor cores.
    Bf16,
    /// fp16 tensor cores.
    Fp16,
    /// fp8 tensor cores.
    Fp8,
    /// int8 tensor cores.
    Int8,
}

impl MathDtype {
    /// The lowercase name (as serialised).
    pub fn name(self) -> &'static str {
        match self {
            MathDtype::Fp64 => "fp64",
            MathDtype::Fp32 => "fp32",
            MathDtype::Tf32 => "tf32",
            MathDtype::Bf16 => "bf16",
            MathDtype::Fp16 => "fp16",
            MathDtype::Fp8 => "fp8",
            MathDtype::Int8 => "int8",
        }
    }

    /// Bytes per element of tensors in this format.
    pub fn bytes(self) -> f64 {
        match self {
            MathDtype::Fp64 => 8.0,
            MathDtype::Fp32 | MathDtype::Tf32 => 4.0,
            MathDtype::Bf16 | MathDtype::Fp16 => 2.0,
            MathDtype::Fp8 | MathDtype::Int8 => 1.0,
        }
    }
}

/// The compute and bandwidth ceilings of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ceilings {
    /// HBM/GDDR bandwidth in bytes/s.
    pub memory_bandwidth_bytes_per_s: f64,
    /// Dense peak FLOP/s by math format (no 2:4 sparsity).
    pub peak_flops_per_s: Vec<(MathDtype, f64)>,
    /// Interconnect bandwidth between GPUs (NVLink/xGMI), bytes/s, if any.
    pub interconnect_bytes_per_s: Option<f64>,
}

impl Ceilings {
    /// Peak FLOP/s for a format; elementwise math runs on the fp32 units.
    pub fn peak(&self, dtype: MathDtype) -> Option<f64> {
        self.peak_flops_per_s
            .iter()
            .find(|(d, _)| *d == dtype)
            .map(|(_, f)| *f)
    }

    /// Ridge point in FLOP/byte for a format.
    pub fn ridge(&self, dtype: MathDtype) -> Option<f64> {
        self.peak(dtype)
            .map(|p| p / self.memory_bandwidth_bytes_per_s)
    }
}

/// What limits an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bound {
    /// Intensity below the ridge point.
    Memory,
    /// Intensity at or above the ridge point.
    Compute,
    /// GPU-to-GPU traffic (tensor-parallel all-reduce).
    Network,
}

/// One op class, summed over all layers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpCost {
    /// Op class name (`attention.qkv_proj`, `mlp.down`, …).
    pub name: String,
    /// Whether it runs on tensor cores (GEMMs) or the fp32 vector units (elementwise).
    pub tensor_core: bool,
    /// FLOPs.
    pub flops: f64,
    /// Minimum bytes moved between HBM and the chip (or over the interconnect for `Network`).
    pub bytes: f64,
    /// flops / bytes.
    pub intensity: f64,
    /// What limits it.
    pub bound: Bound,
    /// Lower-bound time in seconds at the given efficiencies.
    pub time_s: f64,
}

/// Settings of a roofline analysis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RooflineWorkload {
    /// Phase.
    pub phase: RooflinePhase,
    /// Sequences.
    pub batch: u64,
    /// Sequence length (train, prefill) or context length (decode).
    pub seq: u64,
    /// Format of the GEMMs.
    pub dtype: MathDtype,
    /// Bytes per element of weights as stored (2 for bf16; less for quantised weights).
    pub weight_bytes: f64,
    /// Bytes per element of the KV cache.
    pub kv_bytes: f64,
    /// Tensor-parallel degree (weights and heads split over `tp` GPUs; two all-reduces per layer).
    pub tp: u64,
    /// Fraction of peak FLOP/s achieved by GEMMs (model FLOPs utilisation); 1 = the roofline.
    pub flops_efficiency: f64,
    /// Fraction of peak bandwidth achieved.
    pub bandwidth_efficiency: f64,
    /// Training: the loss kernel (how many passes over the `[tokens, vocab]` logits go through
    /// memory). Left out of JSON when it is transformers' own loss.
    #[serde(skip_serializing_if = "is_torch_loss")]
    pub loss: LossKernel,
    /// Training: the layer kernels (Liger's fused norm and gated-activation backward read and
    /// write less). Left out of JSON when they are transformers' eager modules.
    #[serde(skip_serializing_if = "is_torch_kernels")]
    pub kernels: KernelSet,
}

fn is_torch_kernels(k: &KernelSet) -> bool {
    *k == KernelSet::Torch
}

fn is_torch_loss(l: &LossKernel) -> bool {
    *l == LossKernel::Torch
}

impl RooflineWorkload {
    /// The checks of [`RooflineWorkload::validate`] that need no model: every count and
    /// fraction against the shared limits.
    pub fn validate_numbers(&self) -> Result<(), CoreError> {
        use crate::workload::limits::{count, fraction, MAX_BATCH, MAX_SEQ};
        count("batch", self.batch, MAX_BATCH)?;
        count("seq", self.seq, MAX_SEQ)?;
        count("tp", self.tp, crate::layout::MAX_GPUS)?;
        fraction("flops_efficiency", self.flops_efficiency)?;
        fraction("bandwidth_efficiency", self.bandwidth_efficiency)?;
        Ok(())
    }

    /// Checks every field against the shared limits ([`crate::workload::limits`]) and the
    /// model: tensor parallelism splits each layer's attention heads, so `tp` must divide them
    /// (Megatron-LM `megatron/core/transformer/attention.py` divides `num_attention_heads` by
    /// the tensor-parallel size; vLLM refuses the same).
    pub fn validate(&self, model: &ModelDesc) -> Result<(), CoreError> {
        self.validate_numbers()?;
        for layer in &model.layers {
            let heads = layer.attention.num_heads();
            if heads % self.tp != 0 {
                let fits: Vec<String> = (1..=heads.min(64))
                    .filter(|t| heads % t == 0)
                    .map(|t| t.to_string())
                    .collect();
                return Err(CoreError::invalid_value(
                    "tp",
                    self.tp,
                    format!(
                        "{heads} attention heads are not divisible by the tensor-parallel degree"
                    ),
                    format!("pick a `tp` that divides {heads}: {}", fits.join(", ")),
                ));
            }
        }
        Ok(())
    }
}

/// Result of a roofline analysis for one GPU (one tensor-parallel rank).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Roofline {
    /// Ridge point of the GEMM format, FLOP/byte.
    pub ridge_flops_per_byte: f64,
    /// Op classes.
    pub ops: Vec<OpCost>,
    /// Sum of FLOPs.
    pub total_flops: f64,
    /// Sum of bytes over HBM.
    pub total_bytes: f64,
    /// Sum of per-op lower-bound times.
    pub time_s: f64,
    /// Tokens processed per second per GPU group (`batch·seq` for train/prefill, `batch` for decode).
    pub tokens_per_s: f64,
}

/// The kernel class of one recorded op, with the shape the time model needs to pick an
/// efficiency (see `crate::time`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OpKind {
    /// A GEMM `[m×k]·[k×n]` on one rank (for `moe.experts`: one expert's GEMM, `m` = tokens
    /// routed to an expert on average); `role` is the decoder-layer linear it implements.
    Gemm {
        /// Rows (tokens).
        m: f64,
        /// Reduction dimension.
        k: f64,
        /// Output columns.
        n: f64,
        /// The linear's role, for LoRA targets (`None` for the LM head, router, experts).
        role: Option<LinearRole>,
    },
    /// The fused attention core (QKᵀ, softmax, PV) of one layer.
    Attention {
        /// Query heads on this rank.
        heads: f64,
        /// Query rows (tokens).
        q_rows: f64,
        /// Keys each query attends to (the sequence, or the sliding window).
        context: f64,
        /// Query/key head dimension.
        qk_dim: f64,
        /// Value head dimension.
        v_dim: f64,
        /// 0.5 when causal masking halves the work, 1 otherwise.
        causal: f64,
    },
    /// A memory-bound elementwise op, reduction or gather.
    Elementwise,
    /// The optimizer update (training only; no forward/backward split).
    Optimizer,
}

/// One op of one layer as the roofline counts it: forward FLOPs and minimum HBM bytes, and the
/// backward's multiple of each (GEMMs 2× — input and weight gradients; FlashAttention's
/// backward 2.5× the FLOPs and 2× the bytes; elementwise 2×). The sums over records are what
/// [`analyze`] reports per op class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpRecord {
    /// Op class name, as in [`OpCost::name`].
    pub name: &'static str,
    /// Decoder layer index; `None` for embeddings, final norm, head, loss and optimizer.
    pub layer: Option<usize>,
    /// Kernel class and shape.
    pub kind: OpKind,
    /// Forward FLOPs (the whole update for [`OpKind::Optimizer`]).
    pub flops: f64,
    /// Forward minimum HBM bytes (the whole update for [`OpKind::Optimizer`]).
    pub bytes: f64,
    /// Backward FLOPs as a multiple of `flops` (0 when the op has no backward).
    pub backward_flops_factor: f64,
    /// Backward bytes as a multiple of `bytes`.
    pub backward_bytes_factor: f64,
}

struct Acc {
    ops: Vec<OpCost>,
    records: Vec<OpRecord>,
    layer: Option<usize>,
    train: bool,
    /// Sum the ops by name (what [`analyze`] reports); [`op_records`] needs the records only.
    keep_ops: bool,
}

impl Acc {
    fn new(train: bool) -> Self {
        Acc {
            ops: Vec::new(),
            records: Vec::new(),
            layer: None,
            train,
            keep_ops: true,
        }
    }

    fn add(&mut self, name: &str, tensor_core: bool, flops: f64, bytes: f64) {
        if !self.keep_ops {
            return;
        }
        if let Some(o) = self.ops.iter_mut().find(|o| o.name == name) {
            o.flops += flops;
            o.bytes += bytes;
        } else {
            self.ops.push(OpCost {
                name: name.to_owned(),
                tensor_core,
                flops,
                bytes,
                intensity: 0.0,
                bound: Bound::Memory,
                time_s: 0.0,
            });
        }
    }

    /// Records one op's forward cost and adds its (training: forward + backward) total.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        name: &'static str,
        kind: OpKind,
        tensor_core: bool,
        flops: f64,
        bytes: f64,
        backward_flops_factor: f64,
        backward_bytes_factor: f64,
    ) {
        self.records.push(OpRecord {
            name,
            layer: self.layer,
            kind,
            flops,
            bytes,
            backward_flops_factor,
            backward_bytes_factor,
        });
        let (f, b) = if self.train {
            (
                (1.0 + backward_flops_factor) * flops,
                (1.0 + backward_bytes_factor) * bytes,
            )
        } else {
            (flops, bytes)
        };
        self.add(name, tensor_core, f, b);
    }

    /// A GEMM `[m×k]·[k×n]`: the weight `k×n` in `wb` bytes/element, activations in `ab`.
    /// Backward: dX = dY·Wᵀ and dW = Xᵀ·dY, each as costly as the forward (reads dY, X or W).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &mut self,
        name: &'static str,
        role: Option<LinearRole>,
        m: f64,
        k: f64,
        n: f64,
        ab: f64,
        wb: f64,
    ) {
        let flops = 2.0 * m * k * n;
        let bytes = m * k * ab + k * n * wb + m * n * ab;
        self.record(
            name,
            OpKind::Gemm { m, k, n, role },
            true,
            flops,
            bytes,
            2.0,
            2.0,
        );
    }

    /// An elementwise op over `n` elements: `flops_per` FLOPs each, reading `reads` tensors and
    /// writing one, `eb` bytes per element (backward ≈ twice the traffic and math).
    fn elementwise(&mut self, name: &'static str, n: f64, flops_per: f64, reads: f64, eb: f64) {
        self.elementwise_bw(name, n, flops_per, reads, eb, 2.0);
    }

    /// [`Acc::elementwise`] whose backward moves `backward_bytes` times the forward's bytes.
    fn elementwise_bw(
        &mut self,
        name: &'static str,
        n: f64,
        flops_per: f64,
        reads: f64,
        eb: f64,
        backward_bytes: f64,
    ) {
        let flops = n * flops_per;
        let bytes = n * eb * (reads + 1.0);
        self.record(
            name,
            OpKind::Elementwise,
            false,
            flops,
            bytes,
            2.0,
            backward_bytes,
        );
    }

    /// A norm over `n` elements. Liger's RMSNorm backward (Liger-Kernel 0.8.5
    /// `ops/rms_norm.py` `_rms_norm_backward_kernel`) reads `dY` and `X` and writes `dX` over
    /// `dY` in one pass: 3 passes, 1.5× the forward's read-and-write (the eager decomposition's
    /// backward is counted at 2×).
    fn norm(&mut self, n: f64, kind: NormKind, eb: f64, kernels: KernelSet) {
        let bw = match (kernels, kind) {
            (
                KernelSet::Liger | KernelSet::Rmsnorm,
                NormKind::RmsNorm | NormKind::GemmaRmsNorm | NormKind::Olmo2RmsNorm,
            ) => 1.5,
            _ => 2.0,
        };
        self.elementwise_bw("norm", n, norm_flops(kind), 1.0, eb, bw);
    }
}

/// FLOPs per element of a norm (square, sum, scale by rsqrt, weight; LayerNorm adds mean and bias).
fn norm_flops(kind: NormKind) -> f64 {
    match kind {
        NormKind::LayerNorm | NormKind::CohereLayerNorm => 7.0,
        _ => 4.0,
    }
}

fn check_shape(w: &RooflineWorkload) -> Result<(), CoreError> {
    if w.batch == 0 || w.seq == 0 {
        return Err(CoreError::invalid(
            "batch",
            "batch and sequence length must be at least 1",
        ));
    }
    if w.tp == 0 {
        return Err(CoreError::invalid(
            "tp",
            "tensor parallelism must be at least 1",
        ));
    }
    Ok(())
}

/// Every op of `model` under `w`, per layer, with its forward FLOPs and bytes, its backward
/// multiples and its shape: the counts [`analyze`] sums, for models that need them per op
/// (the step-time model, `crate::time`). Tensor-parallel communication is not an op here.
pub fn op_records(model: &ModelDesc, w: &RooflineWorkload) -> Result<Vec<OpRecord>, CoreError> {
    check_shape(w)?;
    // the records only: the sums by name (a search by name and an owned name per op) are
    // what `analyze` reports, and the step-time model runs this per candidate
    Ok(collect(model, w, false)?.records)
}

/// Enumerates the ops (shared by [`analyze`] and [`op_records`]).
fn collect(model: &ModelDesc, w: &RooflineWorkload, keep_ops: bool) -> Result<Acc, CoreError> {
    let train = w.phase == RooflinePhase::Train;
    let tp = w.tp as f64;
    let b = w.batch as f64;
    let s = w.seq as f64;
    // rows through the per-token ops
    let rows = match w.phase {
        RooflinePhase::Decode => b,
        _ => b * s,
    };
    let ab = w.dtype.bytes().max(2.0);
    let wb = w.weight_bytes;
    let h = model.hidden_size as f64;
    let mut acc = Acc::new(train);
    acc.keep_ops = keep_ops;

    // embeddings: a gather of `rows` rows (backward: a scatter-add of as many)
    acc.record(
        "embedding",
        OpKind::Elementwise,
        false,
        0.0,
        rows * h * ab,
        0.0,
        1.0,
    );

    for (i, layer) in model.layers.iter().enumerate() {
        acc.layer = Some(i);
        layer_ops(&mut acc, layer, w, rows, b, s, h, ab, wb, tp);
        if w.tp > 1 {
            // Megatron-style TP: one all-reduce after attention and one after the MLP (forward;
            // two more in backward). Ring all-reduce moves 2(tp-1)/tp of the buffer per GPU.
            let per = 2.0 * (tp - 1.0) / tp * rows * h * ab;
            let n = if train { 4.0 } else { 2.0 };
            acc.add("tensor_parallel.all_reduce", false, 0.0, n * per);
        }
    }
    acc.layer = None;
    // final norm + LM head: prefill keeps the last position only (`logits_to_keep=1`)
    if let Some(n) = model.head.final_norm {
        acc.norm(rows * h, n.kind, ab, w.kernels);
    }
    let v = model.embeddings.vocab_size as f64;
    let head_rows = match w.phase {
        RooflinePhase::Prefill => b,
        _ => rows,
    };
    acc.gemm(
        "lm_head",
        None,
        head_rows,
        model.embeddings.dim as f64,
        v / tp,
        ab,
        wb,
    );
    if train {
        let n = rows * v / tp;
        match w.loss {
            // loss: fp32 upcast, log-softmax, NLL, and their backward over [rows, vocab]
            LossKernel::Torch => {
                acc.elementwise("loss.softmax_cross_entropy", n, 5.0, 1.0, 4.0);
            }
            // flash-attn's fused cross-entropy: the forward reads the low-precision logits once
            // (a log-sum-exp per row), the backward reads them and writes the gradient in place:
            // no fp32 copy (flash_attn/ops/triton/cross_entropy.py)
            LossKernel::Fused => acc.record(
                "loss.fused_cross_entropy",
                OpKind::Elementwise,
                false,
                5.0 * n,
                n * ab,
                0.8,
                2.0,
            ),
            // Liger's fused linear cross-entropy: each chunk's logits are written by the head's
            // GEMM (counted in `lm_head`), read once by the kernel, which writes the gradient
            // over them for the two backward GEMMs, all inside the forward; the backward only
            // hands the gradients on (liger_kernel/ops/fused_linear_cross_entropy.py)
            LossKernel::FusedLinear => acc.record(
                "loss.fused_linear_cross_entropy",
                OpKind::Elementwise,
                false,
                9.0 * n,
                2.0 * n * ab,
                0.0,
                0.0,
            ),
        }
        // optimizer: AdamW reads param, grad, m, v and writes param, m, v (~12 FLOPs/param)
        let p = model.param_counts()?.total as f64 / tp;
        acc.record(
            "optimizer.adamw_update",
            OpKind::Optimizer,
            false,
            12.0 * p,
            p * (4.0 + 3.0) * wb,
            0.0,
            0.0,
        );
    }
    Ok(acc)
}

/// Analyses `model` under `w` against `ceilings`.
pub fn analyze(
    model: &ModelDesc,
    w: &RooflineWorkload,
    ceilings: &Ceilings,
) -> Result<Roofline, CoreError> {
    w.validate(model)?;
    let gemm_peak = ceilings.peak(w.dtype).ok_or_else(|| {
        CoreError::invalid_value(
            "dtype",
            w.dtype.name(),
            "this GPU publishes no peak for this format",
            "pick a format the GPU has tensor cores for (bf16 everywhere; fp8 from Hopper/Ada on); `memwall gpus` lists the peaks",
        )
    })?;
    let vector_peak = ceilings.peak(MathDtype::Fp32).unwrap_or(gemm_peak);
    let b = w.batch as f64;
    let s = w.seq as f64;
    let mut acc = collect(model, w, true)?;

    let ridge = gemm_peak / ceilings.memory_bandwidth_bytes_per_s;
    let bw = ceilings.memory_bandwidth_bytes_per_s * w.bandwidth_efficiency;
    let link = ceilings
        .interconnect_bytes_per_s
        .map(|l| l * w.bandwidth_efficiency);
    let mut total_flops = 0.0;
    let mut total_bytes = 0.0;
    let mut time = 0.0;
    for o in &mut acc.ops {
        o.intensity = if o.bytes > 0.0 {
            o.flops / o.bytes
        } else {
            f64::INFINITY
        };
        if o.name.starts_with("tensor_parallel") {
            o.bound = Bound::Network;
            o.intensity = 0.0;
            o.time_s = match link {
                Some(l) => o.bytes / l,
                None => o.bytes / bw,
            };
        } else {
            let peak = if o.tensor_core {
                gemm_peak
            } else {
                vector_peak
            } * w.flops_efficiency;
            let op_ridge = if o.tensor_core {
                ridge
            } else {
                vector_peak / ceilings.memory_bandwidth_bytes_per_s
            };
            o.bound = if o.intensity >= op_ridge {
                Bound::Compute
            } else {
                Bound::Memory
            };
            o.time_s = (o.flops / peak).max(o.bytes / bw);
            total_flops += o.flops;
            total_bytes += o.bytes;
        }
        time += o.time_s;
    }
    let tokens = match w.phase {
        RooflinePhase::Decode => b,
        _ => b * s,
    };
    Ok(Roofline {
        ridge_flops_per_byte: ridge,
        ops: acc.ops,
        total_flops,
        total_bytes,
        time_s: time,
        tokens_per_s: if time > 0.0 { tokens / time } else { 0.0 },
    })
}

/// The smallest decode batch at which the weight GEMMs (projections, MLP) become
/// compute-bound: below it, decode is limited by streaming the weights and KV cache.
/// Found by bisection on [`analyze`] (intensity grows with batch); `None` if even
/// `max_batch` stays memory-bound.
pub fn decode_compute_bound_batch(
    model: &ModelDesc,
    w: &RooflineWorkload,
    ceilings: &Ceilings,
    max_batch: u64,
) -> Result<Option<u64>, CoreError> {
    let bound_at = |batch: u64| -> Result<bool, CoreError> {
        let mut probe = w.clone();
        probe.phase = RooflinePhase::Decode;
        probe.batch = batch;
        let r = analyze(model, &probe, ceilings)?;
        Ok(r.ops
            .iter()
            .filter(|o| o.name.starts_with("mlp.up_gate"))
            .all(|o| o.bound == Bound::Compute))
    };
    if !bound_at(max_batch)? {
        return Ok(None);
    }
    let (mut lo, mut hi) = (1u64, max_batch);
    if bound_at(lo)? {
        return Ok(Some(1));
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if bound_at(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Some(hi))
}

/// A chunked-scan mixer's projections (column-parallel inputs, row-parallel `out_proj` over
/// TP, as vLLM splits them) and its depthwise convolution, under the mixer's op names
/// (`[in_proj, out_proj, conv1d]`); `(ab, wb, tp)`: activation and weight bytes, TP degree.
fn projections_and_conv(
    acc: &mut Acc,
    linears: &[crate::model::LinearShape],
    names: [&'static str; 3],
    conv_dim: f64,
    conv_kernel: f64,
    rows: f64,
    (ab, wb, tp): (f64, f64, f64),
) {
    for l in linears {
        let (k, n) = match l.role {
            LinearRole::SsmOut => (l.in_features as f64 / tp, l.out_features as f64),
            _ => (l.in_features as f64, l.out_features as f64 / tp),
        };
        let name = if l.role == LinearRole::SsmOut {
            names[1]
        } else {
            names[0]
        };
        acc.gemm(name, Some(l.role), rows, k, n, ab, wb);
    }
    acc.elementwise(
        names[2],
        rows * conv_dim / tp,
        2.0 * conv_kernel + 4.0,
        1.0,
        ab,
    );
}

/// A Mamba-2 mixer: `in_proj` and `out_proj` GEMMs (column- and row-split under TP, as vLLM's
/// `MambaMixer2` does), the depthwise convolution, and the SSD chunked scan as one fused op.
/// Scan FLOPs per token and head, after Dao & Gu 2024 (Mamba-2, §6 "SSD algorithm"): the
/// intra-chunk scores `C·Bᵀ` and their product with `x` (`2·L·N + 2·L·P` for chunk length
/// `L`), the chunk states `B·x` and the state output `C·h` (`2·N·P` each). Bytes: `x`, `B`, `C`,
/// `dt` in and `y` out (the kernel keeps the chunk states on chip). An estimate: no truth row
/// times it.
#[allow(clippy::too_many_arguments)]
/// A gated DeltaNet mixer (Qwen3-Next): the three projections as GEMMs (column-parallel
/// inputs, row-parallel `out_proj`), the depthwise convolution, the chunked delta rule
/// (per chunk of `L` tokens and value head: `QKᵀ`, `KKᵀ`, the triangular solves and the state
/// read/update, ≈ `4·L·dk + 2·L·dv + 6·dk·dv` FLOPs per token and head) and the gated norm.
fn deltanet_ops(
    acc: &mut Acc,
    m: &crate::mixer::GatedDeltaNet,
    rows: f64,
    h: f64,
    ab: f64,
    wb: f64,
    tp: f64,
) {
    projections_and_conv(
        acc,
        &m.linears(h as u64),
        [
            "linear_attn.in_proj",
            "linear_attn.out_proj",
            "linear_attn.conv1d",
        ],
        m.conv_dim() as f64,
        m.conv_kernel as f64,
        rows,
        (ab, wb, tp),
    );
    let cd = m.conv_dim() as f64 / tp;
    let heads = m.num_v_heads as f64 / tp;
    let (l, dk, dv) = (
        m.chunk_size as f64,
        m.k_head_dim as f64,
        m.v_head_dim as f64,
    );
    let flops = rows * heads * (4.0 * l * dk + 2.0 * l * dv + 6.0 * dk * dv);
    let bytes = rows * (cd + m.value_dim() as f64 / tp) * ab;
    acc.record(
        "linear_attn.delta_rule",
        OpKind::Elementwise,
        true,
        flops,
        bytes,
        2.0,
        2.0,
    );
    acc.elementwise(
        "linear_attn.gated_norm",
        rows * m.value_dim() as f64 / tp,
        8.0,
        2.0,
        ab,
    );
}

fn mamba2_ops(
    acc: &mut Acc,
    m: &crate::mixer::Mamba2,
    rows: f64,
    h: f64,
    ab: f64,
    wb: f64,
    tp: f64,
) {
    projections_and_conv(
        acc,
        &m.linears(h as u64),
        ["ssm.in_proj", "ssm.out_proj", "ssm.conv1d"],
        m.conv_dim() as f64,
        m.conv_kernel as f64,
        rows,
        (ab, wb, tp),
    );
    let cd = m.conv_dim() as f64 / tp;
    let heads = m.num_heads as f64 / tp;
    let (l, n, p) = (m.chunk_size as f64, m.state_size as f64, m.head_dim as f64);
    let flops = rows * heads * (2.0 * l * n + 2.0 * l * p + 4.0 * n * p);
    let bytes = rows * (cd + m.intermediate as f64 / tp) * ab;
    acc.record(
        "ssm.scan",
        OpKind::Elementwise,
        true,
        flops,
        bytes,
        2.0,
        2.0,
    );
    acc.elementwise(
        "ssm.gated_norm",
        rows * m.intermediate as f64 / tp,
        8.0,
        2.0,
        ab,
    );
}

/// A Mamba-1 mixer: `in_proj`, `x_proj`, `dt_proj` and `out_proj` GEMMs (vLLM's `MambaMixer`
/// splits `in_proj`/`dt_proj` column-wise and `x_proj`/`out_proj` row-wise over TP), the
/// depthwise convolution, and the selective scan as one fused op. Scan FLOPs per token and
/// channel (Gu & Dao 2023, Mamba, Algorithm 2 and §3.3.2 "selective scan"): per state element
/// `exp(Δ·A)`, `Δ·B·x`, the state update `h·Ā + B̄x` and the output `C·h` (≈ 9 FLOPs), plus
/// the skip `D·x` and the `silu(z)` gate. Bytes: `x`, `Δ`, `z`, `B`, `C` in and `y` out (the
/// kernel keeps the state on chip). An estimate: no truth row times it.
#[allow(clippy::too_many_arguments)]
fn mamba1_ops(
    acc: &mut Acc,
    m: &crate::mixer::Mamba1,
    rows: f64,
    h: f64,
    ab: f64,
    wb: f64,
    tp: f64,
) {
    let i = m.intermediate as f64 / tp;
    let (r, n) = (m.time_step_rank as f64, m.state_size as f64);
    acc.gemm(
        "ssm.in_proj",
        Some(LinearRole::SsmIn),
        rows,
        h,
        2.0 * i,
        ab,
        wb,
    );
    acc.elementwise(
        "ssm.conv1d",
        rows * i,
        2.0 * m.conv_kernel as f64 + 4.0,
        1.0,
        ab,
    );
    acc.gemm("ssm.x_proj", None, rows, i, r + 2.0 * n, ab, wb);
    acc.gemm("ssm.dt_proj", None, rows, r, i, ab, wb);
    let flops = rows * i * (9.0 * n + 6.0);
    let bytes = rows * (4.0 * i + 2.0 * n) * ab;
    acc.record(
        "ssm.scan",
        OpKind::Elementwise,
        true,
        flops,
        bytes,
        2.0,
        2.0,
    );
    acc.gemm("ssm.out_proj", Some(LinearRole::SsmOut), rows, i, h, ab, wb);
}

#[allow(clippy::too_many_arguments)]
fn layer_ops(
    acc: &mut Acc,
    layer: &LayerSpec,
    w: &RooflineWorkload,
    rows: f64,
    b: f64,
    s: f64,
    h: f64,
    ab: f64,
    wb: f64,
    tp: f64,
) {
    for n in [
        layer.attn_norm,
        layer.attn_post_norm,
        layer.mlp_norm,
        layer.mlp_post_norm,
    ]
    .into_iter()
    .flatten()
    {
        acc.norm(rows * h, n.kind, ab, w.kernels);
    }
    // a state-space mixer replaces the attention block; the layer's feed-forward block (Jamba,
    // Granite 4.0-H) still runs below
    let mut ssm = false;
    if let Some(m) = layer.mamba2() {
        mamba2_ops(acc, m, rows, h, ab, wb, tp);
        // a Falcon-H1 layer runs its attention block beside the mixer
        ssm = !layer.parallel_mixers();
    }
    if let Some(m) = layer.mamba1() {
        mamba1_ops(acc, m, rows, h, ab, wb, tp);
        ssm = true;
    }
    if let Some(g) = layer.gated_delta_net() {
        // the layer's `attention` has no heads: its records below are empty
        deltanet_ops(acc, g, rows, h, ab, wb, tp);
    }
    if !ssm {
        let a = &layer.attention;
        for l in a.linears(h as u64) {
            let name = match l.role {
                LinearRole::O => "attention.out_proj",
                _ => "attention.qkv_proj",
            };
            // TP splits q/k/v column-wise and the output projection row-wise
            let (k, n) = match l.role {
                LinearRole::O => (l.in_features as f64 / tp, l.out_features as f64),
                _ => (l.in_features as f64, l.out_features as f64 / tp),
            };
            acc.gemm(name, Some(l.role), rows, k, n, ab, wb);
        }
        let (heads, kv_heads, qk_dim, v_dim) = match a.kind {
            AttentionKind::Standard {
                num_heads,
                num_kv_heads,
                head_dim,
            } => (
                num_heads as f64,
                num_kv_heads as f64,
                head_dim as f64,
                head_dim as f64,
            ),
            AttentionKind::Mla {
                num_heads,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
                ..
            } => {
                // training/prefill materialise per-head k and v; decode reads the latent cache
                let _ = kv_lora_rank;
                (
                    num_heads as f64,
                    num_heads as f64,
                    (qk_nope_head_dim + qk_rope_head_dim) as f64,
                    v_head_dim as f64,
                )
            }
        };
        let heads = heads / tp;
        let kv_heads = (kv_heads / tp).max(1.0);
        // attention core (fused flash kernel): QKᵀ and PV
        let (ctx, causal) = match w.phase {
            RooflinePhase::Decode => (s, 1.0),
            _ => {
                let window = a.sliding_window.map_or(s, |win| (win as f64).min(s));
                (window, if window < s { 1.0 } else { 0.5 })
            }
        };
        let q_rows = rows;
        let fwd_flops = 2.0 * q_rows * heads * ctx * (qk_dim + v_dim) * causal;
        let kv_read = match w.phase {
            // decode streams the whole KV cache of every sequence
            RooflinePhase::Decode => b * s * kv_heads * (qk_dim + v_dim) * w.kv_bytes,
            _ => rows * kv_heads * (qk_dim + v_dim) * ab,
        };
        let fwd_bytes = q_rows * heads * (qk_dim + v_dim) * ab + kv_read;
        // backward: FlashAttention-2 recomputes the scores and runs four GEMMs (2.5× the forward
        // FLOPs; Dao 2023, benchmark_flash_attention.py), reading q, k, v, o, dO and writing dq, dk, dv
        acc.record(
            "attention.core",
            OpKind::Attention {
                heads,
                q_rows,
                context: ctx,
                qk_dim,
                v_dim,
                causal,
            },
            true,
            fwd_flops,
            fwd_bytes,
            2.5,
            2.0,
        );
    }
    let _ = b;
    match &layer.mlp {
        Mlp::None => {}
        Mlp::Dense(d) => {
            for l in d.linears(h as u64) {
                let name = if l.role == LinearRole::Down {
                    "mlp.down"
                } else {
                    "mlp.up_gate"
                };
                let (k, n) = if l.role == LinearRole::Down {
                    (l.in_features as f64 / tp, l.out_features as f64)
                } else {
                    (l.in_features as f64, l.out_features as f64 / tp)
                };
                acc.gemm(name, Some(l.role), rows, k, n, ab, wb);
            }
            let i = d.intermediate as f64 / tp;
            // Liger's SwiGLU/GeGLU backward (ops/swiglu.py, ops/geglu.py) reads dc, a and b and
            // writes da and db over a and b: 5 passes, 5/3 of the forward's three
            let bw = if d.gated && w.kernels == KernelSet::Liger {
                5.0 / 3.0
            } else {
                2.0
            };
            acc.elementwise_bw(
                "mlp.activation",
                rows * i,
                if d.gated { 5.0 } else { 4.0 },
                if d.gated { 2.0 } else { 1.0 },
                ab,
                bw,
            );
        }
        Mlp::Moe(m) => {
            let e = m.num_experts as f64;
            let k = m.top_k as f64;
            acc.gemm("moe.router", None, rows, h, e, ab, wb);
            // each token runs through top_k experts; weights of the experts actually hit are read
            let hit = e.min(rows * k);
            let i = m.expert.intermediate as f64 / tp;
            let ins = if m.expert.gated { 2.0 } else { 1.0 };
            let r = rows * k;
            let flops = 2.0 * r * h * i * (ins + 1.0);
            let bytes = hit * h * i * (ins + 1.0) * wb + r * (h + ins * i + i + h) * ab;
            // one expert's GEMM sees the tokens routed to it: r / e on average
            acc.record(
                "moe.experts",
                OpKind::Gemm {
                    m: r / e,
                    k: h,
                    n: i,
                    role: None,
                },
                true,
                flops,
                bytes,
                2.0,
                2.0,
            );
            acc.elementwise("mlp.activation", r * i, 5.0, 2.0, ab);
            if let Some(sh) = &m.shared {
                for l in sh.linears(h as u64) {
                    acc.gemm(
                        "mlp.up_gate",
                        Some(l.role),
                        rows,
                        l.in_features as f64,
                        l.out_features as f64 / tp,
                        ab,
                        wb,
                    );
                }
            }
        }
    }
    // two residual adds per layer (one in a block without a feed-forward block: `MambaBlock`)
    let adds = if matches!(layer.mlp, Mlp::None) {
        1.0
    } else {
        2.0
    };
    acc.elementwise("residual_add", adds * rows * h, 1.0, 2.0, ab);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::llama2_7b;

    fn a100() -> Ceilings {
        // NVIDIA A100 datasheet: 312 TFLOP/s dense bf16, 19.5 TFLOP/s fp32, 2.0 TB/s (80GB SXM: 2,039 GB/s)
        Ceilings {
            memory_bandwidth_bytes_per_s: 2.0e12,
            peak_flops_per_s: vec![(MathDtype::Bf16, 312e12), (MathDtype::Fp32, 19.5e12)],
            interconnect_bytes_per_s: Some(600e9),
        }
    }

    fn h100() -> Ceilings {
        // NVIDIA H100 SXM5 datasheet: 3.35 TB/s HBM3, 989.5 TFLOP/s dense bf16, 67 TFLOP/s fp32
        Ceilings {
            memory_bandwidth_bytes_per_s: 3.35e12,
            peak_flops_per_s: vec![(MathDtype::Bf16, 989.5e12), (MathDtype::Fp32, 67e12)],
            interconnect_bytes_per_s: Some(900e9),
        }
    }

    fn w(phase: RooflinePhase, batch: u64, seq: u64) -> RooflineWorkload {
        RooflineWorkload {
            phase,
            batch,
            seq,
            dtype: MathDtype::Bf16,
            weight_bytes: 2.0,
            kv_bytes: 2.0,
            tp: 1,
            flops_efficiency: 1.0,
            bandwidth_efficiency: 1.0,
            loss: LossKernel::Torch,
            kernels: KernelSet::Torch,
        }
    }

    #[test]
    fn every_input_is_bounded_and_names_its_field() {
        let m = llama2_7b();
        let field = |f: fn(&mut RooflineWorkload)| {
            let mut x = w(RooflinePhase::Train, 1, 128);
            f(&mut x);
            analyze(&m, &x, &a100()).unwrap_err().field()
        };
        assert_eq!(field(|x| x.batch = 0), Some("batch"));
        assert_eq!(field(|x| x.batch = u64::MAX), Some("batch"));
        assert_eq!(field(|x| x.seq = 1 << 40), Some("seq"));
        assert_eq!(field(|x| x.tp = 7), Some("tp"));
        assert_eq!(field(|x| x.tp = 0), Some("tp"));
        assert_eq!(
            field(|x| x.flops_efficiency = 1e-300),
            Some("flops_efficiency")
        );
        assert_eq!(
            field(|x| x.flops_efficiency = f64::NAN),
            Some("flops_efficiency")
        );
        assert_eq!(
            field(|x| x.bandwidth_efficiency = 2.0),
            Some("bandwidth_efficiency")
        );
        assert_eq!(field(|x| x.dtype = MathDtype::Fp8), Some("dtype"));
        // the smallest accepted efficiency keeps the time finite
        let mut x = w(RooflinePhase::Train, 1, 128);
        x.flops_efficiency = crate::workload::limits::MIN_FRACTION;
        x.bandwidth_efficiency = crate::workload::limits::MIN_FRACTION;
        let r = analyze(&m, &x, &a100()).unwrap();
        assert!(r.time_s.is_finite() && r.tokens_per_s > 0.0);
    }

    #[test]
    fn a100_ridge_is_156() {
        assert!((a100().ridge(MathDtype::Bf16).unwrap() - 156.0).abs() < 1e-9);
    }

    #[test]
    fn seed_classification_table() {
        // ReLU/add ~1 FLOP/byte or less, LayerNorm/softmax a few, a 4096³ GEMM ~1000s: on A100
        // (ridge 156) the first two are memory-bound, the GEMM compute-bound.
        let mut acc = Acc::new(false);
        let n = 4096.0 * 4096.0;
        acc.elementwise("relu", n, 1.0, 1.0, 2.0);
        acc.elementwise("layernorm", n, 7.0, 1.0, 2.0);
        acc.gemm("gemm", None, 4096.0, 4096.0, 4096.0, 2.0, 2.0);
        let i = |name: &str| {
            let o = acc.ops.iter().find(|o| o.name == name).unwrap();
            o.flops / o.bytes
        };
        assert!(i("relu") <= 1.0);
        assert!(i("layernorm") > 1.0 && i("layernorm") < 10.0);
        assert!(i("gemm") > 1000.0 && i("gemm") < 3000.0, "{}", i("gemm"));
        let ridge = a100().ridge(MathDtype::Bf16).unwrap();
        assert!(i("relu") < ridge && i("layernorm") < ridge && i("gemm") > ridge);
    }

    #[test]
    fn fused_losses_move_fewer_bytes_than_the_fp32_loss() {
        let m = llama2_7b();
        let time = |loss| {
            let mut w = w(RooflinePhase::Train, 4, 2048);
            w.loss = loss;
            analyze(&m, &w, &h100()).unwrap().time_s
        };
        let (torch, fused, linear) = (
            time(LossKernel::Torch),
            time(LossKernel::Fused),
            time(LossKernel::FusedLinear),
        );
        assert!(linear < fused && fused < torch, "{linear} {fused} {torch}");
    }

    #[test]
    fn liger_layer_kernels_move_fewer_bytes_than_the_eager_modules() {
        let m = llama2_7b();
        let time = |kernels| {
            let mut w = w(RooflinePhase::Train, 4, 2048);
            w.kernels = kernels;
            analyze(&m, &w, &h100()).unwrap().time_s
        };
        assert!(time(KernelSet::Liger) < time(KernelSet::Torch));
        // inference does not run the training kernels' backward: no change
        let infer = |kernels| {
            let mut w = w(RooflinePhase::Prefill, 4, 2048);
            w.kernels = kernels;
            analyze(&m, &w, &h100()).unwrap().time_s
        };
        assert_eq!(infer(KernelSet::Liger), infer(KernelSet::Torch));
    }

    #[test]
    fn llama2_7b_decode_batch1_on_h100_is_bandwidth_bound_near_250_tokens_per_s() {
        // anchor: 3.35 TB/s ÷ 13.5 GB of bf16 weights ≈ 248 tokens/s upper bound per sequence
        let r = analyze(&llama2_7b(), &w(RooflinePhase::Decode, 1, 512), &h100()).unwrap();
        let gemm_time: f64 = r
            .ops
            .iter()
            .filter(|o| o.tensor_core)
            .map(|o| o.time_s)
            .sum();
        assert!(r
            .ops
            .iter()
            .filter(|o| o.tensor_core)
            .all(|o| o.bound == Bound::Memory));
        assert!(
            r.tokens_per_s > 200.0 && r.tokens_per_s < 260.0,
            "{}",
            r.tokens_per_s
        );
        assert!(gemm_time > 0.0);
    }

    #[test]
    fn large_training_gemms_are_compute_bound() {
        let r = analyze(&llama2_7b(), &w(RooflinePhase::Train, 8, 4096), &h100()).unwrap();
        let mlp = r.ops.iter().find(|o| o.name == "mlp.up_gate").unwrap();
        assert_eq!(mlp.bound, Bound::Compute);
        // 6·N·tokens is the textbook training FLOP count; ours adds attention, so it is above it
        let six_n = 6.0 * 6.74e9 * 8.0 * 4096.0;
        assert!(
            r.total_flops > six_n && r.total_flops < 1.5 * six_n,
            "{} vs {}",
            r.total_flops,
            six_n
        );
    }

    #[test]
    fn decode_crossover_is_near_the_ridge_over_bytes_per_weight() {
        // weights dominate decode traffic: intensity ≈ 2·batch / 2 bytes = batch FLOP/byte, so
        // the GEMMs turn compute-bound near batch ≈ ridge (295 on H100 SXM bf16)
        let b = decode_compute_bound_batch(
            &llama2_7b(),
            &w(RooflinePhase::Decode, 1, 128),
            &h100(),
            1 << 16,
        )
        .unwrap()
        .unwrap();
        assert!((250..=400).contains(&b), "{b}");
    }

    #[test]
    fn decode_turns_compute_bound_with_batch() {
        let small = analyze(&llama2_7b(), &w(RooflinePhase::Decode, 1, 128), &h100()).unwrap();
        let big = analyze(&llama2_7b(), &w(RooflinePhase::Decode, 1024, 128), &h100()).unwrap();
        let up = |r: &Roofline| {
            r.ops
                .iter()
                .find(|o| o.name == "mlp.up_gate")
                .unwrap()
                .bound
        };
        assert_eq!(up(&small), Bound::Memory);
        assert_eq!(up(&big), Bound::Compute);
    }
}
