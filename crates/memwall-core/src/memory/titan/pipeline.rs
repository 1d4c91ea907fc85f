//! torchtitan 0.3.0's pipeline parallelism (`parallelism.pipeline_parallel_degree` > 1): one
//! pp rank's stage(s), its schedule's order of forwards and backwards, and what is alive at each
//! backward.
//!
//! Sources (torchtitan 0.3.0, torch 2.15.0):
//! - the stage split: `torchtitan/distributed/pipeline_parallel.py`
//!   `_generate_llm_fqn_per_model_part` (the embeddings and `[norm, lm_head]` each weigh one
//!   layer, `pipeline_parallel_first_stage_less_layers = 1`, `_last_stage_less_layers = 1`;
//!   `num_effective_layers // num_stages` per stage, the first `% num_stages` stages one more),
//!   stages per rank (`_get_pipeline_metadata`: 1 for single-stage schedules, 2 for looped ones
//!   without `pipeline_parallel_layers_per_stage`) and the rank's stages
//!   (`_get_pp_rank_to_stage_indices_mapping`, "loop" style: `rank + k·pp`);
//! - FSDP2 under PP: `distributed/fsdp.py` `get_fsdp_reshard_after_forward_policy` ("default"
//!   is *no* reshard after forward when PP is on), and torch's
//!   `distributed/pipelining/stage.py` `backward_maybe_with_nosync` (every microbatch's
//!   backward runs with `set_requires_gradient_sync(False)` and
//!   `set_reshard_after_backward(False)`: the units stay gathered in bf16 through the step and
//!   FSDP2 accumulates the unsharded gradients in fp32, `reduce_dtype`, until the stage's
//!   `REDUCE_GRAD` action reduce-scatters them: `schedules.py` `_add_reduce_grad` places it
//!   right after the stage's last backward, `start_gradient_reduction`);
//! - the orders: torch's `distributed/pipelining/schedules.py` (`ScheduleGPipe`: every forward
//!   then every backward; `Schedule1F1B`: `min(n, pp - rank)` warm-up forwards, then one
//!   backward and one forward; `ScheduleInterleaved1F1B._calculate_single_rank_operations` with
//!   `_get_warmup_ops` and `_get_1f1b_rank_ops`).
//!
//! Measured (`tools/truth/titan/measure_titan.py --pp-cases`, `tests/truth/titan_pp.jsonl`:
//! FSDPMemTracker on fake tensors and a fake pp × dp_shard mesh, one pp rank each, torch's
//! pipelining stages given their static metadata because it refuses runtime shape inference over
//! a fake process group), each peak at one backward:
//! - per microbatch held from its forward to its backward: the stage's blocks' saved tensors
//!   (the no-AC set of `step.rs`), the received input (`[mb, seq, dim]` bf16) on every stage
//!   but the first, the stage's output held by the schedule for its backward (bf16 hidden
//!   state; on the last stage the logits, the final norm's saved tensors and the fp32
//!   log-softmax the loss saves, the loss being computed right after each forward);
//! - the first stage's peak: the embeddings' backward (its bf16 weight gradient while the fp32
//!   accumulated gradient exists, the stage output, the received gradient and the embedding
//!   output's gradient: three `[mb, seq, dim]` bf16);
//! - a middle stage's: its last block's feed-forward backward (`w2`'s bf16 gradient and one
//!   `[mb, seq, F]` gradient), with every in-flight microbatch's tensors;
//! - the last stage's: the loss backward (two fp32 vocabulary-sized gradients, as without PP);
//! - Qwen 3 (dense, untied) stages as Llama 3's, with its blocks' q/k norms and head_dim
//!   (`step.rs`) and its cos/sin RoPE cache (`TitanModel::rope_row_bytes`) per block; torchtitan
//!   refuses a tied model under PP (`models/common/decoder.py`), so the tied unit never splits;
//! - Qwen 3 MoE stages: a stage before the last peaks at its last block's experts' first weight
//!   gradient (each bf16 expert gradient is accumulated into the fp32 one as soon as it is
//!   computed, so one is alive), with the block's expert intermediates still saved.
//! - under FullAC / SelectiveAC a block keeps its checkpoint input (on a stage after the
//!   first, the first block's is the received buffer itself) or SelectiveAC's outputs per
//!   microbatch, and its backward recomputes the no-AC set besides them; under every-k:K only
//!   every K-th block of the rank, counted from 1 across the rank's own stages (earlier
//!   torchtitan's process-wide layer-SAC counter; measured, `titan-pp-*-everyk*`);
//! - after its last microbatch's backward, the last stage's head unit is reduce-scattered
//!   first (its fp32 reduce-scatter input and shard while every accumulated gradient is
//!   alive); under Interleaved1F1B the rank's other stage still holds microbatches in flight
//!   then (measured with `measure_titan.py --live`, which lists the storages alive at the
//!   peak with the frames that allocated them);
//! - the fp32 unsharded gradients exist from a stage's first backward of the step on; the
//!   input-gradient send buffers of the last stage stay alive until the step's final wait (one
//!   per earlier backward), a middle stage's one.
//!
//! With TP + SP (`tp` > 1; `titan-pptp-*`, a fake pp × dp_shard × tp mesh; torchtitan 0.3.0's
//! `pipeline_llm` calls the model's `parallelize_fn` on every model part, so each stage gets the
//! TP plan of `step.rs` before FSDP2): the same instants, with the stage's FSDP units holding
//! TP-local shards (`Sizes` of a `tp` job), the blocks' saved tensors of `step.rs`'s TP
//! `BlockActs`, the residual stream on the sequence shard — the received input, the send
//! buffers and a checkpointed block's input are `[mb, seq/tp, dim]` bf16, what the stages
//! exchange (the harness gives the stages those TP-local shapes as static metadata) — the
//! final norm on the sequence shard with its output all-gathered for the LM head, and the
//! last stage's logits and loss vocabulary-parallel (`[mb·seq, V/tp]`; the loss backward's
//! three fp32 buffers of `_LossParallelCrossEntropy`, as in `step.rs`). Real tensors again keep
//! one boundary tensor, `[mb, seq/tp, dim]`, per in-flight microbatch fewer than fake ones on
//! the stages before the last (`xc-titan-pptp-*`).

use super::step::{Instant, Sizes};
use super::Shapes;
use crate::error::CoreError;
use crate::layout::Schedule;
use crate::memory::{Category, Phase};
use crate::workload::CheckpointPolicy;

/// One pp rank of a torchtitan job with pipeline parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipeJob {
    /// The model's shapes.
    pub shapes: Shapes,
    /// All ranks (`pp × dp_shard × tp`).
    pub world: u64,
    /// `pipeline_parallel_degree`.
    pub pp: u64,
    /// `tensor_parallel_degree` (1: no TP; with TP, sequence parallelism, torchtitan's default).
    pub tp: u64,
    /// The pp rank simulated.
    pub rank: u64,
    /// `pipeline_parallel_schedule`.
    pub schedule: Schedule,
    /// Stages per rank (1, or 2 for Interleaved1F1B).
    pub stages_per_rank: u64,
    /// `pipeline_parallel_microbatch_size`.
    pub microbatch_size: u64,
    /// Microbatches per step (`local_batch_size / microbatch_size`).
    pub microbatches: u64,
    /// `training.seq_len`.
    pub seq: u64,
    /// `optimizer.implementation = "fused"` (else "foreach").
    pub fused_optimizer: bool,
    /// Activation checkpointing (`FullAC` or `SelectiveAC` on every block, or every-k:K's
    /// `FullAC` wrapper on every K-th block of the rank; `None`: no AC).
    pub checkpointing: Option<CheckpointPolicy>,
}

/// What one pipeline stage holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stage {
    /// `tok_embeddings` is on it.
    pub embeddings: bool,
    /// Transformer blocks on it.
    pub blocks: u64,
    /// `norm` and `lm_head` are on it.
    pub head: bool,
}

/// torchtitan's default split of `layers` blocks into `stages` stages
/// (`_generate_llm_fqn_per_model_part` with input and output weights 1).
pub fn split(stages: u64, layers: u64) -> Result<Vec<Stage>, CoreError> {
    let effective = layers + 2;
    if stages == 0 || stages > effective || effective / stages == 0 {
        return Err(CoreError::invalid_value(
            "pp",
            stages,
            format!(
                "torchtitan splits {layers} layers plus the embeddings and the head (one layer \
                 each) into stages of at least one layer, and {stages} stages are too many"
            ),
            "use fewer pipeline stages (--pp, or --virtual-stages) or a deeper model",
        ));
    }
    let per = effective / stages;
    let extra = effective % stages;
    let mut current = 0u64;
    let mut out = Vec::new();
    for s in 0..stages {
        let here = per + u64::from(s < extra);
        if stages == 1 {
            return Ok(vec![Stage {
                embeddings: true,
                blocks: layers,
                head: true,
            }]);
        }
        let (embeddings, head, n) = if s == 0 {
            (true, false, here - 1)
        } else if s == stages - 1 {
            (false, true, here - 1)
        } else {
            (false, false, here)
        };
        let blocks = n.min(layers - current);
        current += blocks;
        // a stage may hold no transformer block (the embeddings alone, or `[norm, lm_head]`
        // alone, when the split gives it one "layer"): measured (`titan-pp-8b-2l-pp4r0-1f1b`,
        // `-2l-pp4r3-1f1b`, `-3l-pp4r3-gpipe`, `-10l-pp4r3-interleaved1f1b`, the qwen3
        // `-6l-pp4r{0,3}-interleaved1f1b` cases): the same instants without the blocks'
        // (the embeddings-only stage peaks at its gradient reduce-scatter, the head-only stage
        // at the LM head's weight gradient of its first backward)
        out.push(Stage {
            embeddings,
            blocks,
            head,
        });
    }
    Ok(out)
}

/// One action of a rank's schedule: a forward or a backward of `(local stage, microbatch)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    F(usize, u64),
    B(usize, u64),
}

/// The rank's order of forwards and backwards (torch 2.15's schedules, see the module docs).
fn order(job: &PipeJob) -> Vec<Op> {
    let n = job.microbatches;
    match job.schedule {
        Schedule::Gpipe => (0..n)
            .map(|m| Op::F(0, m))
            .chain((0..n).map(|m| Op::B(0, m)))
            .collect(),
        Schedule::OneFOneB => {
            let warm = n.min(job.pp - job.rank);
            let mut ops: Vec<Op> = (0..warm).map(|m| Op::F(0, m)).collect();
            let mut f = warm;
            for b in 0..n {
                ops.push(Op::B(0, b));
                if f < n {
                    ops.push(Op::F(0, f));
                    f += 1;
                }
            }
            ops
        }
        Schedule::Interleaved => {
            let v = job.stages_per_rank;
            let p = job.pp;
            let rounds = (n / p).max(1);
            let per_round = n / rounds;
            let total = n * v;
            let warm = ((v - 1) * per_round + 2 * (p - 1 - job.rank)).min(total);
            let fwd_stage = |step: u64| ((step / per_round) % v) as usize;
            let bwd_stage = |step: u64| (v - 1 - ((step - warm) / per_round) % v) as usize;
            let mut fi = vec![0u64; v as usize];
            let mut bi = vec![0u64; v as usize];
            let mut ops = Vec::new();
            let fwd_bwd = total - warm;
            for op in 0..(warm + fwd_bwd + warm) {
                if op < warm + fwd_bwd {
                    let s = fwd_stage(op);
                    ops.push(Op::F(s, fi[s]));
                    fi[s] += 1;
                }
                if op >= warm {
                    let s = bwd_stage(op);
                    ops.push(Op::B(s, bi[s]));
                    bi[s] += 1;
                }
            }
            ops
        }
    }
}

/// Every backward instant of the rank (and its optimizer step); the peak is the largest.
pub fn rank_instants(job: &PipeJob) -> Result<Vec<Instant>, CoreError> {
    use Category::{
        Activations, Buffers, Gradients, OptimizerStates, OptimizerTemporaries, Temporaries,
        Weights,
    };
    let s = &job.shapes;
    let v = job.stages_per_rank;
    let stages = split(job.pp * v, s.layers)?;
    let mine: Vec<Stage> = (0..v)
        .map(|k| stages[(job.rank + k * job.pp) as usize])
        .collect();
    let tp_deg = job.tp.max(1);
    let dp = job.world / job.pp / tp_deg;
    let tp = u128::from(tp_deg);
    let d = u128::from(s.dim);
    // TP-local: the vocabulary-parallel logits and the column-parallel feed-forward width
    let vocab = u128::from(s.vocab).div_ceil(tp);
    let f = u128::from(s.ffn) / tp;
    let seq = u128::from(job.seq);
    let tm = u128::from(job.microbatch_size) * seq;
    // the sequence-parallel shard of a microbatch's tokens (`tm` without TP): the residual
    // stream between blocks and across stage boundaries
    let tl = tm / tp;
    let tokens = tm * u128::from(job.microbatches);
    // per stage: the FSDP units' sizes (`Sizes` of a job with the stage's blocks, dp_shard ranks)
    // the FSDP units of one stage: a job of the stage's blocks over the dp_shard ranks
    let stage_sizes = |st: &Stage| -> Result<Sizes, CoreError> {
        Sizes::new(&super::step::Job {
            shapes: Shapes {
                layers: st.blocks,
                ..*s
            },
            world: dp * tp_deg,
            tp: tp_deg,
            ep: 1,
            batch: 1,
            seq: job.seq,
            checkpointing: None,
            reshard: super::ReshardPolicy::Never,
            fused_optimizer: job.fused_optimizer,
            float8: None,
        })
    };
    let sizes = |st: &Stage| -> Result<(u128, u128, u128, u128, u128), CoreError> {
        Ok(stage_sizes(st)?.stage(st.embeddings, st.head))
    };
    let per: Vec<(u128, u128, u128, u128, u128)> =
        mine.iter().map(sizes).collect::<Result<_, _>>()?;
    let sharded: u128 = per.iter().map(|x| x.0).sum();
    let padded: u128 = per.iter().map(|x| x.1).sum();
    let tensors: u128 = per.iter().map(|x| x.2).sum();
    let blocks: u128 = mine.iter().map(|x| u128::from(x.blocks)).sum();
    let grads: Vec<u128> = per.iter().map(|x| 4 * x.1).collect();
    let emb_padded: Vec<u128> = per.iter().map(|x| x.3).collect();
    // which of the rank's blocks run under a checkpoint wrapper: every block under FullAC and
    // SelectiveAC; under every-k:K every K-th block the rank holds, counted from 1 across its
    // stages in the order they are built (stage `rank`, then `rank + pp`): earlier torchtitan's
    // layer-level SAC counts the blocks given to it with one process-wide counter
    // (`distributed/activation_checkpoint.py` `_apply_layer_sac`, the module-global
    // `_layer_sac_count`, pytorch/torchtitan 01db32e9), and each pp rank's process builds and
    // wraps only its own model parts (measured: `titan-pp-*-everyk*`)
    let first_block: Vec<u64> = mine
        .iter()
        .scan(0u64, |n, st| {
            let here = *n;
            *n += st.blocks;
            Some(here)
        })
        .collect();
    let checkpointed = |ls: usize, j: u64| -> bool {
        job.checkpointing
            .is_some_and(|p| usize::try_from(first_block[ls] + j).is_ok_and(|c| p.covers(c)))
    };
    let no_ac = super::step::block_saved_no_ac(s, tp, tm);
    // what a block keeps per microbatch: its no-AC set, or under a checkpoint wrapper its input
    // (FullAC's, every-k's) or SelectiveAC's cached outputs
    let saved_when_checkpointed = match job.checkpointing {
        Some(CheckpointPolicy::SelectiveOp) => {
            super::step::block_saved(s, tp, tm, Some(CheckpointPolicy::SelectiveOp))
        }
        _ => super::step::block_saved(s, tp, tm, Some(CheckpointPolicy::Full)),
    };
    let saved = |ls: usize, j: u64| -> u128 {
        if checkpointed(ls, j) {
            saved_when_checkpointed
        } else {
            no_ac
        }
    };
    // the stage's last block: what it keeps, and what its backward holds of it (a checkpointed
    // block recomputes its no-AC set while its checkpoint input, and SelectiveAC's cached
    // outputs, the same tensors, stay: the no-AC set and the input)
    let last_block = |ls: usize| -> (u128, u128) {
        let st = &mine[ls];
        if st.blocks == 0 {
            return (0, 0);
        }
        let j = st.blocks - 1;
        if checkpointed(ls, j) {
            (saved(ls, j), no_ac + 2 * d * tl)
        } else {
            (no_ac, no_ac)
        }
    };
    // held per microbatch from its forward to its backward
    let held_at = |ls: usize| -> u128 {
        let st = &mine[ls];
        let mut h: u128 = (0..st.blocks).map(|j| saved(ls, j)).sum();
        // the received input (when the first block is checkpointed it is also that block's
        // checkpoint input: one storage)
        if !st.embeddings && (st.blocks == 0 || !checkpointed(ls, 0)) {
            h += 2 * d * tl;
        }
        if st.head {
            // final norm (fp32 input, normalised, rstd on the sequence shard; bf16 output,
            // all-gathered to every token under SP), bf16 logits, fp32 log-softmax saved by
            // `cross_entropy(pred.float())` (with TP the `V / tp` local ones of the
            // vocabulary-parallel loss)
            h += (8 * d + 4) * tl + 2 * d * tm + 2 * vocab * tm + 4 * vocab * tm;
        }
        // (on fake tensors a stage that is not the last also keeps a second `[mb, seq, dim]`
        // bf16 per microbatch, its output: an artefact of FakeTensorMode, absent on real
        // tensors, `tests/truth/titan_crosscheck.jsonl`; the real count is simulated)
        h
    };
    let base = |name: String, phase: Phase| {
        let mut x = Instant::new(name, phase);
        x.add(Weights, 4 * sharded + 2 * padded)
            .add(OptimizerStates, 8 * sharded + 4 * tensors)
            // the stage's blocks' RoPE caches (`seq_len` rows each: Llama 3's complex64,
            // Qwen 3's fp32 cos and sin, `TitanModel::rope_row_bytes`)
            .add(Buffers, blocks * seq * u128::from(s.rope_row_bytes()))
            // MoE: `expert_bias_E` and `tokens_per_expert_E` (fp32, one per expert) per block
            // (models/common/moe.py `MoE.__init__`)
            .add(
                Buffers,
                blocks * s.moe.map_or(0, |m| 8 * u128::from(m.experts)),
            )
            .add(Activations, 16 * tokens + 8 * tm);
        x
    };
    // a stage's `REDUCE_GRAD` (see the loop below): FSDP2's `finalize_backward`
    // (torch/distributed/fsdp/_fully_shard/_fsdp_state.py) runs the post-backward of every unit
    // in reverse registration order (`[norm, lm_head]`, the blocks from the last, the
    // embeddings), each one resharding the unit (its bf16 parameters freed), copying its fp32
    // accumulated gradient into an fp32 reduce-scatter input (the previous unit's input freed
    // first), writing its fp32 shard and freeing the accumulated gradient (measured, `--debug`
    // and `--live`: `titan-pp-70b-4l-pp2r1-gpipe-b2s512` (the head unit first),
    // `titan-pp-8b-2l-pp4r0-1f1b-b4s1024` (the embeddings alone, the peak)). One instant per
    // unit: its accumulated gradient, input and shard, the units before it resharded and
    // reduced, the units after it still gathered and accumulated.
    let finalize = |ls: usize,
                    live: &[((usize, u64), u128)],
                    earlier: u64,
                    others_grads: u128|
     -> Result<Vec<Instant>, CoreError> {
        let st = &mine[ls];
        let z = stage_sizes(st)?;
        // `(name, (shard, gathered) elements, shard written before the accumulated gradient
        // is freed)`: `foreach_reduce` (`_fsdp_collectives.py`) frees a block's accumulated
        // gradients (`unsharded_grads.clear()`) before its reduce-scatter output (the shard) is
        // allocated (measured on `titan-pp-8b-6l-pp4r1-gpipe-b8s1024-full`, `--debug`); the
        // single-weight units' (`[norm, lm_head]`, `tok_embeddings`) gradient is still alive
        // when their shard is written (measured on `titan-pp-70b-4l-pp2r1-gpipe-b2s512` and
        // `titan-pp-8b-2l-pp4r0-1f1b-b4s1024`; what keeps it was not found)
        let mut units: Vec<(&str, (u128, u128), bool)> = Vec::new();
        if st.head {
            units.push(("head unit", z.head_unit(), true));
        }
        for _ in 0..st.blocks {
            units.push(("block", z.block_unit(), false));
        }
        if st.embeddings {
            units.push(("embeddings", z.embedding_unit(), true));
        }
        // the input-gradient send buffers of the last stage (one per earlier backward; a
        // middle stage's last one is done by then: measured, `--debug`), and the microbatches
        // in flight on the rank's other stage
        let sends = if st.head && !st.embeddings {
            u128::from(earlier) * 2 * d * tl
        } else {
            0
        };
        let in_flight: u128 = live.iter().map(|(_, h)| *h).sum();
        let stage_no = job.rank + ls as u64 * job.pp;
        let mut accumulated: u128 = units.iter().map(|(_, (_, pad), _)| 4 * pad).sum();
        let mut shards = 0u128;
        let mut resharded = 0u128;
        let mut out = Vec::new();
        for (k, (what, (sh, pad), shard_first)) in units.iter().enumerate() {
            resharded += 2 * pad;
            if *shard_first {
                shards += 4 * sh;
            }
            let mut x = base(
                format!(
                    "stage {stage_no} gradient reduce-scatter after its last microbatch \
                     (unit {} of {}: {what})",
                    k + 1,
                    units.len()
                ),
                Phase::Backward,
            );
            x.add(Gradients, others_grads + accumulated + shards)
                .add(Category::CommBuffers, 4 * pad)
                .add(Activations, sends + in_flight)
                .add(Temporaries, if st.embeddings { 0 } else { 2 * d * tl });
            // the resharded units' bf16 parameters (`Category::ALL[0]` is `Weights`)
            debug_assert_eq!(Category::ALL[0], Weights);
            x.bytes[0] = x.bytes[0].saturating_sub(resharded);
            out.push(x);
            accumulated -= 4 * pad;
            if !*shard_first {
                shards += 4 * sh;
            }
        }
        Ok(out)
    };
    let mut out = Vec::new();
    let mut live: Vec<((usize, u64), u128)> = Vec::new();
    let mut backwards = vec![0u64; mine.len()];
    // a stage's gradients once reduced: its fp32 gradient shards (4 bytes per shard element)
    let reduced_grads: Vec<u128> = per.iter().map(|x| 4 * x.0).collect();
    let mut reduced = vec![false; mine.len()];
    for op in order(job) {
        match op {
            Op::F(ls, m) => live.push(((ls, m), held_at(ls))),
            Op::B(ls, m) => {
                let st = &mine[ls];
                let others: u128 = live
                    .iter()
                    .filter(|(k, _)| *k != (ls, m))
                    .map(|(_, h)| *h)
                    .sum();
                let grads_other: u128 = (0..mine.len())
                    .filter(|&x| x != ls && backwards[x] > 0)
                    .map(|x| {
                        if reduced[x] {
                            reduced_grads[x]
                        } else {
                            grads[x]
                        }
                    })
                    .sum();
                let own = if backwards[ls] > 0 { grads[ls] } else { 0 };
                let earlier: u64 = (0..mine.len())
                    .filter(|&x| !mine[x].embeddings)
                    .map(|x| backwards[x])
                    .sum();
                let sends = if st.embeddings {
                    0
                } else if st.head {
                    u128::from(earlier) * 2 * d * tl
                } else {
                    u128::from(earlier.min(1)) * 2 * d * tl
                };
                let stage_no = job.rank + ls as u64 * job.pp;
                let mut push = |what: &str, grads: u128, act: u128, temp: u128| {
                    let mut x = base(
                        format!("stage {stage_no} microbatch {m} backward: {what}"),
                        Phase::Backward,
                    );
                    x.add(Gradients, grads + grads_other)
                        .add(Activations, others + sends + act)
                        .add(Temporaries, temp);
                    out.push(x);
                };
                if st.head {
                    push(
                        "loss (log-softmax gradient)",
                        own,
                        held_at(ls),
                        // without TP two fp32 `[T, V]` gradients; with TP the
                        // vocabulary-parallel loss's (`_LossParallelCrossEntropy.backward`, as in
                        // `step.rs`): three fp32 `[T, V/tp]` buffers besides `log_probs`
                        if tp > 1 { 12 } else { 8 } * vocab * tm,
                    );
                    // the LM head's weight gradient (bf16) and, at the stage's first backward of
                    // the step, its fp32 copy that becomes the accumulated gradient (FSDP2's
                    // `reduce_dtype` under `set_requires_gradient_sync(False)`), both alive with
                    // the gradient of the final norm's output; the microbatch's fp32
                    // log-softmax is freed, its logits (the stage output) are not (measured:
                    // `titan-pp-8b-3l-pp4r3-gpipe-b4s1024`, `--live`, the first microbatch)
                    let head_pad = stage_sizes(st)?.head_unit().1;
                    push(
                        "LM head weight gradient",
                        if backwards[ls] > 0 { own } else { 4 * head_pad },
                        held_at(ls) - 4 * vocab * tm,
                        2 * head_pad + 2 * d * tm,
                    );
                }
                if st.blocks > 0 && !st.head {
                    let (last_saved, last_recomputed) = last_block(ls);
                    if let Some(moe) = s.moe {
                        // torchtitan's MoE experts' backward at their first weight gradient
                        // (measured, `titan-pp-qwen3-30b-a3b-4l-pp2r0-1f1b-b4s1024-dp8`,
                        // `--live`): under PP each bf16 expert gradient is accumulated into the
                        // fp32 unsharded gradient as soon as it is computed (no reduce-scatter
                        // holds it, unlike `step.rs`), so one `[E, F, D]` bf16 gradient is alive,
                        // with a `[T·K, D]` and a `[T·K, F]` gradient and the scores' fp32
                        // gradient; of the block's saved tensors the combine's fp32 routed
                        // output and the sorted scores are freed, the four expert
                        // intermediates are not yet
                        let (e, k, fe) = (
                            u128::from(moe.experts),
                            u128::from(moe.top_k),
                            u128::from(moe.expert_ffn),
                        );
                        push(
                            &format!(
                                "block {} MoE experts (first weight gradient)",
                                st.blocks - 1
                            ),
                            own,
                            (held_at(ls) - last_saved + last_recomputed)
                                .saturating_sub((4 * d * k + 4 * k) * tm),
                            2 * e * fe * d + (2 * d * k + 2 * fe * k + 4 * k) * tm + 2 * d * tm,
                        );
                    } else {
                        push(
                            &format!("block {} feed-forward (w2 gradient)", st.blocks - 1),
                            own,
                            held_at(ls) - last_saved + last_recomputed,
                            2 * f * d + 2 * f * tm,
                        );
                    }
                }
                if st.embeddings {
                    push(
                        "embeddings weight gradient",
                        grads[ls],
                        0,
                        2 * 2 * d * tm + 2 * emb_padded[ls],
                    );
                }
                live.retain(|(k, _)| *k != (ls, m));
                backwards[ls] += 1;
                // torch 2.15 `schedules.py` `_add_reduce_grad`: each stage's `REDUCE_GRAD`
                // (`start_gradient_reduction`, FSDP2's reduce-scatter of the accumulated
                // gradients) is scheduled right after the stage's last backward, so under
                // Interleaved1F1B the rank's later stage reduces while its other stage still
                // holds microbatches in flight (measured:
                // `titan-pp-qwen3-14b-6l-pp2r1-interleaved1f1b-b8s512`, `--live`); with one
                // stage per rank it is the schedule's last action
                if backwards[ls] == job.microbatches {
                    let others_grads: u128 = (0..mine.len())
                        .filter(|&x| x != ls && backwards[x] > 0)
                        .map(|x| {
                            if reduced[x] {
                                reduced_grads[x]
                            } else {
                                grads[x]
                            }
                        })
                        .sum();
                    let earlier: u64 = (0..mine.len())
                        .filter(|&x| !mine[x].embeddings)
                        .map(|x| backwards[x])
                        .sum();
                    out.extend(finalize(ls, &live, earlier, others_grads)?);
                    reduced[ls] = true;
                }
            }
        }
    }
    // then `clip_grad_norm_` and AdamW (fused in place, or foreach's fp32 list of the shards)
    let mut x = base(
        if job.fused_optimizer {
            "optimizer step (fused AdamW)".into()
        } else {
            "optimizer step (foreach AdamW)".into()
        },
        Phase::Optimizer,
    );
    // (every unit resharded and its accumulated gradient freed by then: measured, the end
    // of `titan-pp-70b-4l-pp2r1-gpipe-b2s512`'s log)
    x.bytes[0] = x.bytes[0].saturating_sub(2 * padded);
    x.add(Gradients, 4 * sharded).add(
        OptimizerTemporaries,
        if job.fused_optimizer { 0 } else { 4 * sharded },
    );
    out.push(x);
    Ok(out)
}

/// Model states of the rank (fp32 shards, gradient shards, AdamW states) and its parameters.
pub fn rank_states(job: &PipeJob) -> Result<(u128, u128), CoreError> {
    let stages = split(job.pp * job.stages_per_rank, job.shapes.layers)?;
    let mut states = 0u128;
    let mut params = 0u128;
    for k in 0..job.stages_per_rank {
        let st = stages[(job.rank + k * job.pp) as usize];
        let one = super::step::Job {
            shapes: Shapes {
                layers: st.blocks,
                ..job.shapes
            },
            world: job.world / job.pp,
            tp: job.tp.max(1),
            ep: 1,
            batch: 1,
            seq: job.seq,
            checkpointing: None,
            reshard: super::ReshardPolicy::Never,
            fused_optimizer: job.fused_optimizer,
            float8: None,
        };
        let z = Sizes::new(&one)?;
        let (sh, _, tensors, _, n) = z.stage(st.embeddings, st.head);
        states += 16 * sh + 4 * tensors;
        params += n;
    }
    Ok((states, params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_matches_torchtitans_default() {
        // 4 layers, 2 stages: [emb, l0, l1], [l2, l3, norm, lm_head]
        let s = split(2, 4).unwrap();
        assert_eq!(
            s,
            vec![
                Stage {
                    embeddings: true,
                    blocks: 2,
                    head: false
                },
                Stage {
                    embeddings: false,
                    blocks: 2,
                    head: true
                }
            ]
        );
        // 6 layers, 4 stages: [emb, l0], [l1, l2], [l3, l4], [l5, norm, lm_head]
        let s = split(4, 6).unwrap();
        assert_eq!(
            s.iter().map(|x| x.blocks).collect::<Vec<_>>(),
            vec![1, 2, 2, 1]
        );
        // 10 layers, 8 stages: the last holds norm and head alone
        let s = split(8, 10).unwrap();
        assert_eq!(
            s.iter().map(|x| x.blocks).collect::<Vec<_>>(),
            vec![1, 2, 2, 2, 1, 1, 1, 0]
        );
        assert!(s[7].head && !s[0].head && s[0].embeddings);
        // 2 layers, 4 stages: the embeddings alone, one block each, the head alone
        assert_eq!(
            split(4, 2)
                .unwrap()
                .iter()
                .map(|x| x.blocks)
                .collect::<Vec<_>>(),
            vec![0, 1, 1, 0]
        );
        // 32 layers, 4 stages: 34 effective, 9 9 8 8
        let s = split(4, 32).unwrap();
        assert_eq!(
            s.iter().map(|x| x.blocks).collect::<Vec<_>>(),
            vec![8, 9, 8, 7]
        );
        assert!(split(7, 4).is_err());
    }
}
