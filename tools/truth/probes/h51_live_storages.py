#!/usr/bin/env python3
"""Which storages are alive at chosen instants of one training step on fake CPU tensors (helper 51).

    $PY tools/truth/probes/h51_live_storages.py attention rnd-s197-deepseekv3-0 2 30 eager bf16
    $PY tools/truth/probes/h51_live_storages.py attention rnd-s197-gemma3text-0 6 169 sdpa amp-bf16
    $PY tools/truth/probes/h51_live_storages.py positions rnd-s157-olmo2-0 2 164 sdpa amp-bf16
    $PY tools/truth/probes/h51_live_storages.py loss rnd-s197-deepseekv3-0 2 30 eager bf16

Builds the model as measure.py does (`build_config`/`build_model`, the packed-sequence detection
answered "none", the model in bf16/fp16 or fp32 with CPU autocast for amp-*), under a dispatch
mode that records every non-parameter storage an op creates (the op, shape and dtype, labelled by
the last module whose forward started), then prints the live ones:

* `attention`: at layer 0's attention entry, at its o_proj entry and when it returns (the
  one-head MLA's kv_b_proj output kept by the value's bmm and the training cache's `cat`
  copies; a single kv head's full-size autocast casts under SDPA; Gemma's fp32 `1 + weight`);
* `positions`: the int64 [S] storages alive at every decoder layer's backward start and end,
  with gradient checkpointing on (the `position_ids` keyword held by each checkpoint);
* `loss`: the int64 and 0-dim storages alive at `_log_softmax`, `nll_loss_backward` and
  `_log_softmax_backward_data` (ForCausalLMLoss's padded and shifted labels).

Not a measurement (measure.py is).
"""
import contextlib
import sys
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from measure import build_config, build_model  # noqa: E402

MODE, CFG, B, S, ATTN, PREC = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
import transformers.masking_utils as _mu  # noqa: E402

_mu.find_packed_sequence_indices = lambda position_ids: None
cfg = build_config(CFG, "config")
mdt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PREC, torch.float32)
adt = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(PREC)
live = {}
where = ["-"]
count = [0]
WATCH = ("_log_softmax.default", "nll_loss_backward", "_log_softmax_backward_data")


def prune():
    for k in [k for k, v in live.items() if v[0]() is None]:
        del live[k]


def dump(tag, keep=lambda v: True):
    prune()
    rows = sorted((v for v in live.values() if keep(v)), key=lambda v: v[2])
    print(f"== {tag}: {sum(v[1] for v in rows)} B")
    for v in rows:
        print(f"  {v[1]:>10} #{v[2]} {v[3]}")


def small(v):
    return "int64" in v[3] or " () " in v[3]


class Track(TorchDispatchMode):
    def __init__(self, params):
        super().__init__()
        self.params = params

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if MODE == "loss" and any(w in str(func) for w in WATCH):
            dump(f"at {func}", small)
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                st = o.untyped_storage()
                if id(st) not in live and id(st) not in self.params:
                    count[0] += 1
                    live[id(st)] = (weakref.ref(st), st.nbytes(), count[0],
                                    f"{where[0]} {func} {tuple(o.shape)} {o.dtype}")
        return out


with FakeTensorMode():
    torch.set_default_dtype(mdt)
    model = build_model(cfg, attn_implementation=ATTN, dtype=mdt)
    torch.set_default_dtype(torch.float32)
    if MODE == "positions":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    for n, m in model.named_modules():
        m.register_forward_pre_hook(lambda m, a, n=n: where.__setitem__(0, n))
    layers = model.model.layers
    if MODE == "attention":
        sa = layers[0].self_attn
        sa.register_forward_pre_hook(lambda m, a: dump("layer 0 attention entry"))
        sa.o_proj.register_forward_pre_hook(lambda m, a: dump("layer 0 o_proj entry"))
        sa.register_forward_hook(lambda m, a, o: dump("layer 0 attention return"))
    if MODE == "positions":
        positions = lambda v: "int64" in v[3] and f"({S},)" in v[3]  # noqa: E731
        for i, layer in enumerate(layers):
            layer.register_full_backward_pre_hook(
                lambda m, g, i=i: dump(f"layer {i} backward start", positions))
            layer.register_full_backward_hook(
                lambda m, gi, go, i=i: dump(f"layer {i} backward end", positions))
    params = {id(t.untyped_storage()) for t in list(model.parameters()) + list(model.buffers())}
    ids = torch.randint(0, cfg.vocab_size, (B, S))
    with Track(params):
        with torch.autocast("cpu", dtype=adt) if adt else contextlib.nullcontext():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
