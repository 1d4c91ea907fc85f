"""memwall: will this LLM training or serving run fit, and how fast can it go.

The same estimates as the ``memwall`` command line, from Python: each function runs the CLI's
own argument resolution and report builder (the Rust library, in ``memwall._native``) and
returns a typed result. Keyword arguments are the CLI's flags in snake case (``grad_accum=4``
is ``--grad-accum 4``; ``True`` is a bare flag; a list is comma-joined); ``None`` keeps the
CLI's default::

    >>> import memwall
    >>> r = memwall.train(model="llama-3.1-8b", batch=4, checkpointing=True)
    >>> r.peak_bytes, r.phase, r.fits
    >>> r.to_dict()           # the JSON of `memwall train --json`, exactly

``model=`` takes what ``--model`` takes (a catalogue id, a Hub repo id in the local cache, a
path to a config.json, a model directory, a .safetensors or .gguf file), or a ``dict`` of a
config.json, or a ``transformers.PretrainedConfig`` (anything with ``to_dict()``), or a model
with a ``.config``. Bad input raises :class:`MemwallError` (a ``ValueError``) naming the field
and carrying the CLI's hint.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, TypeVar, Union

from . import _native
from ._errors import MemwallError, MemwallWarning
from ._reports import (
    DoctorReport,
    DoctorStep,
    GpuFit,
    GpuSpec,
    InferReport,
    InspectReport,
    ModelEntry,
    ModelInfo,
    Plan,
    PlanReport,
    Record,
    RooflineReport,
    ServeReport,
    Speed,
    TrainReport,
    format_bytes,
)
from ._hf import from_training_args, training_args_kwargs

__version__: str = _native.__version__

__all__ = [
    "__version__",
    "train",
    "infer",
    "serve",
    "roofline",
    "plan",
    "doctor",
    "doctor_infer",
    "inspect",
    "models",
    "gpus",
    "from_training_args",
    "training_args_kwargs",
    # MemwallCallback too, but not listed: `from memwall import *` must not import transformers
    "MemwallError",
    "MemwallWarning",
    "TrainReport",
    "InferReport",
    "ServeReport",
    "RooflineReport",
    "PlanReport",
    "Plan",
    "DoctorReport",
    "DoctorStep",
    "InspectReport",
    "ModelEntry",
    "GpuSpec",
    "ModelInfo",
    "GpuFit",
    "Speed",
    "Record",
    "format_bytes",
]

ModelArg = Union[str, "os.PathLike[str]", Dict[str, Any], Any]
_R = TypeVar("_R")


def _json_default(value: Any) -> Any:
    """What json.dumps cannot write in a config: dtypes (``torch.bfloat16`` → ``bfloat16``),
    nested configs, sets."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    text = str(value)
    return text[len("torch.") :] if text.startswith("torch.") else text


def _model_arg(model: ModelArg) -> Tuple[str, Optional[str]]:
    """The ``--model`` value and, for a config given as an object, its JSON text."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model), None
    config: Any = model
    if not isinstance(config, dict) and not hasattr(config, "to_dict"):
        inner = getattr(config, "config", None)  # a transformers model: its config
        if inner is not None and (isinstance(inner, dict) or hasattr(inner, "to_dict")):
            config = inner
    if hasattr(config, "to_dict") and not isinstance(config, dict):
        config = config.to_dict()
    if not isinstance(config, dict):
        raise MemwallError(
            f"cannot use model of type {type(model).__name__}",
            "pass a catalogue id, a Hub repo id, a path, a dict of a config.json, or a "
            "transformers PretrainedConfig",
            field="model",
            flag="--model",
        )
    label = next(
        (
            str(config[k])
            for k in ("_name_or_path", "name_or_path", "model_type")
            if isinstance(config.get(k), str) and config.get(k)
        ),
        "config",
    )
    try:
        text = json.dumps(config, default=_json_default, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise MemwallError(
            f"cannot write the model config as JSON: {e}",
            "pass a config whose values are numbers, strings, lists and dicts",
            field="model",
            flag="--model",
        ) from None
    return label, text


def _flag_args(name: str, value: Any) -> List[str]:
    """One keyword argument as CLI arguments (``[]`` when it keeps the CLI default)."""
    if value is None:
        return []
    if name == "dropout":
        return [] if value else ["--no-dropout"]
    if name == "enable_prefix_caching":  # vLLM's pair: --enable-prefix-caching / --no-…
        return ["--enable-prefix-caching" if value else "--no-enable-prefix-caching"]
    if name == "use_cache":  # a flag with a value: --use-cache=true|false
        return [f"--use-cache={'true' if value else 'false'}"]
    flag = "--" + name.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return []
    if isinstance(value, (list, tuple, set, frozenset)):
        value = ",".join(str(v) for v in value)
    elif isinstance(value, float):
        value = repr(value)
    elif isinstance(value, os.PathLike):
        value = os.fspath(value)
    return [f"{flag}={value}"]


def _run_json(argv: List[str], config_json: Optional[str] = None) -> Any:
    ok, text = _native.run(argv, config_json)
    if not ok:
        raise MemwallError._from_lines(text)
    return json.loads(text)


def _run(
    command: Sequence[str], flags: Dict[str, Any], report: Type[_R], model: Any = None
) -> _R:
    argv = list(command)
    config_json = None
    if model is not None:
        label, config_json = _model_arg(model)
        argv.append(f"--model={label}")
    for name, value in flags.items():
        argv.extend(_flag_args(name, value))
    argv.append("--json")
    return report._from_json(_run_json(argv, config_json))  # type: ignore[attr-defined,no-any-return]


def _flags(values: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in values.items() if k != "model"}


def train(
    model: Optional[ModelArg] = None,
    *,
    batch: Optional[int] = None,
    seq: Optional[int] = None,
    precision: Optional[str] = None,
    optimizer: Optional[str] = None,
    checkpointing: Optional[bool] = None,
    checkpointing_policy: Optional[str] = None,
    attention: Optional[str] = None,
    lora_rank: Optional[int] = None,
    lora_targets: Union[str, Sequence[str], None] = None,
    qlora: Optional[bool] = None,
    grad_accum: Optional[int] = None,
    dropout: Optional[bool] = None,
    loss: Optional[str] = None,
    padding_free: Optional[bool] = None,
    loop: Optional[str] = None,
    use_cache: Optional[bool] = None,
    kernels: Optional[str] = None,
    train_vision: Optional[bool] = None,
    image_tokens: Optional[int] = None,
    gpu: Optional[str] = None,
    matmul_efficiency: Optional[float] = None,
    bandwidth_efficiency: Optional[float] = None,
    alloc_margin: Optional[float] = None,
    gpus: Optional[int] = None,
    gpus_per_node: Optional[int] = None,
    strategy: Optional[str] = None,
    tp: Optional[int] = None,
    sequence_parallel: Optional[bool] = None,
    pp: Optional[int] = None,
    schedule: Optional[str] = None,
    virtual_stages: Optional[int] = None,
    cp: Optional[int] = None,
    ep: Optional[int] = None,
    offload: Optional[str] = None,
    offload_device: Optional[str] = None,
    global_batch: Optional[int] = None,
    runtime: Optional[str] = None,
    activation_offload: Optional[bool] = None,
    float8: Optional[str] = None,
    float8_all_gather: Optional[bool] = None,
) -> TrainReport:
    """Peak memory of one training step (``memwall train``); see ``memwall train --help``.

    ``dropout=False`` is ``--no-dropout``; ``float8="rowwise"`` is ``--float8 rowwise`` (with
    ``runtime="torchtitan"``). With ``gpus > 1`` or a ``strategy`` the report has
    every rank (``distributed``, ``ranks``); when the step does not fit, the doctor's steps
    (``doctor``).
    """
    return _run(["train"], _flags(locals()), TrainReport, model)


def doctor(
    model: Optional[ModelArg] = None,
    *,
    batch: Optional[int] = None,
    seq: Optional[int] = None,
    precision: Optional[str] = None,
    optimizer: Optional[str] = None,
    checkpointing: Optional[bool] = None,
    checkpointing_policy: Optional[str] = None,
    attention: Optional[str] = None,
    lora_rank: Optional[int] = None,
    lora_targets: Union[str, Sequence[str], None] = None,
    qlora: Optional[bool] = None,
    grad_accum: Optional[int] = None,
    dropout: Optional[bool] = None,
    loss: Optional[str] = None,
    padding_free: Optional[bool] = None,
    loop: Optional[str] = None,
    use_cache: Optional[bool] = None,
    kernels: Optional[str] = None,
    train_vision: Optional[bool] = None,
    image_tokens: Optional[int] = None,
    gpu: Optional[str] = None,
    matmul_efficiency: Optional[float] = None,
    bandwidth_efficiency: Optional[float] = None,
    alloc_margin: Optional[float] = None,
    gpus: Optional[int] = None,
    gpus_per_node: Optional[int] = None,
    strategy: Optional[str] = None,
    tp: Optional[int] = None,
    sequence_parallel: Optional[bool] = None,
    pp: Optional[int] = None,
    schedule: Optional[str] = None,
    virtual_stages: Optional[int] = None,
    cp: Optional[int] = None,
    ep: Optional[int] = None,
    offload: Optional[str] = None,
    offload_device: Optional[str] = None,
    global_batch: Optional[int] = None,
    runtime: Optional[str] = None,
    activation_offload: Optional[bool] = None,
    float8: Optional[str] = None,
    float8_all_gather: Optional[bool] = None,
) -> DoctorReport:
    """Where the training peak is and the cheapest fixes, in order, until it fits
    (``memwall doctor``); the keywords of :func:`train`."""
    return _run(["doctor"], _flags(locals()), DoctorReport, model)


def infer(
    model: Optional[ModelArg] = None,
    *,
    image_tokens: Optional[int] = None,
    batch: Optional[int] = None,
    prompt: Optional[int] = None,
    new_tokens: Optional[int] = None,
    attention: Optional[str] = None,
    weights: Optional[str] = None,
    kv_dtype: Optional[str] = None,
    gpu: Optional[str] = None,
    moe_grouped_decode: Optional[bool] = None,
    alloc_margin: Optional[float] = None,
) -> InferReport:
    """Peak memory of ``generate``-style inference, prefill then decode (``memwall infer``)."""
    return _run(["infer"], _flags(locals()), InferReport, model)


def doctor_infer(
    model: Optional[ModelArg] = None,
    *,
    image_tokens: Optional[int] = None,
    batch: Optional[int] = None,
    prompt: Optional[int] = None,
    new_tokens: Optional[int] = None,
    attention: Optional[str] = None,
    weights: Optional[str] = None,
    kv_dtype: Optional[str] = None,
    gpu: Optional[str] = None,
    moe_grouped_decode: Optional[bool] = None,
    alloc_margin: Optional[float] = None,
) -> DoctorReport:
    """The inference doctor (``memwall doctor infer``); the keywords of :func:`infer`."""
    return _run(["doctor", "infer"], _flags(locals()), DoctorReport, model)


def serve(
    model: Optional[ModelArg] = None,
    *,
    gpu: Optional[str] = None,
    tp: Optional[int] = None,
    gpu_memory_utilization: Optional[float] = None,
    kv_cache_dtype: Optional[str] = None,
    quantization: Optional[str] = None,
    weights: Optional[str] = None,
    block_size: Optional[int] = None,
    max_model_len: Optional[int] = None,
    max_num_batched_tokens: Optional[int] = None,
    max_num_seqs: Optional[int] = None,
    enforce_eager: Optional[bool] = None,
    kv_cache_memory_bytes: Optional[int] = None,
    non_torch_bytes: Optional[int] = None,
    activation_bytes: Optional[int] = None,
    cuda_graph_bytes: Optional[int] = None,
    enable_prefix_caching: Optional[bool] = None,
    request_lengths: Union[str, Sequence[int], None] = None,
) -> ServeReport:
    """KV-cache capacity of a vLLM deployment, by vLLM's own accounting (``memwall serve``).
    ``enable_prefix_caching=True|False`` is ``--enable-prefix-caching`` /
    ``--no-enable-prefix-caching`` (``None``: vLLM's default for the model)."""
    return _run(["serve"], _flags(locals()), ServeReport, model)


def roofline(
    model: Optional[ModelArg] = None,
    *,
    gpu: Optional[str] = None,
    phase: Optional[str] = None,
    batch: Optional[int] = None,
    seq: Optional[int] = None,
    dtype: Optional[str] = None,
    tp: Optional[int] = None,
    flops_efficiency: Optional[float] = None,
    bandwidth_efficiency: Optional[float] = None,
    svg: Union[str, "os.PathLike[str]", None] = None,
) -> RooflineReport:
    """Roofline of a training step, prefill or decode: FLOPs, bytes, bound and time of each op
    (``memwall roofline``); ``svg=PATH`` also writes the plot."""
    return _run(["roofline"], _flags(locals()), RooflineReport, model)


def plan(
    model: Optional[ModelArg] = None,
    *,
    gpu: Optional[str] = None,
    gpus: Optional[int] = None,
    gpus_per_node: Optional[int] = None,
    seq: Optional[int] = None,
    global_batch: Optional[int] = None,
    host_memory_per_node: Optional[int] = None,
    allow: Union[str, Sequence[str], None] = None,
    max_step_s: Optional[float] = None,
    top: Optional[int] = None,
    precision: Optional[str] = None,
    optimizer: Optional[str] = None,
    attention: Optional[str] = None,
    loss: Optional[str] = None,
    checkpointing_policy: Optional[str] = None,
    loop: Optional[str] = None,
    use_cache: Optional[bool] = None,
    kernels: Optional[str] = None,
    dropout: Optional[bool] = None,
    lora_rank: Optional[int] = None,
    lora_targets: Union[str, Sequence[str], None] = None,
    alloc_margin: Optional[float] = None,
    runtime: Optional[str] = None,
) -> PlanReport:
    """The fastest training configurations that fit a cluster, ranked by tokens/s per GPU
    (``memwall plan``). Each plan's ``kwargs`` reproduce it with :func:`train`."""
    return _run(["plan"], _flags(locals()), PlanReport, model)


def inspect(model: ModelArg) -> InspectReport:
    """Exact parameter counts by component, and the bytes per dtype (``memwall inspect``)."""
    label, config_json = _model_arg(model)
    return InspectReport._from_json(
        _run_json(["inspect", "--json", "--", label], config_json)
    )


def models() -> List[ModelEntry]:
    """The embedded model catalogue (``memwall models``)."""
    return [ModelEntry._from_json(m) for m in _run_json(["models", "--json"])]


def gpus() -> List[GpuSpec]:
    """The GPUs ``gpu=`` accepts (``memwall gpus``)."""
    return [GpuSpec._from_json(g) for g in _run_json(["gpus", "--json"])]


def __getattr__(name: str) -> Any:
    # MemwallCallback subclasses transformers.TrainerCallback: defined on first use, so that
    # `import memwall` never imports transformers
    if name == "MemwallCallback":
        from ._hf import callback_class

        cls = callback_class()
        globals()["MemwallCallback"] = cls
        return cls
    raise AttributeError(f"module 'memwall' has no attribute {name!r}")
