"""CPU references of the fused loss kernels users turn on, for the truth harness.

The kernels themselves are Triton (CUDA) and cannot run on CPU fake tensors.  Each reference below
allocates exactly the tensors its kernel's Python wrapper allocates (read from the pinned source,
cited per function) and replaces the Triton kernel, which works in registers and writes only into
the buffers it is given, by in-place PyTorch ops on those same buffers.  What is left over are
tensors of one element per token row (row maxima and sums, a few bytes per token), which the
kernels keep in registers; they are documented in tools/truth/README.md ("Fused losses").

* ``fused``: flash-attn's ``CrossEntropyLossFunction`` with ``inplace_backward=True``
  (flash-attention commit 058ad35a3914afd7408dd33c7d5f558a48f4bb05,
  ``flash_attn/ops/triton/cross_entropy.py``): saves the low-precision logits and an fp32
  log-sum-exp per row; backward writes the logits' gradient into the logits' own storage.
* ``fused-linear``: Liger-Kernel 0.8.5 (PyPI) ``LigerFusedLinearCrossEntropyFunction``
  (``liger_kernel/ops/fused_linear_cross_entropy.py``, ``fused_linear_cross_entropy_forward``) on
  its CUDA bf16/fp16 path (``_can_use_mm_out`` true: ``torch.mm(out=)`` into one persistent
  ``[chunk_size, V]`` logits buffer, ``torch.addmm(out=grad_weight)``): the logits of the whole
  batch never exist; ``grad_input`` ``[BT, H]`` and ``grad_weight`` ``[V, H]`` are computed in the
  forward and saved for backward.
"""
from __future__ import annotations

IGNORE_INDEX = -100


def liger_chunk_size(bt: int, hidden: int, vocab: int, chunk_mem_const: int = 1) -> int:
    """Liger 0.8.5 ``fused_linear_cross_entropy_forward``: ``inc_factor = cdiv(V, C * H)``,
    ``chunk_size = min(next_power_of_2(cdiv(BT, inc_factor)), BT)``."""
    inc = -(-vocab // (chunk_mem_const * hidden))
    rows = -(-bt // inc)
    p = 1
    while p < rows:
        p *= 2
    return min(p, bt)


def shift_labels(labels):
    """transformers ``ForCausalLMLoss`` / Liger ``LigerForCausalLMLoss``: pad with the ignore
    index and drop the first position (``labels[..., 1:].contiguous()``), flattened."""
    import torch.nn.functional as F

    labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)
    return labels[..., 1:].contiguous().view(-1)


def _flash_ce_function():
    import torch

    class FlashCrossEntropy(torch.autograd.Function):
        """flash-attn ``CrossEntropyLossFunction`` (see module docstring), ``inplace_backward=True``."""

        @staticmethod
        def forward(ctx, logits, labels):
            n_rows, n_cols = logits.shape
            if logits.stride(-1) != 1:
                logits = logits.contiguous()
            losses = torch.empty(n_rows, dtype=torch.float, device=logits.device)
            lse = torch.empty(n_rows, dtype=torch.float, device=logits.device)
            z_losses = torch.empty(n_rows, dtype=torch.float, device=logits.device)
            # the Triton forward kernel, a few rows at a time (at most ~1 MiB of fp32 scratch)
            step = max(1, (1 << 20) // (n_cols * 4))
            for r0 in range(0, n_rows, step):
                r1 = min(n_rows, r0 + step)
                block = logits[r0:r1].float()
                lse[r0:r1] = torch.logsumexp(block, dim=-1)
                del block
            valid = labels != IGNORE_INDEX
            picked = logits.gather(1, labels.clamp(min=0).unsqueeze(1)).squeeze(1).float()
            torch.sub(lse, picked, out=losses)
            losses.masked_fill_(~valid, 0.0)
            z_losses.zero_()
            del picked, valid
            ctx.save_for_backward(logits, lse, labels)
            ctx.mark_non_differentiable(z_losses)
            return losses, z_losses

        @staticmethod
        def backward(ctx, grad_losses, grad_z_losses):
            del grad_z_losses
            logits, lse, labels = ctx.saved_tensors
            dlogits = logits  # inplace_backward=True
            # the Triton backward kernel: softmax minus one-hot, times the row's upstream gradient
            dlogits.sub_(lse.unsqueeze(1)).exp_()
            valid = labels != IGNORE_INDEX
            rows = torch.arange(labels.shape[0], device=labels.device)
            idx = labels.clamp(min=0)
            dlogits[rows, idx] -= valid.to(dlogits.dtype)
            dlogits.mul_((grad_losses * valid).unsqueeze(1))
            return dlogits, None

    return FlashCrossEntropy


def flash_ce_causal_lm_loss(logits, labels, vocab_size: int, **kwargs):
    """A drop-in for transformers' ``model.loss_function``: the causal-LM shift of
    ``ForCausalLMLoss`` without the fp32 upcast, then flash-attn's fused cross-entropy over the
    low-precision logits (``flash_attn.losses.cross_entropy.CrossEntropyLoss(inplace_backward=True)``,
    reduction "mean": ``loss.sum() / (labels != ignore_index).sum()``)."""
    target = shift_labels(labels)
    losses, _z = _flash_ce_function().apply(logits.view(-1, vocab_size), target)
    return losses.sum() / (target != IGNORE_INDEX).sum()


def _liger_flce_function():
    import torch

    class LigerFLCE(torch.autograd.Function):
        """Liger ``LigerFusedLinearCrossEntropyFunction`` (see module docstring), reduction "mean",
        ``accum_dtype=None``, no bias, no softcap."""

        @staticmethod
        def forward(ctx, _input, weight, target, n_non_ignore):
            device = _input.device
            bt, h = _input.shape
            v = weight.shape[0]
            chunk_size = liger_chunk_size(bt, h, v)
            num_chunks = -(-bt // chunk_size)
            grad_input = torch.zeros_like(_input, device=device)
            grad_weight = torch.zeros_like(weight, device=device) if weight.requires_grad else None
            loss_1d = torch.zeros(bt, dtype=torch.float32, device=device)
            target_mask = target != IGNORE_INDEX
            # `total_n_non_ignore = target_mask.sum().item()` is data-dependent; the caller knows it
            logits_storage = torch.empty((chunk_size, v), dtype=_input.dtype, device=device)
            for chunk_id in range(num_chunks):
                start, end = chunk_id * chunk_size, min((chunk_id + 1) * chunk_size, bt)
                x_chunk = _input[start:end]
                logits_chunk = logits_storage[: end - start]
                torch.mm(x_chunk, weight.t(), out=logits_chunk)
                t_chunk = target[start:end]
                # liger_cross_entropy_kernel: loss and the gradient written over the logits
                valid = t_chunk != IGNORE_INDEX
                idx = t_chunk.clamp(min=0)
                m = logits_chunk.amax(dim=-1)
                picked = logits_chunk.gather(1, idx.unsqueeze(1)).squeeze(1)
                logits_chunk.sub_(m.unsqueeze(1)).exp_()
                d = logits_chunk.sum(dim=-1, dtype=torch.float32)
                row_loss = (d.log() + m.float() - picked.float()) * valid / n_non_ignore
                loss_1d[start:end] = row_loss
                logits_chunk.div_(d.unsqueeze(1))
                rows = torch.arange(end - start, device=device)
                logits_chunk[rows, idx] -= valid.to(logits_chunk.dtype)
                logits_chunk.mul_((valid.to(torch.float32) / n_non_ignore).unsqueeze(1))
                del m, picked, d, row_loss, rows, valid, idx
                torch.mm(logits_chunk, weight, out=grad_input[start:end])
                if grad_weight is not None:
                    torch.addmm(grad_weight, logits_chunk.t(), x_chunk, out=grad_weight)
                del logits_chunk, x_chunk, t_chunk
            del logits_storage
            loss = torch.sum(loss_1d)
            del target_mask
            ctx.save_for_backward(
                grad_input.detach(), grad_weight.detach() if grad_weight is not None else None
            )
            return loss

        @staticmethod
        def backward(ctx, grad_output):
            grad_input, grad_weight = ctx.saved_tensors
            # fused_linear_cross_entropy_backward: element_mul_kernel in place when grad_output != 1
            # (the comparison is data-dependent; an in-place multiply by 1 allocates nothing either)
            grad_input.mul_(grad_output)
            if grad_weight is not None:
                grad_weight.mul_(grad_output)
            return grad_input, grad_weight, None, None

    return LigerFLCE


def liger_causal_lm_forward(n_non_ignore: int, on_head=None):
    """A forward for a ``*ForCausalLM`` instance like Liger's ``lce_forward``
    (``liger_kernel/transformers/model/llama.py``): the decoder, then ``LigerForCausalLMLoss``
    (``liger_kernel/transformers/model/loss_utils.py``) on the final hidden states and
    ``lm_head.weight`` -- the LM head's forward never runs and no logits are returned.
    ``on_head()`` is called where the LM head would start (the harness's phase boundary)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    def forward(self, input_ids=None, labels=None, position_ids=None, use_cache=None, **kwargs):
        outputs = self.base_model(input_ids=input_ids, position_ids=position_ids, use_cache=use_cache)
        hidden_states = outputs.last_hidden_state
        if on_head is not None:
            on_head()
        target = shift_labels(labels)
        loss = _liger_flce_function().apply(
            hidden_states.view(-1, self.config.hidden_size), self.lm_head.weight, target, n_non_ignore
        )
        return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=outputs.past_key_values)

    return forward


def selftest() -> None:
    """The references compute what ``torch.nn.functional.cross_entropy`` computes (loss and
    gradients), on real CPU tensors: ``python tools/truth/kernels.py``."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        bt, h, v = 300, 64, 1000  # several Liger chunks (cdiv(1000, 64) = 16 -> chunk 32 rows)
        x = torch.randn(bt, h, dtype=dtype, requires_grad=True)
        w = (torch.randn(v, h) / h**0.5).to(dtype).requires_grad_(True)
        labels = torch.randint(0, v, (bt,))
        labels[::7] = IGNORE_INDEX
        n = int((labels != IGNORE_INDEX).sum())
        ref = F.cross_entropy((x @ w.t()).float(), labels, ignore_index=IGNORE_INDEX)
        gx, gw = torch.autograd.grad(ref, (x, w))
        # fused: flash-attn cross-entropy over low-precision logits, gradient in place
        logits = x @ w.t()
        losses, _ = _flash_ce_function().apply(logits, labels)
        fused = losses.sum() / n
        fx, fw = torch.autograd.grad(fused, (x, w))
        # fused-linear: Liger's chunked algorithm
        flce = _liger_flce_function().apply(x, w, labels, n)
        lx, lw = torch.autograd.grad(flce, (x, w))
        for name, loss, a, b in (("fused", fused, fx, fw), ("fused-linear", flce, lx, lw)):
            err = max(
                abs(float(loss) - float(ref)) / abs(float(ref)),
                float((a.float() - gx.float()).abs().max() / gx.float().abs().max()),
                float((b.float() - gw.float()).abs().max() / gw.float().abs().max()),
            )
            status = "ok" if err < tol else "FAIL"
            print(f"{status} {name} {dtype}: max relative error {err:.2e} (tolerance {tol:.0e})")
            if err >= tol:
                raise SystemExit(1)


if __name__ == "__main__":
    selftest()
