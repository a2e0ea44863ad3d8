"""Per-row direction table of the golden comparison (issue #11): which published GPU peaks memplan
predicts BELOW the measurement, by how much, and which of its terms would have to grow.

An estimate below the measurement is the worst direction for a memory planner ("it said it fits,
then it OOMed"), so this table lists every compared row of
``tests/golden/test_memory_published.py`` with:

* the quantity predicted for the row's counter (``allocated`` / ``reserved`` / ``device`` =
  nvidia-smi / ``band`` = [allocated, nvidia-smi] for an unnamed counter), measured value and
  the signed error of that test (negative: memplan is low);
* ``gap``: GiB the prediction would have to grow to reach the measurement (the top of the band;
  0 when the value is inside or below);
* the moment of memplan's peak and its activations + temporaries there;
* ``grow``: the memplan term the gap points at, by a mechanical rule stated before reading the
  rows (no diagnosis is typed in here):

  - a row in a sequence-length sweep (same source, model, method, GPUs, ZeRO stage; at least 3
    lengths) whose measured growth from the shortest to the longest length is within 25 % of
    memplan's (or smaller), while the shortest length is already low: **fixed** (a term that does
    not scale with tokens: model states, engine buffers, load-time leftovers, allocator or
    context); measured growth more than 25 % above memplan's: **per-token** (activations, logits,
    attention workspace), possibly on top of a fixed term;
  - any other low row: **fixed** when the gap exceeds all activations and temporaries at memplan's
    peak (they would have to more than double), else **per-token or fixed** (undecided from one
    row).

Usage: ``PYTHONPATH=src python scripts/underestimates.py [--check]`` writes
``validation/underestimates.md`` and ``validation/underestimates.json``; ``--check`` exits 1 when
they are stale (``tests/test_underestimates.py``).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "validation" / "underestimates.md"
FIGURES = ROOT / "validation" / "underestimates.json"
SWEEP_MIN_LENGTHS = 3
"""A sweep needs at least three lengths before its slope says anything."""
SLOPE_MARGIN = 0.25
"""Measured growth within +25 % of memplan's counts as "same slope" (README caveat 9 puts the
per-row noise of the data at +-10 %, so two rows can differ by 20 % by noise alone)."""


def _golden():
    sys.path.insert(0, str(ROOT / "tests" / "golden"))
    import test_memory_published as golden  # noqa: PLC0415 - a test module, imported by path
    return golden


def _sweep_key(case) -> tuple:
    r = case.recipe
    return (case.group, case.model_id, r.method.kind, r.method.modules_to_save,
            r.parallelism.gpus, r.parallelism.zero, case.metric)


def _row(golden, case) -> dict[str, object]:
    from memplan import Category, get_device  # noqa: PLC0415
    from memplan.units import GIB  # noqa: PLC0415

    res = golden._predicted(case)
    b = golden.estimate_row(case.model_id, case.recipe, get_device(case.gpu)).worst
    cats = b.categories_at_peak()
    per_token = (cats.get(Category.ACTIVATIONS, 0) + cats.get(Category.TEMPORARY, 0)) / GIB
    gap = max(0.0, case.value_gib - res.hi_gib)
    return {"id": case.id, "group": case.group, "grade": case.grade, "model": case.model_id,
            "seq_len": case.recipe.batch.seq_len, "counter": case.metric,
            "upper_bound": case.upper_bound, "measured_gib": round(case.value_gib, 3),
            "predicted_lo_gib": round(res.floor_gib, 3), "predicted_hi_gib": round(res.hi_gib, 3),
            "error": round(res.error, 4), "gap_gib": round(gap, 3),
            "peak": f"{b.peak_step}/{b.peak_phase}", "per_token_at_peak_gib": round(per_token, 3),
            "status": golden.status(case)}


def _classify(rows: list[dict[str, object]], cases) -> None:
    """Fill ``grow`` (and ``sweep``) per the rule of the module docstring."""
    sweeps: dict[tuple, list[int]] = defaultdict(list)
    for i, c in enumerate(cases):
        sweeps[_sweep_key(c)].append(i)
    for idx in sweeps.values():
        lengths = {rows[i]["seq_len"] for i in idx}
        sweep = len(lengths) >= SWEEP_MIN_LENGTHS and not any(rows[i]["upper_bound"] for i in idx)
        if sweep:
            idx.sort(key=lambda i: rows[i]["seq_len"])
            first, last = rows[idx[0]], rows[idx[-1]]
            measured = last["measured_gib"] - first["measured_gib"]
            ours = last["predicted_hi_gib"] - first["predicted_hi_gib"]
            per_token = measured > ours * (1 + SLOPE_MARGIN) + 1e-9
            fixed = first["gap_gib"] > 0
            label = ("per-token" + (" + fixed" if fixed else "")) if per_token else (
                "fixed" if fixed else "-")
            note = (f"sweep {first['seq_len']}-{last['seq_len']}: measured +{measured:.2f} GiB, "
                    f"memplan +{ours:.2f} GiB; gap at {first['seq_len']}: "
                    f"{first['gap_gib']:.2f} GiB")
        for i in idx:
            r = rows[i]
            if r["error"] >= 0:
                r["grow"], r["why"] = "-", "not low"
            elif sweep:
                r["grow"], r["why"] = label, note
            elif r["gap_gib"] > r["per_token_at_peak_gib"]:
                r["grow"], r["why"] = "fixed", (
                    f"gap {r['gap_gib']:.2f} GiB > activations + temporaries at the peak "
                    f"({r['per_token_at_peak_gib']:.2f} GiB)")
            else:
                r["grow"], r["why"] = "per-token or fixed", (
                    f"gap {r['gap_gib']:.2f} GiB <= activations + temporaries at the peak "
                    f"({r['per_token_at_peak_gib']:.2f} GiB)")


def figures() -> dict[str, object]:
    golden = _golden()
    cases = golden.CASES
    rows = [_row(golden, c) for c in cases]
    _classify(rows, cases)

    def count(sel) -> dict[str, object]:
        rs = [r for r in rows if sel(r)]
        low = [r for r in rs if r["error"] < 0]
        return {"rows": len(rs), "low": len(low), "inside": sum(r["error"] == 0 for r in rs),
                "high": sum(r["error"] > 0 for r in rs),
                "low_share": round(len(low) / len(rs), 4) if rs else 0.0,
                "median_signed_error": round(statistics.median(r["error"] for r in rs), 4)
                if rs else 0.0}

    qwen = "qwen-readme-profiling"
    grow: dict[str, int] = defaultdict(int)
    for r in rows:
        if r["error"] < 0:
            grow[r["grow"]] += 1
    return {"source": "tests/golden/test_memory_published.py via scripts/underestimates.py",
            "definition": "low: signed error < 0, i.e. the measurement lies above the predicted "
                          "quantity (above the top of the band for an unnamed counter)",
            "all": count(lambda r: True), "qwen": count(lambda r: r["group"] == qwen),
            "other": count(lambda r: r["group"] != qwen),
            "A": count(lambda r: r["grade"] == "A"), "B": count(lambda r: r["grade"] == "B"),
            "low_by_term": dict(sorted(grow.items())), "rows": rows}


def render(f: dict[str, object]) -> str:
    out = ["# Underestimates of the golden comparison (issue #11)", "",
           "Generated by `scripts/underestimates.py` from `tests/golden/test_memory_published.py` "
           "(do not edit by hand; the rule for the `grow` column is in the script's docstring).",
           "", f"Definition: {f['definition']}.", "",
           "| rows | compared | low | inside | high | low share | median signed error |",
           "|---|---|---|---|---|---|---|"]
    for key in ("all", "qwen", "other", "A", "B"):
        c = f[key]
        out.append(f"| {key} | {c['rows']} | {c['low']} | {c['inside']} | {c['high']} | "
                   f"{c['low_share']:.1%} | {c['median_signed_error']:+.1%} |")
    out += ["", "Low rows by the term that would have to grow: " + ", ".join(
        f"{k} {v}" for k, v in f["low_by_term"].items()) + ".", "",
        "| id | group | grade | counter | seq | measured GiB | predicted GiB | error | gap GiB | "
        "memplan peak | act+temp at peak GiB | grow | why | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in f["rows"]:
        lo, hi = r["predicted_lo_gib"], r["predicted_hi_gib"]
        pred = f"{hi:.2f}" if lo == hi else f"{lo:.2f}-{hi:.2f}"
        out.append(f"| {r['id']} | {r['group']} | {r['grade']} | {r['counter']}"
                   f"{' (seq max)' if r['upper_bound'] else ''} | {r['seq_len']} | "
                   f"{r['measured_gib']:.2f} | {pred} | {r['error']:+.1%} | {r['gap_gib']:.2f} | "
                   f"{r['peak']} | {r['per_token_at_peak_gib']:.2f} | {r['grow']} | {r['why']} | "
                   f"{r['status']} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    f = figures()
    text, data = render(f), json.dumps(f, indent=1) + "\n"
    if "--check" in argv:
        stale = [p.name for p, want in ((TABLE, text), (FIGURES, data))
                 if not p.is_file() or p.read_text() != want]
        if stale:
            print(f"stale: {', '.join(stale)}; run PYTHONPATH=src python scripts/underestimates.py")
            return 1
        return 0
    TABLE.write_text(text)
    FIGURES.write_text(data)
    c = f["all"]
    print(f"{c['low']} of {c['rows']} compared rows are low ({c['low_share']:.1%}); "
          f"Qwen {f['qwen']['low']}/{f['qwen']['rows']}, other {f['other']['low']}/"
          f"{f['other']['rows']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
