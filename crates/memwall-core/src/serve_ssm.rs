//! vLLM's cache accounting for models whose layers are state-space mixers (Mamba-1, Mamba-2).
//!
//! vLLM (v1 engine; `vllm/model_executor/layers/mamba/mamba_utils.py` and
//! `vllm/v1/kv_cache_interface.py` `MambaSpec` at vllm-project/vllm commit
//! `02d710837549a368073552333f66d714477415d2`) gives each Mamba layer a `MambaSpec` whose page is
//! one whole recurrent state: `page_size_bytes = Σ prod(shape) · dtype_size` over
//! `MambaStateShapeCalculator.mamba2_state_shape`:
//!
//! - conv state `(conv_kernel − 1, conv_dim / tp)` with `conv_dim = I + 2·G'·N`, where
//!   `G' = n_groups + extra_groups_for_head_shards(n_groups, tp)` (groups are replicated up to
//!   `tp` when they do not divide it);
//! - temporal (SSM) state `(num_heads / tp, head_dim, state_size)`.
//!
//! Both in `mamba_cache_dtype` / `mamba_ssm_cache_dtype`, `"auto"` = the model dtype
//! (`MambaStateDtypeCalculator._mamba_state_dtype`) — unlike transformers, whose SSM state is
//! fp32. Without prefix caching (`mamba_cache_mode = "none"`) a request holds one block per
//! layer whatever its length, so the capacity is counted in requests, not tokens.
//!
//! Models that mix attention and state-space layers (hybrids: vLLM pads the attention page to
//! the Mamba page and shares one block pool) are refused here, not approximated.

use crate::error::CoreError;
use crate::model::ModelDesc;
use crate::serve::{KvGroup, ServeConfig, ServePlan};

/// `KvGroup::kind` of a state-space group.
pub const KIND: &str = "mamba";

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
/// `MambaStateShapeCalculator.mamba1_state_shape` (same file and commit) gives the conv state
/// `(conv_kernel − 1, I / tp)` and the temporal state `(I / tp, state_size)`, in the dtypes of
/// `mamba1_state_dtype` (= `_mamba_state_dtype`, as for Mamba-2). vLLM serves
/// `MambaForCausalLM` with `MambaMixer` (`vllm/model_executor/models/mamba.py`), whose
/// projections are column/row-split over `tp` (`divide(intermediate_size, tp)`).
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

/// The serve plan of a model made of state-space layers only.
pub fn plan(model: &ModelDesc, cfg: &ServeConfig) -> Result<ServePlan, CoreError> {
    if model.layers.iter().any(|l| l.parallel_mixers()) {
        // vLLM serves FalconH1ForCausalLM with both an attention KV page and a Mamba-2 state
        // page per layer in its hybrid cache manager (one shared pool, the attention pages
        // padded to the Mamba page), which memwall does not model, like the other hybrids
        return Err(CoreError::invalid_value(
            "model",
            &model.model_type,
            "every layer runs attention and a Mamba-2 mixer in parallel (Falcon-H1); vLLM's hybrid cache (attention pages padded to the Mamba page, one shared pool) is not modelled",
            "estimate one request's memory with `memwall infer` instead",
        ));
    }
    if model.layers.iter().any(|l| l.gated_delta_net().is_some()) {
        // vLLM sizes one gated DeltaNet layer's state by MambaStateShapeCalculator
        // .gated_delta_net_state_shape (vllm/model_executor/layers/mamba/mamba_utils.py: conv
        // state `(conv_dim / tp, kernel - 1)`, temporal state `(Hv / tp, dv, dk)`), but Qwen3-Next
        // is a hybrid whose attention pages are padded to that state's page in one shared pool
        return Err(CoreError::invalid_value(
            "model",
            &model.model_type,
            "gated DeltaNet layers with attention layers need vLLM's hybrid cache (attention pages padded to the linear-attention state page, one shared pool), which is not modelled",
            "estimate one request's memory with `memwall infer` instead",
        ));
    }
    let mut page: Option<u128> = None;
    for l in &model.layers {
        let elems = match (l.mamba2(), l.mamba1()) {
            (Some(m), _) => mamba2_page_elems(m, cfg.tp)?,
            (None, Some(m)) => mamba1_page_elems(m, cfg.tp)?,
            (None, None) => return Err(CoreError::invalid_value(
                "model",
                &model.model_type,
                "the model mixes attention and state-space layers; vLLM's hybrid cache (attention pages padded to the Mamba page, one shared pool) is not modelled",
                "estimate one request's memory with `memwall infer` instead",
            )),
        };
        // the model dtype (`mamba_cache_dtype = "auto"`): `resolve` refuses a `--kv-cache-dtype`
        // that differs from it for these models, so `kv_dtype_bytes` is the model dtype here
        let p = elems * u128::from(cfg.kv_dtype_bytes);
        page = Some(page.map_or(p, |q: u128| q.max(p)));
    }
    let page = u64::try_from(page.unwrap_or(0)).map_err(|_| {
        CoreError::invalid_value(
            "model",
            &model.model_type,
            "one layer's state would exceed 2^64 bytes",
            "check the state sizes",
        )
    })?;
    let num_layers = model.layers.len() as u64;
    let requested = (cfg.gpu_memory_bytes as f64 * cfg.gpu_memory_utilization).ceil() as u64;
    let available = match cfg.kv_cache_memory_bytes {
        Some(b) => b,
        None => requested
            .saturating_sub(cfg.weights_bytes_per_rank)
            .saturating_sub(cfg.non_torch_bytes)
            .saturating_sub(cfg.activation_peak_bytes)
            .saturating_sub(cfg.cuda_graph_bytes),
    };
    let bytes_per_block = page.saturating_mul(num_layers).max(1);
    let num_gpu_blocks = available / bytes_per_block;
    // one block per request (plus vLLM's null block)
    let fits = available.saturating_sub(bytes_per_block) >= bytes_per_block;
    Ok(ServePlan {
        requested_memory_bytes: requested,
        available_kv_bytes: available,
        num_kv_heads_per_rank: 0,
        groups: vec![KvGroup {
            kind: KIND,
            num_layers,
            page_size_bytes: page,
            sliding_window: None,
            attention_chunk_size: None,
        }],
        bytes_per_block,
        num_gpu_blocks,
        // a state holds any number of tokens: the token capacity is unbounded by the cache
        kv_tokens: num_gpu_blocks.saturating_mul(cfg.max_model_len),
        fits_max_model_len: fits,
        max_model_len_that_fits: if fits { cfg.max_model_len } else { 0 },
    })
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
            conv_bias: true,
            residual_in_fp32: true,
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
}
