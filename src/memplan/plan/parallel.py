"""Evaluate a long candidate list in worker processes (``fork``), each with its own
``Evaluator`` and memo; the numbers are the estimator's either way.

Candidates are sorted by what their activation simulation depends on (engine and ZeRO stage,
which set the parameters' dtype and gathering; tp, sp, cp, checkpointing, kernel, loss; then pp
and virtual stages, whose stages are composed from the same short simulations; then
micro-batch) and cut into contiguous chunks, so a worker's memo is reused inside a chunk. Each
worker's memo starts with the search's lane shapes (``activations.LANE_SHAPES``), as the
single-process search's does: one simulation of a context then serves every micro-batch of it,
in whichever worker meets the context first.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterator

from ..host import HostSetup
from ..model.spec import ModelSpec
from ..recipe import Recipe
from .evaluate import Cluster, Evaluated, Evaluator

__all__ = ["evaluate_all", "can_fork", "usable_cores"]

_STATE: dict[str, Evaluator] = {}
_JOB: dict[str, object] = {}


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one: a container's
    or ``taskset``'s limit, not the machine's count)."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def can_fork() -> bool:
    """Worker processes need the ``fork`` start method (Linux, macOS)."""
    return "fork" in mp.get_all_start_methods()


def _key(r: Recipe) -> tuple[object, ...]:
    p = r.parallelism
    return (str(r.engine_kind), p.zero, p.tp, p.sequence_parallel, p.cp, repr(r.checkpointing),
            str(r.platform.attention), str(r.loss.kind), p.pp, p.pp_virtual, r.batch.micro_batch)


def _chunk(bounds: tuple[int, int]) -> list[Evaluated | None]:
    ev = _STATE.get("ev")
    if ev is None:
        ev = _STATE["ev"] = Evaluator(_JOB["spec"], _JOB["cluster"], _JOB["setup"])  # type: ignore[arg-type]
        ev.memo.update(_JOB["memo"])  # type: ignore[arg-type]
    cands: list[Recipe] = _JOB["candidates"]  # type: ignore[assignment]
    return [ev.evaluate(r) for r in cands[bounds[0]:bounds[1]]]


def evaluate_all(spec: ModelSpec, cluster: Cluster, setup: HostSetup | None,
                 candidates: list[Recipe], workers: int,
                 progress: Callable[[int, int], None] | None = None,
                 memo: dict[object, object] | None = None) -> Iterator[Evaluated]:
    """Every candidate's ``Evaluated`` (None for those the estimator refuses is dropped), in
    an order sorted by ``_key``; ``memo``: entries each worker's memo starts with."""
    order = sorted(candidates, key=_key)
    n = len(order)
    size = max(64, n // (workers * 8))
    chunks = [(i, min(n, i + size)) for i in range(0, n, size)]
    _JOB.update(spec=spec, cluster=cluster, setup=setup, candidates=order, memo=dict(memo or {}))
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
