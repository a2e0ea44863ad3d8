"""Per-rank validation data (issue #11 item 5): ``memplan validate --nproc N`` on every case of
``src/memplan/validate/dist_cases.toml``, written to ``validation/dist_nproc<N>.json`` with the
command that produced it, and a markdown table of it.

Usage (the 4-rank run takes about a minute on 2 cores):
``PYTHONPATH=src python scripts/validate_dist.py --nproc 4``
``PYTHONPATH=src python scripts/validate_dist.py --table validation/dist_nproc4.json``
``PYTHONPATH=src python scripts/validate_dist.py --nproc 2 --only "deepspeed zero0 bf16"``: run
only the named cases (repeatable) and merge them into the committed file, in table order; the
file's ``merged`` lists each merge after the full run's ``command``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def table(report: dict) -> str:
    rows = ["| case | engine | configured from | ranks | measured peak / rank | estimated | "
            "error | forward / backward / optimizer-step error |", "|---|---|---|---|---|---|---|---|"]
    for c in report["cases"]:
        if c["error"]:
            rows.append(f"| {c['name']} | {c['engine']} | {c['configured_from']} | - | - | - | "
                        f"{c['error'][:80]} | - |")
            continue
        peaks = sorted({x["measured_peak_allocated_bytes"] for x in c["ranks"]})
        errs = sorted({x["estimate_error_pct"] for x in c["ranks"]})
        ph = c["ranks"][0]["phase_error_pct"]
        rows.append(
            f"| {c['name']} | {c['engine']} | {c['configured_from']} | {len(c['ranks'])} | "
            f"{' / '.join(f'{p:,}' for p in peaks)} B | "
            f"{c['ranks'][0]['estimated_peak_allocated_bytes']:,} B | "
            f"{' / '.join(f'{e:+.2f}%' for e in errs)} | "
            + " / ".join(f"{ph[p]:+.1f}%" for p in ("forward", "backward", "optimizer-step")
                         if p in ph) + " |")
    return "\n".join(rows)


def _run_all(nproc: int) -> dict:
    cmd = [sys.executable, "-m", "memplan", "validate", "--nproc", str(nproc), "--format",
           "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    report = json.loads(p.stdout)
    report["command"] = f"memplan validate --nproc {nproc} --format json"
    report["exit_code"] = p.returncode
    report["when"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return report


def _merge(saved: Path, nproc: int, names: list[str]) -> dict:
    """Run the cases ``names`` and put them into the report of ``saved`` (replacing a case of
    the same name), in the order of dist_cases.toml; the report's totals are recomputed."""
    from memplan.validate.distributed import dist_cases, validate_distributed

    new = validate_distributed(nproc=nproc, names=tuple(names)).to_dict()
    report = json.loads(saved.read_text())
    by_name = {c["name"]: c for c in report["cases"]} | {c["name"]: c for c in new["cases"]}
    order = [c.name for c in dist_cases(nproc=nproc)]
    report["cases"] = [by_name[n] for n in order if n in by_name]
    errs = [c["max_abs_error_pct"] for c in report["cases"] if c["max_abs_error_pct"] is not None]
    report["max_abs_error_pct"] = max(errs, default=None)
    report["passed"] = all(c["ok"] for c in report["cases"])
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    only = " ".join(f"--only {n!r}" for n in names)
    report.setdefault("merged", []).append(
        f"{when}: scripts/validate_dist.py --nproc {nproc} {only}")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--table", type=Path, help="print the table of a saved run instead")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="run only this case (repeatable) and merge it into the saved file")
    a = ap.parse_args()
    if a.table:
        print(table(json.loads(a.table.read_text())))
        return
    out = ROOT / "validation" / f"dist_nproc{a.nproc}.json"
    report = _merge(out, a.nproc, a.only) if a.only else _run_all(a.nproc)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}\n")
    print(table(report))


if __name__ == "__main__":
    main()
