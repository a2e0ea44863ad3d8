"""Rich tables for traces and measurements: the per-module table at the peak, measured-vs-other
per category (``memplan measure --against``), and the ``memplan validate`` matrix. Formatting
only."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rich.table import Table
from rich.text import Text

from ..breakdown import Breakdown, Category, Item, Moment
from ..units import fmt_bytes

__all__ = ["by_category", "render_modules", "render_comparison", "render_validation"]


def by_category(b: Breakdown) -> Breakdown:
    """``b`` with each moment's items summed per category (one line each): the per-module
    detail of a trace stays in ``render_modules``."""
    ranks = []
    for r in b.ranks:
        moments = []
        for m in r.moments:
            sums = {c: v for c, v in m.categories().items() if v}
            how = m.items[0].formula if m.items else ""
            items = tuple(Item(category=c, name=f"{c} (all modules)", bytes=v, formula=how)
                          for c, v in sums.items())
            moments.append(replace(m, items=items))
        ranks.append(replace(r, moments=tuple(moments)))
    return replace(b, ranks=tuple(ranks))


def render_modules(moment: Moment, limit: int = 12) -> Table:
    """Which module group holds what at ``moment`` (the ``limit`` largest rows, the rest summed)."""
    rows: dict[str, dict[Category, int]] = {}
    for it in moment.items:
        rows.setdefault(it.name, dict.fromkeys(Category, 0))[it.category] += it.bytes
    cats = [c for c in Category if any(r[c] for r in rows.values())]
    t = Table(title=f"by module at the peak ({moment.label}, {moment.step} step)",
              title_justify="left", show_edge=False)
    t.add_column("module", no_wrap=True, min_width=18)
    for c in cats:
        t.add_column(str(c), justify="right")
    t.add_column("total", justify="right")
    ordered = sorted(rows.items(), key=lambda kv: -sum(kv[1].values()))
    shown, rest = ordered[:limit], ordered[limit:]
    for name, r in shown:
        t.add_row(name, *(fmt_bytes(r[c]) for c in cats), fmt_bytes(sum(r.values())))
    if rest:
        t.add_row(f"({len(rest)} more)", *(fmt_bytes(sum(r[c] for _, r in rest)) for c in cats),
                  fmt_bytes(sum(sum(r.values()) for _, r in rest)))
    return t


def render_comparison(rows: list[dict[str, Any]], other: str) -> Table:
    """``memplan.measure.aggregate.compare`` rows: measured, the other, error % of the peak."""
    t = Table(title=f"measured vs {other} (error in % of the measured peak)",
              title_justify="left", show_edge=False)
    for col, just in (("category", "left"), ("measured", "right"), (other, "right"),
                      ("error", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        err = Text(f"{r['error_pct_of_peak']:+.1f}%")
        if r["unmodelled"]:
            err = Text("not modelled", style="yellow")
        t.add_row(r["what"], fmt_bytes(r["measured"]), fmt_bytes(r[other]), err)
    return t


def render_validation(report: dict[str, Any]) -> Table:
    """One row per case: measured, traced and estimated peaks and the errors."""
    b = report["bounds_pct"]
    t = Table(title=f"memplan validate ({report['device']}{', quick' if report['quick'] else ''}"
                    f"): bounds trace {b['trace']:g}%, estimate {b['estimate']:g}%",
              title_justify="left", show_edge=False)
    for col in ("case", "measured", "trace", "err", "estimate", "err", "act+tmp est/meas"):
        t.add_column(col, justify="left" if col == "case" else "right")
    for c in report["cases"]:
        if c["error"]:
            t.add_row(c["name"], Text(c["error"][:60], style="red"), "", "", "", "", "")
            continue

        def err(v: float, bound: float) -> Text:
            style = "yellow" if c.get("differs_from_framework") else (
                "green" if abs(v) <= bound else "bold red")
            return Text(f"{v:+.2f}%", style=style)

        cats = c["categories_at_peak"]
        at = ("activations", "temporary")
        est = sum(cats.get(k, {}).get("estimated", 0) for k in at)
        meas = sum(cats.get(k, {}).get("measured", 0) for k in at)
        harness = c.get("harness", "memplan")
        traced = c["traced_peak_allocated_bytes"]
        name = c["name"]  # framework case names start with their harness
        if c.get("differs_from_framework"):
            name += " (differs)"
        t.add_row(name, fmt_bytes(c["measured_peak_allocated_bytes"]),
                  "-" if traced is None else fmt_bytes(traced),
                  "-" if traced is None else err(c["trace_error_pct"], b["trace"]),
                  fmt_bytes(c["estimated_peak_allocated_bytes"]),
                  err(c["estimate_error_pct"], b["estimate"]),
                  f"{fmt_bytes(est)} / {fmt_bytes(meas)}" if harness == "memplan" else "-")
    return t
