//! Property: the header readers never panic, on arbitrary bytes or on mutated real headers,
//! and whatever they accept the GGUF mapping handles without panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_formats::checkpoint::Checkpoint;
use memwall_formats::{gguf, gguf_to_model, parse_quantization_config, safetensors};
use proptest::prelude::*;

fn valid_gguf() -> (Vec<u8>, u64) {
    crate::gguf::Gguf::new()
        .str("general.architecture", "llama")
        .u32("llama.block_count", 2)
        .u32("llama.embedding_length", 64)
        .u32("llama.attention.head_count", 4)
        .u32("llama.feed_forward_length", 128)
        .strings("tokenizer.ggml.tokens", 10)
        .tensor("token_embd.weight", &[64, 10], gguf::GgufTensorType::Q8_0)
        .tensor("blk.0.attn_q.weight", &[64, 64], gguf::GgufTensorType::Q4_0)
        .tensor("blk.1.attn_q.weight", &[64, 64], gguf::GgufTensorType::F16)
        .build()
}

fn valid_safetensors() -> (Vec<u8>, u64) {
    let json = r#"{"__metadata__":{"format":"pt"},"model.layers.0.mlp.up_proj.weight":{"dtype":"BF16","shape":[4,8],"data_offsets":[0,64]},"model.layers.0.mlp.up_proj.weight_scale_inv":{"dtype":"F32","shape":[1,1],"data_offsets":[64,68]}}"#;
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json.as_bytes());
    let len = b.len() as u64 + 68;
    (b, len)
}

fn exercise_gguf(bytes: &[u8], len: u64) {
    if let Ok(h) = gguf::parse_header(bytes, len) {
        let _ = gguf_to_model(&h);
        let c = Checkpoint::from_gguf(std::slice::from_ref(&h));
        let _ = (
            c.storage(),
            c.layer_bytes(),
            h.weight_format(),
            h.bytes_by_type(),
        );
    }
}

fn exercise_safetensors(bytes: &[u8], len: u64) {
    let _ = safetensors::prefix_len(bytes, len);
    if let Ok(h) = safetensors::parse_header(bytes, len) {
        let c = Checkpoint::from_safetensors(std::slice::from_ref(&h));
        let _ = (c.storage(), c.layer_bytes(), h.bytes_by_dtype());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), extra in any::<u64>()) {
        let len = (bytes.len() as u64).saturating_add(extra % 4096);
        exercise_gguf(&bytes, len);
        exercise_gguf(&bytes, extra);
        exercise_safetensors(&bytes, len);
        exercise_safetensors(&bytes, extra);
        let mut g = b"GGUF\x03\x00\x00\x00".to_vec();
        g.extend_from_slice(&bytes);
        exercise_gguf(&g, len.saturating_add(8));
        if let Ok(text) = std::str::from_utf8(&bytes) {
            let _ = safetensors::parse_index(text);
            let _ = parse_quantization_config(text);
        }
    }

    #[test]
    fn mutated_gguf_headers_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), cut in any::<usize>(), len_delta in -64i64..64) {
        let (mut b, len) = valid_gguf();
        for (at, v) in flips {
            let n = b.len();
            b[at % n] = v;
        }
        let cut = cut % (b.len() + 1);
        let len = len.saturating_add_signed(len_delta);
        exercise_gguf(&b, len);
        exercise_gguf(&b[..cut], len);
    }

    #[test]
    fn mutated_safetensors_headers_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8), len_delta in -64i64..64) {
        let (mut b, len) = valid_safetensors();
        for (at, v) in flips {
            let n = b.len();
            b[at % n] = v;
        }
        exercise_safetensors(&b, len.saturating_add_signed(len_delta));
    }
}

#[test]
fn the_valid_bases_parse() {
    let (b, len) = valid_gguf();
    gguf_to_model(&gguf::parse_header(&b, len).unwrap()).unwrap();
    let (b, len) = valid_safetensors();
    safetensors::parse_header(&b, len).unwrap();
}
