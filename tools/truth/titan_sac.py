"""torchtitan's op-level selective activation checkpointing applied to a transformers model.

`checkpointing_policy = "selective-op"` in a case: every decoder layer runs under
`torch.utils.checkpoint.checkpoint(use_reentrant=False, early_stop=False,
context_fn=create_selective_checkpoint_contexts(policy))` with torchtitan's policy, through
transformers' own `gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)`
(modeling_utils.py `_activation_checkpointing_enable` passes the kwargs to `checkpoint`).

The policy is a verbatim port of torchtitan 0.3.0
(`torchtitan/distributed/activation_checkpoint.py`, `SelectiveAC._wrap_block` and
`_get_default_save_ops`; the package is installed in /work/venvs/titan, but it cannot be
imported into the truth venv, so the code is copied here with its structure kept):

- save ops: `get_default_op_list().compute_intensive_ops` of torch's partitioner (mm, addmm,
  bmm, _scaled_mm, convolution, the CUDA SDPA flash/efficient ops and their
  `_flash_attention_forward`/`_efficient_attention_forward` kernels, ...), plus
  `_scaled_dot_product_cudnn_attention`, `_scaled_dot_product_attention_math`,
  `_scaled_dot_product_fused_attention_overrideable`, `max.default`, flex_attention,
  `linear.default`, `topk.default` and the c10d reduce_scatter / all_to_all outputs;
- each save op's outputs are MUST_SAVE, except that `mm` and `linear` are counted per checkpoint
  call and every second one (count % 2 == 0) is PREFER_RECOMPUTE ("save every other mm");
- `force_recompute_mm_shapes_by_fqns` defaults to ["moe.router.gate"], an fqn transformers
  models do not have (their routers are `mlp.gate`), so no shape is forced to recompute here,
  as a torchtitan user applying the default config to an HF model would get;
- everything else is PREFER_RECOMPUTE; `early_stop=False` and `preserve_rng_state=True` as
  `ptd_checkpoint_wrapper(..., early_stop=False)` in torchtitan.

CPU mapping (the harness runs on CPU fake tensors): SDPA without dropout dispatches to
`aten._scaled_dot_product_flash_attention_for_cpu` (outputs: out, logsumexp), which is not in
torchtitan's set because torchtitan runs on CUDA, where the same call is
`_scaled_dot_product_flash_attention` (or `_efficient_attention`/`_cudnn_attention`), all saved.
So the CPU flash op is added to the save set here as the stand-in of the CUDA kernels: on both
devices the attention output and its logsumexp are what the policy keeps. SDPA with dropout
runs the CompositeImplicit math path on CPU, whose `bmm`s are saved as compute-intensive ops.
"""
from __future__ import annotations


def titan_save_ops() -> set:
    """torchtitan 0.3.0 `_get_default_save_ops()`, plus the CPU flash SDPA op (see above)."""
    import torch
    from torch._functorch.partitioners import get_default_op_list

    compute_ops = [
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
        torch.ops.aten._scaled_dot_product_attention_math.default,
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
        torch.ops.aten.max.default,
        torch._higher_order_ops.flex_attention,
        torch.ops.aten.linear.default,
        torch.ops.aten.topk.default,
        (torch._higher_order_ops, "inductor_compiled_code"),
        (torch.ops, "torch_attn._varlen_attn.default"),
    ]
    comm_ops = [
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        torch.ops._c10d_functional.all_to_all_single.default,
    ]
    ops = set()
    for spec in compute_ops + comm_ops:
        if isinstance(spec, tuple):
            obj, path = spec
            try:
                for part in path.split("."):
                    obj = getattr(obj, part)
                ops.add(obj)
            except AttributeError:
                pass
        else:
            ops.add(spec)
    ops.update(op.default for op in get_default_op_list().compute_intensive_ops)
    # the CPU stand-in of the CUDA flash kernel (module docstring)
    ops.add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    return ops


LOG: list | None = None  # set to a list to record (op, policy) decisions (probes)


def titan_policy_factory(save_ops: set, mm_recompute_shapes: set):
    """torchtitan's `_get_custom_policy()`: a fresh counter per checkpoint call."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)

    def make():
        meta = {"forward_mm_count": 0, "recompute_mm_count": 0}

        def wrapped_policy(ctx, func, *args, **kwargs):
            if (
                func == torch.ops.aten._to_copy.default
                and "cuda" in str(args[0].device)
                and "device" in kwargs
                and str(kwargs["device"]) == "cpu"
            ):
                return CheckpointPolicy.MUST_SAVE
            mode = "recompute" if ctx.is_recompute else "forward"
            key = f"{mode}_mm_count"
            if func in mm_ops:
                shape = args[1].shape
                if func == torch.ops.aten.linear.default:
                    shape = torch.Size((shape[1], shape[0]))
                if shape in mm_recompute_shapes:
                    return CheckpointPolicy.PREFER_RECOMPUTE
                meta[key] += 1
            if func in save_ops:
                if func in mm_ops and meta[key] % 2 == 0:
                    out = CheckpointPolicy.PREFER_RECOMPUTE
                else:
                    out = CheckpointPolicy.MUST_SAVE
            else:
                out = CheckpointPolicy.PREFER_RECOMPUTE
            if LOG is not None and func in save_ops:
                LOG.append((mode, str(func), out.name))
            return out

        return wrapped_policy

    return make


def titan_selective_op_kwargs(model) -> dict:
    """`gradient_checkpointing_kwargs` that make transformers' per-layer checkpoint torchtitan's
    selective-op AC."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    save_ops = titan_save_ops()
    # force_recompute_mm_shapes_by_fqns = ["moe.router.gate"] (torchtitan's default): matched
    # against the layers' module names; HF models have none, so the set stays empty
    import torch.nn as nn

    shapes = set()
    for fqn, sub in model.named_modules():
        if "moe.router.gate" in fqn and isinstance(sub, nn.Linear):
            out_f, in_f = sub.weight.shape
            shapes.add((in_f, out_f))
    make = titan_policy_factory(save_ops, shapes)
    return {
        "use_reentrant": False,
        "early_stop": False,
        "preserve_rng_state": True,
        "context_fn": lambda: create_selective_checkpoint_contexts(make()),
    }
