#!/usr/bin/env python3
"""Probe one FalconH1Mixer (transformers 5.23, torch path, `mamba_rms_norm = false`) on fake
tensors and compare it with memwall's Mamba-2 closed forms (crates/memwall-core/src/memory/hf/
ssm.rs, `Scan` with `norm = false`), the way mamba2_mixer.py does for Mamba2Mixer.

The mixer's own multiplications (`x * ssm_in_multiplier`, `in_proj(x) * mup_vector`) are outside
the closed forms (memwall replays them as ops), so the anchors below remove them.

Usage:
  python tools/truth/probes/falcon_h1_mixer.py --check          # bf16, fp32 and amp-bf16 deltas
  python tools/truth/probes/falcon_h1_mixer.py --check-amp      # Scan::saved_amp (1-4 chunks)
  python tools/truth/probes/falcon_h1_mixer.py --order          # gated norm: norm-first vs gate-first
  python tools/truth/probes/falcon_h1_mixer.py B S MODE PREC h,H,P,G,N,K,L   # print the trace
"""
import sys, torch
from transformers import AutoConfig
from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer, compute_mup_vector

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from mixer_trace import trace, marks  # noqa: E402
from mamba2_mixer import dims_of, saved as m2_saved, fwd_peak, fwd_peak_amp as m2_fwd_peak_amp, CASES  # noqa: E402


def run(B, S, mode, prec, dims, norm=False, before=False, frozen=False):
    h, H, P, G, N, K, L = dims
    cfg = AutoConfig.for_model("falcon_h1", hidden_size=h, mamba_n_heads=H, mamba_d_head=P,
        mamba_d_ssm=H * P, mamba_n_groups=G, mamba_d_state=N, mamba_d_conv=K, mamba_chunk_size=L,
        num_hidden_layers=1, vocab_size=10, num_attention_heads=1, num_key_value_heads=1,
        mamba_rms_norm=norm, mamba_norm_before_gate=before)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "amp": torch.float32}[prec]

    def make():
        mx = FalconH1Mixer(cfg, 0)
        mx.register_buffer("mup_vector", compute_mup_vector(cfg), persistent=False)
        return mx

    def freeze(mx, ev):
        for p in mx.parameters():
            p.requires_grad_(False)

    # any mode but train is the checkpointed first pass; `frozen`: no mixer parameter needs a
    # gradient (LoRA elsewhere), the input does
    return trace(make, cfg, "train" if mode == "train" else "ckpt", B, S, h, dtype,
                 autocast=torch.bfloat16 if prec == "amp" else None, skip_buffers=True,
                 setup=freeze if frozen else None)


def saved_nonorm(d, s):
    T, I, G = d["T"], d["I"], d["G"]
    v = m2_saved(d, s) - 4 * T * I * 4 - T * G * 4 + T * I * s
    if s == 4:
        v += T * I * 4
    return v


def check():
    for B, S, dims in CASES:
        for prec, s in (("bf16", 2), ("fp32", 4), ("amp", 2)):
            d = dims_of(B, S, dims, s)
            T, h, E, I = d["T"], d["h"], d["E"], d["I"]
            xs = 4 if prec == "amp" else s
            m = marks(run(B, S, "train", prec, dims))
            # live after forward: x, x·ssm_in (saved by in_proj), out_proj's input, y
            anchor = 2 * T * h * xs + T * I * s + T * h * s
            if prec == "amp":
                anchor += T * h * 2  # in_proj's bf16 copy of its input (autocast)
            saved_m = m["fwd"][0] - anchor
            bpk_m = m["bwd"][1] - m["gy"][0]
            c = marks(run(B, S, "ckpt", prec, dims))
            print(f"B={B} S={S} dims={dims} {prec}: saved {saved_m - saved_nonorm(d, s):+d}"
                  f" (of {saved_m}) bwd peak above grad {bpk_m}  fwd peak {m['fwd'][1]}"
                  f"  no-save peak {c['fwd'][1]}")



def saved_amp(d):
    """Autocast (bf16) form: zxbcdt is fp32 (bf16 in_proj times the fp32 mup_vector), the
    convolution runs in bf16 on a bf16 copy and is cast back to fp32, and every einsum's bmm
    saves bf16 copies of its operands."""
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f, b = 4, 2
    return sum([
        T*E*f, 2*H*f,                                   # zxbcdt, A
        cd*K*b, B*cd*S*b, B*cd*(S+K-1)*b, B*cd*S*f,     # conv weight/input casts, conv, fp32 cast
        3*T*H*f,                                        # dt + bias, softplus, clamp
        Tp*I*f, Tp*H*N*f, 2*L*L, B*H*c*L*L*f,           # pad x, pad B, masks, L
        4*Tp*H*N*b, B*c*H*L*L*b,                        # bmm copies of C, B (x2), G
        2*Tp*I*b, B*c*H*L*L*b, Tp*I*b,                  # x copies, M cast, Y_diag
        2*Tp*H*f, 2*(c+1)**2, B*H*(c+1)**2*f,           # decay exps, chunk masks, decay_chunk
        B*(c+1)*H*P*N*b, B*H*(c+1)**2*b, B*c*H*P*N*b,   # states cat, decay_chunk cast, states copy
        Tp*I*f, T*I*f,                                  # y + D_residual, silu(gate)
        # one chunk: the 16-bit `new_states` bmm output, saved through its `[:, :-1]` view
        # (ssm.rs Scan::one_chunk_saved_extra); the bmm operands stay copies (casts)
        B*H*P*N*b if c == 1 else 0,
    ])


def check_amp():
    for B, S, dims in CASES:
        for norm in (False, True):
            d = dims_of(B, S, dims, 2)
            T, h, E, I, G = d["T"], d["h"], d["E"], d["I"], d["G"]
            m = marks(run(B, S, "train", "amp", dims, norm))
            # live after forward outside the scan: in_proj's bf16 weight and input copies,
            # out_proj's bf16 weight and input copies, the output
            anchor = E * h * 2 + T * h * 2 + h * I * 2 + T * I * 2 + T * h * 2
            # the gated norm (gate first, fp32): x·silu(gate), the normalised groups, rsqrt
            form = saved_amp(d) + (2 * T * I * 4 + T * G * 4 if norm else 0)
            print(f"B={B} S={S} dims={dims} amp norm={norm}: saved {m['fwd'][0] - anchor - form:+d}")


def fwd_peak_amp(d):
    """Autocast forward peak of the saving forward over an fp32 `zxbcdt` (ssm.rs
    `Scan::forward_peak_amp`), above in_proj's bf16 weight and input copies and its fp32
    output: Mamba2Mixer's autocast form (`mamba2_mixer.py fwd_peak_amp`, the larger of the
    output's and the wide state's `C_times_states` instants) with Falcon-H1's convolution and
    dt: the convolution's bf16 output cast back to fp32 (its bf16 silu goes at once) in place
    of a bf16 silu output, dt's three ops in fp32, and no `.float()` copies of x and dt."""
    T, H, I, B, S, cd = [d[k] for k in "T H I B S cd".split()]
    f, b = 4, 2
    return m2_fwd_peak_amp(d) - (B*cd*S*b + 3*T*H*b + T*I*f + 2*T*H*f) + (B*cd*S*f + 3*T*H*f)


FWD_CASES = CASES + [(5, 19, (128, 8, 32, 2, 128, 4, 128)), (2, 19, (128, 8, 32, 2, 128, 4, 128)),
                     (3, 150, (128, 8, 32, 2, 128, 4, 64)), (1, 100, (128, 8, 32, 2, 128, 4, 32)),
                     (4, 24, (256, 64, 8, 4, 32, 2, 64)), (2, 150, (256, 64, 8, 4, 32, 2, 64))]


def check_amp_fwd():
    """The saving forward's peak under autocast (fp32 zxbcdt) against `fwd_peak_amp`, with and
    without the gated norm (the peak is inside the scan, before the norm)."""
    for B, S, dims in FWD_CASES:
        for norm in (False, True):
            d = dims_of(B, S, dims, 2)
            T, h, E = d["T"], d["h"], d["E"]
            m = marks(run(B, S, "train", "amp", dims, norm))
            inproj = E * h * 2 + T * h * 2 + T * E * 4
            print(f"B={B} S={S} dims={dims} c={d['c']} amp norm={norm}: fwd peak "
                  f"{m['fwd'][1] - inproj - fwd_peak_amp(d):+d} (traced {m['fwd'][1]})")


def check_order():
    """FalconH1RMSNormGated with `mamba_norm_before_gate` true (normalise, weight, then
    `* silu(gate.float())`) against the gate-first order memwall's forms follow: the saved bytes
    after the forward, the forward's peak, the backward's peak above the output gradient and the
    checkpointed (no-save) forward's peak, per case and precision; 0 everywhere means the
    gate-first forms hold for both orders."""
    worst = 0
    for B, S, dims in CASES:
        for prec in ("bf16", "fp32", "amp"):
            a = marks(run(B, S, "train", prec, dims, True, False))
            b = marks(run(B, S, "train", prec, dims, True, True))
            ca = marks(run(B, S, "ckpt", prec, dims, True, False))
            cb = marks(run(B, S, "ckpt", prec, dims, True, True))
            d = (b["fwd"][0] - a["fwd"][0], b["fwd"][1] - a["fwd"][1],
                 (b["bwd"][1] - b["gy"][0]) - (a["bwd"][1] - a["gy"][0]), cb["fwd"][1] - ca["fwd"][1])
            worst = max(worst, *map(abs, d))
            print(f"B={B} S={S} dims={dims} {prec}: norm-first minus gate-first: saved {d[0]:+d}"
                  f"  fwd peak {d[1]:+d}  bwd peak {d[2]:+d}  no-save peak {d[3]:+d}")
            if prec != "amp":
                # every mixer parameter frozen (ssm.rs `Scan::backward_peak_frozen`)
                fa = marks(run(B, S, "train", prec, dims, True, False, True))
                fb = marks(run(B, S, "train", prec, dims, True, True, True))
                print(f"    frozen: saved {fb['fwd'][0] - fa['fwd'][0]:+d}  bwd peak "
                      f"{(fb['bwd'][1] - fb['gy'][0]) - (fa['bwd'][1] - fa['gy'][0]):+d}")
    print(f"largest difference: {worst} B")


if __name__ == "__main__" and sys.argv[1:2] == ["--order"]:
    check_order()
elif __name__ == "__main__" and sys.argv[1:2] == ["--check"]:
    check()
elif __name__ == "__main__" and sys.argv[1:2] == ["--check-amp-fwd"]:
    check_amp_fwd()
elif __name__ == "__main__" and sys.argv[1:2] == ["--check-amp"]:
    check_amp()
elif __name__ == "__main__":
    B, S, mode, prec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dims = tuple(int(v) for v in sys.argv[5].split(","))
    for e in run(B, S, mode, prec, dims): print(*e)
