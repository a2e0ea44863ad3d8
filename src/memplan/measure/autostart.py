"""Start a ``Session`` when a Python process starts, for ``memplan measure -- python train.py``.

``memplan measure`` runs the command with ``MEMPLAN_MEASURE_OUT`` set and this package's
``_boot`` folder first on ``PYTHONPATH``; its ``sitecustomize.py`` calls ``start_from_env``,
which opens a session over every module and optimizer of the process (global hooks) and
writes the report at exit. Under torchrun every rank is a process of its own: each writes
``memplan-measure.rank<R>.json`` and rank 0 the aggregate.
"""

from __future__ import annotations

import atexit
import os
import sys

__all__ = ["ENV_OUT", "ENV_INTERVAL", "start_from_env"]

ENV_OUT = "MEMPLAN_MEASURE_OUT"
"""Directory the child writes its report to (set by ``memplan measure``)."""
ENV_INTERVAL = "MEMPLAN_MEASURE_INTERVAL_S"
"""Sampling interval of RSS and allocator counters, seconds (default 0.01)."""
ENV_NO_TENSORS = "MEMPLAN_MEASURE_NO_TENSORS"
"""Set to 1 to skip live-tensor tracking (allocator counters and RSS only)."""


def start_from_env() -> None:
    out = os.environ.get(ENV_OUT)
    if not out:
        return
    from .loop import Session

    s = Session(out=out, interval_s=float(os.environ.get(ENV_INTERVAL, "0.01")),
                track_tensors=os.environ.get(ENV_NO_TENSORS, "0") != "1")
    s.__enter__()

    def finish() -> None:
        try:
            s.__exit__(None, None, None)
        except Exception as e:  # noqa: BLE001 - never turn the user's exit into a traceback
            sys.stderr.write(f"memplan measure: could not write the report: {e}\n")

    atexit.register(finish)
