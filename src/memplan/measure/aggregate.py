"""Writing session reports (one per rank under torchrun, plus rank 0's aggregate) and comparing
a measurement with an estimate or a trace. No torch needed."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..breakdown import Breakdown, Category
from .report import MeasureReport

__all__ = ["write_reports", "write_json", "write_plot", "plot_available", "aggregate", "compare",
           "report_paths", "NO_PLOT"]

log = logging.getLogger(__name__)
STEM = "memplan-measure"
_WAIT_S = 60.0  # how long rank 0 waits for the other ranks' reports
NO_PLOT = "matplotlib is not installed: no timeline PNG (pip install 'memplan[plot]')"


def report_paths(out: Path, rank: int, world: int) -> tuple[Path, Path]:
    """(JSON, PNG) of one rank: ``<stem>.json/.png`` alone, ``<stem>.rank<R>.*`` under torchrun."""
    stem = STEM if world == 1 else f"{STEM}.rank{rank}"
    return out / f"{stem}.json", out / f"{stem}.png"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file, then a rename): a reader never
    sees half a file, and a failed write leaves the previous file whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def plot_available() -> bool:
    """Whether the ``plot`` extra (matplotlib) is installed."""
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(data: dict[str, Any], path: Path) -> Path | None:
    """The timeline PNG of ``data`` (written atomically), or None without matplotlib."""
    if not plot_available():
        return None
    from ..report.plot import plot_timeline

    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.png")
    try:
        plot_timeline(data, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_reports(report: MeasureReport, out: Path, *, plot: bool = True,
                  wait_for_ranks: bool = True) -> list[Path]:
    """Write this rank's JSON (and PNG when matplotlib is installed); rank 0 of several also
    waits for the others' reports and writes the aggregate ``<stem>.json`` (unless
    ``wait_for_ranks`` is off: ``memplan measure``'s parent aggregates instead)."""
    out.mkdir(parents=True, exist_ok=True)
    rank, world = report.rank, report.world_size
    json_path, png_path = report_paths(out, rank, world)
    data = report.to_dict()
    write_json(json_path, data)
    written = [json_path]
    if plot:
        png = write_plot(data, png_path)
        if png is None:
            log.warning(NO_PLOT)
        else:
            written.append(png)
    if world > 1 and rank == 0 and wait_for_ranks:
        paths = [report_paths(out, r, world)[0] for r in range(world)]
        deadline = time.monotonic() + _WAIT_S
        while not all(p.exists() for p in paths) and time.monotonic() < deadline:
            time.sleep(0.2)
        found = [MeasureReport.from_dict(json.loads(p.read_text())) for p in paths if p.exists()]
        write_json(out / f"{STEM}.json", aggregate(found, world).to_dict())
        written.append(out / f"{STEM}.json")
    return written


def aggregate(reports: list[MeasureReport], world: int) -> MeasureReport:
    """One Breakdown whose ``per_rank`` lists every rank's role (maxima over ranks on top),
    the counters and ending per rank, and the ranks without a report."""
    ranks = [r for rep in reports for r in rep.breakdown.ranks]
    first = reports[0].breakdown
    b = Breakdown(source="measure", model=first.model, recipe=first.recipe, device=first.device,
                  ranks=tuple(ranks))
    missing = tuple(sorted(set(range(world)) - {r.rank for r in reports}))
    return MeasureReport(breakdown=b, world_size=world, aggregate=True, ranks_missing=missing,
                         rank_counters={r.rank: r.counters for r in reports
                                        if r.counters is not None},
                         rank_ends={r.rank: r.end for r in reports if r.end is not None})


def compare(measured: Breakdown, other: Breakdown) -> list[dict[str, Any]]:
    """Per category at the peak and for the peak itself: ``other`` (an estimate or a trace)
    against ``measured``; error in % of the measured peak (a category's own measured bytes can
    be 0)."""
    m, o = measured.worst, other.worst
    peak = m.peak_allocated_bytes or 1
    mc, oc = m.categories_at_peak(), o.categories_at_peak()
    rows = []
    for c in Category:
        if mc[c] or oc[c]:
            rows.append({"what": str(c), "measured": mc[c], str(other.source): oc[c],
                         "error_pct_of_peak": (oc[c] - mc[c]) / peak * 100,
                         "unmodelled": c in o.unmodelled})
    rows.append({"what": "peak allocated", "measured": m.peak_allocated_bytes,
                 str(other.source): o.peak_allocated_bytes,
                 "error_pct_of_peak": (o.peak_allocated_bytes - m.peak_allocated_bytes)
                 / peak * 100, "unmodelled": False})
    return rows


def env_rank() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) as torchrun sets them, (0, 1) otherwise."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
