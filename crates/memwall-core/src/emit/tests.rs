//! The emitters against the simulator (the constants they write are the ones it simulates) and
//! the capability checks.

use super::*;
use crate::layout::{Layout, Offload, OffloadDevice, Schedule, Strategy};
use crate::memory::dist::simulate_train_dist;
use crate::memory::Kernels;
use crate::model::tests::llama2_7b;
use crate::workload::{Lora, Optimizer, Precision, TrainWorkload};

fn layout(strategy: Strategy, gpus: u64) -> Layout {
    Layout {
        gpus,
        gpus_per_node: 8,
        strategy,
        ..Layout::single()
    }
}

fn workload() -> TrainWorkload {
    TrainWorkload {
        checkpointing: true,
        grad_accum: 4,
        ..TrainWorkload::new(2, 1024)
    }
}

fn spec(l: &Layout, w: &TrainWorkload) -> LaunchSpec {
    LaunchSpec::from_train(&llama2_7b(), w, Some(l))
        .unwrap()
        .with_model_id("meta-llama/Llama-2-7b-hf")
}

fn file<'a>(files: &'a [EmittedFile], name: &str) -> &'a str {
    &files
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .contents
}

fn ds_config(s: &LaunchSpec) -> serde_json::Value {
    let files = emit(EmitKind::Deepspeed, s).unwrap();
    serde_json::from_str(file(&files, "ds_config.json")).unwrap()
}

#[test]
fn zero_buckets_are_the_ones_the_simulator_allocates() {
    let w = TrainWorkload {
        precision: Precision::Bf16,
        ..workload()
    };
    let l = layout(Strategy::Zero3, 8);
    let est = simulate_train_dist(&llama2_7b(), &w, &l, Kernels::Cuda).unwrap();
    let line = |prefix: &str| {
        est.comm_buffers
            .iter()
            .find(|b| b.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line"))
            .bytes
    };
    let cfg = ds_config(&spec(&l, &w));
    let z = &cfg["zero_optimization"];
    // bf16 buckets: 2 bytes per element
    assert_eq!(
        z["reduce_bucket_size"].as_u64().unwrap() * 2,
        line("ZeRO ipg gradient bucket")
    );
    // the gathered window is the largest parameter (the 32000 × 4096 embedding) + the prefetch
    let largest = 32000 * 4096;
    assert_eq!(
        (largest + z["stage3_prefetch_bucket_size"].as_u64().unwrap()) * 2,
        line("ZeRO-3 gathered parameters")
    );
    assert_eq!(z["sub_group_size"], 1_000_000_000u64);
    assert_eq!(z["stage3_param_persistence_threshold"], 100_000u64);
}

#[test]
fn nvme_buffers_are_the_ones_the_simulator_reserves() {
    let w = workload();
    let mut l = layout(Strategy::Zero3, 8);
    l.offload = Offload::Both;
    l.offload_device = OffloadDevice::Nvme;
    let est = simulate_train_dist(&llama2_7b(), &w, &l, Kernels::Cuda).unwrap();
    let z = ds_config(&spec(&l, &w))["zero_optimization"].clone();
    let p = &z["offload_param"];
    let o = &z["offload_optimizer"];
    let buf = p["buffer_size"].as_u64().unwrap();
    // fp16 parameter swap buffers and fp32 optimizer swap buffers of buffer_size elements
    let per_rank = p["buffer_count"].as_u64().unwrap() * buf * 2
        + o["buffer_count"].as_u64().unwrap() * buf * 4;
    assert_eq!(est.host_bytes_per_node, per_rank * 8);
    assert_eq!(p["device"], "nvme");
    assert_eq!(o["pin_memory"], true);
}

#[test]
fn batch_keys_multiply_to_the_global_batch() {
    let w = workload();
    let l = layout(Strategy::Zero2, 16);
    let cfg = ds_config(&spec(&l, &w));
    let est = simulate_train_dist(&llama2_7b(), &w, &l, Kernels::Cuda).unwrap();
    assert_eq!(cfg["train_micro_batch_size_per_gpu"], 2);
    assert_eq!(cfg["gradient_accumulation_steps"], 4);
    assert_eq!(cfg["train_batch_size"].as_u64().unwrap(), est.global_batch);
    assert_eq!(cfg["zero_optimization"]["overlap_comm"], false);
}

#[test]
fn engines_refuse_configurations_they_would_not_run_as_estimated() {
    let w = workload();
    let code = |k: EmitKind, l: &Layout, w: &TrainWorkload| {
        emit(k, &spec(l, w)).err().map(|e| {
            assert!(e.hint().is_some(), "{e}");
            e.code()
        })
    };
    let fsdp = layout(Strategy::FsdpFull, 8);
    assert_eq!(
        code(EmitKind::Megatron, &fsdp, &w),
        Some("emit-unsupported")
    );
    assert_eq!(
        code(EmitKind::Deepspeed, &fsdp, &w),
        Some("emit-unsupported")
    );
    assert_eq!(code(EmitKind::Accelerate, &fsdp, &w), None);
    assert_eq!(code(EmitKind::Trainer, &fsdp, &w), None);
    assert_eq!(code(EmitKind::Vllm, &fsdp, &w), Some("emit-wrong-command"));
    let amp = TrainWorkload {
        precision: Precision::AmpBf16,
        ..w.clone()
    };
    assert_eq!(
        code(EmitKind::Accelerate, &fsdp, &amp),
        Some("emit-unsupported")
    );
    let mut mega = layout(Strategy::Zero1, 16);
    mega.tp = 8;
    mega.pp = 2;
    assert_eq!(code(EmitKind::Megatron, &mega, &w), None);
    assert_eq!(
        code(EmitKind::Deepspeed, &mega, &w),
        Some("emit-unsupported")
    );
    assert_eq!(
        code(EmitKind::Accelerate, &mega, &w),
        Some("emit-unsupported")
    );
    assert_eq!(
        code(EmitKind::Torchtitan, &mega, &w),
        Some("emit-unsupported")
    );
    mega.schedule = Schedule::Gpipe;
    assert_eq!(
        code(EmitKind::Megatron, &mega, &w),
        Some("emit-unsupported")
    );
    let mut offload_sgd = layout(Strategy::Zero3, 8);
    offload_sgd.offload = Offload::Optimizer;
    let sgd = TrainWorkload {
        optimizer: Optimizer::Sgd,
        ..w.clone()
    };
    assert_eq!(
        code(EmitKind::Deepspeed, &offload_sgd, &sgd),
        Some("emit-unsupported")
    );
    let forloop = TrainWorkload {
        optimizer: Optimizer::AdamwForloop,
        ..w.clone()
    };
    assert_eq!(
        code(EmitKind::Trainer, &Layout::single(), &forloop),
        Some("emit-unsupported")
    );
    let serve = ServeLaunchSpec::from_serve(
        "m",
        &crate::serve::ServeConfig {
            gpu_memory_bytes: 80 << 30,
            tp: 1,
            gpu_memory_utilization: 0.9,
            kv_dtype_bytes: 2,
            block_size: 16,
            max_model_len: 4096,
            max_num_batched_tokens: 2048,
            kv_cache_memory_bytes: None,
            weights_bytes_per_rank: 0,
            non_torch_bytes: 0,
            activation_peak_bytes: 0,
            cuda_graph_bytes: 0,
            enable_prefix_caching: None,
            flashinfer_gdn_prefill: false,
        },
        VllmKvCacheDtype::Auto,
        256,
        true,
    );
    assert!(emit_serve(EmitKind::Vllm, &serve).is_ok());
    assert_eq!(
        emit_serve(EmitKind::Deepspeed, &serve).unwrap_err().code(),
        "emit-wrong-command"
    );
    // a prefix-caching choice reaches both files: `--no-` on the command line, `false` in the
    // config file (which vLLM's load_config_file turns back into `--no-enable-prefix-caching`)
    let text = |p: Option<bool>| {
        let mut s = serve.clone();
        s.enable_prefix_caching = p;
        let files = emit_serve(EmitKind::Vllm, &s).unwrap();
        files
            .iter()
            .map(|f| f.contents.clone())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(!text(None).contains("prefix-caching"));
    let off = text(Some(false));
    assert!(off.contains("--no-enable-prefix-caching"), "{off}");
    assert!(off.contains("enable-prefix-caching: false"), "{off}");
    let on = text(Some(true));
    assert!(on.contains("  --enable-prefix-caching"), "{on}");
    assert!(on.contains("enable-prefix-caching: true"), "{on}");
}

#[test]
fn qlora_writes_peft_and_bitsandbytes_configs() {
    let w = TrainWorkload {
        lora: Some(Lora {
            rank: 16,
            targets: vec!["q_proj".into(), "v_proj".into()],
            qlora: true,
        }),
        ..workload()
    };
    let files = emit(EmitKind::Trainer, &spec(&Layout::single(), &w)).unwrap();
    let lora: serde_json::Value = serde_json::from_str(file(&files, "lora_config.json")).unwrap();
    assert_eq!(lora["r"], 16);
    assert_eq!(
        lora["target_modules"],
        serde_json::json!(["q_proj", "v_proj"])
    );
    let bnb: serde_json::Value = serde_json::from_str(file(&files, "bnb_config.json")).unwrap();
    assert_eq!(bnb["bnb_4bit_quant_type"], "nf4");
    assert_eq!(bnb["bnb_4bit_use_double_quant"], true);
}

#[test]
fn kinds_round_trip_their_names() {
    for (k, n) in EmitKind::ALL {
        assert_eq!(EmitKind::parse(n).unwrap(), k);
        assert_eq!(k.name(), n);
    }
    assert_eq!(
        EmitKind::parse("nope").unwrap_err().code(),
        "emit-unknown-kind"
    );
}

#[test]
fn every_supported_model_type_has_a_decoder_layer_class() {
    let mut sorted = DECODER_LAYER_CLASSES.to_vec();
    sorted.sort();
    assert_eq!(sorted, DECODER_LAYER_CLASSES.to_vec());
    assert_eq!(decoder_layer_class("llama"), Some("LlamaDecoderLayer"));
}

#[test]
fn trainer_turns_liger_on_as_the_simulator_models_it() {
    use crate::workload::{KernelSet, LossKernel};
    let args = |layers: KernelSet| -> serde_json::Value {
        let mut w = workload();
        w.kernels.layers = layers;
        w.kernels.loss = if layers == KernelSet::Liger {
            LossKernel::FusedLinear
        } else {
            LossKernel::Torch
        };
        let files = emit(EmitKind::Trainer, &spec(&Layout::single(), &w)).unwrap();
        serde_json::from_str(file(&files, "training_args.json")).unwrap()
    };
    assert!(args(KernelSet::Torch).get("use_liger_kernel").is_none());
    let liger = args(KernelSet::Liger);
    assert_eq!(liger["use_liger_kernel"], true);
    assert!(
        liger.get("liger_kernel_config").is_none(),
        "Liger's defaults"
    );
    let norm = args(KernelSet::Rmsnorm);
    assert_eq!(norm["use_liger_kernel"], true);
    assert_eq!(norm["liger_kernel_config"]["rms_norm"], true);
    assert_eq!(norm["liger_kernel_config"]["swiglu"], false);
    assert_eq!(
        norm["liger_kernel_config"]["fused_linear_cross_entropy"],
        false
    );
}
