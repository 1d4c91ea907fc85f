"""The functions against the CLI: the same JSON, typed; keywords are the CLI's flags."""

from __future__ import annotations

import dataclasses
import inspect
import re
import subprocess
import sys
from typing import Any, Dict, List

import pytest

import memwall


def test_acceptance_peak_bytes_is_the_cli_s(cli: Any) -> None:
    assert memwall.train(model="llama-3.1-8b").peak_bytes == cli("train")["peak_bytes"]


@pytest.mark.parametrize(
    "kwargs,args",
    [
        ({}, []),
        (
            {"model": "llama-3.1-8b", "batch": 4, "seq": 4096, "checkpointing": True},
            ["--model", "llama-3.1-8b", "--batch", "4", "--seq", "4096", "--checkpointing"],
        ),
        (
            {"model": "qwen3-8b", "lora_rank": 16, "lora_targets": ["q_proj", "v_proj"], "qlora": True},
            ["--model", "qwen3-8b", "--lora-rank", "16", "--lora-targets", "q_proj,v_proj", "--qlora"],
        ),
        (
            {"model": "llama-3.1-70b", "gpus": 16, "strategy": "fsdp-full", "precision": "amp-bf16",
             "optimizer": "adamw-fused", "dropout": False, "alloc_margin": 0.1},
            ["--model", "llama-3.1-70b", "--gpus", "16", "--strategy", "fsdp-full", "--precision",
             "amp-bf16", "--optimizer", "adamw-fused", "--no-dropout", "--alloc-margin", "0.1"],
        ),
        (
            {"model": "llama-3.1-8b", "gpus": 8, "tp": 2, "pp": 2, "sequence_parallel": True},
            ["--model", "llama-3.1-8b", "--gpus", "8", "--tp", "2", "--pp", "2", "--sequence-parallel"],
        ),
        ({"model": "llama-3.1-70b"}, ["--model", "llama-3.1-70b"]),
    ],
)
def test_train_is_the_cli_report(cli: Any, kwargs: Dict[str, Any], args: List[str]) -> None:
    r = memwall.train(**kwargs)
    expected = cli("train", *args)
    assert r.to_dict() == expected
    assert r.peak_bytes == expected["peak_bytes"]
    assert r.phase == expected["phase"]
    assert r.at_peak == expected["at_peak"]
    assert r.gpu.fits == expected["gpu"]["fits"] == r.fits
    assert r.model.label == expected["model"]["label"]
    assert r.speed is not None and r.speed.step_s == expected["speed"]["step_s"]
    # every top-level key is a declared field: a new key fails here, not silently
    assert set(expected) <= {f.name for f in dataclasses.fields(r)}
    if "ranks" in expected:
        assert r.distributed is not None and r.ranks is not None
        assert r.ranks[0].peak_bytes == expected["ranks"][0]["peak_bytes"]
        assert r.distributed.layout.to_dict() == expected["distributed"]["layout"]


def test_the_other_commands_are_the_cli_reports(cli: Any) -> None:
    cases = [
        (memwall.infer(batch=4, prompt=1024, new_tokens=128),
         cli("infer", "--batch", "4", "--prompt", "1024", "--new-tokens", "128")),
        (memwall.infer(model="llama-3.1-70b"), cli("infer", "--model", "llama-3.1-70b")),
        (memwall.serve(model="qwen3-8b", request_lengths=[1024, 8192]),
         cli("serve", "--model", "qwen3-8b", "--request-lengths", "1024,8192")),
        (memwall.roofline(phase="decode", batch=8), cli("roofline", "--phase", "decode", "--batch", "8")),
        (memwall.roofline(), cli("roofline")),
        (memwall.plan(top=3), cli("plan", "--top", "3")),
        (memwall.plan(model="llama-3.1-405b", gpus=1, top=2),
         cli("plan", "--model", "llama-3.1-405b", "--gpus", "1", "--top", "2")),
        (memwall.doctor(model="llama-3.1-70b"), cli("doctor", "--model", "llama-3.1-70b")),
        (memwall.doctor_infer(model="llama-3.1-70b"), cli("doctor", "infer", "--model", "llama-3.1-70b")),
        (memwall.inspect("gpt2"), cli("inspect", "gpt2")),
    ]
    for report, expected in cases:
        assert report.to_dict() == expected
        fields = {f.name for f in dataclasses.fields(report)}
        assert set(expected) <= fields, (type(report).__name__, set(expected) - fields)
    models = memwall.models()
    assert [m.to_dict() for m in models] == cli("models")
    assert {f.name for f in dataclasses.fields(models[0])} >= set(cli("models")[0])
    gpus = memwall.gpus()
    assert [g.to_dict() for g in gpus] == cli("gpus")
    assert {f.name for f in dataclasses.fields(gpus[0])} >= set(cli("gpus")[0])


def test_nested_parts_are_typed(cli: Any) -> None:
    d = memwall.doctor(model="llama-3.1-70b")
    for step, raw in zip(d.steps, cli("doctor", "--model", "llama-3.1-70b")["steps"]):
        assert {f.name for f in dataclasses.fields(step)} >= set(raw)
        assert step.to_dict() == raw
    p = memwall.plan(top=2)
    raw_plan = cli("plan", "--top", "2")["plans"][0]
    assert {f.name for f in dataclasses.fields(p.plans[0])} >= set(raw_plan)
    t = memwall.train(gpus=8, strategy="zero3")
    raw = cli("train", "--gpus", "8", "--strategy", "zero3")
    for part, cls in (("model", memwall.ModelInfo), ("gpu", memwall.GpuFit), ("speed", memwall.Speed)):
        assert isinstance(getattr(t, part), cls)
        assert {f.name for f in dataclasses.fields(cls)} >= set(raw[part]), part
        assert getattr(t, part).to_dict() == raw[part]


def test_doctor_steps_and_plans_reproduce_with_train() -> None:
    r = memwall.train(model="llama-3.1-70b")
    assert not r.fits and r.doctor is not None
    step = r.doctor.first_fitting_step
    assert step is not None and step.fits
    assert step.command.startswith("memwall train --model llama-3.1-70b ")
    again = memwall.train(**step.kwargs)
    assert again.peak_bytes == step.peak_bytes and again.fits
    best = memwall.plan(top=1).best
    assert best is not None
    assert memwall.train(**best.kwargs).peak_bytes == best.peak_bytes


def test_records_and_reprs() -> None:
    r = memwall.train(gpus=8, strategy="zero3")
    assert r.distributed is not None
    assert r.distributed.layout.strategy == "zero3"
    assert r.distributed["layout"]["strategy"] == "zero3"
    assert dict(r.distributed.layout)["tp"] == 1
    with pytest.raises(AttributeError):
        r.distributed.no_such_field
    text = repr(r)
    assert text.startswith("TrainReport('llama-3.1-8b', peak_bytes=") and "fits" in text
    html = r._repr_html_()
    assert "<table>" in html and "optimizer_states" in html and "GiB" in html
    for report in (memwall.infer(), memwall.serve(), memwall.roofline(), memwall.plan(top=2),
                   memwall.doctor(model="llama-3.1-70b")):
        assert type(report).__name__ in repr(report)
        assert "<table>" in report._repr_html_()
    assert memwall.format_bytes(80302612480) == "74.79 GiB"
    assert memwall.format_bytes(524288000) == "500.00 MiB"


def test_keywords_mirror_every_cli_flag(repo: Any) -> None:
    """Each long flag of `memwall <command> --help` is a keyword of the function (a flag added
    to the CLI fails here until the bindings take it)."""
    from conftest import _binary

    not_keywords = {"help", "version", "format", "json", "emit", "out", "plan_rank"}
    renamed = {"no_dropout": "dropout", "no_enable_prefix_caching": "enable_prefix_caching"}
    functions = {
        ("train",): memwall.train,
        ("doctor",): memwall.doctor,
        ("doctor", "infer"): memwall.doctor_infer,
        ("infer",): memwall.infer,
        ("serve",): memwall.serve,
        ("roofline",): memwall.roofline,
        ("plan",): memwall.plan,
    }
    for command, fn in functions.items():
        help_text = subprocess.run(
            [str(_binary()), *command, "--help"], capture_output=True, text=True, check=True
        ).stdout
        flags = {f.replace("-", "_") for f in re.findall(r"^\s+(?:-\w, )?--([a-z][a-z0-9-]*)", help_text, re.M)}
        names = {renamed.get(f, f) for f in flags} - not_keywords
        params = set(inspect.signature(fn).parameters)
        assert names - params == set(), (command, names - params)
        assert params - names == set(), (command, params - names)


def test_import_does_not_import_transformers() -> None:
    code = "import sys, memwall; memwall.train(model='gpt2'); print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_version_is_the_workspace_version(repo: Any) -> None:
    cargo = (repo / "Cargo.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', cargo, re.M)
    assert version is not None and memwall.__version__ == version.group(1)


def test_the_stubs_name_every_public_function() -> None:
    import pathlib

    stub = pathlib.Path(memwall.__file__).with_name("__init__.pyi").read_text()
    for name in memwall.__all__:
        assert re.search(rf"\b{name}\b", stub), name
    assert pathlib.Path(memwall.__file__).with_name("py.typed").exists()


def test_prefix_caching_reaches_the_hybrid_state_cache() -> None:
    """``enable_prefix_caching`` is vLLM's flag pair: on a hybrid model it picks
    ``mamba_cache_mode`` (align: 2 state blocks per request; none: 1), and the report says so."""
    on = memwall.serve(model="granite-4.0-h-tiny", enable_prefix_caching=True)
    off = memwall.serve(model="granite-4.0-h-tiny", enable_prefix_caching=False)
    assert on.state_cache["mamba_cache_mode"] == "align"
    assert on.state_cache["state_blocks_per_request"] == 2
    assert off.state_cache["mamba_cache_mode"] == "none"
    assert off.state_cache["state_blocks_per_request"] == 1
    assert "--no-enable-prefix-caching" in off.vllm_serve_command
    assert memwall.serve(model="llama-3.1-8b").state_cache is None
