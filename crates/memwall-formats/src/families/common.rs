//! What the rotary decoder families share: config-class defaults, resolved sizes, and one
//! builder for the `embed_tokens → layers → norm → lm_head` skeleton.

use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{
    activation, assemble, attention_dropout_only, divide_hidden, head, heads, layer, limits::*,
    norm, token_embeddings, AttnOpts, Ctx, HeadDimDefault, Heads, NormPlacement, Parts,
};
use memwall_core::model::{Activation, Dropout, LinearRole, Mlp, ModelDesc, NormKind};

/// A family's transformers config-class defaults (read from its `configuration_*.py`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Defaults {
    pub vocab_size: u64,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    /// `None`: defaults to `num_attention_heads`.
    pub num_key_value_heads: Option<u64>,
    pub head_dim: HeadDimDefault,
    pub act: &'static str,
    pub max_position_embeddings: u64,
    pub tie_word_embeddings: bool,
    /// The config class's `validate_architecture` requires `hidden_size % num_attention_heads
    /// == 0` even when `head_dim` is explicit.
    pub strict_divisible: bool,
}

/// Sizes every rotary decoder family resolves the same way.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub vocab_size: u64,
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub heads: Heads,
    pub act: Activation,
    pub max_position_embeddings: u64,
    pub tie_word_embeddings: bool,
    pub attention_dropout: f64,
}

impl Dims {
    /// Resolves the Llama-style keys (`hidden_size`, `num_hidden_layers`, …, `hidden_act`).
    pub fn llama(raw: &HfConfig, ctx: &Ctx, d: &Defaults) -> Result<Dims, FormatError> {
        Self::with_act(raw, ctx, d, ("hidden_act", raw.hidden_act.as_deref()))
    }

    /// As [`Dims::llama`] with the activation read from another key (Gemma 2/3 read
    /// `hidden_activation`).
    pub fn with_act(
        raw: &HfConfig,
        ctx: &Ctx,
        d: &Defaults,
        (act_field, act): (&str, Option<&str>),
    ) -> Result<Dims, FormatError> {
        let vocab_size = ctx.core(raw.vocab_size, "vocab_size", d.vocab_size, MAX_VOCAB)?;
        let hidden = ctx.core(raw.hidden_size, "hidden_size", d.hidden_size, MAX_HIDDEN)?;
        let layers = ctx.core(
            raw.num_hidden_layers,
            "num_hidden_layers",
            d.num_hidden_layers,
            MAX_LAYERS,
        )?;
        let num_heads = ctx.core(
            raw.num_attention_heads,
            "num_attention_heads",
            d.num_attention_heads,
            MAX_HEADS,
        )?;
        let kv = raw.num_key_value_heads.or(d.num_key_value_heads);
        if d.strict_divisible {
            divide_hidden(ctx, hidden, num_heads)?;
        }
        let heads = heads(
            ctx,
            hidden,
            num_heads,
            ("num_key_value_heads", kv),
            raw.head_dim,
            d.head_dim,
        )?;
        let intermediate = ctx.size(
            raw.intermediate_size,
            "intermediate_size",
            d.intermediate_size,
            MAX_INTERMEDIATE,
        )?;
        let act = activation(ctx, act_field, act.unwrap_or(d.act))?;
        let max_position_embeddings = ctx.size(
            raw.max_position_embeddings,
            "max_position_embeddings",
            d.max_position_embeddings,
            MAX_POSITIONS,
        )?;
        Ok(Dims {
            vocab_size,
            hidden,
            intermediate,
            layers,
            heads,
            act,
            max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(d.tie_word_embeddings),
            attention_dropout: ctx.prob(raw.attention_dropout, "attention_dropout", 0.0)?,
        })
    }

    /// Number of layers as a length (bounded by `MAX_LAYERS`).
    pub fn num_layers(&self) -> usize {
        usize::try_from(self.layers).unwrap_or(usize::MAX)
    }
}

/// The `embed_tokens → layers → norm → lm_head` skeleton with per-family knobs.
pub(crate) struct Decoder {
    pub attn: AttnOpts,
    /// Sliding window of each layer (`None`: full attention).
    pub windows: Vec<Option<u64>>,
    pub placement: NormPlacement,
    pub norm_kind: NormKind,
    pub dropout: Dropout,
    pub names: Vec<(LinearRole, String)>,
    /// Gemma's `embed_tokens * sqrt(hidden)`.
    pub scaled_embeddings: bool,
    pub final_logit_softcap: Option<f64>,
}

impl Decoder {
    /// Llama defaults: bias-free fully-rotary attention, pre-norm RMSNorm, no windows.
    pub fn new(d: &Dims, names: Vec<(LinearRole, String)>) -> Self {
        Decoder {
            attn: AttnOpts::rope(d.heads.head_dim),
            windows: vec![None; d.num_layers()],
            placement: NormPlacement::Pre,
            norm_kind: NormKind::RmsNorm,
            dropout: attention_dropout_only(d.attention_dropout),
            names,
            scaled_embeddings: false,
            final_logit_softcap: None,
        }
    }

    /// Builds the model; `mlp(i)` gives layer `i`'s feed-forward block.
    pub fn build(
        self,
        ctx: &Ctx,
        model_type: &str,
        d: &Dims,
        mlp: impl Fn(usize) -> Result<Mlp, FormatError>,
    ) -> Result<ModelDesc, FormatError> {
        let n = norm(self.norm_kind, d.hidden);
        let layers = (0..d.num_layers())
            .map(|i| {
                let w = self.windows.get(i).copied().flatten();
                Ok(layer(
                    n,
                    self.placement,
                    self.attn.build(d.heads, w),
                    mlp(i)?,
                ))
            })
            .collect::<Result<Vec<_>, FormatError>>()?;
        assemble(
            ctx,
            model_type,
            Parts {
                hidden_size: d.hidden,
                max_position_embeddings: d.max_position_embeddings,
                embeddings: token_embeddings(d.vocab_size, d.hidden, self.scaled_embeddings),
                layers,
                head: head(Some(n), d.tie_word_embeddings, self.final_logit_softcap),
                dropout: self.dropout,
                linear_names: self.names,
            },
        )
    }
}
