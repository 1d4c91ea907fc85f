"""Regenerate tests/transformers_counts.json: exact parameter counts of every catalogue entry.

Run: /work/venvs/truth/bin/python crates/memwall-catalog/tests/make_golden.py

Counts come from transformers itself on the meta device:
AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)) (Gemma3ForCausalLM on
`text_config` for multimodal gemma3), sum(p.numel() for p in model.parameters()).
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
            if cfg["model_type"] == "gemma3":
                text = dict(cfg["text_config"]); text.pop("model_type", None)
                model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**text))
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
