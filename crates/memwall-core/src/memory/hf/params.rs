//! Parameter construction: every weight, bias, norm, adapter and expert stack the model
//! allocates, in its stored dtype or inference format, filed under its sharding unit.

use super::{mul, Builder, LayerParams, LinearP, P};
use crate::model::{AttentionKind, DenseMlp, LayerSpec, LinearRole, Mlp, ModelDesc, Norm};
use crate::workload::{Lora, WeightFormat};

fn is_lora_target(model: &ModelDesc, lora: Option<&Lora>, role: LinearRole) -> bool {
    let Some(l) = lora else { return false };
    model
        .linear_names
        .iter()
        .any(|(r, name)| *r == role && l.targets.iter().any(|t| t == name))
}

impl Builder<'_> {
    pub(super) fn new_param(&mut self, numel: u128, trainable_base: bool) -> P {
        self.new_matrix(numel, 0, 1, trainable_base)
    }

    /// A parameter of shape [.., rows, cols] (`rows == 0` for a vector).
    pub(super) fn new_matrix(
        &mut self,
        numel: u128,
        rows: u128,
        cols: u128,
        trainable_base: bool,
    ) -> P {
        let trainable = trainable_base && self.mode.lora().is_none() && !self.mode.is_infer();
        let id = self.t.param(mul(numel, self.param_size), trainable);
        let unit = self.train.cur_unit;
        let p = P {
            id,
            numel,
            rows,
            cols,
            unit,
        };
        if self.train.shard.is_some() {
            // dim 0 of the tensor, the dimension FSDP2 and ZeRO-3 shard (vectors: numel;
            // matrices [rows, cols]; stacked experts [E, rows, cols])
            let lead = numel / (rows * cols).max(1);
            let dim0 = if rows == 0 {
                numel
            } else if lead > 1 {
                lead
            } else {
                rows
            };
            self.note_unit_param(id, numel, dim0, (rows, cols), trainable, self.param_size);
        }
        let weighted = mul(numel, self.unit_weight(unit));
        self.param_count += weighted;
        if trainable {
            self.train.trainable.push(p);
            self.train.trainable_count += weighted;
        }
        p
    }

    /// A frozen parameter of `numel` weights stored in `bytes` (a quantised format), shaped
    /// [.., rows, cols]: not trainable, not sharded (as QLoRA's NF4 linears).
    fn new_frozen(&mut self, numel: u128, rows: u128, cols: u128, bytes: u128) -> P {
        let id = self.t.param(bytes, false);
        let unit = self.train.cur_unit;
        self.param_count += numel * self.unit_weight(unit);
        P {
            id,
            numel,
            rows,
            cols,
            unit,
        }
    }

    /// Bytes of one expert's gate (or up) projection `[inter, hidden]` and of its down
    /// projection `[hidden, inter]` when experts are quantised: QLoRA (NF4 with double
    /// quantisation, as every QLoRA linear) or a non-GGUF inference format (GGUF experts are
    /// re-typed by [`Self::gguf_matrix_bytes`]). `None`: stored in the parameter dtype.
    fn quantized_expert_bytes(&self, inter: u128, hidden: u128) -> Option<(u128, u128)> {
        if self.mode.lora().is_some_and(|l| l.qlora) {
            return Some((nf4_bytes(inter * hidden), nf4_bytes(hidden * inter)));
        }
        if matches!(self.mode.weights(), Some(WeightFormat::Gguf(_))) {
            return None;
        }
        if let Some(f @ WeightFormat::Mxfp4) = self.mode.weights() {
            return Some((
                crate::quant::expert_bytes(f, inter, hidden)?,
                crate::quant::expert_bytes(f, hidden, inter)?,
            ));
        }
        Some((
            self.quantized_linear_bytes(Some(LinearRole::Gate), inter, hidden)?,
            self.quantized_linear_bytes(Some(LinearRole::Down), hidden, inter)?,
        ))
    }

    fn new_adapter(&mut self, numel: u128, rows: u128, cols: u128) -> P {
        let id = self.t.param(numel * self.adapter_size, true);
        self.note_unit_param(
            id,
            numel,
            rows.max(1),
            (rows, cols),
            true,
            self.adapter_size,
        );
        let unit = self.train.cur_unit;
        let p = P {
            id,
            numel,
            rows,
            cols,
            unit,
        };
        let weight = self.unit_weight(unit);
        self.param_count += numel * weight;
        self.train.trainable.push(p);
        self.train.trainable_count += numel * weight;
        p
    }

    pub(super) fn new_linear(
        &mut self,
        role: Option<LinearRole>,
        in_f: u128,
        out_f: u128,
        bias: bool,
    ) -> LinearP {
        // nn.Linear.weight is [out_features, in_features]
        let qlora = role.is_some() && self.mode.lora().is_some_and(|l| l.qlora);
        if qlora {
            // bitsandbytes Linear4bit: frozen NF4 weight; the bias stays in the compute dtype
            let id = self.t.param(nf4_bytes(in_f * out_f), false);
            self.param_count += in_f * out_f * self.unit_weight(self.train.cur_unit);
            let w = P {
                id,
                numel: in_f * out_f,
                rows: out_f,
                cols: in_f,
                unit: self.train.cur_unit,
            };
            let b = bias.then(|| self.new_param(out_f, true));
            let rank = u128::from(self.mode.lora().map_or(0, |l| l.rank));
            let lora = match role {
                Some(r) if is_lora_target(self.model, self.mode.lora(), r) => Some((
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
            self.param_count += in_f * out_f * self.unit_weight(self.train.cur_unit);
            let w = P {
                id,
                numel: in_f * out_f,
                rows: out_f,
                cols: in_f,
                unit: self.train.cur_unit,
            };
            let b = bias.then(|| self.new_param(out_f, true));
            let nf4 = matches!(
                self.mode.weights(),
                Some(WeightFormat::Nf4 { .. } | WeightFormat::Fp4 { .. })
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
        let w = self.new_matrix(mul(in_f, out_f), out_f, in_f, true);
        let b = bias.then(|| self.new_param(out_f, true));
        let lora = match role {
            Some(r) if is_lora_target(self.model, self.mode.lora(), r) => {
                let rank = u128::from(self.mode.lora().map_or(0, |l| l.rank));
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
        let (Some(format), Some(_)) = (self.mode.weights(), role) else {
            return None;
        };
        Some(match format {
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
                let n_expert = (0..self.n_layers()).find_map(|i| match &self.spec(i).mlp {
                    Mlp::Moe(m) => Some(u128::from(m.num_experts)),
                    Mlp::Dense(_) | Mlp::None => None,
                });
                // llama.cpp's LLM_TYPE_70B bump: 80-layer models of hidden 8192
                let is_70b = n_layers == 80 && self.model.hidden_size == 8192;
                let layer = self.gguf_layer_index();
                preset
                    .tensor_type(tr, layer, n_layers, in_f, n_expert.unwrap_or(1), is_70b)
                    .bytes(out_f, in_f)
            }
            other => quant::linear_bytes(other, out_f, in_f)?,
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
        let Some(WeightFormat::Gguf(preset)) = self.mode.weights() else {
            return None;
        };
        let n = self.model.layers.len() as u128;
        Some(
            preset
                .tensor_type(role, self.gguf_layer_index(), n, cols, 1, false)
                .bytes(rows, cols),
        )
    }

    /// The full-model index llama.cpp types the tensor being built by: its layer's, or the
    /// layer count for tensors built after the layers (`output.weight`).
    fn gguf_layer_index(&self) -> u128 {
        let built = self.layers_built;
        if built >= self.n_layers() {
            self.model.layers.len() as u128
        } else {
            self.orig_layer(built) as u128
        }
    }

    fn new_norm(&mut self, n: &Norm) -> (P, Option<P>) {
        let w = self.new_param(u128::from(n.dim), true);
        let b = n.bias.then(|| self.new_param(u128::from(n.dim), true));
        if matches!(self.mode.weights(), Some(WeightFormat::Gguf(_))) {
            // GGUF keeps 1-D tensors in fp32
            self.t.resize_param(w.id, u128::from(n.dim) * 4);
            if let Some(b) = b {
                self.t.resize_param(b.id, u128::from(n.dim) * 4);
            }
        }
        (w, b)
    }

    pub(super) fn build_params(&mut self) {
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
        // one allocation each for the replayed layers and their trainable parameters (a
        // dense layer has up to a dozen); the tables an earlier builder left are reused in
        // place (emptied first), set aside while they are filled
        let n = self.n_layers();
        let mut layers = std::mem::take(&mut self.layers);
        layers.truncate(n);
        layers.resize_with(n, LayerParams::default);
        self.train.trainable.reserve(16 * n + 8);
        for (i, lp) in layers.iter_mut().enumerate() {
            self.train.cur_unit = i + 1;
            lp.reset();
            self.layer_params(self.spec(i), lp);
            self.layers_built = i + 1;
        }
        self.layers = layers;
        self.train.cur_unit = 0;
        self.final_norm = m.head.final_norm.as_ref().map(|n| self.new_norm(n));
        if !m.head.tied {
            self.lm_head = Some(self.new_matrix(v * dim, v, dim, true));
            if let (Some(h), Some(b)) = (
                self.lm_head,
                self.gguf_matrix_bytes(crate::quant::TensorRole::Output, v, dim),
            ) {
                self.t.resize_param(h.id, b);
            }
        }
        // a tied head shares only the weight: `lm_head.bias` stays its own parameter
        if m.head.bias {
            self.lm_head_bias = Some(self.new_param(u128::from(e.vocab_size), true));
        }
        // A vision-language model's vision tower and projector: present in memory (root unit),
        // trained only when asked (`VisionTower::trainable`); their activations are not
        // simulated (text-only steps never run them). One flat tensor stands for all of them.
        if let Some(v) = &m.vision {
            let n = u128::from(v.encoder_params) + u128::from(v.projector_params);
            if n > 0 {
                self.new_param(n, v.trainable);
            }
            // peft matches `target_modules` by module name across the whole model: vision
            // linears with a targeted name get adapters too (fp32, trainable). A text-only
            // step never runs them, so they get no gradient and AdamW no state for them
            // (`torch.optim` skips parameters whose `.grad` is None): weights only.
            if let Some(l) = self.mode.lora() {
                let rank = u128::from(l.rank);
                for lin in v
                    .linears
                    .iter()
                    .filter(|x| l.targets.iter().any(|t| t == x.name))
                {
                    let per = rank * (u128::from(lin.in_features) + u128::from(lin.out_features));
                    let numel = per * u128::from(lin.count);
                    self.t.param(numel * self.adapter_size, false);
                    self.param_count += numel;
                    self.train.trainable_count += numel;
                }
            }
        }
    }

    /// Fills `lp` (empty) with layer `l`'s parameters.
    fn layer_params(&mut self, l: &LayerSpec, lp: &mut LayerParams) {
        let h = self.hidden;
        for (i, n) in [l.attn_norm, l.attn_post_norm, l.mlp_norm, l.mlp_post_norm]
            .iter()
            .enumerate()
        {
            if let Some(n) = n {
                lp.norms[i] = Some(self.new_norm(n));
            }
        }
        if let Some(m) = l.mamba2() {
            self.mamba2_params(m, lp);
        }
        if let Some(m) = l.gated_delta_net() {
            self.deltanet_params(m, lp);
        }
        if let Some(m) = l.mamba1() {
            self.mamba1_params(m, lp);
        }
        let a = &l.attention;
        // shapes come from the model description, the one place they are defined (a layer
        // whose mixer is not attention has none here); the attention's and the MLP's linears
        // in one allocation
        lp.linears.reserve(9);
        if l.attention_block().is_some() {
            a.for_each_linear(self.model.hidden_size, |shape| {
                let lin = self.shaped_linear(&shape);
                lp.linears.push((shape.role, lin));
            });
        }
        // gpt-oss `GptOssAttention.sinks = nn.Parameter(torch.empty(num_attention_heads))`
        if a.sinks {
            lp.sinks = Some(self.new_param(u128::from(a.num_heads()), true));
        }
        let norm_dims = if l.attention_block().is_some() {
            a.norm_dims()
        } else {
            Vec::new()
        };
        match a.kind {
            AttentionKind::Standard { .. } => {
                if let [q, k] = norm_dims[..] {
                    // registration order: q norm's weight (and bias), then the key norm's
                    let qw = self.new_param(u128::from(q), true);
                    let qb = a.qk_norm_bias.then(|| self.new_param(u128::from(q), true));
                    let kw = self.new_param(u128::from(k), true);
                    let kb = a.qk_norm_bias.then(|| self.new_param(u128::from(k), true));
                    lp.qk_norms = Some((qw, kw));
                    lp.qk_norm_biases = qb.zip(kb);
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
            Mlp::None => {}
            Mlp::Dense(d) => self.mlp_params(d, &mut lp.linears),
            Mlp::Moe(moe) => {
                let e = u128::from(moe.num_experts);
                lp.router = Some(self.new_linear(None, h, e, moe.router_bias));
                let i = u128::from(moe.expert.intermediate);
                // transformers 5 stores each expert kind as one 3-D parameter
                // (`gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I]).
                let ins = if moe.expert.gated { 2 } else { 1 };
                // quantised experts (QLoRA's NF4 base, or an inference weight format) are
                // frozen and stored expert by expert, projection by projection, as every other
                // quantised linear: bitsandbytes, GPTQ, AWQ and fp8 checkpoints store
                // `experts.{j}.w1/w2/w3` (or `gate_proj/up_proj/down_proj`) each with its own
                // packed weight, scales and zeros
                let (gu, down) = match self.quantized_expert_bytes(i, h) {
                    Some((gate_or_up, down_b)) => (
                        self.new_frozen(e * ins * i * h, ins * i, h, e * ins * gate_or_up),
                        self.new_frozen(e * i * h, h, i, e * down_b),
                    ),
                    None => (
                        self.new_matrix(e * ins * i * h, ins * i, h, true),
                        self.new_matrix(e * i * h, h, i, true),
                    ),
                };
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
                lp.experts.extend([gu, down]);
                // expert biases: two parameters (gpt-oss `gate_up_proj_bias` [E, 2I] and
                // `down_proj_bias` [E, H], models/gpt_oss/modeling_gpt_oss.py GptOssExperts)
                if moe.expert.bias {
                    lp.experts.push(self.new_param(e * ins * i, true));
                    lp.experts.push(self.new_param(e * h, true));
                }
                if moe.router_extra_params > 0 {
                    self.new_param(u128::from(moe.router_extra_params), true);
                }
                // ERNIE 4.5 `moe_statics.e_score_correction_bias`: fp32, requires_grad=False
                if moe.frozen_router_params > 0 {
                    let n = u128::from(moe.frozen_router_params);
                    self.new_frozen(n, 0, 1, n * 4);
                }
                if let Some(s) = &moe.shared {
                    self.mlp_params(s, &mut lp.shared);
                }
                if moe.shared_gate {
                    lp.shared_gate = Some(self.new_linear(None, h, 1, false));
                }
            }
        }
    }

    /// Builds `d`'s linears, appended to `out` in forward order.
    fn mlp_params(&mut self, d: &DenseMlp, out: &mut Vec<(LinearRole, LinearP)>) {
        d.for_each_linear(self.model.hidden_size, |shape| {
            let lin = self.shaped_linear(&shape);
            out.push((shape.role, lin));
        });
    }

    /// The linear of `shape` (the model description's, the one place shapes are defined).
    pub(super) fn shaped_linear(&mut self, shape: &crate::model::LinearShape) -> LinearP {
        self.new_linear(
            Some(shape.role),
            u128::from(shape.in_features),
            u128::from(shape.out_features),
            shape.bias,
        )
    }
}

/// NF4 block size (bitsandbytes `quantize_4bit` default blocksize=64).
pub(super) const NF4_BLOCK: u128 = 64;

/// Bytes of one NF4 weight with double quantisation (bitsandbytes functional.py `quantize_4bit`
/// with `compress_statistics=True`): packed nibbles, one uint8 absmax per 64-block, those
/// absmax quantised in blocks of 256 with an fp32 absmax each, an fp32 offset, and the
/// 16-entry fp32 NF4 code of the QuantState.
fn nf4_bytes(numel: u128) -> u128 {
    let blocks = numel.div_ceil(NF4_BLOCK);
    numel.div_ceil(2) + blocks + blocks.div_ceil(256) * 4 + 4 + 16 * 4
}
