"""``memplan measure -- CMD``: run a command, measure every rank, say how it ended and set it
beside an estimate (``--against``); split from ``cli.py`` like ``cli_export.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .cli_options import check_format, emit_json, fail, guard

Opt = typer.Option


def measure_command(
    ctx: typer.Context,
    out: Annotated[Path, Opt(help="Folder for the report (memplan-measure.json/.png).")] = Path(
        "memplan-measure"),
    against: Annotated[Path | None, Opt(help="A `memplan estimate/trace --format json` file: "
                                             "print the error per category.")] = None,
    interval: Annotated[float, Opt(help="Sampling interval of RSS / allocator, seconds.")] = 0.01,
    no_tensors: Annotated[bool, Opt("--no-tensors", help="Skip live-tensor tracking (faster; "
                                                         "no categories).")] = False,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
) -> None:
    """Run a command and measure it: `memplan measure -- python train.py ...`. The child (each
    rank under torchrun) writes a report in the estimate's JSON schema and a timeline PNG."""
    check_format(format)
    cmd = list(ctx.args)
    if not cmd:
        fail("no command to measure. Usage: memplan measure [OPTIONS] -- python train.py ...")
    from .measure.precheck import check_measure_inputs

    expected = guard(lambda: check_measure_inputs(cmd, out, against, interval))

    def run() -> Any:
        from .measure.cli_run import run_measured

        return run_measured(cmd, out, interval_s=interval, track_tensors=not no_tensors)

    code, report = guard(run)
    rows, ooms = None, {}
    if against is not None:
        def compare() -> Any:
            from .measure.aggregate import compare as cmp

            return cmp(report.breakdown, expected)

        rows = guard(compare)
        from .measure.oom import beside_estimate

        ooms = {r: b for r, e in report.endings.items()
                if (b := beside_estimate(e, expected)) is not None}
    from .measure.aggregate import NO_PLOT, plot_available
    from .measure.loop_text import describe_loop, loop_hints

    hints = loop_hints(report.loop, expected.recipe) if expected and report.loop else []

    if not plot_available():
        typer.echo(NO_PLOT, err=True)
    if format == "json":
        emit_json({"report": str(out), "exit_code": code, "comparison": rows,
                    "peak_allocated_bytes": max(r.peak_allocated_bytes
                                                for r in report.breakdown.ranks),
                    "ended": {r: e.to_dict() for r, e in report.endings.items()},
                    "ranks_missing": list(report.ranks_missing),
                    "oom_vs_estimate": {r: b.to_dict() for r, b in ooms.items()},
                    "loop": report.loop, "loop_hints": hints})
    else:
        from rich.console import Console

        from .units import fmt_bytes

        console = Console()
        worst = report.breakdown.worst
        console.print(f"measured: peak {fmt_bytes(worst.peak_allocated_bytes)} at "
                      f"{worst.peak_moment.label} ({worst.peak_step} step); host RSS peak "
                      f"{fmt_bytes(report.peak_rss_bytes)}; report in {out}/")
        if report.loop:
            console.print(describe_loop(report.loop), highlight=False, soft_wrap=True)
        for hint in hints:
            console.print(f"  {hint}", highlight=False, markup=False, soft_wrap=True)
        for r, e in report.endings.items():
            if e.how != "completed" or e.report_errors:
                who = f"rank {r}" if report.world_size > 1 else "run"
                console.print(f"{who} ended: {e.diagnosis}"
                              + "".join(f"; {x}" for x in e.report_errors))
        if report.ranks_missing:
            console.print(f"no report from rank(s) {', '.join(map(str, report.ranks_missing))}")
        for r, b in ooms.items():
            console.print(("" if report.world_size == 1 else f"rank {r}: ") + b.sentence())
        if rows is not None:
            from .report.measured import render_comparison

            console.print(render_comparison(rows, [k for k in rows[0] if k not in (
                "what", "measured", "error_pct_of_peak", "unmodelled")][0]))
    if code:
        raise typer.Exit(code)
