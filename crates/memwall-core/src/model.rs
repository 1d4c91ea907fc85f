//! Architecture-neutral description of a decoder-only transformer.
//!
//! Every family (llama, gpt2, deepseek_v3, …) is normalised into these structs by
//! `memwall-formats`; every size, parameter count and memory event is computed from them
//! generically. The field comments name the Hugging Face modules they stand for.

use crate::error::CoreError;
pub use crate::mixer::{GatedDeltaNet, Mamba1, Mamba2, Mixer};
use serde::Serialize;

/// Normalisation layer kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// `LlamaRMSNorm`: `weight * (x.float() * rsqrt(mean(x²)+eps)).to(dtype)`
    /// (transformers `models/llama/modeling_llama.py`).
    RmsNorm,
    /// `GemmaRMSNorm`: `(x.float() * rsqrt(...) * (1 + weight.float())).type_as(x)`
    /// (transformers `models/gemma/modeling_gemma.py`): the whole norm runs in fp32.
    GemmaRmsNorm,
    /// `Olmo2RMSNorm`: `(weight * (x.float() * rsqrt(...))).to(dtype)`
    /// (transformers `models/olmo2/modeling_olmo2.py`): the weight multiplies in fp32.
    Olmo2RmsNorm,
    /// `torch.nn.LayerNorm`.
    LayerNorm,
    /// `CohereLayerNorm` (models/cohere/modeling_cohere.py): a bias-free LayerNorm written out
    /// in fp32 ops: `x.float()`, `mean`, `(x - mean).pow(2).mean()`, `(x - mean) *
    /// rsqrt(var + eps)`, `weight.float() * h`, cast back.
    CohereLayerNorm,
}

/// One normalisation layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Norm {
    /// Kind of normalisation.
    pub kind: NormKind,
    /// Normalised dimension (length of the weight vector).
    pub dim: u64,
    /// Whether it has a bias vector (LayerNorm with `bias=True`).
    pub bias: bool,
}

impl Norm {
    /// Parameters: weight (+ bias).
    pub fn params(&self) -> u128 {
        let d = u128::from(self.dim);
        if self.bias {
            2 * d
        } else {
            d
        }
    }
}

/// Activation function, by its transformers `ACT2FN` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `silu` / `swish`.
    Silu,
    /// `gelu` (exact erf form).
    Gelu,
    /// `gelu_pytorch_tanh` (`F.gelu(approximate="tanh")`).
    GeluTanh,
    /// `gelu_new` / `gelu_fast` (tanh approximation, in transformers `activations.py`).
    GeluNew,
    /// `relu`.
    Relu,
    /// gpt-oss's clamped SwiGLU (`GptOssExperts._apply_gate`, models/gpt_oss/modeling_gpt_oss.py):
    /// on interleaved gate/up columns, `gate.clamp(max=limit)`, `up.clamp(-limit, limit)`,
    /// `(up + 1) * (gate * sigmoid(gate * alpha))`. Only as the gated activation of an MLP; the
    /// constants (`swiglu_alpha`, `swiglu_limit`) do not change memory.
    ClampedSwiglu,
}

/// How attention heads are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AttentionKind {
    /// Multi-head / grouped-query / multi-query attention.
    Standard {
        /// Query heads.
        num_heads: u64,
        /// Key/value heads (= num_heads for MHA, 1 for MQA).
        num_kv_heads: u64,
        /// Per-head dimension (may differ from hidden / heads, e.g. Gemma, Qwen3).
        head_dim: u64,
    },
    /// DeepSeek multi-head latent attention (transformers `models/deepseek_v3/modeling_deepseek_v3.py`).
    Mla {
        /// Query heads.
        num_heads: u64,
        /// Rank of the query down-projection (`q_lora_rank`); `None` = a plain `q_proj`.
        q_lora_rank: Option<u64>,
        /// Rank of the joint key/value latent (`kv_lora_rank`).
        kv_lora_rank: u64,
        /// Non-rotary part of each query/key head.
        qk_nope_head_dim: u64,
        /// Rotary part of each query/key head (shared across heads for keys).
        qk_rope_head_dim: u64,
        /// Value head dimension.
        v_head_dim: u64,
    },
}

/// Where q/k normalisation applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNormScope {
    /// One norm of `head_dim` shared by all heads (Qwen3, Gemma 3).
    PerHead,
    /// One norm over the full projection width (OLMo 2).
    Full,
}

/// The attention block of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Attention {
    /// Head layout.
    pub kind: AttentionKind,
    /// Bias on the q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// q, k, v computed by one fused linear (GPT-2 `c_attn`, NeoX/Falcon `query_key_value`, Phi-3 `qkv_proj`).
    pub fused_qkv: bool,
    /// q/k RMS normalisation (Qwen3, Gemma 3, OLMo 2) and its kind.
    pub qk_norm: Option<(QkNormScope, NormKind)>,
    /// Number of rotary dimensions per head; `None` for learned/absolute positions.
    pub rotary_dim: Option<u64>,
    /// Sliding-window size when this layer attends locally.
    pub sliding_window: Option<u64>,
    /// Gemma 2 `attn_logit_softcapping`.
    pub logit_softcap: Option<f64>,
    /// Eager attention computes the softmax in fp32 and casts the probabilities back
    /// (`softmax(..., dtype=torch.float32).to(query.dtype)` in Llama's `eager_attention_forward`
    /// and its copies); GPT-2 (`modeling_gpt2.py`) and Falcon (`modeling_falcon.py`) keep the
    /// scores' dtype: the compute dtype, or fp32 under autocast, where the fp32 mask promotes
    /// the masked scores (memory::hf::attention).
    pub eager_softmax_fp32: bool,
    /// How the family's own eager attention code runs.
    pub eager_style: EagerStyle,
    /// The rotated q/k are rebuilt by `torch.cat([rotated, pass_through])` even when every
    /// dimension rotates (modeling_phi3.py and modeling_gpt_neox.py `apply_rotary_pos_emb`):
    /// they come out laid out `[B, H, S, D]` rather than as transposed projection views.
    pub rope_concat: bool,
    /// Learned per-head attention-sink logits (gpt-oss `GptOssAttention.sinks`, one parameter
    /// per query head): eager attention concatenates them as an extra key column before the
    /// softmax and drops that column after it (`eager_attention_forward`,
    /// models/gpt_oss/modeling_gpt_oss.py).
    pub sinks: bool,
    /// The rotary embedding runs in fp32 on fp32 cos/sin tables and casts back (ERNIE 4.5
    /// `apply_rotary_pos_emb`, models/ernie4_5_moe/modeling_ernie4_5_moe.py:
    /// `(q.float() * cos) + (rotate_half(q).float() * sin)`, then `.to(original_dtype)`).
    pub rope_fp32: bool,
    /// Rotary embedding by complex multiplication in fp32 (Llama 4 `apply_rotary_emb`,
    /// models/llama4/modeling_llama4.py: `view_as_complex(x.float())`, `* freqs_cis`,
    /// `view_as_real(...).type_as(x)`), with one complex64 `freqs_cis` table per forward.
    pub rope_complex: bool,
    /// A weightless L2 norm of q and k per head, after the rotary embedding (Llama 4
    /// `Llama4TextL2Norm`: `x.float() * rsqrt(mean(x²) + eps)`, cast back).
    pub l2_qk_norm: bool,
    /// Llama 4 attention temperature tuning on a NoPE layer: the query is scaled per position by
    /// `log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1` (an fp32 product cast back).
    pub temperature_tuning: bool,
    /// Llama 4 chunked local attention: `sliding_window` holds `attention_chunk_size`. Hugging
    /// Face caches and masks such a layer like a sliding window of that size
    /// (cache_utils.py `LAYER_CLASS_MAP`: `DynamicSlidingWindowLayer`); vLLM gives it its own
    /// KV spec (`ChunkedLocalAttentionSpec`).
    pub chunked: bool,
    /// The q/k norms run on the rotated q/k instead of before the rotation
    /// (modeling_hunyuan_v1_dense.py HunYuanDenseV1Attention: `apply_rotary_pos_emb` then
    /// `query_layernorm`/`key_layernorm`; Qwen3, Gemma 3, OLMo 2 and EXAONE 4 normalise first).
    pub qk_norm_after_rope: bool,
    /// The partial-rotary split is bound to locals of the attention function
    /// (models/phi/modeling_phi.py `PhiAttention.forward`: `query_rot, query_pass = ...`, then
    /// `query_rot, key_rot = apply_rotary_pos_emb(...)`): the q/k projection outputs (behind the
    /// pass-through views) and the rotated parts stay alive until the function returns, and the
    /// query and key are the `torch.cat` of the two. With every dimension rotated
    /// (`partial_rotary_factor` 1.0) the pass-through views are empty but still hold their
    /// storage (tools/truth/probes/live_tensors.py on phiqkln-small-fp32-eager-b3-p100: the
    /// projection outputs, the rotated q/k and their cats alive at the eager scores).
    pub rope_locals: bool,
    /// `apply_rotary_pos_emb` upcasts q and k to fp32 and casts the rotated result back, with
    /// an interleaved `rotate_half` (`torch.stack([-x2, x1], -1).flatten(-2)`)
    /// (models/cohere/modeling_cohere.py, models/cohere2/modeling_cohere2.py).
    pub rope_upcast_qk: bool,
    /// A sigmoid output gate computed by the query projection (Qwen3-Next
    /// `Qwen3NextAttention`, models/qwen3_next/modeling_qwen3_next.py: `q_proj` is twice as
    /// wide, `torch.chunk` splits each head into query and gate, and `attn_output *
    /// torch.sigmoid(gate)` feeds `o_proj`).
    pub output_gate: bool,
    /// The key projection's output is multiplied by a scalar before the rotary embedding
    /// (Falcon-H1 `FalconH1Attention.forward`: `k_proj(x).view(..).transpose(1, 2) *
    /// self.key_multiplier`): a new `[B, kv_heads, S, head_dim]` tensor, nothing saved.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub key_scaled: bool,
    /// q, k and v are clamped in place after the q/k norms (OLMoE `clip_qkv`,
    /// models/olmoe/modeling_olmoe.py `OlmoeAttention.forward`: `query_states.clamp_(min=-c,
    /// max=c)`, the same for key and value). `clamp_`'s backward reads the input
    /// (`clamp_backward(grad, self, min, max)`, tools/autograd/derivatives.yaml), so autograd
    /// saves a copy of each before it is overwritten (torch 2.15 on CPU: the saved tensor's
    /// storage differs from the clamped one).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub clip_qkv: bool,
    /// Each q/k norm runs on its projection's output before the next projection is computed,
    /// and the value projection comes last (models/qwen3/modeling_qwen3.py and
    /// models/qwen3_moe/modeling_qwen3_moe.py: `self.q_norm(self.q_proj(x).view(..))`, then
    /// `self.k_norm(self.k_proj(x).view(..))`, then `self.v_proj(x)`; models/olmo2/
    /// modeling_olmo2.py likewise). Gemma 3, EXAONE 4 and Cohere compute q, k and v first and
    /// normalise after. Inside a checkpointed region (nothing saved) the raw projection dies at
    /// its norm, so the order sets the forward's peak there.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm_inline: bool,
    /// The q/k norms carry a bias beside their weight (models/phi/modeling_phi.py
    /// `PhiAttention.q_layernorm` / `k_layernorm`: `nn.LayerNorm(hidden_size //
    /// num_attention_heads, elementwise_affine=True)`, bias on by default).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm_bias: bool,
    /// The rotation works on the two halves of each head (gpt-oss `_apply_rotary_emb`,
    /// models/gpt_oss/modeling_gpt_oss.py: `first_half, second_half = torch.chunk(x, 2, -1)`,
    /// `first_ = first_half * cos - second_half * sin`, `second_ = second_half * cos +
    /// first_half * sin`, `torch.cat((first_, second_), -1)`): half-width temporaries, at most
    /// two full widths alive at once, instead of `rotate_half`'s full-width ones.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rope_halves: bool,
    /// Eager attention multiplies by a single shared key/value head that matmul broadcasts over
    /// the query heads (Falcon with `multi_query` and the old decoder architecture,
    /// models/falcon/modeling_falcon.py `_split_heads`: `fused_qkv[..., [-2], :]`, then
    /// `query_layer @ key_layer.transpose(-1, -2)` and `attention_scores @ value_layer`).
    /// With a batch above one, matmul's `expand(...).reshape([B·H, ., .])` must copy (the
    /// stride-0 head dim cannot merge with the batch dim; aten/src/ATen/native/
    /// LinearAlgebra.cpp `matmul`) and bmm saves the copies for backward.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kv_broadcast: bool,
    /// Falcon's new decoder architecture with fewer key/value heads than query heads broadcasts
    /// each key/value group to its query heads in `_split_heads` (`torch.broadcast_to(key,
    /// query.shape)`, then `flatten(2, 3)`), and from there on keys and values, the KV cache
    /// included, have every query head (`num_kv_heads = self.num_heads if
    /// self.new_decoder_architecture`, models/falcon/modeling_falcon.py FalconAttention.forward,
    /// transformers 5.23). The transformers step of such a model is not simulated: it is refused
    /// by name ([`crate::memory::check_attention`]; measured: rnd-i173-001-falcon, 7 heads over
    /// one key/value head, −6.9% with a one-head cache). vLLM's Falcon caches the real key/value
    /// heads, so serving estimates read the real count.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kv_expanded: bool,
    /// The rotary embedding hands out its fp32 cos/sin tables without casting them to the
    /// hidden states' dtype (models/olmo2/modeling_olmo2.py `Olmo2RotaryEmbedding.forward`
    /// returns `emb.cos() * attention_scaling` as is), so in `apply_rotary_pos_emb` `q * cos`
    /// and `rotate_half(q) * sin` promote to fp32 and the rotated q and k are cast back at the
    /// end (`return q_embed.to(q_type), k_embed.to(k_type)`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rope_promotes: bool,
}

/// Family-specific eager attention code paths that change what is alive when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EagerStyle {
    /// transformers' shared `eager_attention_forward`: `repeat_kv` copies for GQA/MQA, a new
    /// tensor for the scaled scores, the mask added into another.
    Shared,
    /// `FalconAttention.forward` (models/falcon/modeling_falcon.py): k/v broadcast by matmul
    /// (transient expanded copies), scores scaled in place, `softmax(scores + mask)` while the
    /// scores are still bound.
    Falcon,
}

impl Attention {
    /// Number of query heads.
    pub fn num_heads(&self) -> u64 {
        match self.kind {
            AttentionKind::Standard { num_heads, .. } | AttentionKind::Mla { num_heads, .. } => {
                num_heads
            }
        }
    }

    /// The projections of the attention block, in forward order, with their shapes.
    ///
    /// MLA follows transformers `models/deepseek_v3/modeling_deepseek_v3.py`
    /// (`DeepseekV3Attention.__init__`): `attention_bias` adds biases to `q_a_proj` and
    /// `kv_a_proj_with_mqa` only; the plain `q_proj` (no `q_lora_rank`), `q_b_proj` and
    /// `kv_b_proj` never have one.
    pub fn linears(&self, hidden: u64) -> Vec<LinearShape> {
        // one allocation: the projections and the output (MLA has up to five)
        let mut v = Vec::with_capacity(5);
        self.for_each_linear(hidden, |s| v.push(s));
        v
    }

    /// [`Attention::linears`] handed to `f` one by one, in the same order (no allocation: the
    /// simulator builds the parameters of every replayed layer this way).
    pub fn for_each_linear(&self, hidden: u64, mut f: impl FnMut(LinearShape)) {
        let l = |role, in_features, out_features, bias| LinearShape {
            role,
            in_features,
            out_features,
            bias,
        };
        match self.kind {
            AttentionKind::Standard {
                num_heads,
                num_kv_heads,
                head_dim,
            } => {
                let q = num_heads * head_dim;
                let kv = num_kv_heads * head_dim;
                if self.fused_qkv {
                    f(l(LinearRole::Qkv, hidden, q + 2 * kv, self.qkv_bias));
                } else {
                    f(l(
                        LinearRole::Q,
                        hidden,
                        if self.output_gate { 2 * q } else { q },
                        self.qkv_bias,
                    ));
                    f(l(LinearRole::K, hidden, kv, self.qkv_bias));
                    f(l(LinearRole::V, hidden, kv, self.qkv_bias));
                }
                f(l(LinearRole::O, q, hidden, self.o_bias));
            }
            AttentionKind::Mla {
                num_heads,
                q_lora_rank,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
            } => {
                let qk_head = qk_nope_head_dim + qk_rope_head_dim;
                match q_lora_rank {
                    Some(r) => {
                        f(l(LinearRole::QA, hidden, r, self.qkv_bias));
                        f(l(LinearRole::QB, r, num_heads * qk_head, false));
                    }
                    None => f(l(LinearRole::Q, hidden, num_heads * qk_head, false)),
                }
                f(l(
                    LinearRole::KvA,
                    hidden,
                    kv_lora_rank + qk_rope_head_dim,
                    self.qkv_bias,
                ));
                f(l(
                    LinearRole::KvB,
                    kv_lora_rank,
                    num_heads * (qk_nope_head_dim + v_head_dim),
                    false,
                ));
                f(l(
                    LinearRole::O,
                    num_heads * v_head_dim,
                    hidden,
                    self.o_bias,
                ));
            }
        }
    }

    /// Norm weights inside the attention block: q/k norms, or MLA's `q_a_layernorm` and
    /// `kv_a_layernorm` (RMSNorm, no bias).
    pub fn norm_dims(&self) -> Vec<u64> {
        match self.kind {
            AttentionKind::Standard {
                num_heads,
                num_kv_heads,
                head_dim,
            } => match self.qk_norm {
                Some((QkNormScope::PerHead, _)) => vec![head_dim, head_dim],
                Some((QkNormScope::Full, _)) => vec![num_heads * head_dim, num_kv_heads * head_dim],
                None => vec![],
            },
            AttentionKind::Mla {
                q_lora_rank,
                kv_lora_rank,
                ..
            } => q_lora_rank
                .into_iter()
                .chain(std::iter::once(kv_lora_rank))
                .collect(),
        }
    }

    /// Parameters of the attention block, including q/k norms, MLA's internal norms and
    /// attention sinks.
    pub fn params(&self, hidden: u64) -> u128 {
        let linears: u128 = self.linears(hidden).iter().map(LinearShape::params).sum();
        let sinks = if self.sinks {
            u128::from(self.num_heads())
        } else {
            0
        };
        let norm_weights = self
            .norm_dims()
            .iter()
            .map(|&d| u128::from(d))
            .sum::<u128>();
        // a biased q/k norm has a bias vector as long as its weight
        let norms = if self.qk_norm_bias {
            2 * norm_weights
        } else {
            norm_weights
        };
        linears + sinks + norms
    }
}

/// A dense (non-expert) feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DenseMlp {
    /// Intermediate width.
    pub intermediate: u64,
    /// Gated (SwiGLU/GeGLU: `down(act(gate(x)) * up(x))`) or plain (`down(act(up(x)))`).
    pub gated: bool,
    /// gate and up computed by one fused linear (Phi-3 `gate_up_proj`).
    pub fused_gate_up: bool,
    /// Biases on the projections.
    pub bias: bool,
    /// Activation.
    pub act: Activation,
}

impl DenseMlp {
    /// The projections of this MLP in forward order (transformers names them per family).
    pub fn linears(&self, hidden: u64) -> Vec<LinearShape> {
        // one allocation: the input projections and the output
        let mut v = Vec::with_capacity(3);
        self.for_each_linear(hidden, |s| v.push(s));
        v
    }

    /// [`DenseMlp::linears`] handed to `f` one by one, in the same order (no allocation).
    pub fn for_each_linear(&self, hidden: u64, mut f: impl FnMut(LinearShape)) {
        let l = |role, in_features, out_features| LinearShape {
            role,
            in_features,
            out_features,
            bias: self.bias,
        };
        let i = self.intermediate;
        if !self.gated {
            f(l(LinearRole::Up, hidden, i));
        } else if self.fused_gate_up {
            f(l(LinearRole::GateUp, hidden, 2 * i));
        } else {
            f(l(LinearRole::Gate, hidden, i));
            f(l(LinearRole::Up, hidden, i));
        }
        f(l(LinearRole::Down, i, hidden));
    }

    /// Parameters of this MLP.
    pub fn params(&self, hidden: u64) -> u128 {
        self.linears(hidden).iter().map(LinearShape::params).sum()
    }
}

/// A mixture-of-experts feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MoeMlp {
    /// Routed experts.
    pub num_experts: u64,
    /// Experts per token.
    pub top_k: u64,
    /// Shape of one routed expert.
    pub expert: DenseMlp,
    /// Bias on the router linear.
    pub router_bias: bool,
    /// Always-on shared expert(s), expressed as one MLP of the combined width.
    pub shared: Option<DenseMlp>,
    /// Qwen2-MoE `shared_expert_gate` (a `Linear(hidden, 1)`).
    pub shared_gate: bool,
    /// Extra router parameters that are real `nn.Parameter`s (none in the supported families).
    pub router_extra_params: u64,
    /// The router runs in fp32 and its routing weights stay fp32, so the weighted expert
    /// outputs are fp32 too (DeepSeek-V3 `DeepseekV3TopkRouter`:
    /// `F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))`, sigmoid).
    pub router_fp32: bool,
    /// The router takes the top-k of the raw logits and softmaxes only those k, in the compute
    /// dtype (gpt-oss `GptOssTopKRouter`: `topk(router_logits)`, then
    /// `softmax(top_value, dtype=top_value.dtype)`), instead of a softmax over all experts.
    pub router_topk_then_softmax: bool,
    /// With `router_fp32`: the fp32 routing weights are cast back to the hidden dtype before
    /// they weight the experts (ERNIE 4.5 `Ernie4_5_MoeTopKRouter`:
    /// `routing_weights.to(hidden_states.dtype)`), so the weighted outputs are not fp32.
    pub router_weights_in_compute_dtype: bool,
    /// The softmax router's fp32 top-k weights are returned without a cast back to the
    /// logits' dtype (Mixtral `MixtralTopKRouter`, transformers 5.23
    /// models/mixtral/modeling_mixtral.py: `softmax(router_logits.float())`, `topk`,
    /// `/= sum`, no `.to(router_logits.dtype)` as Qwen2/Qwen3-MoE and OLMoE have), so in a
    /// 16-bit model `proj_out * sample_weights_g` promotes the weighted expert outputs to fp32
    /// (integrations/moe.py `grouped_mm_experts_forward`).
    pub router_scores_fp32: bool,
    /// The shared experts run before the router and their output is held until it is added
    /// to the routed output (ERNIE 4.5 `Ernie4_5_MoeSparseMoeBlock.forward`).
    pub shared_first: bool,
    /// Frozen fp32 router parameters (`requires_grad=False`; ERNIE 4.5
    /// `moe_statics.e_score_correction_bias`, one per expert): counted, never trained.
    pub frozen_router_params: u64,
    /// Every token runs through every expert (Llama 4 `Llama4TextMoe`, transformers 5.23
    /// models/llama4/modeling_llama4.py): the input is repeated once per expert, scaled by its
    /// sigmoid router score (0 for experts not in the top-k) and passed through batched matmuls
    /// over all experts (`Llama4TextExperts`: `bmm` with `gate_up_proj` `[E, H, 2I]` and
    /// `down_proj` `[E, I, H]`), then summed over experts into the shared expert's output.
    pub all_experts: bool,
    /// Granite MoE's router (`GraniteMoeTopKRouter`, transformers 5.23
    /// models/granitemoe/modeling_granitemoe.py): `F.linear(x, w).float()` (the fp32 logits stay
    /// bound to `_` in `GraniteMoeMoE.forward` until the block returns), top-k of the fp32
    /// logits, softmax over those k in fp32 (saved), `.type_as(hidden_states)`.
    pub granite_router: bool,
    /// HunYuan MoE's gate (`HunYuanMoEV1Gate`, transformers 5.23
    /// models/hunyuan_v1_moe/modeling_hunyuan_v1_moe.py): an fp32 `wg` linear on
    /// `hidden_states.float()` (no weight copy; the fp32 input is saved only for the weight's
    /// gradient), softmax over all experts in fp32 (saved), top-k, renormalised in place, fp32
    /// routing weights (the weighted expert outputs are fp32, as with `router_fp32`).
    pub hunyuan_router: bool,
    /// The top-k routing weights divided by their sum (HF `norm_topk_prob`), as the config
    /// states it; recorded by the `deepseek_v3` normaliser (torchtitan's `route_norm`, whose
    /// saved tensors `memory/titan` counts), `None` where a family's router is modelled as a
    /// whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub norm_topk_prob: Option<bool>,
}

impl MoeMlp {
    /// Whether the routing weights that scale the expert outputs are fp32 (HunYuan's gate,
    /// DeepSeek-V3's fp32 router, Mixtral's uncast softmax top-k), making the weighted expert
    /// outputs fp32 by type promotion in a 16-bit model.
    pub fn routing_weights_fp32(&self) -> bool {
        self.hunyuan_router
            || self.router_scores_fp32
            || (self.router_fp32 && !self.router_weights_in_compute_dtype)
    }

    /// Parameters: router + all experts + shared experts.
    pub fn params(&self, hidden: u64) -> u128 {
        let h = u128::from(hidden);
        let e = u128::from(self.num_experts);
        let mut p = h * e
            + e * self.expert.params(hidden)
            + u128::from(self.router_extra_params)
            + u128::from(self.frozen_router_params);
        if self.router_bias {
            p += e;
        }
        if let Some(s) = self.shared {
            p += s.params(hidden);
        }
        if self.shared_gate {
            p += h;
        }
        p
    }
}

/// The feed-forward block of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mlp {
    /// Dense MLP.
    Dense(DenseMlp),
    /// Mixture of experts.
    Moe(MoeMlp),
    /// No feed-forward block: the layer is its norm and token mixer only (`Mamba2Block`).
    None,
}

impl Mlp {
    /// Parameters of this block.
    pub fn params(&self, hidden: u64) -> u128 {
        match self {
            Mlp::Dense(d) => d.params(hidden),
            Mlp::Moe(m) => m.params(hidden),
            Mlp::None => 0,
        }
    }
}

/// How the two sub-blocks combine with the residual stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Residual {
    /// `h = x + attn(n1(x)); out = h + mlp(n2(h))` (pre-norm; Llama and most).
    Sequential,
    /// `out = x + attn(n1(x)) + mlp(n2(x))` (GPT-NeoX `use_parallel_residual`, Falcon
    /// `parallel_attn`); with no `mlp_norm` the MLP reads `n1(x)` too (Falcon-7B, Phi-2,
    /// Cohere).
    Parallel,
    /// Post-norm: `h = n1(x + attn(x)); out = n2(h + mlp(h))` (OPT `do_layer_norm_before=False`).
    PostNorm,
}

/// One decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LayerSpec {
    /// Norm before attention (`input_layernorm`, `ln_1`, `ln_attn`).
    pub attn_norm: Option<Norm>,
    /// Norm on the attention output before the residual add (Gemma 2/3, OLMo 2 `post_attention_layernorm`).
    pub attn_post_norm: Option<Norm>,
    /// Norm before the MLP (`post_attention_layernorm` in Llama, `pre_feedforward_layernorm` in Gemma 2).
    pub mlp_norm: Option<Norm>,
    /// Norm on the MLP output before the residual add (Gemma 2/3, OLMo 2).
    pub mlp_post_norm: Option<Norm>,
    /// Residual wiring.
    pub residual: Residual,
    /// Attention block.
    pub attention: Attention,
    /// Feed-forward block.
    pub mlp: Mlp,
    /// The attention output stays bound to a Python local until the layer returns, so it is
    /// alive during the MLP (`GPT2Block.forward` keeps `attn_output`; Llama-style layers rebind
    /// `hidden_states` and free it).
    pub attn_output_outlives_mlp: bool,
    /// The MLP is written inline in the decoder layer and rebinds its input (OPT:
    /// `hidden_states = self.fc1(hidden_states)`), so the norm output dies once the first
    /// projection has read it unless autograd saved it; an MLP module (`self.mlp(x)`) keeps
    /// its argument alive to the end. Omitted from serialised output when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub mlp_input_rebound: bool,
    /// Token mixer: the `attention` block above, or a state-space mixer that replaces it
    /// (`crate::mixer`). Omitted from serialised output for attention layers.
    #[serde(skip_serializing_if = "Mixer::is_attention")]
    pub mixer: Mixer,
    /// Each sub-block's output is multiplied by a scalar before its residual add (Granite's
    /// `residual + hidden_states * residual_multiplier`): one more `[tokens, hidden]` tensor per
    /// sub-block. Omitted from serialised output when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub residual_scaled: bool,
    /// A parallel block sums `residual + attn + mlp` (the residual first: Cohere,
    /// models/cohere/modeling_cohere.py `CohereDecoderLayer.forward`) rather than
    /// `attn + mlp + residual` (GPT-NeoX, Phi, Falcon).
    pub parallel_residual_first: bool,
    /// Multiplications by Python scalars inside the layer (muP multipliers): each makes a new
    /// tensor and saves nothing. Omitted from serialised output when there are none.
    #[serde(skip_serializing_if = "ScalarMuls::is_none")]
    pub muls: ScalarMuls,
}

/// The scalar multiplications of one decoder layer (µP multipliers; Falcon-H1,
/// transformers 5.23 `models/falcon_h1/modeling_falcon_h1.py`). Each one is applied whatever
/// its value (`x * 1.0` is still a new tensor), so the flags say where the code multiplies,
/// not what by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ScalarMuls {
    /// The attention block's input (`hidden_states * attention_in_multiplier`, `[T, hidden]`,
    /// alive while the attention runs; its projections save it).
    pub attn_in: bool,
    /// The attention block's output (`attention_hidden_states * attn_out_multiplier`).
    pub attn_out: bool,
    /// A Mamba-2 mixer's input (`hidden_states * ssm_in_multiplier`, saved by `in_proj`).
    pub ssm_in: bool,
    /// A Mamba-2 mixer's `in_proj` output times a per-channel buffer (`projected_states *
    /// self.mup_vector`, `[T, in_proj width]`; the buffer needs no gradient, so the product is
    /// what the scan reads and saves, and `in_proj`'s own output is freed).
    pub ssm_proj: bool,
    /// A Mamba-2 mixer's output (`mamba_hidden_states * ssm_out_multiplier`).
    pub ssm_out: bool,
    /// The MLP's gate projection before the activation (`gate_proj(x) * gate_multiplier`,
    /// `[T, intermediate]`; the activation saves the product).
    pub mlp_gate: bool,
    /// The MLP's output (`down_proj(y) * down_multiplier`).
    pub mlp_down: bool,
}

impl ScalarMuls {
    /// No scalar multiplications (every family but Falcon-H1).
    pub const NONE: ScalarMuls = ScalarMuls {
        attn_in: false,
        attn_out: false,
        ssm_in: false,
        ssm_proj: false,
        ssm_out: false,
        mlp_gate: false,
        mlp_down: false,
    };

    /// Whether there are none.
    pub fn is_none(&self) -> bool {
        *self == ScalarMuls::NONE
    }
}

impl LayerSpec {
    /// Parameters of the layer.
    pub fn params(&self, hidden: u64) -> u128 {
        let norms: u128 = [
            self.attn_norm,
            self.attn_post_norm,
            self.mlp_norm,
            self.mlp_post_norm,
        ]
        .iter()
        .flatten()
        .map(Norm::params)
        .sum();
        let mixer = match &self.mixer {
            Mixer::Attention => self.attention.params(hidden),
            Mixer::Mamba2(m) => m.params(hidden),
            Mixer::GatedDeltaNet(d) => d.params(hidden),
            Mixer::Mamba1(m) => m.params(hidden),
            Mixer::AttentionAndMamba2(m) => self.attention.params(hidden) + m.params(hidden),
        };
        norms + mixer + self.mlp.params(hidden)
    }

    /// The layer's attention block, `None` when its token mixer is not attention (a
    /// state-space layer, whose `attention` field is unused).
    pub fn attention_block(&self) -> Option<&Attention> {
        match self.mixer {
            Mixer::Attention | Mixer::AttentionAndMamba2(_) => Some(&self.attention),
            Mixer::Mamba2(_) | Mixer::GatedDeltaNet(_) | Mixer::Mamba1(_) => None,
        }
    }

    /// The layer's Mamba-2 mixer, if it has one.
    pub fn mamba2(&self) -> Option<&Mamba2> {
        match &self.mixer {
            Mixer::Mamba2(m) | Mixer::AttentionAndMamba2(m) => Some(m),
            Mixer::Attention | Mixer::GatedDeltaNet(_) | Mixer::Mamba1(_) => None,
        }
    }

    /// The layer's gated DeltaNet mixer, if it has one.
    pub fn gated_delta_net(&self) -> Option<&GatedDeltaNet> {
        match &self.mixer {
            Mixer::GatedDeltaNet(d) => Some(d),
            Mixer::Attention
            | Mixer::Mamba2(_)
            | Mixer::Mamba1(_)
            | Mixer::AttentionAndMamba2(_) => None,
        }
    }

    /// The layer's Mamba-1 mixer, if it has one.
    pub fn mamba1(&self) -> Option<&Mamba1> {
        match &self.mixer {
            Mixer::Mamba1(m) => Some(m),
            Mixer::Attention
            | Mixer::Mamba2(_)
            | Mixer::GatedDeltaNet(_)
            | Mixer::AttentionAndMamba2(_) => None,
        }
    }

    /// Whether the layer is a state-space block that keeps its residual in fp32
    /// (`residual_in_fp32` of `Mamba2Block` / `MambaBlock`).
    pub fn ssm_residual_in_fp32(&self) -> bool {
        match &self.mixer {
            Mixer::Mamba2(m) => m.residual_in_fp32,
            Mixer::Mamba1(m) => m.residual_in_fp32,
            Mixer::Attention | Mixer::GatedDeltaNet(_) | Mixer::AttentionAndMamba2(_) => false,
        }
    }

    /// The projections of the token mixer, in forward order.
    pub fn mixer_linears(&self, hidden: u64) -> Vec<LinearShape> {
        match &self.mixer {
            Mixer::Attention => self.attention.linears(hidden),
            Mixer::Mamba2(m) => m.linears(hidden),
            Mixer::GatedDeltaNet(d) => d.linears(hidden),
            Mixer::Mamba1(m) => m.linears(hidden),
            // FalconH1DecoderLayer.forward runs the Mamba-2 mixer first, then the attention
            Mixer::AttentionAndMamba2(m) => {
                let mut v = m.linears(hidden);
                v.extend(self.attention.linears(hidden));
                v
            }
        }
    }

    /// Whether the layer runs attention and a state-space mixer side by side
    /// ([`Mixer::AttentionAndMamba2`]).
    pub fn parallel_mixers(&self) -> bool {
        matches!(self.mixer, Mixer::AttentionAndMamba2(_))
    }
}

/// Token (and position) embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Embeddings {
    /// Vocabulary rows.
    pub vocab_size: u64,
    /// Embedding width (OPT `word_embed_proj_dim` may differ from hidden).
    pub dim: u64,
    /// Learned absolute position rows (GPT-2 `wpe`, OPT `embed_positions` incl. its offset of 2).
    pub learned_positions: Option<u64>,
    /// The position ids are made per sequence from a 2-D mask (OPT: `torch.cumsum` of an
    /// all-ones `[batch, past + seq]` mask), so the position embeddings are `[batch, seq,
    /// hidden]` and the mask and the int64 ids are locals of the model's forward; GPT-2's are
    /// `arange(seq)[None]`, one `[1, seq, hidden]` row shared by the batch. Omitted from
    /// serialised output when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub positions_from_mask: bool,
    /// OPT `project_in`/`project_out` (bias-free linears between `dim` and hidden).
    pub projections: bool,
    /// The embeddings are multiplied by a scalar, a new tensor in the forward (Gemma's
    /// `sqrt(hidden)` normalizer, Granite's `embedding_multiplier`).
    pub scaled: bool,
    /// LayerNorm right after the embeddings (Falcon/OPT have none; BLOOM-style models do).
    pub norm: Option<Norm>,
    /// The scale is part of the embedding module's forward (Gemma's
    /// `*TextScaledWordEmbedding`), so a forward hook on the module (peft's
    /// `enable_input_require_grads`) sees the scaled tensor; Granite scales in the model's
    /// forward, after the hook.
    pub scale_in_module: bool,
    /// The embedding dropout rebinds `inputs_embeds` (Phi: `inputs_embeds =
    /// self.embed_dropout(inputs_embeds)`), so the lookup is freed once the dropout has run and
    /// the dropout's output is what the model's forward keeps; elsewhere the dropout's input
    /// stays bound to `inputs_embeds` (Starcoder2, GPT-NeoX, GPT-2's sum). Omitted from
    /// serialised output when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dropout_rebinds: bool,
}

/// Dropout probabilities used in training mode.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Dropout {
    /// After the embeddings.
    pub embed: f64,
    /// On attention probabilities.
    pub attention: f64,
    /// On each sub-block output before the residual add.
    pub residual: f64,
    /// After the MLP activation.
    pub activation: f64,
}

/// Final norm and output projection.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Head {
    /// Final norm (`norm`, `ln_f`, `final_layer_norm`).
    pub final_norm: Option<Norm>,
    /// Output projection shares the token embedding matrix.
    pub tied: bool,
    /// Bias on the output projection.
    pub bias: bool,
    /// Gemma 2 `final_logit_softcapping`.
    pub logit_softcap: Option<f64>,
    /// The model's forward upcasts the logits itself (`lm_head(...).float()` in
    /// `Mamba2ForCausalLM.forward`): the low-precision logits are a temporary and the fp32 copy
    /// is what the loss reads and the output holds. Omitted from serialised output when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub logits_fp32: bool,
    /// The model scales its logits by a scalar (Granite `logits / logits_scaling`, Cohere `logits * logit_scale`): a new
    /// logits tensor replaces the LM head's output. Omitted from serialised output when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub logits_scaled: bool,
}

/// A whole decoder-only causal LM.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelDesc {
    /// `model_type` of the source config.
    pub model_type: String,
    /// Residual stream width.
    pub hidden_size: u64,
    /// Context length the model was built for.
    pub max_position_embeddings: u64,
    /// Embeddings.
    pub embeddings: Embeddings,
    /// Decoder layers in order.
    pub layers: Vec<LayerSpec>,
    /// Final norm and LM head.
    pub head: Head,
    /// Training-mode dropout.
    pub dropout: Dropout,
    /// The module names transformers gives each linear role (what `--lora-targets` names).
    pub linear_names: Vec<(LinearRole, String)>,
    /// A vision-language model's vision tower and projector (`None` for a text-only model).
    pub vision: Option<VisionTower>,
    /// The config's `use_cache` (default true): a forward called without `use_cache` builds a
    /// `DynamicCache` when it is true (`if use_cache and past_key_values is None:
    /// past_key_values = DynamicCache(config=self.config)` in every `*Model.forward`, the
    /// argument defaulting to the config's value through `merge_with_config_defaults`), so a
    /// training forward without checkpointing keeps its keys and values in the cache.
    /// `generate` always passes `use_cache=True`.
    #[serde(skip_serializing_if = "is_true")]
    pub use_cache: bool,
    /// The model's forward builds the full-attention and the sliding-window causal mask
    /// whatever its layers are (models/gemma2/modeling_gemma2.py and
    /// models/gemma3/modeling_gemma3.py: `causal_mask_mapping = {"full_attention": ...,
    /// "sliding_attention": ...}` unconditionally, transformers 5.23; so do Cohere 2, GPT-OSS
    /// and Qwen 2 MoE, while Qwen 2 / 3 and SmolLM 3 add the sliding one `if
    /// self.has_sliding_layers`, so their normalisers set this only with a sliding layer).
    /// Eager attention materialises both; each layer reads its type's, whatever the window.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub builds_both_masks: bool,
    /// The rotary embedding keeps one `inv_freq` / `original_inv_freq` buffer pair per layer
    /// type (models/gemma3/modeling_gemma3.py `Gemma3RotaryEmbedding.__init__`:
    /// `{layer_type}_inv_freq` for each of `sorted(set(config.layer_types))`) instead of one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub rope_buffers_per_layer_type: bool,
}

/// The vision encoder and multimodal projector of a vision-language model
/// (`*ForConditionalGeneration`): their weights are sized exactly; their activations are not
/// simulated (image tokens count as text tokens of the sequence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VisionTower {
    /// `model_type` of the vision config (`siglip_vision_model`, `pixtral`, …).
    pub model_type: String,
    /// Parameters of the vision encoder.
    pub encoder_params: u64,
    /// Parameters of the multimodal projector (patch merger, adapter, projection into the
    /// text model's width).
    pub projector_params: u64,
    /// Whether a training step updates the vision tower and projector. Off by default: most
    /// VLM fine-tuning recipes freeze the vision encoder (`--train-vision` turns this on).
    pub trainable: bool,
    /// The tower's `nn.Linear` modules by name: peft matches LoRA `target_modules` by the last
    /// component of the module name across the whole model, so `q_proj` also adapts a vision
    /// tower whose attention has a `q_proj`.
    pub linears: Vec<VisionLinear>,
    /// The shapes of the tower's forward over image patches, for the families whose image
    /// forward memwall simulates (`None`: image inputs are refused, only the weights count).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forward: Option<VisionForward>,
    /// Image tokens per sequence (`--image-tokens N`): N of the sequence's tokens are one
    /// image's tokens, and the tower's forward, projector and merge into the embeddings are
    /// simulated. `None`: text-only steps (image tokens, if any, count as text tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_tokens: Option<u64>,
}

/// The vision transformer of Qwen2-VL or Qwen2.5-VL (`qwen2_vl/modeling_qwen2_vl.py`
/// `Qwen2VisionTransformerPretrainedModel`): patches of `patch_in` values (C·T·P·P) embedded to
/// `width`, `depth` blocks of full attention within each image (LayerNorm, `qkv` + 2-D rotary
/// in fp32, quick-GELU MLP of `mlp` features), and the `PatchMerger` that turns `merge`² patches
/// into one LLM token of `out` features.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VisionForward {
    /// Values per patch (`in_channels · temporal_patch_size · patch_size²`).
    pub patch_in: u64,
    /// Embedding width of the blocks (`embed_dim`).
    pub width: u64,
    /// Attention heads (`num_heads`).
    pub heads: u64,
    /// MLP features (`embed_dim · mlp_ratio`).
    pub mlp: u64,
    /// Vision blocks (`depth`).
    pub depth: u64,
    /// `spatial_merge_size`: `merge`² patches make one LLM token.
    pub merge: u64,
    /// Projector output features (the text model's hidden size).
    pub out: u64,
    /// Which tower: the block's norm and MLP, and whether attention is windowed.
    pub kind: VisionKind,
    /// Qwen2.5-VL: the attention window's side in LLM tokens
    /// (`window_size / spatial_merge_size / patch_size`); 0 for full attention everywhere.
    pub window: u64,
    /// Qwen2.5-VL: the blocks with full attention over each image (`fullatt_block_indexes`).
    pub full_blocks: Vec<u64>,
    /// LLM tokens per image for towers that see fixed-size images (Gemma 3:
    /// `mm_tokens_per_image`; N image tokens are N / `per_image` images); 0 when a sequence's
    /// N image tokens are one image of N tokens (Qwen2-VL, Qwen2.5-VL).
    pub per_image: u64,
    /// Llama 4: the pixel-shuffle MLP's width (`projector_input_dim` = `projector_output_dim`
    /// = `vision_output_dim`, the sizes `Llama4VisionMLP2` and the projector chain through);
    /// 0 for the other towers.
    #[serde(skip_serializing_if = "is_zero")]
    pub adapter: u64,
}

/// The vision towers whose forward memwall simulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VisionKind {
    /// Qwen2-VL: LayerNorm, quick-GELU MLP, full attention per image.
    Qwen2Vl,
    /// Qwen2.5-VL (`qwen2_5_vl/modeling_qwen2_5_vl.py`): RMSNorm, SiLU-gated MLP, windowed
    /// attention except in the full-attention blocks, patches reordered by window.
    Qwen25Vl,
    /// Gemma 3's SigLIP tower (`siglip/modeling_siglip.py` SiglipVisionModel: conv patch
    /// embedding + learned positions, LayerNorm / MHA with biases / LayerNorm / GELU-tanh MLP,
    /// post LayerNorm) and `Gemma3MultiModalProjector` (avg-pool by `merge`, RMSNorm, matmul
    /// into the text width); `patch_in` is C·P², `per_image` the tokens per image.
    Gemma3Siglip,
    /// Mistral 3's Pixtral tower (`pixtral/modeling_pixtral.py` PixtralVisionModel: conv patch
    /// embedding, RMSNorm, 2-D RoPE, the batch's images as one sequence under a block-diagonal
    /// mask, SiLU-gated MLP) and `Mistral3MultiModalProjector` (RMSNorm, `Mistral3PatchMerger`
    /// of `merge`² patches, two linears into the text width); `patch_in` is C·P², N image
    /// tokens are one image per sequence.
    Pixtral,
    /// Llama 4's vision model (`llama4/modeling_llama4.py` Llama4VisionModel: unfold patch
    /// embedding as a linear, class token, learned positions, LayerNorm, 2-D rotary with
    /// complex frequencies, encoder layers of LayerNorm / attention with biases and no mask /
    /// GELU MLP, `Llama4VisionPixelShuffleMLP`) and `Llama4MultiModalProjector` (one linear):
    /// every 336-px tile is `per_image` LLM tokens (`merge`² patches each after the pixel
    /// shuffle), N image tokens are N / `per_image` tiles per sequence; `adapter` is the
    /// pixel-shuffle MLP's width.
    Llama4,
}

/// `count` vision-tower linears of one name and shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VisionLinear {
    /// Last component of the module name (`q_proj`, `fc1`, `linear_1`, …).
    pub name: &'static str,
    /// Input features.
    pub in_features: u64,
    /// Output features.
    pub out_features: u64,
    /// How many modules have this name and shape.
    pub count: u64,
}

impl VisionTower {
    /// Encoder + projector parameters.
    pub fn params(&self) -> u64 {
        self.encoder_params.saturating_add(self.projector_params)
    }

    /// The fewest tokens a sequence needs for its image tokens (`image_tokens` with a
    /// simulated forward): the image tokens and the separator tokens the family's processor
    /// adds around them (mistral3: one `[IMG_BREAK]`/`[IMG_END]` per row of the image grid;
    /// llama4: `<|image_start|>`, a separator per local tile, `<|image|>`, `<|image_end|>`, i.e.
    /// tiles + 2); 0 without image tokens.
    pub fn image_sequence_tokens(&self) -> u128 {
        let (Some(f), Some(n)) = (self.forward.as_ref(), self.image_tokens) else {
            return 0;
        };
        let n = u128::from(n);
        n + match f.kind {
            VisionKind::Pixtral => crate::memory::image_grid(n).0,
            VisionKind::Llama4 => n / u128::from(f.per_image.max(1)) + 2,
            VisionKind::Qwen2Vl | VisionKind::Qwen25Vl | VisionKind::Gemma3Siglip => 0,
        }
    }
}

fn is_true(b: &bool) -> bool {
    *b
}

/// The runs of equal consecutive layers of `layers`, each once with its length: what sums
/// and maxima over layers need, at the cost of one comparison per layer.
pub fn layer_runs(layers: &[LayerSpec]) -> impl Iterator<Item = (&LayerSpec, u128)> {
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = layers.get(i)?;
        let len = layers[i..].iter().take_while(|l| *l == first).count();
        i += len;
        Some((first, len as u128))
    })
}

/// One linear layer of a decoder layer (`nn.Linear(in_features, out_features, bias)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LinearShape {
    /// What it computes.
    pub role: LinearRole,
    /// Input features.
    pub in_features: u64,
    /// Output features.
    pub out_features: u64,
    /// Whether it has a bias.
    pub bias: bool,
}

impl LinearShape {
    /// Weight (+ bias) parameters.
    pub fn params(&self) -> u128 {
        let w = u128::from(self.in_features) * u128::from(self.out_features);
        if self.bias {
            w + u128::from(self.out_features)
        } else {
            w
        }
    }
}

/// The role of a linear layer inside a decoder layer, independent of family naming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinearRole {
    /// Query projection.
    Q,
    /// Key projection.
    K,
    /// Value projection.
    V,
    /// Fused q/k/v projection.
    Qkv,
    /// Attention output projection.
    O,
    /// MLA query down-projection (`q_a_proj`).
    QA,
    /// MLA query up-projection (`q_b_proj`).
    QB,
    /// MLA joint kv down-projection (`kv_a_proj_with_mqa`).
    KvA,
    /// MLA kv up-projection (`kv_b_proj`).
    KvB,
    /// MLP gate projection (dense MLPs and shared experts).
    Gate,
    /// MLP up projection (plain MLPs: the first linear).
    Up,
    /// Fused gate/up projection.
    GateUp,
    /// MLP down projection (plain MLPs: the second linear).
    Down,
    /// State-space mixer input projection (Mamba `in_proj`).
    SsmIn,
    /// State-space mixer output projection (Mamba `out_proj`).
    SsmOut,
    /// A linear-attention mixer's second input projection (Qwen3-Next gated DeltaNet
    /// `in_proj_ba`: the per-head `beta` and decay inputs).
    SsmGates,
}

/// Parameter counts by component, as transformers instantiates them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ParamCounts {
    /// Token + position embeddings (+ OPT projections, embedding norm).
    pub embeddings: u64,
    /// All decoder layers.
    pub layers: u64,
    /// Final norm.
    pub final_norm: u64,
    /// Untied LM head (0 when tied).
    pub lm_head: u64,
    /// Sum of the above.
    pub total: u64,
    /// Vision tower and projector of a vision-language model (0 otherwise); included in
    /// `total`.
    #[serde(skip_serializing_if = "is_zero")]
    pub vision: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn to_u64(v: u128, what: &'static str) -> Result<u64, CoreError> {
    u64::try_from(v).map_err(|_| CoreError::Overflow { what })
}

impl ModelDesc {
    /// Parameter counts by component.
    pub fn param_counts(&self) -> Result<ParamCounts, CoreError> {
        let e = &self.embeddings;
        let h = u128::from(self.hidden_size);
        let dim = u128::from(e.dim);
        let mut embed = u128::from(e.vocab_size) * dim;
        if let Some(p) = e.learned_positions {
            embed += u128::from(p) * h;
        }
        if e.projections {
            embed += 2 * dim * h;
        }
        if let Some(n) = e.norm {
            embed += n.params();
        }
        let layers: u128 = layer_runs(&self.layers)
            .map(|(l, n)| n * l.params(self.hidden_size))
            .sum();
        let final_norm = self.head.final_norm.map_or(0, |n| n.params());
        let lm_head = if self.head.tied {
            // a tied head shares its weight only; a bias stays its own parameter
            if self.head.bias {
                u128::from(e.vocab_size)
            } else {
                0
            }
        } else {
            u128::from(e.vocab_size) * dim
                + if self.head.bias {
                    u128::from(e.vocab_size)
                } else {
                    0
                }
        };
        let vision = self.vision.as_ref().map_or(0, |v| {
            u128::from(v.encoder_params) + u128::from(v.projector_params)
        });
        let total = embed + layers + final_norm + lm_head + vision;
        Ok(ParamCounts {
            embeddings: to_u64(embed, "embedding parameters")?,
            layers: to_u64(layers, "layer parameters")?,
            final_norm: to_u64(final_norm, "final norm parameters")?,
            lm_head: to_u64(lm_head, "lm_head parameters")?,
            total: to_u64(total, "total parameters")?,
            vision: to_u64(vision, "vision tower parameters")?,
        })
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A Llama-2-7B-shaped description built by hand (config from meta-llama/Llama-2-7b-hf).
    pub(crate) fn llama2_7b() -> ModelDesc {
        let norm = Norm {
            kind: NormKind::RmsNorm,
            dim: 4096,
            bias: false,
        };
        let layer = LayerSpec {
            attn_norm: Some(norm),
            attn_post_norm: None,
            mlp_norm: Some(norm),
            mlp_post_norm: None,
            residual: Residual::Sequential,
            attention: Attention {
                kind: AttentionKind::Standard {
                    num_heads: 32,
                    num_kv_heads: 32,
                    head_dim: 128,
                },
                qkv_bias: false,
                o_bias: false,
                fused_qkv: false,
                qk_norm: None,
                rotary_dim: Some(128),
                sliding_window: None,
                logit_softcap: None,
                eager_softmax_fp32: true,
                eager_style: EagerStyle::Shared,
                rope_concat: false,
                sinks: false,
                rope_fp32: false,
                rope_complex: false,
                l2_qk_norm: false,
                temperature_tuning: false,
                chunked: false,
                qk_norm_after_rope: false,
                rope_locals: false,
                rope_upcast_qk: false,
                output_gate: false,
                key_scaled: false,
                clip_qkv: false,
                qk_norm_inline: false,
                qk_norm_bias: false,
                rope_halves: false,
                kv_broadcast: false,
                kv_expanded: false,
                rope_promotes: false,
            },
            attn_output_outlives_mlp: false,
            mlp_input_rebound: false,
            mixer: Mixer::Attention,
            residual_scaled: false,
            parallel_residual_first: false,
            muls: ScalarMuls::NONE,
            mlp: Mlp::Dense(DenseMlp {
                intermediate: 11008,
                gated: true,
                fused_gate_up: false,
                bias: false,
                act: Activation::Silu,
            }),
        };
        ModelDesc {
            rope_buffers_per_layer_type: false,
            model_type: "llama".into(),
            hidden_size: 4096,
            max_position_embeddings: 4096,
            embeddings: Embeddings {
                vocab_size: 32000,
                dim: 4096,
                learned_positions: None,
                positions_from_mask: false,
                projections: false,
                scaled: false,
                norm: None,
                scale_in_module: false,
                dropout_rebinds: false,
            },
            layers: vec![layer; 32],
            head: Head {
                final_norm: Some(norm),
                tied: false,
                bias: false,
                logit_softcap: None,
                logits_fp32: false,
                logits_scaled: false,
            },
            dropout: Dropout::default(),
            linear_names: vec![],
            vision: None,
            use_cache: true,
            builds_both_masks: false,
        }
    }

    #[test]
    fn llama2_7b_param_count_matches_transformers() {
        // transformers LlamaForCausalLM(Llama-2-7b-hf config): 6_738_415_616 parameters.
        let c = llama2_7b().param_counts().unwrap();
        assert_eq!(c.total, 6_738_415_616);
        assert_eq!(c.embeddings, 32000 * 4096);
        assert_eq!(c.lm_head, 32000 * 4096);
    }
}
