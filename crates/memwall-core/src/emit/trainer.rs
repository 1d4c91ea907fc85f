//! transformers `Trainer`: `training_args.json` (`TrainingArguments(**json)`), the
//! `from_pretrained` kwargs, PEFT's `LoraConfig` and bitsandbytes' `BitsAndBytesConfig` as
//! JSON, `ds_config.json` for ZeRO, and the launch line.
//!
//! Keys: transformers 5.23.0 `training_args.py` (`per_device_train_batch_size`,
//! `gradient_accumulation_steps`, `bf16`, `fp16`, `activation_checkpointing` and
//! `activation_checkpointing_kwargs` (the 5.x names of `gradient_checkpointing*`), `optim`,
//! `optim_args`, `fsdp`, `fsdp_config` (`version`, `reshard_after_forward`, `cpu_offload`,
//! `activation_checkpointing`, `transformer_layer_cls_to_wrap`), `deepspeed`),
//! `OptimizerNames` and `trainer_optimizer.py` (`adamw_torch` = `torch.optim.AdamW` with the
//! foreach default, `adamw_torch_fused`, `adamw_bnb_8bit`, `sgd` with `optim_args` momentum);
//! `utils/quantization_config.py` `BitsAndBytesConfig`; peft 0.21.2 `tuners/lora/config.py`
//! `LoraConfig` (`r`, `target_modules`, `lora_dropout`, `bias`, `task_type`).

use super::{
    deepspeed, hash_comment, header_lines, hf_attn_implementation, hf_model_dtype, json_file,
    shell, EmitError, EmittedFile, LaunchSpec,
};
use crate::layout::{Offload, Strategy};
use crate::workload::{Optimizer, Precision};
use serde_json::{json, Map, Value};

const KIND: &str = "trainer";

/// `TrainingArguments.optim` (and `optim_args`) for the estimated optimizer.
fn optim(o: Optimizer) -> Result<(&'static str, Option<&'static str>), EmitError> {
    Ok(match o {
        // torch.optim.AdamW with foreach=None: foreach on CUDA tensors (torch/optim/optimizer.py
        // _default_to_fused_or_foreach)
        Optimizer::Adamw => ("adamw_torch", None),
        Optimizer::AdamwFused => ("adamw_torch_fused", None),
        Optimizer::Adamw8bit => ("adamw_bnb_8bit", None),
        Optimizer::Sgd => ("sgd", Some("momentum=0.0")),
        Optimizer::SgdMomentum => ("sgd", Some("momentum=0.9")),
        Optimizer::AdamwForloop => {
            return Err(EmitError::unsupported(
                KIND,
                "`adamw-forloop` (torch AdamW with foreach=False) has no TrainingArguments.optim name",
                "pass optimizers=(torch.optim.AdamW(params, foreach=False), None) to Trainer, or plan with --optimizer adamw",
            ))
        }
        Optimizer::Adafactor => {
            return Err(EmitError::unsupported(
                KIND,
                "memwall's `adafactor` is torch.optim.Adafactor; the Trainer's `adafactor` is transformers' own Adafactor",
                "pass optimizers=(torch.optim.Adafactor(params, foreach=True), None) to Trainer",
            ))
        }
        Optimizer::Lion => {
            return Err(EmitError::unsupported(
                KIND,
                "memwall's `lion` is lion-pytorch's Lion (state in the parameter dtype); the Trainer's `lion_32bit` is bitsandbytes' with fp32 state",
                "pass optimizers=(lion_pytorch.Lion(params), None) to Trainer",
            ))
        }
    })
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
    let strategy = spec.strategy();
    let zero = matches!(
        strategy,
        Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3
    );
    let fsdp = strategy.is_fsdp();
    if strategy == Strategy::Hsdp {
        return Err(EmitError::unsupported(
            KIND,
            "TrainingArguments has no hybrid-shard (replicate × shard) mesh for FSDP2",
            "use --emit accelerate (parallelism_config dp_replicate_size/dp_shard_size) or --emit torchtitan",
        ));
    }
    if fsdp && matches!(w.precision, Precision::AmpBf16 | Precision::AmpFp16) {
        return Err(EmitError::unsupported(
            KIND,
            "memwall's amp-* with FSDP2 reduces gradients in fp32; the Trainer's bf16/fp16 with FSDP2 sets reduce_dtype to the 16-bit dtype and autocasts",
            "use --emit torchtitan, or plan with --precision bf16 (a bf16 model, no mixed precision)",
        ));
    }
    let mut files = Vec::new();
    let mut args = Map::new();
    args.insert("per_device_train_batch_size".into(), json!(w.batch));
    args.insert("gradient_accumulation_steps".into(), json!(w.grad_accum));
    // bf16/fp16 = autocast; the cast precisions load the model in that dtype instead. With
    // DeepSpeed they must equal ds_config.json's bf16/fp16.enabled
    // (integrations/deepspeed.py HfTrainerDeepSpeedConfig.trainer_config_process).
    let (bf16, fp16) = match (w.precision, zero) {
        (Precision::AmpBf16, _) | (Precision::Bf16, true) => (true, false),
        (Precision::AmpFp16, _) | (Precision::Fp16, true) => (false, true),
        _ => (false, false),
    };
    args.insert("bf16".into(), json!(bf16));
    args.insert("fp16".into(), json!(fp16));
    if !fsdp {
        args.insert("activation_checkpointing".into(), json!(w.checkpointing));
        if w.checkpointing {
            args.insert(
                "activation_checkpointing_kwargs".into(),
                json!({"use_reentrant": false}),
            );
        }
    }
    if w.kernels.layers == crate::workload::KernelSet::Liger {
        // TrainingArguments.use_liger_kernel: the Trainer runs Liger's
        // `_apply_liger_kernel_to_instance(model)` (rope, rms_norm, swiglu/geglu and
        // fused_linear_cross_entropy by default; liger_kernel/transformers/monkey_patch.py)
        args.insert("use_liger_kernel".into(), json!(true));
    }
    if w.kernels.layers == crate::workload::KernelSet::Rmsnorm {
        // Liger's RMSNorm alone (keywords of apply_liger_kernel_to_*)
        args.insert("use_liger_kernel".into(), json!(true));
        args.insert(
            "liger_kernel_config".into(),
            json!({"rope": false, "swiglu": false, "geglu": false, "cross_entropy": false,
                   "fused_linear_cross_entropy": false, "rms_norm": true}),
        );
    }
    let offloaded_optimizer = zero && matches!(l.offload, Offload::Optimizer | Offload::Both);
    if !offloaded_optimizer {
        let (name, optim_args) = optim(w.optimizer)?;
        args.insert("optim".into(), json!(name));
        if let Some(a) = optim_args {
            args.insert("optim_args".into(), json!(a));
        }
    }
    if fsdp {
        let class = spec.decoder_layer_class.ok_or_else(|| {
            EmitError::unsupported(
                KIND,
                format!(
                    "memwall does not know the decoder-layer class of model_type `{}`",
                    spec.shape.model_type
                ),
                "add the class to emit::DECODER_LAYER_CLASSES",
            )
        })?;
        args.insert("fsdp".into(), json!(true));
        args.insert(
            "fsdp_config".into(),
            json!({
                "version": 2,
                "reshard_after_forward": strategy == Strategy::FsdpFull,
                "cpu_offload": l.offload != Offload::None,
                "activation_checkpointing": w.checkpointing,
                "transformer_layer_cls_to_wrap": [class],
            }),
        );
    }
    if zero {
        let cfg = deepspeed::config(spec, KIND)?;
        args.insert("deepspeed".into(), json!("ds_config.json"));
        files.push(json_file("ds_config.json", &cfg));
    }
    files.insert(0, json_file("training_args.json", &Value::Object(args)));

    let mut model_kwargs = Map::new();
    model_kwargs.insert("dtype".into(), json!(hf_model_dtype(w.precision)));
    model_kwargs.insert(
        "attn_implementation".into(),
        json!(hf_attn_implementation(w.attention)),
    );
    files.push(json_file("model_kwargs.json", &Value::Object(model_kwargs)));
    if let Some(lora) = &w.lora {
        files.push(json_file(
            "lora_config.json",
            &json!({
                "r": lora.rank,
                "target_modules": lora.targets,
                "lora_dropout": 0.0,
                "bias": "none",
                "task_type": "CAUSAL_LM",
            }),
        ));
        if lora.qlora {
            // NF4 with double quantisation (memory/hf.rs nf4_bytes); compute in the model dtype
            files.push(json_file(
                "bnb_config.json",
                &json!({
                    "load_in_4bit": true,
                    "bnb_4bit_quant_type": "nf4",
                    "bnb_4bit_use_double_quant": true,
                    "bnb_4bit_compute_dtype": hf_model_dtype(w.precision),
                }),
            ));
        }
    }

    let mut lines = header_lines(
        &spec.provenance,
        "transformers Trainer (TrainingArguments of transformers 5.23.0, LoraConfig of peft 0.21.2)",
    );
    lines.push(String::new());
    lines.push("Your script builds, from the JSON files beside this one:".to_string());
    let quant = if w.lora.as_ref().is_some_and(|x| x.qlora) {
        ", quantization_config=BitsAndBytesConfig(**bnb_config)"
    } else {
        ""
    };
    lines.push(format!(
        "  model = AutoModelForCausalLM.from_pretrained({:?}, **model_kwargs{quant})",
        spec.model_id
    ));
    if w.lora.is_some() {
        lines.push("  model = get_peft_model(model, LoraConfig(**lora_config))".to_string());
    }
    if w.lora.as_ref().is_some_and(|x| x.qlora) {
        lines.push(
            "  (no prepare_model_for_kbit_training: it casts the unquantised weights to fp32)"
                .to_string(),
        );
    }
    lines.push(
        "  Trainer(model, TrainingArguments(output_dir=…, **training_args), train_dataset=…)"
            .to_string(),
    );
    lines.push(format!("  with sequences of {} tokens (no padding)", w.seq));
    if offloaded_optimizer {
        lines.push(
            "  (the optimizer is DeepSpeed's CPU optimizer named in ds_config.json)".to_string(),
        );
    }
    let mut sh = String::from("#!/usr/bin/env bash\n");
    sh.push_str(&hash_comment(&lines));
    sh.push_str("set -euo pipefail\n");
    let script = shell::var("TRAIN_SCRIPT", "train.py");
    if l.gpus == 1 {
        sh.push_str(&format!("exec python {script} \"$@\"\n"));
    } else {
        sh.push_str(&format!(
            "exec {} {script} \"$@\"\n",
            super::torchrun::command(spec)
        ));
    }
    files.push(EmittedFile::new("launch_trainer.sh", sh));
    Ok(files)
}
