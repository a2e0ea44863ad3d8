"""Timeline PNG of a measurement report (matplotlib, Agg backend; the optional ``plot`` extra).

Top panel: live tensor bytes over time, stacked by category, with the peak marked and annotated
(bytes, moment, step). Bottom panel: host RSS, and on CUDA the allocator's allocated/reserved
bytes, pinned host memory and NVML's used memory. Formatting only: nothing is computed here that
the report does not hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..breakdown import Category
from ..units import GIB, fmt_bytes

__all__ = ["plot_timeline", "timeline_figure", "SIZE_PX"]

SIZE_PX = (1200, 800)
"""Width and height of the PNG in pixels."""
_DPI = 100
_COLORS = {"params": "#4c72b0", "gradients": "#dd8452", "optimizer": "#55a868",
           "activations": "#c44e52", "temporary": "#8172b3", "communication": "#937860",
           "overhead": "#da8bc3"}


def _unit(max_bytes: float) -> tuple[float, str]:
    for div, name in ((GIB, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= div:
            return div, name
    return 1, "B"


def timeline_figure(report: dict[str, Any]) -> Any:
    """The matplotlib ``Figure`` (use ``plot_timeline`` to write it)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(SIZE_PX[0] / _DPI, SIZE_PX[1] / _DPI), dpi=_DPI)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    tl = report.get("timeline", {})
    pts = tl.get("tensors", [])
    gpu = report["gpu"]
    peak = gpu["peak_allocated_bytes"]
    div, unit = _unit(max([peak] + [sum(p.get(str(c), 0) for c in Category) for p in pts]))
    if pts:
        ts = [p["t"] for p in pts]
        cats = [str(c) for c in Category if any(p.get(str(c), 0) for p in pts)]
        top.stackplot(ts, *[[p.get(c, 0) / div for p in pts] for c in cats], labels=cats,
                      colors=[_COLORS[c] for c in cats], step="post", alpha=0.85)
        totals = [sum(p.get(c, 0) for c in cats) for p in pts]
        k = max(range(len(totals)), key=totals.__getitem__)
        rank = gpu["per_rank"][0]
        text = (f"peak {fmt_bytes(totals[k])}\n{rank['peak_moment']} ({rank['peak_step']} step)")
        top.plot([ts[k]], [totals[k] / div], marker="v", color="black", markersize=10)
        top.annotate(text, xy=(ts[k], totals[k] / div), xytext=(0.02, 0.97),
                     textcoords="axes fraction", va="top", fontsize=10,
                     arrowprops={"arrowstyle": "->", "color": "black"},
                     bbox={"boxstyle": "round", "fc": "white", "alpha": 0.9})
        top.legend(loc="upper right", fontsize=8)
    else:
        top.text(0.5, 0.5, f"no tensor timeline (tensor tracking off); peak {fmt_bytes(peak)}",
                 ha="center", transform=top.transAxes)
    top.set_ylabel(f"live tensors ({unit})")
    top.set_title(f"memplan measure: {report['model'].get('id', '')} on {gpu.get('name', '?')}",
                  fontsize=11)
    samples = tl.get("samples", [])
    if samples:
        ts = [s["t"] for s in samples]
        hmax = max(max(v for k, v in s.items() if k.endswith("_bytes") and v) for s in samples)
        hdiv, hunit = _unit(hmax)
        for key, label in (("rss_bytes", "host RSS"), ("pinned_bytes", "pinned host"),
                           ("cuda_allocated_bytes", "CUDA allocated"),
                           ("cuda_reserved_bytes", "CUDA reserved"),
                           ("nvml_used_bytes", "GPU used (NVML)")):
            if any(key in s for s in samples):
                bottom.plot(ts, [s.get(key, 0) / hdiv for s in samples], label=label)
        bottom.set_ylabel(hunit)
        bottom.legend(loc="upper right", fontsize=8)
    bottom.set_xlabel("seconds since the session started")
    fig.tight_layout()
    return fig


def plot_timeline(report: dict[str, Any], path: str | Path) -> Path:
    """Write the timeline PNG of ``report`` to ``path`` (``SIZE_PX``); the peak is also stored
    in the PNG's ``Description`` text chunk."""
    path = Path(path)
    fig = timeline_figure(report)
    rank = report["gpu"]["per_rank"][0]
    fig.savefig(path, dpi=_DPI, metadata={
        "Title": "memplan measure timeline",
        "Description": f"peak {rank['peak_allocated_bytes']} bytes at {rank['peak_moment']}"})
    return path
