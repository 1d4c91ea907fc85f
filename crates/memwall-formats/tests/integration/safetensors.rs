//! safetensors header and index: real-shaped round trips and one test per known attack.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_formats::checkpoint::{Checkpoint, Storage};
use memwall_formats::safetensors::{
    check_shards, parse_header, parse_index, prefix_len, Dtype, MAX_HEADER_BYTES,
};
use memwall_formats::{FileFormat, FormatError, HeaderProblem};

/// Bytes per element of the dtypes used here.
fn size(dtype: &str) -> u64 {
    match dtype {
        "F32" | "I32" => 4,
        "BF16" | "F16" => 2,
        "F8_E4M3" | "U8" | "I8" => 1,
        other => panic!("{other}"),
    }
}

/// A header-only "file": the 8-byte length and JSON of contiguous tensors, plus the real
/// file length (the data is never materialised).
fn file(tensors: &[(&str, &str, &[u64])]) -> (Vec<u8>, u64) {
    let mut offset = 0u64;
    let mut entries = Vec::new();
    for (name, dtype, shape) in tensors {
        let bytes = shape.iter().product::<u64>() * size(dtype);
        entries.push(format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{offset},{}]}}",
            offset + bytes
        ));
        offset += bytes;
    }
    let json = format!(
        "{{\"__metadata__\":{{\"format\":\"pt\"}},{}}}",
        entries.join(",")
    );
    raw(&json, offset)
}

/// The 8-byte length + `json`, and the file length for `data_len` data bytes.
fn raw(json: &str, data_len: u64) -> (Vec<u8>, u64) {
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json.as_bytes());
    let len = b.len() as u64 + data_len;
    (b, len)
}

fn problem(e: FormatError) -> HeaderProblem {
    match e {
        FormatError::Header {
            format: FileFormat::Safetensors,
            problem,
            hint,
        } => {
            assert!(!hint.is_empty());
            problem
        }
        other => panic!("expected a safetensors header error, got {other:?}"),
    }
}

fn err(prefix: &[u8], len: u64) -> HeaderProblem {
    problem(parse_header(prefix, len).unwrap_err())
}

#[test]
fn two_tensors_round_trip() {
    let (b, len) = file(&[
        ("model.embed_tokens.weight", "BF16", &[32000, 4096]),
        ("model.norm.weight", "F32", &[4096]),
    ]);
    let h = parse_header(&b, len).unwrap();
    assert_eq!(h.tensors().len(), 2);
    let e = h.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!(e.dtype(), Dtype::BF16);
    assert_eq!(e.shape(), &[32000, 4096]);
    assert_eq!(e.bytes(), 32000 * 4096 * 2);
    assert_eq!(h.data_bytes(), 32000 * 4096 * 2 + 4096 * 4);
    assert_eq!(h.data_start(), b.len() as u64);
    assert_eq!(h.metadata()["format"], "pt");
    let by = h.bytes_by_dtype();
    assert_eq!(by[&Dtype::F32], 4096 * 4);
    assert_eq!(prefix_len(&b[..8], len).unwrap(), b.len() as u64);
}

#[test]
fn the_safetensors_crate_writes_what_we_read() {
    use safetensors::tensor::TensorView;
    let a = vec![0u8; 6 * 4 * 2];
    let b = vec![0u8; 3];
    let views = vec![
        (
            "w".to_string(),
            TensorView::new(Dtype::BF16, vec![6, 4], &a).unwrap(),
        ),
        (
            "s".to_string(),
            TensorView::new(Dtype::U8, vec![3], &b).unwrap(),
        ),
    ];
    let bytes = safetensors::serialize(views, None).unwrap();
    let h = parse_header(&bytes, bytes.len() as u64).unwrap();
    assert_eq!(h.tensor("w").unwrap().bytes(), 48);
    assert_eq!(h.tensor("s").unwrap().shape(), &[3]);
    assert_eq!(h.data_start() + h.data_bytes(), bytes.len() as u64);
    // a prefix holding only the header is enough
    let end = prefix_len(&bytes, bytes.len() as u64).unwrap() as usize;
    assert_eq!(parse_header(&bytes[..end], bytes.len() as u64).unwrap(), h);
}

#[test]
fn mixtral_expert_names_and_bytes() {
    let mut t: Vec<(String, &str, Vec<u64>)> = Vec::new();
    for e in 0..8 {
        for (w, shape) in [
            ("w1", [14336, 4096]),
            ("w2", [4096, 14336]),
            ("w3", [14336, 4096]),
        ] {
            t.push((
                format!("model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"),
                "BF16",
                shape.to_vec(),
            ));
        }
    }
    t.push((
        "model.layers.0.block_sparse_moe.gate.weight".into(),
        "BF16",
        vec![8, 4096],
    ));
    let refs: Vec<(&str, &str, &[u64])> = t
        .iter()
        .map(|(n, d, s)| (n.as_str(), *d, s.as_slice()))
        .collect();
    let (b, len) = file(&refs);
    let h = parse_header(&b, len).unwrap();
    let expert_bytes = 8 * 3 * 14336 * 4096 * 2;
    assert_eq!(h.data_bytes(), expert_bytes + 8 * 4096 * 2);
    let c = Checkpoint::from_safetensors(&[h]);
    assert_eq!(c.layer_bytes().per_layer, vec![expert_bytes + 8 * 4096 * 2]);
    assert_eq!(c.storage(), Storage::Float("BF16".into()));
}

#[test]
fn gptq_packed_bytes_equal_the_core_layout() {
    // AutoGPTQ 4-bit g128 layout of one 4096×4096 linear: exactly what memwall-core sizes.
    let (b, len) = file(&[
        ("model.layers.0.self_attn.q_proj.g_idx", "I32", &[4096]),
        (
            "model.layers.0.self_attn.q_proj.qweight",
            "I32",
            &[512, 4096],
        ),
        ("model.layers.0.self_attn.q_proj.qzeros", "I32", &[32, 512]),
        ("model.layers.0.self_attn.q_proj.scales", "F16", &[32, 4096]),
    ]);
    let h = parse_header(&b, len).unwrap();
    assert_eq!(
        u128::from(h.data_bytes()),
        memwall_core::quant::grouped_int_bytes(4096, 4096, 4, 128, true)
    );
    assert_eq!(Checkpoint::from_safetensors(&[h]).storage(), Storage::Gptq);
}

#[test]
fn fp8_block_bytes_equal_the_core_layout() {
    // DeepSeek-V3: e4m3 weight + fp32 weight_scale_inv per 128×128 block.
    let (b, len) = file(&[
        (
            "model.layers.3.mlp.experts.0.down_proj.weight",
            "F8_E4M3",
            &[7168, 2048],
        ),
        (
            "model.layers.3.mlp.experts.0.down_proj.weight_scale_inv",
            "F32",
            &[56, 16],
        ),
    ]);
    let h = parse_header(&b, len).unwrap();
    assert_eq!(
        u128::from(h.data_bytes()),
        memwall_core::quant::fp8_block_bytes(7168, 2048)
    );
    let c = Checkpoint::from_safetensors(&[h]);
    assert_eq!(c.storage(), Storage::Fp8Block);
    assert_eq!(c.bytes_by_type()["F8_E4M3"], 7168 * 2048);
}

#[test]
fn keys_in_any_order_are_sorted_by_offset() {
    let json = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let (b, len) = raw(json, 16);
    let h = parse_header(&b, len).unwrap();
    let names: Vec<&str> = h.tensors().iter().map(|t| t.name()).collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn an_empty_header_is_an_empty_file() {
    let (b, len) = raw("{}", 0);
    assert_eq!(parse_header(&b, len).unwrap().data_bytes(), 0);
}

// ---- attacks -------------------------------------------------------------------------

#[test]
fn attack_header_length_beyond_the_file() {
    let mut b = 1000u64.to_le_bytes().to_vec();
    b.extend_from_slice(b"{}");
    assert!(matches!(
        err(&b, b.len() as u64),
        HeaderProblem::Truncated { needed: 1008, .. }
    ));
}

#[test]
fn attack_u64_max_header_length() {
    let b = u64::MAX.to_le_bytes();
    assert!(matches!(
        err(&b, 1 << 40),
        HeaderProblem::TooLarge {
            value: u64::MAX,
            max: MAX_HEADER_BYTES,
            ..
        }
    ));
    // just above the limit, in a file large enough to hold it
    let b = (MAX_HEADER_BYTES + 1).to_le_bytes();
    assert!(matches!(err(&b, 1 << 40), HeaderProblem::TooLarge { .. }));
}

#[test]
fn attack_overlapping_offsets() {
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let (b, len) = raw(json, 12);
    match err(&b, len) {
        HeaderProblem::Tensor { tensor, reason } => {
            assert_eq!(tensor, "b");
            assert!(reason.contains("overlap"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn attack_out_of_order_offsets_with_a_gap() {
    let json = r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let (b, len) = raw(json, 24);
    match err(&b, len) {
        HeaderProblem::Tensor { tensor, reason } => {
            assert_eq!(tensor, "b");
            assert!(reason.contains("gap"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn attack_offsets_ending_before_they_begin() {
    let json = r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}}"#;
    let (b, len) = raw(json, 8);
    assert!(matches!(err(&b, len), HeaderProblem::Tensor { .. }));
}

#[test]
fn attack_shape_product_overflows() {
    let json = format!(
        r#"{{"a":{{"dtype":"F32","shape":[{},{},4],"data_offsets":[0,0]}}}}"#,
        1u64 << 32,
        1u64 << 32
    );
    let (b, len) = raw(&json, 0);
    match err(&b, len) {
        HeaderProblem::Tensor { tensor, reason } => {
            assert_eq!(tensor, "a");
            assert!(reason.contains("overflow"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn attack_dtype_times_shape_differs_from_the_offsets() {
    let json = r#"{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,4]}}"#;
    let (b, len) = raw(json, 4);
    match err(&b, len) {
        HeaderProblem::Tensor { reason, .. } => assert!(reason.contains("8 bytes"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn attack_huge_shape_array() {
    let dims = vec!["1"; 100_000].join(",");
    let json = format!(r#"{{"a":{{"dtype":"U8","shape":[{dims}],"data_offsets":[0,1]}}}}"#);
    let (b, len) = raw(&json, 1);
    match err(&b, len) {
        HeaderProblem::Json { message } => assert!(message.contains("dimensions"), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn attack_invalid_utf8() {
    let mut json = br#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#.to_vec();
    json[2] = 0xFF;
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(&json);
    let len = b.len() as u64 + 1;
    assert!(matches!(
        err(&b, len),
        HeaderProblem::InvalidUtf8 { offset: 10, .. }
    ));
}

#[test]
fn attack_truncated_files() {
    let (b, len) = file(&[("a", "F32", &[1024])]);
    // the data is cut short
    assert!(matches!(err(&b, len - 1), HeaderProblem::Truncated { .. }));
    // shorter than the length prefix
    assert!(matches!(
        err(&b[..5], 5),
        HeaderProblem::Truncated { needed: 8, .. }
    ));
    // the header itself is cut
    assert!(matches!(err(&b[..20], 20), HeaderProblem::Truncated { .. }));
    // a prefix shorter than the header while the file goes on: read more
    assert_eq!(
        parse_header(&b[..20], len).unwrap_err(),
        FormatError::NeedMoreBytes {
            format: FileFormat::Safetensors,
            have: 20,
            needed: b.len() as u64
        }
    );
}

#[test]
fn attack_trailing_bytes() {
    let (b, len) = file(&[("a", "F32", &[4])]);
    assert!(matches!(
        err(&b, len + 1),
        HeaderProblem::TrailingBytes { .. }
    ));
}

#[test]
fn attack_duplicate_tensor_names() {
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#;
    let (b, len) = raw(json, 16);
    assert_eq!(
        err(&b, len),
        HeaderProblem::Duplicate {
            what: "tensor".into(),
            name: "a".into()
        }
    );
}

#[test]
fn attack_unknown_dtype_and_non_object_headers() {
    for json in [
        r#"{"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,1]}}"#,
        r#"[1,2,3]"#,
        r#"{"__metadata__":{"format":7}}"#,
        r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
        r#"{"a":1}"#,
    ] {
        let (b, len) = raw(json, 4);
        assert!(matches!(err(&b, len), HeaderProblem::Json { .. }), "{json}");
    }
}

#[test]
fn attack_sub_byte_dtype_off_a_byte_boundary() {
    let json = r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#;
    let (b, len) = raw(json, 2);
    match err(&b, len) {
        HeaderProblem::Tensor { reason, .. } => {
            assert!(reason.contains("byte boundary"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

// ---- index ---------------------------------------------------------------------------

const INDEX: &str = r#"{"metadata":{"total_size":48},"weight_map":{
  "a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#;

#[test]
fn index_round_trip_and_shard_check() {
    let idx = parse_index(INDEX).unwrap();
    assert_eq!(idx.total_size(), Some(48));
    assert_eq!(
        idx.shards(),
        [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors"
        ]
    );
    let (b1, l1) = file(&[("a", "F32", &[4])]);
    let (b2, l2) = file(&[("b", "F32", &[8])]);
    let h1 = parse_header(&b1, l1).unwrap();
    let h2 = parse_header(&b2, l2).unwrap();
    check_shards(
        &idx,
        &[
            ("model-00001-of-00002.safetensors", &h1),
            ("model-00002-of-00002.safetensors", &h2),
        ],
    )
    .unwrap();
    // a tensor in the wrong shard is named
    let e = check_shards(
        &idx,
        &[
            ("model-00001-of-00002.safetensors", &h2),
            ("model-00002-of-00002.safetensors", &h1),
        ],
    )
    .unwrap_err();
    assert!(e.to_string().contains("tensor `a`"), "{e}");
    // a missing shard is named
    let e = check_shards(&idx, &[("model-00001-of-00002.safetensors", &h1)]).unwrap_err();
    assert!(e.to_string().contains("00002"), "{e}");
    assert_eq!(Checkpoint::from_safetensors(&[h1, h2]).total_bytes(), 48);
}

#[test]
fn index_total_size_may_be_an_integral_float() {
    let idx =
        parse_index(r#"{"metadata":{"total_size":1.5e10},"weight_map":{"a":"x.safetensors"}}"#)
            .unwrap();
    assert_eq!(idx.total_size(), Some(15_000_000_000));
}

#[test]
fn index_attacks() {
    for (json, what) in [
        (r#"{"weight_map":{"a":"../../etc/passwd"}}"#, "Value"),
        (r#"{"weight_map":{"a":"/abs.safetensors"}}"#, "Value"),
        (r#"{"weight_map":{"a":"C:\\x.safetensors"}}"#, "Value"),
        (r#"{"weight_map":{"a":"x","a":"y"}}"#, "Duplicate"),
        (r#"{"metadata":{"total_size":-1},"weight_map":{}}"#, "Value"),
        (
            r#"{"metadata":{"total_size":"big"},"weight_map":{}}"#,
            "Value",
        ),
        (r#"{"weight_map":[1]}"#, "Json"),
        (r#"{}"#, "Json"),
    ] {
        match parse_index(json).unwrap_err() {
            FormatError::Header {
                format: FileFormat::SafetensorsIndex,
                problem,
                ..
            } => assert!(
                format!("{problem:?}").starts_with(what),
                "{json}: {problem:?}"
            ),
            other => panic!("{json}: {other:?}"),
        }
    }
}
