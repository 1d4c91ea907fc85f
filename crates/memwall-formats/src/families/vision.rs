//! Vision towers of vision-language models: the wrapper's `vision_config` (and its projector
//! keys) → exact parameter counts of the vision encoder and the multimodal projector, as
//! transformers 5.23 instantiates them (`*ForConditionalGeneration`). Paths are relative to
//! `transformers/models/`.

use crate::error::FormatError;
use crate::raw::HfConfig;
use crate::resolve::limits::*;
use memwall_core::model::{VisionForward, VisionKind, VisionLinear, VisionTower};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Images are at most 2^20 pixels on a side; patches and channels are small.
const MAX_IMAGE: u64 = 1 << 20;

/// The keys of a `vision_config` that size a tower; others are skipped.
#[derive(Debug, Default, Deserialize)]
struct RawVision {
    model_type: Option<String>,
    hidden_size: Option<u64>,
    intermediate_size: Option<u64>,
    num_hidden_layers: Option<u64>,
    depth: Option<u64>,
    embed_dim: Option<u64>,
    mlp_ratio: Option<f64>,
    num_channels: Option<u64>,
    in_channels: Option<u64>,
    in_chans: Option<u64>,
    image_size: Option<Box<RawValue>>,
    patch_size: Option<Box<RawValue>>,
    temporal_patch_size: Option<Box<RawValue>>,
    spatial_merge_size: Option<u64>,
    out_hidden_size: Option<u64>,
    vision_use_head: Option<bool>,
    vision_output_dim: Option<u64>,
    num_heads: Option<u64>,
    num_attention_heads: Option<u64>,
    window_size: Option<u64>,
    fullatt_block_indexes: Option<Vec<u64>>,
    projector_input_dim: Option<u64>,
    projector_output_dim: Option<u64>,
    pixel_shuffle_ratio: Option<f64>,
}

/// A parsed `vision_config` with the field names for errors.
struct Vision {
    raw: RawVision,
}

impl Vision {
    fn parse(top: &HfConfig) -> Result<Self, FormatError> {
        let raw = match top.vision_config.as_deref() {
            None => RawVision::default(),
            Some(v) if v.get().trim_start().starts_with('{') => serde_json::from_str(v.get())
                .map_err(|e| FormatError::WrongType {
                    field: "vision_config".into(),
                    message: e.to_string(),
                    hint: "`vision_config` holds the vision tower's sizes as non-negative integers"
                        .into(),
                })?,
            Some(_) => {
                return Err(FormatError::WrongType {
                    field: "vision_config".into(),
                    message: "expected an object".into(),
                    hint: "a vision-language config nests its vision tower under `vision_config`"
                        .into(),
                })
            }
        };
        Ok(Vision { raw })
    }

    /// A size with the vision config class's default, checked to lie in `1..=max`.
    fn size(
        &self,
        v: Option<u64>,
        field: &str,
        default: u64,
        max: u64,
    ) -> Result<u128, FormatError> {
        let v = v.unwrap_or(default);
        if v == 0 || v > max {
            return Err(FormatError::OutOfRange {
                field: format!("vision_config.{field}"),
                value: v.to_string(),
                reason: format!("must be between 1 and {max}"),
                hint: format!("`vision_config.{field}` is a size of the vision tower"),
            });
        }
        Ok(u128::from(v))
    }

    /// `image_size`/`patch_size`: an int, or a square `[n, n]` (the config classes allow both).
    fn side(&self, v: Option<&RawValue>, field: &str, default: u64) -> Result<u128, FormatError> {
        let n = match v {
            None => default,
            Some(raw) => match serde_json::from_str::<u64>(raw.get()) {
                Ok(n) => n,
                Err(_) => match serde_json::from_str::<Vec<u64>>(raw.get()) {
                    Ok(l) if l.len() == 2 && l[0] == l[1] => l[0],
                    _ => {
                        return Err(FormatError::Unsupported {
                            field: format!("vision_config.{field}"),
                            value: memwall_core::error::untrusted(raw.get()),
                            reason: "memwall sizes square images and patches only".into(),
                            hint: format!("give `{field}` as one integer"),
                        })
                    }
                },
            },
        };
        self.size(Some(n), field, default, MAX_IMAGE)
    }

    fn channels(&self, default: u64) -> Result<u128, FormatError> {
        let r = &self.raw;
        self.size(
            r.num_channels.or(r.in_channels).or(r.in_chans),
            "num_channels",
            default,
            64,
        )
    }

    fn tower(
        self,
        encoder: u128,
        projector: u128,
        default_type: &str,
        linears: &[(&'static str, u128, u128, u128)],
    ) -> Result<VisionTower, FormatError> {
        let too_big = |what: &str| FormatError::OutOfRange {
            field: "vision_config".into(),
            value: what.into(),
            reason: "the vision tower would have more than 2^64 parameters".into(),
            hint: "check the vision tower's sizes".into(),
        };
        Ok(VisionTower {
            model_type: self.raw.model_type.clone().map_or_else(
                || default_type.to_string(),
                |m| memwall_core::error::untrusted(&m),
            ),
            encoder_params: u64::try_from(encoder).map_err(|_| too_big("encoder"))?,
            projector_params: u64::try_from(projector).map_err(|_| too_big("projector"))?,
            trainable: false,
            linears: linears
                .iter()
                .map(|&(name, i, o, n)| {
                    Ok(VisionLinear {
                        name,
                        in_features: u64::try_from(i).map_err(|_| too_big("linear"))?,
                        out_features: u64::try_from(o).map_err(|_| too_big("linear"))?,
                        count: u64::try_from(n).map_err(|_| too_big("linear"))?,
                    })
                })
                .collect::<Result<_, FormatError>>()?,
            forward: None,
            image_tokens: None,
        })
    }
}

/// `Linear(i, o)` parameters, with or without a bias.
fn linear(i: u128, o: u128, bias: bool) -> u128 {
    i * o + if bias { o } else { 0 }
}

/// Gemma 3's SigLIP tower (`siglip/modeling_siglip.py` SiglipVisionTransformer; class defaults
/// from `SiglipVisionConfig`) and `Gemma3MultiModalProjector` (`gemma3/modeling_gemma3.py`:
/// `mm_input_projection_weight [vision_hidden, text_hidden]`, `mm_soft_emb_norm` RMSNorm).
pub(crate) fn siglip_gemma3(top: &HfConfig, text_hidden: u64) -> Result<VisionTower, FormatError> {
    let v = Vision::parse(top)?;
    let r = &v.raw;
    let h = v.size(r.hidden_size, "hidden_size", 768, MAX_HIDDEN)?;
    let i = v.size(
        r.intermediate_size,
        "intermediate_size",
        3072,
        MAX_INTERMEDIATE,
    )?;
    let layers = v.size(r.num_hidden_layers, "num_hidden_layers", 12, MAX_LAYERS)?;
    let c = v.channels(3)?;
    let image = v.side(r.image_size.as_deref(), "image_size", 224)?;
    let patch = v.side(r.patch_size.as_deref(), "patch_size", 16)?;
    // SiglipVisionEmbeddings: Conv2d(C, H, patch, stride=patch) with bias; position
    // embedding of (image // patch)² rows
    let positions = (image / patch) * (image / patch);
    let embeddings = linear(c * patch * patch, h, true) + positions * h;
    // SiglipEncoderLayer: layer_norm1/2 (LayerNorm), q/k/v/out_proj with bias, fc1/fc2 with bias
    let layer = 2 * 2 * h + 4 * linear(h, h, true) + linear(h, i, true) + linear(i, h, true);
    let mut encoder = embeddings + layers * layer + 2 * h; // post_layernorm
    if r.vision_use_head.unwrap_or(true) {
        // SiglipMultiheadAttentionPoolingHead: probe, nn.MultiheadAttention (in_proj 3H×H +
        // bias, out_proj H×H + bias), layernorm, SiglipMLP
        encoder += h
            + 3 * h * h
            + 3 * h
            + linear(h, h, true)
            + 2 * h
            + linear(h, i, true)
            + linear(i, h, true);
    }
    let projector = h * u128::from(text_hidden) + h;
    let use_head = r.vision_use_head.unwrap_or(true);
    let head = u128::from(use_head);
    let heads = v.size(r.num_attention_heads, "num_attention_heads", 12, MAX_HEADS)?;
    let mut tower = v.tower(
        encoder,
        projector,
        "siglip_vision_model",
        &[
            ("q_proj", h, h, layers),
            ("k_proj", h, h, layers),
            ("v_proj", h, h, layers),
            ("out_proj", h, h, layers + head),
            ("fc1", h, i, layers + head),
            ("fc2", i, h, layers + head),
        ],
    )?;
    // The image forward (`--image-tokens`), simulated when the projector's pooling is exact:
    // Gemma3MultiModalProjector pools the (image // patch)² patches with
    // `kernel = patches_per_image // int(mm_tokens_per_image ** 0.5)` to mm_tokens_per_image
    // tokens; other shapes make `get_placeholder_mask` fail in transformers, so they are
    // left to the text-token approximation (no forward). Gemma3Config default: 256 tokens.
    let side = image / patch;
    let tokens = u128::from(top.mm_tokens_per_image.unwrap_or(256));
    let tps = (1..=side)
        .take_while(|t| t * t <= tokens)
        .last()
        .unwrap_or(0);
    if !use_head
        && tps > 0
        && tps * tps == tokens
        && side.is_multiple_of(tps)
        && h.is_multiple_of(heads)
    {
        let as_u64 = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        tower.forward = Some(VisionForward {
            patch_in: as_u64(c * patch * patch),
            width: as_u64(h),
            heads: as_u64(heads),
            mlp: as_u64(i),
            depth: as_u64(layers),
            merge: as_u64(side / tps),
            out: text_hidden,
            kind: VisionKind::Gemma3Siglip,
            window: 0,
            full_blocks: Vec::new(),
            per_image: as_u64(tokens),
            adapter: 0,
        });
    }
    Ok(tower)
}

/// Llama 4's vision model (`llama4/modeling_llama4.py` Llama4VisionModel, defaults from
/// `Llama4VisionConfig`) and `Llama4MultiModalProjector` (`linear_1`, no bias).
pub(crate) fn llama4_vision(top: &HfConfig, text_hidden: u64) -> Result<VisionTower, FormatError> {
    let v = Vision::parse(top)?;
    let r = &v.raw;
    let h = v.size(r.hidden_size, "hidden_size", 768, MAX_HIDDEN)?;
    let i = v.size(
        r.intermediate_size,
        "intermediate_size",
        5632,
        MAX_INTERMEDIATE,
    )?;
    let layers = v.size(r.num_hidden_layers, "num_hidden_layers", 34, MAX_LAYERS)?;
    let c = v.channels(3)?;
    let image = v.side(r.image_size.as_deref(), "image_size", 448)?;
    let patch = v.side(r.patch_size.as_deref(), "patch_size", 14)?;
    let out = v.size(r.vision_output_dim, "vision_output_dim", 7680, MAX_HIDDEN)?;
    let p_in = v.size(
        r.projector_input_dim,
        "projector_input_dim",
        4096,
        MAX_HIDDEN,
    )?;
    let p_out = v.size(
        r.projector_output_dim,
        "projector_output_dim",
        4096,
        MAX_HIDDEN,
    )?;
    // class_embedding [H], positional_embedding_vlm [(image // patch)² + 1, H],
    // Llama4UnfoldConvolution linear(C·patch², H, bias=False), layernorm_pre/post (LayerNorm)
    let positions = (image / patch) * (image / patch) + 1;
    let embeddings = h + positions * h + linear(c * patch * patch, h, false) + 2 * 2 * h;
    // Llama4VisionEncoderLayer: q/k/v/o_proj with bias, Llama4VisionMLP fc1/fc2 with bias,
    // input_layernorm/post_attention_layernorm (LayerNorm)
    let layer = 4 * linear(h, h, true) + linear(h, i, true) + linear(i, h, true) + 2 * 2 * h;
    // Llama4VisionPixelShuffleMLP → Llama4VisionMLP2: fc1 Linear(intermediate_size,
    // projector_input_dim), fc2 Linear(projector_output_dim, projector_output_dim), no biases
    let adapter = linear(i, p_in, false) + linear(p_out, p_out, false);
    let encoder = embeddings + layers * layer + adapter;
    let projector = linear(out, u128::from(text_hidden), false);
    let heads = v.size(r.num_attention_heads, "num_attention_heads", 16, MAX_HEADS)?;
    let ratio = r.pixel_shuffle_ratio.unwrap_or(0.5);
    let mut tower = v.tower(
        encoder,
        projector,
        "llama4_vision_model",
        &[
            ("linear", c * patch * patch, h, 1),
            ("q_proj", h, h, layers),
            ("k_proj", h, h, layers),
            ("v_proj", h, h, layers),
            ("o_proj", h, h, layers),
            ("fc1", h, i, layers),
            ("fc2", i, h, layers),
            ("fc1", i, p_in, 1),
            ("fc2", p_out, p_out, 1),
            ("linear_1", out, u128::from(text_hidden), 1),
        ],
    )?;
    // The image forward (`--image-tokens`, `memory/hf/llama4_vision.rs`) where the shapes chain
    // as Llama4VisionModel runs them: heads divide the width (`head_dim = hidden_size //
    // num_attention_heads`), `pixel_shuffle_ratio` is 1/k for a whole k dividing the tile's
    // `image_size // patch_size` patches a side (`pixel_shuffle` views them as a square grid),
    // the shuffled width k²·hidden_size is `intermediate_size` (Llama4VisionMLP2.fc1's input),
    // and fc1's output, fc2 and the projector's input agree (`projector_input_dim` =
    // `projector_output_dim` = `vision_output_dim`). Otherwise `--image-tokens` is refused by
    // name (the real model would not run).
    let side = image / patch;
    let k = if ratio.is_finite() && ratio > 0.0 && ratio <= 1.0 {
        let k = (1.0 / ratio).round();
        ((k * ratio - 1.0).abs() < 1e-9).then_some(k as u128)
    } else {
        None
    };
    if let Some(k) = k.filter(|&k| k >= 1 && side.is_multiple_of(k)) {
        if h.is_multiple_of(heads) && i == h * k * k && p_in == p_out && p_out == out {
            let as_u64 = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
            tower.forward = Some(VisionForward {
                patch_in: as_u64(c * patch * patch),
                width: as_u64(h),
                heads: as_u64(heads),
                mlp: as_u64(i),
                depth: as_u64(layers),
                merge: as_u64(k),
                out: text_hidden,
                kind: VisionKind::Llama4,
                window: 0,
                full_blocks: Vec::new(),
                per_image: as_u64((side / k) * (side / k)),
                adapter: as_u64(p_out),
            });
        }
    }
    Ok(tower)
}

/// Qwen2-VL's vision transformer (`qwen2_vl/modeling_qwen2_vl.py`
/// Qwen2VisionTransformerPretrainedModel, defaults from `Qwen2VLVisionConfig`); its
/// `PatchMerger` projects into `vision_config.hidden_size`.
pub(crate) fn qwen2_vl_vision(top: &HfConfig) -> Result<VisionTower, FormatError> {
    let v = Vision::parse(top)?;
    let r = &v.raw;
    let e = v.size(r.embed_dim, "embed_dim", 1280, MAX_HIDDEN)?;
    let out = v.size(r.hidden_size, "hidden_size", 3584, MAX_HIDDEN)?;
    let depth = v.size(r.depth, "depth", 32, MAX_LAYERS)?;
    let ratio = r.mlp_ratio.unwrap_or(4.0);
    if !(ratio.is_finite() && ratio > 0.0 && ratio <= 1024.0) {
        return Err(FormatError::OutOfRange {
            field: "vision_config.mlp_ratio".into(),
            value: ratio.to_string(),
            reason: "must be a positive number up to 1024".into(),
            hint: "Qwen2-VL uses 4".into(),
        });
    }
    // mlp_hidden_dim = int(embed_dim * mlp_ratio)
    let m = (e as f64 * ratio).floor() as u128;
    let c = v.channels(3)?;
    let patch = v.side(r.patch_size.as_deref(), "patch_size", 14)?;
    let t = v.side(r.temporal_patch_size.as_deref(), "temporal_patch_size", 2)?;
    let merge = v.size(r.spatial_merge_size, "spatial_merge_size", 2, 64)?;
    // PatchEmbed: Conv3d(C, E, (t, patch, patch), bias=False)
    let embed = c * t * patch * patch * e;
    // Qwen2VLVisionBlock: norm1/norm2 LayerNorm, attn qkv Linear(E, 3E) + proj Linear(E, E)
    // with biases, VisionMlp fc1/fc2 with biases
    let block = 2 * 2 * e
        + linear(e, 3 * e, true)
        + linear(e, e, true)
        + linear(e, m, true)
        + linear(m, e, true);
    let encoder = embed + depth * block;
    // PatchMerger: ln_q LayerNorm(E), Linear(E·merge², E·merge²), GELU, Linear(E·merge², out)
    let wide = e * merge * merge;
    let projector = 2 * e + linear(wide, wide, true) + linear(wide, out, true);
    let heads = v.size(r.num_heads, "num_heads", 16, MAX_HEADS)?;
    let mut tower = v.tower(
        encoder,
        projector,
        "qwen2_vl",
        &[
            ("qkv", e, 3 * e, depth),
            ("proj", e, e, depth),
            ("fc1", e, m, depth),
            ("fc2", m, e, depth),
            ("0", wide, wide, 1),
            ("2", wide, out, 1),
        ],
    )?;
    let as_u64 = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
    tower.forward = Some(VisionForward {
        patch_in: as_u64(c * t * patch * patch),
        width: as_u64(e),
        heads: as_u64(heads),
        mlp: as_u64(m),
        depth: as_u64(depth),
        merge: as_u64(merge),
        out: as_u64(out),
        kind: VisionKind::Qwen2Vl,
        window: 0,
        full_blocks: Vec::new(),
        per_image: 0,
        adapter: 0,
    });
    Ok(tower)
}

/// Qwen2.5-VL's vision transformer (`qwen2_5_vl/modeling_qwen2_5_vl.py`
/// Qwen2_5_VisionTransformerPretrainedModel, defaults from `Qwen2_5_VLVisionConfig`): RMSNorms,
/// gated MLP with biases, `Qwen2_5_VLPatchMerger` into `out_hidden_size`.
pub(crate) fn qwen2_5_vl_vision(top: &HfConfig) -> Result<VisionTower, FormatError> {
    let v = Vision::parse(top)?;
    let r = &v.raw;
    let h = v.size(r.hidden_size, "hidden_size", 3584, MAX_HIDDEN)?;
    let i = v.size(
        r.intermediate_size,
        "intermediate_size",
        3420,
        MAX_INTERMEDIATE,
    )?;
    let depth = v.size(r.depth, "depth", 32, MAX_LAYERS)?;
    let out = v.size(r.out_hidden_size, "out_hidden_size", 3584, MAX_HIDDEN)?;
    let c = v.channels(3)?;
    let patch = v.side(r.patch_size.as_deref(), "patch_size", 14)?;
    let t = v.side(r.temporal_patch_size.as_deref(), "temporal_patch_size", 2)?;
    let merge = v.size(r.spatial_merge_size, "spatial_merge_size", 2, 64)?;
    let embed = c * t * patch * patch * h;
    // Qwen2_5_VLVisionBlock: norm1/norm2 RMSNorm, qkv + proj with biases, Qwen2_5_VLMLP
    // gate/up/down_proj with biases
    let block = 2 * h
        + linear(h, 3 * h, true)
        + linear(h, h, true)
        + 2 * linear(h, i, true)
        + linear(i, h, true);
    let encoder = embed + depth * block;
    let wide = h * merge * merge;
    let projector = h + linear(wide, wide, true) + linear(wide, out, true);
    let heads = v.size(r.num_heads, "num_heads", 16, MAX_HEADS)?;
    // Qwen2_5_VLVisionConfig defaults: window_size 112, fullatt_block_indexes [7, 15, 23, 31]
    let window_px = v.size(r.window_size, "window_size", 112, MAX_IMAGE)?;
    let full_blocks = r
        .fullatt_block_indexes
        .clone()
        .unwrap_or_else(|| vec![7, 15, 23, 31]);
    let mut tower = v.tower(
        encoder,
        projector,
        "qwen2_5_vl",
        &[
            ("qkv", h, 3 * h, depth),
            ("proj", h, h, depth),
            ("gate_proj", h, i, depth),
            ("up_proj", h, i, depth),
            ("down_proj", i, h, depth),
            ("0", wide, wide, 1),
            ("2", wide, out, 1),
        ],
    )?;
    let as_u64 = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
    tower.forward = Some(VisionForward {
        patch_in: as_u64(c * t * patch * patch),
        width: as_u64(h),
        heads: as_u64(heads),
        mlp: as_u64(i),
        depth: as_u64(depth),
        merge: as_u64(merge),
        out: as_u64(out),
        kind: VisionKind::Qwen25Vl,
        // vit_merger_window_size = window_size // spatial_merge_size // patch_size
        // (transformers vision_utils.py get_vision_window_index)
        window: as_u64(window_px / merge / patch),
        full_blocks,
        per_image: 0,
        adapter: 0,
    });
    Ok(tower)
}

/// Mistral 3's Pixtral tower (`pixtral/modeling_pixtral.py` PixtralVisionModel, defaults from
/// `PixtralVisionConfig`) and `Mistral3MultiModalProjector` (`mistral3/modeling_mistral3.py`:
/// RMSNorm, `Mistral3PatchMerger.merging_layer`, `linear_1`, `linear_2`).
pub(crate) fn pixtral_mistral3(
    top: &HfConfig,
    text_hidden: u64,
) -> Result<VisionTower, FormatError> {
    let v = Vision::parse(top)?;
    let r = &v.raw;
    let h = v.size(r.hidden_size, "hidden_size", 1024, MAX_HIDDEN)?;
    let i = v.size(
        r.intermediate_size,
        "intermediate_size",
        4096,
        MAX_INTERMEDIATE,
    )?;
    let layers = v.size(r.num_hidden_layers, "num_hidden_layers", 24, MAX_LAYERS)?;
    let c = v.channels(3)?;
    let patch = v.side(r.patch_size.as_deref(), "patch_size", 16)?;
    // patch_conv Conv2d(C, H, patch, bias=False), ln_pre RMSNorm; PixtralAttentionLayer:
    // attention_norm, ffn_norm (RMSNorm), q/k/v/o_proj Linear(H, H, bias=False), gated
    // feed_forward without biases
    let encoder = c * patch * patch * h + h + layers * (2 * h + 4 * h * h + 3 * h * i);
    // Mistral3Config: spatial_merge_size=2, multimodal_projector_bias=False,
    // vision_feature_layer=-1 (an int: one feature layer; a list: one per entry)
    let merge = u128::from(top.spatial_merge_size.unwrap_or(2));
    if merge == 0 || merge > 64 {
        return Err(FormatError::OutOfRange {
            field: "spatial_merge_size".into(),
            value: merge.to_string(),
            reason: "must be between 1 and 64".into(),
            hint: "Mistral 3 uses 2".into(),
        });
    }
    // the image forward is simulated for the last layer's features only (the default)
    let mut last_layer = true;
    let feature_layers = match top.vision_feature_layer.as_deref() {
        None => 1,
        Some(raw) => match serde_json::from_str::<i64>(raw.get()) {
            Ok(layer) => {
                last_layer = layer == -1;
                1
            }
            Err(_) => match serde_json::from_str::<Vec<i64>>(raw.get()) {
                Ok(l) if !l.is_empty() && l.len() <= 1024 => {
                    last_layer = false;
                    l.len() as u128
                }
                _ => {
                    return Err(FormatError::WrongType {
                        field: "vision_feature_layer".into(),
                        message: format!(
                            "expected an integer or a list of integers, found {}",
                            memwall_core::error::untrusted(raw.get())
                        ),
                        hint: "Mistral 3 uses -1 (the last layer)".into(),
                    })
                }
            },
        },
    };
    let bias = top.multimodal_projector_bias.unwrap_or(false);
    let t = u128::from(text_hidden);
    let projector = h
        + linear(h * merge * merge, h, false)
        + linear(h * feature_layers, t, bias)
        + linear(t, t, bias);
    let heads = v.size(r.num_attention_heads, "num_attention_heads", 16, MAX_HEADS)?;
    let patch_in = c * patch * patch;
    let mut tower = v.tower(
        encoder,
        projector,
        "pixtral",
        &[
            ("q_proj", h, h, layers),
            ("k_proj", h, h, layers),
            ("v_proj", h, h, layers),
            ("o_proj", h, h, layers),
            ("gate_proj", h, i, layers),
            ("up_proj", h, i, layers),
            ("down_proj", i, h, layers),
            ("merging_layer", h * merge * merge, h, 1),
            ("linear_1", h * feature_layers, t, 1),
            ("linear_2", t, t, 1),
        ],
    )?;
    // The image forward (`--image-tokens`, `memory/hf/pixtral.rs`) for the last layer's
    // features (`vision_feature_layer = -1`; other layers keep other hidden states alive) and
    // heads that divide the width (`PixtralAttention.head_dim = hidden_size // num_heads`).
    if last_layer && h.is_multiple_of(heads) {
        let as_u64 = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        tower.forward = Some(VisionForward {
            patch_in: as_u64(patch_in),
            width: as_u64(h),
            heads: as_u64(heads),
            mlp: as_u64(i),
            depth: as_u64(layers),
            merge: as_u64(merge),
            out: text_hidden,
            kind: VisionKind::Pixtral,
            window: 0,
            full_blocks: Vec::new(),
            per_image: 0,
            adapter: 0,
        });
    }
    Ok(tower)
}
