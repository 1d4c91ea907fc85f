"""torchtitan 0.3.0's llama3 train step measured on CPU fake tensors with FSDPMemTracker, the way
torchtitan's former scripts/estimate/estimation.py (removed in torchtitan commit 76d5c72e2, the
config-system refactor) did on CUDA fake tensors.  See tools/truth/titan/README.md.

    PY=/work/venvs/titan/bin/python
    $PY tools/truth/titan/measure_titan.py                 # every case -> tests/truth/titan.jsonl
    $PY tools/truth/titan/measure_titan.py --one ARGS...   # one configuration, printed
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def measure_one(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser()
    # torchtitan 0.3.0's model (its `model_registry` and parallelize function): llama3 (every
    # case without this flag), qwen3 (dense and MoE flavours) or deepseek_v3
    ap.add_argument("--model", choices=["llama3", "qwen3", "deepseek_v3"], default="llama3")
    ap.add_argument("--flavor", default="8B")
    # untie a tied flavour (`enable_weight_tying = False`: embeddings and head separate, as
    # torchtitan's untied flavours); the qwen3 crosschecks use the tied "debugmodel" so
    ap.add_argument("--untie", action="store_true")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--world", type=int, default=8)
    # tensor (+ sequence) parallelism: a 2-D mesh (dp_shard = world / tp, tp), torchtitan's
    # `parallelism.tensor_parallel_degree` with its defaults `enable_sequence_parallel = True`,
    # `spmd_backend = "spmd_types"` (loss parallel: `_LossParallelCrossEntropy` whenever the tp
    # mesh is larger than 1, components/loss.py) and `compile.enable_async_tensor_parallel = False`
    ap.add_argument("--tp", type=int, default=1)
    # HSDP: `parallelism.data_parallel_replicate_degree`; the mesh is dp_replicate × dp_shard
    # (× tp), dp_shard = world / (dp_replicate · tp · pp), and `apply_fsdp_to_decoder` gets the
    # 2-D ["dp_replicate", "fsdp"] mesh (models/llama3/parallelize.py)
    ap.add_argument("--dp-replicate", type=int, default=1)
    ap.add_argument("--no-sp", action="store_true")
    # expert parallelism (`parallelism.expert_parallel_degree`): the experts sharded over an ep
    # mesh carved out of dp_shard, FSDP2 over `efsdp = dp_shard / ep` for them; the token
    # dispatch is `AllToAllTokenDispatcher` (models/common/token_dispatcher.py). Its split
    # sizes come from a token-count all-to-all read back with `.tolist()`, which fake tensors
    # (and the fake process group, whose collectives write nothing) cannot give: the harness
    # replaces `_sync_token_count_exchange` with balanced routing (every rank sends T·K/ep rows
    # to every rank, T·K/E per expert), see README "Expert parallelism"
    ap.add_argument("--ep", type=int, default=1)
    # probe: one forward under saved_tensors_hooks, the bytes autograd saves per top-level
    # module (deduplicated by storage), printed instead of a measurement
    ap.add_argument("--saved", action="store_true")
    # probe: the steady step's allocation log (storages >= this many bytes, FSDP hook events),
    # printed to stderr (measure_dist.py's --debug format, abridged)
    ap.add_argument("--debug", type=int, default=None)
    # cross-check (fake must equal real): run on REAL CPU tensors (uninitialised storage, the
    # fake process group's collectives do not write) instead of FakeTensorMode; with
    # --attn-stub, FlexAttention's kernel is replaced on both sides by an autograd function that
    # allocates what the fused kernel's fake rule does (out, logsumexp and max forward, the
    # three gradients backward), because flex_attention's eager CPU path materialises the dense
    # scores (its math fallback), which the fused kernel never does
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--attn-stub", action="store_true")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    # every-k:K wraps every K-th block (counted from 1) in torchtitan's FullAC wrapper: the
    # layer-level selective AC of earlier torchtitan (`selective_ac_option = "K"`), which 0.3.0
    # no longer offers as an option (its SelectiveAC is op-level only)
    ap.add_argument("--ac", default="none")
    ap.add_argument("--loss", choices=["chunked", "ce"], default="chunked")
    ap.add_argument("--attn", default="flex")
    # `optimizer.implementation`: torchtitan 0.3.0's default is "fused" (components/optimizer/
    # optimizer.py; every case without this flag ran it)
    ap.add_argument("--optim", choices=["fused", "foreach", "for-loop"], default="fused")
    ap.add_argument("--reshard", choices=["default", "always", "never"], default="default")
    # pipeline parallelism (`parallelism.pipeline_parallel_degree`, `_schedule`,
    # `_microbatch_size`, `_layers_per_stage`): the mesh is pp × dp_shard (× tp); the measured
    # rank is the first of pp rank --pp-rank (pp is the outermost mesh dimension,
    # distributed/parallel_dims.py), and only its stage(s) run; the fake process group's
    # send/recv are no-ops (the stage still allocates its receive buffers)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--pp-rank", type=int, default=0)
    ap.add_argument("--schedule", default="1F1B")
    ap.add_argument("--mbs", type=int, default=1)
    ap.add_argument("--layers-per-stage", type=int, default=None)
    # probe (PP): the tracked storages of at least this many bytes still alive at the end of
    # each step, with the step that allocated them and the Python frames (torch's pipelining,
    # torchtitan) that did, printed to stderr
    ap.add_argument("--live", type=int, default=None)
    # torchtitan 0.3.0's `Float8LinearConverter` (components/quantization/float8.py, needs
    # torchao: run with /work/venvs/titan-fp8): `recipe_name` rowwise | rowwise_with_gw_hp (the
    # only two it accepts), `filter_fqns` from --float8-filter (comma-separated; default none:
    # every Linear with both dims divisible by 16, the LM head included, as the converter does)
    ap.add_argument("--float8", choices=["rowwise", "rowwise_with_gw_hp"], default=None)
    ap.add_argument("--float8-filter", default="")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from measure_dist import fsdp_tracker_class, patch_dtensor_propagation_fake_mode

    patch_dtensor_propagation_fake_mode()

    # torchtitan picks `_get_available_device_type() or "cuda"`: this CPU-only machine would get
    # "cuda" meshes; the fake-tensor harness runs on the CPU device (as tools/truth/measure_dist.py)
    import torchtitan.tools.utils as tt_utils

    tt_utils.device_type, tt_utils.device_module = "cpu", torch.cpu
    import torchtitan.distributed.parallel_dims as tt_pd

    tt_pd.device_type = "cpu"
    # torchtitan compiles flex_attention and create_block_mask (models/common/attention.py);
    # Inductor's CPU code cannot run on fake tensors (it dereferences their data: segfault).
    # Eager: the flex_attention HOP's fake implementation allocates what the fused kernel
    # returns (out, logsumexp) and its backward the gradients; create_block_mask eager builds a
    # dense [B, 1, S, S] boolean mask first (transient, before the first layer).
    import torchtitan.models.common.attention as tt_attn
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    tt_attn.FlexAttention._compiled_flex_attn = staticmethod(flex_attention)
    if args.attn_stub:
        tt_attn.FlexAttention._compiled_flex_attn = staticmethod(stub_flex_attention)
    # flex_attention refuses backward on a CPU device (a Python guard: the CPU backend has no
    # backward kernel); on fake tensors only the HOP's fake implementation runs
    import torch.nn.attention.flex_attention as fa

    fa._validate_device = lambda *a, **k: None
    # eager flex_attention wraps the HOP in torch.compile(backend="eager", fullgraph=True),
    # which dynamo refuses under a non-infra dispatch mode (the tracker): call the HOP directly
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    tt_attn._compiled_create_block_mask = create_block_mask
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common.config_utils import decoder_vocab_size
    import importlib

    from torchtitan.models.llama3.config_registry import llama3_8b

    model_registry = importlib.import_module(f"torchtitan.models.{args.model}").model_registry
    if args.model == "deepseek_v3":
        register_dsv3_debug671()

    if args.dp_replicate > 1:
        # HSDP: `fully_shard` concatenates the replicate and shard meshes itself
        # (`_fsdp_init.py` `_get_mesh_info_from_named_dims` → `DeviceMesh._concatenate`), inside
        # the FakeTensorMode the model is parallelised under; the rank map is a real int tensor,
        # so the mesh is built outside the fake mode (as the other meshes are: memory-neutral)
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.distributed.device_mesh import DeviceMesh

        _concat = DeviceMesh._concatenate

        def _concatenate_real(*a, **k):
            with unset_fake_temporarily():
                return _concat(*a, **k)

        DeviceMesh._concatenate = staticmethod(_concatenate_real)
    W = args.world
    os.environ.setdefault("WORLD_SIZE", str(W))
    os.environ.setdefault("LOCAL_RANK", "0")
    if W % (args.pp * args.tp * args.dp_replicate):
        raise SystemExit(f"world {W} is not a multiple of pp {args.pp} x tp {args.tp} x dp_replicate {args.dp_replicate}")
    rank = args.pp_rank * (W // args.pp)
    dist.init_process_group("fake", rank=rank, world_size=W, store=FakeStore())

    # the job config of `llama3_8b()` (loss, optimizer, training defaults) with the chosen
    # model's spec in place of llama3's (the trainer reads `config.model_spec`)
    config = llama3_8b()
    converters = None
    if args.float8:
        # the converter refuses to swap unless the device is SM89+ (or `emulate`, which replaces
        # the recipe by torchao's tensorwise default and emulates the GEMMs); the fake CPU device
        # has no capability: the check is patched, the recipe kept, and the GEMMs are
        # `torch._scaled_mm` (its fake rule on fake tensors; it runs on CPU tensors in torch 2.15)
        import torchtitan.components.quantization.float8 as tt_fp8

        tt_fp8.has_cuda_capability = lambda *a, **k: True
        filt = [f for f in args.float8_filter.split(",") if f]
        converters = [tt_fp8.Float8LinearConverter.Config(recipe_name=args.float8, filter_fqns=filt)]
    spec = model_registry(args.flavor, attn_backend=args.attn, converters=converters)
    spec.model.layers = spec.model.layers[: args.layers]
    if args.untie:
        spec.model.enable_weight_tying = False
    config.model_spec = spec
    config.training.local_batch_size = args.batch
    config.training.seq_len = args.seq
    config.compile.enable = False
    config.optimizer.implementation = args.optim
    if W % args.tp:
        raise SystemExit(f"world {W} is not a multiple of tp {args.tp}")
    config.parallelism.data_parallel_shard_degree = W // (args.tp * args.pp * args.dp_replicate)
    config.parallelism.data_parallel_replicate_degree = args.dp_replicate
    config.parallelism.pipeline_parallel_degree = args.pp
    config.parallelism.pipeline_parallel_schedule = args.schedule
    config.parallelism.pipeline_parallel_microbatch_size = args.mbs
    config.parallelism.pipeline_parallel_layers_per_stage = args.layers_per_stage
    config.parallelism.tensor_parallel_degree = args.tp
    config.parallelism.expert_parallel_degree = args.ep
    if args.ep > 1:
        patch_balanced_ep_splits(torch)
        patch_tracker_param_groups()
    config.parallelism.enable_sequence_parallel = not args.no_sp
    config.parallelism.fsdp_reshard_after_forward = args.reshard
    if args.ac.startswith("every-k:"):
        every = int(args.ac.split(":")[1])
        # earlier torchtitan's layer-level SAC counts the blocks it is given with one
        # process-wide counter (`distributed/activation_checkpoint.py` `_apply_layer_sac`, the
        # module-global `_layer_sac_count`; pytorch/torchtitan 01db32e9): without PP the model's
        # blocks from 1; under PP each rank's own blocks, across its model parts in the order
        # they are built (stage `rank`, then `rank + pp` for looped schedules), from 1
        count = [0]

        def apply_every_k(self, model):
            layers = model.get_submodule("layers")
            for layer_id, block in list(layers.named_children()):
                count[0] += 1
                if count[0] % every == 0:
                    layers.register_module(layer_id, self._wrap_block(block, base_fqn=f"layers.{layer_id}"))

        FullAC.apply = apply_every_k
        config.activation_checkpoint = FullAC.Config()
    else:
        config.activation_checkpoint = {"none": None, "full": FullAC.Config(), "selective": SelectiveAC.Config()}[args.ac]
    ce = CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec))
    config.loss = ChunkedLossWrapper.Config(loss_fn=ce) if args.loss == "chunked" else ce

    parallel_dims = ParallelDims.from_config(config.parallelism, W)
    # Trainer.__init__ and _forward_backward_body (trainer.py): the SPMD backend
    # (`parallelism.spmd_backend`, default "spmd_types") is set globally, and the step runs in
    # `get_spmd_context`, which sets the current SPMD mesh: without it every module's
    # redistribution (SP reduce-scatter / all-gather) and the loss-parallel branch of
    # components/loss.py are skipped (`spmd_redistribute_per_axis` returns its input when the
    # mesh is None)
    import torchtitan.distributed.utils as tt_dist_utils
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types

    tt_dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
    train_context = tt_dist_utils.get_spmd_context(parallel_dims=parallel_dims)
    _ = parallel_dims.world_mesh  # outside FakeTensorMode, like estimation.py
    cpu = torch.device("cpu")
    model_config = spec.model
    model_config.update_from_config(config=config)
    t0 = time.time()
    import contextlib

    if args.pp > 1:
        # the split deep-copies the model (pipeline_parallel.py `_split_module`), which mixes
        # fake modes if it is built under FakeTensorMode: built, split and parallelised on the
        # meta device (as the Trainer does), materialised under FakeTensorMode
        with torch.device("meta"):
            model = model_config.build()
        fake = contextlib.nullcontext() if args.real else FakeTensorMode(allow_non_fake_inputs=True)
        peak, first, snap, mt, n_gates = measure_pp(args, config, spec, model, model_config, parallel_dims, train_context, fake)
        return result(args, W, snap, first, mt, t0, n_gates)
    with contextlib.nullcontext() if args.real else FakeTensorMode():
        with torch.device("meta"):
            model = model_config.build()
        model = spec.parallelize_fn(
            model,
            parallel_dims=parallel_dims,
            training=config.training,
            parallelism=config.parallelism,
            compile_config=config.compile,
            ac_config=config.activation_checkpoint,
            dump_folder="/tmp/titan_dump",
        )
        model.to_empty(device="cpu")
        if getattr(model, "enable_weight_tying", False):
            # Trainer.__init__ (trainer.py, non-PP branch): `to_empty`, then `init_weights` under
            # no_grad, whose `Decoder.init_states` (models/common/decoder.py) re-points
            # `tok_embeddings.weight` at `lm_head.weight`; the tie made in `Decoder.__init__`
            # does not survive `Module.parallelize` (protocols/module.py
            # `_spmd_distribute_state` registers a new `nn.Parameter` per module)
            _tie_probe(model, "before init_weights")
            with torch.no_grad():
                model.init_weights(buffer_device=None)
            _tie_probe(model, "after init_weights")
        model.train()
        # MoE routers compute the gate under `torch.autocast(device_type, dtype=torch.float32)`
        # (models/common/moe.py TokenChoiceTopKRouter.forward): CUDA autocast casts the linear's
        # input and weight to fp32 (fp32 scores); CPU autocast refuses float32 (a warning) and
        # would run the gate in bf16. Emulate CUDA: the gate's linear on explicit fp32 casts
        # (what autocast's cached_cast does; the casts' backward casts the gradients back)
        import torch.nn.functional as F

        n_gates = 0
        for name, mod in model.named_modules():
            if name.endswith("router.gate"):
                def gate_fp32(x, _m=mod):
                    return F.linear(x.float(), _m.weight.float(), None if _m.bias is None else _m.bias.float())

                mod.forward = gate_fp32
                n_gates += 1
        loss_fn = config.loss.build(compile_config=config.compile)
        if isinstance(loss_fn, ChunkedLossWrapper):
            loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True
        optimizers = config.optimizer.build(model_parts=[model])
        # Trainer.__init__ (trainer.py): the model's post-optimizer hook (qwen3 / deepseek_v3:
        # `register_moe_load_balancing_hook`, the expert-bias update before each step)
        if spec.post_optimizer_build_fn is not None:
            spec.post_optimizer_build_fn(optimizers, [model], parallel_dims)
        vocab = model_config.vocab_size
        inputs = torch.randint(0, vocab, (args.batch, args.seq))
        labels = torch.randint(0, vocab, (args.batch, args.seq))
        tracker_cls = fsdp_tracker_class()
        # the flex_attention HOP (and its backward) pass through the tracker's
        # __torch_dispatch__, which runs them (FakeTensorMode's rule) and tracks their outputs
        tracker_cls.supports_higher_order_operators = True
        mt = tracker_cls(model, optimizers.optimizers[0], log_min_bytes=args.debug)
        mt.track_inputs((inputs, labels))
        gvt = torch.tensor(args.batch * args.seq)
        # the dataloader's per-token positions (one document per row); the Trainer builds the
        # flex/varlen masks from them (Trainer.post_dataloading_process)
        positions = torch.arange(args.seq).repeat(args.batch, 1)
        extra = {"positions": positions}
        if args.attn in ("flex", "flex_flash", "varlen"):
            extra["attention_masks"] = model.get_attention_masks(positions=positions)
        if config.parallelism.spmd_backend == "spmd_types":  # Trainer.post_dataloading_process
            inputs, labels, extra = annotate_input_spmd_types(parallel_dims, inputs, labels, extra)
        if args.saved:
            with train_context():
                return saved_per_module(model, inputs, extra)
        with mt:
            for it in range(2):
                if it == 1:
                    first = mt._peak_mem.get(cpu, 0)
                    mt.reset_mod_stats()
                    mt._peak_mem = {d: s["Total"] for d, s in mt._curr_mem_snap.items()}
                    from copy import deepcopy

                    mt._peak_mem_snap = deepcopy(mt._curr_mem_snap)
                    mt.log.clear()
                with train_context():
                    pred = model(inputs, **extra)
                    loss, _ = loss_fn(pred, labels, gvt, positions=positions)
                    del pred
                    loss.backward()
                    del loss
                if args.ep > 1:
                    # Trainer.train_step (trainer.py): torchtitan's own clip_grad_norm_, whose
                    # EP branch (`_clip_grad_norm_with_ep`) takes the expert and non-expert
                    # norms on their own meshes (torch's refuses to stack DTensors of two meshes)
                    tt_dist_utils.clip_grad_norm_(list(model.parameters()), 1.0, foreach=True, ep_enabled=True)
                else:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                optimizers.step()
                optimizers.zero_grad()
                gc.collect(1)
        snap = mt.get_tracker_snapshot("peak")[cpu]
        if getattr(model, "enable_weight_tying", False):
            _tie_probe(model, "after two steps")
    return result(args, W, snap, first, mt, t0, n_gates)


def patch_balanced_ep_splits(torch):
    """Balanced routing for `AllToAllTokenDispatcher` (torchtitan 0.3.0
    models/common/token_dispatcher.py): `_sync_token_count_exchange` waits on the token-count
    all-to-all and reads the split sizes back to the host (`.tolist()`), data fake tensors do not
    have and the fake process group does not write. The patch keeps the wait and returns what
    perfectly balanced routing exchanges: each of the ep ranks sends N / ep of its N = T·K routed
    rows to every rank (N / E per expert), so each rank receives N rows in all. The counts are
    a real (fake under FakeTensorMode) `(E,)` int64 tensor of N / E, as the exchange returns."""
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    def sync(self, num_local_tokens_per_expert_E, num_global_tokens_per_local_expert_EP_e, ep_size):
        got = torch.ops._c10d_functional.wait_tensor(num_global_tokens_per_local_expert_EP_e)
        n_experts = num_local_tokens_per_expert_E.shape[0]
        n = SPLIT_ROWS[0]
        if n % n_experts:
            raise SystemExit(f"balanced routing needs T*K ({n}) divisible by the experts ({n_experts})")
        # probe (never a fixture): TITAN_EP_RECV_SKEW=S makes this rank receive S times the rows
        # it sends (its experts picked S times as often), to read how the peak grows with
        # uneven routing; the fixtures run S = 1
        skew = float(os.environ.get("TITAN_EP_RECV_SKEW", "1"))
        recv = int(n * skew) // n_experts
        counts = torch.full_like(got.reshape(-1), recv)
        return counts, [n // ep_size] * ep_size, [recv * n_experts // ep_size] * ep_size

    AllToAllTokenDispatcher._sync_token_count_exchange = sync
    orig = AllToAllTokenDispatcher._local_reorder

    def local_reorder(self, x_TD, topk_scores_TK, topk_expert_ids_TK):
        SPLIT_ROWS[0] = topk_expert_ids_TK.numel()
        return orig(self, x_TD, topk_scores_TK, topk_expert_ids_TK)

    AllToAllTokenDispatcher._local_reorder = local_reorder


SPLIT_ROWS = [0]


def patch_tracker_param_groups():
    """FSDPMemTracker (torch 2.15 distributed/_tools/fsdp2_mem_tracker.py) reads one
    `FSDPState._fsdp_param_group` per FSDP module; under EP `apply_fsdp_to_decoder` gives a MoE
    block two (`shard_placement_fn` returning a `ShardPlacementResult` per parameter: the experts
    on the `efsdp` mesh, the rest on dp_shard), and the property raises. The tracker only
    attributes categories and takes snapshots in these hooks (the peak is the dispatch mode's sum
    of live storages, which does not depend on them): where a state has several groups the
    property returns a view listing all their parameters (for category attribution), and each
    group's own `pre_backward` / `post_backward` is wrapped by the tracker (the view's
    attribute writes are dropped). Memory-neutral: nothing is allocated or kept."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    class Groups:
        def __init__(self, groups):
            object.__setattr__(self, "groups", groups)

        @property
        def fsdp_params(self):
            return [p for g in self.groups for p in g.fsdp_params]

        def pre_backward(self, *a, **k):
            raise AssertionError("not called: each group's own pre_backward runs")

        post_backward = pre_backward

        def __setattr__(self, name, value):
            pass

    one = FSDPState._fsdp_param_group

    def group(self):
        if len(self._fsdp_param_groups) > 1:
            return Groups(self._fsdp_param_groups)
        return one.fget(self)

    FSDPState._fsdp_param_group = property(group)
    orig = FSDPMemTracker._instrument_fsdp_module

    def instrument(self):
        orig(self)
        for module in self._root_mod.modules():
            if isinstance(module, FSDPModule):
                groups = module._get_fsdp_state()._fsdp_param_groups
                if len(groups) > 1:
                    for g in groups:
                        g.pre_backward = self._fsdp_param_group_pre_backward(module, g.pre_backward)
                        g.post_backward = self._fsdp_param_group_post_backward(module, g.post_backward)

    FSDPMemTracker._instrument_fsdp_module = instrument


def _tie_probe(model, when):
    if os.environ.get("TITAN_TIE_PROBE"):
        e, h = model.tok_embeddings.weight, model.lm_head.weight
        print(f"# tie {when}: same object {e is h}, embedding {type(e).__name__} "
              f"{tuple(e.shape)}, lm_head {tuple(h.shape)}, "
              f"params {len(list(model.parameters()))}", file=sys.stderr)
        from torch.distributed.fsdp._fully_shard._fully_shard import FSDPModule

        for m in (model.tok_embeddings, model.lm_head):
            st = m._get_fsdp_state() if isinstance(m, FSDPModule) else None
            grp = st._fsdp_param_group if st is not None else None
            if grp is not None:
                for fp in grp.fsdp_params:
                    mi = fp._module_info
                    print(f"#   unit param {type(mi.module).__name__}.{mi.param_name} "
                          f"shared {[type(x).__name__ for x in mi.shared_modules]} "
                          f"sharded {tuple(fp.sharded_param.shape)} is_lm_head "
                          f"{fp.sharded_param is model.lm_head.weight} is_emb "
                          f"{fp.sharded_param is model.tok_embeddings.weight}", file=sys.stderr)
                break


def result(args, W, snap, first, mt, t0, n_gates=0) -> dict:
    import torch

    if args.debug is not None:
        print(f"# peak after event: {mt.peak_event}", file=sys.stderr)
        for entry in mt.log:
            if entry[0] == "event":
                _, name, snp = entry
                cats = " ".join(f"{str(k).split('.')[-1]}={v}" for k, v in snp.items() if k != "Total" and v)
                print(f"== {name:<40} total={snp.get('Total', 0)}  {cats}", file=sys.stderr)
            else:
                kind, ref, delta, old, in_opt, is_bw = entry
                where = "opt" if in_opt else ("bw" if is_bw else "fw")
                print(f"   {kind[0]}{delta:>13} {ref}{' (was ' + old + ')' if old else ''} [{where}]", file=sys.stderr)
    import importlib.metadata as md
    import platform

    return {
        **({"model": args.model} if args.model != "llama3" else {}),
        "flavor": args.flavor, **({"untied": True} if args.untie else {}), "layers": args.layers, "world_size": W, "batch": args.batch,
        "seq": args.seq, "activation_checkpoint": args.ac, "loss": args.loss,
        **({"tp": args.tp, "sequence_parallel": not args.no_sp} if args.tp > 1 else {}),
        **({"ep": args.ep, "ep_routing": "balanced (harness patch)"} if args.ep > 1 else {}),
        **({"dp_replicate": args.dp_replicate} if args.dp_replicate > 1 else {}),
        "attention": args.attn + ("-stub" if args.attn_stub else ""),
        **({"tensors": "real"} if args.real else {}),
        **({"reshard_after_forward": args.reshard} if args.reshard != "default" else {}),
        **({"optimizer_implementation": args.optim} if args.optim != "fused" else {}),
        **({"float8": args.float8, **({"float8_filter_fqns": args.float8_filter} if args.float8_filter else {})}
           if args.float8 else {}),
        **({"router_gate": "fp32 (CUDA autocast emulated)"} if n_gates else {}),
        **({"pp": args.pp, "pp_rank": args.pp_rank, "schedule": args.schedule,
            "microbatch_size": args.mbs, "microbatches": args.batch // args.mbs,
            **({"layers_per_stage": args.layers_per_stage} if args.layers_per_stage else {})}
           if args.pp > 1 else {}),
        "measured": {
            "peak_bytes": int(snap["Total"]),
            "at_peak": {str(k).split(".")[-1].lower(): int(v) for k, v in snap.items() if k != "Total"},
            "first_step_peak_bytes": int(first),
        },
        "versions": {"torch": torch.__version__.split("+")[0], "torchtitan": md.version("torchtitan"),
                     **({"torchao": md.version("torchao")} if args.float8 else {}),
                     "python": platform.python_version()},
        "_seconds": round(time.time() - t0, 1),
    }


def measure_pp(args, config, spec, model, model_config, parallel_dims, train_context, fake):
    """One pp rank's step under torchtitan's pipeline schedule (`pipeline_llm`, as
    `Trainer.__init__` and `Trainer.pp_forward_backward_step` run it)."""
    import gc
    from copy import deepcopy

    import torch
    import torch.nn as nn
    from torch.distributed.pipelining import _utils as pp_utils
    from torch.distributed.pipelining import stage as pp_stage
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types

    from measure_dist import fsdp_tracker_class

    cpu = torch.device("cpu")
    mb = args.mbs
    S, D = args.seq, model_config.dim

    loss_fn = config.loss.build(compile_config=config.compile)
    pp_schedule, parts, has_first, has_last = pipeline_llm(
        model,
        parallel_dims=parallel_dims,
        training=config.training,
        parallelism=config.parallelism,
        compile_config=config.compile,
        ac_config=config.activation_checkpoint,
        dump_folder="/tmp/titan_dump",
        device=cpu,
        model_config=model_config,
        parallelize_fn=spec.parallelize_fn,
        loss_fn=loss_fn,
    )
    del model
    # torch.distributed.pipelining refuses runtime shape inference over a fake process group
    # ("Provide complete static metadata ... to the PipelineStage constructor"; the peers'
    # metadata would arrive by P2P): every stage is given the static metadata torchtitan's
    # stages exchange at runtime: token ids [mb, seq] into the first stage, one hidden state
    # [mb, seq, dim] in the compute dtype (bf16 under FSDP2's MixedPrecisionPolicy) across each
    # boundary, the logits [mb, seq, vocab] out of the last (plain tensors under spmd_types, so
    # the gradients' metadata follows from them)
    # (with TP + SP, the TP-local tensors: the block outputs are sequence-sharded, [mb, seq/tp,
    # dim], and the LM head's colwise output vocabulary-sharded, [mb, seq, vocab/tp]; what the
    # stages' runtime shape inference would exchange)
    dt = torch.bfloat16
    tp = args.tp
    S_hid = S // tp if (tp > 1 and not args.no_sp) else S
    with torch.device("meta"):
        tok = torch.empty(mb, S, dtype=torch.long)
        hid = torch.empty(mb, S_hid, D, dtype=dt, requires_grad=True)
        logits = torch.empty(mb, S, model_config.vocab_size // tp, dtype=dt, requires_grad=True)
    for st in pp_schedule._stages if hasattr(pp_schedule, "_stages") else [pp_schedule._stage]:
        st._user_meta = pp_utils._StageMeta(
            inputs=pp_utils.extract_tensor_metas((tok,) if st.is_first else (hid,)),
            outputs=pp_utils.extract_tensor_metas((logits,) if st.is_last else (hid,)),
        )
    fake.__enter__()
    for m in parts:
        m.to_empty(device="cpu")
        m.train()
    # MoE blocks: the router gate in fp32 as CUDA autocast runs it (see measure_one), and the
    # model's post-optimizer hook (`register_moe_load_balancing_hook`), as `Trainer.__init__`
    # runs both on the model parts
    import torch.nn.functional as F

    n_gates = 0
    for part in parts:
        for name, mod in part.named_modules():
            if name.endswith("router.gate"):
                def gate_fp32(x, _m=mod):
                    return F.linear(x.float(), _m.weight.float(), None if _m.bias is None else _m.bias.float())

                mod.forward = gate_fp32
                n_gates += 1
    optimizers = config.optimizer.build(model_parts=parts)
    if spec.post_optimizer_build_fn is not None:
        spec.post_optimizer_build_fn(optimizers, parts, parallel_dims)
    vocab = model_config.vocab_size
    n_mb = args.batch // mb
    inputs = torch.randint(0, vocab, (args.batch, S))
    labels = torch.randint(0, vocab, (args.batch, S))
    positions = torch.arange(S).repeat(mb, 1)
    tracker_cls = fsdp_tracker_class()
    tracker_cls.supports_higher_order_operators = True

    class PPTracker(tracker_cls):
        # every stage module is an FSDP root called once per microbatch: FSDPMemTracker's
        # per-module statistics refuse a root's second pre-forward ("multiple iterative
        # calls"); the totals and categories do not depend on them, so the root's statistics
        # are restarted at each microbatch
        def _fsdp_state_pre_forward(self, fsdp_mod, orig):
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            def f(*a, **k):
                if not self._mod_tracker.is_bw:
                    self.memory_tracking.pop(fsdp_mod, None)
                return inner(*a, **k)

            return f

    if args.live is not None:
        import traceback

        from torch.distributed._tools.mem_tracker import _UpdateType

        class LiveTracker(PPTracker):
            step = 0
            born: dict = {}

            def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
                super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
                if u_type == _UpdateType.ADD and winfo.mem_consumed >= args.live:
                    frames = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                              for f in traceback.extract_stack()[:-2]
                              if ("pipelining" in f.filename or "torchtitan" in f.filename
                                  or "loss" in f.filename)]
                    self.born[id(winfo)] = (self.step, " < ".join(reversed(frames[-6:])))

            at_peak: list = []

            def _update_peak_stats(self, peak_state):
                before = self._peak_mem_snap.get(cpu, {}).get("Total", 0) if self.step == 1 else None
                super()._update_peak_stats(peak_state)
                if before is not None and self._peak_mem_snap.get(cpu, {}).get("Total", 0) != before:
                    self.at_peak = self.rows()

            def rows(self):
                out = []
                for st, (winfo, _) in list(self._WINFO.items()):
                    if winfo.mem_consumed >= args.live:
                        b = self.born.get(id(winfo), ("?", ""))
                        out.append(f"{winfo.mem_consumed:>13} {winfo.reftype.value:<16} step {b[0]}: {b[1]}")
                return out

            def live(self):
                for r in self.rows():
                    print(f"#   live {r}", file=sys.stderr)
                if self.step == 1:
                    print(f"# at the steady step's peak ({self.peak_event}):", file=sys.stderr)
                    for r in self.at_peak:
                        print(f"#   peak {r}", file=sys.stderr)

        PPTracker = LiveTracker
    mt = PPTracker(parts[0], optimizers.optimizers[0], log_min_bytes=args.debug)
    mt._root_mod = nn.ModuleList(parts)  # every local stage instrumented (looped schedules)
    mt.track_inputs((inputs, labels))
    gvt = torch.tensor(args.batch * S)
    mbs = []
    for i in range(n_mb):
        x, y = inputs[i * mb:(i + 1) * mb], labels[i * mb:(i + 1) * mb]
        extra = {"positions": positions}
        if args.attn in ("flex", "flex_flash", "varlen"):
            extra["attention_masks"] = parts[0].get_attention_masks(positions=positions)
        if config.parallelism.spmd_backend == "spmd_types":
            x, y, extra = annotate_input_spmd_types(parallel_dims, x, y, extra)
        mbs.append((x, y, extra))
    first = 0
    with mt:
        for it in range(2):
            if it == 1:
                first = mt._peak_mem.get(cpu, 0)
                mt.reset_mod_stats()
                mt._peak_mem = {d: s["Total"] for d, s in mt._curr_mem_snap.items()}
                mt._peak_mem_snap = deepcopy(mt._curr_mem_snap)
                mt.log.clear()
            with train_context():
                losses = [] if has_last else None
                pp_schedule.step(
                    arg_mbs=[(x,) for x, _, _ in mbs] if has_first else None,
                    kwarg_mbs=[e for _, _, e in mbs],
                    target_mbs=[y for _, y, _ in mbs] if has_last else None,
                    losses=losses,
                    loss_kwargs={"global_valid_tokens": gvt},
                    return_outputs=False,
                )
                del losses
            torch.nn.utils.clip_grad_norm_([p for m in parts for p in m.parameters()], 1.0, foreach=True)
            optimizers.step()
            optimizers.zero_grad()
            gc.collect(1)
            if args.live is not None:
                print(f"# live at the end of step {it}:", file=sys.stderr)
                mt.live()
                mt.step = it + 1
        snap = mt.get_tracker_snapshot("peak")[cpu]
    return snap["Total"], first, snap, mt, n_gates


def register_dsv3_debug671():
    """A small deepseek_v3 flavour "debug671" with the 671B flavour's structure (q LoRA rank
    and `q_norm`, sigmoid scores, node-limited routing 4 groups / 2 kept, `route_norm`,
    `route_scale` 2.5, one shared expert, a leading dense block) at debugmodel widths, for the
    fake-vs-real crosschecks (the 671B widths do not fit real CPU tensors). Built with
    torchtitan's own `_build_dsv3_layers`, as its `_debugmodel` is; a harness-only flavour."""
    import torchtitan.models.deepseek_v3 as dsv3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm

    def _debug671(attn_backend, moe_comm_backend, non_blocking_capacity_factor=None, num_mtp_layers=0):
        dim, vocab = 256, 2048
        layers = dsv3._build_dsv3_layers(
            n_layers=6, n_dense_layers=1, dim=dim, n_heads=16, q_lora_rank=128, kv_lora_rank=128,
            qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, mscale=1.0,
            dense_hidden_dim=1024, moe_hidden_dim=256, num_experts=16, num_shared_experts=1,
            router_top_k=4, router_score_func="sigmoid", router_num_expert_groups=4,
            router_num_limited_groups=2, router_route_scale=2.5, router_route_norm=True,
            attn_backend=attn_backend, moe_comm_backend=moe_comm_backend,
            non_blocking_capacity_factor=non_blocking_capacity_factor,
            rope=ComplexRoPE.Config(dim=32, max_seq_len=4096 * 4, theta=10000.0, scaling="yarn",
                                    rope_factor=40.0, beta_fast=32.0, beta_slow=1.0, original_seq_len=4096),
        )
        return dsv3.DeepSeekV3Model.Config(
            vocab_size=vocab, dim=dim,
            tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=dsv3._EMBEDDING_INIT),
            norm=RMSNorm.Config(normalized_shape=dim, param_init=dsv3._NORM_INIT),
            lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=dsv3._output_linear_init(dim)),
            layers=layers,
            mtp_layers=dsv3._build_mtp_layers(layers[-1], dim=dim, num_mtp_layers=num_mtp_layers),
        )

    dsv3.deepseekv3_configs.setdefault("debug671", _debug671)


def stub_flex_attention(q, k, v, *, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                        return_aux=None, kernel_options=None):
    """The fused FlexAttention's allocations without its arithmetic (see --attn-stub)."""
    import types

    import torch

    class _Stub(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            # the output has the value head dim (MLA: v_head_dim 128 < qk_head_dim 192; the
            # same shape as q for GQA, so the llama3 / qwen3 crosschecks are unchanged)
            out = q.new_empty((*q.shape[:-1], v.shape[-1]))
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
            mx = q.new_empty(q.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse, mx)
            return out, lse

        @staticmethod
        def backward(ctx, grad_out, grad_lse):
            q, k, v, *_ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    out, lse = _Stub.apply(q, k, v)
    return out, types.SimpleNamespace(lse=lse, max_scores=None)


def saved_per_module(model, inputs, extra) -> dict:
    """Bytes autograd saves in one forward, by the top-level module (and block) saving them,
    each storage counted once (the first module that saves it)."""
    import torch

    where = ["top"]
    seen: set = set()
    out: dict = {}

    def pre(name):
        def f(mod, args, kwargs=None):
            where.append(name)

        return f

    def post(name):
        def f(mod, args, output):
            where.pop()

        return f

    for name, mod in model.named_children():
        if name == "layers":
            for lid, blk in mod.named_children():
                blk.register_forward_pre_hook(pre(f"layers.{lid}"))
                blk.register_forward_hook(post(f"layers.{lid}"))
        else:
            mod.register_forward_pre_hook(pre(name))
            mod.register_forward_hook(post(name))

    def pack(t):
        try:
            key = t.untyped_storage()._cdata if not hasattr(t, "_local_tensor") else t._local_tensor.untyped_storage()._cdata
            nbytes = (t._local_tensor if hasattr(t, "_local_tensor") else t).untyped_storage().nbytes()
        except Exception:
            return t
        if key not in seen:
            seen.add(key)
            k = where[-1]
            out.setdefault(k, []).append((tuple(t.shape), str(t.dtype).replace("torch.", ""), nbytes))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pred = model(inputs, **extra)
    return {"saved": {k: {"bytes": sum(b for *_, b in v), "tensors": v} for k, v in out.items()},
            "pred": [tuple(pred.shape), str(pred.dtype)]}


CASES = [
    # id, arguments (torchtitan llama3 "8B" with its first N layers, FSDP over W fake ranks)
    ("titan-llama3-8b-2l-w8-s512", ["--layers", "2", "--world", "8", "--seq", "512", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w8-s512-fullac", ["--layers", "2", "--world", "8", "--seq", "512", "--loss", "ce", "--ac", "full"]),
    ("titan-llama3-8b-4l-w8-s1024", ["--layers", "4", "--world", "8", "--seq", "1024", "--loss", "ce"]),
    ("titan-llama3-8b-4l-w8-b2s2048", ["--layers", "4", "--world", "8", "--batch", "2", "--seq", "2048", "--loss", "ce"]),
    ("titan-llama3-8b-4l-w64-s2048", ["--layers", "4", "--world", "64", "--seq", "2048", "--loss", "ce"]),
    # second batch (issue 15, --runtime torchtitan): non-power-of-two worlds, selective (op) AC,
    # reshard policies, batch/sequence shapes
    ("titan-llama3-8b-2l-w6-s512", ["--layers", "2", "--world", "6", "--seq", "512", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w8-s512-selac", ["--layers", "2", "--world", "8", "--seq", "512", "--loss", "ce", "--ac", "selective"]),
    ("titan-llama3-8b-2l-w8-s512-never", ["--layers", "2", "--world", "8", "--seq", "512", "--loss", "ce", "--reshard", "never"]),
    ("titan-llama3-8b-2l-w8-s512-always", ["--layers", "2", "--world", "8", "--seq", "512", "--loss", "ce", "--reshard", "always"]),
    ("titan-llama3-8b-3l-w24-b2s1024", ["--layers", "3", "--world", "24", "--batch", "2", "--seq", "1024", "--loss", "ce"]),
    ("titan-llama3-8b-4l-w8-s1024-fullac", ["--layers", "4", "--world", "8", "--seq", "1024", "--loss", "ce", "--ac", "full"]),
    ("titan-llama3-8b-3l-w16-s1024-selac", ["--layers", "3", "--world", "16", "--seq", "1024", "--loss", "ce", "--ac", "selective"]),
    ("titan-llama3-8b-3l-w12-b4s512-fullac", ["--layers", "3", "--world", "12", "--batch", "4", "--seq", "512", "--loss", "ce", "--ac", "full"]),
    ("titan-llama3-8b-4l-w8-s1024-everyk2", ["--layers", "4", "--world", "8", "--seq", "1024", "--loss", "ce", "--ac", "every-k:2"]),
    ("titan-llama3-405b-1l-w64-s512", ["--flavor", "405B", "--layers", "1", "--world", "64", "--seq", "512", "--loss", "ce"]),
    ("titan-llama3-405b-2l-w32-s1024-fullac", ["--flavor", "405B", "--layers", "2", "--world", "32", "--seq", "1024", "--loss", "ce", "--ac", "full"]),
    ("titan-llama3-70b-2l-w16-s2048-selac", ["--flavor", "70B", "--layers", "2", "--world", "16", "--seq", "2048", "--loss", "ce", "--ac", "selective"]),
    ("titan-llama3-70b-2l-w64-s4096", ["--flavor", "70B", "--layers", "2", "--world", "64", "--seq", "4096", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w8-b4s4096-fullac", ["--layers", "2", "--world", "8", "--batch", "4", "--seq", "4096", "--loss", "ce", "--ac", "full"]),
    ("titan-llama3-8b-2l-w8-b2s2048-selac", ["--layers", "2", "--world", "8", "--batch", "2", "--seq", "2048", "--loss", "ce", "--ac", "selective"]),
    # third batch (tensor + sequence parallelism, torchtitan's defaults: SP on, loss parallel,
    # no async TP): a 2-D mesh (dp_shard = world / tp, tp)
    ("titan-llama3-8b-2l-w8-tp2-s2048", ["--layers", "2", "--world", "8", "--tp", "2", "--seq", "2048", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w8-tp4-s2048", ["--layers", "2", "--world", "8", "--tp", "4", "--seq", "2048", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w8-tp8-s4096", ["--layers", "2", "--world", "8", "--tp", "8", "--seq", "4096", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w2-tp2-s2048", ["--layers", "2", "--world", "2", "--tp", "2", "--seq", "2048", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w8-tp2-s4096-fullac", ["--layers", "2", "--world", "8", "--tp", "2", "--seq", "4096", "--ac", "full", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w4-tp4-s8192-selac", ["--layers", "2", "--world", "4", "--tp", "4", "--seq", "8192", "--ac", "selective", "--loss", "ce"]),
    ("titan-llama3-8b-4l-w16-tp4-b2s2048", ["--layers", "4", "--world", "16", "--tp", "4", "--batch", "2", "--seq", "2048", "--loss", "ce"]),
    ("titan-llama3-8b-3l-w8-tp2-s8192-fullac", ["--layers", "3", "--world", "8", "--tp", "2", "--seq", "8192", "--ac", "full", "--loss", "ce"]),
    ("titan-llama3-8b-4l-w8-tp4-s4096-everyk2", ["--layers", "4", "--world", "8", "--tp", "4", "--seq", "4096", "--ac", "every-k:2", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w8-tp2-s2048-never", ["--layers", "2", "--world", "8", "--tp", "2", "--seq", "2048", "--reshard", "never", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w8-tp2-s2048-always", ["--layers", "2", "--world", "8", "--tp", "2", "--seq", "2048", "--reshard", "always", "--loss", "ce"]),
    ("titan-llama3-70b-2l-w8-tp4-s4096", ["--flavor", "70B", "--layers", "2", "--world", "8", "--tp", "4", "--seq", "4096", "--loss", "ce"]),
    ("titan-llama3-70b-2l-w16-tp8-s8192-fullac", ["--flavor", "70B", "--layers", "2", "--world", "16", "--tp", "8", "--seq", "8192", "--ac", "full", "--loss", "ce"]),
    ("titan-llama3-70b-3l-w16-tp4-s2048-selac", ["--flavor", "70B", "--layers", "3", "--world", "16", "--tp", "4", "--seq", "2048", "--ac", "selective", "--loss", "ce"]),
    ("titan-llama3-8b-2l-w2-tp2-s2048-foreach", ["--layers", "2", "--world", "2", "--tp", "2", "--seq", "2048", "--loss", "ce", "--optim", "foreach"]),
    ("titan-llama3-70b-2l-w8-tp8-s1024", ["--flavor", "70B", "--layers", "2", "--world", "8", "--tp", "8", "--seq", "1024", "--loss", "ce"]),
    ("titan-llama3-70b-2l-w16-tp4-s1024-fullac", ["--flavor", "70B", "--layers", "2", "--world", "16", "--tp", "4", "--seq", "1024", "--loss", "ce", "--ac", "full"]),
    ("titan-llama3-8b-2l-w8-tp2-s512", ["--layers", "2", "--world", "8", "--tp", "2", "--seq", "512", "--loss", "ce"]),
    ("titan-llama3-405b-1l-w32-tp8-s1024", ["--flavor", "405B", "--layers", "1", "--world", "32", "--tp", "8", "--seq", "1024", "--loss", "ce"]),
    ("titan-llama3-8b-4l-w8-tp2-s1024-selac", ["--layers", "4", "--world", "8", "--tp", "2", "--seq", "1024", "--loss", "ce", "--ac", "selective"]),
    ("titan-llama3-70b-3l-w8-tp8-b2s1024-everyk2", ["--flavor", "70B", "--layers", "3", "--world", "8", "--tp", "8", "--batch", "2", "--seq", "1024", "--loss", "ce", "--ac", "every-k:2"]),
    ("titan-llama3-70b-2l-w32-tp4-s2048-always", ["--flavor", "70B", "--layers", "2", "--world", "32", "--tp", "4", "--seq", "2048", "--loss", "ce", "--reshard", "always"]),
    ("titan-llama3-70b-2l-w32-tp8-s4096", ["--flavor", "70B", "--layers", "2", "--world", "32", "--tp", "8", "--seq", "4096", "--loss", "ce"]),
    # fourth batch: torchtitan's own qwen3 model (dense, untied flavours 8B / 14B / 32B; 32B has
    # n_heads × head_dim = 8192 ≠ dim = 5120): q/k RMSNorm per head, cos/sin RoPE
    ("titan-qwen3-8b-2l-w8-s512", ["--model", "qwen3", "--flavor", "8B", "--layers", "2", "--world", "8", "--seq", "512", "--loss", "ce"]),
    ("titan-qwen3-8b-2l-w8-s1024-fullac", ["--model", "qwen3", "--flavor", "8B", "--layers", "2", "--world", "8", "--seq", "1024", "--loss", "ce", "--ac", "full"]),
    ("titan-qwen3-8b-3l-w16-s1024-selac", ["--model", "qwen3", "--flavor", "8B", "--layers", "3", "--world", "16", "--seq", "1024", "--loss", "ce", "--ac", "selective"]),
    ("titan-qwen3-32b-2l-w8-s1024", ["--model", "qwen3", "--flavor", "32B", "--layers", "2", "--world", "8", "--seq", "1024", "--loss", "ce"]),
    ("titan-qwen3-14b-2l-w8-b2s2048-selac", ["--model", "qwen3", "--flavor", "14B", "--layers", "2", "--world", "8", "--batch", "2", "--seq", "2048", "--loss", "ce", "--ac", "selective"]),
    ("titan-qwen3-8b-2l-w6-s512-never", ["--model", "qwen3", "--flavor", "8B", "--layers", "2", "--world", "6", "--seq", "512", "--loss", "ce", "--reshard", "never"]),
    ("titan-qwen3-14b-3l-w12-b2s1024-everyk2", ["--model", "qwen3", "--flavor", "14B", "--layers", "3", "--world", "12", "--batch", "2", "--seq", "1024", "--loss", "ce", "--ac", "every-k:2"]),
    ("titan-qwen3-8b-2l-w8-tp2-s2048", ["--model", "qwen3", "--flavor", "8B", "--layers", "2", "--world", "8", "--tp", "2", "--seq", "2048", "--loss", "ce"]),
    ("titan-qwen3-32b-2l-w16-tp4-s2048-fullac", ["--model", "qwen3", "--flavor", "32B", "--layers", "2", "--world", "16", "--tp", "4", "--seq", "2048", "--loss", "ce", "--ac", "full"]),
    ("titan-qwen3-8b-2l-w8-tp8-s4096-selac", ["--model", "qwen3", "--flavor", "8B", "--layers", "2", "--world", "8", "--tp", "8", "--seq", "4096", "--loss", "ce", "--ac", "selective"]),
    ("titan-qwen3-14b-2l-w16-tp2-b2s1024-always", ["--model", "qwen3", "--flavor", "14B", "--layers", "2", "--world", "16", "--tp", "2", "--batch", "2", "--seq", "1024", "--loss", "ce", "--reshard", "always"]),
    # fifth batch: torchtitan's qwen3 MoE flavours (GroupedExperts on torch._grouped_mm, no EP;
    # experts FSDP-sharded on dim 0, or dim 1 when dp_shard > experts), router gate in fp32
    ("titan-qwen3moe-30b-2l-w8-s1024", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "8", "--seq", "1024", "--loss", "ce"]),
    ("titan-qwen3moe-30b-2l-w16-s2048-fullac", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "16", "--seq", "2048", "--loss", "ce", "--ac", "full"]),
    # measured, not a fixture (memwall refuses it, see README "Qwen 3 MoE"): ("titan-qwen3moe-30b-2l-w256-s1024", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "256", "--seq", "1024", "--loss", "ce"]),
    ("titan-qwen3moe-30b-3l-w8-b2s1024-everyk2", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "3", "--world", "8", "--batch", "2", "--seq", "1024", "--loss", "ce", "--ac", "every-k:2"]),
    ("titan-qwen3moe-235b-1l-w32-s2048", ["--model", "qwen3", "--flavor", "235B-A22B", "--layers", "1", "--world", "32", "--seq", "2048", "--loss", "ce"]),
    # measured first as not a fixture (memwall refused it, +20%; the eighth batch below adds it)
    ("titan-qwen3moe-30b-2l-w12-s512-always", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "12", "--seq", "512", "--loss", "ce", "--reshard", "always"]),
    ("titan-qwen3moe-30b-2l-w8-b2s2048-foreach", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "8", "--batch", "2", "--seq", "2048", "--loss", "ce", "--optim", "foreach"]),
    # seventh batch (issue 15, h24): torchtitan's op-level SelectiveAC on the MoE blocks (its
    # default AC mode): `wqkv` saved, `wo` recomputed, the router gate forced to recompute by its
    # shape, `_grouped_mm` not in the save list, `topk` saved
    ("titan-qwen3moe-30b-2l-w8-s1024-selac", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "8", "--seq", "1024", "--loss", "ce", "--ac", "selective"]),
    ("titan-qwen3moe-30b-3l-w16-b2s2048-selac", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "3", "--world", "16", "--batch", "2", "--seq", "2048", "--loss", "ce", "--ac", "selective"]),
    ("titan-qwen3moe-30b-1l-w32-s512-selac", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "1", "--world", "32", "--seq", "512", "--loss", "ce", "--ac", "selective"]),
    ("titan-qwen3moe-30b-2l-w12-b2s1024-selac-always-foreach", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "12", "--batch", "2", "--seq", "1024", "--loss", "ce", "--ac", "selective", "--reshard", "always", "--optim", "foreach"]),
    ("titan-qwen3moe-235b-2l-w32-s1024-selac", ["--model", "qwen3", "--flavor", "235B-A22B", "--layers", "2", "--world", "32", "--seq", "1024", "--loss", "ce", "--ac", "selective"]),
    # FullAC on one MoE block: block 0's reduce-scatter after its reshard, nothing of the
    # recomputed block alive (as without AC and under SelectiveAC)
    ("titan-qwen3moe-30b-1l-w32-s512-fullac", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "1", "--world", "32", "--seq", "512", "--loss", "ce", "--ac", "full"]),
    ("titan-qwen3moe-235b-1l-w16-b2s2048-selac", ["--model", "qwen3", "--flavor", "235B-A22B", "--layers", "1", "--world", "16", "--batch", "2", "--seq", "2048", "--loss", "ce", "--ac", "selective"]),
    # sixth batch: qwen3's tied flavours (0.6B / 1.7B / 4B, `enable_weight_tying`): one FSDP unit
    # `[tok_embeddings, norm, lm_head]`, the tie re-made by `init_weights` after `fully_shard`
    # as `Trainer.__init__` does (see README "Tied embeddings")
    ("titan-qwen3tied-0.6b-2l-w8-s1024", ["--model", "qwen3", "--flavor", "0.6B", "--layers", "2", "--world", "8", "--seq", "1024", "--loss", "ce"]),
    ("titan-qwen3tied-1.7b-2l-w8-s1024-fullac", ["--model", "qwen3", "--flavor", "1.7B", "--layers", "2", "--world", "8", "--seq", "1024", "--loss", "ce", "--ac", "full"]),
    ("titan-qwen3tied-4b-3l-w4-s2048-selac", ["--model", "qwen3", "--flavor", "4B", "--layers", "3", "--world", "4", "--seq", "2048", "--loss", "ce", "--ac", "selective"]),
    ("titan-qwen3tied-1.7b-2l-w2-s2048", ["--model", "qwen3", "--flavor", "1.7B", "--layers", "2", "--world", "2", "--seq", "2048", "--loss", "ce"]),
    ("titan-qwen3tied-4b-2l-w8-b2s1024-always", ["--model", "qwen3", "--flavor", "4B", "--layers", "2", "--world", "8", "--batch", "2", "--seq", "1024", "--loss", "ce", "--reshard", "always"]),
    ("titan-qwen3tied-1.7b-2l-w6-s512-never", ["--model", "qwen3", "--flavor", "1.7B", "--layers", "2", "--world", "6", "--seq", "512", "--loss", "ce", "--reshard", "never"]),
    ("titan-qwen3tied-0.6b-3l-w8-s2048-foreach", ["--model", "qwen3", "--flavor", "0.6B", "--layers", "3", "--world", "8", "--seq", "2048", "--loss", "ce", "--optim", "foreach"]),
    ("titan-qwen3tied-0.6b-2l-w8-tp2-s2048", ["--model", "qwen3", "--flavor", "0.6B", "--layers", "2", "--world", "8", "--tp", "2", "--seq", "2048", "--loss", "ce"]),
    # all 28 blocks at short sequences: the gradient shards and the tied unit outweigh the loss
    ("titan-qwen3tied-0.6b-28l-w2-s128", ["--model", "qwen3", "--flavor", "0.6B", "--layers", "28", "--world", "2", "--seq", "128", "--loss", "ce"]),
    ("titan-qwen3tied-1.7b-28l-w8-s256-fullac", ["--model", "qwen3", "--flavor", "1.7B", "--layers", "28", "--world", "8", "--seq", "256", "--loss", "ce", "--ac", "full"]),
    ("titan-qwen3tied-4b-2l-w8-tp2-s1024-fullac", ["--model", "qwen3", "--flavor", "4B", "--layers", "2", "--world", "8", "--tp", "2", "--seq", "1024", "--loss", "ce", "--ac", "full"]),
    # float8 linears (torchtitan 0.3.0's Float8LinearConverter over torchao 0.18.0; run with
    # /work/venvs/titan-fp8/bin/python, see README "Float8"): every Linear, the LM head included
    ("titan-fp8-8b-1l-w8-s1024-rowwise", ["--layers", "1", "--world", "8", "--seq", "1024", "--loss", "ce", "--float8", "rowwise"]),
    ("titan-fp8-8b-2l-w8-s2048-rowwise", ["--layers", "2", "--world", "8", "--seq", "2048", "--loss", "ce", "--float8", "rowwise"]),
    ("titan-fp8-8b-4l-w16-s4096-rowwise-fullac", ["--layers", "4", "--world", "16", "--seq", "4096", "--loss", "ce", "--float8", "rowwise", "--ac", "full"]),
    ("titan-fp8-8b-4l-w8-b2s4096-rowwise", ["--layers", "4", "--world", "8", "--batch", "2", "--seq", "4096", "--loss", "ce", "--float8", "rowwise"]),
    ("titan-fp8-8b-2l-w64-b2s1024-gwhp", ["--layers", "2", "--world", "64", "--batch", "2", "--seq", "1024", "--loss", "ce", "--float8", "rowwise_with_gw_hp"]),
    ("titan-fp8-8b-3l-w8-s2048-gwhp-never", ["--layers", "3", "--world", "8", "--seq", "2048", "--loss", "ce", "--float8", "rowwise_with_gw_hp", "--reshard", "never"]),
    ("titan-fp8-8b-2l-w32-s8192-gwhp-fullac-foreach", ["--layers", "2", "--world", "32", "--seq", "8192", "--loss", "ce", "--float8", "rowwise_with_gw_hp", "--ac", "full", "--optim", "foreach"]),
    ("titan-fp8-8b-3l-w16-s2048-rowwise-always", ["--layers", "3", "--world", "16", "--seq", "2048", "--loss", "ce", "--float8", "rowwise", "--reshard", "always"]),
    # few ranks: the gradient shards outweigh the casts, the peak is the embeddings' backward
    # with and without float8 (the blocks' casts stay below it)
    ("titan-fp8-8b-4l-w1-s512-rowwise", ["--layers", "4", "--world", "1", "--seq", "512", "--loss", "ce", "--float8", "rowwise"]),
    ("titan-fp8-8b-8l-w2-s1024-rowwise-fullac", ["--layers", "8", "--world", "2", "--seq", "1024", "--loss", "ce", "--float8", "rowwise", "--ac", "full"]),
    ("titan-fp8-8b-4l-w2-s2048-rowwise", ["--layers", "4", "--world", "2", "--seq", "2048", "--loss", "ce", "--float8", "rowwise"]),
    ("titan-fp8-qwen3-8b-2l-w8-s2048-rowwise-selective", ["--model", "qwen3", "--flavor", "8B", "--layers", "2", "--world", "8", "--seq", "2048", "--loss", "ce", "--float8", "rowwise", "--ac", "selective"]),
    # seventh batch: torchtitan's deepseek_v3 (MLA + MoE with shared experts, `n_dense_layers`
    # leading dense blocks; router gate in fp32 as CUDA autocast runs it), its 16B flavour
    # (1 dense block, 64 experts, top 6, 2 shared, softmax, no route_norm, q_lora_rank 0) and
    # its 671B flavour (3 dense blocks, 256 experts, top 8, 1 shared, sigmoid, node-limited
    # routing 8/4, route_norm, q_lora_rank 1536); the first blocks of each
    ("titan-dsv3-16b-2l-w8-s1024", ["--model", "deepseek_v3", "--flavor", "16B", "--layers", "2", "--world", "8", "--seq", "1024", "--loss", "ce"]),
    ("titan-dsv3-16b-3l-w16-b2s2048-fullac", ["--model", "deepseek_v3", "--flavor", "16B", "--layers", "3", "--world", "16", "--batch", "2", "--seq", "2048", "--loss", "ce", "--ac", "full"]),
    ("titan-dsv3-16b-3l-w64-s1024-everyk2", ["--model", "deepseek_v3", "--flavor", "16B", "--layers", "3", "--world", "64", "--seq", "1024", "--loss", "ce", "--ac", "every-k:2"]),
    ("titan-dsv3-16b-2l-w8-b2s512-always-foreach", ["--model", "deepseek_v3", "--flavor", "16B", "--layers", "2", "--world", "8", "--batch", "2", "--seq", "512", "--loss", "ce", "--reshard", "always", "--optim", "foreach"]),
    ("titan-dsv3-671b-4l-w64-s1024", ["--model", "deepseek_v3", "--flavor", "671B", "--layers", "4", "--world", "64", "--seq", "1024", "--loss", "ce"]),
    ("titan-dsv3-671b-5l-w32-s2048-fullac", ["--model", "deepseek_v3", "--flavor", "671B", "--layers", "5", "--world", "32", "--seq", "2048", "--loss", "ce", "--ac", "full"]),
    ("titan-dsv3-671b-4l-w64-b2s1024-always", ["--model", "deepseek_v3", "--flavor", "671B", "--layers", "4", "--world", "64", "--batch", "2", "--seq", "1024", "--loss", "ce", "--reshard", "always"]),
    ("titan-dsv3-671b-4l-w256-s512-foreach", ["--model", "deepseek_v3", "--flavor", "671B", "--layers", "4", "--world", "256", "--seq", "512", "--loss", "ce", "--optim", "foreach"]),
    ("titan-dsv3-671b-3l-w8-s2048", ["--model", "deepseek_v3", "--flavor", "671B", "--layers", "3", "--world", "8", "--seq", "2048", "--loss", "ce"]),
    # eighth batch: MoE blocks (Qwen 3 MoE, DeepSeek-V3) under `fsdp_reshard_after_forward =
    # "never"`, without AC and under FullAC (the Qwen 3 235B case was measured before, off by
    # +20%, and refused: see README "DeepSeek-V3", "never")
    # ninth batch (issue 15, h28): expert parallelism (`expert_parallel_degree`, the
    # AllToAllTokenDispatcher under the harness's balanced split sizes, FSDP2 of the experts over
    # efsdp = dp_shard / ep; see README "Expert parallelism")
    ("titan-qwen3moe-30b-1l-w8-ep2-s512", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "1", "--world", "8", "--ep", "2", "--seq", "512", "--loss", "ce"]),
    ("titan-qwen3moe-30b-2l-w16-ep4-b2s1024-fullac", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "16", "--ep", "4", "--batch", "2", "--seq", "1024", "--ac", "full", "--loss", "ce"]),
    ("titan-qwen3moe-30b-3l-w8-ep8-s2048-everyk2", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "3", "--world", "8", "--ep", "8", "--seq", "2048", "--ac", "every-k:2", "--loss", "ce"]),
    ("titan-qwen3moe-235b-2l-w32-ep8-s1024", ["--model", "qwen3", "--flavor", "235B-A22B", "--layers", "2", "--world", "32", "--ep", "8", "--seq", "1024", "--loss", "ce"]),
    ("titan-qwen3moe-235b-1l-w64-ep8-s2048-fullac", ["--model", "qwen3", "--flavor", "235B-A22B", "--layers", "1", "--world", "64", "--ep", "8", "--seq", "2048", "--ac", "full", "--loss", "ce"]),
    ("titan-dsv3-16b-2l-w8-ep2-s1024", ["--model", "deepseek_v3", "--flavor", "16B", "--layers", "2", "--world", "8", "--ep", "2", "--seq", "1024", "--loss", "ce"]),
    ("titan-dsv3-16b-3l-w16-ep4-b2s512-fullac", ["--model", "deepseek_v3", "--flavor", "16B", "--layers", "3", "--world", "16", "--ep", "4", "--batch", "2", "--seq", "512", "--ac", "full", "--loss", "ce"]),
    ("titan-dsv3-671b-4l-w64-ep8-s1024", ["--model", "deepseek_v3", "--flavor", "671B", "--layers", "4", "--world", "64", "--ep", "8", "--seq", "1024", "--loss", "ce"]),
    ("titan-dsv3-671b-5l-w32-ep8-s2048-fullac", ["--model", "deepseek_v3", "--flavor", "671B", "--layers", "5", "--world", "32", "--ep", "8", "--seq", "2048", "--ac", "full", "--loss", "ce"]),
    ("titan-qwen3moe-30b-2l-w16-ep2-s1024-always-foreach", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "16", "--ep", "2", "--seq", "1024", "--reshard", "always", "--optim", "foreach", "--loss", "ce"]),
    # larger EP degrees: ep 32 over 256 ranks (efsdp 8), and ep = dp_shard (efsdp 1: the experts
    # not FSDP-sharded at all)
    ("titan-dsv3-671b-4l-w256-ep32-s512-fullac", ["--model", "deepseek_v3", "--flavor", "671B", "--layers", "4", "--world", "256", "--ep", "32", "--seq", "512", "--ac", "full", "--loss", "ce"]),
    ("titan-qwen3moe-235b-2l-w64-ep64-s1024", ["--model", "qwen3", "--flavor", "235B-A22B", "--layers", "2", "--world", "64", "--ep", "64", "--seq", "1024", "--loss", "ce"]),
    # "never" resharding with EP: every unit gathered from its forward to its post-backward
    ("titan-qwen3moe-30b-2l-w8-ep2-s1024-never", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "8", "--ep", "2", "--seq", "1024", "--reshard", "never", "--loss", "ce"]),
    ("titan-dsv3-16b-3l-w16-ep4-s1024-fullac-never", ["--model", "deepseek_v3", "--flavor", "16B", "--layers", "3", "--world", "16", "--ep", "4", "--seq", "1024", "--ac", "full", "--reshard", "never", "--loss", "ce"]),
    # the routing-skew probe's case (TITAN_EP_RECV_SKEW, README "Expert parallelism"), balanced
    ("titan-dsv3-16b-4l-w16-ep4-s2048", ["--model", "deepseek_v3", "--flavor", "16B", "--layers", "4", "--world", "16", "--ep", "4", "--seq", "2048", "--loss", "ce"]),
    ("titan-qwen3moe-235b-2l-w64-s1024-fullac-never", ["--model", "qwen3", "--flavor", "235B-A22B", "--layers", "2", "--world", "64", "--seq", "1024", "--loss", "ce", "--ac", "full", "--reshard", "never"]),
    ("titan-qwen3moe-30b-2l-w8-s1024-never", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "8", "--seq", "1024", "--loss", "ce", "--reshard", "never"]),
    ("titan-dsv3-16b-2l-w8-s1024-never", ["--model", "deepseek_v3", "--flavor", "16B", "--layers", "2", "--world", "8", "--seq", "1024", "--loss", "ce", "--reshard", "never"]),
    ("titan-dsv3-16b-4l-w8-s1024-fullac-never", ["--model", "deepseek_v3", "--flavor", "16B", "--layers", "4", "--world", "8", "--seq", "1024", "--loss", "ce", "--ac", "full", "--reshard", "never"]),
    ("titan-dsv3-671b-4l-w64-s1024-never", ["--model", "deepseek_v3", "--flavor", "671B", "--layers", "4", "--world", "64", "--seq", "1024", "--loss", "ce", "--reshard", "never"]),
    ("titan-dsv3-671b-5l-w32-s2048-fullac-never", ["--model", "deepseek_v3", "--flavor", "671B", "--layers", "5", "--world", "32", "--seq", "2048", "--loss", "ce", "--ac", "full", "--reshard", "never"]),
    # eighth batch (issue 15, h26): HSDP, `data_parallel_replicate_degree` R > 1 with dp_shard S
    # = world / R: `fully_shard` on the 2-D ["dp_replicate", "fsdp"] mesh (shards within S, the
    # reduce-scatter output all-reduced in place across R; see README "HSDP")
    ("titan-hsdp-8b-2l-r2s4-s1024", ["--layers", "2", "--world", "8", "--dp-replicate", "2", "--seq", "1024", "--loss", "ce"]),
    ("titan-hsdp-8b-4l-r4s8-s2048-fullac", ["--layers", "4", "--world", "32", "--dp-replicate", "4", "--seq", "2048", "--loss", "ce", "--ac", "full"]),
    ("titan-hsdp-8b-3l-r2s2-b2s1024-selac", ["--layers", "3", "--world", "4", "--dp-replicate", "2", "--batch", "2", "--seq", "1024", "--loss", "ce", "--ac", "selective"]),
    ("titan-hsdp-8b-1l-r3s6-s512-foreach", ["--layers", "1", "--world", "18", "--dp-replicate", "3", "--seq", "512", "--loss", "ce", "--optim", "foreach"]),
    ("titan-hsdp-70b-2l-r2s8-s2048", ["--flavor", "70B", "--layers", "2", "--world", "16", "--dp-replicate", "2", "--seq", "2048", "--loss", "ce"]),
    ("titan-hsdp-70b-1l-r4s4-s1024-fullac", ["--flavor", "70B", "--layers", "1", "--world", "16", "--dp-replicate", "4", "--seq", "1024", "--loss", "ce", "--ac", "full"]),
    ("titan-hsdp-qwen3-8b-2l-r2s4-s2048-selac", ["--model", "qwen3", "--flavor", "8B", "--layers", "2", "--world", "8", "--dp-replicate", "2", "--seq", "2048", "--loss", "ce", "--ac", "selective"]),
    ("titan-hsdp-qwen3-14b-2l-r4s2-s1024", ["--model", "qwen3", "--flavor", "14B", "--layers", "2", "--world", "8", "--dp-replicate", "4", "--seq", "1024", "--loss", "ce"]),
    ("titan-hsdp-qwen3-32b-3l-r2s8-b2s1024-fullac", ["--model", "qwen3", "--flavor", "32B", "--layers", "3", "--world", "16", "--dp-replicate", "2", "--batch", "2", "--seq", "1024", "--loss", "ce", "--ac", "full"]),
    # the tied unit, the MoE blocks (experts on their own `efsdp` mesh, replicated the same way)
    # and float8 linears (run with /work/venvs/titan-fp8) under HSDP
    ("titan-hsdp-qwen3tied-1.7b-2l-r2s4-s1024", ["--model", "qwen3", "--flavor", "1.7B", "--layers", "2", "--world", "8", "--dp-replicate", "2", "--seq", "1024", "--loss", "ce"]),
    ("titan-hsdp-qwen3moe-30b-2l-r2s8-s1024", ["--model", "qwen3", "--flavor", "30B-A3B", "--layers", "2", "--world", "16", "--dp-replicate", "2", "--seq", "1024", "--loss", "ce"]),
    ("titan-fp8-hsdp-8b-2l-r2s4-s2048-rowwise", ["--layers", "2", "--world", "8", "--dp-replicate", "2", "--seq", "2048", "--loss", "ce", "--float8", "rowwise"]),
]


# pipeline parallelism (issue 15): one pp rank each (its stage, or its two virtual stages under
# the looped schedules), mesh pp × dp_shard 4, torchtitan's default stage split
# (`_generate_llm_fqn_per_model_part`: embeddings and norm + head each weigh one layer)
# -> tests/truth/titan_pp.jsonl
def _pp(name, layers, pp, rank, sched, batch, seq=1024, extra=(), dp=4, flavor="8B", mbs=1, model="llama3"):
    prefix = "titan-pp" if model == "llama3" else f"titan-pp-{model}"
    return (f"{prefix}-{flavor.lower()}-{layers}l-pp{pp}r{rank}-{sched.lower()}-b{batch}s{seq}"
            + (f"-dp{dp}" if dp != 4 else "") + (f"-mbs{mbs}" if mbs != 1 else "")
            + "".join(f"-{e.lstrip('-').replace('every-k:', 'everyk')}" for e in extra if e.startswith("--optim") is False and not e.startswith("-")),
            [*(["--model", model] if model != "llama3" else []),
             "--flavor", flavor, "--layers", str(layers), "--world", str(dp * pp), "--pp", str(pp), "--pp-rank", str(rank),
             "--schedule", sched, "--batch", str(batch), "--seq", str(seq), "--mbs", str(mbs), "--loss", "ce", *extra])


def _ppq(*a, **k):
    """A case of torchtitan's qwen3 model (dense, untied flavours) under PP."""
    return _pp(*a, model="qwen3", **k)


# torch 2.15's Schedule1F1B refuses fewer microbatches than stages ("Number of microbatches (2)
# must be greater than or equal to the number of stages (4)"): no such case
PP_CASES = [
    _pp("", 4, 2, 0, "1F1B", 4), _pp("", 4, 2, 1, "1F1B", 4),
    _pp("", 6, 4, 0, "1F1B", 8), _pp("", 6, 4, 1, "1F1B", 8), _pp("", 6, 4, 3, "1F1B", 8),
    _pp("", 6, 4, 0, "1F1B", 4),
    _pp("", 4, 2, 0, "GPipe", 4), _pp("", 4, 2, 1, "GPipe", 4),
    _pp("", 6, 4, 0, "GPipe", 8), _pp("", 6, 4, 1, "GPipe", 8), _pp("", 6, 4, 3, "GPipe", 8),
    _pp("", 6, 2, 0, "Interleaved1F1B", 4), _pp("", 6, 2, 1, "Interleaved1F1B", 4),
    _pp("", 6, 2, 0, "Interleaved1F1B", 8), _pp("", 6, 2, 1, "Interleaved1F1B", 8),
    # second batch: microbatch size 2, dp_shard 2 and 8, uneven splits, the 70B width, foreach
    # AdamW, four ranks of Interleaved1F1B (eight virtual stages)
    _pp("", 4, 2, 0, "1F1B", 8, seq=512, mbs=2), _pp("", 4, 2, 1, "1F1B", 8, seq=512, mbs=2),
    _pp("", 10, 4, 2, "1F1B", 4, seq=2048, dp=2), _pp("", 9, 4, 1, "GPipe", 4, seq=2048, dp=2),
    _pp("", 7, 2, 1, "1F1B", 2, seq=4096, dp=8),
    _pp("", 4, 2, 1, "GPipe", 2, seq=512, flavor="70B"), _pp("", 4, 2, 0, "1F1B", 4, seq=1024, flavor="70B", dp=8),
    _pp("", 4, 2, 1, "1F1B", 4, extra=("--optim", "foreach")),
    _pp("", 10, 4, 0, "Interleaved1F1B", 8, seq=512), _pp("", 10, 4, 2, "Interleaved1F1B", 8, seq=512),
    _pp("", 10, 4, 3, "Interleaved1F1B", 8, seq=512),
    # third batch: activation checkpointing under PP (full, selective op-level)
    _pp("", 4, 2, 0, "1F1B", 4, seq=2048, extra=("--ac", "full")),
    _pp("", 4, 2, 1, "1F1B", 4, seq=2048, extra=("--ac", "full")),
    _pp("", 6, 4, 1, "GPipe", 8, seq=1024, extra=("--ac", "full")),
    _pp("", 4, 2, 0, "1F1B", 4, seq=2048, extra=("--ac", "selective")),
    _pp("", 6, 2, 1, "Interleaved1F1B", 4, seq=1024, extra=("--ac", "selective")),
    # fourth batch: torchtitan's qwen3 (dense, untied: 8B, 14B, 32B whose n_heads × head_dim =
    # 8192 ≠ dim = 5120) under PP: q/k RMSNorms, head_dim, the cos/sin RoPE cache. The tied
    # flavours (0.6B/1.7B/4B) are refused by torchtitan itself under PP
    # (models/common/decoder.py `update_from_config`: "Weight tying is not supported with
    # Pipeline Parallel.")
    _ppq("", 4, 2, 0, "1F1B", 4), _ppq("", 4, 2, 1, "1F1B", 4),
    _ppq("", 6, 4, 1, "1F1B", 8), _ppq("", 6, 4, 3, "GPipe", 8), _ppq("", 6, 4, 0, "GPipe", 4),
    _ppq("", 6, 2, 0, "Interleaved1F1B", 4, flavor="14B"), _ppq("", 6, 2, 1, "Interleaved1F1B", 8, seq=512, flavor="14B"),
    _ppq("", 4, 2, 1, "GPipe", 2, seq=512, flavor="32B", dp=2), _ppq("", 4, 2, 0, "1F1B", 4, flavor="32B", dp=2),
    _ppq("", 4, 2, 1, "1F1B", 4, seq=2048, extra=("--ac", "full")),
    _ppq("", 4, 2, 0, "1F1B", 4, seq=2048, extra=("--ac", "selective")),
    _ppq("", 7, 2, 1, "1F1B", 8, seq=512, mbs=2, extra=("--optim", "foreach")),
    _ppq("", 14, 4, 2, "Interleaved1F1B", 8, seq=512, flavor="14B", dp=2),
    _ppq("", 6, 4, 2, "GPipe", 8, seq=1024, extra=("--ac", "full")),
    # fifth batch: splits that leave a stage without a transformer block (the first stage the
    # embeddings alone, the last `[norm, lm_head]` alone): 1F1B / GPipe with pp = layers + 2 or
    # 3 layers on 4 ranks, Interleaved1F1B with 8 virtual stages
    _pp("", 2, 4, 0, "1F1B", 4), _pp("", 2, 4, 3, "1F1B", 4), _pp("", 3, 4, 3, "GPipe", 4),
    _ppq("", 6, 4, 0, "Interleaved1F1B", 8, seq=512), _ppq("", 6, 4, 3, "Interleaved1F1B", 8, seq=512),
    _pp("", 2, 4, 0, "GPipe", 4, seq=2048, extra=("--ac", "full")),
    # sixth batch: torchtitan's qwen3 MoE flavours under PP (router gate in fp32 as CUDA autocast
    # runs it, the load-balancing hook registered on the parts; experts FSDP-sharded on dim 0)
    _ppq("", 4, 2, 0, "1F1B", 4, flavor="30B-A3B", dp=8), _ppq("", 4, 2, 1, "1F1B", 4, flavor="30B-A3B", dp=8),
    _ppq("", 6, 4, 1, "GPipe", 8, seq=512, flavor="30B-A3B"), _ppq("", 6, 4, 3, "1F1B", 8, seq=512, flavor="30B-A3B"),
    _ppq("", 6, 2, 1, "Interleaved1F1B", 4, flavor="30B-A3B"),
    _ppq("", 4, 2, 1, "1F1B", 4, seq=2048, flavor="30B-A3B", dp=8, extra=("--ac", "full")),
    _ppq("", 3, 2, 0, "GPipe", 2, seq=512, flavor="235B-A22B", dp=16),
    # eighth batch (h24): every-k:K AC under PP (earlier torchtitan's layer-level SAC: each
    # rank counts its own blocks, across its stages)
    _pp("", 4, 2, 0, "1F1B", 4, seq=2048, extra=("--ac", "every-k:2")),
    _pp("", 4, 2, 1, "1F1B", 4, seq=2048, extra=("--ac", "every-k:2")),
    _pp("", 6, 4, 1, "GPipe", 8, seq=1024, extra=("--ac", "every-k:2")),
    _pp("", 9, 2, 0, "1F1B", 4, seq=1024, extra=("--ac", "every-k:3")),
    _ppq("", 6, 2, 1, "Interleaved1F1B", 4, seq=1024, extra=("--ac", "every-k:2")),
    _ppq("", 6, 4, 2, "1F1B", 8, seq=1024, flavor="14B", extra=("--ac", "every-k:2")),
    _ppq("", 6, 2, 0, "Interleaved1F1B", 8, seq=512, extra=("--ac", "every-k:3")),
    # seventh batch (h24): SelectiveAC on the MoE stages
    _ppq("", 4, 2, 0, "1F1B", 4, seq=2048, flavor="30B-A3B", dp=8, extra=("--ac", "selective")),
    _ppq("", 4, 2, 1, "1F1B", 4, seq=1024, flavor="30B-A3B", dp=8, extra=("--ac", "selective")),
    _ppq("", 6, 4, 1, "GPipe", 8, seq=512, flavor="30B-A3B", extra=("--ac", "selective")),
    _ppq("", 6, 2, 1, "Interleaved1F1B", 4, flavor="30B-A3B", extra=("--ac", "selective")),
    # PP with TP + SP (issue 15, h26): a pp × dp_shard × tp mesh; the stages exchange the
    # TP-local tensors (sequence-sharded hidden states, vocabulary-sharded logits)
    ("titan-pptp-8b-4l-pp2r0-tp2-1f1b-b4s1024-dp2", ["--flavor", "8B", "--layers", "4", "--world", "8", "--pp", "2", "--pp-rank", "0", "--tp", "2", "--schedule", "1F1B", "--batch", "4", "--seq", "1024", "--mbs", "1", "--loss", "ce"]),
    ("titan-pptp-8b-4l-pp2r1-tp2-1f1b-b4s1024-dp2", ["--flavor", "8B", "--layers", "4", "--world", "8", "--pp", "2", "--pp-rank", "1", "--tp", "2", "--schedule", "1F1B", "--batch", "4", "--seq", "1024", "--mbs", "1", "--loss", "ce"]),
    ("titan-pptp-8b-6l-pp4r1-tp2-gpipe-b4s1024-dp2", ["--flavor", "8B", "--layers", "6", "--world", "16", "--pp", "4", "--pp-rank", "1", "--tp", "2", "--schedule", "GPipe", "--batch", "4", "--seq", "1024", "--mbs", "1", "--loss", "ce"]),
    ("titan-pptp-8b-6l-pp2r1-tp4-interleaved1f1b-b4s1024-dp2", ["--flavor", "8B", "--layers", "6", "--world", "16", "--pp", "2", "--pp-rank", "1", "--tp", "4", "--schedule", "Interleaved1F1B", "--batch", "4", "--seq", "1024", "--mbs", "1", "--loss", "ce"]),
    ("titan-pptp-70b-4l-pp2r1-tp4-1f1b-b2s2048-dp2-full", ["--flavor", "70B", "--layers", "4", "--world", "16", "--pp", "2", "--pp-rank", "1", "--tp", "4", "--schedule", "1F1B", "--batch", "2", "--seq", "2048", "--mbs", "1", "--loss", "ce", "--ac", "full"]),
    ("titan-pptp-qwen3-8b-4l-pp2r0-tp2-gpipe-b4s1024-dp4-selective", ["--model", "qwen3", "--flavor", "8B", "--layers", "4", "--world", "16", "--pp", "2", "--pp-rank", "0", "--tp", "2", "--schedule", "GPipe", "--batch", "4", "--seq", "1024", "--mbs", "1", "--loss", "ce", "--ac", "selective"]),
    ("titan-pptp-8b-6l-pp4r3-tp2-1f1b-b4s512-dp2", ["--flavor", "8B", "--layers", "6", "--world", "16", "--pp", "4", "--pp-rank", "3", "--tp", "2", "--schedule", "1F1B", "--batch", "4", "--seq", "512", "--mbs", "1", "--loss", "ce"]),
    ("titan-pptp-8b-6l-pp4r0-tp4-1f1b-b4s1024-dp2-full", ["--flavor", "8B", "--layers", "6", "--world", "32", "--pp", "4", "--pp-rank", "0", "--tp", "4", "--schedule", "1F1B", "--batch", "4", "--seq", "1024", "--mbs", "1", "--loss", "ce", "--ac", "full"]),
]


# fake vs real CPU tensors on torchtitan's small "debugmodel" flavour (dim 256), attention
# stubbed on both sides (see --attn-stub) -> tests/truth/titan_crosscheck.jsonl
CROSSCHECKS = [
    # float8 linears (run with /work/venvs/titan-fp8): `torch._scaled_mm` runs on CPU tensors in
    # torch 2.15 (rowwise and tensorwise scales, bf16 output), so the casts and GEMMs of
    # torchao's Float8Linear run for real on the llama3 debugmodel
    ("xc-titan-fp8-debug-2l-w4-s256-rowwise", ["--flavor", "debugmodel", "--layers", "2", "--world", "4", "--seq", "256", "--float8", "rowwise"]),
    ("xc-titan-fp8-debug-2l-w4-b2s256-gwhp-fullac", ["--flavor", "debugmodel", "--layers", "2", "--world", "4", "--batch", "2", "--seq", "256", "--float8", "rowwise_with_gw_hp", "--ac", "full"]),
    ("xc-titan-fp8-debug-3l-w8-s512-rowwise-selac-never", ["--flavor", "debugmodel", "--layers", "3", "--world", "8", "--seq", "512", "--float8", "rowwise", "--ac", "selective", "--reshard", "never"]),
    ("xc-titan-debug-2l-w4-s256", ["--flavor", "debugmodel", "--layers", "2", "--world", "4", "--seq", "256"]),
    # HSDP (h26): the 2-D ["dp_replicate", "fsdp"] mesh, the reduce-scatter output all-reduced in
    # place over the replicate group (a no-op collective on the fake process group, both sides)
    ("xc-titan-hsdp-debug-2l-w4-r2s2-s256", ["--flavor", "debugmodel", "--layers", "2", "--world", "4", "--dp-replicate", "2", "--seq", "256"]),
    ("xc-titan-hsdp-debug-3l-w8-r2s4-b2s256-selac", ["--flavor", "debugmodel", "--layers", "3", "--world", "8", "--dp-replicate", "2", "--batch", "2", "--seq", "256", "--ac", "selective"]),
    ("xc-titan-hsdp-qwen3-debug-2l-w12-r3s4-s256-fullac", ["--model", "qwen3", "--flavor", "debugmodel", "--untie", "--layers", "2", "--world", "12", "--dp-replicate", "3", "--seq", "256", "--ac", "full"]),
    ("xc-titan-debug-2l-w4-tp2-s256", ["--flavor", "debugmodel", "--layers", "2", "--world", "4", "--tp", "2", "--seq", "256"]),
    ("xc-titan-debug-2l-w2-tp2-s256", ["--flavor", "debugmodel", "--layers", "2", "--world", "2", "--tp", "2", "--seq", "256"]),
    ("xc-titan-debug-3l-w8-tp4-b2s256-selac", ["--flavor", "debugmodel", "--layers", "3", "--world", "8", "--tp", "4", "--batch", "2", "--seq", "256", "--ac", "selective"]),
    ("xc-titan-debug-2l-w4-tp2-s512-fullac-foreach", ["--flavor", "debugmodel", "--layers", "2", "--world", "4", "--tp", "2", "--seq", "512", "--ac", "full", "--optim", "foreach"]),
    # torchtitan's qwen3 "debugmodel" (dim 256, 16 heads of head_dim 128: n_heads × head_dim =
    # 2048 ≠ dim; q/k norms, cos/sin RoPE), untied
    ("xc-titan-qwen3-debug-2l-w4-s256", ["--model", "qwen3", "--flavor", "debugmodel", "--untie", "--layers", "2", "--world", "4", "--seq", "256"]),
    ("xc-titan-qwen3-debug-2l-w4-tp2-s256-selac", ["--model", "qwen3", "--flavor", "debugmodel", "--untie", "--layers", "2", "--world", "4", "--tp", "2", "--seq", "256", "--ac", "selective"]),
    ("xc-titan-qwen3-debug-3l-w8-tp4-b2s256-fullac", ["--model", "qwen3", "--flavor", "debugmodel", "--untie", "--layers", "3", "--world", "8", "--tp", "4", "--batch", "2", "--seq", "256", "--ac", "full"]),
    # torchtitan's qwen3 MoE "debugmodel_moe" (64 experts, top 8; GroupedExperts on
    # torch._grouped_mm, whose CPU kernel and fake rule both run; the router gate in fp32 as
    # CUDA autocast runs it): fake equals real, though memwall does not model the MoE step yet
    # the qwen3 "debugmodel" tied (`enable_weight_tying`, as shipped): one FSDP unit
    # `[tok_embeddings, norm, lm_head]`, re-tied by `init_weights` after `fully_shard`
    ("xc-titan-qwen3tied-debug-2l-w4-s256", ["--model", "qwen3", "--flavor", "debugmodel", "--layers", "2", "--world", "4", "--seq", "256"]),
    ("xc-titan-qwen3tied-debug-2l-w4-tp2-s256-selac", ["--model", "qwen3", "--flavor", "debugmodel", "--layers", "2", "--world", "4", "--tp", "2", "--seq", "256", "--ac", "selective"]),
    ("xc-titan-qwen3tied-debug-3l-w8-b2s256-fullac-always", ["--model", "qwen3", "--flavor", "debugmodel", "--layers", "3", "--world", "8", "--batch", "2", "--seq", "256", "--ac", "full", "--reshard", "always"]),
    # torchtitan's deepseek_v3 "debugmodel" (dim 256, MLA without q LoRA, 1 dense block, 8
    # experts top 3 with 2 shared, softmax) and the harness's "debug671" (the 671B flavour's
    # structure: q LoRA + q_norm, sigmoid, node-limited routing, route_norm, 1 shared expert)
    ("xc-titan-dsv3-debug-2l-w4-s256", ["--model", "deepseek_v3", "--flavor", "debugmodel", "--layers", "2", "--world", "4", "--seq", "256"]),
    ("xc-titan-dsv3-debug-3l-w8-b2s256-fullac", ["--model", "deepseek_v3", "--flavor", "debugmodel", "--layers", "3", "--world", "8", "--batch", "2", "--seq", "256", "--ac", "full"]),
    ("xc-titan-dsv3-debug671-2l-w4-s256", ["--model", "deepseek_v3", "--flavor", "debug671", "--layers", "2", "--world", "4", "--seq", "256"]),
    ("xc-titan-dsv3-debug671-3l-w8-b2s512-always-foreach", ["--model", "deepseek_v3", "--flavor", "debug671", "--layers", "3", "--world", "8", "--batch", "2", "--seq", "512", "--reshard", "always", "--optim", "foreach"]),
    ("xc-titan-dsv3-debug671-3l-w4-s256-fullac-never", ["--model", "deepseek_v3", "--flavor", "debug671", "--layers", "3", "--world", "4", "--seq", "256", "--ac", "full", "--reshard", "never"]),
    ("xc-titan-qwen3moe-debug-2l-w4-s256", ["--model", "qwen3", "--flavor", "debugmodel_moe", "--layers", "2", "--world", "4", "--seq", "256"]),
    ("xc-titan-qwen3moe-debug-2l-w8-s256-fullac", ["--model", "qwen3", "--flavor", "debugmodel_moe", "--layers", "2", "--world", "8", "--batch", "2", "--seq", "256", "--ac", "full"]),
    # SelectiveAC on the MoE blocks (h24): the SAC cache (wqkv's output, the attention HOP's,
    # topk's values and ids) and the recomputed router and experts, on real tensors too
    ("xc-titan-qwen3moe-debug-2l-w8-b2s256-selac", ["--model", "qwen3", "--flavor", "debugmodel_moe", "--layers", "2", "--world", "8", "--batch", "2", "--seq", "256", "--ac", "selective"]),
    ("xc-titan-qwen3moe-debug-1l-w4-s256-selac", ["--model", "qwen3", "--flavor", "debugmodel_moe", "--layers", "1", "--world", "4", "--seq", "256", "--ac", "selective"]),
    # expert parallelism (h28): the AllToAllTokenDispatcher with the harness's balanced split
    # sizes on both sides (the fake process group's all-to-all writes nothing into real tensors
    # either), experts over efsdp = dp_shard / ep
    ("xc-titan-qwen3moe-debug-2l-w4-ep2-s256", ["--model", "qwen3", "--flavor", "debugmodel_moe", "--layers", "2", "--world", "4", "--ep", "2", "--seq", "256"]),
    ("xc-titan-qwen3moe-debug-2l-w8-ep4-b2s256-fullac", ["--model", "qwen3", "--flavor", "debugmodel_moe", "--layers", "2", "--world", "8", "--ep", "4", "--batch", "2", "--seq", "256", "--ac", "full"]),
    ("xc-titan-dsv3-debug671-2l-w8-ep2-s256", ["--model", "deepseek_v3", "--flavor", "debug671", "--layers", "2", "--world", "8", "--ep", "2", "--seq", "256"]),
    # pipeline parallelism: one pp rank's stage(s) with real tensors over the same fake process
    # group (its send/recv are no-ops: the received buffers are allocated, not written)
    # PP with TP + SP (h26): a pp × dp_shard × tp mesh, the TP-local stage tensors
    ("xc-titan-pptp-debug-4l-w8-pp2r0-tp2-1f1b-b4s256", ["--flavor", "debugmodel", "--layers", "4", "--world", "8", "--pp", "2", "--pp-rank", "0", "--tp", "2", "--schedule", "1F1B", "--batch", "4", "--seq", "256"]),
    ("xc-titan-pptp-debug-4l-w8-pp2r1-tp2-gpipe-b4s256-fullac", ["--flavor", "debugmodel", "--layers", "4", "--world", "8", "--pp", "2", "--pp-rank", "1", "--tp", "2", "--schedule", "GPipe", "--batch", "4", "--seq", "256", "--ac", "full"]),
    ("xc-titan-pptp-debug-6l-w16-pp2r1-tp4-interleaved1f1b-b4s256", ["--flavor", "debugmodel", "--layers", "6", "--world", "16", "--pp", "2", "--pp-rank", "1", "--tp", "4", "--schedule", "Interleaved1F1B", "--batch", "4", "--seq", "256"]),
    ("xc-titan-debug-4l-w4-pp2r0-1f1b-b4s256", ["--flavor", "debugmodel", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "0", "--schedule", "1F1B", "--batch", "4", "--seq", "256"]),
    ("xc-titan-debug-4l-w4-pp2r1-gpipe-b4s256", ["--flavor", "debugmodel", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "1", "--schedule", "GPipe", "--batch", "4", "--seq", "256"]),
    ("xc-titan-debug-4l-w4-pp2r0-gpipe-b4s256", ["--flavor", "debugmodel", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "0", "--schedule", "GPipe", "--batch", "4", "--seq", "256"]),
    ("xc-titan-debug-6l-w8-pp4r1-1f1b-b4s256", ["--flavor", "debugmodel", "--layers", "6", "--world", "8", "--pp", "4", "--pp-rank", "1", "--schedule", "1F1B", "--batch", "4", "--seq", "256"]),
    ("xc-titan-debug-4l-w4-pp2r1-1f1b-b4s256-fullac", ["--flavor", "debugmodel", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "1", "--schedule", "1F1B", "--batch", "4", "--seq", "256", "--ac", "full"]),
    ("xc-titan-debug-4l-w4-pp2r0-1f1b-b4s256-selac", ["--flavor", "debugmodel", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "0", "--schedule", "1F1B", "--batch", "4", "--seq", "256", "--ac", "selective"]),
    ("xc-titan-debug-6l-w4-pp2r1-interleaved1f1b-b4s256", ["--flavor", "debugmodel", "--layers", "6", "--world", "4", "--pp", "2", "--pp-rank", "1", "--schedule", "Interleaved1F1B", "--batch", "4", "--seq", "256"]),
    # torchtitan's qwen3 "debugmodel" (untied) under PP: q/k norms, cos/sin RoPE cache per stage,
    # and (interleaved, 8 microbatches) the last stage's reduce-scatter with the rank's other
    # stage's microbatches in flight
    ("xc-titan-qwen3-debug-4l-w4-pp2r0-1f1b-b4s256", ["--model", "qwen3", "--flavor", "debugmodel", "--untie", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "0", "--schedule", "1F1B", "--batch", "4", "--seq", "256"]),
    ("xc-titan-qwen3-debug-4l-w4-pp2r1-gpipe-b4s256-fullac", ["--model", "qwen3", "--flavor", "debugmodel", "--untie", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "1", "--schedule", "GPipe", "--batch", "4", "--seq", "256", "--ac", "full"]),
    # torchtitan's qwen3 "debugmodel_moe" (dim 256, 64 experts) under PP: the MoE stages'
    # grouped-mm backward with gradient accumulation, on real tensors too
    ("xc-titan-qwen3moe-debug-4l-w4-pp2r0-1f1b-b4s256", ["--model", "qwen3", "--flavor", "debugmodel_moe", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "0", "--schedule", "1F1B", "--batch", "4", "--seq", "256"]),
    ("xc-titan-qwen3moe-debug-4l-w4-pp2r1-gpipe-b4s256-fullac", ["--model", "qwen3", "--flavor", "debugmodel_moe", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "1", "--schedule", "GPipe", "--batch", "4", "--seq", "256", "--ac", "full"]),
    ("xc-titan-qwen3moe-debug-4l-w4-pp2r0-1f1b-b4s256-selac", ["--model", "qwen3", "--flavor", "debugmodel_moe", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "0", "--schedule", "1F1B", "--batch", "4", "--seq", "256", "--ac", "selective"]),
    # every-k:K under PP (h24): each rank counts its own blocks across its stages
    ("xc-titan-debug-4l-w4-pp2r0-1f1b-b4s256-everyk2", ["--flavor", "debugmodel", "--layers", "4", "--world", "4", "--pp", "2", "--pp-rank", "0", "--schedule", "1F1B", "--batch", "4", "--seq", "256", "--ac", "every-k:2"]),
    ("xc-titan-debug-6l-w4-pp2r1-interleaved1f1b-b4s256-everyk2", ["--flavor", "debugmodel", "--layers", "6", "--world", "4", "--pp", "2", "--pp-rank", "1", "--schedule", "Interleaved1F1B", "--batch", "4", "--seq", "256", "--ac", "every-k:2"]),
    # stages without a transformer block: the embeddings alone (rank 0) and `[norm, lm_head]`
    # alone (rank 3) of 2 layers on 4 ranks
    ("xc-titan-debug-2l-w8-pp4r0-1f1b-b4s256", ["--flavor", "debugmodel", "--layers", "2", "--world", "8", "--pp", "4", "--pp-rank", "0", "--schedule", "1F1B", "--batch", "4", "--seq", "256"]),
    ("xc-titan-debug-2l-w8-pp4r3-gpipe-b4s256", ["--flavor", "debugmodel", "--layers", "2", "--world", "8", "--pp", "4", "--pp-rank", "3", "--schedule", "GPipe", "--batch", "4", "--seq", "256"]),
    ("xc-titan-qwen3-debug-6l-w4-pp2r1-interleaved1f1b-b8s256", ["--model", "qwen3", "--flavor", "debugmodel", "--untie", "--layers", "6", "--world", "4", "--pp", "2", "--pp-rank", "1", "--schedule", "Interleaved1F1B", "--batch", "8", "--seq", "256"]),
]


def crosscheck() -> None:
    import json
    import subprocess

    root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    out_path = os.path.join(root, "tests", "truth", "titan_crosscheck.jsonl")
    done = {}
    if os.path.exists(out_path):  # rows already cross-checked are kept, not re-run
        for line in open(out_path):
            if line.strip():
                r = json.loads(line)
                done[r["id"]] = r
    rows = []
    done = {}
    if os.path.exists(out_path):  # measured rows are kept, never re-measured in place
        for line in open(out_path):
            if line.strip():
                r = json.loads(line)
                done[r["id"]] = r
    for cid, argv in CROSSCHECKS:
        if cid in done:
            rows.append(done[cid])
            continue
        got = {}
        for side in ("fake", "real"):
            extra = ["--loss", "ce", "--attn-stub"] + (["--real"] if side == "real" else [])
            p = subprocess.run([sys.executable, __file__, "--one", *argv, *extra], capture_output=True, text=True)
            lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
            if p.returncode != 0 or not lines:
                raise SystemExit(f"FAIL {cid} {side}: {p.stderr[-2000:]}")
            got[side] = json.loads(lines[-1])
        f, r = got["fake"]["measured"], got["real"]["measured"]
        row = {"id": cid, "args": argv, "fake": f, "real": r,
               "difference_bytes": r["peak_bytes"] - f["peak_bytes"], "versions": got["fake"]["versions"]}
        print(f"{cid}: fake {f['peak_bytes']} real {r['peak_bytes']} diff {row['difference_bytes']}")
        rows.append(row)
    with open(out_path, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def main() -> None:
    import json
    import subprocess

    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(measure_one(sys.argv[2:])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--crosscheck":
        crosscheck()
        return
    root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    cases = CASES
    out_path = os.path.join(root, "tests", "truth", "titan.jsonl")
    if len(sys.argv) > 1 and sys.argv[1] == "--pp-cases":
        cases = PP_CASES
        out_path = os.path.join(root, "tests", "truth", "titan_pp.jsonl")
    rows = {}
    if os.path.exists(out_path):
        for line in open(out_path):
            if line.strip():
                r = json.loads(line)
                rows[r["id"]] = r
    for cid, argv in cases:
        if cid in rows:  # measured fixtures are never re-measured in place
            continue
        p = subprocess.run([sys.executable, __file__, "--one", *argv], capture_output=True, text=True)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not lines:
            print(f"FAIL {cid}: {p.stderr[-2000:]}")
            continue
        r = {"id": cid, "kind": "torchtitan-train", **json.loads(lines[-1])}
        r.pop("_seconds", None)
        rows[cid] = r
        print(f"ok   {cid}: peak={r['measured']['peak_bytes']}")
        with open(out_path + ".tmp", "w") as f:
            for k in sorted(rows):
                f.write(json.dumps(rows[k]) + "\n")
        os.replace(out_path + ".tmp", out_path)


if __name__ == "__main__":
    main()
