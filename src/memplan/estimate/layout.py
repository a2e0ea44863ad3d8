"""Who holds what: pipeline stages, tensor/expert splits, and which elements train.

``layout(model, recipe)`` returns one ``Stage`` per pipeline stage, listing the ``Held`` tensors
of one rank of that stage with their per-rank element counts. LoRA adapters appear as extra
trainable tensors next to the linear they adapt.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.spec import Component, ModelSpec, Split, Tensor
from ..recipe import Recipe

__all__ = ["Held", "Stage", "layout", "stage_layers"]


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

    @property
    def largest_unit_numel(self) -> int:
        """Elements of the biggest unit."""
        return max((sum(h.numel for h in u) for u in self.units), default=0)


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Split layers over ``pp`` stages as evenly as possible; earlier stages take the remainder."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def _adapters(t: Tensor, recipe: Recipe) -> list[Held]:
    """LoRA A (r x in) and B (out x r) for a targeted linear; under TP, the factor on the split
    side is split too (NeMo/Megatron LoRA: column-parallel base -> B split, row -> A split)."""
    if not (t.is_linear and set(t.targets) & set(recipe.method.lora_targets)):
        return []
    out_f, in_f = t.shape[0], t.shape[-1]
    r, tp = recipe.method.lora_rank, recipe.parallelism.tp
    a_in = -(-in_f // tp) if t.split is Split.ROW else in_f
    b_out = -(-out_f // tp) if t.split in (Split.COLUMN, Split.VOCAB) else out_f
    experts = -(-t.experts // recipe.parallelism.ep) if t.experts > 1 else 1
    a = Tensor(name=t.name.replace(".weight", ".lora_A"), shape=(r, in_f), component=t.component,
               experts=t.experts)
    b = Tensor(name=t.name.replace(".weight", ".lora_B"), shape=(out_f, r), component=t.component,
               experts=t.experts)
    return [Held(tensor=a, numel=experts * r * a_in, trainable=True, adapter=True),
            Held(tensor=b, numel=experts * r * b_out, trainable=True, adapter=True)]


def _hold(t: Tensor, recipe: Recipe, trainable: bool) -> list[Held]:
    numel = t.numel_per_rank(recipe.parallelism.tp, recipe.parallelism.ep)
    if recipe.method.kind in ("lora", "qlora"):
        quantized = (recipe.method.kind == "qlora" and t.is_linear
                     and t.component not in (Component.HEAD, Component.EMBEDDING))
        return [Held(tensor=t, numel=numel, trainable=False, quantized=quantized),
                *_adapters(t, recipe)]
    return [Held(tensor=t, numel=numel, trainable=trainable)]


def layout(model: ModelSpec, recipe: Recipe,
           memo: dict[object, object] | None = None) -> list[Stage]:
    """Per pipeline stage, the tensors one rank of that stage holds. ``memo`` (one per
    ``model``, see ``estimate``) keeps the answer under what it reads: the method part and
    tp, ep and pp."""
    if memo is not None:
        par = recipe.parallelism
        key = ("layout", recipe.method, par.tp, par.ep, par.pp)
        if key not in memo:
            memo[key] = layout(model, recipe)
        return memo[key]  # type: ignore[return-value]
    n = model.num_layers
    train_from = n - recipe.method.freeze_trainable_layers if recipe.method.kind == "freeze" else 0
    full = recipe.method.kind == "full"
    stages = []
    ranges = stage_layers(n, recipe.parallelism.pp) if n else [range(0)] * recipe.parallelism.pp
    for s, layers in enumerate(ranges):
        held: list[Held] = []
        first, last = s == 0, s == recipe.parallelism.pp - 1
        units = []
        if first:
            for t in model.embedding:
                held += _hold(t, recipe, trainable=full)
            units.append(tuple(held))
        for i in layers:
            layer_held: list[Held] = []
            for t in model.layers[i].tensors:
                layer_held += _hold(t, recipe, trainable=full or i >= train_from)
            units.append(tuple(layer_held))
            held += layer_held
        if last:
            before = len(held)
            for t in model.head:
                held += _hold(t, recipe, trainable=full)  # freeze: only the layers train
            if model.tied_embeddings and recipe.parallelism.pp > 1:
                # Megatron keeps a copy of the shared embedding on the last stage for the head.
                copy = Tensor(name="lm_head.weight (tied copy)",
                              shape=(model.vocab_size, model.hidden_size),
                              component=Component.HEAD, split=Split.VOCAB)
                held += _hold(copy, recipe, trainable=full)
            units.append(tuple(held[before:]))
        # FSDP/ZeRO-3 gather one unit at a time: each layer, and the embedding and head as
        # their own units (torchtitan wraps them separately; with 256k vocabularies they can
        # be the largest).
        stages.append(Stage(index=s, layers=layers, held=tuple(held), units=tuple(units)))
    return stages
