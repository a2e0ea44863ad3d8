"""SVG charts of a memplan result, shared by ``memplan serve`` and the HTML report.

Two charts, both drawn from the JSON form of a ``Breakdown`` (``Breakdown.to_dict()``), so a
saved estimate, trace or measurement draws the same way as a live one:

- ``category_bars``: bytes per category at the peak, one bar per category (grouped when
  several results are compared), in fixed colours, with the value on hover (SVG ``<title>``);
- ``timeline_area``: allocated bytes moment by moment, a stacked step area by category, with
  the peak moment marked and the capacity drawn as a dashed line.

Formatting only: nothing here computes memory. Every element a test needs carries a
``data-*`` attribute (category, bytes, moment index) so the charts are checked by parsing them
as XML, not by looking at pixels. No JavaScript, no fonts or images fetched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from ..breakdown import Category
from ..units import fmt_bytes

__all__ = ["CATEGORY_COLOURS", "category_bars", "timeline_area"]

CATEGORY_COLOURS: dict[str, str] = {
    "params": "#4c78a8",
    "gradients": "#f58518",
    "optimizer": "#e45756",
    "activations": "#72b7b2",
    "temporary": "#54a24b",
    "communication": "#eeca3b",
    "overhead": "#b279a2",
}
"""One colour per ``Category``, the same in every chart, page and report (Tableau 10)."""

_SERIES_OPACITY = (1.0, 0.55, 0.35, 0.25)
_FONT = 'font-family="system-ui, sans-serif" font-size="12"'


def _open(width: int, height: int, label: str, kind: str) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label={quoteattr(label)} '
            f'data-chart="{kind}" {_FONT}>']


def _n(x: float) -> str:
    return f"{x:.1f}"


def category_bars(series: Sequence[tuple[str, Mapping[str, int]]], *,
                  formulas: Mapping[str, str] | None = None, width: int = 640) -> str:
    """Horizontal bars of bytes per category; one bar per (category, series).

    Args:
        series: ``(name, {category: bytes})`` pairs, e.g. ``[("estimate", cats)]`` or an
            estimate and a measurement. Categories that are 0 in every series are left out.
        formulas: optional hover text per category (how the number was obtained).
        width: SVG width in pixels.
    Returns:
        An ``<svg>`` element as a string.
    """
    cats = [str(c) for c in Category if any(s.get(str(c), 0) for _, s in series)]
    top = max((b for _, s in series for b in s.values()), default=0) or 1
    bar_h, gap, left, right = 16, 8, 110, 90
    n = max(len(series), 1)
    height = 10 + len(cats) * (n * bar_h + gap) + (18 * n if n > 1 else 0) + 10
    out = _open(width, height, "bytes per category at the peak", "category-bars")
    y = 10
    for cat in cats:
        colour = CATEGORY_COLOURS[cat]
        out.append(f'<text x="{left - 6}" y="{y + n * bar_h / 2 + 4:.1f}" '
                   f'text-anchor="end">{escape(cat)}</text>')
        for k, (name, values) in enumerate(series):
            b = int(values.get(cat, 0))
            w = (width - left - right) * b / top
            tip = f"{cat}: {fmt_bytes(b)} ({b:,} B)" + (f" [{name}]" if n > 1 else "")
            if formulas and formulas.get(cat):
                tip += f"\n{formulas[cat]}"
            out.append(
                f'<g data-category="{cat}" data-series={quoteattr(name)} data-bytes="{b}">'
                f'<title>{escape(tip)}</title>'
                f'<rect x="{left}" y="{y}" width="{_n(w)}" height="{bar_h - 2}" fill="{colour}" '
                f'fill-opacity="{_SERIES_OPACITY[min(k, 3)]}"/>'
                f'<text x="{left + w + 4:.1f}" y="{y + bar_h - 5}">{escape(fmt_bytes(b))}</text>'
                f'</g>')
            y += bar_h
        y += gap
    if n > 1:
        for k, (name, _) in enumerate(series):
            out.append(f'<g data-legend={quoteattr(name)}><rect x="{left}" y="{y}" width="12" '
                       f'height="12" fill="#888" fill-opacity="{_SERIES_OPACITY[min(k, 3)]}"/>'
                       f'<text x="{left + 18}" y="{y + 10}">{escape(name)}</text></g>')
            y += 18
    out.append("</svg>")
    return "".join(out)


def _peak_index(moments: Sequence[Mapping[str, Any]]) -> int:
    """First moment with the most allocated bytes (``RankBreakdown.peak_moment``'s rule)."""
    best = 0
    for i, m in enumerate(moments):
        if m["allocated_bytes"] > moments[best]["allocated_bytes"]:
            best = i
    return best


def timeline_area(moments: Sequence[Mapping[str, Any]], *, capacity_bytes: int | None = None,
                  width: int = 720, height: int = 260) -> str:
    """Stacked step area of allocated bytes by category over a step's moments.

    Args:
        moments: the ``timeline`` of one rank in ``Breakdown.to_dict()`` form: dicts with
            ``label``, ``step``, ``phase``, ``allocated_bytes`` and ``categories``.
        capacity_bytes: the GPU's usable memory, drawn as a dashed line when given.
        width, height: SVG size in pixels.
    Returns:
        An ``<svg>`` element as a string; the peak moment carries ``data-peak``.
    """
    if not moments:
        raise ValueError("timeline_area needs at least one moment")
    left, right, top_pad, bottom = 70, 12, 22, 28
    pw, ph = width - left - right, height - top_pad - bottom
    totals = [int(m["allocated_bytes"]) for m in moments]
    ymax = max(max(totals), capacity_bytes or 0) * 1.05 or 1
    step_w = pw / len(moments)

    def sx(i: float) -> float:
        return left + i * step_w

    def sy(b: float) -> float:
        return top_pad + ph - ph * b / ymax

    out = _open(width, height, "allocated memory over the training step", "timeline")
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        y = sy(ymax * frac)
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{_n(y)}" y2="{_n(y)}" '
                   f'stroke="#ddd"/><text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" '
                   f'fill="#555">{escape(fmt_bytes(int(ymax * frac)))}</text>')
    below = [0] * len(moments)
    for cat in (str(c) for c in Category):
        vals = [int(m.get("categories", {}).get(cat, 0)) for m in moments]
        if not any(vals):
            continue
        upper = [b + v for b, v in zip(below, vals)]
        pts: list[str] = []
        for i, v in enumerate(upper):
            pts += [f"{_n(sx(i))},{_n(sy(v))}", f"{_n(sx(i + 1))},{_n(sy(v))}"]
        for i in range(len(below) - 1, -1, -1):
            pts += [f"{_n(sx(i + 1))},{_n(sy(below[i]))}", f"{_n(sx(i))},{_n(sy(below[i]))}"]
        out.append(f'<polygon data-category="{cat}" data-max-bytes="{max(vals)}" '
                   f'fill="{CATEGORY_COLOURS[cat]}" fill-opacity="0.85" stroke="none" '
                   f'points="{" ".join(pts)}"><title>{escape(cat)}: up to '
                   f'{escape(fmt_bytes(max(vals)))}</title></polygon>')
        below = upper
    # step boundaries (first step | steady step) as thin separators
    for i in range(1, len(moments)):
        if moments[i]["step"] != moments[i - 1]["step"]:
            out.append(f'<line x1="{_n(sx(i))}" x2="{_n(sx(i))}" y1="{top_pad}" '
                       f'y2="{top_pad + ph}" stroke="#333" stroke-dasharray="2,3"/>'
                       f'<text x="{sx(i) + 3:.1f}" y="{top_pad + ph + 14}" fill="#333">'
                       f'{escape(str(moments[i]["step"]))} step</text>')
    if capacity_bytes:
        y = sy(capacity_bytes)
        out.append(f'<g data-capacity="{capacity_bytes}"><title>capacity '
                   f'{escape(fmt_bytes(capacity_bytes))}</title><line x1="{left}" '
                   f'x2="{width - right}" y1="{_n(y)}" y2="{_n(y)}" stroke="#c00" '
                   f'stroke-dasharray="6,4" stroke-width="1.5"/></g>')
    p = _peak_index(moments)
    px, py = sx(p + 0.5), sy(totals[p])
    peak = moments[p]
    out.append(f'<g data-peak="{p}" data-bytes="{totals[p]}"><title>peak '
               f'{escape(fmt_bytes(totals[p]))} at {escape(str(peak["label"]))} '
               f'({escape(str(peak["step"]))} step)</title>'
               f'<line x1="{_n(px)}" x2="{_n(px)}" y1="{top_pad}" y2="{top_pad + ph}" '
               f'stroke="#000" stroke-width="1.5"/><circle cx="{_n(px)}" cy="{_n(py)}" r="4" '
               f'fill="#000"/><text x="{_n(min(px + 6, width - 200))}" y="{top_pad - 6}">'
               f'peak {escape(fmt_bytes(totals[p]))}: {escape(str(peak["label"]))}</text></g>')
    # hover bands: one transparent column per moment with its values
    for i, m in enumerate(moments):
        parts = [f"{c} {fmt_bytes(b)}" for c, b in m.get("categories", {}).items() if b]
        at = f" at {m['seconds']:.3g} s" if m.get("seconds") is not None else ""
        tip = (f"{m['label']} ({m['step']} step{at}): {fmt_bytes(totals[i])}\n"
               + ", ".join(parts))
        out.append(f'<rect data-moment="{i}" data-bytes="{totals[i]}" x="{_n(sx(i))}" '
                   f'y="{top_pad}" width="{_n(step_w)}" height="{ph}" fill="transparent">'
                   f'<title>{escape(tip)}</title></rect>')
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{top_pad + ph}" '
               f'y2="{top_pad + ph}" stroke="#333"/></svg>')
    return "".join(out)
