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
        let s = self.param_size;
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
        let rg = self.rg(emb);
        let merged = self.act(rows * self.hidden * s, rg);
        if rg {
            self.t.record(Node {
                saved: Ids::of(&[image_mask]),
                inputs: Ids::of(&[emb]),
                outputs: Ids::of(&[merged]),
                ..Node::default()
            });
        }
        self.drop_(emb);
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
        let heads = u128::from(f.heads).max(1);
        let m = u128::from(f.mlp);
        // SiglipVisionEmbeddings: `patch_embedding(pixel_values.to(dtype=target_dtype))` (a copy
        // of the fp32 pixels unless fp32, freed when the conv returns), `flatten(2).transpose`
        // (a view), `+ position_embedding(position_ids)` ([1, patches, E], freed after the add)
        let pv = (s != 4).then(|| self.act(p * u128::from(f.patch_in) * s, false));
        let conv = self.act(p * e * s, false);
        if let Some(pv) = pv {
            self.drop_(pv);
        }
        let pos = self.act(per_image * e * s, false);
        let embedded = self.act(p * e * s, false);
        self.drop_(pos);
        self.drop_(conv);
        // the embeddings stay bound as SiglipVisionModel.forward's `hidden_states` (and the
        // encoder's `inputs_embeds`) until the vision model returns
        let mut h = embedded;
        for _ in 0..f.depth {
            // SiglipEncoderLayer: residual = x; x = layer_norm1(x)
            let n1 = self.vision_norm(false, p * e, p);
            // SiglipAttention: q/k/v_proj outputs, `view(...).transpose(1, 2)` views
            let q = self.act(p * e * s, false);
            let k = self.act(p * e * s, false);
            let v = self.act(p * e * s, false);
            let (o, weights) = self.siglip_attention(images, per_image, e, heads, s);
            // `reshape(...).contiguous()`: a view of the [B, S, H, D] output; out_proj
            let proj = self.act(p * e * s, false);
            self.drop_(o);
            self.drop_(q);
            self.drop_(k);
            self.drop_(v);
            self.drop_(n1);
            let h1 = self.act(p * e * s, false);
            self.drop_(proj);
            // layer_norm2, SiglipMLP: fc2(gelu_tanh(fc1(x)))
            let n2 = self.vision_norm(false, p * e, p);
            let f1 = self.act(p * m * s, false);
            let g = self.act(p * m * s, false);
            self.drop_(f1);
            let f2 = self.act(p * e * s, false);
            self.drop_(g);
            self.drop_(n2);
            let h2 = self.act(p * e * s, false);
            self.drop_(f2);
            self.drop_(h1);
            // eager: the attention weights are bound to `_` in the layer's forward until it
            // returns; the caller's `hidden_states` goes when it is rebound to the output
            if let Some(w) = weights {
                self.drop_(w);
            }
            if h != embedded {
                self.drop_(h);
            }
            h = h2;
        }
        // post_layernorm; the encoder's output object keeps the un-normed state until the
        // vision model's forward returns
        let last = self.vision_norm(false, p * e, p);
        if h != embedded {
            self.drop_(h);
        }
        self.drop_(embedded);
        // Gemma3MultiModalProjector: `transpose(1, 2).reshape(B, E, side, side).contiguous()`
        // (a copy), AvgPool2d(kernel = merge) to `tokens` per image, flatten/transpose (views)
        let rs = self.act(p * e * s, false);
        let rows = images * tokens;
        let pooled = self.act(rows * e * s, false);
        let normed = self.gemma3_rms_norm(rows, e);
        // `torch.matmul(normed, mm_input_projection_weight).type_as(vision_outputs)`
        let projected = self.act(rows * u128::from(f.out) * s, false);
        self.drop_(normed);
        self.drop_(pooled);
        self.drop_(rs);
        (last, projected)
    }

    /// `Gemma3RMSNorm` over `rows` rows of `e` features, no grad: `_norm(x.float())`
    /// (`x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`), `* (1.0 + weight.float())`,
    /// `type_as(x)`; returns the output in the model dtype.
    fn gemma3_rms_norm(&mut self, rows: u128, e: u128) -> TensorId {
        let s = self.param_size;
        let numel = rows * e;
        // `.float()` of the transposed pooled view: a contiguous fp32 copy (also in fp32)
        let xf = self.act(numel * 4, false);
        let sq = self.act(numel * 4, false);
        let mean = self.act(rows * 4, false);
        self.drop_(sq);
        let eps = self.act(rows * 4, false);
        self.drop_(mean);
        let rs = self.act(rows * 4, false);
        self.drop_(eps);
        let y = self.act(numel * 4, false);
        self.drop_(rs);
        self.drop_(xf);
        let w32 = self.act(e * 4, false);
        let w1 = self.act(e * 4, false);
        self.drop_(w32);
        let out = self.act(numel * 4, false);
        self.drop_(w1);
        self.drop_(y);
        if s == 4 {
            return out;
        }
        let down = self.act(numel * s, false);
        self.drop_(out);
        down
    }

    /// SiglipAttention's core over `images` images of `len` patches each (no mask, not
    /// causal); returns the output (laid out [B, S, H, D], so `transpose(1, 2).contiguous()`
    /// and the reshape are views) and, for eager, the attention weights the layer keeps.
    fn siglip_attention(
        &mut self,
        images: u128,
        len: u128,
        e: u128,
        heads: u128,
        s: u128,
    ) -> (TensorId, Option<TensorId>) {
        let p = images * len;
        let w_elems = images * heads * len * len;
        match self.mode.attention() {
            AttentionImpl::Eager => {
                // matmul(q, kᵀ) * scaling; softmax(dtype=float32) converts its input first
                // (aten `softmax.int`), cast back to the query's dtype; dropout p = 0 returns
                // its input; matmul with v; `transpose(1, 2).contiguous()` copies
                let w = self.act(w_elems * s, false);
                let ws = self.act(w_elems * s, false);
                self.drop_(w);
                let sm = if s == 4 {
                    self.act(w_elems * 4, false)
                } else {
                    let up = self.act(w_elems * 4, false);
                    let sm32 = self.act(w_elems * 4, false);
                    self.drop_(up);
                    let sm = self.act(w_elems * s, false);
                    self.drop_(sm32);
                    sm
                };
                self.drop_(ws);
                let o = self.act(p * e * s, false);
                let oc = self.act(p * e * s, false);
                self.drop_(o);
                (oc, Some(sm))
            }
            AttentionImpl::Sdpa | AttentionImpl::Flash => {
                // scaled_dot_product_attention: the fused kernel's output (q's [B, S, H, D]
                // layout) and its fp32 logsumexp, dropped by the Python wrapper
                let o = self.act(p * e * s, false);
                let lse = self.act(images * heads * len * 4, false);
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
        e.phase_peaks
            .iter()
            .find(|(p, _)| *p == Phase::Forward)
            .map(|&(_, b)| b)
            .unwrap()
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
            let f = |e: &crate::memory::TrainEstimate| {
                e.phase_peaks
                    .iter()
                    .find(|(p, _)| *p == Phase::Backward)
                    .map(|&(_, b)| b)
                    .unwrap()
            };
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
