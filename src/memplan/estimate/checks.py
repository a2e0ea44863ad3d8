"""Checks that need both the model and the recipe (the recipe checks itself alone)."""

from __future__ import annotations

from ..errors import Problems
from ..model.spec import ModelSpec
from ..recipe import Recipe

__all__ = ["check_compatible"]


def check_compatible(model: ModelSpec, recipe: Recipe) -> None:
    """Raise one ``ConfigError`` listing every way ``recipe`` cannot apply to ``model``."""
    p = Problems()
    attn = next((layer.attention for layer in model.layers if layer.attention), None)
    if recipe.parallelism.tp > 1 and attn is not None:
        if attn.num_heads % recipe.parallelism.tp:
            divisors = [d for d in range(1, attn.num_heads + 1) if attn.num_heads % d == 0]
            p.add(f"tp={recipe.parallelism.tp} does not divide the {attn.num_heads} attention heads of "
                  f"{model.id}; each TP rank needs whole heads. Use tp in "
                  f"{', '.join(map(str, [d for d in divisors if d <= 64]))}.")
        kv = attn.num_kv_heads
        if kv % recipe.parallelism.tp and recipe.parallelism.tp % kv:
            p.add(f"tp={recipe.parallelism.tp} and the {kv} key/value heads of {model.id} do not divide "
                  "either way (kv heads are split when tp divides them, replicated when they "
                  "divide tp). Choose tp as a divisor or multiple of the kv heads.")
    if recipe.parallelism.pp_virtual > 1 and model.num_layers % (recipe.parallelism.pp * recipe.parallelism.pp_virtual):
        p.add(f"pp_virtual={recipe.parallelism.pp_virtual}: the {model.num_layers} layers of {model.id} do "
              f"not split into pp x pp_virtual = {recipe.parallelism.pp * recipe.parallelism.pp_virtual} equal chunks "
              "(Megatron requires it). Choose pp_virtual so that pp x pp_virtual divides the "
              "layers.")
    if recipe.parallelism.pp > max(1, model.num_layers):
        p.add(f"pp={recipe.parallelism.pp} is larger than the {model.num_layers} layers of {model.id}; "
              f"every pipeline stage needs at least one layer. Use pp <= {model.num_layers}.")
    experts = max((t.experts for t in model.tensors), default=1)
    if recipe.parallelism.ep > 1:
        if experts <= 1:
            p.add(f"ep={recipe.parallelism.ep} but {model.id} has no routed experts (not a MoE model). "
                  "Use ep=1.")
        elif experts % recipe.parallelism.ep:
            p.add(f"ep={recipe.parallelism.ep} does not divide the {experts} experts of {model.id}. "
                  f"Use a divisor of {experts}.")
    if recipe.method.kind in ("lora", "qlora"):
        have = model.available_targets()
        missing = [t for t in recipe.method.lora_targets if t not in have]
        if not have:
            p.add(f"{model.id} has no linear layers memplan can adapt with LoRA.")
        elif len(missing) == len(recipe.method.lora_targets):
            p.add(f"LoRA targets {','.join(missing)} match no module of {model.id}; it has "
                  f"{','.join(t for t in ('q', 'k', 'v', 'o', 'gate', 'up', 'down') if t in have)}.")
        elif missing:
            p.add(f"LoRA target(s) {','.join(missing)} do not exist in {model.id} (it has "
                  f"{','.join(t for t in ('q', 'k', 'v', 'o', 'gate', 'up', 'down') if t in have)}"
                  "). Remove them from lora_targets.")
    if recipe.method.kind == "freeze" and recipe.method.freeze_trainable_layers > model.num_layers:
        p.add(f"freeze_trainable_layers={recipe.method.freeze_trainable_layers} exceeds the "
              f"{model.num_layers} layers of {model.id}.")
    if recipe.parallelism.cp > 1 and recipe.batch.seq_len % (2 * recipe.parallelism.cp):
        p.add(f"seq_len={recipe.batch.seq_len} must be divisible by 2*cp={2 * recipe.parallelism.cp}: context "
              "parallelism splits each sequence into 2*cp load-balanced chunks (Megatron-Core).")
    if recipe.parallelism.pp > 1 and model.num_layers == 0:
        p.add(f"{model.id} has no detectable layer stack, so it cannot be split into pipeline "
              "stages. Use pp=1.")
    p.raise_if_any()
