"""The allocation tracer the mixer probes share (mamba1_mixer.py, mamba2_mixer.py,
deltanet_mixer.py, falcon_h1_mixer.py).

Every storage allocation and free inside one mixer is logged on fake tensors: a
TorchDispatchMode registers each op's output storages, weakref finalizers log their frees;
the mixer's parameters (and, on request, its buffers) are excluded. Events:
`("+", op, bytes, live, shape, dtype)`, `("-", op, bytes, live, shape, dtype)` (the freed
storage's first shape), `("MARK", name)`.
Modes: `train` (forward, ones_like grad, backward), `train-cache` (the same with a
DynamicCache passed as the model passes it with `use_cache` on, dropped after the forward), `ckpt` (forward under saved_tensors_hooks
that keep nothing: a checkpointed layer's first pass), `infer` (no_grad prefill with a
DynamicCache, then one decode step).
"""
import contextlib
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def trace(make, cfg, mode, B, S, h, dtype, autocast=None, skip_buffers=False, setup=None,
          input_grad=True):
    """Events of one mixer built by `make()` (under `dtype` as the default dtype) on a
    `[B, S, h]` input; `autocast` (a dtype) runs the forward under CPU autocast; `setup(mixer,
    events)`, when given, runs after the mixer is built (to register hooks that add MARKs, freeze
    parameters); `input_grad=False` gives the training input no gradient."""
    live, ev, cur = {}, [], [0]
    skip = set()

    def reg(t, op):
        st = t.untyped_storage(); k = st._cdata
        if k in live or k in skip: return
        n = st.nbytes(); live[k] = (n, tuple(t.shape)); cur[0] += n
        shape, dt = tuple(t.shape), str(t.dtype)
        ev.append(("+", op, n, cur[0], shape, dt))
        def fin(k=k, n=n, op=op, shape=shape, dt=dt):
            if live.pop(k, None) is not None:
                cur[0] -= n; ev.append(("-", op, n, cur[0], shape, dt))
        weakref.finalize(st, fin)

    class M(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor): reg(t, str(func.overloadpacket.__name__))
            return out

    amp = ((lambda: torch.autocast("cpu", dtype=autocast)) if autocast is not None
           else contextlib.nullcontext)
    with FakeTensorMode():
        torch.set_default_dtype(dtype)
        mx = make()
        torch.set_default_dtype(torch.float32)
        skip |= {p.untyped_storage()._cdata for p in mx.parameters()}
        if setup is not None:
            setup(mx, ev)
        if skip_buffers:
            skip |= {b.untyped_storage()._cdata for b in mx.buffers()}
        if mode in ("train", "train-cache"):
            mx.train()
            x = torch.randn(B, S, h, dtype=dtype, requires_grad=input_grad)
            cache = None
            if mode == "train-cache":
                # the training forward with `use_cache` on (the model builds a DynamicCache and
                # passes it as `cache_params`); the cache goes with the model output, before the
                # backward (a loop that keeps only the loss, tools/truth/measure.py)
                from transformers import DynamicCache
                cache = DynamicCache(config=cfg)
            with M():
                with amp():
                    y = mx(x) if cache is None else mx(x, cache_params=cache)
                ev.append(("MARK", "fwd"))
                del cache
                ev.append(("MARK", "cache"))
                g = torch.ones_like(y)
                ev.append(("MARK", "gy"))
                y.backward(g); del y, g
                ev.append(("MARK", "bwd"))
        elif mode == "ckpt":
            mx.train()
            x = torch.randn(B, S, h, dtype=dtype, requires_grad=True)
            with M(), torch.autograd.graph.saved_tensors_hooks(lambda t: None, lambda t: None):
                with amp():
                    y = mx(x)
                ev.append(("MARK", "fwd")); del y
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
    """(live bytes, peak since the previous mark) at each MARK."""
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
