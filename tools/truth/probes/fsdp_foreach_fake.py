#!/usr/bin/env python3
"""Probe: are FSDP2 (DTensor-parameter) optimizer steps measured correctly on fake tensors?

Runs one small FSDP2 case through measure_dist's worker for {adamw-forloop, adamw (foreach)} x
{fake without the DTensor-propagation patch, fake (as measure_dist runs), real CPU tensors}, each in
a fresh subprocess, and prints the steady peak, the per-phase peaks and the first-step peak.

What it showed (torch 2.15.0, smollm-135m, W=4, B=1, S=128): without the patch the fake FIRST
step is too high (for-loop 453,057,472 B, foreach 1,143,379,936 B vs 353,935,144 B real): DTensor
sharding propagation builds global-shape tensors under the active fake mode, which FSDPMemTracker
counts (README, "Distributed training").  With the patch fake == real byte for byte, first and
steady step, for-loop and foreach.  Not a measurement; nothing is written.

Usage: python tools/truth/probes/fsdp_foreach_fake.py [CONFIG [W]]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import measure_dist  # noqa: E402


def main() -> None:
    config = sys.argv[1] if len(sys.argv) > 1 else "smollm-135m"
    w = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    for opt in ("adamw-forloop", "adamw"):
        for mode in ("fake-unpatched", "fake", "real"):
            case = dict(measure_dist.DEFAULTS, id=f"probe-{opt}", config=config, world_size=w,
                        batch=1, seq=128, optimizer=opt)
            cmd = [sys.executable, str(HERE.parent / "measure_dist.py"), "--worker", json.dumps(case)]
            env = dict(os.environ)
            if mode == "real":
                cmd.append("--worker-real")
            if mode == "fake-unpatched":
                env["MEMWALL_NO_DTENSOR_PROP_PATCH"] = "1"
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                print(f"{opt:<14} {mode}: FAILED\n{p.stdout[-1500:]}{p.stderr[-1500:]}")
                continue
            m = json.loads(line[7:])["measured"]
            print(f"{opt:<14} {mode:<15} peak={m['peak_bytes']} first_step={m['first_step_peak_bytes']} "
                  f"steady phase peaks={m['phase_peaks']}", flush=True)


if __name__ == "__main__":
    main()
