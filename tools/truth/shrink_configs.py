#!/usr/bin/env python3
"""Small-width configs of the issue-14 families for sweeps (helper 6): each starts from a committed
reduced config and keeps its structure (layer types, sliding / chunked attention, expert routing)
at hidden 64, 4 heads x 16, 8 experts, vocab 1000, so that activations, not weights, dominate a
step and a mechanism that is invisible at real widths shows.  Writes tests/truth/configs/sw6-*.json.
Committed: sw6-qwen3next, sw6-qwen3next-d128 (key/value head width 128), sw6-llama4 and sw6-seedoss; the other
families measured within 1% at these widths (see tools/truth/README.md, "small-width sweep").
"""
import json
D="tests/truth/configs/"
def load(n): return json.load(open(D+n+".json"))
out={}
# Helper 10 (issue 14): GatedDeltaNet training at other linear-attention shapes: sw6-qwen3next with
# hidden 64 to 512, 1 to 4 value heads per key head, key and value head widths that differ.
# `shrink_configs.py --gdn` writes only these (the sw6 lines below rewrite every sw6 config).
GDN = {
    "h10-qwen3next-h64-r1": dict(hidden_size=64, linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16),
    "h10-qwen3next-h128-r3": dict(hidden_size=128, linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=32, linear_value_head_dim=48),
    "h10-qwen3next-h256-r4": dict(hidden_size=256, linear_num_key_heads=1, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=96),
    "h10-qwen3next-h512-r2": dict(hidden_size=512, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64),
    "h23-qwen3next-h128-r1": dict(hidden_size=128, linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32),
}
# Helper 46: Mamba-2 prefill at other one-head and two-head shapes around the random sample's
# rnd-s139-mamba2-0 (one head of 16, state 32, chunks of 16): a state wide against short chunks
# (the chunk-level states' `bmm` peaks) and two heads of 8 (C's `bmm` layout a copy).
# `shrink_configs.py --mamba2` writes only these.
MAMBA2 = {
    "h46-mamba2-1h-n128-l4": dict(state_size=128, chunk_size=4),
    "h46-mamba2-2h": dict(num_heads=2, head_dim=8),
}
# Helper 50: Falcon's new decoder architecture with grouped key/value heads (falcon-40b-2l's
# structure, 128 heads over 8 key/value heads) at small widths: 8 query heads of 32 over 4, 2 or 1
# key/value heads (the 4-group one with biases, Falcon's fp32 biased projections under autocast),
# vocabulary 1000. `shrink_configs.py --falcon-gqa` writes only these.
FALCON_GQA = {
    "h50-falcon-8h4kv": dict(num_kv_heads=4, bias=True),
    "h50-falcon-8h2kv": dict(num_kv_heads=2),
    "h50-falcon-8h1kv": dict(num_kv_heads=1),
}
import sys
if "--falcon-gqa" in sys.argv:
    for name, over in FALCON_GQA.items():
        c = load("falcon-40b-2l")
        c.update(hidden_size=256, num_attention_heads=8, vocab_size=1000)
        c.update(over)
        open(D + name + ".json", "w").write(json.dumps(c, indent=2, sort_keys=True) + "\n")
    sys.exit(0)
# Helper 52: Qwen 2 MoE's sliding-window mask, built on every forward and read by no layer when
# no layer is sliding: with `use_sliding_window` but `max_window_layers=0` its window is the
# config's, so SDPA materialises it only once the keys reach it (64: yes at 256 tokens; 4096: no).
# (Without `use_sliding_window` the window is 0: rnd-s17-qwen2moe-0 itself.)
# `shrink_configs.py --h52` writes only these.
H52 = {
    "h52-qwen2moe-sw64-nolayers": dict(use_sliding_window=True, sliding_window=64, max_window_layers=0),
    "h52-qwen2moe-sw4096-nolayers": dict(use_sliding_window=True, sliding_window=4096, max_window_layers=0),
}
if "--h52" in sys.argv:
    for name, over in H52.items():
        c = load("rnd-s17-qwen2moe-0"); c.update(over)
        open(D + name + ".json", "w").write(json.dumps(c, indent=2, sort_keys=True) + "\n")
    sys.exit(0)
if "--mamba2" in sys.argv:
    for name, over in MAMBA2.items():
        c = load("rnd-s139-mamba2-0"); c.update(over)
        open(D + name + ".json", "w").write(json.dumps(c, indent=2, sort_keys=True) + "\n")
    sys.exit(0)
if "--gdn" in sys.argv:
    for name, over in GDN.items():
        c = load("sw6-qwen3next"); c.update(over)
        json.dump(c, open(D + name + ".json", "w"), indent=1, sort_keys=True)
    sys.exit(0)
def shrink(src, name, **over):
    c=load(src)
    t=c
    base=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=1000)
    for k,v in base.items():
        if k in t or k in ("head_dim",): t[k]=v
    for k in ("moe_intermediate_size","shared_expert_intermediate_size","intermediate_size_mlp"):
        if k in t and t[k]: t[k]=48 if k!="intermediate_size_mlp" else 128
    for k in ("num_local_experts","num_experts","n_routed_experts","moe_num_experts"):
        if k in t and t[k]: t[k]=8
    if "quantization_config" in t: del t["quantization_config"]
    for k in ("pad_token_id","bos_token_id","eos_token_id"):
        if isinstance(t.get(k),int) and t[k]>=1000: t[k]=2
        if isinstance(t.get(k),list): t[k]=[x if x<1000 else 2 for x in t[k]]
    t.update(over)
    out[name]=src
    json.dump(c, open(D+name+".json","w"), indent=1, sort_keys=True)
shrink("gpt-oss-20b-2l","sw6-gptoss", sliding_window=16, num_experts_per_tok=4, experts_per_token=4, layer_types=["sliding_attention","full_attention"])
shrink("llama-4-scout-17b-16e-text-4l","sw6-llama4", attention_chunk_size=16, num_experts_per_tok=1, intermediate_size=48, intermediate_size_mlp=128, interleave_moe_layer_step=2)
shrink("qwen3-next-80b-a3b-4l","sw6-qwen3next", linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, num_experts_per_tok=3, head_dim=16)
shrink("granite-3.1-1b-a400m-4l","sw6-granitemoe", num_experts_per_tok=3)
shrink("olmoe-1b-7b-2l","sw6-olmoe", num_experts_per_tok=3)
shrink("command-r7b-4l","sw6-cohere2", sliding_window=16)
shrink("hunyuan-a13b-2l","sw6-hunyuanmoe")
shrink("ernie-4.5-21b-a3b-2l","sw6-ernie45moe")
shrink("exaone-4.0-32b-4l","sw6-exaone4", sliding_window=16)
shrink("phi-2-4l","sw6-phi")
shrink("glm-4-9b-0414-4l","sw6-glm4")
shrink("smollm3-3b-4l","sw6-smollm3")
shrink("seed-oss-36b-2l","sw6-seedoss")
shrink("granite-moeshared-1b-s1024-4l","sw6-granitemoeshared", num_experts_per_tok=3)
d128 = load("sw6-qwen3next")
d128.update(linear_key_head_dim=128, linear_value_head_dim=128, hidden_size=256)
json.dump(d128, open(D + "sw6-qwen3next-d128.json", "w"), indent=1, sort_keys=True)
print(out)
