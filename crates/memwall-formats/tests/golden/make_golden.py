"""Regenerate tests/golden/param_counts.json from transformers itself.

Run: /work/venvs/truth/bin/python crates/memwall-formats/tests/golden/make_golden.py

For every config under tests/configs/ it instantiates the causal LM on the meta device
(AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)); for vision-language wrappers
AutoModelForImageTextToText) and counts `model.parameters()` (tied weights once, buffers
excluded), split by parameter name into embeddings / layers / final_norm / lm_head (+ vision:
everything outside the language model and the LM head).
"""
import json, pathlib, re, sys
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = pathlib.Path(__file__).resolve().parent
CONFIGS = HERE.parent / "configs"
LAYER = re.compile(r"\.(layers|h)\.\d+\.")
DROP = ("quantization_config", "auto_map")


# vision-language wrappers: counted as transformers' image-text-to-text class; parameters
# outside the language model and the LM head are the vision tower + projector ("vision")
VLM = ("gemma3", "llama4", "mistral3", "qwen2_vl", "qwen2_5_vl")


def is_text(name):
    return "language_model" in name or re.search(r"(^|\.)lm_head\.", name)


def split(model, vlm=False):
    out = {"embeddings": 0, "layers": 0, "final_norm": 0, "lm_head": 0}
    if vlm:
        out["vision"] = 0
    for name, p in model.named_parameters():  # deduplicates tied parameters
        n = p.numel()
        if vlm and not is_text(name):
            out["vision"] += n
        elif LAYER.search(name):
            out["layers"] += n
        elif re.search(r"(^|\.)lm_head\.", name):
            out["lm_head"] += n
        elif re.search(r"(^|\.)(norm|norm_f|ln_f|final_layer_norm|final_layernorm)\.", name):
            out["final_norm"] += n
        else:
            out["embeddings"] += n
    out["total"] = sum(p.numel() for p in model.parameters())
    assert out["total"] == sum(v for k, v in out.items() if k != "total"), out
    return out


rows = []
for path in sorted(CONFIGS.glob("*.json")):
    cfg = json.loads(path.read_text())
    for k in DROP:
        cfg.pop(k, None)
    with torch.device("meta"):
        vlm = cfg["model_type"] in VLM
        if vlm:
            model = transformers.AutoModelForImageTextToText.from_config(AutoConfig.for_model(**cfg))
        else:
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    row = {"file": path.name, "model_type": cfg["model_type"], **split(model, vlm)}
    print(row, file=sys.stderr)
    rows.append(row)

(HERE / "param_counts.json").write_text(
    json.dumps({"transformers": transformers.__version__, "rows": rows}, indent=1) + "\n"
)
