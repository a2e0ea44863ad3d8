"""Write timing/accuracy.toml (the error band) and print the README accuracy table from the
published throughput rows. Run: PYTHONPATH=src python scripts/throughput_accuracy.py"""

from pathlib import Path

from memplan.validate.throughput import band, evaluate, summary

ROOT = Path(__file__).resolve().parent.parent
results = evaluate(ROOT / "tests/golden/data/throughput.csv")
lo, hi = band(results)
(ROOT / "src/memplan/timing/accuracy.toml").write_text(f"""\
# Written by scripts/throughput_accuracy.py from tests/golden/data/throughput.csv: do not edit.
# Signed error = predicted / published - 1 over every row (xfails included).
[band]
rows = {len(results)}
error_min = {lo:.4f}
error_max = {hi:.4f}
source = "tests/golden/data/throughput.csv ({len(results)} published rows; see its source_ref column)"
""")
print("| source | rows | median abs error | p90 abs error | mean signed error |")
print("|---|---:|---:|---:|---:|")
for g, s in summary(results).items():
    print(f"| {g} | {s['rows']} | {s['median_abs']:.0%} | {s['p90_abs']:.0%} | "
          f"{s['mean_signed']:+.0%} |")
print()
print("| row | metric | published | predicted | error |")
print("|---|---|---:|---:|---:|")
for r in results:
    mark = " (xfail)" if r.xfail else ""
    print(f"| {r.id}{mark} | {r.metric} | {r.published:,.0f} | {r.predicted:,.0f} | "
          f"{r.error:+.0%} |")
