//! Which weight format an estimate uses, and where the weight bytes come from.
//!
//! Precedence: an explicit `--weights` (or `serve --quantization`), then the checkpoint's
//! headers (exact tensor bytes), then the config's `quantization_config` (its format, with the
//! library's rules for which modules stay unquantised), then bf16. The output says which.

use crate::error::UserError;
use crate::model_source::ModelSource;
use anyhow::Result;
use memwall_core::model::{LinearRole, Mlp, ModelDesc};
use memwall_core::quant::{self, StoredWeights};
use memwall_core::workload::{WeightFormat, GPTQ_PER_COLUMN};
use memwall_core::Bytes;
use memwall_formats::quant_config::{QuantCoverage, QuantMethod};
use memwall_formats::QuantConfig;

/// The weights an estimate uses.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightsChoice {
    /// The format simulated (per-tensor layouts, dequantisation, compute dtype).
    pub format: WeightFormat,
    /// Exact bytes that replace the simulated weights, when known: a checkpoint's tensor
    /// bytes, or the simulated bytes corrected for modules the quantisation config leaves
    /// unquantised (`Correction`).
    pub bytes: WeightBytes,
    /// Where the weights come from, in words, safe to show.
    pub from: String,
}

/// What decides the weight bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WeightBytes {
    /// The simulated format, as is.
    Simulated,
    /// A checkpoint's tensors, exactly.
    Stored(StoredWeights),
    /// The simulated format plus this many bytes (signed): modules a quantisation config
    /// treats differently from memwall's default scope (every decoder linear and expert).
    Correction(i128),
}

/// The nearest memwall format for a quantisation config that has no exact one, with what is
/// approximated (`None` when nothing fits).
fn nearest(q: &QuantConfig) -> Option<(WeightFormat, &'static str)> {
    if let Some(f) = q.weight_format() {
        return Some((f, ""));
    }
    match q.method() {
        QuantMethod::Fp8 { .. } => Some((
            WeightFormat::Fp8,
            "per-tensor fp8 sized as 128×128-block fp8 (the scales differ by < 0.01%)",
        )),
        QuantMethod::Gptq {
            bits,
            group_size: None,
            ..
        } => Some((
            WeightFormat::Gptq {
                bits: u32::try_from(*bits).ok()?,
                group: GPTQ_PER_COLUMN,
            },
            "",
        )),
        QuantMethod::Awq { group_size, .. } => Some((
            WeightFormat::Awq {
                group: u32::try_from(*group_size).ok()?,
            },
            "AWQ sized in the GEMM layout (other kernel layouts pack the same bits)",
        )),
        QuantMethod::CompressedTensors { schemes, .. } => match schemes.as_slice() {
            [s] if s.kind == "float" && s.num_bits == 8 => Some((
                WeightFormat::Fp8,
                "compressed-tensors fp8 sized as 128×128-block fp8 (the scales differ by < 0.01%)",
            )),
            [s] if s.kind == "int" && matches!(s.num_bits, 4 | 8) => Some((
                WeightFormat::Gptq {
                    bits: u32::try_from(s.num_bits).ok()?,
                    group: s
                        .group_size
                        .and_then(|g| u32::try_from(g).ok())
                        .unwrap_or(GPTQ_PER_COLUMN),
                },
                "compressed-tensors packed integers sized as GPTQ (packed weight, scales, zeros)",
            )),
            _ => None,
        },
        _ => None,
    }
}

/// Bytes of `out × in` in `f`, or in bf16 when `f` keeps it unquantised.
fn linear(f: WeightFormat, out_f: u64, in_f: u64) -> (u128, u128) {
    let (o, i) = (u128::from(out_f), u128::from(in_f));
    let plain = o * i * 2;
    (plain, quant::linear_bytes(f, o, i).unwrap_or(plain))
}

/// Bytes by which `coverage` differs from memwall's default scope (every decoder linear,
/// shared expert and routed expert quantised; LM head, embeddings and routers not).
fn coverage_correction(desc: &ModelDesc, f: WeightFormat, cov: &QuantCoverage) -> i128 {
    let h = desc.hidden_size;
    let mut delta: i128 = 0;
    // a module the config keeps in bf16 costs plain − packed more than simulated
    let mut unquantised = |(plain, packed): (u128, u128), copies: u64| {
        delta += (plain as i128 - packed as i128) * i128::from(copies);
    };
    for (l, c) in desc.layers.iter().zip(&cov.layers) {
        let role_off = |list: &[(LinearRole, bool)], role: LinearRole| {
            list.iter().any(|(r, q)| *r == role && !q)
        };
        for s in l.attention.linears(h) {
            if role_off(&c.attention, s.role) {
                unquantised(linear(f, s.out_features, s.in_features), 1);
            }
        }
        match &l.mlp {
            Mlp::None => {}
            Mlp::Dense(d) => {
                for s in d.linears(h) {
                    if role_off(&c.mlp, s.role) {
                        unquantised(linear(f, s.out_features, s.in_features), 1);
                    }
                }
            }
            Mlp::Moe(m) => {
                if c.experts == Some(false) {
                    let i = m.expert.intermediate;
                    let ins = if m.expert.gated { 2 } else { 1 };
                    unquantised(linear(f, i, h), m.num_experts * ins);
                    unquantised(linear(f, h, i), m.num_experts);
                }
                if let (Some(sh), Some(false)) = (&m.shared, c.shared_experts) {
                    for s in sh.linears(h) {
                        unquantised(linear(f, s.out_features, s.in_features), 1);
                    }
                }
            }
        }
    }
    if cov.lm_head {
        let (plain, packed) = linear(f, desc.embeddings.vocab_size, desc.embeddings.dim);
        delta -= plain as i128 - packed as i128;
    }
    delta
}

/// Chooses the weights for `model`, `explicit` being `--weights` when given.
pub fn choose(model: &ModelSource, explicit: Option<WeightFormat>) -> Result<WeightsChoice> {
    let described = || -> Option<String> {
        if let Some(c) = &model.checkpoint {
            Some(format!("the checkpoint's {}", c.storage))
        } else {
            model
                .quant
                .as_ref()
                .map(|q| format!("the quantization_config's {}", q.describe()))
        }
    };
    if let Some(f) = explicit {
        let from = match described() {
            Some(d) => format!("--weights {} (overrides {d})", f.name()),
            None => format!("--weights {}", f.name()),
        };
        return Ok(WeightsChoice {
            format: f,
            bytes: WeightBytes::Simulated,
            from,
        });
    }
    if let Some(c) = &model.checkpoint {
        let format = c
            .format_equivalent
            .or_else(|| model.quant.as_ref().and_then(|q| nearest(q).map(|n| n.0)))
            .unwrap_or(WeightFormat::Bf16);
        return Ok(WeightsChoice {
            format,
            bytes: WeightBytes::Stored(c.stored),
            from: format!(
                "checkpoint headers ({} {} file(s), {}): {} exactly{}",
                c.files,
                c.format,
                c.storage,
                Bytes(c.stored.total_bytes()),
                if c.extra_layers > 0 {
                    format!(
                        " (incl. {} layer(s) transformers does not load)",
                        c.extra_layers
                    )
                } else {
                    String::new()
                }
            ),
        });
    }
    if let Some(q) = &model.quant {
        let Some((format, note)) = nearest(q) else {
            return Err(UserError::new(
                format!(
                    "cannot size the quantization_config ({}) of {} without its checkpoint",
                    q.describe(),
                    model.label
                ),
                "pass the model directory with its .safetensors files (their headers give the exact bytes), or choose a format with --weights",
            )
            .into());
        };
        let cov = q.coverage(&model.desc);
        let correction = coverage_correction(&model.desc, format, &cov);
        let skipped = q.skipped_patterns();
        let mut from = format!(
            "the config's quantization_config: {} → {}",
            q.describe(),
            format.name()
        );
        if !note.is_empty() {
            from.push_str(&format!(" ({note})"));
        }
        if !skipped.is_empty() {
            from.push_str(&format!(
                "; unquantised: {}",
                skipped
                    .iter()
                    .map(|s| memwall_core::error::untrusted(s))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        return Ok(WeightsChoice {
            format,
            bytes: if correction == 0 {
                WeightBytes::Simulated
            } else {
                WeightBytes::Correction(correction)
            },
            from,
        });
    }
    Ok(WeightsChoice {
        format: WeightFormat::Bf16,
        bytes: WeightBytes::Simulated,
        from: "bf16 (the default: no --weights, no checkpoint files, no quantization_config)"
            .into(),
    })
}

/// `est` with the weight bytes `choice` decides.
pub fn apply(
    est: memwall_core::memory::InferEstimate,
    choice: &WeightsChoice,
) -> memwall_core::memory::InferEstimate {
    match choice.bytes {
        WeightBytes::Simulated => est,
        WeightBytes::Stored(s) => quant::with_stored_weights(est, s),
        WeightBytes::Correction(d) => {
            let total = (i128::from(est.weights_bytes) + d).max(0);
            let total = u64::try_from(total).unwrap_or(u64::MAX);
            quant::with_stored_weights(
                est,
                StoredWeights {
                    layer_bytes: total,
                    other_bytes: 0,
                },
            )
        }
    }
}

/// The `quant_method` of a config, as vLLM names it.
fn vllm_method(q: &QuantConfig) -> &'static str {
    match q.method() {
        QuantMethod::Fp8 { .. } => "fp8",
        QuantMethod::Gptq { .. } => "gptq",
        QuantMethod::Awq { .. } => "awq",
        QuantMethod::Bnb4 { .. } | QuantMethod::Bnb8 => "bitsandbytes",
        QuantMethod::CompressedTensors { .. } => "compressed-tensors",
        QuantMethod::Mxfp4 => "mxfp4",
    }
}

/// The weights of a vLLM deployment (vLLM 0.33): `--weights` (a memwall what-if) first; then
/// `--quantization`, which must name the checkpoint's own method when the config has one
/// (`ModelConfig._verify_quantization`) or an online method for an unquantised checkpoint;
/// then the checkpoint's headers, its `quantization_config`, or the checkpoint dtype.
pub fn choose_serve(
    model: &ModelSource,
    quantization: Option<&str>,
    explicit: Option<WeightFormat>,
) -> Result<(memwall_core::serve::ServeWeights, String)> {
    use memwall_core::serve::ServeWeights;
    if let Some(f) = explicit {
        let w = match f {
            WeightFormat::Bf16 | WeightFormat::Fp16 | WeightFormat::Fp32 => ServeWeights::Dtype,
            other => ServeWeights::Format(other),
        };
        return Ok((
            w,
            format!(
                "--weights {} (a what-if; overrides the checkpoint)",
                f.name()
            ),
        ));
    }
    let own = model.quant.as_ref().map(vllm_method);
    if let Some(m) = quantization {
        let m = m.trim().to_ascii_lowercase();
        let shown = memwall_core::error::untrusted(&m);
        match own {
            Some(own) => {
                let same = m == own
                    || (own == "gptq" && matches!(m.as_str(), "gptq_marlin" | "auto_gptq"))
                    || (own == "awq" && matches!(m.as_str(), "awq_marlin" | "auto_awq"));
                if !same {
                    return Err(UserError::flag(
                        "--quantization",
                        &m,
                        format!("the checkpoint is quantised with {own}, and vLLM refuses a different method (ModelConfig._verify_quantization)"),
                        format!("drop --quantization (vLLM reads {own} from the config), or use --weights for a what-if"),
                    )
                    .into());
                }
            }
            None => {
                if matches!(
                    m.as_str(),
                    "fp8_per_tensor" | "fp8_per_block" | "fp8_per_channel"
                ) {
                    return Ok((
                        ServeWeights::Format(WeightFormat::Fp8),
                        format!("--quantization {shown}: vLLM quantises the bf16 weights to fp8 online (quantization/online/fp8.py)"),
                    ));
                }
                let hint = if m == "fp8" {
                    "vLLM 0.33's `fp8` method reads fp8 checkpoints only (quantization/fp8.py l.106): use --quantization fp8_per_tensor or fp8_per_block to quantise a bf16 checkpoint online"
                } else {
                    "this method loads checkpoints quantised with it: pass such a checkpoint (its config names the method), or use --weights for a what-if"
                };
                return Err(UserError::flag(
                    "--quantization",
                    &m,
                    "the checkpoint has no quantization_config",
                    hint,
                )
                .into());
            }
        }
    }
    if own == Some("bitsandbytes") {
        return Err(UserError::new(
            format!(
                "vLLM 0.33 cannot serve {}: its quantization_config is bitsandbytes, which vLLM 0.33 no longer lists (QuantizationMethods in quantization/__init__.py)",
                model.label
            ),
            "serve a GPTQ, AWQ or fp8 checkpoint of the model, or size a what-if with --weights nf4",
        )
        .into());
    }
    if let Some(c) = &model.checkpoint {
        return Ok((
            ServeWeights::Stored(c.stored),
            format!(
                "checkpoint headers ({} {} file(s), {}): {} exactly, split over the ranks",
                c.files,
                c.format,
                c.storage,
                Bytes(c.stored.total_bytes())
            ),
        ));
    }
    if let Some(q) = &model.quant {
        if let Some((f, note)) = nearest(q) {
            let mut from = format!(
                "the config's quantization_config: {} → {}",
                q.describe(),
                f.name()
            );
            if !note.is_empty() {
                from.push_str(&format!(" ({note})"));
            }
            return Ok((ServeWeights::Format(f), from));
        }
        return Err(UserError::new(
            format!(
                "cannot size the quantization_config ({}) of {} without its checkpoint",
                q.describe(),
                model.label
            ),
            "pass the model directory with its .safetensors files, or choose a format with --weights",
        )
        .into());
    }
    Ok((
        ServeWeights::Dtype,
        "the checkpoint dtype (bf16/fp16): no quantization_config".into(),
    ))
}

/// Whether the checkpoint is bitsandbytes 4-bit (its config says so).
pub fn is_bnb_4bit(model: &ModelSource) -> bool {
    model
        .quant
        .as_ref()
        .is_some_and(|q| matches!(q.method(), QuantMethod::Bnb4 { .. }))
}

/// Training a quantised checkpoint with `--runtime torchtitan`: torchtitan trains fp32 master
/// weights loaded through its state-dict adapters, and only DeepSeek-V3's dequantises a
/// quantised HF checkpoint (torchtitan 0.3.0 `models/deepseek_v3/state_dict_adapter.py`
/// `from_hf`: "When loading from HF checkpoint, dequantize the weights from float8 to
/// float32"), so DeepSeek-V3's block-wise fp8 checkpoint trains as its unquantised model;
/// every other quantised checkpoint is refused by name.
pub fn check_trainable_titan(model: &ModelSource) -> Result<()> {
    let Some(q) = &model.quant else {
        return Ok(());
    };
    if model.desc.model_type == "deepseek_v3" && matches!(q.method(), QuantMethod::Fp8 { .. }) {
        return Ok(());
    }
    Err(UserError::new(
        format!(
            "{} is quantised ({}), and torchtitan 0.3.0 dequantises only DeepSeek-V3's fp8 checkpoints when it loads HF weights",
            model.label,
            q.describe()
        ),
        "train the unquantised checkpoint with --runtime torchtitan, or drop --runtime torchtitan",
    )
    .into())
}

/// Training a quantised checkpoint: transformers refuses to fine-tune a purely quantised
/// model (`Trainer.__init__`: "You cannot perform fine-tuning on purely quantized models.
/// Please attach trainable adapters"); with LoRA adapters memwall models the frozen base as
/// QLoRA's NF4 (bitsandbytes 4-bit checkpoints); other quantised bases are refused rather
/// than sized as bf16, except MXFP4, which transformers dequantises for training.
pub fn check_trainable(
    model: &ModelSource,
    lora: Option<&memwall_core::workload::Lora>,
) -> Result<()> {
    let Some(q) = &model.quant else {
        return Ok(());
    };
    // MXFP4 (gpt-oss): transformers trains the dequantised bf16 model
    // (quantizers/quantizer_mxfp4.py `is_trainable`: "please consider dequantizing the model
    // first by passing quantization_config=Mxfp4Config(dequantize=True)"), which is what the
    // training estimate sizes (the precision's dtype), with or without LoRA.
    if matches!(q.method(), QuantMethod::Mxfp4) {
        return Ok(());
    }
    if lora.is_none() {
        return Err(UserError::new(
            format!(
                "{} is quantised ({}), and transformers refuses to fine-tune a purely quantised model",
                model.label,
                q.describe()
            ),
            "train LoRA adapters on it (--lora-rank R --lora-targets …; a bitsandbytes 4-bit base is QLoRA), or train the unquantised checkpoint",
        )
        .into());
    }
    if !is_bnb_4bit(model) {
        return Err(UserError::new(
            format!(
                "LoRA on a {} base is not modelled: memwall models a frozen quantised base as QLoRA's bitsandbytes NF4",
                q.describe()
            ),
            "train on the unquantised checkpoint with --qlora (NF4 base), or estimate inference with `memwall infer`",
        )
        .into());
    }
    Ok(())
}
