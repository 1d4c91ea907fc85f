#!/usr/bin/env python3
"""Probe one MambaMixer (Mamba-1; transformers 5.23 `models/mamba/modeling_mamba.py`, torch
path: `causal_conv1d_fn`'s F.conv1d fallback and `mamba_selective_scan`'s sequential loop) on
fake tensors and check memwall's closed forms (crates/memwall-core/src/memory/hf/mamba1.rs).

Every storage allocation and free inside the mixer is logged by mixer_trace.py (a TorchDispatchMode registers each
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
import sys, torch
from transformers import AutoConfig
from transformers.models.mamba.modeling_mamba import MambaMixer
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from mixer_trace import trace, marks  # noqa: E402


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
    return trace(make, cfg, mode, B, S, h, dtype)


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
