//! Bytes of quantised weights, per tensor, following each library's storage layout.

use serde::Serialize;

/// A GGUF tensor type with its block layout (ggml `ggml-common.h`: bytes per block / weights
/// per block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GgmlType {
    /// fp32.
    F32,
    /// fp16.
    F16,
    /// bf16.
    Bf16,
    /// 32 weights: fp16 scale + 16 bytes of nibbles.
    Q4_0,
    /// 32 weights: fp16 scale and min + 16 bytes.
    Q4_1,
    /// 32 weights: fp16 scale + 4 bytes of high bits + 16 bytes.
    Q5_0,
    /// 32 weights: fp16 scale and min + 4 + 16 bytes.
    Q5_1,
    /// 32 weights: fp16 scale + 32 bytes.
    Q8_0,
    /// 256 weights in 84 bytes.
    Q2K,
    /// 256 weights in 110 bytes.
    Q3K,
    /// 256 weights in 144 bytes.
    Q4K,
    /// 256 weights in 176 bytes.
    Q5K,
    /// 256 weights in 210 bytes.
    Q6K,
}

impl GgmlType {
    /// (bytes per block, weights per block).
    pub fn block(self) -> (u128, u128) {
        match self {
            GgmlType::F32 => (4, 1),
            GgmlType::F16 | GgmlType::Bf16 => (2, 1),
            GgmlType::Q4_0 => (18, 32),
            GgmlType::Q4_1 => (20, 32),
            GgmlType::Q5_0 => (22, 32),
            GgmlType::Q5_1 => (24, 32),
            GgmlType::Q8_0 => (34, 32),
            GgmlType::Q2K => (84, 256),
            GgmlType::Q3K => (110, 256),
            GgmlType::Q4K => (144, 256),
            GgmlType::Q5K => (176, 256),
            GgmlType::Q6K => (210, 256),
        }
    }

    /// Bytes of a `rows × cols` tensor (rows of `cols` contiguous weights).
    pub fn bytes(self, rows: u128, cols: u128) -> u128 {
        let (b, n) = self.block();
        rows * cols.div_ceil(n) * b
    }

    /// llama.cpp's fallback when a row is not a multiple of the block (`llama-quant.cpp`).
    fn fallback(self, cols: u128) -> GgmlType {
        if cols.is_multiple_of(self.block().1) {
            return self;
        }
        let t = match self {
            GgmlType::Q2K | GgmlType::Q3K => GgmlType::Q4_0,
            GgmlType::Q4K => GgmlType::Q5_0,
            GgmlType::Q5K => GgmlType::Q5_1,
            GgmlType::Q6K => GgmlType::Q8_0,
            other => other,
        };
        if cols.is_multiple_of(t.block().1) {
            t
        } else {
            GgmlType::F16
        }
    }
}

/// A llama.cpp file type (`llama-quantize` preset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GgufPreset {
    /// Every matrix in one type.
    Uniform(GgmlType),
    /// Q4_K_M: Q4_K with Q6_K for the output, and for attn_v / ffn_down on "more bits" layers.
    Q4KM,
    /// Q5_K_M: Q5_K with the same Q6_K promotions.
    Q5KM,
}

/// Which tensor of the model a weight is, for GGUF's per-tensor rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// token_embd.
    TokenEmbd,
    /// output (LM head).
    Output,
    /// attn_q / attn_k / attn_output and MLA projections.
    Attn,
    /// attn_k (a separate rule for 8-expert models).
    AttnK,
    /// attn_v.
    AttnV,
    /// fused attn_qkv.
    AttnQkv,
    /// ffn_gate / ffn_up.
    FfnUpGate,
    /// ffn_down.
    FfnDown,
    /// anything else (routers, shared experts).
    Other,
}

/// llama.cpp `use_more_bits` (`llama-quant.cpp`, `llama_tensor_get_type`).
fn use_more_bits(i_layer: u128, n_layers: u128) -> bool {
    // `i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2`; the subtraction only runs when i >= n/8
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

impl GgufPreset {
    /// The type llama.cpp gives a `rows × cols` tensor of `role` in layer `layer` of `n_layers`
    /// (`llama_tensor_get_type`), for the presets modelled here. `n_expert` routes the
    /// 8-expert rules (Mixtral); `is_70b` the attn_v bump of 70B models.
    pub fn tensor_type(
        self,
        role: TensorRole,
        layer: u128,
        n_layers: u128,
        cols: u128,
        n_expert: u128,
        is_70b: bool,
    ) -> GgmlType {
        let base = match self {
            GgufPreset::Uniform(t) => {
                // quantised file types store `output.weight` in Q6_K unless they are Q8_0
                // (llama_tensor_get_type: `else if (new_type != GGML_TYPE_Q8_0) new_type = Q6_K`);
                // F16/BF16/F32 files are not re-typed per tensor
                let quantized = !matches!(
                    t,
                    GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 | GgmlType::Q8_0
                );
                if role == TensorRole::Output && quantized {
                    return GgmlType::Q6K.fallback(cols);
                }
                return t.fallback(cols);
            }
            GgufPreset::Q4KM => GgmlType::Q4K,
            GgufPreset::Q5KM => GgmlType::Q5K,
        };
        let t = match role {
            TensorRole::Output => GgmlType::Q6K,
            TensorRole::AttnV => {
                let mut t = if use_more_bits(layer, n_layers) {
                    GgmlType::Q6K
                } else {
                    base
                };
                if is_70b && t == GgmlType::Q4K {
                    t = GgmlType::Q5K;
                }
                if n_expert == 8 {
                    t = GgmlType::Q8_0;
                }
                t
            }
            TensorRole::AttnK if n_expert == 8 => GgmlType::Q8_0,
            TensorRole::Attn if n_expert == 8 && self == GgufPreset::Q4KM => GgmlType::Q5K,
            TensorRole::AttnQkv => {
                if self == GgufPreset::Q4KM {
                    GgmlType::Q5K
                } else {
                    GgmlType::Q6K
                }
            }
            TensorRole::FfnDown if use_more_bits(layer, n_layers) => GgmlType::Q6K,
            _ => base,
        };
        t.fallback(cols)
    }
}

/// NF4/FP4 block size (bitsandbytes `quantize_4bit` default blocksize=64).
pub const BNB_4BIT_BLOCK: u128 = 64;

/// Bytes of a bitsandbytes 4-bit (NF4/FP4) weight (`functional.py quantize_4bit`): packed
/// nibbles plus one fp32 absmax per 64-block, or with double quantisation
/// (`compress_statistics=True`) one uint8 absmax per block, an fp32 absmax per 256 of those, an
/// fp32 offset, and the 16-entry fp32 code of the QuantState.
pub fn bnb_4bit_bytes(numel: u128, double_quant: bool) -> u128 {
    let blocks = numel.div_ceil(BNB_4BIT_BLOCK);
    if double_quant {
        numel.div_ceil(2) + blocks + blocks.div_ceil(256) * 4 + 4 + 16 * 4
    } else {
        numel.div_ceil(2) + blocks * 4 + 16 * 4
    }
}

/// Bytes of a bitsandbytes LLM.int8 weight (`Int8Params`): int8 values plus one fp32 scale per
/// output row (`SCB`).
pub fn bnb_int8_bytes(rows: u128, cols: u128) -> u128 {
    rows * cols + rows * 4
}

/// Bytes of a GPTQ/AWQ weight `out × in` with `bits`-bit values in groups of `group` input
/// channels (AutoGPTQ/AutoAWQ layouts): packed `qweight`, fp16 `scales` `[in/g, out]`, packed
/// `qzeros` `[in/g, out]`, and for GPTQ the int32 `g_idx` `[in]`.
pub fn grouped_int_bytes(out_f: u128, in_f: u128, bits: u128, group: u128, g_idx: bool) -> u128 {
    let groups = in_f.div_ceil(group.max(1));
    let qweight = (out_f * in_f * bits).div_ceil(8);
    let scales = groups * out_f * 2;
    let qzeros = (groups * out_f * bits).div_ceil(8);
    qweight + scales + qzeros + if g_idx { in_f * 4 } else { 0 }
}

/// Bytes of a block-wise fp8 weight (transformers `FineGrainedFP8`, DeepSeek-V3 format): one
/// byte per weight and an fp32 `weight_scale_inv` per 128×128 block.
pub fn fp8_block_bytes(rows: u128, cols: u128) -> u128 {
    rows * cols + rows.div_ceil(128) * cols.div_ceil(128) * 4
}

/// Bytes of one `out × in` linear weight stored in `format`, for the formats whose layout
/// does not depend on the tensor's place in the model (every format but GGUF presets, whose
/// per-tensor types follow llama.cpp's rules: `None`). `None` also for the unquantised formats
/// (bf16, fp16, fp32: the parameter dtype decides). The layouts are the functions above; a
/// GPTQ `group` of [`crate::workload::GPTQ_PER_COLUMN`] is one group per column (`group_size: -1`).
pub fn linear_bytes(
    format: crate::workload::WeightFormat,
    out_f: u128,
    in_f: u128,
) -> Option<u128> {
    use crate::workload::WeightFormat as F;
    let numel = out_f * in_f;
    Some(match format {
        // MXFP4 quantises only the routed experts (`expert_bytes`)
        F::Bf16 | F::Fp16 | F::Fp32 | F::Gguf(_) | F::Mxfp4 => return None,
        F::Fp8 => fp8_block_bytes(out_f, in_f),
        F::Int8 => bnb_int8_bytes(out_f, in_f),
        F::Nf4 { double_quant } | F::Fp4 { double_quant } => bnb_4bit_bytes(numel, double_quant),
        F::Gptq { bits, group } => {
            grouped_int_bytes(out_f, in_f, u128::from(bits), u128::from(group), true)
        }
        F::Awq { group } => grouped_int_bytes(out_f, in_f, 4, u128::from(group), false),
    })
}

/// Bytes of one routed expert's `out × in` projection in `format`: MXFP4 stores the experts
/// as `*_blocks` `[.., out, in/32, 16]` uint8 (two e2m1 values per byte) and `*_scales`
/// `[.., out, in/32]` uint8 (one e8m0 exponent per 32 values) (transformers
/// integrations/mxfp4.py `_convert_moe_packed_tensors`: `blocks.shape[:-1] == scales.shape`,
/// `Mxfp4GptOssExperts`: `gate_up_proj` `[E, 2I, H // 2]` uint8); other formats as
/// [`linear_bytes`].
pub fn expert_bytes(
    format: crate::workload::WeightFormat,
    out_f: u128,
    in_f: u128,
) -> Option<u128> {
    match format {
        crate::workload::WeightFormat::Mxfp4 => {
            let groups = in_f.div_ceil(32);
            Some(out_f * groups * (16 + 1))
        }
        other => linear_bytes(other, out_f, in_f),
    }
}

/// A checkpoint's weights as stored, read from its files' headers (safetensors or GGUF):
/// the estimate's weights are replaced by these bytes, exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StoredWeights {
    /// Bytes of the tensors under a decoder-layer prefix.
    pub layer_bytes: u64,
    /// Bytes of every other tensor (embeddings, final norm, LM head).
    pub other_bytes: u64,
}

impl StoredWeights {
    /// All tensor bytes.
    pub fn total_bytes(&self) -> u64 {
        self.layer_bytes.saturating_add(self.other_bytes)
    }
}

/// `est` with its weights replaced by a checkpoint's exact tensor bytes. The weights are
/// allocated when the model loads and freed after the run, so they are live at every instant
/// of the timeline: changing their size shifts every instant, the peak and the prefill peak
/// alike, by the same amount, and the peak stays where it was. (The caching allocator's
/// rounding of each tensor to 512 bytes is not added: the result is the files' bytes.)
pub fn with_stored_weights(
    mut est: crate::memory::InferEstimate,
    stored: StoredWeights,
) -> crate::memory::InferEstimate {
    use crate::memory::Category;
    let new = stored.total_bytes();
    let old = est.weights_bytes;
    let shift = |v: u64| v.saturating_sub(old).saturating_add(new);
    est.peak_bytes = shift(est.peak_bytes);
    est.prefill_peak_bytes = shift(est.prefill_peak_bytes);
    for (c, b) in &mut est.at_peak {
        if *c == Category::Weights {
            *b = new;
        }
    }
    est.weights_bytes = new;
    est
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mxfp4_experts_are_4_25_bits_and_linears_stay_unquantised() {
        use crate::workload::WeightFormat;
        // gpt-oss-20b gate_up_proj of one expert: [2·2880, 2880] → blocks [5760, 90, 16] +
        // scales [5760, 90] uint8
        assert_eq!(
            expert_bytes(WeightFormat::Mxfp4, 5760, 2880),
            Some(5760 * 90 * 17)
        );
        assert_eq!(linear_bytes(WeightFormat::Mxfp4, 5760, 2880), None);
        assert_eq!(
            expert_bytes(WeightFormat::Fp8, 256, 256),
            linear_bytes(WeightFormat::Fp8, 256, 256)
        );
    }

    #[test]
    fn ggml_block_sizes_give_the_published_bits_per_weight() {
        let bpw = |t: GgmlType| t.bytes(1, 256 * 32) as f64 * 8.0 / (256.0 * 32.0);
        assert_eq!(bpw(GgmlType::Q4_0), 4.5);
        assert_eq!(bpw(GgmlType::Q8_0), 8.5);
        assert_eq!(bpw(GgmlType::Q4K), 4.5);
        assert_eq!(bpw(GgmlType::Q5K), 5.5);
        assert_eq!(bpw(GgmlType::Q6K), 6.5625);
        assert_eq!(bpw(GgmlType::Q2K), 2.625);
    }

    #[test]
    fn more_bits_layers_follow_llama_cpp() {
        // 32 layers: the first 4, the last 4 and every third in between from layer 6
        let more: Vec<u128> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        assert_eq!(
            more,
            vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
    }

    #[test]
    fn nf4_with_double_quant_is_about_4_127_bits() {
        let n = 4096u128 * 4096;
        let bits = bnb_4bit_bytes(n, true) as f64 * 8.0 / n as f64;
        assert!((bits - 4.127).abs() < 0.01, "{bits}");
        let plain = bnb_4bit_bytes(n, false) as f64 * 8.0 / n as f64;
        assert!((plain - 4.5).abs() < 0.01, "{plain}");
    }

    #[test]
    fn stored_weights_shift_every_instant_by_the_same_bytes() {
        use crate::memory::{simulate_infer, Category, Kernels};
        use crate::workload::{AttentionImpl, InferWorkload, KvDtype, WeightFormat};
        let w = InferWorkload {
            batch: 1,
            prompt: 64,
            new_tokens: 2,
            attention: AttentionImpl::Sdpa,
            weights: WeightFormat::Bf16,
            kv_dtype: KvDtype::Auto,
            moe_decode_batched: true,
        };
        let est = simulate_infer(&crate::model::tests::llama2_7b(), &w, Kernels::Cpu).unwrap();
        let stored = StoredWeights {
            layer_bytes: 1_000_000_000,
            other_bytes: 234,
        };
        let out = with_stored_weights(est.clone(), stored);
        assert_eq!(out.weights_bytes, 1_000_000_234);
        let d = |a: u64, b: u64| i128::from(a) - i128::from(b);
        let shift = d(out.weights_bytes, est.weights_bytes);
        assert_eq!(d(out.peak_bytes, est.peak_bytes), shift);
        assert_eq!(d(out.prefill_peak_bytes, est.prefill_peak_bytes), shift);
        let at = |e: &crate::memory::InferEstimate| e.at_peak.iter().map(|x| x.1).sum::<u64>();
        assert_eq!(at(&out), out.peak_bytes);
        assert!(out
            .at_peak
            .iter()
            .any(|(c, b)| *c == Category::Weights && *b == 1_000_000_234));
    }

    #[test]
    fn linear_bytes_leave_float_and_gguf_formats_to_the_caller() {
        use crate::workload::WeightFormat as F;
        assert_eq!(linear_bytes(F::Bf16, 8, 8), None);
        assert_eq!(linear_bytes(F::Gguf(GgufPreset::Q4KM), 8, 8), None);
        assert_eq!(linear_bytes(F::Fp8, 256, 256), Some(256 * 256 + 4 * 4));
        // per-column GPTQ: one group per column
        let per_col = F::Gptq {
            bits: 4,
            group: crate::workload::GPTQ_PER_COLUMN,
        };
        assert_eq!(
            linear_bytes(per_col, 4096, 4096),
            Some(grouped_int_bytes(4096, 4096, 4, 4096, true))
        );
    }

    #[test]
    fn gptq_4bit_group_128() {
        // 4096×4096: 8 MiB qweight + 32×4096×2 scales + 32×4096/2 qzeros + 4096×4 g_idx
        assert_eq!(
            grouped_int_bytes(4096, 4096, 4, 128, true),
            8 * 1024 * 1024 + 262_144 + 65_536 + 16_384
        );
    }
}

#[cfg(test)]
mod names {
    use crate::workload::WeightFormat;

    #[test]
    fn every_name_round_trips() {
        for n in [
            "bf16",
            "fp16",
            "fp32",
            "fp8",
            "int8",
            "nf4",
            "nf4-dq",
            "fp4",
            "fp4-dq",
            "gptq-int4-g128",
            "gptq-int3-g64",
            "gptq-int4-per-column",
            "awq-int4-g128",
            "gguf-q4_k_m",
            "gguf-q5_k_m",
            "gguf-q8_0",
            "gguf-q6_k",
            "gguf-q2_k",
            "gguf-f16",
        ] {
            assert_eq!(WeightFormat::parse(n).unwrap().name(), n);
        }
    }
}
