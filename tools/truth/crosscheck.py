#!/usr/bin/env python3
"""Run a few small cases twice under MemTracker -- on REAL CPU tensors and on fake tensors
(FakeTensorMode, CPU) -- and write tests/truth/crosscheck.jsonl with both numbers.

Same code path as measure.py (measure.run_case), only the FakeTensorMode context differs; the
inference cases (INFER_CASES) go through measure_infer.run_case the same way (`real=True`).
Usage: python tools/truth/crosscheck.py [ID_SUBSTRING]
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import measure  # noqa: E402
import measure_infer  # noqa: E402

OUT = measure.REPO / "tests/truth/crosscheck.jsonl"

CASES = [
    dict(id="xc-smollm135m-bf16-adamw", config="smollm-135m", batch=2, seq=128),
    dict(id="xc-smollm135m-fp32-eager-ckpt", config="smollm-135m", batch=2, seq=128,
         precision="fp32", attention="eager", checkpointing=True),
    dict(id="xc-gpt2-bf16-dropout", config="gpt2", batch=2, seq=128),
    dict(id="xc-qwen2-0.5b-ampbf16-lora", config="qwen2.5-0.5b", batch=1, seq=128,
         precision="amp-bf16", lora={"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}),
    dict(id="xc-pythia160m-bf16-sgdmom-ga2", config="pythia-160m", batch=2, seq=128,
         precision="bf16", optimizer="sgd-momentum", grad_accum=2),
    # the fused-loss references and packed sequences (tools/truth/kernels.py)
    dict(id="xc-smollm135m-fce", config="smollm-135m", batch=2, seq=128, loss="fused"),
    dict(id="xc-smollm135m-flce", config="smollm-135m", batch=2, seq=128, loss="fused-linear"),
    dict(id="xc-tinyllama-flce-ga2", config="tinyllama-1.1b", batch=1, seq=128, loss="fused-linear",
         grad_accum=2, optimizer="sgd"),
    dict(id="xc-smollm135m-pf", config="smollm-135m", batch=4, seq=64, padding_free=True),
    # training loops, checkpointing policies, the training KV cache (issue 17)
    dict(id="xc-smollm135m-keep-ga2", config="smollm-135m", batch=2, seq=128, loop="keep-outputs",
         grad_accum=2),
    dict(id="xc-smollm135m-every2", config="smollm-135m", batch=2, seq=128, checkpointing=True,
         checkpointing_policy="every-k:2"),
    dict(id="xc-smollm135m-selattn-eager", config="smollm-135m", batch=2, seq=128,
         attention="eager", checkpointing=True, checkpointing_policy="selective-attn"),
    dict(id="xc-pythia160m-fp32-cache-on", config="pythia-160m", batch=2, seq=128, precision="fp32",
         use_cache=True),
    dict(id="xc-pythia160m-fp32-cache-off", config="pythia-160m", batch=2, seq=128,
         precision="fp32", use_cache=False),
    dict(id="xc-smollm135m-cache-off", config="smollm-135m", batch=2, seq=128, use_cache=False),
    dict(id="xc-gpt2-cache-off", config="gpt2", batch=2, seq=128, dropout="off", use_cache=False),
    # torchtitan's op-level SAC and save_on_cpu activation offloading (issue 17, item 3)
    dict(id="xc-i17b-smollm135m-sacop", config="smollm-135m", batch=2, seq=128, checkpointing=True,
         checkpointing_policy="selective-op"),
    dict(id="xc-i17b-gpt2-sacop-eager", config="gpt2", batch=2, seq=128, attention="eager",
         checkpointing=True, checkpointing_policy="selective-op"),
    dict(id="xc-i17b-smollm135m-offload", config="smollm-135m", batch=2, seq=128,
         activation_offload=True),
    # falcon_h1: attention + Mamba-2 in parallel; transformers' tracing detection (is_tracing is
    # true for fake tensors) must not change what the mixer allocates
    dict(id="xc-falconh1-2l-bf16", config="falcon-h1-0.5b-2l", batch=1, seq=256),
    dict(id="xc-falconh1-2l-ampbf16-lora", config="falcon-h1-0.5b-2l", batch=1, seq=256,
         precision="amp-bf16", lora={"rank": 8, "alpha": 16, "targets": ["q_proj", "in_proj"]}),
    # Mamba2Mixer under autocast (16-bit projections: bf16 einsum operands cast from fp32,
    # ssm.rs Scan::saved_amp16): 2 chunks, padded; SGD keeps the real run small
    dict(id="xc-codestral-2l-ampbf16-sgd", config="mamba-codestral-7b-2l", batch=1, seq=300,
         precision="amp-bf16", attention="eager", optimizer="sgd"),
    # mistral3 image inputs (Pixtral tower, block mask, patch merger, masked_scatter): fake
    # tensors with a ShapeEnv (measure.run_case fake_images) against real ones, at a small
    # image; the measured image cases run on real tensors only
    dict(id="xc-mistral3-1l-img64-eager", config="mistral-small-3.1-24b-1l-v2", batch=2, seq=96,
         image_tokens=64, attention="eager", optimizer="sgd", fake_images=True),
    dict(id="xc-mistral3-1l-img30-sdpa", config="mistral-small-3.1-24b-1l-v2", batch=1, seq=64,
         image_tokens=30, optimizer="sgd", fake_images=True),
    # llama4 image inputs (Llama4VisionModel at Scout's widths, 2 layers, behind a small text
    # model): its measured image cases run on fake tensors (measure.run_case), so both here
    dict(id="xc-llama4-small-img288-b2-eager", config="llama4-xc-small", batch=2, seq=320,
         image_tokens=288, attention="eager", optimizer="sgd", fake_images=True),
    dict(id="xc-llama4-small-img720-sdpa", config="llama4-xc-small", batch=1, seq=800,
         image_tokens=720, optimizer="sgd", fake_images=True),
    dict(id="xc-llama4-small-img144-fp32-lora", config="llama4-xc-small", batch=2, seq=200,
         image_tokens=144, precision="fp32",
         lora={"rank": 8, "alpha": 16, "targets": ["gate_proj", "up_proj", "down_proj"]}),
    # llama4 image inputs under checkpointing (helper 20): the tower's backward (the
    # recomputed encoder layers' SDPA / eager backward) on real CPU tensors against fake ones
    dict(id="xc-llama4-small-img288-sgd-ckpt", config="llama4-xc-small", batch=1, seq=320,
         image_tokens=288, optimizer="sgd", checkpointing=True, fake_images=True),
    dict(id="xc-llama4-small-img144-b2-sgd-ckpt-eager", config="llama4-xc-small", batch=2,
         seq=200, image_tokens=144, attention="eager", optimizer="sgd", checkpointing=True,
         fake_images=True),
    # mistral3 image inputs under checkpointing (issue 14): enable_input_require_grads hooks
    # PixtralVisionModel.patch_conv, so the frozen tower records autograd and its backward runs;
    # fake tensors (fake_images) against real ones, the tower at its real widths (2 layers)
    # behind a small text model. (qwen2_vl / gemma3 image cases run on real tensors only, so
    # their measured cases need no crosscheck.)
    dict(id="xc-mistral3-small-img64-ckpt", config="mistral3-xc-small", batch=2, seq=96,
         image_tokens=64, optimizer="sgd", checkpointing=True, fake_images=True),
    # llama4_text under autocast (issue 14): Llama4TextExperts' bmm casts and caches the fp32
    # expert weights; the 16-bit copies must be alive on real tensors as on fake ones
    dict(id="xc-llama4-tiny-ampfp16-sgd", config="sw6-llama4", batch=1, seq=33,
         precision="amp-fp16", optimizer="sgd", dropout="off"),
    # GatedDeltaNet at other shapes (issue 14, helper 10): the chunk loop's backward accumulators
    # and the training cache's final state / pinned last update (3 value heads per key head of
    # 48/32, 3 chunks padded; 1 chunk at 3 sequences)
    dict(id="xc-qwen3next-h128-r3-s150-sgd", config="h10-qwen3next-h128-r3", batch=1, seq=150,
         optimizer="sgd"),
    dict(id="xc-qwen3next-h128-r3-s40-b3-sgd", config="h10-qwen3next-h128-r3", batch=3, seq=40,
         optimizer="sgd"),
    # ... and in fp32, where the gated norm's no-op casts leave the `z` copy and the core
    # output's contiguous copy saved (4 chunks, padded)
    dict(id="xc-qwen3next-tiny-s200-fp32-sgd", config="sw6-qwen3next", batch=1, seq=200,
         precision="fp32", optimizer="sgd"),
    # ... and under autocast (helper 16), where the delta rule's matmuls save 16-bit casts of
    # their fp32 operands and the training cache pins the last update's casts (3 chunks padded,
    # 3 value heads per key head; 1 chunk, one value head per key head)
    dict(id="xc-qwen3next-h128-r3-s150-ampbf16-sgd", config="h10-qwen3next-h128-r3", batch=1,
         seq=150, precision="amp-bf16", optimizer="sgd"),
    dict(id="xc-qwen3next-h64-r1-s40-b2-ampbf16-sgd", config="h10-qwen3next-h64-r1", batch=2,
         seq=40, precision="amp-bf16", optimizer="sgd"),
    # ... and in fp32 with one value head per key head (helper 23), where l2norm saves query and
    # key as views of the conv's silu output and silu saves `z` as a view of in_proj_qkvz's
    # output (`to`'s aliasing must be the same on real tensors; 3 chunks, padded)
    dict(id="xc-qwen3next-h128-r1-s130-fp32-sgd", config="h23-qwen3next-h128-r1", batch=1,
         seq=130, precision="fp32", optimizer="sgd"),
    # ... and the training cache at the forward's peak (helper 25): the rule's final state and
    # the cache's copy alive at the gated norm (fp16, fp32), the unreachable last update's saves
    # outliving the backward while the loop keeps the outputs (the next forward's peak)
    dict(id="xc-qwen3next-rnd53-b1-s160-fp16", config="rnd-s53-qwen3next-0", batch=1, seq=160,
         precision="fp16", attention="eager"),
    dict(id="xc-qwen3next-rnd53-b1-s160-fp32-sgd", config="rnd-s53-qwen3next-0", batch=1,
         seq=160, precision="fp32", optimizer="sgd"),
    dict(id="xc-qwen3next-rnd53-b2-s160-keep", config="rnd-s53-qwen3next-0", batch=2, seq=160,
         loop="keep-outputs"),
    # fp32 over several unpadded chunks (helper 55): matmul's batch fold copies the chunked
    # query, key and k_beta (the fp32 `.to` aliases the strided views), at batch 2 the chunk
    # loop's slices too
    dict(id="xc-qwen3next-rnd53-b1-s128-fp32", config="rnd-s53-qwen3next-0", batch=1, seq=128,
         precision="fp32", optimizer="adamw-forloop", attention="eager"),
    dict(id="xc-qwen3next-rnd53-b2-s128-fp32-sgd", config="rnd-s53-qwen3next-0", batch=2,
         seq=128, precision="fp32", optimizer="sgd"),
    # ... and under autocast the gated norm's 16-bit return (the forward's peak with the cache)
    dict(id="xc-qwen3next-rnd53-b1-s255-ampbf16", config="rnd-s53-qwen3next-0", batch=1,
         seq=255, precision="amp-bf16", optimizer="adamw-forloop"),
    # Phi's q/k LayerNorms on bf16 projections under autocast (issue 14, seed 53): CPU autocast
    # runs layer_norm in the input's dtype; the fake tensors' reference native_layer_norm returns
    # mean/rstd in the input's dtype where the real CPU kernel keeps fp32 with fp32 weights
    dict(id="xc-phiqkln-small-ampbf16-sgd", config="phi-qkln-small", batch=2, seq=128,
         precision="amp-bf16", optimizer="sgd", dropout="off"),
    # Falcon-H1 norm-before-gate under autocast with checkpointing at the seed-53 widths: the
    # recomputed G and L die before the engine casts G's gradient (ssm.rs backward_peak_scan_amp)
    dict(id="xc-falconh1-nbg-small-ampbf16-ckpt-sgd", config="falcon-h1-small-nbg", batch=2,
         seq=264, precision="amp-bf16", optimizer="sgd", checkpointing=True, dropout="off"),
    # Falcon-H1 under autocast at rnd-s167-falconh1-0's widths (state 128, one chunk): the saving
    # forward peaks at C_times_states' bmm on 16-bit operands (ssm.rs Scan::forward_peak_amp;
    # helper 49), with and without checkpointing
    dict(id="xc-falconh1-s167-ampbf16-b5-s19", config="rnd-s167-falconh1-0", batch=5, seq=19,
         precision="amp-bf16", optimizer="adamw-forloop", attention="eager", dropout="off"),
    dict(id="xc-falconh1-s167-ampbf16-ckpt-b5-s19", config="rnd-s167-falconh1-0", batch=5,
         seq=19, precision="amp-bf16", optimizer="adamw-forloop", attention="eager",
         dropout="off", checkpointing=True),
    # Cohere 2 with a window (120) as long as the sequence, checkpointed (helper 29): both causal
    # masks built and held through the backward, the layer's locals alive at its final sum
    dict(id="xc-cohere2-rnd61-b3-s120-ckpt-fp32-sgd", config="rnd-s61-cohere2-0", batch=3,
         seq=120, precision="fp32", attention="eager", optimizer="sgd", checkpointing=True),
    # GPT-OSS and Qwen 2 with a window at least the sequence, checkpointed (helper 31): both
    # masks built, each held by the checkpoints of its type's layers
    dict(id="xc-gptoss-rnd61-b3-s120-ckpt-fp32-sgd", config="rnd-s61-gptoss-0", batch=3,
         seq=120, precision="fp32", attention="eager", optimizer="sgd", checkpointing=True),
    dict(id="xc-qwen2-sw128-b3-s120-ckpt-fp32-sgd", config="h31-qwen2-sw128", batch=3,
         seq=120, precision="fp32", attention="eager", optimizer="sgd", checkpointing=True),
    # GPT-2 eager under autocast fp16 (helper 33): the fp32 mask promotes the scores, the
    # softmax output is saved in fp32 beside its fp16 copy (rnd-t71-028-gpt2)
    dict(id="xc-gpt2-rnd71-b2-s400-ampfp16-eager", config="rnd-s71-gpt2-0", batch=2, seq=400,
         precision="amp-fp16", attention="eager", dropout="off"),
    # helper 36: Falcon eager under autocast keeps the fp32 softmax bound and makes the fp16 copy
    # inside `@ value` (LoRA on the MLP: the attention saves nothing); the base model's locals go
    # before the LM head while the final hidden state lives through the loss
    dict(id="xc-falcon-rnd97-b2-s200-ampfp16-lora-4h", config="rnd-s97-falcon-0", batch=2,
         seq=200, precision="amp-fp16", attention="eager",
         lora={"rank": 4, "alpha": 8, "targets": ["dense_4h_to_h"]}),
    # ... OPT's per-sequence position embeddings and position ids, and its inline MLP
    dict(id="xc-opt-rnd97-b3-s150-fp32-eager", config="rnd-s97-opt-0", batch=3, seq=150,
         precision="fp32", attention="eager", dropout="off"),
    # ... Llama 4 builds the full and the chunked mask whatever the layers read
    dict(id="xc-llama4text-rnd89-b2-s96-fp32-eager", config="rnd-s89-llama4text-0", batch=2,
         seq=96, precision="fp32", attention="eager", optimizer="sgd-momentum"),
    # helper 48: under autocast OLMoE's q/k norms (`weight * x.to(input_dtype)`, fp32 weight) give
    # fp32 outputs from the bf16 projections, and `clamp_` (clip_qkv) saves fp32 copies of them
    dict(id="xc-olmoe-s29-ampbf16-lora-qo-b4-s128", config="rnd-s29-olmoe-1", batch=4, seq=128,
         precision="amp-bf16", optimizer="sgd", dropout="off",
         lora={"rank": 2, "alpha": 4, "targets": ["q_proj", "o_proj"]}),
    # ... and OLMoE's router: topk saves its int64 indices, norm_topk_prob's in-place division a
    # clone of the top values and the divisor, `.to(router_logits.dtype)` a 16-bit copy
    dict(id="xc-olmoe-s79-ampfp16-eager-sgd-b2-s192", config="rnd-s79-olmoe-0", batch=2, seq=192,
         precision="amp-fp16", attention="eager", optimizer="sgd", dropout="off"),
    # ... Qwen3-MoE's router is the same (bf16 model: the fp32 top values cast back to bf16)
    dict(id="xc-qwen3moe-s17-bf16-lora-qv-b2-s128", config="rnd-s17-qwen3moe-0", batch=2, seq=128,
         precision="bf16", optimizer="adamw", dropout="off",
         lora={"rank": 2, "alpha": 4, "targets": ["q_proj", "v_proj"]}),
    # helper 37: GPT-2's fused query at a batch of one is a view bmm saves (no matmul copy), and
    # a one-head Mamba-2 mixer's einsum operands of C and B are views (granitemoehybrid)
    dict(id="xc-gpt2-rnd17-b1-s411-bf16-eager", config="rnd-s17-gpt2-1", batch=1, seq=411,
         precision="bf16", attention="eager", optimizer="adamw", dropout="off"),
    dict(id="xc-granitehybrid-rnd29-1head-b4-s186", config="rnd-s29-granitemoehybrid-1", batch=4,
         seq=186, precision="bf16", optimizer="adamw-forloop", dropout="off"),
    # ... and an fp32 ERNIE 4.5 MoE router's `.float()` of its fp32 input and weight is no copy
    dict(id="xc-ernie45moe-rnd61-b3-s64-fp32", config="rnd-s61-ernie45moe-0", batch=3, seq=64,
         precision="fp32", optimizer="adamw", dropout="off"),
    # helper 38: Falcon multi_query eager at a batch above one: matmul copies the broadcast
    # single k/v head and bmm saves the copies
    dict(id="xc-falcon-mq-s107-fp32-b3-s64-eager", config="rnd-s107-falcon-0", batch=3, seq=64,
         precision="fp32", attention="eager", dropout="off"),
    # helper 41: GPT-2 eager without a KV cache (checkpointed): matmul copies the strided q, k
    # and v views of c_attn's output and bmm saves the copies; CPU SDPA's math kernel (attention
    # dropout) keeps no dropped probabilities for a value that needs no gradient
    dict(id="xc-h41-gpt2-rnd17-ckpt-b3-s96-fp32-eager", config="rnd-s17-gpt2-1", batch=3, seq=96,
         precision="fp32", attention="eager", checkpointing=True, dropout="off"),
    dict(id="xc-h41-granite-rnd53-sdpamath-lora-qko-b4-s48", config="rnd-s53-granite-0", batch=4,
         seq=48, precision="bf16", optimizer="sgd", attention="sdpa",
         lora={"rank": 4, "alpha": 8, "targets": ["q_proj", "k_proj", "o_proj"]}),
    # ... and peft's input leaf under checkpointing keeps OPT's embedding lookup alive
    dict(id="xc-h41-leaf-opt-rnd17-lora-ckpt-b3-s48-fp32", config="rnd-s17-opt-1", batch=3, seq=48,
         precision="fp32", optimizer="sgd", checkpointing=True, attention="eager", dropout="off",
         lora={"rank": 2, "alpha": 4, "targets": ["q_proj", "v_proj"]}),
    # helper 42: OLMo 2's fp32 rotary tables promote 16-bit q/k (`q * cos` saves the fp32 cos),
    # cast back at the end of apply_rotary_pos_emb; plain and checkpointed
    dict(id="xc-olmo2-rope-s73-fp16-b3-s96-eager-sgd", config="rnd-s73-olmo2-0", batch=3, seq=96,
         precision="fp16", attention="eager", optimizer="sgd", dropout="off"),
    dict(id="xc-olmo2-rope-s73-bf16-b2-s128-ckpt", config="rnd-s73-olmo2-0", batch=2, seq=128,
         precision="bf16", checkpointing=True, dropout="off"),
    # helper 40: DeepSeek-V3 (MLA + grouped-mm MoE): a frozen router under LoRA with eager MLA's
    # value copy; the checkpointed un-permute's IndexBackward and the experts' fp32 gradient
    # cast; the router under autocast (the measured traces were on fake tensors)
    dict(id="xc-dsv3-s17-bf16-b3-s96-eager-lora-kva-o", config="rnd-s17-deepseekv3-0", batch=3,
         seq=96, precision="bf16", optimizer="sgd", attention="eager", dropout="off",
         lora={"rank": 4, "alpha": 8, "targets": ["kv_a_proj_with_mqa", "o_proj"]}),
    dict(id="xc-dsv3-s17-bf16-b2-s64-sdpa-sgd-ckpt", config="rnd-s17-deepseekv3-0", batch=2,
         seq=64, precision="bf16", optimizer="sgd", checkpointing=True, dropout="off"),
    dict(id="xc-dsv3-s17-ampfp16-b2-s64-sdpa-sgd", config="rnd-s17-deepseekv3-0", batch=2,
         seq=64, precision="amp-fp16", optimizer="sgd", dropout="off"),
    # helper 43: a checkpointed layer's last nodes that save nothing run before the recompute
    # (the residual add's 16-bit cast of its gradient, LoRA's scaling and cast), and the
    # recompute stops at its last saved tensor (torch early stop): real tensors must free and
    # keep the same; a Mamba-2 mixer with a wide state under autocast peaks at C_times_states
    dict(id="xc-h43-qwen2-bf16-lora-down-ckpt", config="rnd-s17-qwen2-1", batch=2, seq=48,
         precision="bf16", attention="eager", optimizer="sgd", checkpointing=True,
         lora={"rank": 2, "alpha": 2, "targets": ["down_proj"]}, dropout="off"),
    dict(id="xc-h43-mamba2-s53-ampfp16-ckpt", config="rnd-s53-mamba2-0", batch=2, seq=24,
         precision="amp-fp16", attention="eager", optimizer="sgd", checkpointing=True,
         dropout="off"),
    # helper 45: the LoRA projection's frozen base runs after the adapter's path and releases
    # its incoming [b, s, E] gradient before its input's two gradients are summed
    dict(id="xc-h45-gpt2-rnd17-lora-cproj-ckpt-b4-s60-fp32", config="rnd-s17-gpt2-1", batch=4,
         seq=60, precision="fp32", optimizer="sgd-momentum", checkpointing=True, attention="eager",
         lora={"rank": 1, "alpha": 2, "targets": ["c_proj"]}),
    dict(id="xc-h45-qwen2-rnd17-lora-down-b4-s40-fp32", config="rnd-s17-qwen2-1", batch=4, seq=40,
         precision="fp32", optimizer="sgd", attention="eager", dropout="off",
         lora={"rank": 2, "alpha": 4, "targets": ["down_proj"]}),
    # helper 47: Falcon multi_query's key and value are advanced-index copies of the fused qkv
    # output (`fused_qkv[..., [-1], :]`): the value matmul saves the single-head copy and the
    # fused output dies with the attention's locals, on real tensors as on fake ones
    dict(id="xc-h47-falcon-mq-s149-fp16-lora-dense-4h-ckpt-b1-s96", config="rnd-s149-falcon-0",
         batch=1, seq=96, precision="fp16", attention="eager", optimizer="sgd",
         checkpointing=True, dropout="off",
         lora={"rank": 8, "alpha": 16, "targets": ["dense", "dense_4h_to_h"]}),
    dict(id="xc-h47-falcon-mq-s127-fp32-b1-s64-eager", config="rnd-s127-falcon-0", batch=1,
         seq=64, precision="fp32", attention="eager", optimizer="sgd", dropout="off"),
    # helper 50: Falcon's new decoder architecture over 2 key/value groups (`_split_heads`' index
    # copies and the clones over every query head, eager without a cache) and over one group
    # (stride-0 key/value views; checkpointed eager at a batch above one, matmul's value copy)
    dict(id="xc-h50-falcon-8h2kv-ampbf16-b2-s96-eager-ckpt", config="h50-falcon-8h2kv", batch=2,
         seq=96, precision="amp-bf16", attention="eager", optimizer="sgd", checkpointing=True,
         dropout="off"),
    dict(id="xc-h50-falcon-8h1kv-fp32-b3-s64-eager-ckpt", config="h50-falcon-8h1kv", batch=3,
         seq=64, precision="fp32", attention="eager", optimizer="sgd", checkpointing=True,
         dropout="off"),
    dict(id="xc-h50-falcon-8h1kv-fp32-b2-s96-eager-nocache", config="h50-falcon-8h1kv", batch=2,
         seq=96, precision="fp32", attention="eager", optimizer="sgd", use_cache=False,
         dropout="off"),
    dict(id="xc-h50-falcon-8h4kv-bf16-b2-s80-sdpa", config="h50-falcon-8h4kv", batch=2, seq=80,
         precision="bf16", attention="sdpa", optimizer="sgd", dropout="off"),
    # helper 51: one-head MLA (matmul's reshape of the value slice is a view: bmm saves
    # kv_b_proj's output, no copy; the training DynamicCache's latent copies), and a single kv
    # head under autocast with a sliding-window mask (SDPA's cast of repeat_kv's zero-stride view
    # is a full [B, H, S, D] tensor; Gemma's norms save their fp32 `1 + weight`)
    dict(id="xc-h51-dsv3-s197-h1-bf16-b3-s40-eager-sgd", config="rnd-s197-deepseekv3-0", batch=3,
         seq=40, precision="bf16", attention="eager", optimizer="sgd", dropout="off"),
    dict(id="xc-h51-gemma3-s197-ampbf16-b2-s48-sdpa-sgd", config="rnd-s197-gemma3text-0",
         batch=2, seq=48, precision="amp-bf16", attention="sdpa", optimizer="sgd", dropout="off"),
    # helper 53: eager attention with one kv head (repeat_kv a view; matmul's copies of the
    # expanded key and value at each bmm, temporaries in a checkpointed first pass) and the
    # llama-style fp32 softmax under autocast (no fp32 copy of the scores the fp32 mask made
    # fp32): the forward phase's own peak as well as the step's, real = fake
    dict(id="xc-h53-granitehybrid-rnd29-mqa-fp16-b2-s128-ckpt", config="rnd-s29-granitemoehybrid-1",
         batch=2, seq=128, precision="fp16", attention="eager", optimizer="sgd",
         checkpointing=True, dropout="off"),
    dict(id="xc-h53-granite-rnd67-mqa-ampbf16-b2-s160", config="rnd-s67-granite-0", batch=2,
         seq=160, precision="amp-bf16", attention="eager", optimizer="sgd", dropout="off"),
    dict(id="xc-h53-llama-rnd173-mqa-fp32-b2-s96", config="rnd-s173-llama-0", batch=2, seq=96,
         precision="fp32", attention="eager", optimizer="sgd", dropout="off"),
    # ... and Phi's embedding dropout (rebinds inputs_embeds: the lookup freed) and its parallel
    # residual's branches bound through the three-way sum
    dict(id="xc-h53-phi-rnd67-embdrop-bf16-b2-s128-ckpt", config="rnd-s67-phi-0", batch=2,
         seq=128, precision="bf16", attention="eager", optimizer="sgd", checkpointing=True),
    dict(id="xc-h53-phi-rnd53-embdrop-fp32-b2-s96", config="rnd-s53-phi-0", batch=2, seq=96,
         precision="fp32", attention="sdpa", optimizer="sgd"),
    # helper 54: ForCausalLMLoss's int64 labels, padded [B, S+1] and the contiguous shifted
    # target [B, S] that nll_loss saves (one row: the target is a view of the padded labels)
    dict(id="xc-loss-labels-falcon-8h4kv-ampfp16-b4-s512", config="h50-falcon-8h4kv", batch=4,
         seq=512, precision="amp-fp16", optimizer="sgd", dropout="off"),
    dict(id="xc-loss-labels-falcon-8h4kv-ampfp16-b1-s1024-ga2", config="h50-falcon-8h4kv",
         batch=1, seq=1024, precision="amp-fp16", optimizer="sgd", dropout="off", grad_accum=2),
    # ... and, checkpointed, the base model's int64 position ids held by every layer's checkpoint
    dict(id="xc-loss-labels-smollm135m-ampbf16-ckpt-b2-s128", config="smollm-135m", batch=2,
         seq=128, precision="amp-bf16", checkpointing=True, optimizer="sgd", dropout="off"),
]

# cases of the random sample (tools/truth/cases/random_train.toml, drawn by sample_cases.py),
# chosen to cover every option kind: MoE + LoRA + autocast, falcon fp16 checkpointing, gemma3
# sliding windows + lion + accumulation, neox fp32, gemma2 eager LoRA, packed sequences, gpt2
# dropout under autocast, opt, deepseek MLA + LoRA, fused losses, fused AdamW fp16
RANDOM_IDS = [
    "rnd-t17-000-qwen2moe", "rnd-t17-002-falcon", "rnd-t17-004-gemma3text", "rnd-t17-012-gptneox",
    "rnd-t17-014-gemma2", "rnd-t17-019-qwen2", "rnd-t17-029-gpt2", "rnd-t17-030-opt",
    "rnd-t17-044-deepseekv3", "rnd-t17-045-qwen2", "rnd-t17-049-llama", "rnd-t17-059-opt",
    # helper 50: a new-architecture Falcon over 3 groups, checkpointed amp-bf16 LoRA on
    # query_key_value and dense_4h_to_h (the LoRA sum's AddBackward hands one gradient to both)
    "rnd-t157-024-falcon",
]


# cases of the issue-14 sample (tools/truth/cases/random_new_train.toml, seed 29) whose mechanisms
# were fixed from fake-tensor traces: OLMoE clip_qkv (clamp_ saves copies) under autocast, a
# Mamba-2 mixer with frozen parameters (LoRA on in_proj), a Falcon-H1 mixer that needs no
# gradient (LoRA downstream), gpt-oss eager sinks under autocast
RANDOM_NEW_IDS = [
    "rnd-t29-011-olmoe", "rnd-t29-097-mamba2", "rnd-t29-088-falconh1", "rnd-t29-065-gptoss",
    # seed 61: a checkpointed Granite 4.0-H mixer under autocast, whose recomputed 16-bit `G`
    # goes at unpack, before the engine casts its gradient (docs/ssm.md)
    "rnd-t61-016-granitemoehybrid",
    # seed 113: EXAONE 4 with one sliding layer under eager attention, checkpointed, autocast:
    # Exaone4Model builds the full mask as well as the sliding one (the full one unread)
    "rnd-t113-002-exaone4",
]


# inference cases (measure_infer.run_case, generate's prefill and decode): each once on fake and
# once on real CPU tensors. Helper 42: OLMo 2's promoting fp32 rotary, eager GQA's repeat_kv
# copies through the output's contiguous copy, sliding-window caches growing in decode (and
# their int64 window scalars), the base model's int64 position ids
INFER_CASES = [
    dict(id="xc-infer-olmo2-rnd71-b2-p300-bf16-sdpa", config="rnd-s71-olmo2-0", batch=2, prompt=300,
         new_tokens=4, weights="bf16", attention="sdpa"),
    dict(id="xc-infer-olmo2-rnd73-b4-p100-fp16-eager", config="rnd-s73-olmo2-0", batch=4,
         prompt=100, new_tokens=6, weights="fp16", attention="eager"),
    dict(id="xc-infer-qwen3-rnd17-b5-p28-bf16-eager", config="rnd-s17-qwen3-0", batch=5, prompt=28,
         new_tokens=3, weights="bf16", attention="eager"),
    dict(id="xc-infer-gemma3text-rnd17-b2-p20-n30", config="rnd-s17-gemma3text-0", batch=2,
         prompt=20, new_tokens=30, weights="bf16", attention="sdpa"),
    dict(id="xc-infer-starcoder2-rnd17-b3-p16-n50-fp32", config="rnd-s17-starcoder2-0", batch=3,
         prompt=16, new_tokens=50, weights="fp32", attention="sdpa"),
    # helper 46: Mamba-2's one-head no-grad scan (C's and the chunk-level states' `bmm`
    # operands are views), the random sample's rnd-i139-002-mamba2 and the wide-state variant
    dict(id="xc-infer-mamba2-rnd139-b5-p67-fp32", config="rnd-s139-mamba2-0", batch=5, prompt=67,
         new_tokens=9, weights="fp32", attention="eager"),
    dict(id="xc-infer-mamba2-1h-n128-b3-p30-fp32", config="h46-mamba2-1h-n128-l4", batch=3,
         prompt=30, new_tokens=4, weights="fp32", attention="eager"),
    # GPT-NeoX's parallel residual normalises the MLP's input only after the attention returns
    # (rnd-i157-009-gptneox, its peak inside the attention)
    dict(id="xc-infer-gptneox-rnd157-b3-p67-fp16-sdpa", config="rnd-s157-gptneox-0", batch=3,
         prompt=67, new_tokens=5, weights="fp16", attention="sdpa"),
    # helper 50: Falcon's new decoder architecture caches every query head (2 groups; 1 group,
    # whose key and value are stride-0 views until the cache's `cat`)
    dict(id="xc-infer-h50-falcon-8h2kv-b2-p60-n5-fp32-sdpa", config="h50-falcon-8h2kv", batch=2,
         prompt=60, new_tokens=5, weights="fp32", attention="sdpa"),
    dict(id="xc-infer-h50-falcon-8h1kv-b3-p40-n4-bf16-eager", config="h50-falcon-8h1kv", batch=3,
         prompt=40, new_tokens=4, weights="bf16", attention="eager"),
    # helper 52: Qwen 2 MoE's unread sliding mask (window 0 without use_sliding_window), one
    # [1, 1, q, kv] bool SDPA materialises in the prefill and every decode step
    dict(id="xc-infer-qwen2moe-rnd17-b3-p150-bf16-sdpa", config="rnd-s17-qwen2moe-0", batch=3,
         prompt=150, new_tokens=6, weights="bf16", attention="sdpa"),
]


def random_cases() -> list[dict]:
    """The RANDOM_IDS / RANDOM_NEW_IDS cases as specified in random_train.toml /
    random_new_train.toml, ids prefixed with ``xc-``."""
    out = []
    for file, ids in (("random_train.toml", RANDOM_IDS), ("random_new_train.toml", RANDOM_NEW_IDS)):
        by_id = {c["id"]: c for c in measure.load_cases(measure.REPO / "tools/truth/cases" / file)}
        out += [dict(by_id[i], id="xc-" + i) for i in ids]
    return out


def main() -> None:
    only = sys.argv[1] if len(sys.argv) > 1 else None  # optional id substring
    rows = []
    for spec in INFER_CASES:
        if only and only not in spec["id"]:
            continue
        case = dict(measure_infer.DEFAULTS)
        case.update(spec)
        t0 = time.time()
        fake = measure_infer.run_case(case)
        t1 = time.time()
        real = measure_infer.run_case(case, real=True)
        t2 = time.time()
        fm, rm = fake["measured"], real["measured"]
        row = {
            "id": case["id"],
            "kind": "infer",
            "case": {k: case[k] for k in measure_infer.DEFAULTS} | {"config": fake["config"]},
            "fake": {"peak_bytes": fm["peak_bytes"], "at_peak": fm["at_peak"], "phase": fm["phase"],
                     "final_bytes": fm["final_bytes"]},
            "real": {"peak_bytes": rm["peak_bytes"], "at_peak": rm["at_peak"], "phase": rm["phase"],
                     "final_bytes": rm["final_bytes"]},
            "diff_bytes": rm["peak_bytes"] - fm["peak_bytes"],
            "diff_rel": (rm["peak_bytes"] - fm["peak_bytes"]) / fm["peak_bytes"],
            "seconds": {"fake": round(t1 - t0, 1), "real": round(t2 - t1, 1)},
            "versions": fake["versions"],
        }
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("id", "diff_bytes", "diff_rel", "seconds")}), flush=True)
        write(rows)
    for spec in CASES + random_cases():
        if only and only not in spec["id"]:
            continue
        case = dict(measure.DEFAULTS)
        case.update(spec)
        fake_images = bool(case.pop("fake_images", False))
        t0 = time.time()
        fake = measure.run_case(case, fake=True, fake_images=fake_images)
        t1 = time.time()
        real = measure.run_case(case, fake=False, fake_images=fake_images)
        t2 = time.time()
        fm, rm = fake["measured"], real["measured"]
        row = {
            "id": case["id"],
            "case": {k: case[k] for k in measure.DEFAULTS} | {"config": fake["config"]},
            "fake": {"peak_bytes": fm["peak_bytes"], "at_peak": fm["at_peak"], "phase": fm["phase"]},
            "real": {"peak_bytes": rm["peak_bytes"], "at_peak": rm["at_peak"], "phase": rm["phase"]},
            "diff_bytes": rm["peak_bytes"] - fm["peak_bytes"],
            "diff_rel": (rm["peak_bytes"] - fm["peak_bytes"]) / fm["peak_bytes"],
            "seconds": {"fake": round(t1 - t0, 1), "real": round(t2 - t1, 1)},
            "versions": fake["versions"],
        }
        if "forward_peak_bytes" in fm:
            # the forward phase's own peak (measure.py, helper 53), on both
            row["fake"]["forward_peak_bytes"] = fm["forward_peak_bytes"]
            row["real"]["forward_peak_bytes"] = rm["forward_peak_bytes"]
            row["forward_diff_bytes"] = rm["forward_peak_bytes"] - fm["forward_peak_bytes"]
        rows.append(row)
        keys = ("id", "diff_bytes", "diff_rel", "forward_diff_bytes", "seconds")
        print(json.dumps({k: row[k] for k in keys if k in row}), flush=True)
        write(rows)


def write(new_rows: list[dict]) -> None:
    """Merge into crosscheck.jsonl (replace same id), atomically, after every case."""
    rows = {}
    if OUT.exists():
        for line in OUT.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[r["id"]] = r
    for r in new_rows:
        rows[r["id"]] = r
    fd, tmp = tempfile.mkstemp(dir=OUT.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        for k in sorted(rows):
            f.write(json.dumps(rows[k]) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, OUT)


if __name__ == "__main__":
    main()
