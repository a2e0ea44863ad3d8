"""Result type of the time model, carried by ``Breakdown.time`` (JSON key ``time``)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["ResourceTime", "StagePhases", "TimeEstimate", "RESOURCES", "validation_band"]


@cache
def validation_band() -> tuple[float, float]:
    """(error_min, error_max) from ``accuracy.toml``, written by
    ``scripts/throughput_accuracy.py`` from the published rows."""
    row = tomllib.loads(resources.files("memplan.timing").joinpath("accuracy.toml")
                        .read_text())["band"]
    return float(row["error_min"]), float(row["error_max"])

RESOURCES = ("compute", "hbm", "launch", "nvlink", "network", "pcie", "nvme", "cpu", "data",
             "pipeline bubble")
"""Where step time goes. ``nvlink`` is intra-node GPU traffic, ``network`` inter-node,
``launch`` the CPU issuing kernels when the GPU runs them faster."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ResourceTime:
    """Time one resource is busy per step, and how much of it the step waits for."""

    name: str
    """One of ``RESOURCES``."""
    seconds: float
    """Busy time per step on one rank (or its share of a node resource)."""
    exposed_seconds: float
    """Part of the step time attributed to this resource (not hidden by overlap)."""
    detail: str = ""
    """What the time is (collectives, transfers) and the overlap assumption."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": self.seconds,
                "exposed_seconds": self.exposed_seconds, "detail": self.detail}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResourceTime:
        return cls(name=d["name"], seconds=float(d["seconds"]),
                   exposed_seconds=float(d["exposed_seconds"]), detail=d.get("detail", ""))


@dataclass(frozen=True, kw_only=True, slots=True)
class StagePhases:
    """When, in seconds from the start of the step, one pipeline stage runs the forward and
    backward of the micro-batch the memory timeline draws (the step's last) and the serial
    tail after it (``timing/schedule.py``)."""

    forward_start: float
    forward_seconds: float
    backward_seconds: float
    tail_start: float
    """Where the serial tail begins: the DP reduction the engine cannot hide, the optimizer
    step (GPU, CPU or NVMe) and the ZeRO-Offload upload; it ends with the step."""

    def to_dict(self) -> dict[str, float]:
        return {"forward_start": self.forward_start, "forward_seconds": self.forward_seconds,
                "backward_seconds": self.backward_seconds, "tail_start": self.tail_start}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StagePhases:
        return cls(**{k: float(d[k]) for k in ("forward_start", "forward_seconds",
                                               "backward_seconds", "tail_start")})


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeEstimate:
    """Predicted time of one optimizer step and where it goes."""

    step_seconds: float
    """Wall time of one optimizer step (all micro-batches)."""
    tokens_per_step: int
    """Tokens the whole job consumes per step."""
    gpus: int
    """World size."""
    model_flops_per_step: float
    """Model FLOPs of the whole job per step (PaLM convention, see ``timing.flops``)."""
    executed_flops_per_step: float
    """FLOPs actually executed (recomputation, eager attention's masked half): HFU's numerator."""
    peak_flops_per_gpu: float
    """Dense peak of the compute dtype, FLOP/s."""
    gpu_busy_seconds: float
    """Compute + memory-bound kernel time per step on one rank."""
    resources: tuple[ResourceTime, ...]
    """Per-resource busy and exposed time."""
    assumptions: tuple[str, ...] = field(default=())
    """Efficiencies and overlap rules used."""
    notes: tuple[str, ...] = field(default=())
    """Unknown bandwidths and other caveats."""
    error_min: float = 0.0
    """Smallest signed error (predicted / published - 1) validation measured (``band``)."""
    error_max: float = 0.0
    """Largest signed error validation measured (``timing/accuracy.toml``)."""
    model_flops_noncausal_per_step: float = 0.0
    """Model FLOPs over the full s x s attention matrix (torchtitan's / PaLM's MFU formula), to
    compare with MFUs published that way; 0 when not computed."""
    stages: tuple[StagePhases, ...] = ()
    """One per pipeline stage, in the order of the breakdown's ranks: the step's time axis."""

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_seconds

    @property
    def tokens_per_second_per_gpu(self) -> float:
        return self.tokens_per_second / self.gpus

    @property
    def tokens_per_second_range(self) -> tuple[float, float]:
        """Measured tokens/s this prediction stands for: ``P / (1 + error_max)`` to
        ``P / (1 + error_min)``, the spread of validation's errors on published rows."""
        p = self.tokens_per_second
        return p / (1 + self.error_max), p / (1 + self.error_min)

    @property
    def mfu(self) -> float:
        """Model FLOPs per second per GPU over the dense peak."""
        return self.model_flops_per_step / self.step_seconds / self.gpus / self.peak_flops_per_gpu

    @property
    def hfu(self) -> float:
        """Executed FLOPs per second per GPU over the dense peak."""
        return (self.executed_flops_per_step / self.step_seconds / self.gpus
                / self.peak_flops_per_gpu)

    @property
    def gpu_idle_fraction(self) -> float:
        """Share of the step the GPU runs no kernel of its own work."""
        return max(0.0, 1.0 - self.gpu_busy_seconds / self.step_seconds)

    @property
    def bottleneck(self) -> str:
        """The resource with the largest exposed time."""
        return max(self.resources, key=lambda r: r.exposed_seconds).name

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_seconds": self.step_seconds, "tokens_per_second": self.tokens_per_second,
            "tokens_per_second_per_gpu": self.tokens_per_second_per_gpu,
            "mfu": round(self.mfu, 4), "hfu": round(self.hfu, 4),
            "bottleneck": self.bottleneck,
            "gpu_idle_fraction": round(self.gpu_idle_fraction, 4),
            "tokens_per_step": self.tokens_per_step, "gpus": self.gpus,
            "model_flops_per_step": self.model_flops_per_step,
            "executed_flops_per_step": self.executed_flops_per_step,
            "model_flops_noncausal_per_step": self.model_flops_noncausal_per_step,
            "tokens_per_second_range": list(self.tokens_per_second_range),
            "error_min": self.error_min, "error_max": self.error_max,
            "peak_flops_per_gpu": self.peak_flops_per_gpu,
            "gpu_busy_seconds": self.gpu_busy_seconds,
            "resources": [r.to_dict() for r in self.resources],
            "assumptions": list(self.assumptions), "notes": list(self.notes),
            "stages": [p.to_dict() for p in self.stages],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimeEstimate:
        return cls(step_seconds=float(d["step_seconds"]), tokens_per_step=int(d["tokens_per_step"]),
                   gpus=int(d["gpus"]), model_flops_per_step=float(d["model_flops_per_step"]),
                   executed_flops_per_step=float(d["executed_flops_per_step"]),
                   peak_flops_per_gpu=float(d["peak_flops_per_gpu"]),
                   gpu_busy_seconds=float(d["gpu_busy_seconds"]),
                   resources=tuple(ResourceTime.from_dict(r) for r in d["resources"]),
                   assumptions=tuple(d.get("assumptions", ())), notes=tuple(d.get("notes", ())),
                   error_min=float(d.get("error_min", 0.0)),
                   error_max=float(d.get("error_max", 0.0)),
                   model_flops_noncausal_per_step=float(
                       d.get("model_flops_noncausal_per_step", 0.0)),
                   stages=tuple(StagePhases.from_dict(p) for p in d.get("stages", ())))
