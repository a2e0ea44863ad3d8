"""DeepSpeed ZeRO buffers that follow from the model's size and the ds_config, beyond the model
states themselves (issue #11 item 5: found live at the measured peak of ``memplan validate
--nproc N``, validation/dist_nproc{2,4}.json).

Source: DeepSpeed 0.19.8 (pinned in the `engines` extra of pyproject.toml),
``deepspeed/runtime/zero/stage_1_and_2.py`` (ZeRO-1/2) and ``deepspeed/runtime/zero/stage3.py``
(ZeRO-3). Each size is a pure function of the partition size, the largest parameter and the
dtype; no constant is fitted.
"""

from __future__ import annotations

import math

from ..breakdown import ALL_PHASES, Category, Item, Pool
from ..facts import Dtypes
from ..recipe import Recipe
from ..units import dtype_bytes
from .layout import Held
from .lines import Line

__all__ = ["deepspeed_buffer_lines", "offload_bit16_param_buffer_bytes",
           "offload_temp_grad_buffer_bytes", "zero3_grad_partition_bytes"]


def zero3_grad_partition_bytes(partition_numel: int, grad_accum_bytes: float) -> int:
    """ZeRO-3's flat gradient partition: one buffer of this rank's partition of every trainable
    parameter, in the gradient-accumulation dtype, allocated at init and kept for the run.

    ``grad_partitions_flat_buffer = torch.zeros(sum(p.partition_numel() for p in all_params),
    dtype=self.gradient_accumulation_dtype, device=self.device)``
    (stage3.py ``DeepSpeedZeroOptimizer_Stage3._setup_for_real_optimizer``); each parameter's
    reduced gradient partition is a ``narrow`` of it (``__param_id_to_grad_partition``).
    ``self.device`` is the host under ``offload_optimizer`` (pinned with ``pin_memory``).
    """
    return math.ceil(partition_numel * grad_accum_bytes)


def offload_bit16_param_buffer_bytes(partition_numel: int, param_bytes: float) -> int:
    """ZeRO-1/2 with ``offload_optimizer``: a host copy of this rank's 16-bit parameter partition,
    the staging buffer for the updated weights.

    ``temp_buffer_bit16 = torch.full(weights_partition.shape, fill_value=0.0, dtype=temp_dtype,
    device=weights_partition.device)`` appended to ``param_buffer_of_bit16_for_cpu_offload_groups``
    (stage_1_and_2.py ``DeepSpeedZeroOptimizer.__init__``); ``weights_partition`` is on the host.
    """
    return math.ceil(partition_numel * param_bytes)


def offload_temp_grad_buffer_bytes(largest_param_numel: int, grad_bytes: float) -> int:
    """ZeRO-1/2 with ``offload_optimizer``: one 16-bit buffer the size of the largest parameter,
    made twice, once on the host (``temp_grad_buffer_for_cpu_offload``) and once on the GPU
    (``temp_grad_buffer_for_gpu_offload``), through which gradients are copied to the host.

    ``torch.zeros(largest_param_numel, device=..., dtype=self.dtype)`` (stage_1_and_2.py
    ``DeepSpeedZeroOptimizer.__init__``, ``if self.cpu_offload:``); returns the bytes of one.
    """
    return math.ceil(largest_param_numel * grad_bytes)


def deepspeed_buffer_lines(recipe: Recipe, dt: Dtypes, trainable: list[Held],
                           partition_numel: int) -> list[Line]:
    """The lines of the buffers above for one rank of a DeepSpeed recipe (none for other
    engines); ``partition_numel``: this rank's share of the trainable elements."""
    z, off = recipe.parallelism.zero, str(recipe.offload.kind)
    if recipe.engine_kind != "deepspeed" or not trainable or z == 0:
        return []
    # offload_optimizer makes ``self.device`` the host, for device: nvme too (stage3.py
    # __init__: "... if not self.offload_optimizer else OffloadDeviceEnum.cpu")
    host = Pool.HOST
    gb, pb = dtype_bytes(dt.grad), dtype_bytes(dt.param)
    out = []
    if z == 3:
        out.append(Line(Item(
            category=Category.GRADIENTS, name=f"ZeRO-3 gradient partition ({dt.grad}, flat)",
            bytes=zero3_grad_partition_bytes(partition_numel, gb),
            pool=Pool.ALLOCATED if off == "none" else host,
            formula=f"trainable elements / {recipe.parallelism.shard_degree} x {gb:g} B, "
            "allocated at init and kept (DeepSpeed stage3.py _setup_for_real_optimizer: "
            "grad_partitions_flat_buffer" + ("" if off == "none" else ", on the host under "
                                             "offload_optimizer") + ")"), ALL_PHASES))
    elif off != "none":
        largest = max(h.numel for h in trainable)
        out.append(Line(Item(
            category=Category.COMMUNICATION, name=f"offload 16-bit parameter buffer ({dt.param})",
            bytes=offload_bit16_param_buffer_bytes(partition_numel, pb), pool=host,
            formula=f"trainable elements / {recipe.parallelism.shard_degree} x {pb:g} B on the "
            "host (DeepSpeed stage_1_and_2.py: param_buffer_of_bit16_for_cpu_offload_groups)"),
            ALL_PHASES))
        one = offload_temp_grad_buffer_bytes(largest, gb)
        for where, pool in (("cpu", host), ("gpu", Pool.ALLOCATED)):
            out.append(Line(Item(
                category=Category.COMMUNICATION,
                name=f"offload gradient staging buffer ({where})", bytes=one, pool=pool,
                formula=f"largest parameter, {largest:,} elements x {gb:g} B (DeepSpeed "
                f"stage_1_and_2.py: temp_grad_buffer_for_{where}_offload)"), ALL_PHASES))
    return out
