"""What the distributed harness (``dist_worker``) does to DeepSpeed so that it runs on gloo/CPU as
it runs on a GPU, each change recorded in the case's ``overrides``: the CPU shared-memory op left
unbuilt, ``FP16_Optimizer`` at ZeRO-0 with a 16-bit config, and a PEFT base partitioned as
``zero.Init`` leaves it under ZeRO-3."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["FUSED_OVERRIDE", "SHM_OVERRIDE", "fp16_optimizer_on_cpu", "skip_shm_op",
           "zero0_16bit", "zero_init_base"]

SHM_OVERRIDE = ("deepspeed.comm.torch.build_shm_op -> None (its op serves only "
                 "inference_all_reduce; training collectives go through gloo)")


def skip_shm_op() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU ``deepspeed_shm_comm`` op at ``init_distributed``.

    DeepSpeed 0.19.8 ``comm/torch.py``: ``TorchBackend.__init__`` calls ``build_shm_op()`` on the
    CPU accelerator, a C++ build of about a minute of both cores here on the first launch of each
    fresh environment, and the op is read only by ``inference_all_reduce``. ``all_reduce``,
    ``all_gather``, ``reduce_scatter`` (what ZeRO's training step calls) go to
    ``torch.distributed`` on gloo either way, and the op's buffers are shared memory, not tensors,
    so the tensor bytes measured here do not depend on it. On a GPU the accelerator is CUDA and
    the op is never built."""
    # importlib, not ``import deepspeed.comm.torch as m``: that binds ``deepspeed.comm``'s
    # attribute ``torch``, which is the torch package.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def zero_init_base(model: Any, cfg: dict[str, Any], zero3_init: bool = True) -> None:
    """ZeRO-3 with a frozen base (a PEFT method): leave the model as transformers and PEFT
    leave it before ``deepspeed.initialize``. ``from_pretrained`` builds the base under
    ``deepspeed.zero.Init`` whenever ZeRO-3 is configured (transformers ``modeling_utils.py``
    ``is_deepspeed_zero3_enabled``), partitioned in the config's 16-bit dtype; PEFT then adds
    its fp32 adapters outside that context, and the engine, seeing a ``zero.Init`` model,
    partitions them without its 16-bit cast (``engine.py`` ``_configure_distributed_model``,
    ``is_zero_init_model``). Here: the frozen tensors cast to the config's dtype, then every
    parameter partitioned by ``zero.Init(module=...)``, which converts without a cast
    (``partition_parameters.py`` ``_convert_to_zero_parameters``, 0.19.8). ``zero3_init``
    false (the recipe's ``Engine.zero3_init``): a script of its own, the model handed to
    ``deepspeed.initialize`` as built."""
    import deepspeed

    half = (torch.bfloat16 if cfg.get("bf16", {}).get("enabled")
            else torch.float16 if cfg.get("fp16", {}).get("enabled") else None)
    params = list(model.parameters())
    if cfg.get("zero_optimization", {}).get("stage") != 3 or half is None or not zero3_init \
            or all(p.requires_grad for p in params):
        return
    for p in params:
        if not p.requires_grad and p.is_floating_point():
            p.data = p.data.to(half)
    deepspeed.zero.Init(module=model, config_dict_or_path=cfg)


FUSED_OVERRIDE = ("deepspeed.runtime.engine.FusedAdam -> torch.optim.AdamW while the engine is "
                  "built, and optimizer.params.fused = true (ZeRO-0, 16-bit): the engine wraps "
                  "torch's fused AdamW in FP16_Optimizer, as it wraps the FusedAdam a GPU run "
                  "builds")


def zero0_16bit(cfg: dict[str, Any]) -> bool:
    return int(cfg.get("zero_optimization", {}).get("stage", 0)) == 0 and bool(
        cfg.get("bf16", {}).get("enabled") or cfg.get("fp16", {}).get("enabled"))


@contextlib.contextmanager
def fp16_optimizer_on_cpu(cfg: dict[str, Any]) -> Iterator[None]:
    """At ZeRO-0 with a 16-bit config DeepSpeed 0.19.8 picks ``FP16_Optimizer`` when the basic
    optimizer is its ``FusedAdam`` (what ``optimizer.type`` AdamW builds on a GPU) and
    ``FP16_UnfusedOptimizer`` otherwise (``engine.py`` ``_configure_fp16_optimizer``:
    ``isinstance(optimizer, fused_opts)``, ``fused_opts = FusedAdam``). FusedAdam has no CPU
    build here (``torch_adam``), so the engine's name ``FusedAdam`` is pointed at
    ``torch.optim.AdamW`` while it is built: the run then holds what a GPU run holds
    (``FP16_Optimizer``'s flat 16-bit and fp32 groups). The AdamW is torch's fused one
    (``fused=True``, a CPU kernel since torch 2.4), which, like FusedAdam, updates in place:
    torch's default single-tensor path allocates two temporaries of the flat fp32 master
    (``sqrt(exp_avg_sq)``, then ``/ bias_correction2_sqrt``), measured at 8 B per trainable
    element above a GPU run's step (the full fine-tuning case: -5.3 % per rank without it)."""
    if not zero0_16bit(cfg):
        yield
        return
    cfg.setdefault("optimizer", {}).setdefault("params", {})["fused"] = True
    mod = importlib.import_module("deepspeed.runtime.engine")
    orig = mod.FusedAdam
    mod.FusedAdam = torch.optim.AdamW
    try:
        yield
    finally:
        mod.FusedAdam = orig
