"""Per-rank validation data (issue #11 item 5): ``memplan validate --nproc N`` on every case of
``src/memplan/validate/dist_cases.toml``, written to ``validation/dist_nproc<N>.json`` with the
command that produced it, and a markdown table of it.

Usage (the 4-rank run takes about a minute on 2 cores):
``PYTHONPATH=src python scripts/validate_dist.py --nproc 4``
``PYTHONPATH=src python scripts/validate_dist.py --table validation/dist_nproc4.json``
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--table", type=Path, help="print the table of a saved run instead")
    a = ap.parse_args()
    if a.table:
        print(table(json.loads(a.table.read_text())))
        return
    cmd = [sys.executable, "-m", "memplan", "validate", "--nproc", str(a.nproc), "--format",
           "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    report = json.loads(p.stdout)
    report["command"] = f"memplan validate --nproc {a.nproc} --format json"
    report["exit_code"] = p.returncode
    report["when"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = ROOT / "validation" / f"dist_nproc{a.nproc}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}\n")
    print(table(report))


if __name__ == "__main__":
    main()
