"""Which tensors are alive at the backward peak of one training step (debugging aid).

    $PY tools/truth/probes/live_tensors_train.py tests/truth/configs/sw6-llama4.json 1 33 fp16

The training counterpart of live_tensors.py: builds the model from the config in fp32 on fake CPU
tensors, runs two steps (forward under CPU autocast in fp16/bf16 when the last argument says so,
`none` for none; loss; backward), like measure.py, under a dispatch mode that tracks every
storage an op creates, and prints the live non-parameter storages after the second forward (by
the module that made them, and each one of layer 3) and at the second backward's peak.  Labels
are the last module whose forward started, so a storage made between modules carries the
previous one's name.  Not a measurement (measure.py is).  Used to find llama4_text's autocast
expert weight casts (`Llama4TextExperts`' bmm, issue 14).
"""
import sys, weakref, collections
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM
cfg_path, batch, seq, amp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = AutoConfig.from_pretrained(cfg_path)
live = {}
peak = {"bytes": 0}
where = ["-"]
phase = ["fw"]
class Track(TorchDispatchMode):
    def __init__(self, params): super().__init__(); self.params = params
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                st = o.untyped_storage(); key = id(st)
                if key not in live and key not in self.params:
                    live[key] = (weakref.ref(st), st.nbytes(), f"{phase[0]} {where[0]} {func} {tuple(o.shape)} {o.dtype}")
        for k in [k for k, v in live.items() if v[0]() is None]: del live[k]
        total = sum(v[1] for v in live.values())
        if phase[0] == "bw" and total > peak["bytes"]:
            peak.update(bytes=total, op=f"{where[0]} {func}", top=sorted(((v[1], v[2]) for v in live.values()), reverse=True))
        return out
with FakeTensorMode():
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    for n, m in model.named_modules():
        m.register_forward_pre_hook(lambda m, a, n=n: where.__setitem__(0, n))

    params = {id(t.untyped_storage()) for t in list(model.parameters()) + list(model.buffers())}
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    with Track(params):
        for it in range(2):
            phase[0] = "fw"
            ctx = torch.autocast("cpu", dtype=torch.float16) if amp == "fp16" else torch.autocast("cpu", dtype=torch.bfloat16) if amp == "bf16" else torch.autocast("cpu", enabled=False)
            with ctx:
                loss = model(input_ids=ids, labels=ids).loss
            if it == 1:
                tot = sum(v[1] for v in live.values())
                print("after forward live non-param", tot)
                agg = collections.Counter()
                for v in live.values():
                    agg[v[2].split(" ")[1].rsplit(".", 0)[0]] += v[1]
                for k, b in sorted(agg.items()): print(f"{b:>10d} {k}")
                for v in sorted(live.values(), key=lambda v: v[2]):
                    if "layers.3" in v[2]: print("   L3", v[1], v[2])
            phase[0] = "bw" if it == 1 else "bw0"
            loss.backward(); del loss
            for p in model.parameters(): p.grad = None
print("bw peak non-param", peak["bytes"], "at", peak["op"])
for b, w in peak["top"]: print(f"{b:>10d} {w}")
