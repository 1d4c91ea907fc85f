//! The training driver: forward with the loss, backward (with checkpoint recomputation), the
//! optimizer states and step, and the steady-state step that strings them together.

use super::Builder;
use crate::memory::timeline::{Category, Ids, Marker, Node, Phase, SegKind};
use crate::model::AttentionKind;
use crate::optimizer::OptimTensor;

impl Builder<'_> {
    fn forward_and_loss(&mut self) {
        let rows = self.tokens;
        let ckpt = self.mode.checkpointing();
        self.t.set_phase(Phase::Forward);
        self.unit_pre_forward(0);
        let (mut x, xs) = self.embeddings();
        // rotary cos/sin tables, [B, S, rotary_dim] in the compute dtype (fp32 under autocast)
        if let Some(l) = self.model.layers.first() {
            let dim = match l.attention.kind {
                AttentionKind::Standard { .. } => l.attention.rotary_dim.map_or(0, u128::from),
                AttentionKind::Mla {
                    qk_rope_head_dim, ..
                } => u128::from(qk_rope_head_dim),
            };
            if dim > 0 {
                let sz = if self.amp { 4 } else { self.param_size };
                let cos = self.act(rows * dim * sz, false);
                let sin = self.act(rows * dim * sz, false);
                self.rope_tables = Some((cos, sin));
                self.out_refs.push(cos);
                self.out_refs.push(sin);
            }
        }
        let mut xsize = xs;
        let mask = self.causal_mask(self.seq, self.seq);
        for i in 0..self.n_layers() {
            self.seg(Some(i), SegKind::Forward);
            self.mark(Marker::PostBackward(i + 1));
            self.unit_pre_forward(i + 1);
            let y = if ckpt {
                self.t.recording = false;
                let y = self.layer(i, x, xsize, true);
                self.t.recording = true;
                // the checkpoint keeps the layer's inputs for the recompute: the hidden state
                // and the rotary cos/sin passed to every layer (torch/utils/checkpoint.py)
                let mut kept = Ids::of(&[x]);
                if let Some((cos, sin)) = self.rope_tables {
                    kept.push(cos);
                    kept.push(sin);
                }
                self.t.record(Node {
                    saved: kept,
                    inputs: Ids::of(&[]),
                    outputs: Ids::of(&[y]),
                    recompute: Some(i),
                    ..Node::default()
                });
                y
            } else {
                self.layer(i, x, xsize, false)
            };
            self.unit_post_forward(i + 1);
            self.mark(Marker::PreBackward(i + 1));
            self.drop_(x);
            x = y;
            xsize = if self.amp { 4 } else { xsize };
        }
        self.seg(None, SegKind::Fixed);
        let (fx, fs) = self.body_tail(x, xsize, rows, mask);
        // the loss phase starts at the LM head (the harness's lm_head forward pre-hook)
        self.t.set_phase(Phase::Loss);
        let v = u128::from(self.model.embeddings.vocab_size);
        let head = self.lm_head_linear();
        let c = self.compute_size;
        let (mut logits, _) = self.linear(fx, fs, rows, head);
        self.drop_(fx);
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
        // ForCausalLMLoss (transformers loss/loss_utils.py): logits.float(), then
        // cross_entropy = log_softmax (fp32 output saved) + nll_loss.
        let lf = if c != 4 {
            self.cast(logits, rows * v * 4)
        } else {
            logits
        };
        self.t.retag(lf, Category::LossBuffers);
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
        // nll_loss_backward materialises a full fp32 [tokens, vocab] gradient
        self.t.record(Node {
            inputs: Ids::of(&[ls]),
            outputs: Ids::of(&[loss]),
            ..Node::default()
        });
        self.drop_(ls);
        // the training loop keeps only the loss: outputs (logits, cache) are dropped
        self.drop_(logits);
        for r in std::mem::take(&mut self.out_refs) {
            self.drop_(r);
        }
        for r in std::mem::take(&mut self.autocast_cache) {
            self.drop_(r);
        }
        // the model's forward (the root unit's) returns here, after the loss
        self.unit_post_forward(0);
        self.t.set_phase(Phase::Backward);
        self.t.seed_grad(loss);
        self.unit_pre_backward(0);
        self.backward();
        self.seg(None, SegKind::Fixed);
        self.finish_backward();
        self.drop_(loss);
    }

    fn backward(&mut self) {
        while let Some(node) = self.t.tape.pop() {
            if let Some(m) = node.marker {
                self.on_marker(m);
                continue;
            }
            if let Some(i) = node.recompute {
                // non-reentrant checkpoint: the first unpack re-runs the layer's forward with
                // saving on (torch/utils/checkpoint.py `_checkpoint_hook`), then backward goes on.
                let x = node.saved.as_slice()[0];
                let out = node.outputs.as_slice()[0];
                self.t.tape.push(Node {
                    saved: node.saved,
                    ..Node::default()
                });
                let xsize = self.t.bytes(x) / (self.tokens * self.hidden).max(1);
                let y = self.layer(i, x, xsize, true);
                // the recompute runs in its own autocast region (checkpoint.py re-enters the
                // saved autocast state); leaving it clears autocast's weight-cast cache
                // (`torch.clear_autocast_cache` when the nesting drops to 0)
                for r in std::mem::take(&mut self.autocast_cache) {
                    self.drop_(r);
                }
                self.t.move_grad(out, y);
                self.drop_(y);
                continue;
            }
            self.t.backward_node(&node);
            self.after_backward_node(&node);
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
        if let Some(b) = w.optimizer.step_temporaries(total, largest) {
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
        self.t.reset_peak();
        let micro = w.grad_accum.min(2);
        for _ in 0..micro {
            self.forward_and_loss();
        }
        self.optimizer_step();
        self.t.zero_grad();
        self.shard_zero_grad();
    }
}
