"""``memplan validate --nproc N`` (called by ``cli.py``): the distributed cases, every rank
measured under torchrun, against memplan's per-rank estimate."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from .cli_options import guard

__all__ = ["run", "NPROC_HELP"]

NPROC_HELP = ("Ranks per distributed case: >= 2 runs the DeepSpeed and FSDP2 cases under "
              "torchrun (gloo, CPU) instead of the single-process matrix.")


def run(nproc: int, format: str) -> None:
    """Run the distributed cases on ``nproc`` ranks; print the table or JSON; exit 1 past the
    bound."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    def cases() -> Any:
        from .validate_dist import DIST_CASES, validate_distributed

        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(f"torchrun x {nproc}", total=len(DIST_CASES))
            return validate_distributed(
                nproc, on_case=lambda r: bar.update(task, advance=1, description=r.case.name))

    results = guard(cases, stdout_to_stderr=True)
    from .validate_dist import BOUND_PCT

    rows = [r.to_dict() for r in results]
    if format == "json":
        sys.stdout.write(json.dumps({"nproc": nproc, "bound_pct": BOUND_PCT, "cases": rows},
                                    indent=2) + "\n")
    else:
        t = Table(title=f"memplan validate --nproc {nproc}: bytes a rank holds between steps "
                        "(torchrun, gloo, CPU)")
        for col in ("case", "engine", "measured per rank", "estimated", "error per rank", "s"):
            t.add_column(col, justify="left" if col in ("case", "engine") else "right")
        for r in rows:
            err = r["error"] or ", ".join(f"{e:+.3f}%" for e in r["error_pct_per_rank"])
            t.add_row(r["name"], r["engine"],
                      ", ".join(f"{m:,}" for m in r["measured_bytes_per_rank"]) or "-",
                      f"{r['estimated_bytes_per_rank']:,}", err, f"{r['seconds']:.0f}")
        Console().print(t)
    if any(not r["within_bound"] for r in rows):
        raise typer.Exit(1)
