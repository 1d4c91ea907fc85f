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
  python tools/truth/measure.py --cases tools/truth/cases/random_train.toml \
      --out tests/truth/random_train.jsonl --jobs 1 --per-worker 10
  python tools/truth/measure_infer.py --cases tools/truth/cases/random_infer.toml \
      --out tests/truth/random_infer.jsonl --jobs 1 --per-worker 10

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
    """Replace the rnd- lines of SOURCES.toml (other lines untouched)."""
    path = CONFIG_DIR / "SOURCES.toml"
    kept = [l for l in path.read_text().splitlines() if not l.startswith('"rnd-')]
    kept += [f'"{n}" = "random, seed {seed} (tools/truth/sample_cases.py; widths drawn over {t})"'
             for n, t in sorted(names.items())]
    path.write_text("\n".join(kept) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--train", type=int, default=220, help="training cases to draw")
    ap.add_argument("--infer", type=int, default=70, help="inference cases to draw")
    ap.add_argument("--configs-per-family", type=int, default=2)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    pool, names = [], {}
    for mt in sorted(TEMPLATES):
        for k in range(args.configs_per_family):
            name = f"rnd-s{args.seed}-{mt.replace('_', '')}-{k}"
            d = random_config(mt, rng)
            (CONFIG_DIR / f"{name}.json").write_text(json.dumps(d, indent=2) + "\n")
            pool.append((name, mt))
            names[name] = TEMPLATES[mt]
    write_sources(names, args.seed)

    note = (f"# Random truth sample, seed {args.seed}: written by tools/truth/sample_cases.py "
            f"--seed {args.seed} --train {args.train} --infer {args.infer} "
            f"--configs-per-family {args.configs_per_family}; do not edit.\n"
            "# Fields and semantics as in {}.toml.\n")
    train = [train_case(i, args.seed, rng, pool) for i in range(args.train)]
    infer = [infer_case(i, args.seed, rng, pool) for i in range(args.infer)]
    write_cases(CASES_DIR / "random_train.toml", note.format("train"), train)
    write_cases(CASES_DIR / "random_infer.toml", note.format("infer"), infer)
    print(f"{len(pool)} configs, {len(train)} training and {len(infer)} inference cases (seed {args.seed})")


if __name__ == "__main__":
    main()
