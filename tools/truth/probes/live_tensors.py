"""Which tensors are alive at the activation peak of one inference forward (debugging aid).

    $PY tools/truth/probes/live_tensors.py tests/truth/configs/gemma-3-1b.json 4 2048 eager bfloat16

Builds the model from the config on fake CPU tensors (no weights, no GPU), runs one prefill
forward like measure_infer.py (no_grad, DynamicCache, logits_to_keep=1) under a dispatch mode
that tracks every storage an op creates, and prints the op at which the non-parameter live
bytes peak and the largest storages alive there.  Not a measurement (measure_infer.py is);
it tells which tensor a disagreement is about.  Used to find the Falcon / sliding-window masks
and the CPU math-kernel locals.
"""
import sys
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

cfg_path, batch, seq, attn, dtype_name = sys.argv[1:6]
batch, seq, dtype = int(batch), int(seq), getattr(torch, dtype_name)
cfg = AutoConfig.from_pretrained(cfg_path)
live: dict[int, tuple] = {}  # id(storage) -> (weakref, bytes, what made it)
peak = {"bytes": 0, "op": None, "top": []}


class Track(TorchDispatchMode):
    def __init__(self, param_storages: set[int]) -> None:
        super().__init__()
        self.params = param_storages

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                st = o.untyped_storage()
                key = id(st)
                if key not in live and key not in self.params:
                    live[key] = (weakref.ref(st), st.nbytes(), f"{func} {tuple(o.shape)} {o.dtype}")
        for key in [k for k, v in live.items() if v[0]() is None]:
            del live[key]
        total = sum(v[1] for v in live.values())
        if total > peak["bytes"]:
            peak.update(bytes=total, op=str(func),
                        top=sorted(((v[1], v[2]) for v in live.values()), reverse=True)[:30])
        return out


with FakeTensorMode():
    torch.set_default_dtype(dtype)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=dtype).eval()
    params = {id(t.untyped_storage()) for t in list(model.parameters()) + list(model.buffers())}
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    cache = DynamicCache(config=cfg)
    with torch.no_grad(), Track(params):
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
print(f"peak of non-parameter live bytes: {peak['bytes']} at {peak['op']}")
for nbytes, what in peak["top"]:
    print(f"{nbytes:>14d}  {what}")
