//! Memory simulation: a step replayed as an allocation timeline.
//!
//! The peak is the maximum of live bytes over the timeline, and the breakdown is taken at that
//! instant — never a sum of per-component maxima.

pub mod dist;
mod dist_types;
pub mod fast;
mod hf;
mod megatron;
mod ranks;
pub mod timeline;
pub mod titan;

pub use crate::workload::InferWorkload;
pub use dist::{simulate_train_dist, simulate_train_dist_with, DistOptions};
pub use hf::{image_grid, Kernels};
pub use ranks::{CommBuffer, DistEstimate, RankGroup, RankSet};
pub use timeline::{Category, Phase};

use crate::engine::Engine;
use crate::error::CoreError;
use crate::model::ModelDesc;
use crate::workload::TrainWorkload;
use serde::Serialize;

/// Result of simulating one steady-state training step on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainEstimate {
    /// Whose runtime is simulated ([`Engine::Hf`]; its `name()` is the runtime profile).
    pub engine: Engine,
    /// Peak bytes PyTorch's allocator holds during the step.
    pub peak_bytes: u64,
    /// What is alive at the peak, by category (sums to `peak_bytes`).
    pub at_peak: Vec<(Category, u64)>,
    /// Phase in which the peak occurs.
    pub phase: Phase,
    /// Peak live bytes within each phase of the step (forward, loss, backward, optimizer), the
    /// same reading of the timeline as a distributed rank's (`RankGroup::phase_peaks`).
    pub phase_peaks: Vec<(Phase, u64)>,
    /// All parameters.
    pub params_total: u64,
    /// Trainable parameters.
    pub params_trainable: u64,
    /// Activation offloading (`--activation-offload`): the most host bytes the packed saved
    /// tensors hold at once, also the bytes each micro-batch copies to the host and back.
    #[serde(skip_serializing_if = "is_zero")]
    pub host_offload_bytes: u64,
}

impl TrainEstimate {
    /// The highest live bytes within `phase` (`None` for a phase the step does not run).
    pub fn phase_peak(&self, phase: Phase) -> Option<u64> {
        ranks::peak_in(&self.phase_peaks, phase)
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn to_u64(v: u128, what: &'static str) -> Result<u64, CoreError> {
    u64::try_from(v).map_err(|_| CoreError::Overflow { what })
}

/// What is alive at the timeline's peak, by category, in [`Category::ALL`] order.
fn breakdown_at_peak(t: &timeline::Timeline) -> Result<Vec<(Category, u64)>, CoreError> {
    breakdown(t.peak_breakdown())
}

/// A breakdown in [`Category::ALL`] order as the reports carry it.
fn breakdown(at: [u128; 9]) -> Result<Vec<(Category, u64)>, CoreError> {
    Category::ALL
        .iter()
        .zip(at)
        .map(|(c, v)| Ok((*c, to_u64(v, "breakdown")?)))
        .collect()
}

/// The peak of each phase of a training step, in step order.
fn train_phase_peaks(t: &timeline::Timeline) -> Result<Vec<(Phase, u64)>, CoreError> {
    [
        Phase::Forward,
        Phase::Loss,
        Phase::Backward,
        Phase::Optimizer,
    ]
    .iter()
    .map(|p| Ok((*p, to_u64(t.phase_peak(*p), "phase peak")?)))
    .collect()
}

/// Simulates a steady-state (second) training step on one GPU ([`Engine::Hf`]).
pub fn simulate_train(
    model: &ModelDesc,
    w: &TrainWorkload,
    kernels: Kernels,
) -> Result<TrainEstimate, CoreError> {
    let engine = check_train(model, w)?;
    run_train(model, w, kernels, engine)
}

/// What every single-GPU training estimate checks first; the engine that runs it.
pub(crate) fn check_train(model: &ModelDesc, w: &TrainWorkload) -> Result<Engine, CoreError> {
    w.validate()?;
    let engine = Engine::resolve(None);
    engine.check(w, None)?;
    check_hf_step(model, w, false)?;
    if model.layers.is_empty() {
        return Err(CoreError::invalid(
            "num_hidden_layers",
            "the model has no layers",
        ));
    }
    Ok(engine)
}

/// What transformers' training step of `model` under `w` must satisfy to run, on one GPU or
/// on each rank of a data-parallel step (`distributed`): the same model code runs either way,
/// so both estimates refuse the same workloads by name.
pub(crate) fn check_hf_step(
    model: &ModelDesc,
    w: &TrainWorkload,
    distributed: bool,
) -> Result<(), CoreError> {
    check_step_options(model, w, distributed)?;
    check_lora_targets(model, w)?;
    let builds_cache = !w.checkpointing
        && !w.kernels.padding_free
        && w.step_options.use_cache.unwrap_or(model.use_cache);
    check_jamba_cache(model, builds_cache, true)
}

/// The checks every engine's step makes of the workload's options against the model (kernels,
/// checkpointing policy, attention, autocast, image checkpointing); [`check_hf_step`] adds
/// those of transformers' model code.
pub(crate) fn check_step_options(
    model: &ModelDesc,
    w: &TrainWorkload,
    distributed: bool,
) -> Result<(), CoreError> {
    crate::liger::check(model, w)?;
    crate::memory::hf::sac_check(model, w)?;
    check_attention(model, w.attention)?;
    check_autocast(model, w.precision)?;
    check_image_checkpointing(model, w, distributed)
}

/// The reference replay of a checked single-GPU training step.
fn run_train(
    model: &ModelDesc,
    w: &TrainWorkload,
    kernels: Kernels,
    engine: Engine,
) -> Result<TrainEstimate, CoreError> {
    let mut b = hf::Builder::train(model, w, kernels, None);
    b.run();
    let t = &b.t;
    let at_peak = breakdown_at_peak(t)?;
    Ok(TrainEstimate {
        engine,
        peak_bytes: to_u64(t.peak(), "peak bytes")?,
        at_peak,
        phase: t.peak_phase(),
        phase_peaks: train_phase_peaks(t)?,
        params_total: to_u64(b.param_count, "parameters")?,
        params_trainable: to_u64(b.trainable_count(), "trainable parameters")?,
        host_offload_bytes: to_u64(t.host.peak, "host offload bytes")?,
    })
}

/// Result of simulating an inference run on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InferEstimate {
    /// Whose runtime is simulated ([`Engine::Hf`]: transformers' `generate`).
    pub engine: Engine,
    /// Peak bytes PyTorch's allocator holds.
    pub peak_bytes: u64,
    /// What is alive at the peak, by category (sums to `peak_bytes`).
    pub at_peak: Vec<(Category, u64)>,
    /// Phase of the peak (prefill or decode).
    pub phase: Phase,
    /// All parameters.
    pub params_total: u64,
    /// Bytes of the weights.
    pub weights_bytes: u64,
    /// Bytes of the KV cache at its largest (after the last step).
    pub kv_cache_bytes: u64,
    /// Peak of the prefill alone.
    pub prefill_peak_bytes: u64,
}

/// Simulates `generate`-style inference on one GPU ([`Engine::Hf`]).
pub fn simulate_infer(
    model: &ModelDesc,
    w: &crate::workload::InferWorkload,
    kernels: Kernels,
) -> Result<InferEstimate, CoreError> {
    check_infer(model, w)?;
    run_infer(model, w, kernels)
}

/// Autocast (`amp-*`) over a Mamba-2 mixer whose projections are 16-bit and that has no gated
/// norm (`scan_output * silu(gate)` in 16 bits): no released model has one and it is not
/// measured, so it is refused. The measured autocast forms (`hf/ssm.rs`) are Falcon-H1's
/// (`Scan::saved_amp`, fp32 `zxbcdt` through the `mup_vector`) and `Mamba2Mixer`'s
/// (`Scan::saved_amp16`: Mamba-2 / Codestral, Granite 4.0-H, Bamba), 1 or more chunks.
pub(crate) fn check_autocast(
    model: &ModelDesc,
    precision: crate::Precision,
) -> Result<(), CoreError> {
    if !precision.autocast() {
        return Ok(());
    }
    let unmodelled = model
        .layers
        .iter()
        .filter_map(|l| l.mamba2().filter(|_| !l.muls.ssm_proj))
        .any(|m| !m.gated_norm);
    if unmodelled {
        return Err(CoreError::invalid_value(
            "precision",
            precision.name(),
            format!(
                "`{}` has Mamba-2 mixers with 16-bit projections and no gated norm (`scan_output * silu(gate)`); their chunked scan under autocast is not measured",
                crate::error::untrusted(&model.model_type)
            ),
            "use --precision bf16 or fp32 (both measured)",
        ));
    }
    Ok(())
}

/// A hybrid model whose layers are all linear-attention / Mamba layers cannot run a forward
/// that builds a cache: its `*Model.forward` asks the `DynamicCache` for `get_seq_length()`
/// (`past_seen_tokens = past_key_values.get_seq_length()`), which raises `ValueError` when the
/// cache holds only linear-attention layers (transformers 5.23 cache_utils.py
/// `DynamicCache.get_seq_length`; models/jamba, qwen3_next and granitemoehybrid
/// `modeling_*.py`). Measured: the harness's Jamba and Qwen3-Next steps without checkpointing
/// and Jamba's `generate` fail, checkpointed steps (HF turns the cache off) run. Training with
/// checkpointing or `use_cache` off does not build one. Mamba-2 keeps its own cache class.
/// `training`: the hint names the training workarounds; `generate` always builds the cache.
fn check_jamba_cache(
    model: &ModelDesc,
    builds_cache: bool,
    training: bool,
) -> Result<(), CoreError> {
    let field = match model.model_type.as_str() {
        "jamba" => "attn_layer_offset",
        "qwen3_next" | "granitemoehybrid" => "layer_types",
        _ => return Ok(()),
    };
    if !builds_cache || model.layers.iter().any(|l| l.attention_block().is_some()) {
        return Ok(());
    }
    Err(CoreError::invalid_value(
        field,
        format!("no attention layer in {} layers", model.layers.len()),
        format!(
            "transformers' `{}` cannot build a cache without an attention layer (`get_seq_length` raises), so this forward does not run",
            crate::error::untrusted(&model.model_type)
        ),
        if training {
            "train with --checkpointing or --use-cache false (no cache is built), or give the model an attention layer"
        } else {
            "generate always builds the cache: give the model an attention layer"
        },
    ))
}

/// The model types transformers 5.23 converts from v4 MoE checkpoints like Qwen2-MoE
/// (`conversion_mapping._MODEL_TO_CONVERSION_PATTERN` → `"qwen2_moe"`), the memwall families
/// among them.
const PEFT_MOE_CONVERTED: [&str; 7] = [
    "qwen2_moe",
    "qwen3_moe",
    "qwen3_next",
    "deepseek_v3",
    "olmoe",
    "ernie4_5_moe",
    "hunyuan_v1_moe",
];

/// The LoRA target names peft 0.21.2 maps onto the routed experts' fused parameters in those
/// families (`utils/transformers_weight_conversion.py` `_MOE_TARGET_MODULE_MAPPING["qwen2_moe"]`).
const PEFT_MOE_EXPERT_NAMES: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// LoRA on the experts is refused: in the families above, peft 0.21.2
/// (`_convert_peft_config_moe`) turns the target names `gate_proj` / `up_proj` / `down_proj`
/// into adapters on `experts.gate_up_proj` / `experts.down_proj` (`target_parameters`, rank r·E
/// for the fused pair) and no longer adapts the dense or shared MLP's `nn.Linear` of that name
/// (measured on HunYuan MoE and ERNIE 4.5 MoE); those adapters are not modelled. Names that
/// match nothing are ignored, as peft ignores them while another target matches.
pub(crate) fn check_lora_targets(model: &ModelDesc, w: &TrainWorkload) -> Result<(), CoreError> {
    let Some(lora) = &w.lora else {
        return Ok(());
    };
    let mt = model.model_type.as_str();
    // peft 0.21.2 `BaseTuner.inject_adapter` (tuners/tuners_utils.py) raises
    // `NoMatchingPeftModuleError` when no module of the model matches `target_modules`
    // (measured: rdist137-018-mamba2 with the attention / MLP names, which Mamba-2 lacks)
    let vision_names = model
        .vision
        .iter()
        .flat_map(|v| v.linears.iter().map(|l| l.name));
    let known = |t: &str| {
        model.linear_names.iter().any(|(_, n)| n == t) || vision_names.clone().any(|n| n == t)
    };
    // (a description that names none of its linears, as hand-built test models, is not judged)
    if !model.linear_names.is_empty() && !lora.targets.iter().any(|t| known(t)) {
        let names: Vec<&str> = model.linear_names.iter().map(|(_, n)| n.as_str()).collect();
        return Err(CoreError::invalid_value(
            "lora_targets",
            lora.targets.join(","),
            format!(
                "no module of `{}` is named by these targets (peft raises NoMatchingPeftModuleError)",
                crate::error::untrusted(mt)
            ),
            format!("target some of {}", names.join(", ")),
        ));
    }
    // peft 0.21.2 `_check_lora_target_modules_mamba` (tuners/tuners_utils.py) raises for these
    // targets of "Mamba-based" model types; Mamba-1's `x_proj` / `dt_proj` (Mamba, Jamba) run
    // inside the scan composite (hf/mamba1.rs), where adapters are not modelled
    let unmodelled: &[(&[&str], &[&str], &str)] = &[
        (
            &["falcon_h1", "mamba", "mamba2"],
            &["out_proj", "conv1d"],
            "peft refuses it for Mamba-based models (\"incompatible with Mamba-based models\")",
        ),
        (
            &["mamba", "jamba"],
            &["x_proj", "dt_proj"],
            "it runs inside the Mamba-1 scan, where adapters are not modelled",
        ),
    ];
    for (types, names, why) in unmodelled {
        if !types.contains(&mt) {
            continue;
        }
        if let Some(bad) = lora.targets.iter().find(|t| names.contains(&t.as_str())) {
            return Err(CoreError::invalid_value(
                "lora_targets",
                crate::error::untrusted(bad),
                format!(
                    "LoRA on `{}` of `{}`: {why}",
                    crate::error::untrusted(bad),
                    crate::error::untrusted(mt)
                ),
                "target in_proj and the attention / MLP projections",
            ));
        }
    }
    match lora
        .targets
        .iter()
        .find_map(|t| expert_target_refusal(model, t))
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The refusal of LoRA target `target` on the routed experts of a family peft converts
/// (`PEFT_MOE_CONVERTED`; see `check_lora_targets`), if it is one. The CLI consults it
/// before its own "not a linear layer" check: those names are `nn.Linear`s of the dense or
/// shared MLP, so the true reason is the experts'.
pub fn expert_target_refusal(model: &ModelDesc, target: &str) -> Option<CoreError> {
    let mt = model.model_type.as_str();
    if !PEFT_MOE_CONVERTED.contains(&mt) || !PEFT_MOE_EXPERT_NAMES.contains(&target) {
        return None;
    }
    Some(CoreError::invalid_value(
        "lora_targets",
        crate::error::untrusted(target),
        format!(
            "in `{}` peft adapts the routed experts' fused parameters for `{}` (transformers converts this MoE family), which is not modelled",
            crate::error::untrusted(mt),
            crate::error::untrusted(target)
        ),
        "target the attention projections (q_proj, k_proj, v_proj, o_proj)",
    ))
}

/// Image inputs under activation checkpointing run the vision tower's backward: transformers
/// 5.23 `PreTrainedModel.activation_checkpointing_enable` calls `enable_input_require_grads`
/// (the wrapper's `main_input_name` is `input_ids`), which walks `self.modules()` and hooks the
/// `get_input_embeddings()` of every `PreTrainedModel` in it, the vision sub-model included
/// (`modeling_utils.py`): `Llama4VisionModel.get_input_embeddings` is its `patch_embedding`,
/// `PixtralVisionModel`'s its `patch_conv`, Qwen2-VL's and Qwen2.5-VL's vision transformers
/// have `_input_embed_layer = "patch_embed"` and `SiglipVisionModel` (Gemma 3's tower)
/// `_input_embed_layer = "patch_embedding"`, found under `embeddings` by the generic
/// `get_input_embeddings`. The hook calls `output.requires_grad_(True)`, so the frozen tower's
/// patch embeddings require grad: the tower records autograd (its encoder layers are
/// `GradientCheckpointingLayer`s, checkpointed like the text layers; the ops between them save
/// their inputs) and the backward runs back through it, recomputing its layers. For Qwen2-VL,
/// Qwen2.5-VL, Gemma 3 (SigLIP) and Mistral 3 (Pixtral) that backward is simulated on one GPU
/// under full checkpointing (memory/hf/vision.rs `vision_tower`, `recompute_vision_block`;
/// siglip.rs `siglip_block`, pixtral.rs `pixtral_block`; the measured `vlm-*-ckpt` cases of
/// these towers, 33% to 41% short before, are within 0.33%); another checkpointing policy
/// with image inputs is refused for them (field checkpointing_policy), and so are the sharded
/// engines (field image_tokens). The same holds for Llama 4's tower (llama4_vision.rs
/// `llama4_block`, `recompute_vision_block`): measured with the tower at its real width (2
/// layers) behind a small text model, the frozen-tower estimate was short by 25.5%; the
/// simulated backward is within 0.06% (`vlm-l4xc-*-ckpt`, `vlm-l4scout-1l-img576-sgd-ckpt`).
pub(crate) fn check_image_checkpointing(
    model: &ModelDesc,
    w: &crate::workload::TrainWorkload,
    distributed: bool,
) -> Result<(), CoreError> {
    let Some(v) = model.vision.as_ref() else {
        return Ok(());
    };
    let Some(kind) = v.forward.as_ref().map(|f| f.kind) else {
        return Ok(());
    };
    let Some(n) = v.image_tokens.filter(|_| w.checkpointing) else {
        return Ok(());
    };
    let tower = match kind {
        crate::model::VisionKind::Qwen2Vl => "Qwen2-VL",
        crate::model::VisionKind::Qwen25Vl => "Qwen2.5-VL",
        crate::model::VisionKind::Gemma3Siglip => "Gemma 3 (SigLIP)",
        crate::model::VisionKind::Pixtral => "Mistral 3 (Pixtral)",
        crate::model::VisionKind::Llama4 => "Llama 4",
    };
    let policy = w.step_options.checkpointing_policy;
    if policy != crate::workload::CheckpointPolicy::Full {
        // transformers checkpoints every GradientCheckpointingLayer, the vision
        // blocks included; a layer policy is the harness's, over the text layers
        return Err(CoreError::invalid_value(
            crate::workload::CheckpointPolicy::FIELD,
            policy.name(),
            format!(
                "with image inputs, the {tower} vision tower's blocks are modelled under full checkpointing only (transformers checkpoints every vision block; which blocks a `{}` policy would cover is not traced)",
                policy.name()
            ),
            "drop --checkpointing-policy (full checkpointing), or drop --image-tokens and count the image tokens as text tokens of the sequence",
        ));
    }
    if !distributed {
        // simulated on one GPU (memory/hf/vision.rs `vision_tower`, siglip.rs, pixtral.rs,
        // llama4_vision.rs)
        return Ok(());
    }
    Err(CoreError::invalid_value(
        "image_tokens",
        n,
        format!(
            "with activation checkpointing the {tower} vision tower's backward runs (enable_input_require_grads hooks its patch embedding); memwall models it on one GPU only, not under data-parallel sharding"
        ),
        "estimate one GPU (drop --gpus), or drop --checkpointing",
    ))
}

/// Attention implementations transformers refuses for the model: a model with attention sinks
/// (gpt-oss) has no SDPA path (transformers 5.23 models/gpt_oss/modeling_gpt_oss.py
/// `GptOssPreTrainedModel._supports_sdpa = False`; `from_pretrained(attn_implementation="sdpa")`
/// raises), so an SDPA estimate would describe a run that cannot happen.
pub fn check_attention(
    model: &ModelDesc,
    attention: crate::workload::AttentionImpl,
) -> Result<(), CoreError> {
    let sinks = model
        .layers
        .iter()
        .filter_map(|l| l.attention_block())
        .any(|a| a.sinks);
    if attention != crate::workload::AttentionImpl::Sdpa
        && model.layers.iter().all(|l| l.attention_block().is_none())
    {
        // sdpa is the default, so only an explicit choice reaches here
        return Err(CoreError::invalid_value(
            "attention",
            attention.name(),
            format!(
                "`{}` has no attention layers (state-space layers only), so no attention kernel runs",
                crate::error::untrusted(&model.model_type)
            ),
            "drop --attention",
        ));
    }
    // Falcon's new architecture with fewer key/value heads than query heads is simulated with
    // its rotary embedding only (`Builder::falcon_expanded_split`); the ALiBi branch of
    // FalconAttention.forward (fp32 scores, the alibi bias, dropout on the probabilities) is
    // not modelled for the expanded heads
    if model
        .layers
        .iter()
        .filter_map(|l| l.attention_block())
        .any(|a| a.kv_expanded && a.rotary_dim.is_none())
    {
        return Err(CoreError::invalid_value(
            "alibi",
            "true",
            "Falcon's new decoder architecture with fewer key/value heads than query heads and ALiBi positions (models/falcon/modeling_falcon.py FalconAttention.forward, the `alibi` branch) is not simulated".to_string(),
            "use a config with alibi = false (every released new-architecture Falcon uses rotary positions), or `memwall serve`",
        ));
    }
    if sinks && attention == crate::workload::AttentionImpl::Sdpa {
        return Err(CoreError::invalid_value(
            "attention",
            "sdpa",
            format!(
                "transformers has no SDPA attention for `{}` (attention sinks: `_supports_sdpa = False`); it runs eager or a flash kernel with sinks",
                crate::error::untrusted(&model.model_type)
            ),
            "use --attention eager (the measured path) or --attention flash",
        ));
    }
    Ok(())
}

/// What every inference estimate checks first.
fn check_infer(model: &ModelDesc, w: &crate::workload::InferWorkload) -> Result<(), CoreError> {
    w.validate()?;
    check_attention(model, w.attention)?;
    check_jamba_cache(model, true, false)?;
    if w.kv_dtype != crate::workload::KvDtype::Auto
        && model.layers.iter().all(|l| l.attention_block().is_none())
    {
        return Err(CoreError::invalid_value(
            "kv_dtype",
            w.kv_dtype.name(),
            format!(
                "`{}` keeps no KV cache: its state-space layers keep a fixed-size state in the model's dtype",
                crate::error::untrusted(&model.model_type)
            ),
            "drop --kv-dtype",
        ));
    }
    if model.layers.is_empty() {
        return Err(CoreError::invalid(
            "num_hidden_layers",
            "the model has no layers",
        ));
    }
    Ok(())
}

/// The reference replay of a checked inference run.
fn run_infer(
    model: &ModelDesc,
    w: &crate::workload::InferWorkload,
    kernels: Kernels,
) -> Result<InferEstimate, CoreError> {
    let mut b = hf::Builder::infer(model, w, kernels);
    let prefill_peak = b.run_inference();
    let kv = b.kv_cache_bytes();
    let t = &b.t;
    let at_peak = breakdown_at_peak(t)?;
    let weights = at_peak
        .iter()
        .find(|(c, _)| *c == Category::Weights)
        .map_or(0, |x| x.1);
    Ok(InferEstimate {
        engine: Engine::Hf,
        peak_bytes: to_u64(t.peak(), "peak bytes")?,
        at_peak,
        phase: t.peak_phase(),
        params_total: to_u64(b.param_count, "parameters")?,
        weights_bytes: weights,
        kv_cache_bytes: to_u64(kv, "kv cache bytes")?,
        prefill_peak_bytes: to_u64(prefill_peak, "prefill peak")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::llama2_7b;

    #[test]
    fn llama_7b_bf16_step_is_plausible() {
        let m = llama2_7b();
        let w = TrainWorkload::new(1, 512);
        let e = simulate_train(&m, &w, Kernels::Cuda).unwrap();
        let p = 6_738_415_616u64;
        // weights 2P + grads 2P + AdamW states 4P + foreach temp 2P at the optimizer step
        assert!(e.peak_bytes >= 10 * p, "{}", e.peak_bytes);
        assert_eq!(e.params_total, p);
    }

    /// Falcon's new architecture with fewer key/value heads than query heads (`kv_expanded`) is
    /// estimated: from `_split_heads` on keys, values and the KV cache have every query head,
    /// so the cache is the one of as many key/value heads as query heads, and the step keeps
    /// more than the same model with the real (grouped) key/value heads would; with ALiBi
    /// positions it is refused by name.
    #[test]
    fn falcon_expanded_kv_heads_cache_every_query_head() {
        let falcon = |kv: u64, expanded: bool| {
            let mut m = llama2_7b();
            m.layers.truncate(2);
            for l in &mut m.layers {
                if let crate::model::AttentionKind::Standard {
                    ref mut num_kv_heads,
                    ..
                } = l.attention.kind
                {
                    *num_kv_heads = kv;
                }
                l.attention.kv_expanded = expanded;
                l.attention.fused_qkv = true;
                l.attention.eager_style = crate::model::EagerStyle::Falcon;
            }
            m
        };
        let i = crate::workload::InferWorkload {
            batch: 1,
            prompt: 16,
            new_tokens: 4,
            attention: crate::workload::AttentionImpl::Sdpa,
            weights: crate::workload::WeightFormat::Bf16,
            kv_dtype: crate::workload::KvDtype::Auto,
            moe_decode_batched: true,
        };
        let cache = |m: &ModelDesc| simulate_infer(m, &i, Kernels::Cuda).unwrap().kv_cache_bytes;
        let (grouped, expanded, full) = (falcon(8, false), falcon(8, true), falcon(32, false));
        // 2 layers × (k + v) × 32 heads × 128 dims × 19 tokens (the last new token is not
        // fed back) × 2 bytes
        assert_eq!(cache(&expanded), 2 * 2 * 32 * 128 * 19 * 2);
        assert_eq!(cache(&expanded), cache(&full));
        assert_eq!(cache(&grouped) * 4, cache(&full));
        let w = TrainWorkload::new(2, 64);
        let forward = |m: &ModelDesc| {
            simulate_train(m, &w, Kernels::Cuda)
                .unwrap()
                .phase_peak(Phase::Forward)
                .unwrap()
        };
        assert!(forward(&expanded) > forward(&grouped));
        let mut alibi = expanded.clone();
        for l in &mut alibi.layers {
            l.attention.rotary_dim = None;
        }
        let msg = simulate_train(&alibi, &w, Kernels::Cuda)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("alibi"), "{msg}");
    }

    /// Autocast over Mamba-2 mixers: measured forms for `Mamba2Mixer` (16-bit projections,
    /// gated norm) and Falcon-H1 (fp32 `zxbcdt`); a 16-bit mixer without the gated norm has
    /// no measured form and is refused by name.
    #[test]
    fn autocast_refuses_only_the_unmeasured_mamba2_mixer() {
        let mut m = llama2_7b();
        let mut mixer = crate::mixer::tests::codestral();
        m.layers[0].mixer = crate::model::Mixer::Mamba2(mixer);
        assert!(check_autocast(&m, crate::Precision::AmpBf16).is_ok());
        mixer.gated_norm = false;
        m.layers[0].mixer = crate::model::Mixer::Mamba2(mixer);
        let e = check_autocast(&m, crate::Precision::AmpFp16).unwrap_err();
        assert!(e.to_string().contains("precision"), "{e}");
        assert!(check_autocast(&m, crate::Precision::Bf16).is_ok());
        m.layers[0].muls.ssm_proj = true;
        assert!(check_autocast(&m, crate::Precision::AmpBf16).is_ok());
    }

    fn with_lora(targets: &[&str]) -> TrainWorkload {
        let mut w = TrainWorkload::new(1, 64);
        w.lora = Some(crate::workload::Lora {
            rank: 8,
            targets: targets.iter().map(|t| (*t).to_owned()).collect(),
            qlora: false,
        });
        w
    }

    /// peft 0.21 puts MLP-named adapters on the experts' fused parameters in the MoE families
    /// transformers converts (refused), refuses out_proj on Mamba models (refused) and Mamba-1's
    /// x_proj/dt_proj are not modelled (refused); other names pass, unmatched ones are ignored
    /// as long as one target names a module (none: refused, as peft refuses it).
    #[test]
    fn lora_targets_memwall_cannot_place_are_refused_by_name() {
        let mut m = llama2_7b();
        m.model_type = "qwen3_moe".into();
        let e = simulate_train(&m, &with_lora(&["q_proj", "down_proj"]), Kernels::Cpu).unwrap_err();
        assert!(
            e.to_string().contains("lora_targets") && e.to_string().contains("down_proj"),
            "{e}"
        );
        assert!(simulate_train(&m, &with_lora(&["q_proj", "v_proj"]), Kernels::Cpu).is_ok());
        m.model_type = "llama".into();
        assert!(simulate_train(&m, &with_lora(&["gate_proj", "no_such"]), Kernels::Cpu).is_ok());
        m.model_type = "falcon_h1".into();
        let e = check_lora_targets(&m, &with_lora(&["q_proj", "out_proj"])).unwrap_err();
        assert!(e.to_string().contains("out_proj"), "{e}");
        m.model_type = "jamba".into();
        let e = check_lora_targets(&m, &with_lora(&["dt_proj"])).unwrap_err();
        assert!(e.to_string().contains("dt_proj"), "{e}");
        assert!(check_lora_targets(&m, &with_lora(&["q_proj", "in_proj", "out_proj"])).is_ok());
        // no target names any module: peft raises NoMatchingPeftModuleError
        m.model_type = "llama".into();
        m.linear_names = vec![(crate::model::LinearRole::Q, "q_proj".into())];
        assert!(check_lora_targets(&m, &with_lora(&["q_proj", "no_such"])).is_ok());
        let e = check_lora_targets(&m, &with_lora(&["in_proj", "no_such"])).unwrap_err();
        assert!(
            e.to_string().contains("lora_targets") && e.to_string().contains("NoMatchingPeft"),
            "{e}"
        );
    }

    /// Every rank of a data-parallel step runs the same transformers model code as one GPU, so
    /// the distributed estimate refuses what the single-GPU one refuses (it skipped the LoRA
    /// target and hybrid-cache checks until a random distributed sample, seed 83, drew a
    /// Qwen3-Next FSDP2 step with LoRA on `gate_proj` and got a parameter count off by the
    /// experts' adapters).
    #[test]
    fn distributed_steps_refuse_what_one_gpu_refuses() {
        use crate::layout::{Layout, Strategy};
        let mut m = llama2_7b();
        m.model_type = "qwen3_moe".into();
        let w = with_lora(&["q_proj", "down_proj"]);
        for strategy in [Strategy::FsdpFull, Strategy::Ddp, Strategy::Zero3] {
            let layout = Layout {
                gpus: 4,
                gpus_per_node: 4,
                strategy,
                ..Layout::single()
            };
            let e = crate::memory::simulate_train_dist(&m, &w, &layout, Kernels::Cpu)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("lora_targets") && e.contains("down_proj"),
                "{strategy:?}: {e}"
            );
            let ok = with_lora(&["q_proj", "v_proj"]);
            assert!(
                crate::memory::simulate_train_dist(&m, &ok, &layout, Kernels::Cpu).is_ok(),
                "{strategy:?}"
            );
        }
    }

    /// FSDP2's MixedPrecisionPolicy (`amp-bf16` over an fp32 model) casts peft's fp32 adapters
    /// to bf16 with the base at the all-gather, so `lora_A` takes the layer's bf16 input as it
    /// is: two more adapted linears on the same input add [rows, rank] tensors and their bf16
    /// weights to the forward, not an fp32 copy of the [rows, hidden] input each (which peft's
    /// `_cast_input_dtype` makes, and `lora_A` saves, only for fp32 adapters: the
    /// overestimate of up to +42% in forward measured on seed-83 FSDP2 steps).
    #[test]
    fn fsdp2_mixed_precision_runs_lora_adapters_in_param_dtype() {
        use crate::layout::{Layout, Strategy};
        let mut m = crate::plan::test_model();
        m.layers.truncate(2);
        // a small vocabulary: the root unit's all-gather must not hide the layers' activations
        m.embeddings.vocab_size = 256;
        let layout = Layout {
            gpus: 4,
            gpus_per_node: 4,
            strategy: Strategy::FsdpFull,
            ..Layout::single()
        };
        let forward = |targets: &[&str]| -> u64 {
            let mut w = with_lora(targets);
            w.seq = 512;
            w.precision = crate::Precision::AmpBf16;
            let e = crate::memory::simulate_train_dist(&m, &w, &layout, Kernels::Cuda).unwrap();
            let g = &e.groups[e.worst];
            g.phase_peak(Phase::Forward).unwrap()
        };
        let rows_hidden_fp32 = 512 * 4096 * 4;
        let q = forward(&["q_proj"]);
        let qkv = forward(&["q_proj", "k_proj", "v_proj"]);
        assert!(qkv > q, "{qkv} {q}");
        assert!(qkv - q < rows_hidden_fp32, "{qkv} - {q}");
    }

    /// FSDP2's root reshards after forward when given `reshard_after_forward=True`, also over
    /// layers given `False` (it was kept unsharded whatever it was given): its backward then
    /// starts by all-gathering it again, the flat all-gather buffer and the copied-out
    /// parameters alive together (measured: rdist131-017-mistral's backward, -4.7% without
    /// it). Left unset, the root does what the layers do (accelerate's FSDP2 plugin).
    #[test]
    fn fsdp2_root_reshards_as_given_under_unresharded_layers() {
        use crate::layout::{Layout, Strategy};
        use crate::memory::DistOptions;
        let mut m = crate::plan::test_model();
        m.layers.truncate(2);
        let mut w = with_lora(&["q_proj"]);
        w.seq = 64;
        let backward = |strategy: Strategy, root: Option<bool>| -> u64 {
            let layout = Layout {
                gpus: 4,
                gpus_per_node: 4,
                strategy,
                ..Layout::single()
            };
            let opts = DistOptions {
                fsdp_root_reshard: root,
                ..DistOptions::default()
            };
            let e = crate::memory::simulate_train_dist_with(&m, &w, &layout, Kernels::Cpu, &opts)
                .unwrap();
            let g = &e.groups[e.worst];
            g.phase_peak(Phase::Backward).unwrap()
        };
        let kept = backward(Strategy::FsdpGradOp, Some(false));
        let resharded = backward(Strategy::FsdpGradOp, Some(true));
        assert!(resharded > kept, "{resharded} {kept}");
        assert_eq!(backward(Strategy::FsdpGradOp, None), kept);
        assert_eq!(
            backward(Strategy::FsdpFull, None),
            backward(Strategy::FsdpFull, Some(true))
        );
    }

    /// Phi-3 / GLM-4's fused MLP binds `gate` (a view of the gate_up output) until its forward
    /// returns, so with nothing saved (a checkpointed forward here) the whole [rows, 2·inter]
    /// output is alive through down_proj, where separate gate/up projections are freed at the
    /// product. With an fp32 LoRA adapter on down_proj (its fp32 input copy) that instant is
    /// the forward's peak (measured: rdist83-033-glm4, forward -15.8% without it).
    #[test]
    fn fused_gate_up_output_lives_through_down_proj() {
        let mut m = crate::plan::test_model();
        m.layers.truncate(1);
        m.embeddings.vocab_size = 256;
        let mut fused = m.clone();
        for l in &mut fused.layers {
            if let crate::model::Mlp::Dense(d) = &mut l.mlp {
                d.fused_gate_up = true;
            }
        }
        let mut w = with_lora(&["down_proj"]);
        w.seq = 512;
        w.checkpointing = true;
        let forward = |m: &ModelDesc| {
            let e = simulate_train(m, &w, Kernels::Cpu).unwrap();
            e.phase_peak(Phase::Forward).unwrap()
        };
        // at down_proj's fp32 input copy the fused MLP still holds its [rows, 2·inter]
        // gate_up output (without it the two forward peaks are equal)
        let gate_up = 512 * 2 * 11008 * 2;
        assert!(forward(&fused) >= forward(&m) + gate_up);
    }

    /// Image inputs under checkpointing: simulated for the Qwen towers on one GPU with full
    /// checkpointing (the tower's backward then runs after the text's and adds to the step),
    /// refused by name for a layer policy and for the sharded engines (Llama 4's tower alike).
    #[test]
    fn image_checkpointing_is_simulated_for_the_qwen_towers() {
        use crate::model::{VisionForward, VisionKind, VisionTower};
        let mut m = llama2_7b();
        m.layers.truncate(1);
        let tower = |kind: VisionKind| VisionTower {
            model_type: "qwen2_vl".into(),
            encoder_params: 0,
            projector_params: 0,
            trainable: false,
            linears: vec![],
            forward: Some(VisionForward {
                patch_in: 1176,
                width: 1280,
                heads: 16,
                mlp: 5120,
                depth: 2,
                merge: 2,
                out: 4096,
                kind,
                window: if kind == VisionKind::Qwen25Vl { 4 } else { 0 },
                full_blocks: vec![1],
                per_image: 0,
                adapter: 0,
            }),
            image_tokens: Some(1024),
        };
        let mut w = TrainWorkload::new(1, 1100);
        w.checkpointing = true;
        for kind in [VisionKind::Qwen2Vl, VisionKind::Qwen25Vl] {
            m.vision = Some(tower(kind));
            let with = simulate_train(&m, &w, Kernels::Cpu).expect("simulated");
            assert!(check_image_checkpointing(&m, &w, true)
                .is_err_and(|e| e.field() == Some("image_tokens")));
            let mut policy = w.clone();
            policy.step_options.checkpointing_policy = crate::workload::CheckpointPolicy::EveryK(2);
            assert!(check_image_checkpointing(&m, &policy, false)
                .is_err_and(|e| e.field() == Some("checkpointing_policy")));
            // the same step with the image tokens counted as text: no tower
            let mut text = m.clone();
            text.vision = None;
            let text = simulate_train(&text, &w, Kernels::Cpu).expect("simulated");
            let backward = |e: &TrainEstimate| e.phase_peak(Phase::Backward).unwrap_or(0);
            // P = 4096 patches: after the text's backward the recomputed vision block holds its
            // saved tensors and its MLP's backward gradients ([P, 5120] bf16 each), above the
            // text-only step's backward peak (without the tower's backward, the image tokens'
            // forward would leave nothing in the backward but the placeholder mask)
            let one_mlp_activation = 4096 * 5120 * 2;
            assert!(
                backward(&with) > backward(&text) + one_mlp_activation,
                "{kind:?}: {} vs {}",
                backward(&with),
                backward(&text)
            );
        }
        // Llama 4's tower too (llama4_vision.rs), on one GPU only
        m.vision = Some(tower(VisionKind::Llama4));
        assert!(check_image_checkpointing(&m, &w, false).is_ok());
        assert!(check_image_checkpointing(&m, &w, true)
            .is_err_and(|e| e.field() == Some("image_tokens")));
    }

    /// A Jamba / Qwen3-Next / Granite 4.0-H without attention layers cannot build a cache:
    /// refused where the forward builds one, estimated with checkpointing (cache off).
    #[test]
    fn hybrids_without_attention_are_refused_where_they_build_a_cache() {
        let mut m = llama2_7b();
        m.layers.truncate(2);
        for l in &mut m.layers {
            l.mixer = crate::model::Mixer::Mamba2(crate::mixer::tests::codestral());
        }
        m.model_type = "jamba".into();
        let e = simulate_train(&m, &TrainWorkload::new(1, 64), Kernels::Cpu).unwrap_err();
        assert!(e.to_string().contains("attn_layer_offset"), "{e}");
        let mut w = TrainWorkload::new(1, 64);
        w.checkpointing = true;
        assert!(simulate_train(&m, &w, Kernels::Cpu).is_ok());
        m.model_type = "qwen3_next".into();
        let e = check_jamba_cache(&m, true, false).unwrap_err();
        assert!(e.hint().contains("generate"), "{e:?}");
        m.model_type = "mamba2".into();
        assert!(check_jamba_cache(&m, true, true).is_ok());
    }

    /// OLMoE `clip_qkv`: `clamp_` saves a copy of q, k and v, so a step with it holds more than
    /// one without, and inference (no grad) the same.
    #[test]
    fn clip_qkv_copies_are_saved_in_training_only() {
        let mut m = llama2_7b();
        m.layers.truncate(2);
        let w = TrainWorkload::new(1, 256);
        let base = simulate_train(&m, &w, Kernels::Cpu).unwrap();
        for l in &mut m.layers {
            l.attention.clip_qkv = true;
        }
        let clipped = simulate_train(&m, &w, Kernels::Cpu).unwrap();
        let forward = |e: &TrainEstimate| e.phase_peak(Phase::Forward);
        // both layers' three bf16 copies of [256, 4096] are alive at the forward's end
        assert_eq!(
            forward(&clipped).unwrap() - forward(&base).unwrap(),
            2 * 3 * 256 * 4096 * 2
        );
        let iw = crate::workload::InferWorkload {
            batch: 1,
            prompt: 256,
            new_tokens: 4,
            attention: crate::workload::AttentionImpl::Sdpa,
            weights: crate::workload::WeightFormat::Bf16,
            kv_dtype: crate::workload::KvDtype::Auto,
            moe_decode_batched: true,
        };
        let mut plain = m.clone();
        for l in &mut plain.layers {
            l.attention.clip_qkv = false;
        }
        assert_eq!(
            simulate_infer(&m, &iw, Kernels::Cpu).unwrap().peak_bytes,
            simulate_infer(&plain, &iw, Kernels::Cpu)
                .unwrap()
                .peak_bytes
        );
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::model::tests::llama2_7b;
    use crate::workload::{AttentionImpl, Optimizer, Precision};
    use proptest::prelude::*;

    fn small_model(layers: usize, hidden: u64, vocab: u64) -> ModelDesc {
        let mut m = llama2_7b();
        m.layers.truncate(layers);
        m.hidden_size = hidden;
        m.embeddings.dim = hidden;
        m.embeddings.vocab_size = vocab;
        for l in &mut m.layers {
            for n in [&mut l.attn_norm, &mut l.mlp_norm].into_iter().flatten() {
                n.dim = hidden;
            }
            l.attention.kind = crate::model::AttentionKind::Standard {
                num_heads: 4,
                num_kv_heads: 2,
                head_dim: hidden / 4,
            };
            l.attention.rotary_dim = Some(hidden / 4);
        }
        if let Some(n) = m.head.final_norm.as_mut() {
            n.dim = hidden;
        }
        m
    }

    fn workload(
        batch: u64,
        seq: u64,
        p: usize,
        o: usize,
        ckpt: bool,
        eager: bool,
    ) -> TrainWorkload {
        let mut w = TrainWorkload::new(batch, seq);
        w.precision = Precision::ALL[p % 5].0;
        w.optimizer = Optimizer::ALL[o % 8].0;
        w.checkpointing = ckpt;
        w.attention = if eager {
            AttentionImpl::Eager
        } else {
            AttentionImpl::Sdpa
        };
        w
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn more_batch_or_sequence_never_needs_less(
            layers in 1usize..4, h in 1u64..5, v in 100u64..5000,
            batch in 1u64..16, seq in 1u64..512, extra in 1u64..8,
            p in 0usize..5, o in 0usize..8, ckpt: bool, eager: bool,
        ) {
            let m = small_model(layers, h * 64, v);
            let base = simulate_train(&m, &workload(batch, seq, p, o, ckpt, eager), Kernels::Cuda).unwrap();
            let more_b = simulate_train(&m, &workload(batch + extra, seq, p, o, ckpt, eager), Kernels::Cuda).unwrap();
            let more_s = simulate_train(&m, &workload(batch, seq + extra, p, o, ckpt, eager), Kernels::Cuda).unwrap();
            prop_assert!(more_b.peak_bytes >= base.peak_bytes);
            prop_assert!(more_s.peak_bytes >= base.peak_bytes);
        }

        #[test]
        fn breakdown_sums_to_peak_and_weights_are_counted(
            layers in 1usize..4, batch in 1u64..8, seq in 1u64..256, p in 0usize..5, o in 0usize..8, ckpt: bool,
        ) {
            let m = small_model(layers, 256, 1000);
            let e = simulate_train(&m, &workload(batch, seq, p, o, ckpt, false), Kernels::Cpu).unwrap();
            let sum: u64 = e.at_peak.iter().map(|(_, b)| b).sum();
            prop_assert_eq!(sum, e.peak_bytes);
            let weights = e.at_peak.iter().find(|(c, _)| *c == Category::Weights).map(|x| x.1).unwrap();
            let elem = if matches!(Precision::ALL[p % 5].0, Precision::Bf16 | Precision::Fp16) { 2 } else { 4 };
            prop_assert_eq!(weights, e.params_total * elem);
        }

        #[test]
        fn checkpointing_never_increases_activation_peak_for_long_sequences(
            layers in 2usize..6, batch in 1u64..8, seq in 256u64..1024,
        ) {
            let m = small_model(layers, 256, 1000);
            let off = simulate_train(&m, &workload(batch, seq, 0, 0, false, false), Kernels::Cuda).unwrap();
            let on = simulate_train(&m, &workload(batch, seq, 0, 0, true, false), Kernels::Cuda).unwrap();
            prop_assert!(on.peak_bytes <= off.peak_bytes);
        }
    }

    #[test]
    fn grad_accumulation_keeps_gradients_through_the_next_forward() {
        let m = small_model(2, 256, 1000);
        let mut w = workload(8, 512, 0, 6, false, false); // sgd: no optimizer-step temporaries
        let one = simulate_train(&m, &w, Kernels::Cpu).unwrap();
        w.grad_accum = 4;
        let four = simulate_train(&m, &w, Kernels::Cpu).unwrap();
        assert!(four.peak_bytes > one.peak_bytes);
    }

    #[test]
    fn absurd_workloads_are_refused_not_overflowed() {
        let m = llama2_7b();
        let w = TrainWorkload::new(1 << 20, 1 << 30);
        assert!(simulate_train(&m, &w, Kernels::Cuda).is_err());
    }
}

#[cfg(test)]
mod infer_tests {
    use super::*;
    use crate::model::tests::llama2_7b;
    use crate::model::AttentionKind;
    use crate::workload::{AttentionImpl, InferWorkload, KvDtype, WeightFormat};

    fn w(batch: u64, prompt: u64, new_tokens: u64) -> InferWorkload {
        InferWorkload {
            batch,
            prompt,
            new_tokens,
            attention: AttentionImpl::Sdpa,
            weights: WeightFormat::Bf16,
            kv_dtype: KvDtype::Auto,
            moe_decode_batched: true,
        }
    }

    #[test]
    fn seed_llama2_7b_kv_cache_at_32_by_4096_is_68_7_gb() {
        // 2 (k, v) · 32 layers · 32 heads · 128 · 4096 tokens · 32 sequences · 2 bytes
        let e = simulate_infer(&llama2_7b(), &w(32, 4096, 1), Kernels::Cuda).unwrap();
        assert_eq!(e.kv_cache_bytes, 2 * 32 * 32 * 128 * 4096 * 32 * 2);
        assert_eq!(e.kv_cache_bytes, 68_719_476_736);
    }

    #[test]
    fn seed_gqa_with_8_kv_heads_is_a_quarter() {
        // Llama-3-8B shape: 8 KV heads → 17.2 GB for the same 32 × 4096 tokens
        let mut m = llama2_7b();
        for l in &mut m.layers {
            l.attention.kind = AttentionKind::Standard {
                num_heads: 32,
                num_kv_heads: 8,
                head_dim: 128,
            };
        }
        let e = simulate_infer(&m, &w(32, 4096, 1), Kernels::Cuda).unwrap();
        assert_eq!(e.kv_cache_bytes, 2 * 32 * 8 * 128 * 4096 * 32 * 2);
        assert!((e.kv_cache_bytes as f64 / 1e9 - 17.2).abs() < 0.05);
    }

    #[test]
    fn decode_grows_the_cache_and_the_peak() {
        let m = llama2_7b();
        let short = simulate_infer(&m, &w(8, 1024, 2), Kernels::Cuda).unwrap();
        let long = simulate_infer(&m, &w(8, 1024, 512), Kernels::Cuda).unwrap();
        assert!(long.kv_cache_bytes > short.kv_cache_bytes);
        assert!(long.peak_bytes >= short.peak_bytes);
        // prompt + 511 decode steps cached
        assert_eq!(
            long.kv_cache_bytes,
            2 * 32 * 32 * 128 * (1024 + 511) * 8 * 2
        );
    }

    #[test]
    fn fp8_kv_halves_the_cache() {
        let m = llama2_7b();
        let mut a = w(4, 2048, 16);
        let bf = simulate_infer(&m, &a, Kernels::Cuda).unwrap();
        a.kv_dtype = KvDtype::Fp8;
        let f8 = simulate_infer(&m, &a, Kernels::Cuda).unwrap();
        assert_eq!(f8.kv_cache_bytes * 2, bf.kv_cache_bytes);
    }

    #[test]
    fn sliding_caches_grow_in_decode_up_to_their_window() {
        // DynamicSlidingWindowLayer concatenates every step until its window is full: after
        // the last of `new_tokens - 1` decode steps each layer's k and v hold
        // min(prompt + steps, window) tokens (measured: starcoder2-rnd17-b3-p16-n50-fp32-sliding)
        let mut m = llama2_7b();
        m.layers.truncate(2);
        for l in &mut m.layers {
            l.attention.sliding_window = Some(200);
        }
        // k and v, two layers, 32 heads of 128, bf16
        let per_token = 2 * 2 * 32 * 128 * 2;
        let cache = |new_tokens| {
            simulate_infer(&m, &w(1, 100, new_tokens), Kernels::Cpu)
                .unwrap()
                .kv_cache_bytes
        };
        assert_eq!(cache(3), per_token * (100 + 2));
        assert_eq!(cache(50), per_token * (100 + 49));
        assert_eq!(cache(150), per_token * 200);
    }

    #[test]
    fn fp32_rotary_tables_promote_16_bit_queries() {
        // OLMo 2: fp32 cos/sin, `q * cos` in fp32, cast back at the end; with fp32 weights
        // nothing promotes and the flag changes nothing
        let mut m = llama2_7b();
        m.layers.truncate(2);
        let peak = |m: &ModelDesc, weights| {
            let mut a = w(2, 64, 1);
            a.weights = weights;
            simulate_infer(m, &a, Kernels::Cpu).unwrap().peak_bytes
        };
        let plain = (peak(&m, WeightFormat::Bf16), peak(&m, WeightFormat::Fp32));
        for l in &mut m.layers {
            l.attention.rope_promotes = true;
        }
        let promoted = (peak(&m, WeightFormat::Bf16), peak(&m, WeightFormat::Fp32));
        assert!(promoted.0 > plain.0, "{promoted:?} {plain:?}");
        assert_eq!(promoted.1, plain.1);
    }

    #[test]
    fn the_rotary_and_embedding_scale_buffers_are_alive_at_the_peak() {
        // inv_freq and original_inv_freq, fp32 [head_dim / 2] each; Gemma 3 one pair per layer
        // type; Gemma's embed_scale in the weights' dtype (measured: rnd-i17-018-gemma3text)
        let buffers = |m: &ModelDesc| {
            simulate_infer(m, &w(1, 16, 1), Kernels::Cpu)
                .unwrap()
                .at_peak
                .iter()
                .find(|(c, _)| *c == Category::Buffers)
                .map(|&(_, b)| b)
                .unwrap()
        };
        let mut m = llama2_7b();
        m.layers.truncate(2);
        let pair = 2 * 64 * 4;
        assert_eq!(buffers(&m), pair);
        m.rope_buffers_per_layer_type = true;
        assert_eq!(buffers(&m), pair);
        m.layers[0].attention.sliding_window = Some(8);
        assert_eq!(buffers(&m), 2 * pair);
        m.embeddings.scaled = true;
        m.embeddings.scale_in_module = true;
        assert_eq!(buffers(&m), 2 * pair + 2);
    }

    #[test]
    fn weights_are_all_there() {
        let e = simulate_infer(&llama2_7b(), &w(1, 128, 4), Kernels::Cpu).unwrap();
        assert_eq!(e.weights_bytes, 6_738_415_616 * 2);
        assert!(e.peak_bytes > e.weights_bytes);
    }
}

#[cfg(test)]
mod quantized_weights {
    use super::*;
    use crate::model::tests::llama2_7b;
    use crate::workload::{AttentionImpl, InferWorkload, KvDtype, WeightFormat};

    fn weights_gb(fmt: &str) -> f64 {
        let w = InferWorkload {
            batch: 1,
            prompt: 16,
            new_tokens: 1,
            attention: AttentionImpl::Sdpa,
            weights: WeightFormat::parse(fmt).unwrap(),
            kv_dtype: KvDtype::Auto,
            moe_decode_batched: true,
        };
        simulate_infer(&llama2_7b(), &w, Kernels::Cuda)
            .unwrap()
            .weights_bytes as f64
            / 1e9
    }

    #[test]
    fn gguf_sizes_match_published_llama2_7b_files() {
        // TheBloke/Llama-2-7B-GGUF model card: Q4_0 3.83 GB, Q4_K_M 4.08 GB, Q8_0 7.16 GB
        for (fmt, gb) in [
            ("gguf-q4_0", 3.83),
            ("gguf-q4_k_m", 4.08),
            ("gguf-q8_0", 7.16),
        ] {
            let got = weights_gb(fmt);
            assert!((got - gb).abs() / gb < 0.005, "{fmt}: {got} GB vs {gb}");
        }
    }

    #[test]
    fn four_bit_formats_are_about_a_quarter_of_bf16_plus_unquantised_embeddings() {
        let bf16 = weights_gb("bf16");
        for f in ["nf4", "nf4-dq", "gptq-int4-g128", "awq-int4-g128"] {
            let q = weights_gb(f);
            assert!(q > bf16 / 4.0 && q < bf16 / 3.0, "{f}: {q} vs {bf16}");
        }
        assert!(weights_gb("nf4-dq") < weights_gb("nf4"));
        let int8 = weights_gb("int8");
        assert!(int8 > bf16 / 2.0 && int8 < bf16 * 0.55, "{int8}");
    }

    #[test]
    fn unknown_format_names_the_field() {
        assert!(matches!(
            WeightFormat::parse("q7"),
            Err(CoreError::Invalid {
                field: "weights",
                ..
            })
        ));
    }
}
