//! How fast each kind of kernel runs relative to the hardware's ceilings, and how a step is
//! executed (kernels, recomputation, overlap switches). Every default names its source in
//! `docs/time-model.md`; every field is public so a caller (the CLI's flags) can override it.

use super::hardware::Hardware;
use crate::layout::{Layout, Schedule};
use crate::model::{LinearRole, Mlp, ModelDesc};
use crate::workload::{AttentionImpl, CheckpointPolicy, Lora, TrainWorkload};
use serde::Serialize;

/// Fraction of the dense peak the best-shaped GEMM reaches when the catalogue has no
/// measurement: the NVIDIA entries of the MAMF table (ml-engineering
/// `compute/accelerator/README.md`) run 72.9–86.9%, median 78%.
pub const DEFAULT_MATMUL_EFFICIENCY: f64 = 0.78;

/// Achieved fractions of the hardware's ceilings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Efficiencies {
    /// Fraction of the dense tensor-core peak a large, well-shaped GEMM reaches: the GPU's
    /// measured maximum achievable matmul FLOP/s (MAMF), else [`DEFAULT_MATMUL_EFFICIENCY`].
    pub matmul: f64,
    /// Fraction of `matmul` that a training GEMM of a large, but not hand-picked, shape
    /// reaches: MAMF is the fastest iteration of the best shape of a sweep, and the finder's
    /// own README says a sweep over `m` at `n = k = 4096` "should give around 80-90% of the
    /// maximum achievable result" (ml-engineering `compute/accelerator/benchmarks/README.md`):
    /// 0.85.
    pub matmul_typical_shape: f64,
    /// GEMM dimension at which tile quantization halves throughput relative to a large
    /// dimension; `f(d) = d/(d + half)` normalised to 1 at [`Self::gemm_reference_dim`].
    pub gemm_half_dim: f64,
    /// Dimension at and above which a GEMM runs at `matmul` (the MAMF table's best shapes
    /// have every dimension ≥ 1024).
    pub gemm_reference_dim: f64,
    /// Attention (fused, forward + backward) fraction of the dense peak at long sequences and
    /// head dim 128; resolved from the kernel and architecture by [`attention_peak_fraction`].
    pub attention: f64,
    /// Sequence length (keys per query) at which a fused attention kernel reaches half its
    /// long-sequence throughput.
    pub attention_half_seq: f64,
    /// Head dimension at which a fused attention kernel reaches half its throughput (64-dim
    /// heads run ~0.83× 128-dim ones in the FlashAttention-2 paper's sweeps).
    pub attention_half_head_dim: f64,
    /// Fraction of HBM bandwidth memory-bound kernels (elementwise, reductions, optimizer)
    /// reach.
    pub memory_bandwidth: f64,
    /// Fraction of the per-direction NVLink/xGMI bandwidth a ring collective reaches as bus
    /// bandwidth at large messages (A100 78%, H200 82% in ml-engineering's nccl-tests runs).
    pub intra_node_link_fraction: f64,
    /// Fraction of the per-GPU network bandwidth a ring reaches (ml-engineering: 4 × 8 B200
    /// nodes over 8 × 400 Gb/s EFA, 377 GB/s all-reduce busbw of 400 GB/s = 94%; "80–90%" as
    /// the rule of thumb): 0.9.
    pub network_fraction: f64,
    /// Fraction of the PCIe per-direction bandwidth pinned host↔device copies reach.
    pub pcie_fraction: f64,
    /// Per-call latency of a collective inside a node, seconds (α).
    pub intra_node_latency_s: f64,
    /// Per-call latency of a collective that crosses nodes, seconds (α).
    pub network_latency_s: f64,
    /// While a communication kernel overlaps compute it holds SMs (one CUDA block per NCCL
    /// channel): the overlapped compute runs this fraction slower, charged as exposed
    /// communication.
    pub overlap_slowdown: f64,
    /// Host memory bandwidth one GPU's share of the CPU optimizer step streams at, bytes/s.
    pub host_optimizer_bytes_per_s: f64,
    /// NVMe bandwidth per GPU for ZeRO-Infinity, bytes/s.
    pub nvme_bytes_per_s: f64,
}

impl Efficiencies {
    /// The documented defaults for `hw`, with attention at the FlashAttention-2 class.
    pub fn for_hardware(hw: &Hardware) -> Self {
        Efficiencies {
            matmul: hw.matmul_efficiency.unwrap_or(DEFAULT_MATMUL_EFFICIENCY),
            matmul_typical_shape: 0.85,
            gemm_half_dim: 128.0,
            gemm_reference_dim: 1024.0,
            attention: attention_peak_fraction(AttentionKernel::Flash2, &hw.architecture),
            attention_half_seq: 512.0,
            attention_half_head_dim: 32.0,
            memory_bandwidth: 0.8,
            intra_node_link_fraction: 0.8,
            network_fraction: 0.9,
            pcie_fraction: 0.8,
            intra_node_latency_s: 50e-6,
            network_latency_s: 200e-6,
            overlap_slowdown: 0.1,
            host_optimizer_bytes_per_s: 25e9,
            nvme_bytes_per_s: 3e9,
        }
    }

    /// The defaults for `hw` with the attention fraction of `kernel`.
    pub fn defaults(hw: &Hardware, kernel: AttentionKernel) -> Self {
        Efficiencies {
            attention: attention_peak_fraction(kernel, &hw.architecture),
            ..Efficiencies::for_hardware(hw)
        }
    }

    /// GEMM efficiency (fraction of the tensor-core peak) for `[m×k]·[k×n]`.
    pub fn gemm(&self, m: f64, k: f64, n: f64) -> f64 {
        let reference = self.gemm_reference_dim / (self.gemm_reference_dim + self.gemm_half_dim);
        let f = |d: f64| {
            let d = d.max(1.0);
            (d / (d + self.gemm_half_dim) / reference).min(1.0)
        };
        self.matmul * self.matmul_typical_shape * f(m) * f(k) * f(n)
    }

    /// Fused-attention efficiency at `context` keys per query and `head_dim`.
    pub fn attention_at(&self, context: f64, head_dim: f64) -> f64 {
        let seq = context / (context + self.attention_half_seq);
        let d = |x: f64| x / (x + self.attention_half_head_dim);
        let dim = (d(head_dim) / d(128.0)).min(1.0);
        self.attention * seq * dim
    }
}

/// The attention kernel a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionKernel {
    /// Unfused: QKᵀ and PV as batched GEMMs over the full `s×s` scores, softmax (and mask,
    /// dropout) as memory-bound kernels over them (transformers `eager`, Megatron without
    /// flash attention).
    Eager,
    /// FlashAttention-2 class (`flash_attention_2`, PyTorch SDPA's flash backend).
    Flash2,
    /// Hopper-native fused attention (FlashAttention-3, cuDNN via Transformer Engine).
    Flash3,
}

impl AttentionKernel {
    /// The kernel a workload names, on a GPU architecture, under Megatron (Transformer Engine
    /// picks cuDNN's fused attention on Hopper and newer) or PyTorch.
    pub fn resolve(attention: AttentionImpl, architecture: &str, megatron: bool) -> Self {
        match attention {
            AttentionImpl::Eager => AttentionKernel::Eager,
            _ if megatron && matches!(architecture, "hopper" | "blackwell") => {
                AttentionKernel::Flash3
            }
            _ => AttentionKernel::Flash2,
        }
    }
}

/// Forward + backward fraction of the dense bf16 peak of a fused attention kernel at long
/// sequences, head dim 128, causal:
/// - FlashAttention-2 on Ampere: "50-73% of the theoretical maximum FLOPs/s on A100" (Dao
///   2023, "FlashAttention-2", abstract; forward + backward, the upper part at long sequences)
///   = 0.64;
/// - FlashAttention-2 on Hopper: "only 35% utilization" (Shah et al. 2024, "FlashAttention-3",
///   §1) = 0.35; FlashAttention-3 / cuDNN on Hopper: ~75% forward, backward 1.5–1.75× faster
///   than FA2 (same paper, Fig. 5/6) ≈ 0.55 over forward + backward;
/// - other architectures (Ada, Blackwell without a native kernel, AMD, TPU): 0.4, an assumption.
pub fn attention_peak_fraction(kernel: AttentionKernel, architecture: &str) -> f64 {
    match (kernel, architecture) {
        (AttentionKernel::Flash3, "hopper" | "blackwell") => 0.55,
        (_, "ampere") => 0.64,
        (_, "hopper") => 0.35,
        _ => 0.4,
    }
}

/// What share of a layer's forward runs again in the backward, by op class.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Recompute {
    /// Share of the forward GEMM time recomputed.
    pub gemm: f64,
    /// Share of the forward attention-core time recomputed.
    pub attention: f64,
    /// Share of the forward elementwise time recomputed.
    pub elementwise: f64,
}

impl Recompute {
    /// No activation checkpointing.
    pub const NONE: Recompute = Recompute {
        gemm: 0.0,
        attention: 0.0,
        elementwise: 0.0,
    };
    /// Full recomputation of every layer (transformers `gradient_checkpointing_enable()`,
    /// Megatron `--recompute-granularity full --recompute-method uniform`, torchtitan
    /// `mode = "full"`): the whole forward of each layer runs twice.
    pub const FULL: Recompute = Recompute {
        gemm: 1.0,
        attention: 1.0,
        elementwise: 1.0,
    };
    /// Megatron selective recomputation (`--recompute-granularity selective`, Korthikanti et
    /// al. 2022 §5): only the core attention is recomputed.
    pub const SELECTIVE_ATTENTION: Recompute = Recompute {
        gemm: 0.0,
        attention: 1.0,
        elementwise: 0.0,
    };
    /// torchtitan op-level selective AC (`selective_ac_option = "op"`,
    /// `torchtitan/parallelisms/parallelize_llama.py` `_save_list`): every other matmul and
    /// all elementwise ops are recomputed; attention and reduce-scatter outputs are saved.
    pub const TORCHTITAN_OP: Recompute = Recompute {
        gemm: 0.5,
        attention: 0.0,
        elementwise: 1.0,
    };

    /// Full recomputation of one layer in `n` (torchtitan `selective_ac_option = "n"`).
    pub fn every_nth_layer(n: u64) -> Recompute {
        let f = 1.0 / n.max(1) as f64;
        Recompute {
            gemm: f,
            attention: f,
            elementwise: f,
        }
    }

    /// What a workload's `checkpointing` switch and policy mean: `full` recomputes every layer;
    /// `selective-attn` the attention cores; `every-k:K` one layer in K (exact when the layer count is a multiple of K; see
    /// [`Recompute::for_layers`]).
    pub fn from_workload(w: &TrainWorkload) -> Recompute {
        match (w.checkpointing, w.step_options.checkpointing_policy) {
            (false, _) => Recompute::NONE,
            (true, CheckpointPolicy::Full) => Recompute::FULL,
            (true, CheckpointPolicy::EveryK(k)) => Recompute::every_nth_layer(k),
            (true, CheckpointPolicy::SelectiveAttn) => Recompute::SELECTIVE_ATTENTION,
            (true, CheckpointPolicy::SelectiveOp) => Recompute::TORCHTITAN_OP,
        }
    }

    /// [`Recompute::from_workload`] for a model of `layers` decoder layers: the share of the
    /// layers the policy checkpoints (`every-k:K` covers `⌊layers / K⌋` of them), each recomputed
    /// whole.
    pub fn for_layers(w: &TrainWorkload, layers: usize) -> Recompute {
        if !w.checkpointing {
            return Recompute::NONE;
        }
        if w.step_options
            .checkpointing_policy
            .recomputes_attention_only()
        {
            return Recompute::SELECTIVE_ATTENTION;
        }
        if w.step_options.checkpointing_policy.saves_matmuls() {
            return Recompute::TORCHTITAN_OP;
        }
        let f = w.step_options.checkpointing_policy.share(layers);
        Recompute {
            gemm: f,
            attention: f,
            elementwise: f,
        }
    }

    /// [`Recompute::for_layers`] for `model`, with `selective-op`'s GEMM share exact: the
    /// FLOP-weighted share of the layers' matmuls the policy recomputes
    /// (`selective_op_gemm_share`).
    pub fn for_model(w: &TrainWorkload, model: &ModelDesc) -> Recompute {
        let r = Recompute::for_layers(w, model.layers.len());
        if w.checkpointing && w.step_options.checkpointing_policy.saves_matmuls() {
            return Recompute {
                gemm: selective_op_gemm_share(model, w.lora.as_ref()),
                ..r
            };
        }
        r
    }
}

/// How the step is executed: kernels, recomputation and the overlap switches of the engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Execution {
    /// Megatron-LM's runtime (tensor/pipeline/context/expert parallelism, its fused kernels,
    /// its DDP and distributed optimizer) rather than PyTorch/DeepSpeed's.
    pub megatron: bool,
    /// Recomputation policy.
    pub recompute: Recompute,
    /// Attention kernel.
    pub attention: AttentionKernel,
    /// Elementwise ops run as fused kernels (Megatron's fused kernels, `torch.compile`)
    /// rather than PyTorch eager's one kernel per op.
    pub fused_elementwise: bool,
    /// Norms run as one fused kernel even when other elementwise ops do not (torchtitan
    /// `norm_type = "fused_rmsnorm"`; LayerNorm is always one native kernel).
    pub fused_norm: bool,
    /// Data-parallel gradient reduction overlapped with the backward, bucket by bucket
    /// (PyTorch DDP always; Megatron `--overlap-grad-reduce`).
    pub overlap_grad_reduce: bool,
    /// Distributed-optimizer parameter all-gather overlapped with the next forward
    /// (Megatron `--overlap-param-gather`).
    pub overlap_param_gather: bool,
    /// Tensor-parallel collectives overlapped with the neighbouring GEMMs (Megatron
    /// `--tp-comm-overlap`, torchtitan async TP).
    pub tp_comm_overlap: bool,
    /// Pipeline sends/receives overlapped with compute (Megatron's interleaved schedule
    /// `overlap_p2p_comm`).
    pub pp_p2p_overlap: bool,
    /// Gradient bucket size in bytes (PyTorch DDP `bucket_cap_mb = 25`; Megatron
    /// `bucket_size = max(40M, 1M·dp)` parameters).
    pub grad_bucket_bytes: f64,
    /// Megatron sends pipeline activations scattered over the tensor-parallel ranks
    /// (Narayanan et al. 2021 §4.1 scatter/gather).
    pub pp_scatter_gather: bool,
}

impl Execution {
    /// What the engine the layout resolves to does by default: Megatron-LM when the layout is
    /// model-parallel (tp, pp, cp or ep > 1), PyTorch/DeepSpeed otherwise.
    ///
    /// Megatron's overlap switches default to on: `--overlap-grad-reduce` and
    /// `--overlap-param-gather` are what NVIDIA's published configurations run (Megatron-LM
    /// README, "Communication optimizations"); `--tp-comm-overlap` defaults to off (it needs
    /// Transformer Engine userbuffers and is opt-in).
    pub fn defaults(layout: &Layout, w: &TrainWorkload, hw: &Hardware) -> Self {
        let megatron = layout.model_parallel();
        let grad_bytes = if megatron {
            // megatron/core/distributed/distributed_data_parallel.py: bucket_size =
            // max(40_000_000, 1_000_000 · dp) parameters
            (40e6_f64).max(1e6 * layout.dp() as f64) * 2.0
        } else {
            // torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25)
            25.0 * 1024.0 * 1024.0
        };
        Execution {
            megatron,
            recompute: Recompute::from_workload(w),
            attention: AttentionKernel::resolve(w.attention, &hw.architecture, megatron),
            fused_elementwise: megatron,
            fused_norm: megatron,
            overlap_grad_reduce: true,
            overlap_param_gather: megatron,
            tp_comm_overlap: false,
            pp_p2p_overlap: layout.schedule == Schedule::Interleaved,
            grad_bucket_bytes: grad_bytes,
            pp_scatter_gather: true,
        }
    }
}

/// The FLOP-weighted share of the decoder layers' matmuls that torchtitan's op-level selective
/// AC recomputes (`torchtitan/distributed/activation_checkpoint.py` `SelectiveAC`, 0.3.0):
/// per layer call the unbiased linears (`aten.mm`) are counted in forward order and every second
/// one runs again in backward; biased ones (`addmm`) are always kept (the memory replay,
/// `memory/hf/sac.rs`, classifies the same ops). A LoRA adapter's two matmuls follow its base
/// layer's (peft `lora.Linear.forward`: base, then `lora_B(lora_A(x))`) and take part in the
/// count; their FLOPs (rank-sized) are counted too. The attention cores are kept
/// (`Recompute::attention` 0).
pub fn selective_op_gemm_share(model: &ModelDesc, lora: Option<&Lora>) -> f64 {
    let hidden = model.hidden_size;
    let targeted = |role: LinearRole| {
        lora.is_some_and(|l| {
            model
                .linear_names
                .iter()
                .any(|(r, name)| *r == role && l.targets.iter().any(|t| t == name))
        })
    };
    let (mut total, mut recomputed) = (0.0_f64, 0.0_f64);
    for layer in &model.layers {
        let mut linears = layer.mixer_linears(hidden);
        if let Mlp::Dense(d) = &layer.mlp {
            linears.extend(d.linears(hidden));
        }
        let mut count = 0u64;
        let mut mm = |flops: f64, bias: bool| {
            total += flops;
            if !bias {
                count += 1;
                if count.is_multiple_of(2) {
                    recomputed += flops;
                }
            }
        };
        for l in linears {
            let (i, o) = (l.in_features as f64, l.out_features as f64);
            mm(i * o, l.bias);
            if let (Some(lo), true) = (lora, targeted(l.role)) {
                let r = lo.rank as f64;
                mm(i * r, false);
                mm(r * o, false);
            }
        }
    }
    if total > 0.0 {
        recomputed / total
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_efficiency_saturates_and_penalises_small_dims() {
        let hw = crate::time::collective::tests::h100();
        let e = Efficiencies::for_hardware(&hw);
        let big = e.gemm(8192.0, 4096.0, 4096.0);
        assert!((big - 0.803 * 0.85).abs() < 1e-12);
        let skinny = e.gemm(8192.0, 4096.0, 16.0);
        assert!(skinny < 0.2 * big, "{skinny}");
        assert!(e.gemm(512.0, 4096.0, 4096.0) < big);
    }

    #[test]
    fn attention_efficiency_grows_with_sequence() {
        let hw = crate::time::collective::tests::h100();
        let e = Efficiencies::defaults(&hw, AttentionKernel::Flash3);
        assert!(e.attention_at(512.0, 128.0) < e.attention_at(8192.0, 128.0));
        assert!(e.attention_at(8192.0, 64.0) < e.attention_at(8192.0, 128.0));
        assert!(e.attention_at(1e9, 128.0) <= 0.55);
    }
}
