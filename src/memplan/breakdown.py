"""``Breakdown``: the one result type. The estimator, the tracer and the measurer all fill it,
so comparing a plan with reality needs no extra code.

A ``Breakdown`` holds, for each distinct *role* of rank (one pipeline stage, say), the step's
*timeline*: a sequence of ``Moment``s (forward layer by layer, the loss, backward layer by layer,
the optimizer step), each listing the ``Item``s allocated at that instant. Two steps are
described: the ``first`` (optimizer states created lazily inside it) and the ``steady`` state.
The peak is the largest moment of the timeline, never a ``max`` over labels; ``items`` are the
lines live at that moment plus the memory outside PyTorch's allocator.

Where a byte lives (``Pool``) decides which counter sees it:

- ``ALLOCATED``: tensors in PyTorch's caching allocator (``torch.cuda.max_memory_allocated``);
- ``RESERVED``: allocator slack, i.e. reserved but unallocated (``max_memory_reserved`` - allocated);
- ``DEVICE``: GPU memory outside PyTorch's allocator (CUDA context, NCCL internals): nvidia-smi;
- ``HOST`` / ``NVME``: states offloaded off the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .results import DeviceInfo, HostEstimate, ModelInfo, NvmeEstimate, TimeEstimate

__all__ = ["Category", "Phase", "Step", "Pool", "Item", "Moment", "RankBreakdown", "Breakdown"]


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
    """Phases of a run, in order: loading the model (before the first step), then the phases of
    one training step."""

    LOAD = "load"
    """Building, loading, sharding and quantising the model before the first step
    (``Step.INIT`` only; ``memplan.estimate.load``)."""
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer-step"


ALL_PHASES: tuple[Phase, ...] = (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)
"""The phases of a training step (``Phase.LOAD`` happens once, before the first step)."""


class Step(StrEnum):
    """Which training step a moment belongs to."""

    INIT = "init"
    """Before the first step: the model is built, loaded, sharded and quantised
    (``Phase.LOAD``). The caching allocator keeps what this reserved (no ``empty_cache``)."""
    FIRST = "first"
    """Step 0: lazily created state (torch optimizers' ``exp_avg``...) appears inside it."""
    STEADY = "steady"
    """Any later step: everything that persists across steps is there from the start."""


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
    pool: Pool = Pool.ALLOCATED
    """Which memory holds them (see module docstring)."""
    formula: str = ""
    """How the number was obtained: formula and source, or 'measured'."""

    def to_dict(self) -> dict[str, Any]:
        return {"category": str(self.category), "name": self.name, "bytes": self.bytes,
                "pool": str(self.pool), "formula": self.formula}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Item:
        return cls(category=Category(d["category"]), name=d["name"], bytes=int(d["bytes"]),
                   pool=Pool(d.get("pool", "allocated")), formula=d.get("formula", ""))


@dataclass(frozen=True, kw_only=True, slots=True)
class Moment:
    """One instant of a training step and the allocated memory live at it."""

    step: Step
    """The first step or the steady state."""
    phase: Phase
    """The phase the instant belongs to."""
    label: str
    """What happens at the instant, e.g. ``backward: loss`` or ``forward: layer 31``."""
    items: tuple[Item, ...]
    """Allocated-pool lines live at the instant."""
    seconds: float | None = None
    """When the instant comes, in seconds from the start of its step, on the step-time
    estimate's time axis (``timing/schedule.py``); None without one (the load phase, a
    measurement, no step time)."""

    @property
    def allocated_bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    def categories(self) -> dict[Category, int]:
        """Bytes per category (every category present, 0 if none)."""
        out = dict.fromkeys(Category, 0)
        for i in self.items:
            out[i.category] += i.bytes
        return out

    def to_dict(self) -> dict[str, Any]:
        """Summary form for JSON: totals per category, not the items."""
        out = {"step": str(self.step), "phase": str(self.phase), "label": self.label,
               "allocated_bytes": self.allocated_bytes,
               "categories": {str(c): b for c, b in self.categories().items() if b}}
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Moment:
        items = tuple(Item(category=Category(c), name=c, bytes=int(b))
                      for c, b in d.get("categories", {}).items())
        seconds = d.get("seconds")
        return cls(step=Step(d["step"]), phase=Phase(d["phase"]), label=d["label"], items=items,
                   seconds=None if seconds is None else float(seconds))


_ON_GPU = (Pool.ALLOCATED, Pool.RESERVED, Pool.DEVICE)


@dataclass(frozen=True, kw_only=True, slots=True)
class RankBreakdown:
    """Memory of one role of rank; ``ranks`` ranks share it."""

    role: str
    """E.g. ``every rank``, ``pp stage 0 (layers 0-9, embedding)``."""
    ranks: int
    """How many ranks of the job have this role."""
    moments: tuple[Moment, ...]
    """The run's timeline, in order: loading (``Step.INIT``, estimator only), the first step,
    then the steady state. Never empty."""
    outside: tuple[Item, ...] = ()
    """Lines outside the allocated pool at the peak: allocator slack (``RESERVED``), memory
    outside PyTorch (``DEVICE``) and offloaded states (``HOST``, ``NVME``)."""
    unmodelled: tuple[Category, ...] = ()
    """Categories this producer does not account for: their 0 means 'unknown', not 'none'."""
    notes: tuple[str, ...] = field(default=())
    """Caveats specific to this rank."""

    def __post_init__(self) -> None:
        if not self.moments:
            raise ValueError(f"RankBreakdown {self.role!r} needs at least one moment")
        if any(i.pool == Pool.ALLOCATED for i in self.outside):
            raise ValueError("allocated lines belong in moments, not in 'outside'")

    # -- the timeline ------------------------------------------------------------------
    @property
    def peak_moment(self) -> Moment:
        """The moment with the most allocated bytes (the first one on a tie)."""
        best = self.moments[0]
        most = best.allocated_bytes
        for m in self.moments[1:]:
            n = m.allocated_bytes
            if n > most:
                best, most = m, n
        return best

    def step_peak(self, step: Step) -> int:
        """Peak allocated bytes within ``step`` (0 when the producer did not describe it)."""
        return max((m.allocated_bytes for m in self.moments if m.step == step), default=0)

    def phase_peaks(self, step: Step = Step.STEADY) -> dict[Phase, int]:
        """Peak allocated bytes of each phase of ``step`` (phases not described are absent)."""
        out: dict[Phase, int] = {}
        for m in self.moments:
            if m.step == step:
                out[m.phase] = max(out.get(m.phase, 0), m.allocated_bytes)
        return out

    def phase_moment(self, phase: Phase, step: Step = Step.STEADY) -> Moment:
        """The largest moment of ``phase`` in ``step``."""
        cands = [m for m in self.moments if m.step == step and m.phase == phase]
        if not cands:
            raise KeyError(f"no {step} {phase} moment in {self.role!r}")
        return max(cands, key=lambda m: m.allocated_bytes)

    @property
    def peak_phase(self) -> Phase:
        return self.peak_moment.phase

    @property
    def peak_step(self) -> Step:
        return self.peak_moment.step

    @property
    def first_step_peak_allocated_bytes(self) -> int:
        return self.step_peak(Step.FIRST)

    @property
    def steady_peak_allocated_bytes(self) -> int:
        return self.step_peak(Step.STEADY)

    @property
    def load_peak_allocated_bytes(self) -> int:
        """Peak allocated while the model is loaded, before the first step (0: not described)."""
        return self.step_peak(Step.INIT)

    # -- totals at the peak ------------------------------------------------------------
    @property
    def items(self) -> tuple[Item, ...]:
        """Every line at the peak: the peak moment's allocated lines, then the others."""
        return self.peak_moment.items + self.outside

    @property
    def peak_allocated_bytes(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` would read over the whole run."""
        return self.peak_moment.allocated_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        """What ``torch.cuda.max_memory_reserved`` would read: allocated plus allocator slack."""
        return self.peak_allocated_bytes + self.outside_bytes(Pool.RESERVED)

    @property
    def device_total_bytes(self) -> int:
        """What nvidia-smi would show for this process: reserved plus memory outside PyTorch."""
        return self.peak_reserved_bytes + self.outside_bytes(Pool.DEVICE)

    def outside_bytes(self, pool: Pool) -> int:
        return sum(i.bytes for i in self.outside if i.pool == pool)

    def off_gpu_bytes(self, pool: Pool) -> int:
        """Bytes this rank keeps in host RAM or on NVMe (offload)."""
        return self.outside_bytes(pool)

    def categories_at_peak(self) -> dict[Category, int]:
        """GPU bytes per category at the peak (every category present, 0 if none)."""
        out = dict.fromkeys(Category, 0)
        for i in self.items:
            if i.pool in _ON_GPU:
                out[i.category] += i.bytes
        return out

    def to_dict(self) -> dict[str, Any]:
        peak = self.peak_moment
        return {
            "role": self.role,
            "ranks": self.ranks,
            "categories": {str(c): b for c, b in self.categories_at_peak().items()},
            "unmodelled": [str(c) for c in self.unmodelled],
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "first_step_peak_allocated_bytes": self.first_step_peak_allocated_bytes,
            "steady_peak_allocated_bytes": self.steady_peak_allocated_bytes,
            "load_peak_allocated_bytes": self.load_peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "device_total_bytes": self.device_total_bytes,
            "peak_phase": str(peak.phase),
            "peak_step": str(peak.step),
            "peak_moment": peak.label,
            "offloaded_host_bytes": self.off_gpu_bytes(Pool.HOST),
            "offloaded_nvme_bytes": self.off_gpu_bytes(Pool.NVME),
            "items": [i.to_dict() for i in self.items],
            "timeline": [m.to_dict() for m in self.moments],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankBreakdown:
        """Inverse of ``to_dict``; the peak moment gets its full items back, other moments
        one line per category."""
        moments = [Moment.from_dict(m) for m in d["timeline"]]
        items = [Item.from_dict(i) for i in d["items"]]
        allocated = tuple(i for i in items if i.pool == Pool.ALLOCATED)
        for k, m in enumerate(moments):
            if (m.label == d.get("peak_moment") and str(m.step) == d.get("peak_step")
                    and m.allocated_bytes == sum(i.bytes for i in allocated)):
                moments[k] = Moment(step=m.step, phase=m.phase, label=m.label, items=allocated,
                                    seconds=m.seconds)
                break
        return cls(role=d["role"], ranks=int(d["ranks"]), moments=tuple(moments),
                   outside=tuple(i for i in items if i.pool != Pool.ALLOCATED),
                   unmodelled=tuple(Category(c) for c in d.get("unmodelled", [])),
                   notes=tuple(d.get("notes", [])))


@dataclass(frozen=True, kw_only=True, slots=True)
class Breakdown:
    """Memory of a whole training job: one ``RankBreakdown`` per distinct role of rank."""

    source: str
    """``estimate``, ``trace`` or ``measure``."""
    model: ModelInfo
    """The model: id, parameter counts, layers, where it was read from."""
    recipe: dict[str, Any]
    """The recipe as given (after defaults), for the record."""
    device: DeviceInfo
    """The GPU: name, capacity and the catalog row's source (and a measured run's allocator
    counters)."""
    ranks: tuple[RankBreakdown, ...]
    max_micro_batch: int | None = None
    """Largest micro-batch that fits every rank with everything else unchanged (estimator
    only; 0 when not even 1 fits, None when not computed)."""
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
        return self.device.capacity_bytes

    @property
    def headroom_bytes(self) -> int:
        """Free GPU memory on the fullest rank at its peak (negative: short by that much)."""
        return self.capacity_bytes - self.worst.device_total_bytes

    @property
    def fits(self) -> bool:
        """True when every rank's total GPU footprint fits the device."""
        return all(r.device_total_bytes <= self.capacity_bytes for r in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "source": self.source,
            "model": self.model.to_dict(),
            "recipe": self.recipe,
            "gpu": {
                **self.device.to_dict(),
                "per_rank": [r.to_dict() for r in self.ranks],
                "peak_allocated_bytes": max(r.peak_allocated_bytes for r in self.ranks),
                "first_step_peak_allocated_bytes": max(r.first_step_peak_allocated_bytes
                                                       for r in self.ranks),
                "steady_peak_allocated_bytes": max(r.steady_peak_allocated_bytes
                                                   for r in self.ranks),
                "load_peak_allocated_bytes": max(r.load_peak_allocated_bytes
                                                 for r in self.ranks),
                "peak_reserved_bytes": max(r.peak_reserved_bytes for r in self.ranks),
                "device_total_bytes": worst.device_total_bytes,
                "capacity_bytes": self.capacity_bytes,
                "headroom_bytes": self.headroom_bytes,
                "fits": self.fits,
                "max_micro_batch": self.max_micro_batch,
            },
            **{key: part.to_dict() for key, part in
               (("host", self.host), ("nvme", self.nvme), ("time", self.time)) if part is not None},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Breakdown:
        gpu = dict(d["gpu"])
        ranks = tuple(RankBreakdown.from_dict(r) for r in gpu.pop("per_rank"))
        mmb = gpu.pop("max_micro_batch", None)
        for derived in ("peak_allocated_bytes", "first_step_peak_allocated_bytes",
                        "steady_peak_allocated_bytes", "load_peak_allocated_bytes",
                        "peak_reserved_bytes",
                        "device_total_bytes", "headroom_bytes", "fits"):
            gpu.pop(derived, None)
        return cls(source=d["source"], model=ModelInfo.from_dict(d["model"]), recipe=d["recipe"],
                   device=DeviceInfo.from_dict(gpu),
                   ranks=ranks, max_micro_batch=mmb,
                   host=HostEstimate.from_dict(d["host"]) if d.get("host") else None,
                   nvme=NvmeEstimate.from_dict(d["nvme"]) if d.get("nvme") else None,
                   time=TimeEstimate.from_dict(d["time"]) if d.get("time") else None)
