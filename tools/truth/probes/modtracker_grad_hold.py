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
one that counts the same way (measure.patch_mod_tracker_leaf_leak's replacement) and keeps None.
Not a measurement (measure.py is).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import measure  # noqa: E402
import torch  # noqa: E402

_leaf_patch = measure.patch_mod_tracker_leaf_leak


def patch_without_grad_hold() -> None:
    _leaf_patch()
    import torch.distributed._tools.mod_tracker as mod_tracker
    from torch.autograd.graph import _get_grad_fn_or_grad_acc

    inner = mod_tracker.register_multi_grad_hook

    class _Handles:
        def __init__(self, handles):
            self.handles = handles

        def remove(self):
            for h in self.handles:
                h.remove()

    def register_multi_grad_hook(tensors, fn, *, mode="all"):
        if mode != "all":
            return inner(tensors, fn, mode=mode)
        n = len(tensors)
        state = {"grad_fns": [_get_grad_fn_or_grad_acc(t) for t in tensors], "expected": 0}
        calls = {}

        def hook_for(idx):
            def hook(grad):
                task = torch._C._current_graph_task_id()
                seen = calls.get(task, 0)
                calls[task] = seen + 1
                if seen == 0 and state["grad_fns"] is not None:
                    state["expected"] = sum(map(torch._C._will_engine_execute_node, state["grad_fns"]))
                    state["grad_fns"] = None
                if seen == state["expected"] - 1:
                    del calls[task]
                    fn([None] * n)

            return hook

        return _Handles([t.register_hook(hook_for(i)) for i, t in enumerate(tensors)])

    mod_tracker.register_multi_grad_hook = register_multi_grad_hook


measure.patch_mod_tracker_leaf_leak = patch_without_grad_hold

if __name__ == "__main__":
    cases = measure.load_cases(Path(sys.argv[1]))
    for cid in sys.argv[2:]:
        case = next(c for c in cases if c["id"] == cid)
        row = measure.run_case(case)
        print(cid, row["measured"]["peak_bytes"], flush=True)
