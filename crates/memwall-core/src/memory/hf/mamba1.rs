//! Mamba-1 layers: `MambaMixer` (transformers 5.23 `models/mamba/modeling_mamba.py`) on the
//! path transformers takes without the `mamba_ssm` / `causal_conv1d` kernels: `mamba_inner_fn`
//! falls back to a function that returns `None`, so training runs the same code as the
//! prefill — `causal_conv1d_fn`'s `F.conv1d` fallback, `x_proj`, `dt_proj.weight @ dt`, and
//! `mamba_selective_scan`'s **sequential loop** over the tokens (`use_mambapy = False`; the
//! associative scan only runs under `torch.compile`); decode steps run `causal_conv1d_update`
//! and `mamba_selective_state_update`. That is what the fake-tensor truth harness runs.
//!
//! `in_proj` and `out_proj` are ordinary linears replayed op by op (LoRA can target them).
//! Between them, the convolution, `x_proj`, the time-step matmul and the scan are replayed as
//! one composite autograd node whose bytes come from the closed forms below. Each lists the
//! tensors alive at that instant, in source order; they were read off allocation traces of one
//! mixer under `FakeTensorMode` (every storage allocation and free,
//! `tools/truth/probes/mamba1_mixer.py`, whose `--check` compares them) and hold byte for byte
//! there for batch 1–4, 3–9 tokens, bf16 and fp32 and random widths. What dominates: the loop
//! keeps every step's fp32 state `[B, I, N]` (and its low-precision copy for the `bmm`) for
//! backward, and the discretised `A`, `B·u` tensors are `[B, I, S, N]` fp32 — about
//! `(14·N + 20)·I` bytes per token in bf16, `N = 16` → 1.2 MB per token per layer at Mamba
//! 2.8B's widths. Backward's peak is in the loop's second step: the gradients of `exp(A·dt)`
//! and `B·u` are each summed out of place from one `select_backward` (a zero-filled
//! `[B, I, S, N]` tensor) per step.

use super::{Builder, LayerParams};
use crate::memory::timeline::{Category, Ids, Node, TensorId};
use crate::mixer::Mamba1;
use crate::model::LinearRole;

/// fp32: the scan's `.float()` casts are copies in low precision and no-ops in fp32.
const F: u128 = 4;

/// The sizes of one mixer call (`b` sequences of `s` tokens), in elements.
#[derive(Debug, Clone, Copy)]
struct Scan {
    b: u128,
    s: u128,
    /// tokens `b·s`
    t: u128,
    /// inner width
    i: u128,
    /// state size
    n: u128,
    /// `x_proj` width `R + 2N`
    w: u128,
    /// convolution kernel
    k: u128,
    /// dt rank
    r: u128,
    /// Jamba's RMSNorms on dt, B and C
    norms: bool,
}

impl Scan {
    fn new(m: &Mamba1, b: u128, s: u128) -> Self {
        Scan {
            b,
            s,
            t: b * s,
            i: u128::from(m.intermediate),
            n: u128::from(m.state_size),
            w: u128::from(m.x_proj_width()),
            k: u128::from(m.conv_kernel),
            r: u128::from(m.time_step_rank),
            norms: m.bcdt_norms,
        }
    }

    /// Extra bytes saved by Jamba's RMSNorms on `dt`, `B` and `C` (`JambaRMSNorm`: the fp32
    /// input, `rsqrt`, the normalised copy and the weighted output per norm, while `x_proj`'s
    /// output is no longer saved in low precision), read off the traces of `JambaMambaMixer`
    /// (`mamba1_mixer.py --jamba`); `extra_peak` adds what the forward's peak holds on top.
    fn norms_saved(&self, z: u128, extra_peak: bool) -> u128 {
        if !self.norms {
            return 0;
        }
        let Scan { t, n, r, w, .. } = *self;
        if z == F {
            t * (2 * F * w + 12)
        } else {
            let peak = if extra_peak { 2 * t * n } else { 0 };
            t * (3 * z * r + 5 * z * n + 12) + peak
        }
    }

    /// Bytes autograd keeps after the mixer's forward between `in_proj`'s output (excluded:
    /// saved through its views by the convolution and `silu(gate)`) and `out_proj`'s input
    /// (excluded); `z` = bytes per element of the projections.
    fn saved(&self, z: u128) -> u128 {
        let Scan {
            b,
            s,
            t,
            i,
            n,
            w,
            k,
            ..
        } = *self;
        let lowp = z != F;
        let mut v = self.norms_saved(z, false)
            + 2 * i * n * F // exp(A_log.float()) (saved by exp), A = -exp (saved by A·dt)
            + b * i * (s + k - 1) * z // conv1d output, saved by silu through its [..., :S] view
            + t * i * z // silu output (x_proj's input, hidden·D)
            + t * w * z // x_proj output (dt saved by the dt matmul, C slices by the bmm's)
            + 2 * t * i * z // dt + dt_bias (softplus), softplus (A·dt, dt·B)
            + 2 * t * i * n * F // discrete_A = exp(A·dt), discrete_B = dt·B
            + b * i * n * z // the zero initial state (saved by the first step's product)
            + t * i * F // scan_output + hidden·D (saved by the gating product)
            + t * i * z; // silu(gate)
        if b > 1 {
            // x_proj's input `[B, S, I]` transposed: `reshape` copies it for the mm
            v += t * i * z;
        }
        if lowp {
            v += i * F // D.float() (saved by hidden·D)
                + t * n * F // B.float() (saved by dt·B)
                + t * i * F // hidden.float() (saved by discrete_B·u)
                + t * i * n * F - b * i * n * F // every step's fp32 state but the last
                + t * i * n * z; // every step's state cast for the bmm with C
        } else {
            // fp32: the casts are the tensors themselves; every state is saved by its bmm
            v += t * i * n * F;
        }
        v
    }

    /// Highest bytes alive during the mixer's forward above its input and `in_proj`'s output,
    /// with autograd saving (at the gating product, before the scan's locals go).
    fn forward_peak(&self, z: u128) -> u128 {
        let Scan { t, i, n, b, .. } = *self;
        let mut v = self.saved(z)
            + self.norms_saved(z, true) - self.norms_saved(z, false)
            + t * i * n * F // deltaB_u
            + t * i * z // dt (the contiguous `dt_proj.weight @ dt`)
            + t * i * z // the per-step bmm outputs (the list `torch.stack` reads)
            + t * i * F; // scan_output · silu(gate)
        if z != F {
            v += b * i * n * F // the last state (not saved)
                + i * F; // dt_proj.bias.float()
        }
        v
    }

    /// Bytes of the forward's locals that outlive the scan until the mixer returns (after
    /// `out_proj`): `dt`, the gated output in fp32 and `dt_proj.bias.float()`.
    fn locals(&self, z: u128) -> u128 {
        let Scan { t, i, .. } = *self;
        t * i * z + t * i * F + if z != F { i * F } else { 0 }
    }

    /// Highest bytes alive during a forward that saves nothing (`torch.no_grad()`, or a
    /// checkpointed layer's first pass) above the input and `in_proj`'s output: either the
    /// last step of the loop or the end of the scan (D term and gating), whichever is higher.
    /// (Jamba's dt/B/C norms are freed before the scan: not counted.)
    fn forward_peak_unsaved(&self, z: u128) -> u128 {
        let Scan {
            b, s, t, i, n, w, ..
        } = *self;
        let common = 3 * t * i * n * F // discrete_A, discrete_B, deltaB_u
            + i * n * F // A
            + t * w * z // x_proj output
            + 3 * t * i * z // silu output, dt, softplus
            + if z != F { 2 * i * F } else { 0 }; // dt_proj.bias.float(), D.float()
                                                  // the last step: previous state, state·discrete_A, the new state; S − 1 bmm outputs
        let last_step = (s.saturating_sub(1)) * b * i * z + 3 * b * i * n * F;
        // the end: S bmm outputs, their stack, hidden·D and the sum (fp32), the final state
        let end = t * i * z + t * i * z + 2 * t * i * F + b * i * n * F;
        common + last_step.max(end)
    }

    /// Highest bytes of the mixer's backward above what is alive when it starts (its output's
    /// gradient from `out_proj`, everything saved), input and parameter gradients included: the
    /// loop's second backward step, with two `[B, I, S, N]` gradient sums and the out-of-place
    /// sum of one of them.
    fn backward_peak(&self, z: u128) -> u128 {
        let Scan { b, t, i, n, .. } = *self;
        let base = 16 * t * i * n + t * n * z;
        if z == F {
            (base + 4 * i).saturating_sub(4 * b * i * n)
        } else {
            let freed = 4 * b * i * n + 2 * z * t * i;
            let back = if b == 1 { z * t * i } else { 0 };
            (base + back).saturating_sub(freed)
        }
    }

    /// Highest transient bytes of one decode step (`mamba_selective_state_update`) above the
    /// states, the step's input and `in_proj`'s output: at `state·dA + dB·x`.
    fn decode_peak(&self, z: u128) -> u128 {
        let Scan { b, i, n, w, .. } = *self;
        let mut v = i * n * F // A
            + b * i * z // conv update's output (silu)
            + b * w * z // x_proj output
            + 2 * b * i * z // dt, softplus(dt + dt_bias)
            + 5 * b * i * n * F; // dA, dB, dB·x, state·dA, the new state
        if z != F {
            v += i * F; // dt_proj.bias.float()
        }
        v
    }
}

impl Builder<'_> {
    /// The mixer's parameters: `in_proj`, `out_proj` (linears), then `conv1d.weight`
    /// `[I, 1, kernel]`, `conv1d.bias`, `x_proj.weight`, `dt_proj.weight`, `dt_proj.bias`,
    /// `A_log` `[I, N]` and `D`.
    pub(super) fn mamba1_params(&mut self, m: &Mamba1, lp: &mut LayerParams) {
        for shape in m.linears(self.model.hidden_size) {
            let lin = self.shaped_linear(&shape);
            lp.linears.push((shape.role, lin));
        }
        let i = u128::from(m.intermediate);
        let k = u128::from(m.conv_kernel);
        let r = u128::from(m.time_step_rank);
        let n = u128::from(m.state_size);
        let w = u128::from(m.x_proj_width());
        lp.ssm.push(self.new_matrix(i * k, i, k, true));
        if m.conv_bias {
            lp.ssm.push(self.new_param(i, true));
        }
        lp.ssm.push(self.new_matrix(w * i, w, i, true));
        lp.ssm.push(self.new_matrix(i * r, i, r, true));
        lp.ssm.push(self.new_param(i, true));
        lp.ssm.push(self.new_matrix(i * n, i, n, true));
        lp.ssm.push(self.new_param(i, true));
        if m.bcdt_norms {
            // Jamba: dt_layernorm, b_layernorm, c_layernorm
            lp.ssm.push(self.new_param(r, true));
            lp.ssm.push(self.new_param(n, true));
            lp.ssm.push(self.new_param(n, true));
        }
    }

    /// `MambaMixer.forward`: `in_proj`, the convolution + scan composite,
    /// `out_proj(scan_output.transpose(1, 2).to(dtype))`.
    pub(super) fn mamba1_mixer(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        m: &Mamba1,
    ) -> TensorId {
        let rows = self.tokens;
        let lin = |role: LinearRole| {
            lp.linears
                .iter()
                .find(|(r, _)| *r == role)
                .map_or(&super::LIN_ZERO, |(_, l)| l)
        };
        let (zx, zs) = self.linear(x, x_size, rows, lin(LinearRole::SsmIn));
        let d = Scan::new(m, self.batch, self.seq);
        let (inner, locals) = self.mamba1_inner(zx, zs, x_size, lp, &d);
        self.drop_(zx);
        let (y, _) = self.linear(inner, x_size, rows, lin(LinearRole::SsmOut));
        self.drop_(inner);
        if let Some(l) = locals {
            self.drop_(l);
        }
        y
    }

    /// Convolution, `x_proj`, time step and selective scan as one node: returns the gated scan
    /// output cast to the mixer input's dtype (`out_proj`'s input) and the forward's locals.
    fn mamba1_inner(
        &mut self,
        zx: TensorId,
        zs: u128,
        out_size: u128,
        lp: &LayerParams,
        d: &Scan,
    ) -> (TensorId, Option<TensorId>) {
        let out_bytes = d.t * d.i * out_size;
        if self.mode.is_infer() {
            return (self.mamba1_infer(zs, out_bytes, d), None);
        }
        let params: Vec<TensorId> = lp.ssm.iter().map(|p| p.id).collect();
        let rg = self.rg(zx) || params.iter().any(|&p| self.t.requires_grad(p));
        if !self.t.recording {
            // a checkpointed layer's first pass: nothing is saved
            if rg {
                // the composite node saves: the layer's tail starts after it
                self.t.tail_barrier();
            }
            self.t
                .transient(d.forward_peak_unsaved(zs), Category::Activations);
            return (self.act(out_bytes, rg), None);
        }
        let extra = d.saved(zs);
        let kept = self.act(extra, false);
        let locals = self.act(d.locals(zs), false);
        self.t.transient(
            d.forward_peak(zs).saturating_sub(extra + d.locals(zs)),
            Category::Activations,
        );
        let out = self.act(out_bytes, rg);
        if rg {
            // a node holds at most six parameters: the first six go with the scan's node; the
            // rest (D with a conv bias) with an empty node recorded before it, whose backward
            // runs right after the scan's
            let (head, tail) = params.split_at(params.len().min(6));
            if !tail.is_empty() {
                self.t.record(Node {
                    params: Ids::of(tail),
                    ..Node::default()
                });
            }
            let param_grads: u128 = lp
                .ssm
                .iter()
                .take(head.len())
                .filter(|p| self.trainable(p))
                .map(|p| p.numel * self.param_size)
                .sum();
            let temps = d
                .backward_peak(zs)
                .saturating_sub(d.t * 2 * d.i * zs + param_grads);
            self.t.record(Node {
                saved: Ids::of(&[zx, kept]),
                inputs: Ids::of(&[zx]),
                params: Ids::of(head),
                outputs: Ids::of(&[out]),
                backward_temps: temps,
                ..Node::default()
            });
        }
        self.drop_(kept);
        (out, Some(locals))
    }

    /// Inference: the prefill allocates the layer's conv state `[B, I, kernel]` (in the
    /// projections' dtype, `update_conv_state` before the convolution) and, after the scan, the
    /// fp32 SSM state `[B, I, N]` (`update_recurrent_state`: a `zeros_like` of the scan's fp32
    /// final state, `LinearAttentionLayer` in transformers `cache_utils.py`); decode steps
    /// update both in place.
    fn mamba1_infer(&mut self, zs: u128, out_bytes: u128, d: &Scan) -> TensorId {
        let layer = self.cur_layer;
        let has_state = self.cache.get(layer).is_some_and(Option::is_some);
        if has_state && d.s == 1 {
            self.t.transient(d.decode_peak(zs), Category::Activations);
        } else {
            let conv = self.act(d.b * d.i * d.k * zs, false);
            self.t
                .transient(d.forward_peak_unsaved(zs), Category::Activations);
            let ssm = self.act(d.b * d.i * d.n * F, false);
            if let Some(slot) = self.cache.get_mut(layer) {
                if let Some((oc, os, _)) = slot.replace((conv, ssm, 0)) {
                    self.t.release(oc);
                    self.t.release(os);
                }
            }
        }
        self.act(out_bytes, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The closed forms against allocation traces of `MambaMixer` (numbers printed by
    /// `tools/truth/probes/mamba1_mixer.py --marks`).
    #[test]
    fn closed_forms_match_the_traces() {
        let m = Mamba1 {
            intermediate: 16,
            state_size: 4,
            time_step_rank: 3,
            conv_kernel: 4,
            proj_bias: false,
            conv_bias: true,
            residual_in_fp32: true,
            bcdt_norms: false,
        };
        // B = 2, S = 5, bf16 prefill: the end of the scan, 11932 bytes above x and in_proj's
        // output, of which the conv state is 256
        let d = Scan::new(&m, 2, 5);
        assert_eq!(d.forward_peak_unsaved(2) + 2 * 16 * 4 * 2, 11932);
        // its decode step: 3116 above the states, the input and in_proj's output
        let d1 = Scan::new(&m, 2, 1);
        assert_eq!(d1.decode_peak(2), 3116);
    }
}
