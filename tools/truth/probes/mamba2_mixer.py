#!/usr/bin/env python3
"""Probe one Mamba2Mixer (transformers 5.23, torch path) on fake tensors and check memwall's
closed forms (crates/memwall-core/src/memory/hf/ssm.rs) against it.

Every storage allocation and free inside the mixer is logged by mixer_trace.py (a TorchDispatchMode registers each
op's output storages, weakref finalizers log their frees); parameters are excluded. Modes:
`train` (forward, ones_like grad, backward), `ckpt` (forward under saved_tensors_hooks that keep
nothing: a checkpointed layer's first pass), `infer` (no_grad prefill with a DynamicCache, then
one decode step).

`--check-amp` does the same under CPU autocast (fp32 parameters and input, amp-bf16 and
amp-fp16: `saved_amp`, `fwd_peak_amp`, `no_save_peak_amp`, `bwd_amp` = ssm.rs
`Scan::saved_amp16`, `forward_peak_amp16`, `forward_peak_unsaved_amp16`, and the larger of the
norm's and `backward_peak_scan_amp16`'s instants). The backward peak is read up to the `cat`
of zxbcdt's gradient slices (in_proj's backward is memwall's own op); it is the larger of the
gated norm's instant (`bwd_x`) and the scan's at `M = G * L` (`bwd_scan`, ssm.rs
`Scan::backward_peak_scan`), which wins when padding dominates (Codestral 8 × 8).

Usage:
  python tools/truth/probes/mamba2_mixer.py B S MODE PREC h,H,P,G,N,K,L   # print the trace
      (PREC: bf16, fp32, amp-bf16, amp-fp16)
  python tools/truth/probes/mamba2_mixer.py --check                       # closed forms vs traces
  python tools/truth/probes/mamba2_mixer.py --check-amp                   # the same under autocast
  python tools/truth/probes/mamba2_mixer.py --check-ckpt                  # autocast scan backward, checkpointed
  python tools/truth/probes/mamba2_mixer.py --check-infer                 # no-grad prefill peak (three instants)
"""
import sys, torch, json, math
from transformers import AutoConfig
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from mixer_trace import trace, marks  # noqa: E402

def run(B, S, mode, dtype, dims, autocast=None):
    """`autocast` (a 16-bit dtype): fp32 parameters and input, forward under CPU autocast."""
    h, H, P, G, N, K, L = dims
    cfg = AutoConfig.for_model("mamba2", hidden_size=h, num_heads=H, head_dim=P, expand=(H*P)//h,
        n_groups=G, state_size=N, conv_kernel=K, chunk_size=L, num_hidden_layers=1, vocab_size=10)
    return trace(lambda: Mamba2Mixer(cfg, 0), cfg, mode, B, S, h, dtype, autocast=autocast)

def no_save_peak(d, s):
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f = 4
    return (H*f + B*cd*S*s + T*H*s + 7*Tp*I*f + 4*Tp*H*f + 3*Tp*H*N*f + 3*B*H*c*L*L*f
            + B*H*P*N*f + B*H*(c+1)**2*f + B*H*(c+1)*P*N*f)


CASES = [(1, 512, (4096, 128, 64, 8, 128, 4, 256)), (2, 300, (4096, 128, 64, 8, 128, 4, 256)),
         (3, 50, (77, 14, 11, 7, 13, 6, 16)), (1, 50, (77, 14, 11, 7, 13, 6, 16)),
         (2, 64, (77, 14, 11, 7, 13, 6, 16)), (2, 32, (77, 14, 11, 7, 13, 6, 16)),
         (1, 10, (77, 14, 11, 7, 13, 6, 16)), (8, 8, (4096, 128, 64, 8, 128, 4, 256)),
         (8, 100, (4096, 128, 64, 8, 128, 4, 256)), (2, 256, (4096, 128, 64, 8, 128, 4, 256)),
         (1, 100, (4096, 128, 64, 8, 128, 4, 256)),
         # one head (granitemoehybrid rnd-s29-granitemoehybrid-1: mamba_n_heads 1)
         (4, 186, (32, 1, 64, 1, 32, 4, 32)), (2, 100, (32, 1, 64, 1, 32, 4, 32)),
         (1, 100, (32, 1, 64, 1, 32, 4, 32)), (3, 50, (16, 1, 32, 1, 13, 6, 16)), (1, 70, (16, 1, 32, 1, 13, 6, 16)),
         (3, 20, (16, 1, 32, 1, 13, 6, 32)), (1, 20, (16, 1, 32, 1, 13, 6, 32)),
         # a wide state, N > 3·P (rnd-s53-mamba2-0): C_times_states' bmm is the autocast peak
         (4, 24, (256, 64, 8, 4, 32, 2, 64)), (2, 150, (256, 64, 8, 4, 32, 2, 64)),
         (1, 24, (256, 64, 8, 4, 32, 2, 64)), (3, 40, (16, 4, 8, 2, 40, 4, 16))]


def bwd_scan(d, s):
    """The backward of `M = G * L` (ssm.rs `Scan::backward_peak_scan`): wins over the gated
    norm's backward when the `[chunk, chunk]` blocks dominate (padding: seq << chunk)."""
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f = 4
    blocks = B*c*H*L*L
    # C and B in G's bmm layout: copies, or with one sequence of one chunk views of the padded
    # C and B, which stay alive for G's backward all the same
    copies = 2*Tp*H*N*f
    alive = sum([
        T*E*s, 2*H*f, B*cd*(S+K-1)*s, 2*T*H*s,               # saved: zxbcdt, A, conv, dt ops
        T*I*f, Tp*I*f, 2*T*H*f, 2*L*L, blocks*f, copies, blocks*f,  # x.float(), pad(x), dt.float()s, masks, L, C/B, G
        I*s, T*I*s, Tp*I*f, 2*Tp*H*N*f, Tp*H*f,              # grads: norm weight, gate, output, C, B, A_cumsum
        blocks*f, Tp*I*f, 2*blocks*f,                        # M, x, G and L
    ])
    if s == 4:
        alive += T*H*f + B*cd*S*f - T*I*f - 2*T*H*f
    return alive - saved(d, s) - T*I*s


def check():
    for B, S, dims in CASES:
        for dt, s in ((torch.bfloat16, 2), (torch.float32, 4)):
            d = dims_of(B, S, dims, s)
            T, h, E, I = d["T"], d["h"], d["E"], d["I"]
            ev = run(B, S, "train", dt, dims)
            m = marks(ev)
            saved_m = m["fwd"][0] - 2 * T * h * s - T * I * s
            fpk_m = m["fwd"][1] - T * h * s - T * E * s
            bpk_m = scan_bwd_peak(ev, B, S, E) - h * I * s
            c = marks(run(B, S, "ckpt", dt, dims))
            ck_m = c["fwd"][1] - T * h * s - T * E * s
            print(f"B={B} S={S} h={h} {'bf16' if s == 2 else 'fp32'}: saved {saved_m - saved(d, s):+d}"
                  f"  fwd peak {fpk_m - fwd_peak(d, s):+d}  bwd peak {bpk_m - max(bwd_x(d, s), bwd_scan(d, s)):+d}"
                  f"  no-save peak {ck_m - no_save_peak(d, s):+d}  (0 = closed form exact)")



def dims_of(B,S,dims,s):
    h,H,P,G,N,K,L = dims
    I=H*P; cd=I+2*G*N; E=I+cd+H; c=-(-S//L); Sp=c*L; T=B*S; Tp=B*Sp
    return dict(h=h,H=H,P=P,G=G,N=N,K=K,L=L,I=I,cd=cd,E=E,c=c,Sp=Sp,T=T,Tp=Tp,B=B,S=S)
def saved(d,s):
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f=4
    t = [T*E*s, 2*H*f, B*cd*(S+K-1)*s, 2*T*H*s, T*I*f, Tp*I*f, 2*T*H*f, Tp*H*N*f, 2*L*L,
      B*H*c*L*L*f, 2*Tp*H*N*f, B*c*H*L*L*f, B*c*L*L*H*f, Tp*I*f, Tp*I*f, Tp*H*f, Tp*H*N*f, Tp*I*f,
      B*(c+1)*H*P*N*f, 2*(c+1)**2, B*H*(c+1)**2*f, Tp*H*f, Tp*H*N*f, B*c*H*P*N*f, Tp*I*f,
      T*I*f, T*I*f, T*I*f, T*G*f, T*I*f]
    if s == 4: t += [-2*T*I*f, -2*T*H*f, T*H*f, B*cd*S*f]
    if c == 1:  # ssm.rs Scan::one_chunk_saved_extra / one_chunk_saved_less
        t.append(B*H*P*N*f - Tp*I*f)
    elif B == 1 and H == 1:  # the chunk states' bmm operand is a view of new_states, x's are views
        t.append(B*H*P*N*f - Tp*I*f)
    if H == 1 or (B == 1 and c == 1):  # ssm.rs Scan::cb_views: C and B for G are views
        t.append(-2*Tp*H*N*f)
    return sum(t)
def fwd_peak(d,s):
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f=4
    t = [2*H*f, B*cd*(S+K-1)*s, B*cd*S*s, 3*T*H*s, T*I*f, Tp*I*f, Tp*I*f, 2*T*H*f, Tp*I*f, Tp*H*f, 2*Tp*H*N*f,
         Tp*H*f, 2*L*L, B*H*c*L*L*f, 2*Tp*H*N*f, 2*B*c*H*L*L*f, 2*Tp*I*f, Tp*H*f, Tp*H*N*f, Tp*I*f, Tp*H*N*f,
         B*H*P*N*f, B*(c+1)*H*P*N*f, 2*(c+1)**2, B*H*(c+1)**2*f, B*H*(c+1)*P*N*f, Tp*H*f, Tp*H*N*f, B*c*H*P*N*f,
         4*Tp*I*f]
    if s == 4:
        t += [-T*I*f, -2*T*H*f]
    if c == 1:  # views instead of copies (ssm.rs forward_peak); exact for N >= P
        t.append(-(2*Tp*I*f + B*H*P*N*f))
    elif B == 1 and H == 1:  # one sequence of one head: the same views
        t.append(-(2*Tp*I*f + B*c*H*P*N*f))
    if H == 1 or (B == 1 and c == 1):  # ssm.rs Scan::cb_views: C and B for G, B_decay and
        t.append(-4*Tp*H*N*f)         # C for the states are views
    return sum(t)
def bwd_x(d,s):
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f=4
    return 4*T*I*f - T*I*s + I*s - T*G*f

def saved_amp(d):
    """Autocast (fp32 parameters and input, 16-bit compute) form of `saved` for a Mamba2Mixer
    with 16-bit projections (ssm.rs `Scan::saved_amp16`): Falcon-H1's `saved_amp` with a bf16
    zxbcdt that nothing saves, a conv that stays 16-bit (no fp32 cast), dt+bias and softplus
    in 16 bits with the fp32 copies of `dt` and `x` the scan's `.float()` makes, and the gated
    norm's fp32 cast of the gate."""
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f, b = 4, 2
    from falcon_h1_mixer import saved_amp as fh_saved_amp
    return (fh_saved_amp(d) - T*E*f - B*cd*S*f - 3*T*H*f + 2*T*H*b + 2*T*H*f + T*I*f
            + T*I*f + 2*T*I*f + T*G*f)


def fwd_peak_amp(d, conv_bias=True):
    """Autocast form of `fwd_peak` (ssm.rs `Scan::forward_peak_amp16`): above in_proj's
    16-bit weight and input copies and its output, at the contiguous copy of Y_diag + Y_off."""
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f, b = 4, 2
    c1 = c + 1
    at_output = sum([
        2*H*f, cd*b if conv_bias else 0,                 # A; conv bias copy (autocast cache)
        cd*K*b, B*cd*S*b, B*cd*(S+K-1)*b, B*cd*S*b,      # conv weight/input copies, conv, silu
        3*T*H*b, T*I*f, 2*T*H*f,                         # dt+bias, softplus, clamp; .float()s
        3*Tp*I*f, Tp*H*f, 2*Tp*H*N*f, Tp*H*f,            # pad, D_res, x·dt; A, B, C; A_cumsum
        2*L*L, B*H*c*L*L*f,                              # masks, L
        2*Tp*H*N*b, B*c*H*L*L*b, B*c*H*L*L*f,            # C, B copies; G; M
        2*Tp*I*b, B*c*H*L*L*b,                           # x copy, Y_diag; M copy
        Tp*H*f, Tp*H*N*f, Tp*H*N*b, Tp*I*b,              # decay_states, B_decay, its copy, x copy
        B*H*P*N*b, 2*c1*c1, B*H*c1*c1*f,                 # zeros_like, chunk masks, decay_chunk
        B*c1*H*P*N*b, B*H*c1*c1*b, B*H*c1*P*N*b,         # cat copy, decay_chunk copy, new_states
        Tp*H*f, B*c*H*P*N*b, Tp*H*N*b, Tp*I*b,           # state_decay_out, states/C copies, bmm
        3*Tp*I*f,                                        # Y_off, Y_diag + Y_off, contiguous copy
        -B*H*P*N*b if c == 1 else 0,                     # one chunk: the states are in bmm layout
    ])
    # an earlier instant wins when the state is wide (N > 3·P, rnd-s53-mamba2-0): the `bmm` of
    # `C_times_states`, with C's fp32 layout copy alive beside its 16-bit cast, before Y_off,
    # the sum and its copy exist (C is a view with one head, or one sequence of one chunk)
    views = H == 1 or (B == 1 and c == 1)
    at_cts = at_output - 3*Tp*I*f + (0 if views else Tp*H*N*f)
    return max(at_output, at_cts)


def no_save_peak_amp(d, conv_bias=True):
    """Autocast form of `no_save_peak` (ssm.rs `Scan::forward_peak_unsaved_amp16`)."""
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f, b = 4, 2
    c1 = c + 1
    at_output = (H*f + (cd*b if conv_bias else 0) + B*cd*S*b + T*H*b + 5*Tp*I*f + 2*Tp*I*b
                 + 4*Tp*H*f + 3*Tp*H*N*f + 2*B*H*c*L*L*f + B*c*H*L*L*b + B*H*P*N*b
                 + B*H*c1*c1*f + B*H*c1*P*N*b)
    at_cts = at_output + Tp*H*N*b + B*c*H*P*N*b - 3*Tp*I*f
    # the chunk states' bmm (`einsum("bclhn,bclhp->bchpn", B_decay, x)`): the fp32 layout
    # copies of x and B_decay, their 16-bit casts and the bmm output, before Y_off and the
    # chunk-level tensors exist (wins at Codestral's widths)
    at_states = (H*f + (cd*b if conv_bias else 0) + B*cd*S*b + T*H*b + 2*Tp*I*f + 3*Tp*H*f
                 + 2*Tp*H*N*f + 2*B*H*c*L*L*f + B*c*H*L*L*b + Tp*I*b + Tp*H*N*f
                 + Tp*H*N*b + Tp*I*b + B*c*H*P*N*b)
    if c > 1:  # one chunk: the bmm layouts of x and B_decay are views, cast directly
        # x's and B_decay's fp32 layout copies; B_decay's is a view with one head (ssm.rs
        # `Scan::cb_views`), cast directly
        at_states += Tp*I*f + (0 if H == 1 else Tp*H*N*f)
    return max(at_output, at_cts, at_states)


def bwd_amp(d):
    """Autocast form of the mixer's backward peak above what memwall holds when the composite's
    backward starts (its saved tensors, the fp32 gradient of its output, out_proj's weight
    gradient): the larger of the gated norm's backward (`bwd_x` with an fp32 incoming
    gradient) and the backward of `M = G * L` (ssm.rs `Scan::backward_peak_scan_amp16`)."""
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f, b = 4, 2
    norm = 4*T*I*f + I*f - T*I*f - T*G*f
    alive = sum([
        2*H*f, cd*K*b, B*cd*S*b, B*cd*(S+K-1)*b, 2*T*H*b,   # saved: A, conv, dt + bias, softplus
        T*I*f, Tp*I*f, 2*T*H*f, 2*L*L, B*H*c*L*L*f,         # x.float(), pad(x), dt.float()s, masks, L
        2*Tp*H*N*b, B*c*H*L*L*b,                            # C, B copies and G (saved by the bmm, M)
        I*f, T*I*b, Tp*I*f, 2*Tp*H*N*f, Tp*H*f,             # grads: norm weight, gate, output, C, B, A_cumsum
        B*c*H*L*L*f, Tp*I*f, 2*B*c*H*L*L*f, B*c*H*L*L*b,    # M (fp32 cast), x, G and L, G's 16-bit cast
    ])
    scan = alive - saved_amp(d) - T*I*f
    return max(norm, scan)


def scan_bwd_peak(ev, B, S, E):
    """Peak of the backward above the live bytes when it starts, up to (excluding) the `cat`
    of zxbcdt's gradient slices (`torch.split`'s backward): what follows is in_proj's backward,
    which memwall replays as its own op."""
    i0 = next(i for i, e in enumerate(ev) if e[0] == "MARK" and e[1] == "gy")
    base = cur = next(e[3] for e in reversed(ev[:i0]) if e[0] != "MARK")
    pk = cur
    for e in ev[i0 + 1:]:
        if e[0] == "MARK" or (e[0] == "+" and e[1] == "cat" and e[4] == (B, S, E)):
            break
        pk = max(pk, e[3])
    return pk - base


def check_amp():
    for B, S, dims in CASES:
        for ac in (torch.bfloat16, torch.float16):
            d = dims_of(B, S, dims, 2)
            T, h, E, I = d["T"], d["h"], d["E"], d["I"]
            ev = run(B, S, "train", torch.float32, dims, ac)
            m = marks(ev)
            # live after forward outside the scan: in_proj's 16-bit weight and input copies,
            # out_proj's 16-bit weight and input copies, the output
            anchor = E * h * 2 + T * h * 2 + h * I * 2 + T * I * 2 + T * h * 2
            inproj = E * h * 2 + T * h * 2 + T * E * 2
            ck = marks(run(B, S, "ckpt", torch.float32, dims, ac))
            print(f"B={B} S={S} dims={dims} c={d['c']} {ac}: saved {m['fwd'][0] - anchor - saved_amp(d):+d}"
                  f"  fwd peak {m['fwd'][1] - inproj - fwd_peak_amp(d):+d}"
                  f"  no-save peak {ck['fwd'][1] - inproj - no_save_peak_amp(d):+d}"
                  f"  bwd peak {scan_bwd_peak(ev, B, S, E) - T*I*2 - h*I*2 - bwd_amp(d):+d}")


def no_save_instants(d, s):
    """ssm.rs `Scan::forward_peak_unsaved` (no autocast): the largest of three instants of the
    no-grad scan, above the input, in_proj's output and the cache's conv state:
    - the output (`at_output`, = `no_save_peak`);
    - the `bmm` of `einsum("bclhn,bchpn->bclhp", C, states)` (`C_times_states`): before
      `Y_off`, the sum and its copy, with the chunk states' layout copy (a view with one chunk:
      `new_states[:, :-1]` is in the layout) and C's (a view where the chunked `[b, c, l, h, n]`
      merges `b·c` with `h`: one head, or one sequence of one chunk, ssm.rs `Scan::cb_views`);
    - the `bmm` of `einsum("bhzc,bchpn->bzhpn", decay_chunk, states)` (`new_states`): the `cat`,
      its layout copy (a view where `[b, c + 1, h, p·n]` merges `b` with `h`: one sequence, or
      one head) and the output, before `state_decay_out` and what follows exist."""
    h,H,P,G,N,K,L,I,cd,E,c,Sp,T,Tp,B,S=[d[k] for k in "h H P G N K L I cd E c Sp T Tp B S".split()]
    f = 4
    c1 = c + 1
    at_output = no_save_peak(d, s)
    c_copy = 0 if (H == 1 or (B == 1 and c == 1)) else Tp*H*N*f
    states_copy = 0 if c == 1 else B*c*H*P*N*f
    at_cts = at_output + c_copy + states_copy - 3*Tp*I*f
    cat_copy = 0 if (B == 1 or H == 1) else B*H*c1*P*N*f
    at_new = (H*f + B*cd*S*s + T*H*s + 3*Tp*I*f + 3*Tp*H*f + 3*Tp*H*N*f + 3*B*H*c*L*L*f
              + B*H*P*N*f + B*H*c1*c1*f + 2*B*H*c1*P*N*f + cat_copy)
    return dict(output=at_output, c_times_states=at_cts, new_states=at_new)


INFER_CASES = [
    # rnd-s139-mamba2-0 (one head of 16, state 32, chunks of 16): the random sample's
    # rnd-i139-002-mamba2 is 5 x 67 (five chunks, the last padded)
    (5, 67, (8, 1, 16, 1, 32, 4, 16)), (5, 64, (8, 1, 16, 1, 32, 4, 16)),
    (1, 67, (8, 1, 16, 1, 32, 4, 16)), (2, 40, (8, 1, 16, 1, 32, 4, 16)),
    (3, 10, (8, 1, 16, 1, 32, 4, 16)), (1, 10, (8, 1, 16, 1, 32, 4, 16)),
    # other one-head widths (rnd-s29-granitemoehybrid-1, odd)
    (4, 186, (32, 1, 64, 1, 32, 4, 32)), (2, 100, (32, 1, 64, 1, 32, 4, 32)),
    (3, 50, (16, 1, 32, 1, 13, 6, 16)), (1, 70, (16, 1, 32, 1, 13, 6, 16)),
    (3, 20, (16, 1, 32, 1, 13, 6, 32)),
    # several heads around them (wide states and narrow ones)
    (5, 67, (8, 2, 8, 1, 32, 4, 16)), (5, 67, (16, 4, 8, 2, 32, 4, 16)),
    (2, 60, (96, 24, 8, 1, 128, 2, 32)), (1, 60, (96, 24, 8, 1, 128, 2, 32)),
    (2, 28, (96, 24, 8, 1, 128, 2, 32)), (3, 50, (77, 14, 11, 7, 13, 6, 16)),
    (4, 24, (256, 64, 8, 4, 32, 2, 64)), (2, 150, (256, 64, 8, 4, 32, 2, 64)),
    (3, 40, (16, 4, 8, 2, 40, 4, 16)),
    # a state wide against short chunks: the new_states instant (one head and several)
    (3, 30, (8, 1, 16, 1, 128, 4, 4)), (2, 40, (16, 1, 32, 1, 64, 4, 8)),
    (1, 40, (16, 1, 32, 1, 64, 4, 8)), (2, 40, (32, 2, 16, 1, 64, 4, 8)),
    (1, 40, (32, 2, 16, 1, 64, 4, 8)), (3, 50, (8, 1, 16, 1, 96, 4, 16)),
    # one head where C_times_states' bmm wins (its C is a view)
    (2, 64, (8, 1, 16, 1, 64, 4, 16)), (2, 100, (8, 1, 16, 1, 128, 4, 32)),
]


def check_infer():
    """The no-grad prefill (`infer`) against ssm.rs `Scan::forward_peak_unsaved`: the scan's
    peak above the input, in_proj's output and the cache's conv state, read before the cache's
    SSM state (`[B, H, P, N]` zeros) is allocated; and the same in `ckpt` mode (a checkpointed
    layer's first pass)."""
    for B, S, dims in INFER_CASES:
        for dt, s in ((torch.bfloat16, 2), (torch.float32, 4)):
            d = dims_of(B, S, dims, s)
            T, h, E, H, P, N, cd, K = (d[k] for k in "T h E H P N cd K".split())
            ev = run(B, S, "infer", dt, dims)
            pk = 0
            for e in ev:
                if e[0] == "+" and e[4] == (B, H, P, N):
                    break
                if e[0] != "MARK":
                    pk = max(pk, e[3])
            traced = pk - T*h*s - T*E*s - B*cd*K*s
            ins = no_save_instants(d, s)
            ck = marks(run(B, S, "ckpt", dt, dims))["fwd"][1] - T*h*s - T*E*s
            best = max(ins, key=ins.get)
            if s == 2:
                # the same first pass under autocast (fp32 parameters, ssm.rs
                # `Scan::forward_peak_unsaved_amp16`), above in_proj's 16-bit copies and output
                da = dims_of(B, S, dims, 2)
                ac = marks(run(B, S, "ckpt", torch.float32, dims, torch.bfloat16))["fwd"][1]
                ac -= E*h*2 + T*h*2 + T*E*2
                print(f"B={B} S={S} dims={dims} c={d['c']} amp-bf16 ckpt: "
                      f"{ac - no_save_peak_amp(da):+d}")
            print(f"B={B} S={S} dims={dims} c={d['c']} {'bf16' if s == 2 else 'fp32'}: "
                  f"infer {traced - ins[best]:+d}  ckpt {ck - ins[best]:+d}  (at {best}; "
                  f"output {ins['output']}, c_times_states {ins['c_times_states']}, "
                  f"new_states {ins['new_states']})")


class _Checkpointed(torch.nn.Module):
    """The mixer under non-reentrant `torch.utils.checkpoint` (HF gradient checkpointing)."""
    def __init__(self, mx):
        super().__init__(); self.mx = mx

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        return checkpoint(self.mx, x, use_reentrant=False)


def check_ckpt():
    """Under autocast, the backward of `M = G * L` with the mixer checkpointed against without:
    lower by the recomputed 16-bit `G` (`b·c·H·L·L·2`; ssm.rs `Scan::backward_peak_scan_amp16`
    with `ckpt`), read at the engine's 16-bit cast of `G`'s gradient."""
    for B, S, dims in [(1, 67, (160, 20, 16, 2, 8, 4, 256)), (2, 300, (160, 20, 16, 2, 8, 4, 256)),
                       (3, 50, (77, 14, 11, 7, 13, 6, 16)), (1, 10, (77, 14, 11, 7, 13, 6, 16)),
                       (8, 8, (512, 16, 64, 2, 128, 4, 256))]:
        h, H, P, G, N, K, L = dims
        c = -(-S // L)
        cfg = AutoConfig.for_model("mamba2", hidden_size=h, num_heads=H, head_dim=P,
            expand=(H*P)//h, n_groups=G, state_size=N, conv_kernel=K, chunk_size=L,
            num_hidden_layers=1, vocab_size=10)
        at = []
        for ck in (False, True):
            make = (lambda: _Checkpointed(Mamba2Mixer(cfg, 0))) if ck else (lambda: Mamba2Mixer(cfg, 0))
            ev = trace(make, cfg, "train", B, S, h, torch.float32, autocast=torch.bfloat16)
            i0 = next(i for i, e in enumerate(ev) if e[0] == "MARK" and e[1] == "gy")
            at.append(next(e[3] for e in ev[i0 + 1:] if e[0] == "+" and e[1] == "_to_copy"
                           and e[4] == (B, c, L, L, H) and e[5] == "torch.bfloat16"))
        print(f"B={B} S={S} dims={dims}: plain - ckpt {at[0] - at[1]:+d}, "
              f"b·c·H·L·L·2 {B*c*H*L*L*2:+d}")


if __name__ == "__main__" and sys.argv[1:2] == ["--check-infer"]:
    check_infer()
elif __name__ == "__main__" and sys.argv[1:2] == ["--check-ckpt"]:
    check_ckpt()
elif __name__ == "__main__" and sys.argv[1:2] == ["--check"]:
    check()
elif __name__ == "__main__" and sys.argv[1:2] == ["--check-amp"]:
    check_amp()
elif __name__ == "__main__":
    B, S, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dt, ac = {"bf16": (torch.bfloat16, None), "fp32": (torch.float32, None),
              "amp-bf16": (torch.float32, torch.bfloat16),
              "amp-fp16": (torch.float32, torch.float16)}[sys.argv[4]]
    dims = tuple(int(v) for v in sys.argv[5].split(","))  # h,H,P,G,N,K,L
    for e in run(B, S, mode, dt, dims, ac): print(*e)
