//! Granite (IBM granite-3.x dense): Llama's layer with µP multipliers, each a scalar
//! multiplication that makes a new tensor in the forward (transformers 5.23
//! `models/granite/{configuration,modeling}_granite.py`).

use super::common::{Decoder, Defaults, Dims};
use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{gated, llama_names, AttnOpts, Ctx, HeadDimDefault};
use memwall_core::model::{DenseMlp, Mlp, ModelDesc};

/// `granite/configuration_granite.py` `GraniteConfig` field defaults.
const GRANITE: Defaults = Defaults {
    vocab_size: 32000,
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

pub(crate) fn granite(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    let d = Dims::llama(raw, ctx, &GRANITE)?;
    // modeling_granite.py GraniteAttention: q/k/v/o_proj bias=config.attention_bias; the
    // attention scale is `attention_multiplier` (a kernel argument, no tensor).
    let bias = raw.attention_bias.unwrap_or(false);
    // modeling_granite.py GraniteMLP: gate/up/down_proj bias=config.mlp_bias.
    let mlp = DenseMlp {
        bias: raw.mlp_bias.unwrap_or(false),
        ..gated(d.intermediate, d.act)
    };
    // The multipliers' values change no size: each is applied whatever its value (`x * 1.0` is
    // still a new tensor), so `embedding_multiplier`, `residual_multiplier`,
    // `attention_multiplier` and `logits_scaling` are not read.
    let mut desc = Decoder {
        attn: AttnOpts {
            qkv_bias: bias,
            o_bias: bias,
            ..AttnOpts::rope(d.heads.head_dim)
        },
        // modeling_granite.py GraniteModel.forward: `inputs_embeds * self.embedding_multiplier`
        scaled_embeddings: true,
        ..Decoder::new(&d, llama_names(true))
    }
    .build(ctx, "granite", &d, |_| Ok(Mlp::Dense(mlp)))?;
    // modeling_granite.py GraniteDecoderLayer.forward: `residual + hidden_states *
    // self.residual_multiplier` after attention and after the MLP.
    for l in &mut desc.layers {
        l.residual_scaled = true;
    }
    // modeling_granite.py GraniteForCausalLM.forward: `logits = logits / self.config.logits_scaling`
    desc.head.logits_scaled = true;
    Ok(desc)
}
