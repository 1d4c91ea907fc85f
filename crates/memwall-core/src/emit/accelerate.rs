//! accelerate: `accelerate_config.yaml` for FSDP2, DeepSpeed (with `ds_config.json`), DDP or
//! one GPU.
//!
//! Keys: accelerate 1.15.0 — `commands/config/config_args.py` (`ClusterConfig`:
//! `distributed_type`, `mixed_precision`, `num_machines`, `num_processes`, `fsdp_config`,
//! `deepspeed_config`, `parallelism_config`), `commands/config/cluster.py` (the `fsdp_*` keys
//! the questionnaire writes), `utils/dataclasses.py` `FullyShardedDataParallelPlugin`
//! (`fsdp_version`, `fsdp_reshard_after_forward`, `fsdp_offload_params` → `CPUOffloadPolicy`,
//! `fsdp_auto_wrap_policy`, `fsdp_transformer_layer_cls_to_wrap`,
//! `fsdp_activation_checkpointing`) and `ParallelismConfig` (`dp_replicate_size`,
//! `dp_shard_size`).
//!
//! Precision: with FSDP2, accelerate's `mixed_precision: bf16` builds
//! `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)` and upcasts the weights to fp32
//! (`utils/dataclasses.py` `set_mixed_precision`, `utils/fsdp_utils.py` `fsdp2_prepare_model`);
//! memwall's `amp-*` with FSDP2 reduces in fp32, which no accelerate config key expresses, so
//! it is refused. The cast precisions run with `mixed_precision: "no"` on a model loaded in
//! that dtype. With DDP or one GPU, `amp-*` is accelerate's autocast (`mixed_precision: bf16`).

use super::{
    deepspeed, hash_comment, header_lines, hf_script_notes, json_file, yaml, EmitError,
    EmittedFile, LaunchSpec,
};
use crate::layout::{Offload, Strategy};
use crate::workload::Precision;
use serde_json::{json, Map, Value};

const KIND: &str = "accelerate";

fn amp_name(p: Precision) -> &'static str {
    match p {
        Precision::AmpBf16 | Precision::Bf16 => "bf16",
        Precision::AmpFp16 | Precision::Fp16 => "fp16",
        Precision::Fp32 => "no",
    }
}

pub(super) fn emit(spec: &LaunchSpec) -> Result<Vec<EmittedFile>, EmitError> {
    if spec.is_megatron() {
        return Err(EmitError::unsupported(
            KIND,
            "this configuration was estimated with Megatron-LM (tensor/pipeline/context/expert parallelism)",
            "use --emit megatron",
        ));
    }
    let w = &spec.workload;
    let l = &spec.layout;
    let mut root = Map::new();
    let mut files = Vec::new();
    let mut checkpointing_in_config = false;
    root.insert("compute_environment".into(), json!("LOCAL_MACHINE"));
    let strategy = spec.strategy();
    let distributed_type = match strategy {
        s if s.is_fsdp() => "FSDP",
        Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3 => "DEEPSPEED",
        _ if l.gpus > 1 => "MULTI_GPU",
        _ => "NO",
    };
    root.insert("distributed_type".into(), json!(distributed_type));
    let mixed_precision = match distributed_type {
        "FSDP" => {
            if matches!(w.precision, Precision::AmpBf16 | Precision::AmpFp16) {
                return Err(EmitError::unsupported(
                    KIND,
                    "memwall's amp-* with FSDP2 is MixedPrecisionPolicy(param_dtype=bf16/fp16, reduce_dtype=fp32); \
                     accelerate's mixed_precision sets reduce_dtype to the same 16-bit dtype and autocasts the forward",
                    "use --emit torchtitan (mixed_precision_reduce = float32), or plan with --precision bf16 (a bf16 model, no mixed precision)",
                ));
            }
            "no"
        }
        // ds_config.json's bf16/fp16 section decides (not written here)
        "DEEPSPEED" => amp_name(w.precision),
        // DDP / one GPU: accelerate's mixed precision is autocast over the model's weights
        _ => match w.precision {
            Precision::AmpBf16 => "bf16",
            Precision::AmpFp16 => "fp16",
            _ => "no",
        },
    };
    match distributed_type {
        "FSDP" => {
            let class = spec.decoder_layer_class.ok_or_else(|| {
                EmitError::unsupported(
                    KIND,
                    format!(
                        "memwall does not know the decoder-layer class of model_type `{}` to auto-wrap",
                        spec.shape.model_type
                    ),
                    "use --emit torchtitan, or add the class to emit::DECODER_LAYER_CLASSES",
                )
            })?;
            let mut f = Map::new();
            f.insert("fsdp_version".into(), json!(2));
            // FULL_SHARD / HSDP reshard after forward; SHARD_GRAD_OP keeps the unsharded weights
            f.insert(
                "fsdp_reshard_after_forward".into(),
                json!(strategy != Strategy::FsdpGradOp),
            );
            f.insert(
                "fsdp_auto_wrap_policy".into(),
                json!("TRANSFORMER_BASED_WRAP"),
            );
            f.insert("fsdp_transformer_layer_cls_to_wrap".into(), json!(class));
            // CPUOffloadPolicy: sharded parameters, gradients and optimizer states on the host
            f.insert(
                "fsdp_offload_params".into(),
                json!(l.offload != Offload::None),
            );
            // non-reentrant checkpoint_wrapper around every decoder layer
            f.insert(
                "fsdp_activation_checkpointing".into(),
                json!(w.checkpointing),
            );
            checkpointing_in_config = true;
            root.insert("fsdp_config".into(), Value::Object(f));
            if strategy == Strategy::Hsdp {
                root.insert(
                    "parallelism_config".into(),
                    json!({
                        "parallelism_config_dp_replicate_size": l.gpus / l.shard_group().max(1),
                        "parallelism_config_dp_shard_size": l.shard_group(),
                    }),
                );
            }
        }
        "DEEPSPEED" => {
            let cfg = deepspeed::config(spec, KIND)?;
            root.insert(
                "deepspeed_config".into(),
                json!({"deepspeed_config_file": "ds_config.json"}),
            );
            files.push(json_file("ds_config.json", &cfg));
        }
        _ => {}
    }
    // with deepspeed_config_file, accelerate refuses its own mixed_precision key
    // (utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks): ds_config.json decides
    if distributed_type != "DEEPSPEED" {
        root.insert("mixed_precision".into(), json!(mixed_precision));
    }
    root.insert("num_machines".into(), json!(spec.num_nodes()));
    root.insert("num_processes".into(), json!(l.gpus));
    root.insert("machine_rank".into(), json!(0));

    let mut lines = header_lines(
        &spec.provenance,
        "accelerate (config file keys of accelerate 1.15.0)",
    );
    lines.push(String::new());
    let launch = if spec.num_nodes() > 1 {
        "accelerate launch --config_file accelerate_config.yaml --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port 29500 train.py"
    } else {
        "accelerate launch --config_file accelerate_config.yaml train.py"
    };
    lines.push(format!("launch:   {launch}"));
    lines.extend(hf_script_notes(spec, checkpointing_in_config));
    let mut text = hash_comment(&lines);
    text.push_str(&yaml::to_yaml(&Value::Object(root)));
    files.insert(0, EmittedFile::new("accelerate_config.yaml", text));
    Ok(files)
}
