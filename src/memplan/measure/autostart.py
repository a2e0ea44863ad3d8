"""Start a ``Session`` when a Python process starts, for ``memplan measure -- python train.py``.

``memplan measure`` runs the command with ``MEMPLAN_MEASURE_OUT`` set and this package's
``_boot`` folder first on ``PYTHONPATH``; its ``sitecustomize.py`` calls ``start_from_env``,
which opens a session over every module and optimizer of the process (global hooks) and
streams its records (``stream.py``) until the process ends. Under torchrun every rank is a
process of its own.

How the process ends is recorded where it can be: an uncaught exception (``KeyboardInterrupt``
included) through ``sys.excepthook``; SIGTERM (what schedulers send) by a handler that records
and flushes, then lets the signal's default action end the process as it would have; a normal
exit by ``atexit``. SIGKILL cannot be caught: the parent reads the stream up to its last flush.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from typing import Any

__all__ = ["ENV_OUT", "ENV_INTERVAL", "ENV_NO_TENSORS", "ENV_FLUSH", "ENV_PARENT",
           "start_from_env"]

ENV_OUT = "MEMPLAN_MEASURE_OUT"
"""Directory the child writes its report to (set by ``memplan measure``)."""
ENV_INTERVAL = "MEMPLAN_MEASURE_INTERVAL_S"
"""Sampling interval of RSS and allocator counters, seconds (default 0.01)."""
ENV_NO_TENSORS = "MEMPLAN_MEASURE_NO_TENSORS"
"""Set to 1 to skip live-tensor tracking (allocator counters and RSS only)."""
ENV_FLUSH = "MEMPLAN_MEASURE_FLUSH_S"
"""Longest time between two flushes of the stream, seconds (default ``stream.FLUSH_S``)."""
ENV_PARENT = "MEMPLAN_MEASURE_PARENT"
"""Set by ``memplan measure``: the parent assembles the reports and the aggregate."""


def start_from_env() -> None:
    out = os.environ.get(ENV_OUT)
    if not out:
        return
    from .loop import Session
    from .stream import FLUSH_S

    s = Session(out=out, interval_s=float(os.environ.get(ENV_INTERVAL, "0.01")),
                track_tensors=os.environ.get(ENV_NO_TENSORS, "0") != "1",
                flush_s=float(os.environ.get(ENV_FLUSH, str(FLUSH_S))))
    s.parent_assembles = os.environ.get(ENV_PARENT) == "1"
    s.__enter__()
    pid = os.getpid()
    previous_hook = sys.excepthook

    def on_exception(tp: type[BaseException], exc: BaseException, tb: Any) -> None:
        try:
            s.record_exception(exc)
        finally:
            previous_hook(tp, exc, tb)

    def on_term(signum: int, frame: Any) -> None:
        if os.getpid() == pid:  # not in a forked worker that inherited the handler
            s.record_signal(signum)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def finish() -> None:
        if os.getpid() != pid:
            return
        try:
            s.__exit__(None, None, None)
        except Exception as e:  # noqa: BLE001 - never turn the user's exit into a traceback
            sys.stderr.write(f"memplan measure: could not write the report: {e}\n")

    sys.excepthook = on_exception
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_term)
    atexit.register(finish)
