#!/usr/bin/env python3
"""Measure the steady-state peak memory of ONE RANK of data-parallel LLM training (FSDP2
``fully_shard``, HSDP, torch DDP, composable ``replicate``) on fake tensors (FakeTensorMode, CPU
device) and a fake process group.  See the "Distributed training" section of
tools/truth/README.md for the semantics.

Usage:
  python tools/truth/measure_dist.py --jobs 2            # all cases of tools/truth/cases/dist.toml
  python tools/truth/measure_dist.py --only smollm       # cases whose id contains "smollm"
  python tools/truth/measure_dist.py --missing           # cases not yet in tests/truth/dist.jsonl
  python tools/truth/measure_dist.py --debug ID          # allocation timeline of one case (not written)
  python tools/truth/measure_dist.py --crosscheck ID,..  # same cases on REAL CPU tensors vs fake (log only)

Reuses build_config / versions / the ModTracker leak patch / the fast MemTracker and the
subprocess-per-case runner (read_existing / write_rows / run_cases) of measure.py.  The parent
never imports torch; each case runs in a fresh worker subprocess (the fake process group is
per-process state), and the parent is the only writer of tests/truth/dist.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import (  # noqa: E402  (torch is imported lazily inside these)
    build_config,
    fast_mem_tracker_class,
    fast_update_peak_stats,
    patch_mod_tracker_leaf_leak,
    read_case_specs,
    read_existing,
    run_cases,
    versions,
)

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tools/truth/cases/dist.toml"
OUT = REPO / "tests/truth/dist.jsonl"
LOG = REPO / "tools/truth/measure_dist.log"
CONFIG_DIR = REPO / "tests/truth/configs"

DEFAULTS = {
    "strategy": "fsdp",
    "world_size": 4,
    "replicate": 1,  # hsdp: size of the replicate mesh dim (mesh = (replicate, world_size // replicate))
    "reshard_after_forward": True,  # passed to every decoder-layer unit
    "root_reshard_after_forward": None,  # None: same as reshard_after_forward
    "mixed_precision": None,  # or {param_dtype = "bf16", reduce_dtype = "fp32"}
    "batch": 2,
    "seq": 512,
    "precision": "bf16",
    "optimizer": "adamw-forloop",
    "checkpointing": False,
    "attention": "sdpa",
    "grad_accum": 1,
    "dropout": "config",
    "lora": None,  # fsdp and hsdp only: {rank, targets[, alpha]}, peft LoraConfig applied before sharding
    "gradient_as_bucket_view": False,  # ddp only
    "bucket_cap_mb": 25,  # ddp only (torch default)
}
STRATEGIES = {"fsdp", "hsdp", "ddp", "replicate"}
OPTIMIZERS = {"adamw-forloop", "sgd", "adamw"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
LR = 1e-4

# at_peak keys of every row (FSDPMemTracker categories + one for DDP's gradient buckets)
AT_PEAK_KEYS = ("sharded_param", "unsharded_param", "buffer", "sharded_grad", "unsharded_grad",
                "activation", "temp", "all_gather", "reduce_scatter", "optstate", "inputs", "ddp_bucket")


def load_cases(path: Path = CASES) -> list[dict]:
    cases = []
    for case in read_case_specs(path, DEFAULTS):
        cid = case["id"]
        unknown = set(case) - set(DEFAULTS) - {"id", "config"}
        if unknown:
            raise SystemExit(f"{cid}: unknown fields {sorted(unknown)}")
        if case["strategy"] not in STRATEGIES:
            raise SystemExit(f"{cid}: bad strategy {case['strategy']}")
        if case["optimizer"] not in OPTIMIZERS:
            raise SystemExit(f"{cid}: bad optimizer {case['optimizer']}")
        if case["precision"] not in DTYPES:
            raise SystemExit(f"{cid}: bad precision {case['precision']}")
        if not 1 <= int(case["grad_accum"]) <= 4:
            raise SystemExit(f"{cid}: grad_accum must be 1..4")
        if case["grad_accum"] != 1 and case["strategy"] != "fsdp":
            raise SystemExit(f"{cid}: grad_accum > 1 is only implemented for fsdp")
        if case["attention"] not in ("sdpa", "eager"):
            raise SystemExit(f"{cid}: bad attention {case['attention']}")
        if case["dropout"] not in ("config", "off"):
            raise SystemExit(f"{cid}: bad dropout {case['dropout']}")
        if case["lora"] is not None and case["strategy"] not in ("fsdp", "hsdp"):
            raise SystemExit(f"{cid}: lora is only implemented for fsdp and hsdp")
        w, r = int(case["world_size"]), int(case["replicate"])
        if case["strategy"] == "hsdp":
            if r < 2 or w % r != 0 or w // r < 2:
                raise SystemExit(f"{cid}: hsdp needs replicate >= 2 dividing world_size")
        elif r != 1:
            raise SystemExit(f"{cid}: replicate only for hsdp")
        mp = case["mixed_precision"]
        if mp is not None:
            if case["strategy"] == "ddp":
                raise SystemExit(f"{cid}: mixed_precision is only implemented for fsdp/hsdp/replicate")
            if set(mp) != {"param_dtype", "reduce_dtype"} or not set(mp.values()) <= set(DTYPES):
                raise SystemExit(f"{cid}: bad mixed_precision {mp}")
        if not (CONFIG_DIR / f"{case['config']}.json").exists():
            raise SystemExit(f"{cid}: missing config {case['config']}")
        cases.append(case)
    return cases


# ----------------------------------------------------------------------------------------------
# worker side (imports torch)
# ----------------------------------------------------------------------------------------------

def decoder_layers(model):
    """The repeated decoder blocks, each of which becomes one FSDP unit."""
    # a peft model wraps the transformers model as `base_model.model` (PeftModelForCausalLM ->
    # LoraModel -> the model): search both, so every family's layer path holds with LoRA
    # (OPT's `model.decoder.layers` under peft was missing: rdist193-016-opt)
    roots = [model]
    inner = getattr(getattr(model, "base_model", None), "model", None)
    if inner is not None:
        roots.append(inner)
    for root in roots:
        for path in ("model.layers", "transformer.h", "model.decoder.layers", "gpt_neox.layers",
                     # Mamba2ForCausalLM: `backbone.layers` (models/mamba2/modeling_mamba2.py)
                     "backbone.layers"):
            obj = root
            try:
                for part in path.split("."):
                    obj = getattr(obj, part)
            except AttributeError:
                continue
            return list(obj)
    raise RuntimeError(f"no decoder layer list found in {type(model).__name__}")


def make_dist_optimizer(name: str, params):
    import torch

    params = list(params)
    if name == "adamw-forloop":
        return torch.optim.AdamW(params, lr=LR, foreach=False, fused=False)
    if name == "adamw":  # foreach (see README on foreach with DTensor parameters)
        return torch.optim.AdamW(params, lr=LR, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.0, foreach=False)
    raise ValueError(name)


def fsdp_tracker_class():
    """FSDPMemTracker with (1) measure.py's O(active modules) peak update, (2) activation-
    checkpointing recomputation counted as "Activation" (upstream detects recomputation only
    through FSDP's own pre-forward hook, which transformers >= 5 keeps *outside* the checkpointed
    region, so recomputed tensors would be filed as "Temp"; totals are unaffected), (3) a record
    of the last FSDP hook event before the peak, (4) an optional allocation log (--debug)."""
    from functools import wraps

    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import _UpdateType
    from torch.utils.weak import weakref

    patch_mod_tracker_leaf_leak()

    class DistMemTracker(FSDPMemTracker):
        def __init__(self, mod, optm=None, log_min_bytes: int | None = None) -> None:
            super().__init__(mod, optm)
            self._fqn_cache: dict[str, list] = {}
            self._fqn_cache_len = -1
            self.last_event = "start"
            self.peak_event = "start"
            self.log_min_bytes = log_min_bytes
            self.log: list[tuple] = []

        # --- event markers -------------------------------------------------------------
        def _name(self, mod) -> str:
            return self._mod_tracker.get_known_fqn(mod) or type(mod).__name__

        def _mark(self, what: str, mod) -> None:
            self.last_event = f"{what} {self._name(mod)}"
            if self.log_min_bytes is not None:
                snap = self._curr_mem_snap.get(next(iter(self._curr_mem_snap), None), {})
                self.log.append(("event", self.last_event, dict(snap)))

        def _wrap(self, what: str, mod, inner):
            @wraps(inner)
            def f(*args, **kwargs):
                self._mark(what + ">", mod)
                out = inner(*args, **kwargs)
                self._mark(what + "<", mod)
                return out

            return f

        def _fsdp_state_pre_forward(self, fsdp_mod, orig):
            return self._wrap("pre_forward", fsdp_mod, super()._fsdp_state_pre_forward(fsdp_mod, orig))

        def _fsdp_state_post_forward(self, fsdp_mod, orig):
            return self._wrap("post_forward", fsdp_mod, super()._fsdp_state_post_forward(fsdp_mod, orig))

        def _fsdp_param_group_pre_backward(self, fsdp_mod, orig):
            return self._wrap("pre_backward", fsdp_mod, super()._fsdp_param_group_pre_backward(fsdp_mod, orig))

        def _fsdp_param_group_post_backward(self, fsdp_mod, orig):
            return self._wrap("post_backward", fsdp_mod, super()._fsdp_param_group_post_backward(fsdp_mod, orig))

        # --- recomputation under activation checkpointing = "Activation" ---------------
        def _ac_pre_fw(self, module, inputs) -> None:
            if self._mod_tracker.is_bw and self._ac_mod is None:
                self._ac_mod = weakref.ref(module)
                self._in_ac = True

        def _ac_post_fw(self, module, inputs, outputs) -> None:
            if self._mod_tracker.is_bw and self._ac_mod is not None and self._ac_mod() is module:
                self._ac_mod = None
                self._in_ac = False

        def __enter__(self):
            if self._depth == 0:
                self._mod_tracker.register_user_hooks(self._ac_pre_fw, self._ac_post_fw)
            return super().__enter__()

        def __exit__(self, *args):
            super().__exit__(*args)
            if self._depth == 0:
                self._mod_tracker.clear_user_hooks()

        # --- allocation log ------------------------------------------------------------
        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            if self.log_min_bytes is None:
                return
            if u_type == _UpdateType.SIZE:
                delta = winfo.mem_consumed - old_mem_consumed
            else:
                delta = winfo.mem_consumed
            if abs(delta) >= self.log_min_bytes:
                self.log.append((u_type.name, winfo.reftype.value, delta,
                                 old_reftype.value if old_reftype is not None else None,
                                 self._in_opt, self._mod_tracker.is_bw))

        # --- peak update (same result as upstream, see measure.fast_mem_tracker_class) ---
        def reset_mod_stats(self) -> None:
            super().reset_mod_stats()
            self._fqn_cache_len = -1

        def _update_peak_stats(self, peak_state) -> None:
            if fast_update_peak_stats(self, peak_state):
                self.peak_event = self.last_event

    return DistMemTracker


def patch_dtensor_propagation_fake_mode() -> None:
    """DTensor sharding propagation (the uncached path, i.e. the first time an op/shape/placement
    combination is seen) builds *global-shape* tensors with ``torch.empty_strided`` under
    ``detect_fake_mode() or FakeTensorMode()``.  In a real run there is no active fake mode, so it
    uses a private FakeTensorMode and FSDPMemTracker skips those ops (it only counts ops whose
    active fake mode is the one it was entered under).  Under our outer FakeTensorMode,
    ``detect_fake_mode()`` returns that very mode, so the tracker counted the global-shape meta
    tensors as allocations (e.g. two full-size temporaries per parameter when AdamW creates its
    states in the first step).  Returning None here gives propagation a private fake mode, as in a
    real run; it only derives output metadata and allocates nothing the real computation uses."""
    import torch.distributed.tensor._sharding_prop as sp

    sp.detect_fake_mode = lambda *args, **kwargs: None


class _NoRebuildReducer:
    """Proxy for DDP's C++ Reducer whose ``_rebuild_buckets`` is a no-op (see README: the
    rebuild reads bucket indices from tensor data, which fake tensors do not have)."""

    def __init__(self, reducer) -> None:
        self.__dict__["_reducer"] = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._reducer, name)


def run_case(case: dict, debug: bool = False, fake: bool = True, debug_min_bytes: int = 1 << 20) -> dict:
    """Measure one case in this (fresh) process.  fake=False: real CPU tensors (--crosscheck)."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    patch_mod_tracker_leaf_leak()
    import transformers.masking_utils as _mu
    from transformers import AutoModelForCausalLM

    # see measure.py: a real run on unpacked inputs gets None here; fake tensors would build a mask
    _mu.find_packed_sequence_indices = lambda position_ids: None
    if fake and not os.environ.get("MEMWALL_NO_DTENSOR_PROP_PATCH"):  # env: only for probes/fsdp_foreach_fake.py
        patch_dtensor_propagation_fake_mode()

    strategy = case["strategy"]
    W = int(case["world_size"])
    R = int(case["replicate"])
    dt = lambda name: getattr(torch, DTYPES[name])  # noqa: E731
    model_dtype = dt(case["precision"])
    cpu = torch.device("cpu")

    dist.init_process_group("fake", rank=0, world_size=W, store=FakeStore())
    mesh = None
    if strategy in ("fsdp", "replicate"):
        mesh = init_device_mesh("cpu", (W,), mesh_dim_names=("replicate" if strategy == "replicate" else "shard",))
    elif strategy == "hsdp":
        mesh = init_device_mesh("cpu", (R, W // R), mesh_dim_names=("replicate", "shard"))

    cfg = build_config(case["config"], case["dropout"])
    layout = None
    with (FakeTensorMode() if fake else contextlib.nullcontext()):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=case["attention"], dtype=model_dtype)
        if case["checkpointing"]:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if case["lora"]:
            # as measure.py: peft defaults, adapters added before fully_shard (the FSDP + LoRA
            # recipe); the frozen base is sharded too, only adapter grads are reduce-scattered
            from peft import LoraConfig, get_peft_model

            from measure import _fake_swap_workaround

            lc = case["lora"]
            r = int(lc["rank"])
            lcfg = LoraConfig(r=r, lora_alpha=int(lc.get("alpha", 2 * r)), target_modules=list(lc["targets"]),
                              lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
            with _fake_swap_workaround():
                model = get_peft_model(model, lcfg)
        all_params = {id(p): p for p in model.parameters()}
        params_total = sum(p.numel() for p in all_params.values())
        lm_head = model.get_output_embeddings()

        if strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            if fake:
                # DDP's constructor checks that all ranks have the same parameter shapes by
                # reading a metadata tensor in C++; with fake tensors there is no data to read.
                # The check allocates nothing that outlives it (and runs before tracking).
                import torch.nn.parallel.distributed as _ddp_mod

                _ddp_mod._verify_param_shape_across_processes = lambda *a, **k: None
            root = DDP(model, gradient_as_bucket_view=bool(case["gradient_as_bucket_view"]),
                       bucket_cap_mb=case["bucket_cap_mb"])
            buckets_seen: dict[int, tuple] = {}
            tracker_box: list = []

            def allreduce_hook(state, bucket):
                # Memory-equivalent of DDP's built-in allreduce hook: divide in place, all-reduce in
                # place (a no-op on the fake process group), return the bucket buffer itself.
                from torch.distributed._tools.mem_tracker import _MemRefType

                buf = bucket.buffer()
                if tracker_box:
                    # The bucket storages are allocated by the C++ Reducer's constructor, before
                    # tracking starts; register the live storage (its own size) with the tracker.
                    # With gradient_as_bucket_view the same storage backs param.grad.
                    ref = _MemRefType.GRAD if case["gradient_as_bucket_view"] else _MemRefType.OTH
                    tracker_box[0]._update_and_maybe_create_winfos(buf, ref)
                buckets_seen[bucket.index()] = (buf.numel(), str(buf.dtype).replace("torch.", ""))
                buf.div_(W)
                dist.all_reduce(buf)
                fut = torch.futures.Future()
                fut.set_result(buf)
                return fut

            root.register_comm_hook(None, allreduce_hook)
            if fake:
                root.reducer = _NoRebuildReducer(root.reducer)
        else:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = case["mixed_precision"]
            mp_policy = (MixedPrecisionPolicy(param_dtype=dt(mp["param_dtype"]), reduce_dtype=dt(mp["reduce_dtype"]))
                         if mp else MixedPrecisionPolicy())
            raf = bool(case["reshard_after_forward"])
            root_raf = raf if case["root_reshard_after_forward"] is None else bool(case["root_reshard_after_forward"])
            if strategy == "replicate":
                from torch.distributed._composable.replicate_with_fsdp import replicate

                for layer in decoder_layers(model):
                    replicate(layer, mesh=mesh, mp_policy=mp_policy)
                replicate(model, mesh=mesh, mp_policy=mp_policy)
            else:
                for layer in decoder_layers(model):
                    fully_shard(layer, mesh=mesh, reshard_after_forward=raf, mp_policy=mp_policy)
                fully_shard(model, mesh=mesh, reshard_after_forward=root_raf, mp_policy=mp_policy)
            root = model
            # layout of the sharded parameters as FSDP set it up (introspection, not measurement)
            from torch.distributed.fsdp import FSDPModule

            shard_ws = {"fsdp": W, "hsdp": W // R, "replicate": 1}[strategy]
            units, per_unit = 0, {}
            for name, mod in model.named_modules():
                if not isinstance(mod, FSDPModule):
                    continue
                pg = mod._get_fsdp_state()._fsdp_param_group
                if pg is None:
                    continue
                units += 1
                numel = padded = shard = 0
                for fp in pg.fsdp_params:
                    numel += fp._orig_size.numel()
                    shard += fp.sharded_size.numel()  # this rank (rank 0 holds the largest chunks)
                    # every rank's shard is padded to chunk 0's size; all-gather output = S x that
                    padded += fp.padded_sharded_param_size.numel() * shard_ws
                per_unit[name or "<root>"] = {"numel": numel, "padded_numel": padded, "rank0_shard_numel": shard}
            first_layer = next((v for k, v in per_unit.items() if k != "<root>"), None)
            layout = {
                "units": units,
                "shard_world_size": shard_ws,
                "root_unit": per_unit.get("<root>"),
                "first_layer_unit": first_layer,
                "total": {k: sum(u[k] for u in per_unit.values()) for k in ("numel", "padded_numel", "rank0_shard_numel")},
            }
        model.train()
        opt = make_dist_optimizer(case["optimizer"], [p for p in root.parameters() if p.requires_grad])
        ids = torch.randint(0, cfg.vocab_size, (case["batch"], case["seq"]))

        if strategy == "ddp":
            from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType
            from torch.distributed._tools.mem_tracker import _MemRefType

            mt = fast_mem_tracker_class()()
            mt._ref_class = list(_MemRefType) + [_FSDPRefType.INP]  # snapshot keys
            mt.track_external(root, opt)
            mt._update_and_maybe_create_winfos(ids, _FSDPRefType.INP)
            tracker_box.append(mt)
        else:
            mt = fsdp_tracker_class()(root, opt, log_min_bytes=debug_min_bytes if debug else None)
            mt.track_inputs((ids,))

        # Per-phase peaks: at every phase boundary the tracker's running peak is read and reset
        # to the current usage, so each phase's own maximum is known; the step's peak is the
        # largest of them (same value and snapshot as one running peak over the whole step).
        phase_peaks: list[dict] = [{}, {}]  # per step: phase -> bytes
        best: list[dict] = [{}, {}]  # per step: {"bytes", "snap", "phase", "event"}
        state = {"step": 0, "in_model": False}

        def close_phase(name: str) -> None:
            st = state["step"]
            value = mt._peak_mem.get(cpu, 0)
            phase_peaks[st][name] = max(value, phase_peaks[st].get(name, 0))
            if value > best[st].get("bytes", -1):
                best[st] = {"bytes": value, "snap": dict(mt._peak_mem_snap.get(cpu, {})), "phase": name,
                            "event": getattr(mt, "peak_event", None)}
            mt._peak_mem = {dev: snap["Total"] for dev, snap in mt._curr_mem_snap.items()}
            mt._peak_mem_snap = {dev: dict(snap) for dev, snap in mt._curr_mem_snap.items()}
            if hasattr(mt, "last_event"):
                mt.peak_event = mt.last_event

        def lm_head_pre_hook(mod, args):
            if state["in_model"]:
                close_phase("forward")

        hook = lm_head.register_forward_pre_hook(lm_head_pre_hook)
        t0 = time.time()
        with mt:
            for it in range(2):
                state["step"] = it
                if it == 1:
                    # steady state: forget module stats AND the running peak of the first step
                    mt.reset_mod_stats()
                    mt._peak_mem = {dev: snap["Total"] for dev, snap in mt._curr_mem_snap.items()}
                    mt._peak_mem_snap = {dev: dict(snap) for dev, snap in mt._curr_mem_snap.items()}
                    if strategy != "ddp":
                        mt.peak_event = mt.last_event
                        mt.log.clear()
                n_acc = int(case["grad_accum"])
                for micro in range(n_acc):
                    if micro > 0:
                        # the tracker refuses a second forward of a module without a reset of
                        # its per-module stats (as in measure.py); the running peak is kept
                        mt.reset_mod_stats()
                    state["in_model"] = True
                    loss = root(input_ids=ids, labels=ids).loss
                    state["in_model"] = False
                    close_phase("loss")
                    # FSDP2 reduce-scatters every micro-batch (no set_requires_gradient_sync):
                    # the sharded gradients accumulate in place
                    (loss / n_acc if n_acc > 1 else loss).backward()
                    del loss
                    close_phase("backward")
                opt.step()
                opt.zero_grad(set_to_none=True)
                close_phase("optimizer")
        elapsed = time.time() - t0
        hook.remove()

        first_step_peak = best[0]["bytes"]
        peak_snap = best[1]["snap"]
        peak = peak_snap["Total"]
        if peak != best[1]["bytes"]:
            raise RuntimeError("peak snapshot does not match the peak")
        phase = best[1]["phase"]
        peak_event = best[1]["event"]
        marks = {"steady": phase_peaks[1], "first_step": phase_peaks[0]}
        names = {
            "Sharded Param": "sharded_param", "Unsharded Param": "unsharded_param", "Buffer": "buffer",
            "Sharded Grad": "sharded_grad", "Unsharded Grad": "unsharded_grad", "Activation": "activation",
            "Temp": "temp", "All Gather": "all_gather", "Reduce Scatter": "reduce_scatter",
            "OptState": "optstate", "Inputs": "inputs",
            # MemTracker (ddp) categories
            "Parameter": "sharded_param", "Gradient": "sharded_grad", "Optstate": "optstate", "Other": "ddp_bucket",
        }
        at_peak = dict.fromkeys(AT_PEAK_KEYS, 0)
        for k, v in peak_snap.items():
            if k == "Total":
                continue
            at_peak[names[k.value if hasattr(k, "value") else str(k)]] += int(v)
        if sum(at_peak.values()) != peak:
            raise RuntimeError("breakdown does not sum to total")

        if debug:
            print_debug(case, mt, marks, peak, phase, first_step_peak, at_peak, layout, cpu, peak_event)

    result = {"id": case["id"], "kind": "dist", "config": f"tests/truth/configs/{case['config']}.json",
              "model_type": cfg.model_type}
    for k in ("strategy", "world_size", "replicate", "reshard_after_forward", "root_reshard_after_forward",
              "mixed_precision", "batch", "seq", "precision", "optimizer", "checkpointing", "attention",
              "grad_accum", "dropout"):
        result[k] = case[k]
    if case["lora"] is not None:
        result["lora"] = {"rank": int(case["lora"]["rank"]),
                          "alpha": float(case["lora"].get("alpha", 2 * int(case["lora"]["rank"]))),
                          "targets": list(case["lora"]["targets"])}
    if strategy in ("fsdp", "hsdp"):
        result["reshard_after_forward"] = bool(case["reshard_after_forward"])
        result["root_reshard_after_forward"] = (result["reshard_after_forward"]
                                                if case["root_reshard_after_forward"] is None
                                                else bool(case["root_reshard_after_forward"]))
    else:  # ddp / replicate never shard: nothing to reshard
        result["reshard_after_forward"] = False
        result["root_reshard_after_forward"] = False
    if strategy == "ddp":
        result["gradient_as_bucket_view"] = bool(case["gradient_as_bucket_view"])
        result["bucket_cap_mb"] = case["bucket_cap_mb"]
    result["measured"] = {
        "peak_bytes": int(peak),
        "at_peak": at_peak,
        "phase": phase,
        "params_total": int(params_total),
        "first_step_peak_bytes": int(first_step_peak),
        "phase_peaks": {k: int(v) for k, v in phase_peaks[1].items()},
    }
    if strategy != "ddp":
        result["measured"]["peak_after_event"] = peak_event
        result["fsdp_layout"] = layout
    else:
        result["ddp_buckets"] = [{"index": i, "numel": n, "dtype": d} for i, (n, d) in sorted(buckets_seen.items())]
    result["versions"] = versions({"optimizer": case["optimizer"]})
    result["_seconds"] = round(elapsed, 1)
    return result


def print_debug(case, mt, marks, peak, phase, first_step_peak, at_peak, layout, cpu, peak_event) -> None:
    print(f"# case {case['id']}: steady-state peak {peak} B in {phase}; first-step peak {first_step_peak}")
    print(f"# at_peak {json.dumps(at_peak)}")
    print(f"# per-phase peaks: {marks}")
    if layout is not None:
        print(f"# fsdp layout {json.dumps(layout)}")
    if not hasattr(mt, "log"):
        return
    print(f"# peak reached after event: {peak_event}")
    short = {"Sharded Param": "shP", "Unsharded Param": "unP", "Buffer": "buf", "Sharded Grad": "shG",
             "Unsharded Grad": "unG", "Activation": "act", "Temp": "tmp", "All Gather": "AG",
             "Reduce Scatter": "RS", "OptState": "opt", "Inputs": "inp"}
    print("# allocation log of the steady step: 'event' lines = FSDP hook begin (>) / end (<) with the "
          "live bytes per category; other lines = storage ADD/DEL/SIZE(resize_)/REF(re-categorised) "
          f">= {mt.log_min_bytes} B")
    for entry in mt.log:
        if entry[0] == "event":
            _, name, snap = entry
            cats = " ".join(f"{short.get(getattr(k, 'value', k), k)}={v}" for k, v in snap.items()
                            if k != "Total" and v)
            print(f"== {name:<40} total={snap.get('Total', 0)}  {cats}")
        else:
            kind, ref, delta, old, in_opt, is_bw = entry
            where = "opt" if in_opt else ("bw" if is_bw else "fw")
            sign = {"ADD": "+", "DEL": "-", "SIZE": "~", "REF": "="}[kind]
            extra = f" (was {old})" if old else ""
            print(f"   {sign}{delta:>13} {ref}{extra} [{where}]")
    print("# per-unit snapshots (Total bytes) of the steady step")
    for ms in mt.memory_tracking.values():
        parts = []
        for st, snaps in ms.snapshots.items():
            vals = [s.get(cpu, {}).get("Total", 0) for s in snaps]
            parts.append(f"{st.name}={','.join(str(v) for v in vals)}")
        print(f"{ms.mod_fqn}\t" + "\t".join(parts))


# ----------------------------------------------------------------------------------------------
# parent side
# ----------------------------------------------------------------------------------------------

def _describe(m: dict) -> str:
    return f"phase={m['phase']} after='{m.get('peak_after_event', '-')}'"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="run only cases whose id contains this substring")
    ap.add_argument("--debug", help="print the allocation timeline of one case id (not written)")
    ap.add_argument("--debug-min-bytes", type=int, default=1 << 20, help="smallest storage event --debug prints")
    ap.add_argument("--crosscheck", help="comma-separated ids: measure on real CPU tensors too (log only)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=180, help="seconds per case before it is killed")
    ap.add_argument("--cases", default=str(CASES))
    ap.add_argument("--missing", action="store_true", help="run only cases not yet in dist.jsonl")
    ap.add_argument("--first", help="comma-separated ids to run before the others (scheduling only)")
    ap.add_argument("--out", default=str(OUT), help="fixture file (default tests/truth/dist.jsonl)")
    ap.add_argument("--log", default=str(LOG), help="run log appended to (default tools/truth/measure_dist.log)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-real", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        case = json.loads(args.worker)
        res = run_case(case, fake=not args.worker_real)
        print("RESULT " + json.dumps(res))
        return

    cases = load_cases(Path(args.cases))
    if args.debug:
        case = next((c for c in cases if c["id"] == args.debug), None)
        if case is None:
            raise SystemExit(f"no case {args.debug}")
        run_case(case, debug=True, debug_min_bytes=args.debug_min_bytes)
        return
    if args.crosscheck:
        crosscheck([c for c in cases if c["id"] in args.crosscheck.split(",")], args.timeout, Path(args.log))
        return

    if args.only:
        cases = [c for c in cases if args.only in c["id"]]
    if args.missing:
        have = read_existing(Path(args.out))
        cases = [c for c in cases if c["id"] not in have]
    if args.first:
        first = args.first.split(",")
        cases.sort(key=lambda c: first.index(c["id"]) if c["id"] in first else len(first))
    failures = run_cases(Path(__file__), cases, args.jobs, args.timeout, Path(args.out), _describe, Path(args.log))
    if failures:
        print(f"{len(failures)} failed: {failures}")


def crosscheck(cases: list[dict], timeout: float, log: Path = LOG) -> None:
    """Each case once on fake and once on real CPU tensors (fresh subprocesses); the comparison
    goes to stdout and measure_dist.log, nothing is written to dist.jsonl."""
    import subprocess

    for c in cases:
        res = {}
        for mode in ("fake", "real"):
            cmd = [sys.executable, str(Path(__file__)), "--worker", json.dumps(c)]
            if mode == "real":
                cmd.append("--worker-real")
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                res[mode] = None
                print(p.stdout[-2000:], p.stderr[-2000:])
            else:
                res[mode] = (json.loads(line[7:])["measured"], time.time() - t0)
        if res["fake"] and res["real"]:
            f, r = res["fake"][0], res["real"][0]
            diff = {k: r["at_peak"][k] - f["at_peak"][k] for k in AT_PEAK_KEYS if r["at_peak"][k] != f["at_peak"][k]}
            msg = (f"xc   {c['id']}: fake={f['peak_bytes']} real={r['peak_bytes']} "
                   f"diff={r['peak_bytes'] - f['peak_bytes']} first_step fake={f['first_step_peak_bytes']} "
                   f"real={r['first_step_peak_bytes']} phase fake={f['phase']} real={r['phase']} "
                   f"phase_peaks fake={f['phase_peaks']} real={r['phase_peaks']} "
                   f"at_peak diff(real-fake)={diff} wall fake={res['fake'][1]:.0f}s real={res['real'][1]:.0f}s")
        else:
            msg = f"xc   FAIL {c['id']}: fake={'ok' if res['fake'] else 'FAIL'} real={'ok' if res['real'] else 'FAIL'}"
        line = time.strftime("%H:%M:%S ") + msg
        print(line, flush=True)
        with open(log, "a") as lf:
            lf.write(line + "\n")


if __name__ == "__main__":
    main()
