"""Reproducer: MemTracker keeps every micro-step's embedding-output leaf (and its .grad) alive
under peft + non-reentrant gradient checkpointing; plain PyTorch frees it after backward.

    /path/to/truth-venv/bin/python tools/truth/probes/memtracker_leaf_leak.py          # plain: 0 alive
    /path/to/truth-venv/bin/python tools/truth/probes/memtracker_leaf_leak.py --mt     # MemTracker: grows

Real CPU tensors, a 2-layer Llama; needs only the harness venv.  peft's
enable_input_require_grads makes the embedding output a leaf that requires grad; ModTracker
(inside MemTracker) registers multi-grad hooks on module inputs that require grad.  Clearing
that leaf's Python `_backward_hooks` after backward does NOT free it, so the holder is on the
C++ side (not visible to gc.get_referrers).  See tests/truth/known_gaps.toml.
"""
import contextlib
import gc
import sys
import weakref
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import fast_mem_tracker_class  # noqa: E402

cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
model = AutoModelForCausalLM.from_config(cfg)
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
model.train()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
outs: list[weakref.ref] = []
model.get_input_embeddings().register_forward_hook(lambda m, i, o: outs.append(weakref.ref(o)))
ids = torch.randint(0, 1000, (2, 32))
mt = None
if "--mt" in sys.argv:
    mt = fast_mem_tracker_class()()
    mt.track_external(model, opt)
with mt if mt is not None else contextlib.nullcontext():
    for step in range(2):
        for micro in range(4):
            loss = model(input_ids=ids, labels=ids).loss
            (loss / 4).backward()
            del loss
            gc.collect()
            if mt is not None:
                mt.reset_mod_stats()
            alive = sum(r() is not None for r in outs)
            print(f"step {step} micro {micro}: embedding outputs still alive: {alive}")
        opt.step()
        opt.zero_grad(set_to_none=True)
