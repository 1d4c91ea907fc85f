#!/usr/bin/env python3
"""Probe one Qwen3NextGatedDeltaNet (transformers 5.23, torch fallback: torch_chunk_gated_delta_rule,
torch_recurrent_gated_delta_rule, causal_conv1d_fn/update) on fake tensors and print the bytes
memwall's closed forms (crates/memwall-core/src/memory/hf/deltanet.rs) must reproduce.

Every storage allocation and free inside the mixer is logged by tools/truth/probes/mixer_trace.py;
parameters are excluded. Modes: train (forward, ones_like grad, backward), ckpt (forward that
saves nothing), infer (no_grad prefill with a DynamicCache, then one decode step).

Precisions: bf16, fp16, fp32 (the mixer and its input in that dtype), amp-bf16 / amp-fp16 (fp32
mixer and input, forward under CPU autocast to that dtype).

`--check-backward` (train only) splits the backward at the composite memwall replays as one node
(head reordering .. gated norm, `deltanet.rs` `deltanet_inner`): it starts when `out_proj`'s input
gradient exists (a tensor hook on `out_proj`'s input) and ends when both projections' output
gradients exist (hooks on `in_proj_qkvz`'s and `in_proj_ba`'s outputs). Printed: the bytes alive
at its start, its peak above that start, the input and parameter gradients it produces, the
saved bytes and output gradient it frees, and `temps` = peak − gradients (what memwall's
`Node::backward_temps` must hold: the node's model is saved + output gradient + temps + input and
parameter gradients at its peak); with `trace`, the op at the peak and what is alive there.

`--unsaved` (infer / ckpt): the forward that saves nothing (`deltanet.rs` `Sizes::unsaved_peak`,
`Sizes::unsaved_locals`): `peak` = the highest bytes alive between `in_proj_ba`'s output and
`out_proj`'s, above the input, both projections' outputs and (infer) the conv state the cache
holds; `locals` = what is alive when `out_proj` allocates its output besides that reference, the
cache's recurrent state (infer), the gated norm's output and `out_proj`'s output; `decode` (infer)
= the decode step's peak above its input, projections' outputs and the cache.

`--real`: run on real CPU tensors instead of fake ones (the `--unsaved` figures are the same:
checked at 3 × 65 bf16 prefill, 150 tokens fp32 prefill with one value head per key head,
2 × 130 bf16 checkpointed first pass with one key head).

`--saved` (train only): the composite's saved bytes and its forward's last state update, held
apart from what memwall counts outside it (see `check_saved`).

`--forward` (train, train-cache): see `check_forward`.

Usage: python tools/truth/probes/deltanet_mixer.py B S MODE PREC h,Hk,Hv,dk,dv,K [trace]
       [--check-backward | --saved | --unsaved | --forward] [--frozen] [--no-input-grad] [--real]
"""
import sys, torch
from transformers import AutoConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from mixer_trace import trace, marks  # noqa: E402

PRECISIONS = {
    "bf16": (torch.bfloat16, None), "fp16": (torch.float16, None), "fp32": (torch.float32, None),
    "amp-bf16": (torch.float32, torch.bfloat16), "amp-fp16": (torch.float32, torch.float16),
}


def config(dims):
    h, Hk, Hv, dk, dv, K = dims
    return AutoConfig.for_model("qwen3_next", hidden_size=h, linear_num_key_heads=Hk,
        linear_num_value_heads=Hv, linear_key_head_dim=dk, linear_value_head_dim=dv,
        linear_conv_kernel_dim=K, num_hidden_layers=1, layer_types=["linear_attention"],
        vocab_size=10, num_experts=0)


def run(B, S, mode, prec, dims, setup=None, input_grad=True):
    dtype, amp = PRECISIONS[prec]
    cfg = config(dims)
    return trace(lambda: Qwen3NextGatedDeltaNet(cfg, 0), cfg, mode, B, S, dims[0], dtype,
                 autocast=amp, setup=setup, input_grad=input_grad)


def composite_hooks(mx, ev, frozen=False):
    """MARKs at the composite's backward boundaries (see the module doc); `frozen`: LoRA's view
    of the mixer (every parameter frozen but `in_proj_qkvz`'s, which stands for its adapter)."""
    if frozen:
        for n, p in mx.named_parameters():
            if not n.startswith("in_proj_qkvz"):
                p.requires_grad_(False)
    def mark(name):
        def hook(g):
            ev.append(("MARK", name))
        return hook

    def pre(_m, args):
        args[0].register_hook(mark("cstart"))

    def post(name):
        def f(_m, _args, out):
            if out.requires_grad:
                out.register_hook(mark(name))
        return f

    mx.out_proj.register_forward_pre_hook(pre)
    mx.in_proj_qkvz.register_forward_hook(post("qkvz_grad"))
    mx.in_proj_ba.register_forward_hook(post("ba_grad"))


def check_backward(B, S, prec, dims, frozen=False, input_grad=True):
    """The composite's backward (see the module doc); `frozen` / `input_grad=False`: LoRA's
    mixer (frozen parameters), its input without a gradient (the first layer under LoRA)."""
    ev = run(B, S, "train", prec, dims, setup=lambda mx, ev: composite_hooks(mx, ev, frozen),
             input_grad=input_grad)
    names = [e[1] for e in ev if e[0] == "MARK"]
    i0 = next(i for i, e in enumerate(ev) if e == ("MARK", "cstart"))
    # the composite ends when its input gradients exist: the first projection's backward
    # (its hook) follows the last of them
    i1 = min(i for i, e in enumerate(ev) if e[0] == "MARK" and e[1] in ("qkvz_grad", "ba_grad"))
    cur = 0
    for e in ev[:i0]:
        if e[0] != "MARK":
            cur = e[3]
    start = cur
    peak, at = start, i0
    for i in range(i0, i1):
        e = ev[i]
        if e[0] != "MARK":
            cur = e[3]
            if cur > peak:
                peak, at = cur, i
    end = cur
    h, Hk, Hv, dk, dv, K = dims
    z = 4 if prec.startswith("amp") or prec == "fp32" else 2
    p = 4 if prec.startswith("amp") or prec == "fp32" else 2
    # projections' outputs are 16-bit under autocast
    zo = 2 if prec.startswith("amp") else z
    t = B * S
    g_in = t * (2 * Hk * dk + 2 * Hv * dv) * zo + (t * 2 * Hv * zo if input_grad else 0)
    cd = 2 * Hk * dk + Hv * dv
    g_par = 0 if frozen else (cd * K + 2 * Hv + dv) * p
    out = {"marks": names, "start": start, "peak_above": peak - start, "end_minus_start": end - start,
           "grads_in": g_in, "grads_param": g_par, "temps": peak - start - g_in - g_par,
           "peak_op": ev[at]}
    return out, ev, (i0, at, i1)


def check_saved(B, S, prec, dims, frozen=False, input_grad=True):
    """The composite's saved bytes and its forward's last state update (`deltanet.rs`
    `Sizes::saved` (+ `saved_amp_delta` under autocast), `forward_loop` / `forward_loop_amp`):
    the bytes alive when the forward ends, less what memwall holds outside the composite — the
    input (its 16-bit cast under autocast), the output, `out_proj`'s input when `out_proj` trains
    and, under autocast, the projection weights' 16-bit casts the linears save (`in_proj_qkvz`'s
    and `in_proj_ba`'s when the input needs a gradient or the weight trains, `out_proj`'s) —;
    `loop`: the bytes alive at the chunk loop's last state `add` above the forward's end, plus
    the output and `out_proj`'s input (and its weight cast), less the projections' outputs."""
    ev = run(B, S, "train", prec, dims, setup=lambda mx, ev: composite_hooks(mx, ev, frozen),
             input_grad=input_grad)
    h, Hk, Hv, dk, dv, K = dims
    t, vd = B * S, Hv * dv
    amp = prec.startswith("amp")
    z = 2 if amp or prec in ("bf16", "fp16") else 4
    i1 = ev.index(("MARK", "fwd"))
    fw = [e for e in ev[:i1] if e[0] != "MARK"]
    end = fw[-1][3]
    outside = 2 * t * h * z + (0 if frozen else t * vd * z)
    if amp:
        outside += h * vd * 2
        if input_grad or not frozen:
            outside += (2 * Hk * dk + 2 * vd) * h * 2
        if input_grad:
            outside += 2 * Hv * h * 2
    adds = [e for e in fw if e[0] == "+" and e[1] == "add" and tuple(e[4]) == (B, Hv, dk, dv)]
    loop = None
    if adds:
        loop = (adds[-1][3] - end + 2 * t * h * z - t * h * z + t * vd * z
                - t * (2 * Hk * dk + 2 * vd) * z - t * 2 * Hv * z + (h * vd * 2 if amp else 0))
    return {"saved": end - outside, "loop": loop}


def check_unsaved(B, S, mode, prec, dims):
    """See the module doc (`--unsaved`)."""
    ev = run(B, S, mode, prec, dims)
    h, Hk, Hv, dk, dv, K = dims
    dtype, _ = PRECISIONS[prec]
    z = 4 if dtype == torch.float32 else 2
    t, vd, cd = B * S, Hv * dv, 2 * Hk * dk + Hv * dv
    state = B * Hv * dk * dv * 4
    out = {}
    end = ev.index(("MARK", "prefill" if mode == "infer" else "fwd"))
    mms = [i for i, e in enumerate(ev[:end]) if e[0] == "+" and e[1] == "mm"]
    i_ba, i_out = mms[1], mms[2]
    ref = ev[i_ba][3] + (B * cd * K * z if mode == "infer" else 0)
    pk = max(e[3] for e in ev[i_ba + 1:i_out] if e[0] != "MARK")
    at = max(range(i_ba + 1, i_out), key=lambda i: ev[i][3] if ev[i][0] != "MARK" else -1)
    out["peak"] = pk - ref
    out["peak_op"] = ev[at][:3] + ev[at][4:]
    cache_state = state if mode == "infer" else 0
    out["locals"] = ev[i_out][3] - ref - cache_state - t * vd * z - t * h * z
    if mode == "infer":
        d0 = end + 1
        d1 = ev.index(("MARK", "decode"))
        dm = [i for i, e in enumerate(ev[d0:d1], d0) if e[0] == "+" and e[1] == "mm"]
        # decode reference: the prefill's cache (conv, state) and the decode step's projections
        dref = ev[dm[1]][3]
        out["decode"] = max(e[3] for e in ev[dm[1] + 1:dm[2]] if e[0] != "MARK") - dref
        out["decode_locals"] = ev[dm[2]][3] - dref - B * vd * z - B * h * z
    return out


def check_forward(B, S, prec, dims, cache=True):
    """`--forward` (train / train-cache): the training forward's peak and end as memwall's
    timeline of the mixer has them (`deltanet.rs` `Sizes::forward_peak`): every storage the
    mixer allocates from `in_proj_qkvz`'s output on (its input and parameters excluded) —
    `peak`, the highest bytes alive up to the forward's return, and `end`, those alive when it
    returns (the saved tensors, the cache, `out_proj`'s input and output); `peak_op`, the op
    at the peak."""
    ev = run(B, S, "train-cache" if cache else "train", prec, dims)
    i1 = ev.index(("MARK", "fwd"))
    fw = [e for e in ev[:i1] if e[0] != "MARK"]
    at = max(range(len(fw)), key=lambda i: fw[i][3])
    return {"peak": fw[at][3], "end": fw[-1][3], "peak_op": fw[at][:3] + fw[at][4:]}


if __name__ == "__main__":
    B, S, mode, prec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dims = tuple(int(v) for v in sys.argv[5].split(","))
    if "--real" in sys.argv:
        # real CPU tensors instead of fake ones (fake must equal real: the same events)
        import contextlib, mixer_trace
        mixer_trace.FakeTensorMode = contextlib.nullcontext
    if "--forward" in sys.argv:
        print(check_forward(B, S, prec, dims, cache=mode == "train-cache"))
    elif "--unsaved" in sys.argv:
        print(check_unsaved(B, S, mode, prec, dims))
    elif "--saved" in sys.argv:
        print(check_saved(B, S, prec, dims, frozen="--frozen" in sys.argv,
                          input_grad="--no-input-grad" not in sys.argv))
    elif "--check-backward" in sys.argv:
        res, ev, (i0, at, i1) = check_backward(B, S, prec, dims, frozen="--frozen" in sys.argv,
                                               input_grad="--no-input-grad" not in sys.argv)
        if "trace" in sys.argv:
            for i, e in enumerate(ev[i0:i1 + 1], i0):
                print("*" if i == at else " ", *e)
        print(res)
    else:
        ev = run(B, S, mode, prec, dims)
        if sys.argv[6:7] == ["trace"]:
            for e in ev: print(*e)
        print(marks(ev))
