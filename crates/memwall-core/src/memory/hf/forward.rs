//! The model's forward shared by training and inference: embeddings, one decoder layer, and the
//! tail between the last layer and the LM head.

use super::{find_linear, Builder, LayerParams, LinearP, P};
use crate::memory::timeline::TensorId;
use crate::model::{LinearRole, Mlp, Norm, Residual};

impl Builder<'_> {
    pub(super) fn embeddings(&mut self) -> (TensorId, u128) {
        let rows = self.tokens;
        let e = self.model.embeddings;
        let s = self.param_size;
        let dim = u128::from(e.dim);
        let h = self.hidden;
        // embedding backward: dense grad_weight (embedding_dense_backward)
        let mut emb = self.op(rows * dim * s, &[], &[], &[self.embed.id], &[]);
        if e.scaled && e.scale_in_module {
            // Gemma's `*TextScaledWordEmbedding`: `super().forward(input_ids) * embed_scale`
            // inside the module; the unscaled lookup is a temporary of its forward, and a
            // forward hook on the module sees the scaled tensor
            let y = self.op(rows * dim * s, &[emb], &[], &[], &[]);
            self.drop_(emb);
            emb = y;
        }
        // peft's PeftModel.__init__ calls `enable_input_require_grads()` when the model already
        // has gradient checkpointing on (peft_model.py `prepare_model_for_gradient_checkpointing`):
        // the frozen embedding's output becomes a leaf that requires grad, so layer 0 saves its
        // activations. Its AccumulateGrad node holds the leaf (torch/csrc/autograd/functions/
        // accumulate_grad.h: `Variable variable`) and the `.grad` it stores, both until the graph
        // is freed after backward, whatever consumes the leaf first: GPT-2's position add and
        // Granite's multiplier save nothing, yet the lookup stays (traced on torch 2.15 CPU with
        // rnd-s97-gpt2-0 b4 × 50, LoRA, checkpointing: the [4, 50, 40] `aten.embedding` output
        // alive at the loss's backward beside `inputs_embeds + position_embeds`; the h41
        // fixture gpt2-kvview-s97-ckpt-eager-ampbf16-b4-s50-lora was -0.93%).
        let input_leaf =
            self.mode.lora().is_some() && self.mode.checkpointing() && !self.t.requires_grad(emb);
        if input_leaf {
            self.input_grad_leaf(emb);
        }
        // a vision-language wrapper with image inputs: the vision tower runs and its features
        // are scattered into the embeddings (memory/hf/vision.rs)
        let mut emb = self.image_merge(emb);
        if e.scaled && !e.scale_in_module {
            // Granite (and its MoE/hybrid kin, Falcon-H1): `inputs_embeds = inputs_embeds *
            // self.embedding_multiplier` in the model's forward (transformers 5.23
            // models/granite/modeling_granite.py GraniteModel.forward; Falcon-H1
            // `self.embed_tokens(input_ids) * self.embedding_multiplier`): a new tensor that
            // rebinds `inputs_embeds`, so the lookup is freed at once and the product is what
            // the forward keeps (tools/truth/probes/live_tensors.py on rnd-s61-granite-0: one
            // [B, S, hidden] product alive at the eager softmax, no lookup). A multiplication
            // saves nothing for a constant factor (peft's grad-requiring leaf above is held by
            // its AccumulateGrad node all the same).
            let y = self.op(rows * h * s, &[emb], &[], &[], &[]);
            self.drop_(emb);
            emb = y;
        }
        // `inputs_embeds` stays referenced by the model's forward until it returns, unless the
        // embedding dropout rebinds it (then its output is what stays, below)
        if !e.dropout_rebinds {
            self.t.retain(emb);
            self.out_refs.push(emb);
        }
        let mut x = emb;
        if let Some((pin, _)) = self.projections {
            // OPT project_in
            let (y, _) = self.linear(x, s, rows, &pin);
            self.drop_(x);
            x = y;
        }
        if let Some(pos) = self.pos_embed {
            let pe = if self.model.embeddings.positions_from_mask {
                self.positions_from_mask(pos)
            } else {
                // GPT-2: `position_ids = cache_position.unsqueeze(0)`, one row for the batch
                self.op(self.seq * h * s, &[], &[], &[pos.id], &[])
            };
            let y = self.op(rows * h * s, &[x, pe], &[], &[], &[]);
            // `position_embeds` (gpt2) / `pos_embeds` (opt) is a local of the model's forward
            self.out_refs.push(pe);
            self.drop_(x);
            x = y;
        }
        // dropout consumes x's reference and returns the tensor to continue with
        x = self.dropout(x, rows * h * s, s, self.model.dropout.embed);
        if e.dropout_rebinds {
            // Phi: `inputs_embeds = self.embed_dropout(inputs_embeds)` frees the lookup (the
            // dropout saves its noise or mask, not its input) and binds the output, which the
            // forward keeps until it returns (traced with tools/truth/measure_dist.py --debug on
            // rdist137-002-phi: the [1, 256, 64] lookup freed right after the dropout's product;
            // its forward phase was +1.89%, one [b, s, hidden] over)
            self.t.retain(x);
            self.out_refs.push(x);
        }
        (x, s)
    }

    /// OPT's position embeddings (transformers 5.23 models/opt/modeling_opt.py
    /// `OPTDecoder.forward`, `OPTLearnedPositionalEmbedding.forward`): without an
    /// `attention_mask` argument the forward makes `position_attention_mask = torch.ones(B,
    /// past + S)` (the default dtype, fp32), `position_ids = (cumsum(mask) * mask - 1).long()`
    /// sliced to the new tokens (a view: the whole `[B, past + S]` storage stays), both locals
    /// of the forward until it returns; the lookup `embedding(position_ids + 2)` is `[B, S,
    /// hidden]`, one row per sequence, and its backward keeps the shifted int64 indices
    /// (`embedding_dense_backward` takes `indices`). Traced with
    /// tools/truth/probes/live_tensors.py on rnd-s97-opt-0: a `[4, 173, 32]` lookup, the fp32
    /// ones and the int64 ids alive at the eager attention peak. Returns the lookup.
    fn positions_from_mask(&mut self, pos: P) -> TensorId {
        let (b, rows, h, s) = (self.batch, self.tokens, self.hidden, self.param_size);
        let past = self
            .cache
            .iter()
            .flatten()
            .map(|&(_, _, n)| n)
            .max()
            .unwrap_or(0);
        let cols = b * (past + self.seq);
        let mask = self.act(cols * 4, false);
        self.out_refs.push(mask);
        // cumsum, `* mask` and `- 1` in fp32, then `.long()`
        let sum = self.act(cols * 4, false);
        let prod = self.act(cols * 4, false);
        let shifted = self.act(cols * 4, false);
        self.drop_(prod);
        let ids = self.act(cols * 8, false);
        self.drop_(shifted);
        self.drop_(sum);
        self.out_refs.push(ids);
        let offset = self.act(rows * 8, false);
        let pe = self.op(rows * h * s, &[], &[offset], &[pos.id], &[]);
        self.drop_(offset);
        pe
    }

    /// One decoder layer; returns its output. `x` keeps its reference (the caller drops it).
    pub(super) fn layer(&mut self, idx: usize, x: TensorId, x_size: u128, ckpt: bool) -> TensorId {
        // borrow the layer's parameter table without copying it: the tables are set aside
        // while the layer runs (nothing reads them but through `lp`)
        let layers = std::mem::take(&mut self.layers);
        let y = self.layer_with(idx, &layers[idx], x, x_size, ckpt);
        self.layers = layers;
        if self.spec(idx).attention.eager_style == crate::model::EagerStyle::Falcon
            && !self.recomputing
        {
            // FalconModel's loop binds the block's `(output, attn_weights)` to `outputs` until
            // the next block returns (models/falcon/modeling_falcon.py FalconModel.forward).
            // Not in a checkpoint's recomputation in backward: that re-runs the block alone
            // (torch/utils/checkpoint.py `_checkpoint_hook` recomputes `fn(*args)` and keeps
            // only the tensors autograd saved), so its returned `attn_weights` go when it
            // returns (measured: rnd-t149-014-falcon, two checkpointed eager layers, layer 1's
            // recomputed probabilities gone before layer 0's recompute; +6.6% with them held)
            let locals = std::mem::take(&mut self.layer_locals);
            for t in std::mem::replace(&mut self.block_outputs, locals) {
                self.drop_(t);
            }
        } else {
            self.drop_list(|b| &mut b.layer_locals);
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
        let spec = *self.spec(idx);
        if let (true, Mlp::None) = (
            spec.mamba2().is_some() || spec.mamba1().is_some(),
            &spec.mlp,
        ) {
            // `Mamba2Block` / `MambaBlock`: norm, mixer, residual (fp32 under `residual_in_fp32`)
            return self.mamba2_block(lp, x, x_size, &spec);
        }
        let rows = self.tokens;
        let h = self.hidden;
        let p_drop = self.model.dropout.residual;
        let add =
            |b: &mut Self, a: TensorId, bb: TensorId, size: u128| b.add(a, bb, rows * h * size);
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
                // the token mixer: attention, or a state-space mixer in its place
                let a = match (spec.mamba2(), spec.gated_delta_net(), spec.mamba1()) {
                    (Some(m), _, _) if spec.parallel_mixers() => {
                        self.parallel_mixers(n1, n1s, lp, m, &spec, ckpt)
                    }
                    (Some(m), _, _) => self.mamba2_mixer(n1, n1s, lp, m),
                    (None, Some(g), _) => self.deltanet_mixer(n1, n1s, lp, g),
                    (None, None, Some(m)) => self.mamba1_mixer(n1, n1s, lp, m),
                    (None, None, None) => self.attention(n1, n1s, &spec.attention, lp, ckpt),
                };
                self.drop_(n1);
                let (a, _) = post(self, a, self.compute_size, 1, spec.attn_post_norm);
                let a = self.dropout(a, rows * h * self.compute_size, self.compute_size, p_drop);
                let a_scaled = self.residual_scaled(a, &spec);
                let mut hdn = add(self, x, a_scaled, rs);
                if a_scaled != a {
                    self.drop_(a_scaled);
                }
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
                    Mlp::Dense(d) => {
                        self.mlp_muls = (spec.muls.mlp_gate, spec.muls.mlp_down);
                        // an inline MLP (OPT) drops `n2` itself after the first projection
                        self.mlp_input_rebound = spec.mlp_input_rebound;
                        let y = self.dense_mlp(n2, n2s, rows, d, &lp.linears);
                        self.mlp_muls = (false, false);
                        y
                    }
                    Mlp::Moe(moe) => self.moe_mlp(n2, n2s, lp, moe),
                    Mlp::None => self.retain_id(n2),
                };
                if !(spec.mlp_input_rebound && matches!(spec.mlp, Mlp::Dense(_))) {
                    self.drop_(n2);
                }
                let (m, _) = post(self, m, self.compute_size, 3, spec.mlp_post_norm);
                let m = self.dropout(m, rows * h * self.compute_size, self.compute_size, p_drop);
                let m_scaled = self.residual_scaled(m, &spec);
                let mut out = add(self, hdn, m_scaled, rs);
                if m_scaled != m {
                    self.drop_(m_scaled);
                }
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
                // GPT-NeoX (`post_attention_dropout`, `post_mlp_dropout`) and Phi
                // (`resid_dropout` twice, models/phi/modeling_phi.py PhiDecoderLayer.forward)
                // drop each branch before the sum; Falcon drops the sum (`dropout_add`,
                // models/falcon/modeling_falcon.py FalconDecoderLayer.forward)
                let per_branch = spec.attention.eager_style != crate::model::EagerStyle::Falcon;
                // The MLP's own norm: Falcon's new architecture computes both norms before the
                // attention (`attention_layernorm_out = self.ln_attn(hidden_states)`,
                // `mlp_layernorm_out = self.ln_mlp(hidden_states)`), GPT-NeoX only once the
                // attention has returned (`mlp_output = self.mlp(self.post_attention_layernorm(
                // hidden_states))` follows the attention call, models/gpt_neox/modeling_gpt_neox.py
                // GPTNeoXLayer.forward, transformers 5.23; measured: rnd-i157-009-gptneox, one
                // [b, s, hidden] over during the prefill's attention with it computed before).
                // One norm (Phi, Cohere, Falcon's old architecture): the MLP reads the same output.
                // Ok: the MLP's input now; Err: its norm, applied once the attention returns
                let mlp_in = match (spec.mlp_norm, lp.norms[2]) {
                    (Some(n), Some(p)) if per_branch => Err((n, p)),
                    (Some(n), Some(p)) => Ok(self.norm(x, x_size, rows, &n, p)),
                    _ => {
                        self.t.retain(n1);
                        Ok((n1, n1s))
                    }
                };
                let c = self.compute_size;
                let a = self.attention(n1, n1s, &spec.attention, lp, ckpt);
                // Falcon binds it to `attention_layernorm_out`, a local of the layer's frame
                // (models/falcon/modeling_falcon.py FalconDecoderLayer.forward): with two norms
                // (`new_decoder_architecture`, `num_ln_in_parallel_attn` 2) it outlives the
                // attention, beside `mlp_layernorm_out`, until the layer returns
                // (tools/truth/probes/live_tensors.py on rnd-s97-falcon-0: both layer-norm
                // outputs alive at the MLP's gelu); elsewhere it is a temporary of the call
                let held_n1 = if per_branch {
                    self.drop_(n1);
                    None
                } else {
                    Some(n1)
                };
                let a = if per_branch {
                    self.dropout(a, rows * h * c, c, p_drop)
                } else {
                    a
                };
                let (n2, n2s) = match mlp_in {
                    Ok(e) => e,
                    Err((n, p)) => self.norm(x, x_size, rows, &n, p),
                };
                let m = match &spec.mlp {
                    Mlp::Dense(d) => self.dense_mlp(n2, n2s, rows, d, &lp.linears),
                    Mlp::Moe(moe) => self.moe_mlp(n2, n2s, lp, moe),
                    Mlp::None => self.retain_id(n2),
                };
                // (Cohere keeps the normalised input bound until the layer returns, below)
                if !spec.parallel_residual_first {
                    self.drop_(n2);
                }
                let m = if per_branch {
                    self.dropout(m, rows * h * c, c, p_drop)
                } else {
                    m
                };
                if spec.parallel_residual_first {
                    // Cohere: `residual + hidden_states_attention + hidden_states_mlp`
                    // (models/cohere{,2}/modeling_cohere{,2}.py Cohere{,2}DecoderLayer.forward,
                    // transformers 5.23). The normalised input (`hidden_states`, rebound only
                    // by the sum), `hidden_states_attention` and `hidden_states_mlp` are locals
                    // of the layer's frame: alive through both adds until the layer returns.
                    // Only the intermediate `residual + attention` is a temporary.
                    self.layer_locals.extend([n2, a, m]);
                    let xa = add(self, x, a, rs);
                    let out = add(self, xa, m, rs);
                    self.drop_(xa);
                    if let Some(n1) = held_n1 {
                        self.drop_(n1);
                    }
                    return out;
                }
                // Falcon's biased output projections under autocast are fp32
                // (`Builder::bias_fp32`), and so is the sum of the branches
                let role_size = |b: &Self, role: LinearRole| {
                    find_linear(&lp.linears, role).map_or(c, |l| b.linear_out_size(l))
                };
                let ams = if matches!(spec.mlp, Mlp::Dense(_)) {
                    role_size(self, LinearRole::O).max(role_size(self, LinearRole::Down))
                } else {
                    c
                };
                let am = add(self, m, a, ams);
                // Phi (`hidden_states = attn_outputs + feed_forward_hidden_states + residual`,
                // models/phi/modeling_phi.py PhiDecoderLayer.forward) and GPT-NeoX
                // (`hidden_states = mlp_output + attn_output + hidden_states`,
                // models/gpt_neox/modeling_gpt_neox.py GPTNeoXLayer.forward, transformers 5.23)
                // bind both branches to locals of the layer's frame, alive through the second
                // add until the layer returns (traced on torch 2.15 CPU, rnd-s67-phi-0 b2 × 256:
                // the MLP output, the branches' sum and the layer's output alive together)
                if !per_branch {
                    self.drop_(a);
                    self.drop_(m);
                }
                let am = if per_branch {
                    am
                } else {
                    self.dropout(am, rows * h * ams, ams, p_drop)
                };
                let out = add(self, am, x, rs);
                self.drop_(am);
                if per_branch {
                    self.drop_(a);
                    self.drop_(m);
                }
                if let Some(n1) = held_n1 {
                    self.drop_(n1);
                }
                out
            }
        }
    }

    /// A sub-block output times the residual multiplier (Granite: `hidden_states *
    /// self.residual_multiplier`, a new tensor, nothing saved for a Python scalar); the input
    /// itself when the layer has none. The input stays bound until the residual add returns.
    fn residual_scaled(&mut self, y: TensorId, spec: &crate::model::LayerSpec) -> TensorId {
        if !spec.residual_scaled {
            return y;
        }
        self.op(
            self.tokens * self.hidden * self.compute_size,
            &[y],
            &[],
            &[],
            &[],
        )
    }

    /// After the last decoder layer: the causal mask and the kept block outputs go, then the
    /// final norm and (OPT-350m style) the output projection run on the hidden states.
    /// Shared by the training forward and the inference forward (same modeling code).
    pub(super) fn body_tail(
        &mut self,
        x: TensorId,
        xsize: u128,
        rows: u128,
        mask: Option<TensorId>,
    ) -> (TensorId, u128) {
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
        let (fx, fs) = match self.projections {
            Some((_, pout)) => {
                let (y, ys) = self.linear(fx, fs, rows, &pout);
                self.drop_(fx);
                (y, ys)
            }
            None => (fx, fs),
        };
        // the mask is a local of the base model's forward (`causal_mask_mapping` /
        // `causal_mask` in `*Model.forward`), which runs the final norm (and OPT's
        // `project_out`) before it returns; measured: rdist-017-gemma3text, both eager masks
        // alive through the final norm
        if let Some(m) = mask {
            self.drop_(m);
        }
        if let Some(m) = self.unused_mask.take() {
            self.drop_(m);
        }
        if let Some(m) = self.sliding_mask.take() {
            self.drop_(m);
        }
        if !self.amp && fs != self.param_size {
            // an fp32 residual stream (`residual_in_fp32`) meets a low-precision head:
            // `self.lm_head(hidden_states.to(self.lm_head.weight.dtype))` (Mamba2ForCausalLM)
            let y = self.cast(
                fx,
                rows * u128::from(self.model.embeddings.dim) * self.param_size,
            );
            self.drop_(fx);
            return (y, self.param_size);
        }
        (fx, fs)
    }

    /// The LM head as a linear layer: its own weight, or the tied input embedding.
    pub(super) fn lm_head_linear(&self) -> LinearP {
        let v = u128::from(self.model.embeddings.vocab_size);
        let dim = u128::from(self.model.embeddings.dim);
        LinearP {
            nf4: false,
            quantized: false,
            w: P {
                numel: v * dim,
                ..self.lm_head.unwrap_or(self.embed)
            },
            b: self.lm_head_bias,
            lora: None,
            in_f: dim,
            out_f: v,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::dtype::Precision;
    use crate::memory::hf::Builder;
    use crate::memory::Kernels;
    use crate::model::tests::llama2_7b;
    use crate::workload::{Lora, TrainWorkload};

    #[test]
    fn peft_input_leaf_keeps_the_embedding_lookup_whatever_consumes_it() {
        // LoRA under checkpointing: `enable_input_require_grads` makes the lookup a leaf whose
        // AccumulateGrad node holds it until the graph is freed, so it outlives the model's
        // forward even when no op saves it (GPT-2's position add; measured:
        // gpt2-kvview-s97-ckpt-eager-ampbf16-b4-s50-lora, -0.93% without it); a full
        // fine-tune or a step without checkpointing keeps no such leaf
        let mut m = llama2_7b();
        m.layers.truncate(1);
        let (batch, seq) = (2u64, 32u64);
        let held = |lora: bool, checkpointing: bool| {
            let mut w = TrainWorkload::new(batch, seq);
            w.precision = Precision::Bf16;
            w.checkpointing = checkpointing;
            if lora {
                w.lora = Some(Lora {
                    rank: 8,
                    targets: vec!["q_proj".into()],
                    qlora: false,
                });
            }
            let mut b = Builder::train(&m, &w, Kernels::Cpu, None);
            b.build_params();
            let before = b.t.live();
            let (x, _) = b.embeddings();
            b.drop_(x);
            b.drop_list(|b| &mut b.out_refs);
            b.t.live() - before
        };
        let lookup = u128::from(batch * seq * m.hidden_size) * 2;
        assert_eq!(held(true, true), lookup);
        assert_eq!(held(true, false), 0);
        assert_eq!(held(false, true), 0);
    }
}
