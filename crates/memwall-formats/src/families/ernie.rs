//! ERNIE 4.5 dense (transformers 5.23 `models/ernie4_5/`): a Llama layer skeleton with one
//! `use_bias` flag for every projection and an fp32, interleaved rotary embedding.

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{gated, llama_names, AttnOpts, Ctx, HeadDimDefault};
use memwall_core::model::{DenseMlp, Dropout, Mlp, ModelDesc};

/// `ernie4_5/configuration_ernie4_5.py` `Ernie4_5Config` field defaults; `__post_init__` sets
/// `head_dim = hidden_size // num_attention_heads` when it is None (class default 128).
const ERNIE4_5: Defaults = Defaults {
    vocab_size: 103424,
    hidden_size: 1024,
    intermediate_size: 3072,
    num_hidden_layers: 18,
    num_attention_heads: 16,
    num_key_value_heads: Some(2),
    head_dim: HeadDimDefault::Fixed(128),
    act: "silu",
    max_position_embeddings: 131072,
    tie_word_embeddings: true,
    strict_divisible: false,
};

pub(crate) fn ernie4_5(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &ERNIE4_5)?;
    // modeling_ernie4_5.py Ernie4_5Attention: q/k/v/o_proj bias=config.use_bias, and
    // `self.attention_dropout = 0.0` whatever the config says; Ernie4_5MLP: gate/up/down_proj
    // bias=config.use_bias (default False).
    let bias = raw.use_bias.unwrap_or(false);
    Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            // modeling_ernie4_5.py Ernie4_5RotaryEmbedding.forward returns fp32 cos/sin and
            // apply_rotary_pos_emb rotates in fp32 (interleaved `rotate_half`)
            rope_fp32: true,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        dropout: Dropout::default(),
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "ernie4_5", &d, |_| {
        Ok(Mlp::Dense(DenseMlp {
            bias,
            ..gated(d.intermediate, d.act)
        }))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;

    #[test]
    fn one_bias_flag_and_an_fp32_rotation() {
        let d = parse_hf_config(
            r#"{"model_type":"ernie4_5","vocab_size":100,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"use_bias":true}"#,
        )
        .unwrap();
        let a = d.layers[0].attention;
        assert!(a.qkv_bias && a.o_bias && a.rope_fp32);
        assert_eq!(a.rotary_dim, Some(128));
        assert!(d.head.tied);
    }
}
