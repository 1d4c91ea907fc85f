//! torchtitan's op-level selective activation checkpointing (`--checkpointing-policy
//! selective-op`) inside a checkpointed decoder layer.
//!
//! torchtitan 0.3.0 (`torchtitan/distributed/activation_checkpoint.py`, `SelectiveAC`) wraps
//! each block in a non-reentrant `torch.utils.checkpoint` (`early_stop=False`) whose
//! `context_fn` is `create_selective_checkpoint_contexts(policy)`. PyTorch's SAC
//! (`torch/utils/checkpoint.py`, `_CachingTorchDispatchMode`) asks the policy about every op
//! the forward dispatches: a MUST_SAVE op's outputs are stored (detached aliases, so their
//! storage stays alive) until the recomputation in backward reaches the same op, which then
//! returns the stored tensors instead of running (`_CachedTorchDispatchMode`, the entry becomes
//! `_CONSUMED`); every other op runs again. torchtitan's policy (`_get_default_save_ops`,
//! `wrapped_policy`) saves the compute-intensive ops — `mm`, `addmm`, `bmm`, the SDPA kernels,
//! `topk`, `max` — except that `mm`/`linear` are counted per checkpoint call and every second
//! one is recomputed ("save every other mm"). On the CPU the truth harness runs, SDPA without
//! dropout is `_scaled_dot_product_flash_attention_for_cpu`, which stands for CUDA's flash /
//! efficient / cuDNN kernels (all saved; `tools/truth/titan_sac.py`).
//!
//! In the replay a checkpointed layer's forward runs without saving (as for full
//! checkpointing); each op the policy keeps holds its outputs in a per-layer cache
//! ([`Builder::sac_keep`]), and in the recomputation the same op releases them just before it
//! allocates its outputs ([`Builder::sac_pre`]): handing the stored tensors back costs the same
//! bytes as computing them anew, at the same instant.

use super::Builder;
use crate::memory::timeline::TensorId;

/// How the policy classifies a dispatched op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SacOp {
    /// `aten.mm` (an `nn.Linear` without a bias, a LoRA adapter): counted, every second one
    /// recomputed.
    Mm,
    /// A compute-intensive op that is always saved: `addmm` (a linear with a bias, GPT-2's
    /// `Conv1D`), `bmm` (eager attention, the SDPA math path), the fused SDPA kernels.
    Saved,
}

/// The SAC state of the checkpointed layer being run.
#[derive(Debug, Default)]
pub(super) struct Sac {
    /// Inside a checkpointed layer under `selective-op`: `Some(recompute)`.
    pass: Option<bool>,
    /// `mm` ops seen in this checkpoint call (torchtitan's `{mode}_mm_count`).
    mm_count: u64,
    /// The layer slot being run.
    slot: usize,
    /// Next cache entry the recomputation consumes.
    cursor: usize,
    /// Per layer slot: the outputs of each kept op of its last forward, in op order.
    cache: Vec<Vec<Vec<TensorId>>>,
}

impl Builder<'_> {
    /// Whether checkpointed layers run under torchtitan's op-level SAC.
    pub(super) fn sac_policy(&self) -> bool {
        self.mode
            .train()
            .is_some_and(|w| w.checkpointing && w.step_options.checkpointing_policy.saves_matmuls())
    }

    /// A checkpointed layer's forward (`recompute` false) or its recomputation starts.
    pub(super) fn sac_begin(&mut self, slot: usize, recompute: bool) {
        if !self.sac_policy() {
            return;
        }
        if self.sac.cache.len() <= slot {
            self.sac.cache.resize_with(slot + 1, Vec::new);
        }
        if !recompute {
            for group in std::mem::take(&mut self.sac.cache[slot]) {
                for t in group {
                    self.drop_(t);
                }
            }
        }
        self.sac.pass = Some(recompute);
        self.sac.mm_count = 0;
        self.sac.slot = slot;
        self.sac.cursor = 0;
    }

    /// The checkpointed layer's forward or recomputation returned. After the recomputation every
    /// entry has been consumed; anything left (none, when forward and recompute dispatch the
    /// same ops) goes with the checkpoint's frame.
    pub(super) fn sac_end(&mut self) {
        if self.sac.pass.take() == Some(true) {
            let left = std::mem::take(&mut self.sac.cache[self.sac.slot]);
            for group in left {
                for t in group {
                    self.drop_(t);
                }
            }
        }
    }

    /// Before an op the policy classifies as `op` is dispatched: whether its outputs are kept.
    /// In the recomputation a kept op's stored outputs are released here (the op returns them
    /// instead of allocating; the caller allocates their twins right after).
    pub(super) fn sac_pre(&mut self, op: SacOp) -> bool {
        let Some(recompute) = self.sac.pass else {
            return false;
        };
        let keep = match op {
            SacOp::Saved => true,
            SacOp::Mm => {
                self.sac.mm_count += 1;
                self.sac.mm_count % 2 == 1
            }
        };
        if keep && recompute {
            let slot = self.sac.slot;
            if let Some(group) = self.sac.cache[slot].get_mut(self.sac.cursor) {
                for t in std::mem::take(group) {
                    self.t.release(t);
                }
            }
            self.sac.cursor += 1;
        }
        keep
    }

    /// After a kept op of a checkpointed forward: its outputs stay alive in the SAC cache until
    /// the recomputation consumes them.
    pub(super) fn sac_keep(&mut self, keep: bool, outputs: &[TensorId]) {
        if !keep || self.sac.pass != Some(false) {
            return;
        }
        for &t in outputs {
            self.t.retain(t);
        }
        let slot = self.sac.slot;
        self.sac.cache[slot].push(outputs.to_vec());
    }
}

/// Refuses `selective-op` where the replay does not classify every op the policy sees: mixtures
/// of experts (router `mm`, `topk`, the experts' grouped matmuls), MLA and state-space mixers,
/// and fused layer kernels (Liger's Triton kernels are not ATen ops, so SAC never sees them).
pub(crate) fn check(
    model: &crate::model::ModelDesc,
    w: &crate::workload::TrainWorkload,
) -> Result<(), crate::error::CoreError> {
    use crate::model::{AttentionKind, Mlp};
    if !(w.checkpointing && w.step_options.checkpointing_policy.saves_matmuls()) {
        return Ok(());
    }
    let why = if model.layers.iter().any(|l| matches!(l.mlp, Mlp::Moe(_))) {
        Some("its mixture-of-experts layers (router, topk, expert matmuls) are not modelled under the op-level policy")
    } else if model.layers.iter().any(|l| l.mamba2().is_some()) {
        Some("its state-space mixers are not modelled under the op-level policy")
    } else if model
        .layers
        .iter()
        .any(|l| matches!(l.attention.kind, AttentionKind::Mla { .. }))
    {
        Some("its multi-head latent attention is not modelled under the op-level policy")
    } else if w.kernels.layers != crate::workload::KernelSet::Torch {
        Some("fused layer kernels are not ATen ops, so which outputs SAC keeps is not modelled")
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(crate::error::CoreError::invalid_value(
            crate::workload::CheckpointPolicy::FIELD,
            "selective-op",
            format!("`{}`: {why}", model.model_type),
            "use --checkpointing-policy full, every-k:K or selective-attn for this model (selective-op is modelled for dense attention models with --kernels torch)",
        )),
    }
}
