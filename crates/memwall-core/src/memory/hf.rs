//! Runtime profile `hf`: one training step of PyTorch eager + transformers
//! `AutoModelForCausalLM` with the loss computed inside the model, replayed op by op.
//!
//! Each helper below mirrors a piece of transformers 5.x / PyTorch 2.x code and cites it.
//! What a helper allocates and what autograd saves was read from those sources and checked
//! against allocation traces of the truth harness (`tools/truth/`).

use super::timeline::{Category, Ids, Marker, Node, Phase, TensorId, Timeline};
mod shard;

use crate::model::{
    Activation, Attention, AttentionKind, DenseMlp, LayerSpec, LinearRole, Mlp, ModelDesc, Norm,
    NormKind, QkNormScope, Residual,
};
use crate::workload::{AttentionImpl, Optimizer, Precision, TrainWorkload};

/// Which device's kernels the simulation follows where CPU and CUDA differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// CUDA: `native_dropout` keeps a 1-byte mask; the caching allocator rounds blocks to 512 bytes.
    Cuda,
    /// CPU (what the fake-tensor truth harness runs): dropout keeps a noise tensor of the input's
    /// dtype, SDPA with dropout falls back to the math kernel, and sizes are not rounded.
    Cpu,
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

/// Sizes in elements for the tensors of one step.
pub(crate) struct Builder<'a> {
    pub(crate) t: Timeline,
    model: &'a ModelDesc,
    w: &'a TrainWorkload,
    kernels: Kernels,
    /// bytes per element of parameters
    param_size: u128,
    /// bytes per element of matmul outputs (autocast dtype under AMP)
    compute_size: u128,
    /// autocast active (fp32 weights, low-precision matmuls)
    amp: bool,
    /// bytes per element of LoRA adapters (peft upcasts bf16/fp16 adapters to fp32)
    adapter_size: u128,
    batch: u128,
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
    /// tensors whose Python reference lives until the model outputs are dropped
    out_refs: Vec<TensorId>,
    /// autocast's weight-cast cache, cleared when the autocast region exits
    autocast_cache: Vec<TensorId>,
    /// rotary cos/sin (shared by all layers, saved by the rotary multiplications)
    rope_tables: Option<(TensorId, TensorId)>,
    /// every trainable parameter (for the optimizer)
    trainable: Vec<P>,
    /// the current layer's query is laid out [B, H, S, D] (made by `cat`)
    q_bhsd: bool,
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
    /// inference: `torch.no_grad()` and a persistent DynamicCache
    infer: bool,
    /// inference: per layer, the cached (k, v) storages and the tokens the cache layer keeps
    cache: Vec<Option<(TensorId, TensorId, u128)>>,
    /// inference: bytes per cached element when the cache is stored in another dtype
    pub(crate) kv_size: Option<u128>,
    /// inference: storage format of the weights
    pub(crate) wformat: crate::workload::WeightFormat,
    /// inference: MoE decode uses `batched_mm` experts
    pub(crate) moe_decode_batched: bool,
    /// data-parallel sharding simulated on this rank (FSDP2 / DeepSpeed ZeRO / DDP)
    pub(crate) shard: Option<super::dist_types::ShardSim>,
    /// the sharding state of each unit (0 = root, 1 + i = decoder layer i)
    pub(crate) units: Vec<super::dist_types::Unit>,
    cur_unit: usize,
    /// FSDP2: the unit whose all-gather was issued ahead (backward prefetch), with its buffer
    prefetched: Option<(usize, TensorId)>,
    /// FSDP2: the reduce-scatter input kept alive until the next unit's post-backward
    rs_in_flight: Option<TensorId>,
    /// FSDP2: the forward all-gather output kept until the next unit's all-gather
    ag_held: Option<TensorId>,
    /// bytes of every trainable parameter's state dtype
    pub(crate) param_count: u128,
    pub(crate) trainable_count: u128,
}

#[derive(Debug, Clone, Default)]
struct LayerParams {
    linears: Vec<(LinearRole, LinearP)>,
    norms: [Option<(P, Option<P>)>; 4],
    qk_norms: Option<(P, P)>,
    /// MoE: router, fused experts (all experts' weights of one kind in one parameter)
    router: Option<LinearP>,
    experts: Vec<P>,
    shared: Vec<(LinearRole, LinearP)>,
    shared_gate: Option<LinearP>,
    mla_norms: Vec<P>,
}

fn is_lora_target(model: &ModelDesc, w: &TrainWorkload, role: LinearRole) -> bool {
    let Some(l) = &w.lora else { return false };
    model
        .linear_names
        .iter()
        .any(|(r, name)| *r == role && l.targets.iter().any(|t| t == name))
}

impl<'a> Builder<'a> {
    pub(crate) fn new(model: &'a ModelDesc, w: &'a TrainWorkload, kernels: Kernels) -> Self {
        let (param_size, compute_size, amp) = match w.precision {
            Precision::Bf16 | Precision::Fp16 => (2, 2, false),
            Precision::Fp32 => (4, 4, false),
            Precision::AmpBf16 | Precision::AmpFp16 => (4, 2, true),
        };
        // peft `_cast_adapter_dtype(autocast_adapter_dtype=True)` upcasts fp16/bf16 adapters to fp32
        // (peft `tuners/tuners_utils.py`).
        let adapter_size = 4;
        let tokens = u128::from(w.batch) * u128::from(w.seq);
        let mut t = Timeline::new();
        if kernels == Kernels::Cuda {
            t.granularity = 512;
        }
        Builder {
            t,
            model,
            w,
            kernels,
            param_size,
            compute_size,
            amp,
            adapter_size,
            batch: u128::from(w.batch),
            seq: u128::from(w.seq),
            tokens,
            hidden: u128::from(model.hidden_size),
            layers: Vec::new(),
            embed: P {
                id: 0,
                numel: 0,
                rows: 0,
                cols: 1,
            },
            pos_embed: None,
            projections: None,
            final_norm: None,
            lm_head: None,
            out_refs: Vec::new(),
            autocast_cache: Vec::new(),
            rope_tables: None,
            trainable: Vec::new(),
            q_bhsd: false,
            kv_len: u128::from(w.seq),
            cur_layer: 0,
            layer_locals: Vec::new(),
            attn_locals: Vec::new(),
            block_outputs: Vec::new(),
            infer: false,
            cache: Vec::new(),
            kv_size: None,
            wformat: crate::workload::WeightFormat::Bf16,
            moe_decode_batched: true,
            shard: None,
            units: Vec::new(),
            cur_unit: 0,
            prefetched: None,
            rs_in_flight: None,
            ag_held: None,
            param_count: 0,
            trainable_count: 0,
        }
    }

    // ------------------------------------------------------------------ parameters

    fn new_param(&mut self, numel: u128, trainable_base: bool) -> P {
        self.new_matrix(numel, 0, 1, trainable_base)
    }

    /// A parameter of shape [.., rows, cols] (`rows == 0` for a vector).
    fn new_matrix(&mut self, numel: u128, rows: u128, cols: u128, trainable_base: bool) -> P {
        let trainable = trainable_base && self.w.lora.is_none() && !self.infer;
        let id = self.t.param(numel * self.param_size, trainable);
        let p = P {
            id,
            numel,
            rows,
            cols,
        };
        // dim 0 of the tensor, the dimension FSDP2 and ZeRO-3 shard (vectors: numel; matrices
        // [rows, cols]; stacked experts [E, rows, cols])
        let lead = numel / (rows * cols).max(1);
        let dim0 = if rows == 0 {
            numel
        } else if lead > 1 {
            lead
        } else {
            rows
        };
        self.note_unit_param(id, numel, dim0, trainable, self.param_size);
        self.param_count += numel;
        if trainable {
            self.trainable.push(p);
            self.trainable_count += numel;
        }
        p
    }

    fn new_adapter(&mut self, numel: u128, rows: u128, cols: u128) -> P {
        let id = self.t.param(numel * self.adapter_size, true);
        self.note_unit_param(id, numel, rows.max(1), true, self.adapter_size);
        let p = P {
            id,
            numel,
            rows,
            cols,
        };
        self.param_count += numel;
        self.trainable.push(p);
        self.trainable_count += numel;
        p
    }

    fn new_linear(
        &mut self,
        role: Option<LinearRole>,
        in_f: u128,
        out_f: u128,
        bias: bool,
    ) -> LinearP {
        // nn.Linear.weight is [out_features, in_features]
        let qlora = role.is_some() && self.w.lora.as_ref().is_some_and(|l| l.qlora);
        if qlora {
            // bitsandbytes Linear4bit: frozen NF4 weight; the bias stays in the compute dtype
            let id = self.t.param(nf4_bytes(in_f * out_f), false);
            self.param_count += in_f * out_f;
            let w = P {
                id,
                numel: in_f * out_f,
                rows: out_f,
                cols: in_f,
            };
            let b = bias.then(|| self.new_param(out_f, true));
            let rank = u128::from(self.w.lora.as_ref().map_or(0, |l| l.rank));
            let lora = match role {
                Some(r) if is_lora_target(self.model, self.w, r) => Some((
                    self.new_adapter(rank * in_f, rank, in_f),
                    self.new_adapter(out_f * rank, out_f, rank),
                )),
                _ => None,
            };
            return LinearP {
                w,
                nf4: true,
                quantized: true,
                b,
                lora,
                in_f,
                out_f,
            };
        }
        if let (Some(r), Some(bytes)) = (role, self.quantized_linear_bytes(role, out_f, in_f)) {
            // a quantised decoder linear (inference): frozen, stored in its format
            let _ = r;
            let id = self.t.param(bytes, false);
            self.param_count += in_f * out_f;
            let w = P {
                id,
                numel: in_f * out_f,
                rows: out_f,
                cols: in_f,
            };
            let b = bias.then(|| self.new_param(out_f, true));
            let nf4 = matches!(
                self.wformat,
                crate::workload::WeightFormat::Nf4 { .. }
                    | crate::workload::WeightFormat::Fp4 { .. }
            );
            return LinearP {
                w,
                nf4,
                quantized: true,
                b,
                lora: None,
                in_f,
                out_f,
            };
        }
        let w = self.new_matrix(in_f * out_f, out_f, in_f, true);
        let b = bias.then(|| self.new_param(out_f, true));
        let lora = match role {
            Some(r) if is_lora_target(self.model, self.w, r) => {
                let rank = u128::from(self.w.lora.as_ref().map_or(0, |l| l.rank));
                Some((
                    self.new_adapter(rank * in_f, rank, in_f),
                    self.new_adapter(out_f * rank, out_f, rank),
                ))
            }
            _ => None,
        };
        LinearP {
            nf4: false,
            quantized: false,
            w,
            b,
            lora,
            in_f,
            out_f,
        }
    }

    /// Bytes of a decoder linear `out × in` in the inference weight format, `None` when it is
    /// stored unquantised.
    fn quantized_linear_bytes(
        &self,
        role: Option<LinearRole>,
        out_f: u128,
        in_f: u128,
    ) -> Option<u128> {
        use crate::quant::{self, TensorRole};
        use crate::workload::WeightFormat as F;
        if !self.infer || role.is_none() {
            return None;
        }
        let numel = out_f * in_f;
        Some(match self.wformat {
            F::Bf16 | F::Fp16 | F::Fp32 => return None,
            F::Fp8 => quant::fp8_block_bytes(out_f, in_f),
            F::Int8 => quant::bnb_int8_bytes(out_f, in_f),
            F::Nf4 { double_quant } | F::Fp4 { double_quant } => {
                quant::bnb_4bit_bytes(numel, double_quant)
            }
            F::Gptq { bits, group } => {
                quant::grouped_int_bytes(out_f, in_f, u128::from(bits), u128::from(group), true)
            }
            F::Awq { group } => quant::grouped_int_bytes(out_f, in_f, 4, u128::from(group), false),
            F::Gguf(preset) => {
                let tr = match role {
                    Some(LinearRole::V) => TensorRole::AttnV,
                    Some(LinearRole::K) => TensorRole::AttnK,
                    Some(LinearRole::Qkv) => TensorRole::AttnQkv,
                    Some(LinearRole::Down) => TensorRole::FfnDown,
                    Some(LinearRole::Gate | LinearRole::Up | LinearRole::GateUp) => {
                        TensorRole::FfnUpGate
                    }
                    _ => TensorRole::Attn,
                };
                let n_layers = self.model.layers.len() as u128;
                let n_expert = self.model.layers.iter().find_map(|l| match &l.mlp {
                    Mlp::Moe(m) => Some(u128::from(m.num_experts)),
                    Mlp::Dense(_) => None,
                });
                // llama.cpp's LLM_TYPE_70B bump: 80-layer models of hidden 8192
                let is_70b = n_layers == 80 && self.model.hidden_size == 8192;
                let layer = self.layers.len() as u128;
                preset
                    .tensor_type(tr, layer, n_layers, in_f, n_expert.unwrap_or(1), is_70b)
                    .bytes(out_f, in_f)
            }
        })
    }

    /// Bytes of a non-linear matrix (embeddings, LM head, fused experts) in GGUF, `None`
    /// otherwise: bitsandbytes, GPTQ and AWQ keep them unquantised (bitsandbytes replaces
    /// `nn.Linear` only and skips `lm_head`).
    fn gguf_matrix_bytes(
        &self,
        role: crate::quant::TensorRole,
        rows: u128,
        cols: u128,
    ) -> Option<u128> {
        let crate::workload::WeightFormat::Gguf(preset) = self.wformat else {
            return None;
        };
        if !self.infer {
            return None;
        }
        let n = self.model.layers.len() as u128;
        Some(
            preset
                .tensor_type(role, self.layers.len() as u128, n, cols, 1, false)
                .bytes(rows, cols),
        )
    }

    fn new_norm(&mut self, n: &Norm) -> (P, Option<P>) {
        let w = self.new_param(u128::from(n.dim), true);
        let b = n.bias.then(|| self.new_param(u128::from(n.dim), true));
        if self.infer && matches!(self.wformat, crate::workload::WeightFormat::Gguf(_)) {
            // GGUF keeps 1-D tensors in fp32
            self.t.resize_param(w.id, u128::from(n.dim) * 4);
            if let Some(b) = b {
                self.t.resize_param(b.id, u128::from(n.dim) * 4);
            }
        }
        (w, b)
    }

    fn build_params(&mut self) {
        let m = self.model;
        let h = self.hidden;
        let e = &m.embeddings;
        let (v, dim) = (u128::from(e.vocab_size), u128::from(e.dim));
        self.embed = self.new_matrix(v * dim, v, dim, true);
        if let Some(b) = self.gguf_matrix_bytes(crate::quant::TensorRole::TokenEmbd, v, dim) {
            self.t.resize_param(self.embed.id, b);
        }
        self.pos_embed = e
            .learned_positions
            .map(|p| self.new_matrix(u128::from(p) * h, u128::from(p), h, true));
        if e.projections {
            let pin = self.new_linear(None, dim, h, false);
            let pout = self.new_linear(None, h, dim, false);
            self.projections = Some((pin, pout));
        }
        for (i, layer) in m.layers.iter().enumerate() {
            self.cur_unit = i + 1;
            let lp = self.layer_params(layer);
            self.layers.push(lp);
        }
        self.cur_unit = 0;
        self.final_norm = m.head.final_norm.as_ref().map(|n| self.new_norm(n));
        if !m.head.tied {
            self.lm_head = Some(self.new_matrix(v * dim, v, dim, true));
            if let (Some(h), Some(b)) = (
                self.lm_head,
                self.gguf_matrix_bytes(crate::quant::TensorRole::Output, v, dim),
            ) {
                self.t.resize_param(h.id, b);
            }
            if m.head.bias {
                self.new_param(u128::from(e.vocab_size), true);
            }
        }
    }

    fn layer_params(&mut self, l: &LayerSpec) -> LayerParams {
        let h = self.hidden;
        let mut lp = LayerParams::default();
        for (i, n) in [l.attn_norm, l.attn_post_norm, l.mlp_norm, l.mlp_post_norm]
            .iter()
            .enumerate()
        {
            if let Some(n) = n {
                lp.norms[i] = Some(self.new_norm(n));
            }
        }
        let a = &l.attention;
        // shapes come from the model description, the one place they are defined
        for shape in a.linears(self.model.hidden_size) {
            let lin = self.new_linear(
                Some(shape.role),
                u128::from(shape.in_features),
                u128::from(shape.out_features),
                shape.bias,
            );
            lp.linears.push((shape.role, lin));
        }
        let norm_dims = a.norm_dims();
        match a.kind {
            AttentionKind::Standard { .. } => {
                if let [q, k] = norm_dims[..] {
                    lp.qk_norms = Some((
                        self.new_param(u128::from(q), true),
                        self.new_param(u128::from(k), true),
                    ));
                }
            }
            AttentionKind::Mla { .. } => {
                for d in norm_dims {
                    let p = self.new_param(u128::from(d), true);
                    lp.mla_norms.push(p);
                }
            }
        }
        match &l.mlp {
            Mlp::Dense(d) => {
                let ls = self.mlp_params(d);
                lp.linears.extend(ls);
            }
            Mlp::Moe(moe) => {
                let e = u128::from(moe.num_experts);
                lp.router = Some(self.new_linear(None, h, e, moe.router_bias));
                let i = u128::from(moe.expert.intermediate);
                // transformers 5 stores each expert kind as one 3-D parameter
                // (`gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I]).
                let ins = if moe.expert.gated { 2 } else { 1 };
                let gu = self.new_matrix(e * ins * i * h, ins * i, h, true);
                let down = self.new_matrix(e * i * h, h, i, true);
                // GGUF quantises the stacked experts (ffn_gate/up/down_exps) per expert row
                if let Some(b) =
                    self.gguf_matrix_bytes(crate::quant::TensorRole::FfnUpGate, e * ins * i, h)
                {
                    self.t.resize_param(gu.id, b);
                }
                if let Some(b) = self.gguf_matrix_bytes(crate::quant::TensorRole::FfnDown, e * h, i)
                {
                    self.t.resize_param(down.id, b);
                }
                lp.experts = vec![gu, down];
                if moe.expert.bias {
                    lp.experts.push(self.new_param(e * (ins * i + h), true));
                }
                if moe.router_extra_params > 0 {
                    self.new_param(u128::from(moe.router_extra_params), true);
                }
                if let Some(s) = &moe.shared {
                    lp.shared = self.mlp_params(s);
                }
                if moe.shared_gate {
                    lp.shared_gate = Some(self.new_linear(None, h, 1, false));
                }
            }
        }
        lp
    }

    fn mlp_params(&mut self, d: &DenseMlp) -> Vec<(LinearRole, LinearP)> {
        d.linears(self.model.hidden_size)
            .into_iter()
            .map(|shape| {
                let lin = self.new_linear(
                    Some(shape.role),
                    u128::from(shape.in_features),
                    u128::from(shape.out_features),
                    shape.bias,
                );
                (shape.role, lin)
            })
            .collect()
    }

    // ------------------------------------------------------------------ tensor helpers

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
        let rg =
            inputs.iter().any(|&i| self.rg(i)) || params.iter().any(|&p| self.t.requires_grad(p));
        let y = self.act(out_bytes, rg);
        if rg {
            let mut needing = [0; 6];
            let mut n = 0;
            for &i in inputs {
                if self.rg(i) && n < 6 {
                    needing[n] = i;
                    n += 1;
                }
            }
            self.t.record(Node {
                saved: Ids::of(saved),
                inputs: Ids::of(&needing[..n]),
                params: Ids::of(params),
                outputs: Ids::of(&[y]),
                backward_temps: temps.iter().sum(),
                ..Node::default()
            });
        }
        y
    }

    /// `a * b` of two tensors: each operand is saved only if the other needs a gradient
    /// (`tools/autograd/derivatives.yaml`, `mul.Tensor`).
    fn mul(&mut self, a: TensorId, b: TensorId, out_bytes: u128) -> TensorId {
        let mut saved = Vec::with_capacity(2);
        if self.rg(b) {
            saved.push(a);
        }
        if self.rg(a) {
            saved.push(b);
        }
        self.op(out_bytes, &[a, b], &saved, &[], &[])
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

    /// After the last decoder layer: the causal mask and the kept block outputs go, then the
    /// final norm and (OPT-350m style) the output projection run on the hidden states.
    /// Shared by the training forward and the inference forward (same modeling code).
    fn body_tail(
        &mut self,
        x: TensorId,
        xsize: u128,
        rows: u128,
        mask: Option<TensorId>,
    ) -> (TensorId, u128) {
        if let Some(m) = mask {
            self.drop_(m);
        }
        for t in std::mem::take(&mut self.block_outputs) {
            self.drop_(t);
        }
        let (fx, fs) = match (self.model.head.final_norm, self.final_norm) {
            (Some(n), Some(p)) => {
                let r = self.norm(x, xsize, rows, &n, p);
                self.drop_(x);
                r
            }
            _ => (x, xsize),
        };
        match self.projections {
            Some((_, pout)) => {
                let (y, ys) = self.linear(fx, fs, rows, pout);
                self.drop_(fx);
                (y, ys)
            }
            None => (fx, fs),
        }
    }

    /// The LM head as a linear layer: its own weight, or the tied input embedding.
    fn lm_head_linear(&self) -> LinearP {
        let v = u128::from(self.model.embeddings.vocab_size);
        let dim = u128::from(self.model.embeddings.dim);
        LinearP {
            nf4: false,
            quantized: false,
            w: P {
                numel: v * dim,
                ..self.lm_head.unwrap_or(self.embed)
            },
            b: None,
            lora: None,
            in_f: dim,
            out_f: v,
        }
    }

    fn drop_(&mut self, x: TensorId) {
        self.t.release(x);
    }

    // ------------------------------------------------------------------ layers

    /// `nn.Linear` / `F.linear` on `rows` rows: output saved-input semantics of `mm`
    /// (`tools/autograd/derivatives.yaml`: `mm` saves `self` when `mat2` needs grad and `mat2`
    /// when `self` needs grad). Under autocast the weight is cast once per autocast region and
    /// cached (`aten/src/ATen/autocast_mode.cpp`, `cached_cast`), the input is cast per call.
    /// LoRA per peft `tuners/lora/layer.py` `Linear.forward`.
    fn linear(&mut self, x: TensorId, x_size: u128, rows: u128, lin: LinearP) -> (TensorId, u128) {
        let c = self.compute_size;
        let w_tr = self.trainable(&lin.w);
        let mut params = vec![lin.w.id];
        if let Some(b) = lin.b {
            params.push(b.id);
        }
        let y = if lin.nf4 && rows == 1 {
            // bnb `matmul_4bit` inference fast path: one token of one sequence runs `gemv_4bit`
            // on the packed weight, nothing dequantised
            self.op(rows * lin.out_f * x_size, &[x], &[], &params, &[])
        } else if self.infer && self.wformat == crate::workload::WeightFormat::Int8 && lin.quantized
        {
            // bitsandbytes MatMul8bitLt: row-wise int8 activations with fp32 stats, an int32
            // product, dequantised into the output (autograd/_functions.py)
            self.t.transient(
                rows * lin.in_f + rows * 4 + rows * lin.out_f * 4,
                Category::Activations,
            );
            self.op(rows * lin.out_f * x_size, &[x], &[], &params, &[])
        } else if self.infer && self.wformat == crate::workload::WeightFormat::Fp8 && lin.quantized
        {
            // FP8Linear: per-token-group (128) fp8 activations and their fp32 scales
            self.t.transient(
                rows * lin.in_f + rows * lin.in_f.div_ceil(128) * 4,
                Category::Activations,
            );
            self.op(rows * lin.out_f * x_size, &[x], &[], &params, &[])
        } else if lin.nf4 {
            // bitsandbytes MatMul4Bit (autograd/_functions.py) with the dequant + F.linear path of
            // `gemm_4bit` for training-sized inputs (backends/cuda/ops.py): the weight is
            // dequantised to the input dtype for the forward and again in backward; nothing of the
            // frozen weight is saved.
            let dq = lin.w.numel * x_size + lin.w.numel.div_ceil(NF4_BLOCK) * 4;
            self.t
                .transient(dq + rows * lin.out_f * x_size, Category::Activations);
            self.op(rows * lin.out_f * x_size, &[x], &[], &params, &[dq])
        } else if self.amp {
            // autocast caches the cast only for leaf tensors that require grad (`cached_cast`
            // in aten/src/ATen/autocast_mode.cpp); a frozen weight is cast per call
            let wc = self.t.alloc(lin.w.numel * c, Category::Activations, false);
            let xc = if x_size != c {
                self.cast(x, rows * lin.in_f * c)
            } else {
                x
            };
            // mm saves the cast weight for the input's gradient and the input for the weight's
            let mut saved = Vec::with_capacity(2);
            if self.rg(xc) {
                saved.push(wc);
            }
            if w_tr {
                saved.push(xc);
            }
            // bf16 gradient of the cast weight, converted to the fp32 `.grad`
            let temps = if w_tr { vec![lin.w.numel * c] } else { vec![] };
            let y = self.op(rows * lin.out_f * c, &[xc], &saved, &params, &temps);
            if xc != x {
                self.drop_(xc);
            }
            if w_tr {
                self.autocast_cache.push(wc);
            } else {
                self.drop_(wc);
            }
            y
        } else {
            let saved: Vec<TensorId> = if w_tr { vec![x] } else { vec![] };
            self.op(rows * lin.out_f * c, &[x], &saved, &params, &[])
        };
        let Some((a, b)) = lin.lora else {
            return (y, c);
        };
        let s = self.adapter_size;
        // x = _cast_input_dtype(x, lora_A.weight.dtype)
        let xa = if x_size != s {
            self.cast(x, rows * lin.in_f * s)
        } else {
            x
        };
        let rank = a.numel / lin.in_f.max(1);
        // Under autocast lora_A/lora_B are ordinary F.linear calls: their fp32 input and weights
        // are cast to the autocast dtype and the adapter path runs in it; otherwise it runs in
        // the adapters' fp32.
        let (ha, hb, s) = if self.amp {
            let la = LinearP {
                w: a,
                nf4: false,
                quantized: false,
                b: None,
                lora: None,
                in_f: lin.in_f,
                out_f: rank,
            };
            let lb = LinearP {
                w: b,
                nf4: false,
                quantized: false,
                b: None,
                lora: None,
                in_f: rank,
                out_f: lin.out_f,
            };
            let (ha, _) = self.linear(xa, s, rows, la);
            if xa != x {
                self.drop_(xa);
            }
            let (hb, _) = self.linear(ha, c, rows, lb);
            (ha, hb, c)
        } else {
            let ha = self.op(rows * rank * s, &[xa], &[xa], &[a.id], &[]);
            if xa != x {
                self.drop_(xa);
            }
            let hb = self.op(rows * lin.out_f * s, &[ha], &[ha], &[b.id], &[]);
            (ha, hb, s)
        };
        self.drop_(ha);
        let scaled = self.op(rows * lin.out_f * s, &[hb], &[], &[], &[]);
        self.drop_(hb);
        let out_size = c.max(s);
        let sum = self.op(rows * lin.out_f * out_size, &[y, scaled], &[], &[], &[]);
        self.drop_(y);
        self.drop_(scaled);
        if out_size != c {
            let r = self.cast(sum, rows * lin.out_f * c);
            self.drop_(sum);
            (r, c)
        } else {
            (sum, c)
        }
    }

    /// A norm over `rows` rows of `dim`, input elements of `x_size` bytes. Returns (output, its size).
    fn norm(
        &mut self,
        x: TensorId,
        x_size: u128,
        rows: u128,
        norm: &Norm,
        p: (P, Option<P>),
    ) -> (TensorId, u128) {
        let dim = u128::from(norm.dim);
        let n = rows * dim;
        let mut params = vec![p.0.id];
        if let Some(b) = p.1 {
            params.push(b.id);
        }
        match norm.kind {
            NormKind::LayerNorm => {
                // torch.native_layer_norm saves input, mean and rstd (fp32 per row).
                // Under autocast the op runs in fp32 (`autocast_mode.cpp` fp32 list).
                let (xin, out_size) = if self.amp && x_size != 4 {
                    (self.cast(x, n * 4), 4)
                } else {
                    (x, x_size)
                };
                let mean = self.act(rows * 4, false);
                let rstd = self.act(rows * 4, false);
                let y = self.op(n * out_size, &[xin], &[xin, mean, rstd], &params, &[]);
                self.drop_(mean);
                self.drop_(rstd);
                if xin != x {
                    self.drop_(xin);
                }
                (y, out_size)
            }
            NormKind::RmsNorm | NormKind::Olmo2RmsNorm | NormKind::GemmaRmsNorm => {
                // Shared prefix of LlamaRMSNorm, Olmo2RMSNorm and GemmaRMSNorm (transformers
                // models/{llama,olmo2,gemma}/modeling_*.py):
                //   h = x.to(float32); h = h * rsqrt(h.pow(2).mean(-1) + eps)
                let x32 = if x_size != 4 { self.cast(x, n * 4) } else { x };
                self.t.transient(n * 4, Category::Activations); // pow(2), freed after mean
                let rs = self.op(rows * 4, &[x32], &[x32], &[], &[]);
                let h32 = self.mul(x32, rs, n * 4);
                // mul saves `h` only for the weight's gradient (derivatives.yaml: mul saves
                // `other` when `self` needs grad and `self` when `other` does); the decomposed
                // backward holds up to four fp32 row-sized temporaries
                let w_tr = self.trainable(&p.0);
                let temps = [4 * n * 4];
                let y = if norm.kind == NormKind::RmsNorm && x_size != 4 {
                    // Llama: `weight * h.to(input_dtype)`: the weight multiplies in the input dtype
                    let hd = self.cast(h32, n * x_size);
                    self.drop_(h32);
                    let saved: &[TensorId] = if w_tr { &[hd] } else { &[] };
                    let y = self.op(n * x_size, &[hd], saved, &params, &temps);
                    self.drop_(hd);
                    y
                } else {
                    // Olmo2: `(weight * h).to(input_dtype)`; Gemma: `(h * (1 + weight.float())).type_as(x)`:
                    // the weight multiplies in fp32, then one cast
                    let saved: &[TensorId] = if w_tr { &[h32] } else { &[] };
                    let y32 = self.op(n * 4, &[h32], saved, &params, &temps);
                    self.drop_(h32);
                    if x_size != 4 {
                        let y = self.cast(y32, n * x_size);
                        self.drop_(y32);
                        y
                    } else {
                        y32
                    }
                };
                self.drop_(rs);
                if x32 != x {
                    self.drop_(x32);
                }
                (y, x_size)
            }
        }
    }

    /// Training-mode dropout; p = 0 returns the input itself (`ATen/native/Dropout.cpp`).
    fn dropout(&mut self, x: TensorId, bytes: u128, elem: u128, p: f64) -> TensorId {
        if p <= 0.0 || !self.w.dropout {
            return x;
        }
        let numel = bytes / elem.max(1);
        let mask = match self.kernels {
            // native_dropout: output + bool mask saved
            Kernels::Cuda => self.act(numel, false),
            // _dropout_impl: noise = empty_like(x).bernoulli_(); x * noise (noise saved)
            Kernels::Cpu => self.act(bytes, false),
        };
        let y = self.op(bytes, &[x], &[mask], &[], &[]);
        self.drop_(mask);
        self.drop_(x);
        y
    }

    /// Rotary embedding on a [rows, heads*dim] tensor, `rot` of each head's `dim` rotated
    /// (`apply_rotary_pos_emb`, `rotate_half`): q*cos + rotate_half(q)*sin; nothing large saved.
    fn rope(
        &mut self,
        x: TensorId,
        x_size: u128,
        heads: u128,
        dim: u128,
        rot: u128,
    ) -> (TensorId, u128) {
        let rows = self.tokens;
        // cos/sin are fp32 under autocast (computed outside autocast's matmul list): the result promotes
        let out_size = if self.amp { 4 } else { x_size };
        let full = rows * heads * dim;
        let part = rows * heads * rot;
        let (cos, sin) = self.rope_tables.unwrap_or((0, 0));
        // transients: x*cos, neg half, cat, rotate*sin
        let y = if rot == dim {
            self.t.transient(
                part * out_size * 2 + part * x_size / 2 + part * x_size,
                Category::Activations,
            );
            self.op(
                full * out_size,
                &[x],
                &[cos, sin],
                &[],
                &[3 * part * out_size],
            )
        } else {
            // partial rotary: rotate the first `rot` dims, then cat with the pass-through part
            let r = self.op(
                part * out_size,
                &[x],
                &[cos, sin],
                &[],
                &[3 * part * out_size],
            );
            let y = self.op(full * out_size, &[r, x], &[], &[], &[]);
            self.drop_(r);
            y
        };
        (y, out_size)
    }

    /// The attention block. Tensors bound to locals of the attention function (the fused qkv
    /// output: Falcon's `fused_qkv`, NeoX/Phi-3 `qkv`, GPT-2's query view) live until it returns.
    fn attention(
        &mut self,
        x: TensorId,
        x_size: u128,
        a: &Attention,
        lp: &LayerParams,
        ckpt: bool,
    ) -> TensorId {
        let y = self.attention_inner(x, x_size, a, lp, ckpt);
        for t in std::mem::take(&mut self.attn_locals) {
            self.drop_(t);
        }
        y
    }

    fn attention_inner(
        &mut self,
        x: TensorId,
        x_size: u128,
        a: &Attention,
        lp: &LayerParams,
        ckpt: bool,
    ) -> TensorId {
        let rows = self.tokens;
        let lin = |role: LinearRole| lp.linears.iter().find(|(r, _)| *r == role).map(|(_, l)| *l);
        let c = self.compute_size;
        let (heads, kv_heads, qk_dim, v_dim, rot, q, k, v, qs, ks) = match a.kind {
            AttentionKind::Standard {
                num_heads,
                num_kv_heads,
                head_dim,
            } => {
                let (heads, kvh, hd) = (
                    u128::from(num_heads),
                    u128::from(num_kv_heads),
                    u128::from(head_dim),
                );
                let (q, k, v) = if let Some(qkv) = lin(LinearRole::Qkv) {
                    let (y, _) = self.linear(x, x_size, rows, qkv);
                    // q, k, v are views of the fused output; keep it alive through each view,
                    // and through the attention function (a local)
                    self.t.retain(y);
                    self.t.retain(y);
                    self.t.retain(y);
                    self.attn_locals.push(y);
                    (y, y, y)
                } else {
                    let (q, _) =
                        self.linear(x, x_size, rows, lin(LinearRole::Q).unwrap_or(lin_zero()));
                    let (k, _) =
                        self.linear(x, x_size, rows, lin(LinearRole::K).unwrap_or(lin_zero()));
                    let (v, _) =
                        self.linear(x, x_size, rows, lin(LinearRole::V).unwrap_or(lin_zero()));
                    (q, k, v)
                };
                let rot = a.rotary_dim.map_or(0, u128::from);
                (heads, kvh, hd, hd, rot, q, k, v, c, c)
            }
            AttentionKind::Mla {
                num_heads,
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
            } => {
                let heads = u128::from(num_heads);
                let nope = u128::from(qk_nope_head_dim);
                let ropd = u128::from(qk_rope_head_dim);
                let kvr = u128::from(kv_lora_rank);
                let mla_norm = |dim: u64| Norm {
                    kind: NormKind::RmsNorm,
                    dim,
                    bias: false,
                };
                let q = match q_lora_rank {
                    Some(r) => {
                        let (qa, _) =
                            self.linear(x, x_size, rows, lin(LinearRole::QA).unwrap_or(lin_zero()));
                        let np = (lp.mla_norms[0], None);
                        let (qn, _) = self.norm(qa, c, rows, &mla_norm(r), np);
                        self.drop_(qa);
                        let (qb, _) =
                            self.linear(qn, c, rows, lin(LinearRole::QB).unwrap_or(lin_zero()));
                        self.drop_(qn);
                        qb
                    }
                    None => {
                        self.linear(x, x_size, rows, lin(LinearRole::Q).unwrap_or(lin_zero()))
                            .0
                    }
                };
                let (kva, _) =
                    self.linear(x, x_size, rows, lin(LinearRole::KvA).unwrap_or(lin_zero()));
                // split: latent part normalised, rope part rotated and expanded to all heads
                let np = (lp.mla_norms[lp.mla_norms.len() - 1], None);
                if self.infer {
                    return self.mla_infer(a, lp, q, kva, np);
                }
                let (kvn, _) = self.norm(kva, c, rows, &mla_norm(kv_lora_rank), np);
                let (kvb, _) =
                    self.linear(kvn, c, rows, lin(LinearRole::KvB).unwrap_or(lin_zero()));
                self.drop_(kvn);
                let _ = kvr;
                // k = cat(k_nope, k_rope.expand(heads)), q = cat(q_nope, rope(q_rope)) (new tensors)
                let (kr, _) = self.rope(kva, c, 1, ropd, ropd);
                self.drop_(kva);
                let (qr, _) = self.rope(q, c, heads, ropd, ropd);
                let qf = self.op(rows * heads * (nope + ropd) * c, &[q, qr], &[], &[], &[]);
                self.drop_(q);
                self.drop_(qr);
                let kf = self.op(rows * heads * (nope + ropd) * c, &[kvb, kr], &[], &[], &[]);
                self.drop_(kr);
                (
                    heads,
                    heads,
                    nope + ropd,
                    u128::from(v_head_dim),
                    0,
                    qf,
                    kf,
                    kvb,
                    c,
                    c,
                )
            }
        };
        // q/k norms (Qwen3, Gemma 3 per head; OLMo 2 over the whole projection)
        let (mut q, mut k, mut qs, mut ks) = (q, k, qs, ks);
        if let (Some((scope, kind)), Some((qn, kn))) = (a.qk_norm, lp.qk_norms) {
            let (qrows, krows, qdim, kdim) = match scope {
                QkNormScope::PerHead => {
                    (rows * heads, rows * kv_heads, qk_dim as u64, qk_dim as u64)
                }
                QkNormScope::Full => (
                    rows,
                    rows,
                    (heads * qk_dim) as u64,
                    (kv_heads * qk_dim) as u64,
                ),
            };
            let (q2, s2) = self.norm(
                q,
                qs,
                qrows,
                &Norm {
                    kind,
                    dim: qdim,
                    bias: false,
                },
                (qn, None),
            );
            let (k2, s3) = self.norm(
                k,
                ks,
                krows,
                &Norm {
                    kind,
                    dim: kdim,
                    bias: false,
                },
                (kn, None),
            );
            self.drop_(q);
            self.drop_(k);
            (q, k, qs, ks) = (q2, k2, s2, s3);
        }
        self.q_bhsd = matches!(a.kind, AttentionKind::Mla { .. })
            || (rot > 0 && (rot < qk_dim || a.rope_concat));
        if rot > 0 {
            let (q2, s2) = self.rope(q, qs, heads, qk_dim, rot);
            let (k2, s3) = self.rope(k, ks, kv_heads, qk_dim, rot);
            self.drop_(q);
            self.drop_(k);
            (q, k, qs, ks) = (q2, k2, s2, s3);
        }
        let mut vs = c;
        if self.infer {
            // Inference with a DynamicCache (transformers cache_utils.py): `DynamicLayer.update`
            // replaces the cache by `torch.cat([cache, new])` (new storage, the old one freed);
            // `DynamicSlidingWindowLayer.update` does the same cat, returns the full states and
            // keeps a *view* of the last `window - 1` tokens, so the concatenated storage stays
            // alive until the next update. MLA caches the per-head k and v, not the latent.
            let layer = self.cur_layer;
            let prev = self.cache.get_mut(layer).and_then(Option::take);
            let kept = prev.map_or(0, |(_, _, n)| n);
            let q_len = self.seq;
            let total = kept + q_len;
            // a cache in another dtype stores converted k/v (`--kv-dtype`)
            let (ks, vs) = match self.kv_size {
                Some(e) => (e, e),
                None => (ks, vs),
            };
            let kc = self.op(
                self.batch * total * kv_heads * qk_dim * ks,
                &[k],
                &[],
                &[],
                &[],
            );
            // `DynamicLayer.update` rebinds `self.keys` before concatenating the values, so the
            // old keys are gone by then; the sliding layer builds both full states first.
            let prev = match (prev, a.sliding_window) {
                (Some((pk, pv, n)), None) => {
                    self.drop_(pk);
                    Some((None, pv, n))
                }
                (Some((pk, pv, n)), Some(_)) => Some((Some(pk), pv, n)),
                (None, _) => None,
            };
            let vc = self.op(
                self.batch * total * kv_heads * v_dim * vs,
                &[v],
                &[],
                &[],
                &[],
            );
            if let Some((pk, pv, _)) = prev {
                if let Some(pk) = pk {
                    self.drop_(pk);
                }
                self.drop_(pv);
            }
            self.drop_(k);
            self.drop_(v);
            let keeps = match a.sliding_window {
                Some(win) => total.min(u128::from(win).saturating_sub(1)),
                None => total,
            };
            self.t.retain(kc);
            self.t.retain(vc);
            if let Some(slot) = self.cache.get_mut(layer) {
                *slot = Some((kc, vc, keeps));
            }
            self.kv_len = total;
            let y =
                self.attention_core(q, qs, kc, ks, vc, vs, heads, kv_heads, qk_dim, v_dim, a, lp);
            return y;
        }
        // DynamicCache.update (transformers cache_utils.py) concatenates k/v into the cache,
        // which the model output keeps; HF disables the cache under gradient checkpointing.
        if !ckpt && !matches!(a.kind, AttentionKind::Mla { .. }) {
            let cache_size = ks.max(vs);
            let kc = self.op(rows * kv_heads * qk_dim * cache_size, &[k], &[], &[], &[]);
            let vc = self.op(rows * kv_heads * v_dim * cache_size, &[v], &[], &[], &[]);
            self.drop_(k);
            self.drop_(v);
            self.t.retain(kc);
            self.t.retain(vc);
            self.out_refs.push(kc);
            self.out_refs.push(vc);
            k = kc;
            ks = cache_size;
            vs = cache_size;
            let _ = &mut k;
            return self
                .attention_core(q, qs, kc, ks, vc, vs, heads, kv_heads, qk_dim, v_dim, a, lp);
        }
        self.attention_core(q, qs, k, ks, v, vs, heads, kv_heads, qk_dim, v_dim, a, lp)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_core(
        &mut self,
        q: TensorId,
        qs: u128,
        k: TensorId,
        ks: u128,
        v: TensorId,
        vs: u128,
        heads: u128,
        kv_heads: u128,
        qk_dim: u128,
        v_dim: u128,
        a: &Attention,
        lp: &LayerParams,
    ) -> TensorId {
        let (b, s, kv) = (self.batch, self.seq, self.kv_len);
        let rows = self.tokens;
        let c = self.compute_size;
        let lin = |role: LinearRole| lp.linears.iter().find(|(r, _)| *r == role).map(|(_, l)| *l);
        let attn_dropout = if self.w.dropout {
            self.model.dropout.attention
        } else {
            0.0
        };
        // The CPU flash kernel needs dropout 0 and equal q/k and v head dims (MLA has 192 vs
        // 128); otherwise CPU SDPA runs the math kernel. On CUDA, flash or mem-efficient
        // attention covers both.
        let cpu_math = self.kernels == Kernels::Cpu
            && self.w.attention == AttentionImpl::Sdpa
            && (attn_dropout > 0.0 || qk_dim != v_dim);
        let out = match self.w.attention {
            AttentionImpl::Sdpa if cpu_math => {
                // On CPU, SDPA with dropout has no fused kernel and runs
                // `_scaled_dot_product_attention_math` (aten/src/ATen/native/transformers/attention.cpp):
                // bf16/fp16 q, k, v are upcast to fp32, q and k scaled, k^T made contiguous,
                // scores and `_safe_softmax` in fp32, dropout noise of the same size, probs @ v,
                // result cast back. Saved: scaled q, k^T copy, probs, noise, dropped probs, v.
                let x = b * heads * s * kv;
                let w = 4;
                let nq = rows * heads * qk_dim;
                let nk = b * kv * kv_heads * qk_dim;
                let nv = b * kv * kv_heads * v_dim;
                let (q32, k32, v32) = (
                    if qs != w {
                        self.cast(q, nq * w)
                    } else {
                        self.retain_id(q)
                    },
                    if ks != w {
                        self.cast(k, nk * w)
                    } else {
                        self.retain_id(k)
                    },
                    if vs != w {
                        self.cast(v, nv * w)
                    } else {
                        self.retain_id(v)
                    },
                );
                // the fp32 casts are locals of the C++ math function: alive until it returns
                let qsc = self.op(nq * w, &[q32], &[], &[], &[]);
                // grouped-query attention: the math kernel repeats k and v to every head
                // (`repeat_interleave` under `enable_gqa`)
                let (k32, v32) = if heads > kv_heads {
                    let kr = self.op(b * kv * heads * qk_dim * w, &[k32], &[], &[], &[]);
                    let vr = self.op(b * kv * heads * v_dim * w, &[v32], &[], &[], &[]);
                    self.drop_(k32);
                    self.drop_(v32);
                    (kr, vr)
                } else {
                    (k32, v32)
                };
                let nk = b * kv * heads * qk_dim;
                // `is_causal` becomes an additive [q, kv] bias in the upcast dtype
                // (`convert_boolean_attn_mask` on a `tril` of ones), a local until return
                let bias = (s > 1).then(|| self.act(s * kv * w, false));
                let ksc = self.op(nk * w, &[k32], &[], &[], &[]);
                let kt = self.op(nk * w, &[ksc], &[], &[], &[]);
                self.drop_(ksc);
                let scores = self.mul(qsc, kt, x * w);
                self.drop_(kt);
                let masked = self.op(x * w, &[scores], &[], &[], &[]);
                self.drop_(scores);
                let probs = self.op_saving_output(x * w, masked);
                self.drop_(masked);
                let dropped = self.dropout(probs, x * w, w, attn_dropout);
                let o32 = self.op(
                    rows * heads * v_dim * w,
                    &[dropped, v32],
                    &[dropped, v32],
                    &[],
                    &[],
                );
                self.drop_(dropped);
                self.drop_(v32);
                let o = if c != w {
                    self.cast(o32, rows * heads * v_dim * c)
                } else {
                    self.retain_id(o32)
                };
                self.drop_(o32);
                // the scaled query is a local of the C++ function too (`query = query_ *
                // scaling_factor`); the scaled key is a temporary of the matmul call
                self.drop_(qsc);
                if let Some(m) = bias {
                    self.drop_(m);
                }
                self.drop_(q32);
                self.drop_(k32);
                // [B, H, S, D] -> [B, S, H*D] contiguous copy
                let oc = self.op(rows * heads * v_dim * c, &[o], &[], &[], &[]);
                self.drop_(o);
                oc
            }
            AttentionImpl::Sdpa | AttentionImpl::Flash => {
                // flash kernel: saves q, k, v, output and logsumexp (fp32, B*H*S)
                // (aten `_scaled_dot_product_flash_attention[_for_cpu]`, derivatives.yaml).
                let (q2, k2, v2) = if self.amp {
                    let q2 = if qs != c {
                        self.cast(q, rows * heads * qk_dim * c)
                    } else {
                        q
                    };
                    let k2 = if ks != c {
                        self.cast(k, rows * kv_heads * qk_dim * c)
                    } else {
                        k
                    };
                    let v2 = if vs != c {
                        self.cast(v, rows * kv_heads * v_dim * c)
                    } else {
                        v
                    };
                    (q2, k2, v2)
                } else {
                    (q, k, v)
                };
                let lse = self.act(b * heads * s * 4, false);
                // A sliding-window layer shorter than the sequence gets an explicit boolean mask
                // (transformers masking_utils `sliding_window_causal_mask`; a full causal layer
                // uses `is_causal` and no mask). SDPA converts it to an additive float mask in
                // the query's dtype per call (`convert_boolean_attn_mask`,
                // aten/src/ATen/native/transformers/attention.cpp) and saves it for backward.
                //
                // Falcon always passes its materialised boolean causal mask to SDPA
                // (models/falcon/modeling_falcon.py: `create_causal_mask(...,
                // allow_is_causal_skip=False)`), decode steps included; the flash-attention-2
                // path gets no 4-D mask. Converted the same way: `where(mask, 0, -inf)` makes a
                // [B, 1, q, kv] tensor in the query's dtype for the duration of the call.
                let falcon_mask = a.eager_style == crate::model::EagerStyle::Falcon
                    && self.w.attention == AttentionImpl::Sdpa;
                let mask = match a.sliding_window {
                    Some(win) if u128::from(win) < kv && s > 1 => {
                        Some(self.act(b * s * kv * c, false))
                    }
                    _ if falcon_mask => Some(self.act(b * s * kv * c, false)),
                    _ => None,
                };
                let o = self.act(rows * heads * v_dim * c, true);
                let mut saved = vec![q2, k2, v2, o, lse];
                saved.extend(mask);
                self.t.record(Node {
                    saved: Ids::of(&saved),
                    inputs: Ids::of(&[q2, k2, v2]),
                    outputs: Ids::of(&[o]),
                    ..Node::default()
                });
                self.drop_(lse);
                if let Some(m) = mask {
                    self.drop_(m);
                }
                for (new, old) in [(q2, q), (k2, k), (v2, v)] {
                    if new != old {
                        self.drop_(new);
                    }
                }
                // The kernel's output takes q's memory layout. A q made by `cat` (partial
                // rotary, MLA) is laid out [B, H, S, D], so `transpose(1, 2).contiguous()` in
                // `sdpa_attention_forward` (integrations/sdpa_attention.py) copies it; a q that
                // is a transposed view of a projection is [B, S, H, D] already and is not copied.
                if self.q_bhsd {
                    let oc = self.op(rows * heads * v_dim * c, &[o], &[], &[], &[]);
                    self.drop_(o);
                    oc
                } else {
                    o
                }
            }
            AttentionImpl::Eager => {
                // eager_attention_forward (models/llama/modeling_llama.py): repeat_kv copies
                // k/v when kv_heads < heads; scores in the compute dtype; softmax in fp32;
                // probabilities cast back and saved by the second matmul; output made contiguous.
                let n_rep = heads / kv_heads.max(1);
                // keys and values span the cache (kv tokens), queries the new rows
                let kv_rows = b * kv;
                let falcon = a.eager_style == crate::model::EagerStyle::Falcon;
                // With a single kv head, `repeat_kv`'s `expand(...).reshape(...)` is a view (the
                // expanded dim merges with the size-1 head dim). Under no_grad the copies matmul
                // then makes for bmm are temporaries of each call. With autograd, matmul's
                // reshape to [B·H, ., .] (aten/src/ATen/native/LinearAlgebra.cpp `matmul`) is
                // still a view when B = 1 — bmm saves the stride-0 views — but must copy when
                // B > 1 (the stride-0 head dim cannot merge with the batch dim), and bmm saves
                // those copies, which costs the same as keeping repeat_kv copies.
                let mqa_view =
                    n_rep > 1 && kv_heads == 1 && !falcon && (self.infer || self.batch == 1);
                let (kr, vr) = if n_rep > 1 && !falcon && !mqa_view {
                    // repeat_kv: expand + reshape copies kept through attention
                    let kr = self.op(kv_rows * heads * qk_dim * ks, &[k], &[], &[], &[]);
                    let vr = self.op(kv_rows * heads * v_dim * vs, &[v], &[], &[], &[]);
                    (kr, vr)
                } else {
                    self.t.retain(k);
                    self.t.retain(v);
                    (k, v)
                };
                let x = b * heads * s * kv;
                // A query that is still a strided view of a fused qkv output (no rotary copy in
                // between, GPT-2) is copied by matmul's reshape to [B*H, S, D].
                let qcopy = a.fused_qkv && a.rotary_dim.is_none();
                let q = if qcopy {
                    self.op(rows * heads * qk_dim * qs, &[q], &[], &[], &[])
                } else {
                    q
                };
                let (qm, km) = if self.amp {
                    (
                        if qs != c {
                            self.cast(q, rows * heads * qk_dim * c)
                        } else {
                            q
                        },
                        if ks != c {
                            self.cast(kr, rows * heads * qk_dim * c)
                        } else {
                            kr
                        },
                    )
                } else {
                    (q, kr)
                };
                if falcon {
                    // `query @ key.transpose(-1, -2)` broadcasts the shared k over the heads:
                    // matmul materialises contiguous copies of q and the expanded k for bmm
                    let copies = rows * heads * qk_dim * c
                        + if n_rep > 1 {
                            kv_rows * heads * qk_dim * c
                        } else {
                            0
                        };
                    self.t.transient(copies + x * c, Category::Activations);
                }
                if mqa_view {
                    self.t
                        .transient(kv_rows * heads * qk_dim * ks + x * c, Category::Activations);
                }
                let scores = self.mul(qm, km, x * c);
                if qm != q {
                    self.drop_(qm);
                }
                if km != kr {
                    self.drop_(km);
                }
                // Falcon scales in place (`attention_scores /= sqrt(d)`) and keeps the scores
                // bound until `softmax(scores + mask)` returns
                let held_scores = if falcon { Some(scores) } else { None };
                let scaled = if falcon {
                    self.retain_id(scores)
                } else {
                    self.op(x * c, &[scores], &[], &[], &[])
                };
                if !falcon {
                    self.drop_(scores);
                }
                let mut cur = scaled;
                if a.logit_softcap.is_some() {
                    // Gemma 2: scores / cap; tanh (saves its output); * cap
                    let d = self.op(x * c, &[cur], &[], &[], &[]);
                    self.drop_(cur);
                    let th = self.op_saving_output(x * c, d);
                    self.drop_(d);
                    let m = self.op(x * c, &[th], &[], &[], &[]);
                    self.drop_(th);
                    cur = m;
                }
                let masked = self.op(x * c, &[cur], &[], &[], &[]);
                self.drop_(cur);

                // softmax saves its output; llama-style upcasts to fp32 and casts back
                let sm = if a.eager_softmax_fp32 { 4 } else { c };
                let f32in = if c != sm {
                    self.cast(masked, x * sm)
                } else {
                    masked
                };
                let probs32 = self.op_saving_output(x * sm, f32in);
                if f32in != masked {
                    self.drop_(f32in);
                }
                let probs = if c != sm {
                    self.cast(probs32, x * c)
                } else {
                    probs32
                };
                self.drop_(masked);
                if let Some(sc) = held_scores {
                    // rebinding `attention_scores` to the softmax frees the scores
                    self.drop_(sc);
                }
                if probs != probs32 {
                    self.drop_(probs32);
                }
                let probs = self.dropout(probs, x * c, c, self.model.dropout.attention);
                if falcon && n_rep > 1 {
                    // `probs @ value` broadcasts the shared v: a transient expanded copy
                    self.t.transient(
                        kv_rows * heads * v_dim * c + rows * heads * v_dim * c,
                        Category::Activations,
                    );
                }
                if mqa_view {
                    self.t.transient(
                        kv_rows * heads * v_dim * vs + rows * heads * v_dim * c,
                        Category::Activations,
                    );
                }
                let vm = if self.amp && vs != c {
                    self.cast(vr, kv_rows * heads * v_dim * c)
                } else {
                    vr
                };
                let o = self.op(
                    rows * heads * v_dim * c,
                    &[probs, vm],
                    &[probs, vm],
                    &[],
                    &[],
                );
                if vm != vr {
                    self.drop_(vm);
                }
                // eager attention returns the probabilities too; the decoder layer binds them to
                // a local (`self_attn_weights` in GPT-2/OPT, `_` in Llama's
                // `hidden_states, _ = self.self_attn(...)`) that lives until the layer returns
                self.layer_locals.push(probs);
                self.drop_(kr);
                self.drop_(vr);
                let oc = self.op(rows * heads * v_dim * c, &[o], &[], &[], &[]);
                self.drop_(o);
                if qcopy {
                    self.drop_(q);
                }
                oc
            }
        };
        self.drop_(q);
        self.drop_(k);
        self.drop_(v);
        let (y, _) = self.linear(out, c, rows, lin(LinearRole::O).unwrap_or(lin_zero()));
        self.drop_(out);
        y
    }

    fn activation(&mut self, x: TensorId, bytes: u128, act: Activation) -> TensorId {
        match act {
            // silu/gelu/relu: one op saving its input (relu saves its output)
            Activation::Silu | Activation::Gelu | Activation::GeluTanh => {
                self.op(bytes, &[x], &[x], &[], &[])
            }
            Activation::Relu => self.op_saving_output(bytes, x),
            Activation::GeluNew => {
                // 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) (transformers activations.py
                // NewGELUActivation): saved x (pow), tanh output, 0.5*x and 1+tanh. Python
                // evaluates the left factor `0.5 * input` first, so it lives through the chain.
                let half = self.op(bytes, &[x], &[], &[], &[]);
                let p3 = self.op(bytes, &[x], &[x], &[], &[]);
                let s1 = self.op(bytes, &[p3], &[], &[], &[]);
                self.drop_(p3);
                let s2 = self.op(bytes, &[x, s1], &[], &[], &[]);
                self.drop_(s1);
                let s3 = self.op(bytes, &[s2], &[], &[], &[]);
                self.drop_(s2);
                let th = self.op_saving_output(bytes, s3);
                self.drop_(s3);
                let one = self.op(bytes, &[th], &[], &[], &[]);
                self.drop_(th);
                let y = self.mul(half, one, bytes);
                self.drop_(half);
                self.drop_(one);
                y
            }
        }
    }

    fn dense_mlp(
        &mut self,
        x: TensorId,
        x_size: u128,
        rows: u128,
        d: &DenseMlp,
        linears: &[(LinearRole, LinearP)],
    ) -> TensorId {
        let c = self.compute_size;
        let i = u128::from(d.intermediate);
        let lin = |role: LinearRole| linears.iter().find(|(r, _)| *r == role).map(|(_, l)| *l);
        let hidden_act = if d.gated {
            let (g, u) = if let Some(gu) = lin(LinearRole::GateUp) {
                let (y, _) = self.linear(x, x_size, rows, gu);
                self.t.retain(y);
                (y, y)
            } else {
                let (g, _) =
                    self.linear(x, x_size, rows, lin(LinearRole::Gate).unwrap_or(lin_zero()));
                let (u, _) =
                    self.linear(x, x_size, rows, lin(LinearRole::Up).unwrap_or(lin_zero()));
                (g, u)
            };
            let a = self.activation(g, rows * i * c, d.act);
            self.drop_(g);
            let m = self.mul(a, u, rows * i * c);
            self.drop_(a);
            self.drop_(u);
            m
        } else {
            let (u, _) = self.linear(x, x_size, rows, lin(LinearRole::Up).unwrap_or(lin_zero()));
            let a = self.activation(u, rows * i * c, d.act);
            self.drop_(u);
            self.dropout(a, rows * i * c, c, self.model.dropout.activation)
        };
        let (y, _) = self.linear(
            hidden_act,
            c,
            rows,
            lin(LinearRole::Down).unwrap_or(lin_zero()),
        );
        self.drop_(hidden_act);
        y
    }

    /// Mixture of experts, transformers 5 (`MixtralSparseMoeBlock` with the default
    /// `experts_implementation="grouped_mm"`, `integrations/moe.py` `grouped_mm_experts_forward`):
    /// router logits, fp32 softmax, top-k; the `tokens * top_k` (token, expert) rows are gathered
    /// in expert order, run through grouped matmuls (gate_up, activation * up, down), weighted,
    /// un-permuted and summed over k. Memory does not depend on the routing.
    fn moe_mlp(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        moe: &crate::model::MoeMlp,
    ) -> TensorId {
        let rows = self.tokens;
        let c = self.compute_size;
        let h = self.hidden;
        let e = u128::from(moe.num_experts);
        let k = u128::from(moe.top_k);
        let router = lp.router.unwrap_or(lin_zero());
        let topw = if moe.router_fp32 {
            // DeepSeek-V3: fp32 copies of the input and the router weight, fp32 logits,
            // sigmoid scores (saved), biased scores for the group top-k, fp32 routing weights
            let xf = self.cast(x, rows * h * 4);
            let wf = self.t.alloc(e * h * 4, Category::Activations, false);
            let logits = self.op(rows * e * 4, &[xf], &[xf, wf], &[router.w.id], &[]);
            self.drop_(wf);
            self.drop_(xf);
            let scores = self.op(rows * e * 4, &[logits], &[], &[], &[]);
            self.drop_(logits);
            self.t.transient(rows * e * 4 * 2, Category::Activations);
            let topw = self.op(rows * k * 4, &[scores], &[scores], &[], &[]);
            self.drop_(scores);
            topw
        } else {
            // softmax(router_logits, dtype=float) saved; top-k weights cast to the hidden dtype
            let (logits, _) = self.linear(x, x_size, rows, router);
            let probs = self.op(rows * e * 4, &[logits], &[], &[], &[]);
            self.drop_(logits);
            let topw = self.op(rows * k * 4, &[probs], &[probs], &[], &[]);
            self.drop_(probs);
            topw
        };
        // routing weights fp32 make the weighted expert outputs fp32 (type promotion)
        let ws = if moe.router_fp32 { 4 } else { c };
        // experts: gathered rows (tokens*k), gate/up, act, mul, down, weighted
        let i = u128::from(moe.expert.intermediate);
        let ins = if moe.expert.gated { 2 } else { 1 };
        let ek = rows * k;
        if self.infer && self.seq == 1 && self.moe_decode_batched {
            return self.moe_batched_decode(x, x_size, lp, moe, topw);
        }
        let gathered = self.op(ek * h * x_size, &[x], &[], &[], &[]);
        // a grouped matmul saves its input only for the (fused) expert weight's gradient
        let experts_trainable = self.trainable(&lp.experts[0]);
        let saved_g: &[TensorId] = if experts_trainable { &[gathered] } else { &[] };
        let gu = self.op(
            ek * ins * i * c,
            &[gathered],
            saved_g,
            &[lp.experts[0].id],
            &[],
        );
        let a = self.activation(gu, ek * i * c, moe.expert.act);
        let m = if moe.expert.gated {
            self.mul(a, gu, ek * i * c)
        } else {
            a
        };
        if moe.expert.gated {
            self.drop_(a);
        }
        self.drop_(gu);
        let saved_m: &[TensorId] = if experts_trainable { &[m] } else { &[] };
        let down = self.op(ek * h * c, &[m], saved_m, &[lp.experts[1].id], &[]);
        self.drop_(m);
        let weighted = self.mul(down, topw, ek * h * ws);
        self.drop_(topw);
        // `weighted_out[inv_perm]` (a gather, new tensor), then `.view(T, k, H).sum(1)`,
        // then `.to(hidden_states.dtype)`
        let unpermuted = self.op(ek * h * ws, &[weighted], &[], &[], &[]);
        self.drop_(weighted);
        let summed = self.op(rows * h * ws, &[unpermuted], &[], &[], &[]);
        self.drop_(unpermuted);
        let out = if ws != c {
            let y = self.cast(summed, rows * h * c);
            self.drop_(summed);
            y
        } else {
            summed
        };
        // `selected_hidden_states_g` and the last `proj_out` stay bound until the experts
        // function returns (integrations/moe.py `grouped_mm_experts_forward`)
        self.drop_(gathered);
        self.drop_(down);
        self.shared_experts(x, x_size, lp, moe, out)
    }

    /// MLA at inference, transformers 5.23 `DeepseekV3Attention.forward`: the cache stores the
    /// normalised latent `kv_nope` and the rotated `k_rot` (one "head" of kv_lora_rank + rope
    /// dims); every step `expand_kv` runs `kv_b_proj` over all cached tokens and builds
    /// per-head keys in a new tensor, values as a view of the projection.
    fn mla_infer(
        &mut self,
        a: &Attention,
        lp: &LayerParams,
        q: TensorId,
        kva: TensorId,
        np: (P, Option<P>),
    ) -> TensorId {
        let AttentionKind::Mla {
            num_heads,
            kv_lora_rank,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            ..
        } = a.kind
        else {
            return q;
        };
        let lin = |role: LinearRole| lp.linears.iter().find(|(r, _)| *r == role).map(|(_, l)| *l);
        let (b, rows, c) = (self.batch, self.tokens, self.compute_size);
        let heads = u128::from(num_heads);
        let (nope, ropd, vd, kvr) = (
            u128::from(qk_nope_head_dim),
            u128::from(qk_rope_head_dim),
            u128::from(v_head_dim),
            u128::from(kv_lora_rank),
        );
        let norm = Norm {
            kind: NormKind::RmsNorm,
            dim: kv_lora_rank,
            bias: false,
        };
        let (kvn, _) = self.norm(kva, c, rows, &norm, np);
        let (kr, _) = self.rope(kva, c, 1, ropd, ropd);
        self.drop_(kva);
        let layer = self.cur_layer;
        let prev = self.cache.get_mut(layer).and_then(Option::take);
        let total = prev.map_or(0, |(_, _, n)| n) + self.seq;
        let kc = self.op(b * total * kvr * c, &[kvn], &[], &[], &[]);
        let rc = self.op(b * total * ropd * c, &[kr], &[], &[], &[]);
        if let Some((pk, pr, _)) = prev {
            self.drop_(pk);
            self.drop_(pr);
        }
        self.drop_(kvn);
        self.drop_(kr);
        if let Some(slot) = self.cache.get_mut(layer) {
            *slot = Some((kc, rc, total));
        }
        self.kv_len = total;
        let (qr, _) = self.rope(q, c, heads, ropd, ropd);
        let qf = self.op(rows * heads * (nope + ropd) * c, &[q, qr], &[], &[], &[]);
        // `q_pass` (a view of the q_b_proj output) and the rotated `q_rot` stay bound as locals
        // of DeepseekV3Attention.forward until it returns (modeling_deepseek_v3.py)
        self.attn_locals.push(q);
        self.attn_locals.push(qr);
        // expand_kv over every cached token
        let kv_rows = b * total;
        let (kvb, _) = self.linear(kc, c, kv_rows, lin(LinearRole::KvB).unwrap_or(lin_zero()));
        let kf = self.op(
            kv_rows * heads * (nope + ropd) * c,
            &[kvb, rc],
            &[],
            &[],
            &[],
        );
        self.q_bhsd = true;
        self.attention_core(qf, c, kf, c, kvb, c, heads, heads, nope + ropd, vd, a, lp)
    }

    /// MoE experts during decode: `generate` on a GPU switches `grouped_mm` to `batched_mm`
    /// for the decode loop (generation/utils.py `_optimize_model_for_decode`), which gathers a
    /// copy of each selected expert's weights per (token, expert) pair
    /// (integrations/moe.py `batched_mm_experts_forward`). Python locals keep
    /// `selected_hidden_states` and the last `proj_out` until the function returns; the down
    /// weights are gathered before `selected_weights` is rebound, so both copies coexist.
    fn moe_batched_decode(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        moe: &crate::model::MoeMlp,
        topw: TensorId,
    ) -> TensorId {
        let rows = self.tokens;
        let c = self.compute_size;
        let h = self.hidden;
        let k = u128::from(moe.top_k);
        let i = u128::from(moe.expert.intermediate);
        let ins = if moe.expert.gated { 2 } else { 1 };
        let ek = rows * k;
        let ws = if moe.router_fp32 { 4 } else { c };
        let sel_h = self.op(ek * h * x_size, &[x], &[], &[], &[]);
        let w_gu = self.act(ek * ins * i * h * c, false);
        let gu = self.op(
            ek * ins * i * c,
            &[sel_h, w_gu],
            &[],
            &[lp.experts[0].id],
            &[],
        );
        let a = self.activation(gu, ek * i * c, moe.expert.act);
        let m = if moe.expert.gated {
            self.mul(a, gu, ek * i * c)
        } else {
            self.retain_id(a)
        };
        self.drop_(a);
        self.drop_(gu);
        let w_down = self.act(ek * i * h * c, false);
        self.drop_(w_gu);
        let down = self.op(ek * h * c, &[m, w_down], &[], &[lp.experts[1].id], &[]);
        self.drop_(m);
        let weighted = self.mul(down, topw, ek * h * ws);
        self.drop_(topw);
        let summed = self.op(rows * h * ws, &[weighted], &[], &[], &[]);
        self.drop_(weighted);
        let out = if ws != c {
            let y = self.cast(summed, rows * h * c);
            self.drop_(summed);
            y
        } else {
            summed
        };
        for t in [sel_h, w_down, down] {
            self.drop_(t);
        }
        self.shared_experts(x, x_size, lp, moe, out)
    }

    /// Adds the always-on shared expert (gated in Qwen2-MoE) to the routed output.
    fn shared_experts(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        moe: &crate::model::MoeMlp,
        out: TensorId,
    ) -> TensorId {
        let Some(s) = &moe.shared else { return out };
        let rows = self.tokens;
        let c = self.compute_size;
        let h = self.hidden;
        let so = self.dense_mlp(x, x_size, rows, s, &lp.shared.clone());
        let so = if let Some(g) = lp.shared_gate {
            let (gl, _) = self.linear(x, x_size, rows, g);
            let sg = self.op(rows * c, &[gl], &[], &[], &[]);
            self.drop_(gl);
            let y = self.mul(so, sg, rows * h * c);
            self.drop_(so);
            self.drop_(sg);
            y
        } else {
            so
        };
        let sum = self.op(rows * h * c, &[out, so], &[], &[], &[]);
        self.drop_(out);
        self.drop_(so);
        sum
    }

    /// One decoder layer; returns its output. `x` keeps its reference (the caller drops it).
    fn layer(&mut self, idx: usize, x: TensorId, x_size: u128, ckpt: bool) -> TensorId {
        // borrow the layer's parameter table without cloning it
        let lp = std::mem::take(&mut self.layers[idx]);
        let y = self.layer_with(idx, &lp, x, x_size, ckpt);
        self.layers[idx] = lp;
        let locals = std::mem::take(&mut self.layer_locals);
        if self.model.layers[idx].attention.eager_style == crate::model::EagerStyle::Falcon {
            // FalconModel's loop binds the block's `(output, attn_weights)` to `outputs` until
            // the next block returns (models/falcon/modeling_falcon.py FalconModel.forward)
            for t in std::mem::replace(&mut self.block_outputs, locals) {
                self.drop_(t);
            }
        } else {
            for t in locals {
                self.drop_(t);
            }
        }
        y
    }

    fn layer_with(
        &mut self,
        idx: usize,
        lp: &LayerParams,
        x: TensorId,
        x_size: u128,
        ckpt: bool,
    ) -> TensorId {
        self.cur_layer = idx;
        let spec = self.model.layers[idx];
        let rows = self.tokens;
        let h = self.hidden;
        let p_drop = self.model.dropout.residual;
        let add = |b: &mut Self, a: TensorId, bb: TensorId, size: u128| {
            b.op(rows * h * size, &[a, bb], &[], &[], &[])
        };
        let post = |b: &mut Self,
                    y: TensorId,
                    ys: u128,
                    i: usize,
                    spec_n: Option<Norm>|
         -> (TensorId, u128) {
            match (spec_n, lp.norms[i]) {
                (Some(n), Some(p)) => {
                    let (z, zs) = b.norm(y, ys, rows, &n, p);
                    b.drop_(y);
                    (z, zs)
                }
                _ => (y, ys),
            }
        };
        // residual stream dtype: parameters' dtype (fp32 under autocast: fp32 + bf16 promotes)
        let rs = if self.amp { 4 } else { x_size };
        match spec.residual {
            Residual::Sequential | Residual::PostNorm => {
                let pre = spec.residual == Residual::Sequential;
                let (n1, n1s) = match (pre, spec.attn_norm, lp.norms[0]) {
                    (true, Some(n), Some(p)) => self.norm(x, x_size, rows, &n, p),
                    _ => {
                        self.t.retain(x);
                        (x, x_size)
                    }
                };
                let a = self.attention(n1, n1s, &spec.attention, lp, ckpt);
                self.drop_(n1);
                let (a, _) = post(self, a, self.compute_size, 1, spec.attn_post_norm);
                let a = self.dropout(a, rows * h * self.compute_size, self.compute_size, p_drop);
                let mut hdn = add(self, x, a, rs);
                let kept_attn = if spec.attn_output_outlives_mlp {
                    Some(a)
                } else {
                    None
                };
                if kept_attn.is_none() {
                    self.drop_(a);
                }
                if !pre {
                    (hdn, _) = post(self, hdn, rs, 0, spec.attn_norm);
                }
                let (n2, n2s) = match (pre, spec.mlp_norm, lp.norms[2]) {
                    (true, Some(n), Some(p)) => self.norm(hdn, rs, rows, &n, p),
                    _ => {
                        self.t.retain(hdn);
                        (hdn, rs)
                    }
                };
                let m = match &spec.mlp {
                    Mlp::Dense(d) => self.dense_mlp(n2, n2s, rows, d, &lp.linears),
                    Mlp::Moe(moe) => self.moe_mlp(n2, n2s, lp, moe),
                };
                self.drop_(n2);
                let (m, _) = post(self, m, self.compute_size, 3, spec.mlp_post_norm);
                let m = self.dropout(m, rows * h * self.compute_size, self.compute_size, p_drop);
                let mut out = add(self, hdn, m, rs);
                self.drop_(m);
                self.drop_(hdn);
                if let Some(a) = kept_attn {
                    self.drop_(a);
                }
                if !pre {
                    (out, _) = post(self, out, rs, 2, spec.mlp_norm);
                }
                out
            }
            Residual::Parallel => {
                let (n1, n1s) = match (spec.attn_norm, lp.norms[0]) {
                    (Some(n), Some(p)) => self.norm(x, x_size, rows, &n, p),
                    _ => {
                        self.t.retain(x);
                        (x, x_size)
                    }
                };
                let (n2, n2s) = match (spec.mlp_norm, lp.norms[2]) {
                    (Some(n), Some(p)) => self.norm(x, x_size, rows, &n, p),
                    _ => {
                        self.t.retain(n1);
                        (n1, n1s)
                    }
                };
                let a = self.attention(n1, n1s, &spec.attention, lp, ckpt);
                self.drop_(n1);
                let m = match &spec.mlp {
                    Mlp::Dense(d) => self.dense_mlp(n2, n2s, rows, d, &lp.linears),
                    Mlp::Moe(moe) => self.moe_mlp(n2, n2s, lp, moe),
                };
                self.drop_(n2);
                let am = add(self, m, a, self.compute_size);
                self.drop_(a);
                self.drop_(m);
                let am = self.dropout(am, rows * h * self.compute_size, self.compute_size, p_drop);
                let out = add(self, am, x, rs);
                self.drop_(am);
                out
            }
        }
    }

    // ------------------------------------------------------------------ the step

    fn embeddings(&mut self) -> (TensorId, u128) {
        let rows = self.tokens;
        let e = self.model.embeddings;
        let s = self.param_size;
        let dim = u128::from(e.dim);
        let h = self.hidden;
        // embedding backward: dense grad_weight (embedding_dense_backward)
        let emb = self.op(rows * dim * s, &[], &[], &[self.embed.id], &[]);
        // peft's PeftModel.__init__ calls `enable_input_require_grads()` when the model already
        // has gradient checkpointing on (peft_model.py `prepare_model_for_gradient_checkpointing`):
        // the frozen embedding's output becomes a leaf that requires grad, so layer 0 saves its
        // activations and the leaf's gradient lives until the graph is freed after backward.
        if self.w.lora.is_some() && self.w.checkpointing && !self.t.requires_grad(emb) {
            self.t.set_requires_grad(emb, true);
            self.t.record(Node {
                outputs: Ids::of(&[emb]),
                ..Node::default()
            });
        }
        // `inputs_embeds` stays referenced by the model's forward until it returns
        self.t.retain(emb);
        self.out_refs.push(emb);
        let mut x = emb;
        if let Some((pin, _)) = self.projections {
            // OPT project_in
            let (y, _) = self.linear(x, s, rows, pin);
            self.drop_(x);
            x = y;
        }
        if let Some(pos) = self.pos_embed {
            let pe = self.op(self.seq * h * s, &[], &[], &[pos.id], &[]);
            let y = self.op(rows * h * s, &[x, pe], &[], &[], &[]);
            // `position_embeds` (gpt2) / `pos_embeds` (opt) is a local of the model's forward
            self.out_refs.push(pe);
            self.drop_(x);
            x = y;
        }
        if e.scaled {
            // Gemma: hidden_states * normalizer (a new tensor)
            let y = self.op(rows * h * s, &[x], &[], &[], &[]);
            self.drop_(x);
            x = y;
        }
        // dropout consumes x's reference and returns the tensor to continue with
        x = self.dropout(x, rows * h * s, s, self.model.dropout.embed);
        (x, s)
    }

    fn forward_and_loss(&mut self) {
        let rows = self.tokens;
        let ckpt = self.w.checkpointing;
        self.t.set_phase(Phase::Forward);
        self.unit_pre_forward(0);
        let (mut x, xs) = self.embeddings();
        // rotary cos/sin tables, [B, S, rotary_dim] in the compute dtype (fp32 under autocast)
        if let Some(l) = self.model.layers.first() {
            let dim = match l.attention.kind {
                AttentionKind::Standard { .. } => l.attention.rotary_dim.map_or(0, u128::from),
                AttentionKind::Mla {
                    qk_rope_head_dim, ..
                } => u128::from(qk_rope_head_dim),
            };
            if dim > 0 {
                let sz = if self.amp { 4 } else { self.param_size };
                let cos = self.act(rows * dim * sz, false);
                let sin = self.act(rows * dim * sz, false);
                self.rope_tables = Some((cos, sin));
                self.out_refs.push(cos);
                self.out_refs.push(sin);
            }
        }
        let mut xsize = xs;
        let mask = self.causal_mask(self.seq, self.seq);
        for i in 0..self.model.layers.len() {
            self.mark(Marker::PostBackward(i + 1));
            self.unit_pre_forward(i + 1);
            let y = if ckpt {
                self.t.recording = false;
                let y = self.layer(i, x, xsize, true);
                self.t.recording = true;
                // the checkpoint keeps the layer's inputs for the recompute: the hidden state
                // and the rotary cos/sin passed to every layer (torch/utils/checkpoint.py)
                let mut kept = vec![x];
                if let Some((cos, sin)) = self.rope_tables {
                    kept.extend([cos, sin]);
                }
                self.t.record(Node {
                    saved: Ids::of(&kept),
                    inputs: Ids::of(&[]),
                    outputs: Ids::of(&[y]),
                    recompute: Some(i),
                    ..Node::default()
                });
                y
            } else {
                self.layer(i, x, xsize, false)
            };
            self.unit_post_forward(i + 1);
            self.mark(Marker::PreBackward(i + 1));
            self.drop_(x);
            x = y;
            xsize = if self.amp { 4 } else { xsize };
        }
        let (fx, fs) = self.body_tail(x, xsize, rows, mask);
        // the loss phase starts at the LM head (the harness's lm_head forward pre-hook)
        self.t.set_phase(Phase::Loss);
        let v = u128::from(self.model.embeddings.vocab_size);
        let head = self.lm_head_linear();
        let c = self.compute_size;
        let (mut logits, _) = self.linear(fx, fs, rows, head);
        self.drop_(fx);
        if self.model.head.logit_softcap.is_some() {
            // Gemma 2: logits / cap; tanh; * cap (modeling_gemma2.py)
            let d = self.op(rows * v * c, &[logits], &[], &[], &[]);
            self.drop_(logits);
            let th = self.op_saving_output(rows * v * c, d);
            self.drop_(d);
            logits = self.op(rows * v * c, &[th], &[], &[], &[]);
            self.drop_(th);
        }
        self.t.retag(logits, Category::LossBuffers);
        // ForCausalLMLoss (transformers loss/loss_utils.py): logits.float(), then
        // cross_entropy = log_softmax (fp32 output saved) + nll_loss.
        let lf = if c != 4 {
            self.cast(logits, rows * v * 4)
        } else {
            logits
        };
        self.t.retag(lf, Category::LossBuffers);
        let ls = self.act(rows * v * 4, true);
        self.t.retag(ls, Category::LossBuffers);
        self.t.record(Node {
            saved: Ids::of(&[ls]),
            inputs: Ids::of(&[lf]),
            outputs: Ids::of(&[ls]),
            ..Node::default()
        });
        if lf != logits {
            self.drop_(lf);
        }
        let loss = self.act(4, true);
        // nll_loss_backward materialises a full fp32 [tokens, vocab] gradient
        self.t.record(Node {
            inputs: Ids::of(&[ls]),
            outputs: Ids::of(&[loss]),
            ..Node::default()
        });
        self.drop_(ls);
        // the training loop keeps only the loss: outputs (logits, cache) are dropped
        self.drop_(logits);
        for r in std::mem::take(&mut self.out_refs) {
            self.drop_(r);
        }
        for r in std::mem::take(&mut self.autocast_cache) {
            self.drop_(r);
        }
        // the model's forward (the root unit's) returns here, after the loss
        self.unit_post_forward(0);
        self.t.set_phase(Phase::Backward);
        self.t.seed_grad(loss);
        self.unit_pre_backward(0);
        self.backward();
        self.finish_backward();
        self.drop_(loss);
    }

    fn backward(&mut self) {
        while let Some(node) = self.t.tape.pop() {
            if let Some(m) = node.marker {
                self.on_marker(m);
                continue;
            }
            if let Some(i) = node.recompute {
                // non-reentrant checkpoint: the first unpack re-runs the layer's forward with
                // saving on (torch/utils/checkpoint.py `_checkpoint_hook`), then backward goes on.
                let x = node.saved.as_slice()[0];
                let out = node.outputs.as_slice()[0];
                self.t.tape.push(Node {
                    saved: node.saved,
                    ..Node::default()
                });
                let xsize = self.t.bytes(x) / (self.tokens * self.hidden).max(1);
                let y = self.layer(i, x, xsize, true);
                // the recompute runs in its own autocast region (checkpoint.py re-enters the
                // saved autocast state); leaving it clears autocast's weight-cast cache
                // (`torch.clear_autocast_cache` when the nesting drops to 0)
                for r in std::mem::take(&mut self.autocast_cache) {
                    self.drop_(r);
                }
                self.t.move_grad(out, y);
                self.drop_(y);
                continue;
            }
            self.t.backward_node(&node);
            self.after_backward_node(&node);
        }
    }

    fn optimizer_step(&mut self) {
        self.t.set_phase(Phase::Optimizer);
        if let Some(temps) = self.sharded_optimizer_temps() {
            self.t.transient(temps, Category::OptimizerTemporaries);
            return;
        }
        let sizes: Vec<u128> = self.trainable.iter().map(|p| self.t.bytes(p.id)).collect();
        let total: u128 = sizes.iter().sum();
        let largest = sizes.iter().copied().max().unwrap_or(0);
        match self.w.optimizer {
            // torch/optim/adam.py `_multi_tensor_adam`: exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)
            // is one parameter-sized list alive at once; everything else is in place.
            Optimizer::Adamw => self.t.transient(total, Category::OptimizerTemporaries),
            // `_single_tensor_adam`: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            // allocates sqrt and the division for one parameter at a time.
            Optimizer::AdamwForloop => self
                .t
                .transient(2 * largest, Category::OptimizerTemporaries),
            // fused kernel / in-place foreach updates / bitsandbytes kernels: no temporaries
            Optimizer::AdamwFused
            | Optimizer::Sgd
            | Optimizer::SgdMomentum
            | Optimizer::Adamw8bit => {}
            // lion-pytorch `update_fn`: exp_avg.clone().mul_(b1).add(grad, ...) = two tensors per param
            Optimizer::Lion => self
                .t
                .transient(2 * largest, Category::OptimizerTemporaries),
            // torch/optim/_adafactor.py `_multi_tensor_adafactor`: `var_estimates = [row_var @ col_var]`
            // (or `variance.clone()` for vectors) is one parameter-sized list, updated in place
            Optimizer::Adafactor => self.t.transient(total, Category::OptimizerTemporaries),
        }
    }

    /// Optimizer states that exist from the second step on.
    fn optimizer_states(&mut self) {
        if let Some(bytes) = self.sharded_optimizer_states() {
            if bytes > 0 {
                self.t.alloc(bytes, Category::OptimizerStates, false);
            }
            return;
        }
        let mut bytes: u128 = 0;
        for p in &self.trainable {
            let b = self.t.bytes(p.id);
            let numel = p.numel;
            bytes += match self.w.optimizer {
                Optimizer::Adamw | Optimizer::AdamwFused | Optimizer::AdamwForloop => 2 * b,
                // bitsandbytes optim/optimizer.py Optimizer2State.init_state: uint8 states with one
                // fp32 absmax per 256-element block; tensors under min_8bit_size=4096 keep fp32 states
                Optimizer::Adamw8bit => {
                    if numel < 4096 {
                        2 * numel * 4
                    } else {
                        2 * (numel + numel.div_ceil(256) * 4)
                    }
                }
                Optimizer::Sgd => 0,
                Optimizer::SgdMomentum | Optimizer::Lion => b,
                // torch/optim/_adafactor.py: matrices keep row_var [.., rows, 1] and
                // col_var [.., 1, cols]; vectors keep a full `variance`
                Optimizer::Adafactor => {
                    let elem = b / numel.max(1);
                    if p.rows == 0 {
                        b
                    } else {
                        let lead = numel / (p.rows * p.cols).max(1);
                        elem * lead * (p.rows + p.cols)
                    }
                }
            };
        }
        if bytes > 0 {
            self.t.alloc(bytes, Category::OptimizerStates, false);
        }
    }

    /// The model-level causal mask, built once per forward by transformers' `create_causal_mask`
    /// and held by the model's forward until it returns. Eager attention gets an additive mask
    /// `[B, 1, q, kv]` in the compute dtype (masking_utils.py `eager_mask`). SDPA with a plain
    /// causal mask needs none (`is_causal`), except in Falcon, which asks for it materialised
    /// (`allow_is_causal_skip=False`, models/falcon/modeling_falcon.py): `sdpa_mask` builds a
    /// boolean `[1, 1, q, kv]` by broadcasting the index comparison and only `expand`s it to the
    /// batch (a view), since no padding mask is passed.
    fn causal_mask(&mut self, q_len: u128, kv_len: u128) -> Option<TensorId> {
        match self.w.attention {
            AttentionImpl::Eager => {
                // Models that mix sliding-window and full layers (Gemma 2/3) build one mask per
                // layer type (`causal_mask_mapping` in modeling_gemma2.py / modeling_gemma3.py).
                let sliding = |l: &crate::model::LayerSpec| {
                    l.attention
                        .sliding_window
                        .is_some_and(|w| u128::from(w) < kv_len)
                };
                let masks = if q_len > 1
                    && self.model.layers.iter().any(sliding)
                    && self.model.layers.iter().any(|l| !sliding(l))
                {
                    2
                } else {
                    1
                };
                Some(self.act(
                    masks * self.batch * q_len * kv_len * self.compute_size,
                    false,
                ))
            }
            AttentionImpl::Sdpa
                if self.model.layers.iter().any(|l| {
                    l.attention.eager_style == crate::model::EagerStyle::Falcon
                        || (q_len > 1
                            && l.attention
                                .sliding_window
                                .is_some_and(|w| u128::from(w) < kv_len))
                }) =>
            {
                Some(self.act(q_len * kv_len, false))
            }
            _ => None,
        }
    }

    /// One inference forward of `q_len` new tokens per sequence under `torch.no_grad()`
    /// (nothing is saved), with logits for the last position only (`logits_to_keep=1`) and
    /// `generate`'s fp32 copy of them (generation/utils.py `_sample`:
    /// `outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)`). Returns the logits,
    /// which the model output keeps alive until the next forward returns.
    fn infer_forward(&mut self, q_len: u128) -> TensorId {
        self.seq = q_len;
        self.tokens = self.batch * q_len;
        let rows = self.tokens;
        let (mut x, xs) = self.embeddings();
        if let Some(l) = self.model.layers.first() {
            let dim = match l.attention.kind {
                AttentionKind::Standard { .. } => l.attention.rotary_dim.map_or(0, u128::from),
                AttentionKind::Mla {
                    qk_rope_head_dim, ..
                } => u128::from(qk_rope_head_dim),
            };
            if dim > 0 {
                let cos = self.act(rows * dim * self.param_size, false);
                let sin = self.act(rows * dim * self.param_size, false);
                self.rope_tables = Some((cos, sin));
                self.out_refs.push(cos);
                self.out_refs.push(sin);
            }
        }
        let kv_total = q_len
            + self
                .cache
                .iter()
                .flatten()
                .map(|(_, _, n)| *n)
                .max()
                .unwrap_or(0);
        let mask = self.causal_mask(q_len, kv_total);
        for i in 0..self.model.layers.len() {
            let y = self.layer(i, x, xs, false);
            self.drop_(x);
            x = y;
        }
        let (fx, fs) = self.body_tail(x, xs, rows, mask);
        // logits_to_keep=1: the LM head sees the last position of each sequence
        let v = u128::from(self.model.embeddings.vocab_size);
        let head = self.lm_head_linear();
        let c = self.compute_size;
        let (mut logits, _) = self.linear(fx, fs, self.batch, head);
        self.drop_(fx);
        if self.model.head.logit_softcap.is_some() {
            let d = self.op(self.batch * v * c, &[logits], &[], &[], &[]);
            self.drop_(logits);
            let th = self.op(self.batch * v * c, &[d], &[], &[], &[]);
            self.drop_(d);
            logits = self.op(self.batch * v * c, &[th], &[], &[], &[]);
            self.drop_(th);
        }
        self.t.retag(logits, Category::LossBuffers);
        for r in std::mem::take(&mut self.out_refs) {
            self.drop_(r);
        }
        // generate (generation/utils.py `_sample`): `next_token_logits = outputs.logits[:, -1, :]
        // .to(copy=True, dtype=torch.float32)` stays bound until the next step replaces it; the
        // model output is deleted before the next forward
        for t in std::mem::take(&mut self.block_outputs) {
            self.drop_(t);
        }
        let f32 = self
            .t
            .alloc(self.batch * v * 4, Category::LossBuffers, false);
        self.drop_(logits);
        f32
    }

    /// `generate`'s `input_ids` and all-ones attention mask (int64, rebuilt with `torch.cat`
    /// each step, the old ones freed after the new exist).
    fn grow_ids(&mut self, ids: Option<TensorId>, len: u128) -> TensorId {
        let new = self
            .t
            .alloc(2 * self.batch * len * 8, Category::Activations, false);
        if let Some(old) = ids {
            self.drop_(old);
        }
        new
    }

    /// Prefill of `prompt` tokens, then `new_tokens - 1` decode steps (`generate` makes its
    /// first new token from the prefill). Decode steps grow every full-attention cache by one
    /// token, so the last step dominates all earlier ones; the first decode step is where
    /// sliding-window caches shrink from the prompt's concatenation to the window. Those two
    /// steps are simulated exactly and the caches in between are jumped over.
    pub(crate) fn run_inference(&mut self, prompt: u128, new_tokens: u128) -> u128 {
        self.infer = true;
        // torch.no_grad(): autograd records nothing, so nothing is saved
        self.t.recording = false;
        self.build_params();
        self.cache = vec![None; self.model.layers.len()];
        self.t.reset_peak();
        self.t.set_phase(Phase::Prefill);
        let mut ids = self.grow_ids(None, prompt);
        let mut logits = self.infer_forward(prompt);
        let prefill_peak = self.t.peak();
        self.t.set_phase(Phase::Decode);
        let steps = new_tokens.saturating_sub(1);
        for step in 1..=steps {
            if step == 2 && steps > 2 {
                // jump: each full-attention layer cache now holds prompt + steps - 1 tokens
                let before_last = prompt + steps - 1;
                for i in 0..self.cache.len() {
                    if let Some((k, v, kept)) = self.cache[i] {
                        let full = self.model.layers[i].attention.sliding_window.is_none();
                        if full && kept < before_last {
                            let (kb, vb) = (self.t.bytes(k), self.t.bytes(v));
                            let nk = self.t.alloc(
                                kb / kept.max(1) * before_last,
                                Category::Activations,
                                false,
                            );
                            let nv = self.t.alloc(
                                vb / kept.max(1) * before_last,
                                Category::Activations,
                                false,
                            );
                            self.drop_(k);
                            self.drop_(v);
                            self.cache[i] = Some((nk, nv, before_last));
                        }
                    }
                }
            }
            if step >= 2 && step < steps {
                continue;
            }
            let len = prompt + if step == steps { steps } else { step };
            ids = self.grow_ids(Some(ids), len);
            let next = self.infer_forward(1);
            // the previous step's fp32 logits are rebound to the new ones
            self.drop_(logits);
            logits = next;
        }
        self.drop_(logits);
        self.drop_(ids);
        prefill_peak
    }

    /// Bytes held by the KV cache now.
    pub(crate) fn kv_cache_bytes(&self) -> u128 {
        self.cache
            .iter()
            .flatten()
            .map(|(k, v, _)| self.t.bytes(*k) + self.t.bytes(*v))
            .sum()
    }

    pub(crate) fn run(&mut self) {
        self.build_params();
        self.shard_setup();
        self.optimizer_states();
        self.t.reset_peak();
        let micro = self.w.grad_accum.min(2);
        for _ in 0..micro {
            self.forward_and_loss();
        }
        self.optimizer_step();
        self.t.zero_grad();
        self.shard_zero_grad();
    }
}

/// NF4 block size (bitsandbytes `quantize_4bit` default blocksize=64).
const NF4_BLOCK: u128 = 64;

/// Bytes of one NF4 weight with double quantisation (bitsandbytes functional.py `quantize_4bit`
/// with `compress_statistics=True`): packed nibbles, one uint8 absmax per 64-block, those
/// absmax quantised in blocks of 256 with an fp32 absmax each, an fp32 offset, and the
/// 16-entry fp32 NF4 code of the QuantState.
fn nf4_bytes(numel: u128) -> u128 {
    let blocks = numel.div_ceil(NF4_BLOCK);
    numel.div_ceil(2) + blocks + blocks.div_ceil(256) * 4 + 4 + 16 * 4
}

fn lin_zero() -> LinearP {
    LinearP {
        nf4: false,
        quantized: false,
        w: P {
            id: 0,
            numel: 0,
            rows: 0,
            cols: 1,
        },
        b: None,
        lora: None,
        in_f: 0,
        out_f: 0,
    }
}
