"""``plan``: the fastest configurations of a training run that fit a cluster, and why the
others do not (issue #13).

``plan(spec, base, cluster, fixed=...)`` enumerates the search space (``space.py``), estimates
every candidate with the estimator itself (``evaluate.py``: one model, reused work) and ranks
them (``rank.py``). ``size`` (``size.py``) finds the smallest cluster that fits.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigError
from ..estimate.activations import LANE_SHAPES
from ..host import HostSetup
from ..model.spec import ModelSpec
from ..recipe import Recipe
from .evaluate import Cluster, Evaluated, Evaluator
from .parallel import can_fork, evaluate_all
from .rank import Rejected, pareto, ranked, rejected_families
from .space import FUSED_NOTE, SEARCHED, Space

__all__ = ["plan", "PlanResult", "Cluster", "Evaluated", "Evaluator", "Space", "SEARCHED",
           "Rejected", "make_space"]

Progress = Callable[[int, int], None]
"""Called with (done, total) while a search runs."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanResult:
    """A finished search."""

    model_id: str
    """The model planned."""
    cluster: Cluster
    """Where it runs."""
    rows: tuple[Evaluated, ...]
    """Every candidate evaluated."""
    seconds: float
    """Wall time of enumeration and evaluation."""
    global_batch: int | None
    """Sequences per step held across candidates (None: micro-batch and accumulation fixed)."""
    rejected: tuple[Rejected, ...] = ()
    """Families with no fitting candidate, least overflowing first (``rank.py``)."""
    notes: tuple[str, ...] = field(default=())
    """Assumptions of the search."""

    @property
    def candidates_evaluated(self) -> int:
        return len(self.rows)

    @property
    def ranked(self) -> list[Evaluated]:
        return ranked(list(self.rows))

    @property
    def pareto(self) -> list[Evaluated]:
        return pareto(list(self.rows))

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        best = self.ranked
        return {"model": self.model_id, "cluster": {
                    "gpu": self.cluster.gpu, "gpus": self.cluster.gpus,
                    "gpus_per_node": self.cluster.gpus_per_node, "nodes": self.cluster.nodes,
                    "node": self.cluster.node},
                "global_batch": self.global_batch,
                "candidates_evaluated": self.candidates_evaluated,
                "candidates_fitting": len(best), "seconds": round(self.seconds, 3),
                "notes": list(self.notes),
                "top": [e.to_dict() for e in best[:top]],
                "pareto": [e.to_dict() for e in self.pareto],
                "rejected_families": [r.to_dict() for r in self.rejected]}


def make_space(spec: ModelSpec, base: Recipe, cluster: Cluster, fixed: frozenset[str],
               global_batch: int | None,
               only: frozenset[tuple[Any, ...]] | None = None) -> Space:
    """The search space, with the global batch resolved: given, or the recipe's own when
    micro-batch and accumulation are both fixed, else one sequence per GPU."""
    notes = []
    if global_batch is None and not {"micro_batch", "grad_accum"} <= fixed:
        global_batch = cluster.gpus
        notes.append(f"global batch not given: {global_batch} sequences per step (one per "
                     "GPU); set --global-batch to hold yours")
    if global_batch is not None and global_batch < 1:
        raise ConfigError([f"--global-batch {global_batch}: must be at least 1 sequence."])
    space = Space(base=base, fixed=fixed, gpus=cluster.gpus,
                  gpus_per_node=cluster.gpus_per_node, global_batch=global_batch,
                  only=only, notes=tuple(notes))
    return replace(space, notes=(*notes, FUSED_NOTE)) if space.fused else space


def plan(spec: ModelSpec, base: Recipe, cluster: Cluster, *, fixed: frozenset[str] = frozenset(),
         global_batch: int | None = None, setup: HostSetup | None = None,
         progress: Progress | None = None, evaluator: Evaluator | None = None,
         only: frozenset[tuple[Any, ...]] | None = None,
         workers: int = 1) -> PlanResult:
    """Evaluate every candidate of the search space on ``cluster`` (in ``workers`` processes
    when more than one and the search is over 500 candidates).

    Raises:
        ConfigError: the search space is empty (the reasons: batch, degrees, fixed keys).
    """
    with _fewer_collections():
        return _plan(spec, base, cluster, fixed=fixed, global_batch=global_batch, setup=setup,
                     progress=progress, evaluator=evaluator, only=only, workers=workers)


GC_GEN0 = 100_000
"""First-generation threshold of CPython's collector during a search (default 700). The op
graphs a search builds and drops are millions of small objects freed by reference counting,
while the evaluator's memo only grows; at the default threshold the collector keeps
re-scanning that memo (gc module docs: collections are triggered by allocations minus
deallocations exceeding the threshold). Measured on the 8B 1 x 8 search: 27.0 CPU s at 700,
22.7 at 100,000, 23.3 with the collector off (shared machine). The numbers are the same."""


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Raise the first-generation threshold to ``GC_GEN0`` for the search, then restore it."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], GC_GEN0), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _plan(spec: ModelSpec, base: Recipe, cluster: Cluster, *, fixed: frozenset[str],
          global_batch: int | None, setup: HostSetup | None, progress: Progress | None,
          evaluator: Evaluator | None, only: frozenset[tuple[Any, ...]] | None,
          workers: int) -> PlanResult:
    t0 = time.perf_counter()
    space = make_space(spec, base, cluster, fixed, global_batch, only)
    ev = evaluator or Evaluator(spec, cluster, setup)
    candidates = list(space.recipes(spec))
    if not candidates:
        raise ConfigError([_empty_reason(spec, space)])
    # the activation simulations of one context run for all these shapes at once (the local
    # sequence of activations._context; prompt tuning's longer one only misses the lanes)
    shapes: dict[int, set[tuple[int, int]]] = {}
    for r in candidates:
        shapes.setdefault(r.parallelism.tp, set()).add(
            (r.batch.micro_batch, -(-r.batch.seq_len // r.parallelism.cp)))
    old = ev.memo.get(LANE_SHAPES, {})
    ev.memo[LANE_SHAPES] = {tp: tuple(sorted(v | set(old.get(tp, ()))))  # type: ignore
                            for tp, v in shapes.items()}
    rows = []
    if workers > 1 and len(candidates) >= 500 and evaluator is None and can_fork():
        rows = list(evaluate_all(spec, cluster, setup, candidates, workers, progress,
                                 memo={LANE_SHAPES: ev.memo[LANE_SHAPES]}))
    else:
        for i, r in enumerate(candidates):
            e = ev.evaluate(r)
            if e is not None:
                rows.append(e)
            if progress is not None and (i % 64 == 0 or i == len(candidates) - 1):
                progress(i + 1, len(candidates))
    if not rows:
        raise ConfigError([f"none of the {len(candidates)} candidate recipes applies to "
                           f"{spec.id} (the estimator refused each); relax the fixed keys "
                           f"({', '.join(sorted(fixed)) or 'none'})."])
    rejected = [replace(r, closest=ev.evaluate(r.closest.recipe, full=True) or r.closest)
                if not r.closest.complete else r for r in rejected_families(rows)]
    return PlanResult(model_id=spec.id, cluster=cluster, rows=tuple(rows),
                      seconds=time.perf_counter() - t0, global_batch=space.global_batch,
                      rejected=tuple(rejected), notes=space.notes)


def _empty_reason(spec: ModelSpec, space: Space) -> str:
    """Why no candidate exists: the batch, or the fixed keys."""
    from .space import divisors

    gb = space.global_batch
    dps = sorted({space.gpus // (tp * cp * pp) for tp, cp, pp, *_ in space.degrees(spec)})
    if not dps:
        return (f"no tp/cp/pp/ep degrees divide both {spec.id} and {space.gpus} GPUs "
                f"({space.gpus_per_node} per node) with the fixed keys "
                f"{', '.join(sorted(space.fixed & set(SEARCHED))) or '(none)'}; relax them.")
    if gb is not None and all(gb % dp or not space.batches(dp) for dp in dps):
        good = sorted({m * dp for dp in dps for m in divisors(max(dps) * 4)})[:8]
        return (f"no micro-batch x gradient accumulation makes a global batch of {gb} sequences "
                f"on data-parallel sizes {', '.join(map(str, dps))} (the global batch must be a "
                f"multiple of dp, and of the fixed micro-batch/accumulation). Try "
                f"--global-batch in {', '.join(map(str, good))}.")
    return (f"the fixed keys {', '.join(sorted(space.fixed & set(SEARCHED))) or '(none)'} "
            "leave no runnable combination of engine, ZeRO stage and offload (see "
            "`memplan estimate` with them for the reason); relax one of them.")
