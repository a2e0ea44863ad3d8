"""``memplan validate --nproc N``: the CLI side of ``memplan.validate.distributed`` (a table or
JSON of every rank of every case; exit 1 when a rank is outside the 5% bound)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import typer

from .cli_options import fail, guard

__all__ = ["render", "validate_dist"]


def _mib(b: int) -> str:
    return f"{b / 2**20:,.2f} MiB"


def render(report: dict[str, Any]) -> Any:
    """A rich table: one row per (case, rank)."""
    from rich.table import Table

    t = Table(title=f"memplan validate --nproc {report['nproc']} (torchrun, gloo, CPU; "
                    "live tensor bytes per rank)")
    for col in ("case", "engine", "from", "rank", "measured", "estimated", "error",
                "fwd / bwd / opt error", "measured peak at"):
        t.add_column(col, justify="right" if col in ("measured", "estimated", "error") else "left")
    for c in report["cases"]:
        if c["error"]:
            t.add_row(c["name"], c["engine"], c["configured_from"], "-", "-", "-", "-", "-",
                      c["error"][:120])
            continue
        for r in c["ranks"]:
            ph = r["phase_error_pct"]
            t.add_row(c["name"], c["engine"], c["configured_from"], str(r["rank"]),
                      _mib(r["measured_peak_allocated_bytes"]),
                      _mib(r["estimated_peak_allocated_bytes"]),
                      f"{r['estimate_error_pct']:+.2f}%",
                      " / ".join(f"{ph[p]:+.1f}%" if p in ph else "-"
                                 for p in ("forward", "backward", "optimizer-step")),
                      r["measured_peak_moment"])
    return t


def validate_dist(*, nproc: int, device: str, quick: bool, cases: Path | None,
                  format: str) -> None:
    """Run, print, exit 1 when a case is outside the bound."""
    from .validate.distributed import validate_distributed

    if device != "cpu":
        fail(f"--nproc {nproc} with --device {device}: the distributed cases run on gloo on CPU "
             "only; use --device cpu.")
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's logger prints to stdout
        report = guard(lambda: validate_distributed(nproc=nproc, quick=quick,
                                                    table=cases)).to_dict()
    if format == "json":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        from rich.console import Console

        console = Console()
        console.print(render(report))
        e = report["max_abs_error_pct"]
        console.print(f"per-rank estimate |error|: max {'n/a' if e is None else f'{e:.2f}%'} "
                      f"(bound {report['bounds_pct']['estimate_per_rank']}%); "
                      f"{len(report['cases'])} cases in {report['seconds']:.0f} s; "
                      f"{'PASSED' if report['passed'] else 'FAILED'}")
    if not report["passed"]:
        raise typer.Exit(1)
