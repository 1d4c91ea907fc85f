#!/usr/bin/env python3
"""Probe one Qwen3NextGatedDeltaNet (transformers 5.23, torch fallback: torch_chunk_gated_delta_rule,
torch_recurrent_gated_delta_rule, causal_conv1d_fn/update) on fake tensors and print the bytes
memwall's closed forms (crates/memwall-core/src/memory/hf/deltanet.rs) must reproduce.

Every storage allocation and free inside the mixer is logged (as tools/truth/probes/mamba2_mixer.py);
parameters are excluded. Modes: train (forward, ones_like grad, backward), ckpt (forward that
saves nothing), infer (no_grad prefill with a DynamicCache, then one decode step).

Usage: python tools/truth/probes/deltanet_mixer.py B S MODE bf16|fp32 h,Hk,Hv,dk,dv,K [trace]
"""
import sys, weakref, torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import AutoConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet


def run(B, S, mode, dtype, dims):
    h, Hk, Hv, dk, dv, K = dims
    cfg = AutoConfig.for_model("qwen3_next", hidden_size=h, linear_num_key_heads=Hk,
        linear_num_value_heads=Hv, linear_key_head_dim=dk, linear_value_head_dim=dv,
        linear_conv_kernel_dim=K, num_hidden_layers=1, layer_types=["linear_attention"],
        vocab_size=10, num_experts=0)
    live, ev, cur = {}, [], [0]
    def reg(t, op):
        st = t.untyped_storage(); k = st._cdata
        if k in live or k in params: return
        n = st.nbytes(); live[k] = (n, tuple(t.shape)); cur[0] += n
        ev.append(("+", op, n, cur[0], tuple(t.shape), str(t.dtype)))
        def fin(k=k, n=n, op=op):
            if live.pop(k, None) is not None:
                cur[0] -= n; ev.append(("-", op, n, cur[0]))
        weakref.finalize(st, fin)
    class M(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor): reg(t, str(func.overloadpacket.__name__))
            return out
    with FakeTensorMode():
        torch.set_default_dtype(dtype)
        mx = Qwen3NextGatedDeltaNet(cfg, 0)
        torch.set_default_dtype(torch.float32)
        params = {p.untyped_storage()._cdata for p in mx.parameters()}
        if mode == "train":
            mx.train()
            x = torch.randn(B, S, h, dtype=dtype, requires_grad=True)
            with M():
                y = mx(x)
                ev.append(("MARK", "fwd"))
                g = torch.ones_like(y)
                ev.append(("MARK", "gy"))
                y.backward(g); del y, g
                ev.append(("MARK", "bwd"))
        elif mode == "ckpt":
            mx.train()
            x = torch.randn(B, S, h, dtype=dtype, requires_grad=True)
            with M(), torch.autograd.graph.saved_tensors_hooks(lambda t: None, lambda t: None):
                y = mx(x); ev.append(("MARK", "fwd")); del y
        else:
            mx.eval()
            from transformers import DynamicCache
            cache = DynamicCache(config=cfg)
            x = torch.randn(B, S, h, dtype=dtype)
            with M(), torch.no_grad():
                y = mx(x, cache_params=cache); ev.append(("MARK", "prefill")); del y
                x1 = torch.randn(B, 1, h, dtype=dtype)
                y = mx(x1, cache_params=cache); ev.append(("MARK", "decode")); del y
    return ev


def marks(ev):
    cur = pk = 0
    out = {}
    for e in ev:
        if e[0] == "MARK":
            out[e[1]] = (cur, pk)
            pk = cur
            continue
        cur = e[3]
        pk = max(pk, cur)
    return out


if __name__ == "__main__":
    B, S, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[4]]
    dims = tuple(int(v) for v in sys.argv[5].split(","))
    ev = run(B, S, mode, dt, dims)
    if sys.argv[6:7] == ["trace"]:
        for e in ev: print(*e)
    print(marks(ev))
