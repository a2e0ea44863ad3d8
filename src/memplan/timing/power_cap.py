"""Throughput a board keeps under a power cap below its rated power, measured on the same board.

``gemm.power_limited_share`` prices a board's power with a line through two *different* boards
(the 700 W SXM and the 350 W PCIe H100). A board capped with ``nvidia-smi -pl`` below its own
rated power has a direct measurement: Mayr et al. 2026 (arXiv:2603.16164, Table 4) swept the
cap of a 700 W H100 SXM (94 GB HBM2e, the memory of torchtitan's Grand Teton H100s) from 200 to
700 W while it trained Llama 3 8B, and logged the training throughput (``power_caps.toml``).

``measured_cap_share(arch, fraction)`` is that throughput at ``fraction`` of the rated power
over the throughput at the rated power, linear between the measured caps. It is a whole
training step's share; the compute-bound kernels lose at least as much (the step also holds
memory-bound kernels, whose memory clock a cap leaves alone, and communication), so
``capped_board_share`` offers it to ``power_limited_share`` as an upper bound on the GEMM and
attention share of a capped board. Against the per-SM line (Llama 3.1 8B, FSDP on 4 H100s,
predicted tokens/s at the cap over at 700 W; ``tests/test_timing_power_cap.py``): the line
alone predicts 0.92 at 500 W (measured 0.915) and 0.84 at 400 W (0.821), but 0.994 at 600 W
(0.966: the line reaches the 700 W node's sustained 727 TFLOP/s near 600 W) and 0.75 / 0.66 at
300 / 200 W (0.594 / 0.320: the line is extrapolated below its lower board's 3.07 W per SM);
with the bound: 0.977 at 600 W, 0.68-0.69 / 0.41-0.42 at 300 / 200 W (still fast).

**Known limitations**: one workload on one board type; the cap is the set limit, not the drawn
power; below the lowest measured cap the lowest measured share is kept (errs fast); the share
is used as measured for GEMMs and attention alike, though a dense GEMM draws more than the
average of a training step and so loses more (errs fast).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from ..hardware import Device

__all__ = ["CapCurve", "capped_board_share", "measured_cap_share", "power_cap_curves"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CapCurve:
    """One publication's sweep of one workload on one board over power caps."""

    name: str
    """Key of the curve in ``power_caps.toml``."""
    arch: str
    """GPU architecture of the board (``hopper``)."""
    used: bool
    """True for the curve the model reads for ``arch``; False = recorded as evidence only."""
    rated_w: float
    """The board's rated power, W: the cap whose value is the share's denominator."""
    cap_w: tuple[float, ...]
    """The caps set, W, ascending."""
    value: tuple[float, ...]
    """The measured figure at each cap (``metric`` of the data file)."""
    board: str
    """The board measured (memory, rated power, node)."""
    workload: str
    """What ran while the caps were set."""
    source: str
    """Publication, table or figure."""

    def shares(self) -> tuple[tuple[float, float], ...]:
        """(cap / rated power, value / value at the rated power) for every measured cap."""
        full = self.value[self.cap_w.index(self.rated_w)]
        return tuple((w / self.rated_w, v / full) for w, v in zip(self.cap_w, self.value,
                                                                    strict=True))


@cache
def power_cap_curves() -> tuple[CapCurve, ...]:
    """Every ``[[curve]]`` of ``power_caps.toml`` (used or evidence only)."""
    text = resources.files(__package__).joinpath("power_caps.toml").read_text()
    return tuple(CapCurve(name=c["name"], arch=c["arch"], used=c["used"],
                          rated_w=float(c["rated_w"]),
                          cap_w=tuple(float(w) for w in c["cap_w"]),
                          value=tuple(float(v) for v in c["value"]), board=c["board"],
                          workload=c["workload"], source=c["source"])
                 for c in tomllib.loads(text)["curve"])


def _used_curve(arch: str) -> CapCurve | None:
    """The curve the model reads for ``arch`` (``used = true``), None without one."""
    used = [c for c in power_cap_curves() if c.arch == arch and c.used]
    return used[0] if used else None


def measured_cap_share(arch: str, fraction: float) -> float | None:
    """Share of its rated-power throughput a board of ``arch`` keeps at ``fraction`` of its
    rated power: the measured sweep (module docstring) divided by its value at the rated power,
    linear between measured caps, 1 at or above the rated power, the lowest measured share
    below the lowest cap; None when ``arch`` has no measurement."""
    curve = _used_curve(arch)
    if curve is None:
        return None
    if fraction >= 1.0:
        return 1.0
    points = curve.shares()
    if fraction <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if fraction <= x1:
            return y0 + (fraction - x0) * (y1 - y0) / (x1 - x0)
    return 1.0


def capped_board_share(device: Device) -> float:
    """Upper bound on the compute share of ``device`` from the same-board measurement: the
    measured share at ``power_limit_w / tdp_w`` when the board runs capped below its rated
    power and its architecture has a measurement, else 1."""
    limit, rated = device.power_limit_w, device.tdp_w
    if not (limit and rated) or limit >= rated:
        return 1.0
    share = measured_cap_share(device.arch, limit / rated)
    return 1.0 if share is None else share
