//! Mamba-1: `mamba` (`MambaForCausalLM`, transformers 5.23
//! `models/mamba/{configuration,modeling}_mamba.py`). Its layers have no attention and no MLP:
//! each is a norm and a Mamba-1 token mixer ([`memwall_core::mixer::Mamba1`]).

use super::ssm::no_attention;
use crate::error::FormatError;
use crate::raw::{HfConfig, RankOrAuto};
use crate::resolve::{activation, assemble, limits::*, names, norm, token_embeddings, Ctx, Parts};
use memwall_core::mixer::{Mamba1, Mixer};
use memwall_core::model::{
    Activation, Dropout, Head, LayerSpec, LinearRole, Mlp, ModelDesc, NormKind, Residual,
    ScalarMuls,
};

/// Upper bound on the SSM state size and the convolution width (published models: state 16,
/// kernel 4).
const MAX_STATE: u64 = 1 << 12;

/// `mamba`: `MambaConfig` defaults (configuration_mamba.py): vocab 50280, hidden 768, 32
/// layers, state 16, expand 2, kernel 4, `time_step_rank` "auto" = `ceil(hidden / 16)`, no
/// projection bias, conv bias, `residual_in_fp32`, **tied** head (`tie_word_embeddings`
/// defaults to true). `intermediate_size` is always `int(expand · hidden_size)`
/// (`__post_init__` overwrites any value in the file). `n_layer` (in the state-spaces
/// `*-hf` configs next to `num_hidden_layers`) is not read by MambaConfig.
pub(crate) fn mamba(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let vocab = ctx.core(raw.vocab_size, "vocab_size", 50280, MAX_VOCAB)?;
    let hidden = ctx.core(raw.hidden_size, "hidden_size", 768, MAX_HIDDEN)?;
    let layers = ctx.core(raw.num_hidden_layers, "num_hidden_layers", 32, MAX_LAYERS)?;
    let state_size = ctx.size(raw.state_size, "state_size", 16, MAX_STATE)?;
    let expand = ctx.size(raw.expand, "expand", 2, 64)?;
    let conv_kernel = ctx.size(raw.conv_kernel, "conv_kernel", 4, MAX_STATE)?;
    let time_step_rank = match &raw.time_step_rank {
        None => hidden.div_ceil(16),
        Some(RankOrAuto::Word(w)) if w == "auto" => hidden.div_ceil(16),
        Some(RankOrAuto::Word(w)) => {
            return Err(FormatError::Unsupported {
                field: ctx.field("time_step_rank"),
                value: format!("\"{w}\""),
                reason: "MambaConfig accepts a number or \"auto\"".into(),
                hint: "use \"auto\" (ceil(hidden_size / 16)) or the rank".into(),
            })
        }
        Some(RankOrAuto::Rank(r)) => ctx.check(*r, "time_step_rank", MAX_HIDDEN)?,
    };
    // MambaMixer applies `config.hidden_act` after the convolution (`causal_conv1d_fn(...,
    // activation=self.activation)`): silu in every published config; others are refused
    // rather than mis-modelled.
    let act_name = raw.hidden_act.as_deref().unwrap_or("silu");
    if activation(ctx, "hidden_act", act_name)? != Activation::Silu {
        return Err(FormatError::Unsupported {
            field: ctx.field("hidden_act"),
            value: format!("\"{act_name}\""),
            reason: "memwall models the Mamba-1 convolution with silu only".into(),
            hint: "published Mamba checkpoints use \"silu\"".into(),
        });
    }
    let mixer = Mamba1 {
        intermediate: hidden * expand,
        state_size,
        time_step_rank,
        conv_kernel,
        proj_bias: raw.use_bias.unwrap_or(false),
        conv_bias: raw.use_conv_bias.unwrap_or(true),
        residual_in_fp32: raw.residual_in_fp32.unwrap_or(true),
        bcdt_norms: false,
    };
    // MambaRMSNorm: the Llama RMSNorm; one per block (`norm`) and the final `norm_f`
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
        mixer: Mixer::Mamba1(mixer),
        residual_scaled: false,
        parallel_residual_first: false,
        muls: ScalarMuls::NONE,
    };
    let n = usize::try_from(layers).unwrap_or(usize::MAX);
    assemble(
        ctx,
        "mamba",
        Parts {
            hidden_size: hidden,
            // MambaConfig states no context length and the recurrence has none; vLLM then
            // assumes 2048 (`_get_and_verify_max_len`, vllm/config/model.py)
            max_position_embeddings: 2048,
            embeddings: token_embeddings(vocab, hidden, false),
            layers: vec![layer; n],
            head: Head {
                final_norm: Some(rms),
                tied: raw.tie_word_embeddings.unwrap_or(true),
                bias: false,
                logit_softcap: None,
                // MambaForCausalLM.forward: `self.lm_head(h.to(lm_head.weight.dtype)).float()`
                logits_fp32: true,
                logits_scaled: false,
            },
            dropout: Dropout::default(),
            // the LoRA targets: peft 0.21 refuses `out_proj` and `conv1d` of Mamba models
            // ("incompatible with Mamba-based models", peft/tuners/tuners_utils.py), and
            // `x_proj` / `dt_proj` run inside the scan composite (not modelled as targets)
            linear_names: names(&[(LinearRole::SsmIn, "in_proj")]),
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;

    /// state-spaces/mamba-2.8b-hf config.json (the keys MambaConfig reads).
    const MAMBA_2_8B: &str = r#"{"model_type":"mamba","hidden_size":2560,"n_layer":64,
        "num_hidden_layers":64,"intermediate_size":5120,"state_size":16,"expand":2,
        "conv_kernel":4,"time_step_rank":160,"vocab_size":50280,"use_bias":false,
        "use_conv_bias":true,"residual_in_fp32":true}"#;

    #[test]
    fn mamba_2_8b_is_state_space_layers_only() {
        let d = parse_hf_config(MAMBA_2_8B).unwrap();
        assert!(d.layers.iter().all(|l| l.attention_block().is_none()));
        let m = d.layers[0].mamba1().unwrap();
        assert_eq!((m.intermediate, m.time_step_rank), (5120, 160));
        // transformers 5.23 MambaForCausalLM (tied head): 2,768,345,600 parameters
        assert_eq!(d.param_counts().unwrap().total, 2_768_345_600);
        assert!(d.head.logits_fp32 && d.head.tied);
    }

    #[test]
    fn auto_rank_is_a_sixteenth_of_hidden() {
        let d = parse_hf_config(
            r#"{"model_type":"mamba","hidden_size":768,"num_hidden_layers":2,"vocab_size":100,"time_step_rank":"auto"}"#,
        )
        .unwrap();
        assert_eq!(d.layers[0].mamba1().unwrap().time_step_rank, 48);
        let e = parse_hf_config(
            r#"{"model_type":"mamba","hidden_size":768,"num_hidden_layers":2,"vocab_size":100,"time_step_rank":"big"}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("time_step_rank"), "{e}");
    }
}
