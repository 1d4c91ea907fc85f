#!/usr/bin/env python3
"""Draw a random truth sample (issue 17: "truth sampled at random").

Hand-picked fixtures vary one option at a time around a few baselines and leave regions of the
option space unmeasured.  This script draws random *valid* cases from the whole option space that
`measure.py` / `measure_infer.py` already support, deterministically from a seed:

* model configs: for every model type in tests/truth/configs, ``--configs-per-family`` random
  small configs (random but realistic widths: heads / kv heads / head_dim divisibility,
  intermediate sizes, odd vocabularies, 1-3 layers, sliding windows, MoE expert counts, MLA
  ranks, tied/untied heads), written as tests/truth/configs/rnd-s<seed>-<type>-<k>.json with a
  "random, seed S" line in tests/truth/configs/SOURCES.toml;
* training cases (tools/truth/cases/random_train.toml, ids ``rnd-t<seed>-NNN-…``): batch and
  sequence (odd sizes included), precision, attention implementation, checkpointing, gradient
  accumulation, optimizer, LoRA (rank, alpha, targets), loss kernel, padding-free batches,
  dropout on/off;
* inference cases (tools/truth/cases/random_infer.toml, ids ``rnd-i<seed>-NNN-…``): batch,
  prompt, new tokens, weight dtype, attention, MoE decode experts.

Usage:
  python tools/truth/sample_cases.py --seed 17 --train 220 --infer 70
  python tools/truth/sample_cases.py --families new --seed 29 --train 100 --infer 40 \
      --configs-per-family 2     # the issue-14 families (NEW_TEMPLATES) instead of the older ones
  python tools/truth/measure.py --cases tools/truth/cases/random_train.toml \
      --out tests/truth/random_train.jsonl --jobs 1 --per-worker 10
  python tools/truth/measure_infer.py --cases tools/truth/cases/random_infer.toml \
      --out tests/truth/random_infer.jsonl --jobs 1 --per-worker 10

`--families new` draws the newer families (issue 14, `NEW_TEMPLATES`) with their own width rules
(`random_config_new`) and writes tools/truth/cases/random_new_{train,infer}.toml instead; the
default (`--families old`) draws exactly what it always drew (seed 17 gives byte-identical files).

Only the standard library is used (no torch): the same seed always gives the same files.
Combinations the harness cannot run are never drawn (gemma2 + sdpa, the fused losses under
autocast or on families without a Liger forward, padding-free batches on families whose
attention mask does not detect packed sequences); see tools/truth/README.md.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "tests/truth/configs"
CASES_DIR = REPO / "tools/truth/cases"

# the config each family's random configs start from (its other fields are kept verbatim)
TEMPLATES = {
    "deepseek_v3": "deepseek-v3-4l",
    "falcon": "falcon-7b-4l",
    "gemma": "gemma-2b",
    "gemma2": "gemma-2-2b",
    "gemma3_text": "gemma-3-1b",
    "gpt2": "gpt2",
    "gpt_neox": "pythia-160m",
    "llama": "llama-3.2-1b",
    "mistral": "mistral-7b-v0.1-4l",
    "mixtral": "mixtral-8x7b-2l",
    "olmo2": "olmo-2-1b",
    "opt": "opt-125m",
    "phi3": "phi-3-mini-4k",
    "qwen2": "qwen2.5-0.5b",
    "qwen2_moe": "qwen1.5-moe-a2.7b-4l",
    "qwen3": "qwen3-0.6b",
    "qwen3_moe": "qwen3-30b-a3b-2l",
    "starcoder2": "starcoder2-3b",
}

# LoRA target module names per family (peft matches module-name suffixes)
LORA_TARGETS = {
    "deepseek_v3": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
    "falcon": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "gpt_neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
    "opt": ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"],
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "starcoder2": ["q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"],
    # MoE: the experts are fused parameters in transformers 5 (no Linear to target)
    "mixtral": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen2_moe": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen3_moe": ["q_proj", "k_proj", "v_proj", "o_proj"],
}
DENSE_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# families with a Liger `lce_forward` (fused-linear) and a `loss_function` (fused), no softcap
FUSED_LOSS_FAMILIES = {"llama", "mistral", "qwen2", "qwen3", "olmo2", "phi3", "gemma"}
# families whose masks go through masking_utils (packed-sequence detection)
PADDING_FREE_FAMILIES = {"llama", "mistral", "qwen2", "qwen3", "olmo2"}

PRECISIONS = ["bf16", "fp16", "fp32", "amp-bf16", "amp-fp16"]
OPTIMIZERS = ["adamw", "adamw-fused", "adamw-forloop", "sgd", "sgd-momentum", "lion"]


def _heads(rng: random.Random, max_heads: int = 8) -> tuple[int, int]:
    """(attention heads, kv heads) with kv | heads."""
    heads = rng.randint(1, max_heads)
    kv = rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
    return heads, kv


def _vocab(rng: random.Random) -> int:
    return rng.choice([rng.randint(300, 4000), rng.randint(300, 4000) // 64 * 64 + 64])


def _intermediate(rng: random.Random, hidden: int) -> int:
    return rng.choice([rng.randint(hidden, 4 * hidden), 8 * ((rng.randint(hidden, 4 * hidden) + 7) // 8)])


def random_config(model_type: str, rng: random.Random) -> dict:
    """A random small config of one family (see `_random_config`), made buildable:
    * a template's `pad_token_id` outside the drawn vocabulary is dropped (`nn.Embedding`
      asserts `padding_idx < num_embeddings`);
    * expert widths are rounded up to a multiple of 8: `torch._grouped_mm` requires 16-byte
      aligned row strides (`_meta_grouped_mm_common`: "stride along 0 dim to be multiple of
      16 bytes"), as every released MoE has.
    Neither draws from `rng`, so the other configs and all cases stay as drawn."""
    d = _random_config(model_type, rng)
    pad = d.get("pad_token_id")
    if isinstance(pad, int) and pad >= d["vocab_size"]:
        d["pad_token_id"] = None
    expert_width = {"mixtral": "intermediate_size", "qwen2_moe": "moe_intermediate_size",
                    "qwen3_moe": "moe_intermediate_size", "deepseek_v3": "moe_intermediate_size"}
    if model_type in expert_width:
        k = expert_width[model_type]
        d[k] = -(-d[k] // 8) * 8
    return d


def _random_config(model_type: str, rng: random.Random) -> dict:
    """A random small config of one family: the template's fields with new widths."""
    d = json.loads((CONFIG_DIR / f"{TEMPLATES[model_type]}.json").read_text())
    if model_type == "gemma3_text" and "text_config" in d:
        d = dict(d["text_config"])
    layers = rng.randint(1, 3)
    heads, kv = _heads(rng)
    head_dim = rng.choice([8, 16, 24, 32, 48, 64])
    hidden = heads * head_dim
    vocab = _vocab(rng)
    tie = rng.random() < 0.5
    window = rng.choice([None, None, rng.randint(8, 200)])
    if model_type == "gpt2":
        d.update(n_embd=hidden, n_head=heads, n_layer=layers, vocab_size=vocab,
                 n_inner=rng.choice([None, _intermediate(rng, hidden)]))
        for k in ("attn_pdrop", "embd_pdrop", "resid_pdrop"):
            d[k] = rng.choice([0.0, 0.1])
        return d
    d.update(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers, vocab_size=vocab)
    inter = _intermediate(rng, hidden)
    if model_type == "opt":
        d.update(ffn_dim=inter, word_embed_proj_dim=hidden, dropout=rng.choice([0.0, 0.1]),
                 attention_dropout=rng.choice([0.0, 0.1]))
        return d
    if model_type == "gpt_neox":
        d.update(intermediate_size=inter, rotary_pct=rng.choice([0.25, 0.5, 1.0]),
                 use_parallel_residual=rng.random() < 0.5, tie_word_embeddings=tie)
        return d
    if model_type == "falcon":
        if rng.random() < 0.5:
            d.update(multi_query=True, new_decoder_architecture=False, parallel_attn=True)
        else:
            d.update(multi_query=False, new_decoder_architecture=True, num_kv_heads=kv, parallel_attn=True)
        d.update(bias=rng.random() < 0.3)
        return d
    if model_type == "deepseek_v3":
        d.pop("quantization_config", None)  # fp8 checkpoint format; the harness builds bf16 models
        n_group = rng.choice([1, 2, 4])
        experts = n_group * rng.randint(1, 4)
        topk_group = rng.randint(1, n_group)
        per_group = experts // n_group
        d.update(num_key_value_heads=heads, intermediate_size=inter,
                 q_lora_rank=rng.choice([None, rng.randint(8, 96)]), kv_lora_rank=rng.randint(8, 64),
                 qk_nope_head_dim=rng.choice([8, 16, 32]), qk_rope_head_dim=rng.choice([8, 16]),
                 v_head_dim=rng.choice([8, 16, 32]), n_routed_experts=experts, n_group=n_group,
                 topk_group=topk_group, num_experts_per_tok=rng.randint(1, topk_group * per_group),
                 n_shared_experts=rng.randint(1, 2), moe_intermediate_size=_intermediate(rng, hidden // 2),
                 first_k_dense_replace=rng.randint(0, layers), tie_word_embeddings=False)
        return d
    d.update(num_key_value_heads=kv, intermediate_size=inter)
    if model_type in ("gemma", "gemma2", "gemma3_text", "qwen3", "qwen3_moe"):
        d["head_dim"] = head_dim
        if rng.random() < 0.3:  # head_dim independent of hidden / heads (as in gemma-7b)
            d["hidden_size"] = rng.choice([64, 96, 128, 160, 256])
    if model_type in ("gemma2", "gemma3_text"):
        d.update(query_pre_attn_scalar=head_dim, sliding_window=rng.randint(8, 200))
        d.pop("layer_types", None)
    if model_type in ("mistral", "phi3", "starcoder2"):
        d["sliding_window"] = window
    if model_type in ("llama", "mistral", "qwen2", "qwen3", "olmo2", "phi3", "starcoder2"):
        d["tie_word_embeddings"] = tie
    if model_type == "starcoder2":
        d["use_bias"] = rng.random() < 0.5
        for k in ("residual_dropout", "embedding_dropout", "attention_dropout"):
            d[k] = rng.choice([0.0, 0.1])
    if model_type == "phi3":
        d["original_max_position_embeddings"] = d["max_position_embeddings"]
    if model_type == "mixtral":
        n = rng.randint(2, 8)
        d.update(num_local_experts=n, num_experts_per_tok=rng.randint(1, min(n, 3)))
    if model_type == "qwen2_moe":
        n = rng.randint(2, 16)
        d.update(num_experts=n, num_experts_per_tok=rng.randint(1, min(n, 4)),
                 moe_intermediate_size=_intermediate(rng, hidden // 2),
                 shared_expert_intermediate_size=_intermediate(rng, hidden))
    if model_type == "qwen3_moe":
        n = rng.randint(2, 16)
        d.update(num_experts=n, num_experts_per_tok=rng.randint(1, min(n, 4)),
                 moe_intermediate_size=_intermediate(rng, hidden // 2),
                 max_window_layers=layers)
    if model_type in ("qwen2", "qwen3"):
        d["max_window_layers"] = layers
        d.pop("layer_types", None)
    return d


def lora_targets(model_type: str) -> list[str]:
    return LORA_TARGETS.get(model_type, DENSE_TARGETS)


def train_case(i: int, seed: int, rng: random.Random, pool: list[tuple[str, str]]) -> dict:
    name, mt = rng.choice(pool)
    c: dict = {"id": f"rnd-t{seed}-{i:03d}-{mt.replace('_', '')}", "config": name}
    c["batch"] = rng.randint(1, 6)
    c["seq"] = rng.choice([rng.randint(8, 320), rng.randint(8, 64), 2 * rng.randint(4, 160)])
    c["precision"] = rng.choice(PRECISIONS)
    c["optimizer"] = rng.choice(OPTIMIZERS)
    c["checkpointing"] = rng.random() < 0.3
    c["attention"] = "eager" if mt == "gemma2" else rng.choice(["sdpa", "eager"])
    if rng.random() < 0.3:
        targets = lora_targets(mt)
        chosen = [t for t in targets if rng.random() < 0.5] or [rng.choice(targets)]
        r = rng.choice([1, 2, 4, 8, 16, 32])
        c["lora"] = {"rank": r, "alpha": rng.choice([r, 2 * r, 16]), "targets": chosen}
    c["grad_accum"] = rng.choice([1, 1, 1, 2, 3])
    c["dropout"] = rng.choice(["config", "off"])
    if mt in FUSED_LOSS_FAMILIES and not c["precision"].startswith("amp") and rng.random() < 0.3:
        c["loss"] = rng.choice(["fused", "fused-linear"])
    if mt in PADDING_FREE_FAMILIES and rng.random() < 0.15:
        c["padding_free"] = True
    return c


def infer_case(i: int, seed: int, rng: random.Random, pool: list[tuple[str, str]]) -> dict:
    name, mt = rng.choice(pool)
    c: dict = {"id": f"rnd-i{seed}-{i:03d}-{mt.replace('_', '')}", "config": name}
    c["batch"] = rng.randint(1, 5)
    c["prompt"] = rng.choice([rng.randint(4, 300), rng.randint(4, 48)])
    c["new_tokens"] = rng.randint(1, 12)
    c["weights"] = rng.choice(["bf16", "fp16", "fp32"])
    c["attention"] = "eager" if mt == "gemma2" else rng.choice(["sdpa", "eager"])
    if mt in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"):
        c["decode_experts"] = rng.choice(["batched_mm", "grouped_mm"])
    return c


# ------------------------------------------------------------------ the issue-14 families
# `--families new`: the config each family's random configs start from (reduced real configs)
NEW_TEMPLATES = {
    "cohere": "command-r-v01-2l",
    "cohere2": "command-r7b-4l",
    "ernie4_5_moe": "ernie-4.5-21b-a3b-2l",
    "exaone4": "exaone-4.0-32b-4l",
    "falcon_h1": "falcon-h1-0.5b-2l",
    "glm4": "glm-4-9b-0414-4l",
    "gpt_oss": "gpt-oss-20b-2l",
    "granite": "granite-3.1-2b-4l",
    "granitemoe": "granite-3.1-1b-a400m-4l",
    "granitemoehybrid": "granite-4.0-h-tiny-6l",
    "hunyuan_v1_dense": "hunyuan-7b-2l",
    "jamba": "jamba-1.5-mini-5l",
    "llama4_text": "llama-4-scout-17b-16e-text-4l",
    "mamba2": "mamba-codestral-7b-2l",
    "olmoe": "olmoe-1b-7b-2l",
    "phi": "phi-2-4l",
    "qwen3_next": "qwen3-next-80b-a3b-4l",
    "seed_oss": "seed-oss-36b-2l",
    "smollm3": "smollm3-3b-4l",
}
# families whose sparse blocks have fused expert parameters (the `decode_experts` choice)
NEW_MOE = {"ernie4_5_moe", "gpt_oss", "granitemoe", "granitemoehybrid", "jamba", "llama4_text",
           "olmoe", "qwen3_next"}
# the only GatedDeltaNet head shape memwall trained when seed 29 was drawn (Qwen3-Next-80B's 16
# key / 32 value heads, both 128 wide; every shape is estimated since): other shapes were drawn
# for inference only, kept so that the seed draws the same cases
DELTANET_FITTED = {"linear_num_key_heads": 16, "linear_num_value_heads": 32,
                   "linear_key_head_dim": 128, "linear_value_head_dim": 128}
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def _rot_factor(rng: random.Random, head_dim: int) -> float:
    """A partial-rotary factor whose rotary width is an even integer (RoPE rotates halves)."""
    ok = [f for f in (0.25, 0.4, 0.5, 0.75, 1.0) if (head_dim * f) == int(head_dim * f)
          and int(head_dim * f) % 2 == 0 and head_dim * f >= 2]
    return rng.choice(ok)


def _expert_width(rng: random.Random, hidden: int) -> int:
    """Expert widths are multiples of 8 (torch._grouped_mm's 16-byte row strides)."""
    return -(-_intermediate(rng, max(8, hidden // 2)) // 8) * 8


def _layout(rng: random.Random, n: int, kinds: tuple[str, str], p: float) -> list[str]:
    """n layer kinds, each the second with probability p, both present when n > 1."""
    out = [kinds[1] if rng.random() < p else kinds[0] for _ in range(n)]
    if n > 1 and len(set(out)) == 1:
        out[rng.randrange(n)] = kinds[0] if out[0] == kinds[1] else kinds[1]
    return out


def _mamba2_heads(rng: random.Random, inner: int) -> tuple[int, int, int]:
    """(heads, head width, groups) of a Mamba-2 mixer of `inner` = heads × head width channels:
    the head width a multiple of 4 (8 … 64), groups dividing heads."""
    widths = [w for w in (8, 16, 32, 64) if inner % w == 0 and inner // w <= 64]
    d_head = rng.choice(widths)
    n_heads = inner // d_head
    groups = rng.choice([g for g in (1, 2, 4, 8) if n_heads % g == 0])
    return n_heads, d_head, groups


def random_config_new(model_type: str, rng: random.Random, k: int) -> dict:
    """A random small config of one issue-14 family; `k` is its index within the family
    (qwen3_next's config 0 keeps Qwen3-Next-80B's GatedDeltaNet shape, so it can be trained)."""
    d = json.loads((CONFIG_DIR / f"{NEW_TEMPLATES[model_type]}.json").read_text())
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype"):
        d.pop(key, None)
    layers = rng.randint(1, 3)
    heads, kv = _heads(rng)
    head_dim = rng.choice([8, 16, 32, 64])
    hidden = heads * head_dim
    vocab = _vocab(rng)
    tie = rng.random() < 0.5
    d.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
             num_hidden_layers=layers, vocab_size=vocab, intermediate_size=_intermediate(rng, hidden))
    if "head_dim" in d and model_type != "mamba2":
        d["head_dim"] = head_dim
        if model_type in ("gpt_oss", "seed_oss", "exaone4", "hunyuan_v1_dense", "glm4", "cohere2") \
                and rng.random() < 0.3:  # hidden independent of heads × head_dim (as gpt-oss's 2880)
            d["hidden_size"] = hidden = rng.choice([64, 96, 128, 160, 256])
    if model_type == "cohere":
        d.update(use_qk_norm=rng.random() < 0.5, attention_bias=rng.random() < 0.3)
    elif model_type == "cohere2":
        layers = d["num_hidden_layers"] = rng.randint(1, 4)
        d.update(sliding_window=rng.randint(8, 200), sliding_window_pattern=rng.randint(2, 4),
                 attention_bias=rng.random() < 0.3)
        d.pop("layer_types", None)
    elif model_type == "phi":
        d.update(partial_rotary_factor=_rot_factor(rng, head_dim), qk_layernorm=rng.random() < 0.5,
                 tie_word_embeddings=tie, resid_pdrop=rng.choice([0.0, 0.1]),
                 embd_pdrop=rng.choice([0.0, 0.1]), attention_dropout=rng.choice([0.0, 0.1]))
    elif model_type == "granite":
        d.update(tie_word_embeddings=tie, attention_bias=rng.random() < 0.3,
                 mlp_bias=rng.random() < 0.3, attention_dropout=rng.choice([0.0, 0.1]))
    elif model_type == "granitemoe":
        n = rng.randint(2, 8)
        d.update(num_local_experts=n, num_experts_per_tok=rng.randint(1, min(n, 4)),
                 intermediate_size=_expert_width(rng, hidden), tie_word_embeddings=tie)
    elif model_type == "granitemoehybrid":
        layers = d["num_hidden_layers"] = rng.randint(1, 4)
        n_heads, d_head, groups = _mamba2_heads(rng, 2 * hidden)
        n = rng.choice([0, rng.randint(2, 8)])
        d.update(layer_types=_layout(rng, layers, ("mamba", "attention"), 0.35),
                 mamba_expand=2, mamba_n_heads=n_heads, mamba_d_head=d_head, mamba_n_groups=groups,
                 mamba_d_state=rng.choice([8, 16, 32, 64, 128]),
                 mamba_chunk_size=rng.choice([16, 32, 64, 128, 256]),
                 num_local_experts=n, num_experts_per_tok=rng.randint(1, min(n, 4)) if n else 0,
                 intermediate_size=_expert_width(rng, hidden),
                 shared_intermediate_size=_intermediate(rng, hidden),
                 position_embedding_type=rng.choice(["nope", "rope"]), tie_word_embeddings=tie)
    elif model_type == "gpt_oss":
        layers = d["num_hidden_layers"] = rng.randint(1, 4)
        n = rng.randint(2, 8)
        k_ = rng.randint(1, min(n, 4))
        d.update(num_local_experts=n, num_experts_per_tok=k_, experts_per_token=k_,
                 intermediate_size=_expert_width(rng, hidden), sliding_window=rng.randint(8, 200))
        d["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    elif model_type == "llama4_text":
        layers = d["num_hidden_layers"] = rng.randint(1, 4)
        n = rng.randint(1, 8)
        d.update(num_local_experts=n, num_experts_per_tok=1,
                 intermediate_size=_expert_width(rng, hidden),
                 intermediate_size_mlp=_intermediate(rng, hidden),
                 interleave_moe_layer_step=rng.choice([1, 1, 2]),
                 no_rope_layer_interval=rng.choice([2, 3, 4]),
                 attention_chunk_size=rng.randint(8, 200), use_qk_norm=rng.random() < 0.5,
                 attention_bias=rng.random() < 0.2)
        for key in ("layer_types", "no_rope_layers", "moe_layers"):
            d.pop(key, None)
    elif model_type == "glm4":
        d.update(partial_rotary_factor=_rot_factor(rng, head_dim),
                 attention_bias=rng.random() < 0.5, tie_word_embeddings=tie)
    elif model_type == "olmoe":
        n = rng.randint(2, 16)
        d.update(num_experts=n, num_experts_per_tok=rng.randint(1, min(n, 4)),
                 intermediate_size=_expert_width(rng, hidden), norm_topk_prob=rng.random() < 0.5,
                 clip_qkv=rng.choice([None, 8.0]), tie_word_embeddings=tie)
    elif model_type == "falcon_h1":
        n_heads, d_head, groups = _mamba2_heads(rng, rng.choice([1, 2]) * hidden)
        d.update(head_dim=head_dim, mamba_d_ssm=n_heads * d_head, mamba_n_heads=n_heads,
                 mamba_d_head=d_head, mamba_n_groups=groups,
                 mamba_d_state=rng.choice([8, 16, 32, 64, 128]),
                 mamba_chunk_size=rng.choice([16, 32, 64, 128]),
                 mamba_rms_norm=rng.random() < 0.5, mamba_norm_before_gate=rng.random() < 0.5,
                 projectors_bias=rng.random() < 0.3, tie_word_embeddings=tie)
    elif model_type == "jamba":
        layers = d["num_hidden_layers"] = rng.randint(1, 4)
        ap = rng.randint(1, 4)
        ep = rng.randint(1, 3)
        n = rng.randint(1, 8)
        d.update(attn_layer_period=ap, attn_layer_offset=rng.randint(0, ap - 1),
                 expert_layer_period=ep, expert_layer_offset=rng.randint(0, ep - 1),
                 num_experts=n, num_experts_per_tok=rng.randint(1, min(n, 2)),
                 mamba_d_state=rng.choice([4, 8, 16, 32]), mamba_d_conv=rng.choice([2, 3, 4]),
                 mamba_expand=rng.choice([1, 2]), mamba_dt_rank=rng.randint(2, max(2, hidden // 8)),
                 mamba_conv_bias=rng.random() < 0.7, mamba_proj_bias=rng.random() < 0.3,
                 tie_word_embeddings=tie)
        d["intermediate_size"] = -(-d["intermediate_size"] // 8) * 8
    elif model_type == "mamba2":
        for key in ("num_attention_heads", "num_key_value_heads"):
            d.pop(key, None)
        n_heads, d_head, groups = _mamba2_heads(rng, 2 * hidden)
        d.update(expand=2, num_heads=n_heads, head_dim=d_head, n_groups=groups,
                 state_size=rng.choice([8, 16, 32, 64, 128]), chunk_size=rng.choice([16, 32, 64, 128, 256]),
                 conv_kernel=rng.choice([2, 4]), use_bias=rng.random() < 0.3,
                 use_conv_bias=rng.random() < 0.7, residual_in_fp32=rng.random() < 0.5,
                 tie_word_embeddings=tie)
        d.pop("intermediate_size", None)
    elif model_type == "smollm3":
        layers = d["num_hidden_layers"] = rng.randint(1, 4)
        d.update(no_rope_layer_interval=rng.choice([2, 3, 4]), tie_word_embeddings=tie,
                 max_window_layers=layers)
        for key in ("layer_types", "no_rope_layers"):
            d.pop(key, None)
    elif model_type == "exaone4":
        layers = d["num_hidden_layers"] = rng.randint(1, 4)
        d.pop("layer_types", None)
        if rng.random() < 0.3:
            d.update(sliding_window=None, sliding_window_pattern=None)
        else:
            d.update(sliding_window=rng.randint(8, 200), sliding_window_pattern=rng.randint(2, 4))
        d["tie_word_embeddings"] = tie
    elif model_type == "ernie4_5_moe":
        n = rng.randint(2, 16)
        d.update(moe_num_experts=n, moe_k=rng.randint(1, min(n, 4)),
                 moe_intermediate_size=_expert_width(rng, hidden),
                 moe_num_shared_experts=rng.randint(0, 2), moe_layer_start_index=rng.randint(0, 1),
                 moe_layer_interval=rng.choice([1, 1, 2]), moe_layer_end_index=-1,
                 use_bias=rng.random() < 0.3, tie_word_embeddings=tie)
    elif model_type == "seed_oss":
        d.update(attention_bias=rng.random() < 0.5, attention_out_bias=rng.random() < 0.3,
                 mlp_bias=rng.random() < 0.3, attention_dropout=rng.choice([0.0, 0.1]),
                 residual_dropout=rng.choice([0.0, 0.1]), tie_word_embeddings=tie)
    elif model_type == "hunyuan_v1_dense":
        d.update(use_qk_norm=rng.random() < 0.5, attention_bias=rng.random() < 0.3,
                 tie_word_embeddings=tie)
    elif model_type == "qwen3_next":
        # the trainable config (k = 0) has GatedDeltaNet layers and full attention both
        layers = d["num_hidden_layers"] = rng.randint(2 if k == 0 else 1, 4)
        n = rng.randint(2, 16)
        d.update(num_experts=n, num_experts_per_tok=rng.randint(1, min(n, 4)),
                 moe_intermediate_size=_expert_width(rng, hidden),
                 shared_expert_intermediate_size=_intermediate(rng, hidden),
                 decoder_sparse_step=rng.choice([1, 1, 2]),
                 partial_rotary_factor=_rot_factor(rng, head_dim), tie_word_embeddings=tie)
        d.pop("full_attention_interval", None)
        d["layer_types"] = _layout(rng, layers, ("linear_attention", "full_attention"), 0.4)
        if k == 0:
            d.update(DELTANET_FITTED)
        else:
            d.update(linear_num_key_heads=rng.choice([1, 2, 4]), linear_key_head_dim=rng.choice([16, 32, 64]),
                     linear_value_head_dim=rng.choice([16, 32, 64]))
            d["linear_num_value_heads"] = d["linear_num_key_heads"] * rng.choice([1, 2])
    pad = d.get("pad_token_id")
    if isinstance(pad, int) and pad >= d["vocab_size"]:
        d["pad_token_id"] = None
    return d


def lora_targets_new(model_type: str, d: dict) -> tuple[list[str], list[str]]:
    """(targets every config of the family has, further targets this config has): peft
    matches module-name suffixes and needs at least one match; fused expert parameters
    (nn.Parameter, not nn.Linear) cannot be targeted."""
    lt = d.get("layer_types") or []
    if model_type == "phi":
        return ["q_proj", "k_proj", "v_proj", "dense"], ["fc1", "fc2"]
    if model_type == "glm4":
        return ATTN, ["gate_up_proj", "down_proj"]
    if model_type in ("gpt_oss", "granitemoe", "olmoe"):
        return ATTN, []
    if model_type == "llama4_text":
        return ATTN, MLP  # the shared expert and the dense layers' MLP
    if model_type == "ernie4_5_moe":
        return ATTN, MLP
    if model_type == "mamba2":
        return ["in_proj", "out_proj"], []
    if model_type == "falcon_h1":
        return ATTN + ["in_proj", "out_proj"], MLP
    if model_type == "jamba":
        always = ["in_proj", "x_proj", "dt_proj", "out_proj"] if d["attn_layer_offset"] != 0 or \
            d["num_hidden_layers"] > 1 and d["attn_layer_period"] > 1 else ATTN
        return always, (ATTN if always[0] == "in_proj" else []) + MLP
    if model_type == "granitemoehybrid":
        mixers = (["in_proj", "out_proj"] if "mamba" in lt else []) + (ATTN if "attention" in lt else [])
        # shared_mlp.input_linear is an nn.Linear, the experts' input_linear is not
        return mixers, [] if d["num_local_experts"] else ["input_linear", "output_linear"]
    if model_type == "qwen3_next":
        mixers = (["in_proj_qkvz", "in_proj_ba", "out_proj"] if "linear_attention" in lt else []) + \
            (ATTN if "full_attention" in lt else [])
        return mixers, MLP  # the shared expert
    return ATTN, MLP


def train_case_new(i: int, seed: int, rng: random.Random, pool: list[tuple[str, str, dict]]) -> dict:
    name, mt, d = rng.choice(pool)
    c: dict = {"id": f"rnd-t{seed}-{i:03d}-{mt.replace('_', '')}", "config": name}
    c["batch"] = rng.randint(1, 6)
    c["seq"] = rng.choice([rng.randint(8, 320), rng.randint(8, 64), 2 * rng.randint(4, 160)])
    c["precision"] = rng.choice(PRECISIONS)
    c["optimizer"] = rng.choice(OPTIMIZERS)
    c["checkpointing"] = rng.random() < 0.3
    # gpt-oss has no SDPA path (attention sinks); Mamba-2 has no attention (the harness's
    # recorded value, which memwall maps to its default)
    c["attention"] = "eager" if mt in ("gpt_oss", "mamba2") else rng.choice(["sdpa", "eager"])
    if rng.random() < 0.3:
        always, more = lora_targets_new(mt, d)
        chosen = [t for t in always + more if rng.random() < 0.5]
        if not set(chosen) & set(always):
            chosen.insert(0, rng.choice(always))
        r = rng.choice([1, 2, 4, 8, 16, 32])
        c["lora"] = {"rank": r, "alpha": rng.choice([r, 2 * r, 16]), "targets": chosen}
    c["grad_accum"] = rng.choice([1, 1, 1, 2, 3])
    c["dropout"] = rng.choice(["config", "off"])
    return c


def infer_case_new(i: int, seed: int, rng: random.Random, pool: list[tuple[str, str, dict]]) -> dict:
    name, mt, _ = rng.choice(pool)
    c: dict = {"id": f"rnd-i{seed}-{i:03d}-{mt.replace('_', '')}", "config": name}
    c["batch"] = rng.randint(1, 5)
    c["prompt"] = rng.choice([rng.randint(4, 300), rng.randint(4, 48)])
    c["new_tokens"] = rng.randint(1, 12)
    c["weights"] = rng.choice(["bf16", "fp16", "fp32"])
    c["attention"] = "eager" if mt in ("gpt_oss", "mamba2") else rng.choice(["sdpa", "eager"])
    if mt in NEW_MOE:
        c["decode_experts"] = rng.choice(["batched_mm", "grouped_mm"])
    return c


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def write_cases(path: Path, header: str, cases: list[dict]) -> None:
    out = [header]
    for c in cases:
        out.append("[[case]]")
        out += [f"{k} = {toml_value(v)}" for k, v in c.items()]
        out.append("")
    path.write_text("\n".join(out))


def write_sources(names: dict[str, str], seed: int) -> None:
    """Replace this seed's rnd- lines of SOURCES.toml where they stand (other lines untouched;
    a new seed's lines go after the last rnd- line)."""
    path = CONFIG_DIR / "SOURCES.toml"
    lines = path.read_text().splitlines()
    mine = [i for i, l in enumerate(lines) if l.startswith(f'"rnd-s{seed}-')]
    rnd = [i for i, l in enumerate(lines) if l.startswith('"rnd-')]
    at = mine[0] if mine else (rnd[-1] + 1 if rnd else len(lines))
    new = [f'"{n}" = "random, seed {seed} (tools/truth/sample_cases.py; widths drawn over {t})"'
           for n, t in sorted(names.items())]
    kept = [l for i, l in enumerate(lines) if i not in set(mine)]
    at -= sum(1 for i in mine if i < at)
    path.write_text("\n".join(kept[:at] + new + kept[at:]) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--train", type=int, default=220, help="training cases to draw")
    ap.add_argument("--infer", type=int, default=70, help="inference cases to draw")
    ap.add_argument("--configs-per-family", type=int, default=2)
    ap.add_argument("--families", choices=["old", "new"], default="old",
                    help="old: TEMPLATES (seed 17's sample); new: the issue-14 NEW_TEMPLATES")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    new = args.families == "new"
    templates = NEW_TEMPLATES if new else TEMPLATES
    pool, names = [], {}
    for mt in sorted(templates):
        for k in range(args.configs_per_family):
            name = f"rnd-s{args.seed}-{mt.replace('_', '')}-{k}"
            d = random_config_new(mt, rng, k) if new else random_config(mt, rng)
            (CONFIG_DIR / f"{name}.json").write_text(json.dumps(d, indent=2) + "\n")
            pool.append((name, mt, d) if new else (name, mt))
            names[name] = templates[mt]
    write_sources(names, args.seed)

    note = (f"# Random truth sample, seed {args.seed}: written by tools/truth/sample_cases.py "
            f"--seed {args.seed} --train {args.train} --infer {args.infer} "
            f"--configs-per-family {args.configs_per_family}"
            + (" --families new" if new else "") + "; do not edit.\n"
            "# Fields and semantics as in {}.toml.\n")
    if new:
        # GatedDeltaNet training only at the fitted shape (other qwen3_next configs: inference)
        trainable = [p for p in pool if p[1] != "qwen3_next" or p[0].endswith("-0")]
        train = [train_case_new(i, args.seed, rng, trainable) for i in range(args.train)]
        infer = [infer_case_new(i, args.seed, rng, pool) for i in range(args.infer)]
    else:
        train = [train_case(i, args.seed, rng, pool) for i in range(args.train)]
        infer = [infer_case(i, args.seed, rng, pool) for i in range(args.infer)]
    stem = "random_new" if new else "random"
    write_cases(CASES_DIR / f"{stem}_train.toml", note.format("train"), train)
    write_cases(CASES_DIR / f"{stem}_infer.toml", note.format("infer"), infer)
    print(f"{len(pool)} configs, {len(train)} training and {len(infer)} inference cases (seed {args.seed})")


if __name__ == "__main__":
    main()
