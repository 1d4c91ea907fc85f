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


# ----------------------------------------------------------------------------------------------
# Liger's layer kernels (``use_liger_kernel=True``): RMSNorm, SwiGLU / GeGLU, RoPE
# ----------------------------------------------------------------------------------------------
#
# Liger-Kernel 0.8.5 (PyPI), the default Triton implementations on CUDA (``liger_kernel/ops/__init__.py``
# selects no other backend on "cuda"; ``liger_kernel/ops/backends/_triton/rope.py`` is the dispatcher's
# fallback when the optional CuTe DSL is not installed, which a plain ``pip install liger-kernel`` does
# not install).  Each autograd Function below allocates what the Liger wrapper allocates; the Triton
# kernel body works in registers and writes only into the buffers it is handed.  The body runs here only
# on real tensors (the self-test): a fake tensor has no values, and running the math as PyTorch ops on
# fake tensors would show PyTorch's temporaries, which the Triton kernel does not have.

#: ``torch.cuda.get_device_properties(X.device).multi_processor_count`` of an H100 SXM5: the rows of
#: ``rms_norm_backward``'s fp32 partial weight-gradient buffer ``_dW`` (``ops/rms_norm.py``).  On a CPU
#: device Liger uses 1; the simulator models the GPU's buffer with this count.
LIGER_SM_COUNT = 132


def _is_fake(*tensors) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(t, FakeTensor) for t in tensors)


def _liger_rms_norm_function():
    import torch

    class LigerRMSNormRef(torch.autograd.Function):
        """``LigerRMSNormFunction`` (``ops/rms_norm.py``): forward allocates ``Y`` (input dtype) and
        ``RSTD`` (fp32 per row, casting modes llama/gemma) and saves ``X, W, RSTD``; backward
        allocates ``_dW [sm_count, H]`` fp32 (only when the weight needs a gradient), writes ``dX``
        over ``dY`` (``in_place=True``, the default except Gemma 2/3) and returns
        ``_dW.sum(0).to(W.dtype)``."""

        @staticmethod
        def forward(ctx, X, W, eps, offset=0.0, casting_mode="llama", in_place=True):
            X = X.contiguous()  # @ensure_contiguous
            shape = X.shape
            X = X.view(-1, shape[-1])
            n_rows, n_cols = X.shape
            Y = torch.empty((n_rows, n_cols), dtype=X.dtype, device=X.device)
            RSTD = torch.empty(n_rows, dtype=torch.float32, device=X.device)
            if not _is_fake(X, W):
                xf = X.float()
                RSTD.copy_(torch.rsqrt(xf.pow(2).mean(-1) + eps))
                if casting_mode == "llama":
                    Y.copy_((xf * RSTD[:, None]).to(X.dtype) * (offset + W))
                else:  # gemma: everything in fp32, one cast
                    Y.copy_((xf * RSTD[:, None] * (offset + W.float())).to(X.dtype))
            ctx.offset, ctx.casting_mode, ctx.in_place = offset, casting_mode, in_place
            ctx.save_for_backward(X, W, RSTD)
            return Y.view(*shape)

        @staticmethod
        def backward(ctx, dY):
            dY = dY.contiguous()  # @ensure_contiguous
            X, W, RSTD = ctx.saved_tensors
            shape = dY.shape
            dY = dY.view(-1, shape[-1])
            n_rows, n_cols = dY.shape
            needs_dw = ctx.needs_input_grad[1]
            _dW = torch.empty((LIGER_SM_COUNT, n_cols), dtype=torch.float32, device=W.device) if needs_dw else None
            dX = dY if ctx.in_place else torch.zeros_like(dY)
            if not _is_fake(dY, X):
                xf = X.float()
                w = W.float() + ctx.offset
                dy = dY.float()
                m = dy * w
                r = RSTD[:, None]
                dx = r * m - r * (r * r / n_cols) * (m * xf).sum(-1, keepdim=True) * xf
                if needs_dw:
                    if ctx.casting_mode == "llama":
                        part = dy * (xf * r).to(X.dtype).float()
                    else:
                        part = dy * (xf * r)
                    _dW.zero_()
                    _dW[0].copy_(part.sum(0))  # the per-program partial sums, summed below
                dX.copy_(dx.to(X.dtype))
            dW = _dW.sum(dim=0).to(W.dtype) if needs_dw else None
            return dX.view(*shape), dW, None, None, None, None

    return LigerRMSNormRef


def _liger_glu_function(gelu: bool):
    import torch

    class LigerGLURef(torch.autograd.Function):
        """``LigerSiLUMulFunction`` (``ops/swiglu.py``) / ``LigerGELUMulFunction``
        (``ops/geglu.py``, tanh GELU): forward allocates ``c = empty_like(a)`` and saves ``a, b``;
        backward recomputes the activation and writes ``da`` over ``a`` and ``db`` over ``b``,
        which it returns as the gradients (no allocation)."""

        @staticmethod
        def _act(a):
            import torch.nn.functional as F

            return F.gelu(a, approximate="tanh") if gelu else F.silu(a)

        @staticmethod
        def forward(ctx, a, b):
            a, b = a.contiguous(), b.contiguous()  # @ensure_contiguous
            shape = a.shape
            a, b = a.view(-1, shape[-1]), b.view(-1, shape[-1])
            c = torch.empty_like(a)
            if not _is_fake(a, b):
                c.copy_(LigerGLURef._act(a.float()).to(b.dtype) * b)
            ctx.save_for_backward(a, b)
            return c.view(*shape)

        @staticmethod
        def backward(ctx, dc):
            dc = dc.contiguous()  # @ensure_contiguous
            a, b = ctx.saved_tensors
            shape = dc.shape
            if not _is_fake(dc, a):
                with torch.enable_grad():
                    af = a.float().detach().requires_grad_(True)
                    act = LigerGLURef._act(af)
                    (dact,) = torch.autograd.grad(act, af, dc.view_as(a).float() * b.float())
                db = dc.view_as(a).float() * act.detach()
                a.copy_(dact.to(a.dtype))
                b.copy_(db.to(b.dtype))
            return a.view(*shape), b.view(*shape)

    return LigerGLURef


def _rotate_half(x):
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _liger_rope_function():
    import torch

    class LigerRopeRef(torch.autograd.Function):
        """``LigerRopeFunction`` (``ops/rope.py``): q and k are transposed back to their physical
        ``[B, S, heads, D]`` layout, ``.contiguous()`` (a no-op for projection outputs) and rotated in
        place; ``cos, sin`` are saved; the outputs are views of the inputs.  Backward rotates
        ``dq.transpose(1, 2).contiguous()`` and ``dk...`` in place (a copy only where the incoming
        gradient is not in that layout)."""

        @staticmethod
        def _squeeze(cos, sin, unsqueeze_dim):
            if cos.ndim == 4:
                if cos.shape[unsqueeze_dim] == 1:
                    cos, sin = cos.squeeze(unsqueeze_dim), sin.squeeze(unsqueeze_dim)
                else:
                    cos, sin = cos.squeeze(1), sin.squeeze(1)
            if cos.ndim == 2:
                cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
            return cos, sin

        @staticmethod
        def _rotate(x, cos, sin, backward):
            # x [B, S, H, D] in place; cos/sin [B or 1, S, D]
            c = cos[:, :, None, :].to(torch.float32)
            s = sin[:, :, None, :].to(torch.float32)
            xf = x.float()
            y = xf * c - _rotate_half(xf * s) if backward else xf * c + _rotate_half(xf) * s
            x.copy_(y.to(x.dtype))

        @staticmethod
        def forward(ctx, q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            cos, sin = LigerRopeRef._squeeze(cos, sin, unsqueeze_dim)
            q = q.transpose(1, 2).contiguous()
            k = k.transpose(1, 2).contiguous()
            cos, sin = cos.contiguous(), sin.contiguous()
            if not _is_fake(q, k):
                LigerRopeRef._rotate(q, cos, sin, False)
                LigerRopeRef._rotate(k, cos, sin, False)
            ctx.save_for_backward(cos, sin)
            return q.transpose(1, 2), k.transpose(1, 2)

        @staticmethod
        def backward(ctx, dq, dk):
            cos, sin = ctx.saved_tensors
            dq = dq.transpose(1, 2).contiguous()
            dk = dk.transpose(1, 2).contiguous()
            if not _is_fake(dq, dk):
                LigerRopeRef._rotate(dq, cos, sin, True)
                LigerRopeRef._rotate(dk, cos, sin, True)
            return dq.transpose(1, 2), dk.transpose(1, 2), None, None, None, None

    return LigerRopeRef


def liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """``liger_kernel.transformers.rope.liger_rotary_pos_emb`` with the reference Function."""
    return _liger_rope_function().apply(q, k, cos, sin, position_ids, unsqueeze_dim)


#: The families whose Liger patch the harness mirrors: ``model_type`` -> (RMSNorm casting mode,
#: offset, in_place, GLU activation, whether the q/k norms are patched).  From
#: ``liger_kernel/transformers/monkey_patch.py`` ``apply_liger_kernel_to_{llama,mistral,qwen2,qwen3,gemma}``.
LIGER_FAMILIES = {
    "llama": ("llama", 0.0, True, "silu", False),
    "mistral": ("llama", 0.0, True, "silu", False),
    "qwen2": ("llama", 0.0, True, "silu", False),
    "qwen3": ("llama", 0.0, True, "silu", True),
    "gemma": ("gemma", 1.0, True, "gelu", False),
}


def apply_liger_to_instance(model) -> None:
    """What ``Trainer(args=TrainingArguments(use_liger_kernel=True))`` does to the model
    (``_apply_liger_kernel_to_instance`` -> ``apply_liger_kernel_to_<family>(model=model)`` with the
    defaults rope, rms_norm, swiglu/geglu, fused_linear_cross_entropy): ``apply_rotary_pos_emb`` of
    the modeling module is replaced, every decoder layer's norms and MLP get Liger's ``forward``
    bound to the instance (``_patch_rms_norm_module``, ``_patch_swiglu_module``,
    ``_patch_geglu_module``).  The causal-LM forward (``lce_forward``) is installed by the caller
    (``liger_causal_lm_forward``) because the harness marks the loss phase inside it."""
    import importlib
    import types

    mt = model.config.model_type
    if mt not in LIGER_FAMILIES:
        raise SystemExit(f"liger reference: no patch for model_type {mt}")
    casting, offset, in_place, act, qk_norm = LIGER_FAMILIES[mt]
    modeling = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
    modeling.apply_rotary_pos_emb = liger_rotary_pos_emb
    rms = _liger_rms_norm_function()
    glu = _liger_glu_function(act == "gelu")

    def patch_norm(module):
        eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", None) or 1e-6

        def forward(self, hidden_states):
            return rms.apply(hidden_states, self.weight, eps, offset, casting, in_place)

        module.forward = types.MethodType(forward, module)

    def patch_mlp(module):
        def forward(self, x):
            return self.down_proj(glu.apply(self.gate_proj(x), self.up_proj(x)))

        module.forward = types.MethodType(forward, module)

    base = getattr(model, model.base_model_prefix, model)
    patch_norm(base.norm)
    for layer in base.layers:
        patch_mlp(layer.mlp)
        patch_norm(layer.input_layernorm)
        patch_norm(layer.post_attention_layernorm)
        if qk_norm:
            patch_norm(layer.self_attn.q_norm)
            patch_norm(layer.self_attn.k_norm)


def liger_selftest() -> None:
    """The layer references compute what the transformers modules they replace compute (outputs and
    gradients), on real CPU tensors."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    worst = 0.0
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
        rows, h, inter = 64, 96, 160
        # RMSNorm, llama and gemma casting
        for casting, offset in (("llama", 0.0), ("gemma", 1.0)):
            x = torch.randn(2, rows // 2, h, dtype=dtype, requires_grad=True)
            w = (torch.rand(h) * 0.5 + 0.75).to(dtype).requires_grad_(True)
            xf = x.float()
            hn = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
            ref = (hn.to(dtype) * (offset + w)) if casting == "llama" else (hn * (offset + w.float())).to(dtype)
            g = torch.randn_like(ref)
            rx, rw = torch.autograd.grad(ref, (x, w), g)
            y = _liger_rms_norm_function().apply(x, w, 1e-6, offset, casting, True)
            lx, lw = torch.autograd.grad(y, (x, w), g.clone())
            err = max(
                float((y.float() - ref.float()).abs().max() / ref.float().abs().max()),
                float((lx.float() - rx.float()).abs().max() / rx.float().abs().max()),
                float((lw.float() - rw.float()).abs().max() / rw.float().abs().max()),
            )
            worst = max(worst, err)
            print(f"{'ok' if err < tol else 'FAIL'} rms_norm/{casting} {dtype}: {err:.2e}")
            if err >= tol:
                raise SystemExit(1)
        # SwiGLU / GeGLU
        for gelu in (False, True):
            a = torch.randn(rows, inter, dtype=dtype, requires_grad=True)
            b = torch.randn(rows, inter, dtype=dtype, requires_grad=True)
            act = F.gelu(a, approximate="tanh") if gelu else F.silu(a)
            ref = act * b
            g = torch.randn_like(ref)
            ra, rb = torch.autograd.grad(ref, (a, b), g)
            # the kernel overwrites its saved inputs with their gradients: give it copies
            a2, b2 = a.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
            c = _liger_glu_function(gelu).apply(a2 * 1, b2 * 1)
            la, lb = torch.autograd.grad(c, (a2, b2), g)
            err = max(
                float((c.float() - ref.float()).abs().max() / ref.float().abs().max()),
                float((la.float() - ra.float()).abs().max() / ra.float().abs().max()),
                float((lb.float() - rb.float()).abs().max() / rb.float().abs().max()),
            )
            worst = max(worst, err)
            print(f"{'ok' if err < tol else 'FAIL'} {'geglu' if gelu else 'swiglu'} {dtype}: {err:.2e}")
            if err >= tol:
                raise SystemExit(1)
        # RoPE: against transformers' apply_rotary_pos_emb (llama)
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        bsz, seq, heads, kvh, d = 2, 12, 4, 2, 16
        qp = torch.randn(bsz, seq, heads * d, dtype=dtype, requires_grad=True)
        kp = torch.randn(bsz, seq, kvh * d, dtype=dtype, requires_grad=True)
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        freqs = torch.arange(seq).float()[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), -1)[None]
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)

        def qk(qp, kp):
            return (
                qp.view(bsz, seq, heads, d).transpose(1, 2),
                kp.view(bsz, seq, kvh, d).transpose(1, 2),
            )

        rq, rk = apply_rotary_pos_emb(*qk(qp, kp), cos, sin)
        gq, gk = torch.randn_like(rq), torch.randn_like(rk)
        rqg, rkg = torch.autograd.grad((rq, rk), (qp, kp), (gq, gk))
        lq, lk = liger_rotary_pos_emb(*qk(qp * 1, kp * 1), cos, sin)
        lqg, lkg = torch.autograd.grad((lq, lk), (qp, kp), (gq.transpose(1, 2).contiguous().transpose(1, 2), gk.transpose(1, 2).contiguous().transpose(1, 2)))
        err = max(
            float((lq.float() - rq.float()).abs().max() / rq.float().abs().max()),
            float((lk.float() - rk.float()).abs().max() / rk.float().abs().max()),
            float((lqg.float() - rqg.float()).abs().max() / rqg.float().abs().max()),
            float((lkg.float() - rkg.float()).abs().max() / rkg.float().abs().max()),
        )
        worst = max(worst, err)
        print(f"{'ok' if err < tol else 'FAIL'} rope {dtype}: {err:.2e}")
        if err >= tol:
            raise SystemExit(1)


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
    liger_selftest()
