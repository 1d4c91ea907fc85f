//! The per-rank sharding state the timeline builder carries (see [`super::dist`]).

use super::timeline::TensorId;

/// Whose data parallelism is simulated on the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShardKind {
    /// PyTorch DDP: full replica, gradient buckets.
    Ddp {
        /// `gradient_as_bucket_view=True`: `.grad` are views into the buckets.
        bucket_view: bool,
        /// torch's composable `replicate` (FSDP2's machinery at world size 1 per replica):
        /// as `bucket_view`, but a unit's gradients live until its post-backward.
        replicate: bool,
    },
    /// PyTorch FSDP2 (`torch/distributed/fsdp/_fully_shard/`).
    Fsdp2 {
        /// `reshard_after_forward`.
        reshard_after_forward: bool,
        /// The root unit reshards after forward too (see `DistOptions`).
        root_reshard: bool,
    },
    /// DeepSpeed ZeRO (`deepspeed/runtime/zero/stage_1_and_2.py`, `stage3.py`).
    Zero {
        /// Stage 1, 2 or 3.
        stage: u8,
    },
}

/// What one rank of a data-parallel group keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShardSim {
    /// Runtime.
    pub kind: ShardKind,
    /// Ranks the model states are sharded over.
    pub world: u128,
    /// This rank's index in the shard group (rank 0 holds the largest chunks).
    pub rank: u128,
    /// Bytes per element of the sharded parameter the optimizer updates (FSDP2: the sharded
    /// parameter itself; ZeRO: its fp32 master partition).
    pub master_size: u128,
    /// Bytes per element of the gradient reduction buffers (FSDP2 `reduce_dtype`).
    pub reduce_size: u128,
    /// FSDP2 `MixedPrecisionPolicy(param_dtype=…)` differs from the sharded dtype: the
    /// all-gather input is a cast copy (`_fsdp_collectives.py` `_get_param_all_gather_inputs`).
    pub cast_params: bool,
    /// Optimizer states (and master weights, and sharded gradients) live on the host.
    pub offload_states: bool,
    /// Sharded parameters live on the host.
    pub offload_params: bool,
    /// DeepSpeed `reduce_bucket_size` (elements).
    pub bucket_elems: u128,
}

/// One parameter as the sharding sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShardParam {
    pub id: TensorId,
    pub numel: u128,
    pub dim0: u128,
    /// Second-to-last dimension (0 for a vector), as the optimizer sees the tensor.
    pub rows: u128,
    /// Last dimension (1 for a vector).
    pub cols: u128,
    pub trainable: bool,
    /// Bytes per element as the model computes with it (LoRA adapters are fp32 under peft).
    pub elem: u128,
}

impl ShardParam {
    /// Elements per dim-0 row.
    pub fn row(&self) -> u128 {
        super::hf::div(self.numel, self.dim0.max(1))
    }
}

/// One FSDP unit (`fully_shard` call) / ZeRO-3 fetch group: the root or a decoder layer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Unit {
    pub params: Vec<ShardParam>,
    /// The unsharded parameters are allocated.
    pub unsharded: bool,
    /// The unit's sharded gradient storage (FSDP2 reduce-scatter output).
    pub sharded_grad: Option<TensorId>,
}
