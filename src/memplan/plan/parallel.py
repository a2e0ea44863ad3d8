"""Evaluate a long candidate list in worker processes (``fork``), each with its own
``Evaluator`` and memo; the numbers are the estimator's either way.

Candidates are sorted by what their activation simulation depends on (tp, sp, cp, pp, virtual
stages, micro-batch, checkpointing, kernel, loss) and cut into contiguous chunks, so a worker's
memo is reused inside a chunk.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterator

from ..host import HostSetup
from ..model.spec import ModelSpec
from ..recipe import Recipe
from .evaluate import Cluster, Evaluated, Evaluator

__all__ = ["evaluate_all", "can_fork"]

_STATE: dict[str, Evaluator] = {}
_JOB: dict[str, object] = {}


def can_fork() -> bool:
    """Worker processes need the ``fork`` start method (Linux, macOS)."""
    return "fork" in mp.get_all_start_methods()


def _key(r: Recipe) -> tuple[object, ...]:
    p = r.parallelism
    return (p.tp, p.sequence_parallel, p.cp, p.pp, p.pp_virtual, r.batch.micro_batch,
            repr(r.checkpointing), str(r.platform.attention), str(r.loss.kind))


def _chunk(bounds: tuple[int, int]) -> list[Evaluated | None]:
    ev = _STATE.get("ev")
    if ev is None:
        ev = _STATE["ev"] = Evaluator(_JOB["spec"], _JOB["cluster"], _JOB["setup"])  # type: ignore[arg-type]
    cands: list[Recipe] = _JOB["candidates"]  # type: ignore[assignment]
    return [ev.evaluate(r) for r in cands[bounds[0]:bounds[1]]]


def evaluate_all(spec: ModelSpec, cluster: Cluster, setup: HostSetup | None,
                 candidates: list[Recipe], workers: int,
                 progress: Callable[[int, int], None] | None = None) -> Iterator[Evaluated]:
    """Every candidate's ``Evaluated`` (None for those the estimator refuses is dropped), in
    an order sorted by ``_key``."""
    order = sorted(candidates, key=_key)
    n = len(order)
    size = max(64, n // (workers * 8))
    chunks = [(i, min(n, i + size)) for i in range(0, n, size)]
    _JOB.update(spec=spec, cluster=cluster, setup=setup, candidates=order)
    _STATE.clear()
    done = 0
    try:
        with mp.get_context("fork").Pool(workers) as pool:
            for part in pool.imap(_chunk, chunks):
                done += len(part)
                if progress is not None:
                    progress(done, n)
                yield from (e for e in part if e is not None)
    finally:
        _JOB.clear()
