"""Evaluate a long candidate list in worker processes (``fork``), each with its own
``Evaluator`` and memo; the numbers are the estimator's either way.

Candidates are sorted by what their activation simulation depends on (engine and ZeRO stage,
which set the parameters' dtype and gathering; tp, sp, cp, checkpointing, kernel, loss; then pp
and virtual stages, whose stages are composed from the same short simulations; then
micro-batch), and handed out in groups that share tp, sequence parallelism and checkpointing,
whatever their engine, cp and micro-batch: every simulation context belongs to one group (a
context is built from those and the dtypes, kernel and loss inside the group, and one
simulation serves every micro-batch and cp split of its tp as lanes), so a worker that takes a
group runs its simulations for it alone, where contiguous chunks of the sorted list had split
the contexts of one tp and checkpointing across the engines' chunks and both workers ran them.
Groups go out largest first, to whichever worker is free (the 8B, 70B and Mixtral searches
have 35-55 groups, the largest 4-7 % of the candidates). Each worker's memo starts with the
search's lane shapes (``activations.LANE_SHAPES``), as the single-process search's does: one
simulation of a context then serves every micro-batch of it. The rows come back in the
candidates' order whichever worker evaluated them, so the search's output is the one-process
search's, whatever ``--jobs``.
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


def _group(r: Recipe) -> tuple[object, ...]:
    """What every simulation context of ``r`` shares with its group's (module docstring)."""
    p = r.parallelism
    return (p.tp, p.sequence_parallel, repr(r.checkpointing))


def _chunk(indices: list[int]) -> tuple[list[int], list[Evaluated | None]]:
    ev = _STATE.get("ev")
    if ev is None:
        ev = _STATE["ev"] = Evaluator(_JOB["spec"], _JOB["cluster"], _JOB["setup"])  # type: ignore[arg-type]
        ev.memo.update(_JOB["memo"])  # type: ignore[arg-type]
    cands: list[Recipe] = _JOB["candidates"]  # type: ignore[assignment]
    return indices, [ev.evaluate(cands[i]) for i in indices]


def evaluate_all(spec: ModelSpec, cluster: Cluster, setup: HostSetup | None,
                 candidates: list[Recipe], workers: int,
                 progress: Callable[[int, int], None] | None = None,
                 memo: dict[object, object] | None = None) -> Iterator[Evaluated]:
    """Every candidate's ``Evaluated`` (None for those the estimator refuses is dropped), in
    the candidates' order, as one process gives them (the rejected families' ties are broken by
    that order); ``memo``: entries each worker's memo starts with."""
    n = len(candidates)
    groups: dict[tuple[object, ...], list[int]] = {}
    for i in sorted(range(n), key=lambda i: _key(candidates[i])):
        groups.setdefault(_group(candidates[i]), []).append(i)
    tasks = sorted(groups.values(), key=len, reverse=True)
    _JOB.update(spec=spec, cluster=cluster, setup=setup, candidates=candidates,
                memo=dict(memo or {}))
    _STATE.clear()
    out: list[Evaluated | None] = [None] * n
    done = 0
    try:
        with mp.get_context("fork").Pool(workers) as pool:
            for indices, part in pool.imap_unordered(_chunk, tasks):
                for i, e in zip(indices, part, strict=True):
                    out[i] = e
                done += len(part)
                if progress is not None:
                    progress(done, n)
    finally:
        _JOB.clear()
    yield from (e for e in out if e is not None)
