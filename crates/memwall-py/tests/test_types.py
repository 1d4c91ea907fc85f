"""The shipped stubs type-check typical use, and the package checks under mypy --strict
(skipped where mypy is not installed; run_tests.sh installs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

USE = '''
from typing import Optional

import memwall

r: memwall.TrainReport = memwall.train(model="gpt2", batch=2, lora_targets=["q_proj"], dropout=False)
peak: int = r.peak_bytes
fits: bool = r.fits and r.gpu.fits
if r.doctor is not None and r.doctor.first_fitting_step is not None:
    command: str = r.doctor.first_fitting_step.command
    memwall.train(**r.doctor.first_fitting_step.kwargs)
best = memwall.plan(allow=["lora"], top=3).best
ids = [m.id for m in memwall.models()] + [g.id for g in memwall.gpus()]
kw = memwall.training_args_kwargs(object(), {"model_type": "llama"}, gpu="h100-sxm")
cb = memwall.MemwallCallback(gpu="h100-sxm")
try:
    memwall.serve(request_lengths=[1024, 2048])
except memwall.MemwallError as e:
    field: Optional[str] = e.field
'''

BAD = '''
import memwall
memwall.train(batch="4")
'''


def _mypy(tmp_path: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    pytest.importorskip("mypy")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *args],
        capture_output=True, text=True, cwd=tmp_path,
    )


def test_the_stubs_type_check_typical_use(tmp_path: Path) -> None:
    (tmp_path / "use.py").write_text(USE)
    out = _mypy(tmp_path, "use.py")
    assert out.returncode == 0, out.stdout
    (tmp_path / "bad.py").write_text(BAD)
    out = _mypy(tmp_path, "bad.py")
    assert out.returncode == 1 and 'incompatible type "str"' in out.stdout, out.stdout


def test_the_package_checks_strictly(tmp_path: Path) -> None:
    out = _mypy(tmp_path, "-p", "memwall")
    assert out.returncode == 0, out.stdout
