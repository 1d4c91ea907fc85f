"""Check memwall's vLLM accounting of models with state layers against vLLM 0.33.0's own code.

For every case of tests/serve/vllm_expected.json that has an `hf_config` (the hybrids and
state-space models), this builds the KV-cache specs vLLM would build for that config and runs
vLLM's own planning functions on them, then compares with the case's expected values (which the
Rust test `crates/memwall-cli/tests/serve.rs` holds memwall to):

- state shapes and dtypes: the model class's `get_mamba_state_shape_from_config` /
  `get_mamba_state_dtype_from_config` (vllm/model_executor/models/{jamba,granitemoehybrid,
  falcon_h1,qwen3_next,mamba,mamba2}.py), i.e. `MambaStateShapeCalculator`;
- block-size alignment: `Platform._align_hybrid_block_size` (vllm/platforms/interface.py) with
  `FlashAttentionBackend` as the attention backend;
- `mamba_cache_mode` / `mamba_block_size`: `MambaModelConfig.verify_and_update_config`
  (vllm/model_executor/models/config.py);
- groups: `get_kv_cache_groups` (vllm/v1/core/kv_cache_planning.py);
- bytes per block, blocks: `get_kv_cache_config_from_groups`;
- the start-up check and the estimated max length: `_check_enough_kv_cache_memory`,
  `_max_memory_usage_bytes_from_groups`, `_estimate_max_model_len_from_groups` with the default
  `KVCacheConfigBuilder`, after reserving the null block as `get_kv_cache_configs` does;
- concurrency: `get_max_concurrency_for_kv_cache_config` / `get_kv_cache_capacity`
  (vllm/v1/core/kv_cache_utils.py).

Stand-ins (no GPU, no model weights): `vllm_config` is a namespace carrying the fields these
functions read; the model's layers are not built, so `get_mamba_prefill_checkpoint_alignment`
(which walks the built layers) is replaced by what the layers would answer (64 for Qwen3-Next's
gated DeltaNet with the FlashInfer prefill in "align" mode, else None, as
qwen_gdn_linear_attn.py `_checkpoint_alignment` says), and `_find_non_ssm_backends` returns
`[FlashAttentionBackend]` (the first CUDA backend on SM 8.x/9.x, platforms/cuda.py), and
`ModelRegistry.resolve_model_cls` returns the model class imported from its vLLM file (the
registry would resolve it from the full ModelConfig).

Usage: /work/venvs/emit-vllm/bin/python tools/emit_check/vllm_hybrid_check.py
       (writes tools/emit_check/vllm_hybrid_check.out.txt; exit 1 on any mismatch)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]

import vllm  # noqa: E402
from vllm.model_executor.layers.mamba import abstract as mamba_abstract  # noqa: E402
from vllm.platforms.interface import Platform  # noqa: E402
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.core import kv_cache_planning as planning  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec  # noqa: E402

ARCH = {
    "jamba": ("vllm.model_executor.models.jamba", "JambaForCausalLM"),
    "granitemoehybrid": (
        "vllm.model_executor.models.granitemoehybrid",
        "GraniteMoeHybridForCausalLM",
    ),
    "falcon_h1": ("vllm.model_executor.models.falcon_h1", "FalconH1ForCausalLM"),
    "qwen3_next": ("vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM"),
    "mamba": ("vllm.model_executor.models.mamba", "MambaForCausalLM"),
    "mamba2": ("vllm.model_executor.models.mamba2", "Mamba2ForCausalLM"),
}


def layer_kinds(hf: dict) -> list[tuple[bool, bool]]:
    """(attention, state) per layer, as each vLLM model file builds its decoder layers."""
    mt, n = hf["model_type"], hf["num_hidden_layers"]
    if mt == "jamba":  # jamba.py: ALL_DECODER_LAYER_TYPES[config.layers_block_type[i]]
        p, o = hf.get("attn_layer_period", 8), hf.get("attn_layer_offset", 4)
        return [((i % p == o), (i % p != o)) for i in range(n)]
    if mt == "granitemoehybrid":  # granitemoehybrid.py: config.layer_types[i]
        return [(t == "attention", t == "mamba") for t in hf["layer_types"]]
    if mt == "falcon_h1":  # falcon_h1.py: every FalconH1ParallelHybrid has both
        return [(True, True)] * n
    if mt == "qwen3_next":  # qwen3_next.py: config.layer_types[i]
        types = hf.get("layer_types") or [
            "full_attention" if (i + 1) % hf["full_attention_interval"] == 0 else "linear_attention"
            for i in range(n)
        ]
        return [(t == "full_attention", t == "linear_attention") for t in types]
    if mt in ("mamba", "mamba2"):
        return [(False, True)] * n
    raise SystemExit(f"no layer pattern for {mt}")


class HfConfig(SimpleNamespace):
    """Attribute access over the config.json dict (None for absent keys, as the HF config
    classes' defaults are only needed for keys the catalogue configs carry)."""

    def __getattr__(self, name):  # only called for missing attributes
        return None


def make_vllm_config(hf: dict, case: dict):
    dtype = torch.bfloat16
    heads = hf.get("num_attention_heads") or 1  # absent in pure Mamba configs (unused there)
    kv = hf.get("num_key_value_heads") or heads
    head_size = hf.get("head_dim") or hf["hidden_size"] // heads
    tp = case["tp"]
    prefix = case.get("enable_prefix_caching")
    kinds = layer_kinds(hf)
    has_attn = any(a for a, _ in kinds)
    if prefix is None:
        # ModelConfig.is_prefix_caching_supported: hybrid -> True, attention_free -> False
        prefix = has_attn
    hfc = HfConfig(**hf)
    model_config = SimpleNamespace(
        dtype=dtype,
        use_mla=False,
        hf_config=hfc,
        hf_text_config=hfc,
        architecture=ARCH[hf["model_type"]][1],
        max_model_len=case["max_model_len"],
        original_max_model_len=case["max_model_len"],
        get_num_kv_heads=lambda pc: max(1, kv // pc.tensor_parallel_size),
        get_head_size=lambda: head_size,
        is_hybrid=has_attn,
    )
    cache_config = SimpleNamespace(
        block_size=case["block_size"],
        user_specified_block_size=True,
        cache_dtype="auto",
        mamba_cache_dtype="auto",
        mamba_ssm_cache_dtype="auto",
        mamba_page_size_padded=None,
        mamba_block_size=None,
        mamba_cache_mode="none",
        enable_prefix_caching=prefix,
        kv_cache_dtype_skip_layers=[],
        num_gpu_blocks_override=None,
        prefix_cache_retention_interval=0,
        kv_cache_layout=None,
        prefix_match_unit=None,
    )
    from vllm.config.cache import _layout_from_name

    # CacheConfig.get_resolved_kv_cache_layout (vllm/config/cache.py)
    cache_config.get_resolved_kv_cache_layout = lambda: _layout_from_name(cache_config.kv_cache_layout)
    vllm_config = SimpleNamespace(
        model_config=model_config,
        cache_config=cache_config,
        parallel_config=SimpleNamespace(
            tensor_parallel_size=tp,
            decode_context_parallel_size=1,
            pipeline_parallel_size=1,
        ),
        scheduler_config=SimpleNamespace(
            enable_chunked_prefill=True,
            disable_hybrid_kv_cache_manager=False,
            max_num_batched_tokens=case["max_num_batched_tokens"],
        ),
        attention_config=SimpleNamespace(hisparse_config=None),
        speculative_config=None,
        num_speculative_tokens=0,
        additional_config={},
        kv_transfer_config=None,
        compilation_config=SimpleNamespace(static_forward_context={}),
    )
    return vllm_config, kinds, head_size


def check_case(case: dict, out: list[str]) -> bool:
    import importlib

    from vllm.config.vllm import set_current_vllm_config
    from vllm.model_executor.models.config import MambaModelConfig
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )

    hf = json.loads((ROOT / case["hf_config"]).read_text())
    vc, kinds, head_size = make_vllm_config(hf, case)
    mod, cls_name = ARCH[hf["model_type"]]
    model_cls = getattr(importlib.import_module(mod), cls_name)
    gdn = hf["model_type"] == "qwen3_next"
    gdn_flashinfer = bool(case.get("flashinfer_gdn_prefill"))

    # MambaModelConfig.verify_and_update_config (run for hybrids via
    # HybridAttentionMambaModelConfig and for Mamba/Mamba2 via MODELS_CONFIG_MAP)
    MambaModelConfig.verify_and_update_config(vc)
    align = vc.cache_config.mamba_cache_mode == "align"
    ckpt_align = 64 if (gdn and gdn_flashinfer and align) else None
    mamba_abstract.get_mamba_prefill_checkpoint_alignment = lambda _vc: ckpt_align
    # the registry would resolve the same class from model_config (model_impl, hf_config...)
    from vllm.model_executor.models import ModelRegistry

    ModelRegistry.resolve_model_cls = lambda *a, **k: (model_cls, cls_name)
    Platform._find_non_ssm_backends = classmethod(lambda cls, _vc: [FlashAttentionBackend])
    with set_current_vllm_config(vc):
        if vc.model_config.is_hybrid:
            Platform._align_hybrid_block_size(vc, FlashAttentionBackend)
        if align:
            # MambaModelConfig set mamba_block_size to the pre-alignment block size; the
            # platform resets it in align mode
            assert vc.cache_config.mamba_block_size == vc.cache_config.block_size
        shapes = model_cls.get_mamba_state_shape_from_config(vc)
        dtypes = model_cls.get_mamba_state_dtype_from_config(vc)
    cc = vc.cache_config
    kvh = vc.model_config.get_num_kv_heads(vc.parallel_config)
    specs = {}
    for i, (attn, state) in enumerate(kinds):
        if attn:
            specs[f"layers.{i}.attn"] = FullAttentionSpec(
                block_size=cc.block_size,
                num_kv_heads=kvh,
                head_size=head_size,
                dtype=torch.bfloat16,
            )
        if state:
            extra = {}
            if ckpt_align is not None:
                # Qwen3NextGatedDeltaNet.get_kv_cache_spec with FlashInfer checkpoints
                extra = dict(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=cc.block_size)
            specs[f"layers.{i}.mixer"] = MambaSpec(
                shapes=tuple(shapes),
                dtypes=tuple(dtypes),
                block_size=cc.mamba_block_size,
                page_size_padded=cc.mamba_page_size_padded,
                mamba_cache_mode=cc.mamba_cache_mode,
                **extra,
            )
    layouts = get_supported_kv_cache_layouts((FlashAttentionBackend,))
    cc.kv_cache_layout = resolve_kv_cache_layout(vc, [[l.name for l in layouts]], specs.values()).name
    with set_current_vllm_config(vc):
        groups = planning.get_kv_cache_groups(vc, dict(specs))
        builder = get_kv_cache_config_builder(vc)
        available = case["available_kv_bytes"]
        cfg = planning.get_kv_cache_config_from_groups(vc, groups, available)
        bpb = planning._pool_bytes_per_block_from_builder(builder, vc, groups)
        check = available - bpb
        needed = planning._max_memory_usage_bytes_from_groups(builder, vc, groups)
        fits = check > 0 and needed <= check
        est = planning._estimate_max_model_len_from_groups(builder, vc, groups, check)
        conc = {}
        for n in case.get("max_concurrency_at", {}):
            vc.model_config.max_model_len = int(n)
            conc[n] = kv_cache_utils.get_max_concurrency_for_kv_cache_config(vc, cfg)
        vc.model_config.max_model_len = case["max_model_len"]
        tokens, _ = kv_cache_utils.get_kv_cache_capacity(vc, cfg)

    state_page = MambaSpec(shapes=tuple(shapes), dtypes=tuple(dtypes), block_size=1).page_size_bytes
    got = {
        "block_size_aligned": cc.block_size,
        "mamba_cache_mode": cc.mamba_cache_mode,
        "state_page_bytes": state_page,
        "page_size_bytes": groups[0].kv_cache_spec.page_size_bytes,
        "kv_cache_groups": [
            ("full" if isinstance(g.kv_cache_spec, FullAttentionSpec) else "mamba", len(g.layer_names))
            for g in groups
        ],
        "bytes_per_block": bpb,
        "num_gpu_blocks": cfg.num_blocks,
        "fits_max_model_len": fits,
    }
    want = {
        "block_size_aligned": case["block_size_aligned"],
        "mamba_cache_mode": case["mamba_cache_mode"],
        "state_page_bytes": case["state_page_bytes"],
        "page_size_bytes": case["page_size_bytes"],
        "kv_cache_groups": [(g["type"], g["num_layers"]) for g in case["kv_cache_groups"]],
        "bytes_per_block": case["bytes_per_block"],
        "num_gpu_blocks": case["num_gpu_blocks"],
        "fits_max_model_len": case.get("expected_error") is None,
    }
    ok = True
    out.append(f"## {case['id']}  ({hf['model_type']}, tp {case['tp']}, layout {cc.kv_cache_layout})")
    out.append(f"   state shapes {list(shapes)} dtypes {[str(d) for d in dtypes]}")
    for k in got:
        flag = "ok" if got[k] == want[k] else "MISMATCH"
        ok &= got[k] == want[k]
        out.append(f"   {k:22} vllm={got[k]!s:40} expected={want[k]!s:40} {flag}")
    if case.get("expected_error") is not None:
        w = case["expected_error"]["estimated_max_model_len"]
        flag = "ok" if est == w else "MISMATCH"
        ok &= est == w
        out.append(f"   {'estimated_max_len':22} vllm={est!s:40} expected={w!s:40} {flag}")
    else:
        for n, c in conc.items():
            w = case["max_concurrency_at"][n]
            good = abs(c - w) <= 1e-9 * max(1.0, w)
            ok &= good
            out.append(f"   {'concurrency@' + n:22} vllm={c!s:40} expected={w!s:40} {'ok' if good else 'MISMATCH'}")
        w = case["vllm_log_kv_cache_size_tokens"]
        ok &= tokens == w
        out.append(f"   {'log_kv_cache_tokens':22} vllm={tokens!s:40} expected={w!s:40} {'ok' if tokens == w else 'MISMATCH'}")
    return ok


def main() -> int:
    doc = json.loads((ROOT / "tests/serve/vllm_expected.json").read_text())
    out = [f"vLLM {vllm.__version__} ({vllm.__file__}); torch {torch.__version__}", ""]
    ok = True
    n = 0
    for case in doc["cases"]:
        if "hf_config" not in case:
            continue
        n += 1
        try:
            ok &= check_case(case, out)
        except Exception as e:  # report and go on
            import traceback

            traceback.print_exc()
            ok = False
            out.append(f"## {case['id']}: ERROR {type(e).__name__}: {e}")
    out.append("")
    out.append(f"{n} cases: {'all match' if ok else 'MISMATCHES'}")
    text = "\n".join(out) + "\n"
    (ROOT / "tools/emit_check/vllm_hybrid_check.out.txt").write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
