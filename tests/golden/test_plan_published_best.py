"""``memplan plan`` against published comparisons (issue #13): where one source measured
several configurations of the *same* workload (model, cluster, sequence length), plan's ranking
of those configurations must put the source's fastest in its top 3.

Rows: ``data/throughput.csv``. Only two groups there compare configurations of one workload,
both from torchtitan's A100 table (``docs/performance.md`` @0413364, FSDP2 on 64 A100-80GB):
Llama-2-13B at 4096 tokens (TP003: no checkpointing, micro-batch 2; TP015: selective op, 2) and
Llama-2-70B at 4096 tokens (TP004: full, 2; TP016: selective op, 1). Each compares two
configurations, so "top 3" holds trivially; the test asks the stronger thing, that the
published best is plan's first. It holds by speed; but memplan's GPU estimate does not fit
TP003, so ``plan`` itself would reject the 13B group (a strict xfail below names the cause). The other rows are not comparisons: TP006/TP007 run different
cluster sizes, TP010-TP013 different sequence lengths, TP005/TP009 a single configuration.

Each configuration is evaluated by plan's ``Evaluator`` (the numbers plan ranks by), on the
source's cluster, with the row's own settings held: FSDP2 (zero 3), bf16-mixed, flash
attention.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from memplan.host import HostSetup
from memplan.model import load_model
from memplan.plan import Cluster, Evaluated, Evaluator
from memplan.recipe import Recipe

DATA = Path(__file__).parent / "data" / "throughput.csv"
with open(DATA, newline="") as _f:
    ROWS = {r["id"]: r for r in csv.DictReader(_f)}

GROUPS = {
    "llama2-13b-64xA100-4k": ("TP003", "TP015"),
    "llama2-70b-64xA100-4k": ("TP004", "TP016"),
}
"""Same model, GPUs, sequence length; the configurations the source compared."""


def _recipe(row: dict[str, str]) -> Recipe:
    ints = ("gpus", "zero", "tp", "pp", "cp", "micro_batch", "seq_len", "grad_accum")
    return Recipe.of(gpus_per_node=8, checkpointing=row["checkpointing"],
                     attention=row["attention"], precision=row["precision"], engine="fsdp2",
                     **{k: int(row[k]) for k in ints})


def _evaluated(group: str) -> dict[str, Evaluated]:
    rows = [ROWS[i] for i in GROUPS[group]]
    same = {(r["model_id"], r["gpus"], r["seq_len"], r["gpu"], r["metric"]) for r in rows}
    assert len(same) == 1, "a group compares configurations of one workload"
    first = rows[0]
    spec = load_model(first["model_id"])
    ev = Evaluator(spec, Cluster(gpu=first["gpu"], gpus=int(first["gpus"]), gpus_per_node=8,
                                 node=first["node"]), HostSetup(load="sharded"))
    out = {r["id"]: ev.evaluate(_recipe(r), full=True) for r in rows}
    assert all(e is not None for e in out.values())
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_published_best_is_in_plans_top_3_by_speed(group: str) -> None:
    """Plan's order of the compared configurations by estimated tokens/s (``rank.ranked``'s
    key) puts the published fastest first. Fit is left out here: see the next test."""
    evaluated = _evaluated(group)
    order = sorted(evaluated, key=lambda i: (-(evaluated[i].tokens_per_second or 0),
                                             -evaluated[i].headroom_bytes))
    rows = [ROWS[i] for i in GROUPS[group]]
    published_best = max(rows, key=lambda r: float(r["value"]))["id"]
    assert published_best in order[:3]
    assert order[0] == published_best, (
        f"plan orders {order} ({[round(evaluated[i].tokens_per_second or 0) for i in order]} "
        f"tokens/s); the source measured {[(r['id'], r['value']) for r in rows]}")


_NO_FIT = (
    "memplan's GPU estimate does not fit TP003 (13B, no checkpointing, micro-batch 2), so "
    "`plan` (which ranks fitting candidates only) would reject it: it predicts 72.6 GiB of "
    "saved activations, 82.5 GiB reserved on an 79.3 GiB A100. Cause not found. Ruled out "
    "(session 16): autocast's fp32 graph, suspected before: with engine fsdp2 the estimate "
    "already draws bf16 activations (parameters gathered in bf16, activations._context). The "
    "72.6 GiB are 46.4 bytes x hidden per token and layer, close to a count by hand of HF's "
    "Llama block (about 47.6: the two RMSNorms' fp32 upcasts and outputs 16, SDPA's q, k, v "
    "and output 8, o_proj's input 2, the MLP's four 13,824-wide tensors 21.6), and "
    "torchtitan's own block saves more, not less: 49.6 bytes x hidden per token measured on "
    "CPU (torchtitan 0.2.0's Llama block at these shapes, bf16, "
    "scripts/measure_torchtitan_block.py, validation/torchtitan_block.json). Not measured: "
    "the 2024 torchtitan the table ran, and its GPU kernels. The 70B group fits since its TP016 row runs checkpointing = op "
    "(torchtitan's per-op policy, the source's 'selective op')")


@pytest.mark.parametrize("group", [
    pytest.param(g, marks=[pytest.mark.xfail(strict=True, reason=_NO_FIT)]
                 if g == "llama2-13b-64xA100-4k" else []) for g in sorted(GROUPS)])
def test_published_configurations_fit(group: str) -> None:
    evaluated = _evaluated(group)
    assert all(e.gpu_fits for e in evaluated.values()), {
        i: round(e.peak_bytes / 2**30, 1) for i, e in evaluated.items()}
