#!/usr/bin/env python3
"""Measure the peak memory of greedy generation (1 prefill forward + N-1 decode forwards with
transformers' default DynamicCache) with PyTorch's MemTracker on fake tensors (FakeTensorMode,
CPU device).  See the "Inference" section of tools/truth/README.md for the semantics.

Usage:
  python tools/truth/measure_infer.py                    # all cases of tools/truth/cases/infer.toml
  python tools/truth/measure_infer.py --only gpt2        # cases whose id contains "gpt2"
  python tools/truth/measure_infer.py --missing          # cases not yet in tests/truth/infer.jsonl
  python tools/truth/measure_infer.py --debug ID         # print the result + phase marks (not written)
  python tools/truth/measure_infer.py --jobs 2           # worker processes (default 2)

Reuses build_config / fast_mem_tracker_class from measure.py (training harness).  The parent
process never imports torch: every case runs in its own fresh worker subprocess (`--worker`),
and the parent is the only writer of tests/truth/infer.jsonl (atomic replace, sorted by id).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import build_config, build_model, check_image_tokens, fast_mem_tracker_class, image_inputs, llama4_config, read_case_specs, read_existing, run_cases, worker_main  # noqa: E402  (torch imported lazily there)

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tools/truth/cases/infer.toml"
OUT = REPO / "tests/truth/infer.jsonl"
CONFIG_DIR = REPO / "tests/truth/configs"

DEFAULTS = {
    "batch": 1,
    "prompt": 512,
    "new_tokens": 16,
    "weights": "bf16",
    "attention": "sdpa",
    "decode_experts": "batched_mm",
    "image_tokens": None,
}
WEIGHTS = {"bf16", "fp16", "fp32"}


def load_cases(path: Path = CASES) -> list[dict]:
    cases = []
    for case in read_case_specs(path, DEFAULTS):
        cid = case["id"]
        if case["weights"] not in WEIGHTS:
            raise SystemExit(f"{cid}: bad weights {case['weights']} (one of {sorted(WEIGHTS)})")
        if case["attention"] not in ("sdpa", "eager"):
            raise SystemExit(f"{cid}: bad attention {case['attention']}")
        if case["decode_experts"] not in ("batched_mm", "grouped_mm"):
            raise SystemExit(f"{cid}: bad decode_experts {case['decode_experts']}")
        if int(case["new_tokens"]) < 1 or int(case["batch"]) < 1 or int(case["prompt"]) < 1:
            raise SystemExit(f"{cid}: batch/prompt/new_tokens must be >= 1")
        if not (CONFIG_DIR / f"{case['config']}.json").exists():
            raise SystemExit(f"{cid}: missing config {case['config']}")
        check_image_tokens(case)
        cases.append(case)
    return cases


# ----------------------------------------------------------------------------------------------
# worker side (imports torch)
# ----------------------------------------------------------------------------------------------

def versions() -> dict:
    import platform

    import torch
    import transformers

    return {
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one storage counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or not hasattr(t, "untyped_storage"):
            continue
        st = t.untyped_storage()
        key = st._cdata if hasattr(st, "_cdata") else id(st)
        if key in seen:
            continue
        seen.add(key)
        total += st.nbytes()
    return total


def cache_bytes(cache) -> int:
    tensors = []
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values", "indexer_keys"):
            t = getattr(layer, name, None)
            if t is not None and hasattr(t, "untyped_storage"):
                tensors.append(t)
        # linear-attention / state-space layers (cache_utils.LinearAttentionCacheLayerMixin):
        # the fixed-size conv and recurrent states, one per state index
        for name in ("conv_states", "recurrent_states"):
            states = getattr(layer, name, None)
            if isinstance(states, dict):
                tensors.extend(t for t in states.values() if t is not None)
    return _storage_bytes(tensors)


def _snap_breakdown(snap: dict) -> dict:
    out = {}
    for k, v in snap.items():
        if k == "Total":
            continue
        out[k.value.lower() if hasattr(k, "value") else str(k).lower()] = int(v)
    return out


def run_case(case: dict, debug: bool = False, real: bool = False) -> dict:
    """Measure one case; real=True runs it on real CPU tensors (tools/truth/crosscheck.py)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM, DynamicCache

    # Same workaround as measure.py: with fake tensors masking_utils thinks it is tracing and
    # would report a packed-sequence mask; on real unpacked inputs the answer is None.
    import transformers.masking_utils as _mu

    _mu.find_packed_sequence_indices = lambda position_ids: None

    cfg = build_config(case["config"], "config", whole=bool(case.get("image_tokens")))  # eval mode: dropout is inactive anyway
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case["weights"]]
    cpu = torch.device("cpu")
    B, S, N = int(case["batch"]), int(case["prompt"]), int(case["new_tokens"])

    import contextlib

    n_image = case.get("image_tokens")
    # image inputs run on real CPU tensors (the vision tower reads tensor data; measure.py),
    # but llama4's, whose tower reads none (the placeholder-count check switched off)
    fake = not real and (not n_image or llama4_config(case["config"]))
    if n_image and fake:
        import os

        os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    with (FakeTensorMode() if fake else contextlib.nullcontext()):
        torch.set_default_dtype(dtype)
        try:
            # dtype explicit: from_config would otherwise honour a `torch_dtype` in the config
            model = build_model(cfg, attn_implementation=case["attention"], dtype=dtype)
        finally:
            torch.set_default_dtype(torch.float32)
        model.eval()
        all_params = {id(p): p for p in model.parameters()}
        params_total = sum(p.numel() for p in all_params.values())

        # MoE: on a non-CPU device generate() switches grouped_mm -> batched_mm for the decode
        # loop (GenerationMixin._optimize_model_for_decode).  We are on CPU, so we do the switch
        # ourselves to mirror a GPU run (decode_experts = "batched_mm", the default).
        experts_impl = None
        try:
            experts_impl = model.get_experts_implementation()
        except Exception:
            experts_impl = None
        switch_moe = (
            case["decode_experts"] == "batched_mm"
            and isinstance(experts_impl, dict)
            and "grouped_mm" in experts_impl.values()
        )

        text_cfg = model.config.get_text_config(decoder=True)
        vocab = text_cfg.vocab_size
        # generate() hands the cache over as `cache_params` to classes whose name contains "mamba"
        # and as `past_key_values` to all others (GenerationMixin._prepare_cache_for_generation,
        # transformers 5.23 generation/utils.py); Mamba2ForCausalLM ignores `past_key_values`.
        cache_kw = "cache_params" if "mamba" in type(model).__name__.lower() else "past_key_values"

        image_kwargs = {}
        if n_image:
            # the processor's outputs, made before generate() (like the prompt, not its tensors)
            image_ids, image_kwargs = image_inputs(model.config, B, S, int(n_image), dtype)

        mt = fast_mem_tracker_class()()
        mt.track_external(model)

        def running_peak() -> int:
            return mt._peak_mem.get(cpu, 0)

        def current() -> int:
            return mt._curr_mem_snap.get(cpu, {}).get("Total", 0)

        marks: list[tuple[str, int]] = []
        info: dict = {}
        t0 = time.time()
        with mt, torch.no_grad():
            # generate()'s own tensors: the prompt ids (grown by torch.cat every step) and the
            # default all-ones 2-D attention mask (_prepare_attention_mask_for_generation; grown by
            # torch.cat in _update_model_kwargs_for_generation).  The mask is kept and grown but
            # NOT passed to the model (see README: a fake mask defeats SDPA's mask skipping).
            input_ids = image_ids.clone() if n_image else torch.randint(0, vocab, (B, S))
            attention_mask = torch.ones((B, S), dtype=torch.long)
            unfinished = torch.ones(B, dtype=torch.long)
            cache = DynamicCache(config=text_cfg)
            marks.append(("start", running_peak()))
            next_token_logits = None
            next_tokens = None
            for step in range(N):
                if step == 0:
                    # prepare_inputs_for_generation clones the (sliced) input ids
                    model_in = input_ids.clone(memory_format=torch.contiguous_format)
                    # pixels go to the prefill only (prepare_inputs_for_generation drops them after)
                    out = model(input_ids=model_in, **{cache_kw: cache}, use_cache=True, logits_to_keep=1, **image_kwargs)
                else:
                    if step == 1:
                        marks.append(("prefill", running_peak()))
                        info["after_prefill_bytes"] = current()
                        info["cache_after_prefill_bytes"] = cache_bytes(cache)
                        if switch_moe:
                            model.set_experts_implementation(
                                {k: "batched_mm" if v == "grouped_mm" else v for k, v in experts_impl.items()}
                            )
                    # MemTracker refuses a second forward of a module without a reset: this clears
                    # only the per-module timeline, never the running peak.
                    mt.reset_mod_stats()
                    model_in = input_ids[:, -1:].clone(memory_format=torch.contiguous_format)
                    out = model(input_ids=model_in, **{cache_kw: cache}, use_cache=True, logits_to_keep=1)
                del model_in
                # _update_model_kwargs_for_generation: attention mask grows by one column
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones((B, 1))], dim=-1)
                # _sample: fp32 copy of the last position's logits (kept until the next step
                # overwrites the variable, i.e. alive during the next forward), greedy argmax
                next_token_logits = out.logits[:, -1].to(copy=True, dtype=torch.float32, device=input_ids.device)
                next_tokens = torch.argmax(next_token_logits, dim=-1)
                input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
                unfinished = unfinished & torch.ones(B, dtype=torch.bool)  # stopping criteria (tiny)
                del out  # as _sample does, before the next forward
            marks.append(("prefill" if N == 1 else "decode", running_peak()))
            if N == 1:
                info["after_prefill_bytes"] = current()
                info["cache_after_prefill_bytes"] = cache_bytes(cache)
            final_bytes = current()
            final_snap = dict(mt._curr_mem_snap.get(cpu, {}))
            final_cache = cache_bytes(cache)
        elapsed = time.time() - t0

        peak_snap = mt.get_tracker_snapshot("peak").get(cpu)
        if peak_snap is None:
            raise RuntimeError(f"no cpu peak snapshot: {mt.get_tracker_snapshot('peak')}")
        peak = int(peak_snap["Total"])
        phase = None
        for name, value in marks[1:]:
            if value >= peak:
                phase = name
                break
        prefill_peak = next(v for n, v in marks if n == "prefill")
        at_peak = _snap_breakdown(peak_snap)
        if sum(at_peak.values()) != peak:
            raise RuntimeError("breakdown does not sum to total")
        if debug:
            print(f"# {case['id']}: peak {peak} in {phase}; marks {marks}")
            print(f"# at_peak {at_peak}; final {final_bytes} {_snap_breakdown(final_snap)}; info {info}")
            print(f"# experts_impl {experts_impl} switched={switch_moe}; cache layers "
                  f"{[type(l).__name__ for l in cache.layers]}")

    result = {
        "id": case["id"],
        "kind": "infer",
        "config": f"tests/truth/configs/{case['config']}.json",
        "model_type": cfg.model_type,
        "batch": B,
        "prompt": S,
        "new_tokens": N,
        "weights": case["weights"],
        "attention": case["attention"],
    }
    if switch_moe or (isinstance(experts_impl, dict) and "grouped_mm" in experts_impl.values()):
        result["decode_experts"] = case["decode_experts"]
    if n_image:
        result["image_tokens"] = int(n_image)
        if not fake:
            result["tensors"] = "real"
    result["measured"] = {
        "peak_bytes": peak,
        "at_peak": at_peak,
        "phase": phase,
        "prefill_peak_bytes": int(prefill_peak),
        "final_bytes": int(final_bytes),
        "params_total": int(params_total),
        # extra fields (not required by the estimator contract)
        "after_prefill_bytes": int(info["after_prefill_bytes"]),
        "cache_after_prefill_bytes": int(info["cache_after_prefill_bytes"]),
        "final_cache_bytes": int(final_cache),
    }
    result["versions"] = versions()
    result["_seconds"] = round(elapsed, 1)
    return result


# ----------------------------------------------------------------------------------------------
# parent side
# ----------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="run only cases whose id contains this substring")
    ap.add_argument("--debug", help="measure one case id and print details (not written)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=400, help="seconds per case before it is killed")
    ap.add_argument("--cases", default=str(CASES))
    ap.add_argument("--missing", action="store_true", help="run only cases not yet in infer.jsonl")
    ap.add_argument("--first", help="comma-separated ids to run before the others (scheduling only)")
    ap.add_argument("--log", help="also append ok/FAIL lines to this file (default: stdout only)")
    ap.add_argument("--out", default=str(OUT), help="fixture file to write (default tests/truth/infer.jsonl)")
    ap.add_argument("--per-worker", type=int, default=1,
                    help="cases measured one after the other in one worker process (saves start-up)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        worker_main(args.worker, run_case)
        return

    cases = load_cases(Path(args.cases))
    if args.debug:
        case = next((c for c in cases if c["id"] == args.debug), None)
        if case is None:
            raise SystemExit(f"no case {args.debug}")
        res = run_case(case, debug=True)
        print(json.dumps(res, indent=1))
        return
    if args.only:
        cases = [c for c in cases if args.only in c["id"]]
    if args.missing:
        have = read_existing(Path(args.out))
        cases = [c for c in cases if c["id"] not in have]
    if args.first:
        first = args.first.split(",")
        cases.sort(key=lambda c: first.index(c["id"]) if c["id"] in first else len(first))

    failures = run_cases(
        Path(__file__), cases, args.jobs, args.timeout, Path(args.out),
        lambda m: f"phase={m['phase']} prefill_peak={m['prefill_peak_bytes']} final={m['final_bytes']}",
        Path(args.log) if args.log else None,
        per_worker=args.per_worker,
    )
    if failures:
        print(f"{len(failures)} failed: {failures}")

if __name__ == "__main__":
    main()
