"""The append-only record of a measured process: one JSON object per line, flushed at a bounded
interval, so a process killed without warning (SIGKILL, the OOM killer) leaves everything up to
its last flush. The report is assembled from this file (``assemble.py``). No torch.

Records (``kind``): ``start`` (rank, world size, pid, model, device), ``sample`` (the periodic
sample plus the phase, moment and step being run), ``phase`` (a phase change, flushed at once),
``step`` (a closed step with its moments,
``memplan.runtime.steps.step_record``), ``tensors`` (the step's tensor timeline), ``exception``
and ``signal`` (how the process is ending, when it can say), ``end`` (closed cleanly, with the
counters). A line cut by a kill is skipped when read.

A write that fails (a full disk: ``ENOSPC``) stops the stream, never the training: the error is
kept, logged once, and reported by whoever assembles the report.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Stream", "read_stream", "stream_path", "FLUSH_S"]

log = logging.getLogger(__name__)

FLUSH_S = 0.5
"""Default longest time between two flushes, seconds: what a SIGKILL can lose at most."""


def stream_path(out: Path, rank: int, pid: int) -> Path:
    """``<out>/memplan-measure.rank<R>.<pid>.jsonl``: one per process (a launcher and its
    workers share a rank number, never a pid)."""
    return out / f"memplan-measure.rank{rank}.{pid}.jsonl"


class Stream:
    """Buffered JSON-lines writer; ``put`` from any thread, ``flush`` writes the buffer out."""

    def __init__(self, path: Path, *, flush_s: float = FLUSH_S):
        self.path, self.flush_s = path, flush_s
        self.error: str | None = None
        """Why writing stopped (e.g. ``[Errno 28] No space left on device``), else None."""
        self._buf: list[str] = []
        self._closed = False
        self._lock = threading.Lock()
        self._last = time.monotonic()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f: Any = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        except OSError as e:
            self._fail(e)

    def put(self, record: dict[str, Any], *, flush: bool = False) -> None:
        """Queue ``record``; flush when asked or when ``flush_s`` has passed."""
        if self.error is not None or self._closed:
            return  # after close: an exit hook recording the end of a session already written
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            self._buf.append(line)
        if flush or time.monotonic() - self._last >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            lines, self._buf = self._buf, []
            self._last = time.monotonic()
            if self.error is not None or self._closed or not lines:
                return
            try:
                self._f.write("".join(lines))
                self._f.flush()  # into the kernel: survives the death of this process
            except OSError as e:
                self._fail(e)

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._closed = True
        if self.error is None:
            try:
                self._f.close()
            except OSError as e:
                self._fail(e)

    def _fail(self, e: OSError) -> None:
        self.error = f"{self.path}: {e.strerror or e}"
        log.warning("memplan measure: streaming stopped (%s); the report keeps what was "
                    "written before", self.error)


def read_stream(path: Path) -> list[dict[str, Any]]:
    """The records of ``path``, skipping a last line cut short by a kill."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out

