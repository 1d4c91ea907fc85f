"""model= as a dict, a PretrainedConfig-like object, or a model with .config: the config
goes through the CLI's config.json path, with nothing written to disk."""

from __future__ import annotations

import json
import os
from typing import Any, Dict

import pytest

import memwall

QWEN = "data/models/Qwen/Qwen3-0.6B.json"


def _config(repo: Any) -> Dict[str, Any]:
    return json.loads((repo / QWEN).read_text())


class FakeConfig:
    """What transformers.PretrainedConfig offers memwall: to_dict()."""

    def __init__(self, data: Dict[str, Any]) -> None:
        self._data = data

    def to_dict(self) -> Dict[str, Any]:
        return dict(self._data)


class FakeModel:
    def __init__(self, config: Any) -> None:
        self.config = config


def _same_estimate(a: Dict[str, Any], b: Dict[str, Any]) -> None:
    for key in ("peak_bytes", "phase", "at_peak", "gpu", "speed", "workload"):
        assert a[key] == b[key], key


def test_a_dict_is_the_config_file(repo: Any, cli: Any) -> None:
    r = memwall.train(model=_config(repo), batch=2, checkpointing=True)
    _same_estimate(r.to_dict(), cli("train", "--model", QWEN, "--batch", "2", "--checkpointing"))
    assert r.model.label == "qwen3"  # no _name_or_path: the model_type
    assert r.model.origin == "config given as JSON text"


def test_a_config_object_and_a_model(repo: Any, cli: Any) -> None:
    data = _config(repo)
    data["_name_or_path"] = "Qwen/Qwen3-0.6B"
    expected = cli("train", "--model", QWEN)
    for model in (FakeConfig(data), FakeModel(FakeConfig(data)), FakeModel(data)):
        r = memwall.train(model=model)
        _same_estimate(r.to_dict(), expected)
        assert r.model.label == "Qwen/Qwen3-0.6B"


def test_every_command_takes_a_config(repo: Any, cli: Any) -> None:
    data = _config(repo)
    assert memwall.infer(model=data).peak_bytes == cli("infer", "--model", QWEN)["peak_bytes"]
    assert memwall.serve(model=data).kv_tokens == cli("serve", "--model", QWEN)["kv_tokens"]
    assert memwall.roofline(model=data).time_s == cli("roofline", "--model", QWEN)["time_s"]
    assert memwall.inspect(data).params == cli("inspect", QWEN)["params"]
    assert memwall.doctor(model=data).fits
    best = memwall.plan(model=data, gpus=2, top=1).best
    assert best is not None and best.peak_bytes == cli("plan", "--model", QWEN, "--gpus", "2", "--top", "1")["plans"][0]["peak_bytes"]


def test_paths_are_models_too(repo: Any, cli: Any) -> None:
    from pathlib import Path

    path = Path(repo / QWEN)
    assert memwall.train(model=path).peak_bytes == cli("train", "--model", str(path))["peak_bytes"]


def test_a_label_that_looks_like_a_flag(repo: Any) -> None:
    data = _config(repo)
    data["_name_or_path"] = "--batch"
    assert memwall.train(model=data).model.label == "--batch"


def test_dtype_objects_are_written_by_name(repo: Any, cli: Any) -> None:
    class Dtype:
        def __str__(self) -> str:
            return "torch.bfloat16"

    data = _config(repo)
    data["torch_dtype"] = Dtype()
    _same_estimate(memwall.train(model=data).to_dict(), cli("train", "--model", QWEN))


def test_nothing_is_written_to_disk(repo: Any, tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir(tmp_path))
    memwall.train(model=_config(repo))
    assert set(os.listdir(tmp_path)) == before


def test_a_config_that_is_not_json() -> None:
    with pytest.raises(memwall.MemwallError) as e:
        memwall.train(model={"model_type": "llama", "x": float("nan")})
    assert e.value.field == "model"
