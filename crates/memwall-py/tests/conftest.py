"""Shared fixtures: the repository, and the `memwall` binary to compare the bindings with."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[3]


def _binary() -> Path:
    """The CLI built from this checkout: $MEMWALL_BIN, else target/debug/memwall (built here
    with cargo when missing)."""
    env = os.environ.get("MEMWALL_BIN")
    if env:
        return Path(env)
    path = REPO / "target" / "debug" / "memwall"
    if not path.exists():
        subprocess.run(
            ["cargo", "build", "--quiet", "--locked", "-p", "memwall-cli"], cwd=REPO, check=True
        )
    return path


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def cli() -> Callable[..., Any]:
    """``cli("train", "--batch", "2")``: the parsed JSON of ``memwall train --batch 2 --json``."""
    binary = _binary()

    def run(*args: str) -> Any:
        out = subprocess.run(
            [str(binary), *args, "--json"], cwd=REPO, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    return run


@pytest.fixture(scope="session")
def cli_error() -> Callable[..., "subprocess.CompletedProcess[str]"]:
    """``cli_error("train", "--batch", "0")``: the failed run (exit 2), its stderr."""
    binary = _binary()

    def run(*args: str) -> "subprocess.CompletedProcess[str]":
        out = subprocess.run([str(binary), *args], cwd=REPO, capture_output=True, text=True)
        assert out.returncode == 2, out
        return out

    return run
