//! Checkpoint tensors against a model description: exact bytes and the first mismatch.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_formats::checkpoint::{layer_index, Checkpoint, Storage};
use memwall_formats::safetensors::parse_header;
use memwall_formats::{parse_hf_config, FormatError};

const TINY: &str = r#"{"model_type":"llama","vocab_size":1000,"hidden_size":64,"intermediate_size":128,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2}"#;

/// The tensors transformers saves for TINY (bf16), optionally with one more layer.
fn tiny_tensors(layers: usize, intermediate: u64) -> Vec<(String, Vec<u64>)> {
    let mut t = vec![
        ("model.embed_tokens.weight".to_string(), vec![1000, 64]),
        ("model.norm.weight".into(), vec![64]),
        ("lm_head.weight".into(), vec![1000, 64]),
    ];
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        for (n, s) in [
            ("input_layernorm.weight", vec![64]),
            ("self_attn.q_proj.weight", vec![64, 64]),
            ("self_attn.k_proj.weight", vec![32, 64]),
            ("self_attn.v_proj.weight", vec![32, 64]),
            ("self_attn.o_proj.weight", vec![64, 64]),
            ("self_attn.rotary_emb.inv_freq", vec![8]),
            ("post_attention_layernorm.weight", vec![64]),
            ("mlp.gate_proj.weight", vec![intermediate, 64]),
            ("mlp.up_proj.weight", vec![intermediate, 64]),
            ("mlp.down_proj.weight", vec![64, intermediate]),
        ] {
            t.push((format!("{p}.{n}"), s));
        }
    }
    t
}

fn checkpoint(tensors: &[(String, Vec<u64>)]) -> Checkpoint {
    let mut offset = 0u64;
    let mut entries = Vec::new();
    for (name, shape) in tensors {
        let (dtype, size) = if name.ends_with("inv_freq") {
            ("F32", 4)
        } else {
            ("BF16", 2)
        };
        let bytes = shape.iter().product::<u64>() * size;
        entries.push(format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{offset},{}]}}",
            offset + bytes
        ));
        offset += bytes;
    }
    let json = format!("{{{}}}", entries.join(","));
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json.as_bytes());
    let len = b.len() as u64 + offset;
    Checkpoint::from_safetensors(&[parse_header(&b, len).unwrap()])
}

#[test]
fn a_matching_checkpoint_passes_and_its_bytes_are_exact() {
    let d = parse_hf_config(TINY).unwrap();
    let c = checkpoint(&tiny_tensors(2, 128));
    let cc = c.cross_check(&d).unwrap();
    assert_eq!(
        (cc.layers, cc.extra_layers, cc.params_compared),
        (2, 0, true)
    );
    assert_eq!(c.storage(), Storage::Float("BF16".into()));
    // weights as stored: every parameter in bf16, plus the two fp32 inv_freq buffers
    let params = d.param_counts().unwrap().total;
    assert_eq!(c.total_bytes(), params * 2 + 2 * 8 * 4);
    let lb = c.layer_bytes();
    assert_eq!(lb.per_layer.len(), 2);
    assert_eq!(lb.other, 2 * (1000 * 64 * 2) + 64 * 2);
}

#[test]
fn mismatches_are_named() {
    let d = parse_hf_config(TINY).unwrap();
    // weights of a model with a wider MLP
    let e = checkpoint(&tiny_tensors(2, 256))
        .cross_check(&d)
        .unwrap_err();
    assert!(matches!(e, FormatError::Inconsistent { .. }));
    assert!(e.to_string().contains("layer 0 stores"), "{e}");
    // a missing layer
    let e = checkpoint(&tiny_tensors(1, 128))
        .cross_check(&d)
        .unwrap_err();
    assert!(e.to_string().contains("no tensors for layer 1"), "{e}");
    // an extra trailing layer (DeepSeek-V3's MTP layer) is counted, not refused
    let cc = checkpoint(&tiny_tensors(3, 128)).cross_check(&d).unwrap();
    assert_eq!(cc.extra_layers, 1);
}

#[test]
fn layer_prefixes_of_transformers_and_llama_cpp() {
    for (name, i) in [
        ("model.layers.12.mlp.up_proj.weight", Some(12)),
        (
            "model.language_model.layers.3.self_attn.q_proj.weight",
            Some(3),
        ),
        ("transformer.h.0.attn.c_attn.weight", Some(0)),
        ("gpt_neox.layers.7.attention.dense.weight", Some(7)),
        ("model.decoder.layers.1.fc1.weight", Some(1)),
        ("blk.31.ffn_down.weight", Some(31)),
        ("model.layers.x.mlp", None),
        ("model.layers.99999999999999999999999.a", None),
        ("lm_head.weight", None),
        ("token_embd.weight", None),
    ] {
        assert_eq!(layer_index(name), i, "{name}");
    }
}
