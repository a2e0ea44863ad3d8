"""torch's CUDA out-of-memory observer for ``memplan measure`` (CUDA only).

The caching allocator calls the observers attached with
``torch._C._cuda_attach_out_of_memory_observer`` just before it raises ``OutOfMemoryError``
(``c10/cuda/CUDACachingAllocator.cpp``: ``observer(device, size, device_total_allocated,
device_free)``). The observer takes ``torch.cuda.memory._snapshot()`` then, while the
allocator's state is the one that failed, and the session records its summary (``oom.py``)
flushed, so it is in the report even if the process dies right after. Observers cannot be
detached, so one is attached per process and forwards to the session measuring now.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .oom import summarize_snapshot

__all__ = ["watch_cuda_oom"]

_record: Callable[[dict[str, Any]], None] | None = None
_attached = False


def _observer(device: int, size: int, device_allocated: int, device_free: int) -> None:
    if _record is None:
        return
    try:
        summary = summarize_snapshot(torch.cuda.memory._snapshot(device))
    except Exception as e:  # noqa: BLE001 - never raise into the allocator's OOM path
        summary = {"error": f"{type(e).__name__}: {e}"}
    _record({"kind": "oom_snapshot", "device": device, "requested_bytes": size,
             "device_allocated_bytes": device_allocated, "device_free_bytes": device_free,
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
