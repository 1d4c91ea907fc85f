//! safetensors file prefix → header → checkpoint view, as `memwall` reads a shard: 8 bytes,
//! `prefix_len`, the header, then the index and the cross-check against a small model.
//! Any input must give Ok or a typed error: never a panic, an overflow or unbounded memory
//! (the header is bounded by `safetensors::MAX_HEADER_BYTES` whatever the file claims).
#![no_main]

use libfuzzer_sys::fuzz_target;
use memwall_formats::checkpoint::Checkpoint;
use memwall_formats::safetensors::{check_shards, parse_header, parse_index, prefix_len};

const TINY: &str = r#"{"model_type":"llama","vocab_size":1000,"hidden_size":256,"intermediate_size":512,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2}"#;

fuzz_target!(|data: &[u8]| {
    // the claimed file length: the data, or (first byte odd) a much longer sparse file
    let extra = if data.first().is_some_and(|b| b & 1 == 1) {
        1 << 40
    } else {
        0
    };
    let file_len = data.len() as u64 + extra;
    if let Ok(n) = prefix_len(data, file_len) {
        let prefix = &data[..data.len().min(usize::try_from(n).unwrap_or(usize::MAX))];
        if let Ok(h) = parse_header(prefix, file_len) {
            let _ = h.bytes_by_dtype();
            let ck = Checkpoint::from_safetensors(std::slice::from_ref(&h));
            let _ = (ck.total_bytes(), ck.layer_bytes(), ck.storage().describe());
            if let Ok(desc) = memwall_formats::parse_hf_config(TINY) {
                let _ = ck.cross_check(&desc);
            }
        }
    }
    // the same bytes as a model.safetensors.index.json
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(idx) = parse_index(text) {
            let _ = (idx.total_size(), idx.shards());
            let _ = check_shards(&idx, &[]);
        }
    }
});
