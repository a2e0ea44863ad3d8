"""Measure FSDP1's flat gradients on a LoRA model (issue #11 item 1): which units get a
gradient, and how many elements it has, next to the unit's trainable elements.

torchrun, 2 ranks, gloo, CPU (torch 2.13): the tiny Llama of validate/tiny/llama.json with
memplan's LoRA (fp32, so that each unit has one dtype), ``FullyShardedDataParallel`` with
``transformer_auto_wrap_policy`` on ``LlamaDecoderLayer`` (accelerate's
``TRANSFORMER_BASED_WRAP``), ``FULL_SHARD``, ``use_orig_params=True`` (the HF Trainer's
default), one forward and backward. Rank 0 writes ``validation/fsdp1_flat_grad.json``;
``tests/test_fsdp1_flat.py`` compares memplan's estimate with it.

Usage: ``PYTHONPATH=src python -m torch.distributed.run --nproc-per-node=2
scripts/measure_fsdp1_flat_grad.py``
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from memplan.recipe import Recipe
from memplan.runtime.workload import build_model

ROOT = Path(__file__).resolve().parents[1]
RECIPE = {"method": "lora", "precision": "32-true", "micro_batch": 2, "seq_len": 128}


def main() -> None:
    dist.init_process_group("gloo")
    model = build_model(str(ROOT / "src/memplan/validate/tiny/llama.json"),
                        Recipe.from_dict(RECIPE), device="cpu", seed=0).model
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)  # before sharding
    policy = functools.partial(transformer_auto_wrap_policy,
                               transformer_layer_cls={LlamaDecoderLayer})
    m = FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"),
             use_orig_params=True, sharding_strategy=ShardingStrategy.FULL_SHARD)
    ids = torch.randint(0, model.config.vocab_size, (RECIPE["micro_batch"], RECIPE["seq_len"]))
    m(input_ids=ids, labels=ids).loss.backward()
    units = []
    for mod in FSDP.fsdp_modules(m):
        fp = mod._handle.flat_param
        units.append({"module": type(mod.module).__name__,
                      "flat_requires_grad": fp.requires_grad,
                      "unsharded_numel": int(fp._unpadded_unsharded_size.numel()),
                      "shard_numel": fp.numel(),
                      "sharded_grad_numel": None if fp.grad is None else fp.grad.numel(),
                      "grad_dtype": None if fp.grad is None else str(fp.grad.dtype)})
    if dist.get_rank() == 0:
        out = {"torch": torch.__version__, "world_size": dist.get_world_size(),
               "recipe": RECIPE, "wrap": "transformer_auto_wrap_policy(LlamaDecoderLayer)",
               "use_orig_params": True, "sharding_strategy": "FULL_SHARD",
               "trainable_numel": trainable,
               "units": units}
        (ROOT / "validation" / "fsdp1_flat_grad.json").write_text(json.dumps(out, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
