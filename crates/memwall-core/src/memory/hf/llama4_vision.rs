//! Llama 4's image path (`--image-tokens N` on a `llama4` wrapper), op by op as transformers
//! 5.23 runs it: `llama4/modeling_llama4.py` (`Llama4ForConditionalGeneration.forward`,
//! `get_image_features`, `get_placeholder_mask`, `Llama4MultiModalProjector`,
//! `Llama4VisionModel.forward`, `Llama4UnfoldConvolution`, `Llama4VisionRotaryEmbedding`,
//! `Llama4VisionEncoder`, `Llama4VisionEncoderLayer`, `Llama4VisionAttention`,
//! `vision_apply_rotary_emb`, `vision_eager_attention_forward`, `Llama4VisionMLP`,
//! `Llama4VisionPixelShuffleMLP`, `pixel_shuffle`, `Llama4VisionMLP2`) and
//! `integrations/sdpa_attention.py`.
//!
//! Llama4ImageProcessor cuts every image into tiles of `image_size`² pixels (336 for Scout and
//! Maverick; a global tile is added when there is more than one), and each tile is
//! `per_image` LLM tokens (`(image_size / patch_size)² · pixel_shuffle_ratio²` = 144;
//! Llama4Processor: `(H // patch) · (W // patch) // downsample_ratio` `<|patch|>` tokens per
//! tile). N image tokens are N / `per_image` tiles per sequence; the tower runs the batch's
//! tiles as one batch `[tiles, patches + 1, E]` with no attention mask, so its memory depends
//! on the number of tiles only, not on how they group into images. The separators
//! (`<|image_start|>`, tile separators, `<|image|>`, `<|image_end|>`) are text tokens.
//!
//! The tower is frozen and `pixel_values` never require grad, so nothing of it is saved for
//! backward (as in `vision.rs`). The pixels are the batch's input (Llama4ImageProcessor returns
//! bf16; the vision model casts nothing, so they come in the model dtype), not counted. What
//! outlives the tower: the vision model's output (`mm_encoder_outputs["image"]
//! .last_hidden_state`, the pixel-shuffle MLP's output), the projected features and the
//! placeholder mask, locals of the wrapper's forward until the language model returns;
//! `masked_scatter` saves the mask when the embeddings require grad.

use super::Builder;
use crate::memory::timeline::{Ids, Node, TensorId};
use crate::model::VisionForward;
use crate::workload::AttentionImpl;

impl Builder<'_> {
    /// `Llama4ForConditionalGeneration.forward` from the embeddings to the merged
    /// `inputs_embeds` for a forward that carries pixels; `n` image tokens per sequence.
    /// Consumes `emb`'s reference.
    pub(super) fn llama4_image_merge(
        &mut self,
        f: &VisionForward,
        emb: TensorId,
        n: u128,
    ) -> TensorId {
        let s = self.param_size;
        let per = u128::from(f.per_image).max(1);
        let tiles = self.batch * (n / per);
        if tiles == 0 {
            // fewer tokens than one tile's: no pixels (the CLI refuses such N by name)
            return emb;
        }
        let features = self.llama4_tower(f, tiles);
        // Llama4MultiModalProjector over `image_features.view(-1, d)` (a view): linear_1, no
        // bias; `.to(device, dtype)` returns the same tensor
        let projected = self.act(tiles * per * u128::from(f.out) * s, false);
        // get_placeholder_mask: `input_ids == image_token_id` [B, S] bool (its `sum()` and the
        // size check are scalars); unsqueezed, a view
        let rows = self.tokens;
        let image_mask = self.act(rows, false);
        // `inputs_embeds.masked_scatter(special_image_mask, projected_vision_flat)`: a new tensor
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
        self.vision_refs.extend([features, projected, image_mask]);
        merged
    }

    /// `Llama4VisionModel.forward` over `tiles` tiles; returns its `last_hidden_state` (the
    /// pixel-shuffle MLP's output, `[tiles, per_image, adapter]`).
    fn llama4_tower(&mut self, f: &VisionForward, tiles: u128) -> TensorId {
        let s = self.param_size;
        let k2 = u128::from(f.merge) * u128::from(f.merge);
        let per = u128::from(f.per_image);
        let patches = per * k2;
        // the tile's patches and the class token
        let rows = tiles * (patches + 1);
        let e = u128::from(f.width);
        let heads = u128::from(f.heads).max(1);
        let m = u128::from(f.mlp);
        let a = u128::from(f.adapter);
        // Llama4UnfoldConvolution: `nn.Unfold` (im2col, [T, C·P², patches]), `permute` (a
        // view), the bias-free linear; the unfolded pixels go when the name is rebound
        let unfolded = self.act(tiles * u128::from(f.patch_in) * patches * s, false);
        let patched = self.act(tiles * patches * e * s, false);
        self.drop_(unfolded);
        // `torch.cat([hidden_state, class_embedding.expand(...)], dim=1)`, then `+
        // positional_embedding_vlm` (a parameter in the model dtype; `.to` returns it), then
        // layernorm_pre; each result rebinds `hidden_state`
        let with_cls = self.act(rows * e * s, false);
        self.drop_(patched);
        let positioned = self.act(rows * e * s, false);
        self.drop_(with_cls);
        let embeds = self.vision_norm(false, rows * e, rows);
        self.drop_(positioned);
        // `freqs_ci` is the rotary module's buffer: no allocation. The normed embeddings stay
        // bound as `hidden_state` while the encoder runs
        let mut h = embeds;
        for _ in 0..f.depth {
            // Llama4VisionEncoderLayer: input_layernorm; q/k/v_proj with bias (views per head)
            let n1 = self.vision_norm(false, rows * e, rows);
            let q = self.act(rows * e * s, false);
            let k = self.act(rows * e * s, false);
            let v = self.act(rows * e * s, false);
            let (qr, kr) = self.llama4_rotary(rows * e);
            self.drop_(q);
            self.drop_(k);
            let (o, weights) = self.llama4_attention(tiles, patches + 1, e, heads);
            // `reshape(...).contiguous()` (a view), o_proj; the attention's locals go on return
            let proj = self.act(rows * e * s, false);
            self.drop_(o);
            self.drop_(qr);
            self.drop_(kr);
            self.drop_(v);
            self.drop_(n1);
            let h1 = self.act(rows * e * s, false);
            self.drop_(proj);
            // post_attention_layernorm, Llama4VisionMLP: fc2(GELU(fc1(x))), biases
            let n2 = self.vision_norm(false, rows * e, rows);
            let f1 = self.act(rows * m * s, false);
            let g = self.act(rows * m * s, false);
            self.drop_(f1);
            let f2 = self.act(rows * e * s, false);
            self.drop_(g);
            self.drop_(n2);
            let h2 = self.act(rows * e * s, false);
            self.drop_(f2);
            self.drop_(h1);
            // eager: the weights are bound in the layer until it returns; the encoder's
            // `hidden_states` goes when rebound (the embeddings stay bound in the model)
            if let Some(w) = weights {
                self.drop_(w);
            }
            if h != embeds {
                self.drop_(h);
            }
            h = h2;
        }
        // `hidden_state = output.last_hidden_state` rebinds the name that held the embeddings;
        // `output` keeps the encoder's last state until the forward returns
        if h != embeds {
            self.drop_(embeds);
        }
        let last = h;
        // layernorm_post; `[:, :-1, :]` drops the class token (a view)
        let post = self.vision_norm(false, rows * e, rows);
        // pixel_shuffle: two `permute(...).contiguous()` copies of the patches; the first goes
        // when the name is rebound to the second
        let shuffled1 = self.act(tiles * patches * e * s, false);
        let shuffled2 = self.act(tiles * patches * e * s, false);
        self.drop_(shuffled1);
        // Llama4VisionMLP2: GELU(fc2(dropout(GELU(fc1(x))))), no biases; dropout p = 0 (or
        // eval) returns its input
        let tokens = tiles * per;
        let f1 = self.act(tokens * a * s, false);
        let g1 = self.act(tokens * a * s, false);
        self.drop_(f1);
        let f2 = self.act(tokens * a * s, false);
        let out = self.act(tokens * a * s, false);
        self.drop_(f2);
        self.drop_(g1);
        // the adapter returns (its shuffled input goes), the forward's name is rebound (the
        // post-normed states go), the forward returns (the encoder's output goes)
        self.drop_(shuffled2);
        self.drop_(post);
        self.drop_(last);
        out
    }

    /// `vision_apply_rotary_emb` on q and k of `numel` elements each: `x.float()` (a copy
    /// unless fp32), `view_as_complex` (a view), the complex product with `freqs_ci` (complex64,
    /// 4 bytes an element), `view_as_real(...).flatten(3)` (a view), `type_as(x)` (a copy
    /// unless fp32); the fp32 tensors go when the function returns. Returns (q, k) rotated.
    fn llama4_rotary(&mut self, numel: u128) -> (TensorId, TensorId) {
        let s = self.param_size;
        if s == 4 {
            let qo = self.act(numel * 4, false);
            let ko = self.act(numel * 4, false);
            return (qo, ko);
        }
        let qf = self.act(numel * 4, false);
        let kf = self.act(numel * 4, false);
        let qo = self.act(numel * 4, false);
        let ko = self.act(numel * 4, false);
        let q = self.act(numel * s, false);
        let k = self.act(numel * s, false);
        for x in [qf, kf, qo, ko] {
            self.drop_(x);
        }
        (q, k)
    }

    /// Llama4VisionAttention's core over `tiles` tiles of `len` positions, no mask, not
    /// causal; returns the output (laid out `[T, len, H, D]`, so the reshape is a view) and,
    /// for eager, the attention weights the layer keeps.
    fn llama4_attention(
        &mut self,
        tiles: u128,
        len: u128,
        e: u128,
        heads: u128,
    ) -> (TensorId, Option<TensorId>) {
        let s = self.param_size;
        let numel = tiles * len * e;
        let w_elems = tiles * heads * len * len;
        match self.mode.attention() {
            AttentionImpl::Eager => {
                // vision_eager_attention_forward: `matmul(q, kᵀ)` (q and kᵀ are transposed
                // views that matmul's `reshape` to [T·H, ., .] copies), `* head_dim**-0.5`,
                // softmax in the model dtype ("llama4 doesn't cast attn weights to fp32"),
                // dropout p = 0 returns its input, `matmul(w, v)` (v's reshape copies),
                // `transpose(1, 2).contiguous()` copies
                let qc = self.act(numel * s, false);
                let kc = self.act(numel * s, false);
                let w = self.act(w_elems * s, false);
                self.drop_(qc);
                self.drop_(kc);
                let ws = self.act(w_elems * s, false);
                self.drop_(w);
                let sm = self.act(w_elems * s, false);
                self.drop_(ws);
                let vc = self.act(numel * s, false);
                let o = self.act(numel * s, false);
                self.drop_(vc);
                let oc = self.act(numel * s, false);
                self.drop_(o);
                (oc, Some(sm))
            }
            AttentionImpl::Sdpa | AttentionImpl::Flash => {
                // scaled_dot_product_attention: the fused kernel's output (q's [T, len, H, D]
                // layout, so `transpose(1, 2).contiguous()` is a view) and its fp32
                // logsumexp, dropped by the Python wrapper
                let o = self.act(numel * s, false);
                let lse = self.act(tiles * heads * len * 4, false);
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

    /// Llama-2-7B's first two layers behind a Scout-shaped tower of two layers.
    fn model(image_tokens: Option<u64>) -> ModelDesc {
        let mut m = llama2_7b();
        m.layers.truncate(2);
        m.vision = Some(VisionTower {
            model_type: "llama4_vision_model".into(),
            encoder_params: 1000,
            projector_params: 100,
            trainable: false,
            linears: Vec::new(),
            forward: Some(VisionForward {
                patch_in: 3 * 14 * 14,
                width: 1408,
                heads: 16,
                mlp: 5632,
                depth: 2,
                merge: 2,
                out: 4096,
                kind: VisionKind::Llama4,
                window: 0,
                full_blocks: Vec::new(),
                per_image: 144,
                adapter: 4096,
            }),
            image_tokens,
        });
        m
    }

    fn forward_peak(m: &ModelDesc, batch: u64, attention: AttentionImpl) -> u64 {
        // a short text sequence (the core does not tie N to it; the CLI does), so that the tower
        // sets the forward peak
        let mut w = TrainWorkload::new(batch, 64);
        w.attention = attention;
        let e = simulate_train(m, &w, Kernels::Cpu).unwrap();
        e.phase_peaks
            .iter()
            .find(|(p, _)| *p == Phase::Forward)
            .map(|&(_, b)| b)
            .unwrap()
    }

    #[test]
    fn eager_weights_are_per_tile_and_in_the_model_dtype() {
        // 4 rows of 17 tiles: eager holds two [68, 16, 577, 577] bf16 tensors at once (the
        // scaled scores and the softmax, no fp32 copy: 1.45 GB), SDPA none of them (measured:
        // vlm-l4xc-img2448-b2-sgd-eager, the tower sets the forward's peak within 0.02%)
        let w = 68 * 16 * 577 * 577 * 2;
        let text = forward_peak(&model(None), 4, AttentionImpl::Eager);
        let eager = forward_peak(&model(Some(2448)), 4, AttentionImpl::Eager);
        let sdpa = forward_peak(&model(Some(2448)), 4, AttentionImpl::Sdpa);
        assert!(eager > text + 2 * w, "{text} {eager}");
        // an fp32 softmax (as Pixtral's and SigLIP's eager attention) would add two fp32
        // copies of the weights, 4w
        assert!(eager < text + 3 * w, "{text} {eager}");
        // SDPA's peak in the tower is the rotary's fp32 copies and the MLP, below eager's
        assert!(sdpa < eager, "{sdpa} {eager}");
    }

    #[test]
    fn fewer_tokens_than_a_tile_run_no_tower() {
        let text = forward_peak(&model(None), 1, AttentionImpl::Sdpa);
        assert_eq!(
            forward_peak(&model(Some(100)), 1, AttentionImpl::Sdpa),
            text
        );
    }
}
