"""A tiny Llama trained for tests/test_measure_oom.py that raises a CUDA out-of-memory error
(torch's message, simulated on the CPU) in the forward of step 2. CONFIG (environment): the
config.json it builds the model from, the one `memplan estimate` reads for --against."""

import json
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM

OOM = ("CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 79.10 GiB "
       "of which 10.00 MiB is free. Of the allocated memory 2.00 MiB is allocated by PyTorch, "
       "and 1.00 MiB is reserved by PyTorch but unallocated.")
cfg = json.loads(open(os.environ["CONFIG"]).read())
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
step = 0


def strike(module, args):
    if step == 2:
        raise torch.OutOfMemoryError(OOM)


model.model.layers[1].register_forward_pre_hook(strike)
for step in range(4):
    ids = torch.randint(0, cfg["vocab_size"], (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
