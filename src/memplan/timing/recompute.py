"""What a checkpointing policy recomputes in the backward, per layer, for the step-time model
(the policies: ``estimate/activations/policy.py``, with their engine sources).

- ``none``: nothing; ``selective`` (Megatron ``core_attn``): the attention core;
- ``full``: the whole forward of each checkpointed layer (every k-th / first N of a stage);
- ``op`` (torchtitan per-op policy): the matmuls the policy does not save, i.e. every second
  ``mm`` of the block in forward order and every ``addmm`` (a linear with a bias), all pointwise
  ops and TP collectives other than ``reduce_scatter``; fused attention is saved, eager
  attention (``bmm``) recomputed.
"""

from __future__ import annotations

import math

from ..model.spec import Component, Layer
from ..recipe import Recipe
from ..recipe.stages import stages_of

__all__ = ["layer_checkpointed", "recompute_matmul_share", "attention_recomputed",
           "full_share", "recompute_inputs"]

_NOT_MATMUL = (Component.NORM, Component.EMBEDDING)


def recompute_inputs(recipe: Recipe) -> tuple[object, ...]:
    """Every recipe field this module's functions read (the policy, the attention kernel and
    the pipeline split of ``stages_of``): equal tuples, equal answers, so a caller timing many
    recipes of one model keys what it derives from them by this."""
    par = recipe.parallelism
    return (recipe.checkpointing, str(recipe.platform.attention), par.pp, par.pp_first_layers,
            par.pp_last_layers, par.pp_split_embedding, par.pp_split_loss)


def layer_checkpointed(recipe: Recipe, i: int, layers: int) -> bool:
    """Whether layer ``i`` of ``layers`` is one ``full`` checkpoint, its index taken within its
    pipeline stage (the stages of ``recipe.stages.stages_of``, uneven splits included)."""
    c = recipe.checkpointing
    if c.kind != "full":
        return False
    if not c.checkpoint_layers and c.checkpoint_every == 1:
        return True
    start = next((r.start for r in stages_of(layers, recipe) if i in r), 0)
    j = i - start
    if c.checkpoint_layers:
        return j < c.checkpoint_layers
    return (j + 1) % c.checkpoint_every == 0


def full_share(recipe: Recipe, layers: int) -> float:
    """Share of the layers ``full`` recomputes (1.0 for every layer, 0 for other kinds)."""
    if layers <= 0:
        return 0.0
    return sum(layer_checkpointed(recipe, i, layers) for i in range(layers)) / layers


def _op_recomputed(layer: Layer) -> float:
    """Share of a layer's matmul FLOPs that torchtitan's per-op policy recomputes: its 2-D
    weights in state-dict order (the forward order of HF layers), every second one without a
    bias (``mm``) and every one with a bias (``addmm``, not in the save list)."""
    names = {t.name for t in layer.tensors}
    total = again = 0.0
    mm = 0
    for t in layer.tensors:
        if len(t.shape) != 2 or t.is_bias or t.component in _NOT_MATMUL:
            continue
        f = float(math.prod(t.shape))
        total += f
        if t.name.endswith("weight") and t.name[:-6] + "bias" in names:
            again += f
            continue
        mm += 1
        if mm % 2 == 0:
            again += f
    return again / total if total else 0.0


def recompute_matmul_share(recipe: Recipe, layer: Layer, i: int, layers: int) -> float:
    """Share of layer ``i``'s forward matmul FLOPs run again in the backward."""
    kind = recipe.checkpointing.kind
    if kind == "op":
        return _op_recomputed(layer)
    return 1.0 if layer_checkpointed(recipe, i, layers) else 0.0


def attention_recomputed(recipe: Recipe, i: int, layers: int) -> bool:
    """Whether layer ``i``'s attention core runs again in the backward."""
    kind = recipe.checkpointing.kind
    if kind == "selective":
        return True
    if kind == "op":
        return recipe.platform.attention == "eager"
    return layer_checkpointed(recipe, i, layers)
