//! torchtitan's training step as named instants (see the module docs of `memory/titan`).
//!
//! Bytes are per rank. `T` = local batch × seq tokens; `D` = dim, `q` = n_heads × head_dim,
//! `kv` = n_kv_heads × head_dim, `F` = the feed-forward's hidden_dim, `V` = vocab_size.
//!
//! Under tensor parallelism (`tp` > 1, torchtitan's defaults `enable_sequence_parallel = true`,
//! `spmd_backend = "spmd_types"`): every rank holds its TP shard of each parameter
//! (`models/common/decoder_sharding.py`: `wqkv`, `w1`, `w3`, `tok_embeddings` and `lm_head`
//! sharded on dim 0, `wo` and `w2` on dim 1, the norms replicated), and FSDP2 shards that local
//! tensor's dim 0 over the `dp_shard = world / tp` ranks; the residual stream and the norms
//! run on `T / tp` tokens (sequence parallel), the inputs of the column-parallel linears are
//! all-gathered to `T` tokens (and saved by them), the row-parallel outputs are reduce-scattered
//! back, and the loss is vocabulary-parallel (`components/loss.py` `_LossParallelCrossEntropy`
//! over `V / tp` logits).

use super::float8::{linear_casts, Float8Recipe};
use super::{ReshardPolicy, Shapes};
use crate::error::CoreError;
use crate::memory::{Category, Phase};
use crate::workload::CheckpointPolicy;

/// One torchtitan training job on one FSDP mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// The model's shapes.
    pub shapes: Shapes,
    /// All ranks (`data_parallel_shard_degree × tensor_parallel_degree`).
    pub world: u64,
    /// `tensor_parallel_degree` (1: no tensor parallelism); sequence parallelism on when > 1.
    pub tp: u64,
    /// `expert_parallel_degree` (1: no expert parallelism): each rank holds `E / ep` routed
    /// experts, FSDP-sharded over `efsdp = dp_shard / ep` (distributed/parallel_dims.py,
    /// distributed/fsdp.py `apply_fsdp_to_decoder`), the tokens dispatched by all-to-all
    /// (models/common/token_dispatcher.py `AllToAllTokenDispatcher`) under balanced routing.
    pub ep: u64,
    /// `training.local_batch_size`.
    pub batch: u64,
    /// `training.seq_len`.
    pub seq: u64,
    /// The activation checkpointing policy (`None`: no AC).
    pub checkpointing: Option<CheckpointPolicy>,
    /// `parallelism.fsdp_reshard_after_forward`.
    pub reshard: ReshardPolicy,
    /// `optimizer.implementation`: `true` = "fused" (torchtitan 0.3.0's default), `false` =
    /// "foreach".
    pub fused_optimizer: bool,
    /// torchtitan's `Float8LinearConverter` recipe (`None`: bf16 linears); see `float8.rs`.
    pub float8: Option<Float8Recipe>,
}

/// What is alive at one instant of the step, by [`Category`] (in [`Category::ALL`] order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instant {
    /// What happens then.
    pub name: String,
    /// The phase it belongs to.
    pub phase: Phase,
    /// Live bytes by category.
    pub bytes: [u128; 9],
}

impl Instant {
    pub(super) fn new(name: impl Into<String>, phase: Phase) -> Self {
        Instant {
            name: name.into(),
            phase,
            bytes: [0; 9],
        }
    }

    pub(super) fn add(&mut self, c: Category, bytes: u128) -> &mut Self {
        let i = Category::ALL.iter().position(|x| *x == c).unwrap_or(0);
        self.bytes[i] = self.bytes[i].saturating_add(bytes);
        self
    }

    /// All live bytes.
    pub fn total(&self) -> u128 {
        self.bytes.iter().fold(0u128, |a, b| a.saturating_add(*b))
    }
}

/// `(the dims before the sharded one, the dim FSDP2 shards, the dims after it, the divisor of
/// its FSDP mesh)` of each parameter of one FSDP unit (the first is 1 for parameters sharded
/// on dim 0; the last is 1 for the `dp_shard` mesh, `ep` for routed experts under expert
/// parallelism, sharded over `efsdp = dp_shard / ep` with their local `E / ep` rows).
type Params = Vec<(u128, u128, u128, u128)>;

/// Parameter sizes of the FSDP units on one rank (each parameter's TP-local shape).
#[derive(Debug, Clone)]
pub(super) struct Sizes {
    /// FSDP ranks (`dp_shard`).
    world: u128,
    /// The model's (last) block kind: its MoE block, or every block of a uniform model.
    block: Params,
    /// DeepSeek-V3's leading dense blocks (`dense_layers` of them; empty otherwise).
    dense_block: Params,
    dense_layers: u128,
    embedding: Params,
    lm_head: Params,
    final_norm: Params,
    layers: u128,
    /// `enable_weight_tying`: `tok_embeddings` and `lm_head` share one parameter (see
    /// [`Sizes::tied`]).
    tied: bool,
}

impl Sizes {
    pub(super) fn new(job: &Job) -> Result<Self, CoreError> {
        let s = &job.shapes;
        let t = u128::from(job.tp);
        if job.world == 0 || job.tp == 0 || !job.world.is_multiple_of(job.tp) {
            return Err(CoreError::invalid(
                "gpus",
                "no ranks, or not a multiple of tp",
            ));
        }
        let d = u128::from(s.dim);
        // column-parallel outputs and row-parallel inputs are split evenly (heads, kv heads
        // and the feed-forward width divide by tp: checked by `check`); the vocabulary in
        // chunks of ceil(V / tp) rows (models/common/embedding.py, components/loss.py)
        let q = u128::from(s.heads) * u128::from(s.head_dim) / t;
        let kv = u128::from(s.kv_heads) * u128::from(s.head_dim) / t;
        let f = u128::from(s.ffn) / t;
        let v = u128::from(s.vocab).div_ceil(t);
        let hd = u128::from(s.head_dim);
        let mut attention = match s.mla {
            None => vec![(1, q + 2 * kv, d, 1), (1, d, q, 1)],
            Some(m) => {
                // models/deepseek_v3/model.py `Attention` (no TP: refused): `wq` `[H·qk, D]`
                // or `wq_a` `[r_q, D]`, `q_norm` `[r_q]`, `wq_b` `[H·qk, r_q]`; `wkv_a`
                // `[r_kv + rope, D]`, `kv_norm` `[r_kv]`, `wkv_b` `[H·(nope + v), r_kv]`,
                // `wo` `[D, H·v]`
                let h = u128::from(s.heads);
                let qk = u128::from(m.nope_head_dim + m.rope_head_dim);
                let (rq, rkv) = (u128::from(m.q_lora_rank), u128::from(m.kv_lora_rank));
                let mut a = if rq == 0 {
                    vec![(1, h * qk, d, 1)]
                } else {
                    vec![(1, rq, d, 1), (1, rq, 1, 1), (1, h * qk, rq, 1)]
                };
                a.extend([
                    (1, rkv + u128::from(m.rope_head_dim), d, 1),
                    (1, rkv, 1, 1),
                    (1, h * u128::from(m.nope_head_dim + m.v_head_dim), rkv, 1),
                    (1, d, h * u128::from(m.v_head_dim), 1),
                ]);
                a
            }
        };
        // the attention and feed-forward norms
        attention.extend([(1, d, 1, 1), (1, d, 1, 1)]);
        if s.model.qk_norm() {
            // Qwen 3's `q_norm` and `k_norm` (RMSNorm of head_dim each; replicated under TP,
            // models/qwen3/sharding.py)
            attention.extend([(1, hd, 1, 1), (1, hd, 1, 1)]);
        }
        let mut dense_block = attention.clone();
        dense_block.extend([(1, f, d, 1), (1, d, f, 1), (1, f, d, 1)]);
        let block = match s.moe {
            None => dense_block.clone(),
            Some(m) => {
                // models/common/moe.py: the router's `gate` `[E, D]` and `GroupedExperts`'
                // `w1_EFD`, `w2_EDF`, `w3_EFD`, sharded on dim 0 (distributed/fsdp.py
                // `apply_fsdp_to_decoder`; its `Shard(1)` for an FSDP mesh larger than the
                // expert count is refused by `check`, not measured); DeepSeek-V3's shared
                // experts, one `FeedForward` (`w1`, `w2`, `w3`) of `F_s`
                // Under expert parallelism the routed experts are the rank's `E / ep`, sharded
                // over `efsdp = dp_shard / ep` (`_shard_placement_fn`: `edp_mesh` for them,
                // `dp_mesh` for the gate and the rest; measured, `titan-*-ep*`)
                let (e, fe) = (u128::from(m.experts), u128::from(m.expert_ffn));
                let ep = u128::from(job.ep.max(1));
                let el = e / ep;
                let mut b = attention;
                b.extend([
                    (1, e, d, 1),
                    (1, el, fe * d, ep),
                    (1, el, d * fe, ep),
                    (1, el, fe * d, ep),
                ]);
                let fs = u128::from(m.shared_ffn);
                if fs > 0 {
                    b.extend([(1, fs, d, 1), (1, d, fs, 1), (1, fs, d, 1)]);
                }
                b
            }
        };
        let dense_layers = if s.moe.is_some() {
            u128::from(s.dense_layers.min(s.layers))
        } else {
            0
        };
        Ok(Sizes {
            world: u128::from(job.world / job.tp),
            // models/common/attention.py (fused `wqkv` when `fuse_qkv=True`, every llama3
            // flavour), feed_forward.py (w1, w2, w3), llama3/model.py (the two norms); under
            // TP the local shards (`colwise_config`: dim 0, `rowwise_config`: dim 1)
            block,
            dense_block,
            dense_layers,
            embedding: vec![(1, v, d, 1)],
            lm_head: vec![(1, v, d, 1)],
            final_norm: vec![(1, d, 1, 1)],
            layers: u128::from(s.layers),
            tied: s.tied,
        })
    }

    /// Whether the embeddings are tied to the LM head. torchtitan 0.3.0 then shards
    /// `[tok_embeddings, norm, lm_head]` as one FSDP unit, resharded after forward only under
    /// "always" (distributed/fsdp.py `apply_fsdp_to_decoder`, its `enable_weight_tying` case).
    /// The tie made in `Decoder.__init__` does not survive `Module.parallelize` (protocols/
    /// module.py `_spmd_distribute_state` registers a new `nn.Parameter` per module), so
    /// `fully_shard` makes two FSDP parameters of the unit, and `Decoder.init_states`
    /// (`init_weights` in `Trainer.__init__`, after `fully_shard`) re-points
    /// `tok_embeddings.weight` at `lm_head.weight`; FSDP2's lazy init then resets both FSDP
    /// parameters to that one sharded parameter (`FSDPParam.reset_sharded_param`). So: one fp32
    /// shard, one gradient shard (the embeddings' reduce-scatter output is added into the
    /// head's, `foreach_reduce`), one set of AdamW states; but the unit's all-gather still
    /// gathers it twice (two bf16 unsharded copies, `tok_embeddings` reading one and `lm_head`
    /// the other). Measured (`titan-qwen3tied-*`, `tools/truth/titan/README.md`).
    fn tied(&self) -> bool {
        self.tied
    }

    /// The parameters of block `i`'s unit (0-based).
    pub(super) fn unit(&self, i: usize) -> &Params {
        if (i as u128) < self.dense_layers {
            &self.dense_block
        } else {
            &self.block
        }
    }

    /// Elements of rank 0's shards of every block.
    fn blocks_sharded(&self) -> u128 {
        self.sharded(&self.block)
            .saturating_mul(self.layers - self.dense_layers)
            .saturating_add(
                self.sharded(&self.dense_block)
                    .saturating_mul(self.dense_layers),
            )
    }

    /// The embeddings' own elements of rank 0's shards (0 when tied: the head's parameter).
    fn embedding_own_shard(&self) -> u128 {
        if self.tied() {
            0
        } else {
            self.sharded(&self.embedding)
        }
    }

    /// The parameters of the unit holding `lm_head`: `[norm, lm_head]`, or
    /// `[tok_embeddings, norm, lm_head]` when tied (both FSDP parameters gathered).
    fn head_params(&self) -> Params {
        if self.tied() {
            [
                self.embedding.clone(),
                self.final_norm.clone(),
                self.lm_head.clone(),
            ]
            .concat()
        } else {
            [self.final_norm.clone(), self.lm_head.clone()].concat()
        }
    }

    /// Elements of rank 0's shards: FSDP2 shards the chosen dim (dim 0 by default) in
    /// `ceil(dim / world)` rows per rank and pads every rank's shard to that size
    /// (torch/distributed/fsdp/_fully_shard/_fsdp_param.py `_init_sharded_param`).
    fn sharded(&self, p: &Params) -> u128 {
        p.iter()
            .map(|(o, a, b, g)| {
                o.saturating_mul(a.div_ceil((self.world / g).max(1)))
                    .saturating_mul(*b)
            })
            .fold(0, u128::saturating_add)
    }

    /// Elements of a unit's parameters (unpadded).
    pub(super) fn unpadded(&self, p: &Params) -> u128 {
        p.iter()
            .map(|(o, a, b, _)| o.saturating_mul(*a).saturating_mul(*b))
            .fold(0, u128::saturating_add)
    }

    /// Elements of a unit gathered (the padded shards of every rank of each parameter's FSDP
    /// mesh: `dp_shard`, or `efsdp` for routed experts under expert parallelism).
    fn padded(&self, p: &Params) -> u128 {
        p.iter()
            .map(|(o, a, b, g)| {
                let w = (self.world / g).max(1);
                o.saturating_mul(a.div_ceil(w))
                    .saturating_mul(*b)
                    .saturating_mul(w)
            })
            .fold(0, u128::saturating_add)
    }

    /// bf16 bytes a prefetch of the unit allocates before the unit's own pre-backward: the
    /// all-gather output of each parameter whose FSDP mesh has more than one rank. On a mesh of
    /// one rank FSDP2's `unshard` allocates nothing (torch/distributed/fsdp/_fully_shard/
    /// _fsdp_param_group.py: `world_size == 1` returns early; `wait_for_unshard` casts the
    /// shard into the unsharded parameter at the unit's own pre-backward); measured with
    /// expert parallelism at `ep = dp_shard` (`titan-qwen3moe-235b-2l-w64-ep64-s1024`,
    /// `--debug`: the experts' group, on a one-rank `efsdp` mesh, is unsharded only at the
    /// block's pre-backward).
    fn prefetch_bytes(&self, p: &Params) -> u128 {
        p.iter()
            .filter(|(_, _, _, g)| self.world / g > 1)
            .map(|(o, a, b, g)| {
                let w = self.world / g;
                2 * o
                    .saturating_mul(a.div_ceil(w))
                    .saturating_mul(*b)
                    .saturating_mul(w)
            })
            .fold(0, u128::saturating_add)
    }

    /// Elements of all of rank 0's shards.
    fn sharded_total(&self) -> u128 {
        self.blocks_sharded()
            .saturating_add(self.embedding_own_shard())
            .saturating_add(self.sharded(&self.lm_head))
            .saturating_add(self.sharded(&self.final_norm))
    }

    /// Parameter tensors (each has its own AdamW `step` scalar).
    fn tensors(&self) -> u128 {
        self.block.len() as u128 * (self.layers - self.dense_layers)
            + self.dense_block.len() as u128 * self.dense_layers
            + if self.tied() { 2 } else { 3 }
    }

    /// Parameters of the model on one TP rank (all of them without TP).
    pub(super) fn params_total(&self) -> u128 {
        let n = |p: &Params| p.iter().map(|(o, a, b, _)| o * a * b).sum::<u128>();
        let embedding = if self.tied() { 0 } else { n(&self.embedding) };
        n(&self.block) * (self.layers - self.dense_layers)
            + n(&self.dense_block) * self.dense_layers
            + embedding
            + n(&self.lm_head)
            + n(&self.final_norm)
    }

    /// fp32 shards, fp32 gradient shards and AdamW's two fp32 states with its step scalars.
    pub(super) fn model_states(&self) -> u128 {
        16 * self.sharded_total() + 4 * self.tensors()
    }

    /// One pipeline stage's units (its blocks, and the embeddings and `[norm, lm_head]` when it
    /// holds them): elements of rank 0's shards, elements gathered (padded), parameter
    /// tensors, the embeddings' padded elements (0 without them) and parameters.
    pub(super) fn stage(&self, embeddings: bool, head: bool) -> (u128, u128, u128, u128, u128) {
        let n = |p: &Params| p.iter().map(|(o, a, b, _)| o * a * b).sum::<u128>();
        let mut units: Vec<&Params> = vec![&self.block; self.layers as usize];
        if embeddings {
            units.push(&self.embedding);
        }
        if head {
            units.push(&self.final_norm);
            units.push(&self.lm_head);
        }
        let head_unit = [self.final_norm.clone(), self.lm_head.clone()].concat();
        let mut sharded = self.sharded(&self.block) * self.layers;
        let mut padded = self.padded(&self.block) * self.layers;
        if embeddings {
            sharded += self.sharded(&self.embedding);
            padded += self.padded(&self.embedding);
        }
        if head {
            sharded += self.sharded(&head_unit);
            padded += self.padded(&head_unit);
        }
        let tensors = units.iter().map(|u| u.len() as u128).sum();
        let params = units.iter().map(|u| n(u)).sum();
        let emb = if embeddings {
            self.padded(&self.embedding)
        } else {
            0
        };
        (sharded, padded, tensors, emb, params)
    }

    /// `(rank 0's shard, gathered)` elements of the `[norm, lm_head]` unit.
    pub(super) fn head_unit(&self) -> (u128, u128) {
        let head = [self.final_norm.clone(), self.lm_head.clone()].concat();
        (self.sharded(&head), self.padded(&head))
    }

    /// `(rank 0's shard, gathered)` elements of one block's unit.
    pub(super) fn block_unit(&self) -> (u128, u128) {
        (self.sharded(&self.block), self.padded(&self.block))
    }

    /// `(rank 0's shard, gathered)` elements of the `tok_embeddings` unit.
    pub(super) fn embedding_unit(&self) -> (u128, u128) {
        (self.sharded(&self.embedding), self.padded(&self.embedding))
    }

    /// bf16 bytes of the largest unit gathered.
    pub(super) fn largest_unsharded(&self) -> u128 {
        let head = self.head_params();
        let dense = if self.dense_layers > 0 {
            self.padded(&self.dense_block)
        } else {
            0
        };
        2 * self
            .padded(&self.block)
            .max(dense)
            .max(self.padded(&self.embedding))
            .max(self.padded(&head))
    }
}

/// Saved bytes of one block for the job's tokens, by what checkpointing keeps of it. `T` =
/// tokens, `Tl` = `T / tp` (the sequence-parallel shard; `T` without TP); `q`, `kv`, `F` and
/// the heads are TP-local.
struct BlockActs {
    /// No AC: every tensor autograd saves (read with `saved_tensors_hooks` off torchtitan's
    /// `Llama3TransformerBlock`, deduplicated by storage; `measure_titan.py --saved`): per
    /// RMSNorm the fp32 input (`x.float()`), the fp32 normalised tensor and the rstd on `Tl`
    /// tokens, and the bf16 output the next linear saves, all-gathered to `T` tokens under
    /// SP (`2·((8D + 4)·Tl + 2D·T)` for the two norms); the per-layer RoPE cache rows gathered
    /// by position (Llama 3: `head_dim/2` complex64 = `4·head_dim` per token; Qwen 3: cos and
    /// sin, `8·head_dim`); Qwen 3's q and k RMSNorms (fp32 input, fp32 normalised, rstd per
    /// head: `8q + 4·heads + 8kv + 4·kv_heads`, read with `measure_titan.py --model qwen3
    /// --saved`: 243,112 B per token for the 8B block); q and k after RoPE, v, the
    /// FlexAttention output and its logsumexp and row max (`2q + 2kv + 2kv + 2q + 8·heads`);
    /// `w1(x)`, `w3(x)`, `silu(w1(x))` and their product (`4 · 2F`).
    none: u128,
    /// FullAC (`ptd_checkpoint_wrapper`): the block's input only (`Tl` tokens).
    full: u128,
    /// SelectiveAC: the input plus the outputs of the ops the policy must save: matmuls 1, 3 and
    /// 5 of `wqkv, wo, w1, w3, w2` (every second matmul is recomputed: `mm_count % 2 == 0`) and
    /// the FlexAttention HOP (out, logsumexp, max); `w2`'s output is the row-parallel partial
    /// sum on `T` tokens (reduce-scattered after it, spmd_types' own collective, not saved).
    /// On a MoE block (torchtitan 0.3.0 `distributed/activation_checkpoint.py`
    /// `SelectiveAC._wrap_block` and `_get_default_save_ops`): `wqkv` is matmul 1 (saved) and
    /// `wo` matmul 2 (recomputed); the router's gate is forced to recompute by its weight shape
    /// (`force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]`, the default) and is not
    /// counted; `torch._grouped_mm` is in no save list (torch's `get_default_op_list()`
    /// compute-intensive ops are mm, addmm, bmm, `_scaled_mm`, convolution and the SDPA
    /// kernels), so the experts are recomputed; `topk` is saved (its fp32 values and int64
    /// ids, `[T, K]` each: `12K` per token) to keep the expert assignment stable.
    selective: u128,
}

impl BlockActs {
    /// The saved bytes of a MoE block (`moe`, with `s.moe`) or of a dense block.
    fn new(s: &Shapes, tp: u128, ep: u128, tokens: u128, moe: bool) -> Self {
        let d = u128::from(s.dim);
        let q = u128::from(s.heads) * u128::from(s.head_dim) / tp;
        let kv = u128::from(s.kv_heads) * u128::from(s.head_dim) / tp;
        let f = u128::from(s.ffn) / tp;
        let heads = u128::from(s.heads) / tp;
        let t = tokens;
        let tl = tokens / tp;
        let norm = (8 * d + 4) * tl + 2 * d * t;
        let attention_out = (2 * q + 8 * heads) * t;
        let rope = u128::from(s.rope_row_bytes());
        // q/k norms on the TP-local heads (sharded on the head dim, models/qwen3/sharding.py)
        let qk_norms = if s.model.qk_norm() {
            let kv_heads = u128::from(s.kv_heads) / tp;
            8 * q + 4 * heads + 8 * kv + 4 * kv_heads
        } else {
            0
        };
        // torchtitan's MoE feed-forward (no TP: refused with MoE), read with
        // `measure_titan.py --model qwen3 --flavor 30B-A3B --saved`: per token the router's
        // fp32 input copy (`4D`, the gate under fp32 autocast), its softmax scores (`4E`), the
        // top-k ids (int64, `8K`), the route-norm denominator (4) and the normalised top-k
        // scores (`4K`), the dispatch's argsort and token indices (int64, `16K`), the gathered
        // routed input (`2DK`), the four `[T·K, F]` expert intermediates (`8FK`), the sorted
        // scores (`4K`) and the fp32 routed output the combine scales (`4DK`); per block the
        // fp32 gate weight (`4ED`) and the int32 offsets (`4E`); the ffn norm's bf16 output is
        // not saved (the gate saves its fp32 copy, the gather its indices)
        //
        // DeepSeek-V3's MoE (`measure_titan.py --model deepseek_v3 --flavor 671B --saved`): the
        // same tensors (its sigmoid scores are saved as the softmax's are; without `route_norm`,
        // the 16B flavour, no denominator and no normalised scores), plus the shared experts'
        // `FeedForward` on every token: its four `[T, F_s]` intermediates (`8 F_s`) and its
        // input, the ffn norm's bf16 output (so that is saved here). The node-limited
        // routing's group top-k indices and mask are saved by autograd nodes that nothing
        // reaches once `topk`'s values are dropped (`_, ids = torch.topk(...)`, models/common/
        // moe.py `TokenChoiceTopKRouter.forward`): freed with them, not held to the backward.
        let ffn_part = match s.moe {
            Some(m) if moe => {
                let (e, k, fe, fs) = (
                    u128::from(m.experts),
                    u128::from(m.top_k),
                    u128::from(m.expert_ffn),
                    u128::from(m.shared_ffn),
                );
                let route_norm = if m.route_norm { 4 + 4 * k } else { 0 };
                // expert parallelism (`AllToAllTokenDispatcher`, read with `--ep 2 --saved`):
                // the int32 offsets of the rank's `E / ep` local experts, and the int64
                // `permuted_indices` (`[T·K]` under balanced routing: every rank receives as
                // many rows as it sends) that `_permute`'s indexing saves; the all-to-alls
                // save nothing, `_unpermute`'s `index_put` only those indices
                let (offsets, permuted) = if ep > 1 {
                    (4 * e / ep, 8 * k)
                } else {
                    (4 * e, 0)
                };
                let routed =
                    (4 * d + 4 * e + route_norm + 28 * k + permuted + 6 * d * k + 8 * fe * k) * t
                        + 4 * e * d
                        + offsets;
                if fs > 0 {
                    routed + 8 * fs * t
                } else {
                    routed - 2 * d * t
                }
            }
            _ => 8 * f * t,
        };
        // DeepSeek-V3's multi-head latent attention (`measure_titan.py --model deepseek_v3
        // --saved`, 16B and 671B: exact): the RoPE cache rows of `qk_rope_head_dim`; with a q
        // LoRA rank `q_norm`'s fp32 input, fp32 normalised tensor and rstd and its bf16 output
        // (`wq_b`'s input: `10 r_q + 4`); `kv_norm`'s (`8 r_kv + 4`) and its bf16 output
        // (`wkv_b`'s input, `2 r_kv`); q and k after the concatenation (`2 H·qk` each), `wkv_b`'s
        // output whose split v FlexAttention saves (one storage: `2 H·(nope + v)`), the
        // attention output (`2 H·v`, `wo`'s input) and its logsumexp and row max (`8 H`)
        let attention = match s.mla {
            None => (rope + qk_norms + 2 * q + 4 * kv) * t + attention_out,
            Some(m) => {
                let h = u128::from(s.heads);
                let qk = u128::from(m.nope_head_dim + m.rope_head_dim);
                let (rq, rkv) = (u128::from(m.q_lora_rank), u128::from(m.kv_lora_rank));
                let q_lora = if rq > 0 { 10 * rq + 4 } else { 0 };
                (rope
                    + q_lora
                    + 10 * rkv
                    + 4
                    + 4 * h * qk
                    + 2 * h * u128::from(m.nope_head_dim + m.v_head_dim)
                    + 2 * h * u128::from(m.v_head_dim)
                    + 8 * h)
                    * t
            }
        };
        BlockActs {
            none: 2 * norm + attention + ffn_part,
            full: 2 * d * tl,
            selective: match s.moe {
                None => 2 * d * tl + (2 * (q + 2 * kv) + 2 * f + 2 * d) * t + attention_out,
                Some(m) => {
                    2 * d * tl + (2 * (q + 2 * kv) + 12 * u128::from(m.top_k)) * t + attention_out
                }
            },
        }
    }

    /// Saved bytes of block `i` (0-based).
    fn of(&self, policy: Option<CheckpointPolicy>, i: usize) -> u128 {
        match policy {
            None => self.none,
            Some(CheckpointPolicy::SelectiveOp) => self.selective,
            Some(p) if p.covers(i) => self.full,
            Some(_) => self.none,
        }
    }

    /// Whether block `i` runs under a checkpoint wrapper.
    fn checkpointed(policy: Option<CheckpointPolicy>, i: usize) -> bool {
        match policy {
            None => false,
            Some(CheckpointPolicy::SelectiveOp) => true,
            Some(p) => p.covers(i),
        }
    }
}

/// Bytes one block saves for `tokens` tokens without AC, on a `tp`-way TP + SP mesh (see
/// [`BlockActs`]).
pub(super) fn block_saved_no_ac(s: &Shapes, tp: u128, tokens: u128) -> u128 {
    BlockActs::new(s, tp, 1, tokens, s.moe.is_some()).none
}

/// Bytes one block keeps from its forward to its backward for `tokens` tokens on a `tp`-way
/// TP + SP mesh under `policy` (full: its input; selective-op: SelectiveAC's saved outputs;
/// see [`BlockActs`]).
pub(super) fn block_saved(
    s: &Shapes,
    tp: u128,
    tokens: u128,
    policy: Option<CheckpointPolicy>,
) -> u128 {
    BlockActs::new(s, tp, 1, tokens, s.moe.is_some()).of(policy, 0)
}

/// Every instant of the steady (second) step whose live bytes can be the peak. The forward is
/// represented by its end (the logits): the instants inside the forward (a block gathered with
/// the next one prefetched) are below the loss and backward instants in every measured case,
/// so the forward's phase peak is a lower bound.
pub fn instants(job: &Job) -> Result<Vec<Instant>, CoreError> {
    use Category::{
        Activations, Buffers, CommBuffers, Gradients, LossBuffers, OptimizerStates,
        OptimizerTemporaries, Temporaries, Weights,
    };
    let z = Sizes::new(job)?;
    let s = &job.shapes;
    let d = u128::from(s.dim);
    let v = u128::from(s.vocab);
    let layers = usize::try_from(s.layers).map_err(|_| CoreError::Overflow { what: "layers" })?;
    let tokens = u128::from(job.batch).saturating_mul(u128::from(job.seq));
    let tp = u128::from(job.tp.max(1));
    // the sequence-parallel shard of the tokens (all of them without TP)
    let tl = tokens / tp;
    let vl = v.div_ceil(tp);
    // the saved tensors of a dense block and of a MoE block (the same for a uniform model)
    let ep = u128::from(job.ep.max(1));
    let acts_dense = BlockActs::new(s, tp, ep, tokens, false);
    let acts_moe = BlockActs::new(s, tp, ep, tokens, s.moe.is_some());
    let acts_of = |i: usize| {
        if s.is_moe_block(i as u64) {
            &acts_moe
        } else {
            &acts_dense
        }
    };
    let saved_below = |i: usize| -> u128 {
        (0..i)
            .map(|j| acts_of(j).of(job.checkpointing, j))
            .fold(0u128, u128::saturating_add)
    };
    let saved_all = saved_below(layers);
    // the final norm and the LM head (their gradient shards; with tied embeddings the
    // embeddings' gradient is added into the head's)
    let head = [z.final_norm.clone(), z.lm_head.clone()].concat();
    // bf16 units gathered (MixedPrecisionPolicy param_dtype=bfloat16); tied: the unit holding
    // the LM head also holds the embeddings (gathered twice, see `Sizes::tied`), and it is the
    // unit the embeddings' forward and backward gather
    // block `i`'s unit gathered (bf16)
    let u_block_of = |i: usize| 2 * z.padded(z.unit(i));
    let u_head = 2 * z.padded(&z.head_params());
    let u_embedding = if z.tied() {
        u_head
    } else {
        2 * z.padded(&z.embedding)
    };
    let embedding_own = z.embedding_own_shard();
    let sharded = z.sharded_total();
    let never = job.reshard == ReshardPolicy::Never;

    // always alive: fp32 shards, AdamW's exp_avg and exp_avg_sq (fp32 like the shards) and a
    // step scalar per tensor (torch/optim/adamw.py), the per-layer RoPE caches (seq_len rows of
    // head_dim/2 complex64, models/common/rope.py), the token ids and labels (int64)
    let base = |name: String, phase: Phase| {
        let mut x = Instant::new(name, phase);
        x.add(Weights, 4 * sharded)
            .add(OptimizerStates, 8 * sharded + 4 * z.tensors())
            .add(
                Buffers,
                z.layers * u128::from(job.seq) * u128::from(s.rope_row_bytes()),
            )
            // MoE: `expert_bias_E` and `tokens_per_expert_E` (fp32, one per expert) per MoE
            // block (models/common/moe.py `MoE.__init__`)
            .add(
                Buffers,
                u128::from(s.moe_layers()) * s.moe.map_or(0, |m| 8 * u128::from(m.experts)),
            )
            .add(Activations, 16 * tokens);
        x
    };
    // positions (int64 per token, the dataloader's; models take them for RoPE and the masks)
    let positions = 8 * tokens;
    // final norm: fp32 input, fp32 normalised, rstd on the SP shard (and its bf16 output the
    // LM head saves, all-gathered to every token: `pre_lm_head_norm_config`)
    let final_norm_saved = (8 * d + 4) * tl;
    let final_norm_out = 2 * d * tokens;
    // "never": embeddings and blocks stay gathered from their forward to their backward (tied:
    // the embeddings' unit is the head's, counted on its own below, and resharded after the
    // LM head's backward like every unit)
    let resident = |blocks: u128| {
        if never {
            (if z.tied() { 0 } else { u_embedding })
                + (0..blocks as usize).map(u_block_of).sum::<u128>()
        } else {
            0
        }
    };
    let head_resident = job.reshard != ReshardPolicy::Always;

    let mut out = Vec::new();

    // the logits at the end of the forward (bf16, `lm_head`)
    let mut x = base("forward: logits".into(), Phase::Forward);
    x.add(Weights, resident(z.layers))
        .add(Weights, if head_resident { u_head } else { 0 })
        .add(
            Activations,
            saved_all + positions + final_norm_saved + final_norm_out,
        )
        .add(LossBuffers, 2 * vl * tokens);
    out.push(x);

    if let (Some(recipe), 1) = (job.float8, tp) {
        // float8 (float8.rs): the LM head's `Float8Linear` casts its input and its gathered
        // `[V, D]` weight in the forward, with the head unit gathered and its all-gather output
        // alive (FSDP2 frees it after the unit's forward; measured); its backward casts
        // `grad_output` (the bf16 gradient of the logits, alive) and the weight again
        // (the forward's casts are filed as activations, as FSDPMemTracker files what the
        // forward allocates; they are freed when the linear returns)
        let casts = linear_casts(recipe, tokens, d, v);
        let mut x = base("forward: LM head float8 casts".into(), Phase::Forward);
        x.add(Weights, resident(z.layers) + u_head)
            .add(CommBuffers, u_head)
            .add(
                Activations,
                saved_all + positions + final_norm_saved + final_norm_out + casts.forward,
            );
        out.push(x);
        let mut x = base("backward: LM head float8 casts".into(), Phase::Backward);
        x.add(Weights, resident(z.layers) + u_head)
            .add(
                Activations,
                saved_all + positions + final_norm_saved + final_norm_out,
            )
            .add(Temporaries, 2 * v * tokens + casts.backward);
        out.push(x);
    }

    if tp == 1 {
        // components/loss.py: `cross_entropy(pred.float(), …)`; at `log_softmax_backward` the
        // fp32 log-softmax (saved), the gradient of it and the fp32 gradient of the logits are
        // alive; the bf16 logits were dropped (`del pred`)
        let mut x = base("loss backward: log-softmax gradient".into(), Phase::Loss);
        x.add(Weights, resident(z.layers))
            .add(Weights, if head_resident { u_head } else { 0 })
            .add(
                Activations,
                saved_all + positions + final_norm_saved + final_norm_out,
            )
            .add(LossBuffers, 4 * v * tokens)
            .add(Temporaries, 8 * v * tokens);
        out.push(x);
    } else {
        // loss parallel (components/loss.py `_LossParallelCrossEntropy.backward`, fp32 over
        // the V/tp local logits): the saved `log_probs`, `grad_input = zeros_like(log_probs)`,
        // `torch.exp(log_probs)`, their sum, then the product with `grad_output` while the sum
        // is alive (four fp32 buffers besides `log_probs`, at most three at once); the forward's
        // fp32 copy, `shifted` and `exp(shifted)` (with the bf16 logits) are one buffer fewer
        let mut x = base(
            "loss backward: vocab-parallel cross-entropy gradient".into(),
            Phase::Loss,
        );
        x.add(Weights, resident(z.layers))
            .add(Weights, if head_resident { u_head } else { 0 })
            .add(
                Activations,
                saved_all + positions + final_norm_saved + final_norm_out,
            )
            .add(LossBuffers, 4 * vl * tokens)
            .add(Temporaries, 12 * vl * tokens);
        out.push(x);
        // the LM head's backward: the bf16 gradient of the logits, the weight's bf16 gradient
        // (its TP shard) and the gradient of its all-gathered input; the head unit is gathered
        // (re-gathered by its pre-backward when resharded after forward)
        let mut x = base("backward: LM head weight gradient".into(), Phase::Backward);
        x.add(Weights, resident(z.layers) + u_head)
            .add(
                Activations,
                saved_all + positions + final_norm_saved + final_norm_out,
            )
            .add(Temporaries, 2 * vl * tokens + final_norm_out)
            .add(Gradients, 2 * z.padded(&z.lm_head));
        out.push(x);
    }

    // expert parallelism, a MoE last block (two FSDP parameter groups, `shard_placement_fn`):
    // FSDP2 prefetches both of its groups during the LM head's backward, right after the head
    // unit's first pre-backward (measured: `titan-qwen3moe-30b-1l-w8-ep2-s512`, `--debug`: the
    // block's bf16 all-gather outputs allocated before the LM head's weight gradient), not at
    // the head's second pre-backward as with one group per block; so the block is gathered
    // through the head's reduce-scatter and its re-gather
    let early_prefetch = job.ep > 1 && !never && layers > 0 && s.is_moe_block(layers as u64 - 1);
    let early_block = if early_prefetch {
        z.prefetch_bytes(z.unit(layers - 1))
    } else {
        0
    };
    // the LM head's gradient reduce-scatter: its bf16 gradient cast to fp32 into the
    // reduce-scatter input (reduce_dtype=float32), its fp32 shard written, the head unit
    // gathered with its all-gather output (FSDPMemTracker: both at this instant, every
    // policy), the gradient of the final norm's output alive
    let mut x = base(
        "backward: LM head gradient reduce-scatter".into(),
        Phase::Backward,
    );
    x.add(Weights, resident(z.layers) + u_head)
        .add(CommBuffers, u_head + 4 * z.padded(&z.lm_head) + early_block)
        .add(Gradients, 4 * z.sharded(&z.lm_head))
        .add(Activations, saved_all + positions + final_norm_saved)
        .add(Temporaries, final_norm_out);
    out.push(x);
    // the head unit's second pre-backward (the final norm's output, reached after the LM head's
    // post-backward resharded the unit: measured on the TP step's allocation log,
    // `measure_titan.py --debug`): the unit re-gathered, and the last block's all-gather issued
    // (backward prefetch: its bf16 copy-in and all-gather output) while the head's
    // reduce-scatter buffer is alive
    if layers > 0 {
        let mut x = base(
            format!(
                "backward: head re-gathered, block {} prefetched",
                layers - 1
            ),
            Phase::Backward,
        );
        x.add(Weights, resident(z.layers) + u_head)
            .add(
                CommBuffers,
                4 * z.padded(&z.lm_head)
                    + if early_prefetch {
                        // EP: the block was prefetched at the LM head's backward; the peak is
                        // the head's all-gather copy-out (its all-gather output and unsharded
                        // parameters both alive; measured, the same case)
                        early_block + u_head
                    } else if never {
                        // "never": the last block is still gathered from its forward, nothing
                        // to prefetch (measured: `titan-dsv3-16b-2l-w8-s1024-never`, whose MoE
                        // block outweighs the head)
                        0
                    } else {
                        u_block_of(layers - 1) + 2 * z.sharded(z.unit(layers - 1))
                    },
            )
            .add(Gradients, 4 * z.sharded(&z.lm_head))
            .add(Activations, saved_all + positions + final_norm_saved)
            .add(Temporaries, final_norm_out);
        out.push(x);
    }

    let head_grads = 4 * z.sharded(&head);
    for i in (0..layers).rev() {
        // the gradient shards written: the head's and those of the blocks above `i`
        let done = head_grads
            + (i + 1..layers)
                .map(|j| 4 * z.sharded(z.unit(j)))
                .sum::<u128>();
        let acts = acts_of(i);
        let u_block = u_block_of(i);
        // the block's bf16 weight gradients: autograd allocates them in each parameter's own
        // shape, not FSDP2's padded one (measured: `titan-dsv3-671b-4l-w256-s512-foreach`,
        // 256 ranks padding `wkv_a`'s 576 rows to 768)
        let g_block = 2 * z.unpadded(z.unit(i));
        let ckpt = BlockActs::checkpointed(job.checkpointing, i);
        let below = resident(i as u128);
        // the reduce-scatter buffer of the unit above, alive until this block's post-backward
        // waits for it (after the last block: the head unit's second post-backward, the final
        // norm's gradient, waited for the LM head's reduce-scatter and issued the norm's)
        let previous_rs = if i + 1 == layers {
            4 * z.padded(&z.final_norm)
        } else {
            4 * z.padded(z.unit(i + 1))
        };
        // the unit FSDP2 prefetched at this block's pre-backward (its backward prefetch:
        // the embeddings for block 0, block `i - 1` otherwise), its bf16 all-gather output
        // alive through this block's feed-forward and attention backward (measured on
        // `titan-qwen3moe-30b-3l-w8-b2s1024-everyk2`, where block 1's MoE backward is the
        // peak); nothing under "never" (every unit stays gathered)
        let prefetched = match (never, i) {
            (true, _) => 0,
            (false, 0) => u_embedding,
            (false, _) => z.prefetch_bytes(z.unit(i - 1)),
        };
        // the recomputed forward of a checkpointed block: all its saved tensors again, the
        // block gathered (a lower bound of its backward's live bytes)
        if ckpt {
            let mut x = base(format!("backward: block {i} recomputed"), Phase::Backward);
            x.add(Weights, below + u_block)
                .add(Gradients, done)
                .add(Activations, saved_below(i) + positions + acts.none)
                .add(Temporaries, 2 * d * tl);
            out.push(x);
        }
        // the feed-forward's backward at `w1` (the last of its weight gradients): measured on
        // the TP step's allocation log (`measure_titan.py --debug`, selective AC): the block
        // gathered, the previous unit's reduce-scatter buffer still alive (FSDP2 waits for it
        // in the next post-backward: block `i + 1`'s, or the final norm's), block 0 with the embeddings' all-gather issued, the bf16
        // gradients of `w2`, `w3` and `w1`, the gradients of `w3`'s and `w1`'s all-gathered
        // input, one `[T, F/tp]` gradient and the block's output gradient; alive of the block's
        // activations: all but the feed-forward's four `[T, F/tp]` tensors (recomputed under AC,
        // whose checkpoint input stays saved too)
        {
            let f = u128::from(s.ffn) / tp;
            // under AC the recomputed set is the no-AC set (SelectiveAC's saved outputs are
            // the same tensors, replayed from its cache) besides the checkpoint's input
            let own = if ckpt {
                acts.none + 2 * d * tl
            } else {
                acts.none
            };
            let mut x = base(
                format!("backward: block {i} feed-forward input gradient"),
                Phase::Backward,
            );
            x.add(Weights, below + u_block)
                .add(CommBuffers, previous_rs + prefetched);
            if let Some(m) = s.moe.filter(|_| s.is_moe_block(i as u64)) {
                // torchtitan's MoE at `w1_EFD`'s grouped-mm backward (the last expert weight
                // gradient; measured, `measure_titan.py --model qwen3 --flavor 30B-A3B
                // --debug`): the three bf16 `[E, F, D]` expert gradients, the gradients of the
                // routed input from `w3`'s and `w1`'s grouped mm (`[T·K, D]` each), the
                // gradient of `w1`'s output (`[T·K, F]`), the sorted scores' fp32 gradient
                // and the block's output gradient; freed of the block's activations: the
                // combine's fp32 routed output and sorted scores and the four expert
                // intermediates
                let (e, k, fe, fs) = (
                    u128::from(m.experts),
                    u128::from(m.top_k),
                    u128::from(m.expert_ffn),
                    u128::from(m.shared_ffn),
                );
                // DeepSeek-V3's shared experts run after the routed ones, so autograd (latest
                // node first) finishes their backward before the routed experts': their three
                // bf16 weight gradients written, their saved tensors (the ffn norm's bf16
                // output and the four `[T, F_s]` intermediates) freed, and the gradient of their
                // input held until the routed branch's is added to it
                let shared_done = if fs > 0 {
                    (2 * 3 * fs * d, (2 * d + 8 * fs) * tokens, 2 * d * tokens)
                } else {
                    (0, 0, 0)
                };
                // (the rank's `E / ep` local experts under expert parallelism)
                x.add(Gradients, done + 2 * 3 * (e / ep) * fe * d + shared_done.0)
                    .add(
                        Activations,
                        saved_below(i)
                            + positions
                            + own.saturating_sub(
                                (4 * d * k + 8 * fe * k + 4 * k) * tokens + shared_done.1,
                            ),
                    )
                    .add(
                        Temporaries,
                        (2 * 2 * d * k + 2 * fe * k + 4 * k) * tokens + 2 * d * tl + shared_done.2,
                    );
            } else {
                x.add(Gradients, done + 2 * 3 * f * d)
                    .add(
                        Activations,
                        saved_below(i) + positions + own.saturating_sub(8 * f * tokens),
                    )
                    .add(
                        Temporaries,
                        2 * 2 * d * tokens + 2 * f * tokens + 2 * d * tl,
                    );
            }
            out.push(x);
        }
        // the attention's backward at `wqkv` (the last weight gradient of the block; measured,
        // `titan-llama3-70b-2l-w16-tp4-s1024-fullac`): every bf16 weight gradient of the block,
        // the gradient of `wqkv`'s output and of its all-gathered input, the block's output
        // gradient; alive of the block's activations: the attention norm's fp32 buffers and
        // the all-gathered input `wqkv` saved (and the checkpoint's input under AC)
        {
            let q = u128::from(s.heads) * u128::from(s.head_dim) / tp;
            let kv = u128::from(s.kv_heads) * u128::from(s.head_dim) / tp;
            // the gradient of the first projection's output: `wqkv`'s, or MLA's `wq` /
            // `wq_a` (the last of its weight gradients, the query path running first in the
            // forward) with the gradient of the norm's output already accumulated from
            // `wkv_a` (`[T, D]` more)
            let projection_out = match s.mla {
                None => q + 2 * kv,
                Some(m) if m.q_lora_rank > 0 => u128::from(m.q_lora_rank) + d,
                Some(m) => u128::from(s.heads * (m.nope_head_dim + m.rope_head_dim)) + d,
            };
            let mut x = base(
                format!("backward: block {i} attention input gradient"),
                Phase::Backward,
            );
            x.add(Weights, below + u_block)
                .add(CommBuffers, previous_rs + prefetched)
                .add(Gradients, done + g_block)
                .add(
                    Activations,
                    saved_below(i)
                        + positions
                        + (8 * d + 4) * tl
                        + 2 * d * tokens
                        + if ckpt { 2 * d * tl } else { 0 },
                )
                .add(
                    Temporaries,
                    2 * d * tokens + 2 * projection_out * tokens + 2 * d * tl,
                );
            out.push(x);
        }
        // FSDP2 `post_backward` (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py),
        // entered with every bf16 gradient of the block computed: the block still gathered, the
        // previous unit's reduce-scatter buffer still alive (waited for inside this
        // post-backward) and the prefetched unit's all-gather output (the embeddings for block
        // 0); measured under AC on the 405B and 70B blocks (`titan-llama3-405b-2l-w32-s1024-
        // fullac`, `titan-llama3-70b-2l-w16-s2048-selac`): the recomputed norms' fp32 buffers
        // and two hidden-size tensors still alive too (the 8B and Qwen 3 MoE blocks' logs,
        // `--debug`, show none: an upper bound there)
        {
            let mut x = base(
                format!("backward: block {i} post-backward (gathered, gradients computed)"),
                Phase::Backward,
            );
            x.add(Weights, below + u_block)
                .add(CommBuffers, previous_rs + prefetched)
                .add(Gradients, done + g_block)
                .add(Activations, saved_below(i) + positions)
                .add(Temporaries, 2 * d * tl);
            if ckpt {
                x.add(Temporaries, (20 * d + 8) * tl)
                    .add(Activations, 4 * d * tl);
            }
            out.push(x);
        }
        // then the block resharded (`reshard()` before `foreach_reduce`) and its bf16 gradients
        // copied (cast to fp32) into the reduce-scatter input, the previous buffer freed; for
        // block 0 the embeddings' all-gather is already issued (backward prefetch); the same
        // with and without AC (measured: `titan-qwen3moe-30b-1l-w32-s512-selac` and its FullAC
        // run, `--debug`: nothing of the recomputed block is alive then)
        let mut x = base(
            format!("backward: block {i} gradient reduce-scatter"),
            Phase::Backward,
        );
        x.add(Weights, below)
            .add(
                CommBuffers,
                4 * z.padded(z.unit(i)) + if i == 0 && !never { u_embedding } else { 0 },
            )
            // the unit prefetched at this block's pre-backward (block `i - 1`), still gathered
            // (measured: `titan-dsv3-16b-2l-w8-s1024`, `--debug`: block 1's reduce-scatter
            // input allocated while block 0's all-gather output is alive, the peak)
            .add(CommBuffers, if i > 0 { prefetched } else { 0 })
            .add(Gradients, done + g_block)
            .add(Activations, saved_below(i) + positions)
            .add(Temporaries, 2 * d * tl);
        out.push(x);
    }

    // block 0's fp32 reduce-scatter input, alive through the embeddings' pre-backward and backward
    let block0_reduce_scatter = if layers > 0 {
        4 * z.padded(z.unit(0))
    } else {
        0
    };
    // the embeddings' pre-backward (measured: `titan-qwen3tied-0.6b-28l-w2-s128`, where the
    // tied unit is the embeddings' and this is the peak): FSDP2's `wait_for_unshard` copies the
    // all-gather output into the unsharded parameters, both alive (outside the forward the
    // output is freed right after, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py),
    // block 0's reduce-scatter buffer alive, every other gradient shard written, the gradient
    // of the embeddings' output (its sequence-parallel shard under TP: no TP case peaks here,
    // so that part is not measured)
    let mut x = base(
        "backward: embeddings re-gathered (all-gather copy-out)".into(),
        Phase::Backward,
    );
    x.add(Weights, u_embedding)
        .add(CommBuffers, u_embedding)
        .add(CommBuffers, block0_reduce_scatter)
        .add(Gradients, 4 * (sharded - embedding_own))
        .add(Activations, positions)
        .add(Temporaries, 2 * d * tl);
    out.push(x);

    // the embeddings' backward (measured: `titan-llama3-405b-1l-w32-tp8-s1024`): the unit
    // gathered (re-gathered, or resident under "never"), block 0's reduce-scatter buffer still
    // alive (waited for in the embeddings' post-backward), every other gradient shard written,
    // the gradient of the embeddings' output (all-gathered to `T` tokens under SP, the
    // backward of the vocab-parallel embedding's reduce-scatter) and `embedding_dense_backward`'s
    // bf16 weight gradient
    let mut x = base(
        "backward: embeddings weight gradient".into(),
        Phase::Backward,
    );
    x.add(Weights, u_embedding)
        .add(CommBuffers, block0_reduce_scatter)
        .add(Gradients, 4 * (sharded - embedding_own))
        .add(Activations, positions)
        .add(Temporaries, 2 * z.padded(&z.embedding) + 2 * d * tokens);
    out.push(x);

    // the embeddings' post-backward (FSDP2 `foreach_reduce`, measured on one FSDP rank:
    // `dp_shard = 1`): every other gradient shard written, the unit resharded, its bf16
    // gradient, the fp32 reduce-scatter input and the fp32 shard being written
    let mut x = base(
        "backward: embeddings gradient reduce-scatter".into(),
        Phase::Backward,
    );
    x.add(Gradients, 4 * (sharded - embedding_own))
        .add(
            Gradients,
            2 * z.padded(&z.embedding) + 4 * z.sharded(&z.embedding),
        )
        .add(CommBuffers, 4 * z.padded(&z.embedding))
        .add(Activations, positions);
    out.push(x);

    // `clip_grad_norm_(foreach=True)` then AdamW: foreach (torch/optim/adamw.py
    // `_multi_tensor_adam`: `torch._foreach_sqrt(exp_avg_sqs)`, one fp32 list the size of the
    // shards) or fused (`torch._fused_adamw_`, in place: nothing besides the gradients; measured,
    // torchtitan's default `optimizer.implementation = "fused"`); every unit resharded after
    // backward
    let name = if job.fused_optimizer {
        "optimizer step (fused AdamW)"
    } else {
        "optimizer step (foreach AdamW)"
    };
    let mut x = base(name.into(), Phase::Optimizer);
    x.add(Gradients, 4 * sharded).add(
        OptimizerTemporaries,
        if job.fused_optimizer { 0 } else { 4 * sharded },
    );
    out.push(x);
    Ok(out)
}
