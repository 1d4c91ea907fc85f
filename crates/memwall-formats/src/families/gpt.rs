//! Families with fused or learned-position layouts: gpt2, gpt_neox, opt, falcon.
//! Each rule cites its transformers 5.23 source (paths relative to `transformers/models/`).

use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::{
    activation, assemble, divide_hidden, head, limits::*, names, norm, plain, token_embeddings,
    AttnOpts, Ctx, Heads, Parts,
};
use memwall_core::model::{
    Attention, Dropout, EagerStyle, Embeddings, LayerSpec, LinearRole, Mixer, Mlp, ModelDesc,
    NormKind, Residual, ScalarMuls,
};

/// One LayerNorm-ed layer with the given wiring.
fn ln_layer(
    hidden: u64,
    (attn_norm, mlp_norm): (bool, bool),
    residual: Residual,
    attention: Attention,
    mlp: Mlp,
) -> LayerSpec {
    let n = norm(NormKind::LayerNorm, hidden);
    LayerSpec {
        attn_norm: attn_norm.then_some(n),
        attn_post_norm: None,
        mlp_norm: mlp_norm.then_some(n),
        mlp_post_norm: None,
        residual,
        attention,
        mlp,
        attn_output_outlives_mlp: false,
        mlp_input_rebound: false,
        mixer: Mixer::Attention,
        residual_scaled: false,
        parallel_residual_first: false,
        muls: ScalarMuls::NONE,
    }
}

fn mha(num_heads: u64, head_dim: u64) -> Heads {
    Heads {
        num_heads,
        num_kv_heads: num_heads,
        head_dim,
    }
}

pub(crate) fn gpt2(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    // configuration_gpt2.py GPT2Config: vocab_size=50257, n_positions=1024, n_embd=768,
    // n_layer=12, n_head=12, n_inner=None, activation_function="gelu_new", *_pdrop=0.1,
    // tie_word_embeddings=True; attribute_map hidden_size→n_embd,
    // max_position_embeddings→n_positions, num_attention_heads→n_head, num_hidden_layers→n_layer.
    let vocab = ctx.core(raw.vocab_size, "vocab_size", 50257, MAX_VOCAB)?;
    let (hf, hv) = pick(("n_embd", raw.n_embd), ("hidden_size", raw.hidden_size));
    let hidden = ctx.core(hv, hf, 768, MAX_HIDDEN)?;
    let (lf, lv) = pick(
        ("n_layer", raw.n_layer),
        ("num_hidden_layers", raw.num_hidden_layers),
    );
    let layers = ctx.core(lv, lf, 12, MAX_LAYERS)?;
    let (nf, nv) = pick(
        ("n_head", raw.n_head),
        ("num_attention_heads", raw.num_attention_heads),
    );
    let num_heads = ctx.core(nv, nf, 12, MAX_HEADS)?;
    let (pf, pv) = pick(
        ("n_positions", raw.n_positions),
        ("max_position_embeddings", raw.max_position_embeddings),
    );
    let positions = ctx.size(pv, pf, 1024, MAX_POSITIONS)?;
    if raw.add_cross_attention.unwrap_or(false) {
        return Err(FormatError::Unsupported {
            field: ctx.field("add_cross_attention"),
            value: "true".into(),
            reason: "GPT2Block then adds a cross-attention block for an encoder-decoder setup (modeling_gpt2.py)".into(),
            hint: "memwall describes decoder-only causal LMs; set it to false".into(),
        });
    }
    // modeling_gpt2.py GPT2Attention: head_dim = embed_dim // num_heads, which must be exact.
    let head_dim = divide_hidden(ctx, hidden, num_heads)?;
    // modeling_gpt2.py GPT2Block: inner_dim = n_inner if not None else 4 * hidden_size.
    let inner = match raw.n_inner {
        Some(i) => ctx.check(i, "n_inner", MAX_INTERMEDIATE)?,
        None => ctx.check(4 * hidden, "n_inner (4 × n_embd)", MAX_INTERMEDIATE)?,
    };
    let act = activation(
        ctx,
        "activation_function",
        raw.activation_function.as_deref().unwrap_or("gelu_new"),
    )?;
    // modeling_gpt2.py: c_attn = Conv1D(3·embed, embed) and c_proj = Conv1D(embed, embed),
    // c_fc/c_proj Conv1D, all with bias; ln_1/ln_2/ln_f nn.LayerNorm; learned wpe.
    let attention = AttnOpts {
        qkv_bias: true,
        o_bias: true,
        fused_qkv: true,
        rotary_dim: None,
        // modeling_gpt2.py eager_attention_forward: softmax keeps its input dtype (no fp32
        // upcast); under autocast the fp32 mask makes that input fp32 (memory::hf::attention)
        eager_softmax_fp32: false,
        ..AttnOpts::rope(head_dim)
    }
    .build(mha(num_heads, head_dim), None);
    let layer = LayerSpec {
        // modeling_gpt2.py GPT2Block.forward: `attn_output` stays bound until the block returns
        attn_output_outlives_mlp: true,
        mlp_input_rebound: false,
        mixer: Mixer::Attention,
        residual_scaled: false,
        ..ln_layer(
            hidden,
            (true, true),
            Residual::Sequential,
            attention,
            Mlp::Dense(plain(inner, true, act)),
        )
    };
    assemble(
        ctx,
        "gpt2",
        Parts {
            hidden_size: hidden,
            max_position_embeddings: positions,
            embeddings: Embeddings {
                learned_positions: Some(positions),
                ..token_embeddings(vocab, hidden, false)
            },
            layers: vec![layer; usize::try_from(layers).unwrap_or(0)],
            head: head(
                Some(norm(NormKind::LayerNorm, hidden)),
                raw.tie_word_embeddings.unwrap_or(true),
                None,
            ),
            // modeling_gpt2.py: drop(embd_pdrop) after wte+wpe, attn_dropout(attn_pdrop) on
            // probabilities, resid_dropout and mlp dropout (resid_pdrop) on block outputs.
            dropout: Dropout {
                embed: ctx.prob(raw.embd_pdrop, "embd_pdrop", 0.1)?,
                attention: ctx.prob(raw.attn_pdrop, "attn_pdrop", 0.1)?,
                residual: ctx.prob(raw.resid_pdrop, "resid_pdrop", 0.1)?,
                activation: 0.0,
            },
            linear_names: names(&[
                (LinearRole::Qkv, "c_attn"),
                (LinearRole::O, "c_proj"),
                (LinearRole::Up, "c_fc"),
                (LinearRole::Down, "c_proj"),
            ]),
        },
    )
}

/// The primary spelling if present, else the alias (an `attribute_map` entry).
fn pick<'a>(
    primary: (&'a str, Option<u64>),
    alias: (&'a str, Option<u64>),
) -> (&'a str, Option<u64>) {
    if primary.1.is_some() || alias.1.is_none() {
        primary
    } else {
        alias
    }
}

pub(crate) fn gpt_neox(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    // configuration_gpt_neox.py GPTNeoXConfig: vocab_size=50432, hidden_size=6144,
    // num_hidden_layers=44, num_attention_heads=64, intermediate_size=24576, hidden_act="gelu",
    // max_position_embeddings=2048, tie_word_embeddings=False, use_parallel_residual=True,
    // attention_bias=True.
    let vocab = ctx.core(raw.vocab_size, "vocab_size", 50432, MAX_VOCAB)?;
    let hidden = ctx.core(raw.hidden_size, "hidden_size", 6144, MAX_HIDDEN)?;
    let layers = ctx.core(raw.num_hidden_layers, "num_hidden_layers", 44, MAX_LAYERS)?;
    let num_heads = ctx.core(
        raw.num_attention_heads,
        "num_attention_heads",
        64,
        MAX_HEADS,
    )?;
    let inter = ctx.size(
        raw.intermediate_size,
        "intermediate_size",
        24576,
        MAX_INTERMEDIATE,
    )?;
    let positions = ctx.size(
        raw.max_position_embeddings,
        "max_position_embeddings",
        2048,
        MAX_POSITIONS,
    )?;
    // GPTNeoXConfig.validate_architecture: hidden_size % num_attention_heads == 0.
    let head_dim = divide_hidden(ctx, hidden, num_heads)?;
    let act = activation(
        ctx,
        "hidden_act",
        raw.hidden_act.as_deref().unwrap_or("gelu"),
    )?;
    // configuration_gpt_neox.py convert_rope_params_to_dict: rope_parameters.setdefault(
    // "partial_rotary_factor", kwargs.pop("rotary_pct", 0.25)); modeling_gpt_neox.py
    // GPTNeoXAttention: rotary_ndims = int(head_size * partial_rotary_factor).
    let (rf, fraction) = match raw.rope_dict_partial_factor(ctx.prefix)? {
        Some(f) => ("rope_parameters.partial_rotary_factor", f),
        None => ("rotary_pct", raw.rotary_pct.unwrap_or(0.25)),
    };
    let rotary = ctx.rotary_dim(head_dim, fraction, rf)?;
    // modeling_gpt_neox.py GPTNeoXAttention: query_key_value = Linear(hidden, 3·hidden,
    // bias=attention_bias), dense bias=attention_bias.
    let bias = raw.attention_bias.unwrap_or(true);
    let attention = AttnOpts {
        qkv_bias: bias,
        o_bias: bias,
        fused_qkv: true,
        rotary_dim: Some(rotary),
        // modeling_gpt_neox.py apply_rotary_pos_emb: cat([q_embed, q_pass]) always
        rope_concat: true,
        ..AttnOpts::rope(head_dim)
    }
    .build(mha(num_heads, head_dim), None);
    // modeling_gpt_neox.py GPTNeoXLayer: input_layernorm + post_attention_layernorm (both
    // nn.LayerNorm); parallel residual x + attn(ln1(x)) + mlp(ln2(x)) when use_parallel_residual.
    let residual = if raw.use_parallel_residual.unwrap_or(true) {
        Residual::Parallel
    } else {
        Residual::Sequential
    };
    // modeling_gpt_neox.py GPTNeoXMLP: dense_h_to_4h/dense_4h_to_h nn.Linear with bias.
    let layer = ln_layer(
        hidden,
        (true, true),
        residual,
        attention,
        Mlp::Dense(plain(inter, true, act)),
    );
    let hidden_dropout = ctx.prob(raw.hidden_dropout, "hidden_dropout", 0.0)?;
    assemble(
        ctx,
        "gpt_neox",
        Parts {
            hidden_size: hidden,
            max_position_embeddings: positions,
            embeddings: token_embeddings(vocab, hidden, false),
            layers: vec![layer; usize::try_from(layers).unwrap_or(0)],
            // modeling_gpt_neox.py: final_layer_norm nn.LayerNorm; lm_head bias=False.
            head: head(
                Some(norm(NormKind::LayerNorm, hidden)),
                raw.tie_word_embeddings.unwrap_or(false),
                None,
            ),
            // modeling_gpt_neox.py: emb_dropout(hidden_dropout), post_attention_dropout and
            // post_mlp_dropout (hidden_dropout), attention_dropout on probabilities.
            dropout: Dropout {
                embed: hidden_dropout,
                attention: ctx.prob(raw.attention_dropout, "attention_dropout", 0.0)?,
                residual: hidden_dropout,
                activation: 0.0,
            },
            linear_names: names(&[
                (LinearRole::Qkv, "query_key_value"),
                (LinearRole::O, "dense"),
                (LinearRole::Up, "dense_h_to_4h"),
                (LinearRole::Down, "dense_4h_to_h"),
            ]),
        },
    )
}

pub(crate) fn opt(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    // configuration_opt.py OPTConfig: vocab_size=50272, hidden_size=768, num_hidden_layers=12,
    // ffn_dim=3072, max_position_embeddings=2048, do_layer_norm_before=True,
    // _remove_final_layer_norm=False, word_embed_proj_dim=None (→ hidden_size), dropout=0.1,
    // attention_dropout=0.0, num_attention_heads=12, activation_function="relu",
    // enable_bias=True, layer_norm_elementwise_affine=True, tie_word_embeddings=True.
    let vocab = ctx.core(raw.vocab_size, "vocab_size", 50272, MAX_VOCAB)?;
    let hidden = ctx.core(raw.hidden_size, "hidden_size", 768, MAX_HIDDEN)?;
    let layers = ctx.core(raw.num_hidden_layers, "num_hidden_layers", 12, MAX_LAYERS)?;
    let num_heads = ctx.core(
        raw.num_attention_heads,
        "num_attention_heads",
        12,
        MAX_HEADS,
    )?;
    let ffn = ctx.size(raw.ffn_dim, "ffn_dim", 3072, MAX_INTERMEDIATE)?;
    let positions = ctx.size(
        raw.max_position_embeddings,
        "max_position_embeddings",
        2048,
        MAX_POSITIONS,
    )?;
    let proj_dim = ctx.size(
        raw.word_embed_proj_dim,
        "word_embed_proj_dim",
        hidden,
        MAX_HIDDEN,
    )?;
    // modeling_opt.py OPTAttention: head_dim = embed_dim // num_heads, which must be exact.
    let head_dim = divide_hidden(ctx, hidden, num_heads)?;
    let act = activation(
        ctx,
        "activation_function",
        raw.activation_function.as_deref().unwrap_or("relu"),
    )?;
    if raw.layer_norm_elementwise_affine == Some(false) {
        return Err(FormatError::Unsupported {
            field: ctx.field("layer_norm_elementwise_affine"),
            value: "false".into(),
            reason:
                "memwall's norms always carry a weight (no released OPT checkpoint disables it)"
                    .into(),
            hint: "remove the key or set it to true".into(),
        });
    }
    let bias = raw.enable_bias.unwrap_or(true);
    let pre_norm = raw.do_layer_norm_before.unwrap_or(true);
    // modeling_opt.py OPTAttention: q/k/v/out_proj bias=enable_bias; OPTDecoderLayer:
    // fc1/fc2 bias=enable_bias, self_attn_layer_norm and final_layer_norm (nn.LayerNorm),
    // applied before the sub-blocks when do_layer_norm_before else after the residual add.
    let attention = AttnOpts {
        qkv_bias: bias,
        o_bias: bias,
        rotary_dim: None,
        ..AttnOpts::rope(head_dim)
    }
    .build(mha(num_heads, head_dim), None);
    let residual = if pre_norm {
        Residual::Sequential
    } else {
        Residual::PostNorm
    };
    let layer = LayerSpec {
        // modeling_opt.py OPTDecoderLayer.forward runs the MLP inline:
        // `hidden_states = self.fc1(hidden_states)` drops the final_layer_norm output
        mlp_input_rebound: true,
        ..ln_layer(
            hidden,
            (true, true),
            residual,
            attention,
            Mlp::Dense(plain(ffn, bias, act)),
        )
    };
    // modeling_opt.py OPTDecoder: final_layer_norm only if do_layer_norm_before and not
    // _remove_final_layer_norm.
    let final_norm = (pre_norm && !raw.remove_final_layer_norm.unwrap_or(false))
        .then(|| norm(NormKind::LayerNorm, hidden));
    let dropout = ctx.prob(raw.dropout, "dropout", 0.1)?;
    assemble(
        ctx,
        "opt",
        Parts {
            hidden_size: hidden,
            max_position_embeddings: positions,
            // modeling_opt.py OPTDecoder: embed_tokens(vocab, word_embed_proj_dim);
            // OPTLearnedPositionalEmbedding(max_position_embeddings + 2 (offset), hidden);
            // project_in/project_out (bias=False) when word_embed_proj_dim != hidden_size.
            // OPTDecoder.forward makes position ids from the 2-D mask (`cumsum`), one row per
            // sequence.
            embeddings: Embeddings {
                vocab_size: vocab,
                dim: proj_dim,
                learned_positions: Some(positions + 2),
                positions_from_mask: true,
                projections: proj_dim != hidden,
                scaled: false,
                norm: None,
                scale_in_module: false,
                dropout_rebinds: false,
            },
            layers: vec![layer; usize::try_from(layers).unwrap_or(0)],
            // modeling_opt.py OPTForCausalLM: lm_head = Linear(word_embed_proj_dim, vocab, bias=False).
            head: head(final_norm, raw.tie_word_embeddings.unwrap_or(true), None),
            // modeling_opt.py OPTDecoderLayer: dropout (config.dropout) after attention and fc2;
            // attention_dropout on probabilities; no embedding or activation dropout.
            dropout: Dropout {
                embed: 0.0,
                attention: ctx.prob(raw.attention_dropout, "attention_dropout", 0.0)?,
                residual: dropout,
                activation: 0.0,
            },
            linear_names: names(&[
                (LinearRole::Q, "q_proj"),
                (LinearRole::K, "k_proj"),
                (LinearRole::V, "v_proj"),
                (LinearRole::O, "out_proj"),
                (LinearRole::Up, "fc1"),
                (LinearRole::Down, "fc2"),
            ]),
        },
    )
}

pub(crate) fn falcon(raw: &HfConfig, ctx: &Ctx) -> Result<ModelDesc, FormatError> {
    // configuration_falcon.py FalconConfig: vocab_size=65024, hidden_size=4544 (kwarg n_embed
    // overrides it), num_hidden_layers=32, num_attention_heads=71, num_ln_in_parallel_attn=None,
    // num_kv_heads=None (→ heads), alibi=False, new_decoder_architecture=False,
    // multi_query=True, parallel_attn=True, bias=False, max_position_embeddings=2048,
    // ffn_hidden_size=None (→ 4·hidden), activation="gelu", tie_word_embeddings=True.
    let vocab = ctx.core(raw.vocab_size, "vocab_size", 65024, MAX_VOCAB)?;
    let (hf, hv) = pick(("n_embed", raw.n_embed), ("hidden_size", raw.hidden_size));
    let hidden = ctx.core(hv, hf, 4544, MAX_HIDDEN)?;
    let layers = ctx.core(raw.num_hidden_layers, "num_hidden_layers", 32, MAX_LAYERS)?;
    let num_heads = ctx.core(
        raw.num_attention_heads,
        "num_attention_heads",
        71,
        MAX_HEADS,
    )?;
    let positions = ctx.size(
        raw.max_position_embeddings,
        "max_position_embeddings",
        2048,
        MAX_POSITIONS,
    )?;
    let ffn = match raw.ffn_hidden_size {
        Some(f) => ctx.check(f, "ffn_hidden_size", MAX_INTERMEDIATE)?,
        None => ctx.check(
            4 * hidden,
            "ffn_hidden_size (4 × hidden_size)",
            MAX_INTERMEDIATE,
        )?,
    };
    // modeling_falcon.py FalconAttention: head_dim = hidden_size // num_heads, must be exact.
    let head_dim = divide_hidden(ctx, hidden, num_heads)?;
    let act = activation(
        ctx,
        "activation",
        raw.activation.as_deref().unwrap_or("gelu"),
    )?;
    let new_arch = raw.new_decoder_architecture.unwrap_or(false);
    let parallel = raw.parallel_attn.unwrap_or(true);
    // modeling_falcon.py FalconDecoderLayer: num_ln_in_parallel_attn defaults to 2 with the
    // new decoder architecture.
    let num_ln = raw.num_ln_in_parallel_attn.or(new_arch.then_some(2));
    if new_arch && !parallel {
        return Err(FormatError::Unsupported {
            field: ctx.field("parallel_attn"),
            value: "false".into(),
            reason: "with new_decoder_architecture=true, FalconDecoderLayer.forward reads ln_attn/mlp_layernorm_out that only exist with parallel_attn=true (modeling_falcon.py); transformers cannot run this config".into(),
            hint: "set parallel_attn to true (as every new-architecture Falcon does)".into(),
        });
    }
    if parallel && !new_arch && num_ln == Some(2) {
        return Err(FormatError::Unsupported {
            field: ctx.field("num_ln_in_parallel_attn"),
            value: "2".into(),
            reason: "two parallel norms (ln_attn/ln_mlp) are only read by the new decoder architecture; FalconDecoderLayer.forward would look for input_layernorm (modeling_falcon.py)".into(),
            hint: "remove num_ln_in_parallel_attn or set new_decoder_architecture to true".into(),
        });
    }
    // modeling_falcon.py FalconAttention: query_key_value output is (2·num_kv_heads + heads)·
    // head_dim with the new architecture, hidden + 2·head_dim with multi_query (one kv head),
    // else 3·hidden; bias=config.bias on query_key_value and dense.
    let num_kv_heads = if new_arch {
        let kv = ctx.size(raw.num_kv_heads, "num_kv_heads", num_heads, MAX_HEADS)?;
        if kv > num_heads || num_heads % kv != 0 {
            return Err(ctx.inconsistent(
                &["num_attention_heads", "num_kv_heads"],
                format!("{kv} key/value heads do not divide {num_heads} query heads"),
                "each key/value group serves an equal number of query heads",
            ));
        }
        kv
    } else if raw.multi_query.unwrap_or(true) {
        1
    } else {
        num_heads
    };
    let bias = raw.bias.unwrap_or(false);
    // modeling_falcon.py FalconModel: ALiBi instead of rotary when config.alibi.
    let rotary = if raw.alibi.unwrap_or(false) {
        None
    } else {
        let fraction = raw
            .rope_dict_partial_factor(ctx.prefix)?
            .or(raw.partial_rotary_factor)
            .unwrap_or(1.0);
        Some(ctx.rotary_dim(head_dim, fraction, "partial_rotary_factor")?)
    };
    let attention = AttnOpts {
        qkv_bias: bias,
        o_bias: bias,
        fused_qkv: true,
        rotary_dim: rotary,
        // modeling_falcon.py: F.softmax(scores + mask, dtype=hidden_states.dtype)
        eager_softmax_fp32: false,
        // modeling_falcon.py FalconAttention.forward: broadcast k/v, in-place scaling
        eager_style: EagerStyle::Falcon,
        // old architecture with multi_query: one key/value head that matmul broadcasts
        // (`fused_qkv[..., [-2], :]` in `_split_heads`); the new architecture broadcasts and
        // flattens the kv groups itself (`torch.broadcast_to(key, query.shape)`)
        kv_broadcast: !new_arch && num_kv_heads == 1 && num_heads > 1,
        // the new architecture broadcasts and flattens each key/value group to its query heads
        // in `_split_heads` and caches every head (`Attention::kv_expanded`)
        kv_expanded: new_arch && num_kv_heads < num_heads,
        ..AttnOpts::rope(head_dim)
    }
    .build(
        Heads {
            num_heads,
            num_kv_heads,
            head_dim,
        },
        None,
    );
    // modeling_falcon.py FalconDecoderLayer: without parallel_attn, input_layernorm +
    // post_attention_layernorm around a sequential residual; with it, ln_attn + ln_mlp when
    // num_ln_in_parallel_attn == 2, else one input_layernorm feeding both branches.
    let (norms, residual) = if !parallel {
        ((true, true), Residual::Sequential)
    } else if num_ln == Some(2) {
        ((true, true), Residual::Parallel)
    } else {
        ((true, false), Residual::Parallel)
    };
    // modeling_falcon.py FalconMLP: dense_h_to_4h/dense_4h_to_h bias=config.bias.
    let layer = ln_layer(
        hidden,
        norms,
        residual,
        attention,
        Mlp::Dense(plain(ffn, bias, act)),
    );
    let hidden_dropout = ctx.prob(raw.hidden_dropout, "hidden_dropout", 0.0)?;
    assemble(
        ctx,
        "falcon",
        Parts {
            hidden_size: hidden,
            max_position_embeddings: positions,
            embeddings: token_embeddings(vocab, hidden, false),
            layers: vec![layer; usize::try_from(layers).unwrap_or(0)],
            // modeling_falcon.py: ln_f LayerNorm; lm_head bias=False.
            head: head(
                Some(norm(NormKind::LayerNorm, hidden)),
                raw.tie_word_embeddings.unwrap_or(true),
                None,
            ),
            // modeling_falcon.py: attention_dropout on probabilities (and on the attention
            // output in the sequential layout), hidden_dropout on the layer output.
            dropout: Dropout {
                embed: 0.0,
                attention: ctx.prob(raw.attention_dropout, "attention_dropout", 0.0)?,
                residual: hidden_dropout,
                activation: 0.0,
            },
            linear_names: names(&[
                (LinearRole::Qkv, "query_key_value"),
                (LinearRole::O, "dense"),
                (LinearRole::Up, "dense_h_to_4h"),
                (LinearRole::Down, "dense_4h_to_h"),
            ]),
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::parse_hf_config;

    fn expanded(json: &str) -> bool {
        let d = parse_hf_config(json).unwrap();
        let all = d
            .layers
            .iter()
            .filter_map(|l| l.attention_block())
            .all(|a| a.kv_expanded);
        let any = d
            .layers
            .iter()
            .filter_map(|l| l.attention_block())
            .any(|a| a.kv_expanded);
        assert_eq!(all, any);
        all
    }

    #[test]
    fn falcon_new_architecture_expands_fewer_kv_heads_only() {
        // Falcon-40B: new architecture, 128 query heads over 8 key/value heads
        let f40 = include_str!("../../tests/configs/falcon-40b.json");
        assert!(expanded(f40));
        // Falcon-7B: old architecture, multi_query (one head matmul broadcasts: kv_broadcast)
        let f7 = include_str!("../../tests/configs/falcon-7b.json");
        assert!(!expanded(f7));
        // new architecture with as many key/value heads as query heads: nothing to broadcast
        let same = r#"{"model_type":"falcon","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_kv_heads":4,"new_decoder_architecture":true,"vocab_size":100}"#;
        assert!(!expanded(same));
    }
}
