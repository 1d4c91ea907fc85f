"""Which storages are alive at the backward peak of one checkpointed Qwen2-VL vision block
with frozen weights and an input that requires grad (debugging aid, real CPU tensors).

    $PY tools/truth/probes/qwen2vl_vision_block.py 2048 sdpa    # P patches, sdpa | eager

What `enable_input_require_grads` makes of the tower under gradient checkpointing (issue 14):
the block (Qwen2-VL-7B's widths: 1280, 16 heads, MLP 5120, bf16) runs under a non-reentrant
checkpoint, then backward from a random output gradient; a dispatch mode tracks every storage an
op creates and prints the live set at the backward's peak, in [P, E] and [P, MLP] units.  Used
for memory/hf/vision.rs (helper 18): SDPA peaks at the quick-GELU product's backward with the
recomputed block's saved tensors (qkv output, q, k, the SDPA output, the residual, fc1's output
and the sigmoid) and one [P, E] + three [P, MLP] gradients (AddBackward hands one gradient to
both operands); eager at the softmax backward with three fp32 [heads, P, P] tensors, the qkv
output already released (the value is saved by the second matmul only).  Not a measurement
(measure.py is).
"""
import sys, weakref, torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLVisionBlock, Qwen2VLVisionConfig
P = int(sys.argv[1]); attn = sys.argv[2] if len(sys.argv) > 2 else "sdpa"
cfg = Qwen2VLVisionConfig(embed_dim=1280, num_heads=16, mlp_ratio=4, depth=1)
cfg._attn_implementation = attn
blk = Qwen2VLVisionBlock(cfg).to(torch.bfloat16).train()
for p in blk.parameters(): p.requires_grad_(False)
params = {id(p.untyped_storage()) for p in blk.parameters()}
live = {}; peak = {"bytes": 0}; phase = ["fw"]
class Track(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                st = o.untyped_storage(); key = id(st)
                if key not in live and key not in params:
                    live[key] = (weakref.ref(st), st.nbytes(), f"{phase[0]} {func} {tuple(o.shape)} {o.dtype}")
        for k in [k for k, v in live.items() if v[0]() is None]: del live[k]
        total = sum(v[1] for v in live.values())
        if phase[0] == "bw" and total > peak["bytes"]:
            peak.update(bytes=total, op=f"{func}", top=sorted(((v[1], v[2]) for v in live.values()), reverse=True))
        return out
hd = 80
with Track():
    x = torch.randn(P, 1280, dtype=torch.bfloat16).requires_grad_(True)
    cos = torch.randn(P, hd); sin = torch.randn(P, hd)
    cu = torch.tensor([0, P], dtype=torch.int32)
    y = checkpoint(blk, x, cu, (cos, sin), use_reentrant=False)
    g = torch.randn_like(y)
    base = sum(v[1] for v in live.values())
    print("before bw live", base)
    phase[0] = "bw"
    y.backward(g)
print("peak", peak["bytes"], "at", peak["op"], "above base", peak["bytes"] - base)
PE = P*1280*2; PM = P*5120*2
for b, d in peak["top"][:25]: print(f"{b:>12} {b/PE:6.2f}PE {b/PM:5.2f}PM  {d}")
