"""The one-line verdict that opens ``memplan estimate`` / ``trace`` and is all ``--quiet``
prints: GPU, host RAM and NVMe verdicts, and the step's throughput. Formatting only."""

from __future__ import annotations

from ..breakdown import Breakdown
from ..units import fmt_bytes
from .host import cheaper_load_hint

__all__ = ["summary_line"]


def _word(fits: bool) -> str:
    return "fits" if fits else "does NOT fit"


def summary_line(b: Breakdown) -> str:
    """E.g. ``meta-llama/Llama-3.1-70B on 8x H100-80GB: GPU fits (74.10 GiB of 79.21 GiB);
    host RAM does NOT fit (2.07 TiB of 2.00 TiB per node; fits with --load meta (1.17 TiB));
    NVMe fits; 2,949 tokens/s``."""
    w = b.worst
    gpus = b.recipe.get("gpus", 1)
    where = "memory" if b.recipe.get("device") == "cpu" else "GPU"
    parts = [f"{where} {_word(b.fits)} ({fmt_bytes(w.device_total_bytes)} of "
             f"{fmt_bytes(b.capacity_bytes)})"]
    h = b.host
    if h is not None:
        if h.fits is None:
            parts.append("host RAM unknown (give --node or --host-ram)")
        else:
            parts.append(f"host RAM {_word(h.fits)} ({fmt_bytes(h.per_node_peak_bytes)} of "
                         f"{fmt_bytes(h.capacity_bytes or 0)} per node"
                         f"{cheaper_load_hint(h.other_loads, h.capacity_bytes)})")
    n = b.nvme
    if n is not None and n.fits is not None:
        parts.append(f"NVMe {_word(n.fits)}")
    if b.time is not None:
        parts.append(f"{b.time.tokens_per_second:,.0f} tokens/s")
    return f"{b.model.id} on {gpus}x {b.device.name}: " + "; ".join(parts)
