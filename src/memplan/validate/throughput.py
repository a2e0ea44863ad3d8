"""Step-time model against published throughput rows (issue #19): per-row errors, median and
p90 absolute error per source, and the error band every prediction carries.

Rows live in ``tests/golden/data/throughput.csv`` (one published run each, with its citation;
``throughput_heldout.csv`` holds another publisher's rows, reported apart);
``scripts/throughput_accuracy.py`` writes the band to ``timing/accuracy.toml`` and the table in
the README from ``evaluate``. Nothing here is fitted: the rows only check the model.

Signed error of a row: ``predicted / published - 1`` (positive = predicted too fast).
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["RowResult", "evaluate", "summary", "band"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RowResult:
    """One published row and memplan's prediction for it."""

    id: str
    """Row id (``TPnnn``)."""
    source_group: str
    """Publication the row comes from."""
    metric: str
    """``tokens_per_s_per_gpu`` or ``tflops_per_gpu_noncausal``."""
    published: float
    """The published figure."""
    predicted: float
    """memplan's figure for the same configuration."""
    xfail: str
    """Diagnosis of a known miss ("" = expected within tolerance)."""

    @property
    def error(self) -> float:
        """Signed relative error, predicted / published - 1."""
        return self.predicted / self.published - 1


def _extra(text: str) -> dict[str, int | bool | str]:
    """Further recipe keys of a row, ``key=value;key=value`` (the ``extra`` column: settings a
    publication states that the fixed columns do not hold, e.g. ``pp_virtual``); values are
    integers, ``true`` / ``false`` or words (``method=lora``)."""
    def value(v: str) -> int | bool | str:
        v = v.strip()
        if v in ("true", "false"):
            return v == "true"
        return int(v) if v.isdigit() else v
    pairs = (item.split("=", 1) for item in text.split(";") if item.strip())
    return {k.strip(): value(v) for k, v in pairs}


def _predict(row: dict[str, str]) -> float:
    from ..estimate import estimate
    from ..hardware import get_device
    from ..hardware.nodes import get_node
    from ..host import HostSetup, node_hardware
    from ..model import load_model
    from ..recipe import Recipe
    from ..system import with_host_and_time

    ints = ("gpus", "zero", "tp", "pp", "cp", "micro_batch", "seq_len", "grad_accum")
    flags = {k: row[k] == "true" for k in ("compile", "overlap_comm") if row.get(k)}
    r = Recipe.of(gpus_per_node=8, checkpointing=row["checkpointing"], attention=row["attention"],
                  precision=row["precision"], engine=row.get("engine") or "auto", **flags,
                  **{k: int(row[k]) for k in ints}, **_extra(row.get("extra") or ""))
    d = get_device(row["gpu"])
    if row["hbm_gb_per_s"]:
        d = replace(d, hbm_gb_per_s=float(row["hbm_gb_per_s"]))
    peaks = {k: float(row[f"peak_{k}_tflops"]) for k in ("bf16", "fp8")
             if row.get(f"peak_{k}_tflops")}
    if peaks:   # the publication's own statement of its GPUs' peak (row notes)
        d = replace(d, tflops={**(d.tflops or {}), **peaks})
    if row.get("power_limit_w"):   # the publication's stated power limit (row notes)
        d = replace(d, power_limit_w=float(row["power_limit_w"]))
    m = load_model(row["model_id"])
    hw = node_hardware(get_device(row["gpu"]), 8, get_node(row["node"]))
    t = with_host_and_time(estimate(m, r, d), m, r, d, hw, HostSetup()).time
    assert t is not None
    if row["metric"] == "tokens_per_s_per_gpu":
        return t.tokens_per_second_per_gpu
    return t.model_flops_noncausal_per_step / t.step_seconds / t.gpus / 1e12


_EVALUATED: dict[tuple[str, int, int], tuple[RowResult, ...]] = {}


def evaluate(path: str | Path) -> list[RowResult]:
    """Predict every row of a throughput CSV. Kept per file and its size and mtime: the golden
    test and the accuracy figures read the same files when they run in one process."""
    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)
    if key not in _EVALUATED:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        _EVALUATED[key] = tuple(
            RowResult(id=r["id"], source_group=r["source_group"], metric=r["metric"],
                      published=float(r["value"]), predicted=_predict(r), xfail=r["xfail"])
            for r in rows)
    return list(_EVALUATED[key])


def _p90(values: list[float]) -> float:
    """90th percentile, linear interpolation between order statistics (numpy's default)."""
    v = sorted(values)
    pos = 0.9 * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summary(results: list[RowResult]) -> dict[str, dict[str, float]]:
    """Per source group and ``all``: rows, median and p90 absolute error, mean signed error."""
    groups: dict[str, list[RowResult]] = {}
    for r in results:
        groups.setdefault(r.source_group, []).append(r)
    groups["all"] = list(results)
    return {g: {"rows": len(rs), "median_abs": statistics.median(abs(r.error) for r in rs),
                "p90_abs": _p90([abs(r.error) for r in rs]),
                "mean_signed": statistics.fmean(r.error for r in rs)}
            for g, rs in groups.items()}


def band(results: list[RowResult]) -> tuple[float, float]:
    """(smallest, largest) signed error over all rows: a prediction P stands for a measured
    value in ``P / (1 + largest) .. P / (1 + smallest)``."""
    errors = [r.error for r in results]
    return min(errors), max(errors)
