"""Write timing/accuracy.toml (the error band) and print the README accuracy tables from the
published throughput rows, then the held-out rows (``throughput_heldout.csv``: another
publisher's runs, kept out of the band and reported apart).
Run: PYTHONPATH=src python scripts/throughput_accuracy.py"""

from pathlib import Path

from memplan.validate.throughput import band, evaluate, summary

ROOT = Path(__file__).resolve().parent.parent
results = evaluate(ROOT / "tests/golden/data/throughput.csv")
heldout = evaluate(ROOT / "tests/golden/data/throughput_heldout.csv")
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


def table(rows) -> None:
    print("| source | rows | median abs error | p90 abs error | mean signed error |")
    print("|---|---:|---:|---:|---:|")
    for g, s in summary(rows).items():
        print(f"| {g} | {s['rows']} | {s['median_abs']:.0%} | {s['p90_abs']:.0%} | "
              f"{s['mean_signed']:+.0%} |")
    print()
    print("| row | metric | published | predicted | error |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        mark = " (xfail)" if r.xfail else ""
        print(f"| {r.id}{mark} | {r.metric} | {r.published:,.0f} | {r.predicted:,.0f} | "
              f"{r.error:+.0%} |")


table(results)
print()
print("Held out (tests/golden/data/throughput_heldout.csv, not in the band):")
print()
table(heldout)
dense = summary([r for r in heldout if not r.source_group.endswith("-moe")])["all"]
print()
print(f"Held-out dense rows (MoE groups left out): {dense['rows']}, median "
      f"{dense['median_abs']:.0%}, p90 {dense['p90_abs']:.0%}, mean signed "
      f"{dense['mean_signed']:+.0%}.")
