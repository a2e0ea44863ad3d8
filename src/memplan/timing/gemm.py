"""GEMM efficiency by GPU and shape: the measured large-GEMM fraction of peak for the GPU's
architecture, scaled by the shape's tile and wave quantisation relative to the measured shape.

NVIDIA, "Matrix Multiplication Background User's Guide" (DU-09799-001_v001, Feb 2023):

- **Tile quantisation** (§3.1): cuBLAS cuts the ``M x N`` output into ``tm x tn`` thread-block
  tiles; an edge tile that is only partly inside the matrix costs a whole tile, so the useful
  share is ``M N / (ceil(M/tm) ceil(N/tn) tm tn)``.
- **Wave quantisation** (§3.2): each SM runs one tile at a time, so ``T`` tiles run in
  ``ceil(T / SMs)`` waves and the last one is partly idle: share ``T / (ceil(T / SMs) SMs)``.
  The guide's example: 256 x 128 tiles on an A100's 108 SMs.

``gemm_efficiency = base x q(M, N)``: ``q`` is the product of both shares for the best of the
guide's cuBLAS tiles (``TILES``, §2.3: 256 x 128 and 128 x 256 down to 64 x 64; cuBLAS's
heuristics pick the tile per shape) and ``base`` (``base_matmul_efficiency``) the measured
fraction of the dense peak on the GPU's architecture (``rates.toml``
``matmul_efficiency_<arch>``, else the H100 ``matmul_efficiency``) divided by the measured
shape's own ``q``, so the measured shape gets exactly the measured figure. The measured shape is
the 8192 cube (``matmul_reference_size``) unless the architecture states its own share
(``matmul_reference_quantization_<arch>``: Hopper's sustained figure comes from a whole-wave
shape search, share 1). GPUs without an SM count in the catalog get the measured fraction.

**Power limit** (``power_limited_share``): a dense GEMM on a Hopper board is held by the
board's power limit, not its boost clock. Two boards with the same GH100 SM measured with one
torch script at 8192^2 (``rates.toml`` ``matmul_power_hopper_*``): the 700 W, 132-SM SXM
sustains 6.04 TFLOP/s per SM (5.30 W per SM), the 350 W, 114-SM PCIe card 4.32 (3.07 W per
SM; 0.65 of its datasheet peak against the SXM's 0.806). The rate per SM at the board's
``power_w / sm_count`` is the straight line through the two; since throughput rises ever more
slowly with power (dynamic power ~ f V^2), the chord lies below the true curve between the
points: it errs slow, not fast. The share is that rate over the architecture's measured one
(``matmul_efficiency_<arch>`` x the peak per SM: for Hopper the 700 W node's sustained 727
TFLOP/s, so a 132-SM board keeps it down to about 600 W), at most 1; it scales the GEMMs
(``base_matmul_efficiency``) and the attention kernels (``kernels.attention_efficiency``)
alike. Other architectures (no two-board measurement) and devices without an SM count or power
figure get 1. A board capped below its own rated power (``power_limit_w < tdp_w``) gets at most
the share the same board was measured to keep at that fraction of its power (``power_cap.py``:
Mayr et al. 2026, an H100 SXM training Llama 3 8B at 200-700 W caps; 0.915 at 500 W, 0.966 at
600 W), which the line exceeds at 600 W and at 300 W and below.

**Known limitations**: every tile is taken at the large tile's per-tile efficiency (the guide
ranks smaller tiles less efficient but gives no factor), so small GEMMs are optimistic; split-K
and Hopper's stream-K scheduling (which soften wave quantisation further) are not modelled, so
they are pessimistic there; the backward GEMMs are timed at their forward
GEMM's shape (``kernels.py`` charges backward as 2x forward); the K dimension is not quantised.
"""

from __future__ import annotations

import math
from functools import cache

from ..facts.constants import constant, constants
from ..hardware import Device
from .power_cap import capped_board_share

__all__ = ["base_matmul_efficiency", "gemm_efficiency", "measured_matmul_efficiency",
           "power_limited_share", "quantization", "reference_quantization"]


def _arch_efficiency(device: Device) -> float:
    """The architecture's measured large-GEMM fraction of peak at its full power
    (``matmul_efficiency_<arch>``, else the H100 measurement ``matmul_efficiency``)."""
    rows = constants()
    key = f"matmul_efficiency_{device.arch}"
    return rows[key].value if key in rows else constant("matmul_efficiency")


def measured_matmul_efficiency(device: Device) -> float:
    """The architecture's measured fraction (``_arch_efficiency``) times the board's
    power-limited share (``power_limited_share``). For Hopper the two are separate measurements:
    the 700 W node's sustained 727 TFLOP/s (``matmul_efficiency_hopper``) and the per-SM power
    line through two boards' 8192^2 rates; the share takes the line's rate where it is the
    lower one (a board below about 600 W), so the rate is the lower of the two bounds."""
    return _arch_efficiency(device) * power_limited_share(device)


def sustained_tflops_per_sm(arch: str, watts_per_sm: float) -> float | None:
    """Dense 16-bit GEMM TFLOP/s one SM sustains at ``watts_per_sm`` of board power: the line
    through the two measured boards of ``arch`` (module docstring); None = no measurement."""
    rows = constants()
    key = f"matmul_power_{arch}"
    if f"{key}_high_w_per_sm" not in rows:
        return None
    w_hi, t_hi = rows[f"{key}_high_w_per_sm"].value, rows[f"{key}_high_tflops_per_sm"].value
    w_lo, t_lo = rows[f"{key}_low_w_per_sm"].value, rows[f"{key}_low_tflops_per_sm"].value
    return max(0.0, t_lo + (watts_per_sm - w_lo) * (t_hi - t_lo) / (w_hi - w_lo))


def power_limited_share(device: Device) -> float:
    """Share of the architecture's measured GEMM rate (``_arch_efficiency`` x the 16-bit peak
    per SM) that ``device``'s power limit sustains, at most 1 (module docstring), and at most the
    same-board measurement's share for a board capped below its rated power
    (``power_cap.capped_board_share``); 1 when the catalog lacks the SM count, the power or the
    16-bit peak, or the architecture has no measurement."""
    cap = capped_board_share(device)
    peak = (device.tflops or {}).get("bf16") or (device.tflops or {}).get("fp16")
    if not (device.sm_count and device.power_w and peak):
        return cap
    rate = sustained_tflops_per_sm(device.arch, device.power_w / device.sm_count)
    if rate is None:
        return cap
    return min(1.0, rate / (_arch_efficiency(device) * peak / device.sm_count), cap)


def reference_quantization(device: Device) -> float:
    """Tile x wave share of the shape the architecture's efficiency was measured at: the
    architecture's stated share (``matmul_reference_quantization_<arch>``), else the 8192
    cube's on the device's SMs (1 without an SM count)."""
    rows = constants()
    key = f"matmul_reference_quantization_{device.arch}"
    if key in rows and f"matmul_efficiency_{device.arch}" in rows:
        return rows[key].value
    if not device.sm_count:
        return 1.0
    ref = constant("matmul_reference_size")
    return quantization(ref, ref, device.sm_count)


def base_matmul_efficiency(device: Device) -> float:
    """Fraction of peak a whole-wave tile grid reaches on ``device``: the measured fraction over
    its shape's quantisation (``gemm_efficiency`` multiplies a shape's own quantisation back
    in); the measured fraction itself when the SM count is unknown."""
    return measured_matmul_efficiency(device) / reference_quantization(device)


TILES = ((256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128),
         (64, 64))
"""Thread-block tiles cuBLAS chooses among (the guide's §2.3 list, most to least efficient)."""


@cache
def quantization(m: float, n: float, sms: int) -> float:
    """Useful share of the tile grid for an ``m x n`` GEMM output on ``sms`` SMs: tile share x
    wave share (module docstring), for the best tile of ``TILES``. Kept per (m, n, sms) for the
    process (a pure function of them; ``memplan plan`` asks for the same shapes many times)."""
    best = 0.0
    for tm, tn in TILES:
        rows, cols = math.ceil(m / tm), math.ceil(n / tn)
        tiles = rows * cols
        tile_share = m * n / (tiles * tm * tn)
        wave_share = tiles / (math.ceil(tiles / sms) * sms)
        best = max(best, tile_share * wave_share)
    return best


def gemm_efficiency(base: float, m: float, n: float, sms: int | None) -> float:
    """``base`` (a whole-wave grid's fraction, ``base_matmul_efficiency``) times the ``m x n``
    output's quantisation; ``base`` itself when the SM count is unknown. Capped at 1: no GEMM
    runs above the peak (a user catalog's odd SM count could make the reference shape quantise
    badly and ``base`` large)."""
    if not sms:
        return base
    return min(1.0, base * quantization(m, n, sms))
