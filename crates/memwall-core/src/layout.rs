//! How a training job is laid out over GPUs: data-parallel sharding strategy, tensor / sequence /
//! pipeline / context / expert parallelism and offload — validated into a [`Layout`].
//!
//! The degrees multiply as in Megatron-LM (`megatron/core/parallel_state.py`,
//! `initialize_model_parallel`): `gpus = dp · tp · pp · cp`, and expert parallelism splits the
//! data-parallel (× context-parallel) ranks of the MoE layers, so `ep` must divide `dp · cp`.

use crate::engine::Engine;
use crate::error::CoreError;
use serde::Serialize;

crate::names::named_enum! {
    /// Data-parallel sharding strategy (what each data-parallel rank keeps of the model states).
    pub enum Strategy in "strategy" {
        /// PyTorch `DistributedDataParallel`: full replica plus gradient buckets.
        Ddp = "ddp": "PyTorch DDP",
        /// DeepSpeed ZeRO stage 1: optimizer states (and fp32 master weights) partitioned.
        Zero1 = "zero1": "DeepSpeed ZeRO-1 (Megatron's distributed optimizer with --tp/--pp)",
        /// DeepSpeed ZeRO stage 2: + gradients partitioned.
        Zero2 = "zero2": "DeepSpeed ZeRO-2",
        /// DeepSpeed ZeRO stage 3: + parameters partitioned, gathered per module.
        Zero3 = "zero3": "DeepSpeed ZeRO-3",
        /// PyTorch FSDP2 `fully_shard(reshard_after_forward=True)` (FULL_SHARD).
        FsdpFull = "fsdp-full": "PyTorch FSDP2, reshard after forward",
        /// PyTorch FSDP2 `fully_shard(reshard_after_forward=False)` (SHARD_GRAD_OP).
        FsdpGradOp = "fsdp-grad-op": "PyTorch FSDP2, no reshard after forward",
        /// PyTorch FSDP2 on a 2-D mesh (replicate across nodes, shard within a node).
        Hsdp = "hsdp": "PyTorch FSDP2 on a (nodes, gpus-per-node) mesh",
    }
}

impl Strategy {
    /// Whether the strategy is one of PyTorch FSDP2's.
    pub fn is_fsdp(self) -> bool {
        matches!(
            self,
            Strategy::FsdpFull | Strategy::FsdpGradOp | Strategy::Hsdp
        )
    }
}

crate::names::named_enum! {
    /// Pipeline schedule.
    pub enum Schedule in "schedule" {
        /// One-forward-one-backward (PipeDream-flush), Megatron's default.
        OneFOneB = "1f1b": "1F1B",
        /// Megatron's interleaved 1F1B with virtual stages.
        Interleaved = "interleaved": "interleaved 1F1B",
        /// GPipe: all forwards, then all backwards.
        Gpipe = "gpipe": "GPipe",
    }
}

crate::names::named_enum! {
    /// What is offloaded to host memory (or NVMe).
    pub enum Offload in "offload" {
        /// Nothing.
        None = "none": "nothing",
        /// Optimizer states and fp32 master weights (DeepSpeed `offload_optimizer`).
        Optimizer = "optimizer": "optimizer states + master weights",
        /// Parameters (DeepSpeed ZeRO-3 `offload_param`).
        Params = "params": "parameters (ZeRO-3)",
        /// Both (FSDP2's `CPUOffloadPolicy` moves parameters, gradients and states together).
        Both = "both": "both",
    }
}

crate::names::named_enum! {
    /// Where offloaded bytes go.
    pub enum OffloadDevice in "offload_device" {
        /// Pinned host memory.
        Cpu = "cpu": "pinned host memory",
        /// NVMe (DeepSpeed ZeRO-Infinity): host memory holds only the swap buffers.
        Nvme = "nvme": "NVMe (ZeRO-Infinity)",
    }
}

/// A validated layout of one training job over a cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layout {
    /// Total GPUs.
    pub gpus: u64,
    /// GPUs per node (for host memory per node and HSDP's shard group).
    pub gpus_per_node: u64,
    /// Data-parallel sharding strategy.
    pub strategy: Strategy,
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Megatron sequence parallelism (needs `tp > 1` to matter).
    pub sequence_parallel: bool,
    /// Pipeline-parallel degree.
    pub pp: u64,
    /// Pipeline schedule.
    pub schedule: Schedule,
    /// Virtual stages per pipeline rank (interleaved schedule).
    pub virtual_stages: u64,
    /// Context-parallel degree (sequence split across ranks in attention).
    pub cp: u64,
    /// Expert-parallel degree.
    pub ep: u64,
    /// Offload.
    pub offload: Offload,
    /// Offload target.
    pub offload_device: OffloadDevice,
}

/// Largest accepted cluster.
pub const MAX_GPUS: u64 = 1 << 20;

impl Layout {
    /// One GPU, nothing sharded.
    pub fn single() -> Self {
        Layout {
            gpus: 1,
            gpus_per_node: 1,
            strategy: Strategy::Ddp,
            tp: 1,
            sequence_parallel: false,
            pp: 1,
            schedule: Schedule::OneFOneB,
            virtual_stages: 1,
            cp: 1,
            ep: 1,
            offload: Offload::None,
            offload_device: OffloadDevice::Cpu,
        }
    }

    /// Data-parallel degree: `gpus / (tp · pp · cp)`.
    pub fn dp(&self) -> u64 {
        self.gpus / (self.tp * self.pp * self.cp).max(1)
    }

    /// Whether the layout needs Megatron's model-parallel runtime (TP, PP, CP or EP > 1).
    pub fn model_parallel(&self) -> bool {
        self.tp > 1 || self.pp > 1 || self.cp > 1 || self.ep > 1
    }

    /// The size of the group that parameters/gradients/states are sharded over.
    pub fn shard_group(&self) -> u64 {
        match self.strategy {
            Strategy::Hsdp => self.gpus_per_node.min(self.dp()),
            _ => self.dp(),
        }
    }

    /// Checks the degrees against each other and the cluster; the error names the field, its
    /// value and what to do. Every field must matter: a setting that would be silently ignored
    /// (sequence parallelism without tensor parallelism, a pipeline schedule without a
    /// pipeline, an offload device without offload) is refused.
    pub fn validate(&self) -> Result<(), CoreError> {
        use crate::workload::limits::count;
        count("gpus", self.gpus, MAX_GPUS)?;
        count("gpus_per_node", self.gpus_per_node, MAX_GPUS)?;
        count("tp", self.tp, MAX_GPUS)?;
        count("pp", self.pp, MAX_GPUS)?;
        count("cp", self.cp, MAX_GPUS)?;
        count("ep", self.ep, MAX_GPUS)?;
        count("virtual_stages", self.virtual_stages, MAX_GPUS)?;
        // each degree ≤ 2^20, so the product ≤ 2^60 fits
        let mp = self.tp * self.pp * self.cp;
        if mp > MAX_GPUS || !self.gpus.is_multiple_of(mp) {
            return Err(CoreError::invalid_value(
                "gpus",
                self.gpus,
                format!(
                    "not a multiple of `tp` × `pp` × `cp` = {} × {} × {} = {mp}",
                    self.tp, self.pp, self.cp
                ),
                format!(
                    "`gpus` must equal dp × `tp` × `pp` × `cp` with dp ≥ 1: use a multiple of {mp}, or smaller degrees"
                ),
            ));
        }
        if self.gpus > self.gpus_per_node && !self.gpus.is_multiple_of(self.gpus_per_node) {
            return Err(CoreError::invalid_value(
                "gpus_per_node",
                self.gpus_per_node,
                format!(
                    "{} GPUs do not fill whole nodes of {}",
                    self.gpus, self.gpus_per_node
                ),
                "a cluster is whole nodes: make `gpus` a multiple of `gpus_per_node`",
            ));
        }
        let dp_cp = self.dp() * self.cp;
        if !dp_cp.is_multiple_of(self.ep) {
            return Err(CoreError::invalid_value(
                "ep",
                self.ep,
                format!("expert parallelism must divide dp·`cp` = {dp_cp}"),
                format!(
                    "Megatron-LM splits the data-parallel (× context-parallel) ranks into expert groups: pick an `ep` that divides {dp_cp}"
                ),
            ));
        }
        if self.sequence_parallel && self.tp < 2 {
            return Err(CoreError::refused(
                "sequence_parallel",
                "sequence parallelism splits along the tensor-parallel group, and `tp` is 1",
                "set `tp` to 2 or more, or drop `sequence_parallel`",
            ));
        }
        if self.virtual_stages > 1 && self.schedule != Schedule::Interleaved {
            return Err(CoreError::invalid_value(
                "virtual_stages",
                self.virtual_stages,
                "virtual stages exist only in the interleaved schedule",
                "set `schedule` to interleaved (with `pp` ≥ 2), or drop `virtual_stages`",
            ));
        }
        if self.schedule != Schedule::OneFOneB && self.pp < 2 {
            return Err(CoreError::invalid_value(
                "schedule",
                self.schedule.name(),
                "a pipeline schedule needs a pipeline, and `pp` is 1",
                "set `pp` to 2 or more, or drop `schedule`",
            ));
        }
        if self.schedule == Schedule::Interleaved && self.virtual_stages < 2 {
            return Err(CoreError::invalid_value(
                "virtual_stages",
                self.virtual_stages,
                "the interleaved schedule runs 2 or more model chunks per pipeline rank",
                "set `virtual_stages` to 2 or more, or use `schedule` 1f1b",
            ));
        }
        if self.strategy == Strategy::Hsdp
            && (self.gpus_per_node >= self.gpus || !self.gpus.is_multiple_of(self.gpus_per_node))
        {
            return Err(CoreError::invalid_value(
                "strategy",
                self.strategy.name(),
                format!(
                    "hsdp shards within a node and replicates across nodes, and {} GPUs are not several nodes of {}",
                    self.gpus, self.gpus_per_node
                ),
                "make `gpus` a multiple (> 1) of `gpus_per_node`, or use fsdp-full",
            ));
        }
        if self.offload_device == OffloadDevice::Nvme && self.offload == Offload::None {
            return Err(CoreError::invalid_value(
                "offload_device",
                "nvme",
                "nothing is offloaded, so there is nothing to put on NVMe",
                "set `offload` (optimizer, params or both) with `strategy` zero3, or drop `offload_device`",
            ));
        }
        // what the layout's engine runs: strategy (Megatron-LM's data parallelism), offload
        // kinds and devices — one table, `engine::TABLE`
        Engine::resolve(Some(self)).check_layout(self)
    }

    /// [`Layout::validate`], plus the checks that involve the step: with sequence parallelism
    /// Megatron-LM scatters the sequence over the tensor-parallel ranks, which needs `seq` to
    /// be a multiple of `tp` (`megatron/core/tensor_parallel/mappings.py`,
    /// `_split_along_first_dim`: "First dimension of the tensor should be divisible by tensor
    /// parallel size").
    pub fn validate_with(&self, w: &crate::workload::TrainWorkload) -> Result<(), CoreError> {
        self.validate()?;
        if self.sequence_parallel && !w.seq.is_multiple_of(self.tp) {
            return Err(CoreError::invalid_value(
                "seq",
                w.seq,
                format!(
                    "sequence parallelism splits the sequence over `tp` = {} ranks",
                    self.tp
                ),
                format!(
                    "use a `seq` that is a multiple of {}, or drop `sequence_parallel`",
                    self.tp
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(gpus: u64, tp: u64, pp: u64) -> Layout {
        Layout {
            gpus,
            gpus_per_node: 8,
            tp,
            pp,
            ..Layout::single()
        }
    }

    #[test]
    fn degrees_must_divide_the_cluster() {
        assert!(l(8, 2, 2).validate().is_ok());
        assert_eq!(l(8, 2, 2).dp(), 2);
        let e = l(8, 3, 1).validate().unwrap_err();
        assert!(matches!(e, CoreError::Invalid { field: "gpus", .. }), "{e}");
    }

    #[test]
    fn sharding_strategies_other_than_zero1_refuse_model_parallelism() {
        let mut x = l(8, 2, 1);
        x.strategy = Strategy::Zero3;
        assert!(matches!(
            x.validate(),
            Err(CoreError::Unsupported {
                field: "strategy",
                engine: "Megatron-LM",
                ..
            })
        ));
        x.strategy = Strategy::Zero1;
        assert!(x.validate().is_ok());
    }

    #[test]
    fn expert_parallelism_must_divide_data_parallel_ranks() {
        let mut x = l(8, 1, 1);
        x.ep = 3;
        assert!(matches!(
            x.validate(),
            Err(CoreError::Invalid { field: "ep", .. })
        ));
        x.ep = 4;
        assert!(x.validate().is_ok());
    }

    #[test]
    fn hsdp_needs_more_than_one_node() {
        let mut x = l(8, 1, 1);
        x.strategy = Strategy::Hsdp;
        assert!(x.validate().is_err());
        x.gpus = 16;
        assert!(x.validate().is_ok());
        assert_eq!(x.shard_group(), 8);
    }

    #[test]
    fn settings_that_would_be_ignored_are_refused() {
        let field = |x: &Layout| x.validate().err().and_then(|e| e.field());
        let mut x = l(8, 1, 1);
        x.sequence_parallel = true;
        assert_eq!(field(&x), Some("sequence_parallel"));
        x.tp = 2;
        assert_eq!(field(&x), None);
        let mut x = l(8, 1, 1);
        x.schedule = Schedule::Gpipe;
        assert_eq!(field(&x), Some("schedule"));
        x.pp = 2;
        assert_eq!(field(&x), None);
        x.schedule = Schedule::Interleaved;
        assert_eq!(field(&x), Some("virtual_stages"));
        x.virtual_stages = 2;
        assert_eq!(field(&x), None);
        let mut x = l(8, 1, 1);
        x.strategy = Strategy::Zero3;
        x.offload_device = OffloadDevice::Nvme;
        assert_eq!(field(&x), Some("offload_device"));
        x.offload = Offload::Params;
        assert_eq!(field(&x), None);
    }

    #[test]
    fn sequence_parallel_needs_seq_divisible_by_tp() {
        let mut x = l(8, 8, 1);
        x.sequence_parallel = true;
        let e = x
            .validate_with(&crate::workload::TrainWorkload::new(1, 7))
            .unwrap_err();
        assert_eq!((e.field(), e.value()), (Some("seq"), Some("7")));
        assert!(x
            .validate_with(&crate::workload::TrainWorkload::new(1, 8))
            .is_ok());
    }

    #[test]
    fn every_degree_is_bounded() {
        let mut x = l(8, 1, 1);
        x.gpus = u64::MAX;
        assert_eq!(x.validate().unwrap_err().field(), Some("gpus"));
        let mut x = l(8, 1, 1);
        x.tp = MAX_GPUS;
        x.pp = MAX_GPUS;
        assert_eq!(x.validate().unwrap_err().field(), Some("gpus"));
    }

    #[test]
    fn parameter_offload_needs_zero3() {
        let mut x = l(8, 1, 1);
        x.strategy = Strategy::Zero2;
        x.offload = Offload::Params;
        assert!(matches!(
            x.validate(),
            Err(CoreError::Unsupported {
                field: "offload",
                ..
            })
        ));
        x.strategy = Strategy::Zero3;
        assert!(x.validate().is_ok());
    }

    #[test]
    fn fsdp_offloads_everything_or_nothing() {
        // CPUOffloadPolicy moves parameters, gradients and states together: an optimizer-only
        // offload used to be accepted and simulated as `both`
        let mut x = l(8, 1, 1);
        x.strategy = Strategy::FsdpFull;
        x.offload = Offload::Optimizer;
        assert!(matches!(
            x.validate(),
            Err(CoreError::Unsupported {
                field: "offload",
                ..
            })
        ));
        x.offload = Offload::Both;
        assert!(x.validate().is_ok());
    }

    #[test]
    fn megatron_refuses_offload_it_does_not_simulate() {
        let mut x = l(8, 2, 1);
        x.strategy = Strategy::Zero1;
        x.offload = Offload::Optimizer;
        assert!(matches!(
            x.validate(),
            Err(CoreError::Unsupported {
                field: "offload",
                engine: "Megatron-LM",
                ..
            })
        ));
    }
}
