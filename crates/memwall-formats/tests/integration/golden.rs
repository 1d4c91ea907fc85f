//! Golden parameter counts: every family, counted by transformers 5.23 itself
//! (`tests/golden/make_golden.py` writes `tests/golden/param_counts.json`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_formats::{parse_hf_config, supported_model_types};
use serde::Deserialize;
use std::collections::BTreeSet;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Golden {
    transformers: String,
    rows: Vec<Row>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    file: String,
    model_type: String,
    embeddings: u64,
    layers: u64,
    final_norm: u64,
    lm_head: u64,
    total: u64,
    /// Vision tower + projector of a vision-language wrapper.
    #[serde(default)]
    vision: u64,
}

fn golden() -> Golden {
    let text =
        std::fs::read_to_string(super::tests_dir().join("golden/param_counts.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn golden_counts_match_transformers_to_the_parameter() {
    let g = golden();
    assert_eq!(g.transformers, "5.23.0");
    let mut failures = Vec::new();
    for row in &g.rows {
        let desc = match parse_hf_config(&super::config(&row.file)) {
            Ok(d) => d,
            Err(e) => {
                failures.push(format!("{}: {e}", row.file));
                continue;
            }
        };
        assert_eq!(desc.model_type, row.model_type, "{}", row.file);
        let c = desc.param_counts().unwrap();
        let got = (
            c.embeddings,
            c.layers,
            c.final_norm,
            c.lm_head,
            c.vision,
            c.total,
        );
        let want = (
            row.embeddings,
            row.layers,
            row.final_norm,
            row.lm_head,
            row.vision,
            row.total,
        );
        if got != want {
            failures.push(format!(
                "{}: (embeddings, layers, final_norm, lm_head, vision, total) got {got:?}, transformers {want:?} (total off by {})",
                row.file,
                i128::from(c.total) - i128::from(row.total)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_supported_family_has_a_golden_row() {
    let covered: BTreeSet<String> = golden().rows.into_iter().map(|r| r.model_type).collect();
    let missing: Vec<&str> = supported_model_types()
        .iter()
        .copied()
        .filter(|t| !covered.contains(*t))
        .collect();
    assert!(
        missing.is_empty(),
        "families without a golden row: {missing:?}"
    );
}

/// Gemma 3's image forward shape (`--image-tokens`): 896² images in 14-pixel patches are
/// 64 × 64 patches, pooled by 4 × 4 to the 256 `mm_tokens_per_image` tokens; a projector that
/// would not pool to exactly that many tokens gets no image forward (transformers'
/// placeholder check would fail), only the weights.
#[test]
fn gemma3_image_forward_shape() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/configs/gemma-3-4b-pt.json"
    );
    let json = std::fs::read_to_string(path).unwrap();
    let m = parse_hf_config(&json).unwrap();
    let f = m.vision.as_ref().unwrap().forward.clone().unwrap();
    assert_eq!(
        (
            f.patch_in,
            f.width,
            f.heads,
            f.mlp,
            f.depth,
            f.merge,
            f.out,
            f.per_image
        ),
        (3 * 14 * 14, 1152, 16, 4304, 27, 4, 2560, 256)
    );
    let odd = json.replace("\"mm_tokens_per_image\":256", "\"mm_tokens_per_image\":200");
    assert_ne!(odd, json);
    let m = parse_hf_config(&odd).unwrap();
    assert!(m.vision.as_ref().unwrap().forward.is_none());
}

/// Mistral 3's image forward shape (`--image-tokens`): the Pixtral tower at its widths, 2 × 2
/// patches merged per token, projected into the text width; only the last layer's features
/// (`vision_feature_layer = -1`) get an image forward, other feature layers only the weights.
#[test]
fn mistral3_image_forward_shape() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/configs/mistral-small-3.1-24b-instruct.json"
    );
    let json = std::fs::read_to_string(path).unwrap();
    let m = parse_hf_config(&json).unwrap();
    let f = m.vision.as_ref().unwrap().forward.clone().unwrap();
    assert_eq!(f.kind, memwall_core::model::VisionKind::Pixtral);
    assert_eq!(
        (
            f.patch_in,
            f.width,
            f.heads,
            f.mlp,
            f.depth,
            f.merge,
            f.out,
            f.per_image
        ),
        (3 * 14 * 14, 1024, 16, 4096, 24, 2, 5120, 0)
    );
    for other in ["-2", "[-1, -2]"] {
        let odd = json.replace(
            "\"vision_feature_layer\": -1",
            &format!("\"vision_feature_layer\": {other}"),
        );
        assert_ne!(odd, json);
        let m = parse_hf_config(&odd).unwrap();
        assert!(m.vision.as_ref().unwrap().forward.is_none(), "{other}");
    }
}

/// Llama 4's image forward shape (`--image-tokens`): Scout's tower (meta-llama/
/// Llama-4-Scout-17B-16E-Instruct `vision_config`: 1408 wide, 16 heads, 5632 MLP, 34 layers,
/// 336-px tiles of 14-px patches, pixel-shuffle ratio 0.5, projector 4096) makes 144 tokens per
/// tile (24 × 24 patches shuffled by 2 × 2); shapes that would not chain through
/// `pixel_shuffle` and `Llama4VisionMLP2` (the real model fails) get no image forward, only
/// the weights.
#[test]
fn llama4_image_forward_shape() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/configs/llama-4-scout-17b-16e-instruct.json"
    );
    let json = std::fs::read_to_string(path).unwrap();
    let m = parse_hf_config(&json).unwrap();
    let f = m.vision.as_ref().unwrap().forward.clone().unwrap();
    assert_eq!(f.kind, memwall_core::model::VisionKind::Llama4);
    assert_eq!(
        (
            f.patch_in,
            f.width,
            f.heads,
            f.mlp,
            f.depth,
            f.merge,
            f.out,
            f.per_image,
            f.adapter
        ),
        (3 * 14 * 14, 1408, 16, 5632, 34, 2, 5120, 144, 4096)
    );
    for (from, to) in [
        // 4² · 1408 is not fc1's 5632 inputs
        (
            "\"pixel_shuffle_ratio\": 0.5",
            "\"pixel_shuffle_ratio\": 0.25",
        ),
        // not 1/k for a whole k
        (
            "\"pixel_shuffle_ratio\": 0.5",
            "\"pixel_shuffle_ratio\": 0.4",
        ),
        // fc2 (4096 → 4096) cannot take fc1's 2048 outputs
        (
            "\"projector_input_dim\": 4096",
            "\"projector_input_dim\": 2048",
        ),
        // 1408 is not a multiple of 15 heads
        ("\"num_attention_heads\": 16", "\"num_attention_heads\": 15"),
    ] {
        let odd = json.replace(from, to);
        assert_ne!(odd, json, "{to}");
        let m = parse_hf_config(&odd).unwrap();
        assert!(m.vision.as_ref().unwrap().forward.is_none(), "{to}");
    }
}
