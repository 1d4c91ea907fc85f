//! Phi (phi-1, phi-1.5, phi-2): one LayerNorm feeding a parallel attention + MLP block,
//! partial rotary, biased projections and a biased LM head (transformers 5.23
//! `models/phi/{configuration,modeling}_phi.py`).

use super::common::{Defaults, Dims};
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{
    assemble, names, norm, plain, token_embeddings, AttnOpts, Ctx, HeadDimDefault, Parts,
};
use memwall_core::mixer::Mixer;
use memwall_core::model::{
    Dropout, Embeddings, Head, LayerSpec, LinearRole, Mlp, ModelDesc, NormKind, QkNormScope,
    Residual, ScalarMuls,
};

/// `phi/configuration_phi.py` `PhiConfig` field defaults.
const PHI: Defaults = Defaults {
    vocab_size: 51200,
    hidden_size: 2048,
    intermediate_size: 8192,
    num_hidden_layers: 24,
    num_attention_heads: 32,
    num_key_value_heads: None,
    head_dim: HeadDimDefault::Derived,
    act: "gelu_new",
    max_position_embeddings: 2048,
    tie_word_embeddings: false,
    strict_divisible: false,
};

pub(crate) fn phi(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &PHI)?;
    // modeling_phi.py PhiAttention: with `qk_layernorm`, q_layernorm / k_layernorm are
    // `nn.LayerNorm(hidden_size // num_attention_heads, eps, elementwise_affine=True)` (weight
    // and bias) applied to the transposed `[B, H, S, D]` projections, before the partial RoPE.
    // Their width is `hidden_size // num_attention_heads`, not `head_dim`: a config whose
    // head_dim differs fails in transformers' forward.
    let qk_layernorm = raw.qk_layernorm == Some(true);
    let per_head = d.hidden / d.heads.num_heads.max(1);
    if qk_layernorm && per_head != d.heads.head_dim {
        return Err(FormatError::Unsupported {
            field: ctx.field("head_dim"),
            value: d.heads.head_dim.to_string(),
            reason: format!(
                "Phi's q/k LayerNorms are hidden_size // num_attention_heads = {per_head} wide, which does not match head_dim (transformers fails in the forward)"
            ),
            hint: "remove head_dim or set it to hidden_size / num_attention_heads".into(),
        });
    }
    // configuration_phi.py __post_init__: kwargs.setdefault("partial_rotary_factor", 0.5);
    // rope_parameters may carry it too. modeling_phi.py PhiAttention: rotary_ndims =
    // int(head_dim * partial_rotary_factor).
    let fraction = raw
        .rope_dict_partial_factor(ctx.prefix)?
        .or(raw.partial_rotary_factor)
        .unwrap_or(0.5);
    let rotary = ctx.rotary_dim(d.heads.head_dim, fraction, "partial_rotary_factor")?;
    // modeling_phi.py PhiAttention: q/k/v_proj and dense all bias=True; the rotated part is
    // rebuilt by `torch.cat((query_rot, query_pass), dim=-1)` always.
    let attention = AttnOpts {
        qkv_bias: true,
        o_bias: true,
        rotary_dim: Some(rotary),
        rope_concat: true,
        // modeling_phi.py PhiAttention.forward: query_rot/query_pass and key_rot/key_pass are
        // locals until the function returns
        rope_locals: true,
        qk_norm: qk_layernorm.then_some((QkNormScope::PerHead, NormKind::LayerNorm)),
        qk_norm_bias: qk_layernorm,
        ..AttnOpts::rope(d.heads.head_dim)
    }
    .build(d.heads, None);
    // modeling_phi.py PhiDecoderLayer: input_layernorm (nn.LayerNorm) only; attention and the
    // MLP both read its output: `attn_outputs + feed_forward_hidden_states + residual`.
    let n = norm(NormKind::LayerNorm, d.hidden);
    let layer = LayerSpec {
        attn_norm: Some(n),
        attn_post_norm: None,
        mlp_norm: None,
        mlp_post_norm: None,
        residual: Residual::Parallel,
        attention,
        // modeling_phi.py PhiMLP: fc2(act(fc1(x))), both nn.Linear with bias.
        mlp: Mlp::Dense(plain(d.intermediate, true, d.act)),
        attn_output_outlives_mlp: false,
        mlp_input_rebound: false,
        mixer: Mixer::Attention,
        residual_scaled: false,
        parallel_residual_first: false,
        muls: ScalarMuls::NONE,
    };
    assemble(
        ctx,
        "phi",
        Parts {
            hidden_size: d.hidden,
            max_position_embeddings: d.max_position_embeddings,
            // modeling_phi.py PhiModel.forward: `inputs_embeds = self.embed_dropout(inputs_embeds)`
            embeddings: Embeddings {
                dropout_rebinds: true,
                ..token_embeddings(d.vocab_size, d.hidden, false)
            },
            layers: vec![layer; d.num_layers()],
            // modeling_phi.py: final_layernorm nn.LayerNorm; PhiForCausalLM.lm_head bias=True.
            head: Head {
                final_norm: Some(n),
                tied: d.tie_word_embeddings,
                bias: true,
                logit_softcap: None,
                logits_fp32: false,
                logits_scaled: false,
            },
            // modeling_phi.py: embed_dropout(embd_pdrop) after the embeddings, resid_dropout
            // (resid_pdrop) on the attention and MLP outputs, attention_dropout on probabilities.
            dropout: Dropout {
                embed: ctx.prob(raw.embd_pdrop, "embd_pdrop", 0.0)?,
                attention: d.attention_dropout,
                residual: ctx.prob(raw.resid_pdrop, "resid_pdrop", 0.0)?,
                activation: 0.0,
            },
            linear_names: names(&[
                (LinearRole::Q, "q_proj"),
                (LinearRole::K, "k_proj"),
                (LinearRole::V, "v_proj"),
                (LinearRole::O, "dense"),
                (LinearRole::Up, "fc1"),
                (LinearRole::Down, "fc2"),
            ]),
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::parse_hf_config;
    use memwall_core::model::{NormKind, QkNormScope};

    #[test]
    fn phi_rotates_a_fraction_and_models_biased_qk_layernorms() {
        let d = parse_hf_config(
            r#"{"model_type":"phi","vocab_size":1000,"hidden_size":2048,"num_hidden_layers":2,
                "num_attention_heads":32}"#,
        )
        .unwrap();
        // PhiConfig defaults: hidden 2048 / 32 heads = 64, partial_rotary_factor 0.5
        let a = d.layers[0].attention;
        assert_eq!(a.rotary_dim, Some(32));
        assert!(d.head.bias && !d.head.tied);
        assert!(a.qk_norm.is_none() && !a.qk_norm_bias);
        let with = parse_hf_config(
            r#"{"model_type":"phi","vocab_size":1000,"hidden_size":2048,"num_hidden_layers":2,
                "num_attention_heads":32,"qk_layernorm":true}"#,
        )
        .unwrap();
        let b = with.layers[0].attention;
        assert_eq!(b.qk_norm, Some((QkNormScope::PerHead, NormKind::LayerNorm)));
        assert!(b.qk_norm_bias);
        // two LayerNorm(64) per layer, each a weight and a bias
        assert_eq!(b.params(2048) - a.params(2048), 4 * 64);
        // a head_dim other than hidden / heads: the LayerNorms' width does not fit
        let e = parse_hf_config(
            r#"{"model_type":"phi","vocab_size":1000,"hidden_size":2048,"num_hidden_layers":2,
                "num_attention_heads":32,"head_dim":48,"qk_layernorm":true}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("head_dim"), "{e}");
    }
}
