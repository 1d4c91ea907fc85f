#!/usr/bin/env python3
"""Measure cases as measure.py does, but with ModTracker's multi-grad hook keeping no gradients.

    $PY tools/truth/probes/modtracker_grad_hold.py tools/truth/cases/random_new_train.toml \
        rnd-t29-084-granitemoehybrid rnd-t61-043-granitemoehybrid rnd-t53-024-falconh1

MemTracker's ModTracker registers `register_multi_grad_hook(inputs, fn)` (mode "all") on every
module's inputs that require grad; the hook keeps each input's gradient in its buffer until the
last input's gradient has arrived, then calls `fn` (which ignores them). A module whose inputs
get their gradients far apart therefore keeps the early ones alive in between, which a plain
PyTorch run does not: the Mamba-2 gated norm `norm(y, gate)` gets y's gradient at its own
backward but the gate's only when `zxbcdt`'s split runs, at the end of the mixer's backward, so
the scan output's fp32 gradient (tokens x inner) is held through the scan's backward (found by
helper 43: rnd-t29-084-granitemoehybrid 41,910,864 -> 41,254,992, rnd-t61-043-granitemoehybrid
97,910,136 -> 97,149,816, rnd-t53-024-falconh1 130,007,880 -> 128,994,120 bytes without the
hold; memwall estimates 41,299,568, 97,149,684, 128,986,276). This probe replaces the hook with
one that counts the same way (measure.patch_mod_tracker_leaf_leak(hold_grads=False)) and keeps None.
Not a measurement (measure.py is).
"""
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import measure  # noqa: E402

# the harness's own replacement of ModTracker's multi-grad hook, keeping no gradient
measure.patch_mod_tracker_leaf_leak = functools.partial(
    measure.patch_mod_tracker_leaf_leak, hold_grads=False
)

if __name__ == "__main__":
    cases = measure.load_cases(Path(sys.argv[1]))
    for cid in sys.argv[2:]:
        case = next(c for c in cases if c["id"] == cid)
        row = measure.run_case(case)
        print(cid, row["measured"]["peak_bytes"], flush=True)
