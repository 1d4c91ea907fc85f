//! The training driver: forward with the loss, backward (with checkpoint recomputation), the
//! optimizer states and step, and the steady-state step that strings them together.

use super::{Builder, Kernels};
use crate::memory::timeline::TensorId;
use crate::memory::timeline::{Category, Ids, Marker, Node, Phase, SegKind};
use crate::optimizer::OptimTensor;
use crate::workload::{LossKernel, TrainWorkload};

/// Rows of one chunk of Liger's fused linear cross-entropy (Liger-Kernel 0.8.5,
/// `fused_linear_cross_entropy_forward`, `chunk_mem_const = 1`): `inc_factor = cdiv(V, H)`,
/// `chunk_size = min(next_power_of_2(cdiv(BT, inc_factor)), BT)`, which bounds the transient
/// logits to about `BT × H` elements.
pub(crate) fn liger_chunk_rows(rows: u128, hidden: u128, vocab: u128) -> u128 {
    let inc = vocab.div_ceil(hidden.max(1)).max(1);
    rows.div_ceil(inc).next_power_of_two().min(rows)
}

impl Builder<'_> {
    fn forward_and_loss(&mut self) {
        let rows = self.tokens;
        let ckpt = self.mode.checkpointing();
        self.t.set_phase(Phase::Forward);
        // `with save_on_cpu(pin_memory=True): loss = model(**batch).loss` (--activation-offload)
        self.t.host.active = self
            .mode
            .train()
            .is_some_and(|w| w.step_options.activation_offload);
        self.unit_pre_forward(0);
        let (mut x, xs) = self.embeddings();
        let positions =
            (self.builds_position_ids() && !self.mode.kernels().padding_free).then(|| {
                // the base model's int64 `position_ids = arange(S) + past_seen_tokens`, a local
                // until it returns (memory/hf/infer.rs `infer_forward`); a padding-free batch
                // passes its own
                self.position_ids(self.seq)
            });
        // rotary cos/sin tables, [1, S, rotary_dim] in the compute dtype (fp32 under autocast):
        // every *Model.forward builds `position_ids = arange(S).unsqueeze(0)`, shared by the
        // batch (padding-free: the packed row's position ids, [1, B·S])
        if let Some(head_dim) = self.complex_rope_head_dim() {
            // Llama 4: one complex64 freqs_cis table of head_dim per forward, whatever the
            // first layer is (Llama4TextModel always runs its rotary embedding;
            // memory/hf/llama4.rs)
            let t = self.llama4_rope_table(head_dim);
            self.rope_tables = Some((t, t));
        } else {
            let dim = self.rope_table_dim();
            if dim > 0 {
                let sz = if self.amp || self.rope_tables_fp32() {
                    4
                } else {
                    self.param_size
                };
                self.rope_table_transient(self.seq, dim);
                let cos = self.act(self.seq * dim * sz, false);
                let sin = self.act(self.seq * dim * sz, false);
                self.rope_tables = Some((cos, sin));
                self.out_refs.push(cos);
                self.out_refs.push(sin);
            }
        }
        let mut xsize = xs;
        let mask = self.causal_mask(self.seq, self.seq);
        self.attn_mask = mask;
        self.core_calls.clear();
        for i in 0..self.n_layers() {
            self.seg(Some(i), SegKind::Forward);
            self.mark(Marker::PostBackward(i + 1));
            let tables = self.unit_cast_inputs();
            self.unit_pre_forward(i + 1);
            let y = if self.checkpoints_slot(i) {
                self.t.recording = false;
                self.t.start_tail();
                self.sac_begin(i, false);
                let y = self.layer(i, x, xsize, true);
                self.sac_end();
                let tail = self.t.take_tail();
                self.t.recording = true;
                if self.ckpt_tails.len() <= i {
                    self.ckpt_tails.resize_with(i + 1, Default::default);
                }
                self.ckpt_tails[i] = tail;
                // the checkpoint keeps the layer's inputs for the recompute: the hidden state,
                // the rotary cos/sin and the attention mask passed to every layer
                // (torch/utils/checkpoint.py)
                let mut kept = vec![x];
                if let Some((cos, sin)) = self.rope_tables {
                    kept.extend([cos, sin]);
                }
                if let Some(m) = self.layer_mask(i) {
                    kept.push(m);
                }
                // and the base model's `position_ids`, a keyword of every layer's call but
                // Granite 4.0-H's (transformers' GradientCheckpointingLayer checkpoints
                // `partial(forward, self, **kwargs)`, which the recompute holds until the
                // layer's backward; tools/truth/probes/h51_live_storages.py positions on torch 2.15
                // CPU: rnd-s157-olmo2-0's int64
                // [1, 164] alive until layer 0's backward returns)
                if let Some(p) = positions.filter(|_| !self.model.layers_without_position_ids) {
                    kept.push(p);
                }
                self.t.record(Node {
                    saved: Ids::of(&kept),
                    inputs: Ids::of(&[]),
                    outputs: Ids::of(&[y]),
                    recompute: Some(i),
                    ..Node::default()
                });
                y
            } else {
                // a layer the policy leaves alone keeps its activations; the model still runs
                // without a KV cache when checkpointing is on (`use_cache` is forced off for the
                // whole model by `merge_with_config_defaults`, utils/generic.py)
                self.layer(i, x, xsize, ckpt)
            };
            self.unit_post_forward(i + 1);
            self.unit_uncast_inputs(tables);
            self.mark(Marker::PreBackward(i + 1));
            self.drop_(x);
            x = y;
            xsize = self.layer_out_size(i, xsize);
        }
        self.seg(None, SegKind::Fixed);
        let (fx, fs) = self.body_tail(x, xsize, rows, mask);
        self.drop_image_locals();
        // the base model's forward (`*Model.forward`) returns with the final hidden states: its
        // locals (`inputs_embeds`, the rotary `position_embeddings`, OPT's position ids) go
        // now, while the causal LM's forward binds the output to `hidden_states`
        // (`outputs.last_hidden_state`) through the LM head and the loss (traced with
        // tools/truth/probes on rnd-s97-falcon-0 and rnd-s53-smollm3-0 under autocast: at
        // `nll_loss_forward` the final norm's output is alive, the embeddings and cos/sin are not)
        self.drop_list(|b| &mut b.out_refs);
        self.t.retain(fx);
        // the loss phase starts at the LM head (the harness's lm_head forward pre-hook)
        self.t.set_phase(Phase::Loss);
        let loss = match self.mode.kernels().loss {
            LossKernel::FusedLinear => self.fused_linear_loss(fx, fs, rows),
            kind => self.logits_loss(fx, fs, rows, kind),
        };
        // the causal LM's forward returns: `hidden_states` goes; the output object (logits,
        // cache) with it when the loop keeps only the loss (HF Trainer), else it stays bound
        self.drop_(fx);
        let cache = std::mem::take(&mut self.cache_refs);
        if self.mode.keeps_outputs() {
            self.outputs_kept.extend(cache);
        } else {
            for r in cache {
                self.drop_(r);
            }
        }
        self.drop_list(|b| &mut b.autocast_cache);
        // the model's forward (the root unit's) returns here, after the loss
        self.unit_post_forward(0);
        // `outputs = model(**batch)` rebinds the name: the previous output object goes now
        for r in std::mem::take(&mut self.outputs_prev) {
            self.drop_(r);
        }
        self.t.host.active = false;
        self.t.set_phase(Phase::Backward);
        let seed = self.t.seed_grad(loss);
        // `loss.backward()` makes the seed gradient (`_make_grads`: `torch.ones_like(loss)`)
        // and holds it in its `grad_tensors_` list until the engine returns
        // (torch/autograd/__init__.py `backward`; traced with
        // tools/truth/probes/h51_live_storages.py loss: the 0-dim `ones_like` alive at
        // `_log_softmax_backward_data`, after nll_loss's backward consumed it)
        self.t.retain(seed);
        self.unit_pre_backward(0);
        self.backward();
        self.t.release(seed);
        // `del loss` (measure.py; the Trainer's loss goes with the step) frees the graph: the
        // leaves its AccumulateGrad nodes held go, with their `.grad`
        self.drop_list(|b| &mut b.leaves_held);
        self.seg(None, SegKind::Fixed);
        self.finish_backward();
        if self.mode.keeps_outputs() {
            // `loss = outputs.loss` stays bound with the output object
            self.outputs_kept.push(loss);
            self.outputs_prev = std::mem::take(&mut self.outputs_kept);
        } else {
            self.drop_(loss);
        }
    }

    /// The LM head's logits and a cross-entropy over them; returns the loss. The logits' Python
    /// reference (the model output) is dropped here too.
    fn logits_loss(&mut self, fx: TensorId, fs: u128, rows: u128, kind: LossKernel) -> TensorId {
        let v = u128::from(self.model.embeddings.vocab_size);
        let head = self.lm_head_linear();
        let c = self.compute_size;
        let (mut logits, _) = self.linear(fx, fs, rows, &head);
        self.drop_(fx);
        let upcast = self.model.head.logits_fp32 && c != 4;
        if upcast {
            // `lm_head(...).float()` in the model's forward (Mamba2ForCausalLM): the
            // low-precision logits are a temporary, the fp32 ones are the output
            let l32 = self.cast(logits, rows * v * 4);
            self.drop_(logits);
            logits = l32;
        }
        if self.model.head.logits_scaled {
            // Granite: `logits = logits / self.config.logits_scaling`, a new tensor
            let d = self.op(rows * v * c, &[logits], &[], &[], &[]);
            self.drop_(logits);
            logits = d;
        }
        if self.model.head.logit_softcap.is_some() {
            // Gemma 2: logits / cap; tanh; * cap (modeling_gemma2.py)
            let d = self.op(rows * v * c, &[logits], &[], &[], &[]);
            self.drop_(logits);
            let th = self.op_saving_output(rows * v * c, d);
            self.drop_(d);
            logits = self.op(rows * v * c, &[th], &[], &[], &[]);
            self.drop_(th);
        }
        self.t.retag(logits, Category::LossBuffers);
        if kind == LossKernel::Fused {
            // flash-attn `CrossEntropyLossFunction` (flash-attention 058ad35,
            // flash_attn/ops/triton/cross_entropy.py) over the low-precision logits: `losses`,
            // `lse` and `z_losses` are fp32 per row; it saves the logits and `lse`, and with
            // `inplace_backward=True` its backward writes the gradient into the logits' storage.
            let losses = self.act(rows * 4, true);
            let lse = self.act(rows * 4, false);
            let z_losses = self.act(rows * 4, false);
            if self.kernels == Kernels::Cpu && c != 4 {
                // the CPU reference of the Triton forward (tools/truth/kernels.py,
                // `FlashCrossEntropy.forward`) computes the log-sum-exp a block of rows at a time:
                // `logits[r0:r1].float()`, `max(1, 2**20 // (V * 4))` rows (≤ 1 MiB of fp32
                // scratch; `.float()` of fp32 logits is no copy). The Triton kernel keeps this
                // in registers, so CUDA semantics have no such buffer.
                let block_rows = ((1u128 << 20) / (v * 4)).max(1).min(rows);
                self.t.transient(block_rows * v * 4, Category::LossBuffers);
            }
            self.t.record(Node {
                saved: Ids::of(&[logits, lse]),
                inputs: Ids::of(&[logits]),
                outputs: Ids::of(&[losses]),
                grads_in_saved: true,
                ..Node::default()
            });
            self.drop_(lse);
            // `losses.sum() / (labels != ignore_index).sum()`: the per-row losses and the
            // discarded z-losses go when the loss function returns
            let loss = self.op(4, &[losses], &[], &[], &[]);
            self.drop_(losses);
            self.drop_(z_losses);
            self.drop_logits(logits);
            return loss;
        }
        let c = self.compute_size;
        // ForCausalLMLoss (transformers loss/loss_utils.py): logits.float(), then
        // cross_entropy = log_softmax (fp32 output saved) + nll_loss.
        let lf = if c != 4 && !upcast {
            self.cast(logits, rows * v * 4)
        } else {
            logits
        };
        self.t.retag(lf, Category::LossBuffers);
        // then `labels = nn.functional.pad(labels, (0, 1), value=ignore_index)` and `shift_labels =
        // labels[..., 1:].contiguous()`: int64 [B, S + 1] and [B, S] (one row of B·S when
        // padding-free), locals until it returns; nll_loss saves the target (derivatives.yaml
        // `nll_loss_forward`: `target`) until its backward (traced with
        // tools/truth/probes/h51_live_storages.py loss, rnd-s197-deepseekv3-0 b2 × 30: the [2, 31]
        // `constant_pad_nd` and the [2, 30] `clone` alive at `_log_softmax`, the clone still at
        // `nll_loss_backward`; rnd-t197-029-deepseekv3's loss phase was 984 B short without them)
        let label_rows = if self.mode.kernels().padding_free {
            1
        } else {
            self.batch
        };
        let padded = self.act((rows + label_rows) * 8, false);
        let target = self.act(rows * 8, false);
        let ls = self.act(rows * v * 4, true);
        self.t.retag(ls, Category::LossBuffers);
        self.t.record(Node {
            saved: Ids::of(&[ls]),
            inputs: Ids::of(&[lf]),
            outputs: Ids::of(&[ls]),
            ..Node::default()
        });
        if lf != logits {
            self.drop_(lf);
        }
        let loss = self.act(4, true);
        // nll_loss_backward materialises a full fp32 [tokens, vocab] gradient. nll_loss saves
        // its input too (derivatives.yaml `nll_loss_forward`: `self`), which the log-softmax
        // node keeps alive longer anyway; only offloading copies it a second time
        let nll_saved: &[TensorId] = if self.t.host.active {
            &[ls, target]
        } else {
            &[target]
        };
        self.t.record(Node {
            saved: Ids::of(nll_saved),
            inputs: Ids::of(&[ls]),
            outputs: Ids::of(&[loss]),
            ..Node::default()
        });
        self.drop_(ls);
        self.drop_(target);
        self.drop_(padded);
        self.drop_logits(logits);
        loss
    }

    /// The loss function returns: the logits' reference goes, unless the loop keeps the model
    /// output (`outputs.logits`).
    fn drop_logits(&mut self, logits: TensorId) {
        if self.mode.keeps_outputs() {
            self.outputs_kept.push(logits);
        } else {
            self.drop_(logits);
        }
    }

    /// Liger's fused linear cross-entropy (Liger-Kernel 0.8.5,
    /// `liger_kernel/ops/fused_linear_cross_entropy.py`, `fused_linear_cross_entropy_forward`,
    /// CUDA path): the LM head never runs. The forward allocates `grad_input` (the hidden states'
    /// shape) and `grad_weight` (the head weight's, when it is trainable), an fp32 loss per row
    /// and a boolean target mask, and one `[chunk_size, V]` logits buffer that every chunk of rows
    /// reuses (`torch.mm(out=)`; the kernel writes the chunk's gradient over it, then
    /// `torch.mm(out=grad_input[rows])` and `torch.addmm(out=grad_weight)` accumulate). The two
    /// gradients are saved and handed to autograd as they are in backward.
    fn fused_linear_loss(&mut self, fx: TensorId, fs: u128, rows: u128) -> TensorId {
        let v = u128::from(self.model.embeddings.vocab_size);
        let head = self.lm_head_linear();
        let hidden = head.in_f;
        let grad_input = self.act(rows * hidden * fs, false);
        self.t.retag(grad_input, Category::LossBuffers);
        let w_tr = self.trainable(&head.w);
        let w_bytes = self.t.bytes(head.w.id);
        let grad_weight = w_tr.then(|| {
            let g = self.act(w_bytes, false);
            self.t.retag(g, Category::LossBuffers);
            g
        });
        let loss_1d = self.act(rows * 4, false);
        let target_mask = self.act(rows, false);
        let chunk = liger_chunk_rows(rows, hidden, v);
        if self.amp && fs != self.compute_size {
            // under autocast `_can_use_mm_out` is false (fp32 hidden states): each chunk's logits
            // come from `_input_chunk @ weight.t()` (autocast dtype) and the weight gradient from
            // `grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()`, a
            // parameter-sized product and its fp32 copy (the legacy path; derived, not measured)
            let c = self.compute_size;
            let wg = if w_tr { w_bytes / 4 * (c + 4) } else { 0 };
            self.t.transient(
                chunk * v * c + chunk * hidden * c + wg,
                Category::LossBuffers,
            );
        } else {
            self.t.transient(chunk * v * fs, Category::LossBuffers);
        }
        let loss = self.act(4, true);
        let mut saved = vec![grad_input];
        saved.extend(grad_weight);
        let params: Vec<TensorId> = grad_weight.map(|_| head.w.id).into_iter().collect();
        self.t.record(Node {
            saved: Ids::of(&saved),
            inputs: Ids::of(&[fx]),
            params: Ids::of(&params),
            outputs: Ids::of(&[loss]),
            grads_in_saved: true,
            ..Node::default()
        });
        for t in [grad_input, loss_1d, target_mask] {
            self.drop_(t);
        }
        if let Some(g) = grad_weight {
            self.drop_(g);
        }
        self.drop_(fx);
        loss
    }

    fn backward(&mut self) {
        // the last node, copied once (popping an `Option<Node>` would copy it twice)
        while let Some(&node) = self.t.tape.last() {
            self.t.tape.truncate(self.t.tape.len() - 1);
            if let Some(m) = node.marker {
                self.on_marker(m);
                continue;
            }
            if let Some(i) = node.recompute {
                // non-reentrant checkpoint: the first unpack re-runs the layer's forward with
                // saving on (torch/utils/checkpoint.py `_checkpoint_hook`), then backward goes on.
                let x = node.saved.as_slice()[0];
                let out = node.outputs.as_slice()[0];
                // the layer's last nodes that save nothing run first, on the first pass's
                // graph: the recompute starts only when a node unpacks a saved tensor
                // (`Node::saves_nothing`), so their gradients (a residual add's cast of its
                // gradient to a 16-bit branch, a scalar multiplier's product) are alive
                // through it
                let (tail, saving) = self
                    .ckpt_tails
                    .get_mut(i)
                    .map(std::mem::take)
                    .unwrap_or_default();
                let tail = if tail
                    .last()
                    .is_some_and(|n| n.outputs.as_slice().contains(&out))
                {
                    tail
                } else {
                    Vec::new()
                };
                for n in tail.iter().rev() {
                    self.t.backward_node(n);
                    self.after_backward_node(n);
                }
                self.t.tape.push(Node {
                    saved: node.saved,
                    ..Node::default()
                });
                let xsize = self.t.bytes(x) / (self.tokens * self.hidden).max(1);
                self.sac_begin(i, true);
                self.recomputing = true;
                self.t.stop_after(saving);
                let y = self.layer(i, x, xsize, true);
                let stopped = self.t.end_stop();
                debug_assert!(
                    stopped,
                    "layer {i}'s recompute saved less than its first pass"
                );
                self.recomputing = false;
                self.sac_end();
                // the recompute runs in its own autocast region (checkpoint.py re-enters the
                // saved autocast state); leaving it clears autocast's weight-cast cache
                // (`torch.clear_autocast_cache` when the nesting drops to 0)
                self.drop_list(|b| &mut b.autocast_cache);
                self.hand_tail_grads(&tail, out, y);
                self.drop_(y);
                continue;
            }
            if node.leaf_keeps_grad {
                // AccumulateGrad stores the gradient as the leaf's `.grad`; the graph holds
                // both until it is freed after backward (`Builder::leaves_held`)
                for &o in node.outputs.as_slice() {
                    self.t.retain(o);
                    self.leaves_held.push(o);
                    if let Some(g) = self.t.take_grad(o) {
                        self.leaves_held.push(g);
                    }
                }
            }
            if let Some(block) = node.recompute_vision {
                self.recompute_vision_block(&node, block);
                continue;
            }
            if let Some(index) = node.recompute_attention {
                self.recompute_kernel(&node, index);
                continue;
            }
            self.t.backward_node(&node);
            self.after_backward_node(&node);
        }
    }

    /// After a checkpointed layer's recompute: its last nodes, which saved nothing, already
    /// ran on the first pass's graph (`tail`, in recording order); their recorded twins are
    /// the last nodes on the tape. The twins go (autograd does not run a node twice) and the
    /// gradients the tail left on the first pass's tensors move to the twins' inputs, where
    /// the recomputed layer's nodes pick them up. Without a tail the gradient of the layer's
    /// output `out` moves to the recomputed output `y`.
    fn hand_tail_grads(&mut self, tail: &[Node], out: TensorId, y: TensorId) {
        let k = tail.len();
        let len = self.t.tape.len();
        let twins_match = k > 0
            && len >= k
            && self.t.tape[len - k..]
                .iter()
                .zip(tail)
                .all(|(twin, first)| {
                    twin.saves_nothing()
                        && twin.inputs.as_slice().len() == first.inputs.as_slice().len()
                });
        if !twins_match {
            // no tail (or, never expected, a recompute that differs from the first pass:
            // then the first pass's gradients are dropped and the output's is made anew)
            debug_assert!(
                k == 0,
                "a recompute's last nodes differ from its first pass's"
            );
            if k == 0 {
                self.t.move_grad(out, y);
            } else {
                for n in tail {
                    for &a in n.inputs.as_slice() {
                        if let Some(g) = self.t.take_grad(a) {
                            self.drop_(g);
                        }
                    }
                }
                self.t.seed_grad(y);
            }
            return;
        }
        let twins: Vec<Node> = self.t.tape.drain(len - k..).collect();
        for (first, twin) in tail.iter().zip(&twins) {
            for (&a, &b) in first.inputs.as_slice().iter().zip(twin.inputs.as_slice()) {
                if a != b && self.t.has_grad(a) {
                    self.t.move_grad(a, b);
                }
            }
        }
    }

    fn optimizer_step(&mut self) {
        let Some(w) = self.mode.train() else { return };
        self.t.set_phase(Phase::Optimizer);
        if let Some(temps) = self.sharded_optimizer_temps() {
            self.t.transient(temps, Category::OptimizerTemporaries);
            return;
        }
        // the implementation's temporaries (crate::optimizer, `step_temporary_bytes`)
        let (mut total, mut largest) = (0, 0);
        for p in &self.train.trainable {
            let b = self.t.bytes(p.id);
            total += b * self.unit_weight(p.unit);
            largest = largest.max(b);
        }
        let temps = if w.optimizer == crate::workload::Optimizer::AdamwForloop {
            // the parameters in `model.parameters()` order, as the optimizer's group has them
            Some(crate::workload::Optimizer::forloop_step_temporaries(
                self.train.trainable.iter().map(|p| self.t.bytes(p.id)),
            ))
        } else {
            w.optimizer.step_temporaries(total, largest)
        };
        if let Some(b) = temps {
            self.t.transient(b, Category::OptimizerTemporaries);
        }
    }

    /// Optimizer states that exist from the second step on.
    fn optimizer_states(&mut self) {
        let Some(w) = self.mode.train() else { return };
        if let Some(bytes) = self.sharded_optimizer_states() {
            if bytes > 0 {
                self.t.alloc(bytes, Category::OptimizerStates, false);
            }
            return;
        }
        // per parameter as it is allocated (crate::optimizer, `state_bytes`)
        let bytes: u128 = self
            .train
            .trainable
            .iter()
            .map(|p| {
                w.optimizer.state_bytes(OptimTensor::param(
                    p.numel,
                    self.t.bytes(p.id),
                    p.rows,
                    p.cols,
                )) * self.unit_weight(p.unit)
            })
            .sum();
        if bytes > 0 {
            self.t.alloc(bytes, Category::OptimizerStates, false);
        }
    }

    /// One steady-state (second) training step: the parameters and the optimizer states (which
    /// exist from the first step on), then up to two micro-batches of forward and backward (with
    /// accumulation every micro-batch after the second repeats it), the optimizer step and
    /// `zero_grad`.
    pub(crate) fn run(&mut self) {
        let Some(w) = self.mode.train() else { return };
        self.build_params();
        self.shard_setup();
        self.optimizer_states();
        if w.step_options.keeps_outputs() {
            // the previous step's last micro-batch, whose output object is still bound when
            // this step starts (the harness measures the second of two steps the same way)
            self.forward_and_loss();
            self.optimizer_step();
            self.t.zero_grad();
            self.shard_zero_grad();
            self.t.set_phase(Phase::Forward);
        }
        self.t.reset_peak();
        for _ in 0..micro_batches_replayed(w) {
            self.forward_and_loss();
        }
        self.optimizer_step();
        self.t.zero_grad();
        self.shard_zero_grad();
    }
}

/// Micro-batches a training step replays: up to two (every micro-batch after the second
/// repeats it). This is the only way the memory simulation reads `grad_accum`, which is what
/// lets the fast evaluator's memo (`memory/fast/memo.rs`) key a workload by it.
pub(crate) fn micro_batches_replayed(w: &TrainWorkload) -> u64 {
    w.grad_accum.min(2)
}

#[cfg(test)]
mod tests {
    use super::liger_chunk_rows;

    #[test]
    fn liger_chunks_follow_its_source_example() {
        // fused_linear_cross_entropy.py: "BT = 4096*4, V = 32000, H = 4096 ==> inc_factor = 8,
        // chunk_size = 2048"
        assert_eq!(liger_chunk_rows(4096 * 4, 4096, 32000), 2048);
        // never more rows than there are, a power of two otherwise
        assert_eq!(liger_chunk_rows(100, 4096, 32000), 16);
        assert_eq!(liger_chunk_rows(3, 4096, 1000), 3);
    }

    /// The base model's int64 [1, S] `position_ids` is a keyword of every checkpointed layer's
    /// call, held by the checkpoint until that layer's backward (traced: rnd-s157-olmo2-0 and
    /// rnd-s29-gptoss-0 until layer 0's backward returns); a model that does not pass it
    /// (Granite 4.0-H) frees it when the base model returns, as does one without checkpointing.
    #[test]
    fn checkpointed_layers_keep_the_position_ids_they_are_called_with() {
        use crate::memory::{simulate_train, Kernels, Phase};
        use crate::model::tests::llama2_7b;
        use crate::workload::TrainWorkload;
        let seq = 64u64;
        // at the loss, after the base model has returned
        let loss = |ckpt: bool, passed: bool| {
            let mut m = llama2_7b();
            m.layers.truncate(2);
            m.layers_without_position_ids = !passed;
            let mut w = TrainWorkload::new(2, seq);
            w.checkpointing = ckpt;
            let e = simulate_train(&m, &w, Kernels::Cpu).unwrap();
            e.phase_peak(Phase::Loss).unwrap()
        };
        assert_eq!(loss(true, true) - loss(true, false), seq * 8);
        assert_eq!(loss(false, true), loss(false, false));
    }

    /// ForCausalLMLoss over bf16 logits: `logits.float()`, the padded labels and their shifted
    /// contiguous copy (int64), then log-softmax; afterwards the log-softmax output, the target
    /// (saved by nll_loss) and the scalar loss stay (the LM head keeps its input, alive before).
    #[test]
    fn the_torch_loss_keeps_the_shifted_labels_as_nll_losss_target() {
        use crate::memory::hf::Builder;
        use crate::memory::Kernels;
        use crate::model::tests::llama2_7b;
        use crate::workload::{LossKernel, TrainWorkload};
        let mut m = llama2_7b();
        m.layers.truncate(1);
        let (batch, seq) = (2u64, 32u64);
        let w = TrainWorkload::new(batch, seq);
        let mut b = Builder::train(&m, &w, Kernels::Cpu, None);
        b.build_params();
        let rows = u128::from(batch * seq);
        let (h, v) = (
            u128::from(m.hidden_size),
            u128::from(m.embeddings.vocab_size),
        );
        let fx = b.act(rows * h * 2, true);
        b.t.retain(fx);
        let before = b.t.live();
        b.t.reset_peak();
        let loss = b.logits_loss(fx, 2, rows, LossKernel::Torch);
        let labels = (rows + u128::from(batch)) * 8 + rows * 8;
        assert_eq!(
            b.t.peak() - before,
            rows * v * 2 + rows * v * 4 + labels + rows * v * 4
        );
        assert_eq!(b.t.live() - before, rows * v * 4 + rows * 8 + 4);
        b.drop_(loss);
    }
}
