"""The torch side of memplan, shared by ``trace`` (fake tensors) and ``measure`` (real ones).

- ``tracker``: ``StorageTracker``, live storage bytes at every ATen op, with an event log;
- ``book``: opening and closing a step over the tracker, categorising state, replaying the log;
- ``steps``: ``StepMeasurement`` / ``MomentMeasurement`` and ``to_breakdown`` (no torch);
- ``labels``: module groups and the hooks that label moments and owners;
- ``workload``: a recipe applied to real model code (model, optimizer, batch);
- ``fake``: ``FakeTensorMode`` set up for tracing.

``trace`` and ``measure`` use this package and never import each other. Submodules are imported
on first use, so ``memplan.runtime.steps`` works without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CATEGORIES", "PHASES", "ModuleLabeller", "MomentMeasurement", "StepMeasurement",
           "StorageTracker", "Workload", "build_model", "build_workload", "check_traceable",
           "fake_mode", "materialize", "to_breakdown"]

_WHERE = {"CATEGORIES": "steps", "PHASES": "steps", "MomentMeasurement": "steps",
          "StepMeasurement": "steps", "to_breakdown": "steps", "StorageTracker": "tracker",
          "ModuleLabeller": "labels", "Workload": "workload", "build_model": "workload",
          "build_workload": "workload", "check_traceable": "workload",
          "materialize": "workload", "fake_mode": "fake"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
