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
}

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
    "deepseek-v3-4l": ("deepseek-v3", 4),  # first_k_dense_replace=3: 3 dense + 1 MoE layer
    "olmo-2-7b-4l": ("olmo-2-7b", 4),
    "phi-3-mini-4k-8l": ("phi-3-mini-4k", 8),
}


def base_config(name: str) -> dict:
    src, fields = BASE[name]
    if src and (DATA / src).exists():
        d = json.loads((DATA / src).read_text())
        d["_memwall"] = f"verbatim copy of data/models/{src}"  # moved to SOURCES.toml on write
    elif fields:
        d = dict(fields)
        d["_memwall"] = "published hyper-parameters of this model, typed into tools/truth/make_configs.py"
    else:
        return {}
    return d


def reduce(d: dict, n: int, base: str) -> dict:
    d = json.loads(json.dumps(d))
    key = "n_layer" if "n_layer" in d else "num_hidden_layers"
    d[key] = n
    for lk in ("layer_types",):
        if isinstance(d.get(lk), list):
            d[lk] = d[lk][:n]
    d["_memwall"] = f"{base} cut to {n} layers ({d['_memwall']})"
    return d


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    sources = {}

    def write(name: str, d: dict) -> None:
        sources[name] = d.pop("_memwall")
        (OUT / f"{name}.json").write_text(json.dumps(d, indent=2) + "\n")

    for name in BASE:
        d = base_config(name)
        if not d:
            print(f"skip {name}: {BASE[name][0]} not present yet")
            continue
        write(name, d)
        written.append(name)
    for name, (base, n) in REDUCED.items():
        d = base_config(base)
        if not d:
            print(f"skip {name}")
            continue
        write(name, reduce(d, n, base))
        written.append(name)
    lines = ["# origin of each config in this folder (written by tools/truth/make_configs.py)"]
    lines += [f'"{k}" = "{v}"' for k, v in sorted(sources.items())]
    # the random sample's configs are written by sample_cases.py: keep their lines
    old = OUT / "SOURCES.toml"
    if old.exists():
        lines += [l for l in old.read_text().splitlines() if l.startswith('"rnd-')]
    (OUT / "SOURCES.toml").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(written)} configs")


if __name__ == "__main__":
    main()
