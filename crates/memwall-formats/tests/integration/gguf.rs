//! GGUF header: real-shaped headers built here, one test per known attack, and the
//! architecture mapping checked against the config.json each GGUF was converted from.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_formats::checkpoint::{Checkpoint, Storage};
use memwall_formats::gguf::{parse_header, GgufTensorType, GgufValue, MAX_HEADER_BYTES};
use memwall_formats::{
    gguf_to_hf_config, gguf_to_model, parse_hf_config, FileFormat, FormatError, HeaderProblem,
};
use serde_json::Value;

/// A GGUF writer for tests (little-endian, as gguf-py's `GGUFWriter`).
#[derive(Default, Clone)]
pub struct Gguf {
    pub version: u32,
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<u64>, u32)>,
    pub alignment: u64,
    /// Overrides for attacks.
    pub n_kv_override: Option<u64>,
    pub n_tensors_override: Option<u64>,
    pub offsets_override: Option<Vec<u64>>,
}

fn string(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s);
}

impl Gguf {
    pub fn new() -> Gguf {
        Gguf {
            version: 3,
            alignment: 32,
            ..Gguf::default()
        }
    }

    fn key(&mut self, k: &str, ty: u32) {
        string(&mut self.kv, k.as_bytes());
        self.kv.extend_from_slice(&ty.to_le_bytes());
        self.n_kv += 1;
    }

    pub fn u32(mut self, k: &str, v: u32) -> Gguf {
        self.key(k, 4);
        self.kv.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(mut self, k: &str, v: u64) -> Gguf {
        self.key(k, 10);
        self.kv.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn f32(mut self, k: &str, v: f32) -> Gguf {
        self.key(k, 6);
        self.kv.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn boolean(mut self, k: &str, v: bool) -> Gguf {
        self.key(k, 7);
        self.kv.push(u8::from(v));
        self
    }

    pub fn str(mut self, k: &str, v: &str) -> Gguf {
        self.key(k, 8);
        string(&mut self.kv, v.as_bytes());
        self
    }

    pub fn strings(mut self, k: &str, n: u64) -> Gguf {
        self.key(k, 9);
        self.kv.extend_from_slice(&8u32.to_le_bytes());
        self.kv.extend_from_slice(&n.to_le_bytes());
        for i in 0..n {
            string(&mut self.kv, format!("tok{i}").as_bytes());
        }
        self
    }

    pub fn bools(mut self, k: &str, v: &[bool]) -> Gguf {
        self.key(k, 9);
        self.kv.extend_from_slice(&7u32.to_le_bytes());
        self.kv.extend_from_slice(&(v.len() as u64).to_le_bytes());
        self.kv.extend(v.iter().map(|&b| u8::from(b)));
        self
    }

    /// Raw bytes appended to the metadata (for attacks), counted as `n` pairs.
    pub fn raw_kv(mut self, bytes: &[u8], n: u64) -> Gguf {
        self.kv.extend_from_slice(bytes);
        self.n_kv += n;
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], ty: GgufTensorType) -> Gguf {
        self.tensors.push((name.into(), dims.to_vec(), ty.id()));
        self
    }

    pub fn tensor_id(mut self, name: &str, dims: &[u64], ty: u32) -> Gguf {
        self.tensors.push((name.into(), dims.to_vec(), ty));
        self
    }

    fn nbytes(dims: &[u64], ty: u32) -> u64 {
        let (block, size) = GgufTensorType::from_id(ty).map_or((1, 1), |t| t.block());
        (dims.iter().fold(1u64, |a, &d| a.saturating_mul(d)) / block).saturating_mul(size)
    }

    /// The header bytes (up to the data) and the length of the whole file.
    pub fn build(&self) -> (Vec<u8>, u64) {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&self.version.to_le_bytes());
        let nt = self.n_tensors_override.unwrap_or(self.tensors.len() as u64);
        b.extend_from_slice(&nt.to_le_bytes());
        b.extend_from_slice(&self.n_kv_override.unwrap_or(self.n_kv).to_le_bytes());
        b.extend_from_slice(&self.kv);
        let pad = |x: u64| x.div_ceil(self.alignment).saturating_mul(self.alignment);
        let mut offset = 0;
        let mut end = 0;
        for (i, (name, dims, ty)) in self.tensors.iter().enumerate() {
            string(&mut b, name.as_bytes());
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            let o = self.offsets_override.as_ref().map_or(offset, |v| v[i]);
            b.extend_from_slice(&o.to_le_bytes());
            end = offset.saturating_add(Self::nbytes(dims, *ty));
            offset = pad(end.min(u64::MAX / 2));
        }
        let data = if self.tensors.is_empty() {
            b.len() as u64
        } else {
            pad(b.len() as u64)
        };
        (b, data.saturating_add(end))
    }
}

fn problem(e: FormatError) -> HeaderProblem {
    match e {
        FormatError::Header {
            format: FileFormat::Gguf,
            problem,
            ..
        } => problem,
        other => panic!("expected a GGUF header error, got {other:?}"),
    }
}

fn err(g: &Gguf) -> HeaderProblem {
    let (b, len) = g.build();
    problem(parse_header(&b, len).unwrap_err())
}

/// A Llama-shaped header (tiny sizes) with a Q4_K_M-like tensor mix.
fn small_llama() -> Gguf {
    let mut g = Gguf::new()
        .str("general.architecture", "llama")
        .str("general.name", "tiny")
        .u32("general.file_type", 15)
        .u32("general.quantization_version", 2)
        .u32("llama.block_count", 2)
        .u32("llama.context_length", 4096)
        .u32("llama.embedding_length", 256)
        .u32("llama.feed_forward_length", 512)
        .u32("llama.attention.head_count", 8)
        .u32("llama.attention.head_count_kv", 2)
        .u32("llama.rope.dimension_count", 32)
        .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .strings("tokenizer.ggml.tokens", 1000)
        .tensor("token_embd.weight", &[256, 1000], GgufTensorType::Q4K)
        .tensor("output_norm.weight", &[256], GgufTensorType::F32)
        .tensor("output.weight", &[256, 1000], GgufTensorType::Q6K);
    for i in 0..2 {
        for (n, dims, t) in [
            ("attn_norm", vec![256], GgufTensorType::F32),
            ("attn_q", vec![256, 256], GgufTensorType::Q4K),
            ("attn_k", vec![256, 64], GgufTensorType::Q4K),
            ("attn_v", vec![256, 64], GgufTensorType::Q6K),
            ("attn_output", vec![256, 256], GgufTensorType::Q4K),
            ("ffn_norm", vec![256], GgufTensorType::F32),
            ("ffn_gate", vec![256, 512], GgufTensorType::Q4K),
            ("ffn_up", vec![256, 512], GgufTensorType::Q4K),
            ("ffn_down", vec![512, 256], GgufTensorType::Q6K),
        ] {
            g = g.tensor(&format!("blk.{i}.{n}.weight"), &dims, t);
        }
    }
    g
}

#[test]
fn a_llama_header_round_trips() {
    let g = small_llama();
    let (b, len) = g.build();
    let h = parse_header(&b, len).unwrap();
    assert_eq!(h.version(), 3);
    assert_eq!(h.alignment(), 32);
    assert_eq!(h.architecture(), Some("llama"));
    assert_eq!(h.tensors().len(), 21);
    assert_eq!(
        h.get("general.name").and_then(GgufValue::as_str),
        Some("tiny")
    );
    let tokens = h
        .get("tokenizer.ggml.tokens")
        .and_then(GgufValue::as_array)
        .unwrap();
    assert_eq!((tokens.len, tokens.values.is_none()), (1000, true));
    // Q4_K: 256 weights in 144 bytes; Q6_K: 210
    assert_eq!(h.tensor("token_embd.weight").unwrap().bytes(), 1000 * 144);
    assert_eq!(h.tensor("output.weight").unwrap().bytes(), 1000 * 210);
    assert_eq!(
        h.tensor("blk.0.ffn_down.weight").unwrap().bytes(),
        256 * 2 * 210
    );
    assert_eq!(h.data_offset() % 32, 0);
    assert_eq!(
        h.weight_format().map(|f| f.name()).as_deref(),
        Some("gguf-q4_k_m")
    );
    let c = Checkpoint::from_gguf(std::slice::from_ref(&h));
    assert_eq!(c.storage(), Storage::Gguf("Q4_K".into()));
    assert_eq!(c.total_bytes(), h.tensor_bytes());
    assert_eq!(c.layer_bytes().per_layer.len(), 2);
    // the description: 2 layers, GQA 8/2, untied head, vocab from token_embd
    let d = gguf_to_model(&h).unwrap();
    assert_eq!(d.model_type, "llama");
    assert_eq!(d.layers.len(), 2);
    assert_eq!(d.embeddings.vocab_size, 1000);
    assert!(!d.head.tied);
    let cc = c.cross_check(&d).unwrap();
    assert_eq!(
        (cc.layers, cc.extra_layers, cc.params_compared),
        (2, 0, false)
    );
}

#[test]
fn every_type_size_follows_ggml_quant_sizes() {
    // (type, block, bytes) from gguf-py constants.py GGML_QUANT_SIZES
    let table: &[(u32, &str, u64, u64)] = &[
        (0, "F32", 1, 4),
        (1, "F16", 1, 2),
        (2, "Q4_0", 32, 18),
        (3, "Q4_1", 32, 20),
        (6, "Q5_0", 32, 22),
        (7, "Q5_1", 32, 24),
        (8, "Q8_0", 32, 34),
        (9, "Q8_1", 32, 40),
        (10, "Q2_K", 256, 84),
        (11, "Q3_K", 256, 110),
        (12, "Q4_K", 256, 144),
        (13, "Q5_K", 256, 176),
        (14, "Q6_K", 256, 210),
        (15, "Q8_K", 256, 292),
        (16, "IQ2_XXS", 256, 66),
        (17, "IQ2_XS", 256, 74),
        (18, "IQ3_XXS", 256, 98),
        (19, "IQ1_S", 256, 50),
        (20, "IQ4_NL", 32, 18),
        (21, "IQ3_S", 256, 110),
        (22, "IQ2_S", 256, 82),
        (23, "IQ4_XS", 256, 136),
        (24, "I8", 1, 1),
        (25, "I16", 1, 2),
        (26, "I32", 1, 4),
        (27, "I64", 1, 8),
        (28, "F64", 1, 8),
        (29, "IQ1_M", 256, 56),
        (30, "BF16", 1, 2),
        (34, "TQ1_0", 256, 54),
        (35, "TQ2_0", 256, 66),
        (39, "MXFP4", 32, 17),
        (40, "NVFP4", 64, 36),
    ];
    for &(id, name, block, bytes) in table {
        let t = GgufTensorType::from_id(id).unwrap();
        assert_eq!((t.name(), t.block(), t.id()), (name, (block, bytes), id));
        if let Some(core) = t.to_core() {
            assert_eq!(
                core.block(),
                (u128::from(bytes), u128::from(block)),
                "{name}"
            );
        }
    }
    for removed in [4, 5, 31, 32, 33, 36, 37, 38, 41, 1000] {
        assert!(GgufTensorType::from_id(removed).is_none(), "{removed}");
    }
}

#[test]
fn version_2_custom_alignment_and_no_tensors() {
    let g = Gguf {
        version: 2,
        alignment: 64,
        ..Gguf::new()
    }
    .u32("general.alignment", 64)
    .str("general.architecture", "llama")
    .tensor("a", &[32, 3], GgufTensorType::Q8_0)
    .tensor("b", &[7], GgufTensorType::F32);
    let (b, len) = g.build();
    let h = parse_header(&b, len).unwrap();
    assert_eq!((h.version(), h.alignment()), (2, 64));
    assert_eq!(h.tensor("b").unwrap().offset(), 128); // 3 × 34 = 102 → padded to 128
    assert_eq!(h.data_offset() % 64, 0);
    let empty = Gguf::new().str("general.architecture", "llama");
    let (b, len) = empty.build();
    assert!(parse_header(&b, len).unwrap().tensors().is_empty());
}

#[test]
fn a_short_prefix_asks_for_more() {
    let (b, len) = small_llama().build();
    match parse_header(&b[..100], len).unwrap_err() {
        FormatError::NeedMoreBytes {
            have: 100, needed, ..
        } => assert!(needed > 100),
        other => panic!("{other:?}"),
    }
}

// ---- attacks -------------------------------------------------------------------------

#[test]
fn attack_string_length_beyond_the_file() {
    let mut kv = Vec::new();
    kv.extend_from_slice(&(1u64 << 40).to_le_bytes());
    kv.extend_from_slice(b"general.name");
    let g = Gguf::new().raw_kv(&kv, 1);
    assert!(matches!(err(&g), HeaderProblem::Truncated { .. }));
}

#[test]
fn attack_u64_max_lengths_and_counts() {
    // a key length of u64::MAX
    let mut kv = u64::MAX.to_le_bytes().to_vec();
    kv.extend_from_slice(&[0; 16]);
    let g = Gguf::new().raw_kv(&kv, 1);
    let p = err(&g);
    assert!(
        matches!(
            p,
            HeaderProblem::Truncated {
                needed: u64::MAX,
                ..
            }
        ),
        "{p:?}"
    );
    // 2^60 metadata pairs, and u64::MAX tensors: refused before any read or allocation
    let g = Gguf {
        n_kv_override: Some(1 << 60),
        ..Gguf::new()
    };
    assert!(matches!(err(&g), HeaderProblem::Truncated { .. }));
    let g = Gguf {
        n_tensors_override: Some(u64::MAX),
        ..Gguf::new()
    };
    let p = err(&g);
    assert!(
        matches!(
            p,
            HeaderProblem::Truncated {
                needed: u64::MAX,
                ..
            }
        ),
        "{p:?}"
    );
    // a string value declaring u64::MAX bytes in a file that claims to be huge
    let mut kv = Vec::new();
    string_key(&mut kv, "general.name", 8);
    kv.extend_from_slice(&u64::MAX.to_le_bytes());
    let g = Gguf::new().raw_kv(&kv, 1);
    let (b, _) = g.build();
    assert!(matches!(
        problem(parse_header(&b, u64::MAX).unwrap_err()),
        HeaderProblem::TooLarge { .. }
    ));
}

fn string_key(b: &mut Vec<u8>, k: &str, ty: u32) {
    b.extend_from_slice(&(k.len() as u64).to_le_bytes());
    b.extend_from_slice(k.as_bytes());
    b.extend_from_slice(&ty.to_le_bytes());
}

#[test]
fn attack_huge_metadata_arrays() {
    // 2^40 u32 elements declared
    let mut kv = Vec::new();
    string_key(&mut kv, "a", 9);
    kv.extend_from_slice(&4u32.to_le_bytes());
    kv.extend_from_slice(&(1u64 << 40).to_le_bytes());
    let g = Gguf::new().raw_kv(&kv, 1);
    assert!(matches!(err(&g), HeaderProblem::Truncated { .. }));
    // 2^58 strings declared, in a file that claims to be enormous: nothing is allocated for
    // them; strings are read one by one until the prefix ends
    let mut kv = Vec::new();
    string_key(&mut kv, "tokenizer.ggml.tokens", 9);
    kv.extend_from_slice(&8u32.to_le_bytes());
    kv.extend_from_slice(&(1u64 << 58).to_le_bytes());
    let g = Gguf::new().raw_kv(&kv, 1);
    let (mut b, _) = g.build();
    b.resize(b.len() + 64, 0); // 8 empty strings, then the prefix ends
    match parse_header(&b, u64::MAX / 2).unwrap_err() {
        FormatError::NeedMoreBytes { .. } => {}
        other => panic!("{other:?}"),
    }
    let e = parse_header(&[], u64::MAX / 2).unwrap_err();
    assert!(matches!(e, FormatError::NeedMoreBytes { needed: 4, .. }));
    // nested arrays are refused (as by ggml)
    let mut kv = Vec::new();
    string_key(&mut kv, "a", 9);
    kv.extend_from_slice(&9u32.to_le_bytes());
    kv.extend_from_slice(&1u64.to_le_bytes());
    let g = Gguf::new().raw_kv(&kv, 1);
    assert!(matches!(err(&g), HeaderProblem::Value { .. }));
}

#[test]
fn attack_header_beyond_the_limit() {
    let mut kv = Vec::new();
    string_key(&mut kv, "a", 9);
    kv.extend_from_slice(&0u32.to_le_bytes());
    kv.extend_from_slice(&(MAX_HEADER_BYTES + 1).to_le_bytes());
    let g = Gguf::new().raw_kv(&kv, 1);
    let (b, _) = g.build();
    assert!(matches!(
        problem(parse_header(&b, u64::MAX).unwrap_err()),
        HeaderProblem::TooLarge { .. }
    ));
}

#[test]
fn attack_invalid_utf8() {
    let mut kv = Vec::new();
    string_key(&mut kv, "gen\u{e9}ral", 4);
    kv[11] = 0xFF; // inside the key
    kv.extend_from_slice(&0u32.to_le_bytes());
    let g = Gguf::new().raw_kv(&kv, 1);
    assert!(matches!(err(&g), HeaderProblem::InvalidUtf8 { .. }));
    // in a tensor name
    let (mut b, len) = Gguf::new().tensor("zzz", &[4], GgufTensorType::F32).build();
    let at = b.windows(3).position(|w| w == b"zzz").unwrap();
    b[at] = 0xC3;
    assert!(matches!(
        problem(parse_header(&b, len).unwrap_err()),
        HeaderProblem::InvalidUtf8 { .. }
    ));
}

#[test]
fn attack_truncated_files() {
    let (b, len) = small_llama().build();
    // the data of the last tensor is cut
    match problem(parse_header(&b, len - 1).unwrap_err()) {
        HeaderProblem::Truncated { what, .. } => assert!(what.contains("blk.1.ffn_down"), "{what}"),
        other => panic!("{other:?}"),
    }
    // the header itself is cut (prefix = whole file)
    for cut in [0, 3, 7, 20, 200, b.len() - 1] {
        assert!(
            matches!(
                problem(parse_header(&b[..cut], cut as u64).unwrap_err()),
                HeaderProblem::Truncated { .. }
            ),
            "{cut}"
        );
    }
}

#[test]
fn attack_overlapping_and_out_of_order_offsets() {
    let g = Gguf {
        offsets_override: Some(vec![0, 0]),
        ..Gguf::new()
    }
    .tensor("a", &[64], GgufTensorType::F32)
    .tensor("b", &[64], GgufTensorType::F32);
    match err(&g) {
        HeaderProblem::Tensor { tensor, reason } => {
            assert_eq!(tensor, "b");
            assert!(reason.contains("expected 256"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let g = Gguf {
        offsets_override: Some(vec![256, 0]),
        ..g
    };
    assert!(matches!(err(&g), HeaderProblem::Tensor { tensor, .. } if tensor == "a"));
}

#[test]
fn attack_shape_products_that_overflow() {
    let g = Gguf::new().tensor("a", &[1 << 32, 1 << 32], GgufTensorType::F32);
    assert!(
        matches!(err(&g), HeaderProblem::Tensor { reason, .. } if reason.contains("INT64_MAX"))
    );
    let g = Gguf::new().tensor("a", &[1 << 63], GgufTensorType::F32);
    assert!(matches!(err(&g), HeaderProblem::Tensor { reason, .. } if reason.contains("negative")));
    // fits in int64 elements, but not in bytes
    let g = Gguf::new().tensor("a", &[1 << 31, 1 << 30], GgufTensorType::F64);
    assert!(
        matches!(err(&g), HeaderProblem::Tensor { reason, .. } if reason.contains("overflows"))
    );
}

#[test]
fn attack_tensor_info_rules_of_ggml() {
    let long = "x".repeat(64);
    for (g, needle) in [
        (
            Gguf::new().tensor(&long, &[4], GgufTensorType::F32),
            "length",
        ),
        (
            Gguf::new().tensor("a", &[1, 1, 1, 1, 1], GgufTensorType::F32),
            "dimensions",
        ),
        (Gguf::new().tensor_id("a", &[32], 4), "type id 4"),
        (Gguf::new().tensor_id("a", &[32], 77), "type id 77"),
        (
            Gguf::new().tensor("a", &[33], GgufTensorType::Q4_0),
            "multiple",
        ),
    ] {
        let p = err(&g);
        assert!(format!("{p}").contains(needle), "{needle}: {p}");
    }
    let g =
        Gguf::new()
            .tensor("a", &[4], GgufTensorType::F32)
            .tensor("a", &[4], GgufTensorType::F32);
    assert!(matches!(err(&g), HeaderProblem::Duplicate { .. }));
}

#[test]
fn attack_bad_magic_version_alignment_bool_and_duplicate_keys() {
    let (mut b, len) = Gguf::new().build();
    b[0] = b'X';
    assert!(matches!(
        problem(parse_header(&b, len).unwrap_err()),
        HeaderProblem::BadMagic { .. }
    ));
    for v in [0, 1, 4, 0x0300_0000] {
        let g = Gguf {
            version: v,
            ..Gguf::new()
        };
        assert!(matches!(err(&g), HeaderProblem::Version { .. }), "{v}");
    }
    for a in [0, 48, 1 << 21] {
        let g = Gguf::new().u32("general.alignment", a);
        assert!(matches!(err(&g), HeaderProblem::Value { .. }), "{a}");
    }
    let g = Gguf::new().u64("general.alignment", 32);
    assert!(matches!(err(&g), HeaderProblem::Value { .. }));
    let mut kv = Vec::new();
    string_key(&mut kv, "flag", 7);
    kv.push(2);
    assert!(matches!(
        err(&Gguf::new().raw_kv(&kv, 1)),
        HeaderProblem::Value { .. }
    ));
    let g = Gguf::new().u32("a.b", 1).u32("a.b", 2);
    assert!(matches!(err(&g), HeaderProblem::Duplicate { .. }));
}

// ---- architecture mapping: GGUF keys as convert_hf_to_gguf.py writes them ------------

/// Emulates llama.cpp's converter for a config.json: the keys `set_gguf_parameters` writes
/// and the tensors the mapping looks at (names and shapes only).
fn convert(config: &str) -> Gguf {
    let c: Value = serde_json::from_str(config).unwrap();
    let u = |k: &str| c.get(k).and_then(Value::as_u64);
    let model_type = c["model_type"].as_str().unwrap();
    let arch = match model_type {
        "llama" | "mistral" | "mixtral" => "llama",
        "qwen2_moe" => "qwen2moe",
        "qwen3_moe" => "qwen3moe",
        "gemma3_text" => "gemma3",
        "gpt_neox" => "gptneox",
        "deepseek_v3" => "deepseek2",
        other => other,
    };
    let k = |s: &str| format!("{arch}.{s}");
    let hidden = u("hidden_size").or(u("n_embd")).unwrap();
    let heads = u("num_attention_heads").or(u("n_head")).unwrap();
    let layers = u("num_hidden_layers").or(u("n_layer")).unwrap();
    let vocab = u("vocab_size").unwrap();
    let mut g = Gguf::new()
        .str("general.architecture", arch)
        .u32(&k("block_count"), layers as u32)
        .u32(&k("embedding_length"), hidden as u32)
        .u32(&k("attention.head_count"), heads as u32);
    if let Some(ctx) = u("max_position_embeddings").or(u("n_positions")) {
        g = g.u32(&k("context_length"), ctx as u32);
    }
    if let Some(f) = u("intermediate_size")
        .or(u("n_inner"))
        .or(u("ffn_hidden_size"))
    {
        g = g.u32(&k("feed_forward_length"), f as u32);
    }
    // FalconModel: n_head_kv = num_kv_heads, else n_head_kv, else 1 (multi-query 7B)
    let kv = u("num_key_value_heads")
        .or(u("num_kv_heads"))
        .or((model_type == "falcon").then_some(1));
    if model_type == "deepseek_v3" {
        let (nope, rope, v, kvr) = (
            u("qk_nope_head_dim").unwrap(),
            u("qk_rope_head_dim").unwrap(),
            u("v_head_dim").unwrap(),
            u("kv_lora_rank").unwrap(),
        );
        g = g
            .u32(&k("attention.head_count_kv"), 1)
            .u32(&k("attention.kv_lora_rank"), kvr as u32)
            .u32(&k("attention.key_length"), (kvr + rope) as u32)
            .u32(&k("attention.value_length"), kvr as u32)
            .u32(&k("attention.key_length_mla"), (nope + rope) as u32)
            .u32(&k("attention.value_length_mla"), v as u32)
            .u32(&k("rope.dimension_count"), rope as u32)
            .u32(
                &k("leading_dense_block_count"),
                u("first_k_dense_replace").unwrap() as u32,
            )
            .u32(&k("expert_count"), u("n_routed_experts").unwrap() as u32)
            .u32(
                &k("expert_shared_count"),
                u("n_shared_experts").unwrap() as u32,
            )
            .u32(
                &k("expert_used_count"),
                u("num_experts_per_tok").unwrap() as u32,
            )
            .u32(
                &k("expert_feed_forward_length"),
                u("moe_intermediate_size").unwrap() as u32,
            )
            .u32(&k("expert_group_count"), u("n_group").unwrap() as u32)
            .u32(
                &k("expert_group_used_count"),
                u("topk_group").unwrap() as u32,
            )
            .u32(&k("expert_gating_func"), 2)
            .boolean(
                &k("expert_weights_norm"),
                c.get("norm_topk_prob")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
            );
        if let Some(q) = u("q_lora_rank") {
            g = g.u32(&k("attention.q_lora_rank"), q as u32);
        }
    } else {
        g = g.u32(&k("attention.head_count_kv"), kv.unwrap_or(heads) as u32);
        if let Some(d) = u("head_dim") {
            g = g
                .u32(&k("attention.key_length"), d as u32)
                .u32(&k("attention.value_length"), d as u32);
        }
    }
    let head_dim = u("head_dim").unwrap_or(hidden / heads);
    let rotary = c
        .get("partial_rotary_factor")
        .or(c.get("rotary_pct"))
        .and_then(Value::as_f64)
        .unwrap_or(1.0);
    if model_type != "deepseek_v3" {
        g = g.u32(
            &k("rope.dimension_count"),
            (head_dim as f64 * rotary) as u32,
        );
    }
    if let Some(w) =
        u("sliding_window").filter(|_| matches!(model_type, "phi3" | "gemma2" | "gemma3_text"))
    {
        g = g.u32(&k("attention.sliding_window"), w as u32);
    }
    for s in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if let Some(v) = c.get(s).and_then(Value::as_f64) {
            g = g.f32(&k(s), v as f32);
        }
    }
    if let Some(p) = c.get("use_parallel_residual").and_then(Value::as_bool) {
        g = g.boolean(&k("use_parallel_residual"), p);
    }
    let experts = u("num_local_experts").or(u("num_experts"));
    if let Some(e) = experts.filter(|_| model_type != "deepseek_v3") {
        g = g.u32(&k("expert_count"), e as u32).u32(
            &k("expert_used_count"),
            u("num_experts_per_tok").unwrap() as u32,
        );
        if let Some(m) = u("moe_intermediate_size") {
            g = g.u32(&k("expert_feed_forward_length"), m as u32);
        }
        if let Some(s) = u("shared_expert_intermediate_size") {
            g = g.u32(&k("expert_shared_feed_forward_length"), s as u32);
        }
    }
    g = g.tensor("token_embd.weight", &[hidden, vocab], GgufTensorType::F16);
    let tied = c
        .get("tie_word_embeddings")
        .and_then(Value::as_bool)
        .unwrap_or(matches!(
            model_type,
            "gemma" | "gemma2" | "gemma3_text" | "gpt2" | "falcon" | "starcoder2"
        ));
    if !tied {
        g = g.tensor("output.weight", &[hidden, vocab], GgufTensorType::F16);
    }
    let bias = c
        .get("attention_bias")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        || model_type == "qwen2"
        || model_type == "qwen2_moe" && c.get("qkv_bias").and_then(Value::as_bool).unwrap_or(true)
        || c.get("use_bias")
            .and_then(Value::as_bool)
            .unwrap_or(model_type == "starcoder2")
        || c.get("bias").and_then(Value::as_bool).unwrap_or(false);
    let fused = matches!(model_type, "phi3" | "gpt2" | "gpt_neox" | "falcon");
    if bias {
        let t = match model_type {
            "deepseek_v3" => "attn_kv_a_mqa",
            _ if fused => "attn_qkv",
            _ => "attn_q",
        };
        g = g.tensor(&format!("blk.0.{t}.bias"), &[hidden], GgufTensorType::F32);
    }
    if model_type == "falcon"
        && c.get("new_decoder_architecture").and_then(Value::as_bool) == Some(true)
    {
        g = g.tensor("blk.0.attn_norm_2.weight", &[hidden], GgufTensorType::F32);
    }
    let first_dense = u("first_k_dense_replace").unwrap_or(0);
    let only: Vec<u64> = c
        .get("mlp_only_layers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let step = u("decoder_sparse_step").unwrap_or(1);
    if experts.is_some() || model_type == "deepseek_v3" {
        for i in 0..layers {
            let moe = i >= first_dense && !only.contains(&i) && (i + 1) % step == 0;
            if moe {
                g = g.tensor(
                    &format!("blk.{i}.ffn_gate_inp.weight"),
                    &[hidden, 8],
                    GgufTensorType::F32,
                );
            }
        }
    }
    g
}

/// Converts a config to GGUF and back, and checks the description against the config's.
fn round_trip(name: &str) {
    let text = crate::config(name);
    let (b, len) = convert(&text).build();
    let h = parse_header(&b, len).unwrap();
    let from_gguf = gguf_to_model(&h).unwrap_or_else(|e| {
        panic!(
            "{name}: {e}\n{:#}",
            gguf_to_hf_config(&h)
                .map(|v| v.to_string())
                .unwrap_or_default()
        )
    });
    let from_config = parse_hf_config(&text).unwrap();
    let counts = |d: &memwall_core::ModelDesc| d.param_counts().unwrap();
    assert_eq!(
        counts(&from_gguf),
        counts(&from_config),
        "{name}: parameters"
    );
    assert_eq!(from_gguf.layers.len(), from_config.layers.len(), "{name}");
    for (i, (a, b)) in from_gguf.layers.iter().zip(&from_config.layers).enumerate() {
        assert_eq!(a.attention.kind, b.attention.kind, "{name} layer {i}");
        assert_eq!(a.mlp, b.mlp, "{name} layer {i}");
        // llama.cpp's Starcoder2 and Qwen2-MoE converters do not write the sliding window
        if !["starcoder2-3b.json", "synthetic-qwen2-moe-dense-mix.json"].contains(&name) {
            assert_eq!(
                a.attention.sliding_window, b.attention.sliding_window,
                "{name} layer {i} window"
            );
        }
        assert_eq!(
            a.attention.rotary_dim, b.attention.rotary_dim,
            "{name} layer {i} rotary"
        );
        assert_eq!(
            a.attention.qkv_bias, b.attention.qkv_bias,
            "{name} layer {i} bias"
        );
    }
    assert_eq!(from_gguf.head.tied, from_config.head.tied, "{name}");
    assert_eq!(
        from_gguf.max_position_embeddings,
        from_config.max_position_embeddings
    );
}

#[test]
fn gguf_descriptions_equal_their_config_json() {
    for name in [
        "llama-2-7b.json",
        "llama-3.2-1b.json",
        "mixtral-8x7b.json",
        "qwen2.5-3b.json",
        "qwen1.5-moe-a2.7b.json",
        "synthetic-qwen2-moe-dense-mix.json",
        "qwen3-0.6b.json",
        "qwen3-30b-a3b.json",
        "gemma-2b.json",
        "gemma-2-2b.json",
        "gemma-3-1b-pt.json",
        "phi-3-mini-4k.json",
        "synthetic-phi3-partial-rotary.json",
        "starcoder2-3b.json",
        "olmo-2-1124-7b.json",
        "gpt2.json",
        "pythia-160m.json",
        "falcon-7b.json",
        "falcon-40b.json",
        "deepseek-v3.json",
        "deepseek-v3-mla-noqlora.json",
    ] {
        round_trip(name);
    }
}

#[test]
fn unknown_architectures_and_deepseek_v2_are_named() {
    let (b, len) = Gguf::new().str("general.architecture", "mamba").build();
    let e = gguf_to_model(&parse_header(&b, len).unwrap()).unwrap_err();
    assert!(
        e.to_string().contains("mamba") && e.to_string().contains("llama"),
        "{e}"
    );
    let (b, len) = small_deepseek(1).build();
    let e = gguf_to_model(&parse_header(&b, len).unwrap()).unwrap_err();
    assert_eq!(e.field(), Some("deepseek2.expert_gating_func"), "{e}");
    let (b, len) = Gguf::new().str("general.name", "x").build();
    let e = gguf_to_model(&parse_header(&b, len).unwrap()).unwrap_err();
    assert_eq!(e.field(), Some("general.architecture"));
}

/// A DeepSeek header as written before llama.cpp's MLA change: key_length = qk_nope +
/// qk_rope, value_length = v_head_dim.
fn small_deepseek(gating: u32) -> Gguf {
    Gguf::new()
        .str("general.architecture", "deepseek2")
        .u32("deepseek2.block_count", 4)
        .u32("deepseek2.embedding_length", 64)
        .u32("deepseek2.feed_forward_length", 128)
        .u32("deepseek2.attention.head_count", 4)
        .u32("deepseek2.attention.head_count_kv", 4)
        .u32("deepseek2.attention.kv_lora_rank", 32)
        .u32("deepseek2.attention.key_length", 48)
        .u32("deepseek2.attention.value_length", 32)
        .u32("deepseek2.rope.dimension_count", 16)
        .u32("deepseek2.leading_dense_block_count", 1)
        .u32("deepseek2.expert_count", 8)
        .u32("deepseek2.expert_shared_count", 1)
        .u32("deepseek2.expert_used_count", 2)
        .u32("deepseek2.expert_feed_forward_length", 32)
        .u32("deepseek2.expert_gating_func", gating)
        .tensor("token_embd.weight", &[64, 100], GgufTensorType::F16)
        .tensor("output.weight", &[64, 100], GgufTensorType::F16)
}

#[test]
fn older_deepseek_files_without_mla_keys() {
    let (b, len) = small_deepseek(2).build();
    let d = gguf_to_model(&parse_header(&b, len).unwrap()).unwrap();
    let c = gguf_to_hf_config(&parse_header(&b, len).unwrap()).unwrap();
    assert_eq!(
        (c["qk_nope_head_dim"].as_u64(), c["v_head_dim"].as_u64()),
        (Some(32), Some(32))
    );
    assert!(c["q_lora_rank"].is_null());
    // no group keys: llama.cpp routes over all experts, one group (not the 671B defaults,
    // which would put this file's 8 experts one per group and be refused)
    assert_eq!(
        (c["n_group"].as_u64(), c["topk_group"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(d.layers.len(), 4);
}

#[test]
fn gemma3_per_layer_window_pattern() {
    let text = crate::config("gemma-3-1b-pt.json");
    let layers = 26;
    // every layer sliding except the last: not the transformers default pattern
    let pattern: Vec<bool> = (0..layers).map(|i| i != layers - 1).collect();
    let (b, len) = convert(&text)
        .bools("gemma3.attention.sliding_window_pattern", &pattern)
        .build();
    let d = gguf_to_model(&parse_header(&b, len).unwrap()).unwrap();
    let windows: Vec<bool> = d
        .layers
        .iter()
        .map(|l| l.attention.sliding_window.is_some())
        .collect();
    assert_eq!(windows, pattern);
    // a wrong length is refused, naming the key
    let (b, len) = convert(&text)
        .bools("gemma3.attention.sliding_window_pattern", &[true; 3])
        .build();
    let e = gguf_to_model(&parse_header(&b, len).unwrap()).unwrap_err();
    assert_eq!(
        e.field(),
        Some("gemma3.attention.sliding_window_pattern"),
        "{e}"
    );
}
