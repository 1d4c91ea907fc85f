#!/usr/bin/env python3
"""Measure the steady-state peak memory of one LLM training step with PyTorch's MemTracker
on fake tensors (FakeTensorMode, CPU device).  See tools/truth/README.md for the semantics.

Usage:
  python tools/truth/measure.py                      # all cases of tools/truth/cases/train.toml
  python tools/truth/measure.py --only llama         # cases whose id contains "llama"
  python tools/truth/measure.py --debug ID           # per-module timeline of one case (not written)
  python tools/truth/measure.py --jobs 2             # worker processes (default 2)

The parent process never imports torch: every case runs in its own fresh worker subprocess
(`--worker`), and the parent is the only writer of tests/truth/train.jsonl (atomic replace).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tools/truth/cases/train.toml"
OUT = REPO / "tests/truth/train.jsonl"
CONFIG_DIR = REPO / "tests/truth/configs"

DEFAULTS = {
    "batch": 1,
    "seq": 512,
    "precision": "bf16",
    "optimizer": "adamw",
    "checkpointing": False,
    "attention": "sdpa",
    "lora": None,
    "qlora": False,
    "grad_accum": 1,
    "dropout": "config",
    "loss": "torch",
    "padding_free": False,
    "loop": "trainer",
    "checkpointing_policy": "full",
    "use_cache": None,
    "kernels": "torch",
    "image_tokens": None,
    "activation_offload": False,
}
LOOPS = {"trainer", "keep-outputs"}


def every_k(policy: str) -> int | None:
    """K of a `checkpointing_policy = "every-k:K"`, else None."""
    if policy.startswith("every-k:"):
        k = int(policy.split(":", 1)[1])
        if k < 1:
            raise ValueError(policy)
        return k
    return None
LOSSES = {"torch", "fused", "fused-linear"}
KERNELS = {"torch", "liger"}
PRECISIONS = {"bf16", "fp16", "fp32", "amp-bf16", "amp-fp16"}
OPTIMIZERS = {"adamw", "adamw-fused", "adamw-forloop", "sgd", "sgd-momentum", "adafactor", "lion", "adamw-8bit"}
LR = 1e-4


def read_case_specs(path: Path, defaults: dict) -> list[dict]:
    """The `[[case]]` tables of a cases file, each merged over `defaults`; ids must be unique.
    Shared by measure.py, measure_infer.py and measure_dist.py, which validate the fields."""
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    cases, seen = [], set()
    for c in doc.get("case", []):
        case = dict(defaults)
        case.update(c)
        if case["id"] in seen:
            raise SystemExit(f"duplicate case id {case['id']}")
        seen.add(case["id"])
        cases.append(case)
    return cases


def load_cases(path: Path = CASES) -> list[dict]:
    cases = []
    for case in read_case_specs(path, DEFAULTS):
        if case["precision"] not in PRECISIONS:
            raise SystemExit(f"{case['id']}: bad precision {case['precision']}")
        if case["optimizer"] not in OPTIMIZERS:
            raise SystemExit(f"{case['id']}: bad optimizer {case['optimizer']}")
        if case["attention"] not in ("sdpa", "eager"):
            raise SystemExit(f"{case['id']}: bad attention {case['attention']}")
        if case["dropout"] not in ("config", "off"):
            raise SystemExit(f"{case['id']}: bad dropout {case['dropout']}")
        if case["loss"] not in LOSSES:
            raise SystemExit(f"{case['id']}: bad loss {case['loss']}")
        pol = case["checkpointing_policy"]
        if pol not in ("full", "selective-attn", "selective-op") and every_k(pol) is None:
            raise SystemExit(f"{case['id']}: bad checkpointing_policy {pol}")
        if pol != "full" and not case["checkpointing"]:
            raise SystemExit(f"{case['id']}: checkpointing_policy needs checkpointing = true")
        if case["use_cache"] not in (None, True, False):
            raise SystemExit(f"{case['id']}: use_cache must be true or false")
        if case["loop"] not in LOOPS:
            raise SystemExit(f"{case['id']}: bad loop {case['loop']}")
        if not isinstance(case["padding_free"], bool):
            raise SystemExit(f"{case['id']}: padding_free must be true or false")
        if not isinstance(case["activation_offload"], bool):
            raise SystemExit(f"{case['id']}: activation_offload must be true or false")
        if case["activation_offload"] and (case["checkpointing"] or case["loss"] != "torch"
                                           or case["kernels"] != "torch" or case["padding_free"]):
            raise SystemExit(f"{case['id']}: activation_offload is measured without checkpointing, "
                             "fused losses, kernels or padding-free batches")
        if case["kernels"] not in KERNELS:
            raise SystemExit(f"{case['id']}: bad kernels {case['kernels']}")
        if case["kernels"] == "liger":
            # use_liger_kernel=True: Liger's layer kernels and its fused linear cross-entropy
            if case["loss"] not in ("torch", "fused-linear"):
                raise SystemExit(f"{case['id']}: kernels = liger implies loss = fused-linear")
            case["loss"] = "fused-linear"
        if not (CONFIG_DIR / f"{case['config']}.json").exists():
            raise SystemExit(f"{case['id']}: missing config {case['config']}")
        check_image_tokens(case)
        cases.append(case)
    return cases


# wrappers whose image inputs the harness builds (`image_tokens` cases)
IMAGE_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "gemma3", "mistral3", "llama4")


def check_image_tokens(case: dict) -> None:
    """`image_tokens = N`: N of the `seq`/`prompt` tokens of every row are one image's tokens."""
    n = case.get("image_tokens")
    if n is None:
        return
    with open(CONFIG_DIR / f"{case['config']}.json") as f:
        raw = json.load(f)
    model_type = raw.get("model_type")
    if model_type not in IMAGE_FAMILIES:
        raise SystemExit(f"{case['id']}: image_tokens is for {IMAGE_FAMILIES}, not {model_type}")
    length = case.get("seq", case.get("prompt"))
    if model_type == "gemma3":
        # gemma3: N / mm_tokens_per_image images per row, each `<start_of_image>`, the image
        # tokens, `<end_of_image>`, after one leading text token
        per = int(raw.get("mm_tokens_per_image", 256))
        if not isinstance(n, int) or n < per or n % per or n + 2 * (n // per) + 1 > int(length):
            raise SystemExit(f"{case['id']}: image_tokens must be a positive multiple of {per} fitting in seq")
        return
    if model_type == "mistral3":
        # mistral3: one image of a × b tokens; each row of b `[IMG]` ends in `[IMG_BREAK]`, the
        # last in `[IMG_END]`, after one leading text token
        a, _ = image_grid(int(n), 1) if isinstance(n, int) and n > 0 else (0, 0)
        if not isinstance(n, int) or n < 1 or n + a + 1 > int(length):
            raise SystemExit(f"{case['id']}: image_tokens must leave room for one [IMG_BREAK]/[IMG_END] per row in seq")
        return
    if model_type == "llama4":
        # llama4: N / 144 tiles of one image (llama4_tiles), laid out with N + tiles + 2 special
        # tokens after one leading text token
        per = llama4_tokens_per_tile(raw["vision_config"])
        if not isinstance(n, int) or n < per or n % per or n + n // per + 3 > int(length):
            raise SystemExit(f"{case['id']}: image_tokens must be a positive multiple of {per} leaving room for the separators in seq")
        return
    if not isinstance(n, int) or n < 1 or n + 3 > int(length):
        raise SystemExit(f"{case['id']}: image_tokens must be 1..seq-3")


def image_grid(n: int, merge: int) -> tuple[int, int]:
    """(h, w) in patches of one image of `n` LLM tokens: Qwen2-VL's processor resizes an image to
    multiples of patch·merge pixels and the PatchMerger turns merge×merge patches into one token,
    so n = (h/merge)·(w/merge); the most nearly square factorisation n = a·b (a <= b)."""
    a = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return a * merge, (n // a) * merge


def image_inputs(cfg, batch: int, seq: int, n: int, dtype=None) -> tuple:
    """Input ids with one image of `n` tokens per row (`<|vision_start|>`, n image tokens,
    `<|vision_end|>` at positions 1..n+2, text tokens around them drawn below the special ids) and
    the processor's outputs for those images: `mm_token_type_ids`, `pixel_values` [batch·h·w, C·T·P·P] fp32 (the image
    processor returns float32) and `image_grid_thw` [[1, h, w]] per image.  Real tensors."""
    import torch

    if cfg.model_type == "gemma3":
        return gemma3_image_inputs(cfg, batch, seq, n)
    if cfg.model_type == "mistral3":
        return mistral3_image_inputs(cfg, batch, seq, n)
    if cfg.model_type == "llama4":
        return llama4_image_inputs(cfg, batch, seq, n, dtype)
    vc = cfg.vision_config
    merge = int(vc.spatial_merge_size)
    h, w = image_grid(n, merge)
    specials = [cfg.image_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id]
    tc = cfg.get_text_config()
    others = [getattr(c, k, None) for c in (cfg, tc) for k in ("bos_token_id", "eos_token_id")]
    text_vocab = min([tc.vocab_size] + [t for t in others if isinstance(t, int)] + specials)
    ids = torch.randint(0, text_vocab, (batch, seq))
    ids[:, 1] = cfg.vision_start_token_id
    ids[:, 2 : 2 + n] = cfg.image_token_id
    ids[:, 2 + n] = cfg.vision_end_token_id
    channels = int(getattr(vc, "in_channels", None) or getattr(vc, "in_chans", 3))
    width = channels * int(vc.temporal_patch_size) * int(vc.patch_size) ** 2
    kwargs = {
        "pixel_values": torch.randn(batch * h * w, width, dtype=torch.float32),
        "image_grid_thw": torch.tensor([[1, h, w]] * batch),
        # the processor's modality of every token (0 text, 1 image), which M-RoPE needs
        "mm_token_type_ids": (ids == cfg.image_token_id).to(torch.int64),
    }
    return ids, kwargs


def gemma3_image_inputs(cfg, batch: int, seq: int, n: int) -> tuple:
    """Gemma 3: `n / mm_tokens_per_image` images per row.  Ids as Gemma3Processor lays them out
    (`<start_of_image>`, mm_tokens_per_image × `<image_soft_token>`, `<end_of_image>` per image,
    after one leading text token; text ids drawn below the special ids), `pixel_values`
    [batch·images, C, image_size, image_size] fp32 (Gemma3ImageProcessor returns float32) and
    `token_type_ids` (1 on image tokens), which the processor returns and which make Gemma3Model
    build its bidirectional image-block masks.  Real tensors."""
    import torch

    vc = cfg.vision_config
    per = int(cfg.mm_tokens_per_image)
    k = n // per
    specials = [cfg.image_token_id, cfg.boi_token_id, cfg.eoi_token_id]
    tc = cfg.get_text_config()
    others = [getattr(c, k2, None) for c in (cfg, tc) for k2 in ("bos_token_id", "eos_token_id", "pad_token_id")]
    text_vocab = min([tc.vocab_size] + [t for t in others if isinstance(t, int) and t > 2] + specials)
    ids = torch.randint(3, text_vocab, (batch, seq))
    pos = 1
    for _ in range(k):
        ids[:, pos] = cfg.boi_token_id
        ids[:, pos + 1 : pos + 1 + per] = cfg.image_token_id
        ids[:, pos + 1 + per] = cfg.eoi_token_id
        pos += per + 2
    side = int(vc.image_size)
    kwargs = {
        "pixel_values": torch.randn(batch * k, int(vc.num_channels), side, side, dtype=torch.float32),
        "token_type_ids": (ids == cfg.image_token_id).to(torch.int64),
    }
    return ids, kwargs


# PixtralProcessor's row separators (tokenizer ids of Mistral-Small-3.1 / Pixtral: `[IMG]` = 10,
# `[IMG_BREAK]` = 12, `[IMG_END]` = 13); to the model they are text tokens
IMG_BREAK, IMG_END = 12, 13


def image_sizes_of(cfg, batch: int, n: int) -> list[list[int]]:
    """Mistral 3: `image_sizes` [[H, W]] per image, in pixels, of one image of `n` tokens."""
    merge = int(cfg.spatial_merge_size)
    patch = int(cfg.vision_config.patch_size)
    a, b = image_grid(n, 1)
    return [[a * merge * patch, b * merge * patch]] * batch


def mistral3_image_inputs(cfg, batch: int, seq: int, n: int) -> tuple:
    """Mistral 3: one image of `n` tokens per row, the most nearly square grid of a × b tokens
    (a <= b: a rows of b tokens), i.e. an image of (a·merge·patch) × (b·merge·patch) pixels,
    which PixtralImageProcessor leaves as it is (multiples of the patch, within its longest
    edge).  Ids as PixtralProcessor lays them out (each row of b `[IMG]` followed by
    `[IMG_BREAK]`, the last by `[IMG_END]`), after one leading text token; text ids drawn above
    the special ids), `pixel_values` [batch, C, H, W] fp32 (the image processor returns
    float32) and `image_sizes` [[H, W]] per image.  Real tensors."""
    import torch

    vc = cfg.vision_config
    a, b = image_grid(n, 1)
    tc = cfg.get_text_config()
    ids = torch.randint(16, tc.vocab_size, (batch, seq))
    pos = 1
    for r in range(a):
        ids[:, pos : pos + b] = cfg.image_token_id
        ids[:, pos + b] = IMG_END if r == a - 1 else IMG_BREAK
        pos += b + 1
    height, width = image_sizes_of(cfg, batch, n)[0]
    kwargs = {
        "pixel_values": torch.randn(batch, int(vc.num_channels), height, width, dtype=torch.float32),
        "image_sizes": torch.tensor([[height, width]] * batch),
    }
    return ids, kwargs


def llama4_config(name: str) -> bool:
    """Whether the case config `name` is a multimodal llama4 wrapper."""
    with open(CONFIG_DIR / f"{name}.json") as f:
        return json.load(f).get("model_type") == "llama4"


def llama4_tokens_per_tile(vc) -> int:
    """Llama 4: LLM tokens per 336-px tile, `(image_size // patch_size)² · pixel_shuffle_ratio²`
    (Llama4VisionModel's patches, the class token dropped, Llama4VisionPixelShuffleMLP's
    pixel_shuffle; Llama4Processor: `(H // patch) · (W // patch) // downsample_ratio`)."""
    get = vc.get if isinstance(vc, dict) else (lambda k, d=None: getattr(vc, k, d))
    side = int(get("image_size", 448)) // int(get("patch_size", 14))
    ratio = float(get("pixel_shuffle_ratio", 0.5))
    return side * side // int(round(1.0 / (ratio * ratio)))


def llama4_tiles(t: int) -> tuple[int, int]:
    """Llama 4: one image of `t` tiles as (rows, cols) of its local tiles: t = 1 is an image of
    one tile (no global tile); t >= 2 is a rows × cols = t - 1 grid of local tiles (the most
    nearly square, rows <= cols) plus the global tile, which Llama4ImageProcessor appends when
    there is more than one tile.  (t = 2 is laid out as a 1 × 1 grid + global; the processor
    would make two one-tile images of it: the model sees the same 2 tiles and 288 tokens.)"""
    if t == 1:
        return 1, 1
    a = max(d for d in range(1, math.isqrt(t - 1) + 1) if (t - 1) % d == 0)
    return a, (t - 1) // a


def llama4_image_inputs(cfg, batch: int, seq: int, n: int, dtype) -> tuple:
    """Llama 4: one image of `n / 144` tiles per row (`llama4_tiles`).  Ids as Llama4Processor's
    `_prompt_split_image` lays them out after one leading text token: `<|image_start|>`, per
    row of local tiles each tile's 144 `<|patch|>` (the config's image_token_index) followed by
    `<|tile_x_separator|>` but the row's last, which is followed by `<|tile_y_separator|>`,
    then `<|image|>`, the global tile's 144 `<|patch|>` and `<|image_end|>` (a one-tile image:
    `<|image_start|>`, `<|image|>`, 144 `<|patch|>`, `<|image_end|>`).  boi/eoi/patch ids are
    the config's; `<|image|>` and the separators, text tokens to the model, are drawn as text
    ids (below 200000, or below the special ids of a small config).  `pixel_values`
    [batch·tiles, C, image_size, image_size] in the model dtype: Llama4ImageProcessor returns
    bf16 (`rescale_and_normalize`), and Llama4VisionModel casts nothing (an fp32 model needs
    the pixels cast by the caller)."""
    import torch

    vc = cfg.vision_config
    per = llama4_tokens_per_tile(vc)
    t = n // per
    tc = cfg.get_text_config()
    specials = [cfg.image_token_id, cfg.boi_token_id, cfg.eoi_token_id]
    text_vocab = min([tc.vocab_size, 200000] + specials)
    ids = torch.randint(0, text_vocab, (batch, seq))
    pos = 1
    ids[:, pos] = cfg.boi_token_id
    pos += 1
    if t > 1:
        rows, cols = llama4_tiles(t)
        for _ in range(rows):
            for _ in range(cols):
                ids[:, pos : pos + per] = cfg.image_token_id
                pos += per + 1  # then a tile separator (a text id)
    pos += 1  # <|image|> (a text id)
    ids[:, pos : pos + per] = cfg.image_token_id
    pos += per
    ids[:, pos] = cfg.eoi_token_id
    side = int(vc.image_size)
    kwargs = {
        "pixel_values": torch.randn(batch * t, int(vc.num_channels), side, side,
                                    dtype=dtype),
    }
    return ids, kwargs


# ----------------------------------------------------------------------------------------------
# worker side (imports torch)
# ----------------------------------------------------------------------------------------------

def _zero_dropout(d: dict) -> None:
    """Set every dropout-probability field of a config dict (recursively into sub-configs) to 0."""
    for k, v in list(d.items()):
        if isinstance(v, dict):
            _zero_dropout(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            kl = k.lower()
            if ("dropout" in kl or "pdrop" in kl) and v != 0:
                d[k] = 0.0


def build_config(name: str, dropout: str, whole: bool = False):
    from transformers import AutoConfig

    with open(CONFIG_DIR / f"{name}.json") as f:
        d = json.load(f)
    if dropout == "off":
        _zero_dropout(d)
    model_type = d.pop("model_type")
    if model_type == "gemma3" and not whole:
        # multimodal config without image inputs: use the text part with Gemma3ForCausalLM
        # (image cases build the whole Gemma3ForConditionalGeneration, `whole=True`)
        d = dict(d["text_config"])
        model_type = "gemma3_text"
        d.pop("model_type", None)
    return AutoConfig.for_model(model_type, **d)


# vision-language wrappers measured whole (AutoModelForImageTextToText) on text-only inputs
VLM = ("llama4", "mistral3", "qwen2_vl", "qwen2_5_vl", "gemma3")


def build_model(cfg, **kw):
    """The causal LM of `cfg`; a vision-language wrapper is built whole with its vision tower and
    projector frozen (requires_grad False, as VLM fine-tuning recipes do by default), so their
    weights are present and the optimizer skips them."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if cfg.model_type not in VLM:
        return AutoModelForCausalLM.from_config(cfg, **kw)
    model = AutoModelForImageTextToText.from_config(cfg, **kw)
    for name, p in model.named_parameters():
        if not ("language_model" in name or re.search(r"(^|\.)lm_head\.", name)):
            p.requires_grad_(False)
    return model


def make_optimizer(name: str, params):
    import torch

    params = list(params)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LR, foreach=True)
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=LR, fused=True)
    if name == "adamw-forloop":
        return torch.optim.AdamW(params, lr=LR, foreach=False, fused=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.0, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, foreach=True)
    if name == "adafactor":
        return torch.optim.Adafactor(params, foreach=True)
    if name == "lion":
        from lion_pytorch import Lion

        return Lion(params, lr=LR)
    if name == "adamw-8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=LR)
    raise ValueError(name)


def versions(case: dict) -> dict:
    import platform

    import torch
    import transformers

    v = {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__}
    try:
        import peft

        v["peft"] = peft.__version__
    except ImportError:
        pass
    v["python"] = platform.python_version()
    if case["optimizer"] == "lion":
        from importlib.metadata import version

        v["lion-pytorch"] = version("lion-pytorch")
    # the fused losses run CPU references of these kernels (tools/truth/kernels.py)
    if case.get("loss") == "fused":
        v["flash-attn-reference"] = "058ad35a3914afd7408dd33c7d5f558a48f4bb05"
    if case.get("loss") == "fused-linear":
        v["liger-kernel-reference"] = "0.8.5"
    return v


class _fake_swap_workaround:
    """peft moves/casts each new adapter with ``module.to(...)``; for FakeTensor parameters
    ``nn.Module._apply`` always uses ``torch.utils.swap_tensors``, which refuses tensors that
    have a weakref -- and FakeTensorMode's converter memo (a WeakValueDictionary) holds one on
    freshly created fake parameters.  Dropping those memo entries first lets the swap proceed;
    the memo only serves real->fake conversion, which we never do for these tensors.
    Only active around ``get_peft_model``."""

    def __enter__(self):
        import torch
        import torch.utils
        from torch._subclasses.fake_tensor import FakeTensor

        self._orig = orig = torch.utils.swap_tensors

        def swap(t1, t2):
            for t in (t1, t2):
                if isinstance(t, FakeTensor):
                    memo = t.fake_mode.fake_tensor_converter.tensor_memo
                    for k in [k for k, v in list(memo.items()) if v is t]:
                        del memo[k]
            return orig(t1, t2)

        torch.utils.swap_tensors = swap
        return self

    def __exit__(self, *exc):
        import torch.utils

        torch.utils.swap_tensors = self._orig
        return False


def patch_mod_tracker_leaf_leak(hold_grads: bool = True) -> None:
    """Stops ModTracker from keeping peft's embedding-output leaf (and its .grad) alive.

    ModTracker registers ``torch.autograd.graph.register_multi_grad_hook(tensors, fn)`` (mode
    "all") on every module input that requires grad.  That helper keeps the inputs' grad_fns
    (or a leaf's AccumulateGrad) in the hook closure for the hook's whole life, and the hook is
    stored on those very nodes: a cycle through C++ that gc cannot collect.  With a frozen base
    (peft) the chain of kept nodes ends at the AccumulateGrad of the embedding output, which
    peft makes a leaf requiring grad under checkpointing; so each micro-step's leaf and its
    .grad (B*S*H elements each) stayed alive forever.  A plain PyTorch run frees them with the
    graph.  Reproducer: tools/truth/probes/memtracker_leaf_leak.py.

    The replacement below has the same semantics for a graph that is backwarded once (every
    case here): the grad_fns are needed only to count, at the first hook call of a backward,
    how many hooks the engine will run; they are dropped right after.

    ``hold_grads=False`` (a probe's, never a measurement's: tools/truth/probes/
    modtracker_grad_hold.py) keeps no gradient until the last one arrives and hands ``fn``
    Nones, to show what ModTracker's own hold adds to a peak.
    """
    import torch
    import torch.distributed._tools.mod_tracker as mod_tracker
    from torch.autograd.graph import _get_grad_fn_or_grad_acc
    from torch.utils.hooks import RemovableHandle

    if getattr(mod_tracker, "_memwall_leaf_patch", False):
        return
    original = mod_tracker.register_multi_grad_hook

    class _Handles:
        def __init__(self, handles: list[RemovableHandle]) -> None:
            self.handles = handles

        def remove(self) -> None:
            for h in self.handles:
                h.remove()

    def register_multi_grad_hook(tensors, fn, *, mode="all"):
        if mode != "all":
            return original(tensors, fn, mode=mode)
        n = len(tensors)
        state = {"grad_fns": [_get_grad_fn_or_grad_acc(t) for t in tensors], "expected": 0}
        calls: dict[int, int] = {}
        grads: dict[int, list] = {}

        def hook_for(idx):
            def hook(grad):
                task = torch._C._current_graph_task_id()
                seen = calls.get(task, 0)
                calls[task] = seen + 1
                if seen == 0 and state["grad_fns"] is not None:
                    state["expected"] = sum(map(torch._C._will_engine_execute_node, state["grad_fns"]))
                    state["grad_fns"] = None  # break the cycle (see the docstring)
                if hold_grads:
                    grads.setdefault(task, [None] * n)[idx] = grad
                if seen == state["expected"] - 1:
                    del calls[task]
                    fn(grads.pop(task, [None] * n))

            return hook

        return _Handles([t.register_hook(hook_for(i)) for i, t in enumerate(tensors)])

    mod_tracker.register_multi_grad_hook = register_multi_grad_hook
    mod_tracker._memwall_leaf_patch = True


def fast_update_peak_stats(tracker, peak_state) -> bool:
    """MemTracker._update_peak_stats in O(active modules): the same updates as upstream, but only
    on the modules whose fqn is in ``_mod_tracker.parents`` (the only ones upstream updates).
    ``tracker`` caches its per-fqn module stats in ``_fqn_cache``/``_fqn_cache_len`` (reset by
    its ``reset_mod_stats``).  Returns whether the running peak moved."""
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    curr_snap = tracker._curr_mem_snap
    n = len(tracker.memory_tracking)
    if n != tracker._fqn_cache_len:
        cache: dict[str, list] = {}
        for ms in tracker.memory_tracking.values():
            cache.setdefault(ms.mod_fqn, []).append(ms)
        tracker._fqn_cache = cache
        tracker._fqn_cache_len = n
    for fqn in tracker._mod_tracker.parents:
        for mod_stats in tracker._fqn_cache.get(fqn, ()):
            if peak_state in mod_stats.snapshots:
                for dev, dev_snap in curr_snap.items():
                    if mod_stats.local_peak.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                        mod_stats.local_peak[dev] = dev_snap[_TOTAL_KEY]
                        # values are ints: a shallow copy equals upstream's deepcopy
                        mod_stats.snapshots[peak_state][-1][dev] = dict(dev_snap)
    moved = False
    for dev, dev_snap in curr_snap.items():
        if tracker._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
            tracker._peak_mem[dev] = dev_snap[_TOTAL_KEY]
            tracker._peak_mem_snap[dev] = dict(dev_snap)
            moved = True
    return moved


def fast_mem_tracker_class():
    """MemTracker with an O(active modules) ``_update_peak_stats``.

    The stock implementation walks *every* tracked module (a WeakIdKeyDictionary, slow to
    iterate) after *every* dispatched op, which made a 30-layer model take a minute and a
    80-layer one hopeless.  This override does exactly the same updates, but only visits the
    modules whose fqn is in ``_mod_tracker.parents`` (the only ones the original updates).
    """
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    patch_mod_tracker_leaf_leak()

    class FastMemTracker(MemTracker):
        def __init__(self) -> None:
            super().__init__()
            self._fqn_cache: dict[str, list] = {}
            self._fqn_cache_len = -1

        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            # Same as upstream, except that grad hooks are only installed on parameters that
            # require grad (upstream raises on frozen parameters, e.g. a LoRA base model).
            def _grad_hook(grad):
                self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

            param_memory = 0
            for param in module.parameters():
                winfos = self._update_and_maybe_create_winfos(param, _MemRefType.PARAM)
                param_memory += sum(w.mem_consumed for w in winfos)
                if param.grad is not None:
                    self._update_and_maybe_create_winfos(param.grad, _MemRefType.GRAD)
                if (
                    param.requires_grad
                    and self._param_to_grad_hook_handles.get(param, None) is None
                    and install_grad_hooks
                ):
                    h1 = param.register_hook(_grad_hook)
                    h2 = param.register_post_accumulate_grad_hook(lambda p: (_grad_hook(p.grad)))
                    self._param_to_grad_hook_handles[param] = (h1, h2)
            buffer_memory = 0
            for buffer in module.buffers():
                winfos = self._update_and_maybe_create_winfos(buffer, _MemRefType.BUFFER)
                buffer_memory += sum(w.mem_consumed for w in winfos)
            return (param_memory, buffer_memory)

        def reset_mod_stats(self) -> None:
            super().reset_mod_stats()
            self._fqn_cache_len = -1

        def _update_peak_stats(self, peak_state) -> None:
            fast_update_peak_stats(self, peak_state)

    return FastMemTracker


def run_case(case: dict, debug: bool = False, slow_tracker: bool = False, fake: bool = True,
             fake_images: bool = False) -> dict:
    """Measure one case.  fake=False runs on real CPU tensors (tools/truth/crosscheck.py).
    fake_images=True (crosscheck for mistral3; every llama4 image case): image cases run on fake
    tensors too, with (mistral3)
    `image_sizes` given as a list (fake tensors made from it keep their values, so
    `get_image_features`' `.tolist()` of the split sizes is concrete) and transformers'
    placeholder-count check disabled (TRANSFORMERS_DISABLE_TORCH_CHECK, a data read); both runs
    then take `image_sizes` as a list."""
    import contextlib
    from copy import deepcopy

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    patch_mod_tracker_leaf_leak()
    from transformers import AutoModelForCausalLM

    if case["qlora"]:
        raise RuntimeError("qlora: bitsandbytes 4-bit layers cannot run on CPU fake tensors (see README)")

    cfg = build_config(case["config"], case["dropout"], whole=bool(case.get("image_tokens")))
    prec = case["precision"]
    model_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(prec, torch.float32)
    amp_dtype = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(prec)
    cpu = torch.device("cpu")

    # transformers' masking_utils.find_packed_sequence_indices treats any fake tensor as "tracing"
    # (utils/import_utils.py is_tracing) and returns a packed-sequence mask, which makes
    # create_causal_mask materialise a boolean [B,1,S,S] mask (and SDPA a float copy per layer)
    # whenever there is no KV cache, i.e. under gradient checkpointing. On real unpacked inputs
    # (position ids 0..S-1, all ours) it returns None and no mask exists, so we give it that answer.
    import transformers.masking_utils as _mu

    if not hasattr(_mu, "_memwall_find_packed"):
        _mu._memwall_find_packed = _mu.find_packed_sequence_indices
    if case["padding_free"]:
        # packed inputs: transformers' own detection (it returns the sequence index per token,
        # as on real packed position ids)
        _mu.find_packed_sequence_indices = _mu._memwall_find_packed
    else:
        _mu.find_packed_sequence_indices = lambda position_ids: None

    if case.get("image_tokens"):
        # image inputs: the vision tower's index computations (cu_seqlens from the grid, rotary
        # position ids, M-RoPE's get_rope_index, the placeholder check) read tensor data, which
        # fake tensors refuse (DynamicOutputShapeException), so these cases run on real CPU
        # tensors (the crosscheck shows real and fake tensors give the same bytes)
        if case["config"] and llama4_config(case["config"]):
            # llama4: Llama4VisionModel reads no tensor data (fixed 336-px tiles, no mask, no
            # grid), and the placeholder-count check is switched off below, so its image cases
            # run on fake tensors (xc-llama4-* in crosscheck.py: real = fake)
            fake_images = True
        fake = fake and fake_images
    if fake_images:
        import os

        import torch._subclasses.fake_tensor as _ft

        os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
        # fake tensors made from small Python lists keep their values (`constant`), so the
        # `image_sizes` arithmetic and its `.tolist()` stay concrete
        _ft.CONSTANT_NUMEL_LIMIT = 64
    with (FakeTensorMode() if fake else contextlib.nullcontext()):
        torch.set_default_dtype(model_dtype)
        try:
            # dtype passed explicitly: from_config otherwise honours a `torch_dtype`/`dtype` in the
            # config (e.g. gemma-2's "float32") over the default dtype, silently changing precision
            model = build_model(cfg, attn_implementation=case["attention"], dtype=model_dtype)
        finally:
            torch.set_default_dtype(torch.float32)
        if case["checkpointing"]:
            gc_kwargs = {"use_reentrant": False}
            if case["checkpointing_policy"] == "selective-op":
                from titan_sac import titan_selective_op_kwargs

                gc_kwargs = titan_selective_op_kwargs(model)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs)
            k = every_k(case["checkpointing_policy"])
            if k is not None:
                # torchtitan's layer-level selective AC (`selective_ac_option = "<k>"`,
                # torchtitan/models/llama3/infra/parallelize.py `_apply_ac_to_transformer_block`):
                # a counter over the blocks from 1, checkpoint when `count % k == 0`, i.e. layers
                # k-1, 2k-1, ...  Applied to the HF model by switching the other decoder layers'
                # `gradient_checkpointing` off again; the base model's flag stays on, so the model
                # runs without a KV cache as under full checkpointing (`use_cache` forced False).
                from transformers.modeling_layers import GradientCheckpointingLayer

                blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
                for i, block in enumerate(blocks):
                    if (i + 1) % k != 0:
                        block.gradient_checkpointing = False
            if case["checkpointing_policy"] == "selective-attn":
                # Megatron-LM's selective recomputation (`--recompute-granularity selective`,
                # megatron/core/transformer/attention.py `_checkpointed_attention_forward`; Korthikanti
                # et al. 2022 §5): only the core attention -- transformers' attention function,
                # softmax(QK^T)V with its repeat_kv, mask and dropout -- runs under a
                # (non-reentrant) checkpoint, which keeps its inputs (q, k, v, mask) and recomputes
                # it in backward.  No decoder layer is checkpointed; the base model keeps its
                # `gradient_checkpointing` flag, so there is no KV cache, as under full checkpointing.
                import torch.utils.checkpoint
                from transformers.modeling_layers import GradientCheckpointingLayer
                from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

                for m in model.modules():
                    if isinstance(m, GradientCheckpointingLayer):
                        m.gradient_checkpointing = False
                impl = case["attention"]
                if impl == "eager":
                    import sys

                    layer_mod = next(m for m in model.modules() if isinstance(m, GradientCheckpointingLayer))
                    core = sys.modules[type(layer_mod).__module__].eager_attention_forward
                else:
                    core = ALL_ATTENTION_FUNCTIONS[impl]

                def checkpointed_core(module, query, key, value, attention_mask, _core=core, **kwargs):
                    return torch.utils.checkpoint.checkpoint(
                        _core, module, query, key, value, attention_mask, use_reentrant=False, **kwargs
                    )

                ALL_ATTENTION_FUNCTIONS[impl] = checkpointed_core
        if case["lora"]:
            from peft import LoraConfig, get_peft_model

            lc = case["lora"]
            r = int(lc["rank"])
            lcfg = LoraConfig(
                r=r,
                lora_alpha=int(lc.get("alpha", 2 * r)),
                target_modules=list(lc["targets"]),
                lora_dropout=0.0,
                bias="none",
                task_type="CAUSAL_LM",
            )
            with _fake_swap_workaround():
                model = get_peft_model(model, lcfg)  # peft defaults (autocast_adapter_dtype=True)
        if case["use_cache"] is not None:
            # what training scripts do (`model.config.use_cache = False`, TRL/HF examples): the
            # forward's `use_cache` defaults to the config's (utils/generic.py
            # `merge_with_config_defaults`); gradient checkpointing forces it off regardless
            causal = model.get_base_model() if hasattr(model, "get_base_model") else model
            causal.config.use_cache = bool(case["use_cache"])
        model.train()
        lm_head = model.get_output_embeddings()
        all_params = {id(p): p for p in model.parameters()}
        params_total = sum(p.numel() for p in all_params.values())
        trainable = [p for p in all_params.values() if p.requires_grad]
        params_trainable = sum(p.numel() for p in trainable)
        opt = make_optimizer(case["optimizer"], trainable)
        n_acc = int(case["grad_accum"])
        call_kwargs = {}
        if case["padding_free"]:
            # padding-free batch (transformers DataCollatorWithFlattening / TRL padding_free):
            # the `batch` sequences of `seq` tokens concatenated into one row, position ids
            # restarting at 0 for each sequence; no KV cache (transformers only detects packed
            # sequences without one)
            ids = torch.randint(0, cfg.get_text_config().vocab_size, (1, case["batch"] * case["seq"]))
            call_kwargs["position_ids"] = torch.arange(case["seq"]).repeat(case["batch"]).unsqueeze(0)
            call_kwargs["use_cache"] = False
            n_label_rows = 1
        elif case.get("image_tokens"):
            ids, image_kwargs = image_inputs(cfg, case["batch"], case["seq"], int(case["image_tokens"]), model_dtype)
            if fake_images and cfg.model_type == "mistral3":
                image_kwargs["image_sizes"] = image_sizes_of(cfg, case["batch"], int(case["image_tokens"]))
            call_kwargs.update(image_kwargs)
            n_label_rows = case["batch"]
        else:
            ids = torch.randint(0, cfg.get_text_config().vocab_size, (case["batch"], case["seq"]))
            n_label_rows = case["batch"]
        n_non_ignore = case["batch"] * case["seq"] - n_label_rows
        causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        if case["loss"] == "fused":
            from kernels import flash_ce_causal_lm_loss

            causal_lm.loss_function = flash_ce_causal_lm_loss

        mt = MemTracker() if slow_tracker else fast_mem_tracker_class()()
        mt.track_external(model, opt)

        def running_peak() -> int:
            return mt._peak_mem.get(cpu, 0)

        marks: list[tuple[str, int]] = []  # (phase that just ended, running peak at its end)
        step_state = {"in_model": False}

        def lm_head_pre_hook(mod, args):
            if step_state["in_model"]:
                marks.append(("forward", running_peak()))

        hook = lm_head.register_forward_pre_hook(lm_head_pre_hook)
        if case["kernels"] == "liger":
            from kernels import apply_liger_to_instance

            apply_liger_to_instance(causal_lm)
        if case["loss"] == "fused-linear":
            import types

            from kernels import liger_causal_lm_forward

            causal_lm.forward = types.MethodType(
                liger_causal_lm_forward(n_non_ignore, lambda: lm_head_pre_hook(None, None)), causal_lm
            )
        first_step_peak = None
        keep_outputs = case["loop"] == "keep-outputs"
        offload = None
        if case["activation_offload"]:
            from offload import SaveOnHost

            offload = SaveOnHost()
        t0 = time.time()
        with mt:
            for it in range(2):
                if it == 1:
                    # steady state: forget module stats AND the running peak of the first step
                    first_step_peak = running_peak()
                    mt.reset_mod_stats()
                    mt._peak_mem = {dev: snap["Total"] for dev, snap in mt._curr_mem_snap.items()}
                    mt._peak_mem_snap = deepcopy(mt._curr_mem_snap)
                    marks.clear()
                    marks.append(("start", running_peak()))
                for micro in range(n_acc):
                    if micro > 0:
                        # MemTracker refuses a second forward of a module without a reset; this
                        # only clears the per-module timeline (--debug then shows the last
                        # micro-batch), never the running peak.
                        mt.reset_mod_stats()
                    step_state["in_model"] = True
                    with (torch.autocast("cpu", dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext()), \
                            (offload if offload is not None else contextlib.nullcontext()):
                        if keep_outputs:
                            # HF no_trainer / accelerate examples (run_clm_no_trainer.py):
                            # `outputs = model(**batch); loss = outputs.loss`.  The output object
                            # (logits, KV cache) stays bound until the name is rebound, i.e. after
                            # the next forward has returned (it lives through backward, the
                            # optimizer step and the next forward).
                            outputs = model(input_ids=ids, labels=ids, **call_kwargs)
                            loss = outputs.loss
                        else:
                            # like HF Trainer: only the loss is kept, the output object (logits) is dropped
                            loss = model(input_ids=ids, labels=ids, **call_kwargs).loss
                    step_state["in_model"] = False
                    marks.append(("loss", running_peak()))
                    if keep_outputs:
                        # accelerator.backward(loss): `loss = loss / gradient_accumulation_steps`
                        # (a local of backward), then `loss.backward()`; `loss` itself stays bound
                        (loss / n_acc if n_acc > 1 else loss).backward()
                    else:
                        if n_acc > 1:
                            loss = loss / n_acc
                        loss.backward()
                        del loss
                    marks.append(("backward", running_peak()))
                opt.step()
                opt.zero_grad(set_to_none=True)
                marks.append(("optimizer", running_peak()))
        elapsed = time.time() - t0
        hook.remove()

        peak_snap = mt.get_tracker_snapshot("peak").get(cpu)
        if peak_snap is None:
            raise RuntimeError(f"no cpu peak snapshot: {mt.get_tracker_snapshot('peak')}")
        peak = peak_snap["Total"]
        phase = None
        for name, value in marks[1:]:
            if value >= peak:
                phase = name
                break
        at_peak = {}
        for k, v in peak_snap.items():
            if k == "Total":
                continue
            at_peak[k.value.lower() if hasattr(k, "value") else str(k).lower()] = int(v)
        if sum(at_peak.values()) != peak:
            raise RuntimeError("breakdown does not sum to total")

        if debug:
            from torch.distributed._tools.mem_tracker import _ModState

            print(f"# case {case['id']}: steady-state peak {peak} B in {phase}; first-step peak {first_step_peak}")
            print(f"# at_peak {at_peak}")
            print(f"# phase marks (phase ended, running peak): {marks}")
            states = [_ModState.PRE_FW, _ModState.POST_FW, _ModState.PEAK_FW, _ModState.PRE_BW, _ModState.POST_BW, _ModState.PEAK_BW]
            for mod_stats in mt.memory_tracking.values():
                parts = []
                for st in states:
                    snaps = mod_stats.snapshots.get(st, [])
                    vals = [s.get(cpu, {}).get("Total", 0) for s in snaps]
                    parts.append(f"{st.name}={','.join(str(v) for v in vals) or '-'}")
                print(f"{mod_stats.mod_fqn}\t" + "\t".join(parts))

    result = {k: case[k] for k in ("id",)}
    result["kind"] = "train"
    result["config"] = f"tests/truth/configs/{case['config']}.json"
    result["model_type"] = cfg.model_type
    for k in ("batch", "seq", "precision", "optimizer", "checkpointing", "attention", "lora", "qlora", "grad_accum", "dropout"):
        result[k] = case[k]
    if result["lora"] is not None:
        lc = dict(result["lora"])
        lc.setdefault("alpha", 2 * int(lc["rank"]))
        result["lora"] = {"rank": int(lc["rank"]), "alpha": int(lc["alpha"]), "targets": list(lc["targets"])}
    # new fields, written only when not the default (older rows stay as they were measured)
    if case["loss"] != "torch":
        result["loss"] = case["loss"]
    if case["padding_free"]:
        result["padding_free"] = True
    if case["loop"] != "trainer":
        result["loop"] = case["loop"]
    if case["checkpointing_policy"] != "full":
        result["checkpointing_policy"] = case["checkpointing_policy"]
    if case["use_cache"] is not None:
        result["use_cache"] = case["use_cache"]
    if case["kernels"] != "torch":
        result["kernels"] = case["kernels"]
    if case.get("image_tokens"):
        result["image_tokens"] = int(case["image_tokens"])
        if not fake:
            result["tensors"] = "real"
    if case["activation_offload"]:
        result["activation_offload"] = True
    result["measured"] = {
        "peak_bytes": int(peak),
        "at_peak": at_peak,
        "phase": phase,
        "params_total": int(params_total),
        "params_trainable": int(params_trainable),
        "first_step_peak_bytes": int(first_step_peak),
    }
    forward_marks = [v for name, v in marks if name == "forward"]
    if n_acc == 1 and len(forward_marks) == 1:
        # the forward phase's own peak (the running peak of the steady step when the LM head
        # starts: the same boundary memwall's forward phase ends at); one micro-batch only, and
        # rows measured before this field (helper 53) have none
        result["measured"]["forward_peak_bytes"] = int(forward_marks[0])
    if offload is not None:
        # the host side: the most bytes the packed copies held at once (steady-state step)
        result["measured"]["host_peak_bytes"] = int(offload.host_peak)
    result["versions"] = versions(case)
    result["_seconds"] = round(elapsed, 1)
    return result


# ----------------------------------------------------------------------------------------------
# parent side
# ----------------------------------------------------------------------------------------------

def read_existing(out: Path = OUT) -> dict[str, dict]:
    """Rows of a fixture file (train.jsonl or infer.jsonl) keyed by case id."""
    rows = {}
    if out.exists():
        for line in out.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["id"]] = row
    return rows


def write_rows(rows: dict[str, dict], out: Path = OUT) -> None:
    """Atomically rewrites a fixture file, rows sorted by case id."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix="." + out.stem + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        for k in sorted(rows):
            f.write(json.dumps(rows[k], separators=(", ", ": ")) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)


def run_cases(script: Path, cases: list[dict], jobs: int, timeout: float, out: Path,
              describe, log: Path | None = None, per_worker: int = 1) -> list[str]:
    """Measures each case in a fresh ``script --worker CASE`` subprocess, ``jobs`` at a time.

    The worker prints ``RESULT <json>``; this parent is the only writer of ``out`` (rewritten
    atomically after every finished case).  ``describe(measured)`` adds case-specific fields to
    the ok line; ok/FAIL lines go to stdout and, when given, are appended to ``log``.
    With ``per_worker`` K > 1 one worker process measures K cases one after the other (its
    argument is a JSON list; each case still builds its own model, FakeTensorMode and tracker,
    so only the interpreter start-up is shared; ``timeout`` is per case).
    Returns the ids that failed or timed out.
    """
    pending = [cases[i:i + per_worker] for i in range(0, len(cases), per_worker)] if per_worker > 1 \
        else list(cases)
    running: list[tuple[dict, subprocess.Popen, float, object]] = []
    failures = []
    n_cases: dict[int, int] = {}  # cases given to each worker (its time limit is timeout x that)
    while pending or running:
        while pending and len(running) < jobs:
            c = pending.pop(0)
            buf = tempfile.TemporaryFile("w+")
            p = subprocess.Popen(
                [sys.executable, str(script), "--worker", json.dumps(c)],
                stdout=buf, stderr=subprocess.STDOUT, text=True,
            )
            running.append((c, p, time.time(), buf))
            n_cases[id(p)] = len(c) if isinstance(c, list) else 1
        time.sleep(0.5)
        for item in list(running):
            c, p, t0, buf = item
            rc = p.poll()
            dt = time.time() - t0
            if isinstance(c, list) and rc is None:
                # a multi-case worker: record each case as soon as its RESULT line is complete
                buf.seek(0)
                done = []
                for line in buf.read().splitlines(keepends=True):
                    if line.startswith("RESULT ") and line.endswith("\n"):
                        res = json.loads(line[len("RESULT "):])
                        case = next((x for x in c if x["id"] == res["id"]), None)
                        if case is not None:
                            done.append((case, res))
                buf.seek(0, 2)
                for case, res in done:
                    c.remove(case)
                    secs = res.pop("_seconds")
                    rows = read_existing(out)
                    rows[res["id"]] = res
                    write_rows(rows, out)
                    m = res["measured"]
                    line = time.strftime("%H:%M:%S ") + (
                        f"ok   {case['id']}: peak={m['peak_bytes']} {describe(m)} "
                        f"wall={time.time() - t0:.1f}s (in a worker) tracked={secs}s")
                    print(line, flush=True)
                    if log is not None:
                        with open(log, "a") as lf:
                            lf.write(line + "\n")
            if rc is None and dt > timeout * n_cases[id(p)]:
                p.kill()
                p.wait()
                rc = "timeout"
            if rc is None:
                continue
            running.remove(item)
            buf.seek(0)
            text = buf.read()
            buf.close()
            results = {}
            for line in text.splitlines():
                if line.startswith("RESULT "):
                    res = json.loads(line[len("RESULT "):])
                    results[res["id"]] = res
            msgs = []
            for case in (c if isinstance(c, list) else [c]):
                res = results.get(case["id"])
                if res is not None:
                    secs = res.pop("_seconds")
                    rows = read_existing(out)
                    rows[res["id"]] = res
                    write_rows(rows, out)
                    m = res["measured"]
                    msgs.append(f"ok   {case['id']}: peak={m['peak_bytes']} {describe(m)} "
                                f"wall={dt:.1f}s tracked={secs}s")
                else:
                    tail = "\n".join(text.strip().splitlines()[-3:])
                    msgs.append(f"FAIL {case['id']} (rc={rc}, {dt:.1f}s): {tail}")
                    failures.append(case["id"])
            for msg in msgs:
                line = time.strftime("%H:%M:%S ") + msg
                print(line, flush=True)
                if log is not None:
                    with open(log, "a") as lf:
                        lf.write(line + "\n")
    return failures


def worker_main(arg: str, run) -> None:
    """Worker side of run_cases: one case (a JSON object) or several (a JSON list), each
    measured by ``run(case)`` and printed as a ``RESULT`` line as soon as it is done (a case
    that raises prints its traceback and the worker goes on with the next one)."""
    import traceback

    spec = json.loads(arg)
    for case in (spec if isinstance(spec, list) else [spec]):
        try:
            res = run(case)
        except Exception:  # noqa: BLE001 - reported as this case's FAIL by the parent
            traceback.print_exc()
            print(f"case {case['id']} failed", flush=True)
            import torch

            torch.set_default_dtype(torch.float32)  # run_case may have left another one set
            continue
        print("RESULT " + json.dumps(res), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="run only cases whose id contains this substring")
    ap.add_argument("--debug", help="print the per-module timeline of one case id")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=180, help="seconds per case before it is killed")
    ap.add_argument("--cases", default=str(CASES))
    ap.add_argument("--missing", action="store_true", help="run only cases not yet in train.jsonl")
    ap.add_argument("--first", help="comma-separated ids to run before the others (scheduling only)")
    ap.add_argument("--out", default=str(OUT), help="fixture file to write (default tests/truth/train.jsonl)")
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
        run_case(case, debug=True)
        return

    if args.only:
        cases = [c for c in cases if args.only in c["id"]]
    if args.missing:
        have = read_existing(Path(args.out))
        cases = [c for c in cases if c["id"] not in have]
    if args.first:
        first = args.first.split(",")
        cases.sort(key=lambda c: first.index(c["id"]) if c["id"] in first else len(first))
    failures = run_cases(Path(__file__), cases, args.jobs, args.timeout, Path(args.out),
                         lambda m: f"phase={m['phase']}", REPO / "tools/truth/measure.log",
                         per_worker=args.per_worker)
    if failures:
        print(f"{len(failures)} failed: {failures}")

if __name__ == "__main__":
    main()
