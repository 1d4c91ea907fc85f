//! Compute time of one micro-batch on one rank, layer by layer, from the roofline's op counts
//! ([`crate::roofline::op_records`]) at shape-dependent efficiencies.
//!
//! Per rank: the roofline is taken at the tensor-parallel degree (heads, MLP width and vocabulary
//! split `tp` ways, Megatron's column/row-parallel layout); context parallelism splits every
//! token-proportional op `cp` ways (load-balanced causal chunks, Megatron/Transformer Engine and
//! torchtitan both zig-zag the sequence); sequence parallelism splits the ops outside the
//! tensor-parallel region (norms, residual adds, embedding) `tp` ways (Korthikanti et al. 2022
//! §4.2.2). Each op takes `max(flops / (peak · efficiency), bytes / (bandwidth · fraction))`.

use super::efficiency::{AttentionKernel, Efficiencies, Execution};
use super::hardware::Hardware;
use crate::error::CoreError;
use crate::layout::Layout;
use crate::model::{AttentionKind, LinearRole, ModelDesc, NormKind};
use crate::roofline::{op_records, MathDtype, OpKind, OpRecord, RooflinePhase, RooflineWorkload};
use crate::workload::{Precision, TrainWorkload};

/// Forward or backward seconds of one layer (or of the non-layer ops), by op class.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ClassSeconds {
    pub gemm: f64,
    pub attention: f64,
    pub elementwise: f64,
}

impl ClassSeconds {
    pub fn total(&self) -> f64 {
        self.gemm + self.attention + self.elementwise
    }

    fn add(&mut self, o: ClassSeconds) {
        self.gemm += o.gemm;
        self.attention += o.attention;
        self.elementwise += o.elementwise;
    }
}

/// One layer's (or the embedding's, or the head's) cost for one micro-batch on one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct LayerCost {
    pub fwd: ClassSeconds,
    pub bwd: ClassSeconds,
    /// Forward attention-core seconds (what a context-parallel ring overlaps with).
    pub attention_fwd_s: f64,
    /// Model FLOPs of forward + backward (PaLM convention: attention counted unmasked).
    pub model_flops: f64,
    /// Forward model FLOPs by class, for hardware FLOPs of recomputation.
    pub fwd_gemm_flops: f64,
    pub fwd_attention_flops: f64,
}

impl LayerCost {
    pub fn step_s(&self) -> f64 {
        self.fwd.total() + self.bwd.total()
    }

    fn add(&mut self, o: &LayerCost) {
        self.fwd.add(o.fwd);
        self.bwd.add(o.bwd);
        self.attention_fwd_s += o.attention_fwd_s;
        self.model_flops += o.model_flops;
        self.fwd_gemm_flops += o.fwd_gemm_flops;
        self.fwd_attention_flops += o.fwd_attention_flops;
    }
}

/// The compute of one micro-batch on one rank: every decoder layer, the ops before the first
/// (embedding) and after the last (final norm, LM head, loss).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MicroBatchCompute {
    pub layers: Vec<LayerCost>,
    pub pre: LayerCost,
    pub post: LayerCost,
}

/// The math format of a precision's GEMMs (PyTorch's default `float32_matmul_precision` is
/// "highest": fp32 runs on the fp32 units, not TF32).
pub(crate) fn math_dtype(p: Precision) -> MathDtype {
    match p {
        Precision::Bf16 | Precision::AmpBf16 => MathDtype::Bf16,
        Precision::Fp16 | Precision::AmpFp16 => MathDtype::Fp16,
        Precision::Fp32 => MathDtype::Fp32,
    }
}

/// Eager PyTorch runs one kernel per op; the roofline counts the fused minimum (each operand
/// read once, the result written once). Traffic of eager relative to fused, per op class,
/// counted from the code that runs:
/// - RMSNorm (transformers `LlamaRMSNorm.forward`: `.to(float32)`, `pow(2)`, `mean`,
///   `* rsqrt`, `.to(dtype)`, `weight *`): 36 bytes per element against 4 → 9×; LayerNorm is
///   one native kernel → 1×;
/// - gated activation (`act_fn(gate) * up`): 10 bytes against 6 → 5/3;
/// - loss (transformers `ForCausalLMLoss`: `logits.float()`, `log_softmax`, `nll_loss`): 18
///   bytes against 8 → 2.25;
/// - RoPE (`q * cos + rotate_half(q) * sin`, `rotate_half` a `cat` of two halves): 14 bytes
///   against 4 → 3.5;
/// - residual add, embedding gather: 1×.
fn eager_factor(name: &str, layer_norm: bool, gated: bool) -> f64 {
    match name {
        "norm" if layer_norm => 1.0,
        "norm" => 9.0,
        "mlp.activation" if gated => 10.0 / 6.0,
        "loss.softmax_cross_entropy" => 2.25,
        "attention.rope" => 3.5,
        _ => 1.0,
    }
}

/// Bytes per attention-score element of an unfused attention, forward + backward. Fused
/// softmax (Megatron `FusedScaleMaskSoftmax`): QKᵀ writes 2, softmax reads 2 and writes 2, PV
/// reads 2 = 8 forward, twice that backward. transformers `eager_attention_forward`: matmul
/// write 2, `* scaling` 4, `+ causal_mask` 6, `softmax(dtype=float32)` 6, `.to(dtype)` 6,
/// matmul read 2 = 26 forward, twice that backward. Attention dropout adds 5 (read, write,
/// 1-byte mask) each way.
fn score_bytes_per_element(fused: bool, dropout: bool) -> f64 {
    let fwd = if fused { 8.0 } else { 26.0 };
    let drop = if dropout { 5.0 } else { 0.0 };
    3.0 * (fwd + drop)
}

/// Whether LoRA targets a linear of this role (peft matches module names; the model maps roles
/// to its names — the same rule as the memory model's).
fn lora_targets(model: &ModelDesc, w: &TrainWorkload, role: LinearRole) -> bool {
    w.lora.as_ref().is_some_and(|l| {
        model
            .linear_names
            .iter()
            .any(|(r, name)| *r == role && l.targets.iter().any(|t| t == name))
    })
}

/// What of the model's shape picks eager traffic factors.
#[derive(Debug, Clone, Copy)]
struct ModelShape {
    /// Norms are LayerNorm (one native kernel) rather than an RMSNorm written in PyTorch ops.
    layer_norm: bool,
    /// The MLP is gated.
    gated: bool,
}

pub(crate) struct ComputeContext<'a> {
    pub model: &'a ModelDesc,
    pub workload: &'a TrainWorkload,
    pub layout: &'a Layout,
    pub hw: &'a Hardware,
    pub eff: &'a Efficiencies,
    pub exec: &'a Execution,
}

impl ComputeContext<'_> {
    fn peak(&self, dtype: MathDtype) -> Result<f64, CoreError> {
        self.hw.ceilings.peak(dtype).ok_or_else(|| {
            CoreError::invalid(
                "precision",
                format!("this GPU publishes no {dtype:?} peak; pick another precision"),
            )
        })
    }

    /// One GEMM's seconds at its shape.
    fn gemm_s(
        &self,
        dtype: MathDtype,
        m: f64,
        k: f64,
        n: f64,
        flops: f64,
        bytes: f64,
    ) -> Result<f64, CoreError> {
        let peak = self.peak(dtype)?;
        let eff = match dtype {
            // no tensor cores: no tile quantization, just the achievable fraction
            MathDtype::Fp32 | MathDtype::Fp64 => self.eff.matmul * self.eff.matmul_typical_shape,
            _ => self.eff.gemm(m, k, n),
        };
        Ok((flops / (peak * eff)).max(self.mem_s(bytes)))
    }

    fn mem_s(&self, bytes: f64) -> f64 {
        bytes / (self.hw.ceilings.memory_bandwidth_bytes_per_s * self.eff.memory_bandwidth)
    }

    /// The compute of one micro-batch on one rank.
    pub fn micro_batch(&self) -> Result<MicroBatchCompute, CoreError> {
        let w = self.workload;
        let l = self.layout;
        let dtype = math_dtype(w.precision);
        let act_bytes = dtype.bytes().max(2.0);
        let rw = RooflineWorkload {
            phase: RooflinePhase::Train,
            batch: w.batch,
            seq: w.seq,
            dtype,
            weight_bytes: dtype.bytes(),
            kv_bytes: dtype.bytes(),
            tp: l.tp,
            flops_efficiency: 1.0,
            bandwidth_efficiency: 1.0,
            loss: w.kernels.loss,
            kernels: w.kernels.layers,
        };
        let records = op_records(self.model, &rw)?;
        let cp = l.cp.max(1) as f64;
        let tp = l.tp.max(1) as f64;
        let sp = l.sequence_parallel && l.tp > 1;
        let lora = w.lora.is_some();
        let shape = ModelShape {
            layer_norm: self
                .model
                .layers
                .first()
                .and_then(|l| l.attn_norm.or(l.mlp_norm))
                .is_some_and(|n| matches!(n.kind, NormKind::LayerNorm | NormKind::CohereLayerNorm)),
            gated: self.model.layers.iter().any(|l| match &l.mlp {
                crate::model::Mlp::Dense(d) => d.gated,
                crate::model::Mlp::Moe(m) => m.expert.gated,
                crate::model::Mlp::None => false,
            }),
        };
        let mut layers = vec![LayerCost::default(); self.model.layers.len()];
        let mut pre = LayerCost::default();
        let mut post = LayerCost::default();
        for r in &records {
            let cost = self.op_cost(r, dtype, (cp, tp, sp), lora, shape)?;
            let slot = match (r.layer, r.name) {
                (Some(i), _) => layers.get_mut(i),
                (None, "embedding") => Some(&mut pre),
                (None, _) => Some(&mut post),
            };
            if let Some(s) = slot {
                s.add(&cost);
            }
        }
        // ops the roofline does not list: rotary embeddings and residual dropout
        let rows = (w.batch * w.seq) as f64 / cp;
        let h = self.model.hidden_size as f64;
        let dropout = w.dropout && self.model.dropout.residual > 0.0;
        for (layer, cost) in self.model.layers.iter().zip(layers.iter_mut()) {
            let (heads, kv_heads, rot) = match layer.attention.kind {
                AttentionKind::Standard {
                    num_heads,
                    num_kv_heads,
                    ..
                } => (
                    num_heads as f64 / tp,
                    (num_kv_heads as f64 / tp).max(1.0),
                    layer.attention.rotary_dim.unwrap_or(0) as f64,
                ),
                AttentionKind::Mla {
                    num_heads,
                    qk_rope_head_dim,
                    ..
                } => (num_heads as f64 / tp, 1.0, qk_rope_head_dim as f64),
            };
            if rot > 0.0 {
                let bytes = rows * (heads + kv_heads) * rot * 2.0 * act_bytes;
                // Liger's RoPE rotates q and k in place in one kernel (ops/rope.py)
                let f = if self.exec.fused_elementwise || self.liger() {
                    1.0
                } else {
                    eager_factor("attention.rope", false, false)
                };
                let s = self.mem_s(bytes * f);
                cost.fwd.elementwise += s;
                cost.bwd.elementwise += s;
            }
            if dropout {
                // two residual dropouts: a 1-byte mask written forward, read backward (fused
                // into Megatron's bias-dropout-add); eager: read, write and mask each way
                let split = if sp { tp } else { 1.0 };
                let per = if self.exec.fused_elementwise {
                    1.0
                } else {
                    2.0 * act_bytes + 1.0
                };
                let s = self.mem_s(2.0 * rows / split * h * per);
                cost.fwd.elementwise += s;
                cost.bwd.elementwise += s;
            }
        }
        Ok(MicroBatchCompute { layers, pre, post })
    }

    /// Liger's layer kernels run the norms, the gated activation and RoPE (`--kernels liger`).
    fn liger(&self) -> bool {
        self.workload.kernels.layers == crate::workload::KernelSet::Liger
    }

    /// One recorded op's forward and backward seconds on this rank.
    fn op_cost(
        &self,
        r: &OpRecord,
        dtype: MathDtype,
        (cp, tp, sp): (f64, f64, bool),
        lora: bool,
        shape: ModelShape,
    ) -> Result<LayerCost, CoreError> {
        let mut c = LayerCost::default();
        let fused = self.exec.fused_elementwise;
        // sequence parallelism splits the ops outside the tensor-parallel region
        let split = match r.name {
            "norm" | "residual_add" | "embedding" if sp => cp * tp,
            _ => cp,
        };
        let flops = r.flops / split;
        let bytes = r.bytes / split;
        match r.kind {
            OpKind::Gemm { m, k, n, role } => {
                let m = match r.name {
                    // expert parallelism gathers the tokens of `ep` ranks onto each expert
                    "moe.experts" => m / cp * self.layout.ep.max(1) as f64,
                    _ => m / cp,
                };
                let fwd = self.gemm_s(dtype, m, k, n, flops, bytes)?;
                // a frozen base (LoRA) needs the input gradient only, not the weight gradient
                let bwd_factor = if lora { 1.0 } else { r.backward_flops_factor };
                c.fwd.gemm = fwd;
                c.bwd.gemm = bwd_factor * fwd;
                c.fwd_gemm_flops = flops;
                c.model_flops = flops * (1.0 + bwd_factor);
                // QLoRA quantizes every decoder-layer linear; LoRA adapts the targeted ones
                if let (Some(role), true) = (role, lora) {
                    if lora_targets(self.model, self.workload, role) {
                        self.add_adapter(&mut c, m, k, n)?;
                    }
                    self.add_dequant(&mut c, k, n);
                }
            }
            OpKind::Attention {
                heads,
                q_rows,
                context,
                qk_dim,
                v_dim,
                causal,
            } => {
                let q_rows = q_rows / cp;
                // model FLOPs count the scores unmasked (PaLM, Chowdhery et al. 2022, App. B;
                // Megatron `num_floating_point_operations`; torchtitan `get_num_flop_per_token`)
                let unmasked = flops / causal.max(1e-9);
                c.model_flops = 3.0 * unmasked;
                c.fwd_attention_flops = unmasked;
                let peak = self.peak(dtype)?;
                match self.exec.attention {
                    AttentionKernel::Eager => {
                        // the unfused path computes every score, masked or not, as batched GEMMs
                        let g = (unmasked / (peak * self.eff.gemm(context, qk_dim, context)))
                            .max(self.mem_s(bytes));
                        let dropout = self.workload.dropout && self.model.dropout.attention > 0.0;
                        let scores = heads * q_rows * context;
                        let t = self.mem_s(scores * score_bytes_per_element(fused, dropout));
                        c.fwd.attention = g + t / 3.0;
                        c.bwd.attention = 2.0 * g + 2.0 * t / 3.0;
                    }
                    AttentionKernel::Flash2 | AttentionKernel::Flash3 => {
                        let eff = self.eff.attention_at(context, 0.5 * (qk_dim + v_dim));
                        let fwd = (flops / (peak * eff)).max(self.mem_s(bytes));
                        c.fwd.attention = fwd;
                        c.bwd.attention = r.backward_flops_factor * fwd;
                    }
                }
                c.attention_fwd_s = c.fwd.attention;
            }
            OpKind::Elementwise => {
                // Liger's RMSNorm and SwiGLU/GeGLU are one kernel each (ops/rms_norm.py,
                // ops/swiglu.py, ops/geglu.py); LayerNorm is one native kernel anyway
                let fused_norm = self.workload.kernels.layers != crate::workload::KernelSet::Torch;
                let liger_fused = (self.liger() && r.name == "mlp.activation")
                    || (fused_norm && r.name == "norm");
                let f = if fused || liger_fused || (r.name == "norm" && self.exec.fused_norm) {
                    1.0
                } else {
                    eager_factor(r.name, shape.layer_norm, shape.gated)
                };
                let vector = self.peak(MathDtype::Fp32).unwrap_or(self.peak(dtype)?);
                let fwd = (flops / vector).max(self.mem_s(bytes * f));
                // a frozen embedding (LoRA) has no weight gradient to scatter
                let bwd_factor = if lora && r.name == "embedding" {
                    0.0
                } else {
                    r.backward_bytes_factor
                };
                c.fwd.elementwise = fwd;
                c.bwd.elementwise = bwd_factor * fwd;
            }
            OpKind::Optimizer => {}
        }
        Ok(c)
    }

    /// A LoRA adapter on a `[m×k]·[k×n]` linear: `x·A` (`k×r`) then `·B` (`r×n`), scaled and
    /// added. peft keeps adapter weights in fp32 and casts the input to them
    /// (`LoraConfig(autocast_adapter_dtype=True)`, `lora.Linear.forward` `_cast_input_dtype`),
    /// so under a bf16/fp16 model the adapter GEMMs run on the fp32 units; under autocast they
    /// run in the autocast format. Both adapter weights train: backward 2× forward.
    fn add_adapter(&self, c: &mut LayerCost, m: f64, k: f64, n: f64) -> Result<(), CoreError> {
        let Some(lora) = &self.workload.lora else {
            return Ok(());
        };
        let r = lora.rank as f64;
        let (dtype, eb) = match self.workload.precision {
            Precision::Bf16 | Precision::Fp16 | Precision::Fp32 => (MathDtype::Fp32, 4.0),
            Precision::AmpBf16 => (MathDtype::Bf16, 2.0),
            Precision::AmpFp16 => (MathDtype::Fp16, 2.0),
        };
        let a_flops = 2.0 * m * k * r;
        let a_bytes = m * k * eb + k * r * eb + m * r * eb;
        let b_flops = 2.0 * m * r * n;
        // B's output is scaled and added into the base output (read, read, write)
        let b_bytes = m * r * eb + r * n * eb + m * n * eb + 3.0 * m * n * 2.0;
        let fwd = self.gemm_s(dtype, m, k, r, a_flops, a_bytes)?
            + self.gemm_s(dtype, m, r, n, b_flops, b_bytes)?;
        c.fwd.gemm += fwd;
        c.bwd.gemm += 2.0 * fwd;
        c.fwd_gemm_flops += a_flops + b_flops;
        c.model_flops += 3.0 * (a_flops + b_flops);
        Ok(())
    }

    /// QLoRA: bitsandbytes dequantizes each 4-bit base weight to the compute format before
    /// every forward and backward GEMM (`bnb.matmul_4bit` → `dequantize_4bit`): 0.5 byte read
    /// (plus absmax) and 2 bytes written per weight, each way.
    fn add_dequant(&self, c: &mut LayerCost, k: f64, n: f64) {
        if !self.workload.lora.as_ref().is_some_and(|l| l.qlora) {
            return;
        }
        let s = self.mem_s(k * n * (0.5 + 2.0 + 0.1));
        c.fwd.gemm += s;
        c.bwd.gemm += s;
    }
}
