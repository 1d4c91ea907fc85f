"""Activation offloading to host memory, as `torch.autograd.graph.save_on_cpu(pin_memory=True)`
around the model's forward (`with save_on_cpu(pin_memory=True): loss = model(**batch).loss`,
then `loss.backward()` outside it), measured on fake tensors.

torch 2.15 `torch/autograd/graph.py` `save_on_cpu`:

    def pack_to_cpu(tensor):
        packed = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                             pin_memory=is_pinnable)
        packed.copy_(tensor, non_blocking=is_pinnable)
        return (tensor.device, packed)

    def unpack_from_cpu(packed):
        device, tensor = packed
        return tensor.to(device, non_blocking=pin_memory)

Every tensor autograd saves while the hooks are active (activations, outputs saved by their own
op, parameters and their views such as `mm`'s `weight.t()`) is copied into a new host tensor of
its logical size; the device tensor is then referenced only by whatever else holds it.  In
backward each saved tensor is unpacked by a copy back to the device, alive while its node's
backward runs.

The harness's "device" is the CPU, so the host copies cannot be CPU tensors (MemTracker would
count them as device memory).  `SaveOnHost` is `save_on_cpu` with the host tensor made on the
`meta` device, which MemTracker files under its own device (the CPU peak never sees it), and the
unpack made as `torch.empty` of the same size, dtype and layout on the tensor's device — what
`.to(device)` of a contiguous host tensor allocates.  No data moves (fake tensors have none).
"""
from __future__ import annotations

import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes


def _is_fake(t) -> bool:
    return isinstance(t, FakeTensor)


class SaveOnHost(torch.autograd.graph.saved_tensors_hooks):
    def __init__(self) -> None:
        self.host_live = 0
        self.host_peak = 0

        def pack(tensor):
            packed = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, device="meta")
            n = packed.numel() * packed.element_size()
            self.host_live += n
            self.host_peak = max(self.host_peak, self.host_live)
            weakref.finalize(packed, self._free, n)
            data = None
            if not _is_fake(tensor):
                # real tensors (tools/truth/crosscheck.py): the values must come back (labels
                # index the logits); keep them in a copy made with every dispatch mode off, so
                # MemTracker never sees it -- it stands for the host copy
                with _disable_current_modes():
                    data = tensor.detach().clone()
            return (tensor.device, packed, data)

        def unpack(p):
            device, packed, data = p
            out = torch.empty(packed.size(), dtype=packed.dtype, layout=packed.layout, device=device)
            if data is not None:
                with _disable_current_modes():
                    out.copy_(data)  # in place: no allocation
            return out

        super().__init__(pack, unpack)

    def _free(self, n: int) -> None:
        self.host_live -= n
