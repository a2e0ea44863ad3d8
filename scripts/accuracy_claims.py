"""Write the accuracy figures of README.md and validation/ground_truth_gpu.md from the test and
validate outputs, so that the prose cannot drift from what the tests measure.

Inputs (nothing here is typed by hand):

* the golden comparison with published GPU peaks: ``summary()`` and ``report()`` of
  ``tests/golden/test_memory_published.py`` (the same functions its tests assert on);
* the committed CPU matrix ``validation/cpu_tiny_matrix.jsonl`` (measured by
  ``scripts/measure_tiny_matrix.py``) against ``estimate()``;
* ``validation/cpu_validate_full.json`` (written by ``memplan validate --format json``).

Outputs: ``validation/accuracy.json`` (the figures), and the text between the
``<!-- accuracy-claims:begin -->`` / ``<!-- accuracy-claims:end -->`` markers of README.md and
between the ``<!-- golden-report:begin -->`` / ``<!-- golden-report:end -->`` markers of
validation/ground_truth_gpu.md. ``tests/test_accuracy_claims.py`` fails when either is stale.

Usage: ``PYTHONPATH=src python scripts/accuracy_claims.py [--check]``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GOLDEN_PAGE = ROOT / "validation" / "ground_truth_gpu.md"
FIGURES = ROOT / "validation" / "accuracy.json"
VALIDATE_JSON = ROOT / "validation" / "cpu_validate_full.json"
TINY_JSONL = ROOT / "validation" / "cpu_tiny_matrix.jsonl"
MARKERS = {"readme": ("<!-- accuracy-claims:begin -->", "<!-- accuracy-claims:end -->"),
           "throughput": ("<!-- throughput-claims:begin -->", "<!-- throughput-claims:end -->"),
           "golden": ("<!-- golden-report:begin -->", "<!-- golden-report:end -->")}


def _golden():
    sys.path.insert(0, str(ROOT / "tests" / "golden"))
    import test_memory_published as golden  # noqa: PLC0415 - a test module, imported by path
    return golden


def tiny_matrix_figures() -> dict[str, object]:
    """Estimate vs the committed CPU matrix: every measured first and steady step."""
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT / "tests"))
    from test_activation_accuracy import _estimate  # noqa: PLC0415

    rows = [json.loads(line) for line in TINY_JSONL.read_text().splitlines() if line.strip()]
    ran = [r for r in rows if "error" not in r]
    errs = []
    for r in ran:
        rank = _estimate(r["model"], r["batch"], r["seq"], r["precision"], r["attn"],
                         r["grad_ckpt"])
        for est, key in ((rank.first_step_peak_allocated_bytes, "step0"),
                         (rank.steady_peak_allocated_bytes, "step1")):
            errs.append(abs(est - r[key]["peak_bytes"]) / r[key]["peak_bytes"] * 100)
    return {"configurations": len(rows), "ran": len(ran), "failed_to_build": len(rows) - len(ran),
            "failed": sorted({f"{r['model']} {r['attn']}" for r in rows if "error" in r}),
            "peaks": len(errs), "max_abs_error_pct": round(max(errs), 2),
            "median_abs_error_pct": round(statistics.median(errs), 2),
            "within_2pct": sum(e <= 2.0 for e in errs)}


def validate_figures() -> dict[str, object]:
    d = json.loads(VALIDATE_JSON.read_text())
    harness: dict[str, int] = {}
    for c in d["cases"]:
        h = c.get("harness", "memplan")
        harness[h] = harness.get(h, 0) + 1
    framework = [c for c in d["cases"] if c.get("harness", "memplan") != "memplan"]
    fw_errs = [abs(c["estimate_error_pct"]) for c in framework
               if not c["differs_from_framework"] and c["estimate_error_pct"] is not None]
    return {"cases": len(d["cases"]), "harness": harness, "quick": d["quick"],
            "framework_cases": len(fw_errs),
            "framework_max_abs_error_pct": round(max(fw_errs), 2) if fw_errs else None,
            "differs": {c["name"]: round(c["estimate_error_pct"], 1) for c in framework
                        if c["differs_from_framework"]},
            "max_abs_error_pct": round(d["max_abs_error_pct"], 2),
            "median_abs_error_pct": round(d["median_abs_error_pct"], 2),
            "trace_max_abs_error_pct": round(d["trace_max_abs_error_pct"], 2),
            "passed": d["passed"]}


def throughput_figures() -> dict[str, object]:
    """Per-source errors of the step-time model on the published rows
    (tests/golden/data/throughput.csv, the rows tests/golden/test_throughput_published.py checks)."""
    from memplan.validate.throughput import evaluate, summary  # noqa: PLC0415

    rows = evaluate(ROOT / "tests" / "golden" / "data" / "throughput.csv")
    held = evaluate(ROOT / "tests" / "golden" / "data" / "throughput_heldout.csv")
    return {"summary": {g: {k: round(v, 4) for k, v in s.items()}
                        for g, s in summary(rows).items()},
            "xfails": sum(1 for r in rows if r.xfail),
            "heldout": {g: {k: round(v, 4) for k, v in s.items()}
                        for g, s in summary(held).items() if g != "all"}}


OOS_JSONL = ROOT / "validation" / "out_of_sample.jsonl"
OOS_PAGE = ROOT / "validation" / "out_of_sample.md"


def _oos():
    sys.path.insert(0, str(ROOT / "scripts"))
    import out_of_sample as oos  # noqa: PLC0415

    rows = [json.loads(x) for x in OOS_JSONL.read_text().splitlines() if x.strip()]
    return oos, oos.refresh(rows)


def figures() -> dict[str, object]:
    oos, rows = _oos()
    return {"golden": _golden().summary(), "tiny_matrix": tiny_matrix_figures(),
            "validate": validate_figures(), "throughput": throughput_figures(),
            "out_of_sample": oos.summary(rows)}


def render_oos_page() -> str:
    oos, rows = _oos()
    return "\n".join([
        "# Out-of-sample matrix", "",
        "Generated by `scripts/accuracy_claims.py` (do not edit by hand) from the measurements in "
        "`validation/out_of_sample.jsonl`, re-estimated with the estimator of the commit. The rows "
        "are the first ones of a seeded draw (`scripts/out_of_sample.py`, seed "
        f"{oos.SEED}) from settings the estimator was not developed on: hidden 64-384, 1 or 3 "
        "layers, vocab 512 or 3000, sequences 320-4096, batch 1-3, fp32 / bf16 autocast / "
        "bf16-true, eager / sdpa, with and without full checkpointing, AdamW / Adam / SGD, full / "
        "LoRA (q, v) / freeze. Measured on CPU (live tensor bytes, two steps). "
        "`tests/test_out_of_sample.py` requires every row within 5 % on the whole peak, or a "
        "measured cause, or a listed unexplained miss; activations + temporaries at the peak are "
        "reported, not bounded.", "",
        "Fixed after the first run: " + oos.SDPA_MATH_UPCAST, "",
        "Fixed after the second run: " + oos.EAGER_16BIT_SOFTMAX_DROPOUT, "",
        "Re-run: the 3 GPT-2 LoRA rows failed in the first run because memplan's measuring "
        "harness wrapped only `nn.Linear` and GPT-2's attention is a `Conv1D`; since LoRA "
        "targets come from the model's own linear layers (issue #15) they run, and were "
        "measured again.", "",
        oos.table(rows), ""])


def render_throughput(f: dict) -> str:
    t = f["throughput"]
    lines = ["Step time against published runs (`tests/golden/test_throughput_published.py`, "
             f"+-35 %, nothing fitted; {t['xfails']} rows are strict xfails with a diagnosis):",
             "", "| source | rows | median abs error | p90 abs error | mean signed error |",
             "|---|---:|---:|---:|---:|"]
    for g, s in t["summary"].items():
        lines.append(f"| {g} | {s['rows']:.0f} | {s['median_abs']:.0%} | {s['p90_abs']:.0%} | "
                     f"{s['mean_signed']:+.0%} |")
    for g, s in t["heldout"].items():
        lines.append(f"| held out: {g} | {s['rows']:.0f} | {s['median_abs']:.0%} | "
                     f"{s['p90_abs']:.0%} | {s['mean_signed']:+.0%} |")
    return "\n".join(lines)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def render_readme(f: dict) -> str:
    g, t, v, o = f["golden"], f["tiny_matrix"], f["validate"], f["out_of_sample"]
    a, b, al = g["A"], g["B"], g["all"]
    harness = ", ".join(f"{n} {h}" for h, n in sorted(v["harness"].items()))
    return "\n".join([
        f"- the committed matrix (`validation/cpu_tiny_matrix.jsonl`: {t['configurations']} "
        f"configurations = 6 architectures x 3 batch/sequence sizes x fp32 / bf16 autocast x "
        f"eager / sdpa x with and without full checkpointing, AdamW; {t['failed_to_build']} "
        f"({', '.join(t['failed'])}) do not build, so {t['ran']} ran; first and steady step = "
        f"{t['peaks']} peaks): **max error {t['max_abs_error_pct']:.2f}%, median "
        f"{t['median_abs_error_pct']:.2f}%, {t['within_2pct']} of {t['peaks']} within 2%**. "
        f"In-sample: the activation estimator was developed against this matrix;",
        f"- `memplan validate` full matrix (`validation/cpu_validate_full.json`, {v['cases']} "
        f"cases; harness: {harness}): estimate **max {v['max_abs_error_pct']:.2f}%, median "
        f"{v['median_abs_error_pct']:.2f}%**, trace max {v['trace_max_abs_error_pct']:.2f}% "
        f"(the trace shares memplan's tracker and workload builder with the measurement, so it "
        f"shows only that fake tensors behave like real ones). The framework cases (HF Trainer "
        f"with its default TrainingArguments, PEFT LoraConfig defaults, Accelerate, a plain "
        f"loop), measured with PyTorch's own MemTracker: **max "
        f"{v['framework_max_abs_error_pct']:.2f}% over {v['framework_cases']}**; where the "
        f"framework default differs from memplan's assumption and the estimator does not follow "
        f"it, the case says why and is reported outside the bound: "
        + ", ".join(f"{n} {e:+.1f}%" for n, e in v["differs"].items()) + ";",
        f"- out of sample (`validation/out_of_sample.md`: {o['ran']} of the first {o['drawn']} "
        f"configurations of a seeded draw ran, none of them developed on): whole peak **max "
        f"{o['max_abs_peak_error_pct']:.2f}%, median {o['median_abs_peak_error_pct']:.2f}%**, "
        f"{o['peak_outside_5pct']} outside 5% ({o['outside_explained']} with a measured cause, "
        f"{o['peak_outside_5pct'] - o['outside_explained']} unexplained, listed in "
        f"`tests/test_out_of_sample.py`); activations + temporaries at the "
        f"peak max {o['max_abs_act_tmp_error_pct']:.2f}%, median "
        f"{o['median_abs_act_tmp_error_pct']:.2f}%, {o['act_tmp_outside_5pct']} outside 5%;",
        f"- published GPU peaks (`tests/golden/test_memory_published.py`, {al['rows']} rows "
        f"compared, {al['upper_bound_rows']} of them checked at both ends of their sequence "
        f"range; {g['fit_rows']} fit/no-fit row): **{al['pass']} pass, {al['xfail']} outside "
        f"tolerance with a measured cause (strict xfail), {al['miss']} unexplained misses**; "
        f"median absolute error over the fixed-length rows "
        f"{_pct(a['median_abs_error_fixed_length'])} "
        f"on A rows, {_pct(b['median_abs_error_fixed_length'])} on B rows, "
        f"{_pct(al['median_abs_error_fixed_length'])} overall against a bound of "
        f"{_pct(g['tolerance']['median_bound'])} set by the data's noise ("
        f"{'met' if al['median_abs_error_fixed_length'] <= g['tolerance']['median_bound'] else 'not met: a strict xfail'}). "
        f"Every row, cause and miss: `validation/ground_truth_gpu.md`.",
    ])


def render_golden() -> str:
    g = _golden()
    s = g.summary()["all"]
    return "\n".join([
        "Generated by `scripts/accuracy_claims.py` from `tests/golden/test_memory_published.py`"
        " (do not edit by hand).", "",
        f"Of the {s['rows']} rows compared, {s['pass']} pass within tolerance, {s['xfail']} are "
        f"outside it with a measured cause (`XFAIL`, strict), and {s['miss']} are outside it "
        f"with no measured cause (`MISSES`: counted as failures, not xfails).", "",
        g.report()])


def _replace(text: str, which: str, body: str) -> str:
    begin, end = MARKERS[which]
    i, j = text.index(begin) + len(begin), text.index(end)
    return text[:i] + "\n" + body + "\n" + text[j:]


def current(text: str, which: str) -> str:
    begin, end = MARKERS[which]
    return text[text.index(begin) + len(begin):text.index(end)].strip("\n")


def main(argv: list[str]) -> int:
    f = figures()
    readme, golden = render_readme(f), render_golden()
    if "--check" in argv:
        stale = [p.name for p, w, body in ((README, "readme", readme),
                                            (README, "throughput", render_throughput(f)),
                                            (GOLDEN_PAGE, "golden", golden))
                 if current(p.read_text(), w) != body]
        stale += [FIGURES.name] if json.loads(FIGURES.read_text()) != f else []
        stale += [OOS_PAGE.name] if OOS_PAGE.read_text() != render_oos_page() else []
        sys.stderr.write(f"stale: {', '.join(stale)}\n" if stale else "")
        return 1 if stale else 0
    FIGURES.write_text(json.dumps(f, indent=1, sort_keys=True) + "\n")
    README.write_text(_replace(_replace(README.read_text(), "readme", readme), "throughput",
                               render_throughput(f)))
    GOLDEN_PAGE.write_text(_replace(GOLDEN_PAGE.read_text(), "golden", golden))
    OOS_PAGE.write_text(render_oos_page())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
