//! Seed-OSS (transformers 5.23 `models/seed_oss/`): a Llama layer skeleton with biased q/k/v
//! projections and a residual dropout on the attention and MLP outputs.

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{gated, llama_names, AttnOpts, Ctx, HeadDimDefault};
use memwall_core::model::{DenseMlp, Dropout, Mlp, ModelDesc};

/// `seed_oss/configuration_seed_oss.py` `SeedOssConfig` field defaults; `__post_init__` sets
/// `head_dim = hidden_size // num_attention_heads` when it is None (the class default is 128).
const SEED_OSS: Defaults = Defaults {
    vocab_size: 155136,
    hidden_size: 4096,
    intermediate_size: 27648,
    num_hidden_layers: 64,
    num_attention_heads: 80,
    num_key_value_heads: Some(8),
    head_dim: HeadDimDefault::Fixed(128),
    act: "silu",
    max_position_embeddings: 524288,
    tie_word_embeddings: false,
    strict_divisible: false,
};

pub(crate) fn seed_oss(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &SEED_OSS)?;
    // configuration_seed_oss.py: attention_dropout=0.1, residual_dropout=0.1 (both live in
    // training mode). modeling_seed_oss.py: SeedOssAttention and SeedOssMLP apply
    // `dropout(p=residual_dropout)` to their outputs (o_proj, down_proj) before the residual add.
    let dropout = Dropout {
        attention: ctx.prob(raw.attention_dropout, "attention_dropout", 0.1)?,
        residual: ctx.prob(raw.residual_dropout, "residual_dropout", 0.1)?,
        ..Dropout::default()
    };
    // modeling_seed_oss.py SeedOssAttention: q/k/v_proj bias=config.attention_bias (default
    // True), o_proj bias=config.attention_out_bias (default False); SeedOssMLP:
    // gate/up/down_proj bias=config.mlp_bias (default False).
    let mlp = DenseMlp {
        bias: raw.mlp_bias.unwrap_or(false),
        ..gated(d.intermediate, d.act)
    };
    Decoder {
        attn: AttnOpts {
            qkv_bias: raw.attention_bias.unwrap_or(true),
            o_bias: raw.attention_out_bias.unwrap_or(false),
            ..AttnOpts::rope(d.heads.head_dim)
        },
        dropout,
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "seed_oss", &d, |_| Ok(Mlp::Dense(mlp)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;

    #[test]
    fn biases_and_dropouts_follow_the_config_class() {
        let d = parse_hf_config(
            r#"{"model_type":"seed_oss","vocab_size":100,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"head_dim":16}"#,
        )
        .unwrap();
        let a = d.layers[0].attention;
        assert!(a.qkv_bias && !a.o_bias);
        assert!((d.dropout.residual - 0.1).abs() < 1e-12);
        assert!((d.dropout.attention - 0.1).abs() < 1e-12);
        assert!(!d.head.tied);
    }
}
