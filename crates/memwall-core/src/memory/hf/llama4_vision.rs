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
//! The tower is frozen and `pixel_values` never require grad, so without checkpointing
//! nothing of it is saved for backward (as in `vision.rs`); under gradient checkpointing the
//! patch embedding's output is made a leaf that requires grad and the tower's backward runs
//! (`llama4_tower`, `llama4_block`, `recompute_vision_block`). The pixels are the batch's input (Llama4ImageProcessor returns
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
        // bias, frozen (saves nothing of its input); `.to(device, dtype)` returns the same
        // tensor
        let projected = self.op(
            tiles * per * u128::from(f.out) * s,
            &[features],
            &[],
            &[],
            &[],
        );
        // get_placeholder_mask: `input_ids == image_token_id` [B, S] bool (its `sum()` and the
        // size check are scalars); unsqueezed, a view
        let rows = self.tokens;
        let image_mask = self.act(rows, false);
        // `inputs_embeds.masked_scatter(special_image_mask, projected_vision_flat)`: a new
        // tensor; saves the mask (`masked_scatter` in derivatives.yaml: the source's gradient
        // is `masked_select` of the output's)
        let merged = self.masked_scatter_embeds(emb, projected, image_mask);
        self.vision_refs.extend([features, projected, image_mask]);
        merged
    }

    /// `Llama4VisionModel.forward` over `tiles` tiles; returns its `last_hidden_state` (the
    /// pixel-shuffle MLP's output, `[tiles, per_image, adapter]`).
    ///
    /// Under gradient checkpointing `enable_input_require_grads` hooks
    /// `get_input_embeddings()` (Llama4VisionModel: `patch_embedding`, the
    /// Llama4UnfoldConvolution), so the unfolded linear's output is a leaf that requires grad
    /// and the tower's backward runs: each Llama4VisionEncoderLayer (a
    /// GradientCheckpointingLayer) keeps its input and is recomputed in the backward with its
    /// frozen weights (as `siglip.rs`); layernorm_pre/post save their inputs, the
    /// pixel-shuffle MLP's GELUs theirs, `masked_scatter` the placeholder mask.
    fn llama4_tower(&mut self, f: &VisionForward, tiles: u128) -> TensorId {
        let s = self.param_size;
        let k2 = u128::from(f.merge) * u128::from(f.merge);
        let per = u128::from(f.per_image);
        let patches = per * k2;
        // the tile's patches and the class token
        let rows = tiles * (patches + 1);
        let e = u128::from(f.width);
        let a = u128::from(f.adapter);
        let grad = self.mode.checkpointing();
        // Llama4UnfoldConvolution: `nn.Unfold` (im2col, [T, C·P², patches]), `permute` (a
        // view), the bias-free linear; the unfolded pixels go when the name is rebound
        let unfolded = self.act(tiles * u128::from(f.patch_in) * patches * s, false);
        let patched = self.act(tiles * patches * e * s, false);
        self.drop_(unfolded);
        if grad {
            // enable_input_require_grads' hook: `output.requires_grad_(True)`, a leaf held
            // by its AccumulateGrad node until the graph is freed (as in vision.rs)
            self.input_grad_leaf(patched);
        }
        // `torch.cat([hidden_state, class_embedding.expand(...)], dim=1)` (saves sizes
        // only), then `+ positional_embedding_vlm` (a frozen parameter in the model dtype;
        // the add saves nothing), then layernorm_pre (saves its input); each result rebinds
        // `hidden_state`
        let with_cls = self.op(rows * e * s, &[patched], &[], &[], &[]);
        self.drop_(patched);
        let positioned = self.op(rows * e * s, &[with_cls], &[], &[], &[]);
        self.drop_(with_cls);
        let embeds = self.vision_norm_of(false, positioned, rows * e, rows);
        self.drop_(positioned);
        // `freqs_ci` is the rotary module's buffer: no allocation. The normed embeddings stay
        // bound as `hidden_state` while the encoder runs
        let mut h = embeds;
        for block in 0..f.depth {
            let y = if grad {
                // the checkpointed layer's forward saves nothing; the checkpoint keeps its
                // input (`freqs_ci`, its other tensor argument, is a buffer)
                self.t.recording = false;
                let y = self.llama4_block(f, tiles, h);
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
                self.llama4_block(f, tiles, h)
            };
            // the encoder's `hidden_states` goes when rebound (the embeddings stay bound in
            // the model)
            if h != embeds {
                self.drop_(h);
            }
            h = y;
        }
        // `hidden_state = output.last_hidden_state` rebinds the name that held the embeddings;
        // `output` keeps the encoder's last state until the forward returns
        if h != embeds {
            self.drop_(embeds);
        }
        let last = h;
        // layernorm_post (saves its input); `[:, :-1, :]` drops the class token (a view)
        let post = self.vision_norm_of(false, last, rows * e, rows);
        // pixel_shuffle: two `permute(...).contiguous()` copies of the patches (saving
        // nothing); the first goes when the name is rebound to the second
        let shuffled1 = self.op(tiles * patches * e * s, &[post], &[], &[], &[]);
        let shuffled2 = self.op(tiles * patches * e * s, &[shuffled1], &[], &[], &[]);
        self.drop_(shuffled1);
        // Llama4VisionMLP2: GELU(fc2(dropout(GELU(fc1(x))))), no biases, frozen; the GELUs
        // save their inputs; dropout p = 0 (or eval) returns its input
        let tokens = tiles * per;
        let f1 = self.op(tokens * a * s, &[shuffled2], &[], &[], &[]);
        let g1 = self.op(tokens * a * s, &[f1], &[f1], &[], &[]);
        self.drop_(f1);
        let f2 = self.op(tokens * a * s, &[g1], &[], &[], &[]);
        let out = self.op(tokens * a * s, &[f2], &[f2], &[], &[]);
        self.drop_(f2);
        self.drop_(g1);
        // the adapter returns (its shuffled input goes), the forward's name is rebound (the
        // post-normed states go), the forward returns (the encoder's output goes)
        self.drop_(shuffled2);
        self.drop_(post);
        self.drop_(last);
        out
    }

    /// One Llama4VisionEncoderLayer over `tiles` tiles from `h` (which keeps its reference);
    /// returns its output. The weights are frozen, so the linears save nothing of their inputs
    /// (`addmm` saves `mat1` only when `mat2` requires grad, derivatives.yaml); the
    /// LayerNorms save their inputs and statistics, `nn.GELU` its input, the attention its
    /// operands. Without grad nothing is recorded.
    pub(super) fn llama4_block(&mut self, f: &VisionForward, tiles: u128, h: TensorId) -> TensorId {
        let s = self.param_size;
        let patches = u128::from(f.per_image) * u128::from(f.merge) * u128::from(f.merge);
        let rows = tiles * (patches + 1);
        let e = u128::from(f.width);
        let heads = u128::from(f.heads).max(1);
        let m = u128::from(f.mlp);
        // input_layernorm; q/k/v_proj with bias (views per head)
        let n1 = self.vision_norm_of(false, h, rows * e, rows);
        let q = self.op(rows * e * s, &[n1], &[], &[], &[]);
        let k = self.op(rows * e * s, &[n1], &[], &[], &[]);
        let v = self.op(rows * e * s, &[n1], &[], &[], &[]);
        let (qr, kr) = self.llama4_rotary(q, k, rows * e);
        self.drop_(q);
        self.drop_(k);
        let (o, weights) = self.llama4_attention(tiles, patches + 1, e, heads, [qr, kr, v]);
        // `reshape(...).contiguous()` (a view), o_proj; the attention's locals go on return
        let proj = self.op(rows * e * s, &[o], &[], &[], &[]);
        self.drop_(o);
        self.drop_(qr);
        self.drop_(kr);
        self.drop_(v);
        self.drop_(n1);
        // post_attention_layernorm, Llama4VisionMLP: fc2(GELU(fc1(x))), biases
        let h2 = self.norm_gelu_mlp_residual(h, proj, rows, (e, m, s));
        // eager: the weights are bound in the layer until it returns
        if let Some(w) = weights {
            self.drop_(w);
        }
        h2
    }

    /// `vision_apply_rotary_emb` on `q` and `k` of `numel` elements each: `x.float()` (a copy
    /// unless fp32), `view_as_complex` (a view), the complex product with `freqs_ci` (complex64,
    /// 4 bytes an element; a buffer, so the product saves only it), `view_as_real(...)
    /// .flatten(3)` (a view), `type_as(x)` (a copy unless fp32); the fp32 tensors go when the
    /// function returns. Returns (q, k) rotated.
    fn llama4_rotary(&mut self, q: TensorId, k: TensorId, numel: u128) -> (TensorId, TensorId) {
        let s = self.param_size;
        if s == 4 {
            let qo = self.op(numel * 4, &[q], &[], &[], &[]);
            let ko = self.op(numel * 4, &[k], &[], &[], &[]);
            return (qo, ko);
        }
        let qf = self.cast(q, numel * 4);
        let kf = self.cast(k, numel * 4);
        let qo = self.op(numel * 4, &[qf], &[], &[], &[]);
        let ko = self.op(numel * 4, &[kf], &[], &[], &[]);
        let q = self.cast(qo, numel * s);
        let k = self.cast(ko, numel * s);
        for x in [qf, kf, qo, ko] {
            self.drop_(x);
        }
        (q, k)
    }

    /// Llama4VisionAttention's core over `tiles` tiles of `len` positions on `qkv`, no mask,
    /// not causal; returns the output (laid out `[T, len, H, D]`, so the reshape is a view)
    /// and, for eager, the attention weights the layer keeps. With grad, eager's matmuls save
    /// their reshaped operands (the copies of q and kᵀ; the probabilities and v's copy),
    /// softmax its bf16 result, the scaling nothing; SDPA's fused kernel saves q, k, v, its
    /// output and its fp32 logsumexp.
    fn llama4_attention(
        &mut self,
        tiles: u128,
        len: u128,
        e: u128,
        heads: u128,
        qkv: [TensorId; 3],
    ) -> (TensorId, Option<TensorId>) {
        let s = self.param_size;
        let numel = tiles * len * e;
        let w_elems = tiles * heads * len * len;
        let [q, k, v] = qkv;
        match self.mode.attention() {
            AttentionImpl::Eager => {
                // vision_eager_attention_forward: `matmul(q, kᵀ)` (q and kᵀ are transposed
                // views that matmul's `reshape` to [T·H, ., .] copies), `* head_dim**-0.5`,
                // softmax in the model dtype ("llama4 doesn't cast attn weights to fp32"),
                // dropout p = 0 returns its input, `matmul(w, v)` (v's reshape copies),
                // `transpose(1, 2).contiguous()` copies
                let qc = self.op(numel * s, &[q], &[], &[], &[]);
                let kc = self.op(numel * s, &[k], &[], &[], &[]);
                let w = self.op(w_elems * s, &[qc, kc], &[qc, kc], &[], &[]);
                self.drop_(qc);
                self.drop_(kc);
                let ws = self.op(w_elems * s, &[w], &[], &[], &[]);
                self.drop_(w);
                let sm = self.op_saving_output(w_elems * s, ws);
                self.drop_(ws);
                let vc = self.op(numel * s, &[v], &[], &[], &[]);
                let o = self.op(numel * s, &[sm, vc], &[sm, vc], &[], &[]);
                self.drop_(vc);
                let oc = self.op(numel * s, &[o], &[], &[], &[]);
                self.drop_(o);
                (oc, Some(sm))
            }
            AttentionImpl::Sdpa | AttentionImpl::Flash => {
                // scaled_dot_product_attention: the fused kernel's output (q's [T, len, H, D]
                // layout, so `transpose(1, 2).contiguous()` is a view) and its fp32
                // logsumexp, dropped by the Python wrapper unless saved
                let rg = qkv.iter().any(|&x| self.rg(x));
                let o = self.act(numel * s, rg);
                let lse = self.act(tiles * heads * len * 4, false);
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
        e.phase_peak(Phase::Forward).unwrap()
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

    /// Under checkpointing the tower's backward runs after the text's (the patch embeddings
    /// require grad): the recomputed encoder layer holds its saved tensors (LayerNorm inputs,
    /// q/k/v, fc1's output for the GELU) in the backward, so the backward peak passes the
    /// text-only step's by more than one [rows, mlp] activation (LoRA on the text, whose frozen
    /// weights then have no gradients); measured: vlm-l4xc-img2448-b4-sgd-ckpt within 0.01%,
    /// -25.5% with the frozen-tower forward alone.
    #[test]
    fn checkpointing_runs_the_towers_backward() {
        use super::super::vision::test_support::{backward_phase_peak, ckpt_lora_workload};
        use crate::memory::check_image_checkpointing;
        for attention in [AttentionImpl::Sdpa, AttentionImpl::Eager] {
            let w = ckpt_lora_workload(1, 64, attention, "o_proj");
            let backward = |m: &ModelDesc| backward_phase_peak(m, &w);
            // one tile: 577 positions, 5632 bf16 features
            let one_mlp_activation = 577 * 5632 * 2;
            let text = backward(&model(None));
            let images = backward(&model(Some(144)));
            assert!(
                images > text + one_mlp_activation,
                "{attention:?}: {images} vs {text}"
            );
            let m = model(Some(144));
            assert!(check_image_checkpointing(&m, &w, false).is_ok());
            assert!(check_image_checkpointing(&m, &w, true)
                .is_err_and(|e| e.field() == Some("image_tokens")));
        }
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
