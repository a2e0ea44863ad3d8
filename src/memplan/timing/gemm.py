"""GEMM efficiency by GPU and shape: the measured large-GEMM fraction of peak for the GPU's
architecture, scaled by the shape's tile and wave quantisation relative to the measured shape.

NVIDIA, "Matrix Multiplication Background User's Guide" (DU-09799-001_v001, Feb 2023):

- **Tile quantisation** (§3.1): cuBLAS cuts the ``M x N`` output into ``tm x tn`` thread-block
  tiles; an edge tile that is only partly inside the matrix costs a whole tile, so the useful
  share is ``M N / (ceil(M/tm) ceil(N/tn) tm tn)``.
- **Wave quantisation** (§3.2): each SM runs one tile at a time, so ``T`` tiles run in
  ``ceil(T / SMs)`` waves and the last one is partly idle: share ``T / (ceil(T / SMs) SMs)``.
  The guide's example: 256 x 128 tiles on an A100's 108 SMs.

``gemm_efficiency = base x q(M, N) / q(ref, ref)``: ``base`` is the measured fraction of the
dense peak of an 8192-cube GEMM on the GPU's architecture (``rates.toml``
``matmul_efficiency_<arch>``, else the H100 ``matmul_efficiency``) and ``q`` the product of both
shares for the best of the guide's cuBLAS tiles (``TILES``, §2.3: 256 x 128 and 128 x 256 down
to 64 x 64; cuBLAS's heuristics pick the tile per shape), so the measured shape gets exactly the
measured figure. GPUs without an SM count in the catalog get ``base``.

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

__all__ = ["base_matmul_efficiency", "gemm_efficiency", "quantization"]


def base_matmul_efficiency(device: Device) -> float:
    """The measured large-GEMM fraction of peak for ``device``'s architecture
    (``matmul_efficiency_<arch>``), else the H100 measurement (``matmul_efficiency``)."""
    rows = constants()
    key = f"matmul_efficiency_{device.arch}"
    return rows[key].value if key in rows else constant("matmul_efficiency")


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
    """``base`` scaled by the ``m x n`` output's quantisation relative to the measured square
    GEMM's (``matmul_reference_size``); ``base`` itself when the SM count is unknown. Capped at
    1: no GEMM runs above the peak (a user catalog's odd SM count could make the reference
    shape quantise badly and the ratio large)."""
    if not sms:
        return base
    ref = constant("matmul_reference_size")
    return min(1.0, base * quantization(m, n, sms) / quantization(ref, ref, sms))
