"""The step timeline: which lines are allocated at each moment of the first and steady step.

A ``Line`` is live during whole phases; the moments of a phase are the phase's instants where
something changes (``Activity`` adds bytes that vary within a phase, e.g. saved activations
growing layer by layer). The peak is the largest moment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..breakdown import ALL_PHASES, Item, Moment, Phase, Pool, Step
from .lines import Line

__all__ = ["Instant", "moments"]


@dataclass(frozen=True, slots=True)
class Instant:
    """An instant within a phase and the bytes that exist only around it."""

    phase: Phase
    label: str
    items: tuple[Item, ...] = ()
    progress: float = 1.0
    """Share of the parameter gradients produced by this instant (backward)."""


def _static(lines: Iterable[Line], step: Step, phase: Phase,
            progress: float = 1.0, last: bool = True) -> tuple[Item, ...]:
    out = []
    for ln in lines:
        if ln.item.pool != Pool.ALLOCATED or phase not in ln.phases:
            continue
        if step == Step.FIRST and ln.lazy and phase != Phase.OPTIMIZER:
            continue
        if phase == Phase.BACKWARD and (
                (ln.stepping == "during" and (progress <= 0.0 or last))
                or (ln.stepping == "after" and not last)):
            continue
        item = ln.item
        if ln.grows and phase == Phase.BACKWARD and progress < 1.0:
            item = replace(item, bytes=round(item.bytes * progress),
                           name=f"{item.name}, {progress:.0%} produced")
        out.append(item)
    return tuple(out)


def moments(lines: Sequence[Line], instants: Sequence[Instant] = ()) -> tuple[Moment, ...]:
    """Moments of the first and the steady step: each instant (or, for a phase without
    instants, the phase itself) with the phase-long lines live then."""
    out = []
    for step in (Step.FIRST, Step.STEADY):
        for phase in ALL_PHASES:
            mine = [i for i in instants if i.phase == phase]
            if not mine:
                out.append(Moment(step=step, phase=phase, label=str(phase),
                                  items=_static(lines, step, phase)))
            for inst in mine:
                static = _static(lines, step, phase, inst.progress, inst is mine[-1])
                items = tuple(i for i in static + inst.items if i.bytes)
                out.append(Moment(step=step, phase=phase, label=inst.label, items=items))
    return tuple(out)
