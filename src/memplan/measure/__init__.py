"""Measuring real training runs (torch; imported lazily, so ``memplan.measure.aggregate`` and
``memplan.measure.report`` stay usable without it). The storage tracker, module labels and the
workload builder are ``memplan.runtime``'s, shared with ``trace``.

- ``measure_step``: exact live tensor bytes of real training steps, per phase, moment, module
  group and category (``memplan.runtime.stepping``);
- ``session``: the same around a user's own loop, plus CUDA allocator counters, NVML and host
  RSS over time (``loop.py``); ``memplan measure -- python train.py`` starts one in the child
  (``autostart.py``);
- ``measure_recipe``: a recipe applied to a model and run for real (``real.py``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CATEGORIES", "PHASES", "Counters", "MeasureReport", "MomentMeasurement", "Session",
           "StepMeasurement", "measure_recipe", "measure_step", "session"]

_WHERE = {"CATEGORIES": "..runtime.steps", "PHASES": "..runtime.steps",
          "MomentMeasurement": "..runtime.steps", "StepMeasurement": "..runtime.steps",
          "measure_step": "..runtime.stepping", "Session": ".loop", "session": ".loop",
          "measure_recipe": ".real", "Counters": ".report", "MeasureReport": ".report"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
