//! Gemma 3's image path (`--image-tokens N` on a `gemma3` wrapper), op by op as transformers 5.23
//! runs it: `gemma3/modeling_gemma3.py` (`Gemma3Model.forward`, `get_image_features`,
//! `get_placeholder_mask`, `Gemma3MultiModalProjector`, `Gemma3RMSNorm`,
//! `get_block_sequence_ids_for_mask`, `create_masks_for_vision_model`) and
//! `siglip/modeling_siglip.py` (`SiglipVisionModel`, `SiglipVisionEmbeddings`, `SiglipEncoder`,
//! `SiglipEncoderLayer`, `SiglipAttention`, `eager_attention_forward`, `SiglipMLP`).
//!
//! N image tokens are N / `mm_tokens_per_image` images of `image_size`² pixels per sequence.
//! The tower is frozen and `pixel_values` never require grad, so nothing of it is saved for
//! backward (as in `vision.rs`). What outlives it: the tower's output object
//! (`mm_encoder_outputs["image"]`: `last_hidden_state` and the projected `pooler_output`),
//! the placeholder mask and the block ids, locals of `Gemma3Model.forward` until the language
//! model returns; `masked_scatter` saves the mask when the embeddings require grad. With
//! `token_type_ids` (which Gemma3Processor returns) the wrapper builds both layer types' masks
//! with the image blocks OR-ed in, so no attention can skip its mask
//! (`masking_utils.create_causal_mask`: `block_sequence_ids` / `or_mask_function` set
//! `allow_is_causal_skip = False`); that is `Builder::image_blocks`, read by the attention.

use super::Builder;
use crate::memory::timeline::{Ids, Node, TensorId};
use crate::model::VisionForward;
use crate::workload::AttentionImpl;

impl Builder<'_> {
    /// `Gemma3Model.forward` from the embeddings to the merged `inputs_embeds` for a forward
    /// that carries pixels; `n` image tokens per sequence. Consumes `emb`'s reference.
    pub(super) fn gemma3_image_merge(
        &mut self,
        f: &VisionForward,
        emb: TensorId,
        n: u128,
    ) -> TensorId {
        let per = u128::from(f.per_image).max(1);
        let images = self.batch * (n / per);
        if images == 0 {
            // fewer tokens than one image's: no pixels (the CLI refuses such N by name)
            return emb;
        }
        let (last, projected) = self.siglip_tower(f, images);
        // get_placeholder_mask: `input_ids == image_token_id` [B, S] bool (its `sum()` and the
        // size check are scalars); unsqueezed, a view
        let rows = self.tokens;
        let image_mask = self.act(rows, false);
        // `inputs_embeds.masked_scatter(special_image_mask, image_features)`: a new tensor
        // (`pooler_output.to(device, dtype)` is the same tensor)
        let merged = self.masked_scatter_embeds(emb, projected, image_mask);
        // get_block_sequence_ids_for_mask: int64 [B, S], a local of the forward (its bool and
        // cumsum temporaries go at once)
        let block_ids = self.act(rows * 8, false);
        self.image_blocks = true;
        self.vision_refs
            .extend([last, projected, image_mask, block_ids]);
        merged
    }

    /// `get_image_features`: SiglipVisionModel over `images` images, then the projector.
    /// Returns (`last_hidden_state`, projected `pooler_output`).
    fn siglip_tower(&mut self, f: &VisionForward, images: u128) -> (TensorId, TensorId) {
        let s = self.param_size;
        let merge2 = u128::from(f.merge) * u128::from(f.merge);
        let tokens = u128::from(f.per_image);
        let per_image = tokens * merge2;
        let p = images * per_image;
        let e = u128::from(f.width);
        // SiglipVisionEmbeddings: `patch_embedding(pixel_values.to(dtype=target_dtype))` (a copy
        // of the fp32 pixels unless fp32, freed when the conv returns), `flatten(2).transpose`
        // (a view), `+ position_embedding(position_ids)` ([1, patches, E], freed after the add)
        let grad = self.mode.checkpointing();
        let pv = (s != 4).then(|| self.act(p * u128::from(f.patch_in) * s, false));
        let conv = self.act(p * e * s, false);
        if let Some(pv) = pv {
            self.drop_(pv);
        }
        if grad {
            // enable_input_require_grads' hook on `get_input_embeddings()` (SiglipVisionModel:
            // `_input_embed_layer = "patch_embedding"`, modeling_siglip.py) calls
            // `output.requires_grad_(True)`: the conv output is a leaf that requires grad, held
            // by its AccumulateGrad node until backward reaches it (as in vision.rs)
            self.input_grad_leaf(conv);
        }
        let pos = self.act(per_image * e * s, false);
        // the add saves nothing (the position embeddings are frozen)
        let embedded = self.op(p * e * s, &[conv], &[], &[], &[]);
        self.drop_(pos);
        self.drop_(conv);
        // the embeddings stay bound as SiglipVisionModel.forward's `hidden_states` (and the
        // encoder's `inputs_embeds`) until the vision model returns
        let mut h = embedded;
        for block in 0..f.depth {
            let y = if grad {
                // the checkpointed SiglipEncoderLayer (a GradientCheckpointingLayer): its
                // forward saves nothing, the checkpoint keeps its input for the recompute
                self.t.recording = false;
                let y = self.siglip_block(f, images, h);
                self.t.recording = true;
                self.t.set_requires_grad(y, true);
                self.t.record(Node {
                    saved: Ids::of(&[h]),
                    outputs: Ids::of(&[y]),
                    recompute_vision: Some(u32::try_from(block).unwrap_or(u32::MAX)),
                    ..Node::default()
                });
                y
            } else {
                self.siglip_block(f, images, h)
            };
            // the caller's `hidden_states` goes when it is rebound to the output
            if h != embedded {
                self.drop_(h);
            }
            h = y;
        }
        // post_layernorm; the encoder's output object keeps the un-normed state until the
        // vision model's forward returns
        let last = self.vision_norm_of(false, h, p * e, p);
        if h != embedded {
            self.drop_(h);
        }
        self.drop_(embedded);
        // Gemma3MultiModalProjector: `transpose(1, 2).reshape(B, E, side, side).contiguous()`
        // (a copy, saving nothing), AvgPool2d(kernel = merge) to `tokens` per image (saves its
        // input, `avg_pool2d` in derivatives.yaml), flatten/transpose (views)
        let rs = self.op(p * e * s, &[last], &[], &[], &[]);
        let rows = images * tokens;
        let pooled = self.op(rows * e * s, &[rs], &[rs], &[], &[]);
        let normed = self.gemma3_rms_norm(pooled, rows, e);
        // `torch.matmul(normed, mm_input_projection_weight).type_as(vision_outputs)`: the
        // weight is frozen, so `mm` saves nothing of `normed`; `type_as` to the same dtype
        // returns its input
        let projected = self.op(rows * u128::from(f.out) * s, &[normed], &[], &[], &[]);
        self.drop_(normed);
        self.drop_(pooled);
        self.drop_(rs);
        (last, projected)
    }

    /// `Gemma3RMSNorm` of `x` over `rows` rows of `e` features: `_norm(x.float())`
    /// (`x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`), `* (1.0 + weight.float())`,
    /// `type_as(x)`; returns the output in the model dtype. With `x` requiring grad, `pow`
    /// saves the fp32 copy, `rsqrt` its result, the product both, and the product with the
    /// frozen weight saves `1 + weight` (derivatives.yaml).
    fn gemma3_rms_norm(&mut self, x: TensorId, rows: u128, e: u128) -> TensorId {
        let s = self.param_size;
        let numel = rows * e;
        // `.float()` of the transposed pooled view: a contiguous fp32 copy (also in fp32)
        let xf = self.cast(x, numel * 4);
        let sq = self.op(numel * 4, &[xf], &[xf], &[], &[]);
        let mean = self.op(rows * 4, &[sq], &[], &[], &[]);
        self.drop_(sq);
        let eps = self.op(rows * 4, &[mean], &[], &[], &[]);
        self.drop_(mean);
        let rs = self.op_saving_output(rows * 4, eps);
        self.drop_(eps);
        let y = self.mul(xf, rs, numel * 4);
        self.drop_(rs);
        self.drop_(xf);
        let w32 = self.act(e * 4, false);
        let w1 = self.act(e * 4, false);
        self.drop_(w32);
        let out = self.mul(y, w1, numel * 4);
        self.drop_(w1);
        self.drop_(y);
        if s == 4 {
            return out;
        }
        let down = self.cast(out, numel * s);
        self.drop_(out);
        down
    }

    /// One `SiglipEncoderLayer` over `images` images from `h` (which keeps its reference):
    /// `h + attn(layer_norm1(h))`, then `h + mlp(layer_norm2(h))`; returns its output. The
    /// weights are frozen, so a linear saves nothing of its input (`addmm` saves `mat1` only
    /// when `mat2` requires grad, derivatives.yaml); `gelu(approximate="tanh")` saves its
    /// input. Without grad nothing is recorded.
    pub(super) fn siglip_block(
        &mut self,
        f: &VisionForward,
        images: u128,
        h: TensorId,
    ) -> TensorId {
        let s = self.param_size;
        let per_image = u128::from(f.per_image) * u128::from(f.merge) * u128::from(f.merge);
        let p = images * per_image;
        let e = u128::from(f.width);
        let heads = u128::from(f.heads).max(1);
        let m = u128::from(f.mlp);
        // residual = x; x = layer_norm1(x)
        let n1 = self.vision_norm_of(false, h, p * e, p);
        // SiglipAttention: q/k/v_proj outputs, `view(...).transpose(1, 2)` views
        let q = self.op(p * e * s, &[n1], &[], &[], &[]);
        let k = self.op(p * e * s, &[n1], &[], &[], &[]);
        let v = self.op(p * e * s, &[n1], &[], &[], &[]);
        let (o, weights) = self.siglip_attention(images, per_image, e, heads, s, [q, k, v]);
        // `reshape(...).contiguous()`: a view of the [B, S, H, D] output; out_proj
        let proj = self.op(p * e * s, &[o], &[], &[], &[]);
        self.drop_(o);
        self.drop_(q);
        self.drop_(k);
        self.drop_(v);
        self.drop_(n1);
        // layer_norm2, SiglipMLP: fc2(gelu_tanh(fc1(x)))
        let h2 = self.norm_gelu_mlp_residual(h, proj, p, (e, m, s));
        // eager: the attention weights are bound to `_` in the layer's forward until it
        // returns
        if let Some(w) = weights {
            self.drop_(w);
        }
        h2
    }

    /// SiglipAttention's core over `images` images of `len` patches each (no mask, not
    /// causal) on `qkv`; returns the output (laid out [B, S, H, D], so `transpose(1,
    /// 2).contiguous()` and the reshape are views) and, for eager, the attention weights the
    /// layer keeps. With grad, eager's matmuls save their operands (q and k; the 16-bit
    /// probabilities and v), `_softmax` its fp32 result, the scaling and the casts nothing;
    /// SDPA's fused kernel saves q, k, v, its output and its fp32 logsumexp.
    fn siglip_attention(
        &mut self,
        images: u128,
        len: u128,
        e: u128,
        heads: u128,
        s: u128,
        qkv: [TensorId; 3],
    ) -> (TensorId, Option<TensorId>) {
        let p = images * len;
        let w_elems = images * heads * len * len;
        let [q, k, v] = qkv;
        match self.mode.attention() {
            AttentionImpl::Eager => {
                // matmul(q, kᵀ) * scaling; softmax(dtype=float32) converts its input first
                // (aten `softmax.int`), cast back to the query's dtype; dropout p = 0 returns
                // its input; matmul with v; `transpose(1, 2).contiguous()` copies
                let w = self.op(w_elems * s, &[q, k], &[q, k], &[], &[]);
                let ws = self.op(w_elems * s, &[w], &[], &[], &[]);
                self.drop_(w);
                let sm = if s == 4 {
                    self.op_saving_output(w_elems * 4, ws)
                } else {
                    let up = self.cast(ws, w_elems * 4);
                    let sm32 = self.op_saving_output(w_elems * 4, up);
                    self.drop_(up);
                    let sm = self.cast(sm32, w_elems * s);
                    self.drop_(sm32);
                    sm
                };
                self.drop_(ws);
                let o = self.op(p * e * s, &[sm, v], &[sm, v], &[], &[]);
                let oc = self.op(p * e * s, &[o], &[], &[], &[]);
                self.drop_(o);
                (oc, Some(sm))
            }
            AttentionImpl::Sdpa | AttentionImpl::Flash => {
                // scaled_dot_product_attention: the fused kernel's output (q's [B, S, H, D]
                // layout) and its fp32 logsumexp, dropped by the Python wrapper unless saved
                let rg = qkv.iter().any(|&x| self.rg(x));
                let o = self.act(p * e * s, rg);
                let lse = self.act(images * heads * len * 4, false);
                if rg {
                    self.t.record(Node {
                        saved: Ids::of(&[q, k, v, o, lse]),
                        inputs: Ids::of(&qkv),
                        outputs: Ids::of(&[o]),
                        ..Node::default()
                    });
                }
                self.drop_(lse);
                (o, None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::memory::{simulate_train, Kernels, Phase};
    use crate::model::tests::llama2_7b;
    use crate::model::{ModelDesc, VisionForward, VisionKind, VisionTower};
    use crate::workload::{AttentionImpl, TrainWorkload};

    /// Llama-2-7B's first two layers behind a small Gemma-3-shaped tower: 8 × 8 patches per
    /// image pooled by 2 × 2 to 16 tokens.
    fn model(image_tokens: Option<u64>) -> ModelDesc {
        let mut m = llama2_7b();
        m.layers.truncate(2);
        m.vision = Some(VisionTower {
            model_type: "siglip_vision_model".into(),
            encoder_params: 1000,
            projector_params: 100,
            trainable: false,
            linears: Vec::new(),
            forward: Some(VisionForward {
                patch_in: 3 * 14 * 14,
                width: 1152,
                heads: 16,
                mlp: 4304,
                depth: 2,
                merge: 2,
                out: 4096,
                kind: VisionKind::Gemma3Siglip,
                window: 0,
                full_blocks: Vec::new(),
                per_image: 16,
                adapter: 0,
            }),
            image_tokens,
        });
        m
    }

    fn forward_peak(m: &ModelDesc, attention: AttentionImpl) -> u64 {
        let mut w = TrainWorkload::new(2, 64);
        w.attention = attention;
        let e = simulate_train(m, &w, Kernels::Cuda).unwrap();
        e.phase_peak(Phase::Forward).unwrap()
    }

    #[test]
    fn whole_images_run_the_tower_and_partial_ones_do_not() {
        for attention in [AttentionImpl::Sdpa, AttentionImpl::Eager] {
            let text = forward_peak(&model(None), attention);
            let partial = forward_peak(&model(Some(15)), attention);
            let one = forward_peak(&model(Some(16)), attention);
            let two = forward_peak(&model(Some(32)), attention);
            assert_eq!(partial, text, "{attention:?}");
            assert!(text < one && one < two, "{attention:?}: {text} {one} {two}");
        }
    }

    /// Under checkpointing the tower's backward runs after the text's (the patch embeddings
    /// require grad): the recomputed encoder layer holds its saved tensors (LayerNorm inputs,
    /// q/k/v, fc1's output for the GELU) in the backward, so the backward peak passes the
    /// text-only step's by more than one [P, mlp] activation (LoRA on the text, whose frozen
    /// weights then have no gradients); a layer policy and sharding are refused by name.
    #[test]
    fn checkpointing_runs_the_towers_backward() {
        use super::super::vision::test_support::{backward_phase_peak, ckpt_lora_workload};
        use crate::memory::check_image_checkpointing;
        for attention in [AttentionImpl::Sdpa, AttentionImpl::Eager] {
            let w = ckpt_lora_workload(2, 64, attention, "o_proj");
            let backward = |m: &ModelDesc| backward_phase_peak(m, &w);
            // 2 images of 64 patches, 4304 bf16 features
            let one_mlp_activation = 2 * 64 * 4304 * 2;
            let text = backward(&model(None));
            let images = backward(&model(Some(16)));
            assert!(
                images > text + one_mlp_activation,
                "{attention:?}: {images} vs {text}"
            );
            let m = model(Some(16));
            assert!(check_image_checkpointing(&m, &w, true)
                .is_err_and(|e| e.field() == Some("image_tokens")));
            let mut policy = w.clone();
            policy.step_options.checkpointing_policy = crate::workload::CheckpointPolicy::EveryK(2);
            assert!(check_image_checkpointing(&m, &policy, false)
                .is_err_and(|e| e.field() == Some("checkpointing_policy")));
        }
    }

    #[test]
    fn image_blocks_give_sdpa_layers_masks() {
        // the image forward's own tensors aside, SDPA with image blocks holds two boolean
        // [B, 1, S, S] masks and a converted mask per layer call: the step with images grows
        // by more than the tower's output when the sequence is long
        let mut short = TrainWorkload::new(1, 64);
        short.attention = AttentionImpl::Sdpa;
        let mut long = short.clone();
        long.seq = 4096;
        let grow = |w: &TrainWorkload| {
            let a = simulate_train(&model(None), w, Kernels::Cuda).unwrap();
            let b = simulate_train(&model(Some(16)), w, Kernels::Cuda).unwrap();
            let f = |e: &crate::memory::TrainEstimate| e.phase_peak(Phase::Backward).unwrap();
            f(&b) - f(&a)
        };
        // 2 masks of 4096² bytes at least (plus the per-layer fp16 masks saved for backward)
        assert!(
            grow(&long) > grow(&short) + 2 * 4096 * 4096,
            "{} {}",
            grow(&long),
            grow(&short)
        );
    }
}
