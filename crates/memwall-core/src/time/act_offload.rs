//! Activation offloading's host traffic (`--activation-offload`).

use super::collective::{CollectiveKind, LinkKind};
use super::comm::Comm;
use super::Collective;
use crate::memory::Kernels;

impl Comm<'_> {
    /// `torch.autograd.graph.save_on_cpu(pin_memory=True)` (torch/autograd/graph.py): every
    /// saved tensor is copied to pinned host memory in the forward (`packed.copy_(tensor,
    /// non_blocking=True)`) and back in the backward (`tensor.to(device, non_blocking=True)`).
    /// Both copies are issued on the current stream, the one the compute runs on, so nothing
    /// overlaps them: each micro-batch moves the saved bytes over PCIe twice, fully exposed. The
    /// bytes are the memory replay's (the host bytes its packed tensors hold,
    /// `TrainEstimate::host_offload_bytes`); the link is the same host link (and efficiency)
    /// as ZeRO's optimizer offload ([`Comm::offload`]). Returns the seconds added to the step.
    pub(super) fn activation_offload(&mut self) -> f64 {
        if !self.workload.step_options.activation_offload {
            return 0.0;
        }
        // the memory side refuses what it cannot simulate; no bytes, no time then
        let bytes = crate::memory::fast::simulate_train(self.model, self.workload, Kernels::Cuda)
            .map_or(0.0, |e| e.host_offload_bytes as f64);
        let link = self.hw.host_link() * self.eff.pcie_fraction;
        let seconds = 2.0 * bytes * self.micro_batches / link;
        self.out.push(Collective {
            name:
                "activation offload: saved tensors to host and back (PCIe, on the compute stream)"
                    .to_owned(),
            kind: CollectiveKind::SendRecv,
            group_size: 1,
            bytes_per_call: bytes,
            calls_per_step: 2.0 * self.micro_batches,
            link: LinkKind::Pcie,
            seconds,
            exposed_seconds: seconds,
        });
        seconds
    }
}
