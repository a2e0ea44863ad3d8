"""The generic path: a training step of any family transformers can build, for which memplan
has no analytic activation graph (``model_type`` outside ``model.traits.GRAPHS``).

memplan builds the family's real model class from its config on fake tensors (no memory is
used, ``memplan.trace``) with the recipe applied, runs one training step and reads every
tensor's bytes, moment by moment. The Breakdown says so in its model notes. A decoder-only
model deeper than 6 layers is traced with 5 and its middle layer repeated to the real depth,
checked byte for byte against a 6-layer trace (``memplan.trace.repeat``); where that does not
apply or its check fails the whole model is traced, and the note says which. Known limits: a
trace is one rank, so tensor, pipeline, context and expert parallelism, ZeRO and offload are
refused with the fix; without torch and transformers the estimate is refused with
the install command (never another family's graph).
"""

from __future__ import annotations

from dataclasses import replace

from .breakdown import Breakdown
from .errors import ConfigError, TraceError
from .hardware import Device
from .recipe import Recipe

__all__ = ["generic_estimate"]


def generic_estimate(model_ref: str, model_type: str, recipe: Recipe, device: Device, *,
                     whole: bool = False) -> Breakdown:
    """The traced step of ``model_ref`` (a config memplan's builders do not know); ``whole``
    traces every layer instead of the one-layer shortcut (``memplan.trace.repeat``).

    Raises:
        ConfigError: torch/transformers missing, or a recipe one traced rank cannot run.
    """
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError([
            f"model_type {model_type!r} has no analytic activation graph in memplan, and the "
            "generic path (build the real transformers class on fake tensors and trace one "
            "training step) needs torch and transformers: pip install torch transformers. "
            "memplan does not substitute another family's graph."]) from None
    from .trace import cpu_kernels_without_cuda

    recipe, note = cpu_kernels_without_cuda(recipe)
    notes = [note] if note else []
    try:
        b, how = _traced(model_ref, recipe, device, whole=whole)
    except TraceError as e:
        raise ConfigError([f"model_type {model_type!r} has no analytic graph; its generic "
                           f"path traces one rank and cannot apply this recipe: {e}"]) from None
    except ValueError as e:  # transformers refuses an attention implementation
        if "attn_implementation" not in str(e) or recipe.platform.attention == "eager":
            raise
        b, how = _traced(model_ref, recipe.with_keys(attention="eager"), device, whole=whole)
        b = _note(b, f"{model_type} does not support attention={recipe.platform.attention} in "
                     "transformers; traced with eager attention")
    for n in notes:
        b = _note(b, n)
    return _note(b, f"path: generic (no analytic graph for model_type {model_type!r}: the real "
                    f"transformers class built on fake tensors, one training step traced; {how})")


def _traced(model_ref: str, recipe: Recipe, device: Device, *,
            whole: bool) -> tuple[Breakdown, str]:
    """The traced step: by the one-layer shortcut where it applies and passes its check
    (``trace.repeat``), else of the whole model; and a note saying which."""
    from .model.resolve import find_config
    from .trace import trace

    found = find_config(model_ref)
    why = "whole model traced"
    if found is not None and not whole:
        from .trace.repeat import traced_by_layer

        b, why = traced_by_layer(model_ref, found[0], recipe, device)
        if b is not None:
            return b, why
    return trace(model_ref, recipe, device), why


def _note(b: Breakdown, note: str) -> Breakdown:
    return replace(b, model=replace(b.model, notes=tuple(b.model.notes or ()) + (note,)))
