"""Live storages op by op through one RMSNorm's forward and backward (debugging aid).

    $PY tools/truth/probes/rmsnorm_backward.py llama|gemma|olmo2 float16|bfloat16|float32 [frozen]

Runs the transformers norm module on real CPU tensors (rows 512 x dim 256) with an input
that requires grad, then backward with a given gradient, under a dispatch mode that tracks
every storage an op creates and prints the live bytes (excluding the parameter, the input and
the incoming gradient) after each op in units of one fp32 [rows, dim] tensor.  Not a
measurement; it shows how many row-sized temporaries the decomposed backward holds at once.
"""
import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

kind, dtype_name = sys.argv[1:3]
frozen = len(sys.argv) > 3 and sys.argv[3] == "frozen"
dtype = getattr(torch, dtype_name)
rows, dim = 512, 256
unit = rows * dim * 4
if kind == "llama":
    from transformers.models.llama.modeling_llama import LlamaRMSNorm as N
elif kind == "gemma":
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm as N
else:
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm as N
norm = N(dim).to(dtype)
norm.weight.requires_grad_(not frozen)
x = torch.randn(rows, dim, dtype=dtype, requires_grad=True)
g = torch.randn(rows, dim, dtype=dtype)
skip = {id(t.untyped_storage()) for t in (x, g, norm.weight)}
live: dict[int, tuple] = {}
peak = {"fw": 0.0, "bw": 0.0}
phase = ["fw"]


class Track(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                st = o.untyped_storage()
                if id(st) not in live and id(st) not in skip:
                    live[id(st)] = (weakref.ref(st), st.nbytes(), f"{func}")
        for k in [k for k, v in live.items() if v[0]() is None]:
            del live[k]
        total = sum(v[1] for v in live.values()) / unit
        peak[phase[0]] = max(peak[phase[0]], total)
        print(f"{phase[0]} {total:6.3f}  {func} {[ (tuple(o.shape), o.dtype) for o in (out if isinstance(out,(tuple,list)) else (out,)) if isinstance(o, torch.Tensor)]}")
        return out


with Track():
    y = norm(x)
    print("--- backward")
    phase[0] = "bw"
    y.backward(g)
print(f"peak units: forward {peak['fw']:.3f}, backward {peak['bw']:.3f}")
