//! `falcon_h1` (`FalconH1ForCausalLM`, TII Falcon-H1; transformers 5.23
//! `models/falcon_h1/{configuration,modeling}_falcon_h1.py`): every decoder layer runs an
//! attention block and a Mamba-2 mixer in parallel on the same normed input
//! ([`Mixer::AttentionAndMamba2`]), sums their scaled outputs into the residual, then a gated
//! MLP. µP multipliers everywhere (embeddings, logits, key, attention in/out, SSM in/out, the
//! `mup_vector` on `in_proj`'s output, MLP gate/down): each is a scalar `mul` transformers
//! applies whatever its value ([`ScalarMuls`]).
//!
//! `FalconH1Mixer` is `Mamba2Mixer` with two differences the description carries: the inner
//! width is `mamba_d_ssm` (else `mamba_expand · hidden`), and the gated RMSNorm is optional
//! (`mamba_rms_norm`; without it the scan output is `y * silu(gate)`).

use crate::error::FormatError;
use crate::raw::{HfConfig, RankOrAuto};
use crate::resolve::{
    activation, assemble, gated, heads, limits::*, names, norm, token_embeddings, AttnOpts, Ctx,
    HeadDimDefault, Parts,
};
use memwall_core::error::untrusted;
use memwall_core::mixer::{Mamba2, Mixer};
use memwall_core::model::{
    Activation, Dropout, Head, LayerSpec, LinearRole, Mlp, ModelDesc, NormKind, Residual,
    ScalarMuls,
};

/// Upper bound on the SSM state size and the convolution width.
const MAX_STATE: u64 = 1 << 12;

/// Every multiplication of `FalconH1DecoderLayer`, `FalconH1Mixer`, `FalconH1Attention`
/// (the key) and `FalconH1MLP`.
const FALCON_H1_MULS: ScalarMuls = ScalarMuls {
    attn_in: true,
    attn_out: true,
    ssm_in: true,
    ssm_proj: true,
    ssm_out: true,
    mlp_gate: true,
    mlp_down: true,
};

fn unsupported(ctx: &Ctx, field: &str, value: String, reason: &str, hint: &str) -> FormatError {
    FormatError::Unsupported {
        field: ctx.field(field),
        value,
        reason: reason.into(),
        hint: hint.into(),
    }
}

/// `falcon_h1`. Defaults from `FalconH1Config`: vocab 128000, hidden 4096, intermediate 14336,
/// 32 layers, 32 heads, 8 key/value heads, `mamba_d_ssm` 1024, 128 Mamba heads, `mamba_d_head`
/// "auto", 1 group, state 256, conv 4, chunk 256, conv bias, no projection biases, no gated
/// norm, untied head, context 8192.
pub(crate) fn falcon_h1(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let vocab = ctx.core(raw.vocab_size, "vocab_size", 128000, MAX_VOCAB)?;
    let hidden = ctx.core(raw.hidden_size, "hidden_size", 4096, MAX_HIDDEN)?;
    let layers = ctx.core(raw.num_hidden_layers, "num_hidden_layers", 32, MAX_LAYERS)?;
    let num_heads = ctx.core(
        raw.num_attention_heads,
        "num_attention_heads",
        32,
        MAX_HEADS,
    )?;
    // `hidden_act` is both the MLP's activation and the convolution's (`causal_conv1d_fn(...,
    // activation=self.activation)`); memwall models the convolution with silu only
    let act_name = raw.hidden_act.as_deref().unwrap_or("silu");
    if activation(ctx, "hidden_act", act_name)? != Activation::Silu {
        return Err(unsupported(
            ctx,
            "hidden_act",
            format!("\"{}\"", untrusted(act_name)),
            "memwall models the Falcon-H1 Mamba-2 convolution with silu only",
            "published Falcon-H1 checkpoints use \"silu\"",
        ));
    }
    // every layer is "hybrid" (`FalconH1Config.layers_block_type`, which `layer_types` maps to)
    if let Some(t) = raw
        .layer_types
        .as_ref()
        .and_then(|ts| ts.iter().find(|t| *t != "hybrid"))
    {
        return Err(unsupported(
            ctx,
            "layer_types",
            format!("\"{}\"", untrusted(t)),
            "every Falcon-H1 layer runs attention and a Mamba-2 mixer (\"hybrid\")",
            "leave `layer_types` out of a falcon_h1 config",
        ));
    }
    // generate() computes `num_logits_to_keep` logits in the prefill
    // (FalconH1ForCausalLM.prepare_inputs_for_generation); memwall models the last token's
    match raw.num_logits_to_keep {
        None | Some(Some(1)) => {}
        Some(v) => {
            return Err(unsupported(
                ctx,
                "num_logits_to_keep",
                v.map_or("null".into(), |n| n.to_string()),
                "the prefill's logits are modelled for the last prompt token only",
                "use 1 (the FalconH1Config default)",
            ))
        }
    }
    for (field, v, n) in [
        ("mlp_multipliers", &raw.mlp_multipliers, 2),
        ("ssm_multipliers", &raw.ssm_multipliers, 5),
    ] {
        if let Some(v) = v {
            if v.len() != n {
                return Err(unsupported(
                    ctx,
                    field,
                    format!("{} values", v.len()),
                    &format!("FalconH1 unpacks exactly {n} multipliers from `{field}`"),
                    &format!("give {n} numbers"),
                ));
            }
        }
    }
    // FalconH1Attention: `head_dim = getattr(config, "head_dim", hidden // heads)`; q/k/v/o
    // with `attention_bias`; RoPE over the whole head. `num_key_value_heads` defaults to 8
    // (a `null` also reads as absent here; transformers would take num_attention_heads)
    let h = heads(
        ctx,
        hidden,
        num_heads,
        (
            "num_key_value_heads",
            raw.num_key_value_heads.or(Some(8.min(num_heads))),
        ),
        raw.head_dim,
        HeadDimDefault::Derived,
    )?;
    let bias = raw.attention_bias.unwrap_or(false);
    let attention = AttnOpts {
        qkv_bias: bias,
        o_bias: bias,
        key_scaled: true,
        ..AttnOpts::rope(h.head_dim)
    }
    .build(h, None);
    // FalconH1Mixer: intermediate = mamba_d_ssm, or int(mamba_expand * hidden) when null
    let m_heads = ctx.size(raw.mamba_n_heads, "mamba_n_heads", 128, MAX_HEADS)?;
    let expand = ctx.size(raw.mamba_expand, "mamba_expand", 2, 64)?;
    let intermediate = match raw.mamba_d_ssm {
        None => 1024,
        Some(None) => expand * hidden,
        Some(Some(d)) => ctx.check(d, "mamba_d_ssm", MAX_INTERMEDIATE)?,
    };
    if intermediate % m_heads != 0 {
        return Err(ctx.inconsistent(
            &["mamba_n_heads", "mamba_d_ssm"],
            format!("{m_heads} Mamba heads do not divide the inner width {intermediate}"),
            "FalconH1Config.validate_architecture: mamba_n_heads must divide mamba_d_ssm (or mamba_expand * hidden_size)",
        ));
    }
    let d_head = match &raw.mamba_d_head {
        None => intermediate / m_heads,
        Some(RankOrAuto::Word(w)) if w == "auto" => intermediate / m_heads,
        Some(RankOrAuto::Word(w)) => {
            return Err(unsupported(
                ctx,
                "mamba_d_head",
                format!("\"{}\"", untrusted(w)),
                "mamba_d_head is a number or \"auto\"",
                "use \"auto\" (mamba_d_ssm / mamba_n_heads)",
            ))
        }
        Some(RankOrAuto::Rank(d)) => ctx.check(*d, "mamba_d_head", MAX_HEAD_DIM)?,
    };
    if d_head * m_heads != intermediate {
        return Err(ctx.inconsistent(
            &["mamba_d_head", "mamba_n_heads", "mamba_d_ssm"],
            format!("{m_heads} heads × {d_head} ≠ the inner width {intermediate}"),
            "FalconH1Config.validate_architecture requires mamba_d_head * mamba_n_heads == mamba_d_ssm (or mamba_expand * hidden_size)",
        ));
    }
    let n_groups = ctx.size(raw.mamba_n_groups, "mamba_n_groups", 1, MAX_HEADS)?;
    if m_heads % n_groups != 0 {
        return Err(ctx.inconsistent(
            &["mamba_n_heads", "mamba_n_groups"],
            format!("{n_groups} groups do not divide {m_heads} heads"),
            "each group's B and C are shared by mamba_n_heads / mamba_n_groups heads",
        ));
    }
    let gated_norm = raw.mamba_rms_norm.unwrap_or(false);
    // FalconH1Mixer: `FalconH1RMSNormGated(..., norm_before_gate=config.mamba_norm_before_gate)`
    // (FalconH1Config's default true) when `mamba_rms_norm`, else `nn.Identity()`
    let norm_before_gate = gated_norm && raw.mamba_norm_before_gate.unwrap_or(true);
    let mixer = Mamba2 {
        num_heads: m_heads,
        head_dim: d_head,
        n_groups,
        state_size: ctx.size(raw.mamba_d_state, "mamba_d_state", 256, MAX_STATE)?,
        conv_kernel: ctx.size(raw.mamba_d_conv, "mamba_d_conv", 4, MAX_STATE)?,
        intermediate,
        chunk_size: ctx.size(raw.mamba_chunk_size, "mamba_chunk_size", 256, MAX_POSITIONS)?,
        proj_bias: raw.mamba_proj_bias.unwrap_or(false),
        out_bias: raw.projectors_bias.unwrap_or(false),
        gated_norm,
        norm_before_gate,
        conv_bias: raw.mamba_conv_bias.unwrap_or(true),
        // FalconH1DecoderLayer keeps the residual in the model dtype
        residual_in_fp32: false,
        // FalconH1Model builds a DynamicCache when `use_cache` (the config's) is on, in training too
        state_in_training_cache: true,
    };
    // FalconH1MLP: gate/up/down with `mlp_bias`
    let mlp = Mlp::Dense(memwall_core::model::DenseMlp {
        bias: raw.mlp_bias.unwrap_or(false),
        ..gated(
            ctx.size(
                raw.intermediate_size,
                "intermediate_size",
                14336,
                MAX_INTERMEDIATE,
            )?,
            Activation::Silu,
        )
    });
    // FalconH1RMSNorm = the Llama RMSNorm (`input_layernorm`, `pre_ff_layernorm`,
    // `final_layernorm`)
    let rms = norm(NormKind::RmsNorm, hidden);
    let layer = LayerSpec {
        attn_norm: Some(rms),
        attn_post_norm: None,
        mlp_norm: Some(rms),
        mlp_post_norm: None,
        residual: Residual::Sequential,
        attention,
        mlp,
        attn_output_outlives_mlp: false,
        mlp_input_rebound: false,
        mixer: Mixer::AttentionAndMamba2(mixer),
        residual_scaled: false,
        parallel_residual_first: false,
        muls: FALCON_H1_MULS,
    };
    let n = usize::try_from(layers).unwrap_or(usize::MAX);
    assemble(
        ctx,
        "falcon_h1",
        Parts {
            hidden_size: hidden,
            max_position_embeddings: ctx.size(
                raw.max_position_embeddings,
                "max_position_embeddings",
                8192,
                MAX_POSITIONS,
            )?,
            // FalconH1Model.forward: `self.embed_tokens(input_ids) * self.embedding_multiplier`
            embeddings: token_embeddings(vocab, hidden, true),
            layers: vec![layer; n],
            head: Head {
                final_norm: Some(rms),
                tied: raw.tie_word_embeddings.unwrap_or(false),
                bias: false,
                logit_softcap: None,
                logits_fp32: false,
                // `self.lm_head(hidden_states) * self.model.lm_head_multiplier`
                logits_scaled: true,
            },
            dropout: Dropout {
                attention: ctx.prob(raw.attention_dropout, "attention_dropout", 0.0)?,
                ..Dropout::default()
            },
            // peft 0.21 refuses `out_proj` and `conv1d` of falcon_h1 models ("incompatible with
            // Mamba-based models", peft/tuners/tuners_utils.py), so they are not LoRA targets
            linear_names: names(&[
                (LinearRole::Q, "q_proj"),
                (LinearRole::K, "k_proj"),
                (LinearRole::V, "v_proj"),
                (LinearRole::O, "o_proj"),
                (LinearRole::Gate, "gate_proj"),
                (LinearRole::Up, "up_proj"),
                (LinearRole::Down, "down_proj"),
                (LinearRole::SsmIn, "in_proj"),
            ]),
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::error::FormatError;
    use crate::parse_hf_config;

    fn config() -> String {
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/truth/configs/falcon-h1-0.5b.json"
        ))
        .unwrap()
    }

    #[test]
    fn every_layer_runs_attention_and_mamba() {
        let d = parse_hf_config(&config()).unwrap();
        assert!(d
            .layers
            .iter()
            .all(|l| l.parallel_mixers() && l.attention_block().is_some() && l.mamba2().is_some()));
        let m = d.layers[0].mamba2().unwrap();
        assert_eq!(
            (m.intermediate, m.conv_dim(), m.in_proj_width()),
            (1536, 1792, 3352)
        );
        assert!(!m.gated_norm);
        // transformers 5.23 FalconH1ForCausalLM on the meta device: 521,411,104
        assert_eq!(d.param_counts().unwrap().total, 521_411_104);
    }

    /// `FalconH1RMSNormGated`'s order follows `mamba_norm_before_gate` (FalconH1Config's
    /// default true) when `mamba_rms_norm` is on; without the norm there is no order.
    #[test]
    fn gated_norm_order_follows_mamba_norm_before_gate() {
        let c = config();
        // (mamba_rms_norm, the mamba_norm_before_gate entry or none) -> (gated, norm first)
        for (rms, entry, gated, before) in [
            ("true", r#""mamba_norm_before_gate": true,"#, true, true),
            ("true", "", true, true),
            ("true", r#""mamba_norm_before_gate": false,"#, true, false),
            ("false", r#""mamba_norm_before_gate": true,"#, false, false),
        ] {
            let json = c
                .replacen(r#""mamba_norm_before_gate": false,"#, entry, 1)
                .replacen(
                    r#""mamba_rms_norm": false"#,
                    &format!(r#""mamba_rms_norm": {rms}"#),
                    1,
                );
            let d = parse_hf_config(&json).unwrap();
            let m = d.layers[0].mamba2().unwrap();
            assert_eq!(
                (m.gated_norm, m.norm_before_gate),
                (gated, before),
                "{rms} {entry}"
            );
        }
    }

    #[test]
    fn unsupported_fields_are_refused_by_name() {
        let c = config();
        for (from, to, field) in [
            (
                r#""hidden_act": "silu""#,
                r#""hidden_act": "gelu""#,
                "hidden_act",
            ),
            (
                r#""mamba_d_head": 64"#,
                r#""mamba_d_head": "big""#,
                "mamba_d_head",
            ),
            (
                r#""model_type": "falcon_h1""#,
                r#""model_type": "falcon_h1", "num_logits_to_keep": null"#,
                "num_logits_to_keep",
            ),
        ] {
            assert!(c.contains(from), "{from}");
            let e = parse_hf_config(&c.replacen(from, to, 1)).unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
        let bad = c.replacen(r#""mamba_d_head": 64"#, r#""mamba_d_head": 48"#, 1);
        let e = parse_hf_config(&bad).unwrap_err();
        assert!(matches!(e, FormatError::Inconsistent { .. }), "{e:?}");
    }
}
