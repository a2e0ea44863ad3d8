"""How much of the data-parallel communication the step waits for, per engine.

Input: the step's DP / ZeRO / FSDP collectives on one rank, split into parameter all-gathers
(``gather_s``) and gradient reductions (``reduce_s``). Output: the part that can hide behind the
forward/backward (``hidden``; only its excess over the compute is exposed, ``step.py``) and the
part the step waits for in full (``serial``). The rules, from each engine's own source:

- **DDP** (``ddp``, torchtitan with zero 0): gradients are all-reduced in buckets while the
  backward runs (``torch/nn/parallel/distributed.py``: ``Reducer`` hooks; Li et al. 2020,
  "PyTorch Distributed", VLDB 13(12) §3.2.3); the last bucket (25 MiB, ``bucket_cap_mb``'s
  default) starts only when the backward ends: serial.
- **FSDP2 / FSDP1 / torchtitan** (zero 2/3): each unit's all-gather is prefetched during the
  previous unit's compute and each reduce-scatter runs while the next unit's backward computes
  (``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``: forward / backward prefetch;
  ``_fsdp_param_group.py``: all-gather and reduce-scatter streams). The first unit's gathers and
  the last unit's reduce-scatter have nothing to hide behind: one unit's share (units = layers
  of the rank + 1 root unit) is serial.
- **DeepSpeed**: ZeRO-3 prefetches parameters (``stage3_prefetch_bucket_size``, one unit's
  share serial as for FSDP); gradient reduction overlaps the backward only with
  ``overlap_comm`` (``deepspeed/runtime/zero/config.py``: default true for stage 3, false for 1
  and 2; the recipe's ``overlap_comm`` decides), else it is serial; ZeRO-1/2 all-gather the
  updated parameters after the optimizer step: serial.
- **Megatron-Core**: gradient reduction overlaps the backward only with
  ``--overlap-grad-reduce`` (the recipe's ``overlap_comm``; ``DistributedDataParallelConfig``
  defaults ``overlap_grad_reduce = False`` and ``overlap_param_gather = False``,
  ``megatron/core/distributed/distributed_data_parallel_config.py``); the distributed
  optimizer's parameter all-gather follows the step: serial.

**Known limitations**: collectives that run beside compute also slow it (NCCL kernels occupy
SMs and HBM bandwidth); that contention is not modelled (no sourced figure yet).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..facts.constants import constant
from ..recipe import Recipe

__all__ = ["DpOverlap", "dp_overlap"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DpOverlap:
    """DP communication seconds per step, split by whether compute can hide them."""

    hidden: float
    """Overlapped with the forward/backward: only its excess over the compute is exposed."""
    serial: float
    """On the critical path: the step waits for all of it."""
    rule: str
    """The engine's rule, in words."""


def dp_overlap(recipe: Recipe, *, gather_s: float, reduce_s: float, grad_bytes: float,
               layers: float) -> DpOverlap:
    """Split ``gather_s + reduce_s`` by the engine's overlap rule (module docstring).
    ``grad_bytes``: gradient bytes one rank reduces per step (for DDP's last bucket);
    ``layers``: transformer layers on the rank (FSDP units)."""
    engine = str(recipe.engine_kind)
    zero = recipe.parallelism.zero
    overlap = recipe.engine.overlap_comm
    units = layers + 1
    if engine in ("fsdp1", "fsdp2", "torchtitan") and zero >= 2:
        tail = (gather_s + reduce_s) / units
        return DpOverlap(hidden=gather_s + reduce_s - tail, serial=tail,
                         rule="FSDP prefetch: gathers and reduce-scatters behind the next "
                              "unit's compute, one unit's share serial")
    if engine in ("ddp", "fsdp1", "torchtitan") or (engine == "deepspeed" and zero == 0):
        last = min(1.0, constant("ddp_bucket_bytes") / grad_bytes) if grad_bytes else 1.0
        return DpOverlap(hidden=(gather_s + reduce_s) * (1 - last),
                         serial=(gather_s + reduce_s) * last,
                         rule="DDP buckets: all-reduce behind the backward, last bucket serial")
    if engine == "deepspeed" and zero == 3:
        tail = gather_s / units
        red_hidden, red_serial = (reduce_s, 0.0) if overlap else (0.0, reduce_s)
        return DpOverlap(hidden=gather_s - tail + red_hidden, serial=tail + red_serial,
                         rule="ZeRO-3 prefetch (one unit serial); reduce-scatter "
                              + ("overlapped (overlap_comm)" if overlap else
                                 "serial (overlap_comm false)"))
    # DeepSpeed ZeRO-1/2, Megatron-Core: reduction by overlap_comm, parameter gather serial
    red_hidden, red_serial = (reduce_s, 0.0) if overlap else (0.0, reduce_s)
    name = "--overlap-grad-reduce" if engine == "megatron" else "overlap_comm"
    return DpOverlap(hidden=red_hidden, serial=red_serial + gather_s,
                     rule=f"gradient reduction {'overlapped' if overlap else 'serial'} ({name} "
                          f"{str(overlap).lower()}), parameter all-gather after the step serial")
