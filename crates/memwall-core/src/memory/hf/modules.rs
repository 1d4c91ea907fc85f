//! The building blocks every layer calls: `nn.Linear` (with autocast, bitsandbytes and LoRA),
//! the norms and dropout.

use super::params::NF4_BLOCK;
use super::sac::SacOp;
use super::{mul, Builder, Kernels, LinearP, P};
use crate::memory::timeline::{Category, Ids, Node, TensorId};
use crate::model::{Norm, NormKind};
use crate::workload::WeightFormat;

impl Builder<'_> {
    /// Bytes per element of `linear`'s output: the compute dtype, except Falcon's biased
    /// projections under autocast, whose fp32 bias add makes it fp32 (`Builder::bias_fp32`).
    pub(super) fn linear_out_size(&self, lin: &LinearP) -> u128 {
        let w = self.mode.weights();
        let quantized =
            lin.quantized && matches!(w, Some(WeightFormat::Int8) | Some(WeightFormat::Fp8));
        if self.amp && self.bias_fp32 && lin.b.is_some() && !lin.nf4 && !quantized {
            4
        } else {
            self.compute_size
        }
    }

    /// `nn.Linear` / `F.linear` on `rows` rows: output saved-input semantics of `mm`
    /// (`tools/autograd/derivatives.yaml`: `mm` saves `self` when `mat2` needs grad and `mat2`
    /// when `self` needs grad). Under autocast the weight is cast once per autocast region and
    /// cached (`aten/src/ATen/autocast_mode.cpp`, `cached_cast`), the input is cast per call.
    /// LoRA per peft `tuners/lora/layer.py` `Linear.forward`.
    pub(super) fn linear(
        &mut self,
        x: TensorId,
        x_size: u128,
        rows: u128,
        lin: &LinearP,
    ) -> (TensorId, u128) {
        // every projection of a Falcon layer is a `FalconLinear`; the LM head is an `nn.Linear`
        let falcon_linear = self.bias_fp32 && lin.w.id != self.lm_head.unwrap_or(self.embed).id;
        self.linear_as(x, x_size, rows, lin, falcon_linear)
    }

    /// [`Builder::linear`], `falcon_linear` saying whether the module is Falcon's
    /// `FalconLinear` (under autocast) rather than an `nn.Linear` (peft's adapters are).
    fn linear_as(
        &mut self,
        x: TensorId,
        x_size: u128,
        rows: u128,
        lin: &LinearP,
        falcon_linear: bool,
    ) -> (TensorId, u128) {
        let c = self.compute_size;
        let w_tr = self.trainable(&lin.w);
        let mut params = Ids::of(&[lin.w.id]);
        if let Some(b) = lin.b {
            params.push(b.id);
        }
        let params = params.as_slice();
        let falcon_bias = self.linear_out_size(lin) == 4 && self.amp && c != 4;
        // `FalconLinear.forward` (every projection of a Falcon layer; the LM head is an
        // `nn.Linear`) multiplies by `self.weight.T`, a view, and autocast caches only leaf
        // tensors (`cached_cast`, aten/src/ATen/autocast_mode.cpp: `arg.is_leaf()`), so each
        // call casts anew, biased or not: mm saves the cast when the input needs a gradient,
        // and a checkpointed layer's first pass (nothing saved) frees it once the product is
        // made (measured: falcon-gqa-8h2kv-ampfp16-eager-ckpt-b2-s512, unbiased, was +2.09%
        // with the casts of layer 0 and 1 cached through the forward)
        let mut y_size = c;
        // torchtitan's SAC (`sac.rs`): a biased linear dispatches `addmm` (F.linear's 2-D and
        // contiguous 3-D paths, GPT-2's `Conv1D`), always kept; an unbiased one `mm`, counted
        let sac_op = if lin.b.is_some() {
            SacOp::Saved
        } else {
            SacOp::Mm
        };
        let y = if lin.nf4 && rows == 1 {
            // bnb `matmul_4bit` inference fast path: one token of one sequence runs `gemv_4bit`
            // on the packed weight, nothing dequantised
            self.op(rows * lin.out_f * x_size, &[x], &[], params, &[])
        } else if self.mode.weights() == Some(WeightFormat::Int8) && lin.quantized {
            // bitsandbytes MatMul8bitLt: row-wise int8 activations with fp32 stats, an int32
            // product, dequantised into the output (autograd/_functions.py)
            self.t.transient(
                rows * lin.in_f + rows * 4 + rows * lin.out_f * 4,
                Category::Activations,
            );
            self.op(rows * lin.out_f * x_size, &[x], &[], params, &[])
        } else if self.mode.weights() == Some(WeightFormat::Fp8) && lin.quantized {
            // FP8Linear: per-token-group (128) fp8 activations and their fp32 scales
            self.t.transient(
                rows * lin.in_f + rows * lin.in_f.div_ceil(128) * 4,
                Category::Activations,
            );
            self.op(rows * lin.out_f * x_size, &[x], &[], params, &[])
        } else if lin.nf4 {
            // bitsandbytes MatMul4Bit (autograd/_functions.py) with the dequant + F.linear path of
            // `gemm_4bit` for training-sized inputs (backends/cuda/ops.py): the weight is
            // dequantised to the input dtype for the forward and again in backward; nothing of the
            // frozen weight is saved.
            let dq = lin.w.numel * x_size + lin.w.numel.div_ceil(NF4_BLOCK) * 4;
            self.t
                .transient(dq + rows * lin.out_f * x_size, Category::Activations);
            let keep = self.sac_pre(sac_op);
            let y = self.op(rows * lin.out_f * x_size, &[x], &[], params, &[dq]);
            self.sac_keep(keep, &[y]);
            y
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
            let mut saved = Ids::default();
            if self.rg(xc) {
                saved.push(wc);
            }
            if w_tr {
                saved.push(xc);
            }
            // bf16 gradient of the cast weight, converted to the fp32 `.grad` by the cast's
            // own ToCopyBackward node once the linear's node is done
            let keep = self.sac_pre(sac_op);
            let y = if w_tr {
                let y = self.act(rows * lin.out_f * c, true);
                let inputs: &[TensorId] = if self.rg(xc) { &[xc] } else { &[] };
                self.t.record(Node {
                    saved,
                    inputs: Ids::of(inputs),
                    params: Ids::of(params),
                    outputs: Ids::of(&[y]),
                    backward_temps: lin.w.numel * c,
                    param_grads_cast: true,
                    ..Node::default()
                });
                y
            } else {
                self.op(
                    mul(mul(rows, lin.out_f), c),
                    &[xc],
                    saved.as_slice(),
                    params,
                    &[],
                )
            };
            self.sac_keep(keep, &[y]);
            if xc != x {
                self.drop_(xc);
            }
            if w_tr && !falcon_linear {
                self.autocast_cache.push(wc);
            } else {
                self.drop_(wc);
            }
            if falcon_bias {
                // `(x @ W.T) + bias`: the 16-bit product summed with the fp32 bias is fp32; add
                // saves nothing, the product is freed (`Builder::bias_fp32`)
                let sum = self.op(rows * lin.out_f * 4, &[y], &[], &[], &[]);
                self.drop_(y);
                y_size = 4;
                sum
            } else {
                y
            }
        } else {
            let mut saved = Ids::default();
            if w_tr {
                saved.push(x);
            }
            if self.t.host.active && self.rg(x) {
                // mm saves `weight.t()` for the input's gradient; the parameter stays alive
                // anyway, so only activation offloading (which copies it to host and back in
                // backward) makes this reference cost bytes
                saved.push(lin.w.id);
            }
            let keep = self.sac_pre(sac_op);
            let y = self.op(
                mul(mul(rows, lin.out_f), c),
                &[x],
                saved.as_slice(),
                params,
                &[],
            );
            self.sac_keep(keep, &[y]);
            y
        };
        let Some((a, b)) = lin.lora else {
            return (y, y_size);
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
            let (ha, _) = self.linear_as(xa, s, rows, &la, false);
            let (hb, _) = self.linear_as(ha, c, rows, &lb, false);
            (ha, hb, c)
        } else {
            let keep = self.sac_pre(SacOp::Mm);
            let ha = self.op(rows * rank * s, &[xa], &[xa], &[a.id], &[]);
            self.sac_keep(keep, &[ha]);
            let keep = self.sac_pre(SacOp::Mm);
            let hb = self.op(rows * lin.out_f * s, &[ha], &[ha], &[b.id], &[]);
            self.sac_keep(keep, &[hb]);
            (ha, hb, s)
        };
        self.drop_(ha);
        let scaled = self.op(rows * lin.out_f * s, &[hb], &[], &[], &[]);
        self.drop_(hb);
        // the sum is cast back to the base layer's output dtype (`result.to(torch_result_dtype)`)
        let out_size = c.max(s).max(y_size);
        // `result + lora_B(lora_A(x)) * scaling`: AddBackward hands the sum's gradient to both
        // operands where their dtypes agree (`Builder::add`), so the base output's and the
        // scaled adapter output's gradients are one tensor (traced with the MemTracker on
        // rnd-t157-024-falcon, amp-bf16 LoRA on dense_4h_to_h: an fp32 and two bf16
        // [43, 288] temporaries at the adapter's backward, not three bf16; it was +0.194%)
        let sum = self.add(y, scaled, rows * lin.out_f * out_size);
        self.drop_(y);
        self.drop_(scaled);
        let out = if out_size != y_size {
            let r = self.cast(sum, rows * lin.out_f * y_size);
            self.drop_(sum);
            (r, y_size)
        } else {
            (sum, y_size)
        };
        // peft/tuners/lora/layer.py `Linear.forward`: `x = self._cast_input_dtype(x,
        // lora_A.weight.dtype)` rebinds the function's `x`, so the cast input lives until
        // return, past the sum and `result.to(torch_result_dtype)` (not only as lora_A's saved
        // input: inside a checkpointed region nothing is saved; measured, rdist-044-gemma's
        // checkpointed LoRA MLP forward)
        if xa != x {
            self.drop_(xa);
        }
        out
    }

    /// A norm over `rows` rows of `dim`, input elements of `x_size` bytes. Returns (output, its size).
    pub(super) fn norm(
        &mut self,
        x: TensorId,
        x_size: u128,
        rows: u128,
        norm: &Norm,
        p: (P, Option<P>),
    ) -> (TensorId, u128) {
        let dim = u128::from(norm.dim);
        let n = rows * dim;
        let mut params = Ids::of(&[p.0.id]);
        if let Some(b) = p.1 {
            params.push(b.id);
        }
        let params = params.as_slice();
        match norm.kind {
            NormKind::LayerNorm => {
                // torch.native_layer_norm saves input, mean and rstd (one value per row).
                // Under CUDA autocast the op runs in fp32 (`layer_norm` is in autocast_mode.cpp's
                // CUDA fp32 list); CPU autocast lists it in neither list, so it runs in the
                // input's dtype with its output in that dtype (traced on torch 2.15 CPU: Phi's
                // q/k LayerNorms on bf16 projections under amp-bf16 save the bf16 input).
                let cpu = self.kernels == Kernels::Cpu;
                let (xin, out_size) = if self.amp && x_size != 4 && !cpu {
                    (self.cast(x, n * 4), 4)
                } else {
                    (x, x_size)
                };
                // mean and rstd: fp32 on CUDA (`layer_norm_cuda`'s accumulate type); on CPU in
                // the input's dtype (`layer_norm_cpu` with weights of that dtype; the fake
                // tensors' reference `native_layer_norm` converts them to the input's dtype on
                // CPU even with fp32 weights, where the real kernel keeps fp32: rows·2·2 bytes
                // per norm, measured as the fake tensors give it; crosscheck.py
                // xc-phiqkln-small-ampbf16-sgd: real 24,576 B above fake, exactly those bytes of
                // the three layers' q/k norms)
                let stat = if cpu { out_size } else { 4 };
                let mean = self.act(rows * stat, false);
                let rstd = self.act(rows * stat, false);
                let y = self.op(n * out_size, &[xin], &[xin, mean, rstd], params, &[]);
                self.drop_(mean);
                self.drop_(rstd);
                if xin != x {
                    self.drop_(xin);
                }
                (y, out_size)
            }
            NormKind::CohereLayerNorm => self.cohere_norm(x, x_size, rows, dim, p.0),
            NormKind::RmsNorm | NormKind::Olmo2RmsNorm | NormKind::GemmaRmsNorm
                if self.fused_norm() =>
            {
                self.liger_rms_norm(x, x_size, rows, dim, p.0)
            }
            NormKind::RmsNorm | NormKind::Olmo2RmsNorm | NormKind::GemmaRmsNorm => {
                // Shared prefix of LlamaRMSNorm, Olmo2RMSNorm and GemmaRMSNorm (transformers
                // models/{llama,olmo2,gemma}/modeling_*.py):
                //   h = x.to(float32); h = h * rsqrt(h.pow(2).mean(-1) + eps)
                let x32 = if x_size != 4 { self.cast(x, n * 4) } else { x };
                // pow(2), freed after mean
                self.t.transient(n * 4, Category::Activations);
                // Llama / Olmo2 bind `variance = h.pow(2).mean(-1, keepdim=True)` until the
                // norm returns; Gemma's `_norm` keeps the mean as an expression temporary,
                // freed by `+ eps`. `variance + eps` is a temporary freed after `rsqrt`.
                let variance = self.act(rows * 4, false);
                let eps_sum = self.act(rows * 4, false);
                if norm.kind == NormKind::GemmaRmsNorm {
                    self.drop_(variance);
                }
                // The decomposed backward, op by op (tools/truth/probes/rmsnorm_backward.py,
                // torch 2.15): this node stands for rsqrt/add/mean/pow; MeanBackward hands
                // PowBackward `grad.expand(...) / dim` (an fp32 [rows, dim] tensor), which
                // computes `grad * (2 * x.pow(1))` holding it, `x.pow(1)` and `2 * x.pow(1)`
                // beside the gradient it hands on: three temporaries beyond it, all freed before
                // that gradient is summed with the one from `h * rsqrt` (the probe: 6.501 units
                // at PowBackward's product, 4.501 at the sum)
                let rs = self.op(rows * 4, &[x32], &[x32], &[], &[3 * n * 4]);
                self.drop_(eps_sum);
                // `h * rsqrt(...)`: each operand saved for the other's gradient; the
                // row-broadcast factor's gradient `(grad * h).sum(-1)` is a full product before
                // the reduction (mul_tensor_backward)
                let mut hs = Ids::default();
                if self.rg(rs) {
                    hs.push(x32);
                }
                if self.rg(x32) {
                    hs.push(rs);
                }
                let t_rs: &[u128] = if self.rg(rs) { &[n * 4] } else { &[] };
                let h32 = self.op(n * 4, &[x32, rs], hs.as_slice(), &[], t_rs);
                // `hidden_states = hidden_states * torch.rsqrt(...)` rebinds the name: the
                // fp32 copy and the rsqrt temporary are released here (kept only where autograd
                // saved them); under no_grad, and inside a checkpointed region
                // (torch/utils/checkpoint.py `_checkpoint_hook`: nothing saved), the fp32 copy is
                // gone before `.to(input_dtype)` (tools/truth/probes/live_tensors.py on
                // rnd-i29-020-seedoss; the checkpointed q/k norms of rdist-001-gemma3text)
                self.drop_(rs);
                if x32 != x {
                    self.drop_(x32);
                }
                // mul saves `h` only for the weight's gradient (derivatives.yaml: mul saves
                // `other` when `self` needs grad and `self` when `other` does); the weight's
                // gradient `(grad * h).sum_to(weight)` is a full product before the reduction
                let w_tr = self.trainable(&p.0);
                let temps = if w_tr { [n * 4] } else { [0] };
                // Llama and Olmo2 bind `hidden_states` (the fp32 `h`) until the norm returns;
                // Gemma rebinds `output = output * (1.0 + weight.float())`, releasing it before
                // `type_as` (live_tensors.py on rnd-i17-063-olmo2: `h`, `weight * h` and the cast
                // alive at once)
                let gemma = norm.kind == NormKind::GemmaRmsNorm;
                let mut out_size = x_size;
                let y = if norm.kind == NormKind::RmsNorm && x_size != 4 {
                    // Llama: `weight * h.to(input_dtype)`: the weight multiplies in the input
                    // dtype. Under autocast the weight is the fp32 parameter and `mul` is in no
                    // autocast list, so a 16-bit input (a q/k projection's output: Qwen 3's and
                    // OLMoE's q_norm/k_norm) gives an fp32 product by type promotion (traced on
                    // torch 2.15 CPU, rnd-t151-021-olmoe under amp-bf16: q_norm's output and
                    // `clamp_`'s saved copy are fp32 [tokens, hidden]). Its backward computes
                    // both gradients in fp32 (mul_tensor_backward); the 16-bit input's is cast
                    // only after the node returns (engine.cpp `validate_outputs`), beside it.
                    let promoted = self.amp;
                    let y_size = if promoted { 4 } else { x_size };
                    let hd = self.cast(h32, n * x_size);
                    let saved: &[TensorId] = if w_tr { &[hd] } else { &[] };
                    let w_temp = if w_tr { n * y_size } else { 0 };
                    let cast_temp = if promoted && self.rg(hd) {
                        n * y_size
                    } else {
                        0
                    };
                    let y = self.op(n * y_size, &[hd], saved, params, &[w_temp, cast_temp]);
                    self.drop_(hd);
                    out_size = y_size;
                    y
                } else {
                    // Olmo2: `(weight * h).to(input_dtype)`; Gemma: `(h * (1 + weight.float())).type_as(x)`:
                    // the weight multiplies in fp32, then one cast
                    let mut saved = Ids::default();
                    if w_tr {
                        saved.push(h32);
                    }
                    // Gemma's factor `1.0 + weight.float()` is a new fp32 [dim] tensor (the
                    // `.float()` copy before it a temporary, unless the weight is fp32 already),
                    // which the product saves for the input's gradient (derivatives.yaml `mul`):
                    // alive until this node's backward (tools/truth/probes/h51_live_storages.py on
                    // rnd-s197-gemma3text-0: one fp32 `add` [hidden] per layer norm and [head_dim]
                    // per q/k norm alive at the end of the forward; the bf16 and fp16 variants
                    // of rnd-t197-018-gemma3text were 8,576 B short, 11 norms of 2 layers)
                    let factor = gemma.then(|| {
                        let f = self.act(dim * 4, false);
                        if self.param_size != 4 {
                            self.t.transient(dim * 4, Category::Activations);
                        }
                        if self.rg(h32) {
                            saved.push(f);
                        }
                        f
                    });
                    let y32 = self.op(n * 4, &[h32], saved.as_slice(), params, &temps);
                    if let Some(f) = factor {
                        self.drop_(f);
                    }
                    if gemma {
                        self.drop_(h32);
                    }
                    if x_size != 4 {
                        let y = self.cast(y32, n * x_size);
                        self.drop_(y32);
                        y
                    } else {
                        y32
                    }
                };
                if !gemma {
                    self.drop_(h32);
                    self.drop_(variance);
                }
                (y, out_size)
            }
        }
    }

    /// `CohereLayerNorm.forward` (models/cohere/modeling_cohere.py), op by op: every step is an
    /// fp32 tensor; `pow` saves its input, `rsqrt` its result, the two multiplications their
    /// operands crosswise (`tools/autograd/derivatives.yaml`).
    fn cohere_norm(
        &mut self,
        x: TensorId,
        x_size: u128,
        rows: u128,
        dim: u128,
        w: P,
    ) -> (TensorId, u128) {
        let n = rows * dim;
        // hidden_states = hidden_states.to(torch.float32)
        let x32 = if x_size != 4 { self.cast(x, n * 4) } else { x };
        let mean = self.op(rows * 4, &[x32], &[], &[], &[]);
        // variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
        let c1 = self.op(n * 4, &[x32, mean], &[], &[], &[]);
        let sq = self.op(n * 4, &[c1], &[c1], &[], &[]);
        self.drop_(c1);
        let var = self.op(rows * 4, &[sq], &[], &[], &[]);
        self.drop_(sq);
        // (hidden_states - mean) * torch.rsqrt(variance + eps)
        let c2 = self.op(n * 4, &[x32, mean], &[], &[], &[]);
        let ve = self.op(rows * 4, &[var], &[], &[], &[]);
        let rs = self.op_saving_output(rows * 4, ve);
        self.drop_(ve);
        let h = self.mul(c2, rs, n * 4);
        self.drop_(c2);
        self.drop_(rs);
        if x32 != x {
            self.drop_(x32);
        }
        // self.weight.to(torch.float32) * hidden_states
        let y32 = if self.param_size != 4 {
            let wf = self.op(dim * 4, &[], &[], &[w.id], &[]);
            let y = self.mul(wf, h, n * 4);
            self.drop_(wf);
            y
        } else {
            let saved: &[TensorId] = if self.trainable(&w) { &[h] } else { &[] };
            self.op(n * 4, &[h], saved, &[w.id], &[])
        };
        self.drop_(h);
        // `return hidden_states.to(input_dtype)`: mean and variance are locals until then
        let out = if x_size != 4 {
            let y = self.cast(y32, n * x_size);
            self.drop_(y32);
            (y, x_size)
        } else {
            (y32, 4)
        };
        self.drop_(mean);
        self.drop_(var);
        out
    }

    /// Liger's `LigerRMSNormFunction` (Liger-Kernel 0.8.5 `ops/rms_norm.py`, llama and gemma
    /// casting modes alike): `Y` in the input dtype and `RSTD` fp32 per row; saves `X, W, RSTD`.
    /// Backward writes `dX` over `dY` (`in_place=True`), and for a trainable weight allocates the
    /// fp32 partial sums `_dW [sm_count, H]`, then `_dW.sum(0)` (fp32) and its `.to(W.dtype)`.
    fn liger_rms_norm(
        &mut self,
        x: TensorId,
        x_size: u128,
        rows: u128,
        dim: u128,
        w: P,
    ) -> (TensorId, u128) {
        let w_tr = self.trainable(&w);
        let rg = self.rg(x) || w_tr;
        let y = self.act(rows * dim * x_size, rg);
        let rstd = self.act(rows * 4, false);
        if rg {
            let w_elem = self.t.bytes(w.id) / w.numel.max(1);
            let temps = if w_tr {
                crate::liger::LIGER_SM_COUNT * dim * 4 + if w_elem != 4 { dim * 4 } else { 0 }
            } else {
                0
            };
            let inputs: &[TensorId] = if self.rg(x) { &[x] } else { &[] };
            self.t.record(Node {
                saved: Ids::of(&[x, rstd]),
                inputs: Ids::of(inputs),
                params: Ids::of(&[w.id]),
                outputs: Ids::of(&[y]),
                backward_temps: temps,
                input_grad_is_output_grad: true,
                ..Node::default()
            });
        }
        self.drop_(rstd);
        (y, x_size)
    }

    /// Training-mode dropout; p = 0 returns the input itself (`ATen/native/Dropout.cpp`).
    pub(super) fn dropout(&mut self, x: TensorId, bytes: u128, elem: u128, p: f64) -> TensorId {
        if p <= 0.0 || !self.mode.dropout() {
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
}

#[cfg(test)]
mod tests {
    use crate::dtype::Precision;
    use crate::memory::hf::Builder;
    use crate::memory::timeline::Category;
    use crate::memory::Kernels;
    use crate::model::tests::llama2_7b;
    use crate::model::{Norm, NormKind};
    use crate::workload::TrainWorkload;

    /// One fp32 LlamaRMSNorm's forward and backward, as `tools/truth/probes/rmsnorm_backward.py
    /// llama float32` traces it (torch 2.15 CPU, rows 512 × dim 256): the backward peaks at
    /// PowBackward's product with 6.002 [rows, dim] fp32 units alive beyond the input, its
    /// incoming gradient and the weight (mean's expanded gradient, `x.pow(1)`, `2 * x.pow(1)`,
    /// the product, the other path's gradient of `x` and the output), and the sum of `x`'s two
    /// gradients comes after those temporaries are freed (4.002).
    #[test]
    fn rms_norm_backward_peaks_inside_pow_backward_as_traced() {
        let mut m = llama2_7b();
        m.layers.truncate(1);
        let mut w = TrainWorkload::new(1, 512);
        w.precision = Precision::Fp32;
        let mut b = Builder::train(&m, &w, Kernels::Cpu, None);
        let (rows, dim) = (512u128, 256u128);
        let unit = rows * dim * 4;
        let p = b.new_param(dim, true);
        let x = b.act(unit, true);
        let norm = Norm {
            kind: NormKind::RmsNorm,
            dim: 256,
            bias: false,
        };
        let before = b.t.live();
        let (y, _) = b.norm(x, 4, rows, &norm, (p, None));
        // the incoming gradient, held by the caller for the whole backward as in the probe
        let g = b.t.alloc(unit, Category::Temporaries, false);
        b.t.set_grad(y, g);
        b.t.reset_peak();
        while let Some(node) = b.t.tape.pop() {
            b.t.backward_node(&node);
        }
        let beyond = b.t.peak() - before - unit;
        // whole units, and the small [rows] and [dim] tensors below one
        assert_eq!(
            beyond / unit,
            6,
            "{beyond} bytes = {} units",
            beyond as f64 / unit as f64
        );
    }

    /// A Llama-form RMSNorm (`weight * h.to(input_dtype)`) on a 16-bit input: under autocast
    /// the fp32 weight promotes the product to fp32 (OLMoE's and Qwen 3's q/k norms on bf16
    /// projections; traced on torch 2.15 CPU, rnd-t151-021-olmoe), in a bf16 model it stays
    /// bf16; an fp32 input is unchanged either way.
    #[test]
    fn a_llama_rms_norm_of_a_16_bit_input_is_fp32_under_autocast() {
        let out = |precision: Precision, x_size: u128| {
            let mut m = llama2_7b();
            m.layers.truncate(1);
            let mut w = TrainWorkload::new(1, 64);
            w.precision = precision;
            let mut b = Builder::train(&m, &w, Kernels::Cpu, None);
            let (rows, dim) = (64u128, 128u128);
            let p = b.new_param(dim, true);
            let x = b.act(rows * dim * x_size, true);
            let norm = Norm {
                kind: NormKind::RmsNorm,
                dim: 128,
                bias: false,
            };
            let (y, ys) = b.norm(x, x_size, rows, &norm, (p, None));
            assert_eq!(b.t.bytes(y), rows * dim * ys);
            ys
        };
        assert_eq!(out(Precision::AmpBf16, 2), 4);
        assert_eq!(out(Precision::AmpFp16, 2), 4);
        assert_eq!(out(Precision::Bf16, 2), 2);
        assert_eq!(out(Precision::AmpBf16, 4), 4);
    }

    /// GemmaRMSNorm's `output * (1.0 + self.weight.float())`: the factor is a new fp32 [dim]
    /// tensor the product saves for its input's gradient, so it stays with the norm's saved
    /// tensors whenever the input needs a gradient (frozen weight or not), and goes at once
    /// when nothing does (traced: rnd-s197-gemma3text-0, one fp32 `add` [hidden] per norm).
    #[test]
    fn a_gemma_norm_keeps_its_one_plus_weight_factor_for_the_inputs_gradient() {
        let saved = |kind: NormKind, x_grad: bool, w_trainable: bool| {
            let mut m = llama2_7b();
            m.layers.truncate(1);
            let mut w = TrainWorkload::new(1, 64);
            w.precision = Precision::Bf16;
            let mut b = Builder::train(&m, &w, Kernels::Cpu, None);
            let (rows, dim) = (64u128, 128u128);
            let p = b.new_param(dim, w_trainable);
            let x = b.act(rows * dim * 2, x_grad);
            let norm = Norm {
                kind,
                dim: 128,
                bias: false,
            };
            let before = b.t.live();
            let (y, _) = b.norm(x, 2, rows, &norm, (p, None));
            b.drop_(y);
            b.t.live() - before
        };
        let factor = 128 * 4;
        for w_trainable in [true, false] {
            // Olmo2's `(weight * h)` has the same shape otherwise, without the factor
            assert_eq!(
                saved(NormKind::GemmaRmsNorm, true, w_trainable),
                saved(NormKind::Olmo2RmsNorm, true, w_trainable) + factor
            );
        }
        assert_eq!(saved(NormKind::GemmaRmsNorm, false, false), 0);
    }
}
