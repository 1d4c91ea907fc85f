//! [`Engine::Megatron`]: Megatron-LM with tensor (+ sequence), pipeline, context and
//! expert parallelism. Megatron runs its own layers, not transformers', so this profile is
//! the published mechanism, not a replay of a measured one:
//!
//! - model states: `megatron/training/theoretical_memory_usage.py`
//!   (`compute_weight_and_optimizer_memory`): bf16 weights (2 B), fp32 main gradients (4 B),
//!   fp32 master (4 B) and the optimizer's fp32 states — Adam's two moments (8 B), so
//!   18 B/parameter, or 6 + 12/dp with the distributed optimizer (`--use-distributed-optimizer`,
//!   which is what `--strategy zero1` selects here). The states come from
//!   [`crate::optimizer::Optimizer::state_bytes`] over fp32 main parameters, the same
//!   accounting as ZeRO's fp32 partitions; the optimizers Megatron-LM has not got are refused
//!   by its capability row before this runs (`engine::TABLE`);
//!   stage 0 holds the word embeddings, the last stage the output layer (a copy of the
//!   embeddings when they are tied and pp > 1);
//! - activations per layer: Korthikanti et al. 2022, "Reducing Activation Recomputation in
//!   Large Transformer Models" (arXiv 2205.05198), §4.1 and Table 2, generalised from
//!   `34·sbh + 5·as²b` to grouped-query heads, gated MLPs, MoE top-k routing and dropout-free
//!   configs (each saved tensor below names its term);
//! - in-flight micro-batches per pipeline rank: `megatron/core/pipeline_parallel/schedules.py`
//!   (1F1B warm-up `pp − rank − 1`, interleaved `2·(pp − rank − 1) + (v − 1)·pp`), GPipe all.
//!
//! Rank order follows Megatron's default `tp-cp-ep-dp-pp` (`parallel_state.py`): pipeline
//! stage `k` is the contiguous block of ranks `[k·gpus/pp, (k+1)·gpus/pp)`.

use super::ranks::{worst_group, DistEstimate, RankGroup, RankSet};
use super::{to_u64, Category, Phase};
use crate::engine::Engine;
use crate::error::CoreError;
use crate::layout::{Layout, Schedule, Strategy};
use crate::model::{layer_runs, AttentionKind, LayerSpec, Mlp, ModelDesc};
use crate::workload::{AttentionImpl, Precision, TrainWorkload};

/// Saved activation bytes of one layer per token: (replicated unless sequence-parallel,
/// split by tensor parallelism).
fn layer_activation_per_token(
    l: &LayerSpec,
    model: &ModelDesc,
    w: &TrainWorkload,
    tokens_in_attention: u128,
) -> (u128, u128) {
    let h = u128::from(model.hidden_size);
    let e = 2; // bf16 activations (Korthikanti's 2-byte accounting)
               // `--no-dropout` is Megatron-LM's `--attention-dropout 0 --hidden-dropout 0` (what
               // `--emit megatron` writes): no masks are kept (its dropouts call `F.dropout`, which returns
               // the input when p = 0: aten/src/ATen/native/Dropout.cpp `dropout`, torch 2.15)
    let dropout = w.dropout && model.dropout.residual > 0.0;
    let attn_dropout = w.dropout && model.dropout.attention > 0.0;
    // replicated without SP: the two norm inputs (4sbh), the QKV input (2sbh), the MLP input
    // (2sbh), and the two 1-byte residual dropout masks (2sbh) when dropout is on
    let mut replicated = 2 * e * h + e * h + e * h;
    if dropout {
        replicated += 2 * h;
    }
    let (q_width, kv_width, heads) = match l.attention.kind {
        AttentionKind::Standard {
            num_heads,
            num_kv_heads,
            head_dim,
        } => (
            u128::from(num_heads * head_dim),
            u128::from(num_kv_heads * head_dim),
            u128::from(num_heads),
        ),
        AttentionKind::Mla {
            num_heads,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            ..
        } => (
            u128::from(num_heads * (qk_nope_head_dim + qk_rope_head_dim)),
            u128::from(num_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)) / 2,
            u128::from(num_heads),
        ),
    };
    // split by TP: Q and K for QKᵀ (Korthikanti's 4sbh, GQA-sized K), V (2sbh), the output
    // projection's input (2sbh)
    let mut split = e * q_width + e * kv_width + e * kv_width + e * q_width;
    match w.attention {
        // flash/fused attention keeps the output (counted above as the projection input) and
        // an fp32 logsumexp per head; the s² terms of Table 2 are gone (what selective
        // recomputation achieves)
        AttentionImpl::Sdpa | AttentionImpl::Flash => split += 4 * heads,
        // unfused: softmax output (2as²b) [+ dropout mask as²b + dropout output 2as²b]
        AttentionImpl::Eager => {
            split += heads * tokens_in_attention * if attn_dropout { 5 } else { 2 };
        }
    }
    let dense_mlp = |d: &crate::model::DenseMlp| -> u128 {
        let f = u128::from(d.intermediate);
        // fc1 output kept for the activation (GeLU input 8sbh for f = 4h; both halves for a
        // gated unit) and the activation output as fc2's input (8sbh for f = 4h)
        if d.gated {
            e * 2 * f + e * f
        } else {
            e * f + e * f
        }
    };
    split += match &l.mlp {
        Mlp::Dense(d) => dense_mlp(d),
        // no feed-forward block (state-space layers are refused before this, see `mixer`)
        Mlp::None => 0,
        Mlp::Moe(m) => {
            // each token's hidden state is dispatched to top-k experts: k copies of the expert
            // input plus each expert's intermediates; router logits/probs in fp32
            let k = u128::from(m.top_k);
            k * (e * h + dense_mlp(&m.expert))
                + 2 * 4 * u128::from(m.num_experts)
                + m.shared.as_ref().map_or(0, |s| e * h + dense_mlp(s))
        }
    };
    (replicated, split)
}

/// Every rank of a Megatron-LM job (the caller has checked the workload against
/// [`Engine::Megatron`]'s capabilities).
pub(crate) fn simulate(
    model: &ModelDesc,
    w: &TrainWorkload,
    layout: &Layout,
) -> Result<DistEstimate, CoreError> {
    let (p, t, c, ep) = (
        u128::from(layout.pp),
        u128::from(layout.tp),
        u128::from(layout.cp),
        u128::from(layout.ep),
    );
    let v = u128::from(layout.virtual_stages);
    let n_layers = model.layers.len() as u128;
    if model.layers.iter().any(|l| !l.mixer.is_attention()) {
        // the formulas below (Korthikanti et al. 2022) describe attention + MLP layers only
        return Err(CoreError::invalid_value(
            "model_type",
            &model.model_type,
            "tensor/pipeline-parallel layouts (Megatron-LM) of models with state-space layers are not modelled",
            "use a data-parallel layout (ddp, fsdp2, zero) or a single GPU",
        ));
    }
    if model.vision.is_some() {
        // Megatron-LM trains vision-language models with its own multimodal models
        // (megatron/core/models/multimodal/), not transformers' wrappers; the formula here
        // covers the text layers only, so the vision tower would be missing from the estimate
        return Err(CoreError::invalid_value(
            "model_type",
            &model.model_type,
            "tensor/pipeline-parallel layouts (Megatron-LM) of vision-language models are not modelled (the formula covers the text layers, not the vision tower)",
            "use a data-parallel layout (ddp, fsdp2, zero) or a single GPU",
        ));
    }
    if !n_layers.is_multiple_of(p * v) {
        return Err(CoreError::invalid(
            "pp",
            format!(
                "{n_layers} layers do not split evenly into pp·virtual_stages = {} chunks",
                p * v
            ),
        ));
    }
    if u128::from(w.seq) % c != 0 {
        return Err(CoreError::invalid(
            "cp",
            format!("seq {} is not divisible by cp {c}", w.seq),
        ));
    }
    for (l, _) in layer_runs(&model.layers) {
        let heads = u128::from(l.attention.num_heads());
        if heads % t != 0 {
            return Err(CoreError::invalid(
                "tp",
                format!("{heads} attention heads are not divisible by tp {t}"),
            ));
        }
        if let Mlp::Moe(m) = &l.mlp {
            if u128::from(m.num_experts) % ep != 0 {
                return Err(CoreError::invalid(
                    "ep",
                    format!("{} experts are not divisible by ep {ep}", m.num_experts),
                ));
            }
        }
    }
    if ep > 1 && !model.layers.iter().any(|l| matches!(l.mlp, Mlp::Moe(_))) {
        return Err(CoreError::invalid(
            "ep",
            "expert parallelism needs a mixture-of-experts model",
        ));
    }
    let dp = u128::from(layout.dp());
    let sp = layout.sequence_parallel && t > 1;
    let m = u128::from(w.grad_accum); // micro-batches per step per pipeline
    let h = u128::from(model.hidden_size);
    let vocab = u128::from(model.embeddings.vocab_size);
    // tokens of one micro-batch on one rank: context parallelism splits the sequence
    let tokens = u128::from(w.batch) * u128::from(w.seq) / c;
    let seq_local = u128::from(w.seq) / c;

    // bytes per parameter (theoretical_memory_usage.py): weights, main grads, fp32 master
    // (`--bf16`/`--fp16`; none in fp32, where the weights are the main params)
    let (weight_b, grad_b, master_b) = match w.precision {
        Precision::Fp32 => (4, 4, 0),
        _ => (2, 4, 4),
    };
    // master + the optimizer's fp32 states of `n` main-parameter elements (one flat shard
    // per rank with the distributed optimizer, `distrib_optimizer.py`)
    let main_param_states = |n: u128| n * master_b + w.optimizer.flat_state_bytes(n, 4);
    let distributed_optimizer = layout.strategy == Strategy::Zero1;
    let dense_shard = if distributed_optimizer { dp * c } else { 1 };
    let expert_shard = if distributed_optimizer {
        (dp * c / ep).max(1)
    } else {
        1
    };

    let layers_per_stage = n_layers / p;
    let ckpt = w.checkpointing;
    let mut groups = Vec::new();
    let ranks_per_stage = u64::try_from(u128::from(layout.gpus) / p)
        .map_err(|_| CoreError::Overflow { what: "ranks" })?;
    for k in 0..p {
        let first = k == 0;
        let last = k == p - 1;
        // parameters on this stage (per TP rank)
        let (mut dense, mut replicated, mut experts): (u128, u128, u128) = (0, 0, 0);
        let mut act_layer_max: u128 = 0;
        let mut act_stage: u128 = 0;
        let stage = &model.layers[(k * layers_per_stage) as usize..][..layers_per_stage as usize];
        // equal consecutive layers are counted once, times their number
        for (l, n) in layer_runs(stage) {
            let norms: u128 = [l.attn_norm, l.attn_post_norm, l.mlp_norm, l.mlp_post_norm]
                .iter()
                .flatten()
                .map(|n| n.params())
                .sum();
            let moe_experts = match &l.mlp {
                Mlp::Moe(mm) => u128::from(mm.num_experts) * mm.expert.params(model.hidden_size),
                Mlp::Dense(_) | Mlp::None => 0,
            };
            replicated += n * norms;
            experts += n * moe_experts;
            dense += n * (l.params(model.hidden_size) - norms - moe_experts);
            let (rep, split) = layer_activation_per_token(l, model, w, seq_local);
            let per_layer = tokens * (if sp { rep / t } else { rep } + split / t);
            act_layer_max = act_layer_max.max(per_layer);
            // full recomputation keeps each layer's input only (2sbh, split under SP)
            let stored = if ckpt {
                tokens * 2 * h / if sp { t } else { 1 }
            } else {
                per_layer
            };
            act_stage += n * stored;
        }
        let embed = vocab * u128::from(model.embeddings.dim);
        if first {
            dense += embed
                + model
                    .embeddings
                    .learned_positions
                    .map_or(0, |pos| u128::from(pos) * h * t);
        }
        if last {
            replicated += model.head.final_norm.map_or(0, |n| n.params());
            if !model.head.tied || p > 1 {
                dense += embed;
            }
        }
        let params_rank = dense / t + replicated + experts / (t * ep);
        let weights = params_rank * weight_b;
        let grads = params_rank * grad_b;
        let states = main_param_states((dense / t + replicated).div_ceil(dense_shard))
            + main_param_states((experts / (t * ep)).div_ceil(expert_shard));
        // in-flight micro-batches (chunks of layers_per_stage / v layers for interleaved)
        let in_flight_layers = match layout.schedule {
            Schedule::OneFOneB => (p - k).min(m) * layers_per_stage,
            Schedule::Interleaved => {
                let chunks = (2 * (p - k - 1) + (v - 1) * p + 1).min(m * v);
                chunks * layers_per_stage / v
            }
            Schedule::Gpipe => m * layers_per_stage,
        };
        let in_flight_mb = match layout.schedule {
            Schedule::OneFOneB => (p - k).min(m),
            Schedule::Interleaved => (2 * (p - k - 1) + (v - 1) * p + 1).min(m * v).div_ceil(v),
            Schedule::Gpipe => m,
        };
        let mut activations = act_stage / layers_per_stage.max(1) * in_flight_layers;
        if ckpt {
            // the layer being recomputed holds its full activations during its backward
            activations += act_layer_max;
        }
        if first {
            // input ids (int64) of every in-flight micro-batch, and the embedding dropout mask
            activations += in_flight_mb * tokens * 8;
            if w.dropout && model.dropout.embed > 0.0 {
                activations += in_flight_mb * tokens * h / if sp { t } else { 1 };
            }
        }
        let loss = if last {
            // output-layer input (2sbh, split under SP), vocab-parallel logits in bf16 and the
            // fp32 copy `vocab_parallel_cross_entropy` works on (2 + 4 bytes per logit)
            tokens * 2 * h / if sp { t } else { 1 } + tokens * vocab / t * 6
        } else {
            0
        };
        let peak = weights + grads + states + activations + loss;
        let at_peak = vec![
            (Category::Weights, to_u64(weights, "weights")?),
            (Category::Buffers, 0),
            (Category::Gradients, to_u64(grads, "gradients")?),
            (
                Category::OptimizerStates,
                to_u64(states, "optimizer states")?,
            ),
            (Category::Activations, to_u64(activations, "activations")?),
            (Category::LossBuffers, to_u64(loss, "loss buffers")?),
            (Category::Temporaries, 0),
            (Category::OptimizerTemporaries, 0),
            (Category::CommBuffers, 0),
        ];
        let k64 = u64::try_from(k).map_err(|_| CoreError::Overflow { what: "stage" })?;
        // a stage is a contiguous block of ranks
        let (lo, hi) = (k64 * ranks_per_stage, (k64 + 1) * ranks_per_stage - 1);
        let span = if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        };
        groups.push(RankGroup {
            label: format!("pp stage {k} (ranks {span})"),
            ranks: RankSet::span(lo, hi, layout.gpus),
            peak_bytes: to_u64(peak, "peak bytes")?,
            at_peak,
            phase: Phase::Backward,
            host_bytes: 0,
            model_state_bytes: to_u64(weights + grads + states, "model states")?,
            phase_peaks: Vec::new(),
        });
    }
    let worst = worst_group(&groups);
    let params_total = model.param_counts()?.total;
    Ok(DistEstimate {
        engine: Engine::Megatron,
        peak_bytes: groups[worst].peak_bytes,
        worst,
        groups,
        host_bytes_per_node: 0,
        nvme_bytes_per_rank: 0,
        // gradients are reduced in place in the fp32 main-grad buffer (counted as gradients)
        // and the distributed optimizer gathers into the parameter buffer itself
        comm_buffers: Vec::new(),
        dp: layout.dp(),
        global_batch: w
            .batch
            .saturating_mul(w.grad_accum)
            .saturating_mul(layout.dp()),
        params_total,
    })
}
