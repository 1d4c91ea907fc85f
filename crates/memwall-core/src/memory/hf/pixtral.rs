//! Mistral 3's image path (`--image-tokens N` on a `mistral3` wrapper), op by op as
//! transformers 5.23 runs it: `mistral3/modeling_mistral3.py` (`Mistral3Model.forward`,
//! `get_image_features`, `get_placeholder_mask`, `Mistral3MultiModalProjector`,
//! `Mistral3PatchMerger`, `Mistral3RMSNorm`) and `pixtral/modeling_pixtral.py`
//! (`PixtralVisionModel.forward`, `PixtralVisionRotaryEmbedding`, `generate_block_attention_mask`,
//! `PixtralAttentionLayer`, `PixtralAttention`, `apply_rotary_pos_emb`, `eager_attention_forward`,
//! `PixtralMLP`, `PixtralRMSNorm`).
//!
//! N image tokens are one image per sequence of the most nearly square `a × b = N` tokens
//! (`vision::image_grid`), i.e. `(a·merge) × (b·merge)` patches of an image of
//! `(a·merge·patch) × (b·merge·patch)` pixels, which PixtralImageProcessor keeps as it is (a
//! multiple of the patch within its longest edge). PixtralProcessor adds one `[IMG_BREAK]` per
//! row and an `[IMG_END]`: text tokens of the sequence, not image tokens.
//!
//! The tower is frozen and `pixel_values` never require grad, so nothing of it is saved for
//! backward (as in `vision.rs`). Pixtral runs all the batch's images as one sequence of
//! `L = B·patches` positions with a block-diagonal additive mask `[L, L]` in the model dtype
//! (`generate_block_attention_mask`; none under flash attention, which gets `cu_seqlens`), so
//! eager attention weights are `[1, heads, L, L]`. What outlives the tower: the tower's output
//! object (`mm_encoder_outputs["image"]`: `last_hidden_state` and the projected `pooler_output`),
//! the concatenated `image_features` and the placeholder mask, locals of `Mistral3Model.forward`
//! until the language model returns; `masked_scatter` saves the mask when the embeddings
//! require grad. Only `vision_feature_layer = -1` is simulated (the normaliser leaves the
//! forward out otherwise, so `--image-tokens` is refused by name).

use super::Builder;
use crate::memory::timeline::{Ids, Node, TensorId};
use crate::model::VisionForward;
use crate::workload::AttentionImpl;

impl Builder<'_> {
    /// `Mistral3Model.forward` from the embeddings to the merged `inputs_embeds` for a forward
    /// that carries pixels; `n` image tokens (one image) per sequence. Consumes `emb`'s
    /// reference.
    pub(super) fn pixtral_image_merge(
        &mut self,
        f: &VisionForward,
        emb: TensorId,
        n: u128,
    ) -> TensorId {
        let s = self.param_size;
        let images = self.batch;
        let (last, projected) = self.pixtral_tower(f, images, n);
        // `torch.cat(pooler_output, dim=0).to(device, dtype)`: a copy of the split views
        let image_features = self.op(
            images * n * u128::from(f.out) * s,
            &[projected],
            &[],
            &[],
            &[],
        );
        // get_placeholder_mask: `input_ids == image_token_id` [B, S] bool (`sum()` and the
        // size check are scalars; `unsqueeze(-1)` a view)
        let rows = self.tokens;
        let image_mask = self.act(rows, false);
        // `inputs_embeds.masked_scatter(special_image_mask, image_features)`: a new tensor
        let merged = self.masked_scatter_embeds(emb, image_features, image_mask);
        self.vision_refs
            .extend([last, projected, image_features, image_mask]);
        merged
    }

    /// `get_image_features`: PixtralVisionModel over `images` images of `n` LLM tokens each,
    /// then `Mistral3MultiModalProjector`. Returns (`last_hidden_state`, the projector's output).
    fn pixtral_tower(&mut self, f: &VisionForward, images: u128, n: u128) -> (TensorId, TensorId) {
        let s = self.param_size;
        let merge2 = u128::from(f.merge) * u128::from(f.merge);
        let per_image = n * merge2;
        let l = images * per_image;
        let e = u128::from(f.width);
        let heads = u128::from(f.heads).max(1);
        let hd = e / heads;
        let g = self.t.granularity.max(1);
        let grad = self.mode.checkpointing();
        // `patch_conv(pixel_values.to(dtype=target_dtype))`: a copy of the fp32 pixels unless
        // fp32 (freed when the conv returns); the conv's [B, E, h, w] output stays alive
        // through the tower: `patch_embeds_list` (a local until the forward returns) holds
        // views of it
        let pv = (s != 4).then(|| self.act(l * u128::from(f.patch_in) * s, false));
        let conv = self.act(l * e * s, false);
        if let Some(pv) = pv {
            self.drop_(pv);
        }
        if grad {
            // enable_input_require_grads' hook on `get_input_embeddings()` (PixtralVisionModel:
            // `patch_conv`, modeling_pixtral.py) calls `output.requires_grad_(True)`: the conv
            // output is a leaf that requires grad, held by its AccumulateGrad node until
            // backward reaches it (as in vision.rs); the slices, flatten and `.T` are views
            self.input_grad_leaf(conv);
        }
        // `torch.cat([p.flatten(1).T ...])` [1, L, E], then ln_pre (PixtralRMSNorm); the cat
        // goes when `patch_embeds` is rebound; the normed embeddings stay bound until the
        // forward returns
        let cat = self.op(l * e * s, &[conv], &[], &[], &[]);
        let embeds = self.vision_norm_of(true, cat, l * e, l);
        self.drop_(cat);
        // position ids: per image `torch.stack([h.flatten(), w.flatten()], -1)` int64 [P, 2]
        // kept in a list, then `torch.cat` [L, 2] (the list goes when the name is rebound)
        let stacked = self.act(images * per_image * 16, false);
        let position_ids = self.act(l * 16, false);
        self.drop_(stacked);
        let (cos, sin) = self.pixtral_rope(l, hd);
        // generate_block_attention_mask: `torch.full((L, L), finfo.min, dtype)` with the image
        // blocks zeroed in place, expanded (a view); flash attention gets cu_seqlens instead
        let mask =
            (self.mode.attention() != AttentionImpl::Flash).then(|| self.act(l * l * s, false));
        let mut h = embeds;
        for block in 0..f.depth {
            let y = if grad {
                // the checkpointed PixtralAttentionLayer (a GradientCheckpointingLayer): its
                // forward saves nothing, the checkpoint keeps its inputs (the hidden state, the
                // mask and cos/sin) for the recompute
                self.t.recording = false;
                let y = self.pixtral_block(f, l, h, cos, sin, mask);
                self.t.recording = true;
                self.t.set_requires_grad(y, true);
                let mut saved = Ids::of(&[h, cos, sin]);
                if let Some(mask) = mask {
                    saved.push(mask);
                }
                self.t.record(Node {
                    saved,
                    outputs: Ids::of(&[y]),
                    recompute_vision: Some(u32::try_from(block).unwrap_or(u32::MAX)),
                    ..Node::default()
                });
                y
            } else {
                self.pixtral_block(f, l, h, cos, sin, mask)
            };
            // the caller's `hidden_states` goes when rebound (the embeddings stay bound in the
            // forward)
            if h != embeds {
                self.drop_(h);
            }
            h = y;
        }
        // PixtralVisionModel.forward returns: its locals go
        for x in [Some(conv), Some(position_ids), Some(cos), Some(sin), mask]
            .into_iter()
            .flatten()
        {
            self.drop_(x);
        }
        if h != embeds {
            self.drop_(embeds);
        }
        let last = h;
        // Mistral3MultiModalProjector: norm (Mistral3RMSNorm), then Mistral3PatchMerger: per
        // image `view(h, w, d).permute(2, 0, 1)` (a view) and `F.unfold` (im2col makes its
        // input contiguous, a copy freed on return), kept in a list; `torch.cat` of the list,
        // `merging_layer`; the list goes when the merger returns. The list only grows, so the
        // first `images - 1` grids are allocated as one block of their rounded sizes and the
        // last image is replayed in full: the same peak.
        let normed = self.vision_norm_of(true, last, l * e, l);
        let grid_bytes = per_image * e * s;
        let earlier =
            (images > 1).then(|| self.act((images - 1) * grid_bytes.div_ceil(g) * g, false));
        // with grad: `im2col` saves only sizes, `cat` and the frozen `merging_layer` nothing
        let contiguous = self.act(grid_bytes, false);
        let grid = self.op(grid_bytes, &[normed], &[], &[], &[]);
        self.drop_(contiguous);
        let grids_cat = self.op(l * e * s, &[grid], &[], &[], &[]);
        let merged = self.op(l / merge2.max(1) * e * s, &[grids_cat], &[], &[], &[]);
        self.drop_(grids_cat);
        self.drop_(grid);
        if let Some(x) = earlier {
            self.drop_(x);
        }
        self.drop_(normed);
        // linear_1, act (projector_hidden_act), linear_2 over the B·N tokens
        let rows = images * n;
        let out = u128::from(f.out);
        // (frozen linears save nothing of their inputs; the activation, GELU, saves its input)
        let l1 = self.op(rows * out * s, &[merged], &[], &[], &[]);
        let a = self.op(rows * out * s, &[l1], &[l1], &[], &[]);
        self.drop_(l1);
        let projected = self.op(rows * out * s, &[a], &[], &[], &[]);
        self.drop_(a);
        self.drop_(merged);
        (last, projected)
    }

    /// One `PixtralAttentionLayer` over the `l` patches from `h` (which keeps its reference):
    /// `h + attention(attention_norm(h))`, then `h + feed_forward(ffn_norm(h))`; returns its
    /// output. The weights are frozen, so a linear saves nothing of its input (`mm` saves
    /// `self` only when `mat2` requires grad, derivatives.yaml); SiLU saves its input, the
    /// gate-up product both operands. Without grad nothing is recorded.
    pub(super) fn pixtral_block(
        &mut self,
        f: &VisionForward,
        l: u128,
        h: TensorId,
        cos: TensorId,
        sin: TensorId,
        mask: Option<TensorId>,
    ) -> TensorId {
        let s = self.param_size;
        let e = u128::from(f.width);
        let heads = u128::from(f.heads).max(1);
        let m = u128::from(f.mlp);
        // PixtralAttentionLayer: attention_norm, q/k/v_proj ([1, L, E]; views per head)
        let n1 = self.vision_norm_of(true, h, l * e, l);
        let q = self.op(l * e * s, &[n1], &[], &[], &[]);
        let k = self.op(l * e * s, &[n1], &[], &[], &[]);
        let v = self.op(l * e * s, &[n1], &[], &[], &[]);
        // apply_rotary_pos_emb in the model dtype (cos/sin are cast by the rotary module)
        let qe = self.pixtral_rotate(q, cos, sin, l * e);
        let ke = self.pixtral_rotate(k, cos, sin, l * e);
        self.drop_(q);
        self.drop_(k);
        let (o, weights) = self.pixtral_attention(l, e, heads, s, [qe, ke, v], mask);
        // `reshape(...).contiguous()` is a view; o_proj; then the attention's locals go
        let proj = self.op(l * e * s, &[o], &[], &[], &[]);
        self.drop_(o);
        self.drop_(qe);
        self.drop_(ke);
        self.drop_(v);
        self.drop_(n1);
        let h1 = self.op(l * e * s, &[h, proj], &[], &[], &[]);
        self.drop_(proj);
        // ffn_norm, PixtralMLP: down(act(gate(x)) * up(x))
        let n2 = self.vision_norm_of(true, h1, l * e, l);
        let prod = self.gated_act_product(n2, l * m * s);
        let h2 = self.mlp_out_residual(h1, n2, prod, l * e * s);
        // eager: the weights are bound to `_` in the layer until it returns
        if let Some(w) = weights {
            self.drop_(w);
        }
        h2
    }

    /// PixtralVisionRotaryEmbedding over `l` positions (under `no_grad`): `position_ids[...,
    /// None].float() * inv_freq` [L, 2, hd/2] fp32, `cos()`/`sin()` each scaled by
    /// `attention_scaling` (a new tensor), recomposed (`torch.cat` of the h and w halves, then
    /// of that twice: [L, hd] fp32) and cast to the model dtype; returns (cos, sin).
    fn pixtral_rope(&mut self, l: u128, hd: u128) -> (TensorId, TensorId) {
        let s = self.param_size;
        let pf = self.act(l * 2 * 4, false);
        let freqs = self.act(l * hd * 4, false);
        self.drop_(pf);
        let mut pair = [freqs; 2];
        for slot in &mut pair {
            let raw = self.act(l * hd * 4, false);
            let scaled = self.act(l * hd * 4, false);
            self.drop_(raw);
            *slot = scaled;
        }
        for slot in &mut pair {
            let half = self.act(l * hd / 2 * 4, false);
            let full = self.act(l * hd * 4, false);
            self.drop_(half);
            self.drop_(*slot);
            *slot = full;
        }
        if s == 4 {
            self.drop_(freqs);
            return (pair[0], pair[1]);
        }
        let cos = self.act(l * hd * s, false);
        let sin = self.act(l * hd * s, false);
        self.drop_(freqs);
        self.drop_(pair[0]);
        self.drop_(pair[1]);
        (cos, sin)
    }

    /// `(x * cos) + (rotate_half(x) * sin)` in the model dtype over `numel` elements of `x`:
    /// returns the result, its temporaries freed. With `x` requiring grad the products save
    /// the (grad-free) cos and sin only; `rotate_half`'s slices, negation and concatenation
    /// save nothing.
    fn pixtral_rotate(
        &mut self,
        x: TensorId,
        cos: TensorId,
        sin: TensorId,
        numel: u128,
    ) -> TensorId {
        let s = self.param_size;
        let a = self.mul(x, cos, numel * s);
        // rotate_half: torch.cat((-x2, x1), dim=-1)
        let neg = self.act(numel / 2 * s, false);
        let cat = self.op(numel * s, &[x], &[], &[], &[]);
        self.drop_(neg);
        let b = self.mul(cat, sin, numel * s);
        self.drop_(cat);
        let y = self.op(numel * s, &[a, b], &[], &[], &[]);
        self.drop_(a);
        self.drop_(b);
        y
    }

    /// PixtralAttention's core over one sequence of `l` patches with the block mask; returns
    /// the output ([1, L, H, D] layout, so the reshape is a view) and, for eager, the
    /// attention weights the layer keeps. With grad, eager's matmuls save their operands
    /// (q and k; the 16-bit probabilities and v), `_softmax` its fp32 result, the scaling,
    /// the mask's add and the casts nothing; SDPA's fused kernel saves q, k, v, the mask, its
    /// output and its fp32 logsumexp.
    fn pixtral_attention(
        &mut self,
        l: u128,
        e: u128,
        heads: u128,
        s: u128,
        qkv: [TensorId; 3],
        mask: Option<TensorId>,
    ) -> (TensorId, Option<TensorId>) {
        let w_elems = heads * l * l;
        let [q, k, v] = qkv;
        match self.mode.attention() {
            AttentionImpl::Eager => {
                // matmul(q, kᵀ) * scaling, + attention_mask, softmax(dtype=float32) (converts
                // its input first), cast back; dropout p = 0 returns its input; matmul with v;
                // `transpose(1, 2).contiguous()` copies
                let w = self.op(w_elems * s, &[q, k], &[q, k], &[], &[]);
                let ws = self.op(w_elems * s, &[w], &[], &[], &[]);
                self.drop_(w);
                let wm = self.op(w_elems * s, &[ws], &[], &[], &[]);
                self.drop_(ws);
                let sm = if s == 4 {
                    self.op_saving_output(w_elems * 4, wm)
                } else {
                    let up = self.cast(wm, w_elems * 4);
                    let sm32 = self.op_saving_output(w_elems * 4, up);
                    self.drop_(up);
                    let sm = self.cast(sm32, w_elems * s);
                    self.drop_(sm32);
                    sm
                };
                self.drop_(wm);
                let o = self.op(l * e * s, &[sm, v], &[sm, v], &[], &[]);
                let oc = self.op(l * e * s, &[o], &[], &[], &[]);
                self.drop_(o);
                (oc, Some(sm))
            }
            AttentionImpl::Sdpa | AttentionImpl::Flash => {
                // the fused kernel's output (laid out [1, L, H, D]) and its fp32 logsumexp,
                // dropped by the Python wrapper
                let rg = qkv.iter().any(|&x| self.rg(x));
                let o = self.act(l * e * s, rg);
                let lse = self.act(heads * l * 4, false);
                if rg {
                    let mut saved = Ids::of(&[q, k, v, o, lse]);
                    if let Some(mask) = mask {
                        saved.push(mask);
                    }
                    self.t.record(Node {
                        saved,
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

    /// Llama-2-7B's first two layers behind a small Pixtral-shaped tower.
    fn model(image_tokens: Option<u64>) -> ModelDesc {
        let mut m = llama2_7b();
        m.layers.truncate(2);
        m.vision = Some(VisionTower {
            model_type: "pixtral".into(),
            encoder_params: 1000,
            projector_params: 100,
            trainable: false,
            linears: Vec::new(),
            forward: Some(VisionForward {
                patch_in: 3 * 14 * 14,
                width: 1024,
                heads: 16,
                mlp: 4096,
                depth: 2,
                merge: 2,
                out: 4096,
                kind: VisionKind::Pixtral,
                window: 0,
                full_blocks: Vec::new(),
                per_image: 0,
                adapter: 0,
            }),
            image_tokens,
        });
        m
    }

    fn forward_peak(m: &ModelDesc, batch: u64, attention: AttentionImpl) -> u64 {
        let mut w = TrainWorkload::new(batch, 1100);
        w.attention = attention;
        let e = simulate_train(m, &w, Kernels::Cuda).unwrap();
        e.phase_peak(Phase::Forward).unwrap()
    }

    #[test]
    fn eager_attention_spans_the_whole_batch_of_images() {
        // two images of 1024 tokens (4096 patches each) are one sequence of L = 8192 with a
        // block mask: eager holds [1, 16, L, L] weights (2 GiB in bf16) with the fp32
        // softmax and its fp32 input (4 GiB each) at once, SDPA none of them
        let text = forward_peak(&model(None), 2, AttentionImpl::Eager);
        let eager = forward_peak(&model(Some(1024)), 2, AttentionImpl::Eager);
        let sdpa = forward_peak(&model(Some(1024)), 2, AttentionImpl::Sdpa);
        let sdpa_text = forward_peak(&model(None), 2, AttentionImpl::Sdpa);
        assert!(eager > text + (8 << 30), "{text} {eager}");
        assert!(sdpa < sdpa_text + (320 << 20), "{sdpa_text} {sdpa}");
        assert!(sdpa < eager);
    }

    /// Under checkpointing the tower's backward runs after the text's: the recomputed layer's
    /// saved tensors (its norms' inputs, q/k/v, the SiLU input and the gate-up operands, the
    /// block mask held by the checkpoints) put the backward peak more than one [L, mlp]
    /// activation above the text-only step's (LoRA on the text, whose frozen weights then
    /// have no gradients); sharding is refused by name.
    #[test]
    fn checkpointing_runs_the_towers_backward() {
        use super::super::vision::test_support::{backward_phase_peak, ckpt_lora_workload};
        use crate::memory::check_image_checkpointing;
        for attention in [AttentionImpl::Sdpa, AttentionImpl::Eager] {
            let w = ckpt_lora_workload(1, 300, attention, "lm_head");
            let backward = |m: &ModelDesc| backward_phase_peak(m, &w);
            // 256 tokens: L = 1024 patches, 4096 bf16 features
            let one_mlp_activation = 1024 * 4096 * 2;
            let text = backward(&model(None));
            let images = backward(&model(Some(256)));
            assert!(
                images > text + one_mlp_activation,
                "{attention:?}: {images} vs {text}"
            );
            assert!(check_image_checkpointing(&model(Some(256)), &w, true)
                .is_err_and(|e| e.field() == Some("image_tokens")));
        }
    }
}
