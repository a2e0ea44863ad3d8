"""The analytical estimator: ``estimate(model, recipe, device) -> Breakdown``.

Pure arithmetic on the ``ModelSpec``; never imports torch. Each category comes from a small
module (``model_states``, ``overhead``) whose functions state their formula and source.
"""

from __future__ import annotations

from dataclasses import replace

from ..breakdown import Breakdown, Category, Pool, RankBreakdown
from ..hardware import Device
from ..model.spec import ModelSpec
from ..recipe import Recipe
from .checks import check_compatible
from .layout import Stage, layout
from .model_states import model_state_items
from .overhead import overhead_items
from .timeline import moments
from .precision import dtypes

__all__ = ["estimate"]

UNMODELLED = (Category.ACTIVATIONS, Category.TEMPORARY)
"""Categories this version does not estimate yet (reported, so a 0 never reads as 'none')."""


def _role(stage: Stage, recipe: Recipe) -> str:
    if recipe.pp == 1:
        return "every rank"
    what = []
    if stage.index == 0:
        what.append("embedding")
    if stage.index == recipe.pp - 1:
        what.append("head")
    layers = f"layers {stage.layers.start}-{stage.layers.stop - 1}" if len(stage.layers) else "no layers"
    extra = f", {' + '.join(what)}" if what else ""
    return f"pp stage {stage.index} ({layers}{extra})"


def _trainable(model: ModelSpec, recipe: Recipe) -> int:
    """Trainable parameters of the whole model (adapters for LoRA), counted once."""
    whole = replace(recipe, tp=1, pp=1, ep=1, cp=1, gpus=1, gpus_per_node=0, zero=0,
                    hybrid_shard=0, offload="none")
    return sum(h.numel for h in layout(model, whole)[0].held if h.trainable)


def estimate(model: ModelSpec, recipe: Recipe, device: Device) -> Breakdown:
    """Estimate per-rank GPU memory of training ``model`` with ``recipe`` on ``device``.

    Raises:
        ConfigError: the recipe cannot apply to this model (all problems listed).
    """
    check_compatible(model, recipe)
    dt = dtypes(recipe)
    on_cpu = recipe.device == "cpu"
    ranks = []
    per_stage = recipe.gpus // recipe.pp
    for stage in layout(model, recipe):
        lines = model_state_items(stage, recipe, dt) + overhead_items(device, on_cpu)
        outside = tuple(ln.item for ln in lines if ln.item.pool != Pool.ALLOCATED)
        ranks.append(RankBreakdown(role=_role(stage, recipe), ranks=per_stage,
                                   moments=moments(lines), outside=outside,
                                   unmodelled=UNMODELLED))
    return Breakdown(
        source="estimate",
        model={
            "id": model.id,
            "model_type": model.model_type,
            "params": model.num_params,
            "trainable_params": _trainable(model, recipe),
            "params_by_component": model.params_by_component(),
            "layers": model.num_layers,
            "source": model.source,
            "notes": list(model.notes),
        },
        recipe=recipe.to_dict(),
        device=device.to_dict(),
        ranks=tuple(ranks),
    )
