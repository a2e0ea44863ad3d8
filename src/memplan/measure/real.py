"""``measure_recipe``: build a model with a recipe on real tensors and measure two real steps.

The counterpart of ``memplan.trace.trace`` (the same ``memplan.runtime`` builder and tracker,
real memory): what
``validate`` compares the tracer and the estimator with. Meant for small models. On CUDA the
allocator's counters over the same steps are recorded too (``DeviceInfo.allocator``).
"""

from __future__ import annotations

from dataclasses import replace

from ..breakdown import Breakdown
from ..hardware import Device
from ..recipe import Recipe
from ..results import AllocatorCounters

__all__ = ["measure_recipe", "HOW"]

HOW = "measured: live storage bytes of a real step"


def measure_recipe(model: str, recipe: Recipe, device: Device, *, steps: int = 2) -> Breakdown:
    """Really run ``steps`` training steps of ``model`` with ``recipe`` on ``recipe.platform.device``."""
    import torch

    from ..runtime.stepping import measure_step
    from ..runtime.steps import to_breakdown
    from ..runtime.workload import build_model, build_workload

    cuda = recipe.platform.device == "cuda"
    base = 0
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    w = build_workload(build_model(model, recipe, device=recipe.platform.device), recipe)
    measured = measure_step(w.model, w.batch, w.optimizer, autocast_dtype=w.autocast_dtype,
                            loss_fn=w.loss_fn, steps=steps, **w.loop,
                            compile_scope=str(recipe.platform.compile_scope)
                            if recipe.platform.compile else "")
    dev = device.info()
    if cuda:
        # The allocator's own counters over the same steps (block rounding, workspaces and
        # kernel scratch included), next to the tracker's logical bytes.
        stats = torch.cuda.memory_stats()
        free, total = torch.cuda.mem_get_info()
        dev = replace(dev, allocator=AllocatorCounters(
            max_memory_allocated=torch.cuda.max_memory_allocated() - base,
            max_memory_reserved=torch.cuda.max_memory_reserved(),
            active_bytes_peak=int(stats.get("active_bytes.all.peak", 0)),
            device_used=int(total - free)))
    info, notes = w.info, w.notes
    del w
    if cuda:
        torch.cuda.empty_cache()
    return to_breakdown(measured, source="measure", how=HOW, model=info,
                        recipe=recipe.to_dict(), device=dev, notes=notes)
