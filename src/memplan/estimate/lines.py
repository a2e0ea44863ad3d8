"""``Line``: an ``Item`` with its lifetime in the step, the estimator's building block for the
timeline (``timeline.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..breakdown import ALL_PHASES, Item, Phase

__all__ = ["Line"]


@dataclass(frozen=True, slots=True)
class Line:
    """One estimated amount of memory and when it is live."""

    item: Item
    """The bytes and their label."""
    phases: tuple[Phase, ...] = ALL_PHASES
    """Phases of a step during which the bytes are allocated."""
    lazy: bool = False
    """Created inside the first optimizer step (torch optimizers' states): absent from the first
    step's forward and backward."""
    grows: bool = False
    """Produced during the backward (parameter gradients): a backward moment holds the part
    produced so far."""
    stepping: str = ""
    """Exists while parameters are stepped inside the backward (optimizer in backward):
    ``during`` from the first parameter gradient on, except at the backward's last moment;
    ``after`` only at the backward's last moment (the embedding's step; DeepSpeed ZeRO-0's
    gradient all-reduce, which runs after the autograd backward); '' always."""
