"""Reproducer: MemTracker keeps every micro-step's embedding-output leaf (and its .grad) alive
under peft + non-reentrant gradient checkpointing; plain PyTorch frees it after backward.

    $PY tools/truth/probes/memtracker_leaf_leak.py                    # plain PyTorch: 0 alive
    $PY tools/truth/probes/memtracker_leaf_leak.py --mt --unpatched   # MemTracker as shipped: grows
    $PY tools/truth/probes/memtracker_leaf_leak.py --mt               # with measure.py's patch: 0

Real CPU tensors, a 2-layer Llama; needs only the harness venv.  peft's
enable_input_require_grads makes the embedding output a leaf that requires grad; ModTracker
(inside MemTracker) registers torch.autograd.graph.register_multi_grad_hook on module inputs,
whose closure keeps the grad_fns it is attached to (a cycle through C++, invisible to gc); with a
frozen base the kept chain of nodes ends at the leaf's AccumulateGrad, which holds the leaf.
measure.patch_mod_tracker_leaf_leak() fixes it; see its docstring.
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
import torch.distributed._tools.mod_tracker as mod_tracker  # noqa: E402
from measure import fast_mem_tracker_class  # noqa: E402

if "--unpatched" in sys.argv:
    mod_tracker._memwall_leaf_patch = True  # makes measure's patch a no-op

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
