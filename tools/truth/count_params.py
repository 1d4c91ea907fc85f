#!/usr/bin/env python3
"""Count parameters of every config in data/models/index.toml and tests/truth/configs/ by
instantiating the model on the meta device, and write tests/truth/params.jsonl.

Each line: {"file": <path relative to repo>, "model_type": ..., "class": ..., "params_total": int,
            "by_name_prefix": {"embed": .., "layers": .., "final_norm": .., "lm_head": .., "other": ..}}
Parameters are de-duplicated (a tied lm_head shares the embedding and is counted once, under
"embed"; "lm_head" only appears when untied).  Vision-language configs (gemma3, llama4,
mistral3, qwen2_vl, qwen2_5_vl) are counted with AutoModelForImageTextToText; their vision
tower + projector is the "vision" group (noted as "note" in the line).

Usage: python tools/truth/count_params.py
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests/truth/params.jsonl"


def config_files() -> list[Path]:
    files = []
    index = REPO / "data/models/index.toml"
    if index.exists():
        doc = tomllib.loads(index.read_text())
        for m in doc.get("model", []):
            f = REPO / "data/models" / m["file"]
            if f.exists():
                files.append(f)
            else:
                print(f"index entry without file: {m['file']}", file=sys.stderr)
    files += sorted((REPO / "tests/truth/configs").glob("*.json"))
    return files


EMBED_RE = re.compile(r"(^|\.)(embed_tokens|wte|wpe|embed_in|word_embeddings|embed_positions|project_in|embeddings)(\.|$)")
LAYERS_RE = re.compile(r"(^|\.)(layers|h|blocks|layer)\.\d+\.")
NORM_RE = re.compile(r"(^|\.)(norm|norm_f|ln_f|final_layer_norm|final_layernorm|final_norm)\.")
HEAD_RE = re.compile(r"(^|\.)(lm_head|embed_out)\.")


# vision-language wrappers (counted as AutoModelForImageTextToText)
VLM = ("gemma3", "llama4", "mistral3", "qwen2_vl", "qwen2_5_vl")


def group(name: str) -> str:
    if HEAD_RE.search(name):
        return "lm_head"
    if LAYERS_RE.search(name):
        return "layers"
    if EMBED_RE.search(name):
        return "embed"
    if NORM_RE.search(name):
        return "final_norm"
    return "other"


def count(path: Path) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = json.loads(path.read_text())
    note = None
    model_type = d.pop("model_type")
    vlm = model_type in VLM
    cfg = AutoConfig.for_model(model_type, **d)
    with torch.device("meta"):
        if vlm:
            from transformers import AutoModelForImageTextToText

            model = AutoModelForImageTextToText.from_config(cfg)
            note = "vision-language config: counted with its image-text-to-text class; vision = everything outside the language model and the LM head"
        else:
            model = AutoModelForCausalLM.from_config(cfg)
    groups = {"embed": 0, "layers": 0, "final_norm": 0, "lm_head": 0, "other": 0}
    if vlm:
        groups["vision"] = 0
    other_names = []
    # named_parameters() de-duplicates shared (tied) parameters, keeping the first name
    for name, p in model.named_parameters():
        g = "vision" if vlm and not ("language_model" in name or HEAD_RE.search(name)) else group(name)
        groups[g] += p.numel()
        if g == "other":
            other_names.append(name)
    if groups["lm_head"] == 0:
        del groups["lm_head"]
    row = {
        "file": str(path.relative_to(REPO)),
        "model_type": cfg.model_type,
        "class": type(model).__name__,
        "params_total": int(sum(groups.values())),
        "by_name_prefix": {k: int(v) for k, v in groups.items()},
    }
    if other_names:
        row["other_names"] = other_names[:20]
    if note:
        row["note"] = note
    return row


def main() -> None:
    rows = []
    for f in config_files():
        try:
            rows.append(count(f))
            print(f"{rows[-1]['file']}: {rows[-1]['params_total']:,}")
        except Exception as e:  # noqa: BLE001
            print(f"FAIL {f}: {type(e).__name__}: {e}", file=sys.stderr)
            rows.append({"file": str(f.relative_to(REPO)), "error": f"{type(e).__name__}: {e}"})
    rows.sort(key=lambda r: r["file"])
    fd, tmp = tempfile.mkstemp(dir=OUT.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, OUT)


if __name__ == "__main__":
    main()
