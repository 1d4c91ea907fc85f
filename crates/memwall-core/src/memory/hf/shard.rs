//! Data-parallel sharding on one rank: the hooks FSDP2, DeepSpeed ZeRO and DDP run around the
//! same transformers forward/backward the rest of the builder replays.
//!
//! FSDP2 follows `torch/distributed/fsdp/_fully_shard/` (torch 2.15): `_fsdp_param.py` (dim-0
//! chunks padded to rank 0's chunk), `_fsdp_collectives.py` (`foreach_all_gather`,
//! `foreach_all_gather_copy_out`, `foreach_reduce`) and `_fsdp_param_group.py` (`unshard`,
//! `reshard`, `pre_backward` with its one-unit backward prefetch, `post_backward` keeping one
//! reduce-scatter input in flight, `reduce_scatter_max_input_buffers = 1`).

use super::{div_ceil, mul, Builder};
use crate::memory::dist_types::{ShardKind, ShardParam, ShardSim, Unit};
use crate::memory::timeline::{Category, Marker, Node, SegKind, TensorId};
use crate::optimizer::OptimTensor;

impl Builder<'_> {
    /// Files a new parameter under the unit being built (only when sharding is simulated).
    pub(super) fn note_unit_param(
        &mut self,
        id: TensorId,
        numel: u128,
        dim0: u128,
        (rows, cols): (u128, u128),
        trainable: bool,
        elem: u128,
    ) {
        if self.train.shard.is_none() {
            return;
        }
        while self.train.units.len() <= self.train.cur_unit {
            self.push_unit();
        }
        self.train.units[self.train.cur_unit]
            .params
            .push(ShardParam {
                id,
                numel,
                dim0,
                rows,
                cols,
                trainable,
                elem,
            });
    }

    /// Appends a new (empty) sharding unit, in a unit an earlier builder left when there is one
    /// (its parameter list keeps its capacity).
    fn push_unit(&mut self) {
        let unit = match self.train.spare_units.pop() {
            Some(mut u) => {
                let Unit {
                    params,
                    unsharded,
                    sharded_grad,
                } = &mut u;
                params.clear();
                *unsharded = false;
                *sharded_grad = None;
                u
            }
            None => Unit::default(),
        };
        self.train.units.push(unit);
    }

    fn kind(&self) -> Option<ShardKind> {
        self.train.shard.map(|s| s.kind)
    }

    fn world(&self) -> u128 {
        self.train.shard.map_or(1, |s| s.world.max(1))
    }

    /// Rows of dim 0 per rank: `torch.chunk(tensor, world_size, dim=0)` gives every rank
    /// `ceil(dim0 / world)` rows except the tail; FSDP2 pads every rank's storage to that
    /// (`_fsdp_param.py` `_init_sharded_param`, `padded_sharded_param_size`).
    fn padded_shard_numel(&self, p: &ShardParam) -> u128 {
        mul(div_ceil(p.dim0, self.world()), p.row())
    }

    /// This rank's unpadded chunk (what `zeros_like` of the sharded DTensor allocates).
    fn local_numel(&self, p: &ShardParam) -> u128 {
        let world = self.world();
        let rank = self.train.shard.map_or(0, |s| s.rank);
        let chunk = div_ceil(p.dim0, world);
        mul(chunk.min(p.dim0.saturating_sub(mul(rank, chunk))), p.row())
    }

    /// ZeRO-3 partitions every parameter's flattened storage into `ceil(numel / world)`
    /// elements per rank (`deepspeed/runtime/zero/partition_parameters.py`, `_partition_param`).
    fn zero3_partition_numel(&self, p: &ShardParam) -> u128 {
        if p.numel <= ZERO3_PERSISTENCE_ELEMS {
            p.numel
        } else {
            div_ceil(p.numel, self.world())
        }
    }

    /// Every parameter with how many full-model parameters it stands for (1 unless the
    /// replay is a reduced model, `memory/fast.rs`).
    fn weighted_params(&self) -> impl Iterator<Item = (u128, &ShardParam)> + '_ {
        self.train
            .units
            .iter()
            .enumerate()
            .flat_map(move |(u, unit)| {
                let w = self.unit_weight(u);
                unit.params.iter().map(move |p| (w, p))
            })
    }

    /// Visits each tensor the optimizer updates on this rank as `(elements, bytes of one
    /// state-sized tensor, weight)`: ZeRO-1/2 partition the flat fp16/bf16 group evenly
    /// (`stage_1_and_2.py`, `get_data_parallel_partitions`) into one fp32 partition, ZeRO-3
    /// per parameter, FSDP2 per parameter chunk in the shard's own dtype, DDP per parameter.
    fn visit_partition(&self, mut f: impl FnMut(u128, u128, u128)) {
        let Some(s) = self.train.shard else { return };
        let trainable = || self.weighted_params().filter(|(_, p)| p.trainable);
        match s.kind {
            ShardKind::Zero { stage } if stage != 3 => {
                let total: u128 = trainable().map(|(w, p)| w * p.numel).sum();
                let part = div_ceil(total, self.world());
                f(part, part * s.master_size, 1);
            }
            kind => {
                for (w, p) in trainable() {
                    let (n, bytes) = match kind {
                        ShardKind::Fsdp2 { .. } => {
                            let n = self.local_numel(p);
                            (n, mul(n, self.sharded_elem(p)))
                        }
                        ShardKind::Zero { .. } => {
                            let n = self.zero3_partition_numel(p);
                            (n, mul(n, s.master_size))
                        }
                        ShardKind::Ddp { .. } => (p.numel, p.numel * s.master_size),
                    };
                    f(n, bytes, w);
                }
            }
        }
    }

    /// Trainable elements in this rank's partition.
    fn partition_elems(&self) -> u128 {
        let mut total = 0;
        self.visit_partition(|n, _, w| total += mul(w, n));
        total
    }

    /// FSDP2: bytes per element of a parameter's shard — its original dtype, which under a
    /// MixedPrecisionPolicy is the fp32 model's (`master_size`), and fp32 for LoRA adapters.
    fn sharded_elem(&self, p: &ShardParam) -> u128 {
        match self.train.shard {
            Some(s) if s.cast_params => s.master_size.max(p.elem),
            _ => p.elem,
        }
    }

    /// FSDP2: bytes per element of a parameter's gradient in the reduce-scatter: the policy's
    /// `reduce_dtype`, else the gradient's own dtype (`_fsdp_param_group.py` `_get_reduce_dtype`).
    fn reduce_elem(&self, p: &ShardParam) -> u128 {
        match self.train.shard {
            Some(s) if s.cast_params => s.reduce_size,
            _ => p.elem,
        }
    }

    /// Bytes of every trainable parameter's whole gradient in the parameter dtype.
    fn full_gradient_bytes(&self) -> u128 {
        self.weighted_params()
            .filter(|(_, p)| p.trainable)
            .map(|(w, p)| w * p.numel * self.param_size)
            .sum()
    }

    /// The distinct dim-0 sizes of the parameters (what decides a rank's chunks).
    pub(crate) fn shard_dim0s(&self) -> Vec<u128> {
        let mut d: Vec<u128> = self
            .train
            .units
            .iter()
            .flat_map(|u| u.params.iter().map(|p| p.dim0))
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// Allocates what sharding keeps for the whole run; called after the parameters exist.
    pub(super) fn shard_setup(&mut self) {
        let Some(s) = self.train.shard else { return };
        while self.train.units.len() <= self.n_layers() {
            self.push_unit();
        }
        let ps = self.param_size;
        match s.kind {
            ShardKind::Ddp { .. } => {
                // Reducer::initialize_buckets (torch/csrc/distributed/c10d/reducer.cpp): every
                // gradient has a slot in a flat bucket tensor of the gradient dtype, allocated
                // when DDP is built. With gradient_as_bucket_view=False it is a second copy of
                // the gradients; with True it is where `.grad` lives (a gradient then).
                let category = if matches!(
                    s.kind,
                    ShardKind::Ddp {
                        bucket_view: true,
                        ..
                    }
                ) {
                    Category::Gradients
                } else {
                    Category::CommBuffers
                };
                let grads = self.full_gradient_bytes();
                self.t.alloc(grads, category, false);
            }
            ShardKind::Fsdp2 { .. } => {
                let mut sharded: u128 = 0;
                for u in 0..self.train.units.len() {
                    let weight = self.unit_weight(u);
                    for i in 0..self.train.units[u].params.len() {
                        let p = self.train.units[u].params[i];
                        let padded = self.padded_shard_numel(&p);
                        sharded += weight * padded * self.sharded_elem(&p);
                        // the all-gather output per parameter is the padded unsharded size
                        // (`FSDPParam.init_all_gather_outputs`); the gradient is unpadded
                        self.t.resize_param(p.id, padded * self.world() * p.elem);
                        self.t.set_grad_bytes(p.id, p.numel * p.elem);
                        self.t.evict_param(p.id);
                    }
                }
                if !s.offload_params {
                    self.t.alloc(sharded, Category::Weights, false);
                }
            }
            ShardKind::Zero { stage } => {
                if stage == 3 {
                    let mut partition: u128 = 0;
                    let mut largest: u128 = 0;
                    for u in 0..self.train.units.len() {
                        let weight = self.unit_weight(u);
                        for i in 0..self.train.units[u].params.len() {
                            let p = self.train.units[u].params[i];
                            // parameters up to `stage3_param_persistence_threshold` (1e5
                            // elements) are never partitioned (`parameter_offload.py`): they
                            // stay whole
                            if p.numel <= ZERO3_PERSISTENCE_ELEMS {
                                continue;
                            }
                            partition += weight * self.zero3_partition_numel(&p) * ps;
                            largest = largest.max(p.numel);
                            self.t.evict_param(p.id);
                        }
                    }
                    if !s.offload_params {
                        self.t.alloc(partition, Category::Weights, false);
                    }
                    // Parameters are gathered per submodule right before use and released
                    // after it (`parameter_offload.py` pre/post-forward hooks), with up to
                    // `stage3_prefetch_bucket_size` elements fetched ahead
                    // (`partitioned_param_coordinator.py`): the window of gathered bytes is the
                    // largest parameter plus the prefetch bucket.
                    let window = (largest + ZERO3_PREFETCH_ELEMS) * ps;
                    self.t.alloc(window, Category::Weights, false);
                }
                if stage >= 2 {
                    // contiguous_gradients: the ipg bucket, `reduce_bucket_size` elements of
                    // the gradient dtype, allocated once (`stage_1_and_2.py`
                    // `ipg_buffer`, stage3.py `__ipg_bucket_flat_buffer`)
                    self.t
                        .alloc(s.bucket_elems * ps, Category::CommBuffers, false);
                }
            }
        }
    }

    /// Records a hook point on the tape (FSDP2 and ZeRO-2/3 act per unit in backward).
    pub(super) fn mark(&mut self, m: Marker) {
        // the fast evaluator's segments follow the hook points too
        if self.t.segmenting() || self.hooks_on_tape() {
            self.t.tape.push(Node {
                marker: Some(m),
                ..Node::default()
            });
        }
    }

    /// FSDP2 `pre_forward`: unshard the unit. In forward the all-gather output is not freed
    /// after the copy-out: `FSDPCommContext.all_gather_state` keeps it until the next unit's
    /// all-gather has been issued (so the copy-in cannot reuse it early), and the root's
    /// post-forward drops the last one (`_fsdp_param_group.py` `wait_for_unshard`,
    /// `_fsdp_state.py` `_root_post_forward`).
    pub(super) fn unit_pre_forward(&mut self, u: usize) {
        if !matches!(self.kind(), Some(ShardKind::Fsdp2 { .. })) || self.train.units[u].unsharded {
            return;
        }
        let ag = self.all_gather(u);
        if let Some(old) = self.train.ag_held.take() {
            self.t.release(old);
        }
        for p in &self.train.units[u].params {
            self.t.restore_param(p.id);
        }
        self.train.units[u].unsharded = true;
        self.train.ag_held = Some(ag);
    }

    /// FSDP2's `MixedPrecisionPolicy(cast_forward_inputs=True)` (the default) at a decoder
    /// layer's pre-forward, before its all-gather: every floating-point argument whose dtype is
    /// not `param_dtype` is copied to it (torch 2.15 distributed/fsdp/_fully_shard/
    /// _fsdp_state.py `_pre_forward` → `_cast_forward_inputs`, `_fsdp_common.py`
    /// `_cast_fp_tensor`). The hidden states already are (the root's embeddings are
    /// all-gathered in `param_dtype`), the rotary cos/sin are not when the model keeps them
    /// fp32 (OLMo 2, ERNIE 4.5: [`Builder::rope_tables_fp32`]; Llama 4's complex table is not
    /// floating-point): each layer gets its own 16-bit pair. The layer rotates on the copies, so
    /// its ops save them (without checkpointing, until the layer's backward), and transformers'
    /// checkpointing wraps the layer's `forward`, inside the hooks (modeling_layers.py
    /// `GradientCheckpointingLayer`: `checkpoint(partial(forward, self, **kwargs), *args)`), so
    /// the checkpoint holds the copied kwargs until the layer's recompute. Measured:
    /// rdist131-020-olmo2 (checkpointed), two [368, 16] bf16 copies per layer alive from its
    /// pre-forward into backward, its forward -1.03% without them. Returns the model's tables,
    /// to put back after the layer ([`Builder::unit_uncast_inputs`]).
    pub(super) fn unit_cast_inputs(&mut self) -> Option<(TensorId, TensorId)> {
        if !self.rope_tables_cast() {
            return None;
        }
        let tables = self.rope_tables?;
        let bytes = self.seq * self.rope_table_dim() * self.param_size;
        let cos = self.act(bytes, false);
        let sin = self.act(bytes, false);
        self.rope_tables = Some((cos, sin));
        Some(tables)
    }

    /// Whether every decoder layer rotates on FSDP2's 16-bit copies of fp32 rotary tables
    /// ([`Builder::unit_cast_inputs`]); the recompute of a checkpointed layer too (it calls the
    /// layer's `forward` on the held kwargs, without the hooks).
    pub(super) fn rope_tables_cast(&self) -> bool {
        matches!(self.kind(), Some(ShardKind::Fsdp2 { .. }))
            && self.train.shard.is_some_and(|s| s.cast_params)
            && self.complex_rope_head_dim().is_none()
            && self.rope_tables_fp32()
    }

    /// The layer's call returns (after its post-forward hook): its cast inputs
    /// ([`Builder::unit_cast_inputs`]) lose their Python references, the model's tables are the
    /// next layer's input again.
    pub(super) fn unit_uncast_inputs(&mut self, tables: Option<(TensorId, TensorId)>) {
        if let Some(model_tables) = tables {
            if let Some((cos, sin)) = self.rope_tables.replace(model_tables) {
                self.drop_(cos);
                self.drop_(sin);
            }
        }
    }

    /// FSDP2 `post_forward`: reshard unless `reshard_after_forward=False`. The root reshards
    /// only when that was passed explicitly (`_fsdp_state.py` `_lazy_init` clears its
    /// post-forward mesh when it was left to the default); its forward ends with the loss.
    pub(super) fn unit_post_forward(&mut self, u: usize) {
        if u == 0 {
            if let Some(ag) = self.train.ag_held.take() {
                self.t.release(ag);
            }
        }
        if let Some(ShardKind::Fsdp2 {
            reshard_after_forward,
            root_reshard,
        }) = self.kind()
        {
            if (u != 0 && reshard_after_forward) || (u == 0 && root_reshard) {
                self.reshard(u);
            }
        }
    }

    /// Whether the runtime acts at the hook points in backward (FSDP2, ZeRO-2/3).
    fn hooks_on_tape(&self) -> bool {
        matches!(
            self.kind(),
            Some(
                ShardKind::Fsdp2 { .. }
                    | ShardKind::Zero { stage: 2 | 3 }
                    | ShardKind::Ddp {
                        replicate: true,
                        ..
                    }
            )
        )
    }

    /// Dispatches a marker popped from the tape during backward.
    pub(super) fn on_marker(&mut self, m: Marker) {
        match m {
            Marker::PreBackward(u) if u > 0 => self.seg(Some(u - 1), SegKind::BackwardStart),
            Marker::PostBackward(u) if u > 0 => self.seg(Some(u - 1), SegKind::BackwardEnd),
            _ => {}
        }
        // markers recorded only for the segments run no hook
        if !self.hooks_on_tape() {
            return;
        }
        match m {
            Marker::PreBackward(u) => self.unit_pre_backward(u),
            Marker::PostBackward(u) => self.unit_post_backward(u),
        }
    }

    /// FSDP2 `pre_backward`: unshard, then prefetch the unit that ran forward before this one
    /// (`_backward_prefetch`; for the root that is the last layer).
    pub(super) fn unit_pre_backward(&mut self, u: usize) {
        if !matches!(self.kind(), Some(ShardKind::Fsdp2 { .. })) {
            return;
        }
        self.unshard(u);
        let prev = if u == 0 {
            self.train.units.len() - 1
        } else {
            u - 1
        };
        if prev != 0 && !self.train.units[prev].unsharded && self.train.prefetched.is_none() {
            let ag = self.all_gather(prev);
            self.train.prefetched = Some((prev, ag));
        }
    }

    /// After a unit's backward: FSDP2 reshards and reduce-scatters its gradients; ZeRO-2/3
    /// moves them into the rank's gradient partition through the ipg bucket.
    pub(super) fn unit_post_backward(&mut self, u: usize) {
        let Some(s) = self.train.shard else { return };
        // the unit's gradients (in a buffer kept from unit to unit)
        let mut grads = std::mem::take(&mut self.train.grad_scratch);
        grads.clear();
        // bytes of one shard of the gradients being reduced
        let mut shard_grad_bytes: u128 = 0;
        for i in 0..self.train.units[u].params.len() {
            let p = self.train.units[u].params[i];
            if let Some(g) = self.t.take_param_grad(p.id) {
                grads.push(g);
                shard_grad_bytes += self.padded_shard_numel(&p) * self.reduce_elem(&p);
            }
        }
        self.reduce_unit(u, s, &grads, shard_grad_bytes);
        self.train.grad_scratch = grads;
    }

    fn reduce_unit(&mut self, u: usize, s: ShardSim, grads: &[TensorId], shard_grad_bytes: u128) {
        match s.kind {
            ShardKind::Fsdp2 { .. } => {
                self.reshard(u);
                if let Some(old) = self.train.rs_in_flight.take() {
                    self.t.release(old);
                }
                if grads.is_empty() {
                    return;
                }
                // foreach_reduce: reduce_scatter_input (padded unsharded, reduce dtype), the
                // copy-in frees the autograd gradients, then reduce_output (one padded shard)
                // backs the sharded gradients as views
                let rs_in = self.t.alloc(
                    shard_grad_bytes * self.world(),
                    Category::CommBuffers,
                    false,
                );
                for &g in grads {
                    self.t.release(g);
                }
                let rs_out = self.t.alloc(shard_grad_bytes, Category::Gradients, false);
                if s.offload_states {
                    // CPUOffloadPolicy: the sharded gradient is copied to the host
                    self.t.release(rs_out);
                } else if self.train.units[u].sharded_grad.is_some() {
                    // accumulation: `sharded_param.grad += new_sharded_grad`
                    self.t.release(rs_out);
                } else {
                    self.train.units[u].sharded_grad = Some(rs_out);
                }
                self.train.rs_in_flight = Some(rs_in);
            }
            ShardKind::Zero { .. } => {
                // gradients the per-node hook has not taken yet (none in practice)
                let any = !grads.is_empty();
                for &g in grads {
                    self.t.release(g);
                }
                if any {
                    self.ensure_zero_grad_partition();
                }
            }
            ShardKind::Ddp {
                replicate: true, ..
            } => {
                // composable `replicate` (FSDP2 `foreach_reduce` at world size 1): the reduce
                // input (the unit's gradients, copied in) is allocated, the autograd gradients
                // freed, and the input kept until the next unit's post-backward; the unsharded
                // copy this frees and the reduced gradient this makes cancel in the bucket-view
                // accounting (traced: rdist101-002-gemma2, layer 0's post-backward)
                if let Some(old) = self.train.rs_in_flight.take() {
                    self.t.release(old);
                }
                if grads.is_empty() {
                    return;
                }
                let bytes: u128 = grads.iter().map(|&g| self.t.bytes(g)).sum();
                let rs_in = self.t.alloc(bytes, Category::CommBuffers, false);
                for &g in grads {
                    self.t.release(g);
                }
                self.train.rs_in_flight = Some(rs_in);
            }
            ShardKind::Ddp { .. } => {}
        }
    }

    /// ZeRO-2/3 reduce every gradient as soon as autograd has accumulated it: a hook per
    /// parameter copies it into the ipg bucket and frees it (`stage_1_and_2.py`
    /// `reduce_ready_partitions_and_remove_grads`, stage3.py `reduce_partition_and_remove_grads`).
    /// DDP with `gradient_as_bucket_view=True` likewise: the reducer copies each ready
    /// gradient into its bucket and points `.grad` at the bucket view
    /// (`reducer.cpp` `mark_variable_ready_dense`), so the autograd tensor is freed at once.
    pub(super) fn after_backward_node(&mut self, node: &Node) {
        if matches!(
            self.kind(),
            Some(ShardKind::Ddp {
                replicate: true,
                ..
            })
        ) {
            // composable `replicate`: the unit's post-backward takes them
            return;
        }
        let view = matches!(
            self.kind(),
            Some(ShardKind::Ddp {
                bucket_view: true,
                ..
            })
        );
        if view {
            for &p in node.params.as_slice() {
                if let Some(g) = self.t.take_param_grad(p) {
                    self.t.release(g);
                }
            }
            return;
        }
        if !matches!(self.kind(), Some(ShardKind::Zero { stage: 2 | 3 })) {
            return;
        }
        let mut any = false;
        for &p in node.params.as_slice() {
            if let Some(g) = self.t.take_param_grad(p) {
                self.t.release(g);
                any = true;
            }
        }
        if any {
            self.ensure_zero_grad_partition();
        }
    }

    fn ensure_zero_grad_partition(&mut self) {
        let Some(s) = self.train.shard else { return };
        if self.train.units[0].sharded_grad.is_none() && !s.offload_states {
            // `grads_in_partition`: this rank's partition of the averaged gradients in the
            // gradient dtype (stage_1_and_2.py `copy_grads_in_partition`; stage3.py
            // `grad_partitions_flat_buffer`)
            let part = self.partition_elems();
            let g = self
                .t
                .alloc(part * self.param_size, Category::Gradients, false);
            self.train.units[0].sharded_grad = Some(g);
        }
    }

    /// The end of backward (FSDP2's root post-backward final callback, `finalize_backward`).
    pub(super) fn finish_backward(&mut self) {
        if self.train.shard.is_none() {
            return;
        }
        if !self.train.units.is_empty() {
            self.unit_post_backward(0);
        }
        if let Some(g) = self.train.rs_in_flight.take() {
            self.t.release(g);
        }
    }

    /// `optimizer.zero_grad(set_to_none=True)` also drops the sharded gradients.
    pub(super) fn shard_zero_grad(&mut self) {
        for u in 0..self.train.units.len() {
            if let Some(g) = self.train.units[u].sharded_grad.take() {
                self.t.release(g);
            }
        }
    }

    /// Optimizer-state bytes on this rank, or `None` when not sharded.
    pub(super) fn sharded_optimizer_states(&self) -> Option<u128> {
        let s = self.train.shard?;
        let w = self.mode.train()?;
        if matches!(s.kind, ShardKind::Ddp { .. }) {
            return None;
        }
        if s.offload_states {
            return Some(0);
        }
        // one flat tensor per partition (crate::optimizer, `state_bytes`)
        let (mut states, mut part) = (0, 0);
        self.visit_partition(|n, bytes, weight| {
            states += mul(weight, w.optimizer.state_bytes(OptimTensor::flat(n, bytes)));
            part += mul(weight, n);
        });
        let master = match s.kind {
            // DeepSpeed keeps an fp32 master partition next to the fp16/bf16 model
            ShardKind::Zero { .. } if self.param_size != 4 => 4 * part,
            _ => 0,
        };
        Some(states + master)
    }

    /// Optimizer-step temporaries on this rank, or `None` when not sharded.
    pub(super) fn sharded_optimizer_temps(&self) -> Option<u128> {
        let s = self.train.shard?;
        let w = self.mode.train()?;
        if matches!(s.kind, ShardKind::Ddp { .. }) {
            return None;
        }
        if s.offload_states {
            return Some(0);
        }
        let (mut part, mut total, mut largest) = (0, 0, 0);
        self.visit_partition(|n, bytes, weight| {
            part += weight * n;
            total += weight * bytes;
            largest = largest.max(bytes);
        });
        Some(match s.kind {
            // ZeRO builds the fp32 gradient of its partition for the step
            // (stage_1_and_2.py `single_partition_of_fp32_groups[i].grad`; stage3.py
            // `fp32_partitioned_groups_flat[i].grad`); DeepSpeed's FusedAdam has no temporaries
            ShardKind::Zero { stage: 3 } => part.min(ZERO3_SUB_GROUP_ELEMS) * 4,
            ShardKind::Zero { .. } => part * 4,
            // FSDP2 with for-loop AdamW: the square root and the division of one local shard
            // while the loop's `denom` still holds the previous shard's, over the shards in
            // `model.parameters()` order (as on one GPU, `Optimizer::forloop_step_temporaries`;
            // traced: rdist101-020-opt's optimizer phase, the embedding's shard 833,280 B then
            // the positions' 525,312 B twice, 1,883,904 B, was -2.3% at 2 × the largest)
            ShardKind::Fsdp2 { .. } if w.optimizer == crate::workload::Optimizer::AdamwForloop => {
                let shard_bytes: std::collections::BTreeMap<TensorId, u128> = self
                    .train
                    .units
                    .iter()
                    .flat_map(|u| u.params.iter())
                    .filter(|p| p.trainable)
                    .map(|p| (p.id, self.local_numel(p) * self.sharded_elem(p)))
                    .collect();
                crate::workload::Optimizer::forloop_step_temporaries(
                    self.train
                        .trainable
                        .iter()
                        .filter_map(|p| shard_bytes.get(&p.id).copied()),
                )
            }
            // FSDP2: the implementation's temporaries over the sharded parameters
            _ => w.optimizer.step_temporaries(total, largest).unwrap_or(0),
        })
    }

    /// Bytes this rank keeps on the host (offload): FSDP2 `CPUOffloadPolicy` keeps sharded
    /// parameters, gradients and optimizer states there; DeepSpeed `offload_optimizer` keeps the
    /// fp32 master partition, the optimizer states and the fp32 gradient partition
    /// (`stage_1_and_2.py` with `cpu_offload`: `single_partition_of_fp32_groups`,
    /// `averaged_gradients` on the host), `offload_param` the fp16/bf16 parameter partition.
    pub(crate) fn offloaded_bytes(&self) -> u128 {
        let (Some(s), Some(w)) = (self.train.shard, self.mode.train()) else {
            return 0;
        };
        let part = self.partition_elems();
        let states = w.optimizer.flat_state_bytes(part, s.master_size);
        match s.kind {
            ShardKind::Ddp { .. } => 0,
            ShardKind::Fsdp2 { .. } => {
                if s.offload_states {
                    self.fsdp_model_states()
                } else {
                    0
                }
            }
            ShardKind::Zero { stage } => {
                let mut host = 0;
                if s.offload_states {
                    host += states + part * 4 + part * 4;
                }
                if s.offload_params && stage == 3 {
                    let params: u128 = self
                        .weighted_params()
                        .map(|(w, p)| w * self.zero3_partition_numel(p))
                        .sum();
                    host += params * self.param_size;
                }
                host
            }
        }
    }

    /// FSDP2 model states of this rank: padded parameter shards, padded gradient shards (the
    /// reduce-scatter outputs) and optimizer states.
    fn fsdp_model_states(&self) -> u128 {
        let Some(w) = self.mode.train() else { return 0 };
        let (mut params, mut grads, mut states) = (0, 0, 0);
        for (weight, p) in self.weighted_params() {
            params += mul(
                mul(weight, self.padded_shard_numel(p)),
                self.sharded_elem(p),
            );
            if p.trainable {
                grads += mul(mul(weight, self.padded_shard_numel(p)), self.reduce_elem(p));
                states += mul(
                    weight,
                    w.optimizer
                        .flat_state_bytes(self.local_numel(p), self.sharded_elem(p)),
                );
            }
        }
        params + grads + states
    }

    /// Model-state bytes this rank keeps on the GPU between steps and through the step:
    /// its parameters (sharded where sharded), gradients (the rank's share of them once
    /// reduced) and optimizer states (with master weights). Buffers and gathered copies are
    /// not model states.
    pub(crate) fn model_state_bytes(&self) -> u128 {
        let (Some(s), Some(w)) = (self.train.shard, self.mode.train()) else {
            return 0;
        };
        let ps = self.param_size;
        let all = || self.weighted_params();
        let states = self.sharded_optimizer_states().unwrap_or(0);
        match s.kind {
            ShardKind::Ddp { .. } => {
                let p: u128 = all().map(|(n, p)| n * p.numel * ps).sum();
                let g = self.full_gradient_bytes();
                // the optimizer's own states of every parameter (crate::optimizer)
                let opt: u128 = all()
                    .filter(|(_, p)| p.trainable)
                    .map(|(n, p)| {
                        n * w.optimizer.state_bytes(OptimTensor::param(
                            p.numel,
                            p.numel * ps,
                            p.rows,
                            p.cols,
                        ))
                    })
                    .sum();
                p + g + opt
            }
            ShardKind::Fsdp2 { .. } => {
                if s.offload_states {
                    0
                } else {
                    self.fsdp_model_states()
                }
            }
            ShardKind::Zero { stage } => {
                let part = self.partition_elems();
                let p: u128 = if stage == 3 {
                    if s.offload_params {
                        0
                    } else {
                        all()
                            .map(|(n, p)| n * self.zero3_partition_numel(p) * ps)
                            .sum()
                    }
                } else {
                    all().map(|(n, p)| n * p.numel * ps).sum()
                };
                let g = if stage == 1 {
                    self.full_gradient_bytes()
                } else if s.offload_states {
                    0
                } else {
                    part * ps
                };
                p + g + states
            }
        }
    }

    /// The communication buffers of one rank, named as the engine names them.
    pub(crate) fn comm_buffer_lines(&self) -> Vec<crate::memory::ranks::CommBuffer> {
        use crate::memory::ranks::CommBuffer;
        let Some(s) = self.train.shard else {
            return Vec::new();
        };
        let ps = self.param_size;
        let line = |name: &str, bytes: u128| CommBuffer {
            name: name.to_string(),
            bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
        };
        match s.kind {
            ShardKind::Ddp { .. } => {
                let g = self.full_gradient_bytes();
                vec![line(
                    "DDP gradient buckets (gradient_as_bucket_view=False: a second copy of the gradients)",
                    g,
                )]
            }
            ShardKind::Fsdp2 { .. } => {
                let largest = |bytes: &dyn Fn(&ShardParam) -> u128| {
                    self.train
                        .units
                        .iter()
                        .map(|u| u.params.iter().map(bytes).sum::<u128>())
                        .max()
                        .unwrap_or(0)
                        * self.world()
                };
                let gathered = largest(&|p| self.padded_shard_numel(p) * p.elem);
                let reduced = largest(&|p| {
                    if p.trainable {
                        self.padded_shard_numel(p) * self.reduce_elem(p)
                    } else {
                        0
                    }
                });
                vec![
                    line(
                        "FSDP all-gather output, largest unit (one more in flight while backward prefetches)",
                        gathered,
                    ),
                    line(
                        "FSDP reduce-scatter input, largest unit (one kept in flight)",
                        reduced,
                    ),
                ]
            }
            ShardKind::Zero { stage } => {
                let mut v = Vec::new();
                if stage >= 2 {
                    v.push(line(
                        "ZeRO ipg gradient bucket (reduce_bucket_size = 5e8 elements)",
                        s.bucket_elems * ps,
                    ));
                }
                if stage == 3 {
                    let largest = self
                        .train
                        .units
                        .iter()
                        .flat_map(|u| &u.params)
                        .map(|p| p.numel)
                        .max()
                        .unwrap_or(0);
                    v.push(line(
                        "ZeRO-3 gathered parameters: largest parameter + stage3_prefetch_bucket_size (5e7)",
                        (largest + ZERO3_PREFETCH_ELEMS) * ps,
                    ));
                }
                v
            }
        }
    }

    fn all_gather(&mut self, u: usize) -> TensorId {
        let (cast, offload) = self
            .train
            .shard
            .map_or((false, false), |s| (s.cast_params, s.offload_params));
        // one padded shard of every parameter, in the dtype it is gathered in (mixed dtypes,
        // e.g. fp32 LoRA adapters next to a bf16 base, are gathered as bytes)
        let shard: u128 = self.train.units[u]
            .params
            .iter()
            .map(|p| self.padded_shard_numel(p) * p.elem)
            .sum();
        // mixed precision (or a host-resident shard): `_get_param_all_gather_inputs` first
        // copies the shards into one flat tensor of the parameter dtype
        let staging = (cast || offload).then(|| self.t.alloc(shard, Category::CommBuffers, false));
        let ag = self
            .t
            .alloc(shard * self.world(), Category::CommBuffers, false);
        if let Some(t) = staging {
            self.t.release(t);
        }
        ag
    }

    /// FSDP2 unshard outside forward (backward): a prefetched all-gather is copied out,
    /// otherwise one is issued; the flat buffer is freed right after the copy-out.
    fn unshard(&mut self, u: usize) {
        if !matches!(self.kind(), Some(ShardKind::Fsdp2 { .. })) || self.train.units[u].unsharded {
            return;
        }
        let ag = match self.train.prefetched.take() {
            Some((v, ag)) if v == u => ag,
            other => {
                self.train.prefetched = other;
                self.all_gather(u)
            }
        };
        // foreach_all_gather_copy_out: per-parameter outputs, then the flat buffer goes
        for p in &self.train.units[u].params {
            self.t.restore_param(p.id);
        }
        self.t.release(ag);
        self.train.units[u].unsharded = true;
    }

    fn reshard(&mut self, u: usize) {
        if !matches!(self.kind(), Some(ShardKind::Fsdp2 { .. })) {
            return;
        }
        for p in &self.train.units[u].params {
            self.t.evict_param(p.id);
        }
        self.train.units[u].unsharded = false;
    }
}

/// `stage3_prefetch_bucket_size` default (deepspeed/runtime/zero/config.py).
pub(crate) const ZERO3_PREFETCH_ELEMS: u128 = 50_000_000;

/// `stage3_param_persistence_threshold` default (deepspeed/runtime/zero/config.py).
pub(crate) const ZERO3_PERSISTENCE_ELEMS: u128 = 100_000;

/// `sub_group_size` default (deepspeed/runtime/zero/config.py): ZeRO-3 steps the optimizer one
/// sub-group of at most this many elements at a time, with an fp32 gradient copy of it.
pub(crate) const ZERO3_SUB_GROUP_ELEMS: u128 = 1_000_000_000;
