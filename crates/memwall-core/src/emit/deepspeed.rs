//! DeepSpeed ZeRO: `ds_config.json` and a `deepspeed` launch line.
//!
//! Keys and defaults: DeepSpeed 0.19.8 — `deepspeed/runtime/config.py` (batch keys, `bf16`,
//! `fp16`, `optimizer`), `deepspeed/runtime/zero/config.py` (`DeepSpeedZeroConfig`: `stage`,
//! `contiguous_gradients` (default true), `overlap_comm` (default false, true for stage 3),
//! `reduce_bucket_size` (5e8), `stage3_prefetch_bucket_size` (5e7),
//! `stage3_param_persistence_threshold` (1e5), `sub_group_size` (1e9)),
//! `deepspeed/runtime/zero/offload_config.py` (`device`, `nvme_path`, `buffer_count` (5 for
//! parameters, 4 for the optimizer), `buffer_size` (1e8), `pin_memory` (true)).

use super::{
    hash_comment, header_lines, hf_script_notes, json_file, shell, EmitError, EmittedFile,
    LaunchSpec,
};
use crate::layout::{Offload, OffloadDevice, Strategy};
use crate::workload::{Optimizer, Precision};
use serde_json::{json, Map, Value};

/// Where ZeRO-Infinity swaps to; the user points it at a local NVMe mount.
const NVME_PATH: &str = "/local_nvme";

/// The ZeRO stage of the estimated strategy, or why DeepSpeed cannot run it.
pub(super) fn stage(spec: &LaunchSpec, kind: &'static str) -> Result<u8, EmitError> {
    if spec.is_megatron() {
        return Err(EmitError::unsupported(
            kind,
            "this configuration was estimated with Megatron-LM (tensor/pipeline/context/expert parallelism)",
            "use --emit megatron",
        ));
    }
    match spec.strategy() {
        Strategy::Zero1 => Ok(1),
        Strategy::Zero2 => Ok(2),
        Strategy::Zero3 => Ok(3),
        s => Err(EmitError::unsupported(
            kind,
            format!("the strategy is `{}`, not a DeepSpeed ZeRO stage", s.name()),
            if s.is_fsdp() {
                "use --emit accelerate, trainer or torchtitan for FSDP2, or plan with --strategy zero1/zero2/zero3"
            } else {
                "use --emit accelerate, trainer or torchrun for DDP, or plan with --strategy zero1/zero2/zero3"
            },
        )),
    }
}

/// The `ds_config.json` document of a ZeRO configuration.
pub(super) fn config(spec: &LaunchSpec, kind: &'static str) -> Result<Value, EmitError> {
    let stage = stage(spec, kind)?;
    let w = &spec.workload;
    let c = &spec.constants;
    let mut root = Map::new();
    // runtime/config.py: the three batch keys must satisfy train = micro × accumulation × dp
    root.insert("train_micro_batch_size_per_gpu".into(), json!(w.batch));
    root.insert("gradient_accumulation_steps".into(), json!(w.grad_accum));
    root.insert("train_batch_size".into(), json!(spec.global_batch()));
    // runtime/config.py get_bfloat16_config / get_fp16_config: 16-bit weights and gradients, an
    // fp32 master partition (what memory::dist simulates for bf16/fp16 and amp-*)
    match w.precision {
        Precision::Bf16 | Precision::AmpBf16 => {
            root.insert("bf16".into(), json!({"enabled": true}));
        }
        Precision::Fp16 | Precision::AmpFp16 => {
            root.insert("fp16".into(), json!({"enabled": true}));
        }
        Precision::Fp32 => {}
    }
    let mut zero = Map::new();
    zero.insert("stage".into(), json!(stage));
    // one ipg bucket of reduce_bucket_size elements (stage_1_and_2.py allocates a second one
    // with overlap_comm; stage3.py one either way)
    zero.insert("contiguous_gradients".into(), json!(true));
    if stage < 3 {
        zero.insert("overlap_comm".into(), json!(false));
    }
    zero.insert("reduce_bucket_size".into(), json!(c.reduce_bucket_elems));
    if stage == 3 {
        zero.insert(
            "stage3_prefetch_bucket_size".into(),
            json!(c.zero3_prefetch_elems),
        );
        zero.insert(
            "stage3_param_persistence_threshold".into(),
            json!(c.zero3_persistence_elems),
        );
        zero.insert("sub_group_size".into(), json!(c.zero3_sub_group_elems));
    }
    let device = match spec.layout.offload_device {
        OffloadDevice::Cpu => "cpu",
        OffloadDevice::Nvme => "nvme",
    };
    let nvme = spec.layout.offload_device == OffloadDevice::Nvme;
    let offload_optimizer = matches!(spec.layout.offload, Offload::Optimizer | Offload::Both);
    let offload_params = matches!(spec.layout.offload, Offload::Params | Offload::Both);
    if offload_optimizer {
        let mut o = Map::new();
        o.insert("device".into(), json!(device));
        if nvme {
            o.insert("nvme_path".into(), json!(NVME_PATH));
            o.insert("buffer_count".into(), json!(c.nvme_optimizer_buffer_count));
        }
        o.insert("pin_memory".into(), json!(true));
        zero.insert("offload_optimizer".into(), Value::Object(o));
    }
    if offload_params {
        let mut o = Map::new();
        o.insert("device".into(), json!(device));
        if nvme {
            o.insert("nvme_path".into(), json!(NVME_PATH));
            o.insert("buffer_count".into(), json!(c.nvme_param_buffer_count));
            o.insert("buffer_size".into(), json!(c.nvme_buffer_elems));
        }
        o.insert("pin_memory".into(), json!(true));
        zero.insert("offload_param".into(), Value::Object(o));
    }
    root.insert("zero_optimization".into(), Value::Object(zero));
    if offload_optimizer {
        // ZeRO-Offload steps on the CPU with DeepSpeed's own optimizers
        // (runtime/engine.py _configure_basic_optimizer: AdamW → DeepSpeedCPUAdam(adamw_mode=True),
        // Lion → DeepSpeedCPULion); a client torch optimizer is refused (zero_force_ds_cpu_optimizer)
        let ty = match w.optimizer {
            Optimizer::Adamw | Optimizer::AdamwFused | Optimizer::AdamwForloop => "AdamW",
            Optimizer::Lion => "Lion",
            o => {
                return Err(EmitError::unsupported(
                    kind,
                    format!(
                        "ZeRO-Offload steps the optimizer on the CPU with DeepSpeedCPUAdam/CPULion; `{}` has no CPU implementation there",
                        optimizer_name(o)
                    ),
                    "plan with --optimizer adamw or lion, or without --offload",
                ));
            }
        };
        root.insert("optimizer".into(), json!({"type": ty}));
    }
    Ok(Value::Object(root))
}

fn optimizer_name(o: Optimizer) -> &'static str {
    Optimizer::ALL
        .iter()
        .find(|(x, _)| *x == o)
        .map_or("?", |(_, n)| n)
}

/// The torch optimizer the user's script passes to `deepspeed.initialize` (none with offload).
fn client_optimizer(o: Optimizer) -> &'static str {
    match o {
        Optimizer::Adamw => "torch.optim.AdamW(params, foreach=True)",
        Optimizer::AdamwFused => "torch.optim.AdamW(params, fused=True)",
        Optimizer::AdamwForloop => "torch.optim.AdamW(params, foreach=False)",
        Optimizer::Adamw8bit => "bitsandbytes.optim.AdamW8bit(params)",
        Optimizer::Sgd => "torch.optim.SGD(params, momentum=0.0, foreach=True)",
        Optimizer::SgdMomentum => "torch.optim.SGD(params, momentum=0.9, foreach=True)",
        Optimizer::Adafactor => "torch.optim.Adafactor(params, foreach=True)",
        Optimizer::Lion => "lion_pytorch.Lion(params)",
    }
}

pub(super) fn emit(spec: &LaunchSpec) -> Result<Vec<EmittedFile>, EmitError> {
    let cfg = config(spec, "deepspeed")?;
    let mut lines = header_lines(
        &spec.provenance,
        "DeepSpeed ZeRO (ds_config.json; keys of deepspeed 0.19.8)",
    );
    lines.push(String::new());
    lines.extend(hf_script_notes(spec, false));
    if cfg.get("optimizer").is_none() {
        lines.push(format!(
            "  pass optimizer={} to deepspeed.initialize (ds_config.json names none)",
            client_optimizer(spec.workload.optimizer)
        ));
    }
    if spec.layout.offload_device == OffloadDevice::Nvme && spec.layout.offload != Offload::None {
        lines.push(format!(
            "  point nvme_path ({NVME_PATH}) at a local NVMe mount"
        ));
    }
    let mut sh = String::from("#!/usr/bin/env bash\n");
    sh.push_str(&hash_comment(&lines));
    sh.push_str("set -euo pipefail\n");
    let mut cmd = format!("exec deepspeed --num_nodes {}", spec.num_nodes());
    if spec.num_nodes() > 1 {
        cmd.push_str(&format!(
            " --hostfile {}",
            shell::var("HOSTFILE", "hostfile")
        ));
    }
    cmd.push_str(&format!(
        " --num_gpus {} {} --deepspeed ds_config.json \"$@\"\n",
        spec.procs_per_node(),
        shell::var("TRAIN_SCRIPT", "train.py")
    ));
    sh.push_str(&cmd);
    Ok(vec![
        json_file("ds_config.json", &cfg),
        EmittedFile::new("launch_deepspeed.sh", sh),
    ])
}
