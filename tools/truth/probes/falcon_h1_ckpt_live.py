#!/usr/bin/env python3
"""What is alive at the backward peak of one FalconH1Mixer under CPU autocast (bf16), plain or
wrapped in non-reentrant `torch.utils.checkpoint` (as HF gradient checkpointing wraps the decoder
layer), on fake tensors (tools/truth/probes/mixer_trace.py's tracer): the storages alive at the
peak that were not at the output gradient's mark, and those freed by then.

Usage: python tools/truth/probes/falcon_h1_ckpt_live.py plain|ckpt [B S h,H,P,G,N,K,L [gate-first]]

Written for falconh1-nbg-small-ampbf16-ckpt (+8.3% before): at the seed-53 widths (default:
5 x 264 tokens, 96,24,8,8,8,4,128) the plain mixer peaks at the 16-bit cast of G's gradient in
the backward of `M = G * L` (ssm.rs `Scan::backward_peak_scan_amp`); the checkpointed one peaks
at the product for L's gradient, the cast never alive with it (the engine casts after the node's
apply returns, and the recomputed G and L die with apply's locals).
"""
import collections
import sys

import torch
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig
from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer, compute_mup_vector

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import mixer_trace  # noqa: E402

mode = sys.argv[1]
B, S = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (5, 264)
dims = tuple(int(v) for v in sys.argv[4].split(",")) if len(sys.argv) > 4 else (96, 24, 8, 8, 8, 4, 128)
before = not (len(sys.argv) > 5 and sys.argv[5] == "gate-first")
h, H, P, G, N, K, L = dims
cfg = AutoConfig.for_model("falcon_h1", hidden_size=h, mamba_n_heads=H, mamba_d_head=P,
    mamba_d_ssm=H * P, mamba_n_groups=G, mamba_d_state=N, mamba_d_conv=K, mamba_chunk_size=L,
    num_hidden_layers=1, vocab_size=10, num_attention_heads=1, num_key_value_heads=1,
    mamba_rms_norm=True, mamba_norm_before_gate=before)


def make():
    mx = FalconH1Mixer(cfg, 0)
    mx.register_buffer("mup_vector", compute_mup_vector(cfg), persistent=False)
    return mx


if mode == "ckpt":
    plain_forward = FalconH1Mixer.forward

    def forward(self, x, *a, **k):
        return checkpoint(lambda t: plain_forward(self, t, *a, **k), x, use_reentrant=False)

    FalconH1Mixer.forward = forward

ev = mixer_trace.trace(make, cfg, "train", B, S, h, torch.float32, autocast=torch.bfloat16,
                       skip_buffers=True)
idx = {e[1]: k for k, e in enumerate(ev) if e[0] == "MARK"}
live, gy, snap, peak, at = collections.Counter(), None, None, 0, None
for k, e in enumerate(ev):
    if e[0] == "MARK":
        if e[1] == "gy":
            gy, gy_level = collections.Counter(live), level
        continue
    live[(e[1], e[2], e[4], e[5])] += 1 if e[0] == "+" else -1
    level = e[3]
    if idx["gy"] < k < idx["bwd"] and e[3] > peak:
        peak, at, snap = e[3], e[:3], collections.Counter(live)
print(f"{mode}: backward peak {peak - gy_level} B above the output gradient's mark, at {at}")
for sign, diff in (("+", snap - gy), ("-", gy - snap)):
    for (op, n, shape, dt), v in sorted(diff.items(), key=lambda kv: -kv[0][1] * kv[1]):
        print(f"  {sign} {v} x {n:>10d}  {op} {shape} {dt}")
