"""A CUDA out-of-memory set beside what the allocator and memplan's estimate say (issue #18
item 4).

- ``summarize_snapshot``: the caching allocator's state at the OOM, from
  ``torch.cuda.memory._snapshot()`` (its documented ``Snapshot`` dict: ``segments`` with their
  ``blocks``; ``device_traces`` when ``_record_memory_history`` was on), reduced to what
  explains an OOM: reserved vs allocated, the largest free block (a request larger than it
  but smaller than the free total is fragmentation) and the largest live blocks with the frame
  that allocated them when frames were recorded.
- ``beside_estimate``: the estimate's moment that matches the one the run died in (the
  measured group ``model.layers.3`` is the estimate's ``layer 3``), with the bytes memplan
  expected there against the bytes PyTorch held plus the request that failed.

Pure Python: the torch side (the OOM observer that takes the snapshot) is in ``loop.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..breakdown import Breakdown, Moment
from ..units import fmt_bytes
from .ending import RunEnd

__all__ = ["OomBeside", "beside_estimate", "estimate_label", "summarize_snapshot"]

TOP_BLOCKS = 5
"""Live blocks listed in the snapshot summary, largest first."""


_OWN = str(Path(__file__).resolve().parents[1])
"""memplan's own source: its tensor tracker sits in the stack of every op it watches."""


def _frame(block: dict[str, Any]) -> str | None:
    """The innermost frame outside torch and memplan that allocated ``block`` (frames are
    recorded only under ``_record_memory_history``; innermost first)."""
    frames = block.get("frames") or []
    for f in frames:
        name = str(f.get("filename", ""))
        if "/torch/" not in name and not name.startswith(_OWN):
            return f"{name}:{f.get('line')} {f.get('name')}"
    return f"{frames[0].get('filename')}:{frames[0].get('line')}" if frames else None


def summarize_snapshot(snap: dict[str, Any], device: int | None = None) -> dict[str, Any]:
    """The allocator state that explains an OOM, from torch's ``Snapshot`` (all devices; each
    segment names its ``device``, ``torch/csrc/cuda/memory_snapshot.cpp``): the segments of
    ``device`` only when it is given. Fragmentation is what the cache holds unallocated
    (reserved - allocated); a request larger than the largest free block but no larger than
    that total failed for fragmentation alone."""
    segments = [s for s in snap.get("segments") or []
                if device is None or s.get("device", device) == device]
    blocks = [b for s in segments for b in s.get("blocks") or []]
    live = sorted((b for b in blocks if b.get("state") == "active_allocated"),
                  key=lambda b: -int(b.get("size", 0)))
    free = [int(b.get("size", 0)) for b in blocks if b.get("state") == "inactive"]
    reserved = sum(int(s.get("total_size", 0)) for s in segments)
    allocated = sum(int(s.get("allocated_size", 0)) for s in segments)
    traces = snap.get("device_traces") or []
    if device is not None:  # one list per device, indexed by device
        traces = traces[device:device + 1]
    oom = next((e for e in reversed([e for dev in traces for e in dev])
                if e.get("action") == "oom"), None)
    settings = snap.get("allocator_settings") or {}
    return {
        "segments": len(segments),
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "reserved_unallocated_bytes": reserved - allocated,
        "free_blocks": len(free),
        "largest_free_block_bytes": max(free, default=0),
        "largest_live_blocks": [{"bytes": int(b.get("size", 0)), "allocated_by": _frame(b)}
                                for b in live[:TOP_BLOCKS]],
        "expandable_segments": settings.get("expandable_segments"),
        "oom_trace": ({"requested_bytes": oom.get("size"), "device_free_bytes":
                       oom.get("device_free")} if oom else None),
    }


_LAYER = re.compile(r"\.(\d+)$")


def estimate_label(measured: str) -> str | None:
    """The estimate's moment label for a measured one (``runtime/labels.py`` groups):
    ``forward: model.layers.3`` -> ``forward: layer 3``; the embedding, the final norm and
    head, and model code outside every group (the loss) map to ``embedding``, ``head`` and
    ``loss``; a recompute inside the backward is the layer's backward moment."""
    if ": " not in measured:
        return measured if measured in ("optimizer-step", "forward", "backward") else None
    phase, group = measured.split(": ", 1)
    group = group.removesuffix(" (recompute)")
    if (m := _LAYER.search(group)) is not None:
        return f"{phase}: layer {m.group(1)}"
    if group == "(model)":
        return f"{phase}: loss"
    if "embed" in group or group.endswith(("wte", "wpe")):
        return f"{phase}: embedding"
    if "lm_head" in group or "norm" in group or group.endswith(("ln_f", "embed_out")):
        return f"{phase}: head"
    if group == "(optimizer)":
        return "optimizer-step"
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class OomBeside:
    """An OOM and memplan's estimate of the same moment."""

    measured_label: str
    estimate_label: str
    step: str
    estimated_bytes: int
    """Allocated bytes memplan expected at that moment."""
    held_bytes: int
    """Bytes PyTorch held when the request failed (the OOM message, else the counters)."""
    requested_bytes: int
    estimate_peak_bytes: int

    @property
    def needed_bytes(self) -> int:
        return self.held_bytes + self.requested_bytes

    @property
    def error_pct(self) -> float:
        """The estimate against what the run needed there (negative: memplan was low)."""
        return (self.estimated_bytes - self.needed_bytes) / self.needed_bytes * 100

    def sentence(self) -> str:
        side = "low" if self.error_pct < 0 else "high"
        return (f"at the OOM ({self.measured_label}, {self.step} step) memplan estimated "
                f"{fmt_bytes(self.estimated_bytes)} allocated ({self.estimate_label}); PyTorch "
                f"held {fmt_bytes(self.held_bytes)} and asked for "
                f"{fmt_bytes(self.requested_bytes)} more: the estimate is "
                f"{abs(self.error_pct):.1f}% {side} there (its peak: "
                f"{fmt_bytes(self.estimate_peak_bytes)})")

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        return {**d, "needed_bytes": self.needed_bytes, "error_pct": self.error_pct}


def _moment(estimate: Breakdown, step: str, label: str) -> Moment | None:
    return next((m for m in estimate.worst.moments
                 if str(m.step) == step and m.label == label), None)


def _phase_peak(estimate: Breakdown, step: str, phase: str) -> Moment | None:
    within = [m for m in estimate.worst.moments if str(m.step) == step and str(m.phase) == phase]
    return max(within, key=lambda m: m.allocated_bytes, default=None)


def beside_estimate(end: RunEnd, estimate: Breakdown) -> OomBeside | None:
    """The estimate at the moment ``end``'s CUDA OOM happened (the same layer and phase when the
    measurement knows the module, else the estimate's peak of that phase); None when the run
    did not end in a CUDA OOM, or its moment has no counterpart in the estimate."""
    oom = end.cuda_oom
    if oom is None or not end.last_moment or end.last_step is None:
        return None
    label = estimate_label(end.last_moment)
    if label is None:
        return None
    step = "first" if int(end.last_step) == 0 else "steady"
    if ": " in label or label == "optimizer-step":
        m = _moment(estimate, step, label) or _moment(estimate, "steady", label)
    else:  # only the phase is known (``memplan measure -- CMD`` has no module names)
        m = _phase_peak(estimate, step, label) or _phase_peak(estimate, "steady", label)
    if m is None:
        return None
    if ": " not in label:
        label = f"{label} peak, {m.label}"
    held = oom.allocated_bytes or (oom.allocator or {}).get("memory_allocated") or 0
    return OomBeside(measured_label=end.last_moment, estimate_label=label, step=str(m.step),
                     estimated_bytes=m.allocated_bytes, held_bytes=int(held),
                     requested_bytes=int(oom.requested_bytes or 0),
                     estimate_peak_bytes=estimate.worst.peak_allocated_bytes)
