//! State-space families: `mamba2` (`Mamba2ForCausalLM`, transformers 5.23
//! `models/mamba2/{configuration,modeling}_mamba2.py`). Their layers have no attention and no
//! MLP: each is a norm and a Mamba-2 token mixer ([`memwall_core::mixer::Mamba2`]).

use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{
    activation, assemble, limits::*, names, norm, token_embeddings, AttnOpts, Ctx, Heads, Parts,
};
use memwall_core::mixer::{Mamba2, Mixer};
use memwall_core::model::{
    Activation, Attention, Dropout, Head, LayerSpec, LinearRole, Mlp, ModelDesc, NormKind,
    Residual, ScalarMuls,
};

/// Upper bound on the SSM state size and the convolution width (published models: state 16 to
/// 256, kernel 4).
const MAX_STATE: u64 = 1 << 12;

/// The `attention` field of a layer whose mixer is not attention: no heads, no projections
/// (never read: [`LayerSpec::attention_block`] is `None` for such layers).
pub(crate) fn no_attention() -> Attention {
    AttnOpts {
        rotary_dim: None,
        ..AttnOpts::rope(0)
    }
    .build(
        Heads {
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
        },
        None,
    )
}

/// `mamba2`: `Mamba2Config` defaults (configuration_mamba2.py): vocab 32768, hidden 4096,
/// 64 layers, 128 heads of 64, state 128, 8 groups, expand 2, kernel 4, chunk 256, no
/// projection bias, conv bias, `residual_in_fp32`, untied head. `validate_architecture`
/// requires `hidden_size · expand == num_heads · head_dim`; the scan's
/// `repeat_interleave(num_heads // n_groups)` needs the groups to divide the heads.
pub(crate) fn mamba2(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let vocab = ctx.core(raw.vocab_size, "vocab_size", 32768, MAX_VOCAB)?;
    let hidden = ctx.core(raw.hidden_size, "hidden_size", 4096, MAX_HIDDEN)?;
    let layers = ctx.core(raw.num_hidden_layers, "num_hidden_layers", 64, MAX_LAYERS)?;
    let num_heads = ctx.size(raw.num_heads, "num_heads", 128, MAX_HEADS)?;
    let head_dim = ctx.size(raw.head_dim, "head_dim", 64, MAX_HEAD_DIM)?;
    let state_size = ctx.size(raw.state_size, "state_size", 128, MAX_STATE)?;
    let n_groups = ctx.size(raw.n_groups, "n_groups", 8, MAX_HEADS)?;
    let expand = ctx.size(raw.expand, "expand", 2, 64)?;
    let conv_kernel = ctx.size(raw.conv_kernel, "conv_kernel", 4, MAX_STATE)?;
    let chunk_size = ctx.size(raw.chunk_size, "chunk_size", 256, MAX_POSITIONS)?;
    let intermediate = hidden * expand;
    if intermediate != num_heads * head_dim {
        return Err(ctx.inconsistent(
            &["hidden_size", "expand", "num_heads", "head_dim"],
            format!(
                "hidden_size × expand = {intermediate} but num_heads × head_dim = {}",
                num_heads * head_dim
            ),
            "Mamba2Config.validate_architecture requires hidden_size * expand == num_heads * head_dim",
        ));
    }
    if num_heads % n_groups != 0 {
        return Err(ctx.inconsistent(
            &["num_heads", "n_groups"],
            format!("{n_groups} groups do not divide {num_heads} heads"),
            "each group's B and C are shared by num_heads / n_groups heads",
        ));
    }
    // Mamba2Mixer: `self.act = ACT2FN[config.hidden_act]` is the convolution's activation;
    // the torch path applies it through `causal_conv1d_fn(activation=...)`, which is silu in
    // every published config. Other activations are refused rather than mis-modelled.
    let act_name = raw.hidden_act.as_deref().unwrap_or("silu");
    if activation(ctx, "hidden_act", act_name)? != Activation::Silu {
        return Err(FormatError::Unsupported {
            field: ctx.field("hidden_act"),
            value: format!("\"{act_name}\""),
            reason: "memwall models the Mamba-2 convolution with silu only".into(),
            hint: "published Mamba-2 checkpoints use \"silu\"".into(),
        });
    }
    let mixer = Mamba2 {
        num_heads,
        head_dim,
        n_groups,
        state_size,
        conv_kernel,
        intermediate,
        chunk_size,
        proj_bias: raw.use_bias.unwrap_or(false),
        out_bias: raw.use_bias.unwrap_or(false),
        gated_norm: true,
        norm_before_gate: false,
        conv_bias: raw.use_conv_bias.unwrap_or(true),
        residual_in_fp32: raw.residual_in_fp32.unwrap_or(true),
        // Mamba2Model: `use_cache` is off in training whatever the config says
        state_in_training_cache: false,
    };
    // Mamba2RMSNorm: `weight * (x.float() * rsqrt(mean(x²) + eps)).to(input_dtype)`, the
    // Llama RMSNorm; one per block (`norm`) and the final `norm_f`.
    let rms = norm(NormKind::RmsNorm, hidden);
    let layer = LayerSpec {
        attn_norm: Some(rms),
        attn_post_norm: None,
        mlp_norm: None,
        mlp_post_norm: None,
        residual: Residual::Sequential,
        attention: no_attention(),
        mlp: Mlp::None,
        attn_output_outlives_mlp: false,
        mlp_input_rebound: false,
        mixer: Mixer::Mamba2(mixer),
        residual_scaled: false,
        parallel_residual_first: false,
        muls: ScalarMuls::NONE,
    };
    let n = usize::try_from(layers).unwrap_or(usize::MAX);
    assemble(
        ctx,
        "mamba2",
        Parts {
            hidden_size: hidden,
            // Mamba2Config states no context length and the recurrence has none; vLLM then
            // assumes 2048 (`_get_and_verify_max_len`, vllm/config/model.py: "Assuming the
            // model's maximum length is 2048"), which is what `memwall serve` defaults to
            max_position_embeddings: 2048,
            embeddings: token_embeddings(vocab, hidden, false),
            layers: vec![layer; n],
            head: Head {
                final_norm: Some(rms),
                tied: raw.tie_word_embeddings.unwrap_or(false),
                bias: false,
                logit_softcap: None,
                // Mamba2ForCausalLM.forward: `self.lm_head(h.to(lm_head.weight.dtype)).float()`
                logits_fp32: true,
                logits_scaled: false,
            },
            dropout: Dropout::default(),
            linear_names: names(&[
                (LinearRole::SsmIn, "in_proj"),
                (LinearRole::SsmOut, "out_proj"),
            ]),
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::error::FormatError;
    use crate::parse_hf_config;

    const CODESTRAL: &str = r#"{"model_type":"mamba2","hidden_size":4096,"num_hidden_layers":64,
        "num_heads":128,"head_dim":64,"expand":2,"n_groups":8,"state_size":128,"conv_kernel":4,
        "chunk_size":256,"vocab_size":32768,"use_bias":false,"use_conv_bias":true}"#;

    #[test]
    fn codestral_is_state_space_layers_only() {
        let d = parse_hf_config(CODESTRAL).unwrap();
        assert!(d.layers.iter().all(|l| l.attention_block().is_none()));
        let m = d.layers[0].mamba2().unwrap();
        assert_eq!((m.intermediate, m.conv_dim()), (8192, 10240));
        // transformers 5.23 Mamba2ForCausalLM: 7,285,403,648 parameters
        assert_eq!(d.param_counts().unwrap().total, 7_285_403_648);
        assert!(d.head.logits_fp32 && !d.head.tied);
    }

    #[test]
    fn heads_that_do_not_match_the_inner_width_are_refused() {
        let bad = CODESTRAL.replace(r#""num_heads":128"#, r#""num_heads":100"#);
        let e = parse_hf_config(&bad).unwrap_err();
        assert!(matches!(e, FormatError::Inconsistent { .. }), "{e:?}");
        let bad = CODESTRAL.replace(r#""n_groups":8"#, r#""n_groups":3"#);
        let e = parse_hf_config(&bad).unwrap_err();
        assert!(e.to_string().contains("n_groups"), "{e}");
    }
}
