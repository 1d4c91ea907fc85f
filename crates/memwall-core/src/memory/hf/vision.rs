//! Image inputs of a vision-language wrapper (`--image-tokens N`): the vision tower's forward
//! over the patches of one image per sequence, the projector, and the merge of the image
//! features into the text embeddings, op by op as transformers 5.23 runs them
//! (`qwen2_vl/modeling_qwen2_vl.py`: `Qwen2VLModel.forward`, `get_image_features`,
//! `get_placeholder_mask`, `Qwen2VisionTransformerPretrainedModel.forward`,
//! `Qwen2VLVisionBlock`, `VisionAttention`, `apply_rotary_pos_emb_vision`, `VisionMlp`,
//! `PatchMerger`; `qwen2_5_vl/modeling_qwen2_5_vl.py`: `Qwen2_5_VisionTransformerPretrainedModel`
//! with `permute_input_for_window_attn`, `Qwen2_5_VLRMSNorm`, `Qwen2_5_VLMLP`, and
//! transformers `vision_utils.py` `get_vision_window_index` for the windows).
//!
//! The tower is frozen (its parameters do not require grad) and `pixel_values` never require
//! grad, so without checkpointing autograd records nothing in it: transformers does not wrap
//! it in `no_grad`, but an op none of whose inputs requires grad saves nothing
//! (`torch/csrc/autograd`), so every tensor of the tower is a transient freed by reference
//! counting. With checkpointing, `enable_input_require_grads` makes the patch embeddings
//! require grad and the tower runs a backward (checkpointed blocks recomputed, frozen weights:
//! `Builder::vision_tower`). What outlives the tower:
//! its output object (`last_hidden_state` and the merged `pooler_output`), the concatenated
//! `image_embeds` and both placeholder masks, all locals of `Qwen2VLModel.forward` until the
//! language model returns; `masked_scatter` saves the image mask when the embeddings require
//! grad (`tools/autograd/derivatives.yaml`: `masked_scatter` backward needs `mask` only).
//! The pixel values themselves are the batch's input tensor (fp32, from the image processor),
//! not counted, like the input ids.

use super::Builder;
use crate::memory::timeline::{Ids, Node, TensorId};
use crate::model::{VisionForward, VisionKind};
use crate::workload::AttentionImpl;

/// Runs of equal attention chunks, (patches, count).
type Runs = Vec<(u128, u128)>;

impl Builder<'_> {
    /// Runs the image path when the model has image tokens and this forward carries pixels
    /// (every training forward; the prefill of an inference); returns the embeddings to go on
    /// with, consuming `emb`'s reference.
    pub(super) fn image_merge(&mut self, emb: TensorId) -> TensorId {
        let Some(v) = self.model.vision.as_ref() else {
            return emb;
        };
        let (Some(f), Some(n)) = (v.forward.as_ref(), v.image_tokens) else {
            return emb;
        };
        if self.mode.is_infer() {
            if self.images_done {
                return emb;
            }
            self.images_done = true;
        }
        match f.kind {
            VisionKind::Gemma3Siglip => return self.gemma3_image_merge(f, emb, u128::from(n)),
            VisionKind::Pixtral => return self.pixtral_image_merge(f, emb, u128::from(n)),
            VisionKind::Llama4 => return self.llama4_image_merge(f, emb, u128::from(n)),
            VisionKind::Qwen2Vl | VisionKind::Qwen25Vl => {}
        }
        let s = self.param_size;
        let n = u128::from(n);
        let images = self.batch;
        // get_image_features: `pixel_values.type(self.visual.dtype)` (a copy unless fp32)
        let patches = images * n * u128::from(f.merge) * u128::from(f.merge);
        let pv = (s != 4).then(|| self.act(patches * u128::from(f.patch_in) * s, false));
        let (last, merged) = self.vision_tower(f, images, n);
        if let Some(pv) = pv {
            self.drop_(pv);
        }
        // `torch.cat(pooler_output splits).to(inputs_embeds.dtype)`: a copy
        let out = u128::from(f.out);
        let image_embeds = self.op(images * n * out * s, &[merged], &[], &[], &[]);
        // get_placeholder_mask: `input_ids == image_token_id` and `== video_token_id`, [B, S]
        // bool each; the video mask is bound to `_` by the caller, a local too
        let rows = self.tokens;
        let image_mask = self.act(rows, false);
        let video_mask = self.act(rows, false);
        // `inputs_embeds.masked_scatter(image_mask, image_embeds)`: a new tensor
        let merged_embeds = self.masked_scatter_embeds(emb, image_embeds, image_mask);
        self.vision_refs
            .extend([last, merged, image_embeds, image_mask, video_mask]);
        merged_embeds
    }

    /// `inputs_embeds.masked_scatter(mask, source)` over the text embeddings `emb` (released:
    /// the wrapper rebinds `inputs_embeds`): a new tensor of the embeddings' size whose node
    /// saves only the mask (`masked_scatter` in tools/autograd/derivatives.yaml: the source's
    /// gradient is `masked_select` of the output's) and sends gradients to whichever of `emb`
    /// and `source` requires them.
    pub(super) fn masked_scatter_embeds(
        &mut self,
        emb: TensorId,
        source: TensorId,
        mask: TensorId,
    ) -> TensorId {
        let rg = self.rg(emb) || self.rg(source);
        let merged = self.act(self.tokens * self.hidden * self.param_size, rg);
        if rg {
            let mut inputs = Ids::default();
            for x in [emb, source] {
                if self.rg(x) {
                    inputs.push(x);
                }
            }
            self.t.record(Node {
                saved: Ids::of(&[mask]),
                inputs,
                outputs: Ids::of(&[merged]),
                ..Node::default()
            });
        }
        self.drop_(emb);
        merged
    }

    /// Drops the wrapper's image locals when its language model has returned.
    pub(super) fn drop_image_locals(&mut self) {
        self.image_blocks = false;
        for r in std::mem::take(&mut self.vision_refs) {
            self.drop_(r);
        }
    }

    /// The attention chunks of the tower in patches, as runs of (patches, count): one per
    /// image (`cu_seqlens`), and Qwen2.5-VL's windows; returns (full, windowed).
    fn vision_chunks(f: &VisionForward, images: u128, n: u128) -> (Runs, Runs) {
        let merge2 = u128::from(f.merge) * u128::from(f.merge);
        let full = vec![(n * merge2, images)];
        let windows = if f.kind == VisionKind::Qwen25Vl && f.window > 0 {
            let mut runs: Vec<(u128, u128)> = Vec::new();
            let per_image = window_chunks(n, u128::from(f.window));
            let single = runs_of(per_image.iter().map(|t| t * merge2));
            if single.len() == 1 {
                runs.push((single[0].0, single[0].1 * images));
            } else {
                for _ in 0..images {
                    for &(len, count) in &single {
                        push_run(&mut runs, len, count);
                    }
                }
            }
            runs
        } else {
            full.clone()
        };
        (full, windows)
    }

    /// The vision transformer's forward (`Qwen2VisionTransformerPretrainedModel` /
    /// `Qwen2_5_VisionTransformerPretrainedModel.forward`) over `images` images of `n` LLM
    /// tokens each; returns (`last_hidden_state`, merged `pooler_output`).
    ///
    /// Without checkpointing no tensor of the tower requires grad. With it, transformers 5.23
    /// `activation_checkpointing_enable` calls `enable_input_require_grads`, whose forward hook
    /// on the tower's `get_input_embeddings()` (`_input_embed_layer = "patch_embed"`) calls
    /// `output.requires_grad_(True)` (`modeling_utils.py`): the patch embeddings are a leaf
    /// that requires grad, held by its AccumulateGrad node until backward reaches it, and the
    /// frozen tower records autograd from there. Its blocks are `GradientCheckpointingLayer`s,
    /// checkpointed (non-reentrant, `torch/utils/checkpoint.py`) like the text layers: each
    /// keeps its inputs (the hidden state and the fp32 rotary cos/sin) and is recomputed when
    /// backward reaches it, after the whole text backward (the tower ran first). The ops
    /// outside the blocks (Qwen2.5-VL's window permutation, the merger) save what their
    /// backward needs with frozen weights: a linear saves nothing of its input, a norm its
    /// input and statistics, GELU its input, an index its indices
    /// (`tools/autograd/derivatives.yaml`).
    fn vision_tower(&mut self, f: &VisionForward, images: u128, n: u128) -> (TensorId, TensorId) {
        let s = self.param_size;
        let merge2 = u128::from(f.merge) * u128::from(f.merge);
        let p = images * n * merge2;
        let e = u128::from(f.width);
        let heads = u128::from(f.heads).max(1);
        let hd = e / heads;
        let qwen25 = f.kind == VisionKind::Qwen25Vl;
        let grad = self.mode.checkpointing();
        let (full, windows) = Self::vision_chunks(f, images, n);
        // get_vision_position_ids: int64 [P, 2] (h, w coordinates)
        let pos = self.act(p * 2 * 8, false);
        // Qwen2.5-VL get_vision_window_index: int64 window_index over the LLM tokens
        let widx = qwen25.then(|| self.act(p / merge2 * 8, false));
        // PatchEmbed: Conv3d with kernel = stride = the patch, output [P, E]
        let mut h = self.act(p * e * s, false);
        if grad {
            // enable_input_require_grads' hook: the patch embeddings become a leaf that
            // requires grad; its AccumulateGrad node holds it until backward reaches it
            self.input_grad_leaf(h);
        }
        if let Some(widx) = widx {
            // permute_input_for_window_attn: `x[window_index]`, a copy; the index is saved
            let hw = self.op(p * e * s, &[h], &[widx], &[], &[]);
            self.drop_(h);
            h = hw;
        }
        // the vision rotary embedding: fp32 cos and sin, [P, head_dim] each (Qwen2.5-VL:
        // permuted by window too, copies; the tuple is rebound)
        let mut cos = self.act(p * hd * 4, false);
        let mut sin = self.act(p * hd * 4, false);
        if qwen25 {
            let c2 = self.act(p * hd * 4, false);
            let s2 = self.act(p * hd * 4, false);
            self.drop_(cos);
            self.drop_(sin);
            cos = c2;
            sin = s2;
        }
        for block in 0..f.depth {
            let windowed = qwen25 && f.window > 0 && !f.full_blocks.contains(&block);
            let chunks = if windowed { &windows } else { &full };
            let y = if grad {
                // the checkpointed block: its forward saves nothing, the checkpoint keeps its
                // inputs for the recompute
                self.t.recording = false;
                let y = self.vision_block(f, chunks, h, cos, sin, p);
                self.t.recording = true;
                self.t.set_requires_grad(y, true);
                self.t.record(Node {
                    saved: Ids::of(&[h, cos, sin]),
                    outputs: Ids::of(&[y]),
                    recompute_vision: Some(u32::try_from(block).unwrap_or(u32::MAX)),
                    ..Node::default()
                });
                y
            } else {
                self.vision_block(f, chunks, h, cos, sin, p)
            };
            self.drop_(h);
            h = y;
        }
        // Qwen2.5-VL: `reverse_indices = torch.argsort(window_index)` before the merger
        let rev = qwen25.then(|| self.act(p / merge2 * 8, false));
        // PatchMerger: mlp(ln_q(x).view(-1, E·merge²)): Linear, GELU, Linear
        let ln = self.vision_norm_of(qwen25, h, p * e, p);
        let l1 = self.op(p * e * s, &[ln], &[], &[], &[]);
        self.drop_(ln);
        // nn.GELU saves its input
        let gelu = self.op(p * e * s, &[l1], &[l1], &[], &[]);
        self.drop_(l1);
        let out = p / merge2.max(1) * u128::from(f.out) * s;
        let mut merged = self.op(out, &[gelu], &[], &[], &[]);
        self.drop_(gelu);
        if let Some(rev) = rev {
            // `merged_hidden_states[reverse_indices, :]`: a copy, the unordered one rebound
            let ordered = self.op(out, &[merged], &[rev], &[], &[]);
            self.drop_(merged);
            merged = ordered;
        }
        for x in [Some(pos), widx, rev, Some(cos), Some(sin)]
            .into_iter()
            .flatten()
        {
            self.drop_(x);
        }
        (h, merged)
    }

    /// Recomputes checkpointed vision layer `node` (`block`: its index in the tower) when
    /// backward first reaches it: the non-reentrant checkpoint's first unpack re-runs the
    /// layer's forward with saving on (`torch/utils/checkpoint.py` `_checkpoint_hook`); its
    /// nodes then run on the tape. The layer is the tower's own (`VisionForward::kind`), with the
    /// inputs its checkpoint saved.
    pub(super) fn recompute_vision_block(&mut self, node: &Node, block: u32) {
        let model = self.model;
        let Some(v) = model.vision.as_ref() else {
            return;
        };
        let (Some(f), Some(n)) = (v.forward.as_ref(), v.image_tokens) else {
            return;
        };
        let n = u128::from(n);
        // images (tiles for Llama 4) of the batch, each `per_image` tokens
        let images = self.batch * (n / u128::from(f.per_image).max(1));
        let patches = self.batch * n * u128::from(f.merge) * u128::from(f.merge);
        match (f.kind, node.saved.as_slice()) {
            (VisionKind::Gemma3Siglip, &[h]) => {
                self.rerun_checkpointed(node, |b| b.siglip_block(f, images, h));
            }
            (VisionKind::Llama4, &[h]) => {
                self.rerun_checkpointed(node, |b| b.llama4_block(f, images, h));
            }
            (VisionKind::Pixtral, &[h, cos, sin]) => {
                self.rerun_checkpointed(node, |b| b.pixtral_block(f, patches, h, cos, sin, None));
            }
            (VisionKind::Pixtral, &[h, cos, sin, mask]) => {
                self.rerun_checkpointed(node, |b| {
                    b.pixtral_block(f, patches, h, cos, sin, Some(mask))
                });
            }
            (VisionKind::Qwen2Vl | VisionKind::Qwen25Vl, &[h, cos, sin]) => {
                let (full, windows) = Self::vision_chunks(f, self.batch, n);
                let windowed = f.kind == VisionKind::Qwen25Vl
                    && f.window > 0
                    && !f.full_blocks.contains(&u64::from(block));
                let chunks = if windowed { windows } else { full };
                self.rerun_checkpointed(node, |b| b.vision_block(f, &chunks, h, cos, sin, patches));
            }
            _ => {}
        }
    }

    /// The shared part of every checkpointed layer's recompute: the checkpoint's saved inputs
    /// stay held until the layer's backward is done, `run` re-records the layer's forward, and
    /// the gradient the layer's output was given moves to the recomputed output.
    fn rerun_checkpointed(&mut self, node: &Node, run: impl FnOnce(&mut Self) -> TensorId) {
        let Some(&out) = node.outputs.as_slice().first() else {
            return;
        };
        self.t.tape.push(Node {
            saved: node.saved,
            ..Node::default()
        });
        let y = run(self);
        self.t.move_grad(out, y);
        self.drop_(y);
    }

    /// One vision block (`Qwen2VLVisionBlock` / `Qwen2_5_VLVisionBlock`) over `p` patches:
    /// `h + attn(norm1(h))`, then `h + mlp(norm2(h))`; returns its output, `h` keeps its
    /// reference. The weights are frozen, so a linear saves nothing of its input (`addmm`
    /// saves `mat1` only when `mat2` requires grad, derivatives.yaml).
    fn vision_block(
        &mut self,
        f: &VisionForward,
        chunks: &[(u128, u128)],
        h: TensorId,
        cos: TensorId,
        sin: TensorId,
        p: u128,
    ) -> TensorId {
        let s = self.param_size;
        let e = u128::from(f.width);
        let heads = u128::from(f.heads).max(1);
        let m = u128::from(f.mlp);
        let qwen25 = f.kind == VisionKind::Qwen25Vl;
        // hidden_states + attn(norm1(hidden_states)): norm1's output is attn's argument
        let n1 = self.vision_norm_of(qwen25, h, p * e, p);
        let qkv = self.op(p * 3 * e * s, &[n1], &[], &[], &[]);
        // `.reshape(P, 3, heads, -1).permute(1, 0, 2, 3)`: a view whose gradient is made
        // contiguous for the linear (a copy), then `.unbind(0)`: three views whose gradients
        // are stacked (`unbind_backward`: `stack`)
        let rg = self.rg(qkv);
        let r = self.t.view(qkv, p * 3 * e * s, rg);
        let [qv, kv, vv] = [0; 3].map(|_| self.t.view(r, p * e * s, rg));
        if rg {
            self.t.record(Node {
                inputs: Ids::of(&[qkv]),
                outputs: Ids::of(&[r]),
                ..Node::default()
            });
            self.t.record(Node {
                inputs: Ids::of(&[r]),
                outputs: Ids::of(&[qv, kv, vv]),
                ..Node::default()
            });
        }
        self.drop_(r);
        self.drop_(qkv);
        // apply_rotary_pos_emb_vision: q.float(), k.float(), then
        // (x * cos) + (rotate_half(x) * sin) in fp32, cast back to the model dtype
        let qf = self.cast(qv, p * e * 4);
        let kf = self.cast(kv, p * e * 4);
        let qe = self.vision_rotate(qf, cos, sin, p * e);
        let ke = self.vision_rotate(kf, cos, sin, p * e);
        let (q, k) = if s == 4 {
            (qe, ke)
        } else {
            let q = self.cast(qe, p * e * s);
            let k = self.cast(ke, p * e * s);
            self.drop_(qe);
            self.drop_(ke);
            (q, k)
        };
        self.drop_(qf);
        self.drop_(kf);
        self.drop_(qv);
        self.drop_(kv);
        let cat = self.vision_attention(chunks, e, heads, s, [q, k, vv]);
        self.drop_(q);
        self.drop_(k);
        self.drop_(vv);
        let proj = self.op(p * e * s, &[cat], &[], &[], &[]);
        self.drop_(cat);
        self.drop_(n1);
        let h1 = self.op(p * e * s, &[h, proj], &[], &[], &[]);
        self.drop_(proj);
        // hidden_states + mlp(norm2(hidden_states))
        let n2 = self.vision_norm_of(qwen25, h1, p * e, p);
        let g = if qwen25 {
            // Qwen2_5_VLMLP: down(act(gate(x)) * up(x)), SiLU (saves its input)
            self.gated_act_product(n2, p * m * s)
        } else {
            // VisionMlp: fc2(quick_gelu(fc1(x))), quick_gelu = x * sigmoid(1.702 * x): the
            // scalar product saves nothing, sigmoid its result, the product both operands
            let f1 = self.op(p * m * s, &[n2], &[], &[], &[]);
            let scaled = self.op(p * m * s, &[f1], &[], &[], &[]);
            let sig = self.op_saving_output(p * m * s, scaled);
            self.drop_(scaled);
            let g = self.mul(f1, sig, p * m * s);
            self.drop_(sig);
            self.drop_(f1);
            g
        };
        self.mlp_out_residual(h1, n2, g, p * e * s)
    }

    /// `act(gate(x)) * up(x)` of a frozen gated MLP over `x` (the MLP's normalised input; each
    /// of the four `[rows, mlp]` tensors `bytes` long): the activation saves its input, the
    /// product both operands (Qwen2.5-VL's `Qwen2_5_VLMLP`, Pixtral's `PixtralMLP`).
    pub(super) fn gated_act_product(&mut self, x: TensorId, bytes: u128) -> TensorId {
        let gate = self.op(bytes, &[x], &[], &[], &[]);
        let act = self.op(bytes, &[gate], &[gate], &[], &[]);
        self.drop_(gate);
        let up = self.op(bytes, &[x], &[], &[], &[]);
        let g = self.mul(act, up, bytes);
        self.drop_(act);
        self.drop_(up);
        g
    }

    /// The end of a vision encoder layer: the MLP's output projection of `g` (a frozen linear,
    /// saving nothing; `bytes` = one `[rows, hidden]` tensor), then `h1 + mlp` with the MLP's
    /// input `n2` and `h1` freed.
    pub(super) fn mlp_out_residual(
        &mut self,
        h1: TensorId,
        n2: TensorId,
        g: TensorId,
        bytes: u128,
    ) -> TensorId {
        let f2 = self.op(bytes, &[g], &[], &[], &[]);
        self.drop_(g);
        self.drop_(n2);
        let y = self.op(bytes, &[h1, f2], &[], &[], &[]);
        self.drop_(f2);
        self.drop_(h1);
        y
    }

    /// The second half of a pre-norm encoder layer with a LayerNorm and a one-activation MLP
    /// (SigLIP's `layer_norm2` and `fc2(gelu_tanh(fc1(x)))`, Llama 4's
    /// `post_attention_layernorm` and `fc2(GELU(fc1(x)))`): `h1 = h + proj`, then
    /// `h1 + mlp(norm(h1))` over `rows` of width `e` (MLP width `m`, element size `s`); the
    /// activation saves its input, the frozen linears nothing.
    pub(super) fn norm_gelu_mlp_residual(
        &mut self,
        h: TensorId,
        proj: TensorId,
        rows: u128,
        (e, m, s): (u128, u128, u128),
    ) -> TensorId {
        let h1 = self.op(rows * e * s, &[h, proj], &[], &[], &[]);
        self.drop_(proj);
        let n2 = self.vision_norm_of(false, h1, rows * e, rows);
        let f1 = self.op(rows * m * s, &[n2], &[], &[], &[]);
        let g = self.op(rows * m * s, &[f1], &[f1], &[], &[]);
        self.drop_(f1);
        self.mlp_out_residual(h1, n2, g, rows * e * s)
    }

    /// [`Self::vision_norm`] of `x`, recording autograd when `x` requires grad: LayerNorm saves
    /// its input, mean and rstd (`native_layer_norm`); the RMSNorm's ops save the fp32 copy
    /// (`pow`, and the product with the `rsqrt`) and the `rsqrt`'s result.
    pub(super) fn vision_norm_of(
        &mut self,
        rms: bool,
        x: TensorId,
        numel: u128,
        rows: u128,
    ) -> TensorId {
        let s = self.param_size;
        if !rms {
            let rg = self.rg(x);
            let y = self.act(numel * s, rg);
            let stats = self.act(rows * 4 * 2, false);
            if rg {
                self.t.record(Node {
                    saved: Ids::of(&[x, stats]),
                    inputs: Ids::of(&[x]),
                    outputs: Ids::of(&[y]),
                    ..Node::default()
                });
            }
            self.drop_(stats);
            return y;
        }
        // `x.to(torch.float32)`: x itself in fp32
        let up = if s == 4 {
            self.retain_id(x)
        } else {
            self.cast(x, numel * 4)
        };
        let sq = self.op(numel * 4, &[up], &[up], &[], &[]);
        let var = self.op(rows * 4, &[sq], &[], &[], &[]);
        self.drop_(sq);
        let ve = self.op(rows * 4, &[var], &[], &[], &[]);
        let rs = self.op_saving_output(rows * 4, ve);
        self.drop_(ve);
        let y = self.mul(up, rs, numel * 4);
        self.drop_(rs);
        if s != 4 {
            self.drop_(up);
        }
        let out = if s == 4 {
            self.op(numel * 4, &[y], &[], &[], &[])
        } else {
            let down = self.cast(y, numel * s);
            let out = self.op(numel * s, &[down], &[], &[], &[]);
            self.drop_(down);
            out
        };
        self.drop_(y);
        self.drop_(var);
        if s == 4 {
            self.drop_(up);
        }
        out
    }

    /// `(x * cos) + (rotate_half(x) * sin)` on the fp32 copy `x` of `numel` elements: returns
    /// the result, its temporaries freed. With `x` requiring grad the products save the
    /// (grad-free) cos and sin only, so nothing of `x`; `rotate_half`'s slices, negation and
    /// concatenation save nothing and their backward is one gradient of `x`'s size.
    fn vision_rotate(
        &mut self,
        x: TensorId,
        cos: TensorId,
        sin: TensorId,
        numel: u128,
    ) -> TensorId {
        let a = self.mul(x, cos, numel * 4);
        // rotate_half: torch.cat((-x2, x1), dim=-1)
        let neg = self.act(numel / 2 * 4, false);
        let cat = self.op(numel * 4, &[x], &[], &[], &[]);
        self.drop_(neg);
        let b = self.mul(cat, sin, numel * 4);
        self.drop_(cat);
        let y = self.op(numel * 4, &[a, b], &[], &[], &[]);
        self.drop_(a);
        self.drop_(b);
        y
    }

    /// `VisionAttention`'s core for SDPA and eager: one attention call per chunk of patches
    /// (the `cu_seqlens` split: images, or Qwen2.5-VL's windows; [1, heads, len, head_dim],
    /// not causal), each output made contiguous and kept in a list, then
    /// `torch.cat(attn_outputs, dim=1)`; returns the concatenation, [P, E]. `chunks` are runs
    /// of equal chunks, (patches, count): the live bytes grow from one call of a run to the
    /// next (the list only grows), so a run's first `count - 1` outputs are allocated as one
    /// block of their rounded sizes and its last call is replayed in full: the same peak.
    ///
    /// When `qkv` (the rotated q and k and the value view) require grad and autograd records,
    /// each call saves its inputs (views of the three tensors) and, SDPA, its output and
    /// logsumexp (the fused kernel's backward needs both), eager, the fp32 softmax result
    /// (`_softmax` saves its result) and its 16-bit cast (the second matmul's operand); the
    /// outputs' contiguous copies and the concatenation save nothing. A run's saved tensors are
    /// held by one node, which backward reaches last call first (the run's first-reached call
    /// sees them all, its peak), with eager's [heads, len, len] transients of one call; the
    /// gradients of q, k and v (split_backward concatenates the calls') come after every run,
    /// and the concatenation's gradient lives until then.
    fn vision_attention(
        &mut self,
        chunks: &[(u128, u128)],
        e: u128,
        heads: u128,
        s: u128,
        qkv: [TensorId; 3],
    ) -> TensorId {
        let p: u128 = chunks.iter().map(|(len, count)| len * count).sum();
        let g = self.t.granularity.max(1);
        let save = self.t.recording && qkv.iter().any(|&x| self.rg(x));
        let round = |b: u128| b.div_ceil(g) * g;
        let mut outs = Vec::new();
        // where the node handing q, k and v their gradients goes on the tape: before the
        // calls', so that backward reaches it after them
        let first = self.t.tape.len();
        for &(pi, count) in chunks {
            let eager = self.mode.attention() == AttentionImpl::Eager;
            // the saved tensors of the run's first `count - 1` calls, one block each
            let mut held = Vec::new();
            if count > 1 {
                outs.push(self.act((count - 1) * round(pi * e * s), false));
                if save {
                    if eager {
                        held.push(self.act((count - 1) * round(heads * pi * pi * 4), false));
                        held.push(self.act((count - 1) * round(heads * pi * pi * s), false));
                    } else {
                        held.push(self.act((count - 1) * round(pi * e * s), false));
                        held.push(self.act((count - 1) * round(heads * pi * 4), false));
                    }
                }
            }
            // eager backward of one call: the probabilities' gradient (16-bit), its fp32 cast,
            // then the softmax backward's fp32 result, with the 16-bit probabilities (saved by
            // the second matmul only) already released; fp32: the gradient and the result
            let temps = if save && eager {
                let sq = round(heads * pi * pi * 4);
                if s == 4 {
                    2 * sq
                } else {
                    (2 * sq).saturating_sub(round(heads * pi * pi * s))
                }
            } else {
                0
            };
            let oc = match self.mode.attention() {
                AttentionImpl::Eager => {
                    // eager_attention_forward: matmul(q, kᵀ) * scaling, softmax in fp32 cast
                    // back, matmul with v (dropout p = 0 returns its input); the weights go
                    // when the call's result is indexed
                    let w = self.act(heads * pi * pi * s, false);
                    let ws = self.act(heads * pi * pi * s, false);
                    self.drop_(w);
                    let sm = if s == 4 {
                        self.act(heads * pi * pi * 4, false)
                    } else {
                        // softmax(x, dtype=float32) converts its input first (aten
                        // `softmax.int`: `input.toType(dtype)`), a copy freed on return
                        let up = self.act(heads * pi * pi * 4, false);
                        let sm32 = self.act(heads * pi * pi * 4, false);
                        self.drop_(up);
                        let sm = self.act(heads * pi * pi * s, false);
                        if save {
                            held.push(sm32);
                        } else {
                            self.drop_(sm32);
                        }
                        sm
                    };
                    self.drop_(ws);
                    let o = self.act(pi * e * s, false);
                    let oc = self.act(pi * e * s, false);
                    self.drop_(o);
                    if save {
                        held.push(sm);
                    } else {
                        self.drop_(sm);
                    }
                    oc
                }
                AttentionImpl::Sdpa | AttentionImpl::Flash => {
                    // scaled_dot_product_attention: the output and the fp32 logsumexp of the
                    // fused kernel, then `.transpose(1, 2).contiguous()`
                    let o = self.act(pi * e * s, false);
                    let lse = self.act(heads * pi * 4, false);
                    if save {
                        held.push(lse);
                    } else {
                        self.drop_(lse);
                    }
                    let oc = self.act(pi * e * s, false);
                    if save {
                        held.push(o);
                    } else {
                        self.drop_(o);
                    }
                    oc
                }
            };
            if save {
                self.t.record(Node {
                    saved: Ids::of(&held),
                    backward_temps: temps,
                    ..Node::default()
                });
            }
            for x in held {
                self.drop_(x);
            }
            outs.push(oc);
        }
        let rg = qkv.iter().any(|&x| self.rg(x));
        let cat = self.act(p * e * s, rg);
        if save {
            // eager with one call: the value (a view of the qkv output) is saved by the second
            // matmul only, whose backward runs first, so the qkv output is gone before the
            // softmax backward (with more calls the other calls' value views keep it)
            let calls: u128 = chunks.iter().map(|&(_, count)| count).sum();
            let value_first = self.mode.attention() == AttentionImpl::Eager && calls == 1;
            let held: &[TensorId] = if value_first { &qkv[..2] } else { &qkv };
            self.t.record(Node {
                saved: Ids::of(held),
                inputs: Ids::of(&qkv),
                outputs: Ids::of(&[cat]),
                ..Node::default()
            });
            if let Some(node) = self.t.tape.pop() {
                self.t.tape.insert(first, node);
            }
            if value_first {
                self.t.record(Node {
                    saved: Ids::of(&qkv[2..]),
                    ..Node::default()
                });
            }
        }
        for o in outs {
            self.drop_(o);
        }
        cat
    }
}

/// Appends `count` chunks of `len` to run-length `runs`, merging with the last run.
fn push_run(runs: &mut Vec<(u128, u128)>, len: u128, count: u128) {
    match runs.last_mut() {
        Some((l, c)) if *l == len => *c += count,
        _ => runs.push((len, count)),
    }
}

/// The runs of equal values of `chunks`.
fn runs_of(chunks: impl Iterator<Item = u128>) -> Vec<(u128, u128)> {
    let mut runs = Vec::new();
    for c in chunks {
        push_run(&mut runs, c, 1);
    }
    runs
}

/// One image's LLM-token grid as the truth harness and `--image-tokens` define it: the most
/// nearly square `a × b = n` (a ≤ b, a the largest divisor of n up to √n).
pub fn image_grid(n: u128) -> (u128, u128) {
    let mut a = 1;
    let mut d = 1;
    while d * d <= n {
        if n.is_multiple_of(d) {
            a = d;
        }
        d += 1;
    }
    (a, n / a.max(1))
}

/// Qwen2.5-VL's attention windows of one image of `n` LLM tokens, in LLM tokens, in the order
/// `get_vision_window_index` lays them out (transformers `vision_utils.py`): the `a × b` grid
/// padded to multiples of the window side `w`, windows row by row; padding is dropped, so edge
/// windows are smaller (and a grid side divisible by `w` adds an empty row or column of
/// windows, which holds nothing).
fn window_chunks(n: u128, w: u128) -> Vec<u128> {
    let (a, b) = image_grid(n);
    let sides = |x: u128| -> Vec<u128> {
        let mut v = vec![w; (x / w) as usize];
        if !x.is_multiple_of(w) {
            v.push(x % w);
        }
        v
    };
    let (rows, cols) = (sides(a), sides(b));
    let mut out = Vec::with_capacity(rows.len() * cols.len());
    for r in &rows {
        for c in &cols {
            out.push(r * c);
        }
    }
    out
}

/// What the vision towers' checkpointing tests share.
#[cfg(test)]
pub(super) mod test_support {
    use crate::memory::{simulate_train, Kernels, Phase, TrainEstimate};
    use crate::model::ModelDesc;
    use crate::workload::{AttentionImpl, Lora, TrainWorkload};

    /// A checkpointed step of `batch` × `seq` with LoRA (rank 8) on the text module `target`:
    /// the text's frozen weights then have no gradients, which would hide the tower's backward.
    pub(in crate::memory::hf) fn ckpt_lora_workload(
        batch: u64,
        seq: u64,
        attention: AttentionImpl,
        target: &str,
    ) -> TrainWorkload {
        let mut w = TrainWorkload::new(batch, seq);
        w.attention = attention;
        w.checkpointing = true;
        w.lora = Some(Lora {
            rank: 8,
            targets: vec![target.to_owned()],
            qlora: false,
        });
        w
    }

    /// The highest live bytes of `m`'s backward phase under `w` (CUDA kernels).
    pub(in crate::memory::hf) fn backward_phase_peak(m: &ModelDesc, w: &TrainWorkload) -> u64 {
        let e: TrainEstimate = simulate_train(m, w, Kernels::Cuda).unwrap();
        e.phase_peak(Phase::Backward).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_and_windows() {
        assert_eq!(image_grid(256), (16, 16));
        assert_eq!(image_grid(100), (10, 10));
        assert_eq!(image_grid(64), (8, 8));
        assert_eq!(image_grid(7), (1, 7));
        assert_eq!(window_chunks(100, 4), vec![16, 16, 8, 16, 16, 8, 8, 8, 4]);
        assert_eq!(window_chunks(64, 4).len(), 4);
    }
}
