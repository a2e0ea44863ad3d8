"""``measure_recipe``: build a model with a recipe on real tensors and measure two real steps.

The counterpart of ``memplan.trace.trace`` (same builder, same tracker, real memory): what
``validate`` compares the tracer and the estimator with. Meant for small models on CPU.
"""

from __future__ import annotations

from ..breakdown import Breakdown
from ..hardware import Device
from ..recipe import Recipe

__all__ = ["measure_recipe", "HOW"]

HOW = "measured: live storage bytes of a real step"


def measure_recipe(model: str, recipe: Recipe, device: Device, *, steps: int = 2) -> Breakdown:
    """Really run ``steps`` training steps of ``model`` with ``recipe`` on ``recipe.device``."""
    from ..trace.workload import build_model, build_workload
    from .live import measure_step
    from .result import to_breakdown

    w = build_workload(build_model(model, recipe, device=recipe.device), recipe)
    measured = measure_step(w.model, w.batch, w.optimizer, autocast_dtype=w.autocast_dtype,
                            loss_fn=w.loss_fn, steps=steps)
    return to_breakdown(measured, source="measure", how=HOW, model=w.info,
                        recipe=recipe.to_dict(), device=device.to_dict(), notes=w.notes)
