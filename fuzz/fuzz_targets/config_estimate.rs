//! config.json bytes → model description → parameter counts → training and inference estimates.
//! Any input must give Ok or a typed error: never a panic, an overflow or unbounded work; and
//! the fast evaluator must give exactly the replay's answer (or the same error).
#![no_main]

use libfuzzer_sys::fuzz_target;
use memwall_core::memory::{simulate_infer, simulate_train, Kernels};
use memwall_core::workload::{
    AttentionImpl, InferWorkload, KvDtype, Optimizer, Precision, TrainWorkload, WeightFormat,
};

fuzz_target!(|data: &[u8]| {
    let Ok(json) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(model) = memwall_formats::parse_hf_config(json) else {
        return;
    };
    let _ = model.param_counts();
    // The replay costs O(layers); deep configs are valid but only slow the fuzzer down.
    if model.layers.len() > 64 {
        return;
    }
    // Options drawn from the input itself, so the corpus explores them too.
    let h = data.iter().fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let pick = |shift: u32, n: u64| ((h >> shift) % n) as usize;
    let seq = 1 + (h % 512);
    let mut train = TrainWorkload::new(1 + (h >> 9) % 3, seq);
    train.precision = [Precision::Bf16, Precision::Fp16, Precision::Fp32, Precision::AmpBf16]
        [pick(12, 4)];
    train.optimizer = [Optimizer::Adamw, Optimizer::AdamwFused, Optimizer::Sgd, Optimizer::Adafactor]
        [pick(14, 4)];
    train.attention = [AttentionImpl::Sdpa, AttentionImpl::Eager, AttentionImpl::Flash][pick(16, 3)];
    train.checkpointing = (h >> 18) & 1 == 1;
    train.dropout = (h >> 19) & 1 == 1;
    let replay = simulate_train(&model, &train, Kernels::Cuda);
    let fast = memwall_core::memory::fast::simulate_train(&model, &train, Kernels::Cuda);
    assert_eq!(replay, fast, "fast evaluator differs from the replay (train)");
    let infer = InferWorkload {
        batch: 1 + (h >> 20) % 2,
        prompt: seq,
        new_tokens: 1 + (h >> 22) % 4,
        attention: train.attention,
        weights: [WeightFormat::Bf16, WeightFormat::Fp32][pick(24, 2)],
        kv_dtype: [KvDtype::Auto, KvDtype::Fp8][pick(25, 2)],
        moe_decode_batched: (h >> 26) & 1 == 1,
    };
    let replay = simulate_infer(&model, &infer, Kernels::Cuda);
    let fast = memwall_core::memory::fast::simulate_infer(&model, &infer, Kernels::Cuda);
    assert_eq!(replay, fast, "fast evaluator differs from the replay (infer)");
});
