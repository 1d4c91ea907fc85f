#!/usr/bin/env python3
"""Draw a random sample of distributed-training truth cases (one rank of FSDP2 / HSDP / DDP /
composable ``replicate`` on a fake process group), deterministically from a seed.

The hand-picked distributed fixtures (tools/truth/cases/dist.toml) vary one option at a time
around a few baselines, mostly on Llama and Qwen 2 shapes.  This script crosses every option
``measure_dist.py`` supports at random, over the random small configs of the older families
that ``sample_cases.py --seed 17`` wrote (tests/truth/configs/rnd-s17-*.json): strategy, world
size (uneven shards: 3, 5, 6), FSDP2 resharding (decoder layers and root), FSDP2 mixed precision
(fp32 model, bf16 parameters), model dtype, batch, odd sequence lengths, optimizer,
checkpointing, attention implementation, dropout, LoRA under FSDP2 (the family's real target
names), DDP bucket views.

Usage (stdlib only, no torch: the same seed always gives the same file):
  python tools/truth/sample_dist_cases.py --seed 41 --cases 48
  python tools/truth/measure_dist.py --cases tools/truth/cases/random_dist.toml \\
      --out tests/truth/random_dist.jsonl --jobs 1
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "tests/truth/configs"
OUT = REPO / "tools/truth/cases/random_dist.toml"

sys.path.insert(0, str(Path(__file__).resolve().parent))
# LoRA target module names per model type (peft matches module-name suffixes)
from sample_cases import DENSE_TARGETS, LORA_TARGETS  # noqa: E402


# Config pools: "old" is the seed-17 sample's configs (the older families; seed 41's draw);
# "new" the issue-14 families' random configs (seeds 29, 53, 61, 67 and 79 of sample_cases.py
# --families new).
POOLS = {"old": ["rnd-s17-*.json"],
         "new": ["rnd-s29-*.json", "rnd-s53-*.json", "rnd-s61-*.json", "rnd-s67-*.json",
                 "rnd-s79-*.json"]}


def draw(seed: int, n: int, pool: str = "old") -> list[dict]:
    rng = random.Random(seed)
    configs = sorted(p.stem for g in POOLS[pool] for p in CONFIG_DIR.glob(g))
    # seed 41 (the first draw) keeps its ids; later draws carry their seed
    prefix = "rdist" if seed == 41 else f"rdist{seed}"
    out = []
    for i in range(n):
        config = rng.choice(configs)
        family = config.split("-")[2]
        model_type = json.loads((CONFIG_DIR / f"{config}.json").read_text())["model_type"]
        strategy = rng.choice(["fsdp", "fsdp", "fsdp", "hsdp", "ddp", "replicate"])
        case = {"id": f"{prefix}-{i:03d}-{family}", "config": config, "strategy": strategy,
                "world_size": rng.choice([2, 3, 4, 5, 6, 8])}
        if strategy == "hsdp":
            case["world_size"] = rng.choice([4, 6, 8])
            case["replicate"] = 2
        if strategy == "fsdp":
            case["reshard_after_forward"] = rng.random() < 0.7
            if rng.random() < 0.3:
                case["root_reshard_after_forward"] = rng.random() < 0.5
        if strategy in ("fsdp", "hsdp") and rng.random() < 0.35:
            case["precision"] = "fp32"
            case["mixed_precision"] = {"param_dtype": "bf16", "reduce_dtype": "fp32"}
        else:
            case["precision"] = rng.choice(["bf16", "bf16", "fp32", "fp16"])
        case["batch"] = rng.randint(1, 4)
        case["seq"] = rng.choice([rng.randint(16, 700), rng.choice([64, 128, 256, 512])])
        case["optimizer"] = rng.choice(["adamw-forloop", "sgd", "adamw"])
        case["checkpointing"] = rng.random() < 0.35
        case["attention"] = rng.choice(["sdpa", "sdpa", "eager"])
        if model_type in ("gemma2", "gpt_oss", "mamba2"):
            # the harness runs Gemma 2 and gpt-oss eager only; Mamba-2 has no attention
            # (transformers refuses sdpa for it)
            case["attention"] = "eager"
        case["dropout"] = rng.choice(["config", "off"])
        if strategy == "fsdp" and rng.random() < 0.3:
            case["lora"] = {"rank": rng.choice([4, 8, 16]),
                            "targets": LORA_TARGETS.get(model_type, DENSE_TARGETS)}
        if strategy == "ddp":
            case["gradient_as_bucket_view"] = rng.random() < 0.5
        out.append(case)
    return out


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    return str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=41)
    ap.add_argument("--cases", type=int, default=48)
    ap.add_argument("--pool", choices=sorted(POOLS), default="old",
                    help="old: the seed-17 configs (seed 41's draw); new: the issue-14 families'")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    lines = [
        "# Random distributed-training truth cases: drawn by tools/truth/sample_dist_cases.py "
        f"--seed {args.seed} --cases {args.cases}"
        + (f" --pool {args.pool}" if args.pool != "old" else "")
        + " (do not edit; draw again).",
        "# Fields as in tools/truth/cases/dist.toml; measured into tests/truth/random_dist.jsonl.",
        "",
    ]
    for case in draw(args.seed, args.cases, args.pool):
        lines.append("[[case]]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in case.items())
        lines.append("")
    args.out.write_text("\n".join(lines))
    print(f"{args.cases} cases -> {args.out}")


if __name__ == "__main__":
    main()
