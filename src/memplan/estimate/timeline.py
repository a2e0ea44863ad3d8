"""The step timeline: which lines are allocated at each moment of the first and steady step.

A ``Line`` is live during whole phases; the moments of a phase are the phase's instants where
something changes (``Activity`` adds bytes that vary within a phase, e.g. saved activations
growing layer by layer). The peak is the largest moment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Union

from ..breakdown import ALL_PHASES, Item, Moment, Phase, Pool, Step
from .lines import Line

__all__ = ["Instant", "LineSums", "Mark", "Marked", "Phased", "line_sums", "moments",
           "peak_allocated", "phased", "phased_marks"]


@dataclass(frozen=True, slots=True)
class Instant:
    """An instant within a phase and the bytes that exist only around it."""

    phase: Phase
    label: str
    items: tuple[Item, ...] = ()
    progress: float = 1.0
    """Share of the parameter gradients produced by this instant (backward)."""
    items_bytes: int = field(init=False, compare=False, default=0)
    """``sum(i.bytes for i in items)``, summed once (``peak_allocated`` reads it for every
    candidate that shares the instant)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "items_bytes", sum(i.bytes for i in self.items))


def _live(lines: Iterable[Line], step: Step, phase: Phase) -> list[Line]:
    """The allocated lines live during ``phase`` of ``step`` (lazy ones only from the first
    optimizer step on)."""
    return [ln for ln in lines if ln.item.pool == Pool.ALLOCATED and phase in ln.phases
            and not (step == Step.FIRST and ln.lazy and phase != Phase.OPTIMIZER)]


def _stepped_away(ln: Line, phase: Phase, progress: float, last: bool) -> bool:
    """A line of the optimizer in backward that is not live at this backward instant:
    ``stepping = "during"`` lines (one parameter's gradient and step temporaries) exist only
    between the first and the last instant, ``"after"`` ones only at the last."""
    return phase == Phase.BACKWARD and (
        (ln.stepping == "during" and (progress <= 0.0 or last))
        or (ln.stepping == "after" and not last))


def _static(lines: Iterable[Line], step: Step, phase: Phase,
            progress: float = 1.0, last: bool = True) -> tuple[Item, ...]:
    out = []
    for ln in _live(lines, step, phase):
        if _stepped_away(ln, phase, progress, last):
            continue
        item = ln.item
        if ln.grows and phase == Phase.BACKWARD and progress < 1.0:
            item = replace(item, bytes=round(item.bytes * progress),
                           name=f"{item.name}, {progress:.0%} produced")
        out.append(item)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class LineSums:
    """What a group of lines adds to each (step, phase) of ``peak_allocated``: the live lines'
    bytes, and the bytes of its growing lines (the gradients) in the backward."""

    sums: dict[Step, dict[Phase, int]]
    growing: dict[Step, tuple[int, ...]]
    stepping: bool
    """A line of the optimizer in backward is among them (``_peak_stepping``'s case)."""


def line_sums(lines: Iterable[Line]) -> LineSums:
    """The per-(step, phase) sums of ``lines`` in one pass: integers, so the sums of a list's
    groups add up to the list's own."""
    sums = {Step.FIRST: dict.fromkeys(ALL_PHASES, 0), Step.STEADY: dict.fromkeys(ALL_PHASES, 0)}
    first, steady = sums[Step.FIRST], sums[Step.STEADY]
    growing: dict[Step, list[int]] = {Step.FIRST: [], Step.STEADY: []}
    bwd, opt, allocated = Phase.BACKWARD, Phase.OPTIMIZER, Pool.ALLOCATED
    for ln in lines:
        item = ln.item
        if item.pool != allocated:
            continue
        if ln.stepping and bwd in ln.phases:
            return LineSums(sums=sums, growing={}, stepping=True)
        b = item.bytes
        for ph in ln.phases:
            if ph not in steady:
                continue
            steady[ph] += b
            in_first = not (ln.lazy and ph != opt)
            if in_first:
                first[ph] += b
            if ln.grows and ph == bwd:
                growing[Step.STEADY].append(b)
                if in_first:
                    growing[Step.FIRST].append(b)
    return LineSums(sums=sums, growing={k: tuple(v) for k, v in growing.items()},
                    stepping=False)


class Mark(NamedTuple):
    """What ``peak_allocated`` reads of an instant: its backward progress and own bytes."""

    progress: float
    items_bytes: int


Marked = Union[Instant, Mark]
"""An instant, or its ``Mark``."""


@dataclass(frozen=True, slots=True)
class Phased:
    """Instants by phase, as ``peak_allocated`` reads them."""

    by_phase: dict[Phase, list[Marked]]
    most: dict[Phase, int]
    """The largest ``items_bytes`` of each phase's instants (0 without instants)."""
    front: list[Marked] | None = None
    """The backward instants no other backward instant dominates (``_front``); None: not
    computed, ``by_phase`` is read whole."""


def phased(instants: Sequence[Instant], *, front: bool = False) -> Phased:
    """``instants`` by phase, in order, with each phase's largest own bytes (``front``: and
    the backward frontier, for a ``Phased`` many candidates read)."""
    by_phase: dict[Phase, list[Marked]] = {p: [] for p in ALL_PHASES}
    for inst in instants:
        by_phase.setdefault(inst.phase, []).append(inst)
    return phased_marks(by_phase, front=front)


def phased_marks(by_phase: dict[Phase, list[Marked]], *, front: bool = False) -> Phased:
    """``Phased`` of instants (or their marks) already grouped by phase, in order."""
    return Phased(by_phase=by_phase, most={p: max([i.items_bytes for i in mine], default=0)
                                           for p, mine in by_phase.items()},
                  front=_front(by_phase[Phase.BACKWARD]) if front else None)


def _front(mine: Sequence[Marked]) -> list[Marked]:
    """The instants of ``mine`` that no other dominates, i.e. has at least the same progress and
    at least the same own bytes. A backward instant's total in ``_phase_peak`` is its own bytes
    plus ``fixed + sum(round(b x progress))`` over the growing lines' bytes ``b >= 0``, which
    never falls as progress rises (IEEE products and ``round`` are monotone), so a dominated
    instant is never the only largest one: the max over the frontier is the max over all."""
    out: list[Marked] = []
    best: int | None = None
    for i in sorted(mine, key=lambda i: i.progress, reverse=True):
        if best is None or i.items_bytes > best:
            out.append(i)
            best = i.items_bytes
    return out


def peak_allocated(lines: Sequence[Line], instants: Sequence[Instant] = (),
                   groups: Sequence[LineSums] | None = None,
                   phases: Phased | None = None) -> int:
    """``max(m.allocated_bytes for m in moments(lines, instants))`` without building the
    moments: per (step, phase) the live lines' bytes, with a growing line at
    ``round(bytes x progress)`` as ``_static`` writes it, plus each instant's own bytes. The
    live lines' bytes of every (step, phase) are summed in one pass over the lines
    (``line_sums``; ``groups``: those of consecutive groups making up ``lines``, when already
    summed; ``phases``: ``phased(instants)``, when already grouped); the optimizer in backward
    (``stepping`` lines) takes ``_peak_stepping``."""
    phases = phases if phases is not None else phased(instants)
    by_phase, most = phases.by_phase, phases.most
    groups = groups if groups is not None else (line_sums(lines),)
    if any(g.stepping for g in groups):
        return _peak_stepping(lines, phases)
    bwd = Phase.BACKWARD
    totals = []
    for step in (Step.FIRST, Step.STEADY):
        grow = [b for g in groups for b in g.growing[step]]
        for phase in ALL_PHASES:
            whole = sum(g.sums[step][phase] for g in groups)
            mine = by_phase[phase]
            if phase == bwd and grow and phases.front is not None and min(grow) >= 0:
                mine = phases.front
            totals.append(_phase_peak(whole, grow if phase == bwd else [], mine, most[phase]))
    return max(totals)


def _phase_peak(whole: int, grow: list[int], mine: Sequence[Marked], most: int) -> int:
    """The largest total of one (step, phase): ``whole`` bytes of phase-long lines, of which
    ``grow`` (the gradients) grow with each instant's backward progress, plus the instant's
    own items (``most``: the largest of them); ``whole`` alone for a phase without
    instants."""
    if not mine:
        return whole
    fixed = whole - sum(grow)
    if len(grow) == 1:  # the usual case, without the inner sum
        g = grow[0]
        return max([(fixed + round(g * i.progress) if i.progress < 1.0 else whole)
                    + i.items_bytes for i in mine])
    if grow:
        return max([(fixed + sum([round(b * i.progress) for b in grow]) if i.progress < 1.0
                     else whole) + i.items_bytes for i in mine])
    return whole + most


def _peak_stepping(lines: Sequence[Line], phases: Phased) -> int:
    """``peak_allocated`` under the optimizer in backward: which lines live varies from one
    backward instant to the next (``_static`` per instant)."""
    by_phase = phases.by_phase
    totals = []
    for step in (Step.FIRST, Step.STEADY):
        for phase in ALL_PHASES:
            live = _live(lines, step, phase)
            mine = by_phase[phase]
            if any(ln.stepping for ln in live) and phase == Phase.BACKWARD:
                for inst in mine:
                    items = _static(live, step, phase, inst.progress, inst is mine[-1])
                    totals.append(sum(i.bytes for i in items) + inst.items_bytes)
                if not mine:
                    totals.append(sum(i.bytes for i in _static(live, step, phase)))
                continue
            growing = [ln.item.bytes for ln in live if ln.grows and phase == Phase.BACKWARD]
            totals.append(_phase_peak(sum(ln.item.bytes for ln in live), growing, mine,
                                      phases.most[phase]))
    return max(totals)


def moments(lines: Sequence[Line], instants: Sequence[Instant] = ()) -> tuple[Moment, ...]:
    """Moments of the first and the steady step: each instant (or, for a phase without
    instants, the phase itself) with the phase-long lines live then.

    The phase-long lines of a (step, phase) are filtered once and reused by each of its
    instants; only a backward instant that has produced part of the gradients, or any backward
    instant under the optimizer in backward, rebuilds them (``_static`` with its progress), so
    the items are those ``_static`` gives every instant."""
    by_phase: dict[Phase, list[Instant]] = {p: [] for p in ALL_PHASES}
    for inst in instants:
        by_phase.setdefault(inst.phase, []).append(inst)
    out = []
    for step in (Step.FIRST, Step.STEADY):
        for phase in ALL_PHASES:
            mine = by_phase[phase]
            static = _static(lines, step, phase)
            if not mine:
                out.append(Moment(step=step, phase=phase, label=str(phase), items=static))
                continue
            grows = phase == Phase.BACKWARD and any(
                ln.grows and ln.item.pool == Pool.ALLOCATED and phase in ln.phases
                for ln in lines)
            stepping = phase == Phase.BACKWARD and any(ln.stepping for ln in lines)
            nonzero = tuple(i for i in static if i.bytes)
            for inst in mine:
                rebuild = stepping or (grows and inst.progress < 1.0)
                here = (tuple(i for i in _static(lines, step, phase, inst.progress,
                                                 inst is mine[-1]) if i.bytes)
                        if rebuild else nonzero)
                items = here + tuple(i for i in inst.items if i.bytes)
                out.append(Moment(step=step, phase=phase, label=inst.label, items=items))
    return tuple(out)
