//! HunYuan dense v1 (transformers 5.23 `models/hunyuan_v1_dense/`): a Llama layer skeleton whose
//! per-head q/k RMSNorms run on the rotated queries and keys.

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{gated, limits::*, llama_names, AttnOpts, Ctx, HeadDimDefault};
use memwall_core::model::{Mlp, ModelDesc, NormKind, QkNormScope};

/// `hunyuan_v1_dense/configuration_hunyuan_v1_dense.py` `HunYuanDenseV1Config` field defaults.
const HUNYUAN: Defaults = Defaults {
    vocab_size: 290943,
    hidden_size: 4096,
    intermediate_size: 11008,
    num_hidden_layers: 32,
    num_attention_heads: 32,
    num_key_value_heads: None,
    head_dim: HeadDimDefault::Derived,
    act: "silu",
    max_position_embeddings: 2048,
    tie_word_embeddings: false,
    strict_divisible: false,
};

pub(crate) fn hunyuan_v1_dense(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    // modeling_hunyuan_v1_dense.py HunYuanDenseV1Attention: `self.head_dim = getattr(config,
    // "head_dim", hidden_size // num_attention_heads)`, but the config class always has a
    // `head_dim` attribute (default None), so a config without it cannot be built.
    ctx.core(raw.head_dim, "head_dim", 128, MAX_HEAD_DIM)?;
    let d = Dims::llama(raw, ctx, &HUNYUAN)?;
    // HunYuanDenseV1Attention: q/k/v/o_proj bias=config.attention_bias (default False);
    // query_layernorm/key_layernorm = HunYuanDenseV1RMSNorm(head_dim), applied after
    // apply_rotary_pos_emb. HunYuanDenseV1MLP: gate/up/down_proj bias=False.
    let bias = raw.attention_bias.unwrap_or(false);
    Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            qk_norm: Some((QkNormScope::PerHead, NormKind::RmsNorm)),
            qk_norm_after_rope: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "hunyuan_v1_dense", &d, |_| {
        Ok(Mlp::Dense(gated(d.intermediate, d.act)))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;

    #[test]
    fn qk_norms_follow_the_rotation_and_head_dim_is_required() {
        let base = r#""model_type":"hunyuan_v1_dense","vocab_size":100,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2"#;
        let d = parse_hf_config(&format!("{{{base},\"head_dim\":16}}")).unwrap();
        let a = d.layers[0].attention;
        assert!(a.qk_norm.is_some() && a.qk_norm_after_rope);
        let e = parse_hf_config(&format!("{{{base}}}")).unwrap_err();
        assert!(e.to_string().contains("head_dim"), "{e}");
    }
}
