//! The GatedDeltaNet forward that saves nothing — inference's prefill and decode steps, a
//! checkpointed layer's first pass — replayed op by op from the allocation trace of
//! transformers 5.23 `Qwen3NextGatedDeltaNet.forward` (`tools/truth/probes/deltanet_mixer.py
//! --unsaved`): what torch allocates at each op and when it frees it.

use super::{Sizes, F};

/// Bytes alive over a replayed sequence of allocations and frees, and the highest.
#[derive(Debug, Default)]
pub(super) struct Live {
    now: u128,
    peak: u128,
}

impl Live {
    fn alloc(&mut self, bytes: u128) {
        self.now += bytes;
        self.peak = self.peak.max(self.now);
    }

    fn free(&mut self, bytes: u128) {
        self.now = self.now.saturating_sub(bytes);
    }
}

/// A forward that saves nothing ([`Sizes::unsaved`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unsaved {
    /// Highest bytes alive above the input, both projections' outputs and (a prefill) the conv
    /// state, up to the gated norm's output.
    pub(super) peak: u128,
    /// The forward's locals still alive when `out_proj` allocates its output (the
    /// convolution's silu output, the reordering copies, `beta`, `g`, a prefill's final
    /// state), besides the norm's output and the cache's state.
    pub(super) locals: u128,
}

/// Which forward that saves nothing [`Sizes::unsaved`] replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    /// A checkpointed layer's first pass (no cache, the final state dropped).
    Checkpointed,
    /// Inference's prefill with a `DynamicCache`.
    Prefill,
    /// A decode step (one token against the cached states).
    Decode,
}

impl Sizes {
    /// A forward that saves nothing (`torch.no_grad()` inference, a checkpointed layer's first
    /// pass), replayed op by op from `in_proj_ba`'s output to the gated norm's: every tensor
    /// transformers 5.23 `Qwen3NextGatedDeltaNet.forward` and `torch_chunk_gated_delta_rule`
    /// (a decode step: `causal_conv1d_update` and `torch_recurrent_gated_delta_rule`)
    /// allocate, in their order, freed when torch frees it (its last Python reference goes or
    /// is rebound). `z` = bytes per element of the projections' output (the mixer's dtype).
    /// A prefill runs with a `DynamicCache` (`output_final_state=True`: the final state
    /// outlives the rule, the cache's recurrent state is allocated after it, a prompt shorter
    /// than the kernel is padded to it); its conv state — a decode step's whole cache — is
    /// held outside, with the input and both projections' outputs, above which the peak is
    /// counted.
    ///
    /// Read off `tools/truth/probes/deltanet_mixer.py B S infer|ckpt PREC dims --unsaved`
    /// (every storage allocation and free on fake tensors; the unit test
    /// `unsaved_is_the_traced_one` holds it byte for byte over batch 1–4, 1–300 tokens, hidden
    /// 64–2048, one key head, one and more value heads per key head, bf16 and fp32, prefill,
    /// decode and checkpointed). Under autocast (a checkpointed layer's first pass only) the
    /// same replay at 16-bit projections stands in: the matmuls' 16-bit operand casts and
    /// outputs are not replayed (+0.35% at the mixer against
    /// `deltanet_mixer.py 2 130 ckpt amp-bf16 64,2,4,16,16,4 --unsaved`).
    pub(super) fn unsaved(&self, z: u128, pass: Pass) -> Unsaved {
        let Sizes {
            b,
            s,
            t,
            tp,
            c,
            l,
            hk,
            hv,
            dk,
            dv,
            vd,
            cd,
            k,
            ..
        } = *self;
        let fp32 = z == F;
        let cache = pass != Pass::Checkpointed;
        let decode = pass == Pass::Decode;
        let st = self.state();
        let mut m = Live::default();
        // `fix_query_key_value_ordering`: `value` and `z` `[B, S, Hk, (Hv/Hk)·dv]` → `[B, S, Hv,
        // dv]`, `b` and `a` → `[B, S, Hv]` are copies when they merge two dimensions of
        // different strides (more than one key head and more than one value head per key head)
        let per_group = hk > 1 && hv > hk;
        let (value_copy, z_copy, ba_copy) = if per_group {
            (t * vd * z, t * vd * z, 2 * t * hv * z)
        } else {
            (0, 0, 0)
        };
        m.alloc(value_copy + z_copy + ba_copy);
        // `query`/`key`/`value`.reshape(B, S, -1): copies of the strided `[B, S, Hk, ·]` slices
        // with more than one key head (`value` unless copied above)
        let flat = if hk > 1 {
            2 * t * hk * dk * z + if per_group { 0 } else { t * vd * z }
        } else {
            0
        };
        m.alloc(flat);
        // `torch.cat` → the convolution's input
        m.alloc(t * cd * z);
        let silu = if decode {
            // `causal_conv1d_update`: the conv state and the token concatenated `[B, conv_dim,
            // kernel + 1]`, `F.conv1d` of it (2 columns), silu of the last one
            let window = b * cd * (k + 1) * z;
            m.alloc(window + 2 * b * cd * z + b * cd * z);
            m.free(2 * b * cd * z + window + t * cd * z + value_copy + flat);
            b * cd * z
        } else {
            // with a cache, `update_conv_state` pads a prompt shorter than the kernel to it
            // (`F.pad`, the cat freed as `mixed_qkv` is rebound)
            let len = if cache { s.max(k) } else { s };
            let conv_in = b * cd * len * z;
            if len > s {
                m.alloc(conv_in);
                m.free(t * cd * z);
            }
            // `causal_conv1d_fn`: `F.conv1d` (padding kernel − 1), silu of its first `len`
            // columns (bound to `query`/`key`/`value` until the forward returns); its input
            // and the reshape copies go as `mixed_qkv`, `query`, `key`, `value` are rebound
            let silu = b * cd * len * z;
            m.alloc(b * cd * (len + k - 1) * z);
            m.alloc(silu);
            m.free(b * cd * (len + k - 1) * z + conv_in + value_copy + flat);
            silu
        };
        // beta = b.sigmoid(); g = -A_log.float().exp() * softplus(a.float() + dt_bias) (the
        // `.float()`s are no-ops in fp32)
        let (heads, rows) = (hv * F, t * hv * F);
        let (a_log32, a32) = if fp32 { (0, 0) } else { (heads, rows) };
        m.alloc(t * hv * z);
        m.alloc(a_log32 + heads);
        m.free(a_log32);
        m.alloc(heads);
        m.free(heads);
        m.alloc(a32 + rows);
        m.free(a32);
        m.alloc(rows);
        m.free(rows);
        m.alloc(rows);
        m.free(heads + rows);
        // -- torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule --
        // `repeat_interleave` of query and key to the value heads
        let repeat = if hv > hk { t * hv * dk * z } else { 0 };
        m.alloc(2 * repeat);
        // `.transpose(1, 2).to(float32, contiguous_format)`: copies in 16 bits (the decay `g` is
        // fp32 and 3-D: `to` aliases it, its suggested memory format being contiguous); in fp32
        // every one aliases the same way
        let qk = t * hv * dk * F;
        if !fp32 {
            m.alloc(2 * qk + t * vd * F + rows);
            m.free(2 * repeat);
        }
        // l2norm(query), l2norm(key): `x * x`, its sum, `+ eps`, rsqrt, `x * inv_norm`; the
        // input goes as it is rebound (the fp32 copy, in fp32 the repeat copy or a view)
        for _ in 0..2 {
            m.alloc(qk + rows);
            m.free(qk);
            m.alloc(rows);
            m.free(rows);
            m.alloc(rows);
            m.free(rows);
            m.alloc(qk);
            m.free(rows);
            m.free(if fp32 { repeat } else { qk });
        }
        // `query * scaling` (`query / sqrt(dk)` in decode)
        m.alloc(qk);
        m.free(qk);
        let tv = t * vd;
        if decode {
            // core_attn_out = zeros_like(value); the one token: the decay's `exp`, the decayed
            // state, `(state * k).sum(-2)` (kv_mem), `(v − kv_mem) * beta` (delta), the outer
            // product `k * delta` and the new state, the decayed one freed as it is rebound,
            // then `(state * q).sum(-2)` copied into core_attn_out
            m.alloc(tv * F + heads * b + st);
            m.alloc(st + tv * F);
            m.free(st);
            m.alloc(2 * tv * F);
            m.free(tv * F);
            m.alloc(2 * st);
            m.free(2 * st);
            m.alloc(st + tv * F);
            m.free(st + tv * F);
            // `.to(input dtype, contiguous_format)`: a copy in 16 bits (core_attn_out then
            // freed), an alias in fp32 (core_attn_out alive through the norm); the rule's locals
            // go: query, key, the fp32 value and beta (16 bits), the decay's `exp`, kv_mem, delta
            if !fp32 {
                m.alloc(tv * z);
                m.free(tv * F);
            }
            let copies = if fp32 { 0 } else { tv * F + rows };
            m.free(2 * qk + copies + heads * b + 2 * tv * F);
            return self.norm_replay(m, z, pass, silu, z_copy + ba_copy, rows);
        }
        // F.pad to whole chunks (a copy even when nothing is padded) of query, key, value, then
        // beta and the decay
        let (full_k, full_v, tokens) = (tp * hv * dk * F, tp * hv * dv * F, tp * hv * F);
        let ll = b * hv * c * l * l * F;
        m.alloc(2 * full_k + full_v);
        m.free(2 * qk + if fp32 { 0 } else { t * vd * F });
        m.alloc(2 * tokens);
        if !fp32 {
            m.free(rows);
        }
        // v_beta, k_beta; the strictly upper mask (`ones`, then `triu`); cum_decay
        m.alloc(full_v + full_k);
        m.alloc(2 * l * l);
        m.free(l * l);
        m.alloc(tokens);
        // pairwise_decay: `sub`, `masked_fill`, `exp`, each freeing the one before
        m.alloc(2 * ll);
        m.free(ll);
        m.alloc(ll);
        m.free(ll);
        // ut_system, intra_chunk_attn: `[chunk, chunk]` products (bmm) times pairwise_decay
        for _ in 0..2 {
            m.alloc(2 * ll);
            m.free(ll);
        }
        // decayed_k_beta (`cum_decay.exp()`), the two triangular solves, the zero initial state,
        // core_attn_out
        m.alloc(tokens + full_k);
        m.free(tokens);
        m.alloc(full_v + full_k + st + full_v);
        // query and key times their decays (`exp`, then `sub` and `exp`), the padded ones freed;
        // chunk_decay
        m.alloc(tokens + full_k);
        m.free(tokens + full_k);
        m.alloc(2 * tokens);
        m.free(tokens);
        m.alloc(full_k);
        m.free(tokens + full_k);
        m.alloc(b * hv * c * F);
        // the chunk loop: `k_cumdecay[i] @ state`, v_new, `query[i] @ state`, `intra @ v_new`,
        // their sum (copied into core_attn_out); then `state * chunk_decay[i]`, `keyᵀ @ v_new`,
        // their sum, the old state freed. From the second chunk on the previous v_new and
        // inter_chunk_attn go as they are rebound: every chunk peaks alike
        let chunk = b * hv * l * dv * F;
        for i in 0..c.min(2) {
            m.alloc(2 * chunk);
            m.free(chunk);
            if i > 0 {
                m.free(chunk);
            }
            m.alloc(chunk);
            if i > 0 {
                m.free(chunk);
            }
            m.alloc(2 * chunk);
            m.free(2 * chunk);
            m.alloc(3 * st);
            m.free(3 * st);
        }
        if !cache {
            // `output_final_state=False`: the final state is dropped
            m.free(st);
        }
        // core_attn_out.reshape(B, Hv, -1, dv): a copy from two chunks on (`zeros_like` kept
        // `solve_triangular`'s column-major strides), the original freed; `.to(input dtype,
        // contiguous_format)`: a copy in 16 bits (the padded output then freed), an alias in fp32
        if c > 1 {
            m.alloc(full_v);
            m.free(full_v);
        }
        if !fp32 {
            m.alloc(tv * z);
            m.free(full_v);
        }
        // the rule returns: its locals go (the padded value, beta, decay; v_beta, k_beta; the
        // mask; cum_decay; the three `[chunk, chunk]` products; decayed_k_beta, new_values,
        // k_cumdecay; the decayed query and key; chunk_decay; the last v_new and inter_chunk_attn)
        m.free(
            3 * full_v
                + 2 * tokens
                + 5 * full_k
                + l * l
                + tokens
                + 3 * ll
                + b * hv * c * F
                + 2 * chunk,
        );
        if cache {
            // `update_recurrent_state`: the cache's zero state, the final state copied in
            m.alloc(st);
        }
        // core_attn_out.reshape(-1, dv): a copy of fp32's strided alias (the padded output
        // then freed)
        if fp32 {
            m.alloc(tv * F);
            m.free(full_v);
        }
        self.norm_replay(m, z, pass, silu, z_copy + ba_copy, rows)
    }

    /// The end of [`Sizes::unsaved`]: from the rule's output (in the input dtype, or fp32's
    /// alias) through the gated norm; `silu` = the convolution's output, `copies` = the
    /// reordering copies, `rows` = `g`, all still alive at `out_proj` (with a prefill's or a
    /// decode step's final state).
    fn norm_replay(
        &self,
        mut m: Live,
        z: u128,
        pass: Pass,
        silu: u128,
        copies: u128,
        rows: u128,
    ) -> Unsaved {
        let Sizes { t, hk, hv, vd, .. } = *self;
        let fp32 = z == F;
        let tv = t * vd;
        let st = self.state();
        // z.reshape(-1, dv): a copy with one key head (`[B, S, 1, Hv·dv]` split into heads
        // cannot merge its token and head dimensions, unless one of them is 1)
        let z_norm = if hk == 1 && hv > 1 && t > 1 {
            tv * z
        } else {
            0
        };
        m.alloc(z_norm);
        // Qwen3NextRMSNormGated: `.to(float32)` (no-op in fp32), pow, mean, `+ eps`, rsqrt, the
        // product; `weight * hidden.to(input_dtype)`; `gate.to(float32)`, silu, the product;
        // `.to(input_dtype)` (no-ops in fp32); its input freed as core_attn_out is rebound
        let cast = if fp32 { 0 } else { tv * F };
        let norm_rows = t * hv * F;
        m.alloc(cast + tv * F + norm_rows);
        m.free(tv * F);
        m.alloc(norm_rows);
        m.alloc(norm_rows);
        m.free(norm_rows);
        m.alloc(tv * F);
        m.free(norm_rows + cast);
        let to16 = if fp32 { 0 } else { tv * z };
        m.alloc(to16 + tv * z);
        m.free(to16 + tv * F);
        m.alloc(cast + tv * F);
        m.free(cast);
        m.alloc(tv * F);
        m.free(tv * F + tv * z);
        m.alloc(to16);
        m.free(if fp32 { 0 } else { tv * F });
        Unsaved {
            peak: m.peak,
            locals: silu
                + copies
                + t * hv * z
                + rows
                + z_norm
                + if pass == Pass::Checkpointed { 0 } else { st },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{sizes, Dims};
    use super::*;

    /// A forward that saves nothing, against `tools/truth/probes/deltanet_mixer.py B S MODE
    /// PREC dims --unsaved` (`peak`, `locals`; a decode step's `decode`, `decode_locals`):
    /// `infer` (a prefill with a `DynamicCache`, then a decode step) and `ckpt` (a checkpointed
    /// layer's first pass), bf16 and fp32, batch 1–4, 1–300 tokens (one to five chunks, padded
    /// and not), one key head, one and more value heads per key head, hidden 64–2048. A sample
    /// of the 379 traced cases (all exact).
    #[test]
    fn unsaved_is_the_traced_one() {
        // (batch, seq, dims, pass, bytes per element, peak, locals)
        use Pass::{Checkpointed as Ck, Decode as Dec, Prefill as Pre};
        let traced: &[(u128, u128, Dims, Pass, u128, u128, u128)] = &[
            (4, 63, (64, 2, 4, 16, 16, 4), Ck, 2, 1778080, 106848),
            (2, 2, (64, 2, 4, 16, 16, 4), Ck, 4, 840992, 3328),
            (1, 1, (64, 2, 4, 16, 16, 4), Pre, 2, 422072, 5288),
            (3, 65, (64, 2, 4, 16, 16, 4), Pre, 2, 2378584, 94968),
            (1, 300, (64, 2, 4, 16, 16, 4), Pre, 2, 1985840, 131296),
            (2, 200, (64, 2, 4, 16, 16, 4), Pre, 4, 3318912, 340992),
            (4, 63, (64, 2, 6, 24, 40, 4), Ck, 2, 4303216, 305424),
            (3, 65, (64, 2, 6, 24, 40, 4), Ck, 4, 5656240, 468000),
            (3, 65, (64, 2, 6, 24, 40, 4), Pre, 2, 5424580, 305460),
            (1, 150, (64, 2, 6, 24, 40, 4), Pre, 4, 2883208, 383040),
            (1, 64, (64, 4, 4, 16, 16, 4), Ck, 2, 446992, 26112),
            (3, 3, (64, 4, 4, 16, 16, 4), Ck, 4, 1261648, 7200),
            (1, 40, (64, 4, 4, 16, 16, 4), Pre, 2, 437200, 20416),
            (4, 63, (64, 4, 4, 16, 16, 4), Pre, 4, 1872832, 217984),
            (1, 300, (64, 4, 4, 16, 16, 4), Pre, 4, 2098640, 244096),
            (2, 128, (128, 2, 4, 128, 64, 4), Ck, 2, 6318144, 534528),
            (1, 1, (128, 2, 4, 128, 64, 4), Ck, 4, 1780816, 4160),
            (1, 40, (128, 2, 4, 128, 64, 4), Pre, 2, 1860176, 214592),
            (2, 200, (128, 2, 4, 128, 64, 4), Pre, 4, 11924480, 1926144),
            (2, 128, (128, 2, 6, 32, 48, 4), Ck, 2, 4404320, 375808),
            (1, 1, (128, 2, 6, 32, 48, 4), Ck, 4, 1179000, 2912),
            (2, 2, (128, 2, 6, 32, 48, 4), Pre, 2, 2357280, 82928),
            (2, 2, (128, 2, 6, 32, 48, 4), Pre, 4, 2366384, 92032),
            (2, 128, (160, 16, 32, 128, 128, 4), Ck, 2, 71488000, 6373376),
            (3, 65, (160, 16, 32, 128, 128, 4), Ck, 4, 107354368, 9684480),
            (1, 1, (160, 16, 32, 128, 128, 4), Pre, 2, 21598656, 2171200),
            (
                1,
                150,
                (160, 16, 32, 128, 128, 4),
                Pre,
                4,
                51043712,
                9546752,
            ),
            (3, 65, (256, 1, 4, 64, 96, 4), Ck, 2, 7501480, 354120),
            (1, 300, (256, 1, 4, 64, 96, 4), Ck, 2, 5609584, 544800),
            (1, 64, (256, 1, 4, 64, 96, 4), Ck, 4, 1647632, 231424),
            (1, 1, (256, 1, 4, 64, 96, 4), Pre, 2, 1518632, 102424),
            (1, 40, (256, 1, 4, 64, 96, 4), Pre, 4, 1597712, 242944),
            (1, 1, (2048, 16, 32, 128, 128, 4), Ck, 2, 21549504, 24896),
            (
                1,
                300,
                (2048, 16, 32, 128, 128, 4),
                Ck,
                4,
                80562816,
                14899200,
            ),
            (
                1,
                64,
                (2048, 16, 32, 128, 128, 4),
                Pre,
                2,
                23117952,
                3690496,
            ),
            (3, 3, (2048, 16, 32, 128, 128, 4), Pre, 4, 65110912, 6836736),
            // one key head and one value head: `z` is a view at the norm
            (2, 100, (64, 1, 1, 16, 24, 4), Pre, 2, 459840, 26672),
            (1, 70, (64, 1, 1, 16, 24, 4), Pre, 4, 236408, 17776),
            (3, 40, (64, 1, 1, 16, 24, 4), Ck, 2, 381532, 14160),
            // decode steps (after a 5-token prefill)
            (2, 1, (64, 1, 1, 16, 24, 4), Dec, 2, 10492, 3308),
            (2, 1, (64, 1, 1, 16, 24, 4), Dec, 4, 10520, 3536),
            (1, 1, (128, 2, 6, 32, 48, 4), Dec, 4, 118520, 39776),
            (2, 1, (64, 4, 4, 16, 16, 4), Dec, 2, 28528, 9008),
            (3, 1, (128, 2, 6, 32, 48, 4), Dec, 4, 355560, 119328),
            (3, 1, (64, 4, 4, 16, 16, 4), Dec, 4, 43152, 14688),
            (1, 1, (160, 16, 32, 128, 128, 4), Dec, 4, 6423168, 2146816),
            (3, 1, (128, 2, 6, 32, 48, 4), Dec, 2, 354756, 114996),
            (2, 1, (160, 16, 32, 128, 128, 4), Dec, 4, 12846336, 4293632),
            (2, 1, (128, 2, 6, 32, 48, 4), Dec, 2, 236504, 76664),
        ];
        for &(b, s, dims, pass, z, peak, locals) in traced {
            assert_eq!(
                sizes(b, s, dims).unsaved(z, pass),
                Unsaved { peak, locals },
                "{b} x {s} {dims:?} {pass:?} z {z}"
            );
        }
    }
}
