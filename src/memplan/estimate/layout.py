"""Who holds what: pipeline stages, tensor/expert splits, and which elements train.

``layout(model, recipe)`` returns one ``Stage`` per pipeline stage, listing the ``Held`` tensors
of one rank of that stage with their per-rank element counts. What a PEFT method adds (LoRA
adapters, IA3 vectors, prompt embeddings...: ``peft.py``) appears as extra tensors next to the
tensor they adapt, or with the embedding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.spec import Component, ModelSpec, Split, Tensor, is_head_weight
from ..recipe import Recipe
from ..recipe.stages import stage_layers, stages_of
from .peft import FROZEN_BASE, Extra, adapted_roles, base_trains, model_extras, tensor_extras

__all__ = ["Held", "Stage", "layout", "stage_layers", "stages_of"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Held:
    """One tensor as one rank holds it."""

    tensor: Tensor
    numel: int
    """Elements on this rank after TP / EP splitting."""
    trainable: bool
    adapter: bool = False
    quantized: bool = False
    """Stored in the QLoRA quantized format (bitsandbytes), frozen."""

    @property
    def expert(self) -> bool:
        return self.tensor.experts > 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    index: int
    layers: range
    held: tuple[Held, ...]
    units: tuple[tuple[Held, ...], ...] = ()
    """This stage's ZeRO-3/FSDP units on one rank: the embedding, each layer, the head."""
    trainable: tuple[Held, ...] = field(init=False, compare=False, default=())
    """The ``held`` tensors that train (summed once: ``memplan plan`` reads a stage, kept in
    ``layout``'s memo, for every candidate that shares it)."""
    trainable_numel: int = field(init=False, compare=False, default=0)
    """``sum(h.numel for h in held if h.trainable)``."""
    expert_trainable_numel: int = field(init=False, compare=False, default=0)
    """``sum(h.numel for h in held if h.trainable and h.expert)``."""
    unit_numels: tuple[int, ...] = field(init=False, compare=False, default=())
    """Elements of each unit, in order."""
    held_numel: int = field(init=False, compare=False, default=0)
    """``sum(h.numel for h in held)``."""
    largest_tensor_numel: int = field(init=False, compare=False, default=0)
    """Elements of the largest held tensor not quantized (0: none)."""

    def __post_init__(self) -> None:
        trainable = tuple(h for h in self.held if h.trainable)
        for name, value in (
                ("trainable", trainable),
                ("trainable_numel", sum(h.numel for h in trainable)),
                ("expert_trainable_numel", sum(h.numel for h in trainable if h.expert)),
                ("unit_numels", tuple(sum(h.numel for h in u) for u in self.units)),
                ("held_numel", sum(h.numel for h in self.held)),
                ("largest_tensor_numel",
                 max((h.numel for h in self.held if not h.quantized), default=0))):
            object.__setattr__(self, name, value)

    @property
    def largest_unit_numel(self) -> int:
        """Elements of the biggest unit."""
        return max((sum(h.numel for h in u) for u in self.units), default=0)


def _extra(e: Extra) -> Held:
    return Held(tensor=e.tensor, numel=e.numel, trainable=e.trainable, adapter=e.adapter)


def _hold(model: ModelSpec, t: Tensor, recipe: Recipe, trainable: bool,
          roles: frozenset[str]) -> list[Held]:
    """``t`` as one rank holds it, plus what a PEFT method adds next to it (``peft.py``: LoRA
    A and B, DoRA's magnitude, IA3 vectors...)."""
    par = recipe.parallelism
    numel = t.numel_per_rank(par.tp_of(t.experts), par.ep)
    if recipe.method.kind in FROZEN_BASE:
        # Lightning's BitsandbytesPrecision replaces every nn.Linear, the head included
        # (plugins/precision/bitsandbytes.py module_init_context); transformers skips it
        head = recipe.method.quantizer == "lightning-bnb" and is_head_weight(t)
        quantized = recipe.method.kind == "qlora" and (head or (
            t.is_linear and t.component not in (Component.HEAD, Component.EMBEDDING)))
        return [Held(tensor=t, numel=numel, trainable=base_trains(t, recipe),
                     quantized=quantized),
                *(_extra(e) for e in tensor_extras(model, t, recipe, roles))]
    return [Held(tensor=t, numel=numel, trainable=trainable)]


def layout(model: ModelSpec, recipe: Recipe,
           memo: dict[object, object] | None = None) -> list[Stage]:
    """Per pipeline stage, the tensors one rank of that stage holds. ``memo`` (one per
    ``model``, see ``estimate``) keeps the answer under what it reads: the method part and
    tp, ep and pp."""
    if memo is not None:
        par = recipe.parallelism
        key = ("layout", recipe.method, par.tp, par.ep, par.etp, par.pp, par.pp_first_layers,
               par.pp_last_layers, par.pp_split_embedding, par.pp_split_loss)
        if key not in memo:
            memo[key] = layout(model, recipe)
        return memo[key]  # type: ignore[return-value]
    n = model.num_layers
    train_from = n - recipe.method.freeze_trainable_layers if recipe.method.kind == "freeze" else 0
    full = recipe.method.kind == "full"
    roles = adapted_roles(model, recipe)
    stages = []
    ranges = stages_of(n, recipe) if n else [range(0)] * recipe.parallelism.pp
    for s, layers in enumerate(ranges):
        held: list[Held] = []
        first, last = s == 0, s == recipe.parallelism.pp - 1
        units = []
        if first:
            for t in model.embedding:
                held += _hold(model, t, recipe, full, roles)
            held += [_extra(e) for e in model_extras(model, recipe)]
            units.append(tuple(held))
        for i in layers:
            layer_held: list[Held] = []
            for t in model.layers[i].tensors:
                layer_held += _hold(model, t, recipe, full or i >= train_from, roles)
            units.append(tuple(layer_held))
            held += layer_held
        if last:
            before = len(held)
            for t in model.head:
                held += _hold(model, t, recipe, full, roles)  # freeze: only the layers train
            if model.tied_embeddings and recipe.parallelism.pp > 1:
                # Megatron keeps a copy of the shared embedding on the last stage for the head.
                copy = Tensor(name="lm_head.weight (tied copy)",
                              shape=(model.vocab_size, model.hidden_size),
                              component=Component.HEAD, split=Split.VOCAB)
                held += _hold(model, copy, recipe, full, roles)
            units.append(tuple(held[before:]))
        # FSDP/ZeRO-3 gather one unit at a time: each layer, and the embedding and head as
        # their own units (torchtitan wraps them separately; with 256k vocabularies they can
        # be the largest).
        stages.append(Stage(index=s, layers=layers, held=tuple(held), units=tuple(units)))
    return stages
