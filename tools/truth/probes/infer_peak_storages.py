"""The storages alive at the measured peak of one inference case (debugging aid).

    $PY tools/truth/probes/infer_peak_storages.py tools/truth/cases/random_infer.toml rnd-i17-051-qwen3

Runs measure_infer.run_case (the measurement itself: generate's prefill and decode under
MemTracker on fake tensors) with two hooks: MemTracker's dispatch remembers which op last
returned a tensor on each storage, and every time the running peak moves the tracked storages
are listed. Prints the measured result, the op at which the peak was reached and every storage
alive then (bytes, MemTracker reference type, the last op that returned a view or tensor on
it: a view's op names the storage, so read the shape with care; a freed storage's address
may be reused, so a label can be stale). Used to find helper 42's mechanisms (OLMo 2's fp32
rotary, repeat_kv's copies through the contiguous copy, position ids, sliding caches).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import measure  # noqa: E402
import measure_infer  # noqa: E402
import torch  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

toml, case_id = sys.argv[1], sys.argv[2]
labels: dict[int, str] = {}
state: dict = {"op": None, "dump": None}
update_peak = measure.fast_update_peak_stats


def update_and_dump(tracker, peak_state):
    moved = update_peak(tracker, peak_state)
    if moved:
        items = [(w.mem_consumed, str(w.reftype).split(".")[-1], labels.get(st._cdata, "?"))
                 for st, (w, _) in list(tracker._WINFO.items())]
        state["dump"] = (state["op"], sorted(items, key=lambda x: -x[0]))
    return moved


measure.fast_update_peak_stats = update_and_dump
dispatch = MemTracker.__torch_dispatch__


def labelled_dispatch(self, func, types, args=(), kwargs=None):
    state["op"] = str(func)
    res = dispatch(self, func, types, args, kwargs)
    for o in res if isinstance(res, (tuple, list)) else (res,):
        if isinstance(o, torch.Tensor):
            labels[o.untyped_storage()._cdata] = f"{func} {tuple(o.shape)} {o.dtype}"
    return res


MemTracker.__torch_dispatch__ = labelled_dispatch

case = next(c for c in measure_infer.load_cases(Path(toml)) if c["id"] == case_id)
res = measure_infer.run_case(case, debug=True)
print("peak", res["measured"]["peak_bytes"], res["measured"]["at_peak"])
op, items = state["dump"]
print("at op", op, "sum", sum(i[0] for i in items))
for nbytes, reftype, label in items:
    if reftype != "PARAM":
        print(f"{nbytes:>12} {reftype:<8} {label}")
