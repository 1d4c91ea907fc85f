//! The MLP block: activations, dense (gated or not) MLPs and mixtures of experts.

use super::{find_linear, Builder, LayerParams, LinearP, LIN_ZERO};
use crate::memory::timeline::{Category, Ids, Node, TensorId};
use crate::model::{Activation, DenseMlp, LinearRole};

impl Builder<'_> {
    fn activation(&mut self, x: TensorId, bytes: u128, act: Activation) -> TensorId {
        match act {
            // silu/gelu/relu: one op saving its input (relu saves its output)
            // (ClampedSwiglu only occurs as a gated activation, see `gate`)
            Activation::Silu
            | Activation::Gelu
            | Activation::GeluTanh
            | Activation::ClampedSwiglu => self.op(bytes, &[x], &[x], &[], &[]),
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

    /// The gated product `act(g) * u` of `bytes` bytes (`g` and `u` may be views of one fused
    /// output); the inputs stay owned by the caller.
    fn gate(&mut self, g: TensorId, u: TensorId, bytes: u128, act: Activation) -> TensorId {
        if act != Activation::ClampedSwiglu {
            let a = self.activation(g, bytes, act);
            let m = self.mul(a, u, bytes);
            self.drop_(a);
            return m;
        }
        // GptOssExperts._apply_gate (models/gpt_oss/modeling_gpt_oss.py): both clamps save
        // their input (`clamp_backward` needs it); `gate * alpha` is a temporary of sigmoid
        // (which saves its output); the products save their operands; locals die on return.
        let gc = self.op(bytes, &[g], &[g], &[], &[]);
        let uc = self.op(bytes, &[u], &[u], &[], &[]);
        let ga = self.op(bytes, &[gc], &[], &[], &[]);
        let sg = self.op_saving_output(bytes, ga);
        self.drop_(ga);
        let glu = self.mul(gc, sg, bytes);
        let up1 = self.op(bytes, &[uc], &[], &[], &[]);
        self.drop_(uc);
        let m = self.mul(up1, glu, bytes);
        for t in [gc, sg, glu, up1] {
            self.drop_(t);
        }
        m
    }

    /// `y.chunk(2, dim=-1)`: two views of `half` bytes each sharing `y`'s storage, and one
    /// SplitBackward node that receives a half-size gradient per piece and concatenates them
    /// into `y`'s full gradient (`split_backward`, torch/csrc/autograd/FunctionsManual.cpp).
    /// Autograd would instead allocate a full-size gradient per consumer and sum them if both
    /// pieces were the whole tensor; `y` keeps its own reference (the caller drops it).
    fn chunk2(&mut self, y: TensorId, half: u128) -> (TensorId, TensorId) {
        let rg = self.rg(y);
        let a = self.t.view(y, half, rg);
        let b = self.t.view(y, half, rg);
        if rg {
            self.t.record(Node {
                inputs: Ids::of(&[y]),
                outputs: Ids::of(&[a, b]),
                ..Node::default()
            });
        }
        (a, b)
    }

    pub(super) fn dense_mlp(
        &mut self,
        x: TensorId,
        x_size: u128,
        rows: u128,
        d: &DenseMlp,
        linears: &[(LinearRole, LinearP)],
    ) -> TensorId {
        let c = self.compute_size;
        let i = u128::from(d.intermediate);
        let lin = |role: LinearRole| find_linear(linears, role);
        // an inline MLP that rebinds its input takes the caller's reference
        let rebound = std::mem::take(&mut self.mlp_input_rebound);
        // a local of the MLP's forward bound until it returns (after down_proj)
        let mut gate_local = None;
        let mut hidden_size = c;
        let hidden_act = if d.gated {
            let (g, u) = if let Some(gu) = lin(LinearRole::GateUp) {
                let (y, _) = self.linear(x, x_size, rows, gu);
                if d.act == Activation::ClampedSwiglu || self.liger() {
                    self.t.retain(y);
                    (y, Some(y))
                } else {
                    // `gate, up_states = up_states.chunk(2, dim=-1)` (Phi3MLP, Glm4MLP)
                    let (g, u) = self.chunk2(y, rows * i * c);
                    self.drop_(y);
                    // `up_states` is rebound to the product, but `gate` stays bound until the
                    // forward returns, and its view keeps the whole gate_up output alive
                    // through down_proj (transformers 5.23 models/glm4/modeling_glm4.py
                    // `Glm4MLP.forward`, phi3 alike). It matters where nothing saves the gate:
                    // a checkpointed forward, a frozen MLP, inference (measured:
                    // rdist83-033-glm4, checkpointed, forward -15.8% was this [rows, 2·inter])
                    self.t.retain(g);
                    gate_local = Some(g);
                    (g, Some(u))
                }
            } else if self.mlp_muls.0 {
                // FalconH1MLP.forward: `up_proj(x) * act_fn(gate_proj(x) * gate_multiplier)`:
                // up first, then the gate and its scaled copy (the gate itself is a temporary)
                let (u, _) = self.linear(x, x_size, rows, lin(LinearRole::Up).unwrap_or(&LIN_ZERO));
                let (g, _) =
                    self.linear(x, x_size, rows, lin(LinearRole::Gate).unwrap_or(&LIN_ZERO));
                let gs = self.op(rows * i * c, &[g], &[], &[], &[]);
                self.drop_(g);
                (gs, Some(u))
            } else {
                let (g, _) =
                    self.linear(x, x_size, rows, lin(LinearRole::Gate).unwrap_or(&LIN_ZERO));
                // `down_proj(act_fn(gate_proj(x)) * up_proj(x))` (LlamaMLP.forward and its
                // kin) runs left to right: the activation before up_proj, so a LoRA adapter's
                // [rows, inter] temporaries on up_proj meet the saved gate and its activation
                // (measured: mplora-cohere-mlp-sdpa-b2s512, forward -0.83% with up_proj first).
                // Liger's fused SiLU-mul takes both projections (LigerSwiGLUMLP).
                let u = if d.act == Activation::ClampedSwiglu || self.liger() {
                    let (u, _) =
                        self.linear(x, x_size, rows, lin(LinearRole::Up).unwrap_or(&LIN_ZERO));
                    Some(u)
                } else {
                    None
                };
                (g, u)
            };
            let up_or = |b: &mut Self, u: Option<TensorId>| match u {
                Some(u) => u,
                None => {
                    b.linear(x, x_size, rows, lin(LinearRole::Up).unwrap_or(&LIN_ZERO))
                        .0
                }
            };
            let m = if d.act == Activation::ClampedSwiglu {
                let u = up_or(self, u);
                let m = self.gate(g, u, rows * i * c, d.act);
                self.drop_(g);
                self.drop_(u);
                m
            } else if self.liger() {
                // Liger's LigerSiLUMulFunction / LigerGELUMulFunction (Liger-Kernel 0.8.5
                // ops/swiglu.py, ops/geglu.py): `c = empty_like(a)`, saves `a, b`; backward
                // recomputes the activation and writes `da`, `db` over `a`, `b` (handed on)
                let u = up_or(self, u);
                let rg = self.rg(g) || self.rg(u);
                let m = self.act(rows * i * c, rg);
                if rg {
                    self.t.record(Node {
                        saved: Ids::of(&[g, u]),
                        inputs: Ids::of(&[g, u]),
                        outputs: Ids::of(&[m]),
                        grads_in_saved: true,
                        ..Node::default()
                    });
                }
                self.drop_(g);
                self.drop_(u);
                m
            } else {
                // `act_fn(gate_proj(x)) * up_proj(x)`: the gate projection is a temporary
                // freed once the activation has it
                let a = self.activation(g, rows * i * c, d.act);
                self.drop_(g);
                let u = up_or(self, u);
                let m = self.mul(a, u, rows * i * c);
                self.drop_(a);
                self.drop_(u);
                m
            };
            // the input's last use was up_proj (`up_or`)
            if rebound {
                self.drop_(x);
            }
            m
        } else {
            // (fp32 for Falcon's biased projection under autocast, `Builder::bias_fp32`)
            let (u, us) = self.linear(x, x_size, rows, lin(LinearRole::Up).unwrap_or(&LIN_ZERO));
            if rebound {
                self.drop_(x);
            }
            hidden_size = us;
            let a = self.activation(u, rows * i * us, d.act);
            self.drop_(u);
            self.dropout(a, rows * i * us, us, self.model.dropout.activation)
        };
        let (y, _) = self.linear(
            hidden_act,
            hidden_size,
            rows,
            lin(LinearRole::Down).unwrap_or(&LIN_ZERO),
        );
        self.drop_(hidden_act);
        if let Some(g) = gate_local {
            self.drop_(g);
        }
        if self.mlp_muls.1 {
            // FalconH1MLP.forward: `down_proj(y) * down_multiplier`
            let ys = self.op(
                rows * u128::from(self.model.hidden_size) * c,
                &[y],
                &[],
                &[],
                &[],
            );
            self.drop_(y);
            return ys;
        }
        y
    }

    /// Mixture of experts, transformers 5 (`MixtralSparseMoeBlock` with the default
    /// `experts_implementation="grouped_mm"`, `integrations/moe.py` `grouped_mm_experts_forward`):
    /// router logits, fp32 softmax, top-k; the `tokens * top_k` (token, expert) rows are gathered
    /// in expert order, run through grouped matmuls (gate_up, activation * up, down), weighted,
    /// un-permuted and summed over k. Memory does not depend on the routing.
    pub(super) fn moe_mlp(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        moe: &crate::model::MoeMlp,
    ) -> TensorId {
        if moe.all_experts {
            return self.llama4_moe(x, x_size, lp, moe);
        }
        let rows = self.tokens;
        let c = self.compute_size;
        let h = self.hidden;
        let e = u128::from(moe.num_experts);
        let k = u128::from(moe.top_k);
        let router = lp.router.as_ref().unwrap_or(&LIN_ZERO);
        // ERNIE 4.5: `shared_output = self.shared_experts(hidden_states)` before the router,
        // held until it is added to the routed output. Qwen2-MoE / Qwen3-Next run the shared
        // expert's MLP before the router too (`shared_expert_output =
        // self.shared_expert(hidden_states_reshaped)`, then `self.gate`, then `self.experts`)
        // and gate it after the routed experts (`F.sigmoid(self.shared_expert_gate(..)) *
        // shared_expert_output`; models/qwen2_moe/modeling_qwen2_moe.py
        // Qwen2MoeSparseMoeBlock.forward, transformers 5.23), so its activations and output
        // are alive through the routed experts (measured: rdist-015-qwen2moe's forward).
        let pre_shared = if moe.shared_first {
            self.shared_output(x, x_size, lp, moe)
        } else if moe.shared_gate {
            self.shared_mlp(x, x_size, lp, moe)
        } else {
            None
        };
        // the router's top-k indices where the router itself allocates them (DeepSeek-V3)
        let mut router_index = None;
        let topw = if moe.hunyuan_router {
            // HunYuanMoEV1Gate: `hidden_states.float()` (wg is an fp32 nn.Linear), fp32 logits,
            // `softmax(dtype=torch.float)` (saved), topk, `routing_weights /= sum` in place
            let xf = self.cast(x, rows * h * 4);
            let saved: &[TensorId] = if self.trainable(&router.w) {
                &[xf]
            } else {
                &[]
            };
            let logits = self.op(rows * e * 4, &[xf], saved, &[router.w.id], &[]);
            self.drop_(xf);
            let probs = self.op_saving_output(rows * e * 4, logits);
            self.drop_(logits);
            let topw = self.op(rows * k * 4, &[probs], &[], &[], &[]);
            self.drop_(probs);
            topw
        } else if moe.router_fp32 && self.amp && !moe.router_weights_in_compute_dtype {
            // DeepSeek-V3 under autocast: `hidden_states.type(torch.float32)` and
            // `self.weight.type(torch.float32)` return the fp32 tensors themselves, and
            // `F.linear` is autocast's: a 16-bit linear like any other (the input cast, the
            // weight's cached cast), so the logits, the sigmoid scores (saved) and the gathered
            // routing weights are 16-bit; only the biased choice scores are fp32 (the fp32
            // `e_score_correction_bias` promotes them). Traced on torch 2.15 CPU
            // (rnd-s17-deepseekv3-0 under amp-fp16: fp16 `_to_copy` [tokens, hidden] and
            // [experts, hidden], fp16 `sigmoid`, `clone` and divisor alive at the backward
            // peak; the router was modelled fp32, x-amp16 +0.6%)
            let (logits, ls) = self.linear(x, x_size, rows, router);
            let scores = self.op(rows * e * ls, &[logits], &[], &[], &[]);
            // DeepseekV3MoE binds the router logits to `_` until it returns
            self.mlp_locals.push(logits);
            self.t.transient(rows * e * 4 * 2, Category::Activations);
            let topw = self.deepseek_routing_weights(scores, moe, &mut router_index, ls);
            self.drop_(scores);
            topw
        } else if moe.router_fp32 {
            // DeepSeek-V3: fp32 copies of the input and the router weight, fp32 logits,
            // sigmoid scores (saved), biased scores for the group top-k, fp32 routing weights.
            // Without autocast an fp32 input or weight is its own `.float()` /
            // `.type(torch.float32)` (`Tensor.to` returns self when the dtype already matches):
            // no copy (traced on torch 2.15 CPU, rnd-s61-ernie45moe-0 in fp32: no `_to_copy`
            // before the router's `mm`; rdist83-038-ernie45moe forward was +1.8%, one fp32
            // [tokens, hidden] per MoE layer). Under autocast the copies stay as measured.
            let xf = if !self.amp && x_size == 4 {
                self.retain_id(x)
            } else {
                self.cast(x, rows * h * 4)
            };
            let wf = if !self.amp && self.param_size == 4 {
                None
            } else {
                Some(self.t.alloc(e * h * 4, Category::Activations, false))
            };
            // `F.linear` of a 2-D input without bias is `mm(x, w.t())`, whose backward saves
            // each operand only for the other's gradient (tools/autograd/derivatives.yaml
            // `mm`: `self: mm_mat1_backward(grad, mat2, ..)`, `mat2: mm_mat2_backward(grad,
            // self, ..)`): with a frozen router (LoRA) the fp32 input copy is not saved and
            // dies at once; the weight copy (or the weight) is saved while the input needs a
            // gradient (measured: rnd-t17-209-deepseekv3, one fp32 [tokens, hidden] per MoE
            // layer too many at the backward peak)
            let mut saved = Ids::default();
            if self.trainable(&router.w) {
                saved.push(xf);
            }
            if let Some(wf) = wf.filter(|_| self.rg(xf)) {
                saved.push(wf);
            }
            let logits = self.op(rows * e * 4, &[xf], saved.as_slice(), &[router.w.id], &[]);
            if let Some(wf) = wf {
                self.drop_(wf);
            }
            self.drop_(xf);
            let scores = self.op(rows * e * 4, &[logits], &[], &[], &[]);
            if moe.router_weights_in_compute_dtype {
                // (ERNIE 4.5 binds them to `_` too, but its checkpointed autocast case
                // rnd-t89-023-ernie45moe goes from +0.07% to +0.27% with them kept: left as
                // it was until its recomputed MoE is traced)
                self.drop_(logits);
            } else {
                // DeepseekV3MoE binds the router logits to `_` until it returns (traced on
                // torch 2.15 CPU: the fp32 [tokens, experts] `mm` alive at
                // rnd-i17-065-deepseekv3's prefill peak, the experts' un-permute)
                self.mlp_locals.push(logits);
            }
            self.t.transient(rows * e * 4 * 2, Category::Activations);
            if !moe.router_weights_in_compute_dtype {
                let topw = self.deepseek_routing_weights(scores, moe, &mut router_index, 4);
                self.drop_(scores);
                topw
            } else {
                let topw = self.op(rows * k * 4, &[scores], &[scores], &[], &[]);
                self.drop_(scores);
                // ERNIE 4.5: `routing_weights.to(hidden_states.dtype)`
                let cw = self.cast(topw, rows * k * c);
                self.drop_(topw);
                cw
            }
        } else if moe.granite_router {
            // GraniteMoeTopKRouter (models/granitemoe/modeling_granitemoe.py):
            // `router_logits = F.linear(x, w).float()`, `topk`, `softmax(top_k_logits)` in fp32
            // (saved), `.type_as(hidden_states)`; the fp32 logits stay bound to `_` in
            // GraniteMoeMoE.forward until the block returns
            let (logits, _) = self.linear(x, x_size, rows, router);
            let lf = self.cast(logits, rows * e * 4);
            self.drop_(logits);
            let topv = self.op(rows * k * 4, &[lf], &[], &[], &[]);
            let sm = self.op_saving_output(rows * k * 4, topv);
            self.drop_(topv);
            let topw = self.cast(sm, rows * k * c);
            self.drop_(sm);
            self.mlp_locals.push(lf);
            topw
        } else if moe.router_topk_then_softmax {
            // gpt-oss GptOssTopKRouter: top-k of the (biased) logits, softmax over those k in
            // the compute dtype (saved); the logits stay bound to `_` in GptOssMLP.forward
            // until the block returns
            let (logits, _) = self.linear(x, x_size, rows, router);
            let topv = self.op(rows * k * c, &[logits], &[], &[], &[]);
            let topw = self.op_saving_output(rows * k * c, topv);
            self.drop_(topv);
            self.mlp_locals.push(logits);
            topw
        } else if let Some(normalise) = moe.norm_topk_prob.filter(|_| !moe.router_scores_fp32) {
            // OLMoE (`OlmoeTopKRouter`, transformers 5.23 models/olmoe/modeling_olmoe.py), op by
            // op: the logits (autocast's linear: 16-bit under autocast, bound to `_` in the
            // block until it returns), `softmax(logits, dtype=torch.float)` (saved), `topk`
            // (fp32 values and int64 indices; TopkBackward saves the indices: derivatives.yaml
            // `topk`: `value_selecting_reduction_backward_symint(grad, dim, indices, ..)`), with
            // `norm_topk_prob` `router_top_value /= router_top_value.sum(-1, keepdim=True)` (an
            // in-place div_ whose backward needs the original `self`: a saved clone and the
            // [tokens, 1] divisor, as in `deepseek_routing_weights`), then
            // `.to(router_logits.dtype)`: a 16-bit copy under autocast, the tensor itself in
            // fp32. Traced on torch 2.15 CPU (rnd-t151-021-olmoe under amp-bf16, per MoE layer
            // after the block: the bf16 weight copy, the fp32 softmax, the topk indices, the
            // clone of the top values and the divisor, 76,672 B beside the experts)
            let (logits, ls) = self.linear(x, x_size, rows, router);
            let probs = self.op(rows * e * 4, &[logits], &[], &[], &[]);
            self.mlp_locals.push(logits);
            let topk_index = self.act(rows * k * 8, false);
            self.mlp_locals.push(topk_index);
            router_index = Some(topk_index);
            let topv = self.op(rows * k * 4, &[probs], &[probs, topk_index], &[], &[]);
            self.drop_(probs);
            let topv = if normalise {
                let denom = self.op(rows * 4, &[topv], &[], &[], &[]);
                // the in-place division as a new output with its input saved (the clone)
                let y = self.op(rows * k * 4, &[topv, denom], &[topv, denom], &[], &[]);
                self.drop_(topv);
                self.drop_(denom);
                y
            } else {
                topv
            };
            if ls != 4 {
                let w = self.cast(topv, rows * k * ls);
                self.drop_(topv);
                w
            } else {
                topv
            }
        } else {
            // softmax(router_logits, dtype=float) saved; top-k weights cast to the hidden dtype.
            // The router returns its logits and the block binds them to `_` until it returns
            // (`_, routing_weights, selected_experts = self.gate(..)` in Mixtral, Qwen2-MoE,
            // Qwen3-MoE, OLMoE; transformers 5.23)
            let (logits, _) = self.linear(x, x_size, rows, router);
            let probs = self.op(rows * e * 4, &[logits], &[], &[], &[]);
            self.mlp_locals.push(logits);
            let topw = self.op(rows * k * 4, &[probs], &[probs], &[], &[]);
            self.drop_(probs);
            topw
        };
        // `torch._grouped_mm` is not autocast-enabled: transformers casts the input to the
        // expert weights' dtype (integrations/moe.py `_grouped_mm`, `input.to(weight.dtype)`),
        // so under autocast the experts run in the fp32 parameter dtype
        let c = if self.amp { self.param_size } else { c };
        // routing weights fp32 make the weighted expert outputs fp32 (type promotion;
        // Mixtral's router returns them uncast: rdist131-003-mixtral's fp16 forward measured
        // `weighted_out` and its un-permuted copy as fp32 [tokens * k, hidden])
        let ws = if moe.routing_weights_fp32() { 4 } else { c };
        // experts: gathered rows (tokens*k), gate/up, act, mul, down, weighted
        let i = u128::from(moe.expert.intermediate);
        let ins = if moe.expert.gated { 2 } else { 1 };
        let ek = rows * k;
        if self.seq == 1 && self.mode.infer().is_some_and(|w| w.moe_decode_batched) {
            return self.moe_batched_decode(x, x_size, lp, moe, topw, pre_shared);
        }
        // The routing's index tensors (integrations/moe.py `grouped_mm_experts_forward`,
        // transformers 5.23), int64 per (token, k) pair: the router's top-k indices (bound to
        // `selected_experts` until the block returns), `expert_ids_g, perm =
        // torch.sort(expert_ids)` (locals until return), `perm // num_top_k` (the gather's
        // index, saved by its IndexBackward), and `expert_ids_g.float()` for `histc` (fp32 on
        // CPU, `.int()` on CUDA: 4 bytes either way, a local until return). Measured:
        // rdist-015-qwen2moe's forward, where these are 0.3 MB of a small model's MoE block.
        let index_bytes = ek * 8;
        if router_index.is_none() {
            let topk_index = self.act(index_bytes, false);
            self.mlp_locals.push(topk_index);
        }
        let sorted_ids = self.act(index_bytes, false);
        let perm = self.act(index_bytes, false);
        let token_index = self.act(index_bytes, false);
        let saved_index: &[TensorId] = if self.rg(x) { &[token_index] } else { &[] };
        // its backward's zeros [T, H] (`index_backward`, as for the un-permutation below; the
        // incoming gradient is grouped_mm's, contiguous, so no copy)
        let gathered = self.op(
            ek * h * x_size,
            &[x],
            saved_index,
            &[],
            &[rows * h * x_size],
        );
        self.drop_(token_index);
        // `sample_weights_g = sample_weights[perm]`: the routing weights gathered (a new
        // tensor, IndexBackward saving `perm`)
        let saved_perm: &[TensorId] = if self.rg(topw) { &[perm] } else { &[] };
        // (DeepSeek-V3's weights are in the scores' dtype, OLMoE's in the logits': 16-bit
        // under autocast)
        let topw_g_bytes = if router_index.is_some() {
            self.t.bytes(topw)
        } else {
            ek * ws
        };
        let topw_g = self.op(topw_g_bytes, &[topw], saved_perm, &[], &[topw_g_bytes]);
        let histc_input = self.act(ek * 4, false);
        // `tokens_per_expert = torch.histc(..)` (fp32 [E]) and `offsets = torch.cumsum(..,
        // dtype=torch.int32)`, locals until return; both grouped matmuls save `offs` for their
        // backward (traced on torch 2.15 CPU: one int32 [E] `cumsum` per MoE layer alive at the
        // backward peak)
        let tokens_per_expert = self.act(e * 4, false);
        let offsets = self.act(e * 4, false);
        // expert biases (gpt-oss): `gate_up_proj_bias[expert_ids_g]` is gathered per row before
        // the grouped matmul and added in place (`_grouped_linear`: `out.add_(bias)`); it stays
        // bound to `selected_biases` until the down bias replaces it
        let bias_gu = lp
            .experts
            .get(2)
            .map(|b| self.op(ek * ins * i * c, &[], &[], &[b.id], &[]));
        // a grouped matmul saves its input only for the (fused) expert weight's gradient
        let experts_trainable = self.trainable(&lp.experts[0]);
        let saved_g: &[TensorId] = if experts_trainable {
            &[gathered, offsets]
        } else {
            &[offsets]
        };
        let gu_inputs: Vec<TensorId> = std::iter::once(gathered).chain(bias_gu).collect();
        let gu = self.op(
            ek * ins * i * c,
            &gu_inputs,
            saved_g,
            &[lp.experts[0].id],
            &[],
        );
        let m = if moe.expert.gated && moe.expert.act == Activation::ClampedSwiglu {
            // GptOssExperts._apply_gate slices `gate_up[..., ::2]`, `gate_up[..., 1::2]`: two
            // SliceBackward nodes, each a full-size gradient (models/gpt_oss/modeling_gpt_oss.py)
            self.gate(gu, gu, ek * i * c, moe.expert.act)
        } else if moe.expert.gated {
            // `_default_apply_gate` (integrations/moe.py): `gate, up = gate_up_out.chunk(2, -1)`
            let (g, u) = self.chunk2(gu, ek * i * c);
            let m = self.gate(g, u, ek * i * c, moe.expert.act);
            self.drop_(g);
            self.drop_(u);
            m
        } else {
            self.activation(gu, ek * i * c, moe.expert.act)
        };
        self.drop_(gu);
        let bias_down = lp
            .experts
            .get(3)
            .map(|b| self.op(ek * h * c, &[], &[], &[b.id], &[]));
        if let Some(b) = bias_gu {
            self.drop_(b);
        }
        let saved_m: &[TensorId] = if experts_trainable {
            &[m, offsets]
        } else {
            &[offsets]
        };
        let down_inputs: Vec<TensorId> = std::iter::once(m).chain(bias_down).collect();
        let down = self.op(ek * h * c, &down_inputs, saved_m, &[lp.experts[1].id], &[]);
        self.drop_(m);
        if let Some(b) = bias_down {
            self.drop_(b);
        }
        // `proj_out * sample_weights_g.unsqueeze(-1)` (mul_tensor_backward,
        // torch/csrc/autograd/FunctionsManual.cpp): the routing weights' gradient is
        // `(grad * proj_out).sum_to(...)`, a full [S, H] product before the reduction, and the
        // experts' gradient `grad * weights` is computed in the promoted result dtype and
        // converted to proj_out's dtype only after the node returns (`validate_outputs`,
        // engine.cpp); both transients of the node, beyond the gradients it hands on.
        // `validate_outputs` casts the first gradient while both full products are alive (the
        // routing weights' `sum_to` comes after it), so the promoted product counts whole, next
        // to its cast copy (traced on torch 2.15 CPU, a bf16 DeepSeek-V3 at its backward peak:
        // the incoming [S, H] fp32 gradient, two fp32 `mul` products and the bf16 `_to_copy`
        // alive at once; the MoE backward was 1 bf16 [S, H] short)
        let mut saved = Ids::default();
        if self.rg(topw_g) {
            saved.push(down);
        }
        if self.rg(down) {
            saved.push(topw_g);
        }
        // the cast comes first: the routing weights' reduced gradient (allocated with the
        // node's input gradients) does not exist yet beside the two products
        let sum_to = match (self.rg(topw_g), self.rg(down) && ws > c) {
            (false, _) => 0,
            (true, false) => ek * h * ws,
            (true, true) => (ek * h * ws).saturating_sub(self.t.bytes(topw_g)),
        };
        let promoted = if self.rg(down) && ws > c {
            // Under non-reentrant checkpointing the saved tensors are the recomputed ones,
            // which the node holds only through the unpacked locals of its `apply`
            // (torch/utils/checkpoint.py `unpack_hook` drops the frame's handle): they die
            // when `apply` returns, before `validate_outputs` casts (measured: a checkpointed
            // bf16 DeepSeek-V3 peaks one saved [S, H] `proj_out` lower in this node)
            let gone: u128 = if self.recomputing {
                saved.as_slice().iter().map(|&t| self.t.bytes(t)).sum()
            } else {
                0
            };
            (ek * h * ws).saturating_sub(gone)
        } else {
            0
        };
        let weighted = self.op(
            ek * h * ws,
            &[down, topw_g],
            saved.as_slice(),
            &[],
            &[sum_to, promoted],
        );
        // `routing_weights` is bound in the block until it returns
        self.mlp_locals.push(topw);
        // `inv_perm = torch.empty_like(perm)`; `inv_perm[perm] = torch.arange(..)` (a
        // temporary); `weighted_out[inv_perm]` (a gather, new tensor, IndexBackward saving
        // `inv_perm`), then `.view(T, k, H).sum(1)`, then `.to(hidden_states.dtype)`
        let inv_perm = self.act(index_bytes, false);
        self.t.transient(index_bytes, Category::Activations);
        // IndexBackward is `index_backward` (torch/csrc/autograd/FunctionsManual.cpp):
        // `grad.new_zeros(self_sizes).index_put(indices, grad, accumulate=True)`, out of place,
        // so a zeros tensor beside the result. Its incoming gradient is ViewBackward's
        // `reshape` of SumBackward's `expand` of the [T, H] gradient: a contiguous copy (the
        // expanded view cannot be reshaped in place), made before the [T, H] gradient is freed.
        // Traced on torch 2.15 CPU (a checkpointed bf16 DeepSeek-V3 peaks here: the `clone` of
        // the expanded [T, k, H] gradient, `new_zeros` and `index_put`, all fp32, alive at once)
        let saved_inv: &[TensorId] = if self.rg(weighted) { &[inv_perm] } else { &[] };
        let unpermuted = self.op(ek * h * ws, &[weighted], saved_inv, &[], &[ek * h * ws]);
        self.drop_(weighted);
        self.drop_(inv_perm);
        // `.sum(1)`'s backward expands the gradient over the k routes (a view) and the `view`'s
        // backward reshapes it to [T·k, H]: a copy for k > 1, a view of the sum's gradient for
        // k = 1 (an expanded dimension of size 1 keeps the strides viewable)
        let summed = if k == 1 && self.rg(unpermuted) {
            let y = self.act(rows * h * ws, true);
            self.t.record(Node {
                inputs: Ids::of(&[unpermuted]),
                outputs: Ids::of(&[y]),
                input_grads_alias_output: true,
                ..Node::default()
            });
            y
        } else {
            self.op(rows * h * ws, &[unpermuted], &[], &[], &[])
        };
        self.drop_(unpermuted);
        let out = if ws != c {
            let y = self.cast(summed, rows * h * c);
            self.drop_(summed);
            y
        } else {
            summed
        };
        // `selected_hidden_states_g`, the last `proj_out` and the sort's outputs stay bound
        // until the experts function returns (integrations/moe.py `grouped_mm_experts_forward`)
        // (and `sample_weights_g`, the gathered routing weights)
        self.drop_(gathered);
        self.drop_(down);
        self.drop_(topw_g);
        self.drop_(sorted_ids);
        self.drop_(perm);
        self.drop_(histc_input);
        self.drop_(tokens_per_expert);
        self.drop_(offsets);
        self.drop_list(|b| &mut b.mlp_locals);
        self.shared_experts(x, x_size, lp, moe, out, pre_shared)
    }

    /// DeepSeek-V3's routing weights from the sigmoid `scores` (`DeepseekV3TopkRouter.forward`,
    /// transformers 5.23 models/deepseek_v3/modeling_deepseek_v3.py): the top-k indices (int64,
    /// bound to `selected_experts`-like locals until the block returns, so pushed to
    /// `mlp_locals` and handed back in `index`), `scores.gather(1, topk_indices)` (GatherBackward
    /// saves `self` and the index: tools/autograd/derivatives.yaml `gather`), with
    /// `norm_topk_prob` `topk_weights /= topk_weights.sum(-1, keepdim=True) + 1e-20` (an
    /// in-place `div_` whose backward needs the original `self` for the divisor's gradient, so
    /// autograd saves a clone of it and the divisor: `div.Tensor` `other:
    /// div_tensor_other_backward(grad, self, other)`), then `* routed_scaling_factor` (a new
    /// tensor, nothing saved). Traced on torch 2.15 CPU (rnd-t17-209-deepseekv3 at its backward
    /// peak, per MoE layer: the `topk` indices, the `clone` of the gathered weights and the
    /// `[tokens, 1]` divisor alive). `size`: bytes per element of the scores (fp32, or the
    /// autocast dtype).
    fn deepseek_routing_weights(
        &mut self,
        scores: TensorId,
        moe: &crate::model::MoeMlp,
        index: &mut Option<TensorId>,
        size: u128,
    ) -> TensorId {
        let rows = self.tokens;
        let ek = rows * u128::from(moe.top_k);
        let topk_index = self.act(ek * 8, false);
        self.mlp_locals.push(topk_index);
        *index = Some(topk_index);
        let gathered = self.op(ek * size, &[scores], &[scores, topk_index], &[], &[]);
        let normed = if moe.norm_topk_prob.unwrap_or(true) {
            let sum = self.op(rows * size, &[gathered], &[], &[], &[]);
            let denom = self.op(rows * size, &[sum], &[], &[], &[]);
            self.drop_(sum);
            // the in-place division as a new output with its input saved (the clone): the
            // same bytes at every instant
            let y = self.op(ek * size, &[gathered, denom], &[gathered, denom], &[], &[]);
            self.drop_(gathered);
            self.drop_(denom);
            y
        } else {
            gathered
        };
        let topw = self.op(ek * size, &[normed], &[], &[], &[]);
        self.drop_(normed);
        topw
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
        pre_shared: Option<TensorId>,
    ) -> TensorId {
        let rows = self.tokens;
        let c = self.compute_size;
        let h = self.hidden;
        let k = u128::from(moe.top_k);
        let i = u128::from(moe.expert.intermediate);
        let ins = if moe.expert.gated { 2 } else { 1 };
        let ek = rows * k;
        let ws = if moe.routing_weights_fp32() { 4 } else { c };
        let sel_h = self.op(ek * h * x_size, &[x], &[], &[], &[]);
        let w_gu = self.act(ek * ins * i * h * c, false);
        // expert biases (gpt-oss): `gate_up_proj_bias[expert_ids]`, added in place
        let bias_gu = (lp.experts.len() > 2).then(|| self.act(ek * ins * i * c, false));
        let gu = self.op(
            ek * ins * i * c,
            &[sel_h, w_gu],
            &[],
            &[lp.experts[0].id],
            &[],
        );
        let m = if moe.expert.gated && moe.expert.act == Activation::ClampedSwiglu {
            // GptOssExperts._apply_gate slices `gate_up[..., ::2]`, `gate_up[..., 1::2]`: two
            // SliceBackward nodes, each a full-size gradient (models/gpt_oss/modeling_gpt_oss.py)
            self.gate(gu, gu, ek * i * c, moe.expert.act)
        } else if moe.expert.gated {
            // `_default_apply_gate` (integrations/moe.py): `gate, up = gate_up_out.chunk(2, -1)`
            let (g, u) = self.chunk2(gu, ek * i * c);
            let m = self.gate(g, u, ek * i * c, moe.expert.act);
            self.drop_(g);
            self.drop_(u);
            m
        } else {
            self.activation(gu, ek * i * c, moe.expert.act)
        };
        self.drop_(gu);
        let w_down = self.act(ek * i * h * c, false);
        self.drop_(w_gu);
        let bias_down = (lp.experts.len() > 3).then(|| self.act(ek * h * c, false));
        if let Some(b) = bias_gu {
            self.drop_(b);
        }
        let down = self.op(ek * h * c, &[m, w_down], &[], &[lp.experts[1].id], &[]);
        self.drop_(m);
        if let Some(b) = bias_down {
            self.drop_(b);
        }
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
        self.drop_list(|b| &mut b.mlp_locals);
        self.shared_experts(x, x_size, lp, moe, out, pre_shared)
    }

    /// The shared experts' output (gated in Qwen2-MoE), `None` without shared experts.
    fn shared_output(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        moe: &crate::model::MoeMlp,
    ) -> Option<TensorId> {
        let so = self.shared_mlp(x, x_size, lp, moe)?;
        Some(self.gate_shared(x, x_size, lp, so))
    }

    /// The shared experts' MLP output, ungated; `None` without shared experts.
    fn shared_mlp(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        moe: &crate::model::MoeMlp,
    ) -> Option<TensorId> {
        let s = moe.shared.as_ref()?;
        let rows = self.tokens;
        Some(self.dense_mlp(x, x_size, rows, s, &lp.shared))
    }

    /// `so` weighted by Qwen2-MoE's `sigmoid(shared_expert_gate(x))` (unchanged without it).
    fn gate_shared(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        so: TensorId,
    ) -> TensorId {
        let rows = self.tokens;
        let c = self.compute_size;
        let h = self.hidden;
        if let Some(g) = lp.shared_gate {
            let (gl, _) = self.linear(x, x_size, rows, &g);
            let sg = self.op(rows * c, &[gl], &[], &[], &[]);
            self.drop_(gl);
            let y = self.mul(so, sg, rows * h * c);
            self.drop_(so);
            self.drop_(sg);
            y
        } else {
            so
        }
    }

    /// Adds the always-on shared expert (gated in Qwen2-MoE) to the routed output.
    fn shared_experts(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        moe: &crate::model::MoeMlp,
        out: TensorId,
        pre_shared: Option<TensorId>,
    ) -> TensorId {
        let so = match pre_shared {
            // Qwen2-MoE: the shared expert's MLP ran before the router, its gate runs now
            Some(so) if !moe.shared_first => self.gate_shared(x, x_size, lp, so),
            Some(so) => so,
            None => match self.shared_output(x, x_size, lp, moe) {
                Some(so) => so,
                None => return out,
            },
        };
        // `final_hidden_states + shared_output` (AddBackward0: the sum's gradient for an operand
        // of its dtype, a cast for the other): under autocast the routed output is in the
        // experts' fp32 parameter dtype and the shared experts' in the compute dtype, so the sum
        // is fp32 (type promotion)
        let rows = self.tokens * self.hidden;
        let size = self.t.bytes(out).max(self.t.bytes(so)) / rows.max(1);
        let sum = self.add(out, so, rows * size);
        self.drop_(out);
        self.drop_(so);
        sum
    }
}

#[cfg(test)]
mod tests {
    use crate::memory::{simulate_train, Kernels, Phase};
    use crate::model::tests::llama2_7b;
    use crate::model::{Activation, DenseMlp, Mlp, ModelDesc, MoeMlp};
    use crate::workload::TrainWorkload;

    /// Llama-2-7B's first two layers with a DeepSeek-V3 style MoE (fp32 sigmoid router,
    /// fused grouped experts, a shared expert).
    fn deepseek_moe(norm_topk_prob: bool) -> ModelDesc {
        let mut m = llama2_7b();
        m.layers.truncate(2);
        let expert = DenseMlp {
            intermediate: 256,
            gated: true,
            fused_gate_up: true,
            bias: false,
            act: Activation::Silu,
        };
        for l in &mut m.layers {
            l.mlp = Mlp::Moe(MoeMlp {
                num_experts: 8,
                top_k: 2,
                expert,
                router_bias: false,
                shared: Some(DenseMlp {
                    fused_gate_up: false,
                    ..expert
                }),
                shared_gate: false,
                router_extra_params: 0,
                router_fp32: true,
                router_topk_then_softmax: false,
                router_weights_in_compute_dtype: false,
                shared_first: false,
                frozen_router_params: 0,
                all_experts: false,
                granite_router: false,
                hunyuan_router: false,
                router_scores_fp32: false,
                norm_topk_prob: Some(norm_topk_prob),
            });
        }
        m
    }

    fn forward_peak(m: &ModelDesc, w: &TrainWorkload) -> u64 {
        let e = simulate_train(m, w, Kernels::Cpu).unwrap();
        e.phase_peak(Phase::Forward).unwrap()
    }

    #[test]
    fn the_normalised_routing_weights_save_a_clone_and_the_divisor() {
        // `topk_weights /= topk_weights.sum(-1, keepdim=True) + 1e-20` is an in-place `div_`
        // whose backward needs the original weights (a saved clone, [tokens, k] fp32) and the
        // divisor ([tokens, 1] fp32): alive from each MoE layer's router to its backward, so
        // the last layer's forward peak carries both layers' pairs
        let (batch, seq) = (2u64, 64u64);
        let w = TrainWorkload::new(batch, seq);
        let tokens = batch * seq;
        let per_layer = tokens * 2 * 4 + tokens * 4;
        let with = forward_peak(&deepseek_moe(true), &w);
        let without = forward_peak(&deepseek_moe(false), &w);
        assert_eq!(with - without, 2 * per_layer);
    }

    /// Llama-2-7B's first two layers with an OLMoE style MoE (softmax router over all
    /// experts, its top-k weights cast back to the logits' dtype, `norm_topk_prob` given).
    fn olmoe_moe(norm_topk_prob: bool) -> ModelDesc {
        let mut m = deepseek_moe(norm_topk_prob);
        for l in &mut m.layers {
            if let Mlp::Moe(moe) = &mut l.mlp {
                moe.shared = None;
                moe.router_fp32 = false;
            }
        }
        m
    }

    #[test]
    fn olmoes_router_keeps_the_topk_indices_and_the_normalised_weights_inputs() {
        // OlmoeTopKRouter: TopkBackward saves the int64 indices whether or not the weights are
        // normalised; `router_top_value /= sum` adds a saved clone of the fp32 top values and
        // the [tokens, 1] divisor, both alive from each MoE layer's router to its backward
        // (traced on torch 2.15 CPU, rnd-t151-021-olmoe)
        let (batch, seq) = (2u64, 64u64);
        let w = TrainWorkload::new(batch, seq);
        let tokens = batch * seq;
        let per_layer = tokens * 2 * 4 + tokens * 4;
        let with = forward_peak(&olmoe_moe(true), &w);
        let without = forward_peak(&olmoe_moe(false), &w);
        assert_eq!(with - without, 2 * per_layer);
        // the field unset: the router as modelled before (indices freed when the block
        // returns), two layers' [tokens, k] int64 indices fewer at the last layer's peak
        let mut unset = olmoe_moe(false);
        for l in &mut unset.layers {
            if let Mlp::Moe(moe) = &mut l.mlp {
                moe.norm_topk_prob = None;
            }
        }
        let indices = tokens * 2 * 8;
        assert_eq!(without - forward_peak(&unset, &w), 2 * indices);
    }
}
