"""``Breakdown``: the one result type. The estimator, the tracer and the measurer all fill it,
so comparing a plan with reality needs no extra code.

A ``Breakdown`` holds, for each distinct *role* of rank (one pipeline stage, say), a list of
``Item``s: named byte counts, each in a ``Category``, each live during some ``Phase``s of the
training step. Totals per phase make the step's timeline; the peak is the largest phase total,
never a ``max`` over labels.

Where a byte lives (``Pool``) decides which counter sees it:

- ``ALLOCATED``: tensors in PyTorch's caching allocator (``torch.cuda.max_memory_allocated``);
- ``RESERVED``: allocator slack, i.e. reserved but unallocated (``max_memory_reserved`` - allocated);
- ``DEVICE``: GPU memory outside PyTorch's allocator (CUDA context, NCCL internals): nvidia-smi;
- ``HOST`` / ``NVME``: states offloaded off the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the host/time result types live above this layer (issue #5)
    from .host.result import HostEstimate, NvmeEstimate
    from .timing.result import TimeEstimate

__all__ = ["Category", "Phase", "Pool", "Item", "RankBreakdown", "Breakdown"]


class Category(StrEnum):
    """What a byte is for (PyTorch MemTracker's reference types, renamed for users)."""

    PARAMS = "params"
    GRADIENTS = "gradients"
    OPTIMIZER = "optimizer"
    ACTIVATIONS = "activations"
    TEMPORARY = "temporary"
    COMMUNICATION = "communication"
    OVERHEAD = "overhead"


class Phase(StrEnum):
    """Moments of one training step, in order."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer-step"


ALL_PHASES: tuple[Phase, ...] = tuple(Phase)


class Pool(StrEnum):
    """Which memory, and which counter, a byte belongs to."""

    ALLOCATED = "allocated"
    RESERVED = "reserved"
    DEVICE = "device"
    HOST = "host"
    NVME = "nvme"


@dataclass(frozen=True, kw_only=True, slots=True)
class Item:
    """One named amount of memory."""

    category: Category
    """What the bytes are for."""
    name: str
    """Human-readable line label, e.g. ``fp32 master weights``."""
    bytes: int
    """Size in bytes (per rank)."""
    phases: tuple[Phase, ...] = ALL_PHASES
    """Phases of the step during which these bytes are live."""
    pool: Pool = Pool.ALLOCATED
    """Which memory holds them (see module docstring)."""
    formula: str = ""
    """How the number was obtained: formula and source, or 'measured'."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": str(self.category),
            "name": self.name,
            "bytes": self.bytes,
            "phases": [str(p) for p in self.phases],
            "pool": str(self.pool),
            "formula": self.formula,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Item:
        return cls(
            category=Category(d["category"]),
            name=d["name"],
            bytes=int(d["bytes"]),
            phases=tuple(Phase(p) for p in d.get("phases", [p.value for p in ALL_PHASES])),
            pool=Pool(d.get("pool", "allocated")),
            formula=d.get("formula", ""),
        )


_ON_GPU = (Pool.ALLOCATED, Pool.RESERVED, Pool.DEVICE)


@dataclass(frozen=True, kw_only=True, slots=True)
class RankBreakdown:
    """Memory of one role of rank; ``ranks`` ranks share it."""

    role: str
    """E.g. ``all ranks``, ``pp stage 0 (embedding)``."""
    ranks: int
    """How many ranks of the job have this role."""
    items: tuple[Item, ...]
    """Every line that makes up this rank's memory."""
    unmodelled: tuple[Category, ...] = ()
    """Categories this producer does not (yet) account for: their 0 means 'unknown', not 'none'."""
    notes: tuple[str, ...] = field(default=())
    """Caveats specific to this rank."""

    def phase_bytes(self, phase: Phase, pools: tuple[Pool, ...] = (Pool.ALLOCATED,)) -> int:
        """Bytes live during ``phase`` in the given pools."""
        return sum(i.bytes for i in self.items if phase in i.phases and i.pool in pools)

    @property
    def timeline(self) -> dict[Phase, int]:
        """Allocated bytes per phase of the step."""
        return {p: self.phase_bytes(p) for p in ALL_PHASES}

    @property
    def peak_phase(self) -> Phase:
        """The phase with the most allocated bytes (the first one on a tie)."""
        timeline = self.timeline
        return max(ALL_PHASES, key=lambda p: (timeline[p], -ALL_PHASES.index(p)))

    @property
    def peak_allocated_bytes(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` would read."""
        return self.timeline[self.peak_phase]

    @property
    def peak_reserved_bytes(self) -> int:
        """What ``torch.cuda.max_memory_reserved`` would read: allocated plus allocator slack."""
        return self.phase_bytes(self.peak_phase, (Pool.ALLOCATED, Pool.RESERVED))

    @property
    def device_total_bytes(self) -> int:
        """What nvidia-smi would show for this process: reserved plus memory outside PyTorch."""
        return self.phase_bytes(self.peak_phase, _ON_GPU)

    def categories_at_peak(self) -> dict[Category, int]:
        """GPU bytes per category during the peak phase (every category present, 0 if none)."""
        out = {c: 0 for c in Category}
        for i in self.items:
            if self.peak_phase in i.phases and i.pool in _ON_GPU:
                out[i.category] += i.bytes
        return out

    def off_gpu_bytes(self, pool: Pool) -> int:
        """Bytes this rank keeps in host RAM or on NVMe (offload), largest over the step."""
        return max((self.phase_bytes(p, (pool,)) for p in ALL_PHASES), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "ranks": self.ranks,
            "categories": {str(c): b for c, b in self.categories_at_peak().items()},
            "unmodelled": [str(c) for c in self.unmodelled],
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "device_total_bytes": self.device_total_bytes,
            "peak_phase": str(self.peak_phase),
            "timeline": {str(p): b for p, b in self.timeline.items()},
            "offloaded_host_bytes": self.off_gpu_bytes(Pool.HOST),
            "offloaded_nvme_bytes": self.off_gpu_bytes(Pool.NVME),
            "items": [i.to_dict() for i in self.items],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankBreakdown:
        return cls(
            role=d["role"],
            ranks=int(d["ranks"]),
            items=tuple(Item.from_dict(i) for i in d["items"]),
            unmodelled=tuple(Category(c) for c in d.get("unmodelled", [])),
            notes=tuple(d.get("notes", [])),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Breakdown:
    """Memory of a whole training job: one ``RankBreakdown`` per distinct role of rank."""

    source: str
    """``estimate``, ``trace`` or ``measure``."""
    model: dict[str, Any]
    """``id``, ``params``, ``trainable_params`` and per-component counts."""
    recipe: dict[str, Any]
    """The recipe as given (after defaults), for the record."""
    device: dict[str, Any]
    """The GPU: name, capacity and the catalog row's source."""
    ranks: tuple[RankBreakdown, ...]
    host: HostEstimate | None = None
    """Host RAM of the busiest node by category and moment (issue #5); None when not planned."""
    nvme: NvmeEstimate | None = None
    """Local NVMe of the busiest node: swap files and kept checkpoints (issue #5)."""
    time: TimeEstimate | None = None
    """Predicted step time, MFU, GPU idle time and bottleneck (issue #5)."""

    @property
    def worst(self) -> RankBreakdown:
        """The rank role with the largest GPU footprint (what decides OOM)."""
        return max(self.ranks, key=lambda r: r.device_total_bytes)

    @property
    def capacity_bytes(self) -> int:
        return int(self.device["capacity_bytes"])

    @property
    def fits(self) -> bool:
        """True when every rank's total GPU footprint fits the device."""
        return all(r.device_total_bytes <= self.capacity_bytes for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "source": self.source,
            "model": self.model,
            "recipe": self.recipe,
            "gpu": {
                **self.device,
                "per_rank": [r.to_dict() for r in self.ranks],
                "peak_allocated_bytes": max(r.peak_allocated_bytes for r in self.ranks),
                "peak_reserved_bytes": max(r.peak_reserved_bytes for r in self.ranks),
                "device_total_bytes": worst.device_total_bytes,
                "capacity_bytes": self.capacity_bytes,
                "headroom_bytes": self.capacity_bytes - worst.device_total_bytes,
                "fits": self.fits,
            },
            **{key: part.to_dict() for key, part in
               (("host", self.host), ("nvme", self.nvme), ("time", self.time)) if part is not None},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Breakdown:
        gpu = dict(d["gpu"])
        ranks = tuple(RankBreakdown.from_dict(r) for r in gpu.pop("per_rank"))
        for derived in ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes",
                        "headroom_bytes", "fits"):
            gpu.pop(derived, None)
        from .host.result import HostEstimate, NvmeEstimate
        from .timing.result import TimeEstimate

        return cls(source=d["source"], model=d["model"], recipe=d["recipe"], device=gpu,
                   ranks=ranks,
                   host=HostEstimate.from_dict(d["host"]) if d.get("host") else None,
                   nvme=NvmeEstimate.from_dict(d["nvme"]) if d.get("nvme") else None,
                   time=TimeEstimate.from_dict(d["time"]) if d.get("time") else None)
