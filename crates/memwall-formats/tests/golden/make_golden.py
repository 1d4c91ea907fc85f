"""Regenerate tests/golden/param_counts.json from transformers itself.

Run: /work/venvs/truth/bin/python crates/memwall-formats/tests/golden/make_golden.py

For every config under tests/configs/ it instantiates the causal LM on the meta device
(AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)); Gemma3ForCausalLM on
`text_config` for multimodal gemma3) and counts `model.parameters()` (tied weights once,
buffers excluded), split by parameter name into embeddings / layers / final_norm / lm_head.
"""
import json, pathlib, re, sys
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM

HERE = pathlib.Path(__file__).resolve().parent
CONFIGS = HERE.parent / "configs"
LAYER = re.compile(r"\.(layers|h)\.\d+\.")
DROP = ("quantization_config", "auto_map")


def split(model):
    out = {"embeddings": 0, "layers": 0, "final_norm": 0, "lm_head": 0}
    for name, p in model.named_parameters():  # deduplicates tied parameters
        n = p.numel()
        if LAYER.search(name):
            out["layers"] += n
        elif name.startswith("lm_head"):
            out["lm_head"] += n
        elif re.search(r"(^|\.)(norm|ln_f|final_layer_norm|final_layernorm)\.", name):
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
        if cfg["model_type"] == "gemma3":
            text = dict(cfg["text_config"])
            text.pop("model_type", None)
            config = transformers.Gemma3TextConfig(**text)
            model = transformers.Gemma3ForCausalLM(config)
        else:
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    row = {"file": path.name, "model_type": cfg["model_type"], **split(model)}
    print(row, file=sys.stderr)
    rows.append(row)

(HERE / "param_counts.json").write_text(
    json.dumps({"transformers": transformers.__version__, "rows": rows}, indent=1) + "\n"
)
