"""The int64 label tensors of transformers' causal-LM loss: what is alive when (issue h54).

    $PY tools/truth/probes/loss_labels.py CONFIG BATCH SEQ [fake|real] [N_ACC] [ckpt]

Builds the model from CONFIG in fp32, runs `model(input_ids=ids, labels=ids).loss` and its
backward (like measure.py) under a dispatch mode that tracks every storage an op creates, and
prints, from the LM head's forward on, each op that creates an int64 storage or frees one, with
the int64 storages alive after it (bytes).  `fake` (default) runs on FakeTensorMode, `real` on
real CPU tensors, so the two can be compared (fake must equal real).  With `ckpt` the layers are
checkpointed (non-reentrant, as measure.py) and the int64 storages are listed from the start of
the forward: the base model's `position_ids` [1, S], held by every layer's checkpoint (the
`partial(forward, self, **kwargs)` of transformers' GradientCheckpointingLayer), stay alive
through the loss until the first layer's backward.  Not a measurement.
"""
import contextlib
import sys
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM

cfg_path, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "fake"
n_acc = int(sys.argv[5]) if len(sys.argv) > 5 else 1
ckpt = len(sys.argv) > 6 and sys.argv[6] == "ckpt"
cfg = AutoConfig.from_pretrained(cfg_path)
live = {}
state = {"on": False, "phase": "fw", "n": 0}
VERBOSE = False


class Track(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not state["on"]:
            return out
        made = []
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor) and o.dtype == torch.int64:
                st = o.untyped_storage()
                key = id(st)
                if key not in live:
                    live[key] = (weakref.ref(st), st.nbytes(), f"{tuple(o.shape)}")
                    made.append(live[key][2])
        gone = [k for k, v in live.items() if v[0]() is None]
        for k in gone:
            del live[k]
        if made or gone or (VERBOSE and state["phase"].startswith("bw") and state["n"] < 12):
            state["n"] += 1 if state["phase"].startswith("bw") else 0
            alive = sorted((v[1], v[2]) for v in live.values())
            print(f"{state['phase']} {func}: made {made} freed {len(gone)}; int64 alive {alive}")
        return out


ctx = FakeTensorMode() if mode == "fake" else contextlib.nullcontext()
with ctx:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.get_output_embeddings().register_forward_pre_hook(lambda m, a: state.update(on=True))
    ids = torch.randint(0, cfg.get_text_config().vocab_size, (batch, seq))
    with Track():
        for micro in range(n_acc):
            state.update(phase=f"fw{micro}", on=ckpt)
            loss = model(input_ids=ids, labels=ids).loss
            state.update(phase=f"bw{micro}")
            print(f"-- forward returned; int64 alive {sorted((v[1], v[2]) for v in live.values())}")
            if n_acc > 1:
                loss = loss / n_acc
            loss.backward()
            del loss
            print(f"-- backward done; int64 alive {sorted((v[1], v[2]) for v in live.values())}")
            state.update(on=False)
