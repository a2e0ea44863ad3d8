"""Result types of the host planner, carried by ``Breakdown.host`` / ``Breakdown.nvme``.

Plain data with ``to_dict``/``from_dict`` (JSON keys ``host`` and ``nvme``); nothing here
computes. Bytes are per node: the busiest node of the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["HostLine", "HostEstimate", "NvmeEstimate", "MOMENTS"]

MOMENTS = ("load", "steady step", "checkpoint save")
"""Moments of a run at which host RAM is compared: model loading, the training step, a save."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HostLine:
    """One category of host RAM (or NVMe) on one node."""

    name: str
    """E.g. ``process baseline``, ``offloaded states (pinned)``."""
    bytes: int
    """Bytes on the node."""
    moments: tuple[str, ...] = MOMENTS
    """Moments (of ``MOMENTS``) during which the bytes are held."""
    formula: str = ""
    """How the number was obtained, with its source."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "moments": list(self.moments),
                "formula": self.formula}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostLine:
        return cls(name=d["name"], bytes=int(d["bytes"]),
                   moments=tuple(d.get("moments", MOMENTS)), formula=d.get("formula", ""))


def _moment_totals(lines: tuple[HostLine, ...]) -> dict[str, int]:
    return {m: sum(line.bytes for line in lines if m in line.moments) for m in MOMENTS}


@dataclass(frozen=True, kw_only=True, slots=True)
class HostEstimate:
    """Host RAM of the busiest node, by category and by moment."""

    node: str
    """Node preset name, ``custom`` or ``unspecified``."""
    local_ranks: int
    """Training processes on the node."""
    nodes: int
    """Nodes in the job."""
    lines: tuple[HostLine, ...]
    """Every category with its moments and formula."""
    capacity_bytes: int | None
    """Installed host RAM of the node; None = unknown (no verdict)."""
    gpu_memory_per_node_bytes: int
    """Sum of the node's GPU capacities, for the RAM : GPU-memory ratio."""
    notes: tuple[str, ...] = field(default=())
    """Assumptions and caveats for this estimate."""
    other_loads: tuple[tuple[str, int], ...] = field(default=())
    """When this estimate does not fit: (load mode, per-node peak bytes) of each cheaper
    ``load`` mode, cheapest first, so that the verdict can name the fix."""

    @property
    def moments(self) -> dict[str, int]:
        """Host bytes held at each moment."""
        return _moment_totals(self.lines)

    @property
    def peak_moment(self) -> str:
        """The moment with the most host RAM (the first one on a tie)."""
        m = self.moments
        return max(MOMENTS, key=lambda k: (m[k], -MOMENTS.index(k)))

    @property
    def per_node_peak_bytes(self) -> int:
        return self.moments[self.peak_moment]

    @property
    def categories(self) -> dict[str, int]:
        return {line.name: line.bytes for line in self.lines}

    @property
    def fits(self) -> bool | None:
        if self.capacity_bytes is None:
            return None
        return self.per_node_peak_bytes <= self.capacity_bytes

    @property
    def ram_to_gpu_ratio(self) -> float:
        """Host RAM this run needs per byte of the node's GPU memory."""
        return self.per_node_peak_bytes / self.gpu_memory_per_node_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node, "local_ranks": self.local_ranks, "nodes": self.nodes,
            "per_node_peak_bytes": self.per_node_peak_bytes, "peak_moment": self.peak_moment,
            "moments": self.moments, "categories": self.categories,
            "capacity_bytes": self.capacity_bytes, "fits": self.fits,
            "gpu_memory_per_node_bytes": self.gpu_memory_per_node_bytes,
            "ram_to_gpu_memory_ratio": round(self.ram_to_gpu_ratio, 3),
            "lines": [line.to_dict() for line in self.lines], "notes": list(self.notes),
            "other_loads": dict(self.other_loads),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostEstimate:
        return cls(node=d["node"], local_ranks=int(d["local_ranks"]), nodes=int(d["nodes"]),
                   lines=tuple(HostLine.from_dict(x) for x in d["lines"]),
                   capacity_bytes=d.get("capacity_bytes"),
                   gpu_memory_per_node_bytes=int(d["gpu_memory_per_node_bytes"]),
                   notes=tuple(d.get("notes", ())),
                   other_loads=tuple((str(k), int(v))
                                     for k, v in (d.get("other_loads") or {}).items()))


@dataclass(frozen=True, kw_only=True, slots=True)
class NvmeEstimate:
    """Local NVMe of the busiest node: ZeRO-Infinity swap space and kept checkpoints."""

    lines: tuple[HostLine, ...]
    """Swap files and checkpoints, each with its formula."""
    capacity_bytes: int | None
    """Local NVMe capacity; None = unknown."""

    @property
    def bytes(self) -> int:
        return sum(line.bytes for line in self.lines)

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "capacity_bytes": self.capacity_bytes, "fits": self.fits,
                "lines": [line.to_dict() for line in self.lines]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NvmeEstimate:
        return cls(lines=tuple(HostLine.from_dict(x) for x in d["lines"]),
                   capacity_bytes=d.get("capacity_bytes"))
