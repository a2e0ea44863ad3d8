"""The step timeline: which lines are allocated at each moment of the first and steady step.

A ``Line`` is live during whole phases; the moments of a phase are the phase's instants where
something changes (``Activity`` adds bytes that vary within a phase, e.g. saved activations
growing layer by layer). The peak is the largest moment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..breakdown import ALL_PHASES, Item, Moment, Phase, Pool, Step
from .lines import Line

__all__ = ["Instant", "moments"]


@dataclass(frozen=True, slots=True)
class Instant:
    """An instant within a phase and the bytes that exist only around it."""

    phase: Phase
    label: str
    items: tuple[Item, ...] = ()
    steady_only: bool = False
    """Only in the steady state (e.g. gradients kept across steps)."""


def _static(lines: Iterable[Line], step: Step, phase: Phase) -> tuple[Item, ...]:
    return tuple(
        ln.item for ln in lines
        if ln.item.pool == Pool.ALLOCATED and phase in ln.phases
        and not (step == Step.FIRST and ln.lazy and phase != Phase.OPTIMIZER)
    )


def moments(lines: Sequence[Line], instants: Sequence[Instant] = ()) -> tuple[Moment, ...]:
    """Moments of the first and the steady step: each instant (or, for a phase without
    instants, the phase itself) with the phase-long lines live then."""
    out = []
    for step in (Step.FIRST, Step.STEADY):
        for phase in ALL_PHASES:
            static = _static(lines, step, phase)
            mine = [i for i in instants if i.phase == phase
                    and not (i.steady_only and step == Step.FIRST)]
            if not mine:
                out.append(Moment(step=step, phase=phase, label=str(phase), items=static))
            for inst in mine:
                items = tuple(i for i in static + inst.items if i.bytes)
                out.append(Moment(step=step, phase=phase, label=inst.label, items=items))
    return tuple(out)
