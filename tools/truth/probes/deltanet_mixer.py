#!/usr/bin/env python3
"""Probe one Qwen3NextGatedDeltaNet (transformers 5.23, torch fallback: torch_chunk_gated_delta_rule,
torch_recurrent_gated_delta_rule, causal_conv1d_fn/update) on fake tensors and print the bytes
memwall's closed forms (crates/memwall-core/src/memory/hf/deltanet.rs) must reproduce.

Every storage allocation and free inside the mixer is logged by tools/truth/probes/mixer_trace.py;
parameters are excluded. Modes: train (forward, ones_like grad, backward), ckpt (forward that
saves nothing), infer (no_grad prefill with a DynamicCache, then one decode step).

Usage: python tools/truth/probes/deltanet_mixer.py B S MODE bf16|fp32 h,Hk,Hv,dk,dv,K [trace]
"""
import sys, torch
from transformers import AutoConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from mixer_trace import trace, marks  # noqa: E402


def run(B, S, mode, dtype, dims):
    h, Hk, Hv, dk, dv, K = dims
    cfg = AutoConfig.for_model("qwen3_next", hidden_size=h, linear_num_key_heads=Hk,
        linear_num_value_heads=Hv, linear_key_head_dim=dk, linear_value_head_dim=dv,
        linear_conv_kernel_dim=K, num_hidden_layers=1, layer_types=["linear_attention"],
        vocab_size=10, num_experts=0)
    return trace(lambda: Qwen3NextGatedDeltaNet(cfg, 0), cfg, mode, B, S, h, dtype)


if __name__ == "__main__":
    B, S, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[sys.argv[4]]
    dims = tuple(int(v) for v in sys.argv[5].split(","))
    ev = run(B, S, mode, dt, dims)
    if sys.argv[6:7] == ["trace"]:
        for e in ev: print(*e)
    print(marks(ev))
