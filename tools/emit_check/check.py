"""Loads every file memwall's emitters wrote with the engine's own parser.

Usage (see run.sh): python check.py SEEDS_DIR --engines hf|vllm --out results.json

SEEDS_DIR is what `cargo run -p memwall-cli --example emit_seeds -- SEEDS_DIR` writes:
SEEDS_DIR/<seed>/<kind>/<files> and SEEDS_DIR/manifest.json.

Launch scripts are run with fake `torchrun`, `deepspeed`, `python` and `vllm` executables
first on PATH that print their argv, so bash expands the lines exactly as it would at launch;
the argv is then parsed by the real launcher's and engine's parsers. Each check records
accepted/refused with the engine's message. Nothing here needs a GPU or the network.
"""
import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from unittest import mock
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE_TOOLS = ("torchrun", "deepspeed", "python", "vllm", "accelerate")


def run_script(script: Path) -> dict:
    """Runs a launch script with argv-printing stand-ins; returns {tool, argv}."""
    with tempfile.TemporaryDirectory() as bindir:
        out = Path(bindir) / "argv.json"
        for tool in FAKE_TOOLS:
            p = Path(bindir) / tool
            p.write_text(
                "#!/usr/bin/env python3\nimport json, sys\n"
                f"json.dump({{'tool': {tool!r}, 'argv': sys.argv[1:]}}, open({str(out)!r}, 'w'))\n"
            )
            p.chmod(0o755)
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
        subprocess.run(["bash", str(script)], check=True, env=env, cwd=script.parent)
        return json.loads(out.read_text())


def catalogue_config(repo_id: str) -> dict:
    path = REPO / "data" / "models" / f"{repo_id}.json"
    return json.loads(path.read_text())


@contextlib.contextmanager
def fake_world(world_size: int):
    """A fake torch.distributed process group of `world_size` ranks (this process is rank 0)."""
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(min(world_size, 8)),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        tdist.destroy_process_group()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- engines -------------------------------------------------------------------------------

def check_ds_config(path: Path, seed: dict) -> str:
    import deepspeed.runtime.config as dsconfig
    from deepspeed.runtime.config import DeepSpeedConfig

    # Stand-in (no GPU here): DeepSpeedConfig asks deepspeed.comm for the rank and world size;
    # deepspeed.comm.init_distributed would JIT-build its shared-memory op, so answer directly.
    world = seed["gpus"]
    with mock.patch.object(dsconfig.dist, "get_rank", lambda *a, **k: 0), \
            mock.patch.object(dsconfig.dist, "get_world_size", lambda *a, **k: world):
        cfg = DeepSpeedConfig(str(path))
        z = cfg.zero_config
        msg = (f"DeepSpeedConfig: world {cfg.world_size}, train_batch_size {cfg.train_batch_size}, "
               f"zero stage {int(z.stage)}, reduce_bucket_size {z.reduce_bucket_size}, "
               f"overlap_comm {z.overlap_comm}, bf16 {cfg.bfloat16_config.enabled}")
        if int(z.stage) == 3:
            msg += (f", prefetch {z.prefetch_bucket_size}, persistence {z.param_persistence_threshold}, "
                    f"sub_group {z.sub_group_size}")
        if z.offload_optimizer is not None:
            msg += f", offload_optimizer {z.offload_optimizer.device} pin {z.offload_optimizer.pin_memory}"
        return msg


def check_deepspeed_launch(path: Path, seed: dict) -> str:
    from deepspeed.launcher.runner import parse_args

    run = run_script(path)
    assert run["tool"] == "deepspeed", run
    a = parse_args(run["argv"])
    return f"deepspeed launcher: num_nodes {a.num_nodes}, num_gpus {a.num_gpus}, script {a.user_script} {a.user_args}"


def check_torchrun(path: Path, seed: dict, expect_tool="torchrun") -> tuple[str, object]:
    from torch.distributed.run import parse_args

    run = run_script(path)
    if run["tool"] == "python":
        return f"python {run['argv']} (one GPU)", None
    assert run["tool"] == expect_tool, run
    a = parse_args(run["argv"])
    return (f"torchrun: nnodes {a.nnodes}, nproc_per_node {a.nproc_per_node}, "
            f"standalone {a.standalone}, script {a.training_script}"), a


def check_accelerate(path: Path, seed: dict) -> str:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    cfg = load_config_from_file(str(path))
    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(path), "train.py"])
    os.chdir(path.parent)
    with contextlib.redirect_stderr(io.StringIO()):
        args, defaults, mp_from_config_flag = _validate_launch_command(args)
    msg = f"config {type(cfg).__name__}: distributed_type {cfg.distributed_type}, num_processes {cfg.num_processes}, mixed_precision {cfg.mixed_precision}"
    if cfg.distributed_type.value == "FSDP":
        _, env = prepare_multi_gpu_env(args), None
        env = prepare_multi_gpu_env(args)
        old = dict(os.environ)
        os.environ.update(env)
        try:
            plugin = FullyShardedDataParallelPlugin()
            msg += (f"; FullyShardedDataParallelPlugin(env): fsdp_version {plugin.fsdp_version}, "
                    f"reshard_after_forward {plugin.reshard_after_forward}, cpu_offload {type(plugin.cpu_offload).__name__}, "
                    f"wrap {plugin.transformer_cls_names_to_wrap}, activation_checkpointing {plugin.activation_checkpointing}")
        finally:
            os.environ.clear()
            os.environ.update(old)
    elif cfg.distributed_type.value == "DEEPSPEED":
        # as accelerate.commands.launch.launch_command does before deepspeed_launcher
        fields = list(defaults.deepspeed_config.keys()) if defaults else []
        if mp_from_config_flag:
            fields.append("mixed_precision")
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        cmd, env = prepare_deepspeed_cmd_env(args)
        msg += f"; deepspeed env ACCELERATE_DEEPSPEED_CONFIG_FILE={env.get('ACCELERATE_DEEPSPEED_CONFIG_FILE')}, ACCELERATE_MIXED_PRECISION={env.get('ACCELERATE_MIXED_PRECISION')}"
        from accelerate.utils import DeepSpeedPlugin
        old = dict(os.environ)
        os.environ.update(env)
        try:
            plugin = DeepSpeedPlugin()
            plugin.set_mixed_precision(env.get("ACCELERATE_MIXED_PRECISION", "no"))
            msg += f"; DeepSpeedPlugin: zero_stage {plugin.zero_stage}, bf16 {plugin.deepspeed_config.get('bf16')}"
        finally:
            os.environ.clear()
            os.environ.update(old)
    return msg


def check_trainer(d: Path, seed: dict, repo: str) -> list[tuple[str, str]]:
    """training_args.json, model_kwargs.json, lora/bnb configs (each a separate result)."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, TrainingArguments

    results = []
    os.chdir(d)
    targs = json.loads((d / "training_args.json").read_text())
    gpus = seed["gpus"]
    # the model first: once TrainingArguments(deepspeed=ZeRO-3) exists, from_config runs under
    # deepspeed.zero.Init
    kwargs = json.loads((d / "model_kwargs.json").read_text())
    config = AutoConfig.for_model(**catalogue_config(repo))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    msg = (f"AutoModelForCausalLM.from_config(meta, **model_kwargs): {type(model).__name__}, dtype {model.dtype}, "
           f"attn {model.config._attn_implementation}, _no_split_modules {model._no_split_modules}")
    if "fsdp_config" in targs:
        wrap = targs["fsdp_config"].get("transformer_layer_cls_to_wrap", [])
        assert set(wrap) <= set(model._no_split_modules), (wrap, model._no_split_modules)
        msg += f"; wrap class {wrap} is the model's decoder layer"
    results.append(("model_kwargs.json", msg))
    # Stand-ins (no GPU here): TrainingArguments refuses bf16 unless a bf16-capable GPU answers;
    # DeepSpeedConfig (built for `deepspeed`) asks deepspeed.comm for the world size: as in
    # check_ds_config.
    with fake_world(gpus) if gpus > 1 else contextlib.nullcontext(), \
            mock.patch("transformers.training_args.is_torch_bf16_gpu_available", lambda: True), \
            mock.patch("deepspeed.comm.get_rank", lambda *a, **k: 0), \
            mock.patch("deepspeed.comm.get_world_size", lambda *a, **k: gpus):
        ta = TrainingArguments(output_dir=tempfile.mkdtemp(), **targs)
        msg = (f"TrainingArguments: per_device {ta.per_device_train_batch_size}, accum {ta.gradient_accumulation_steps}, "
               f"bf16 {ta.bf16}, optim {ta.optim.value if hasattr(ta.optim, 'value') else ta.optim}, "
               f"activation_checkpointing {ta.activation_checkpointing}, world_size {ta.world_size}")
        if ta.fsdp_config and targs.get("fsdp"):
            msg += f", fsdp {ta.fsdp}, fsdp_config {ta.fsdp_config}"
        if ta.deepspeed:
            msg += f", deepspeed {ta.deepspeed} (HfTrainerDeepSpeedConfig filled and matched)"
        results.insert(0, ("training_args.json", msg))
    if (d / "lora_config.json").exists():
        from peft import LoraConfig, get_peft_model

        lc = LoraConfig(**json.loads((d / "lora_config.json").read_text()))
        pm = get_peft_model(model, lc)
        trainable = sum(p.numel() for p in pm.parameters() if p.requires_grad)
        results.append(("lora_config.json", f"peft.LoraConfig r {lc.r}, targets {sorted(lc.target_modules)}; get_peft_model on meta: {trainable} trainable parameters"))
    if (d / "bnb_config.json").exists():
        from transformers import BitsAndBytesConfig

        bc = BitsAndBytesConfig(**json.loads((d / "bnb_config.json").read_text()))
        results.append(("bnb_config.json", f"BitsAndBytesConfig: 4bit {bc.load_in_4bit}, {bc.bnb_4bit_quant_type}, double_quant {bc.bnb_4bit_use_double_quant}, compute {bc.bnb_4bit_compute_dtype}"))
    return results


def script_exports(path: Path) -> dict:
    """The `export NAME=value` lines of a launch script."""
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            k, v = line[len("export "):].split("=", 1)
            out[k] = v
    return out


def bash_array(path: Path, name: str) -> list[str]:
    """The elements of a bash array assignment in the script, as bash expands them."""
    out = subprocess.run(
        ["bash", "-c", f'eval "$(sed -n "/^{name}=(/,/^)/p" "$1")"; printf "%s\\0" "${{{name}[@]}}"', "_", str(path)],
        check=True, capture_output=True, text=True,
    ).stdout
    return [x for x in out.split("\0") if x]


def check_megatron(path: Path, seed: dict) -> str:
    msg, targs = check_torchrun(path, seed)
    args = list(targs.training_script_args)
    # what the user adds (data, learning rate, iterations), not memwall's business
    user = ["--mock-data", "--lr", "1e-4", "--train-iters", "1"]
    from megatron.training.arguments import parse_args, validate_args

    world = targs.nproc_per_node and int(targs.nproc_per_node) * int(str(targs.nnodes).split(":")[-1])
    old_argv = sys.argv
    os.environ.update({"WORLD_SIZE": str(world), "RANK": "0", "LOCAL_RANK": "0"})
    os.environ.update(script_exports(path))
    sys.argv = ["pretrain_gpt.py"] + args + user
    # Stand-in (no GPU here): validate_args asks CUDA for the device's compute capability; the
    # seed is planned for H100 (sm_90).
    import megatron.training.arguments as margs
    try:
        with contextlib.redirect_stdout(io.StringIO()), mock.patch.object(margs, "get_device_arch_version", lambda: 9):
            a = parse_args()
            validate_args(a, {})
    finally:
        sys.argv = old_argv
    return (msg + f"; megatron parse_args+validate_args (world {world}, plus {' '.join(user)}): tp {a.tensor_model_parallel_size}, "
            f"sp {a.sequence_parallel}, pp {a.pipeline_model_parallel_size}, vpp {a.virtual_pipeline_model_parallel_size}, "
            f"cp {a.context_parallel_size}, dp {a.data_parallel_size}, micro {a.micro_batch_size}, global {a.global_batch_size}, "
            f"recompute {a.recompute_granularity}/{a.recompute_method}/{a.recompute_num_layers}, distributed_optimizer {a.use_distributed_optimizer}, "
            f"bf16 {a.bf16}, attention_backend {a.attention_backend}, padded vocab from tokenizer")


def check_torchtitan(path: Path, seed: dict) -> str:
    msg, targs = check_torchrun(path, seed)
    assert targs.module and targs.training_script == "torchtitan.train", targs
    from torchtitan.config.manager import ConfigManager

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        c = ConfigManager().parse_args(list(targs.training_script_args))
    t, p = c.training, c.parallelism
    m = c.model_spec.model
    return (msg + f"; ConfigManager.parse_args: model {len(m.layers)} layers × dim {m.dim}, local_batch {t.local_batch_size}, global_batch {t.global_batch_size}, seq {t.seq_len}, "
            f"dtype {t.dtype}, mp param {t.mixed_precision_param}/reduce {t.mixed_precision_reduce}, cpu_offload {t.enable_cpu_offload}, "
            f"dp_replicate {p.data_parallel_replicate_degree}, dp_shard {p.data_parallel_shard_degree}, tp {p.tensor_parallel_degree}, "
            f"sp {p.enable_sequence_parallel}, pp {p.pipeline_parallel_degree}"
            + (f" ({p.pipeline_parallel_schedule}, microbatch {p.pipeline_parallel_microbatch_size})" if p.pipeline_parallel_degree > 1 else "")
            + f", cp {p.context_parallel_degree}, ep {p.expert_parallel_degree}, "
            f"async_tp {c.compile.enable_async_tensor_parallel}, disable_cuda_graphs {t.disable_cuda_graphs}, "
            f"reshard {p.fsdp_reshard_after_forward}, AC {type(c.activation_checkpoint).__qualname__}, optimizer impl {c.optimizer.implementation}")


def check_vllm(d: Path, seed: dict) -> list[tuple[str, str]]:
    """vLLM's serve parser needs a resolved CUDA platform (libcuda) to build, which this machine
    lacks; the lightest faithful check is EngineArgs itself: every flag must name an EngineArgs
    field, and EngineArgs(**fields) must construct (its __post_init__ validates values)."""
    import dataclasses
    import yaml
    from vllm.engine.arg_utils import EngineArgs

    results = []
    run = run_script(d / "vllm_serve.sh")
    assert run["tool"] == "vllm" and run["argv"][0] == "serve", run
    argv = run["argv"][2:]
    names = {f.name: f for f in dataclasses.fields(EngineArgs)}
    kwargs, i = {"model": run["argv"][1]}, 0
    while i < len(argv):
        flag = argv[i][2:].replace("-", "_")
        assert flag in names, f"--{argv[i][2:]} is not an EngineArgs field"
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            kwargs[flag] = argv[i + 1]
            i += 2
        else:
            kwargs[flag] = True
            i += 1
    typed = {}
    for k, v in kwargs.items():
        default = names[k].default
        if isinstance(v, str) and isinstance(default, bool):
            v = v.lower() == "true"
        elif isinstance(v, str) and isinstance(default, int) and not isinstance(default, bool):
            v = int(v)
        elif isinstance(v, str) and isinstance(default, float):
            v = float(v)
        elif isinstance(v, str) and k in ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "block_size", "kv_cache_memory_bytes"):
            v = int(v)
        typed[k] = v
    e = EngineArgs(**typed)
    results.append(("vllm_serve.sh", "EngineArgs(**flags): " + ", ".join(f"{k}={getattr(e, k)!r}" for k in typed)))
    cfg = yaml.safe_load((d / "vllm_config.yaml").read_text())
    ykw = {k.replace("-", "_"): v for k, v in cfg.items()}
    e2 = EngineArgs(model=run["argv"][1], **ykw)
    assert all(getattr(e2, k) == getattr(e, k) for k in typed), "YAML and flags differ"
    results.append(("vllm_config.yaml", "yaml.safe_load → EngineArgs(**config): same values as the flags"))
    return results


def versions(engines: str) -> dict:
    from importlib.metadata import version

    names = ["torch", "transformers", "accelerate", "peft", "deepspeed", "megatron-core", "torchtitan", "bitsandbytes"] \
        if engines == "hf" else ["vllm", "torch", "transformers"]
    out = {}
    for n in names:
        try:
            out[n] = version(n)
        except Exception as e:  # noqa: BLE001
            out[n] = f"not installed ({e})"
    out["python"] = sys.version.split()[0]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("seeds", type=Path)
    ap.add_argument("--engines", choices=["hf", "vllm"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    seeds_dir = a.seeds.resolve()
    manifest = json.loads((seeds_dir / "manifest.json").read_text())
    results = []
    cwd = os.getcwd()

    def record(seed, kind, file, fn):
        # each check runs in a forked child: engines set process-wide state (environment
        # variables, process groups) that must not leak into the next check
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            rows = []
            try:
                out = fn()
                items = out if isinstance(out, list) else [(file, out)]
                for f, msg in items:
                    rows.append({"seed": seed, "kind": kind, "file": f, "accepted": True, "message": msg})
            except BaseException as e:  # noqa: BLE001  (argparse exits with SystemExit)
                tb = traceback.format_exception_only(type(e), e)[-1].strip()
                rows.append({"seed": seed, "kind": kind, "file": file, "accepted": False, "message": tb[:800]})
            with os.fdopen(w, "w") as f:
                json.dump(rows, f)
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            data = f.read()
        os.waitpid(pid, 0)
        os.chdir(cwd)
        results.extend(json.loads(data) if data else [{"seed": seed, "kind": kind, "file": file, "accepted": False, "message": "checker crashed"}])

    for seed_id, seed in manifest.items():
        for kind, files in seed["kinds"].items():
            d = seeds_dir / seed_id / kind
            if (kind == "vllm") != (a.engines == "vllm"):
                continue
            repo = json.loads((seeds_dir / "repos.json").read_text())[seed_id] if (seeds_dir / "repos.json").exists() else None
            if kind == "deepspeed":
                record(seed_id, kind, "ds_config.json", lambda: check_ds_config(d / "ds_config.json", seed))
                record(seed_id, kind, "launch_deepspeed.sh", lambda: check_deepspeed_launch(d / "launch_deepspeed.sh", seed))
            elif kind == "accelerate":
                record(seed_id, kind, "accelerate_config.yaml", lambda: check_accelerate(d / "accelerate_config.yaml", seed))
                if "ds_config.json" in files:
                    record(seed_id, kind, "ds_config.json", lambda: check_ds_config(d / "ds_config.json", seed))
            elif kind == "trainer":
                record(seed_id, kind, "training_args.json", lambda: check_trainer(d, seed, seed["repo"]))
                record(seed_id, kind, "launch_trainer.sh", lambda: check_torchrun(d / "launch_trainer.sh", seed)[0])
            elif kind == "torchrun":
                record(seed_id, kind, "launch_torchrun.sh", lambda: check_torchrun(d / "launch_torchrun.sh", seed)[0])
            elif kind == "megatron":
                record(seed_id, kind, "launch_megatron.sh", lambda: check_megatron(d / "launch_megatron.sh", seed))
            elif kind == "torchtitan":
                record(seed_id, kind, "launch_torchtitan.sh", lambda: check_torchtitan(d / "launch_torchtitan.sh", seed))
            elif kind == "vllm":
                record(seed_id, kind, "vllm_serve.sh", lambda: check_vllm(d, seed))
    a.out.write_text(json.dumps({"engines": a.engines, "versions": versions(a.engines), "results": results}, indent=2) + "\n")
    bad = [r for r in results if not r["accepted"]]
    for r in results:
        print(("ok     " if r["accepted"] else "REFUSED"), r["seed"], r["kind"], r["file"], "—", r["message"][:300])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
