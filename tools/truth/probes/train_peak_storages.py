"""The storages alive at the measured peak of one training case (debugging aid).

    $PY tools/truth/probes/train_peak_storages.py tools/truth/cases/random_train.toml rnd-t157-024-falcon

The training counterpart of infer_peak_storages.py: runs measure.run_case (the measurement
itself: two steps under MemTracker on fake tensors) with measure.fast_update_peak_stats wrapped
so that every time the running peak moves the tracked storages are listed. Prints the measured
peak, the innermost modules active at it and every storage of 4,000 bytes or more alive then
(bytes, MemTracker reference type: PARAM, BUFFER, GRAD, ACT, TEMP, OPT). Compare with the
simulator's live tensors at its own peak. Used to find helper 50's LoRA sum (AddBackward hands
the sum's gradient to both operands: rnd-t157-024-falcon, one bf16 [43, 288] temporary fewer
than the simulator had).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import measure  # noqa: E402

orig = measure.fast_update_peak_stats
snap: dict = {}


def patched(tracker, peak_state) -> bool:
    moved = orig(tracker, peak_state)
    if moved:
        snap["live"] = sorted(
            ((winfo.mem_consumed, str(winfo.reftype).split(".")[-1])
             for winfo, _ in list(tracker._WINFO.values())),
            reverse=True,
        )
        snap["parents"] = sorted(tracker._mod_tracker.parents)[-3:]
    return moved


measure.fast_update_peak_stats = patched
cases = measure.load_cases(Path(sys.argv[1]))
case = next(c for c in cases if c["id"] == sys.argv[2])
r = measure.run_case(case)
print(r["measured"]["peak_bytes"], r["measured"]["phase"], snap["parents"])
for b, t in snap["live"]:
    if b >= 4000:
        print(b, t)
