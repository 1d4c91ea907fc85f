//! Optimizers: one place that answers every question about one — its user-facing name, the
//! bytes of its states for a tensor it updates, the temporaries of its step, and which engines
//! run it.
//!
//! Every path asks here: the single-GPU `hf` timeline per parameter, the sharded paths
//! (FSDP2 per parameter shard, ZeRO per flat fp32 partition) and Megatron-LM per fp32 main
//! parameter. A path only says what tensor the optimizer sees (its elements, its bytes as
//! allocated, and whether it is a matrix); the accounting is the same everywhere, so an
//! optimizer's states per parameter agree across engines by construction. Which engine runs
//! which optimizer is the engine's capability row ([`crate::engine::Capabilities`]).

use crate::engine::Engine;
use crate::names::named_enum;

named_enum! {
    /// Optimizer and its implementation.
    pub enum Optimizer in "optimizer" {
        /// `torch.optim.AdamW(foreach=True)`.
        Adamw = "adamw": "torch AdamW, foreach (PyTorch's GPU default)",
        /// `torch.optim.AdamW(fused=True)`.
        AdamwFused = "adamw-fused": "torch AdamW, fused=True",
        /// `torch.optim.AdamW(foreach=False)`.
        AdamwForloop = "adamw-forloop": "torch AdamW, foreach=False",
        /// bitsandbytes `AdamW8bit` (blockwise-quantised states).
        Adamw8bit = "adamw-8bit": "bitsandbytes AdamW8bit",
        /// `torch.optim.SGD(momentum=0, foreach=True)`.
        Sgd = "sgd": "torch SGD without momentum",
        /// `torch.optim.SGD(momentum=0.9, foreach=True)`.
        SgdMomentum = "sgd-momentum": "torch SGD with momentum 0.9",
        /// `torch.optim.Adafactor(foreach=True)`.
        Adafactor = "adafactor": "torch Adafactor",
        /// lion-pytorch `Lion`.
        Lion = "lion": "Lion (lion-pytorch)",
    }
}

/// How the optimizer sees a tensor's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorShape {
    /// A vector, or a flat partition (ZeRO's `single_partition_of_fp32_groups`, Megatron's
    /// distributed-optimizer shards): no factoring.
    Flat,
    /// A tensor of shape `[.., rows, cols]` (leading dimensions = `numel / (rows · cols)`).
    Matrix {
        /// Size of the second-to-last dimension.
        rows: u128,
        /// Size of the last dimension.
        cols: u128,
    },
}

/// One tensor an optimizer updates, as it sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimTensor {
    /// Elements.
    pub numel: u128,
    /// Bytes of the tensor as allocated (its states are `zeros_like` it, so they take the
    /// same rounded block).
    pub bytes: u128,
    /// Its shape as the optimizer sees it.
    pub shape: TensorShape,
}

impl OptimTensor {
    /// A flat tensor (or vector) of `numel` elements taking `bytes`.
    pub const fn flat(numel: u128, bytes: u128) -> Self {
        OptimTensor {
            numel,
            bytes,
            shape: TensorShape::Flat,
        }
    }

    /// A parameter as the `hf` timeline describes it: `rows == 0` for a vector, else
    /// `[.., rows, cols]`.
    pub const fn param(numel: u128, bytes: u128, rows: u128, cols: u128) -> Self {
        OptimTensor {
            numel,
            bytes,
            shape: if rows == 0 {
                TensorShape::Flat
            } else {
                TensorShape::Matrix { rows, cols }
            },
        }
    }
}

/// bitsandbytes `min_8bit_size` default: smaller tensors keep fp32 states
/// (`bitsandbytes/optim/optimizer.py`, `Optimizer2State.init_state`).
pub const BNB_MIN_8BIT_SIZE: u128 = 4096;

/// bitsandbytes block-wise quantisation block: one fp32 `absmax` per 256 elements
/// (`Optimizer2State.init_state`, `blocksize = 256`).
pub const BNB_BLOCK: u128 = 256;

impl Optimizer {
    /// Optimizer-state bytes of one tensor, once they exist (from the first step on).
    ///
    /// - AdamW (`torch/optim/adamw.py`): `exp_avg` and `exp_avg_sq`, `zeros_like` the
    ///   parameter: 2 × its bytes;
    /// - bitsandbytes `AdamW8bit` (`bitsandbytes/optim/optimizer.py`,
    ///   `Optimizer2State.init_state`): two uint8 states with one fp32 absmax per 256-element
    ///   block; tensors under `min_8bit_size` = 4096 elements keep two fp32 states;
    /// - SGD: none without momentum, one `momentum_buffer` with (`torch/optim/sgd.py`);
    /// - Lion (lion-pytorch `lion_pytorch.py`): one `exp_avg`;
    /// - Adafactor (`torch/optim/_adafactor.py`): a matrix keeps `row_var` `[.., rows, 1]`
    ///   and `col_var` `[.., 1, cols]` in its dtype; a vector (or a flat partition) keeps a full
    ///   `variance`.
    pub fn state_bytes(self, t: OptimTensor) -> u128 {
        match self {
            Optimizer::Adamw | Optimizer::AdamwFused | Optimizer::AdamwForloop => 2 * t.bytes,
            Optimizer::Adamw8bit => {
                if t.numel < BNB_MIN_8BIT_SIZE {
                    2 * t.numel * 4
                } else {
                    2 * (t.numel + t.numel.div_ceil(BNB_BLOCK) * 4)
                }
            }
            Optimizer::Sgd => 0,
            Optimizer::SgdMomentum | Optimizer::Lion => t.bytes,
            Optimizer::Adafactor => match t.shape {
                TensorShape::Flat => t.bytes,
                TensorShape::Matrix { rows, cols } => {
                    let elem = t.bytes / t.numel.max(1);
                    let lead = t.numel / (rows * cols).max(1);
                    elem * lead * (rows + cols)
                }
            },
        }
    }

    /// State bytes of a flat tensor of `numel` elements of `elem_bytes` each (a ZeRO or
    /// Megatron partition, an FSDP2 shard seen element-wise).
    pub fn flat_state_bytes(self, numel: u128, elem_bytes: u128) -> u128 {
        self.state_bytes(OptimTensor::flat(numel, numel * elem_bytes))
    }

    /// States per element for the element-wise optimizers (AdamW 2, SGD with momentum and
    /// Lion 1, SGD 0); `None` for those whose states depend on the tensor's shape or size
    /// (bitsandbytes 8-bit blocks, Adafactor's factoring) — ask [`Optimizer::state_bytes`].
    pub const fn elementwise_states(self) -> Option<u128> {
        match self {
            Optimizer::Adamw | Optimizer::AdamwFused | Optimizer::AdamwForloop => Some(2),
            Optimizer::SgdMomentum | Optimizer::Lion => Some(1),
            Optimizer::Sgd => Some(0),
            Optimizer::Adamw8bit | Optimizer::Adafactor => None,
        }
    }

    /// Bytes of the temporaries the step allocates, given the bytes of every tensor it updates
    /// (one list: the implementation's temporaries are freed before the next one starts);
    /// `None` for implementations that allocate none.
    ///
    /// - foreach AdamW (`torch/optim/adamw.py` → `adam.py` `_multi_tensor_adam`):
    ///   `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`, one tensor-sized list alive at once;
    ///   everything else in place;
    /// - for-loop AdamW (`_single_tensor_adam`): `denom = (exp_avg_sq.sqrt() /
    ///   bias_correction2_sqrt).add_(eps)` allocates the square root and the division for one
    ///   tensor at a time, while the loop's `denom` still holds the previous parameter's
    ///   (rebound only when the division returns): the largest `previous + 2 × current` over
    ///   the parameters in order ([`Optimizer::forloop_step_temporaries`]);
    /// - Lion (lion-pytorch `update_fn`): `exp_avg.clone().mul_(beta1).add(grad, …)`: two
    ///   tensors for one parameter at a time;
    /// - foreach Adafactor (`_multi_tensor_adafactor`): `var_estimates` (`row_var @ col_var`,
    ///   or `variance.clone()` for vectors) is one tensor-sized list, then updated in place;
    /// - fused AdamW, foreach SGD (in place) and the bitsandbytes kernels: none.
    pub fn step_temporary_bytes(self, tensor_bytes: &[u128]) -> Option<u128> {
        if self == Optimizer::AdamwForloop {
            return Some(Self::forloop_step_temporaries(tensor_bytes.iter().copied()));
        }
        self.step_temporaries(
            tensor_bytes.iter().sum(),
            tensor_bytes.iter().copied().max().unwrap_or(0),
        )
    }

    /// For-loop AdamW's temporaries over the parameters in the optimizer's order: the square
    /// root and the division of the current one while `denom`, a local of
    /// `_single_tensor_adam`'s loop (torch/optim/adam.py), still holds the previous one's.
    pub fn forloop_step_temporaries(bytes_in_order: impl IntoIterator<Item = u128>) -> u128 {
        let mut prev = 0;
        let mut peak = 0;
        for b in bytes_in_order {
            peak = peak.max(prev + 2 * b);
            prev = b;
        }
        peak
    }

    /// [`Optimizer::step_temporary_bytes`] from the two numbers it depends on: the bytes of
    /// all the tensors the step updates and of the largest one (for-loop AdamW: an upper
    /// bound, see [`Optimizer::forloop_step_temporaries`] for the exact, order-dependent one).
    pub fn step_temporaries(self, total_bytes: u128, largest_bytes: u128) -> Option<u128> {
        match self {
            Optimizer::Adamw | Optimizer::Adafactor => Some(total_bytes),
            Optimizer::AdamwForloop | Optimizer::Lion => Some(2 * largest_bytes),
            Optimizer::AdamwFused
            | Optimizer::Sgd
            | Optimizer::SgdMomentum
            | Optimizer::Adamw8bit => None,
        }
    }

    /// Whether `engine` runs this optimizer (its capability row).
    pub fn supported_by(self, engine: Engine) -> bool {
        engine.capabilities().optimizers.allowed.contains(&self)
    }

    /// Every engine that runs this optimizer.
    pub fn engines(self) -> Vec<Engine> {
        Engine::ALL
            .iter()
            .copied()
            .filter(|e| self.supported_by(*e))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adam_keeps_two_states_of_the_tensor() {
        let t = OptimTensor::param(4096 * 11008, 4096 * 11008 * 2, 11008, 4096);
        assert_eq!(Optimizer::Adamw.state_bytes(t), 4 * 4096 * 11008);
        assert_eq!(Optimizer::Adamw.elementwise_states(), Some(2));
    }

    #[test]
    fn adafactor_factors_matrices_and_keeps_vectors_whole() {
        // [E=8, 1408, 2048] bf16 experts: row_var 8·1408 + col_var 8·2048, 2 bytes each
        let numel = 8 * 1408 * 2048;
        let t = OptimTensor::param(numel, numel * 2, 1408, 2048);
        assert_eq!(Optimizer::Adafactor.state_bytes(t), 2 * 8 * (1408 + 2048));
        assert_eq!(
            Optimizer::Adafactor.state_bytes(OptimTensor::flat(4096, 8192)),
            8192
        );
    }

    #[test]
    fn eight_bit_states_are_blockwise_with_small_tensors_in_fp32() {
        assert_eq!(Optimizer::Adamw8bit.flat_state_bytes(4095, 2), 2 * 4095 * 4);
        assert_eq!(
            Optimizer::Adamw8bit.flat_state_bytes(4096 * 4096, 2),
            2 * (4096 * 4096 + 4096 * 4096 / 256 * 4)
        );
    }

    #[test]
    fn elementwise_optimizers_agree_with_their_state_count() {
        for (o, _) in Optimizer::ALL {
            if let Some(n) = o.elementwise_states() {
                for (numel, elem) in [(1u128, 4u128), (4095, 2), (1 << 20, 4)] {
                    assert_eq!(o.flat_state_bytes(numel, elem), n * numel * elem, "{o}");
                }
            }
        }
    }

    #[test]
    fn step_temporaries_follow_the_implementation() {
        let sizes = [10, 30, 20];
        assert_eq!(Optimizer::Adamw.step_temporary_bytes(&sizes), Some(60));
        // 30's square root and division while `denom` still holds 10's (or 20's while 30's)
        assert_eq!(
            Optimizer::AdamwForloop.step_temporary_bytes(&sizes),
            Some(70)
        );
        assert_eq!(Optimizer::Lion.step_temporary_bytes(&[10, 40]), Some(80));
        assert_eq!(Optimizer::AdamwFused.step_temporary_bytes(&sizes), None);
        assert_eq!(Optimizer::Adamw8bit.step_temporary_bytes(&sizes), None);
    }

    #[test]
    fn every_optimizer_runs_on_the_single_gpu_path() {
        for (o, _) in Optimizer::ALL {
            assert!(o.engines().contains(&Engine::Hf), "{o}");
        }
    }
}
