//! GGUF file prefix → header → model description → checkpoint view, as `memwall` reads a
//! `.gguf` (growing the prefix while the parser asks for more). Any input must give Ok or a
//! typed error: never a panic, an overflow or memory in proportion to a claimed count.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memwall_formats::checkpoint::Checkpoint;
use memwall_formats::gguf::parse_header;
use memwall_formats::FormatError;

fuzz_target!(|data: &[u8]| {
    // the claimed file length: the data, or (last byte odd) a much longer sparse file
    let extra = if data.last().is_some_and(|b| b & 1 == 1) {
        1 << 40
    } else {
        0
    };
    let file_len = data.len() as u64 + extra;
    // first a short prefix, then what the parser asks for (bounded by the data here)
    let mut have = data.len().min(64);
    let header = loop {
        match parse_header(&data[..have], file_len) {
            Err(FormatError::NeedMoreBytes { needed, .. })
                if (have as u64) < needed && have < data.len() =>
            {
                // grow at least geometrically, as memwall does (`needed` is a lower bound)
                have = usize::try_from(needed)
                    .unwrap_or(usize::MAX)
                    .max(have.saturating_mul(2))
                    .min(data.len());
            }
            other => break other,
        }
    };
    let Ok(h) = header else { return };
    let _ = (
        h.weight_format(),
        h.split(),
        h.bytes_by_type(),
        h.tensor_bytes(),
    );
    let ck = Checkpoint::from_gguf(std::slice::from_ref(&h));
    let _ = (ck.total_bytes(), ck.layer_bytes(), ck.storage().describe());
    // The description costs O(layers); deep models are valid but only slow the fuzzer down
    // (as in config_estimate).
    let layers = h
        .architecture()
        .and_then(|a| h.get(&format!("{a}.block_count")))
        .and_then(|v| v.as_u64())
        .unwrap_or(0);
    if layers > 64 {
        return;
    }
    if let Ok(desc) = memwall_formats::gguf_to_model(&h) {
        let _ = desc.param_counts();
        let _ = ck.cross_check(&desc);
    }
    let _ = memwall_formats::gguf_to_hf_config(&h);
});
