"""Bridges to Hugging Face training: ``TrainingArguments`` → :func:`memwall.train` keywords, and
a ``TrainerCallback`` that checks the plan before training starts.

Nothing here imports transformers, except :func:`callback_class` (on first use of
``memwall.MemwallCallback``): the arguments are read by attribute, so TRL's ``SFTConfig`` and
look-alike objects work too.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ._errors import MemwallError, MemwallWarning

__all__ = ["training_args_kwargs", "from_training_args", "callback_class", "not_fit_message"]

# TrainingArguments.optim (transformers.training_args.OptimizerNames) → memwall --optimizer.
# Only optimizers whose device memory memwall models: torch AdamW with foreach (the default
# of torch.optim.AdamW on CUDA) and fused=True (transformers/trainer.py get_optimizer_cls_and_kwargs),
# bitsandbytes AdamW8bit (paged: the same states in unified memory, counted on the GPU),
# transformers' Adafactor (factored second moment, no first moment by default: the states of
# torch's Adafactor) and torch SGD.
OPTIMIZERS: Dict[str, str] = {
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw-fused",
    "adamw_bnb_8bit": "adamw-8bit",
    "adamw_8bit": "adamw-8bit",
    "paged_adamw_8bit": "adamw-8bit",
    "adafactor": "adafactor",
    "sgd": "sgd",
}

# config._attn_implementation → memwall --attention
ATTENTION: Dict[str, str] = {
    "sdpa": "sdpa",
    "eager": "eager",
    "flash_attention_2": "flash",
}

# FSDP sharding (transformers' legacy `fsdp` strings, FSDP1 `reshard_after_forward` names)
FSDP_STRATEGIES: Dict[str, str] = {
    "full_shard": "fsdp-full",
    "shard_grad_op": "fsdp-grad-op",
    "hybrid_shard": "hsdp",
    "no_shard": "ddp",
}

_DTYPES: Dict[str, str] = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
}


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _enum_value(value: Any) -> Any:
    return getattr(value, "value", value)


def _dtype_name(dtype: Any) -> Optional[str]:
    """``torch.bfloat16``, ``"bfloat16"``, ``"bf16"`` → ``bf16``; ``None`` when unknown."""
    if dtype is None:
        return None
    text = str(dtype)
    text = text[len("torch.") :] if text.startswith("torch.") else text
    return _DTYPES.get(text.lower())


def _module_dtype(module: Any) -> Optional[str]:
    """The dtype of a torch module's first floating parameter."""
    params = getattr(module, "parameters", None)
    if params is None:
        return None
    try:
        for p in params():
            if getattr(p, "is_floating_point", lambda: False)():
                return _dtype_name(p.dtype)
    except Exception:  # a look-alike without real parameters: no dtype
        return None
    return None


def _precision(args: Any, model_dtype: Optional[str]) -> str:
    """Trainer's ``bf16``/``fp16`` are autocast over the model as loaded: over a 16-bit model
    nothing changes (the model's dtype is the precision), over an fp32 model it is memwall's
    ``amp-bf16``/``amp-fp16``; without either flag the model trains in its own dtype."""
    bf16 = bool(_get(args, "bf16", False))
    fp16 = bool(_get(args, "fp16", False))
    if bf16 and fp16:
        raise MemwallError(
            "TrainingArguments has both bf16 and fp16 set",
            "set one of them (transformers refuses both too)",
            field="bf16",
        )
    if model_dtype in ("bf16", "fp16"):
        return model_dtype
    if bf16:
        return "amp-bf16"
    if fp16:
        return "amp-fp16"
    return "fp32"


def _optimizer(args: Any) -> Optional[str]:
    optim = _enum_value(_get(args, "optim", None))
    if optim is None:
        return None
    name = str(optim)
    mapped = OPTIMIZERS.get(name)
    if mapped is None:
        raise MemwallError(
            f"TrainingArguments optim `{name}` has no memwall optimizer",
            "memwall models "
            + ", ".join(f"{k} ({v})" for k, v in OPTIMIZERS.items())
            + "; pass optimizer= (adamw, adamw-fused, adamw-forloop, adamw-8bit, sgd, "
            "sgd-momentum, adafactor, lion) to estimate with the closest one",
            field="optim",
        )
    if mapped == "sgd" and _momentum(_get(args, "optim_args", None)):
        return "sgd-momentum"
    return mapped


def _momentum(optim_args: Any) -> bool:
    """``optim_args="momentum=0.9,nesterov=True"`` (Trainer's parser) asks for momentum."""
    if not optim_args:
        return False
    for part in str(optim_args).replace(" ", "").split(","):
        key, _, value = part.partition("=")
        if key == "momentum":
            try:
                return float(value) != 0.0
            except ValueError:
                return True
    return False


def _load_deepspeed(ds: Any) -> Optional[Dict[str, Any]]:
    if ds is None or ds is False or ds == "":
        return None
    if isinstance(ds, Mapping):
        return dict(ds)
    if isinstance(ds, (str, os.PathLike)):
        try:
            with open(ds, encoding="utf-8") as f:
                loaded = json.load(f)
        except (OSError, ValueError) as e:
            raise MemwallError(
                f"cannot read the DeepSpeed config `{os.fspath(ds)}`: {e}",
                "pass TrainingArguments(deepspeed=) a readable JSON file or a dict",
                field="deepspeed",
            ) from None
        if isinstance(loaded, dict):
            return loaded
    raise MemwallError(
        f"TrainingArguments deepspeed of type {type(ds).__name__} is not a DeepSpeed config",
        "pass a path to a DeepSpeed JSON config or a dict",
        field="deepspeed",
    )


def _offload_device(device: Any) -> Optional[str]:
    if device is None:
        return None
    d = str(device).lower()
    if d in ("none", "", "auto"):
        return None
    if d in ("cpu", "nvme"):
        return d
    raise MemwallError(
        f"DeepSpeed offload device `{device}` is not cpu or nvme",
        "memwall models offload to cpu and nvme",
        field="deepspeed",
    )


def _deepspeed(ds: Dict[str, Any], world: int) -> Dict[str, Any]:
    """``zero_optimization``: stage → zeroN (stage 0: plain data parallelism), offload_optimizer /
    offload_param devices → offload and offload_device."""
    zero = ds.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if stage == "auto" or stage is None:
        stage = 0
    try:
        stage = int(stage)
    except (TypeError, ValueError):
        stage = -1
    if stage not in (0, 1, 2, 3):
        raise MemwallError(
            f"DeepSpeed zero_optimization.stage `{zero.get('stage')}` is not 0, 1, 2 or 3",
            "set zero_optimization.stage to 0-3",
            field="deepspeed",
        )
    out: Dict[str, Any] = {}
    if stage == 0:
        out["strategy"] = "ddp" if world > 1 else None
        return out
    out["strategy"] = f"zero{stage}"
    opt = _offload_device(_get(zero.get("offload_optimizer") or {}, "device"))
    par = _offload_device(_get(zero.get("offload_param") or {}, "device"))
    if opt and par and opt != par:
        raise MemwallError(
            f"DeepSpeed offloads the optimizer to {opt} and the parameters to {par}",
            "memwall models one offload device: offload both to cpu or both to nvme",
            field="deepspeed",
        )
    if opt and par:
        out["offload"] = "both"
    elif opt:
        out["offload"] = "optimizer"
    elif par:
        out["offload"] = "params"
    if opt or par:
        out["offload_device"] = opt or par
    return out


def _fsdp(fsdp: Any, config: Any) -> Dict[str, Any]:
    """transformers' ``fsdp`` (``True``, or the legacy strings ``"full_shard auto_wrap"``) and
    ``fsdp_config`` (``reshard_after_forward``: a bool for FSDP2, a sharding strategy name for
    FSDP1; ``cpu_offload``; ``activation_checkpointing``) → strategy, offload, checkpointing.
    transformers/training_args.py `_apply_legacy_fsdp_to_config`."""
    config = dict(config or {})
    items: List[str] = []
    if isinstance(fsdp, str):
        items = fsdp.split()
    elif isinstance(fsdp, (list, tuple)):
        items = [str(_enum_value(i)) for i in fsdp]
    strategy: Optional[str] = None
    offload = bool(config.get("cpu_offload", False)) and str(config.get("cpu_offload")).lower() != "false"
    for item in items:
        item = item.lower()
        if item in FSDP_STRATEGIES:
            strategy = FSDP_STRATEGIES[item]
        elif item == "offload":
            offload = True
        elif item == "auto_wrap":
            pass
        else:
            raise MemwallError(
                f"TrainingArguments fsdp option `{item}` has no memwall strategy",
                "memwall models "
                + ", ".join(f"{k} ({v})" for k, v in FSDP_STRATEGIES.items())
                + ", offload and auto_wrap",
                field="fsdp",
            )
    if strategy is None:
        reshard = config.get("reshard_after_forward", True)
        if isinstance(reshard, bool):
            strategy = "fsdp-full" if reshard else "fsdp-grad-op"
        elif str(reshard).lower() in ("true", "false"):
            strategy = "fsdp-full" if str(reshard).lower() == "true" else "fsdp-grad-op"
        elif str(reshard).lower() in FSDP_STRATEGIES:
            strategy = FSDP_STRATEGIES[str(reshard).lower()]
        else:
            raise MemwallError(
                f"fsdp_config reshard_after_forward `{reshard}` has no memwall strategy",
                "use true (full_shard), false (shard_grad_op) or an FSDP1 strategy name: "
                + ", ".join(FSDP_STRATEGIES),
                field="fsdp_config",
            )
    out: Dict[str, Any] = {"strategy": strategy}
    if offload:
        # FSDP2's CPUOffloadPolicy moves parameters, gradients and optimizer states together
        out["offload"] = "both"
    if str(config.get("activation_checkpointing", "false")).lower() == "true":
        out["checkpointing"] = True
    return out


def _world_size(args: Any) -> Tuple[int, Optional[int]]:
    """GPUs in the job and per node: TrainingArguments.world_size (torch.distributed's, when
    launched), else the launcher's WORLD_SIZE; LOCAL_WORLD_SIZE per node."""
    world: Any = None
    try:
        world = _get(args, "world_size", None)
    except Exception:  # the property needs torch's distributed state; fall back to the env
        world = None
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        env = os.environ.get("WORLD_SIZE", "")
        world = int(env) if env.isdigit() and int(env) > 0 else 1
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    per_node = int(local) if local.isdigit() and int(local) > 0 else None
    return world, per_node


def _split_model(model: Any) -> Tuple[Any, Any]:
    """(what ``model=`` gets, the torch module if one was given)."""
    if model is None or isinstance(model, (str, os.PathLike, Mapping)):
        return model, None
    if hasattr(model, "to_dict"):  # a PretrainedConfig
        return model, None
    config = getattr(model, "config", None)
    if config is not None:
        return config, model
    return model, None


def _lora(module: Any) -> Dict[str, Any]:
    """A PEFT model's active LoRA adapter: rank and targets; QLoRA when the base is 4-bit."""
    peft = getattr(module, "peft_config", None)
    if not isinstance(peft, Mapping) or not peft:
        return {}
    name = getattr(module, "active_adapter", None)
    if not isinstance(name, str) or name not in peft:
        name = next(iter(peft))
    cfg = peft[name]
    r = _get(cfg, "r", None)
    if not isinstance(r, int):
        return {}
    targets = _get(cfg, "target_modules", None)
    if isinstance(targets, str):
        targets_list: Optional[List[str]] = [targets]
    elif isinstance(targets, Iterable):
        targets_list = sorted(str(t) for t in targets)
    else:
        targets_list = None
    out: Dict[str, Any] = {"lora_rank": r}
    if targets_list:
        out["lora_targets"] = targets_list
    if getattr(module, "is_loaded_in_4bit", False):
        out["qlora"] = True
    return out


def _attention(config: Any) -> Optional[str]:
    impl = _get(config, "_attn_implementation", None) if config is not None else None
    if impl is None and isinstance(config, Mapping):
        impl = config.get("attn_implementation")
    if impl is None:
        return None
    mapped = ATTENTION.get(str(impl))
    if mapped is None:
        raise MemwallError(
            f"attention implementation `{impl}` has no memwall attention",
            "memwall models "
            + ", ".join(f"{k} ({v})" for k, v in ATTENTION.items())
            + "; pass attention= to estimate with the closest one",
            field="attn_implementation",
        )
    return mapped


def _liger_kernels(config: Any) -> str:
    """The ``kernels`` value of ``use_liger_kernel=True`` with this ``liger_kernel_config``
    (keywords of Liger's ``apply_liger_kernel_to_<family>``): Liger's defaults are ``liger``;
    RMSNorm alone (rope, swiglu/geglu and the fused linear cross-entropy off) is ``rmsnorm``;
    any other set is refused by name."""
    if not config:
        return "liger"
    if not isinstance(config, dict):
        raise MemwallError(
            f"liger_kernel_config `{config!r}` is not a dict",
            "pass a dict of apply_liger_kernel_to_* keywords, or leave it unset",
            field="liger_kernel_config",
        )
    defaults = {"rope": True, "rms_norm": True, "swiglu": True, "geglu": True, "fused_linear_cross_entropy": True, "cross_entropy": False}
    norm_only = dict(defaults, rope=False, swiglu=False, geglu=False, fused_linear_cross_entropy=False)
    unknown = [k for k in config if k not in defaults]
    if not unknown:
        merged = dict(defaults, **config)
        if merged == defaults:
            return "liger"
        if merged == norm_only:
            return "rmsnorm"
    raise MemwallError(
        f"liger_kernel_config `{config!r}` is not modelled: memwall models Liger's default set (kernels=\"liger\") and RMSNorm alone (kernels=\"rmsnorm\")",
        "leave liger_kernel_config unset, or turn off rope, swiglu, geglu and fused_linear_cross_entropy for RMSNorm alone",
        field="liger_kernel_config",
    )


def training_args_kwargs(
    training_args: Any,
    model_config: Any = None,
    *,
    module: Any = None,
    model_dtype: Any = None,
    **overrides: Any,
) -> Dict[str, Any]:
    """The :func:`memwall.train` keywords of a Hugging Face ``TrainingArguments`` (or TRL
    ``SFTConfig``, or any object with the same attributes).

    Read: ``per_device_train_batch_size`` → batch, ``gradient_accumulation_steps`` →
    grad_accum, ``bf16``/``fp16`` → precision (with the model's dtype: autocast over an fp32
    model is ``amp-bf16``/``amp-fp16``, over a 16-bit model its own dtype),
    ``gradient_checkpointing`` (or ``activation_checkpointing``) → checkpointing, ``optim`` → optimizer, ``deepspeed`` (a path or dict:
    ``zero_optimization.stage`` → zeroN, ``offload_optimizer``/``offload_param`` → offload),
    ``fsdp``/``fsdp_config`` → fsdp-full, fsdp-grad-op, hsdp (``cpu_offload`` → offload both),
    the world size (``world_size``, else ``WORLD_SIZE``; ``LOCAL_WORLD_SIZE`` per node) → gpus,
    TRL's ``max_length``/``max_seq_length`` → seq and ``padding_free``, ``use_liger_kernel`` →
    kernels="liger" (Liger's default kernel set) or "rmsnorm" (``liger_kernel_config`` with only
    ``rms_norm``; any other ``liger_kernel_config`` is refused).

    ``model_config`` is what :func:`memwall.train` takes as ``model=`` (a PretrainedConfig, a
    dict, a catalogue id, a path), or the model itself: then its config, its dtype, its
    attention implementation and a PEFT LoRA adapter are read too (``module=`` gives the model
    separately). ``model_dtype`` (``torch.bfloat16``, ``"bf16"``) says how the model was loaded
    when no model is given; without it an fp32 load is assumed. ``overrides`` are train()
    keywords that win over what was read (``gpu="a100-80gb"``, ``seq=4096``).

    Raises :class:`memwall.MemwallError` naming the field for a value memwall does not model.
    """
    config, found_module = _split_model(model_config)
    module = module if module is not None else found_module
    if config is None and module is not None:
        config = getattr(module, "config", None)
    dtype = _dtype_name(model_dtype) if model_dtype is not None else None
    if model_dtype is not None and dtype is None:
        raise MemwallError(
            f"model_dtype `{model_dtype}` is not bfloat16, float16 or float32",
            "pass torch.bfloat16, torch.float16, torch.float32 or their names",
            field="model_dtype",
        )
    if dtype is None and module is not None:
        dtype = _module_dtype(module)

    kw: Dict[str, Any] = {}
    if config is not None:
        kw["model"] = config
    batch = _get(training_args, "per_device_train_batch_size", None)
    if batch is not None:
        kw["batch"] = int(batch)
    accum = _get(training_args, "gradient_accumulation_steps", None)
    if accum is not None:
        kw["grad_accum"] = int(accum)
    kw["precision"] = _precision(training_args, dtype)
    optimizer = _optimizer(training_args)
    if optimizer is not None:
        kw["optimizer"] = optimizer
    # `activation_checkpointing` is transformers 5's new name of `gradient_checkpointing`
    if _get(training_args, "gradient_checkpointing", False) is True or (
        _get(training_args, "activation_checkpointing", False) is True
    ):
        kw["checkpointing"] = True
    for name in ("max_length", "max_seq_length"):
        seq = _get(training_args, name, None)
        if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0:
            kw["seq"] = seq
            break
    if _get(training_args, "padding_free", False) is True:
        kw["padding_free"] = True
    if _get(training_args, "use_liger_kernel", False) is True:
        # the Trainer patches the model with Liger's kernels (rope, rms_norm, swiglu/geglu and
        # fused linear cross-entropy by default; liger_kernel_config can switch them off)
        kw["kernels"] = _liger_kernels(_get(training_args, "liger_kernel_config", None))
    attention = _attention(config if module is None else getattr(module, "config", config))
    if attention is not None:
        kw["attention"] = attention

    world, per_node = _world_size(training_args)
    ds = _load_deepspeed(_get(training_args, "deepspeed", None))
    fsdp = _get(training_args, "fsdp", None)
    if ds is not None and fsdp:
        raise MemwallError(
            "TrainingArguments sets both deepspeed and fsdp",
            "set one of them (transformers refuses both too)",
            field="fsdp",
        )
    if ds is not None:
        kw.update(_deepspeed(ds, world))
    elif fsdp:
        kw.update(_fsdp(fsdp, _get(training_args, "fsdp_config", None)))
    if world > 1 or kw.get("strategy"):
        kw["gpus"] = world
        if per_node is not None:
            kw["gpus_per_node"] = per_node
    if module is not None:
        kw.update(_lora(module))
    kw.update(overrides)
    return {k: v for k, v in kw.items() if v is not None}


def from_training_args(
    training_args: Any,
    model_config: Any = None,
    *,
    module: Any = None,
    model_dtype: Any = None,
    **overrides: Any,
) -> Any:
    """:func:`memwall.train` for a Hugging Face ``TrainingArguments`` and the model's config
    (see :func:`training_args_kwargs` for what is read); ``overrides`` are train() keywords
    (``gpu="a100-80gb"``). Returns the :class:`memwall.TrainReport`."""
    from . import train

    return train(
        **training_args_kwargs(
            training_args, model_config, module=module, model_dtype=model_dtype, **overrides
        )
    )


def not_fit_message(report: Any) -> str:
    """What the callback warns: the peak against the GPU, and the doctor's first fix that fits."""
    gpu = report.gpu
    from ._reports import format_bytes

    text = (
        f"memwall: this training run will not fit on {gpu.id} ({gpu.name}): peak "
        f"{format_bytes(report.peak_bytes)} during {report.phase}, needing "
        f"{format_bytes(gpu.required_bytes)} of {format_bytes(gpu.memory_bytes)}."
    )
    doctor = report.doctor
    step = doctor.first_fitting_step if doctor is not None else None
    if step is not None:
        text += f" First fix that fits: {step.change}: `{step.command}`"
    elif doctor is not None and doctor.steps:
        text += (
            " No fix of the doctor fits on its own; its steps end at "
            f"{format_bytes(doctor.steps[-1].required_bytes)}: `{doctor.steps[-1].command}`"
        )
    return text


def callback_class() -> type:
    """``memwall.MemwallCallback``: a ``transformers.TrainerCallback`` (imported here, once)."""
    try:
        from transformers import TrainerCallback  # type: ignore[import-not-found,unused-ignore]
    except ImportError as e:
        raise ImportError(
            f"memwall.MemwallCallback is a transformers.TrainerCallback, and transformers cannot "
            f"be imported ({e}): `pip install transformers`"
        ) from e

    from . import train

    class MemwallCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]
        """Checks the training plan with memwall when training begins, and warns
        (:class:`memwall.MemwallWarning`) with the doctor's first fix that fits when the step
        will not fit the GPU. ``report`` holds the last estimate.

        Args:
            model_config: what ``model=`` takes (default: the trained model's config).
            gpu: the GPU to check against (``memwall.gpus()``; default the CLI's).
            strict: raise instead of warning when memwall cannot model the run.
            overrides: more :func:`memwall.train` keywords (``seq=4096``).
        """

        def __init__(
            self,
            model_config: Any = None,
            gpu: Optional[str] = None,
            *,
            strict: bool = False,
            **overrides: Any,
        ) -> None:
            super().__init__()
            self.model_config = model_config
            self.gpu = gpu
            self.strict = strict
            self.overrides = overrides
            self.report: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state is not None and not getattr(state, "is_world_process_zero", True):
                return
            module = kwargs.get("model")
            config = self.model_config
            overrides = dict(self.overrides)
            if self.gpu is not None:
                overrides["gpu"] = self.gpu
            try:
                kw = training_args_kwargs(
                    args,
                    config if config is not None else module,
                    module=module,
                    **overrides,
                )
                self.report = train(**kw)
            except MemwallError as e:
                if self.strict:
                    raise
                warnings.warn(
                    f"memwall could not check this training run: {e}", MemwallWarning, stacklevel=2
                )
                return
            if not self.report.fits:
                warnings.warn(not_fit_message(self.report), MemwallWarning, stacklevel=2)

    MemwallCallback.__module__ = "memwall"
    MemwallCallback.__qualname__ = "MemwallCallback"
    return MemwallCallback
