"""``Calibration``: rates measured on the user's own device by ``memplan calibrate``, read by
``estimate --calibration FILE`` in place of the sourced defaults of ``rates.toml``.

The file is TOML with one ``[calibration]`` table (``Calibration.to_toml``). Rates are absolute
(TFLOP/s, GB/s) as measured; ``estimate`` turns them into fractions of the catalog GPU's peak
(``matmul_efficiency`` = measured GEMM TFLOP/s / dense peak, and so on). A rate of 0 means "not
measured" and leaves the sourced default in place (collectives without torchrun, host copies
without CUDA).
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError, Problems

__all__ = ["Calibration", "load_calibration"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Rates measured by ``memplan calibrate`` on one device."""

    gpu: str
    """Catalog GPU the rates are for (``--gpu`` of ``calibrate``); ``estimate`` refuses another."""
    torch_device: str
    """What torch ran on (``torch.cuda.get_device_name()``, or ``cpu``)."""
    model: str
    """Model whose GEMM shapes were timed."""
    dtype: str = "bf16"
    """Dtype the GEMMs and attention ran in (a key of the catalog's ``tflops``)."""
    gemm_tflops: float = 0.0
    """FLOP-weighted achieved TFLOP/s over the model's linear-layer GEMMs (one layer, forward)."""
    attention_fwd_tflops: float = 0.0
    """Achieved TFLOP/s of the attention kernel's forward (causal work counted)."""
    attention_bwd_tflops: float = 0.0
    """Achieved TFLOP/s of its backward (2x the forward's FLOPs)."""
    hbm_gb_per_s: float = 0.0
    """Device-memory copy bandwidth (read + write bytes per second)."""
    h2d_gb_per_s: float = 0.0
    """Pinned host-to-device copy GB/s (0: not measured)."""
    d2h_gb_per_s: float = 0.0
    """Pinned device-to-host copy GB/s (0: not measured)."""
    allreduce_bus_gb_per_s: float = 0.0
    """All-reduce bus bandwidth (nccl-tests convention, 2 (n-1)/n x bytes / s) at the largest
    message, under torchrun (0: not measured)."""
    world_size: int = 1
    """Ranks in the collective measurement."""
    torch_version: str = ""
    """torch.__version__ of the run."""

    def __post_init__(self) -> None:
        p = Problems()
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "float" and not (isinstance(v, (int, float)) and v >= 0):
                p.add(f"calibration.{f.name}={v!r} must be a rate >= 0 (0 = not measured).")
        if not (isinstance(self.gemm_tflops, (int, float)) and self.gemm_tflops > 0):
            p.add("calibration.gemm_tflops must be > 0: rerun `memplan calibrate`.")
        p.raise_if_any()

    def efficiency(self, rate_tflops: float, peak_tflops: float | None) -> float | None:
        """``rate / peak`` capped at 1 (None when unmeasured or the peak is unknown)."""
        if not rate_tflops or not peak_tflops:
            return None
        return min(1.0, rate_tflops / peak_tflops)

    def to_toml(self) -> str:
        """The file ``calibrate --out`` writes."""
        lines = ["# memplan calibrate: rates measured on this device (memplan.timing.calibration)",
                 "[calibration]"]
        for k, v in asdict(self).items():
            lines.append(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"')
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "[calibration]") -> Calibration:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        missing = sorted(n for n in ("gpu", "torch_device", "model", "gemm_tflops")
                         if n not in data)
        if unknown or missing:
            raise ConfigError([f"{where}: unknown key {k!r}." for k in unknown]
                              + [f"{where}: missing {k!r}; rerun `memplan calibrate`."
                                 for k in missing])
        return cls(**data)


def load_calibration(path: str | Path) -> Calibration:
    """Read a ``calibrate --out`` file; a missing file or table is a ``ConfigError``."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError([f"--calibration {path}: cannot read it ({e}); write one with "
                           "`memplan calibrate MODEL --gpu GPU --out FILE`."]) from e
    table = data.get("calibration")
    if not isinstance(table, dict):
        raise ConfigError([f"--calibration {path}: no [calibration] table; write one with "
                           "`memplan calibrate`."])
    return Calibration.from_dict(table, where=f"{path} [calibration]")
