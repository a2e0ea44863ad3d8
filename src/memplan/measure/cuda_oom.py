"""torch's CUDA out-of-memory observer for ``memplan measure`` (CUDA only).

The caching allocator calls the observers attached with
``torch._C._cuda_attach_out_of_memory_observer`` just before it raises ``OutOfMemoryError``,
after releasing its lock ("Make sure we do not have the device lock before calling our observers
which might need hold the GIL"), as ``observer(device, alloc_size, set_fraction ?
allowed_memory_maximum : device_total, device_free)`` (``DeviceCachingAllocator::malloc`` in
``c10/cuda/CUDACachingAllocator.cpp``, pytorch/pytorch). The observer takes
``torch.cuda.memory._snapshot()`` then, while the allocator's state is the one that failed, and
the session records its summary (``oom.py``) flushed, so it is in the report even if the process
dies right after. Observers cannot be detached, so one is attached per process and forwards to
the session measuring now.

With tensor tracking on, the session also turns on ``torch.cuda.memory._record_memory_history(
enabled="state", context="state", stacks="python")``: every live block then carries the Python
frames that allocated it, and the allocator keeps one trace entry, the OOM's (``max_entries`` is
1 unless ``enabled="all"``, ``torch/csrc/cuda/memory_snapshot.cpp``). torch documents the cost
as about 2 us per allocation; counters-only sessions leave it off. A history the user turned on
is left as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from .oom import summarize_snapshot

__all__ = ["record_history", "watch_cuda_oom"]

log = logging.getLogger(__name__)

_record: Callable[[dict[str, Any]], None] | None = None
_attached = False


def _observer(device: int, size: int, device_limit: int, device_free: int) -> None:
    """The callback torch calls; ``device_limit`` is the device's total memory, or the cap of
    ``set_per_process_memory_fraction`` when one is set."""
    if _record is None:
        return
    try:
        summary = summarize_snapshot(torch.cuda.memory._snapshot(device), device=device)
    except Exception as e:  # noqa: BLE001 - never raise into the allocator's OOM path
        summary = {"error": f"{type(e).__name__}: {e}"}
    _record({"kind": "oom_snapshot", "device": device, "requested_bytes": size,
             "device_limit_bytes": device_limit, "device_free_bytes": device_free,
             "summary": summary})


def watch_cuda_oom(record: Callable[[dict[str, Any]], None] | None) -> bool:
    """Send the next CUDA OOM's allocator snapshot to ``record`` (None: stop); False when this
    torch has no CUDA allocator to observe."""
    global _record, _attached
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None or not torch.cuda.is_available():
        return False
    if not _attached:
        attach(_observer)
        _attached = True
    _record = record
    return True


def record_history() -> Callable[[], None] | None:
    """Turn on the allocator's per-block stacks (see the module docstring); returns the call
    that turns them off again, or None when nothing was turned on (already on, or this torch
    cannot)."""
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if enabled is None or not torch.cuda.is_available():
        return None
    try:
        if enabled():
            return None
        torch.cuda.memory._record_memory_history(enabled="state", context="state",
                                                 stacks="python")
    except Exception as e:  # noqa: BLE001 - a degraded record, never a failed run
        log.warning("memplan measure: allocator stacks unavailable (%s); an OOM's snapshot "
                    "will not say which line allocated each block", e)
        return None
    return lambda: torch.cuda.memory._record_memory_history(enabled=None)
