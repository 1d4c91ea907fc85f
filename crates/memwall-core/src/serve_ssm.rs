//! vLLM's cache accounting for models with state layers: state-space mixers (Mamba-1,
//! Mamba-2) and gated-DeltaNet linear attention, alone or mixed with full-attention layers
//! (hybrids: Jamba, Granite 4.0-H, Falcon-H1, Qwen3-Next). Everything here follows vLLM 0.33.0
//! (PyPI wheel `vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl`), cited file by file; the
//! walk-through is `docs/vllm-accounting.md` § "State layers and hybrids".
//!
//! **State page.** Each state layer gets a `MambaSpec` (`vllm/v1/kv_cache_interface.py`) whose
//! page is one whole recurrent state, `Σ prod(shape) · dtype_size` over the shapes of
//! `MambaStateShapeCalculator` (`vllm/model_executor/layers/mamba/mamba_utils.py`):
//!
//! - `mamba1_state_shape`: conv `(conv_kernel − 1, I / tp)`, temporal `(I / tp, state_size)`;
//! - `mamba2_state_shape`: conv `(conv_kernel − 1, (I + 2·G'·N) / tp)` with
//!   `G' = n_groups + extra_groups_for_head_shards(n_groups, tp)`, temporal
//!   `(num_heads / tp, head_dim, state_size)`;
//! - `gated_delta_net_state_shape`: conv `(conv_kernel − 1, (2·Hk·dk + Hv·dv) / tp)`, temporal
//!   `(Hv / tp, dv, dk)`.
//!
//! All in `mamba_cache_dtype` / `mamba_ssm_cache_dtype`, `"auto"` = the model dtype
//! (`MambaStateDtypeCalculator._mamba_state_dtype`; `gated_delta_net_state_dtype` calls it too).
//!
//! **Prefix caching and `mamba_cache_mode`.** `ModelConfig.is_prefix_caching_supported`
//! (`vllm/config/model.py`) is true for generative hybrids and false for attention-free models,
//! and `EngineArgs._set_default_chunked_prefill_and_prefix_caching_args`
//! (`vllm/engine/arg_utils.py`) takes it as the default of `--enable-prefix-caching`.
//! `MambaModelConfig.verify_and_update_config` (`vllm/model_executor/models/config.py`, run for
//! every hybrid through `HybridAttentionMambaModelConfig`) then sets `mamba_cache_mode = "align"`
//! and `mamba_block_size = block_size` with prefix caching, else `"none"` and
//! `mamba_block_size = max_model_len`.
//!
//! **Block-size alignment (hybrids).** `Platform._align_hybrid_block_size`
//! (`vllm/platforms/interface.py`) raises the attention block size until one attention page
//! holds a whole state page, then pads the state page to the attention page:
//!
//! ```text
//! a     = max(smallest kernel block of the attention backend (16), block_size)
//! a     = lcm(a, prefill checkpoint alignment)          only in "align" mode
//! B     = 16 · cdiv(a · cdiv(state_page, a · attn_page_per_token), 16)
//! block_size = max(block_size, B);  state page padded to block_size · attn_page_per_token
//! ```
//!
//! **Groups and blocks.** All pages are then equal, so `get_kv_cache_groups`
//! (`vllm/v1/core/kv_cache_planning.py`) takes `_get_kv_cache_groups_uniform_page_size`: one
//! bucket per spec (attention, state), split into groups of `min` layers (`max` when
//! `max < 1.5·min`), the i-th group taking `layers[i::n]`; a block is `group size × page`.
//! Per request a full-attention group needs `cdiv(len, block_size)` blocks and a state group
//! `MambaSpec.max_memory_usage_bytes / page`: 1 in `"none"` mode, `2 + checkpoint blocks` in
//! `"align"` mode.

use crate::error::CoreError;
use crate::model::{AttentionKind, ModelDesc};
use crate::serve::{KvGroup, ServeConfig, ServePlan, StateCache};

/// `KvGroup::kind` of a state group (a `MambaSpec` group, whatever the mixer).
pub const KIND: &str = "mamba";

/// The smallest kernel block of the attention backend vLLM picks for these models on CUDA:
/// `FlashAttentionBackend.get_supported_kernel_block_sizes` (and Triton's) return
/// `[MultipleOf(16)]` (`vllm/v1/attention/backends/flash_attn.py`, `triton_attn.py`).
const KERNEL_BLOCK: u64 = 16;

/// `FLASHINFER_GDN_CHECKPOINT_ALIGNMENT` (`vllm/v1/attention/backends/gdn_attn.py`): the token
/// alignment of the prefill checkpoints FlashInfer's GDN prefill exports in `"align"` mode.
const GDN_CHECKPOINT_ALIGNMENT: u64 = 64;

/// The per-layer page of a Mamba-2 layer on one of `tp` ranks, in elements (conv, SSM), or an
/// error when `tp` does not divide the heads.
fn mamba2_page_elems(m: &crate::mixer::Mamba2, tp: u64) -> Result<u128, CoreError> {
    if !m.num_heads.is_multiple_of(tp) {
        return Err(CoreError::invalid_value(
            "tp",
            tp,
            format!(
                "{} SSM heads are not divisible by the tensor-parallel size",
                m.num_heads
            ),
            "vLLM shards Mamba-2 heads over the ranks; pick a `tp` that divides them",
        ));
    }
    let groups = if m.n_groups.is_multiple_of(tp) {
        m.n_groups
    } else {
        // extra_groups_for_head_shards: n_groups + (tp − n_groups)
        tp.max(m.n_groups)
    };
    let conv_dim = u128::from(m.intermediate) + 2 * u128::from(groups) * u128::from(m.state_size);
    let conv = u128::from(m.conv_kernel.saturating_sub(1)) * (conv_dim / u128::from(tp));
    let ssm = u128::from(m.num_heads / tp) * u128::from(m.head_dim) * u128::from(m.state_size);
    Ok(conv + ssm)
}

/// The per-layer page of a Mamba-1 layer on one of `tp` ranks, in elements:
/// `MambaStateShapeCalculator.mamba1_state_shape` gives the conv state `(conv_kernel − 1, I / tp)`
/// and the temporal state `(I / tp, state_size)`. vLLM serves `MambaForCausalLM` and Jamba's
/// Mamba layers with `MambaMixer`, whose projections are column/row-split over `tp`
/// (`divide(intermediate_size, tp)`).
fn mamba1_page_elems(m: &crate::mixer::Mamba1, tp: u64) -> Result<u128, CoreError> {
    if !m.intermediate.is_multiple_of(tp) {
        return Err(CoreError::invalid_value(
            "tp",
            tp,
            format!(
                "the Mamba inner width {} is not divisible by the tensor-parallel size",
                m.intermediate
            ),
            "vLLM shards the Mamba-1 inner channels over the ranks; pick a `tp` that divides them",
        ));
    }
    let i = u128::from(m.intermediate / tp);
    Ok(u128::from(m.conv_kernel.saturating_sub(1)) * i + i * u128::from(m.state_size))
}

/// The per-layer page of a gated-DeltaNet layer on one of `tp` ranks, in elements:
/// `MambaStateShapeCalculator.gated_delta_net_state_shape` (no speculative tokens) gives the conv
/// state `(conv_kernel − 1, conv_dim / tp)`, `conv_dim = 2·Hk·dk + Hv·dv`, and the temporal
/// state `(Hv / tp, dv, dk)`; both through vLLM's `divide`, which asserts divisibility.
fn gdn_page_elems(d: &crate::mixer::GatedDeltaNet, tp: u64) -> Result<u128, CoreError> {
    if !d.num_v_heads.is_multiple_of(tp) || !d.num_k_heads.is_multiple_of(tp) {
        return Err(CoreError::invalid_value(
            "tp",
            tp,
            format!(
                "{} key / {} value linear-attention heads are not divisible by the tensor-parallel size",
                d.num_k_heads, d.num_v_heads
            ),
            "vLLM shards the gated DeltaNet heads over the ranks; pick a `tp` that divides them",
        ));
    }
    let conv = u128::from(d.conv_kernel.saturating_sub(1)) * u128::from(d.conv_dim() / tp);
    let temporal =
        u128::from(d.num_v_heads / tp) * u128::from(d.v_head_dim) * u128::from(d.k_head_dim);
    Ok(conv + temporal)
}

fn lcm(a: u64, b: u64) -> u64 {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a.checked_div(x).map_or(0, |q| q.saturating_mul(b))
}

fn too_big(model: &ModelDesc) -> CoreError {
    CoreError::invalid_value(
        "model",
        crate::error::untrusted(&model.model_type),
        "one layer's cache page would exceed 2^64 bytes",
        "check the state sizes",
    )
}

/// The `mamba_cache_mode` vLLM resolves: `"align"` with prefix caching, else `"none"`
/// (`MambaModelConfig.verify_and_update_config`); prefix caching defaults to on for hybrids and
/// off for attention-free models (`ModelConfig.is_prefix_caching_supported`).
pub fn prefix_caching(model: &ModelDesc, cfg: &ServeConfig) -> bool {
    let has_attention = model.layers.iter().any(|l| l.attention_block().is_some());
    cfg.enable_prefix_caching.unwrap_or(has_attention)
}

/// The serve plan of a model with state layers (pure state-space or hybrid).
pub fn plan(model: &ModelDesc, cfg: &ServeConfig) -> Result<ServePlan, CoreError> {
    let tp = cfg.tp;
    let align = prefix_caching(model, cfg);
    // per layer: the state page (elements) and, for attention layers, the attention geometry
    let mut state_layers: u64 = 0;
    let mut state_elems: Option<u128> = None;
    let mut all_gdn = true;
    let mut attn: Option<(u64, u64, u64)> = None; // (num_heads, kv heads per rank, head_dim)
    let mut attn_layers: u64 = 0;
    for l in &model.layers {
        let elems = match (l.mamba2(), l.mamba1(), l.gated_delta_net()) {
            (Some(m), _, _) => Some(mamba2_page_elems(m, tp)?),
            (None, Some(m), _) => Some(mamba1_page_elems(m, tp)?),
            (None, None, Some(d)) => Some(gdn_page_elems(d, tp)?),
            (None, None, None) => None,
        };
        if let Some(e) = elems {
            all_gdn &= l.gated_delta_net().is_some();
            state_layers += 1;
            match state_elems {
                // vLLM builds one MambaSpec from the model class's state shape
                // (`get_mamba_state_shape_from_config`), the same for every state layer
                Some(s) if s != e => {
                    return Err(CoreError::invalid_value(
                        "model",
                        crate::error::untrusted(&model.model_type),
                        "its state layers have different state sizes; vLLM sizes every state layer from one model-wide state shape",
                        "estimate one request's memory with `memwall infer` instead",
                    ))
                }
                _ => state_elems = Some(e),
            }
        }
        if let Some(a) = l.attention_block() {
            let (heads, kvh, hd) = match a.kind {
                AttentionKind::Standard {
                    num_heads,
                    num_kv_heads,
                    head_dim,
                } => (num_heads, (num_kv_heads / tp).max(1), head_dim),
                AttentionKind::Mla { .. } => {
                    return Err(CoreError::invalid_value(
                        "model",
                        crate::error::untrusted(&model.model_type),
                        "multi-head latent attention next to state layers (vLLM's MLA/Mamba block alignment) is not modelled",
                        "estimate one request's memory with `memwall infer` instead",
                    ))
                }
            };
            if a.sliding_window.is_some() || a.chunked {
                return Err(CoreError::invalid_value(
                    "model",
                    crate::error::untrusted(&model.model_type),
                    "sliding-window or chunked attention next to state layers is not modelled (only full attention, as in Jamba, Granite 4.0-H, Falcon-H1 and Qwen3-Next)",
                    "estimate one request's memory with `memwall infer` instead",
                ));
            }
            match attn {
                // vLLM sizes the attention page from ModelConfig.get_num_kv_heads / get_head_size,
                // one geometry for the whole model
                Some(g) if g != (heads, kvh, hd) => {
                    return Err(CoreError::invalid_value(
                        "model",
                        crate::error::untrusted(&model.model_type),
                        "its attention layers differ in heads or head width next to state layers, which vLLM's hybrid block alignment does not handle",
                        "estimate one request's memory with `memwall infer` instead",
                    ))
                }
                _ => attn = Some((heads, kvh, hd)),
            }
            attn_layers += 1;
        }
    }
    if let Some((heads, _, _)) = attn {
        crate::serve::check_heads_divide_tp(heads, tp)?;
    }
    // the states in the model dtype (`mamba_cache_dtype = "auto"`): `resolve` refuses a
    // `--kv-cache-dtype` that differs from it for these models, so `kv_dtype_bytes` is the
    // model dtype here
    let dtype = u128::from(cfg.kv_dtype_bytes);
    let state_page = state_elems.unwrap_or(0) * dtype;
    let state_page = u64::try_from(state_page).map_err(|_| too_big(model))?;
    // checkpoint blocks: Qwen3NextGatedDeltaNet exports prefill checkpoints only with the
    // FlashInfer GDN prefill in "align" mode (qwen_gdn_linear_attn.py `_checkpoint_alignment`,
    // `get_kv_cache_spec`: num_prefill_checkpoint_blocks = 1); the scheduler takes them only
    // when every state layer can (`get_mamba_prefill_checkpoint_alignment`)
    let checkpoints = align && all_gdn && state_layers > 0 && cfg.flashinfer_gdn_prefill;
    let (block_size, page) = match attn {
        Some((_, kvh, hd)) => {
            let per_token = 2 * u128::from(kvh) * u128::from(hd) * dtype;
            let per_token = u64::try_from(per_token).map_err(|_| too_big(model))?;
            let mut a = KERNEL_BLOCK.max(cfg.block_size);
            if checkpoints {
                a = lcm(a, GDN_CHECKPOINT_ALIGNMENT);
            }
            let unit = u128::from(a) * u128::from(per_token);
            let b = u128::from(a) * u128::from(state_page).div_ceil(unit);
            let b = u128::from(KERNEL_BLOCK) * b.div_ceil(u128::from(KERNEL_BLOCK));
            let block_size =
                u64::try_from(b.max(u128::from(cfg.block_size))).map_err(|_| too_big(model))?;
            let page = u128::from(block_size) * u128::from(per_token);
            (block_size, u64::try_from(page).map_err(|_| too_big(model))?)
        }
        // no attention backend: `update_block_size_for_backend` returns early, the state page
        // stays unpadded
        None => (cfg.block_size, state_page),
    };
    // state blocks per request: MambaSpec.max_memory_usage_bytes / page
    let state_blocks = if align { 2 + u64::from(checkpoints) } else { 1 };
    // _get_kv_cache_groups_uniform_page_size: one bucket per spec, in the order the specs first
    // appear among the layers (vLLM registers a layer's attention before its mixer, as
    // FalconH1ParallelHybrid builds `self_attn` before `mamba`), groups of equal size
    let first_state = model
        .layers
        .iter()
        .position(|l| !l.mixer.is_attention() && l.attention_block().is_none());
    let first_attn = model
        .layers
        .iter()
        .position(|l| l.attention_block().is_some());
    let mut buckets: Vec<(&'static str, u64)> = vec![("full", attn_layers), (KIND, state_layers)];
    if first_state < first_attn && first_state.is_some() {
        buckets.reverse();
    }
    buckets.retain(|b| b.1 > 0);
    let min = buckets.iter().map(|b| b.1).min().unwrap_or(1);
    let max = buckets.iter().map(|b| b.1).max().unwrap_or(1);
    let group_size = if (max as f64) < 1.5 * min as f64 {
        max
    } else {
        min
    };
    let mut groups = Vec::new();
    for (kind, n) in buckets {
        let num_groups = n.div_ceil(group_size);
        for i in 0..num_groups {
            // layers[i::num_groups]
            groups.push(KvGroup {
                kind,
                num_layers: (n - i).div_ceil(num_groups),
                page_size_bytes: page,
                sliding_window: None,
                attention_chunk_size: None,
            });
        }
    }
    let bytes_per_block = groups
        .iter()
        .map(|g| u128::from(g.num_layers) * u128::from(g.page_size_bytes))
        .max()
        .unwrap_or(1)
        .max(1);
    let bytes_per_block = u64::try_from(bytes_per_block).map_err(|_| too_big(model))?;
    let requested = (cfg.gpu_memory_bytes as f64 * cfg.gpu_memory_utilization).ceil() as u64;
    let available = match cfg.kv_cache_memory_bytes {
        Some(b) => b,
        None => requested
            .saturating_sub(cfg.weights_bytes_per_rank)
            .saturating_sub(cfg.non_torch_bytes)
            .saturating_sub(cfg.activation_peak_bytes)
            .saturating_sub(cfg.cuda_graph_bytes),
    };
    let num_gpu_blocks = available / bytes_per_block;
    let mut plan = ServePlan {
        requested_memory_bytes: requested,
        available_kv_bytes: available,
        num_kv_heads_per_rank: attn.map_or(0, |a| a.1),
        groups,
        bytes_per_block,
        num_gpu_blocks,
        kv_tokens: 0,
        fits_max_model_len: false,
        max_model_len_that_fits: 0,
        state_cache: Some(StateCache {
            prefix_caching: align,
            mamba_cache_mode: if align { "align" } else { "none" },
            block_size,
            state_page_bytes: state_page,
            state_blocks_per_request: state_blocks,
        }),
    };
    // token slots of the attention groups; a model without attention holds any number of
    // tokens in its states, so its capacity is counted in max-length requests
    plan.kv_tokens = if attn.is_some() {
        num_gpu_blocks.saturating_mul(block_size)
    } else {
        num_gpu_blocks.saturating_mul(cfg.max_model_len)
    };
    // get_kv_cache_configs: the check reserves the null block
    crate::serve::startup_check(&mut plan, cfg, available, bytes_per_block);
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codestral_page_matches_vllm_shapes() {
        // mamba2_state_shape(tp=1): conv (3, 8192 + 2·8·128) and ssm (128, 64, 128)
        let m = crate::mixer::Mamba2 {
            num_heads: 128,
            head_dim: 64,
            n_groups: 8,
            state_size: 128,
            conv_kernel: 4,
            intermediate: 8192,
            chunk_size: 256,
            proj_bias: false,
            out_bias: false,
            gated_norm: true,
            norm_before_gate: false,
            conv_bias: true,
            residual_in_fp32: true,
            state_in_training_cache: false,
        };
        assert_eq!(
            mamba2_page_elems(&m, 1).unwrap(),
            3 * 10240 + 128 * 64 * 128
        );
        // tp = 16 > n_groups = 8: groups replicated to 16
        assert_eq!(
            mamba2_page_elems(&m, 16).unwrap(),
            3 * ((8192 + 2 * 16 * 128) / 16) + 8 * 64 * 128
        );
        assert!(mamba2_page_elems(&m, 3).is_err());
    }

    #[test]
    fn mamba1_page_is_conv_plus_temporal_state() {
        // mamba1_state_shape(tp=1) for mamba-2.8b: conv (3, 5120), temporal (5120, 16)
        let m = crate::mixer::Mamba1 {
            intermediate: 5120,
            state_size: 16,
            time_step_rank: 160,
            conv_kernel: 4,
            proj_bias: false,
            conv_bias: true,
            residual_in_fp32: true,
            bcdt_norms: false,
        };
        assert_eq!(mamba1_page_elems(&m, 1).unwrap(), 3 * 5120 + 5120 * 16);
        assert_eq!(mamba1_page_elems(&m, 4).unwrap(), 3 * 1280 + 1280 * 16);
        assert!(mamba1_page_elems(&m, 3).is_err());
    }

    #[test]
    fn gdn_page_is_conv_plus_value_by_key_state() {
        // Qwen3-Next linear attention: 16 key / 32 value heads of 128, kernel 4
        let d = crate::mixer::GatedDeltaNet {
            num_k_heads: 16,
            num_v_heads: 32,
            k_head_dim: 128,
            v_head_dim: 128,
            conv_kernel: 4,
            chunk_size: 64,
        };
        // conv (3, 2·2048 + 4096), temporal (32, 128, 128)
        assert_eq!(gdn_page_elems(&d, 1).unwrap(), 3 * 8192 + 32 * 128 * 128);
        assert_eq!(gdn_page_elems(&d, 4).unwrap(), 3 * 2048 + 8 * 128 * 128);
        assert!(gdn_page_elems(&d, 3).is_err());
    }

    #[test]
    fn lcm_of_block_and_checkpoint_alignment() {
        assert_eq!(lcm(16, 64), 64);
        assert_eq!(lcm(80, 64), 320);
        assert_eq!(lcm(0, 64), 0);
    }
}
