//! The vision-language flags: `--train-vision` (update the vision tower and projector in a
//! training step; frozen by default, as most VLM fine-tuning recipes do) and `--image-tokens N`
//! (N of every sequence's tokens are one image's tokens: the vision tower's forward over that
//! image's patches, the projector and the merge into the text embeddings are simulated, for the
//! families whose vision forward memwall models: qwen2_vl, qwen2_5_vl and mistral3 (one image
//! of the most nearly square grid of N tokens); for gemma3, N image tokens are
//! N / `mm_tokens_per_image` fixed-size images; for llama4, N / 144 tiles of 336 px).

use crate::error::UserError;
use crate::model_source::ModelSource;
use anyhow::Result;
use memwall_core::memory::image_grid;
use memwall_core::model::VisionKind;

/// What every report of a vision-language model states without `--image-tokens`.
pub const IMAGE_TOKENS_ASSUMPTION: &str = "image tokens are counted as text tokens of the sequence (give them in --seq/--prompt); the vision tower's own activations are not simulated, only its weights";

/// Appended to the `--image-tokens` note: the step-time model (`memwall_core::time`) prices the
/// text model's work only, the image tokens included, not the tower's.
const IMAGE_TIME_NOTE: &str = "; speed figures count the text model's compute only (the vision tower's forward and recompute are not in the time model)";

/// What a report states with `--image-tokens N` (`per_image`: the tower's tokens per image,
/// or per tile for llama4 (`kind`); 0 when the N tokens are one image).
pub fn image_tokens_note(n: u64, per_image: u64, kind: Option<VisionKind>) -> String {
    if kind == Some(VisionKind::Llama4) {
        let tiles = n.checked_div(per_image).unwrap_or(0);
        return format!("{n} of each sequence's tokens (--seq/--prompt) are the <|patch|> tokens of {tiles} image tile(s) of {per_image} tokens (one image of {tiles} tiles, or several images, as the processor cuts them; its separator tokens are text): the frozen vision tower's forward over the tiles (nothing of it saved for backward; with --checkpointing its encoder layers are checkpointed and its backward runs after the text's, recomputing them), the projector and the merge into the embeddings are simulated; the other tokens are text{IMAGE_TIME_NOTE}");
    }
    if let Some(images) = n.checked_div(per_image) {
        return format!("{n} of each sequence's tokens (--seq/--prompt) are the tokens of {images} image(s) of {per_image} tokens: the frozen vision tower's forward over their patches (nothing of it saved for backward; with --checkpointing its blocks are checkpointed and its backward runs after the text's, recomputing them), the projector, the merge into the embeddings and the bidirectional image-block attention masks are simulated; the other tokens are text{IMAGE_TIME_NOTE}");
    }
    format!("{n} of each sequence's tokens (--seq/--prompt) are one image's tokens: the frozen vision tower's forward over its patches (nothing of it saved for backward; with --checkpointing its blocks are checkpointed and its backward runs after the text's, recomputing them), the projector and the merge into the embeddings are simulated; the other tokens are text{IMAGE_TIME_NOTE}")
}

/// The families whose image forward is simulated, for hints.
const IMAGE_FAMILIES: &str = "gemma3, llama4, mistral3, qwen2_vl and qwen2_5_vl";

/// Where `--image-tokens` is checked: the length it is part of and what else the job uses.
#[derive(Debug, Clone, Copy)]
pub struct ImageContext<'a> {
    /// Tokens per sequence (`--seq` or `--prompt`).
    pub seq: u64,
    /// The flag of that length, for messages.
    pub seq_flag: &'a str,
    /// Autocast precision (`amp-*`).
    pub amp: bool,
    /// Padding-free batches.
    pub padding_free: bool,
    /// LoRA target module names (empty without LoRA).
    pub lora_targets: &'a [String],
    /// A layout that Megatron-LM runs (TP, PP, CP or EP > 1), whose estimate is a formula
    /// over the text layers.
    pub megatron: bool,
}

/// Applies `--train-vision` and `--image-tokens` to the model, refusing what is not simulated
/// by name.
pub fn apply(
    model: &mut ModelSource,
    train_vision: bool,
    image_tokens: Option<u64>,
    lora: bool,
    ctx: ImageContext<'_>,
) -> Result<()> {
    let has_vision = model.desc.vision.is_some();
    if let Some(n) = image_tokens {
        check_image_tokens(model, n, train_vision, ctx)?;
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
        v.image_tokens = image_tokens;
    }
    Ok(())
}

fn check_image_tokens(
    model: &ModelSource,
    n: u64,
    train_vision: bool,
    ctx: ImageContext<'_>,
) -> Result<()> {
    let refuse = |reason: String, hint: String| -> Result<()> {
        Err(UserError::flag("--image-tokens", n, reason, hint).into())
    };
    let Some(v) = model.desc.vision.as_ref() else {
        return refuse(
            format!(
                "{} ({}) has no vision tower",
                model.label, model.desc.model_type
            ),
            "drop --image-tokens; it is for vision-language models".into(),
        );
    };
    if v.forward.is_none() {
        return refuse(
            format!(
                "memwall does not simulate the {} vision tower's forward yet",
                model.desc.model_type
            ),
            format!("drop --image-tokens and count the image tokens as text tokens of {} (the language model sees them as tokens; the vision tower's weights are counted either way); image inputs are simulated for {IMAGE_FAMILIES}", ctx.seq_flag),
        );
    }
    if n == 0 || n > ctx.seq {
        return refuse(
            format!(
                "the image tokens are part of each sequence's {} {} tokens, so N must be between 1 and {}",
                ctx.seq_flag, ctx.seq, ctx.seq
            ),
            format!("give {} as the whole sequence, image tokens included", ctx.seq_flag),
        );
    }
    let kind = v.forward.as_ref().map(|f| f.kind);
    if let Some(per) = v.forward.as_ref().map(|f| f.per_image).filter(|&p| p > 0) {
        if kind == Some(VisionKind::Llama4) {
            return check_llama4_tiles(model, n, per, ctx)
                .and_then(|()| check_image_job(v, n, train_vision, ctx));
        }
        if !n.is_multiple_of(per) {
            return refuse(
                format!(
                    "{} ({}) turns every image into {per} tokens (mm_tokens_per_image), so N must be a positive multiple of {per}",
                    model.label, model.desc.model_type
                ),
                format!(
                    "give --image-tokens {} for {} image(s) per sequence",
                    (n / per).max(1) * per,
                    (n / per).max(1)
                ),
            );
        }
    }
    if kind == Some(VisionKind::Pixtral) {
        // PixtralProcessor ends each of the image's rows of tokens with `[IMG_BREAK]` (the
        // last with `[IMG_END]`): text tokens the sequence must also hold
        let (rows, cols) = image_grid(u128::from(n));
        let needed = u128::from(n) + rows;
        if needed > u128::from(ctx.seq) {
            return refuse(
                format!(
                    "{} ({}) lays N image tokens out as {rows} rows of {cols} tokens, each row followed by an [IMG_BREAK]/[IMG_END] token, so the sequence needs {needed} tokens but {} is {}",
                    model.label, model.desc.model_type, ctx.seq_flag, ctx.seq
                ),
                format!("give {} {needed} or more, or fewer image tokens", ctx.seq_flag),
            );
        }
    }
    check_image_job(v, n, train_vision, ctx)
}

/// Llama 4: N image tokens are N / `per` tiles of `image_size`² pixels (144 each at Scout's
/// 336 px, 14-px patches and pixel-shuffle ratio 0.5; `Llama4Processor.replace_image_token`);
/// laid out as one image, they need `tiles + 2` separator tokens in the sequence
/// (`Llama4Processor._prompt_split_image`: `<|image_start|>`, a tile separator after each of
/// the tiles - 1 local tiles, `<|image|>` before the global tile, `<|image_end|>`; a one-tile
/// image has `<|image_start|>`, `<|image|>`, `<|image_end|>`). A non-multiple is refused:
/// the processor never makes part of a tile.
fn check_llama4_tiles(model: &ModelSource, n: u64, per: u64, ctx: ImageContext<'_>) -> Result<()> {
    let refuse = |reason: String, hint: String| -> Result<()> {
        Err(UserError::flag("--image-tokens", n, reason, hint).into())
    };
    if !n.is_multiple_of(per) {
        let down = n / per * per;
        let tiles = |t: u64| {
            if t == 1 {
                "1 tile".to_string()
            } else {
                format!("{t} tiles")
            }
        };
        let hint = if down == 0 {
            format!("give --image-tokens {per} for one tile")
        } else {
            format!(
                "give --image-tokens {down} ({}) or {} ({})",
                tiles(down / per),
                down + per,
                tiles(down / per + 1)
            )
        };
        return refuse(
            format!(
                "{} ({}) turns every image tile into {per} tokens ((image_size / patch_size)² · pixel_shuffle_ratio²), so N must be a positive multiple of {per}",
                model.label, model.desc.model_type
            ),
            hint,
        );
    }
    let tiles = n / per;
    let needed = u128::from(n) + u128::from(tiles) + 2;
    if needed > u128::from(ctx.seq) {
        return refuse(
            format!(
                "{} ({}) lays {tiles} tile(s) of one image out with {} separator tokens (<|image_start|>, tile separators, <|image|>, <|image_end|>), so the sequence needs {needed} tokens but {} is {}",
                model.label,
                model.desc.model_type,
                tiles + 2,
                ctx.seq_flag,
                ctx.seq
            ),
            format!("give {} {needed} or more, or fewer image tokens", ctx.seq_flag),
        );
    }
    Ok(())
}

/// What the job around the image tokens must not use (every family).
fn check_image_job(
    v: &memwall_core::model::VisionTower,
    n: u64,
    train_vision: bool,
    ctx: ImageContext<'_>,
) -> Result<()> {
    let refuse = |reason: String, hint: String| -> Result<()> {
        Err(UserError::flag("--image-tokens", n, reason, hint).into())
    };
    if train_vision {
        return refuse(
            "with --train-vision the vision tower's activations are saved for backward, which memwall does not simulate yet".into(),
            "drop --train-vision (the tower frozen, as most VLM recipes do), or drop --image-tokens and count the image tokens in --seq".into(),
        );
    }
    if let Some(l) = v
        .linears
        .iter()
        .find(|l| ctx.lora_targets.iter().any(|t| t == l.name))
    {
        return refuse(
            format!("--lora-targets {} also adapts the vision tower's `{}` linears (peft matches module names across the whole model), and with image inputs those adapters run and train, which memwall does not simulate", ctx.lora_targets.join(","), l.name),
            {
                let mut names: Vec<&str> = Vec::new();
                for l in &v.linears {
                    if !names.contains(&l.name) {
                        names.push(l.name);
                    }
                }
                format!("target only linears the vision tower does not have (its linears: {}), or drop --image-tokens and count the image tokens as text tokens", names.join(", "))
            },
        );
    }
    if ctx.amp {
        return refuse(
            "the vision tower under autocast is not simulated".into(),
            "use --precision bf16/fp16/fp32, or drop --image-tokens".into(),
        );
    }
    if ctx.padding_free {
        return refuse(
            "image inputs are simulated for padded batches only".into(),
            "drop --padding-free, or drop --image-tokens".into(),
        );
    }
    if ctx.megatron {
        return refuse(
            "Megatron-LM's estimate (TP/PP/CP/EP layouts) is a formula over the text layers that has no vision tower".into(),
            "use a data-parallel layout (--strategy ddp, zero1/2/3, fsdp-full, fsdp-grad-op, hsdp) or one GPU, or drop --image-tokens and count the image tokens in --seq".into(),
        );
    }
    Ok(())
}
