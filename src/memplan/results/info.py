"""What a result is about: the model (``ModelInfo``), the device (``DeviceInfo``) and the CUDA
allocator's own counters of a measured run (``AllocatorCounters``). Plain data; the producers
(estimate, trace, measure) fill them, nothing here computes.

Fields a producer cannot know are ``None`` and are left out of the JSON (a traced model has
no catalog ``model_type``; a measured training loop has no catalog device row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ModelInfo", "DeviceInfo", "AllocatorCounters"]


def _present(pairs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pairs.items() if v is not None}


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelInfo:
    """The model a result describes."""

    id: str
    """Catalog id, config path, module path, or the class name of a measured model."""
    params: int
    """Parameters of the whole model (all ranks together)."""
    trainable_params: int
    """Parameters that receive gradients (LoRA: the adapters only)."""
    layers: int
    """Transformer layers (0 when not known)."""
    source: str
    """Where the architecture was read from."""
    model_type: str | None = None
    """HF ``model_type`` (estimate only)."""
    params_by_component: dict[str, int] | None = None
    """Parameters per component (embedding, attention, mlp...; estimate only)."""
    notes: tuple[str, ...] | None = None
    """Caveats of the model description (estimate only)."""

    def to_dict(self) -> dict[str, Any]:
        return _present({
            "id": self.id, "model_type": self.model_type, "params": self.params,
            "trainable_params": self.trainable_params,
            "params_by_component": self.params_by_component, "layers": self.layers,
            "source": self.source, "notes": None if self.notes is None else list(self.notes)})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelInfo:
        return cls(id=d["id"], params=int(d["params"]),
                   trainable_params=int(d["trainable_params"]), layers=int(d["layers"]),
                   source=d["source"], model_type=d.get("model_type"),
                   params_by_component=d.get("params_by_component"),
                   notes=None if d.get("notes") is None else tuple(d["notes"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class AllocatorCounters:
    """The CUDA caching allocator's counters over a measured run (``torch.cuda``)."""

    max_memory_allocated: int
    """``torch.cuda.max_memory_allocated()`` minus what was allocated before the run."""
    max_memory_reserved: int
    """``torch.cuda.max_memory_reserved()``."""
    active_bytes_peak: int
    """``memory_stats()["active_bytes.all.peak"]``."""
    device_used: int | None = None
    """Total minus free of ``torch.cuda.mem_get_info()`` right after the steps, before the cache
    is emptied: what nvidia-smi shows in use on the GPU (this process's CUDA context, its
    allocator's pool and anything outside it, and every other process on that GPU)."""

    def to_dict(self) -> dict[str, Any]:
        return {"max_memory_allocated": self.max_memory_allocated,
                "max_memory_reserved": self.max_memory_reserved,
                "active_bytes.all.peak": self.active_bytes_peak,
                "device_used": self.device_used}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AllocatorCounters:
        return cls(max_memory_allocated=int(d["max_memory_allocated"]),
                   max_memory_reserved=int(d["max_memory_reserved"]),
                   active_bytes_peak=int(d.get("active_bytes.all.peak", 0)),
                   device_used=None if d.get("device_used") is None else int(d["device_used"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceInfo:
    """The device a result is for: a catalog row, or what a measured run saw."""

    name: str
    """GPU name (``H100-80GB``), ``cpu``, or the name CUDA reports."""
    capacity_bytes: int
    """Usable memory, the fit verdict's limit."""
    source: str
    """Where the numbers come from."""
    vendor: str | None = None
    """Catalog rows only, like the fields below."""
    arch: str | None = None
    memory_gb: float | None = None
    hbm_gb_per_s: float | None = None
    tflops: dict[str, float] | None = None
    interconnect: str | None = None
    allocator: AllocatorCounters | None = None
    """The allocator's counters of a measured CUDA run; None otherwise."""

    def to_dict(self) -> dict[str, Any]:
        catalog = self.vendor is not None
        d = {"name": self.name, "vendor": self.vendor, "arch": self.arch,
             "memory_gb": self.memory_gb, "capacity_bytes": self.capacity_bytes,
             "hbm_gb_per_s": self.hbm_gb_per_s, "tflops": self.tflops,
             "interconnect": self.interconnect, "source": self.source}
        # catalog rows keep their null entries (the JSON schema of `memplan gpus`)
        d = d if catalog else _present(d)
        if self.allocator is not None:
            d["allocator"] = self.allocator.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceInfo:
        alloc = d.get("allocator")
        return cls(name=d["name"], capacity_bytes=int(d["capacity_bytes"]), source=d["source"],
                   vendor=d.get("vendor"), arch=d.get("arch"), memory_gb=d.get("memory_gb"),
                   hbm_gb_per_s=d.get("hbm_gb_per_s"), tflops=d.get("tflops"),
                   interconnect=d.get("interconnect"),
                   allocator=AllocatorCounters.from_dict(alloc) if alloc else None)
