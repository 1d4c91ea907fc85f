"""Regenerate tests/transformers_counts.json: exact parameter counts of every catalogue entry.

Run: /work/venvs/truth/bin/python crates/memwall-catalog/tests/make_golden.py

Counts come from transformers itself on the meta device:
AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)) (vision-language wrappers:
AutoModelForImageTextToText, vision tower included), sum(p.numel() for p in model.parameters()).
"""
import json, pathlib, tomllib
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE.parents[2] / "data" / "models"
index = tomllib.loads((DATA / "index.toml").read_text())
counts = {}
for m in index.get("model", []):
    cfg = json.loads((DATA / m["file"]).read_text())
    for k in ("quantization_config", "auto_map"):
        cfg.pop(k, None)
    try:
        with torch.device("meta"):
            if cfg["model_type"] in ("gemma3", "llama4", "mistral3", "qwen2_vl", "qwen2_5_vl"):
                model = transformers.AutoModelForImageTextToText.from_config(AutoConfig.for_model(**cfg))
            else:
                model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    except Exception as e:  # transformers itself cannot build it: recorded as null
        print(m["id"], "transformers cannot build it:", str(e)[:120])
        counts[m["id"]] = None
        continue
    counts[m["id"]] = sum(p.numel() for p in model.parameters())
    print(m["id"], counts[m["id"]])
(HERE / "transformers_counts.json").write_text(
    json.dumps({"transformers": transformers.__version__, "counts": counts}, indent=1, sort_keys=True) + "\n"
)
