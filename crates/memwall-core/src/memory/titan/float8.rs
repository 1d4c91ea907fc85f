//! torchtitan 0.3.0's float8 linear layers (`--float8`): `Float8LinearConverter`
//! (torchtitan/components/quantization/float8.py) swaps every `Linear` whose two dims divide by
//! 16 (its default `filter_fqns = []`: every projection of every block and the LM head) for
//! torchao's `Float8Linear` (torchao 0.18.0, the version torchtitan 0.3.0's release pins,
//! docs/release.md).
//!
//! What torchao 0.18.0 does with memory (torchao/float8/float8_linear.py
//! `matmul_with_hp_or_float8_args`, float8_training_tensor.py `_ToFloat8ConstrFunc`,
//! float8_utils.py `tensor_to_amax` / `amax_to_scale` / `to_fp8_saturated`), measured with
//! FSDPMemTracker on fake tensors (`tools/truth/titan/measure_titan.py --float8`):
//! - **Saved for backward**: `ctx.save_for_backward(input_hp, weight_hp_t)`, the bf16 input
//!   and the (gathered) bf16 weight: what `F.linear` saves. No fp8 tensor outlives the
//!   linear, so the blocks' saved sets and the FSDP units are unchanged.
//! - **Each cast** of a bf16 tensor of `n` elements to float8 in eager mode: `abs` (bf16),
//!   the amax (rowwise: one per row) and its fp32 scale, then `tensor.to(float32) * scale`
//!   (two fp32 copies, the first freed after the product), `clamp` (a third fp32 copy) and
//!   `.to(float8)` (1 byte per element) while the product and the clamp are alive: `9n` bytes
//!   at its peak, `n` (and the scale) after it.
//! - **Forward** (`out = input @ weight.t()`): the input cast (`9MK`), then the weight cast
//!   with the fp8 input alive (`MK + 9NK`), then the `_scaled_mm` output (bf16 `[M, N]`)
//!   with both fp8 operands alive; the fp8 copies are freed when the function returns.
//! - **Backward** (rowwise): `grad_output` cast (`9MN`), the weight cast again for
//!   `grad_input` (`MN + 9NK`), `grad_input` (bf16), `grad_output` cast again along the other
//!   axis and the input cast again (the earlier fp8 copies are locals of `backward`, alive to
//!   its end), then `grad_weight` (bf16). `rowwise_with_gw_hp`: the weight for `grad_input`
//!   is cast tensorwise (one fp32 scale) and `grad_weight` is a bf16 matmul of the
//!   high-precision tensors (no further casts).
//!
//! The LM head (`[V, D]`) is the largest of these casts by far (`V ≥ 2·D` and `V ≥ F` for
//! every model this profile accepts, checked in [`check`]), so its forward and backward are
//! the instants added to the step (`step.rs`). The blocks' projections cast the same way at
//! smaller sizes; they are not added to the block instants (in every measured case they stay
//! below the peak: the head's casts, the loss, or the embeddings' gradient instants on 1–2
//! ranks). A peak at a block instant would be underestimated by that projection's casts.
//!
//! Not simulated, refused by name: the `tensorwise` recipe and FSDP2 float8 all-gather
//! (`enable_fsdp_float8_all_gather`, `precompute_float8_dynamic_scale_for_fsdp`): torchtitan
//! 0.3.0's converter accepts `recipe_name` `rowwise` | `rowwise_with_gw_hp` only and builds
//! `Float8Linear` through its constructor, never `Float8Linear.from_float` (where torchao
//! wraps the weight in `WeightWithDynamicFloat8CastTensor`, tensorwise only); float8 with
//! TP or PP, MoE experts (`Float8GroupedExpertsConverter`), tied embeddings (not measured).

use super::Shapes;
use crate::error::CoreError;

crate::names::named_enum! {
    /// torchtitan's float8 recipe (`Float8LinearConverter.Config.recipe_name`, torchao's
    /// `Float8LinearRecipeName`).
    pub enum Float8Recipe in "float8" {
        /// torchao's default: one scale per tensor (not offered by torchtitan 0.3.0).
        Tensorwise = "tensorwise": "one scale per tensor (torchao's default; torchtitan 0.3.0 does not offer it: refused)",
        /// Rowwise scales, e4m3 everywhere, power-of-two scales (torchtitan 0.3.0's default).
        Rowwise = "rowwise": "a scale per row, e4m3 for inputs, weights and gradients (torchtitan 0.3.0's default)",
        /// Rowwise, with `grad_input` against a tensorwise weight and `grad_weight` in bf16.
        RowwiseWithGwHp = "rowwise_with_gw_hp": "rowwise, with grad_weight computed in bf16 (torchao's ROWWISE_WITH_GW_HP)",
    }
}

/// Bytes one `Float8Linear` (`[M, K] @ [N, K]ᵀ`, bf16) holds besides what a bf16 linear holds,
/// at the peaks of its forward and of its backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LinearCasts {
    /// Forward: the largest of the input cast, the weight cast (the fp8 input alive) and the
    /// output written (both fp8 operands alive; the output's own bf16 bytes included, as the
    /// bf16 linear's logits are).
    pub forward: u128,
    /// Backward, besides the bf16 `grad_output` (alive throughout): the largest of the casts,
    /// `grad_input` and `grad_weight` with the fp8 copies alive (their bf16 bytes included).
    pub backward: u128,
}

/// The casts of one linear of `m` tokens, `k` inputs and `n` outputs under `recipe`
/// (torchao 0.18.0; see the module docs). Rowwise scales are fp32, one per row of the scaled
/// axis; a tensorwise scale is one fp32.
pub(super) fn linear_casts(recipe: Float8Recipe, m: u128, k: u128, n: u128) -> LinearCasts {
    let cast = |elements: u128| 9 * elements;
    // forward: input rowwise (scale [M, 1]), weight rowwise (scale [1, N]) in every recipe
    let input = m * k + 4 * m;
    let weight = n * k + 4 * n;
    let forward = cast(m * k)
        .max(input + cast(n * k) + 4 * n)
        .max(input + weight + 2 * m * n);
    // backward: `grad_output` rowwise ([M, 1]), the weight for `grad_input` (rowwise along the
    // other axis, [K, 1]; tensorwise in rowwise_with_gw_hp)
    let go = m * n + 4 * m;
    let w_scale = match recipe {
        Float8Recipe::RowwiseWithGwHp => 4,
        _ => 4 * k,
    };
    let w = n * k + w_scale;
    let grad_input = 2 * m * k;
    let grad_weight = 2 * n * k;
    let backward = match recipe {
        Float8Recipe::RowwiseWithGwHp => cast(m * n)
            .max(go + cast(n * k) + w_scale)
            .max(go + w + grad_input + grad_weight),
        _ => {
            // then `grad_output` along dim 0 ([1, N]) and the input along dim 0 ([1, K])
            let go0 = m * n + 4 * n;
            let in0 = m * k + 4 * k;
            cast(m * n)
                .max(go + cast(n * k) + w_scale)
                .max(go + w + grad_input + cast(m * n) + 4 * n)
                .max(go + w + grad_input + go0 + cast(m * k) + 4 * k)
                .max(go + w + grad_input + go0 + in0 + grad_weight)
        }
    };
    LinearCasts { forward, backward }
}

/// Refuses the float8 settings that are not simulated (see the module docs).
pub(super) fn check(
    recipe: Float8Recipe,
    all_gather: bool,
    s: &Shapes,
    tp: u64,
    pp: u64,
) -> Result<(), CoreError> {
    let refuse = |field: &'static str, value: String, reason: &'static str, hint: &'static str| {
        CoreError::Unsupported {
            field,
            value,
            engine: super::ENGINE,
            reason,
            hint,
        }
    };
    if recipe == Float8Recipe::Tensorwise {
        return Err(refuse(
            "float8",
            recipe.name().into(),
            "torchtitan 0.3.0's Float8LinearConverter accepts recipe_name rowwise | \
             rowwise_with_gw_hp only (components/quantization/float8.py); torchao's tensorwise \
             default is reached only through `emulate`, which is for tests",
            "use --float8 rowwise (torchtitan's default) or rowwise_with_gw_hp",
        ));
    }
    if all_gather {
        return Err(refuse(
            "float8_all_gather",
            "true".into(),
            "torchtitan 0.3.0 has no float8 all-gather: its converter builds Float8Linear \
             through the constructor, never `from_float` (where torchao 0.18.0 wraps the weight \
             for `enable_fsdp_float8_all_gather`), and torchao allows it only with tensorwise \
             scaling, which torchtitan 0.3.0 does not offer",
            "drop --float8-all-gather (FSDP2 gathers bf16 weights under --float8)",
        ));
    }
    if tp > 1 || pp > 1 {
        return Err(refuse(
            if tp > 1 { "tp" } else { "pp" },
            (if tp > 1 { tp } else { pp }).to_string(),
            "float8 linears with tensor or pipeline parallelism were not measured",
            "use --tp 1 --pp 1 with --float8, or drop --float8",
        ));
    }
    if s.moe.is_some() {
        return Err(refuse(
            "float8",
            recipe.name().into(),
            "float8 on MoE models (torchtitan's Float8GroupedExpertsConverter for the experts) \
             was not measured",
            "drop --float8 for a MoE model",
        ));
    }
    if s.tied {
        return Err(refuse(
            "float8",
            recipe.name().into(),
            "float8 with tied embeddings (the LM head's weight shared with the embeddings) was \
             not measured",
            "drop --float8 for a model with tied embeddings",
        ));
    }
    // the LM head's casts outweigh every block projection's (see the module docs)
    if s.vocab < 2 * s.dim || s.vocab < s.ffn || s.vocab < s.heads * s.head_dim {
        return Err(refuse(
            "float8",
            recipe.name().into(),
            "only the LM head's float8 casts are simulated, and this model's vocabulary is \
             smaller than a block projection, whose casts would then be larger",
            "drop --float8 for this model",
        ));
    }
    // torchtitan's `module_filter_fn`: only linears with both dims divisible by 16 are swapped
    if !s.vocab.is_multiple_of(16) || !s.dim.is_multiple_of(16) {
        return Err(refuse(
            "float8",
            recipe.name().into(),
            "the LM head has a dim not divisible by 16, so torchtitan's module_filter_fn keeps \
             it in bf16; that split was not measured",
            "drop --float8 for this model",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instants of one linear, by hand for `[2, 3] @ [4, 3]ᵀ` (M 2, K 3, N 4).
    #[test]
    fn the_casts_of_one_linear_follow_torchaos_order() {
        // forward: input cast 9·6 = 54; weight cast with the fp8 input and its scale:
        // (6 + 8) + 9·12 + 16 = 138; output: 6 + 8 + 12 + 16 + 2·8 = 58
        let r = linear_casts(Float8Recipe::Rowwise, 2, 3, 4);
        assert_eq!(r.forward, 138);
        // backward rowwise: the last cast (the input along dim 0) with grad_output's two fp8
        // copies (8 + 8, 8 + 16), the weight's (12 + 12) and grad_input (12) alive:
        // 16 + 24 + 12 + 24 + 9·6 + 12 = 142
        assert_eq!(r.backward, 142);
        // rowwise_with_gw_hp: the weight cast (tensorwise scale, 4 B) is the largest:
        // 16 + 9·12 + 4 = 128
        let g = linear_casts(Float8Recipe::RowwiseWithGwHp, 2, 3, 4);
        assert_eq!((g.forward, g.backward), (138, 128));
    }

    /// The LM head of Llama 3 8B at 1024 tokens: the weight cast (`9·V·D` with the fp8 input)
    /// is the forward's peak, as measured (`titan-fp8-8b-1l-w8-s1024-rowwise`: 4,202,692,608 B
    /// of fp32 copies, 525,336,576 B of fp8 weight, 4,194,304 B of fp8 input, the scales).
    #[test]
    fn the_lm_head_weight_cast_is_the_forward_peak() {
        let (m, k, n) = (1024, 4096, 128_256);
        let r = linear_casts(Float8Recipe::Rowwise, m, k, n);
        assert_eq!(
            r.forward,
            4_202_692_608 + 525_336_576 + 4_194_304 + 4 * m + 4 * n
        );
        // with more tokens the backward's grad_output casts (`M·N`) take over
        let long = linear_casts(Float8Recipe::Rowwise, 8192, k, n);
        assert!(long.backward > long.forward);
    }

    /// Only the LM head's casts are simulated: a model whose head is not the largest linear,
    /// or is not converted (a dim not divisible by 16), is refused; so are tensorwise, the
    /// float8 all-gather, TP and PP.
    #[test]
    fn what_is_not_simulated_is_refused_by_name() {
        let llama = Shapes {
            model: super::super::TitanModel::Llama3,
            dim: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            ffn: 14336,
            moe: None,
            mla: None,
            dense_layers: 0,
            vocab: 128_256,
            layers: 2,
            tied: false,
        };
        let field = |r: Result<(), CoreError>| r.err().and_then(|e| e.field());
        assert!(check(Float8Recipe::Rowwise, false, &llama, 1, 1).is_ok());
        assert!(check(Float8Recipe::RowwiseWithGwHp, false, &llama, 1, 1).is_ok());
        assert_eq!(
            field(check(Float8Recipe::Tensorwise, false, &llama, 1, 1)),
            Some("float8")
        );
        assert_eq!(
            field(check(Float8Recipe::Rowwise, true, &llama, 1, 1)),
            Some("float8_all_gather")
        );
        assert_eq!(
            field(check(Float8Recipe::Rowwise, false, &llama, 2, 1)),
            Some("tp")
        );
        assert_eq!(
            field(check(Float8Recipe::Rowwise, false, &llama, 1, 2)),
            Some("pp")
        );
        let small_vocab = Shapes {
            vocab: 8192,
            ..llama
        };
        assert!(check(Float8Recipe::Rowwise, false, &small_vocab, 1, 1).is_err());
        let odd_vocab = Shapes {
            vocab: 128_257,
            ..llama
        };
        assert!(check(Float8Recipe::Rowwise, false, &odd_vocab, 1, 1).is_err());
        let tied = Shapes {
            tied: true,
            ..llama
        };
        assert!(check(Float8Recipe::Rowwise, false, &tied, 1, 1).is_err());
    }
}
