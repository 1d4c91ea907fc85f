"""from_training_args and MemwallCallback: with look-alike objects here, and with the real
transformers (a LlamaConfig, TrainingArguments, a Trainer run) where it can be imported: in
this interpreter, or in $MEMWALL_TRANSFORMERS_PYTHON (default: the truth venv,
/work/venvs/truth/bin/python), which then runs hf_real.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Iterator, Optional

import pytest

import memwall

QWEN = "data/models/Qwen/Qwen3-0.6B.json"


def args(**kw: Any) -> SimpleNamespace:
    """A TrainingArguments look-alike with transformers' defaults."""
    base: Dict[str, Any] = dict(
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        optim="adamw_torch",
        optim_args=None,
        deepspeed=None,
        fsdp=None,
        fsdp_config=None,
        world_size=1,
    )
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch: Any) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_the_plain_fields() -> None:
    kw = memwall.training_args_kwargs(
        args(per_device_train_batch_size=4, gradient_accumulation_steps=8, bf16=True,
             gradient_checkpointing=True, optim="adamw_torch_fused"),
        "llama-3.1-8b",
    )
    assert kw == {
        "model": "llama-3.1-8b", "batch": 4, "grad_accum": 8, "precision": "amp-bf16",
        "optimizer": "adamw-fused", "checkpointing": True,
    }
    r = memwall.from_training_args(
        args(per_device_train_batch_size=4, gradient_accumulation_steps=8, bf16=True,
             gradient_checkpointing=True, optim="adamw_torch_fused"),
        "llama-3.1-8b",
    )
    direct = memwall.train(model="llama-3.1-8b", batch=4, grad_accum=8, precision="amp-bf16",
                           optimizer="adamw-fused", checkpointing=True)
    assert r.to_dict() == direct.to_dict()


@pytest.mark.parametrize(
    "optim,expected",
    [("adamw_torch", "adamw"), ("adamw_torch_fused", "adamw-fused"), ("adamw_bnb_8bit", "adamw-8bit"),
     ("adamw_8bit", "adamw-8bit"), ("paged_adamw_8bit", "adamw-8bit"), ("adafactor", "adafactor"),
     ("sgd", "sgd")],
)
def test_optimizers(optim: str, expected: str) -> None:
    class Enum:  # transformers' OptimizerNames is a str Enum: its .value is the name
        value = optim

    assert memwall.training_args_kwargs(args(optim=optim))["optimizer"] == expected
    assert memwall.training_args_kwargs(args(optim=Enum()))["optimizer"] == expected
    momentum = memwall.training_args_kwargs(args(optim="sgd", optim_args="momentum=0.9"))
    assert momentum["optimizer"] == "sgd-momentum"


def test_an_unknown_optimizer_names_the_field() -> None:
    with pytest.raises(memwall.MemwallError) as e:
        memwall.training_args_kwargs(args(optim="galore_adamw"))
    assert e.value.field == "optim" and "galore_adamw" in e.value.message and e.value.hint
    # an override wins over what cannot be read? no: the refusal names the field to override
    assert "optimizer=" in (e.value.hint or "")


@pytest.mark.parametrize(
    "flags,dtype,expected",
    [({"bf16": True}, None, "amp-bf16"), ({"fp16": True}, None, "amp-fp16"), ({}, None, "fp32"),
     ({"bf16": True}, "bfloat16", "bf16"), ({}, "torch.bfloat16", "bf16"), ({"fp16": True}, "float16", "fp16"),
     ({"bf16": True}, "float32", "amp-bf16")],
)
def test_precision_follows_the_flags_and_the_model_dtype(flags: Dict[str, Any], dtype: Optional[str], expected: str) -> None:
    assert memwall.training_args_kwargs(args(**flags), model_dtype=dtype)["precision"] == expected


def test_bf16_and_fp16_together_are_refused() -> None:
    with pytest.raises(memwall.MemwallError) as e:
        memwall.training_args_kwargs(args(bf16=True, fp16=True))
    assert e.value.field == "bf16"


def test_deepspeed_configs(tmp_path: Path, monkeypatch: Any) -> None:
    ds = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                "offload_param": {"device": "cpu"}}}
    kw = memwall.training_args_kwargs(args(deepspeed=ds, world_size=8))
    assert (kw["strategy"], kw["offload"], kw["offload_device"], kw["gpus"]) == ("zero3", "both", "cpu", 8)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}))
    kw = memwall.training_args_kwargs(args(deepspeed=str(path), world_size=4))
    assert (kw["strategy"], kw["offload"], kw["offload_device"]) == ("zero2", "optimizer", "nvme")
    # the world size from the launcher's environment
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    kw = memwall.training_args_kwargs(args(deepspeed={"zero_optimization": {"stage": 1}}, world_size=None))
    assert (kw["strategy"], kw["gpus"], kw["gpus_per_node"]) == ("zero1", 16, 8)
    r = memwall.from_training_args(args(deepspeed=ds, world_size=8, bf16=True), "llama-3.1-8b")
    assert r.distributed is not None and r.distributed.layout.strategy == "zero3"
    with pytest.raises(memwall.MemwallError) as e:
        memwall.training_args_kwargs(args(deepspeed={"zero_optimization": {"stage": 4}}))
    assert e.value.field == "deepspeed"
    with pytest.raises(memwall.MemwallError) as e:
        memwall.training_args_kwargs(args(deepspeed=str(tmp_path / "missing.json")))
    assert e.value.field == "deepspeed"


@pytest.mark.parametrize(
    "fsdp,config,expected",
    [
        ("full_shard auto_wrap", None, {"strategy": "fsdp-full"}),
        (["shard_grad_op"], None, {"strategy": "fsdp-grad-op"}),
        ("hybrid_shard", {"version": 1}, {"strategy": "hsdp"}),
        ("full_shard offload", None, {"strategy": "fsdp-full", "offload": "both"}),
        (True, {"reshard_after_forward": False}, {"strategy": "fsdp-grad-op"}),
        (True, {"cpu_offload": True, "activation_checkpointing": True},
         {"strategy": "fsdp-full", "offload": "both", "checkpointing": True}),
    ],
)
def test_fsdp_settings(fsdp: Any, config: Any, expected: Dict[str, Any]) -> None:
    kw = memwall.training_args_kwargs(args(fsdp=fsdp, fsdp_config=config, world_size=16))
    assert {k: kw[k] for k in expected} == expected
    assert kw["gpus"] == 16
    memwall.train(**kw)  # the CLI takes them


def test_an_unknown_fsdp_option_names_the_field() -> None:
    with pytest.raises(memwall.MemwallError) as e:
        memwall.training_args_kwargs(args(fsdp="hybrid_shard_zero2"))
    assert e.value.field == "fsdp"


def test_trl_fields_and_overrides() -> None:
    kw = memwall.training_args_kwargs(args(max_length=4096, padding_free=True), "gpt2", gpu="a100-80gb-sxm", seq=1024)
    assert kw["seq"] == 1024 and kw["padding_free"] is True and kw["gpu"] == "a100-80gb-sxm"


def test_use_liger_kernel_maps_to_kernels_liger(repo: Any) -> None:
    kw = memwall.training_args_kwargs(args(use_liger_kernel=True), str(repo / QWEN))
    assert kw["kernels"] == "liger"
    report = memwall.train(**kw)  # the CLI takes it: Liger's loss and layer kernels
    plain = memwall.train(**memwall.training_args_kwargs(args(), str(repo / QWEN)))
    assert report.peak_bytes < plain.peak_bytes
    norm_only = {"rope": False, "swiglu": False, "geglu": False, "fused_linear_cross_entropy": False}
    kw = memwall.training_args_kwargs(args(use_liger_kernel=True, liger_kernel_config=norm_only))
    assert kw["kernels"] == "rmsnorm"
    with pytest.raises(memwall.MemwallError) as e:
        memwall.training_args_kwargs(args(use_liger_kernel=True, liger_kernel_config={"swiglu": False}))
    assert e.value.field == "liger_kernel_config"


def test_a_peft_model_gives_its_adapter(repo: Any) -> None:
    class Param:
        dtype = "torch.bfloat16"

        def is_floating_point(self) -> bool:
            return True

    class PeftModel:
        config = json.loads((repo / QWEN).read_text())
        peft_config = {"default": SimpleNamespace(r=16, target_modules={"v_proj", "q_proj"})}
        active_adapter = "default"
        is_loaded_in_4bit = False

        def parameters(self) -> Iterator[Param]:
            yield Param()

    kw = memwall.training_args_kwargs(args(bf16=True), PeftModel())
    assert (kw["lora_rank"], kw["lora_targets"], kw["precision"]) == (16, ["q_proj", "v_proj"], "bf16")
    assert memwall.train(**kw).model.params_trainable < memwall.train(model=kw["model"]).model.params_trainable


# ---------------------------------------------------------------------------------------------
# The callback, over a stand-in transformers module (the real one below)


@pytest.fixture
def fake_transformers(monkeypatch: Any) -> Iterator[None]:
    mod = types.ModuleType("transformers")

    class TrainerCallback:
        pass

    mod.TrainerCallback = TrainerCallback  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers", mod)
    memwall.__dict__.pop("MemwallCallback", None)
    yield
    memwall.__dict__.pop("MemwallCallback", None)


def test_the_callback_warns_with_the_doctor_s_first_fitting_step(fake_transformers: None) -> None:
    cb = memwall.MemwallCallback(model_config="llama-3.1-70b", gpu="h100-sxm")
    assert isinstance(cb, sys.modules["transformers"].TrainerCallback)
    state = SimpleNamespace(is_world_process_zero=True)
    with pytest.warns(memwall.MemwallWarning) as caught:
        cb.on_train_begin(args(per_device_train_batch_size=1, bf16=True), state, None)
    text = str(caught[0].message)
    step = cb.report.doctor.first_fitting_step
    assert "will not fit on h100-sxm" in text
    assert step.command in text and text.endswith(f"`{step.command}`")
    assert step.command.startswith("memwall train --model llama-3.1-70b")


def test_the_callback_is_quiet_when_it_fits(fake_transformers: None) -> None:
    cb = memwall.MemwallCallback(model_config="gpt2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cb.on_train_begin(args(per_device_train_batch_size=2), SimpleNamespace(is_world_process_zero=True), None)
    assert cb.report is not None and cb.report.fits
    # other ranks do not estimate
    cb2 = memwall.MemwallCallback(model_config="gpt2")
    cb2.on_train_begin(args(), SimpleNamespace(is_world_process_zero=False), None)
    assert cb2.report is None


def test_the_callback_uses_the_trained_model_s_config(fake_transformers: None, repo: Any) -> None:
    model = SimpleNamespace(config=json.loads((repo / QWEN).read_text()))
    cb = memwall.MemwallCallback()
    cb.on_train_begin(args(per_device_train_batch_size=2), None, None, model=model)
    assert cb.report.model.model_type == "qwen3"


def test_the_callback_warns_when_it_cannot_model_the_run(fake_transformers: None) -> None:
    cb = memwall.MemwallCallback(model_config="gpt2")
    with pytest.warns(memwall.MemwallWarning, match="could not check"):
        cb.on_train_begin(args(optim="lomo"), None, None)
    strict = memwall.MemwallCallback(model_config="gpt2", strict=True)
    with pytest.raises(memwall.MemwallError):
        strict.on_train_begin(args(optim="lomo"), None, None)


# ---------------------------------------------------------------------------------------------
# The real transformers


def _transformers_python() -> Optional[str]:
    try:
        import transformers  # noqa: F401

        return sys.executable
    except ImportError:
        pass
    candidate = os.environ.get("MEMWALL_TRANSFORMERS_PYTHON", "/work/venvs/truth/bin/python")
    if not candidate or not Path(candidate).exists():
        return None
    probe = subprocess.run([candidate, "-c", "import transformers, torch"], capture_output=True)
    return candidate if probe.returncode == 0 else None


def test_with_the_real_transformers(tmp_path: Path, repo: Any) -> None:
    python = _transformers_python()
    if python is None:
        pytest.skip("transformers is not importable here nor in $MEMWALL_TRANSFORMERS_PYTHON")
    # only the memwall package on the path, so nothing of this venv shadows that interpreter's
    package = Path(memwall.__file__).parent
    shutil.copytree(package, tmp_path / "memwall", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), MEMWALL_REPO=str(repo))
    env.pop("WORLD_SIZE", None)
    from conftest import _binary

    env["MEMWALL_BIN"] = str(_binary())
    out = subprocess.run(
        [python, str(Path(__file__).with_name("hf_real.py"))],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("hf_real: ok"), out.stdout


def test_without_transformers_the_callback_says_what_is_missing(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    memwall.__dict__.pop("MemwallCallback", None)
    with pytest.raises(ImportError, match="pip install transformers"):
        memwall.MemwallCallback
    memwall.__dict__.pop("MemwallCallback", None)
    ns: Dict[str, Any] = {}
    exec("from memwall import *", ns)  # never needs transformers
    assert "train" in ns and "MemwallCallback" not in ns
