//! vLLM: `vllm serve` flags as a launch line and as a `--config` YAML.
//!
//! Flags: vLLM 0.33.0 `vllm/engine/arg_utils.py` `EngineArgs` (`--tensor-parallel-size`,
//! `--gpu-memory-utilization`, `--kv-cache-dtype`, `--block-size`, `--max-model-len`,
//! `--max-num-batched-tokens`, `--max-num-seqs`, `--enforce-eager`,
//! `--kv-cache-memory-bytes`, `--quantization`); the YAML form is read by
//! `vllm/utils/argparse_utils.py` `FlexibleArgumentParser` (`--config`: keys are the long
//! flag names). Every value moves vLLM's KV-cache budget as `serve.rs` accounts it.

use super::{hash_comment, header_lines, shell, yaml, EmitError, EmittedFile, ServeLaunchSpec};
use crate::workload::WeightFormat;
use serde_json::{json, Map, Value};

const KIND: &str = "vllm";

/// `--quantization` for the weights' format (`None` = unquantised).
fn quantization(w: WeightFormat) -> Result<Option<&'static str>, EmitError> {
    Ok(match w {
        WeightFormat::Bf16 | WeightFormat::Fp16 | WeightFormat::Fp32 => None,
        WeightFormat::Fp8 => Some("fp8"),
        WeightFormat::Gptq { .. } => Some("gptq"),
        WeightFormat::Awq { .. } => Some("awq"),
        WeightFormat::Nf4 { .. } | WeightFormat::Int8 => Some("bitsandbytes"),
        WeightFormat::Gguf(_) => Some("gguf"),
        // vllm/model_executor/layers/quantization/__init__.py QuantizationMethods: "mxfp4"
        WeightFormat::Mxfp4 => Some("mxfp4"),
        WeightFormat::Fp4 { .. } => {
            return Err(EmitError::unsupported(
                KIND,
                "vLLM's bitsandbytes loader reads NF4 and int8 checkpoints, not FP4",
                "serve an nf4 or int8 checkpoint",
            ))
        }
    })
}

/// The flags in order, `(name without --, value)`; `None` for a switch.
pub(super) fn flags(spec: &ServeLaunchSpec) -> Result<Vec<(&'static str, Value)>, EmitError> {
    let mut f: Vec<(&'static str, Value)> = vec![
        ("tensor-parallel-size", json!(spec.tensor_parallel_size)),
        ("gpu-memory-utilization", json!(spec.gpu_memory_utilization)),
        ("max-model-len", json!(spec.max_model_len)),
        ("kv-cache-dtype", json!(spec.kv_cache_dtype.flag())),
        ("block-size", json!(spec.block_size)),
        ("max-num-batched-tokens", json!(spec.max_num_batched_tokens)),
        ("max-num-seqs", json!(spec.max_num_seqs)),
    ];
    if let Some(b) = spec.kv_cache_memory_bytes {
        f.push(("kv-cache-memory-bytes", json!(b)));
    }
    if let Some(q) = quantization(spec.weights)? {
        f.push(("quantization", json!(q)));
    }
    if spec.enforce_eager {
        f.push(("enforce-eager", json!(true)));
    }
    // a BooleanOptionalAction flag: `false` is `--no-enable-prefix-caching` on the command line,
    // and `enable-prefix-caching: false` in the config file, which vLLM's
    // FlexibleArgumentParser.load_config_file turns into `--no-enable-prefix-caching`
    // (vllm/utils/argparse_utils.py)
    if let Some(p) = spec.enable_prefix_caching {
        f.push(("enable-prefix-caching", json!(p)));
    }
    Ok(f)
}

pub(super) fn emit(spec: &ServeLaunchSpec) -> Result<Vec<EmittedFile>, EmitError> {
    let f = flags(spec)?;
    let lines = header_lines(
        &spec.provenance,
        "vLLM 0.33.0 (vllm serve; vllm/engine/arg_utils.py)",
    );
    let mut sh = String::from("#!/usr/bin/env bash\n");
    sh.push_str(&hash_comment(&lines));
    sh.push_str("set -euo pipefail\n");
    sh.push_str(&format!("exec vllm serve {}", shell::quote(&spec.model_id)));
    for (name, value) in &f {
        match value {
            Value::Bool(true) => sh.push_str(&format!(" \\\n  --{name}")),
            Value::Bool(false) => sh.push_str(&format!(" \\\n  --no-{name}")),
            Value::String(s) => sh.push_str(&format!(" \\\n  --{name} {}", shell::quote(s))),
            other => sh.push_str(&format!(" \\\n  --{name} {other}")),
        }
    }
    sh.push_str(" \\\n  \"$@\"\n");
    let mut yaml_lines = header_lines(&spec.provenance, "vLLM 0.33.0 (vllm serve --config)");
    yaml_lines.push(format!(
        "launch:   vllm serve {} --config vllm_config.yaml",
        shell::quote(&spec.model_id)
    ));
    let mut map = Map::new();
    for (name, value) in f {
        map.insert(name.to_string(), value);
    }
    let mut y = hash_comment(&yaml_lines);
    y.push_str(&yaml::to_yaml(&Value::Object(map)));
    Ok(vec![
        EmittedFile::new("vllm_serve.sh", sh),
        EmittedFile::new("vllm_config.yaml", y),
    ])
}
