"""The training-loop part of a ``Recipe`` (issue #15): what the user's loop keeps alive around
the step. ``estimate/loop.py`` turns it into memory; ``runtime/stepping.py`` runs it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .check import check_part

__all__ = ["Loop", "Outputs", "ZeroGradAt"]


class Outputs(StrEnum):
    DROPPED = "dropped"
    KEPT = "kept"


class ZeroGradAt(StrEnum):
    AFTER_STEP = "after-step"
    BEFORE_BACKWARD = "before-backward"


@dataclass(frozen=True, kw_only=True, slots=True)
class Loop:
    """The training loop around the step (issue #15): what the user's code keeps alive.

    The default is the HF Trainer's loop: ``loss = model(**batch).loss`` (the outputs are
    dropped before the backward) and ``zero_grad(set_to_none=True)`` after the step."""

    outputs: Outputs = Outputs.DROPPED
    """``kept``: the loop holds the model's outputs (``outputs = model(**batch); loss =
    outputs.loss``, the HF course and Accelerate examples): the logits stay alive through the
    backward and the optimizer step, and until the next forward returns."""
    zero_grad: ZeroGradAt = ZeroGradAt.AFTER_STEP
    """Where ``optimizer.zero_grad()`` is called: ``after-step`` (or before the forward: the
    same), ``before-backward`` (PyTorch's tutorial: the previous step's gradients stay alive
    through the next forward)."""
    set_to_none: bool = True
    """``zero_grad(set_to_none=...)``: True (torch >= 2.0's default) frees the gradients; False
    (torch 1.x's default) zeroes them in place, so they stay allocated across steps."""
    use_cache: bool = False
    """``model.config.use_cache`` while training: off under the HF Trainer (its
    ``TrainingArguments.use_cache`` defaults to False), on in a plain loop over a model whose
    config.json says ``use_cache: true`` (most causal LMs), unless activation checkpointing is
    on (transformers then turns it off). With ``outputs=kept``, ``outputs.past_key_values``
    keeps every layer's keys and values alive with the logits."""

    def __post_init__(self) -> None:
        check_part(self)
