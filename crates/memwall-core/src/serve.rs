//! Runtime profile `vllm`: how many KV-cache blocks a vLLM deployment gets, following vLLM's
//! own accounting (vLLM 0.33.0, commit 4ba787ec9; every step is cited in `docs/vllm-accounting.md`).
//!
//! ```text
//! requested  = ceil(total_memory × gpu_memory_utilization)                    gpu_worker.py
//! available  = kv_cache_memory_bytes, or requested − weights − non-torch growth
//!              − activation peak of the profile run − CUDA-graph estimate        determine_available_memory
//! page/layer = block_size × kv_heads_per_rank × (head_size + head_size_v) × dtype bytes
//!              (full and sliding: k and v; MLA: one latent of kv_lora_rank + rope dims)   kv_cache_interface.py
//! groups     = one group of all layers (uniform), or per attention type split into groups of
//!              equal size (hybrid: Gemma 2/3)                                       kv_cache_planning.py
//! bytes_per_block = max over groups (layers in group × page)
//! num_gpu_blocks  = available // bytes_per_block      (block 0 is the null block)
//! blocks_per_request(N) = Σ groups: full cdiv(N, B); sliding W: cdiv(min(W−1+2·max_num_batched_tokens, N), B) + 1
//! ```

use crate::error::CoreError;
use crate::gpu::GpuSpec;
use crate::model::{AttentionKind, Mlp, ModelDesc};
use crate::quant::StoredWeights;
use crate::workload::WeightFormat;
use serde::Serialize;

/// Inputs of a vLLM deployment (one tensor-parallel rank is computed; ranks are symmetric).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServeConfig {
    /// Device memory as `cudaMemGetInfo` reports its total.
    pub gpu_memory_bytes: u64,
    /// `--tensor-parallel-size`.
    pub tp: u64,
    /// `--gpu-memory-utilization` (vLLM 0.33 default 0.92).
    pub gpu_memory_utilization: f64,
    /// Bytes per KV element (`--kv-cache-dtype auto` = the model dtype, fp8 = 1).
    pub kv_dtype_bytes: u64,
    /// `--block-size` (16).
    pub block_size: u64,
    /// `--max-model-len` (the model's maximum by default).
    pub max_model_len: u64,
    /// `--max-num-batched-tokens` (size of the profile run and of sliding-window reservations).
    pub max_num_batched_tokens: u64,
    /// `--kv-cache-memory-bytes`: replaces the profiled budget when set.
    pub kv_cache_memory_bytes: Option<u64>,
    /// Model weights held by one rank.
    pub weights_bytes_per_rank: u64,
    /// Memory growth outside PyTorch after vLLM's initial snapshot (measured by vLLM at start-up).
    pub non_torch_bytes: u64,
    /// Peak activation of the profile run (measured by vLLM at start-up).
    pub activation_peak_bytes: u64,
    /// CUDA-graph memory estimate (0 with `--enforce-eager`).
    pub cuda_graph_bytes: u64,
    /// `--enable-prefix-caching` / `--no-enable-prefix-caching`; `None` = vLLM's default for the
    /// model (on, except for attention-free models: `ModelConfig.is_prefix_caching_supported`).
    /// It only changes the accounting of state layers (`mamba_cache_mode`, [`crate::serve_ssm`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_prefix_caching: Option<bool>,
    /// Whether vLLM runs the gated-DeltaNet prefill on FlashInfer (Hopper; Blackwell with
    /// 128-wide keys: `_resolve_gdn_prefill_backend` in
    /// `vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`), which exports prefill
    /// checkpoints in `"align"` mode. Only read for models with gated-DeltaNet layers.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub flashinfer_gdn_prefill: bool,
}

/// `KvGroup::kind` of a state group (Mamba or gated-DeltaNet layers, vLLM's `MambaSpec`).
pub const STATE_KIND: &str = crate::serve_ssm::KIND;

/// How vLLM keeps the states of a model with state layers (Mamba, gated DeltaNet).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StateCache {
    /// Whether prefix caching is on (vLLM's default: on for hybrids, off without attention).
    pub prefix_caching: bool,
    /// `mamba_cache_mode`: `align` with prefix caching, else `none`.
    pub mamba_cache_mode: &'static str,
    /// Tokens per attention block after vLLM raised it so one attention page holds a whole
    /// state page (`Platform._align_hybrid_block_size`); `--block-size` without attention.
    pub block_size: u64,
    /// Bytes of one layer's state before it is padded to the attention page.
    pub state_page_bytes: u64,
    /// Blocks one request holds in each state group (1 in `none` mode, 2 in `align` mode,
    /// 3 with gated-DeltaNet prefill checkpoints).
    pub state_blocks_per_request: u64,
}

/// One KV-cache group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvGroup {
    /// `full` or `sliding`.
    pub kind: &'static str,
    /// Layers in the group (padding included for hybrid groups).
    pub num_layers: u64,
    /// Bytes of one layer's page (one block of `block_size` tokens).
    pub page_size_bytes: u64,
    /// Window of a sliding group.
    pub sliding_window: Option<u64>,
    /// Chunk of a chunked-local-attention group (Llama 4; `kind` is `chunked`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_chunk_size: Option<u64>,
}

/// vLLM's KV capacity for a deployment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServePlan {
    /// `ceil(total × utilization)`.
    pub requested_memory_bytes: u64,
    /// Memory left for the KV cache.
    pub available_kv_bytes: u64,
    /// KV heads each rank stores (1 for MLA; replicated when fewer heads than ranks).
    pub num_kv_heads_per_rank: u64,
    /// The layer groups.
    pub groups: Vec<KvGroup>,
    /// Bytes of one block across all layers of a group (the largest group).
    pub bytes_per_block: u64,
    /// `available // bytes_per_block` (includes the null block).
    pub num_gpu_blocks: u64,
    /// `num_gpu_blocks × block_size`.
    pub kv_tokens: u64,
    /// Whether one request of `max_model_len` tokens fits (else vLLM refuses to start).
    pub fits_max_model_len: bool,
    /// The largest `--max-model-len` that fits one request.
    pub max_model_len_that_fits: u64,
    /// How the states are kept, for models with state layers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_cache: Option<StateCache>,
}

/// A page or block size in bytes; only an absurd `block_size` can push it past 64 bits.
fn block_bytes(v: u128, cfg: &ServeConfig) -> Result<u64, CoreError> {
    u64::try_from(v).map_err(|_| {
        CoreError::invalid_value(
            "block_size",
            cfg.block_size,
            "one block of this model's KV cache would exceed 2^64 bytes",
            "use vLLM's block sizes (16 by default; 8 to 128 are common)",
        )
    })
}

impl ServeConfig {
    /// Checks every count and fraction against the shared limits
    /// ([`crate::workload::limits`]): the error names the field, its value and what to do.
    /// Byte counts need no check: they are subtracted with saturation, so an estimate larger
    /// than the GPU leaves no KV cache (and the plan says it does not fit).
    pub fn validate(&self) -> Result<(), CoreError> {
        use crate::layout::MAX_GPUS;
        use crate::workload::limits::{count, fraction, MAX_BATCHED_TOKENS, MAX_CONTEXT};
        count("tp", self.tp, MAX_GPUS)?;
        count("block_size", self.block_size, MAX_CONTEXT)?;
        count("max_model_len", self.max_model_len, MAX_CONTEXT)?;
        count(
            "max_num_batched_tokens",
            self.max_num_batched_tokens,
            MAX_BATCHED_TOKENS,
        )?;
        if self.kv_dtype_bytes == 0 || self.kv_dtype_bytes > 8 {
            return Err(CoreError::invalid_value(
                "kv_cache_dtype",
                format!("{} bytes", self.kv_dtype_bytes),
                "a KV element is 1 to 8 bytes",
                "use `kv_cache_dtype` auto or fp8",
            ));
        }
        fraction("gpu_memory_utilization", self.gpu_memory_utilization)?;
        Ok(())
    }
}

impl ServePlan {
    /// Blocks one request of `tokens` tokens needs, summed over groups.
    pub fn blocks_per_request(&self, cfg: &ServeConfig, tokens: u64) -> u64 {
        // hybrids: the attention block size vLLM aligned to the state page
        let b = self
            .state_cache
            .as_ref()
            .map_or(cfg.block_size, |s| s.block_size)
            .max(1);
        let state_blocks = self
            .state_cache
            .as_ref()
            .map_or(1, |s| s.state_blocks_per_request);
        self.groups
            .iter()
            .map(|g| match (g.attention_chunk_size, g.sliding_window) {
                // a state layer holds its states whatever the request's length
                // (MambaSpec.max_memory_usage_bytes)
                _ if g.kind == crate::serve_ssm::KIND => state_blocks,
                // ChunkedLocalAttentionSpec.max_admission_blocks_per_request
                // (v1/kv_cache_interface.py l.864): cdiv(min(chunk + in-flight tokens,
                // max_model_len), block_size), in-flight = 2 batches (as for sliding windows)
                (Some(chunk), _) => chunk
                    .saturating_add(cfg.max_num_batched_tokens.saturating_mul(2))
                    .min(tokens)
                    .div_ceil(b),
                (None, Some(w)) => {
                    let span = w
                        .saturating_sub(1)
                        .saturating_add(cfg.max_num_batched_tokens.saturating_mul(2))
                        .min(tokens);
                    span.div_ceil(b) + 1
                }
                (None, None) => tokens.div_ceil(b),
            })
            .sum()
    }

    /// vLLM's logged maximum concurrency for requests of `tokens` tokens.
    pub fn max_concurrency(&self, cfg: &ServeConfig, tokens: u64) -> f64 {
        let need = self.blocks_per_request(cfg, tokens).max(1);
        self.num_gpu_blocks as f64 / need as f64
    }
}

/// vLLM requires the attention heads to split evenly over the ranks
/// (config.py ModelConfig.verify_with_parallel_config).
pub(crate) fn check_heads_divide_tp(heads: u64, tp: u64) -> Result<(), CoreError> {
    if !heads.is_multiple_of(tp) {
        let fits: Vec<String> = (1..=heads.min(64))
            .filter(|t| heads.is_multiple_of(*t))
            .map(|t| t.to_string())
            .collect();
        return Err(CoreError::invalid_value(
            "tp",
            tp,
            format!("{heads} attention heads are not divisible by the tensor-parallel size"),
            format!("pick a `tp` that divides {heads}: {}", fits.join(", ")),
        ));
    }
    Ok(())
}

/// Computes vLLM's KV capacity for `model` under `cfg`.
pub fn plan(model: &ModelDesc, cfg: &ServeConfig) -> Result<ServePlan, CoreError> {
    cfg.validate()?;
    let first = model.layers.first().ok_or_else(|| {
        CoreError::invalid_value(
            "num_hidden_layers",
            0,
            "the model has no layers",
            "the model config must describe at least one decoder layer",
        )
    })?;
    if model.layers.iter().any(|l| !l.mixer.is_attention()) {
        return crate::serve_ssm::plan(model, cfg);
    }
    check_heads_divide_tp(first.attention.num_heads(), cfg.tp)?;
    let requested = (cfg.gpu_memory_bytes as f64 * cfg.gpu_memory_utilization).ceil() as u64;
    let available = match cfg.kv_cache_memory_bytes {
        Some(b) => b,
        None => requested
            .saturating_sub(cfg.weights_bytes_per_rank)
            .saturating_sub(cfg.non_torch_bytes)
            .saturating_sub(cfg.activation_peak_bytes)
            .saturating_sub(cfg.cuda_graph_bytes),
    };
    // page sizes per layer; ModelConfig.get_num_kv_heads: 1 for MLA, else max(1, kv // tp)
    let mut kv_heads_rank = 1;
    // (window, chunked, page): a chunked layer is its own spec (vLLM 0.33 keeps the hybrid KV
    // cache manager for chunked local attention: VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE
    // defaults to 1, envs.py l.272)
    let mut specs: Vec<(Option<u64>, bool, u128)> = Vec::with_capacity(model.layers.len());
    for l in &model.layers {
        let (kvh, per_token_elems) = match l.attention.kind {
            AttentionKind::Standard {
                num_kv_heads,
                head_dim,
                ..
            } => {
                let kvh = (num_kv_heads / cfg.tp).max(1);
                (kvh, 2 * u128::from(kvh) * u128::from(head_dim))
            }
            AttentionKind::Mla {
                kv_lora_rank,
                qk_rope_head_dim,
                ..
            } => (1, u128::from(kv_lora_rank) + u128::from(qk_rope_head_dim)),
        };
        kv_heads_rank = kvh;
        // block_size ≤ 2^26, kv heads and head dims ≤ 2^14 each: the product fits in u128
        let page = u128::from(cfg.block_size) * per_token_elems * u128::from(cfg.kv_dtype_bytes);
        specs.push((l.attention.sliding_window, l.attention.chunked, page));
    }
    // grouping (kv_cache_planning.py _get_kv_cache_groups_uniform_spec / _uniform_page_size)
    let mut buckets: Vec<(Option<u64>, bool, u128, u64)> = Vec::new();
    for (w, chunked, page) in &specs {
        match buckets
            .iter_mut()
            .find(|(bw, bc, bp, _)| bw == w && bc == chunked && bp == page)
        {
            Some(b) => b.3 += 1,
            None => buckets.push((*w, *chunked, *page, 1)),
        }
    }
    let group = |w: Option<u64>, chunked: bool, n: u64, page: u128| -> Result<KvGroup, CoreError> {
        Ok(KvGroup {
            kind: match (chunked, w) {
                (true, _) => "chunked",
                (false, Some(_)) => "sliding",
                (false, None) => "full",
            },
            num_layers: n,
            page_size_bytes: block_bytes(page, cfg)?,
            sliding_window: if chunked { None } else { w },
            attention_chunk_size: if chunked { w } else { None },
        })
    };
    let groups: Vec<KvGroup> = if buckets.len() == 1 {
        let (w, chunked, page, n) = buckets[0];
        vec![group(w, chunked, n, page)?]
    } else {
        let min = buckets.iter().map(|b| b.3).min().unwrap_or(1);
        let max = buckets.iter().map(|b| b.3).max().unwrap_or(1);
        let group_size = if (max as f64) < 1.5 * min as f64 {
            max
        } else {
            min
        };
        let mut gs = Vec::new();
        for (w, chunked, page, n) in buckets {
            for _ in 0..n.div_ceil(group_size) {
                gs.push(group(w, chunked, group_size, page)?);
            }
        }
        gs
    };
    let bytes_per_block = groups
        .iter()
        .map(|g| u128::from(g.num_layers) * u128::from(g.page_size_bytes))
        .max()
        .unwrap_or(1)
        .max(1);
    let bytes_per_block = block_bytes(bytes_per_block, cfg)?;
    let num_gpu_blocks = available / bytes_per_block;
    let mut plan = ServePlan {
        requested_memory_bytes: requested,
        available_kv_bytes: available,
        num_kv_heads_per_rank: kv_heads_rank,
        groups,
        bytes_per_block,
        num_gpu_blocks,
        kv_tokens: num_gpu_blocks.saturating_mul(cfg.block_size),
        fits_max_model_len: false,
        max_model_len_that_fits: 0,
        state_cache: None,
    };
    startup_check(&mut plan, cfg, available, bytes_per_block);
    Ok(plan)
}

/// vLLM's start-up check (`vllm/v1/core/kv_cache_planning.py` `check_enough_kv_cache_memory`,
/// vLLM 0.33.0): one request of `max_model_len` must fit in the KV memory less the reserved null
/// block, else vLLM raises and reports the longest length that would fit
/// (`_estimate_max_model_len_from_groups`, a binary search over `[1, max_model_len]`). Sets
/// `fits_max_model_len` and `max_model_len_that_fits` (0 when not even the null block fits).
pub(crate) fn startup_check(
    plan: &mut ServePlan,
    cfg: &ServeConfig,
    available: u64,
    bytes_per_block: u64,
) {
    let check = available.saturating_sub(bytes_per_block);
    let fits = |plan: &ServePlan, len: u64| -> bool {
        u128::from(plan.blocks_per_request(cfg, len)) * u128::from(bytes_per_block)
            <= u128::from(check)
    };
    plan.fits_max_model_len = check > 0 && fits(plan, cfg.max_model_len);
    let (mut lo, mut hi) = (0u64, cfg.max_model_len);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(plan, mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    plan.max_model_len_that_fits = if check > 0 { lo } else { 0 };
}

/// Weights one rank holds: layer weights split over ranks, the vocabulary-parallel embedding and
/// LM head padded to a multiple of 64 rows (vLLM `VocabParallelEmbedding`, `pad_vocab_size`),
/// norms replicated. An estimate: vLLM measures the real number when it loads the model.
pub fn weights_bytes_per_rank(
    model: &ModelDesc,
    tp: u64,
    bytes_per_param: f64,
) -> Result<u64, CoreError> {
    let c = model.param_counts()?;
    let v = model.embeddings.vocab_size;
    let v_pad = v.div_ceil(64) * 64;
    let dim = model.embeddings.dim;
    let embed_rows = |params: u64| {
        if params == 0 {
            0.0
        } else {
            (v_pad * dim) as f64 / tp as f64
        }
    };
    let vocab_params = u128::from(v) * u128::from(dim);
    let embed_other = u128::from(c.embeddings).saturating_sub(vocab_params) as f64;
    let per_rank = embed_rows(c.embeddings)
        + embed_other
        + c.layers as f64 / tp as f64
        + c.final_norm as f64
        + embed_rows(c.lm_head);
    Ok((per_rank * bytes_per_param).round() as u64)
}

/// How the weights one rank holds are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServeWeights {
    /// Every weight in the checkpoint dtype ([`ServeRequest::dtype_bytes`]).
    Dtype,
    /// The linear layers (MoE experts and shared experts included) in a quantised format;
    /// embeddings, norms and routers in the checkpoint dtype, as vLLM's quantisation methods
    /// create them: each `LinearMethod.create_weights` registers the packed weight and its
    /// scales per partition (vLLM 0.33 `quantization/fp8.py` `Fp8LinearMethod.create_weights`
    /// l.282: fp8 weight + fp32 `weight_scale_inv` per 128×128 block; `auto_gptq.py`
    /// `AutoGPTQLinearMethod.create_weights` l.322: `qweight`, `scales`, `qzeros`, `g_idx`;
    /// `auto_awq.py` `AutoAWQMarlinLinearMethod.create_weights` l.418: `qweight`, `qzeros`,
    /// `scales`; the `FusedMoEMethod`s create the same per expert, `w13_*` and `w2_*`), while
    /// `VocabParallelEmbedding`, `ParallelLMHead`, norms and the `ReplicatedLinear` router
    /// stay unquantised.
    Format(WeightFormat),
    /// A checkpoint's exact tensor bytes (read from its headers).
    Stored(StoredWeights),
}

/// [`weights_bytes_per_rank`] with the linear layers stored in `format` (see
/// [`ServeWeights::Format`]): the unquantised bytes of every quantisable linear are replaced
/// by its bytes in `format`, split over the ranks as the linear is (column- or row-parallel).
/// GGUF presets are refused (llama.cpp's per-tensor types are not vLLM's).
pub fn weights_bytes_per_rank_in(
    model: &ModelDesc,
    tp: u64,
    dtype_bytes: u64,
    format: WeightFormat,
) -> Result<u64, CoreError> {
    if matches!(format, WeightFormat::Gguf(_)) {
        return Err(CoreError::invalid_value(
            "weights",
            format.name(),
            "GGUF presets are llama.cpp's per-tensor types, not a vLLM quantisation method",
            "pass the .gguf file itself as the model (its tensor bytes are read), or a vLLM format such as fp8, gptq-int4-g128 or awq-int4-g128",
        ));
    }
    let base = weights_bytes_per_rank(model, tp, dtype_bytes as f64)?;
    let tp_f = tp.max(1) as f64;
    let h = model.hidden_size;
    let (mut plain, mut packed) = (0f64, 0f64);
    let mut add = |out_f: u64, in_f: u64, copies: u64, expert: bool| {
        let (o, i, n) = (u128::from(out_f), u128::from(in_f), u128::from(copies));
        let bytes = if expert {
            crate::quant::expert_bytes(format, o, i)
        } else {
            crate::quant::linear_bytes(format, o, i)
        };
        if let Some(b) = bytes {
            plain += (n * o * i * u128::from(dtype_bytes)) as f64;
            packed += (n * b) as f64;
        }
    };
    for l in &model.layers {
        for s in l.mixer_linears(h) {
            add(s.out_features, s.in_features, 1, false);
        }
        match &l.mlp {
            Mlp::None => {}
            Mlp::Dense(d) => {
                for s in d.linears(h) {
                    add(s.out_features, s.in_features, 1, false);
                }
            }
            Mlp::Moe(m) => {
                // per expert: gate and up `[I, H]` (or one of them), down `[H, I]`
                let i = m.expert.intermediate;
                let ins = if m.expert.gated { 2 } else { 1 };
                add(i, h, m.num_experts * ins, true);
                add(h, i, m.num_experts, true);
                if let Some(sh) = &m.shared {
                    for s in sh.linears(h) {
                        add(s.out_features, s.in_features, 1, false);
                    }
                }
            }
        }
    }
    let per_rank = base as f64 - plain / tp_f + packed / tp_f;
    Ok(per_rank.max(0.0).round() as u64)
}

/// Weights one rank holds from a checkpoint's exact tensor bytes: decoder layers split over
/// the ranks, the rest (embeddings, LM head) as vocabulary-parallel tensors padded to 64
/// rows (as [`weights_bytes_per_rank`]).
pub fn weights_bytes_per_rank_stored(model: &ModelDesc, tp: u64, stored: StoredWeights) -> u64 {
    let tp = tp.max(1) as f64;
    let v = model.embeddings.vocab_size.max(1);
    let pad = v.div_ceil(64) * 64;
    let other = stored.other_bytes as f64 * pad as f64 / v as f64;
    ((stored.layer_bytes as f64 + other) / tp).round() as u64
}

/// `--max-num-batched-tokens` default of `vllm serve` on `gpu` (vLLM 0.33
/// `EngineArgs.get_batch_defaults`, arg_utils.py l.2940–3039; docs/vllm-accounting.md, inputs
/// table): 16384 from 160 GiB of device memory, 8192 from 70 GiB except on A100s, else 2048.
pub fn default_max_num_batched_tokens(gpu: &GpuSpec) -> u64 {
    let gib = gpu.memory_bytes >> 30;
    if gib >= 160 {
        16384
    } else if gib >= 70 && !gpu.id.starts_with("a100") {
        8192
    } else {
        2048
    }
}

/// `--max-num-seqs` default of `vllm serve` (same source as
/// [`default_max_num_batched_tokens`]): 1024 on the devices whose batched-token default is
/// 8192 or more, else 256. vLLM picks both from the device; memwall keys this one on the
/// batched-token count, which agrees with vLLM unless `--max-num-batched-tokens` is given.
pub fn default_max_num_seqs(max_num_batched_tokens: u64) -> u64 {
    if max_num_batched_tokens >= 8192 {
        1024
    } else {
        256
    }
}

/// memwall's estimate of the profile run's activation peak, which vLLM measures at start-up:
/// the residual stream, q/k/v and MLP intermediates of one layer for the dummy batch of
/// `max_num_batched_tokens` tokens, plus the sampler's fp32 logits (and their softmax) for
/// `max_num_seqs` sequences over the 64-padded vocabulary shard.
pub fn estimate_activation_peak_bytes(
    model: &ModelDesc,
    tp: u64,
    max_num_batched_tokens: u64,
    max_num_seqs: u64,
    dtype_bytes: u64,
) -> u64 {
    let tp = tp.max(1);
    let h = model.hidden_size;
    let inter = model
        .layers
        .iter()
        .map(|l| match &l.mlp {
            Mlp::Dense(d) => d.intermediate * if d.gated { 2 } else { 1 },
            Mlp::Moe(x) => x.expert.intermediate * 2 * x.top_k,
            Mlp::None => 0,
        })
        .max()
        .unwrap_or(0)
        / tp;
    let vocab = model.embeddings.vocab_size.div_ceil(64) * 64 / tp;
    let per_token = (4 * h).saturating_add(2 * inter);
    max_num_batched_tokens
        .saturating_mul(per_token)
        .saturating_mul(dtype_bytes)
        .saturating_add(max_num_seqs.saturating_mul(vocab).saturating_mul(4 * 2))
}

/// memwall's estimate of the memory growth outside PyTorch during vLLM's start-up (NCCL
/// buffers with tensor parallelism, cuBLAS/cuDNN handles), which vLLM measures: 512 MiB with
/// `tp > 1`, else 256 MiB.
pub fn estimate_non_torch_bytes(tp: u64) -> u64 {
    if tp > 1 {
        512 << 20
    } else {
        256 << 20
    }
}

/// memwall's estimate of the CUDA-graph memory vLLM captures (0 with `--enforce-eager`).
pub const CUDA_GRAPH_BYTES_ESTIMATE: u64 = 512 << 20;

/// A deployment as asked: the flags of `vllm serve`, unset ones taking vLLM's defaults, and
/// start-up measurements when the user has them.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeRequest {
    /// `--tensor-parallel-size`.
    pub tp: u64,
    /// `--gpu-memory-utilization`.
    pub gpu_memory_utilization: f64,
    /// Bytes per KV element (`--kv-cache-dtype`).
    pub kv_dtype_bytes: u64,
    /// Bytes per weight element of the checkpoint.
    pub dtype_bytes: u64,
    /// How the weights are sized (`--quantization`, the checkpoint's headers or config).
    pub weights: ServeWeights,
    /// `--block-size`.
    pub block_size: u64,
    /// `--max-model-len` (default: the model's `max_position_embeddings`).
    pub max_model_len: Option<u64>,
    /// `--max-num-batched-tokens` (default: [`default_max_num_batched_tokens`]).
    pub max_num_batched_tokens: Option<u64>,
    /// `--max-num-seqs` (default: [`default_max_num_seqs`]).
    pub max_num_seqs: Option<u64>,
    /// `--enforce-eager`.
    pub enforce_eager: bool,
    /// `--kv-cache-memory-bytes`.
    pub kv_cache_memory_bytes: Option<u64>,
    /// Measured non-torch growth (default: [`estimate_non_torch_bytes`]).
    pub non_torch_bytes: Option<u64>,
    /// Measured profile-run activation peak (default: [`estimate_activation_peak_bytes`]).
    pub activation_bytes: Option<u64>,
    /// Measured CUDA-graph memory (default: [`CUDA_GRAPH_BYTES_ESTIMATE`]).
    pub cuda_graph_bytes: Option<u64>,
    /// `--enable-prefix-caching` / `--no-enable-prefix-caching` (default: vLLM's for the model).
    pub enable_prefix_caching: Option<bool>,
}

/// GPU architectures on which memwall models vLLM's hybrid (attention + state layers) block
/// alignment: those where vLLM picks FlashAttention first (`platforms/cuda.py`
/// `_get_backend_priorities`, SM 8.x/9.x).
pub const HYBRID_ARCHITECTURES: [&str; 3] = ["ampere", "ada", "hopper"];

/// A [`ServeConfig`] with vLLM's defaults and memwall's estimates filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedServe {
    /// The configuration [`plan`] takes.
    pub config: ServeConfig,
    /// `--max-num-seqs` as resolved.
    pub max_num_seqs: u64,
    /// Which inputs of `config` are memwall's estimates rather than given or fixed by
    /// `--kv-cache-memory-bytes` (vLLM measures them at start-up), in `config` field order.
    pub estimated_inputs: Vec<&'static str>,
}

/// Fills `request` in for `model` on `gpu`: vLLM's defaults for unset flags, memwall's
/// estimates for what vLLM measures at start-up. With `--kv-cache-memory-bytes` the budget is
/// fixed and no estimate matters, so none is listed.
pub fn resolve(
    model: &ModelDesc,
    gpu: &GpuSpec,
    request: &ServeRequest,
) -> Result<ResolvedServe, CoreError> {
    let tp = request.tp;
    if tp == 0 {
        return Err(CoreError::invalid("tp", "must be at least 1"));
    }
    let has_state = model.layers.iter().any(|l| !l.mixer.is_attention());
    let has_attention = model.layers.iter().any(|l| l.attention_block().is_some());
    if request.kv_dtype_bytes != request.dtype_bytes && has_state {
        // vLLM keeps Mamba and gated-DeltaNet states in `mamba_cache_dtype` /
        // `mamba_ssm_cache_dtype` ("auto" = the model dtype; model_executor/layers/mamba/
        // mamba_utils.py `_mamba_state_dtype`): `--kv-cache-dtype` applies to attention layers
        // only. Without attention the flag has nothing to act on; with attention the states
        // would stay in the model dtype next to an fp8 attention page, a block alignment
        // memwall does not model
        let reason = if has_attention {
            format!(
                "`{}` mixes attention and state layers: vLLM would keep the states in --mamba-cache-dtype (auto = the model dtype) next to an fp8 attention cache, which memwall does not model",
                crate::error::untrusted(&model.model_type)
            )
        } else {
            format!(
                "`{}` has no attention layers: vLLM keeps its state-space states in --mamba-cache-dtype (auto = the model dtype), not in --kv-cache-dtype",
                crate::error::untrusted(&model.model_type)
            )
        };
        return Err(CoreError::invalid_value(
            "kv_cache_dtype",
            format!("{}-byte", request.kv_dtype_bytes),
            reason,
            "drop --kv-cache-dtype (memwall sizes the states in the model dtype, vLLM's default)",
        ));
    }
    if has_state && has_attention && !HYBRID_ARCHITECTURES.contains(&gpu.architecture.as_str()) {
        // platforms/cuda.py `_get_backend_priorities`: FLASH_ATTN (kernel blocks MultipleOf(16))
        // comes first on SM 8.x/9.x only; Blackwell picks FlashInfer (fixed kernel block
        // sizes) and FA4's 128-token pages for head width 256, which the hybrid block
        // alignment would have to follow
        return Err(CoreError::invalid_value(
            "gpu",
            crate::error::untrusted(&gpu.id),
            format!(
                "vLLM's hybrid block alignment on a {} GPU depends on an attention backend memwall does not model (it models FlashAttention on ampere, ada and hopper)",
                crate::error::untrusted(&gpu.architecture)
            ),
            "pick an ampere, ada or hopper GPU (see `memwall gpus`)",
        ));
    }
    // _resolve_gdn_prefill_backend: FlashInfer on SM90, and on SM10x/12x with 128-wide keys
    // (the pinned wheel set runs CUDA 13)
    let mut gdn = model
        .layers
        .iter()
        .filter_map(|l| l.gated_delta_net())
        .peekable();
    let flashinfer_gdn_prefill = gdn.peek().is_some()
        && match gpu.architecture.as_str() {
            "hopper" => true,
            "blackwell" => gdn.all(|d| d.k_head_dim == 128),
            _ => false,
        };
    let batched = request
        .max_num_batched_tokens
        .unwrap_or_else(|| default_max_num_batched_tokens(gpu));
    let seqs = request
        .max_num_seqs
        .unwrap_or_else(|| default_max_num_seqs(batched));
    let mut estimated = vec!["weights_bytes_per_rank"];
    let weights = match request.weights {
        ServeWeights::Dtype => weights_bytes_per_rank(model, tp, request.dtype_bytes as f64)?,
        ServeWeights::Format(f) => weights_bytes_per_rank_in(model, tp, request.dtype_bytes, f)?,
        ServeWeights::Stored(s) => weights_bytes_per_rank_stored(model, tp, s),
    };
    let activation = request.activation_bytes.unwrap_or_else(|| {
        estimated.push("activation_peak_bytes");
        estimate_activation_peak_bytes(model, tp, batched, seqs, request.dtype_bytes)
    });
    let non_torch = request.non_torch_bytes.unwrap_or_else(|| {
        estimated.push("non_torch_bytes");
        estimate_non_torch_bytes(tp)
    });
    let graphs = if request.enforce_eager {
        0
    } else {
        request.cuda_graph_bytes.unwrap_or_else(|| {
            estimated.push("cuda_graph_bytes");
            CUDA_GRAPH_BYTES_ESTIMATE
        })
    };
    if request.kv_cache_memory_bytes.is_some() {
        estimated.clear();
    }
    Ok(ResolvedServe {
        config: ServeConfig {
            gpu_memory_bytes: gpu.memory_bytes,
            tp,
            gpu_memory_utilization: request.gpu_memory_utilization,
            kv_dtype_bytes: request.kv_dtype_bytes,
            block_size: request.block_size,
            max_model_len: request
                .max_model_len
                .unwrap_or(model.max_position_embeddings),
            max_num_batched_tokens: batched,
            kv_cache_memory_bytes: request.kv_cache_memory_bytes,
            weights_bytes_per_rank: weights,
            non_torch_bytes: non_torch,
            activation_peak_bytes: activation,
            cuda_graph_bytes: graphs,
            enable_prefix_caching: request.enable_prefix_caching,
            flashinfer_gdn_prefill,
        },
        max_num_seqs: seqs,
        estimated_inputs: estimated,
    })
}

/// Memory a request of `request_tokens` tokens leaves unused, contiguous versus paged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fragmentation {
    /// Tokens of the request.
    pub request_tokens: u64,
    /// Fraction of a contiguous `max_model_len` reservation left unused by this request.
    pub contiguous_waste: f64,
    /// Fraction of its blocks a paged request leaves unused (only the last block is partial).
    pub paged_waste: f64,
}

/// Waste of a request of `request_tokens` tokens under `cfg`: a contiguous cache reserves
/// `max_model_len` per request (as before PagedAttention, Kwon et al. 2023 §3), a paged one
/// whole blocks of `block_size`.
pub fn fragmentation(cfg: &ServeConfig, request_tokens: u64) -> Fragmentation {
    let n = request_tokens;
    let reserved = cfg.max_model_len.max(n) as f64;
    let blocks = n.div_ceil(cfg.block_size.max(1)) * cfg.block_size.max(1);
    Fragmentation {
        request_tokens: n,
        contiguous_waste: 1.0 - n as f64 / reserved,
        paged_waste: 1.0 - n as f64 / blocks as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::llama2_7b;

    fn cfg() -> ServeConfig {
        ServeConfig {
            gpu_memory_bytes: 80 << 30,
            tp: 1,
            gpu_memory_utilization: 0.92,
            kv_dtype_bytes: 2,
            block_size: 16,
            max_model_len: 4096,
            max_num_batched_tokens: 8192,
            kv_cache_memory_bytes: None,
            weights_bytes_per_rank: 13_476_831_232,
            non_torch_bytes: 256 << 20,
            activation_peak_bytes: 1 << 30,
            cuda_graph_bytes: 512 << 20,
            enable_prefix_caching: None,
            flashinfer_gdn_prefill: false,
        }
    }

    #[test]
    fn quantised_linears_shrink_the_weights_per_rank_and_stored_bytes_split() {
        let m = llama2_7b();
        let bf16 = weights_bytes_per_rank(&m, 2, 2.0).unwrap();
        let fp8 = weights_bytes_per_rank_in(&m, 2, 2, WeightFormat::Fp8).unwrap();
        let awq = weights_bytes_per_rank_in(&m, 2, 2, WeightFormat::Awq { group: 128 }).unwrap();
        assert!(awq < fp8 && fp8 < bf16, "{awq} {fp8} {bf16}");
        // the embeddings and the head stay in bf16: fp8 saves about half of the layers only
        assert!(fp8 as f64 > 0.5 * bf16 as f64);
        assert_eq!(
            weights_bytes_per_rank_in(&m, 2, 2, WeightFormat::Bf16).unwrap(),
            bf16
        );
        let s = StoredWeights {
            layer_bytes: 1000,
            other_bytes: 0,
        };
        assert_eq!(weights_bytes_per_rank_stored(&m, 4, s), 250);
        assert!(weights_bytes_per_rank_in(
            &m,
            1,
            2,
            WeightFormat::Gguf(crate::quant::GgufPreset::Q4KM)
        )
        .is_err());
    }

    #[test]
    fn llama2_7b_pages_are_16_tokens_of_k_and_v() {
        let p = plan(&llama2_7b(), &cfg()).unwrap();
        assert_eq!(p.groups.len(), 1);
        assert_eq!(p.groups[0].page_size_bytes, 16 * 2 * 32 * 128 * 2);
        assert_eq!(p.bytes_per_block, 32 * 16 * 2 * 32 * 128 * 2);
        assert_eq!(p.num_gpu_blocks, p.available_kv_bytes / p.bytes_per_block);
        assert!(p.fits_max_model_len);
    }

    /// vLLM's Falcon caches the real key/value heads (vLLM 0.33 vllm/model_executor/models/
    /// falcon.py `FalconAttention`: `total_num_kv_heads = config.num_kv_heads` with the new
    /// architecture, `Attention(self.num_heads, ..., num_kv_heads=self.num_kv_heads)`),
    /// so a new-architecture Falcon whose transformers step expands them (`kv_expanded`) pages
    /// the grouped heads.
    #[test]
    fn expanded_falcon_heads_page_the_real_key_value_heads() {
        let mut m = llama2_7b();
        for l in &mut m.layers {
            if let crate::model::AttentionKind::Standard {
                ref mut num_kv_heads,
                ..
            } = l.attention.kind
            {
                *num_kv_heads = 8;
            }
        }
        let grouped = plan(&m, &cfg()).unwrap();
        for l in &mut m.layers {
            l.attention.kv_expanded = true;
        }
        let expanded = plan(&m, &cfg()).unwrap();
        assert_eq!(expanded.groups[0].page_size_bytes, 16 * 2 * 8 * 128 * 2);
        assert_eq!(expanded.bytes_per_block, grouped.bytes_per_block);
    }

    #[test]
    fn too_small_a_budget_refuses_and_estimates_a_max_len() {
        let mut c = cfg();
        c.kv_cache_memory_bytes = Some(1 << 30);
        c.max_model_len = 1 << 20;
        let p = plan(&llama2_7b(), &c).unwrap();
        assert!(!p.fits_max_model_len);
        // uniform full attention: E = block_size × (available // bytes_per_block − 1)
        assert_eq!(p.max_model_len_that_fits, 16 * (p.num_gpu_blocks - 1));
    }

    #[test]
    fn heads_must_divide_tp() {
        let mut c = cfg();
        c.tp = 3;
        let e = plan(&llama2_7b(), &c).unwrap_err();
        assert_eq!((e.field(), e.value()), (Some("tp"), Some("3")));
        assert!(e.hint().contains("1, 2, 4, 8, 16, 32"), "{}", e.hint());
    }

    #[test]
    fn each_zero_or_absurd_setting_names_its_own_field() {
        let field = |f: fn(&mut ServeConfig)| {
            let mut c = cfg();
            f(&mut c);
            plan(&llama2_7b(), &c).unwrap_err().field()
        };
        assert_eq!(field(|c| c.block_size = 0), Some("block_size"));
        assert_eq!(field(|c| c.max_model_len = 0), Some("max_model_len"));
        assert_eq!(field(|c| c.tp = 0), Some("tp"));
        assert_eq!(
            field(|c| c.max_num_batched_tokens = u64::MAX),
            Some("max_num_batched_tokens")
        );
        assert_eq!(
            field(|c| c.max_num_batched_tokens = 0),
            Some("max_num_batched_tokens")
        );
        assert_eq!(
            field(|c| c.gpu_memory_utilization = 1e-300),
            Some("gpu_memory_utilization")
        );
        assert_eq!(
            field(|c| c.gpu_memory_utilization = f64::NAN),
            Some("gpu_memory_utilization")
        );
        assert_eq!(field(|c| c.max_model_len = u64::MAX), Some("max_model_len"));
    }

    #[test]
    fn requests_near_u64_max_do_not_wrap() {
        let p = plan(&llama2_7b(), &cfg()).unwrap();
        let mut c = cfg();
        c.max_num_batched_tokens = u64::MAX;
        assert!(p.blocks_per_request(&c, u64::MAX) > 0);
        assert!(p.max_concurrency(&cfg(), u64::MAX).is_finite());
    }
}

#[cfg(test)]
mod default_tests {
    use super::*;
    use crate::advice::tests::gpu;
    use crate::model::tests::llama2_7b;

    fn request() -> ServeRequest {
        ServeRequest {
            tp: 1,
            gpu_memory_utilization: 0.92,
            kv_dtype_bytes: 2,
            dtype_bytes: 2,
            weights: ServeWeights::Dtype,
            block_size: 16,
            max_model_len: None,
            max_num_batched_tokens: None,
            max_num_seqs: None,
            enforce_eager: false,
            kv_cache_memory_bytes: None,
            non_torch_bytes: None,
            activation_bytes: None,
            cuda_graph_bytes: None,
            enable_prefix_caching: None,
        }
    }

    #[test]
    fn vllm_batch_defaults_follow_device_memory() {
        let h100 = gpu("h100-sxm", 80, "hopper");
        let a100 = gpu("a100-80gb-sxm", 80, "ampere");
        let h200 = gpu("h200", 141, "hopper");
        let b200 = gpu("b200", 180, "blackwell");
        let l4 = gpu("l4", 24, "ada");
        assert_eq!(default_max_num_batched_tokens(&h100), 8192);
        assert_eq!(default_max_num_batched_tokens(&a100), 2048);
        assert_eq!(default_max_num_batched_tokens(&h200), 8192);
        assert_eq!(default_max_num_batched_tokens(&b200), 16384);
        assert_eq!(default_max_num_batched_tokens(&l4), 2048);
        assert_eq!(default_max_num_seqs(8192), 1024);
        assert_eq!(default_max_num_seqs(2048), 256);
    }

    #[test]
    fn activation_estimate_is_one_layer_of_the_dummy_batch_plus_sampler_logits() {
        // Llama-2-7B: hidden 4096, gated MLP 2 × 11008, vocab 32000 (a multiple of 64)
        let m = llama2_7b();
        let b = estimate_activation_peak_bytes(&m, 1, 8192, 1024, 2);
        assert_eq!(b, 8192 * (4 * 4096 + 2 * 2 * 11008) * 2 + 1024 * 32000 * 8);
        // absurd inputs saturate instead of overflowing
        assert_eq!(
            estimate_activation_peak_bytes(&m, 1, u64::MAX, u64::MAX, 2),
            u64::MAX
        );
    }

    #[test]
    fn resolve_lists_what_it_estimated_unless_the_budget_is_fixed() {
        let (m, g) = (llama2_7b(), gpu("h100-sxm", 80, "hopper"));
        let r = resolve(&m, &g, &request()).unwrap();
        assert_eq!(
            r.estimated_inputs,
            [
                "weights_bytes_per_rank",
                "activation_peak_bytes",
                "non_torch_bytes",
                "cuda_graph_bytes"
            ]
        );
        assert_eq!(r.config.max_num_batched_tokens, 8192);
        assert_eq!(r.max_num_seqs, 1024);
        assert_eq!(r.config.max_model_len, m.max_position_embeddings);
        assert_eq!(r.config.cuda_graph_bytes, CUDA_GRAPH_BYTES_ESTIMATE);
        let mut q = request();
        (q.enforce_eager, q.activation_bytes, q.non_torch_bytes) = (true, Some(1), Some(2));
        let r = resolve(&m, &g, &q).unwrap();
        assert_eq!(r.estimated_inputs, ["weights_bytes_per_rank"]);
        assert_eq!(r.config.cuda_graph_bytes, 0);
        q.kv_cache_memory_bytes = Some(1 << 30);
        assert!(resolve(&m, &g, &q).unwrap().estimated_inputs.is_empty());
        q.tp = 0;
        assert!(resolve(&m, &g, &q).is_err());
    }

    #[test]
    fn paged_waste_is_only_the_last_block() {
        let cfg = resolve(&llama2_7b(), &gpu("h100-sxm", 80, "hopper"), &request())
            .unwrap()
            .config;
        let f = fragmentation(&cfg, 1000);
        assert_eq!(f.request_tokens, 1000);
        assert!((f.contiguous_waste - (1.0 - 1000.0 / 4096.0)).abs() < 1e-12);
        assert!((f.paged_waste - (1.0 - 1000.0 / 1008.0)).abs() < 1e-12);
    }
}
