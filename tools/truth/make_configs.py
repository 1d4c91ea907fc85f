#!/usr/bin/env python3
"""Write tests/truth/configs/*.json.

* If a verbatim Hugging Face config exists in data/models/<org>/<name>.json (collected by the
  catalogue helper), it is copied from there ("source" below names that file).
* Otherwise the config is written from the published hyper-parameters of that model (the values
  of its Hugging Face config.json, typed in here; keys not listed take the transformers default).
* Reduced-depth variants ("-<N>l" suffix) are the full config with num_hidden_layers (and, for
  configs that list per-layer data, that list) cut to N layers.  Nothing else is changed.

The origin of every file is listed in tests/truth/configs/SOURCES.toml (the JSON files hold
only config keys).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data/models"
OUT = REPO / "tests/truth/configs"

# name -> (data/models file or None, published fields used when that file is absent)
BASE: dict[str, tuple[str | None, dict]] = {
    # ---------------- llama ----------------
    "smollm-135m": (None, dict(  # HuggingFaceTB/SmolLM-135M
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=2048,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, hidden_act="silu",
        attention_bias=False, attention_dropout=0.0, mlp_bias=False, bos_token_id=0, eos_token_id=0)),
    "tinyllama-1.1b": (None, dict(  # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T
        model_type="llama", hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
        num_attention_heads=32, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
        attention_bias=False, attention_dropout=0.0, bos_token_id=1, eos_token_id=2)),
    "llama-3.2-1b": (None, dict(  # meta-llama/Llama-3.2-1B
        model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False, attention_dropout=0.0,
        mlp_bias=False, bos_token_id=128000, eos_token_id=128001)),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B.json", {}),
    "llama-3-8b": ("meta-llama/Meta-Llama-3-8B.json", {}),
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf.json", {}),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B.json", {}),
    # ---------------- mistral / mixtral ----------------
    "mistral-7b-v0.1": (None, dict(  # mistralai/Mistral-7B-v0.1
        model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096, tie_word_embeddings=False,
        hidden_act="silu", bos_token_id=1, eos_token_id=2)),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1.json", {}),
    # ---------------- qwen ----------------
    "qwen2.5-0.5b": (None, dict(  # Qwen/Qwen2.5-0.5B
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
        max_window_layers=24, rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=32768,
        use_sliding_window=False, tie_word_embeddings=True, hidden_act="silu", attention_dropout=0.0,
        bos_token_id=151643, eos_token_id=151643)),
    "qwen2.5-1.5b": (None, dict(  # Qwen/Qwen2.5-1.5B
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=131072,
        max_window_layers=28, rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=131072,
        use_sliding_window=False, tie_word_embeddings=True, hidden_act="silu", attention_dropout=0.0,
        bos_token_id=151643, eos_token_id=151643)),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B.json", {}),
    "qwen1.5-moe-a2.7b": (None, dict(  # Qwen/Qwen1.5-MoE-A2.7B
        model_type="qwen2_moe", hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
        decoder_sparse_step=1, norm_topk_prob=False, output_router_logits=False,
        router_aux_loss_coef=0.001, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=151936, max_position_embeddings=8192,
        max_window_layers=21, rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=32768,
        use_sliding_window=False, tie_word_embeddings=False, hidden_act="silu", attention_dropout=0.0,
        bos_token_id=151643, eos_token_id=151643)),
    "qwen3-0.6b": ("Qwen/Qwen3-0.6B.json", {}),
    "qwen3-1.7b": ("Qwen/Qwen3-1.7B.json", {}),
    "qwen3-8b": ("Qwen/Qwen3-8B.json", {}),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B.json", {}),
    # ---------------- gemma ----------------
    "gemma-2b": (None, dict(  # google/gemma-2b
        model_type="gemma", hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
        num_attention_heads=8, num_key_value_heads=1, head_dim=256, vocab_size=256000,
        max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
        hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", attention_bias=False,
        attention_dropout=0.0, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0)),
    "gemma-7b": (None, dict(  # google/gemma-7b
        model_type="gemma", hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=16, head_dim=256, vocab_size=256000,
        max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
        hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", attention_bias=False,
        attention_dropout=0.0, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0)),
    "gemma-2-2b": ("google/gemma-2-2b.json", {}),
    "gemma-2-9b": ("google/gemma-2-9b.json", {}),
    "gemma-3-4b": (None, dict(  # google/gemma-3-4b-pt config.json, as crates/memwall-formats/tests/configs/gemma-3-4b-pt.json
        _source="google/gemma-3-4b-pt config.json (the copy in crates/memwall-formats/tests/configs/gemma-3-4b-pt.json)",
        architectures=["Gemma3ForConditionalGeneration"], boi_token_index=255999, eoi_token_index=256000,
        eos_token_id=[1, 106], image_token_index=262144, initializer_range=0.02, mm_tokens_per_image=256,
        model_type="gemma3",
        text_config=dict(hidden_size=2560, intermediate_size=10240, model_type="gemma3_text", num_hidden_layers=34,
                         rope_scaling=dict(factor=8.0, rope_type="linear"), sliding_window=1024),
        torch_dtype="bfloat16",
        vision_config=dict(hidden_size=1152, image_size=896, intermediate_size=4304, model_type="siglip_vision_model",
                           num_attention_heads=16, num_hidden_layers=27, patch_size=14, vision_use_head=False))),
    "gemma-3-1b": (None, dict(  # google/gemma-3-1b-pt
        model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        rope_local_base_freq=10000.0, rope_scaling=None, sliding_window=512, sliding_window_pattern=6,
        query_pre_attn_scalar=256, final_logit_softcapping=None, attn_logit_softcapping=None,
        hidden_activation="gelu_pytorch_tanh", attention_bias=False, attention_dropout=0.0,
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0)),
    # ---------------- phi3 ----------------
    "phi-3-mini-4k": (None, dict(  # microsoft/Phi-3-mini-4k-instruct
        model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096,
        original_max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
        sliding_window=2047, hidden_act="silu", attention_dropout=0.0, embd_pdrop=0.0, resid_pdrop=0.0,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=32000, pad_token_id=32000)),
    # ---------------- gpt2 ----------------
    "gpt2": ("openai-community/gpt2.json", dict(
        model_type="gpt2", n_embd=768, n_layer=12, n_head=12, n_positions=1024, n_ctx=1024,
        vocab_size=50257, activation_function="gelu_new", attn_pdrop=0.1, embd_pdrop=0.1,
        resid_pdrop=0.1, layer_norm_epsilon=1e-5, bos_token_id=50256, eos_token_id=50256)),
    "gpt2-medium": (None, dict(  # openai-community/gpt2-medium
        model_type="gpt2", n_embd=1024, n_layer=24, n_head=16, n_positions=1024, n_ctx=1024,
        vocab_size=50257, activation_function="gelu_new", attn_pdrop=0.1, embd_pdrop=0.1,
        resid_pdrop=0.1, layer_norm_epsilon=1e-5, bos_token_id=50256, eos_token_id=50256)),
    "gpt2-xl": (None, dict(  # openai-community/gpt2-xl
        model_type="gpt2", n_embd=1600, n_layer=48, n_head=25, n_positions=1024, n_ctx=1024,
        vocab_size=50257, activation_function="gelu_new", attn_pdrop=0.1, embd_pdrop=0.1,
        resid_pdrop=0.1, layer_norm_epsilon=1e-5, bos_token_id=50256, eos_token_id=50256)),
    # ---------------- gpt_neox ----------------
    "pythia-160m": (None, dict(  # EleutherAI/pythia-160m
        model_type="gpt_neox", hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
        num_attention_heads=12, vocab_size=50304, max_position_embeddings=2048, rotary_pct=0.25,
        rotary_emb_base=10000, layer_norm_eps=1e-5, hidden_act="gelu", use_parallel_residual=True,
        attention_dropout=0.0, hidden_dropout=0.0, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0)),
    "pythia-1.4b": (None, dict(  # EleutherAI/pythia-1.4b
        model_type="gpt_neox", hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
        num_attention_heads=16, vocab_size=50304, max_position_embeddings=2048, rotary_pct=0.25,
        rotary_emb_base=10000, layer_norm_eps=1e-5, hidden_act="gelu", use_parallel_residual=True,
        attention_dropout=0.0, hidden_dropout=0.0, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0)),
    # ---------------- opt ----------------
    "opt-125m": (None, dict(  # facebook/opt-125m
        model_type="opt", hidden_size=768, ffn_dim=3072, num_hidden_layers=12, num_attention_heads=12,
        vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=768,
        do_layer_norm_before=True, activation_function="relu", dropout=0.1, attention_dropout=0.0,
        enable_bias=True, layer_norm_elementwise_affine=True, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=2, pad_token_id=1)),
    "opt-1.3b": (None, dict(  # facebook/opt-1.3b
        model_type="opt", hidden_size=2048, ffn_dim=8192, num_hidden_layers=24, num_attention_heads=32,
        vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=2048,
        do_layer_norm_before=True, activation_function="relu", dropout=0.1, attention_dropout=0.0,
        enable_bias=True, layer_norm_elementwise_affine=True, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=2, pad_token_id=1)),
    # ---------------- falcon ----------------
    "falcon-7b": (None, dict(  # tiiuae/falcon-7b
        model_type="falcon", hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
        multi_query=True, parallel_attn=True, new_decoder_architecture=False, bias=False, alibi=False,
        vocab_size=65024, layer_norm_epsilon=1e-5, hidden_dropout=0.0, attention_dropout=0.0,
        bos_token_id=11, eos_token_id=11, tie_word_embeddings=True)),
    "falcon-40b": (None, dict(  # tiiuae/falcon-40b config.json (its copy: crates/memwall-formats/tests/configs/falcon-40b.json)
        model_type="falcon", hidden_size=8192, num_hidden_layers=60, num_attention_heads=128, num_kv_heads=8,
        multi_query=True, parallel_attn=True, new_decoder_architecture=True, bias=False, alibi=False,
        vocab_size=65024, layer_norm_epsilon=1e-5, hidden_dropout=0.0, attention_dropout=0.0,
        bos_token_id=11, eos_token_id=11, use_cache=True)),
    # ---------------- starcoder2 ----------------
    "starcoder2-3b": (None, dict(  # bigcode/starcoder2-3b
        model_type="starcoder2", hidden_size=3072, intermediate_size=12288, num_hidden_layers=30,
        num_attention_heads=24, num_key_value_heads=2, vocab_size=49152, max_position_embeddings=16384,
        sliding_window=4096, rope_theta=999999.4420358813, norm_epsilon=1e-5, use_bias=True,
        hidden_act="gelu_pytorch_tanh", residual_dropout=0.1, embedding_dropout=0.1,
        attention_dropout=0.1, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)),
    # ---------------- olmo2 ----------------
    "olmo-2-1b": (None, dict(  # allenai/OLMo-2-0425-1B
        model_type="olmo2", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, vocab_size=100352, max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_theta=500000.0, attention_bias=False, attention_dropout=0.0,
        hidden_act="silu", tie_word_embeddings=False, pad_token_id=100277, eos_token_id=100257)),
    "olmo-2-7b": (None, dict(  # allenai/OLMo-2-1124-7B
        model_type="olmo2", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=100352, max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_theta=500000.0, attention_bias=False, attention_dropout=0.0,
        hidden_act="silu", tie_word_embeddings=False, pad_token_id=100277, eos_token_id=100257)),
    # ---------------- deepseek_v3 ----------------
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3.json", {}),
    # ---------------- mamba2 (state-space layers) ----------------
    # mistralai/Mamba-Codestral-7B-v0.1 config.json (HF format, Mamba2ForCausalLM); the
    # `time_step_limit` [0.0, Infinity] is left out (it is not JSON, and it is the default).
    "mamba-codestral-7b": ("mistralai/Mamba-Codestral-7B-v0.1.json", dict(
        model_type="mamba2", hidden_size=4096, num_hidden_layers=64, num_heads=128, head_dim=64,
        expand=2, n_groups=8, state_size=128, conv_kernel=4, chunk_size=256, vocab_size=32768,
        layer_norm_epsilon=1e-5, use_bias=False, use_conv_bias=True, residual_in_fp32=True,
        rms_norm=True, norm_before_gate=True, rescale_prenorm_residual=False, time_step_rank=256,
        time_step_min=0.001, time_step_max=0.1, time_step_floor=0.0001, hidden_act="silu",
        initializer_range=0.1, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
        pad_token_id=0)),
    # ---------------- mamba (Mamba-1 selective scan) ----------------
    "mamba-2.8b": ("state-spaces/mamba-2.8b-hf.json", {}),
    # ---------------- jamba (Mamba-1 + attention hybrid, MoE every 2nd layer) ----------------
    # ai21labs/AI21-Jamba-1.5-Mini: published hyper-parameters; no verbatim config.json was
    # found. Values from a Python-dict copy of its config.json in public ONNX-export test code
    # (`get_ai21_jamba_15_mini`, which points at huggingface.co/ai21labs/AI21-Jamba-1.5-Mini/
    # blob/main/config.json; that copy sets use_mamba_kernels False, read by nothing in
    # transformers 5.23, so it is left out here).
    "jamba-1.5-mini": (None, dict(
        model_type="jamba", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, attn_layer_offset=4, attn_layer_period=8,
        expert_layer_offset=1, expert_layer_period=2, mamba_conv_bias=True, mamba_d_conv=4,
        mamba_d_state=16, mamba_dt_rank=256, mamba_expand=2, mamba_proj_bias=False,
        max_position_embeddings=262144, num_experts=16, num_experts_per_tok=2,
        output_router_logits=False, rms_norm_eps=1e-6, router_aux_loss_coef=0.001,
        tie_word_embeddings=False, hidden_act="silu", attention_dropout=0.0, vocab_size=65536,
        bos_token_id=1, eos_token_id=[2, 518], pad_token_id=0)),
    # ---------------- granitemoehybrid (Mamba-2 + attention, muP multipliers) ----------------
    # ibm-granite/granite-4.0-h-micro: published hyper-parameters; no verbatim config.json was
    # found. Geometry and layer_types as quoted from huggingface.co/ibm-granite/
    # granite-4.0-h-micro/raw/main/config.json by public test code (40 layers, attention at
    # 5/15/25/35, hidden 2048, 32/8 heads, mamba 64 heads x 64, state 128, 1 group, conv 4,
    # shared_intermediate_size 8192, no experts) and a Granite-4-H adapter test (multipliers,
    # "nope", chunk 256). vocab_size 100352 is granite-4.0-h-small's; one copy of h-micro's
    # gives 100096 (only the embedding size depends on it).
    "granite-4.0-h-micro": (None, dict(
        model_type="granitemoehybrid", hidden_size=2048, intermediate_size=8192,
        shared_intermediate_size=8192, num_hidden_layers=40, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=100352, max_position_embeddings=131072,
        rms_norm_eps=1e-5, layer_types=(["mamba"] * 5 + ["attention"]) * 6 + ["mamba"] * 4,
        mamba_n_heads=64, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False,
        num_local_experts=0, num_experts_per_tok=0, embedding_multiplier=12.0, logits_scaling=8.0,
        residual_multiplier=0.22, attention_multiplier=0.015625, position_embedding_type="nope",
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False, attention_dropout=0.0,
        bos_token_id=100257, eos_token_id=100257, pad_token_id=100256)),
    # ---------------- falcon_h1 (attention and Mamba-2 in parallel in every layer, muP) ----------------
    # tiiuae/Falcon-H1-0.5B-Instruct: the catalogue copy (no verbatim config.json was found;
    # data/models/index.toml says where its values come from and why `mamba_d_ssm` is added)
    "falcon-h1-0.5b": ("tiiuae/Falcon-H1-0.5B-Instruct.json", {}),
    # Falcon-H1-1.5B's widths (constructed, see _source)
    "falcon-h1-1.5b-2l": (None, dict(architectures=['FalconH1ForCausalLM'], attention_bias=False, attention_dropout=0.0, attention_in_multiplier=1.0, attention_out_multiplier=0.9375, attn_layer_indices=None, embedding_multiplier=5.656854249492381, head_dim=128, hidden_act='silu', hidden_size=2048, initializer_range=0.02, intermediate_size=4608, key_multiplier=0.39062499999999994, lm_head_multiplier=0.0390625, mamba_chunk_size=128, mamba_conv_bias=True, mamba_d_conv=4, mamba_d_head=64, mamba_d_ssm=3072, mamba_d_state=256, mamba_expand=2, mamba_n_groups=1, mamba_n_heads=48, mamba_norm_before_gate=False, mamba_proj_bias=False, mamba_rms_norm=False, mamba_use_mlp=True, max_position_embeddings=131072, mlp_bias=False, mlp_multipliers=[0.8838834764831844, 0.5859375], model_type='falcon_h1', num_attention_heads=8, num_hidden_layers=2, num_key_value_heads=2, projectors_bias=False, rms_norm_eps=1e-05, rope_scaling=None, rope_theta=100000000000.0, ssm_in_multiplier=1.25, ssm_multipliers=[0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738], ssm_out_multiplier=0.23570226039551587, tie_word_embeddings=False, torch_dtype='bfloat16', vocab_size=65537, _source="constructed: Falcon-H1-1.5B's geometry (transformers' FalconH1 model table: 2048 wide, 8/2 attention heads of 128, 48 Mamba heads of 64, state 256; intermediate 4608, vocabulary 65537 and mamba_d_ssm 3072 as quoted by public sizing code) on Falcon-H1-0.5B-Instruct's other fields (chunk 128, multipliers), 2 layers; typed into tools/truth/make_configs.py")),
    # Falcon-H1 with the gated RMSNorm (constructed, see _source)
    "falcon-h1-0.5b-rmsnorm-2l": (None, dict(architectures=['FalconH1ForCausalLM'], attention_bias=False, attention_dropout=0.0, attention_in_multiplier=1.0, attention_out_multiplier=0.9375, attn_layer_indices=None, embedding_multiplier=5.656854249492381, head_dim=64, hidden_act='silu', hidden_size=1024, initializer_range=0.02, intermediate_size=2048, key_multiplier=0.39062499999999994, lm_head_multiplier=0.0390625, mamba_chunk_size=128, mamba_conv_bias=True, mamba_d_conv=4, mamba_d_head=64, mamba_d_ssm=1536, mamba_d_state=128, mamba_expand=2, mamba_n_groups=2, mamba_n_heads=24, mamba_norm_before_gate=False, mamba_proj_bias=False, mamba_rms_norm=True, mamba_use_mlp=True, max_position_embeddings=16384, mlp_bias=False, mlp_multipliers=[0.8838834764831844, 0.5859375], model_type='falcon_h1', num_attention_heads=8, num_hidden_layers=2, num_key_value_heads=2, projectors_bias=False, rms_norm_eps=1e-05, rope_scaling=None, rope_theta=100000000000.0, ssm_in_multiplier=1.25, ssm_multipliers=[0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738], ssm_out_multiplier=0.23570226039551587, tie_word_embeddings=False, torch_dtype='bfloat16', vocab_size=32784, _source="constructed: Falcon-H1-0.5B-Instruct's fields cut to 2 layers with the gated RMSNorm on (mamba_rms_norm true, mamba_norm_before_gate false) and 2 Mamba groups, to measure FalconH1RMSNormGated (no published config with it was found), typed into tools/truth/make_configs.py")),
    # Falcon-H1 with the gated RMSNorm normalising before it gates (constructed, see _source)
    "falcon-h1-0.5b-nbg-2l": (None, dict(architectures=['FalconH1ForCausalLM'], attention_bias=False, attention_dropout=0.0, attention_in_multiplier=1.0, attention_out_multiplier=0.9375, attn_layer_indices=None, embedding_multiplier=5.656854249492381, head_dim=64, hidden_act='silu', hidden_size=1024, initializer_range=0.02, intermediate_size=2048, key_multiplier=0.39062499999999994, lm_head_multiplier=0.0390625, mamba_chunk_size=128, mamba_conv_bias=True, mamba_d_conv=4, mamba_d_head=64, mamba_d_ssm=1536, mamba_d_state=128, mamba_expand=2, mamba_n_groups=2, mamba_n_heads=24, mamba_norm_before_gate=True, mamba_proj_bias=False, mamba_rms_norm=True, mamba_use_mlp=True, max_position_embeddings=16384, mlp_bias=False, mlp_multipliers=[0.8838834764831844, 0.5859375], model_type='falcon_h1', num_attention_heads=8, num_hidden_layers=2, num_key_value_heads=2, projectors_bias=False, rms_norm_eps=1e-05, rope_scaling=None, rope_theta=100000000000.0, ssm_in_multiplier=1.25, ssm_multipliers=[0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738], ssm_out_multiplier=0.23570226039551587, tie_word_embeddings=False, torch_dtype='bfloat16', vocab_size=32784, _source="constructed: falcon-h1-0.5b-rmsnorm-2l with mamba_norm_before_gate true (FalconH1RMSNormGated normalises, then gates; no published config with it was found), typed into tools/truth/make_configs.py")),
    # small Falcon-H1 with 8 Mamba groups, normalise-then-gate (constructed, see _source)
    "falcon-h1-small-nbg": (None, dict(attention_bias=False, attention_dropout=0.0, attention_in_multiplier=1.0, attention_out_multiplier=0.9375, attn_layer_indices=None, embedding_multiplier=5.656854249492381, head_dim=16, hidden_act='silu', hidden_size=96, initializer_range=0.02, intermediate_size=184, key_multiplier=0.39062499999999994, lm_head_multiplier=0.0390625, mamba_chunk_size=128, mamba_conv_bias=True, mamba_d_conv=4, mamba_d_head=8, mamba_d_ssm=192, mamba_d_state=8, mamba_expand=2, mamba_n_groups=8, mamba_n_heads=24, mamba_norm_before_gate=True, mamba_proj_bias=False, mamba_rms_norm=True, mamba_use_mlp=True, max_position_embeddings=16384, mlp_bias=False, mlp_multipliers=[0.8838834764831844, 0.5859375], model_type='falcon_h1', num_attention_heads=6, num_hidden_layers=3, num_key_value_heads=3, projectors_bias=False, rms_norm_eps=1e-05, rope_scaling=None, rope_theta=100000000000.0, ssm_in_multiplier=1.25, ssm_multipliers=[0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738], ssm_out_multiplier=0.23570226039551587, tie_word_embeddings=False, vocab_size=1216, _source="constructed: the widths random seed 53 drew for falcon_h1 (rnd-s53-falconh1-0: hidden 96, 24 Mamba heads of 8 in 8 groups, state 8) with mamba_rms_norm and mamba_norm_before_gate true, typed into tools/truth/make_configs.py")),
    # Phi with its per-head q/k LayerNorms on (constructed, see _source)
    "phi-qkln-small": (None, dict(model_type='phi', hidden_size=48, intermediate_size=168, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, vocab_size=1744, max_position_embeddings=2048, partial_rotary_factor=1.0, qk_layernorm=True, layer_norm_eps=1e-05, rope_theta=10000.0, rope_scaling=None, hidden_act='gelu_new', attention_dropout=0.0, embd_pdrop=0.1, resid_pdrop=0.1, tie_word_embeddings=True, bos_token_id=50256, eos_token_id=50256, _source="constructed: the widths random seed 53 drew for phi (rnd-s53-phi-0: hidden 48, 6 query / 2 key-value heads of 8, every dimension rotated) with qk_layernorm true (no released Phi checkpoint sets it), typed into tools/truth/make_configs.py")),
    "phi-qkln-2l": (None, dict(model_type='phi', hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8, vocab_size=4096, max_position_embeddings=2048, partial_rotary_factor=0.4, qk_layernorm=True, layer_norm_eps=1e-05, rope_theta=10000.0, rope_scaling=None, hidden_act='gelu_new', attention_dropout=0.0, embd_pdrop=0.0, resid_pdrop=0.1, tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256, _source="constructed: phi-2's fields (partial rotary 0.4, biased LM head) at hidden 256 with 8 heads of 32, 2 layers, vocabulary 4096, qk_layernorm true (no released Phi checkpoint sets it), typed into tools/truth/make_configs.py")),
    # ---------------- qwen3_next (gated DeltaNet + gated attention, MoE) ----------------
    # Qwen/Qwen3-Next-80B-A3B-Instruct config.json, typed into data/models (no verbatim copy was
    # found in the code index; see data/models/index.toml)
    "qwen3-next-80b-a3b": ("Qwen/Qwen3-Next-80B-A3B-Instruct.json", {}),
    # ---------------- MoE families of issue 14 ----------------
    "olmoe-1b-7b": ("allenai/OLMoE-1B-7B-0924.json", {}),
    "gpt-oss-20b": ("openai/gpt-oss-20b.json", {}),
    "gpt-oss-120b": ("openai/gpt-oss-120b.json", {}),
    "ernie-4.5-21b-a3b": ("baidu/ERNIE-4.5-21B-A3B-PT.json", {}),
    # ---------------- llama4 (multimodal wrappers; the truth cases use their text_config) ----------------
    "llama-4-scout-17b-16e": ("meta-llama/Llama-4-Scout-17B-16E-Instruct.json", {}),
    "llama-4-maverick-17b-128e": ("meta-llama/Llama-4-Maverick-17B-128E-Instruct.json", {}),
    # ---------------- vision-language wrappers ----------------
    "mistral-small-3.1-24b": ("mistralai/Mistral-Small-3.1-24B-Instruct-2503.json", {}),
    "qwen2.5-vl-7b": ("Qwen/Qwen2.5-VL-7B-Instruct.json", {}),
    "qwen2-vl-7b": ("Qwen/Qwen2-VL-7B-Instruct.json", {}),
}

# text towers of multimodal configs: name -> base (its `text_config`, verbatim)
TEXT = {
    "llama-4-scout-17b-16e-text": "llama-4-scout-17b-16e",
    "llama-4-maverick-17b-128e-text": "llama-4-maverick-17b-128e",
    # ---------------- smollm3 ----------------
    "smollm3-3b": ("HuggingFaceTB/SmolLM3-3B.json", {}),
    # ---------------- seed_oss ----------------
    # ByteDance-Seed/Seed-OSS-36B-Instruct: sizes from the model summary of
    # github.com/ByteDance-Seed/seed-oss README.md (64 layers, 80/8/8 heads, head size 128,
    # hidden 5120, 512K context, RoPE base 1e7); vocabulary 155136, intermediate 27648,
    # attention_bias/attention_out_bias/dropouts = SeedOssConfig defaults (36.15B parameters,
    # the published "36B")
    "seed-oss-36b": (None, dict(
        model_type="seed_oss", hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
        num_attention_heads=80, num_key_value_heads=8, head_dim=128, vocab_size=155136,
        max_position_embeddings=524288, rms_norm_eps=1e-6, rope_theta=10000000.0,
        attention_bias=True, attention_out_bias=False, attention_dropout=0.1, residual_dropout=0.1,
        mlp_bias=False, tie_word_embeddings=False, hidden_act="silu", bos_token_id=0,
        eos_token_id=2, pad_token_id=1)),
    # ---------------- exaone4 ----------------
    # LGAI-EXAONE/EXAONE-4.0-32B: hybrid attention, 3 sliding (4096) : 1 global layer without
    # RoPE ("LLLG"), per the transformers exaone4 model doc and the LG technical report; sizes
    # hidden 5120, intermediate 27392, 64 layers, 40/8 heads of 128, rope llama3 x16 (as vendored
    # for the EXAONE 4.x text stack in NVIDIA TensorRT-LLM's exaone4_5 tests), vocab 102400,
    # untied (32.0B parameters, the published "32B")
    "exaone-4.0-32b": (None, dict(
        model_type="exaone4", hidden_size=5120, intermediate_size=27392, num_hidden_layers=64,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, vocab_size=102400,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=1000000.0,
        rope_scaling={"factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        sliding_window=4096, sliding_window_pattern="LLLG",
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(64)],
        attention_dropout=0.0, hidden_act="silu", tie_word_embeddings=False, use_cache=True,
        bos_token_id=1, eos_token_id=361, pad_token_id=0)),
    # LGAI-EXAONE/EXAONE-4.0-1.2B: the architecture fields of the transformers-saved config of a
    # quantised derivative (GitHub his0si/EXAONE-4.0-1.2B@1840ff905c28:model/config.json, its
    # quantization_config dropped): full attention with RoPE in all 30 layers, tied embeddings
    "exaone-4.0-1.2b": (None, dict(
        model_type="exaone4", hidden_size=2048, intermediate_size=4096, num_hidden_layers=30,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=102400,
        max_position_embeddings=65536, rms_norm_eps=1e-5, rope_theta=1000000.0,
        rope_scaling={"factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        sliding_window=None, sliding_window_pattern=None, layer_types=["full_attention"] * 30,
        attention_dropout=0.0, hidden_act="silu", tie_word_embeddings=True, use_cache=True,
        bos_token_id=1, eos_token_id=361, pad_token_id=0)),
    # ---------------- ernie4_5 ----------------
    # baidu/ERNIE-4.5-0.3B-PT: Ernie4_5Config's defaults are this model (0.36B parameters:
    # hidden 1024, 18 layers, 16/2 heads of 128, intermediate 3072, vocab 103424, tied,
    # 131072 positions, rope_theta 500000, no biases)
    "ernie-4.5-0.3b": (None, dict(
        model_type="ernie4_5", hidden_size=1024, intermediate_size=3072, num_hidden_layers=18,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, vocab_size=103424,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, use_bias=False,
        tie_word_embeddings=True, hidden_act="silu", bos_token_id=1,
        eos_token_id=2, pad_token_id=0)),
    # ---------------- hunyuan_v1_dense ----------------
    # tencent/Hunyuan-7B-Instruct: sizes as vendored in two independent test suites
    # (NVIDIA TensorRT model-connect families/hunyuan tests; a model-zoo size table): 32 layers,
    # hidden 4096, 32/8 heads of 128, intermediate 14336, vocab 128167, tied embeddings,
    # use_qk_norm, rope dynamic alpha 1000
    "hunyuan-7b": (None, dict(
        model_type="hunyuan_v1_dense", hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        vocab_size=128167, max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=10000.0,
        rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0}, attention_bias=False,
        attention_dropout=0.0, use_qk_norm=True, tie_word_embeddings=True, hidden_act="silu",
        bos_token_id=127958, eos_token_id=127960, pad_token_id=127961)),
    # ---------------- Granite MoE / HunYuan MoE / Granite 4.0-H with experts (issue 14) ----------------
    "granite-3.1-1b-a400m": ("ibm-granite/granite-3.1-1b-a400m-instruct.json", {}),
    # granitemoeshared: no released config was found (transformers' docs name only a test model);
    # granite-3.1-1b-a400m-instruct's fields (verbatim in data/models) with model_type
    # granitemoeshared and shared_intermediate_size=1024 added: a constructed config, sizes real
    "granite-moeshared-1b-s1024": (None, dict(
        _source="constructed: granite-3.1-1b-a400m-instruct's fields with model_type granitemoeshared and shared_intermediate_size 1024 (no released granitemoeshared config found), typed into tools/truth/make_configs.py",
        model_type="granitemoeshared", hidden_size=1024, intermediate_size=512,
        shared_intermediate_size=1024, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=8, num_local_experts=32, num_experts_per_tok=8, vocab_size=49155,
        max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1500000.0,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625,
        logits_scaling=6.0, attention_bias=False, attention_dropout=0.0, hidden_act="silu",
        tie_word_embeddings=True, output_router_logits=False, router_aux_loss_coef=0.0,
        bos_token_id=0, eos_token_id=0, pad_token_id=0)),
    # tencent/Hunyuan-A13B-Instruct: published hyper-parameters (hidden 4096, 32 layers, 32/8
    # heads of 128, intermediate 3072 = expert and shared-MLP width in transformers 5.23, 64
    # experts, top-8 (the Hub file lists moe_topk per layer; one value here), vocab 128167)
    "hunyuan-a13b": (None, dict(
        model_type="hunyuan_v1_moe", hidden_size=4096, intermediate_size=3072,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        num_experts=64, moe_topk=8, vocab_size=128167, max_position_embeddings=32768,
        rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False, attention_dropout=0.0,
        tie_word_embeddings=True, hidden_act="silu", bos_token_id=1, eos_token_id=127960)),
    # ibm-granite/granite-4.0-h-tiny: published hyper-parameters as quoted by public test code
    # (hidden 1536, 40 layers, 12/4 heads, attention at 5/15/25/35, 64 experts of 512, top-6,
    # shared MLP 1024, mamba 48 heads x 64, state 128, 1 group, conv 4, chunk 256, vocab
    # 100352, tied); the multipliers are h-micro's (they set no size)
    "granite-4.0-h-tiny": (None, dict(
        model_type="granitemoehybrid", hidden_size=1536, intermediate_size=512,
        shared_intermediate_size=1024, num_hidden_layers=40, num_attention_heads=12,
        num_key_value_heads=4, vocab_size=100352, max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        layer_types=(["mamba"] * 5 + ["attention"] + (["mamba"] * 9 + ["attention"]) * 3 + ["mamba"] * 4),
        mamba_n_heads=48, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False,
        num_local_experts=64, num_experts_per_tok=6, embedding_multiplier=12.0, logits_scaling=8.0,
        residual_multiplier=0.22, attention_multiplier=0.015625, position_embedding_type="nope",
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False, attention_dropout=0.0,
        bos_token_id=100257, eos_token_id=100257, pad_token_id=100256)),
    # ---------------- phi ----------------
    "phi-2": (None, dict(  # microsoft/phi-2
        model_type="phi", hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=51200, max_position_embeddings=2048,
        partial_rotary_factor=0.4, qk_layernorm=False, layer_norm_eps=1e-5, rope_theta=10000.0,
        rope_scaling=None, hidden_act="gelu_new", attention_dropout=0.0, embd_pdrop=0.0, resid_pdrop=0.1,
        tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256)),
    # ---------------- granite ----------------
    "granite-3.1-2b": (None, dict(  # ibm-granite/granite-3.1-2b-instruct
        model_type="granite", hidden_size=2048, intermediate_size=8192, num_hidden_layers=40,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=49155, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=5000000.0, rope_scaling=None, hidden_act="silu",
        attention_bias=False, mlp_bias=False, attention_dropout=0.1, embedding_multiplier=12.0,
        attention_multiplier=0.015625, residual_multiplier=0.22, logits_scaling=8.0,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0)),
    # ---------------- cohere / cohere2 ----------------
    "command-r-v01": (None, dict(  # CohereForAI/c4ai-command-r-v01
        model_type="cohere", hidden_size=8192, intermediate_size=22528, num_hidden_layers=40,
        num_attention_heads=64, num_key_value_heads=64, vocab_size=256000, max_position_embeddings=8192,
        layer_norm_eps=1e-5, logit_scale=0.0625, rope_theta=8000000.0, use_qk_norm=False,
        attention_bias=False, attention_dropout=0.0, hidden_act="silu", tie_word_embeddings=True,
        bos_token_id=5, eos_token_id=255001, pad_token_id=0)),
    "command-r7b": (None, dict(  # CohereForAI/c4ai-command-r7b-12-2024
        model_type="cohere2", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=256000,
        max_position_embeddings=8192, layer_norm_eps=1e-5, logit_scale=0.25, rope_theta=50000.0,
        rope_scaling=None, sliding_window=4096, sliding_window_pattern=4, attention_bias=False,
        attention_dropout=0.0, hidden_act="silu", tie_word_embeddings=True,
        bos_token_id=5, eos_token_id=255001, pad_token_id=0)),
    # ---------------- glm / glm4 ----------------
    "glm-4-9b-chat-hf": (None, dict(  # THUDM/glm-4-9b-chat-hf
        model_type="glm", hidden_size=4096, intermediate_size=13696, num_hidden_layers=40,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, vocab_size=151552,
        max_position_embeddings=131072, rms_norm_eps=1.5625e-07, rope_theta=10000.0,
        partial_rotary_factor=0.5, attention_bias=True, attention_dropout=0.0, hidden_act="silu",
        tie_word_embeddings=False, pad_token_id=151329, eos_token_id=[151329, 151336, 151338])),
    "glm-4-9b-0414": (None, dict(  # THUDM/GLM-4-9B-0414
        model_type="glm4", hidden_size=4096, intermediate_size=13696, num_hidden_layers=40,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, vocab_size=151552,
        max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=10000.0,
        partial_rotary_factor=0.5, attention_bias=True, attention_dropout=0.0, hidden_act="silu",
        tie_word_embeddings=False, pad_token_id=151329, eos_token_id=[151329, 151336, 151338])),
}

# entries merged into TEXT by mistake are base configs (name -> (file, fields)): move them to BASE
for _name in [k for k, v in TEXT.items() if isinstance(v, tuple)]:
    BASE[_name] = TEXT.pop(_name)

# reduced-depth variants: name -> (base, layers)
REDUCED = {
    "llama-3.1-8b-4l": ("llama-3.1-8b", 4),
    "mistral-7b-v0.1-4l": ("mistral-7b-v0.1", 4),
    "mixtral-8x7b-2l": ("mixtral-8x7b", 2),
    "qwen1.5-moe-a2.7b-4l": ("qwen1.5-moe-a2.7b", 4),
    "qwen3-30b-a3b-2l": ("qwen3-30b-a3b", 2),
    "gemma-7b-4l": ("gemma-7b", 4),
    "gemma-2-9b-4l": ("gemma-2-9b", 4),
    "falcon-7b-4l": ("falcon-7b", 4),
    "falcon-40b-2l": ("falcon-40b", 2),  # new decoder architecture, 128 query heads over 8 key/value heads
    "deepseek-v3-4l": ("deepseek-v3", 4),  # first_k_dense_replace=3: 3 dense + 1 MoE layer
    "olmo-2-7b-4l": ("olmo-2-7b", 4),
    "phi-3-mini-4k-8l": ("phi-3-mini-4k", 8),
    "mamba-codestral-7b-2l": ("mamba-codestral-7b", 2),
    "mamba-2.8b-2l": ("mamba-2.8b", 2),
    # layers 0-4: Mamba (dense MLP), Mamba (MoE), Mamba (dense), Mamba (MoE), attention (dense)
    "jamba-1.5-mini-5l": ("jamba-1.5-mini", 5),
    "granite-4.0-h-micro-6l": ("granite-4.0-h-micro", 6),  # 5 Mamba-2 layers + 1 attention layer
    "falcon-h1-0.5b-2l": ("falcon-h1-0.5b", 2),  # every layer attention + Mamba-2 in parallel
    "falcon-h1-0.5b-4l": ("falcon-h1-0.5b", 4),
    "olmoe-1b-7b-2l": ("olmoe-1b-7b", 2),
    # full_attention_interval 4: layers 0-2 gated DeltaNet, layer 3 gated full attention
    "qwen3-next-80b-a3b-4l": ("qwen3-next-80b-a3b", 4),
    "gpt-oss-20b-2l": ("gpt-oss-20b", 2),
    "ernie-4.5-21b-a3b-2l": ("ernie-4.5-21b-a3b", 2),  # layer 0 dense, layer 1 MoE (moe_layer_start_index=1)
    # 3 chunked-attention RoPE layers + 1 NoPE full-attention layer; all experts kept
    "llama-4-scout-17b-16e-text-4l": ("llama-4-scout-17b-16e-text", 4),
    "llama-4-maverick-17b-128e-text-4l": ("llama-4-maverick-17b-128e-text", 4),
    # wrappers: the text_config's layers are cut; the vision tower stays whole
    "llama-4-scout-17b-16e-4l": ("llama-4-scout-17b-16e", 4),
    "mistral-small-3.1-24b-4l": ("mistral-small-3.1-24b", 4),
    "qwen2.5-vl-7b-4l": ("qwen2.5-vl-7b", 4),
    "qwen2-vl-7b-4l": ("qwen2-vl-7b", 4),
    "smollm3-3b-4l": ("smollm3-3b", 4),  # layers 0-2 RoPE, layer 3 NoPE (no_rope_layers 1,1,1,0)
    "seed-oss-36b-2l": ("seed-oss-36b", 2),
    "exaone-4.0-32b-4l": ("exaone-4.0-32b", 4),  # sliding, sliding, sliding, global (NoPE)
    "exaone-4.0-1.2b-4l": ("exaone-4.0-1.2b", 4),
    "hunyuan-7b-2l": ("hunyuan-7b", 2),
    "phi-2-4l": ("phi-2", 4),
    "granite-3.1-1b-a400m-4l": ("granite-3.1-1b-a400m", 4),
    "granite-moeshared-1b-s1024-4l": ("granite-moeshared-1b-s1024", 4),
    "hunyuan-a13b-2l": ("hunyuan-a13b", 2),
    "granite-4.0-h-tiny-6l": ("granite-4.0-h-tiny", 6),  # 5 Mamba-2 layers + 1 attention layer, MoE in all
    "granite-3.1-2b-4l": ("granite-3.1-2b", 4),
    "command-r-v01-2l": ("command-r-v01", 2),
    "command-r7b-4l": ("command-r7b", 4),  # sliding_window_pattern=4: 3 sliding + 1 global layer
    "glm-4-9b-chat-hf-4l": ("glm-4-9b-chat-hf", 4),
    "glm-4-9b-0414-4l": ("glm-4-9b-0414", 4),
}


# wrappers with image inputs (cases with `image_tokens`): name -> (base, text layers, vision depth);
# Qwen2.5-VL's full-attention blocks are cut to the last kept block (the others are windowed)
VISION_REDUCED = {
    "qwen2-vl-7b-2l-v2": ("qwen2-vl-7b", 2, 2),
    "qwen2.5-vl-7b-2l-v2": ("qwen2.5-vl-7b", 2, 2),
    "gemma-3-4b-2l-v2": ("gemma-3-4b", 2, 2),  # SigLIP: num_hidden_layers in vision_config
    "gemma-3-4b-6l-v2": ("gemma-3-4b", 6, 2),  # 5 sliding + 1 full-attention text layer
    "mistral-small-3.1-24b-1l-v2": ("mistral-small-3.1-24b", 1, 2),  # Pixtral: num_hidden_layers
    # Llama 4 Scout: 1 MoE text layer (16 experts, chunked attention) and 2 vision encoder
    # layers at the real widths (1408 wide, 16 heads, 5632 MLP, 336-px tiles)
    "llama-4-scout-17b-16e-1l-v2": ("llama-4-scout-17b-16e", 1, 2),
}

# small llama4 wrappers for the fake = real crosscheck on real CPU tensors: the text model at
# sw6-llama4's small widths (tools/truth/shrink_configs.py), the special ids moved into its
# vocabulary, the vision tower at Scout's widths cut to 2 layers
VISION_SMALL = {
    "llama4-xc-small": ("llama-4-scout-17b-16e", "sw6-llama4", 2),
}


# tower-dominated wrappers for image inputs under checkpointing (issue 14): the vision tower at
# the real widths cut to 2 layers, behind a 2-layer text model at small widths (hidden 64, 4
# heads x 16, 2 KV heads, MLP 128, vocabulary 1000; the special ids moved to its top), so the
# tower's part of the step is not hidden by the text model
SMALL_TEXT = {
    "qwen2-vl-xc-small": ("qwen2-vl-7b", 2),
    "qwen2.5-vl-xc-small": ("qwen2.5-vl-7b", 2),
    "gemma-3-xc-small": ("gemma-3-4b", 2),
    "mistral3-xc-small": ("mistral-small-3.1-24b", 2),
}

SMALL_TEXT_FIELDS = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000, "num_hidden_layers": 2,
}


def small_text(base: str, depth: int) -> dict:
    d = reduce_vision(reduce(base_config(base), 2, base), depth)
    mt = d["model_type"]
    t = d["text_config"] if isinstance(d.get("text_config"), dict) else d
    t.update(SMALL_TEXT_FIELDS)
    v = d["vision_config"]
    note = ""
    if mt in ("qwen2_vl", "qwen2_5_vl"):
        # Qwen2-VL's PatchMerger writes the text width (vision hidden_size / out_hidden_size);
        # M-RoPE sections sum to head_dim / 2
        v["out_hidden_size" if mt == "qwen2_5_vl" else "hidden_size"] = 64
        d["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 3, 3]}
        d.update(bos_token_id=993, eos_token_id=994, video_token_id=995, vision_token_id=996,
                 vision_start_token_id=997, vision_end_token_id=998, image_token_id=999)
        note = "mrope_section [2, 3, 3], merger output 64, special ids 993..999"
    elif mt == "gemma3":
        t["query_pre_attn_scalar"] = 16
        d["boi_token_index"], d["eoi_token_index"], d["image_token_index"] = 997, 998, 999
        d["eos_token_id"] = 1
        note = "query_pre_attn_scalar 16, boi/eoi/image ids 997/998/999"
    elif mt == "mistral3":
        note = "image id 10 and [IMG_BREAK]/[IMG_END] 12/13 kept"
    else:
        raise SystemExit(f"small_text: {mt}")
    d["_memwall"] = (f"constructed: {base}'s vision tower cut to {depth} layers behind a 2-layer text model "
                     f"at small widths (hidden 64, 4 heads x 16, 2 KV heads, MLP 128, vocabulary 1000; {note}) "
                     f"({d['_memwall']})")
    return d


def small_vision(base: str, text: str, depth: int) -> dict:
    d = reduce_vision(reduce(base_config(base), 1, base), depth)
    t = json.loads((OUT / f"{text}.json").read_text())
    t["num_hidden_layers"] = 2
    d["text_config"] = t
    d["num_hidden_layers"] = 2
    vocab = int(t["vocab_size"])
    d["image_token_index"], d["boi_token_index"], d["eoi_token_index"] = vocab - 1, vocab - 3, vocab - 2
    d["_memwall"] = (f"constructed: {base}'s vision_config cut to {depth} layers with {text}'s text_config "
                     f"(2 layers; its vocabulary {vocab}, so image/boi/eoi ids {vocab - 1}/{vocab - 3}/{vocab - 2}) "
                     f"({d['_memwall']})")
    return d


def reduce_vision(d: dict, depth: int) -> dict:
    v = d["vision_config"]
    v["num_hidden_layers" if "num_hidden_layers" in v else "depth"] = depth
    if isinstance(v.get("fullatt_block_indexes"), list):
        v["fullatt_block_indexes"] = [depth - 1]
    d["_memwall"] = d["_memwall"].replace(" layers (", f" text layers and {depth} vision blocks (", 1)
    return d


def base_config(name: str) -> dict:
    if name in TEXT:
        outer = base_config(TEXT[name])
        if not outer:
            return {}
        d = dict(outer["text_config"])
        d["_memwall"] = f"text_config of {TEXT[name]} ({outer['_memwall']})"
        return d
    src, fields = BASE[name]
    if src and (DATA / src).exists():
        d = json.loads((DATA / src).read_text())
        d["_memwall"] = f"verbatim copy of data/models/{src}"  # moved to SOURCES.toml on write
    elif fields:
        d = dict(fields)
        # a config that is not a published model's says so in its own "_source" entry
        d["_memwall"] = d.pop("_source", "published hyper-parameters of this model, typed into tools/truth/make_configs.py")
    else:
        return {}
    return d


def reduce(d: dict, n: int, base: str) -> dict:
    d = json.loads(json.dumps(d))
    # a vision-language wrapper: the language model's layers live in its text_config
    t = d["text_config"] if isinstance(d.get("text_config"), dict) else d
    key = "n_layer" if "n_layer" in t else "num_hidden_layers"
    t[key] = n
    for lk in ("layer_types",):
        if isinstance(t.get(lk), list):
            t[lk] = t[lk][:n]
    key = "n_layer" if "n_layer" in d else "num_hidden_layers"
    d[key] = n
    if "num_hidden_layers" in d:
        # configs with both (state-spaces/mamba-*-hf): transformers reads num_hidden_layers
        d["num_hidden_layers"] = n
    for lk in ("layer_types", "no_rope_layers"):
        if isinstance(d.get(lk), list):
            d[lk] = d[lk][:n]
    d["_memwall"] = f"{base} cut to {n} layers ({d['_memwall']})"
    return d


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    # `make_configs.py NAME ...` writes only those configs and keeps the other SOURCES lines
    only = set(sys.argv[1:])
    written = []
    sources = {}

    def write(name: str, d: dict) -> None:
        sources[name] = d.pop("_memwall")
        (OUT / f"{name}.json").write_text(json.dumps(d, indent=2) + "\n")

    def wanted(name: str) -> bool:
        return not only or name in only

    for name in BASE:
        if not wanted(name):
            continue
        d = base_config(name)
        if not d:
            print(f"skip {name}: {BASE[name][0]} not present yet")
            continue
        write(name, d)
        written.append(name)
    for name in TEXT:
        if not wanted(name):
            continue
        d = base_config(name)
        if not d:
            print(f"skip {name}")
            continue
        write(name, d)
        written.append(name)
    for name, (base, n) in REDUCED.items():
        if not wanted(name):
            continue
        d = base_config(base)
        if not d:
            print(f"skip {name}")
            continue
        write(name, reduce(d, n, base))
        written.append(name)
    for name, (base, n, depth) in VISION_REDUCED.items():
        if not wanted(name):
            continue
        d = base_config(base)
        if not d:
            print(f"skip {name}")
            continue
        write(name, reduce_vision(reduce(d, n, base), depth))
        written.append(name)
    for name, (base, text, depth) in VISION_SMALL.items():
        if not wanted(name):
            continue
        write(name, small_vision(base, text, depth))
        written.append(name)
    for name, (base, depth) in SMALL_TEXT.items():
        if not wanted(name):
            continue
        write(name, small_text(base, depth))
        written.append(name)
    old = OUT / "SOURCES.toml"
    if only and old.exists():
        # keep the file as it is; replace the written configs' lines in place, append new ones
        lines = []
        for l in old.read_text().splitlines():
            k = l.split(" = ", 1)[0].strip('"')
            lines.append(f'"{k}" = "{sources.pop(k)}"' if k in sources else l)
        lines += [f'"{k}" = "{v}"' for k, v in sorted(sources.items())]
        (OUT / "SOURCES.toml").write_text("\n".join(lines) + "\n")
        print(f"wrote {len(written)} configs")
        return
    lines = ["# origin of each config in this folder (written by tools/truth/make_configs.py)"]
    lines += [f'"{k}" = "{v}"' for k, v in sorted(sources.items())]
    # the random sample's configs are written by sample_cases.py: keep their lines
    if old.exists():
        lines += [l for l in old.read_text().splitlines() if l.startswith('"rnd-')]
    (OUT / "SOURCES.toml").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(written)} configs")


if __name__ == "__main__":
    main()
