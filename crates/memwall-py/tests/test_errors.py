"""Errors are MemwallError (a ValueError) with the field, the flag, the message and the hint."""

from __future__ import annotations

from typing import Any

import pytest

import memwall


def test_a_bad_value_names_its_field_and_hint(cli_error: Any) -> None:
    with pytest.raises(memwall.MemwallError) as e:
        memwall.train(batch=0)
    err = e.value
    assert isinstance(err, ValueError)
    assert err.field == "batch" and err.flag == "--batch"
    assert err.message.startswith("invalid --batch/-b 0")
    assert err.hint
    # the lines the CLI prints on stderr
    assert err.lines == cli_error("train", "--batch", "0").stderr.splitlines()
    assert f"hint: {err.hint}" in str(err)


def test_a_value_the_cli_does_not_accept() -> None:
    with pytest.raises(memwall.MemwallError) as e:
        memwall.train(precision="bf17")
    assert e.value.field == "precision" and e.value.flag == "--precision"
    assert "bf17" in e.value.message
    assert e.value.hint is not None and "--help" in e.value.hint


def test_an_unsupported_combination() -> None:
    with pytest.raises(memwall.MemwallError) as e:
        memwall.train(gpus=8, strategy="fsdp-full", offload="params")
    assert e.value.field == "offload"
    assert e.value.hint == "use --offload both with FSDP2"


def test_an_unknown_model() -> None:
    with pytest.raises(memwall.MemwallError) as e:
        memwall.train(model="llama-3.1-8bb")
    assert e.value.field == "model" and e.value.flag == "--model"
    assert "did you mean" in e.value.message


def test_a_config_field_at_fault(repo: Any) -> None:
    import json

    config = json.loads((repo / "data/models/Qwen/Qwen3-0.6B.json").read_text())
    config["num_key_value_heads"] = 3
    with pytest.raises(memwall.MemwallError) as e:
        memwall.train(model=config)
    assert e.value.flag == "--model"
    assert e.value.field in ("num_attention_heads", "num_key_value_heads"), e.value.lines
    assert "num_key_value_heads" in e.value.message
    assert e.value.hint


def test_a_missing_config_field(repo: Any) -> None:
    import json

    config = json.loads((repo / "data/models/Qwen/Qwen3-0.6B.json").read_text())
    del config["hidden_size"]
    with pytest.raises(memwall.MemwallError) as e:
        memwall.train(model=config)
    assert (e.value.flag, e.value.field) == ("--model", "hidden_size"), e.value.lines


def test_a_model_of_no_usable_type() -> None:
    with pytest.raises(memwall.MemwallError) as e:
        memwall.train(model=3.5)  # type: ignore[arg-type]
    assert e.value.field == "model"


def test_a_value_for_a_bare_flag_and_a_bare_value_flag() -> None:
    with pytest.raises(memwall.MemwallError) as e:
        memwall.train(batch=True)  # type: ignore[arg-type]
    assert e.value.field == "batch"


def test_an_unknown_keyword_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        memwall.train(batch_size=4)  # type: ignore[call-arg]
