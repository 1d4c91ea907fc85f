//! quantization_config: each library's method, its weight format and its unquantised modules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use memwall_core::model::LinearRole;
use memwall_formats::quant_config::ModuleKind;
use memwall_formats::{
    parse_hf_config, parse_quantization_config, FormatError, QuantConfig, QuantMethod,
};
use serde_json::{json, Value};

fn qc(v: Value) -> QuantConfig {
    QuantConfig::from_value(&v, "quantization_config").unwrap()
}

fn qc_err(v: Value) -> FormatError {
    let e = QuantConfig::from_value(&v, "quantization_config").unwrap_err();
    assert!(e.to_string().contains("\nhint: "), "{e}");
    e
}

fn name(q: &QuantConfig) -> Option<String> {
    q.weight_format().map(|f| f.name())
}

#[test]
fn deepseek_v3_fp8_blocks_quantise_experts_and_not_lm_head() {
    let text = crate::config("deepseek-v3.json");
    let q = parse_quantization_config(&text).unwrap().unwrap();
    assert_eq!(
        q.method(),
        &QuantMethod::Fp8 {
            block: Some((128, 128)),
            fmt: Some("e4m3".into())
        }
    );
    assert_eq!(name(&q).as_deref(), Some("fp8"));
    assert_eq!(q.describe(), "fp8 (128×128 blocks)");
    // FineGrainedFP8 without modules_to_not_convert: transformers' default skips the head
    assert_eq!(q.skipped_patterns(), ["lm_head"]);
    let d = parse_hf_config(&text).unwrap();
    let c = q.coverage(&d);
    assert!(!c.lm_head);
    assert_eq!(c.layers.len(), 61);
    for (i, l) in c.layers.iter().enumerate() {
        assert!(l.attention.iter().all(|(_, q)| *q), "layer {i}");
        if i < 3 {
            assert!(l.mlp.iter().all(|(_, q)| *q) && l.experts.is_none());
        } else {
            assert_eq!(
                (l.experts, l.shared_experts),
                (Some(true), Some(true)),
                "layer {i}"
            );
        }
    }
    // the description itself is unchanged by the quantisation config
    assert_eq!(d, parse_hf_config(&text).unwrap());
}

#[test]
fn configs_without_quantisation_have_none() {
    for f in ["llama-3.2-1b.json", "mixtral-8x7b.json", "gpt2.json"] {
        assert!(
            parse_quantization_config(&crate::config(f))
                .unwrap()
                .is_none(),
            "{f}"
        );
    }
}

#[test]
fn gptq_on_mixtral_quantises_experts() {
    let q =
        qc(json!({"quant_method":"gptq","bits":4,"group_size":128,"desc_act":false,"sym":true}));
    assert_eq!(name(&q).as_deref(), Some("gptq-int4-g128"));
    let d = parse_hf_config(&crate::config("mixtral-8x7b.json")).unwrap();
    let c = q.coverage(&d);
    assert!(!c.lm_head);
    assert!(c
        .layers
        .iter()
        .all(|l| l.experts == Some(true) && l.attention.iter().all(|(_, q)| *q)));
    // per-column GPTQ has no core layout: bytes come from the header
    let q = qc(json!({"quant_method":"gptq","bits":8,"group_size":-1}));
    assert_eq!(
        (name(&q), q.describe()),
        (None, "gptq int8 per column".into())
    );
    // modules_in_block_to_quantize restricts; lm_head: true adds the head
    let q = qc(
        json!({"quant_method":"gptq","bits":4,"group_size":64,"lm_head":true,
        "modules_in_block_to_quantize":[["self_attn.q_proj","self_attn.k_proj"],["mlp.down_proj"]]}),
    );
    assert!(q.is_quantized("model.layers.3.self_attn.q_proj", ModuleKind::Linear));
    assert!(!q.is_quantized("model.layers.3.self_attn.o_proj", ModuleKind::Linear));
    assert!(q.is_quantized("model.layers.3.mlp.down_proj", ModuleKind::Linear));
    assert!(!q.is_quantized("model.layers.3.mlp.experts", ModuleKind::Experts));
    assert!(q.is_quantized("lm_head", ModuleKind::Linear));
}

#[test]
fn awq_in_a_config_is_read_and_its_skips_follow_transformers() {
    let mut config: Value = serde_json::from_str(&crate::config("mixtral-8x7b.json")).unwrap();
    config["quantization_config"] = json!({"quant_method":"awq","bits":4,"group_size":128,
        "zero_point":true,"version":"GEMM","modules_to_not_convert":["gate"]});
    let q = parse_quantization_config(&config.to_string())
        .unwrap()
        .unwrap();
    assert_eq!(name(&q).as_deref(), Some("awq-int4-g128"));
    // should_convert_module: re.match from the start, or a suffix
    assert!(!q.is_quantized("model.layers.0.mlp.gate", ModuleKind::Linear));
    assert!(q.is_quantized("model.layers.0.mlp.gate_proj", ModuleKind::Linear));
    assert!(q.is_quantized("model.layers.0.mlp.experts", ModuleKind::Experts));
    assert!(!q.is_quantized("model.layers.0.mlp.gate", ModuleKind::Router));
    // the explicit list replaces the default: lm_head is then quantised
    assert!(q.is_quantized("lm_head", ModuleKind::Linear));
    let q = qc(json!({"quant_method":"awq","bits":4,"group_size":64,"version":"gemv"}));
    assert_eq!((name(&q), q.skipped_patterns()), (None, vec!["lm_head"]));
}

#[test]
fn bitsandbytes_variants() {
    let q = qc(json!({"quant_method":"bitsandbytes","load_in_4bit":true,
        "bnb_4bit_quant_type":"nf4","bnb_4bit_use_double_quant":true}));
    assert_eq!(name(&q).as_deref(), Some("nf4-dq"));
    // BitsAndBytesConfig's default 4-bit type is fp4
    let q = qc(json!({"quant_method":"bitsandbytes","load_in_4bit":true}));
    assert_eq!(name(&q).as_deref(), Some("fp4"));
    let q = qc(json!({"quant_method":"bitsandbytes","load_in_8bit":true,
        "llm_int8_skip_modules":["mlp", "model.layers.1.self_attn"]}));
    assert_eq!(name(&q).as_deref(), Some("int8"));
    // should_convert_module (transformers 5): a bare parent name matches only modules whose
    // name ends with it, a dotted prefix matches everything under it
    assert!(q.is_quantized("model.layers.0.mlp.down_proj", ModuleKind::Linear));
    assert!(!q.is_quantized("model.layers.0.mlp", ModuleKind::Linear));
    assert!(q.is_quantized("model.layers.0.self_attn.q_proj", ModuleKind::Linear));
    assert!(!q.is_quantized("model.layers.1.self_attn.q_proj", ModuleKind::Linear));
    let e = qc_err(json!({"quant_method":"bitsandbytes","load_in_4bit":true,"load_in_8bit":true}));
    assert!(matches!(e, FormatError::Inconsistent { .. }));
    let e = qc_err(
        json!({"quant_method":"bitsandbytes","load_in_4bit":true,"bnb_4bit_quant_type":"int4"}),
    );
    assert_eq!(e.field(), Some("quantization_config.bnb_4bit_quant_type"));
}

#[test]
fn compressed_tensors_fp8_blocks_and_packed_int4() {
    let q = qc(
        json!({"quant_method":"compressed-tensors","format":"float-quantized",
        "config_groups":{"group_0":{"targets":["Linear"],
            "weights":{"num_bits":8,"type":"float","strategy":"block","block_structure":[128,128],"symmetric":true,"dynamic":false},
            "input_activations":{"num_bits":8,"type":"float","strategy":"group","group_size":128,"dynamic":true}}},
        "ignore":["lm_head","re:.*mlp.gate$"]}),
    );
    assert_eq!(name(&q).as_deref(), Some("fp8"));
    assert!(!q.is_quantized("lm_head", ModuleKind::Linear));
    assert!(!q.is_quantized("model.layers.7.mlp.gate", ModuleKind::Linear));
    assert!(q.is_quantized("model.layers.7.mlp.gate_proj", ModuleKind::Linear));
    assert!(q.is_quantized("model.layers.7.mlp.experts", ModuleKind::Experts));
    let q = qc(
        json!({"quant_method":"compressed-tensors","format":"pack-quantized",
        "config_groups":{"group_0":{"targets":["Linear"],
            "weights":{"num_bits":4,"type":"int","strategy":"group","group_size":128,"symmetric":true}}},
        "ignore":["lm_head"]}),
    );
    assert_eq!(name(&q), None);
    assert_eq!(
        q.describe(),
        "compressed-tensors pack-quantized (int4 group)"
    );
    // the older key name
    let t =
        json!({"model_type":"llama","compression_config":{"quant_method":"compressed-tensors"}});
    assert!(parse_quantization_config(&t.to_string()).unwrap().is_some());
}

#[test]
fn mxfp4_quantises_only_the_experts() {
    // gpt-oss-20b config.json
    let q = qc(
        json!({"modules_to_not_convert":["model.layers.*.self_attn","model.layers.*.mlp.router",
        "model.embed_tokens","lm_head"],"quant_method":"mxfp4"}),
    );
    assert_eq!(
        (name(&q), q.describe()),
        (Some("mxfp4".into()), "mxfp4 (experts)".into())
    );
    assert!(q.is_quantized("model.layers.5.mlp.experts", ModuleKind::Experts));
    assert!(!q.is_quantized("model.layers.5.self_attn.q_proj", ModuleKind::Linear));
    assert!(!q.is_quantized("lm_head", ModuleKind::Linear));
    let d = parse_hf_config(&crate::config("qwen3-30b-a3b.json")).unwrap();
    let c = q.coverage(&d);
    assert!(c.layers.iter().all(|l| l.experts == Some(true)
        && l.attention
            .iter()
            .all(|(r, q)| !q && *r != LinearRole::Gate)));
}

#[test]
fn malformed_configs_name_the_field() {
    for (v, field) in [
        (json!({"bits": 4}), "quantization_config.quant_method"),
        (
            json!({"quant_method":"hqq"}),
            "quantization_config.quant_method",
        ),
        (
            json!({"quant_method":"gptq","bits":5}),
            "quantization_config.bits",
        ),
        (
            json!({"quant_method":"gptq","bits":"4"}),
            "quantization_config.bits",
        ),
        (
            json!({"quant_method":"gptq","group_size":0}),
            "quantization_config.group_size",
        ),
        (
            json!({"quant_method":"awq","bits":3}),
            "quantization_config.bits",
        ),
        (
            json!({"quant_method":"fp8","weight_block_size":[128]}),
            "quantization_config.weight_block_size",
        ),
        (
            json!({"quant_method":"fp8","modules_to_not_convert":"lm_head"}),
            "quantization_config.modules_to_not_convert",
        ),
        (
            json!({"quant_method":"compressed-tensors","config_groups":[]}),
            "quantization_config.config_groups",
        ),
        (json!("fp8"), "quantization_config"),
    ] {
        let e = qc_err(v.clone());
        assert_eq!(e.field(), Some(field), "{v}: {e}");
    }
    let e = qc_err(json!({"quant_method":"fp8","modules_to_not_convert":["model.("]}));
    assert!(matches!(e, FormatError::WrongType { .. }), "{e}");
}
