"""The bridges with the real transformers (run by test_hf.py in an interpreter that has it):
a LlamaConfig as model=, real TrainingArguments, and MemwallCallback in a Trainer run.

Environment: PYTHONPATH holds the memwall package, MEMWALL_BIN the CLI, MEMWALL_REPO the repo.
Prints `hf_real: ok` at the end; any failure is an exception (exit 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import transformers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

import memwall

BIN = os.environ["MEMWALL_BIN"]


def cli(*args: str) -> dict:
    out = subprocess.run([BIN, *args, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def main() -> None:
    print("transformers", transformers.__version__, "torch", torch.__version__)
    tmp = Path(tempfile.mkdtemp())

    # 1. a real LlamaConfig as model=: the estimate of its config.json, written by transformers
    for cfg in (
        LlamaConfig(),  # transformers' default Llama (7B dims)
        LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=1024),
    ):
        d = tmp / f"cfg{cfg.num_hidden_layers}"
        cfg.save_pretrained(d)
        for kwargs, flags in (({}, []), ({"batch": 2, "checkpointing": True}, ["--batch", "2", "--checkpointing"])):
            mine = memwall.train(model=cfg, **kwargs).to_dict()
            theirs = cli("train", "--model", str(d / "config.json"), *flags)
            for key in ("peak_bytes", "phase", "at_peak", "gpu", "workload"):
                check(mine[key] == theirs[key], f"{key}: {mine[key]} != {theirs[key]}")
        print("LlamaConfig", cfg.num_hidden_layers, "layers: peak", mine["peak_bytes"], "as the CLI")

    # 2. real TrainingArguments
    a = TrainingArguments(output_dir=str(tmp / "out"), per_device_train_batch_size=2,
                          gradient_accumulation_steps=4, bf16=True, gradient_checkpointing=True,
                          optim="adamw_torch", report_to=[], use_cpu=True)
    kw = memwall.training_args_kwargs(a, "llama-3.1-8b")
    want = {"model": "llama-3.1-8b", "batch": 2, "grad_accum": 4, "precision": "amp-bf16",
            "optimizer": "adamw", "checkpointing": True}
    check(kw == want, f"{kw} != {want}")
    r = memwall.from_training_args(a, "llama-3.1-8b")
    check(r.peak_bytes == cli("train", "--batch", "2", "--grad-accum", "4", "--precision", "amp-bf16",
                              "--checkpointing")["peak_bytes"], "from_training_args peak")
    a = TrainingArguments(output_dir=str(tmp / "out"), optim="adafactor", report_to=[], use_cpu=True)
    check(memwall.training_args_kwargs(a)["optimizer"] == "adafactor", "adafactor")
    a = TrainingArguments(output_dir=str(tmp / "out"), optim="lomo", report_to=[], use_cpu=True)
    try:
        memwall.training_args_kwargs(a)
        raise AssertionError("lomo was accepted")
    except memwall.MemwallError as e:
        check(e.field == "optim", f"field {e.field}")
    print("TrainingArguments: ok")

    # 3. the callback's warning, with the real classes, against a small GPU
    big = LlamaConfig()
    cb = memwall.MemwallCallback(model_config=big, gpu="rtx-4090")
    check(isinstance(cb, transformers.TrainerCallback), "a TrainerCallback")
    a = TrainingArguments(output_dir=str(tmp / "out"), per_device_train_batch_size=1, bf16=True,
                          report_to=[], use_cpu=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cb.on_train_begin(a, TrainerState(), TrainerControl())
    msgs = [str(w.message) for w in caught if issubclass(w.category, memwall.MemwallWarning)]
    check(len(msgs) == 1 and "will not fit on rtx-4090" in msgs[0], f"warnings: {msgs}")
    step = cb.report.doctor.first_fitting_step
    check(step is not None and step.command in msgs[0], msgs[0])
    print("callback warning:", msgs[0])

    # 4. a real Trainer run on a tiny model: the callback estimates the trained model itself
    tiny = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = LlamaForCausalLM(tiny)
    data = [{"input_ids": torch.arange(16) % 128, "labels": torch.arange(16) % 128} for _ in range(4)]
    cb = memwall.MemwallCallback(seq=16)
    a = TrainingArguments(output_dir=str(tmp / "run"), per_device_train_batch_size=2, max_steps=1,
                          report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(model=model, args=a, train_dataset=data, callbacks=[cb]).train()
    check(not [w for w in caught if issubclass(w.category, memwall.MemwallWarning)], "no warning")
    check(cb.report is not None and cb.report.fits, "estimated, fits")
    check(cb.report.model.params_total == sum(p.numel() for p in model.parameters()),
          f"params {cb.report.model.params_total}")
    check(cb.report.to_dict()["workload"]["batch"] == 2, "batch")
    print("Trainer run: estimated", cb.report.peak_bytes, "bytes; params", cb.report.model.params_total)

    check("transformers" in sys.modules, "sanity")
    print("hf_real: ok")


if __name__ == "__main__":
    main()
