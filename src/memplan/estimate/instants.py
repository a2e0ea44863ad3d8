"""The activation instants of one pipeline stage, from its simulated points.

``StageInstants`` is the list ``estimate`` reads moment by moment. It is built only when read:
``memplan plan`` rejects or ranks most candidates on ``peak_allocated`` alone, which needs each
instant's own bytes and backward progress (``StageInstants.phased``, read straight off the
points) and never the named items.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from ..breakdown import ALL_PHASES, Category, Item, Phase
from .activations import Point
from .timeline import Instant, Mark, Marked, Phased, phased_marks

__all__ = ["StageInstants", "instants_of"]


def _walk(points: Sequence[Point], grad_total: int, inflight: float
          ) -> Iterator[tuple[Point, Phase, float, int]]:
    """Per point: its phase, the share of the parameter gradients produced by then (backward
    progress), and the saved activations of the other micro-batches in flight."""
    fwd_end = max((p.saved for p in points if p.phase == "forward"), default=0)
    more = int((inflight - 1) * fwd_end) if inflight > 1 else 0
    produced = 0
    for p in points:
        phase = Phase.FORWARD if p.phase == "forward" else Phase.BACKWARD
        if phase == Phase.BACKWARD:
            produced = p.grads
        yield p, phase, min(1.0, produced / grad_total) if grad_total else 1.0, more


def instants_of(points: Sequence[Point], grad_total: int, inflight: float,
                interleaved: bool) -> list[Instant]:
    """One instant per simulated point: its saved activations and temporaries, the saved
    activations of the other micro-batches the stage holds in flight, and the share of the
    parameter gradients produced so far (backward)."""
    out = []
    for p, phase, progress, more in _walk(points, grad_total, inflight):
        items = [Item(category=Category.ACTIVATIONS, name="saved for backward", bytes=p.saved,
                      formula="tensors autograd saves, op by op (estimate/activations)"),
                 Item(category=Category.TEMPORARY, name="intermediates and activation gradients",
                      bytes=p.temp, formula="live non-saved tensors at this op "
                      "(estimate/activations/graph.py)")]
        if inflight > 1:
            items.append(Item(category=Category.ACTIVATIONS,
                              name=f"{inflight - 1:g} more micro-batches in flight "
                              f"({'interleaved ' if interleaved else ''}1F1B)",
                              bytes=more,
                              formula="1F1B: stage i holds pp - i micro-batches' activations "
                              "(Narayanan et al. 2021, §2.2); interleaved: Megatron-Core "
                              "warm-up chunks, see inflight_microbatches"))
        out.append(Instant(phase, f"{p.phase}: {p.region}", tuple(items), progress=progress))
    return out


class StageInstants(Sequence[Instant]):
    """``instants_of(points, grad_total, inflight, interleaved)``, built on first read;
    ``phased()`` without building it. Read only (a memo shares it between candidates)."""

    __slots__ = ("_args", "_built")

    def __init__(self, points: Sequence[Point], grad_total: int, inflight: float,
                 interleaved: bool) -> None:
        self._args = (points, grad_total, inflight, interleaved)
        self._built: list[Instant] | None = None

    def _list(self) -> list[Instant]:
        if self._built is None:
            self._built = instants_of(*self._args)
        return self._built

    @overload
    def __getitem__(self, i: int) -> Instant: ...

    @overload
    def __getitem__(self, i: slice) -> list[Instant]: ...

    def __getitem__(self, i: int | slice) -> Instant | list[Instant]:
        return self._list()[i]

    def __len__(self) -> int:
        return len(self._args[0])

    def __iter__(self) -> Iterator[Instant]:
        return iter(self._list())

    def phased(self) -> Phased:
        """``timeline.phased(self)`` with the backward frontier, from the points: each
        instant's ``items_bytes`` (saved + temporaries + the micro-batches in flight, the sum
        of its items) and ``progress``, exactly as ``instants_of`` gives them."""
        points, grad_total, inflight, _ = self._args
        by_phase: dict[Phase, list[Marked]] = {p: [] for p in ALL_PHASES}
        for p, phase, progress, more in _walk(points, grad_total, inflight):
            by_phase[phase].append(Mark(progress, p.saved + p.temp + more))
        return phased_marks(by_phase, front=True)
