"""``MeasureReport``: what ``memplan measure`` and ``session`` write, as a typed object.

One rank's report is the ``Breakdown`` of its steps plus the host/allocator ``Counters`` and the
timeline samples; under torchrun rank 0 also writes an aggregate (every rank's roles, the
counters per rank, and the ranks whose report is missing). ``to_dict``/``from_dict`` give the
JSON schema: the ``Breakdown``'s keys on top, so every reader of estimates reads a measurement.
No torch needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..breakdown import Breakdown
from ..results import AllocatorCounters
from .ending import RunEnd

__all__ = ["Counters", "MeasureReport"]

@dataclass(frozen=True, kw_only=True, slots=True)
class Counters:
    """Process-wide counters over a measured run (one rank)."""

    peak_rss_bytes: int
    """Highest resident set size of the process among the samples."""
    seconds: float
    """Wall time of the session."""
    steps: int
    """Training steps tracked (0 with tensor tracking off)."""
    allocator: AllocatorCounters | None = None
    """The CUDA caching allocator's peaks over the session (CUDA only)."""
    nvml_peak_used_bytes: int | None = None
    """Highest device memory in use seen by NVML (CUDA with pynvml only)."""
    peak_pinned_bytes: int | None = None
    """Highest pinned host memory of the caching host allocator (CUDA only)."""

    def to_dict(self) -> dict[str, Any]:
        """One flat JSON object; the CUDA keys only on CUDA."""
        out: dict[str, Any] = {"peak_rss_bytes": self.peak_rss_bytes, "seconds": self.seconds,
                               "steps": self.steps}
        if self.allocator is not None:
            out.update(self.allocator.to_dict(), nvml_peak_used_bytes=self.nvml_peak_used_bytes,
                       peak_pinned_bytes=self.peak_pinned_bytes)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Counters:
        return cls(peak_rss_bytes=int(d.get("peak_rss_bytes", 0)),
                   seconds=float(d.get("seconds", 0.0)), steps=int(d.get("steps", 0)),
                   allocator=(AllocatorCounters.from_dict(d) if "max_memory_allocated" in d
                              else None),
                   nvml_peak_used_bytes=d.get("nvml_peak_used_bytes"),
                   peak_pinned_bytes=d.get("peak_pinned_bytes"))


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasureReport:
    """One rank's measured run, or (``aggregate``) every rank's of a torchrun job."""

    breakdown: Breakdown
    """The measurement in the estimator's result type (all ranks' roles for an aggregate)."""
    rank: int = 0
    """This process's ``RANK`` (0 for an aggregate)."""
    world_size: int = 1
    """``WORLD_SIZE`` of the job."""
    counters: Counters | None = None
    """This rank's counters; None for an aggregate (see ``rank_counters``)."""
    samples: tuple[dict[str, float], ...] = ()
    """Periodic samples: ``t`` (s), ``rss_bytes``, and when known ``live_tensor_bytes``,
    ``cuda_allocated_bytes``, ``cuda_reserved_bytes``, ``nvml_used_bytes``, ``pinned_bytes``."""
    tensors: tuple[dict[str, float], ...] = ()
    """Tensor timeline: ``t`` (s) and bytes per category, the highest point of each bucket."""
    aggregate: bool = False
    """True for rank 0's job-wide report."""
    ranks_missing: tuple[int, ...] = ()
    """Ranks whose report was not found (aggregate only)."""
    rank_counters: dict[int, Counters] = field(default_factory=dict)
    """Counters per rank (aggregate only)."""
    end: RunEnd | None = None
    """How the process ended (assembled by the parent, or at a clean exit); None when not
    known."""
    rank_ends: dict[int, RunEnd] = field(default_factory=dict)
    """How each rank ended (aggregate only)."""
    loop: dict[str, Any] = field(default_factory=dict)
    """The training loop seen (``measure.loop_seen``: outputs, zero_grad, set_to_none,
    forwards_per_step, optimizer); empty when the session did not close."""

    @property
    def endings(self) -> dict[int, RunEnd]:
        """How each rank ended, where known (one entry for a single rank's report)."""
        if self.aggregate:
            return dict(self.rank_ends)
        return {self.rank: self.end} if self.end is not None else {}

    @property
    def ranks_failed(self) -> tuple[int, ...]:
        """Ranks that did not complete (aggregate only)."""
        return tuple(r for r, e in sorted(self.rank_ends.items()) if e.how != "completed")

    @property
    def peak_rss_bytes(self) -> int:
        """Highest RSS of any rank's process."""
        cs = [self.counters] if self.counters else list(self.rank_counters.values())
        return max((c.peak_rss_bytes for c in cs), default=0)

    def to_dict(self) -> dict[str, Any]:
        out = self.breakdown.to_dict()
        if self.aggregate:
            out.update(world_size=self.world_size, ranks_missing=list(self.ranks_missing),
                       ranks_failed=list(self.ranks_failed),
                       counters={f"rank{r}": c.to_dict() for r, c in self.rank_counters.items()},
                       ends={f"rank{r}": e.to_dict() for r, e in self.rank_ends.items()})
            return out
        out.update(rank=self.rank, world_size=self.world_size,
                   counters=self.counters.to_dict() if self.counters else {},
                   timeline={"samples": list(self.samples), "tensors": list(self.tensors)})
        if self.end is not None:
            out["end"] = self.end.to_dict()
        if self.loop:
            out["loop"] = dict(self.loop)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MeasureReport:
        b = Breakdown.from_dict(d)
        if "ranks_missing" in d:
            return cls(breakdown=b, world_size=int(d.get("world_size", 1)), aggregate=True,
                       ranks_missing=tuple(int(r) for r in d["ranks_missing"]),
                       rank_counters={int(k.removeprefix("rank")): Counters.from_dict(c)
                                      for k, c in d.get("counters", {}).items()},
                       rank_ends={int(k.removeprefix("rank")): RunEnd.from_dict(e)
                                  for k, e in d.get("ends", {}).items()})
        tl = d.get("timeline", {})
        return cls(breakdown=b, rank=int(d.get("rank", 0)),
                   world_size=int(d.get("world_size", 1)),
                   counters=Counters.from_dict(d["counters"]) if d.get("counters") else None,
                   samples=tuple(tl.get("samples", ())), tensors=tuple(tl.get("tensors", ())),
                   end=RunEnd.from_dict(d["end"]) if d.get("end") else None,
                   loop=dict(d.get("loop") or {}))
