//! Every collective the engine issues in a step, on its link, with the overlap the engine
//! achieves. Each rule cites the engine's source.

use super::collective::{collective_time, CollectiveKind, Group, LinkKind};
use super::compute::LayerCost;
use super::efficiency::{Efficiencies, Execution};
use super::hardware::Hardware;
use super::Collective;
use crate::layout::{Layout, Offload, OffloadDevice, Strategy};
use crate::model::{Mlp, ModelDesc};
use crate::workload::{Optimizer, Precision, TrainWorkload};

/// Per-call cost and how many calls a step makes; exposure is filled in by the rules.
pub(crate) struct Comm<'a> {
    pub model: &'a ModelDesc,
    pub workload: &'a TrainWorkload,
    pub layout: &'a Layout,
    pub hw: &'a Hardware,
    pub eff: &'a Efficiencies,
    pub exec: &'a Execution,
    /// Micro-batches per step on each data-parallel rank.
    pub micro_batches: f64,
    /// Collectives found so far.
    pub out: Vec<Collective>,
}

/// Parameters of one decoder layer on one rank: (dense, expert).
fn layer_params(model: &ModelDesc, i: usize) -> (f64, f64) {
    let Some(l) = model.layers.get(i) else {
        return (0.0, 0.0);
    };
    let h = model.hidden_size;
    let all = l.params(h) as f64;
    let expert = match &l.mlp {
        Mlp::Moe(m) => (m.num_experts as f64) * m.expert.params(h) as f64,
        Mlp::Dense(_) | Mlp::None => 0.0,
    };
    (all - expert, expert)
}

impl Comm<'_> {
    fn time(&self, kind: CollectiveKind, bytes: f64, group: Group) -> (LinkKind, f64) {
        collective_time(
            kind,
            bytes,
            group,
            self.layout.gpus_per_node,
            self.hw,
            self.eff,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        name: &str,
        kind: CollectiveKind,
        group: Group,
        bytes: f64,
        calls: f64,
        link: LinkKind,
        seconds: f64,
        exposed: f64,
    ) {
        if calls <= 0.0 || seconds <= 0.0 {
            return;
        }
        self.out.push(Collective {
            name: name.to_owned(),
            kind,
            group_size: group.size,
            bytes_per_call: bytes,
            calls_per_step: calls,
            link,
            seconds,
            exposed_seconds: exposed.clamp(0.0, seconds),
        });
    }

    fn act_bytes(&self) -> f64 {
        match self.workload.precision {
            Precision::Fp32 => 4.0,
            _ => 2.0,
        }
    }

    /// Bytes per element of parameters as gathered for compute (FSDP2
    /// `MixedPrecisionPolicy(param_dtype)`, ZeRO-3's fp16/bf16 partitions).
    pub fn param_bytes(&self) -> f64 {
        match self.workload.precision {
            Precision::Fp32 => 4.0,
            _ => 2.0,
        }
    }

    /// Bytes per element of gradients as reduced. Megatron with bf16 reduces its fp32
    /// `main_grad` (`arguments.py`: bf16 sets `accumulate_allreduce_grads_in_fp32`); FSDP2
    /// under autocast-style mixed precision reduces in fp32 (torchtitan
    /// `mixed_precision_reduce = "float32"`); otherwise the parameter dtype.
    pub fn grad_bytes(&self) -> f64 {
        match self.workload.precision {
            Precision::Fp32 | Precision::AmpBf16 | Precision::AmpFp16 => 4.0,
            Precision::Bf16 if self.exec.megatron => 4.0,
            _ => 2.0,
        }
    }

    /// The data-parallel group: `dp·cp` ranks `tp` apart (Megatron reduces gradients over
    /// data and context parallel ranks, `get_data_parallel_group(with_context_parallel=True)`;
    /// torchtitan shards FSDP over its `dp_shard_cp` mesh).
    pub fn data_group(&self) -> Group {
        Group {
            size: self.layout.dp() * self.layout.cp,
            stride: self.layout.tp,
        }
    }

    /// The group parameters are sharded over (HSDP: within a node).
    fn shard_group(&self) -> Group {
        match self.layout.strategy {
            Strategy::Hsdp => Group {
                size: self.layout.shard_group(),
                stride: self.layout.tp,
            },
            _ => self.data_group(),
        }
    }

    /// Trainable parameters of one rank's model-parallel share: (dense, expert), before any
    /// data-parallel sharding.
    pub fn trainable_params(&self, layers: &[usize]) -> (f64, f64) {
        let tp = self.layout.tp.max(1) as f64;
        let ep = self.layout.ep.max(1) as f64;
        if let Some(lora) = &self.workload.lora {
            let h = self.model.hidden_size;
            let r = lora.rank as f64;
            let mut n = 0.0;
            for &i in layers {
                let Some(l) = self.model.layers.get(i) else {
                    continue;
                };
                let mut linears = l.attention.linears(h);
                if let Mlp::Dense(d) = &l.mlp {
                    linears.extend(d.linears(h));
                }
                for lin in linears {
                    let targeted = self.model.linear_names.iter().any(|(role, name)| {
                        *role == lin.role && lora.targets.iter().any(|t| t == name)
                    });
                    if targeted {
                        n += r * (lin.in_features + lin.out_features) as f64;
                    }
                }
            }
            return (n, 0.0);
        }
        let mut dense = 0.0;
        let mut expert = 0.0;
        for &i in layers {
            let (d, e) = layer_params(self.model, i);
            dense += d;
            expert += e;
        }
        (dense / tp, expert / (tp * ep))
    }

    /// Parameters outside the decoder layers (embeddings, final norm, LM head) per rank;
    /// `trainable`: none of them under LoRA (frozen base).
    pub fn root_params(&self, trainable: bool) -> f64 {
        let tp = self.layout.tp.max(1) as f64;
        let Ok(c) = self.model.param_counts() else {
            return 0.0;
        };
        if trainable && self.workload.lora.is_some() {
            return 0.0;
        }
        (c.embeddings + c.final_norm + c.lm_head) as f64 / tp
    }

    /// Tensor-parallel collectives of one micro-batch on the layers of a stage; returns the
    /// exposed seconds. Megatron-LM (`megatron/core/tensor_parallel/layers.py`,
    /// `mappings.py`): without sequence parallelism an all-reduce after the attention and MLP
    /// blocks forward, and one per block backward; with it, an all-gather before and a
    /// reduce-scatter after each block, mirrored backward (Korthikanti et al. 2022 §4.2.2),
    /// the same volume. Backward, one collective per block overlaps the weight-gradient GEMM
    /// (`LinearWithGradAccumulationAndAsyncCommunication`); the rest are exposed unless
    /// `--tp-comm-overlap`. Full recomputation re-issues the forward ones.
    pub fn tensor_parallel(&mut self, stage: &[usize], costs: &[LayerCost], first: bool) -> f64 {
        let l = self.layout;
        if l.tp <= 1 || stage.is_empty() {
            return 0.0;
        }
        let group = Group {
            size: l.tp,
            stride: 1,
        };
        let sp = l.sequence_parallel;
        let tokens = (self.workload.batch * self.workload.seq) as f64 / l.cp.max(1) as f64;
        let bytes = tokens * self.model.hidden_size as f64 * self.act_bytes();
        let (kind_fwd, kind_pair) = if sp {
            (CollectiveKind::AllGather, CollectiveKind::ReduceScatter)
        } else {
            (CollectiveKind::AllReduce, CollectiveKind::AllReduce)
        };
        let (link, t_a) = self.time(kind_fwd, bytes, group);
        let (_, t_b) = self.time(kind_pair, bytes, group);
        // per block: forward t_a (+ t_b with SP), backward the same
        let per_block = if sp { t_a + t_b } else { t_a };
        let blocks = 2.0 * stage.len() as f64;
        let rc = self.exec.recompute.gemm;
        let mut exposed = 0.0;
        for (&i, c) in stage.iter().zip(costs) {
            let _ = i;
            // the partner GEMM of each collective: a quarter of the layer's forward GEMMs
            let partner_f = c.fwd.gemm / 4.0;
            let partner_b = c.bwd.gemm / 4.0;
            let hide = |t: f64, partner: f64| (t - partner).max(0.0);
            let fwd = if self.exec.tp_comm_overlap {
                2.0 * hide(per_block, partner_f)
            } else {
                2.0 * per_block
            };
            // backward: one collective per block rides under the weight-gradient GEMM
            let bwd = if self.exec.tp_comm_overlap {
                2.0 * hide(per_block, partner_b)
            } else if self.exec.megatron {
                2.0 * (per_block - t_a.min(per_block)) + 2.0 * hide(t_a, partner_b)
            } else {
                2.0 * per_block
            };
            exposed += fwd * (1.0 + rc) + bwd;
        }
        let m = self.micro_batches;
        let total = blocks * per_block * (2.0 + rc);
        let name = if sp {
            "tensor-parallel all-gather + reduce-scatter (sequence parallel)"
        } else {
            "tensor-parallel all-reduce"
        };
        let calls = blocks * (2.0 + rc) * if sp { 2.0 } else { 1.0 };
        self.push(
            name,
            kind_fwd,
            group,
            bytes,
            calls * m,
            link,
            total * m,
            exposed * m,
        );
        // vocabulary-parallel embedding: one all-reduce (reduce-scatter with SP) forward
        if first {
            let (link, t) = self.time(kind_pair, bytes, group);
            self.push(
                "tensor-parallel embedding all-reduce",
                kind_pair,
                group,
                bytes,
                m,
                link,
                t * m,
                t * m,
            );
            exposed += t;
        }
        exposed
    }

    /// Context-parallel ring attention (Megatron `cp_comm_type = "p2p"`, Transformer Engine
    /// `attn_forward_func_with_cp`): `cp − 1` steps each forward sending this rank's key/value
    /// chunk to the next rank, twice that backward (keys/values and their gradients),
    /// overlapped with the attention compute of each step; the remainder is exposed.
    pub fn context_parallel(&mut self, stage: &[usize], costs: &[LayerCost]) -> f64 {
        let l = self.layout;
        if l.cp <= 1 || stage.is_empty() {
            return 0.0;
        }
        let group = Group {
            size: l.cp,
            stride: l.tp,
        };
        let tokens = (self.workload.batch * self.workload.seq) as f64 / l.cp as f64;
        let mut exposed = 0.0;
        let mut total = 0.0;
        let mut link = LinkKind::IntraNode;
        let mut bytes = 0.0;
        for (&i, c) in stage.iter().zip(costs) {
            let Some(layer) = self.model.layers.get(i) else {
                continue;
            };
            let kv_width = match layer.attention.kind {
                crate::model::AttentionKind::Standard {
                    num_kv_heads,
                    head_dim,
                    ..
                } => ((num_kv_heads as f64 / l.tp as f64).max(1.0)) * 2.0 * head_dim as f64,
                crate::model::AttentionKind::Mla {
                    num_heads,
                    qk_nope_head_dim,
                    qk_rope_head_dim,
                    v_head_dim,
                    ..
                } => {
                    num_heads as f64 / l.tp as f64
                        * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim) as f64
                }
            };
            bytes = tokens * kv_width * self.act_bytes();
            let (lk, t) = self.time(CollectiveKind::SendRecv, bytes, group);
            link = lk;
            let steps = (l.cp - 1) as f64;
            let fwd = steps * t;
            let bwd = 2.0 * steps * t;
            let rc = self.exec.recompute.attention;
            exposed +=
                (fwd - c.attention_fwd_s).max(0.0) * (1.0 + rc) + (bwd - c.bwd.attention).max(0.0);
            total += fwd * (1.0 + rc) + bwd;
        }
        let m = self.micro_batches;
        let calls = 3.0 * (l.cp - 1) as f64 * stage.len() as f64;
        self.push(
            "context-parallel ring exchange (keys/values)",
            CollectiveKind::SendRecv,
            group,
            bytes,
            calls * m,
            link,
            total * m,
            exposed * m,
        );
        exposed
    }

    /// Expert-parallel all-to-all (Megatron `MoEAlltoAllTokenDispatcher`): dispatch and combine
    /// forward, their mirrors backward, each of the routed tokens' hidden states; exposed
    /// (no overlap by default).
    pub fn expert_parallel(&mut self, stage: &[usize]) -> f64 {
        let l = self.layout;
        if l.ep <= 1 {
            return 0.0;
        }
        let group = Group {
            size: l.ep,
            stride: l.tp,
        };
        let mut tokens = (self.workload.batch * self.workload.seq) as f64 / l.cp.max(1) as f64;
        if l.sequence_parallel {
            tokens /= l.tp as f64;
        }
        let mut moe_layers = 0.0;
        let mut bytes = 0.0;
        for &i in stage {
            if let Some(Mlp::Moe(m)) = self.model.layers.get(i).map(|x| &x.mlp) {
                moe_layers += 1.0;
                bytes = tokens * m.top_k as f64 * self.model.hidden_size as f64 * self.act_bytes();
            }
        }
        if moe_layers == 0.0 {
            return 0.0;
        }
        let (link, t) = self.time(CollectiveKind::AllToAll, bytes, group);
        let per_layer = (4.0 + 2.0 * self.exec.recompute.gemm) * t;
        let exposed = moe_layers * per_layer;
        let m = self.micro_batches;
        self.push(
            "expert-parallel all-to-all (dispatch + combine)",
            CollectiveKind::AllToAll,
            group,
            bytes,
            moe_layers * (4.0 + 2.0 * self.exec.recompute.gemm) * m,
            link,
            exposed * m,
            exposed * m,
        );
        exposed
    }

    /// Per-layer parameter gathers and gradient reduce-scatters of fully sharded data
    /// parallelism, every micro-batch, with prefetch: FSDP2 (`torch/distributed/fsdp/
    /// _fully_shard/_fsdp_param_group.py`: the next unit's all-gather is issued before the
    /// current unit's compute, forward and backward; `reshard_after_forward=False` keeps
    /// the parameters for the backward) and DeepSpeed ZeRO-3 (`stage3_prefetch_bucket_size`,
    /// `overlap_comm` on by default for stage 3). Layer `i`'s gather hides under layer
    /// `i−1`'s compute; the first gather and the last reduce-scatter are exposed. HSDP adds
    /// the all-reduce of each gradient shard across replicas after its reduce-scatter
    /// (FSDP2 `_fsdp_collectives.py` `foreach_reduce`, `all_reduce_group`).
    /// Parameter offload puts each shard's host-to-device copy on the same path.
    pub fn fully_sharded(&mut self, stage: &[usize], costs: &[LayerCost], pre_post: f64) -> f64 {
        let s = self.layout.strategy;
        if !matches!(
            s,
            Strategy::Zero3 | Strategy::FsdpFull | Strategy::FsdpGradOp | Strategy::Hsdp
        ) {
            return 0.0;
        }
        let shard = self.shard_group();
        let replicate = Group {
            size: (self.data_group().size / shard.size.max(1)).max(1),
            stride: shard.size * self.layout.tp,
        };
        let reshard = s != Strategy::FsdpGradOp;
        let offload_params = matches!(self.layout.offload, Offload::Params | Offload::Both);
        let pb = self.param_bytes();
        let gb = self.grad_bytes();
        let h2d = self.hw.host_link() * self.eff.pcie_fraction;
        let mut gather = Vec::new();
        let mut reduce = Vec::new();
        let mut link = LinkKind::IntraNode;
        let mut ag_total = 0.0;
        let mut rs_total = 0.0;
        let mut ar_total = 0.0;
        let mut ag_bytes: f64 = 0.0;
        let mut rs_bytes: f64 = 0.0;
        // the root unit (embeddings, final norm, head) is gathered first and reduced last
        let units: Vec<(f64, f64)> =
            std::iter::once((self.root_params(false), self.root_params(true)))
                .chain(stage.iter().map(|&i| {
                    let (d, e) = layer_params(self.model, i);
                    let tp = self.layout.tp as f64;
                    let all = (d + e / self.layout.ep.max(1) as f64) / tp;
                    let (td, te) = self.trainable_params(&[i]);
                    (all, td + te)
                }))
                .collect();
        for (params, trainable) in &units {
            let (lk, ag) = self.time(CollectiveKind::AllGather, params * pb, shard);
            link = lk;
            let fetch = if offload_params {
                params * pb / shard.size as f64 / h2d
            } else {
                0.0
            };
            let (_, rs) = self.time(CollectiveKind::ReduceScatter, trainable * gb, shard);
            let (_, ar) = if s == Strategy::Hsdp {
                self.time(
                    CollectiveKind::AllReduce,
                    trainable * gb / shard.size as f64,
                    replicate,
                )
            } else {
                (LinkKind::Network, 0.0)
            };
            gather.push(ag + fetch);
            reduce.push(rs + ar);
            ag_total += ag + fetch;
            rs_total += rs;
            ar_total += ar;
            ag_bytes = ag_bytes.max(params * pb);
            rs_bytes = rs_bytes.max(trainable * gb);
        }
        // forward: unit i's gather hides under unit i−1's forward
        let fwd: Vec<f64> = std::iter::once(pre_post)
            .chain(costs.iter().map(|c| c.fwd.total()))
            .collect();
        let rc = &self.exec.recompute;
        let bwd: Vec<f64> = std::iter::once(pre_post)
            .chain(costs.iter().map(|c| {
                c.bwd.total()
                    + rc.gemm * c.fwd.gemm
                    + rc.attention * c.fwd.attention
                    + rc.elementwise * c.fwd.elementwise
            }))
            .collect();
        let n = units.len();
        let mut exposed = gather.first().copied().unwrap_or(0.0);
        for i in 1..n {
            exposed += (gather[i] - fwd[i - 1]).max(0.0);
        }
        // backward runs the units in reverse: unit i's gather (if resharded) and unit i+1's
        // reduce hide under unit i+1's backward; the first unit's reduce is exposed
        let bwd_gather = |i: usize| if reshard { gather[i] } else { 0.0 };
        exposed += bwd_gather(n - 1);
        for i in (0..n - 1).rev() {
            exposed += (bwd_gather(i) + reduce[i + 1] - bwd[i + 1]).max(0.0);
        }
        exposed += reduce.first().copied().unwrap_or(0.0);
        let m = self.micro_batches;
        let ag_calls = if reshard { 2.0 } else { 1.0 };
        let total = ag_total * ag_calls + rs_total + ar_total;
        let name = match s {
            Strategy::Zero3 => "ZeRO-3 parameter all-gather + gradient reduce-scatter per layer",
            Strategy::Hsdp => {
                "HSDP all-gather + reduce-scatter per layer (node) + replicate all-reduce"
            }
            _ => "FSDP2 parameter all-gather + gradient reduce-scatter per layer",
        };
        let _ = rs_bytes;
        self.push(
            name,
            CollectiveKind::AllGather,
            shard,
            ag_bytes,
            (ag_calls + 1.0 + if s == Strategy::Hsdp { 1.0 } else { 0.0 }) * n as f64 * m,
            link,
            total * m,
            exposed * m,
        );
        exposed
    }

    /// Gradient synchronisation of DDP and ZeRO-1/2 (and Megatron's data parallelism) at the
    /// end of the step, given the backward time of the last micro-batch it can overlap with.
    /// Returns the exposed seconds per step.
    ///
    /// - PyTorch DDP (`torch/nn/parallel/distributed.py`, `reducer.cpp`): buckets of
    ///   `bucket_cap_mb` all-reduced as they fill during the backward (`no_sync` during
    ///   accumulation), so only the last bucket and any excess over the backward are exposed;
    ///   Megatron's DDP the same with `--overlap-grad-reduce`, else all exposed.
    /// - Megatron distributed optimizer (`--use-distributed-optimizer`, `--strategy zero1` on
    ///   a model-parallel layout): reduce-scatter of the gradients, then all-gather of the
    ///   updated bf16 parameters, hidden under the next forward with `--overlap-param-gather`.
    /// - DeepSpeed ZeRO-1/2 (`deepspeed/runtime/zero/stage_1_and_2.py`; `overlap_comm` off by
    ///   default): gradients reduce-scattered (ZeRO-2: every micro-batch, into the partitioned
    ///   buffers; ZeRO-1: once), parameters all-gathered after the step; exposed.
    pub fn data_parallel(
        &mut self,
        stage: &[usize],
        last_backward_s: f64,
        first_forward_s: f64,
    ) -> f64 {
        let s = self.layout.strategy;
        if matches!(
            s,
            Strategy::Zero3 | Strategy::FsdpFull | Strategy::FsdpGradOp | Strategy::Hsdp
        ) {
            return 0.0;
        }
        let group = self.data_group();
        if group.size <= 1 {
            return 0.0;
        }
        let (dense, expert) = self.trainable_params(stage);
        let root = if stage.contains(&0) || stage.last() == Some(&(self.model.layers.len() - 1)) {
            self.root_params(true)
        } else {
            0.0
        };
        let expert_group = Group {
            size: (group.size / self.layout.ep.max(1)).max(1),
            stride: group.stride * self.layout.ep.max(1),
        };
        let grad_bytes = (dense + root) * self.grad_bytes();
        let expert_bytes = expert * self.grad_bytes();
        let bucket = self.exec.grad_bucket_bytes.max(1.0);
        let m = self.micro_batches;
        let mut exposed = 0.0;
        let time_of =
            |c: &Self, kind: CollectiveKind, bytes: f64, g: Group| -> (LinkKind, f64, f64) {
                // whole buckets plus the remainder
                let full = (bytes / bucket).floor();
                let rest = bytes - full * bucket;
                let (link, tb) = c.time(kind, bucket, g);
                let (_, tr) = c.time(kind, rest, g);
                let last = if rest > 0.0 { tr } else { tb };
                (link, full * tb + tr, last)
            };
        let reduce_kind = match s {
            Strategy::Ddp => CollectiveKind::AllReduce,
            _ => CollectiveKind::ReduceScatter,
        };
        for (bytes, g, label) in [
            (grad_bytes, group, "gradients"),
            (expert_bytes, expert_group, "expert gradients"),
        ] {
            if bytes <= 0.0 || g.size <= 1 {
                continue;
            }
            let (link, t, last) = time_of(self, reduce_kind, bytes, g);
            let overlapped =
                self.exec.overlap_grad_reduce && (s == Strategy::Ddp || self.exec.megatron);
            let (calls, per_step, exp) = match s {
                // DeepSpeed ZeRO-2 reduces every micro-batch
                Strategy::Zero2 if !self.exec.megatron => (m, t * m, t * m),
                _ if overlapped => (1.0, t, (t - last_backward_s).max(0.0) + last),
                _ => (1.0, t, t),
            };
            exposed += exp;
            let name = match (s, self.exec.megatron) {
                (Strategy::Ddp, true) => format!("Megatron DDP all-reduce of {label}"),
                (Strategy::Ddp, false) => format!("DDP bucketed all-reduce of {label}"),
                (_, true) => format!("distributed-optimizer reduce-scatter of {label}"),
                _ => format!("ZeRO reduce-scatter of {label}"),
            };
            self.push(
                &name,
                reduce_kind,
                g,
                bytes.min(bucket),
                calls * (bytes / bucket).ceil(),
                link,
                per_step,
                exp,
            );
            if s != Strategy::Ddp {
                // updated parameters gathered back after the step
                let pbytes = bytes / self.grad_bytes() * self.param_bytes();
                let (link, t, first) = time_of(self, CollectiveKind::AllGather, pbytes, g);
                let exp = if self.exec.megatron && self.exec.overlap_param_gather {
                    (t - first_forward_s).max(0.0) + first
                } else {
                    t
                };
                exposed += exp;
                self.push(
                    &format!("parameter all-gather after the step ({label})"),
                    CollectiveKind::AllGather,
                    g,
                    pbytes.min(bucket),
                    (pbytes / bucket).ceil(),
                    link,
                    t,
                    exp,
                );
            }
        }
        exposed
    }

    /// Pipeline point-to-point: each micro-batch's activations forward and gradients backward
    /// cross every stage boundary (Megatron `p2p_communication.py`), scattered over the
    /// tensor-parallel ranks. 1F1B waits for each transfer (`send_forward_recv_backward`), so
    /// `2·(m + p − 1)` of them sit on the critical path; the interleaved schedule overlaps
    /// them (`overlap_p2p_comm`) but for the warm-up.
    pub fn pipeline(&mut self) -> f64 {
        let l = self.layout;
        if l.pp <= 1 {
            return 0.0;
        }
        let group = Group {
            size: 2,
            stride: l.tp * l.cp * l.dp(),
        };
        let tokens = (self.workload.batch * self.workload.seq) as f64 / l.cp.max(1) as f64;
        let mut bytes = tokens * self.model.hidden_size as f64 * self.act_bytes();
        if l.tp > 1 && (l.sequence_parallel || self.exec.pp_scatter_gather) {
            bytes /= l.tp as f64;
        }
        let (link, t) = self.time(CollectiveKind::SendRecv, bytes, group);
        let m = self.micro_batches;
        let p = l.pp as f64;
        let v = l.virtual_stages.max(1) as f64;
        let calls = 2.0 * m * v;
        let exposed = if self.exec.pp_p2p_overlap {
            2.0 * (p - 1.0) * t
        } else {
            2.0 * (m + p - 1.0) * t
        };
        self.push(
            "pipeline send/recv (activations, gradients)",
            CollectiveKind::SendRecv,
            group,
            bytes,
            calls,
            link,
            calls * t,
            exposed,
        );
        exposed
    }

    /// Host↔device traffic of offloading, per step: (exposed transfer seconds, optimizer step
    /// seconds on the host). ZeRO-Offload (Ren et al. 2021; `offload_optimizer`): gradients
    /// copied to the host as they are reduced (overlapped with the backward), the Adam step on
    /// the CPU (DeepSpeed `DeepSpeedCPUAdam`), the updated parameters copied back before the
    /// next forward (exposed). FSDP2 `CPUOffloadPolicy` does the same with `torch.optim` on the
    /// CPU (`foreach` traffic, see [`optimizer_bytes_per_param`]). ZeRO-Infinity (NVMe) reads
    /// and writes the optimizer states from NVMe every step.
    pub fn offload(&mut self, stage: &[usize], last_backward_s: f64) -> (f64, f64) {
        let l = self.layout;
        if !matches!(l.offload, Offload::Optimizer | Offload::Both) {
            return (0.0, 0.0);
        }
        let (d, e) = self.trainable_params(stage);
        let shard = match l.strategy {
            Strategy::Ddp => 1.0,
            _ => self.shard_group().size as f64,
        };
        let params = (d + e + self.root_params(true)) / shard;
        let link = self.hw.host_link() * self.eff.pcie_fraction;
        let d2h = params * self.param_bytes() / link;
        let h2d = params * self.param_bytes() / link;
        let d2h_exposed = (d2h - last_backward_s).max(0.0);
        let torch_cpu = l.strategy.is_fsdp();
        let per_param = optimizer_bytes_per_param(
            self.workload.optimizer,
            Precision::AmpBf16,
            !torch_cpu,
            false,
        );
        let mut host = params * per_param / self.eff.host_optimizer_bytes_per_s;
        if l.offload_device == OffloadDevice::Nvme {
            // states (fp32 master, m, v) read and written once
            host += 2.0 * params * 12.0 / self.eff.nvme_bytes_per_s;
        }
        let g = Group { size: 1, stride: 1 };
        self.out.push(Collective {
            name: "offload: gradients to host, parameters back (PCIe)".to_owned(),
            kind: CollectiveKind::SendRecv,
            group_size: g.size,
            bytes_per_call: params * self.param_bytes(),
            calls_per_step: 2.0,
            link: LinkKind::Pcie,
            seconds: d2h + h2d,
            exposed_seconds: d2h_exposed + h2d,
        });
        (d2h_exposed + h2d, host)
    }
}

/// HBM bytes one parameter's update moves, by optimizer.
///
/// Fused kernels read parameter, gradient and states once and write parameter and states once
/// (`torch.optim.AdamW(fused=True)`, Apex/Transformer Engine `FusedAdam` in Megatron,
/// bitsandbytes' 8-bit kernels). The default `foreach` AdamW (`torch/optim/adamw.py`
/// `_multi_tensor_adamw`: `lerp_`, `mul_`, `addcmul_`, `sqrt`, `div_`, `add_`, `addcdiv_`,
/// weight-decay `mul_`) touches 21 tensors per element against the fused 7: 3×.
/// Megatron keeps bf16 parameters with fp32 main gradients, master weights and moments:
/// 4+4+4+4 read, 4+4+4 written, 2 bytes of bf16 parameter written.
pub fn optimizer_bytes_per_param(
    opt: Optimizer,
    precision: Precision,
    fused: bool,
    megatron: bool,
) -> f64 {
    if megatron {
        return 30.0;
    }
    let (p, g, s) = match precision {
        Precision::Bf16 | Precision::Fp16 => (2.0, 2.0, 2.0),
        Precision::Fp32 | Precision::AmpBf16 | Precision::AmpFp16 => (4.0, 4.0, 4.0),
    };
    let (states, foreach_factor) = match opt {
        Optimizer::Adamw | Optimizer::AdamwFused | Optimizer::AdamwForloop => (2.0 * s, 3.0),
        Optimizer::Adamw8bit => (2.0, 1.0),
        Optimizer::Sgd => (0.0, 1.0),
        Optimizer::SgdMomentum => (s, 1.5),
        Optimizer::Adafactor => (0.0, 3.0),
        Optimizer::Lion => (s, 2.0),
    };
    // read p, g, states; write p, states
    let minimal = 2.0 * p + g + 2.0 * states;
    let fused = fused || matches!(opt, Optimizer::AdamwFused | Optimizer::Adamw8bit);
    if fused {
        minimal
    } else {
        minimal * foreach_factor
    }
}
