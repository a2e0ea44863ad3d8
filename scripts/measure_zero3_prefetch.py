"""Do DeepSpeed ZeRO-3's ``stage3_prefetch_bucket_size`` and ``stage3_max_live_parameters``
change the live bytes of a real run (issue #11 item 4)? ``memplan validate --nproc 2`` machinery
(torchrun, gloo, CPU, DeepSpeed 0.19.8, the tiny Llama, bf16, the HF Trainer's "auto" buckets)
on four ds_configs exported by memplan that differ only in those two keys; rank 0's and rank 1's
peaks and phase peaks go to ``validation/zero3_prefetch.json``.

Source read (``runtime/zero/partitioned_param_coordinator.py`` ``fetch_sub_module``): once the
trace is complete, each submodule's fetch prefetches the next parameters of the trace up to
``min(stage3_max_live_parameters - available, stage3_prefetch_bucket_size)`` elements;
``__params_to_release`` keeps a parameter gathered when it is used again within
``stage3_max_reuse_distance`` elements (1e9 by default, more than this whole model).

Usage: ``PYTHONPATH=src python scripts/measure_zero3_prefetch.py``
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from memplan.validate.distributed import validate_distributed

ROOT = Path(__file__).resolve().parents[1]
BASE = {"model": "llama", "engine": "deepspeed", "zero": 3, "precision": "bf16-mixed",
        "reduce_bucket_size": 16384, "stage3_param_persistence_threshold": 1280,
        "micro_batch": 2, "seq_len": 128}
VARIANTS = {
    "prefetch 14745 (auto)": {"stage3_prefetch_bucket_size": 14745},
    "prefetch 0": {"stage3_prefetch_bucket_size": 0},
    "prefetch 1e6": {"stage3_prefetch_bucket_size": 1_000_000},
    "prefetch 1e6, max_live 20000": {"stage3_prefetch_bucket_size": 1_000_000,
                                     "stage3_max_live_parameters": 20_000},
}


def _toml() -> str:
    out = []
    for name, keys in VARIANTS.items():
        out.append("[[case]]")
        out += [f"{k} = {json.dumps(v)}" for k, v in {"name": name, **BASE, **keys}.items()]
        out.append("")
    return "\n".join(out)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "cases.toml"
        table.write_text(_toml())
        report = validate_distributed(nproc=2, table=table).to_dict()
    rows = [{"case": c["name"], "config_zero_optimization": json.loads(c["config"])[
                 "zero_optimization"],
             "ranks": [{k: x[k] for k in ("rank", "measured_peak_allocated_bytes",
                                          "estimated_peak_allocated_bytes", "estimate_error_pct",
                                          "measured_phase_peaks")} for x in c["ranks"]],
             "error": c["error"]} for c in report["cases"]]
    out = {"nproc": 2, "backend": "gloo", "device": "cpu", "versions": report["versions"],
           "cases": rows}
    (ROOT / "validation" / "zero3_prefetch.json").write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(r["case"], [x["measured_peak_allocated_bytes"] for x in r["ranks"]], r["error"])


if __name__ == "__main__":
    main()
