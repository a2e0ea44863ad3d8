"""HTML for a memplan result: the one-file report (``memplan report --html``) and the result
panel of ``memplan serve`` share the templates and the view built here.

Input is the JSON form of any result memplan writes (``estimate``/``trace --format json``, a
measurement's ``memplan-measure.json``), so a saved file renders exactly like a live one. The
report is a single file: CSS, SVG charts and the data are inline, nothing is fetched, and it
opens from ``file://``. Formatting only: every number comes from the result; comparisons use
``memplan.measure.aggregate.compare``. Needs Jinja2 (the ``web`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..breakdown import Breakdown, Category
from ..errors import ConfigError
from ..units import fmt_bytes, fmt_count
from .svg import CATEGORY_COLOURS, category_bars, timeline_area

__all__ = ["environment", "check_result", "result_view", "render_report", "write_report"]

_ITEM_ROWS = 40  # lines of the "what is allocated at the peak" table (largest first)


def environment() -> Any:
    """The Jinja2 environment of the report templates (autoescaped; ``bytes``/``count``
    filters). ``memplan.web`` adds its page templates on top of the same loader."""
    try:
        import jinja2
    except ImportError:
        raise ConfigError(["HTML output needs Jinja2: pip install 'memplan[web]'."]) from None
    env = jinja2.Environment(loader=jinja2.PackageLoader("memplan.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["bytes"] = lambda b: "?" if b is None else fmt_bytes(b)
    env.filters["count"] = fmt_count
    env.filters["pct"] = lambda x: "n/a" if x is None else f"{x:+.2f}%"
    return env


def check_result(data: Any, *, where: str = "result") -> dict[str, Any]:
    """``data`` if it is a memplan result JSON (an estimate, trace or measurement); otherwise
    a ``ConfigError`` naming what is missing."""
    if not isinstance(data, dict):
        raise ConfigError([f"{where}: expected a JSON object written by memplan "
                           "(estimate/trace --format json, or memplan-measure.json)."])
    missing = [k for k in ("source", "model", "recipe", "gpu") if k not in data]
    if not missing and not data["gpu"].get("per_rank"):
        missing = ["gpu.per_rank"]
    if missing:
        raise ConfigError([f"{where}: not a memplan result: missing {', '.join(missing)}. Give "
                           "the JSON of `memplan estimate/trace --format json` or a "
                           "memplan-measure.json."])
    try:
        Breakdown.from_dict(data)
    except (KeyError, ValueError, TypeError) as e:
        raise ConfigError([f"{where}: malformed memplan result ({type(e).__name__}: {e})."]
                          ) from None
    return data


def _recipe_line(r: Mapping[str, Any]) -> str:
    parts = [str(r.get(k)) for k in ("precision", "optimizer") if r.get(k)]
    if r.get("method"):
        parts.append(f"method={r['method']}")
    if "micro_batch" in r and "seq_len" in r:
        parts.append(f"micro-batch {r['micro_batch']} x {r['seq_len']} tokens")
    if r.get("gpus"):
        parts.append(f"{r['gpus']} GPU(s)")
    for k in ("tp", "pp", "cp", "ep"):
        if int(r.get(k, 1) or 1) > 1:
            parts.append(f"{k}={r[k]}")
    if r.get("zero"):
        parts.append(f"ZeRO-{r['zero']}")
    if r.get("offload") not in (None, "none"):
        parts.append(f"offload={r['offload']}")
    return ", ".join(parts)


def _worst(gpu: Mapping[str, Any]) -> dict[str, Any]:
    return max(gpu["per_rank"], key=lambda r: r["device_total_bytes"])


def result_view(data: Mapping[str, Any]) -> dict[str, Any]:
    """What the templates show of one result: headline numbers, charts and tables."""
    gpu = data["gpu"]
    rank = _worst(gpu)
    capacity = gpu.get("capacity_bytes")
    headroom = gpu.get("headroom_bytes")
    if headroom is None and capacity:
        headroom = capacity - rank["device_total_bytes"]
    formulas: dict[str, str] = {}
    for it in rank["items"]:
        if it.get("formula"):
            formulas.setdefault(it["category"], f"{it['name']}: {it['formula']}")
    items = sorted(rank["items"], key=lambda i: -i["bytes"])
    order = [str(c) for c in Category]
    return {
        "source": data["source"],
        "model": data["model"],
        "model_id": data["model"].get("id", "?"),
        "recipe": data["recipe"],
        "recipe_line": _recipe_line(data["recipe"]),
        "gpu_name": gpu.get("name", "?"),
        "capacity": capacity,
        "fits": gpu.get("fits", headroom is not None and headroom >= 0),
        "headroom": headroom,
        "max_micro_batch": gpu.get("max_micro_batch"),
        "rank": rank,
        "ranks": gpu["per_rank"],
        "peak_allocated": rank["peak_allocated_bytes"],
        "peak_reserved": rank["peak_reserved_bytes"],
        "device_total": rank["device_total_bytes"],
        "peak_label": rank["peak_moment"],
        "peak_step": rank["peak_step"],
        "categories": sorted(((c, b) for c, b in rank["categories"].items() if b),
                             key=lambda cb: order.index(cb[0]) if cb[0] in order else 99),
        "colours": CATEGORY_COLOURS,
        "bars_svg": category_bars([(data["source"], rank["categories"])], formulas=formulas),
        "timeline_svg": timeline_area(rank["timeline"], capacity_bytes=capacity),
        "lines": items[:_ITEM_ROWS],
        "lines_hidden": max(0, len(items) - _ITEM_ROWS),
        "modules": data.get("modules_at_peak") or [],
        "unmodelled": rank.get("unmodelled", []),
        "host": data.get("host"),
        "nvme": data.get("nvme"),
        "time": data.get("time"),
        "notes": list(data["model"].get("notes", [])) + list(rank.get("notes", [])),
    }


def comparison_view(measured: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    """Error per category of ``other`` (an estimate or trace) against ``measured``."""
    from ..measure.aggregate import compare

    rows = compare(Breakdown.from_dict(dict(measured)), Breakdown.from_dict(dict(other)))
    m_rank, o_rank = _worst(measured["gpu"]), _worst(other["gpu"])
    return {"rows": rows, "key": str(other["source"]),
            "bars_svg": category_bars([(f"{other['source']}", o_rank["categories"]),
                                       ("measured", m_rank["categories"])])}


def render_report(data: Any, *, against: Any = None, title: str | None = None) -> str:
    """The one-file HTML report of ``data``; with ``against``, also the error per category of
    the two (one of them should be a measurement: it is taken as the truth).

    Raises:
        ConfigError: when either input is not a memplan result.
    """
    data = check_result(data)
    comparison = None
    if against is not None:
        against = check_result(against, where="--against")
        measured, other = (data, against) if data["source"] == "measure" else (against, data)
        comparison = comparison_view(measured, other)
    view = result_view(data)
    env = environment()
    return env.get_template("report.html").render(
        v=view, comparison=comparison, title=title or f"memplan {view['source']}: "
        f"{view['model_id']} on {view['gpu_name']}",
        data_json=json.dumps(data, separators=(",", ":")).replace("<", "\\u003c"),
        style=env.get_template("style.css").render())


def _read_json(path: Path, where: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError([f"{where}: cannot read {path}: {e.strerror}."]) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError([f"{where}: {path} is not JSON ({e}). Give the output of "
                           "`memplan estimate/trace --format json` or a memplan-measure.json."]
                          ) from None


def write_report(result: Path, out: Path, *, against: Path | None = None) -> Path:
    """``memplan report RESULT.json --html OUT``: read, render and write the one-file report."""
    data = _read_json(result, "RESULT")
    other = _read_json(against, "--against") if against is not None else None
    html = render_report(check_result(data, where=str(result)), against=other)
    try:
        Path(out).write_text(html, encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"--html: cannot write {out}: {e.strerror}."]) from None
    return Path(out)
