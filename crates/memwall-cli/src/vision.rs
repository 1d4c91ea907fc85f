//! The vision-language flags: `--train-vision` (update the vision tower and projector in a
//! training step; frozen by default, as most VLM fine-tuning recipes do) and `--image-tokens`
//! (refused: the vision tower's activations are not simulated).

use crate::error::UserError;
use crate::model_source::ModelSource;
use anyhow::Result;

/// What every report of a vision-language model states (the estimate's assumption).
pub const IMAGE_TOKENS_ASSUMPTION: &str = "image tokens are counted as text tokens of the sequence (give them in --seq/--prompt); the vision tower's own activations are not simulated, only its weights";

/// Applies `--train-vision` to the model and refuses `--image-tokens`, naming each flag.
pub fn apply(
    model: &mut ModelSource,
    train_vision: bool,
    image_tokens: Option<u64>,
    lora: bool,
) -> Result<()> {
    let has_vision = model.desc.vision.is_some();
    if let Some(n) = image_tokens {
        let reason = if has_vision {
            "memwall does not simulate the vision tower's forward activations yet".to_string()
        } else {
            format!(
                "{} ({}) has no vision tower",
                model.label, model.desc.model_type
            )
        };
        return Err(UserError::flag(
            "--image-tokens",
            n,
            reason,
            "drop --image-tokens and count the image tokens as text tokens of --seq/--prompt (the language model sees them as tokens); the vision tower's weights are counted either way",
        )
        .into());
    }
    if train_vision {
        if !has_vision {
            return Err(UserError::new(
                format!(
                    "invalid --train-vision: {} ({}) has no vision tower",
                    model.label, model.desc.model_type
                ),
                "drop --train-vision; it is for vision-language models (gemma3, llama4, mistral3, qwen2_vl, qwen2_5_vl)",
            )
            .into());
        }
        if lora {
            return Err(UserError::new(
                "invalid --train-vision: LoRA freezes every base weight, the vision tower included",
                "drop --train-vision to train only the adapters, or drop --lora-rank to train the vision tower in full",
            )
            .into());
        }
    }
    if let Some(v) = model.desc.vision.as_mut() {
        v.trainable = train_vision;
    }
    Ok(())
}
