//! State-space layers: `Mamba2Block` and `Mamba2Mixer` (transformers 5.23
//! `models/mamba2/modeling_mamba2.py`) on the path transformers takes without the
//! `mamba_ssm` / `causal_conv1d` kernels — `causal_conv1d_fn`'s `F.conv1d` fallback and the
//! chunked scan `mamba2_chunk_scan` in training and prefill, `causal_conv1d_update` and
//! `mamba2_selective_state_update` in decode. That is what the fake-tensor truth harness runs
//! (the kernels need CUDA); `docs/ssm.md` says what the CUDA kernels allocate instead.
//!
//! The projections (`in_proj`, `out_proj`) and the block's norm and residual are ordinary
//! modules replayed op by op. Between the projections — convolution, scan and gated norm — the
//! mixer runs about a hundred tensor ops (einsums that copy their operands into `bmm` layouts,
//! segment sums over `[chunk, chunk]` blocks, fp32 casts); they are replayed as one composite
//! autograd node whose bytes come from the closed forms below. Each form lists the tensors of
//! `torch_forward` / `mamba2_chunk_scan` (in source order) that are alive at that instant; they
//! were read off allocation traces of one mixer under `FakeTensorMode` (every storage
//! allocation and free, `tools/truth/probes/mamba2_mixer.py`) and hold byte for byte there for
//! batch 1–8, 1–4 chunks, padded and unpadded sequences, bf16 and fp32, Codestral's widths and
//! odd test widths (the cases the closed forms do not cover are named where they apply).

use super::{Builder, LayerParams};
use crate::memory::timeline::{Category, Ids, Node, TensorId};
use crate::mixer::Mamba2;
use crate::model::{LayerSpec, LinearRole};

/// The sizes of one mixer call (`b` sequences of `s` tokens), in elements.
#[derive(Debug, Clone, Copy)]
struct Scan {
    b: u128,
    s: u128,
    /// tokens `b·s`
    t: u128,
    /// tokens after padding to whole chunks, `b·c·l`
    tp: u128,
    /// chunks `ceil(s / l)`
    c: u128,
    /// chunk length
    l: u128,
    /// heads
    h: u128,
    /// head dim
    p: u128,
    /// state size
    n: u128,
    /// groups
    g: u128,
    /// inner width `h·p`
    i: u128,
    /// convolution channels `i + 2·g·n`
    cd: u128,
    /// `in_proj` width `i + cd + h`
    e: u128,
    /// convolution kernel
    k: u128,
    /// the scan output goes through the gated RMSNorm (else `y * silu(gate)`)
    norm: bool,
    /// the gated norm normalises before it gates (`Mamba2::norm_before_gate`)
    norm_first: bool,
    /// under CPU autocast (bf16): the einsums' `bmm`s and the convolution run in bf16
    amp: bool,
    /// the convolution has a bias (under autocast its 16-bit copy stays in autocast's cache)
    conv_bias: bool,
    /// `zxbcdt` is 16-bit under autocast (`Mamba2Mixer`; Falcon-H1's `mup_vector` makes it
    /// the layer is checkpointed (non-reentrant, HF gradient checkpointing): a saved tensor
    /// the backward unpacks is held only by the node's locals (see
    /// [`Scan::backward_peak_scan_amp16`])
    ckpt: bool,
    /// fp32): set by the caller, which knows the projections' output dtype
    zx16: bool,
    /// the mixer runs in a checkpointed layer's recomputation (set by the caller)
    recomputed: bool,
}

/// fp32: the scan's `.float()` casts are copies in low precision and no-ops in fp32.
const F: u128 = 4;

impl Scan {
    fn new(m: &Mamba2, b: u128, s: u128, amp: bool) -> Self {
        let l = u128::from(m.chunk_size).max(1);
        let c = s.div_ceil(l);
        Scan {
            b,
            s,
            t: b * s,
            tp: b * c * l,
            c,
            l,
            h: u128::from(m.num_heads),
            p: u128::from(m.head_dim),
            n: u128::from(m.state_size),
            g: u128::from(m.n_groups),
            i: u128::from(m.intermediate),
            cd: u128::from(m.conv_dim()),
            e: u128::from(m.in_proj_width()),
            k: u128::from(m.conv_kernel),
            ckpt: false,
            norm: m.gated_norm,
            norm_first: m.gated_norm && m.norm_before_gate,
            amp,
            conv_bias: m.conv_bias,
            zx16: false,
            recomputed: false,
        }
    }

    /// [`Scan::saved`] under autocast, without the gated norm, for a mixer whose `zxbcdt` is
    /// fp32 (Falcon-H1: the bf16 `in_proj` output times the fp32 `mup_vector`): the
    /// convolution runs in bf16 on bf16 copies of its input and weight and is cast back to
    /// fp32 (`out.to(hidden_states.dtype)`), dt stays fp32 (no `.float()` copies), and every
    /// einsum's `bmm` saves bf16 copies of its operands (CPU autocast's lower-precision list)
    /// and returns bf16. Read off `tools/truth/probes/falcon_h1_mixer.py --check-amp` (exact
    /// for 1–4 chunks: with one chunk the 16-bit `new_states` `bmm` output is saved through
    /// its `[:, :-1]` view, as in [`Scan::one_chunk_saved_extra`], while the `bmm` operands
    /// stay copies: they are casts, not layout copies, so [`Scan::one_chunk_saved_less`] does
    /// not apply).
    fn saved_amp(&self) -> u128 {
        let Scan {
            b,
            s,
            t,
            tp,
            c,
            l,
            h,
            p,
            n,
            i,
            cd,
            e,
            k,
            ..
        } = *self;
        const B16: u128 = 2;
        let c1 = c + 1;
        t * e * F + 2 * h * F // zxbcdt, A
            + cd * k * B16 + b * cd * s * B16 // conv weight and input in bf16
            + b * cd * (s + k - 1) * B16 + b * cd * s * F // conv output, its fp32 cast
            + 3 * t * h * F // dt + dt_bias, softplus, clamp
            + tp * i * F + tp * h * n * F + 2 * l * l // padded x, padded B, masks
            + b * h * c * l * l * F // L
            + 4 * tp * h * n * B16 + b * c * h * l * l * B16 // bf16 copies of C and B, G
            + 2 * tp * i * B16 + b * c * h * l * l * B16 + tp * i * B16 // x copies, M, Y_diag
            + 2 * tp * h * F + 2 * c1 * c1 + b * h * c1 * c1 * F // decay exps, masks, decay_chunk
            + b * c1 * h * p * n * B16 + b * h * c1 * c1 * B16 // states cat, decay_chunk copy
            + b * c * h * p * n * B16 // chunk states copy
            + tp * i * F + t * i * F // y + D_residual, silu(gate)
            + if c == 1 { self.b * h * p * n * B16 } else { 0 } // one chunk: new_states
    }

    /// [`Scan::saved`] under autocast for a mixer whose projections are 16-bit
    /// (`Mamba2Mixer`: Mamba-2 / Codestral, Granite 4.0-H), the gated norm included, and
    /// `zxbcdt` excluded: nothing saves `in_proj`'s 16-bit output (the convolution saves the
    /// 16-bit copy autocast makes of `hidden_states.to(weight.dtype)`, an fp32 copy that goes
    /// at once; `dt + dt_bias` does not save; the norm saves its own fp32 cast of the gate).
    /// From [`Scan::saved_amp`]: no fp32 `zxbcdt`, no fp32 cast of the convolution's output
    /// (`out.to(hidden_states.dtype)` casts back to 16 bits, a no-op), `dt + dt_bias` and
    /// softplus in 16 bits (`2·t·h·2`, the clamp is not saved) with the fp32 copies
    /// `dt[..., None].float()` and `dt.float()` (`2·t·h·4`) and `hidden_states.float()`
    /// (`t·i·4`) the products save; the gated norm saves `gate.to(float32)` (by silu),
    /// `silu(gate)`, `x·silu(gate)`, the normalised groups and rsqrt. Read off
    /// `tools/truth/probes/mamba2_mixer.py --check-amp` (exact, amp-bf16 and amp-fp16 alike,
    /// 1–4 chunks, 1–8 sequences, padded and not, Codestral's widths and odd widths).
    fn saved_amp16(&self) -> u128 {
        let Scan {
            t,
            h,
            i,
            g,
            e,
            b,
            s,
            cd,
            ..
        } = *self;
        const B16: u128 = 2;
        let norm = if self.norm {
            3 * t * i * F + t * g * F
        } else {
            0
        };
        (self.saved_amp() + 2 * t * h * B16 + 2 * t * h * F + t * i * F + norm)
            .saturating_sub(t * e * F + b * cd * s * F + 3 * t * h * F)
    }

    /// Bytes autograd keeps after the mixer's forward, `in_proj`'s output included (it is
    /// saved through its views; not under autocast with 16-bit projections, where nothing
    /// saves it: [`Scan::zx_saved`]), `out_proj`'s input excluded; `z` = bytes per element of
    /// the projections' output.
    fn saved(&self, z: u128) -> u128 {
        if self.amp && z != F {
            return self.saved_amp16();
        }
        if self.amp && z == F {
            // the gated norm (gate first, all fp32 under autocast): `x · silu(gate)`, the
            // normalised groups and rsqrt per group on top of `silu(gate)`
            let norm = if self.norm {
                2 * self.t * self.i * F + self.t * self.g * F
            } else {
                0
            };
            return self.saved_amp() + norm;
        }
        let Scan {
            b,
            s,
            t,
            tp,
            c,
            l,
            h,
            p,
            n,
            g,
            i,
            cd,
            e,
            k,
            norm,
            ..
        } = *self;
        let c1 = c + 1;
        let mut v = t * e * z // zxbcdt (conv input, dt) 
            + 2 * h * F // exp(A_log.float()) (saved by exp), A
            + b * cd * (s + k - 1) * z // conv1d output, saved by silu through its [..., :s] view
            + 2 * t * h * z // dt + dt_bias (softplus), softplus (clamp)
            + t * i * F // hidden_states.float()
            + tp * i * F // pad(x) for D_residual
            + 2 * t * h * F // dt[..., None].float(), dt.float()
            + tp * h * n * F // padded B, saved by B * decay_states
            + 2 * l * l // segment_sum masks (bool)
            + b * h * c * l * l * F // L = exp(segment_sum(A))
            + 2 * tp * h * n * F // C and B copied into bmm layout (einsum bclhn,bcshn)
            + 2 * b * c * h * l * l * F // G, M = G * L
            + 2 * tp * i * F // x copy for Y_diag; C_times_states (saved by the decay product)
            + tp * h * F // decay_states
            + tp * h * n * F // B * decay_states
            + tp * i * F // x copy for the chunk states
            + b * c1 * h * p * n * F // cat([previous, states])
            + 2 * c1 * c1 // chunk-level segment_sum masks
            + b * h * c1 * c1 * F // decay_chunk
            + tp * h * F // state_decay_out
            + tp * h * n * F // C copy for C_times_states
            + b * c * h * p * n * F // chunk states copy
            + tp * i * F // y + D_residual
            + 4 * t * i * F // gated norm: gate.float(), silu, x·silu, normalised groups
            + t * g * F; // gated norm: rsqrt per group
        if z == F {
            // fp32: the casts of x, dt (twice) and the gate are the tensors themselves; the
            // conv's silu output is saved instead (x is its view)
            v = v + t * h * F + b * cd * s * F - 2 * t * i * F - 2 * t * h * F;
        }
        if !norm {
            // no gated norm (FalconH1Mixer with `mamba_rms_norm = false`): `scan_output *
            // silu(gate)` saves the scan output (counted above) and `silu(gate)` in the
            // projections' dtype; the gate is a view of zxbcdt, never cast to fp32
            v = v + t * i * z - 4 * t * i * F - t * g * F;
            if z == F {
                // the fp32 correction above took off a cast of the gate that does not exist
                v += t * i * F;
            }
        }
        if c == 1 {
            v = v + self.one_chunk_saved_extra() - self.one_chunk_saved_less();
        } else {
            if b == 1 && h == 1 {
                // one sequence of one head, as one chunk: the chunk states' `bmm` operand is a
                // view of `new_states[:, :-1]` (saved in place of its copy) and x's `bmm`
                // operands are views (only the chunk dimension is left of `b, c, h`)
                v = v + self.one_chunk_saved_extra() - tp * i * F;
            }
            if self.cb_views() {
                v -= 2 * tp * h * n * F;
            }
        }
        v
    }

    /// Whether `einsum`'s `bmm` operands of `C` and `B` (`G`), of `B_decay` (the chunk
    /// states) and of `C` (`C_times_states`) are views rather than copies: each is a
    /// contiguous `[b, c, l, h, n]` chunked tensor permuted to `[b, c, h, l, n]` and reshaped to
    /// `[b·c·h, l, n]`, which merges `b·c` with `h` as a view only when `h` is 1 or `b·c` is 1
    /// (aten/src/ATen/native/Linear.cpp `sumproduct_pair`, then `reshape`). Probe
    /// `tools/truth/probes/mamba2_mixer.py --check` (one head: 4 × 186, 2 × 100, 1 × 100,
    /// 3 × 50; granitemoehybrid rnd-s29-granitemoehybrid-1 has `mamba_n_heads` 1 and saved
    /// `2·tp·n·4` bytes less than the general form: rdist83-001 forward +3.3%).
    fn cb_views(&self) -> bool {
        self.h == 1 || (self.b == 1 && self.c == 1)
    }

    /// Whether autograd keeps `in_proj`'s output (`zxbcdt`, `z` bytes per element): always
    /// but under autocast with 16-bit projections ([`Scan::saved_amp16`]).
    fn zx_saved(&self, z: u128) -> bool {
        !(self.amp && z != F)
    }

    /// What one chunk saves on top of the general form ([`Scan::saved`]): with `c = 1` torch's
    /// `einsum` (`sumproduct_pair`: permute, then `reshape` to `bmm` operands, which copies
    /// only when the strides do not allow a view) finds the chunk dimension of size 1 and
    /// returns `einsum("bzch,bzhpn->bchpn", decay_chunk, states)` as its own `bmm` output,
    /// which `C_times_states`' einsum saves through its `[:, :-1]` view (`b·h·p·n`).
    /// Read off `tools/truth/probes/mamba2_mixer.py --check` (one-chunk cases, 1–3 sequences,
    /// padded and unpadded, bf16 and fp32, 10+ random widths: exact for `h > 1`).
    fn one_chunk_saved_extra(&self) -> u128 {
        self.b * self.h * self.p * self.n * F
    }

    /// What one chunk does not save of the general form: the copies of `x` into the `bmm`
    /// layouts of `Y_diag` and of the chunk states are views (`tp·i`; one of the two is
    /// already in the form as the chunk states' copy's share), and with one sequence also the
    /// copies of `C` and `B` for `G` (`2·tp·h·n`): every dimension they are permuted over is
    /// of size 1.
    fn one_chunk_saved_less(&self) -> u128 {
        let mut v = self.tp * self.i * F;
        if self.cb_views() {
            v += 2 * self.tp * self.h * self.n * F;
        }
        v
    }

    /// Highest bytes alive during the mixer's forward above its input and `in_proj`'s output,
    /// with autograd saving (at the contiguous copy of `Y_diag + Y_off`).
    fn forward_peak(&self, z: u128) -> u128 {
        if self.amp && z != F {
            return self.forward_peak_amp16();
        }
        if self.amp {
            return self.forward_peak_amp();
        }
        let Scan {
            b,
            s,
            t,
            tp,
            c,
            l,
            h,
            p,
            n,
            cd,
            i,
            k,
            ..
        } = *self;
        let c1 = c + 1;
        let mut v = 2 * h * F
            + b * cd * (s + k - 1) * z
            + b * cd * s * z // silu output
            + 3 * t * h * z // dt + bias, softplus, clamp
            + t * i * F
            + 3 * tp * i * F // pad for D, D_residual, padded x·dt
            + 2 * t * h * F
            + tp * h * F // padded A
            + 2 * tp * h * n * F // padded B, C
            + tp * h * F // A_cumsum
            + 2 * l * l
            + b * h * c * l * l * F // L
            + 2 * tp * h * n * F // bmm copies of C, B
            + 2 * b * c * h * l * l * F // G, M
            + 2 * tp * i * F // x copy, Y_diag
            + tp * h * F // decay_states
            + tp * h * n * F // B_decay
            + tp * i * F // x copy for states
            + tp * h * n * F // B_decay copy
            + b * h * p * n * F // zeros_like initial state
            + b * c1 * h * p * n * F // cat
            + 2 * c1 * c1
            + b * h * c1 * c1 * F // decay_chunk
            + b * h * c1 * p * n * F // new_states
            + tp * h * F // state_decay_out
            + tp * h * n * F // C copy
            + b * c * h * p * n * F // states copy
            + 4 * tp * i * F; // C_times_states, Y_off, Y_diag + Y_off, contiguous copy
        if z == F {
            v -= t * i * F + 2 * t * h * F;
        }
        if c == 1 {
            // one chunk: no copies of `x` for `Y_diag` and the chunk states (views), nor of
            // the chunk states for `C_times_states` (`new_states[:, :-1]` is already in the
            // `bmm` layout); with one sequence also none of `C` and `B` for `G`, of `B_decay`
            // for the chunk states and of `C` for `C_times_states` (every dimension they are
            // permuted over is of size 1). Exact at the same instant with `N ≥ P` (every
            // released Mamba-2 width; probe `mamba2_mixer.py --check`).
            v = v.saturating_sub(2 * tp * i * F + b * h * p * n * F);
        } else if b == 1 && h == 1 {
            // one sequence of one head: the same views of x and of the chunk states
            v = v.saturating_sub(2 * tp * i * F + b * c * h * p * n * F);
        }
        if self.cb_views() {
            // C and B for G, B_decay for the states, C for C_times_states: views
            v = v.saturating_sub(4 * tp * h * n * F);
        }
        v
    }

    /// Highest bytes alive during a forward that saves nothing (`torch.no_grad()`, or a
    /// checkpointed layer's first pass): Python locals of `mamba2_chunk_scan` only, at the same
    /// instant. Holds for one chunk too.
    fn forward_peak_unsaved(&self, z: u128) -> u128 {
        if self.amp && z != F {
            return self.forward_peak_unsaved_amp16();
        }
        let Scan {
            b,
            s,
            t,
            tp,
            c,
            l,
            h,
            p,
            n,
            cd,
            i,
            ..
        } = *self;
        let c1 = c + 1;
        let at_output = h * F // A
            + b * cd * s * z // conv output after silu (x, B, C are its views)
            + t * h * z // dt after clamp
            + 7 * tp * i * F // D_residual, padded x·dt, Y_diag, C_times_states, Y_off, sum, copy
            + 4 * tp * h * F // padded A, A_cumsum, decay_states, state_decay_out
            + 3 * tp * h * n * F // padded B and C, B_decay
            + 3 * b * h * c * l * l * F // L, G, M
            + b * h * p * n * F // initial state
            + b * h * c1 * c1 * F // decay_chunk
            + b * h * c1 * p * n * F; // new_states (states and final_state are views)
                                      // an earlier instant wins when the state is wide (`N·(1 + P/L) > 3·P`; Falcon-H1-1.5B:
                                      // N 256, P 64, L 128): the `bmm` of `einsum("bclhn,bchpn->bclhp", C, states)`, with C
                                      // and the chunk states copied into bmm layouts and its output allocated, before Y_off,
                                      // the sum and its copy exist (probe: falcon_h1_mixer.py ckpt mode, exact at 2048 wide)
                                      // One chunk: `new_states[:, :-1]` is already in the `bmm` layout (no copy of the chunk
                                      // states), as in [`Scan::forward_peak`] (probe: mamba2_mixer.py infer, 1 and 2
                                      // sequences of 28 tokens in chunks of 32). `C`'s layout copy is a view wherever
                                      // [`Scan::cb_views`] holds: with one sequence of one chunk, and with one head at any
                                      // batch and chunk count (`[b, c, l, 1, n]` permuted to `[b, c, 1, l, n]` reshapes to
                                      // `[b·c, l, n]` as a view; probe `mamba2_mixer.py --check-infer`, rnd-s139-mamba2-0's
                                      // one head of 16 at 5 × 67 tokens: the copy counted was 25,600 bytes too many)
        let states_copy = if c == 1 { 0 } else { b * c * h * p * n * F };
        let c_copy = if self.cb_views() { 0 } else { tp * h * n * F };
        let at_c_times_states = (at_output + c_copy + states_copy).saturating_sub(3 * tp * i * F);
        // and earlier still when the state is wide against short chunks (Falcon-H1 with
        // N 64, P 32, L 16): the `bmm` of `einsum("bhzc,bchpn->bzhpn", decay_chunk, states)`,
        // with the chunk-level states (the `cat` of the zero initial state and the per-chunk
        // states), their copy in the `bmm` layout and its output alive, before
        // `state_decay_out`, `C_times_states`, `Y_off` and the sum exist (probe:
        // tools/truth/probes/live_tensors.py on rnd-s29-falconh1-0, 1 chunk, exact)
        let at_new_states = h * F
            + b * cd * s * z
            + t * h * z
            + 3 * tp * i * F // D_residual, padded x·dt, Y_diag
            + 3 * tp * h * F // padded A, A_cumsum, decay_states
            + 3 * tp * h * n * F // padded B and C, B_decay
            + 3 * b * h * c * l * l * F // L, G, M
            + b * h * p * n * F // initial state
            + b * h * c1 * c1 * F // decay_chunk
            + 3 * b * h * c1 * p * n * F; // states, their bmm copy, the bmm output
                                          // the states' `bmm` operand `[b·h, c + 1, p·n]` (the `cat`, `[b, c + 1, h, p·n]`,
                                          // permuted) is a view when `b` merges with `h`: with one sequence (probe:
                                          // mamba2_mixer.py infer, 1 × 28 and 1 × 60 tokens against 2 × 28 and 2 × 60) or one
                                          // head (`--check-infer`: 3 × 30 tokens, one head of 16, state 128, chunks of 4), for
                                          // any number of chunks
        let at_new_states = if b == 1 || h == 1 {
            at_new_states - b * h * c1 * p * n * F
        } else {
            at_new_states
        };
        at_output.max(at_c_times_states).max(at_new_states)
    }

    /// 16-bit copies autocast keeps in its cache for the whole forward: the convolution's
    /// bias (a leaf parameter; the weight goes through `unsqueeze(1)` first, so its copy is
    /// not cached).
    fn amp_cached(&self) -> u128 {
        if self.conv_bias {
            self.cd * 2
        } else {
            0
        }
    }

    /// What a mixer none of whose parameters needs a gradient (LoRA) does not hold at the
    /// forward's peak instant (`z` bytes per element of the projections): the padded x of
    /// `D_residual` (gone once the scan used it) and `A = -exp(A_log)` (exp saves its output
    /// only for A_log's gradient), read off a live-storage trace of the forward
    /// (FakeTensorMode, rnd-s29-mamba2-1, batch 1, 30 tokens, fp32, LoRA on in_proj against
    /// without); with 16-bit projections also dt's fp32 copy, which `A * dt` with a frozen
    /// `A_log` does not save, and under autocast the convolution bias's 16-bit cast, which
    /// autocast caches only for a leaf that requires grad (`cached_cast`,
    /// aten/src/ATen/autocast_mode.cpp; probe: Mamba2Mixer with every parameter but
    /// in_proj's frozen against none, bf16 and amp-fp16, rnd-s53-mamba2-0 and rnd-s29-mamba2-1
    /// widths, exact).
    fn frozen_gone(&self, z: u128) -> u128 {
        let mut v = self.tp * self.i * F + self.h * F;
        if z != F {
            v += self.t * self.h * F;
        }
        if self.amp {
            v += self.amp_cached();
        }
        v
    }

    /// [`Scan::forward_peak`] under autocast over an fp32 `zxbcdt` (Falcon-H1: the bf16
    /// `in_proj` output times the fp32 `mup_vector`): the instants of
    /// [`Scan::forward_peak_amp16`] (the output's contiguous copy, or `C_times_states`' `bmm`
    /// with a wide state), where every einsum's `bmm` runs on 16-bit casts of its operands
    /// (their fp32 layout copies go after the `bmm`) and returns 16 bits, with Falcon-H1's
    /// convolution and dt: the convolution's bf16 output is cast back to fp32 (the bf16 silu
    /// goes at once), dt's three ops stay fp32 and the scan makes no `.float()` copies of x
    /// and dt. The fp32 form counted fp32 layout copies and `bmm` outputs: the random sample's
    /// `rnd-t167-036-falconh1` (one chunk, state 128 against heads of 32: the `C_times_states`
    /// instant) was +14.4 %. Read off `tools/truth/probes/falcon_h1_mixer.py --check-amp-fwd`
    /// (exact for 1–4 chunks, padded and not, with and without the gated norm, Codestral's,
    /// odd, wide-state and these widths; one sequence of one head over several chunks is
    /// 4–16 KB over, as [`Scan::forward_peak_amp16`]).
    fn forward_peak_amp(&self) -> u128 {
        let Scan {
            b, s, t, h, cd, i, ..
        } = *self;
        const B16: u128 = 2;
        (self.forward_peak_amp16() + b * cd * s * F + 3 * t * h * F)
            .saturating_sub(b * cd * s * B16 + 3 * t * h * B16 + t * i * F + 2 * t * h * F)
    }

    /// [`Scan::forward_peak`] under autocast with 16-bit projections (`Mamba2Mixer`), at the
    /// same instant (the contiguous copy of `Y_diag + Y_off`): the convolution on 16-bit
    /// copies of its fp32-cast input and of its weight, its output and silu in 16 bits, dt's
    /// three ops in 16 bits, and every einsum's operands cast to 16 bits after their fp32
    /// layout copies go, with 16-bit `bmm` outputs (`G`, `Y_diag`, the chunk states, the
    /// chunk-level states, `C_times_states`); the products on them (`M`, `B_decay`, `Y_off`)
    /// are fp32. Read off `tools/truth/probes/mamba2_mixer.py --check-amp` (exact, 1–4 chunks;
    /// with one chunk the chunk states are already in the `bmm` layout: no copy).
    fn forward_peak_amp16(&self) -> u128 {
        let Scan {
            b,
            s,
            t,
            tp,
            c,
            l,
            h,
            p,
            n,
            cd,
            i,
            k,
            ..
        } = *self;
        const B16: u128 = 2;
        let c1 = c + 1;
        let v = 2 * h * F + self.amp_cached()
            + cd * k * B16 + b * cd * s * B16 // conv weight and input copies
            + b * cd * (s + k - 1) * B16 + b * cd * s * B16 // conv output, silu
            + 3 * t * h * B16 + t * i * F + 2 * t * h * F // dt ops; x.float(), dt.float() x2
            + 3 * tp * i * F + 2 * tp * h * F + 2 * tp * h * n * F // pad, D_res, x·dt; A, cumsum; B, C
            + 2 * l * l + b * h * c * l * l * F // masks, L
            + 2 * tp * h * n * B16 + b * c * h * l * l * B16 + b * c * h * l * l * F // C, B; G; M
            + 2 * tp * i * B16 + b * c * h * l * l * B16 // x copy, Y_diag; M copy
            + tp * h * F + tp * h * n * F + tp * h * n * B16 + tp * i * B16 // decay_states, B_decay, copies
            + b * h * p * n * B16 + 2 * c1 * c1 + b * h * c1 * c1 * F // zeros_like, masks, decay_chunk
            + b * c1 * h * p * n * B16 + b * h * c1 * c1 * B16 + b * h * c1 * p * n * B16 // cat copy, decay_chunk copy, new_states
            + tp * h * F + b * c * h * p * n * B16 + tp * h * n * B16 + tp * i * B16 // state_decay_out; states, C copies; bmm
            + 3 * tp * i * F; // Y_off, Y_diag + Y_off, contiguous copy
        let at_output = if c == 1 { v - b * h * p * n * B16 } else { v };
        // an earlier instant wins when the state is wide (`N > 3·P`): the `bmm` of
        // `einsum("bclhn,bchpn->bclhp", C, states)`, where C's fp32 layout copy is alive beside
        // its 16-bit cast (the cast goes to the `bmm`, the copy right after it), before `Y_off`,
        // the sum and its contiguous copy exist; C is a view where `Scan::cb_views` holds
        // (probe `mamba2_mixer.py --check-amp`, rnd-s53-mamba2-0's widths: 64 heads of 8, state
        // 32, 1–3 chunks, exact; the random sample's rnd-t53-004-mamba2 was 524,288 bytes low)
        let c_copy = if self.cb_views() { 0 } else { tp * h * n * F };
        at_output.max((at_output + c_copy).saturating_sub(3 * tp * i * F))
    }

    /// [`Scan::forward_peak_unsaved`] under autocast with 16-bit projections: the largest of
    /// three instants: the output (as without autocast, `bmm` outputs in 16 bits), the `bmm`
    /// of `C_times_states` (wide states), and the `bmm` of the chunk states, where the fp32
    /// layout copies of `x` and `B_decay` and their 16-bit casts are alive at once (wins at
    /// Codestral's widths; with one chunk the layouts are views, cast directly). Read off
    /// `tools/truth/probes/mamba2_mixer.py --check-amp` (exact, 1–4 chunks).
    fn forward_peak_unsaved_amp16(&self) -> u128 {
        let Scan {
            b,
            s,
            t,
            tp,
            c,
            l,
            h,
            p,
            n,
            cd,
            i,
            ..
        } = *self;
        const B16: u128 = 2;
        let c1 = c + 1;
        let base = h * F + self.amp_cached() + b * cd * s * B16 + t * h * B16; // A, conv, dt
        let at_output = base
            + 5 * tp * i * F + 2 * tp * i * B16 // D_res, x·dt, Y_off, sum, copy; Y_diag, C_times_states
            + 4 * tp * h * F + 3 * tp * h * n * F
            + 2 * b * h * c * l * l * F + b * c * h * l * l * B16 // L, M; G
            + b * h * p * n * B16 + b * h * c1 * c1 * F + b * h * c1 * p * n * B16;
        let at_c_times_states =
            (at_output + tp * h * n * B16 + b * c * h * p * n * B16).saturating_sub(3 * tp * i * F);
        let mut at_states = base
            + 2 * tp * i * F + 3 * tp * h * F + 2 * tp * h * n * F // D_res, x·dt; A, cumsum, decay; B, C
            + 2 * b * h * c * l * l * F + b * c * h * l * l * B16 + tp * i * B16 // L, M; G; Y_diag
            + tp * h * n * F // B_decay
            + tp * h * n * B16 + tp * i * B16 + b * c * h * p * n * B16; // casts, bmm output
        if c > 1 {
            // x's and B_decay's fp32 layout copies; B_decay's is a view where the head
            // dimension merges with the batch ([`Scan::cb_views`]: one head), cast directly
            // (probe `mamba2_mixer.py` ckpt amp-bf16, rnd-s139-mamba2-0's one head at 5 × 67:
            // 51,200 bytes too many before, exact on 16 one-head shapes but one, 3,672 low at
            // 1 × 40 with state 64 in chunks of 8)
            at_states += tp * i * F;
            if !self.cb_views() {
                at_states += tp * h * n * F;
            }
        }
        at_output.max(at_c_times_states).max(at_states)
    }

    /// Highest bytes of the mixer's backward between `out_proj`'s backward (its input's
    /// gradient alive, `z` bytes per element) and `in_proj`'s, above what is alive when it
    /// starts (`w` = bytes of the norm weight's gradient): the larger of the gated norm's
    /// backward in fp32 and the scan's backward at `M = G * L` (with the gated norm; the
    /// latter wins when the `[chunk, chunk]` blocks dominate, as when padding does).
    fn backward_peak(&self, z: u128, w: u128) -> u128 {
        let norm_instant = self.backward_peak_norm(z, w);
        if self.zx16 {
            return norm_instant.max(self.backward_peak_scan_amp16(w));
        }
        if self.norm && !self.amp {
            return norm_instant.max(self.backward_peak_scan(z, w));
        }
        if self.amp {
            return norm_instant.max(self.backward_peak_scan_amp(w));
        }
        norm_instant
    }

    /// [`Scan::backward_peak`] of a mixer none of whose parameters needs a gradient (LoRA
    /// without `in_proj`), above the frozen mixer's saved set, which lacks `t·i` fp32 bytes of
    /// the trainable one (the gated norm's weight `mul`, see `Builder::mamba2_inner`): both
    /// instants, the gated norm's and the scan's at `M = G * L`, hold those bytes all the same
    /// (at the norm's instant the frozen backward's own fp32 product of that size, at the
    /// scan's what the trainable backward has freed by then is not part of the frozen saved set
    /// either), and no gradient of the norm weight. Traced with
    /// `tools/truth/probes/mixer_trace.py` on `GraniteMoeHybridMambaLayer` and `Mamba2Mixer`
    /// with every parameter frozen (bf16 and fp32, 1–6 sequences of 20–300 tokens, padded and
    /// full chunks; [`tests::frozen_mixer_backward_matches_the_trace`]): exact without
    /// autocast; the autocast forms only drop the norm weight's gradient (not traced frozen).
    fn backward_peak_frozen(&self, z: u128) -> u128 {
        let norm_instant = self.backward_peak_norm(z, 0);
        if self.zx16 {
            return norm_instant.max(self.backward_peak_scan_amp16(0));
        }
        if self.norm && !self.amp {
            if self.norm_first {
                // the frozen saved set lacks the normalised groups the weight's `mul` would
                // save: the first instant (the gate's product, before that `mul`'s backward)
                // holds them in neither case, the later one (after it) and the scan's hold the
                // same bytes as the trainable mixer's, so they rise by `t·i` over the frozen set
                let (first, later) = self.backward_norm_first(z, 0);
                let u = self.t * self.i * F;
                return first.max(later + u).max(self.backward_peak_scan(z, 0) + u);
            }
            return norm_instant.max(self.backward_peak_scan(z, 0)) + self.t * self.i * F;
        }
        norm_instant
    }

    /// The backward of `M = G * L` without autocast (`Mamba2Mixer`, projections of `z` bytes
    /// per element, `zxbcdt` saved), above the composite's saved tensors and its output's
    /// gradient: the norm's, `Y_off`'s, the chunk states' and `B_decay`'s backwards have freed
    /// what they saved (but `C` and `B` in `G`'s `bmm` layout: copies, or with one sequence of
    /// one chunk views of the padded `C` and `B`, alive all the same), and the gradients of the
    /// gate, the padded output, `C`, `B`, `A_cumsum` and the chunked `x` are alive with `M`'s
    /// (the fp32 `bmm` output) and those of `G` and `L`. Read off
    /// `tools/truth/probes/mamba2_mixer.py --check` (exact, bf16 and fp32, 1–4 chunks,
    /// 1–8 sequences): it wins at Codestral's chunks of 256 when padding dominates (8 × 8
    /// tokens: 185 MB over the norm's instant on one layer).
    fn backward_peak_scan(&self, z: u128, w: u128) -> u128 {
        let Scan {
            b,
            s,
            t,
            tp,
            c,
            l,
            h,
            n,
            i,
            e,
            cd,
            k,
            ..
        } = *self;
        let blocks = b * c * h * l * l;
        let mut alive = t * e * z + 2 * h * F // saved: zxbcdt, A
            + b * cd * (s + k - 1) * z + 2 * t * h * z // conv output, dt + bias, softplus
            + t * i * F + tp * i * F + 2 * t * h * F // x.float(), pad(x), dt.float() x2
            + 2 * l * l + blocks * F + 2 * tp * h * n * F + blocks * F // masks, L, C/B for G, G
            + i * w + t * i * z + tp * i * F // grads: norm weight, gate, padded output
            + 2 * tp * h * n * F + tp * h * F + tp * i * F // C, B, A_cumsum, x
            + 3 * blocks * F; // M, G and L
        if z == F {
            // fp32: no `.float()` copies of x and dt (the conv's silu output and the clamp are
            // saved instead)
            alive = (alive + t * h * F + b * cd * s * F).saturating_sub(t * i * F + 2 * t * h * F);
        }
        alive.saturating_sub(self.saved(z) + t * i * z)
    }

    /// The backward of `M = G * L` under autocast with 16-bit projections (`Mamba2Mixer`),
    /// above the composite's saved tensors and its output's fp32 gradient: by then the gated
    /// norm's, `Y_off`'s, the chunk states' and `B_decay`'s backwards have freed what they
    /// saved, and the gradients of the gate (16-bit), the padded output, `C`, `B`, `A_cumsum`
    /// and the chunked `x` are alive with `M`'s gradient (cast to fp32 from its `bmm`), the
    /// gradients of `G` and `L` (fp32) and `G`'s 16-bit cast for its `bmm`'s backward. It
    /// wins over the norm's instant when the `[chunk, chunk]` blocks are large (Codestral's
    /// chunks of 256). Read off `tools/truth/probes/mamba2_mixer.py --check-amp` (exact, but
    /// one sequence of one chunk at odd widths: 4.9 KB low).
    fn backward_peak_scan_amp16(&self, w: u128) -> u128 {
        let Scan {
            b,
            s,
            t,
            tp,
            c,
            l,
            h,
            n,
            i,
            cd,
            k,
            ..
        } = *self;
        const B16: u128 = 2;
        let blocks = b * c * h * l * l;
        let alive = 2 * h * F + cd * k * B16 + b * cd * s * B16 // saved: A; conv copies
            + b * cd * (s + k - 1) * B16 + 2 * t * h * B16 // conv output; dt + bias, softplus
            + t * i * F + tp * i * F + 2 * t * h * F // x.float(), pad(x), dt.float() x2
            + 2 * l * l + blocks * F + 2 * tp * h * n * B16 + blocks * B16 // masks, L, C/B copies, G
            + i * w + t * i * B16 + tp * i * F // grads: norm weight, gate, padded output
            + 2 * tp * h * n * F + tp * h * F + tp * i * F // C, B, A_cumsum, x
            + 3 * blocks * F + blocks * B16; // M (fp32 cast), G and L, G's 16-bit cast
                                             // checkpointed: `M = G * L` promotes the 16-bit `G` (the `bmm` output) to fp32, and the
                                             // engine casts `G`'s fp32 gradient back to 16 bits after the node has run
                                             // (`validate_outputs`, torch 2.15 `autograd/engine.cpp`). Outside checkpointing the
                                             // node's `SavedVariable` still holds `G` then; under non-reentrant checkpointing the
                                             // recomputed `G` is held only by the checkpoint's handle, which `unpack_hook` drops
                                             // (`torch/utils/checkpoint.py`), and the node's local, so it goes before the cast.
                                             // Traced: a `Mamba2Mixer` under `torch.utils.checkpoint(use_reentrant=False)` and
                                             // CPU autocast against the plain one (`tools/truth/probes/mixer_trace.py`), the
                                             // instant lower by `b·c·h·l·l` 16-bit bytes exactly (1–8 sequences, 1–2 chunks,
                                             // padded and full, three widths)
        let gone = if self.ckpt { blocks * B16 } else { 0 };
        alive.saturating_sub(self.saved_amp16() + t * i * F + gone)
    }

    /// The backward of `M = G * L` under autocast for a mixer whose `zxbcdt` is fp32
    /// (Falcon-H1: the bf16 `in_proj` output times the fp32 `mup_vector`), above the
    /// composite's saved tensors ([`Scan::saved_amp`], the gated norm's included) and its
    /// output's fp32 gradient. [`Scan::backward_peak_scan_amp16`]'s instant with Falcon-H1's
    /// dtypes: `zxbcdt` has been freed by then (its views' nodes have run), the convolution's
    /// fp32 cast and the three fp32 dt tensors (`dt + dt_bias`, softplus, clamp) are still
    /// saved, there are no `.float()` copies of x and dt, and the gate's gradient is fp32 (the
    /// gate is a view of the fp32 `zxbcdt`). Traced with `tools/truth/probes/falcon_h1_mixer.py`
    /// at the widths random seed 53 drew (hidden 96, 24 heads of 8 in 8 groups, state 8, chunks
    /// of 128, 5 × 264 tokens): the `[chunk, chunk]` blocks dominate there and this instant is
    /// the mixer's backward peak in both gated-norm orders (falconh1-nbg-small-ampbf16-ckpt was
    /// -13.4% with the norm's instant alone).
    fn backward_peak_scan_amp(&self, w: u128) -> u128 {
        let Scan {
            b,
            s,
            t,
            tp,
            c,
            l,
            h,
            n,
            i,
            cd,
            k,
            ..
        } = *self;
        const B16: u128 = 2;
        let blocks = b * c * h * l * l;
        // G's gradient is computed in fp32 (`grad * L`) and cast to G's 16-bit dtype by the
        // engine (`validate_outputs`) after `MulBackward0::apply` returns, while the node still
        // holds its saved G and L. In a checkpointed layer's recomputation the node's saved
        // tensors come from non-reentrant checkpoint's unpack hook, which drops the frame's
        // reference (torch/utils/checkpoint.py `_checkpoint_hook`): G and L die with `apply`'s
        // locals, before the cast, so the instant is the product for L's gradient, without
        // the cast (tools/truth/probes/falcon_h1_ckpt_live.py ckpt)
        let cast = if self.recomputed { 0 } else { blocks * B16 };
        let alive = 2 * h * F + cd * k * B16 + b * cd * s * B16 // saved: A; conv copies
            + b * cd * (s + k - 1) * B16 + b * cd * s * F // conv output, its fp32 cast
            + 3 * t * h * F // dt + bias, softplus, clamp
            + tp * i * F // pad(x)
            + 2 * l * l + blocks * F + 2 * tp * h * n * B16 + blocks * B16 // masks, L, C/B copies, G
            + i * w + t * i * F + tp * i * F // grads: norm weight, gate, padded output
            + 2 * tp * h * n * F + tp * h * F + tp * i * F // C, B, A_cumsum, x
            + 3 * blocks * F + cast; // M (fp32 cast), G and L, G's 16-bit cast
        alive.saturating_sub(self.saved(F) + t * i * F)
    }

    /// The gated norm's backward (see [`Scan::backward_peak`]).
    fn backward_peak_norm(&self, z: u128, w: u128) -> u128 {
        let Scan {
            t,
            i,
            g,
            norm,
            norm_first,
            ..
        } = *self;
        if norm && norm_first {
            let (first, later) = self.backward_norm_first(z, w);
            return first.max(later);
        }
        if !norm {
            // `(scan_output * silu(gate)).to(dtype)` backward: the fp32 gradient of the
            // product, then its gradients for the fp32 scan output and for `silu(gate)`
            return 2 * t * i * F;
        }
        // grad.float(), then x·silu(gate) and the normalised groups times the incoming
        // gradient, pow and the division of rsqrt's backward, minus the freed bf16 gradient and
        // rsqrt; the weight's gradient exists by then
        (4 * t * i * F + i * w).saturating_sub(t * i * z + t * g * F)
    }

    /// The two instants of the normalise-then-gate norm's backward (`FalconH1RMSNormGated`
    /// with `norm_before_gate`: `(weight · normed) * silu(gate.float())`, then `.to(dtype)`),
    /// above what is alive when the mixer's backward starts, as [`Scan::backward_peak_norm`]:
    /// - first, the gate's product: grad.float() and its two products (for the weighted
    ///   groups and for `silu(gate)`), minus the freed 16-bit gradient; the weight's gradient
    ///   does not exist yet and rsqrt is still saved;
    /// - later, the norm's `pow` backward: the weight's gradient now exists and rsqrt is gone,
    ///   while `silu`'s, the gate cast's and the product's saved tensors are freed; in 16 bits
    ///   three fp32 `[t, i]` tensors less than in fp32 (the gate's gradient and the incoming
    ///   one are 16-bit copies, the fp32 ones freed), so it wins only in fp32 (and autocast,
    ///   whose `zxbcdt` is fp32), by `i·w - t·g·4` when that is positive.
    ///
    /// Traced with `tools/truth/probes/falcon_h1_mixer.py --order` (the op-by-op trace of both
    /// orders, bf16, fp32 and autocast, 11 shapes): norm-first minus gate-first is
    /// `max(first, later)` minus [`Scan::backward_peak_norm`]'s gate-first form wherever the
    /// gate-first instant is the mixer backward's peak (`t·g·4 - t·i·4 - i·w` at odd widths,
    /// `-t·i·4` at Falcon-H1's in fp32), and 0 where another instant is (the same in both
    /// orders).
    fn backward_norm_first(&self, z: u128, w: u128) -> (u128, u128) {
        let Scan { t, i, g, .. } = *self;
        let first = (3 * t * i * F).saturating_sub(t * i * z);
        let later = (first + i * w).saturating_sub(t * g * F + 3 * t * i * (F - z.min(F)));
        (first, later)
    }

    /// Highest transient bytes of one decode step (`mamba2_selective_state_update`) above the
    /// step's input and `in_proj`'s output: at `state * dA + dBx`.
    fn decode_peak(&self, z: u128) -> u128 {
        let Scan { b, h, p, n, cd, .. } = *self;
        let state = b * h * p * n;
        let mut v = h * F // A
            + b * cd * z // conv update's output
            + b * h * p * z // softplus(dt + dt_bias) expanded per channel
            + 3 * state * F // dA = exp(dt·A), state·dA, the sum
            + b * h * n * z // B expanded to the heads (contiguous)
            + 2 * state * z; // dB = dt·B, dB·x
        if z == F {
            v -= state * F;
        }
        v
    }
}

impl Builder<'_> {
    /// The mixer's parameters as `Mamba2Mixer.__init__` registers them: `in_proj`, `out_proj`
    /// (linears), then `conv1d.weight` `[conv_dim, 1, kernel]`, `conv1d.bias`, `dt_bias`,
    /// `A_log`, `D` and the gated norm's weight.
    pub(super) fn mamba2_params(&mut self, m: &Mamba2, lp: &mut LayerParams) {
        for shape in m.linears(self.model.hidden_size) {
            let lin = self.shaped_linear(&shape);
            lp.linears.push((shape.role, lin));
        }
        let cd = u128::from(m.conv_dim());
        let k = u128::from(m.conv_kernel);
        let h = u128::from(m.num_heads);
        lp.ssm.push(self.new_matrix(cd * k, cd, k, true));
        if m.conv_bias {
            lp.ssm.push(self.new_param(cd, true));
        }
        for _ in 0..3 {
            lp.ssm.push(self.new_param(h, true));
        }
        if m.gated_norm {
            lp.ssm
                .push(self.new_param(u128::from(m.intermediate), true));
        }
    }

    /// `Mamba2Block.forward` (and `MambaBlock.forward`, Mamba-1): `norm(x.to(norm.weight.dtype))`, the mixer, and
    /// `residual + out` with the residual upcast to fp32 under `residual_in_fp32` (so the
    /// residual stream is fp32 from the first block on). Returns the output, whose bytes per
    /// element [`Builder::layer_out_size`] gives.
    pub(super) fn mamba2_block(
        &mut self,
        lp: &LayerParams,
        x: TensorId,
        x_size: u128,
        spec: &LayerSpec,
    ) -> TensorId {
        let rows = self.tokens;
        let h = self.hidden;
        let s = self.param_size;
        let xin = if x_size != s {
            self.cast(x, rows * h * s)
        } else {
            self.retain_id(x)
        };
        let (n, ns) = match (spec.attn_norm, lp.norms[0]) {
            (Some(nm), Some(p)) => self.norm(xin, s, rows, &nm, p),
            _ => (self.retain_id(xin), s),
        };
        self.drop_(xin);
        let (res, res_size) = if spec.ssm_residual_in_fp32() && x_size != F {
            (self.cast(x, rows * h * F), F)
        } else {
            (self.retain_id(x), x_size)
        };
        // `MambaBlock` (Mamba-1) is the same block around its own mixer
        let y = match &spec.mixer {
            crate::model::Mixer::Mamba1(m1) => self.mamba1_mixer(n, ns, lp, m1),
            _ => match spec.mamba2() {
                Some(m) => self.mamba2_mixer(n, ns, lp, m),
                None => self.retain_id(n),
            },
        };
        self.drop_(n);
        // `residual + hidden_states`: AddBackward0 hands the sum's gradient to the operand of
        // its dtype and a cast to the other (`Builder::add`)
        let out = self.add(res, y, rows * h * res_size.max(self.compute_size));
        self.drop_(res);
        self.drop_(y);
        out
    }

    /// Bytes per element of a block's output given its input's (fp32 once `residual_in_fp32`
    /// upcast the residual; the parameters' dtype or fp32 under autocast otherwise).
    /// Attention layers keep their input's (fp32 under autocast).
    pub(super) fn layer_out_size(&self, slot: usize, x_size: u128) -> u128 {
        if self.amp || self.spec(slot).ssm_residual_in_fp32() {
            F
        } else {
            x_size
        }
    }

    /// `Mamba2Mixer.torch_forward`: `in_proj`, the convolution + scan + gated norm composite,
    /// `out_proj(scan_output.to(dtype))`.
    pub(super) fn mamba2_mixer(
        &mut self,
        x: TensorId,
        x_size: u128,
        lp: &LayerParams,
        m: &Mamba2,
    ) -> TensorId {
        let rows = self.tokens;
        let lin = |role: LinearRole| {
            lp.linears
                .iter()
                .find(|(r, _)| *r == role)
                .map_or(&super::LIN_ZERO, |(_, l)| l)
        };
        let (zx, zs) = self.linear(x, x_size, rows, lin(LinearRole::SsmIn));
        if self.spec(self.cur_layer).muls.ssm_in {
            // FalconH1Mixer.forward: the scaled input is the local `hidden_states`, rebound by
            // `hidden_states, B, C = torch.split(...)` before the scan: the mixer's reference
            // goes here (the caller hands it over; `in_proj` keeps what it saves)
            self.drop_(x);
        }
        let (zx, zs) = if self.spec(self.cur_layer).muls.ssm_proj {
            // FalconH1Mixer.forward: `projected_states * self.mup_vector` (a buffer that needs
            // no gradient: the product saves nothing of `in_proj`'s output, which goes). The
            // buffer is in the parameters' dtype, so under autocast the bf16 projection times
            // the fp32 buffer promotes to fp32: the scan reads an fp32 zxbcdt
            let ps = zs.max(self.param_size);
            let bytes = rows * u128::from(m.in_proj_width()) * ps;
            let y = self.op(bytes, &[zx], &[], &[], &[]);
            self.drop_(zx);
            (y, ps)
        } else {
            (zx, zs)
        };
        let inner = self.mamba2_inner(zx, zs, x_size, lp, m);
        // `Mamba2Mixer.torch_forward`'s locals `hidden_states_B_C` (the convolution's silu
        // output) and `scan_output` (the gated norm's fp32 output, `out_proj` reads its
        // `.to(dtype)` copy) live until the mixer returns, through `out_proj`. A saving
        // forward with 16-bit projections saves neither (the scan saves fp32 copies, the norm
        // weight's `mul` its input), so they are on top of the saved set at `out_proj`'s
        // matmul: the forward's peak where the scan's own instants are low (one head, one
        // sequence of several chunks: `mamba2_mixer.py 1 100 train bf16 32,1,64,1,32,4,32`
        // peaks at `out_proj`'s `mm` with both alive, 7,112 bytes above the scan's instant).
        // In fp32 the silu output is saved and the cast is a no-op (the copy is the output).
        let locals = (!self.mode.is_infer()
            && self.t.recording
            && !self.amp
            && zs != F
            && m.gated_norm
            && matches!(
                self.spec(self.cur_layer).mixer,
                crate::model::Mixer::Mamba2(_)
            ))
        .then(|| {
            let b = self.batch;
            let s = self.seq;
            self.act(
                b * s * u128::from(m.conv_dim()) * zs + rows * u128::from(m.intermediate) * F,
                false,
            )
        });
        let (y, _) = self.linear(inner, x_size, rows, lin(LinearRole::SsmOut));
        if let Some(l) = locals {
            self.drop_(l);
        }
        // `projected_states` is a local of `torch_forward` until it returns (it matters under
        // autocast with 16-bit projections, where nothing saves it: probe
        // `mamba2_mixer.py --check-amp` frees it after `out_proj`'s output)
        self.drop_(zx);
        self.drop_(inner);
        y
    }

    /// Convolution, scan and gated norm between the projections, as one node: returns the
    /// gated norm's output cast to the mixer input's dtype (`out_proj`'s input).
    fn mamba2_inner(
        &mut self,
        zx: TensorId,
        zs: u128,
        out_size: u128,
        lp: &LayerParams,
        m: &Mamba2,
    ) -> TensorId {
        let mut d = Scan::new(m, self.batch, self.seq, self.amp);
        d.zx16 = self.amp && zs != F;
        d.ckpt = self.mode.checkpointing();
        let out_bytes = d.t * d.i * out_size;
        if self.mode.is_infer() {
            return self.mamba2_infer(zx, zs, out_bytes, &d);
        }
        // a training forward that builds a `DynamicCache` (`use_cache` on, no checkpointing,
        // not padding-free, a model that honours it in training): `update_conv_state` puts
        // zeros `[B, conv_dim, kernel]` in the projections' dtype in it before the
        // convolution, and the scan's final state is copied into zeros `[B, H, head_dim, N]`
        // fp32 after it (transformers 5.23 `cache_utils.py` `LinearAttentionLayer`); the model
        // output's `past_key_values` keeps both until the forward's output goes
        let state_cache = m.state_in_training_cache
            && self.mode.use_cache(self.model)
            && !self.mode.checkpointing()
            && !self.mode.kernels().padding_free;
        if state_cache {
            let conv = self.act(d.b * d.cd * d.k * zs, false);
            self.cache_refs.push(conv);
        }
        let params: Vec<TensorId> = lp.ssm.iter().map(|p| p.id).collect();
        let rg = self.rg(zx) || params.iter().any(|&p| self.t.requires_grad(p));
        if !self.t.recording || !rg {
            if rg {
                // the composite node saves: the layer's tail starts after it
                self.t.tail_barrier();
            }
            // a checkpointed layer's first pass, or a mixer nothing in which needs a gradient
            // (a LoRA model whose adapters are all downstream of it: frozen input, frozen
            // `in_proj` and mixer parameters, so autograd records no node): nothing is saved,
            // each intermediate goes when its last local is rebound, as in the first pass
            self.t
                .transient(d.forward_peak_unsaved(zs), Category::Activations);
            let out = self.act(out_bytes, rg);
            if state_cache {
                let ssm = self.act(d.b * d.h * d.p * d.n * F, false);
                self.cache_refs.push(ssm);
            }
            return out;
        }
        let zx_saved = d.zx_saved(zs);
        let mut extra = if zx_saved {
            d.saved(zs).saturating_sub(d.t * d.e * zs)
        } else {
            d.saved(zs)
        };
        // what a frozen mixer does not hold at the forward's peak instant: the padded x of
        // `D_residual` (gone once the scan used it) and `A = -exp(A_log)` (exp saves its output
        // only for A_log's gradient): a live-storage trace of the forward (FakeTensorMode,
        // rnd-s29-mamba2-1, batch 1, 30 tokens, fp32) with LoRA on in_proj against without
        // differs inside the mixer in exactly these two at that instant
        let mut frozen_gone = 0;
        if !params.iter().any(|&p| self.t.requires_grad(p)) {
            frozen_gone = d.frozen_gone(zs);
            extra = extra.saturating_sub(d.h * F);
            // frozen mixer parameters (LoRA): `D_residual = D[..., None] * pad(x)` with a `D`
            // that needs no gradient saves nothing of the padded x (mul saves an operand only
            // for the other operand's gradient), which then goes once the scan has used it
            extra = extra.saturating_sub(d.tp * d.i * F);
            // the gated norm's `self.weight * hidden_states.to(input_dtype)` with a frozen
            // weight saves nothing of the fp32 normalised scan output, and `A * dt` with a
            // frozen `A_log` saves nothing of dt's fp32 copy (made when dt is 16-bit) (mul
            // saves an operand only for the other's gradient; measured on Mamba-2 with LoRA
            // on in_proj, bf16/fp16/amp-bf16/fp32: exact to 20 bytes)
            if d.norm {
                extra = extra.saturating_sub(d.t * d.i * F);
            }
            if zs != F {
                extra = extra.saturating_sub(d.t * d.h * F);
            }
        }
        let kept = self.act(extra, false);
        self.t.transient(
            d.forward_peak(zs).saturating_sub(extra + frozen_gone),
            Category::Activations,
        );
        let out = self.act(out_bytes, rg);
        if state_cache {
            let ssm = self.act(d.b * d.h * d.p * d.n * F, false);
            self.cache_refs.push(ssm);
        }
        if rg {
            let param_grads: u128 = lp
                .ssm
                .iter()
                .filter(|p| self.trainable(p))
                .map(|p| p.numel * self.param_size)
                .sum();
            d.recomputed = self.recomputing;
            let peak = if frozen_gone > 0 {
                d.backward_peak_frozen(out_size)
            } else {
                d.backward_peak(out_size, self.param_size)
            };
            let temps = peak.saturating_sub(d.t * d.e * zs + param_grads);
            let saved = if zx_saved {
                Ids::of(&[zx, kept])
            } else {
                Ids::of(&[kept])
            };
            self.t.record(Node {
                saved,
                inputs: Ids::of(&[zx]),
                params: Ids::of(&params),
                outputs: Ids::of(&[out]),
                backward_temps: temps,
                ..Node::default()
            });
        }
        self.drop_(kept);
        out
    }

    /// Inference: the prefill allocates the layer's fixed-size state (conv state
    /// `[B, conv_dim, kernel]` in the projections' dtype, then the fp32 SSM state
    /// `[B, H, head_dim, N]`, `LinearAttentionLayer.lazy_initialization` in transformers
    /// `cache_utils.py`), decode steps update both in place.
    fn mamba2_infer(&mut self, zx: TensorId, zs: u128, out_bytes: u128, d: &Scan) -> TensorId {
        let _ = zx;
        let layer = self.cur_layer;
        if self.spec(layer).parallel_mixers() {
            // the layer's attention keeps its KV cache in `cache`; the state goes beside it
            let has_state = self.ssm_cache.get(layer).is_some_and(Option::is_some);
            if has_state && d.s == 1 {
                self.t.transient(d.decode_peak(zs), Category::Activations);
            } else {
                let conv = self.act(d.b * d.cd * d.k * zs, false);
                self.t
                    .transient(d.forward_peak_unsaved(zs), Category::Activations);
                let ssm = self.act(d.b * d.h * d.p * d.n * F, false);
                if let Some(slot) = self.ssm_cache.get_mut(layer) {
                    if let Some((oc, os)) = slot.replace((conv, ssm)) {
                        self.t.release(oc);
                        self.t.release(os);
                    }
                }
            }
            return self.act(out_bytes, false);
        }
        let has_state = self.cache.get(layer).is_some_and(Option::is_some);
        if has_state && d.s == 1 {
            self.t.transient(d.decode_peak(zs), Category::Activations);
        } else {
            let conv = self.act(d.b * d.cd * d.k * zs, false);
            self.t
                .transient(d.forward_peak_unsaved(zs), Category::Activations);
            let ssm = self.act(d.b * d.h * d.p * d.n * F, false);
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

    /// Codestral's mixer under autocast (16-bit projections): the forms against the bytes
    /// `tools/truth/probes/mamba2_mixer.py --check-amp` reads off the traces (amp-bf16; saved
    /// above in/out_proj's copies and the output, peaks above in_proj's copies and output, the
    /// backward above the composite's saved tensors, its output's fp32 gradient and out_proj's
    /// weight gradient).
    #[test]
    fn codestral_autocast_forms_match_the_probe() {
        let m = crate::mixer::tests::codestral();
        // (batch, seq, saved, forward peak, no-save peak, backward peak): 2 chunks (padded),
        // then one chunk (padded, 8 sequences)
        for (b, s, saved, fwd, unsaved, bwd) in [
            (2, 300, 733_394_194, 1_104_450_066, 794_176_000, 275_906_286),
            (
                8,
                100,
                1_409_435_656,
                2_178_896_904,
                1_547_547_136,
                585_612_280,
            ),
        ] {
            let mut d = Scan::new(&m, b, s, true);
            d.zx16 = true;
            assert!(!d.zx_saved(2));
            assert_eq!(d.saved(2), saved, "saved {b}×{s}");
            assert_eq!(d.forward_peak(2), fwd, "forward peak {b}×{s}");
            assert_eq!(d.forward_peak_unsaved(2), unsaved, "no-save peak {b}×{s}");
            assert_eq!(d.backward_peak(F, F), bwd, "backward peak {b}×{s}");
        }
    }

    /// Without autocast (bf16), where padding dominates: the scan's backward at `M = G * L`
    /// (Codestral 8 × 8 tokens in a chunk of 256: 192 MB, 26× the norm's instant) and the
    /// forward peak of one sequence of one chunk, against the probe's bytes
    /// (`tools/truth/probes/mamba2_mixer.py --check`).
    #[test]
    fn codestral_padding_dominated_backward_and_one_sequence_forward() {
        let m = crate::mixer::tests::codestral();
        for (b, s, fwd, bwd) in [
            (8, 8, 2_459_141_128, 191_887_352),
            (1, 100, 247_347_208, 45_493_112),
        ] {
            let d = Scan::new(&m, b, s, false);
            assert_eq!(d.forward_peak(2), fwd, "forward peak {b}×{s}");
            assert_eq!(d.backward_peak(2, 2), bwd, "backward peak {b}×{s}");
            assert!(d.backward_peak_scan(2, 2) > d.backward_peak_norm(2, 2));
        }
    }

    /// A mixer with every parameter frozen (LoRA without `in_proj`), Granite 4.0-H's random
    /// config rnd-s29-granitemoehybrid-0 (hidden 224, 14 heads of 32, one group, state 16,
    /// chunks of 128): the backward's highest bytes above the frozen saved set, as the mixer
    /// tracer reads them (`tools/truth/probes/mixer_trace.py` on `GraniteMoeHybridMambaLayer`
    /// and `Mamba2Mixer` with `requires_grad_(False)` on every parameter, the input needing a
    /// gradient: the peak above the backward's start, less the output's gradient). One padded
    /// chunk peaks at `M = G * L`, two chunks and one full chunk at the gated norm.
    #[test]
    fn frozen_mixer_backward_matches_the_trace() {
        let m = Mamba2 {
            num_heads: 14,
            head_dim: 32,
            n_groups: 1,
            state_size: 16,
            conv_kernel: 4,
            intermediate: 448,
            chunk_size: 128,
            ..crate::mixer::tests::codestral()
        };
        // (batch, seq, bytes per element, traced peak above the backward's start)
        for (b, s, z, traced) in [
            (6, 61, 2, 6_572_032),
            (2, 61, 2, 2_190_672),
            (6, 20, 2, 7_675_096),
            (1, 61, 2, 1_324_708),
            (6, 61, 4, 7_555_840),
            (4, 100, 2, 3_681_848),
            (6, 128, 2, 6_878_208),
            (6, 200, 2, 10_747_200),
            (3, 300, 2, 8_060_400),
            (6, 128, 4, 6_878_208),
            (6, 200, 4, 12_034_398),
        ] {
            let d = Scan::new(&m, b, s, false);
            let out_grad = d.t * d.i * z;
            assert_eq!(
                d.backward_peak_frozen(z) + out_grad,
                traced,
                "frozen backward {b}×{s}, {z} B"
            );
        }
    }

    /// rnd-s53-mamba2-0's mixer (64 heads of 8, state 32 > 3·8, 4 groups, kernel 2, chunks of
    /// 64) under amp-fp16, 4 × 24 tokens: the forward peaks at `C_times_states`' `bmm`, 29,455,368
    /// bytes above in_proj's weight and input copies and output, 28,904,712 with every mixer
    /// parameter but in_proj's frozen (tools/truth/probes/mamba2_mixer.py's tracer); without
    /// autocast (bf16) freezing lowers the peak by 549,120 bytes, and at rnd-s29-mamba2-1's
    /// widths (2 × 100 tokens) by 176,856
    #[test]
    fn wide_state_autocast_forward_and_frozen_mixer_match_the_trace() {
        let wide = Mamba2 {
            num_heads: 64,
            head_dim: 8,
            n_groups: 4,
            state_size: 32,
            conv_kernel: 2,
            intermediate: 512,
            chunk_size: 64,
            ..crate::mixer::tests::codestral()
        };
        let mut d = Scan::new(&wide, 4, 24, true);
        d.zx16 = true;
        assert_eq!(d.forward_peak(2), 29_455_368);
        assert_eq!(d.forward_peak(2) - d.frozen_gone(2), 28_904_712);
        let d = Scan::new(&wide, 4, 24, false);
        assert_eq!(d.frozen_gone(2), 549_120);
        let s29 = Mamba2 {
            num_heads: 6,
            head_dim: 32,
            n_groups: 2,
            state_size: 8,
            conv_kernel: 4,
            intermediate: 192,
            chunk_size: 16,
            ..crate::mixer::tests::codestral()
        };
        assert_eq!(Scan::new(&s29, 2, 100, false).frozen_gone(2), 176_856);
    }

    /// A Falcon-H1-style mixer (`zxbcdt` fp32 under autocast) at the widths random seed 53
    /// drew: hidden 96, 24 heads of 8 in 8 groups, state 8, kernel 4, chunks of 128.
    fn seed53_mixer(norm_before_gate: bool) -> Mamba2 {
        Mamba2 {
            num_heads: 24,
            head_dim: 8,
            n_groups: 8,
            state_size: 8,
            conv_kernel: 4,
            intermediate: 192,
            chunk_size: 128,
            proj_bias: false,
            out_bias: false,
            gated_norm: true,
            norm_before_gate,
            conv_bias: true,
            residual_in_fp32: false,
            state_in_training_cache: true,
        }
    }

    /// Normalise-then-gate against gate-first: the same saved bytes and forward peaks, and
    /// the norm's backward instant lower by the amounts `tools/truth/probes/falcon_h1_mixer.py
    /// --order` reads off the op-by-op traces of both orders (odd widths: hidden 77, 14 heads
    /// of 11, 7 groups, state 13, kernel 6, chunks of 16; Codestral's widths in bf16 and fp32).
    #[test]
    fn norm_before_gate_lowers_only_the_norms_backward_instant() {
        let odd = |before| Mamba2 {
            num_heads: 14,
            head_dim: 11,
            n_groups: 7,
            state_size: 13,
            conv_kernel: 6,
            intermediate: 154,
            chunk_size: 16,
            ..seed53_mixer(before)
        };
        let codestral = |before| Mamba2 {
            norm_before_gate: before,
            ..crate::mixer::tests::codestral()
        };
        // (mixer, batch, seq, precision, traced norm-first minus gate-first)
        type Case = (fn(bool) -> Mamba2, u128, u128, &'static str, i128);
        let cases: [Case; 8] = [
            (odd, 3, 50, "bf16", -88_508),
            (odd, 3, 50, "fp32", -88_816),
            (odd, 3, 50, "amp", -88_816),
            (odd, 1, 10, "bf16", -6_188),
            (odd, 2, 64, "fp32", -75_880),
            (codestral, 1, 512, "bf16", -16_777_216),
            (codestral, 2, 300, "bf16", -19_657_984),
            (codestral, 2, 300, "fp32", -19_660_800),
        ];
        for (mixer, b, s, prec, traced) in cases {
            let amp = prec == "amp";
            let (z, w) = if prec == "bf16" { (2, 2) } else { (F, F) };
            let gate_first = Scan::new(&mixer(false), b, s, amp);
            let norm_first = Scan::new(&mixer(true), b, s, amp);
            assert_eq!(norm_first.saved(z), gate_first.saved(z), "{b}×{s} {prec}");
            assert_eq!(norm_first.forward_peak(z), gate_first.forward_peak(z));
            let diff = norm_first.backward_peak_norm(z, w) as i128
                - gate_first.backward_peak_norm(z, w) as i128;
            assert_eq!(diff, traced, "{b}×{s} {prec}");
        }
    }

    /// Every mixer parameter frozen (LoRA elsewhere): normalise-then-gate against gate-first,
    /// the backward peaks' difference as `falcon_h1_mixer.py --order` reads it off the traces
    /// of frozen mixers (the norm's instants are the peak at these shapes).
    #[test]
    fn norm_before_gate_frozen_backward_matches_the_trace() {
        let odd = |before| Mamba2 {
            num_heads: 14,
            head_dim: 11,
            n_groups: 7,
            state_size: 13,
            conv_kernel: 6,
            intermediate: 154,
            chunk_size: 16,
            ..seed53_mixer(before)
        };
        for (b, s, z, traced) in [
            (3, 50, 2, -180_600),
            (3, 50, F, -92_400),
            (2, 64, 2, -154_112),
            (2, 64, F, -78_848),
            (1, 50, 2, -60_200),
            (1, 50, F, -30_800),
        ] {
            let diff = Scan::new(&odd(true), b, s, false).backward_peak_frozen(z) as i128
                - Scan::new(&odd(false), b, s, false).backward_peak_frozen(z) as i128;
            assert_eq!(diff, traced, "{b}×{s} z={z}");
        }
        let codestral = |before| Mamba2 {
            norm_before_gate: before,
            ..crate::mixer::tests::codestral()
        };
        for (z, traced) in [(2, -33_538_048), (F, -16_777_216)] {
            let diff = Scan::new(&codestral(true), 1, 512, false).backward_peak_frozen(z) as i128
                - Scan::new(&codestral(false), 1, 512, false).backward_peak_frozen(z) as i128;
            assert_eq!(diff, traced, "1×512 z={z}");
        }
    }

    /// Autocast over Falcon-H1's fp32 `zxbcdt` at rnd-s167-falconh1-0's widths (8 heads of 32,
    /// 2 groups, state 128, kernel 4): the saving forward's peak as
    /// `tools/truth/probes/falcon_h1_mixer.py --check-amp-fwd` traces it, above in_proj's bf16
    /// weight and input copies and its fp32 output: 29,928,072 − 680,672 at 5 × 19 tokens in
    /// one chunk of 128 (the `C_times_states` instant), 28,153,952 − 2,236,992 at 3 × 150 in
    /// chunks of 64; the fp32 form (16-bit `bmm`s counted as fp32) was 6,236,632 bytes over
    /// at 5 × 19 (rnd-t167-036-falconh1 +14.4 %).
    #[test]
    fn falcon_autocast_forward_peak_matches_the_trace() {
        let s167 = |l| Mamba2 {
            num_heads: 8,
            head_dim: 32,
            n_groups: 2,
            state_size: 128,
            conv_kernel: 4,
            intermediate: 256,
            chunk_size: l,
            proj_bias: false,
            out_bias: false,
            gated_norm: false,
            norm_before_gate: true,
            conv_bias: true,
            residual_in_fp32: false,
            state_in_training_cache: true,
        };
        let d = Scan::new(&s167(128), 5, 19, true);
        assert_eq!(d.forward_peak(F), 29_928_072 - 680_672);
        assert_eq!(
            Scan::new(&s167(64), 3, 150, true).forward_peak(F),
            28_153_952 - 2_236_992
        );
        let fp32 = Scan::new(&s167(128), 5, 19, false);
        assert!(fp32.forward_peak(F) > d.forward_peak(F));
    }

    /// Autocast over Falcon-H1's fp32 `zxbcdt` at the seed-53 widths, 5 × 264 tokens (3
    /// chunks): the scan's backward instant against the op-by-op trace of the mixer
    /// (falcon_h1_mixer.py, norm-first; the live set at the backward's peak, 64,369,120 B
    /// above the output gradient's mark, is this instant once out_proj's own tensors and the
    /// output's fp32 gradient are taken off), and it is the mixer backward's peak there.
    #[test]
    fn falcon_autocast_scan_instant_matches_the_trace() {
        for before in [true, false] {
            let d = Scan::new(&seed53_mixer(before), 5, 264, true);
            assert_eq!(d.backward_peak_scan_amp(F), 63_825_376);
            assert_eq!(d.backward_peak(F, F), 63_825_376);
            assert!(d.backward_peak_norm(F, F) < 63_825_376);
            // recomputed under checkpointing: the same instant without G's gradient's 16-bit
            // cast ([chunk, chunk] blocks of 5 × 3 chunks × 24 heads in bf16)
            let r = Scan {
                recomputed: true,
                ..d
            };
            assert_eq!(
                r.backward_peak(F, F),
                63_825_376 - 5 * 3 * 24 * 128 * 128 * 2
            );
        }
    }

    /// The scan's backward instant (`M = G * L`) wins over the gated norm's at Codestral's
    /// chunks of 256, not at narrow chunks (the norm's instant then, as without autocast).
    #[test]
    fn autocast_backward_takes_the_larger_instant() {
        let m = crate::mixer::tests::codestral();
        let mut d = Scan::new(&m, 2, 300, true);
        d.zx16 = true;
        assert!(d.backward_peak_scan_amp16(F) > d.backward_peak_norm(F, F));
        let narrow = Mamba2 {
            chunk_size: 16,
            ..m
        };
        let mut d = Scan::new(&narrow, 2, 300, true);
        d.zx16 = true;
        assert_eq!(d.backward_peak(F, F), d.backward_peak_norm(F, F));
    }

    /// The no-save forward (prefill under `torch.no_grad()`) of the random config
    /// rnd-s61-mamba2-0 (hidden 96, 24 heads of 8, one group, state 128, conv kernel 2, chunks
    /// of 32), fp32: the highest bytes above the input, `in_proj`'s output and the conv state,
    /// as `tools/truth/probes/mamba2_mixer.py B S infer fp32 96,24,8,1,128,2,32` traces them.
    /// One sequence peaks at the chunk states' `bmm` (whose operand is a view of the `cat`),
    /// one chunk of two sequences at `C_times_states` (chunk states a view, `C` a copy); the
    /// traced peaks without these views were 196,608 bytes (1 × 28 and 2 × 28) higher.
    #[test]
    fn one_sequence_and_one_chunk_no_save_peak_matches_the_trace() {
        let m = Mamba2 {
            num_heads: 24,
            head_dim: 8,
            n_groups: 1,
            state_size: 128,
            conv_kernel: 2,
            intermediate: 192,
            chunk_size: 32,
            conv_bias: false,
            ..crate::mixer::tests::codestral()
        };
        for (b, s, traced) in [
            (1, 28, 2_102_368),
            (2, 28, 4_653_152),
            (1, 60, 4_660_800),
            (2, 60, 9_321_504),
            (1, 100, 9_087_808),
            (3, 100, 27_263_232),
        ] {
            let d = Scan::new(&m, b, s, false);
            assert_eq!(d.forward_peak_unsaved(F), traced, "no-save peak {b}×{s}");
        }
    }

    /// One head (rnd-s29-granitemoehybrid-1: `mamba_n_heads` 1, head 64, one group, state 32,
    /// kernel 4, chunks of 32): einsum's `bmm` operands of `C`, `B` and `B_decay` are views
    /// ([`Scan::cb_views`]), and with one sequence x's and the chunk states' too. Saved bytes
    /// and forward peaks as `tools/truth/probes/mamba2_mixer.py` traces them (bf16 and fp32);
    /// the general form kept `2·tp·n·4` bytes too many (4 × 186: 196,608).
    #[test]
    fn one_head_mixer_saves_views_of_c_and_b() {
        let m = Mamba2 {
            num_heads: 1,
            head_dim: 64,
            n_groups: 1,
            state_size: 32,
            conv_kernel: 4,
            intermediate: 64,
            chunk_size: 32,
            ..crate::mixer::tests::codestral()
        };
        for (b, s, z, saved, fwd) in [
            (4, 186, 2, 3_452_874, 3_844_138),
            (4, 186, 4, 3_933_594, 4_036_186),
            (2, 100, 2, 1_065_234, 1_262_066),
            (2, 100, 4, 1_195_170, 1_314_402),
            (1, 100, 4, 574_062, 559_950),
        ] {
            let d = Scan::new(&m, b, s, false);
            assert_eq!(d.saved(z), saved, "saved {b}×{s} z={z}");
            assert_eq!(d.forward_peak(z), fwd, "forward peak {b}×{s} z={z}");
        }
        // one sequence in bf16: saved exact; the traced forward peak (540,894 above the input
        // and in_proj's output) is not the scan's instant (7,112 bytes lower) but out_proj's
        // matmul, with torch_forward's locals alive (`Builder::mamba2_mixer`): the saved set,
        // the silu output (bf16 [1, 128, 100]) and the norm's fp32 output, out_proj's bf16
        // input and its output
        let d = Scan::new(&m, 1, 100, false);
        assert_eq!(d.saved(2), 509_094);
        assert_eq!(d.forward_peak(2), 540_894 - 7_112);
        let at_out_proj = d.saved(2) - d.t * d.e * 2
            + d.b * d.s * d.cd * 2
            + d.t * d.i * F
            + d.t * d.i * 2
            + d.t * 32 * 2;
        assert_eq!(at_out_proj, 540_894);
    }

    /// The no-save forward (prefill) of one head: `C`'s `bmm` layout for `C_times_states` and
    /// the `cat`'s for the chunk-level states are views (the head dimension of size 1 merges
    /// with the batch), at any batch and chunk count. Peaks as `tools/truth/probes/mamba2_mixer.py
    /// --check-infer` traces them (above the input, `in_proj`'s output and the conv state):
    /// rnd-s139-mamba2-0 (one head of 16, state 32, chunks of 16; rnd-i139-002-mamba2 is
    /// 5 × 67) peaks at the output (the form gave the `C_times_states` instant with C copied,
    /// 25,600 bytes more at 5 × 67 fp32); wide states peak at `C_times_states` or at the
    /// chunk-level states' `bmm`.
    #[test]
    fn one_head_no_save_peak_matches_the_trace() {
        let one_head = |p: u64, n: u64, l: u64| Mamba2 {
            num_heads: 1,
            head_dim: p,
            n_groups: 1,
            state_size: n,
            conv_kernel: 4,
            intermediate: p,
            chunk_size: l,
            ..crate::mixer::tests::codestral()
        };
        // (head dim, state, chunk, batch, seq, bytes per element, traced)
        for (p, n, l, b, s, z, traced) in [
            (16, 32, 16, 5, 67, F, 596_944),
            (16, 32, 16, 5, 67, 2, 542_674),
            (16, 32, 16, 1, 67, F, 119_392),
            (16, 64, 16, 2, 64, F, 314_060),
            (16, 128, 32, 2, 100, 2, 834_396),
            (16, 128, 4, 3, 30, F, 737_848),
            (16, 96, 16, 3, 50, 2, 562_972),
        ] {
            let d = Scan::new(&one_head(p, n, l), b, s, false);
            assert_eq!(
                d.forward_peak_unsaved(z),
                traced,
                "{b}×{s} P{p} N{n} L{l} z={z}"
            );
        }
    }

    /// The no-save forward under autocast (a checkpointed layer's first pass) of one head,
    /// rnd-s139-mamba2-0's widths (head 16, state 32, chunks of 16): the chunk states' `bmm`
    /// casts `B_decay` through a view (no fp32 layout copy), so the output's instant is the
    /// peak, as `mamba2_mixer.py 5 67 ckpt amp-bf16 8,1,16,1,32,4,16` traces it (468,594 bytes
    /// above in_proj's 16-bit copies and output; the form gave 481,634).
    #[test]
    fn one_head_autocast_no_save_peak_casts_b_decay_through_a_view() {
        let m = Mamba2 {
            num_heads: 1,
            head_dim: 16,
            n_groups: 1,
            state_size: 32,
            conv_kernel: 4,
            intermediate: 16,
            chunk_size: 16,
            ..crate::mixer::tests::codestral()
        };
        let mut d = Scan::new(&m, 5, 67, true);
        d.zx16 = true;
        assert_eq!(d.forward_peak_unsaved(2), 468_594);
    }

    /// Granite 4.0-H's random config rnd-s61-granitemoehybrid-0 (hidden 160, 20 heads of 16,
    /// two groups, state 8, chunks of 256) under autocast: the scan's backward at `M = G * L`
    /// (it wins: padding dominates) as the probe reads it (`mamba2_mixer.py --check-amp` form,
    /// +0 against the trace), and under non-reentrant checkpointing lower by the recomputed
    /// 16-bit `G` (`b·c·h·l·l·2`), the difference `torch.utils.checkpoint` makes in the traced
    /// mixer (1 × 67: 2,621,440 bytes; 2 × 300, two chunks: 10,485,760).
    #[test]
    fn checkpointed_autocast_scan_backward_drops_the_recomputed_g() {
        let m = Mamba2 {
            num_heads: 20,
            head_dim: 16,
            n_groups: 2,
            state_size: 8,
            conv_kernel: 4,
            intermediate: 320,
            chunk_size: 256,
            ..crate::mixer::tests::codestral()
        };
        for (b, s, plain, traced_drop) in [(1, 67, 15_138_176, 2_621_440), (2, 300, 0, 10_485_760)]
        {
            let mut d = Scan::new(&m, b, s, true);
            d.zx16 = true;
            let before = d.backward_peak_scan_amp16(F);
            if plain > 0 {
                assert_eq!(d.backward_peak(F, F), plain, "plain {b}×{s}");
            }
            d.ckpt = true;
            assert_eq!(
                before - d.backward_peak_scan_amp16(F),
                traced_drop,
                "{b}×{s}"
            );
        }
    }
}
