#!/usr/bin/env python3
"""Probe one MambaMixer (Mamba-1; transformers 5.23 `models/mamba/modeling_mamba.py`, torch
path: `causal_conv1d_fn`'s F.conv1d fallback and `mamba_selective_scan`'s sequential loop) on
fake tensors and check memwall's closed forms (crates/memwall-core/src/memory/hf/mamba1.rs).

Every storage allocation and free inside the mixer is logged (a TorchDispatchMode registers each
op's output storages, weakref finalizers log their frees); parameters are excluded. Modes:
`train` (forward, ones_like grad, backward), `ckpt` (forward under saved_tensors_hooks that keep
nothing: a checkpointed layer's first pass), `infer` (no_grad prefill with a DynamicCache, then
one decode step).

Usage:
  python tools/truth/probes/mamba1_mixer.py B S MODE bf16|fp32 h,I,N,R,K   # print the trace
  python tools/truth/probes/mamba1_mixer.py --marks B S MODE bf16|fp32 h,I,N,R,K
  python tools/truth/probes/mamba1_mixer.py --fit MODE COUNT [--jamba]
      # COUNT random shapes (batch 1-4, 3-9 tokens, small widths), both dtypes; fits each
      # measured quantity as an integer combination of monomials (T·I·N, B·I·N, T·I, ...),
      # per dtype and batch 1 / batch > 1, and prints the fit and its largest error (0 = the
      # closed form holds exactly). memwall's forms in memory/hf/mamba1.rs were read off
      # these fits and the traces.
"""
import sys, weakref, torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import AutoConfig
from transformers.models.mamba.modeling_mamba import MambaMixer


JAMBA = False  # set by --jamba: JambaMambaMixer (MambaMixer + RMSNorms on dt, B and C)


def run(B, S, mode, dtype, dims):
    h, I, N, R, K = dims
    if JAMBA:
        from transformers.models.jamba.modeling_jamba import JambaMambaMixer
        cfg = AutoConfig.for_model("jamba", hidden_size=h, mamba_expand=I // h, mamba_d_state=N,
                                   mamba_dt_rank=R, mamba_d_conv=K, num_hidden_layers=1,
                                   vocab_size=10, num_attention_heads=1, num_key_value_heads=1)
        make = lambda: JambaMambaMixer(cfg, 0)
    else:
        cfg = AutoConfig.for_model("mamba", hidden_size=h, expand=I // h, state_size=N,
                                   time_step_rank=R, conv_kernel=K, num_hidden_layers=1,
                                   vocab_size=10)
        make = lambda: MambaMixer(cfg, 0, initialize_mixer_weights=False)
    live, ev, cur = {}, [], [0]

    def reg(t, op):
        st = t.untyped_storage(); k = st._cdata
        if k in live or k in params: return
        n = st.nbytes(); live[k] = (n, tuple(t.shape)); cur[0] += n
        ev.append(("+", op, n, cur[0], tuple(t.shape)))

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
        mx = make()
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


if "--jamba" in sys.argv:
    sys.argv.remove("--jamba")
    JAMBA = True

if __name__ == "__main__" and sys.argv[1:2] == ["--marks"]:
    B, S, mode = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[5]]
    dims = tuple(int(v) for v in sys.argv[6].split(","))
    print(marks(run(B, S, mode, dt, dims)))
elif __name__ == "__main__" and sys.argv[1:2] != ["--fit"]:
    B, S, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[4]]
    dims = tuple(int(v) for v in sys.argv[5].split(","))  # h,I,N,R,K
    for e in run(B, S, mode, dt, dims): print(*e)


def fit(mode, count):
    import random
    import numpy as np
    random.seed(1)
    mon = ["TIN", "BIN", "TI", "TN", "TR", "Th", "BI", "BIK", "IN", "I", "hI", "IR", "IK", "one", "B", "T"]

    def mons(B, S, h, I, N, R, K):
        T = B * S
        v = dict(TIN=T*I*N, BIN=B*I*N, TI=T*I, TN=T*N, TR=T*R, Th=T*h, BI=B*I, BIK=B*I*K, IN=I*N,
                 I=I, hI=h*I, IR=I*R, IK=I*K, one=1, B=B, T=T)
        return [v[m] for m in mon]
    rows = {}
    for _ in range(count):
        B = random.choice([1, 1, 2, 3, 4]); S = random.randint(3, 9)
        h = random.randint(3, 17); I = h * random.choice([1, 2, 3]); N = random.randint(1, 7)
        R = random.randint(1, 6); K = random.randint(2, 5)
        for dt, s in ((torch.bfloat16, 2), (torch.float32, 4)):
            m = marks(run(B, S, mode, dt, (h, I, N, R, K)))
            T = B * S
            if mode == "train":
                q = dict(saved=m["fwd"][0] - 2*T*h*s - T*I*s - 2*T*I*s,
                         fwd_peak=m["fwd"][1] - T*h*s - 2*T*I*s,
                         bwd_peak=m["bwd"][1] - m["gy"][0] - h*I*s)
            elif mode == "ckpt":
                q = dict(no_save_peak=m["fwd"][1] - T*h*s - 2*T*I*s)
            else:
                q = dict(prefill_end=m["prefill"][0], prefill_peak=m["prefill"][1],
                         decode_peak=m["decode"][1])
            rows.setdefault((s, B > 1), []).append((mons(B, S, h, I, N, R, K), q))
    for key, rs in sorted(rows.items()):
        X = np.array([r[0] for r in rs], dtype=float)
        for qn in rs[0][1]:
            y = np.array([r[1][qn] for r in rs], dtype=float)
            c = np.round(np.linalg.lstsq(X, y, rcond=None)[0] * 4) / 4
            err = np.abs(X @ c - y).max()
            terms = " + ".join(f"{v:g}*{n}" for v, n in zip(c, mon) if v != 0)
            print(f"{'bf16' if key[0] == 2 else 'fp32'} batch{'>1' if key[1] else '=1'} {qn}: "
                  f"max error {err:g}: {terms}")


if __name__ == "__main__" and sys.argv[1:2] == ["--fit"]:
    fit(sys.argv[2], int(sys.argv[3]))
