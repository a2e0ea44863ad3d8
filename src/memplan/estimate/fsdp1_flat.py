"""FSDP1 (``FullyShardedDataParallel``) flat gradients: a unit that mixes frozen and trainable
parameters gets a gradient for all of them (issue #11 item 1).

FSDP1 flattens each unit's parameters into one ``FlatParameter``. From torch 2.13,
``torch/distributed/fsdp/``:

- ``_flat_param.py`` ``FlatParamHandle._validate_tensors_to_flatten``: the flat parameter's
  ``requires_grad`` is the OR over its tensors; ``use_orig_params=False`` refuses a unit that
  mixes frozen and trainable tensors ("Must flatten tensors with uniform `requires_grad` when
  `use_orig_params=False`"), so a LoRA model wrapped per decoder layer runs with
  ``use_orig_params=True`` (the HF Trainer's default, ``training_args.py``:
  ``fsdp_config.get("use_orig_params", "true")``).
- ``_flat_param.py`` ``_use_unsharded_views(as_params=False)``: in forward and backward the
  module's parameters are autograd views of the one flat parameter, so autograd computes a
  gradient for the frozen views too, into one unsharded flat gradient of the whole unit;
  ``_runtime_utils.py`` ``_reduce_grad`` reduce-scatters ``flat_param.grad`` whole and keeps a
  sharded gradient of the whole shard. ``_use_sharded_grad_views`` then hands only trainable
  parameters a view of it (frozen ones get ``None``), but the flat tensor stays.
- The FSDP docstring (``fully_sharded_data_parallel.py``): "For ``use_orig_params=True``, FSDP
  supports mixing frozen and non-frozen parameters, but it's recommended to avoid doing so to
  prevent higher than expected gradient memory usage."
- A unit with no trainable parameter has ``requires_grad = False`` and no gradient.

Measured (``scripts/measure_fsdp1_flat_grad.py``, 2 ranks, gloo, CPU, torch 2.13, the tiny
Llama with LoRA, fp32, per-layer wrapping, ``use_orig_params=True``): each layer unit's sharded
gradient has 90,240 fp32 elements, the whole shard of its 180,480 (147,712 frozen + 32,768
LoRA); the all-frozen root unit has none (``validation/fsdp1_flat_grad.json``).

Applied by ``estimate`` through the recipe's ``fsdp1_wrap`` (``recipe/engine.py``
``Fsdp1Wrap``): under ``layers`` (``transformer_auto_wrap_policy`` alone) a LoRA layer's adapters
share its unit; under ``peft`` (the default: PEFT's ``fsdp_auto_wrap_policy``, installed by the
HF Trainer for a PEFT model, and llama-recipes') every leaf module with a trainable ``weight``
is a unit of its own (``_own_unit``), so LoRA/DoRA adapters, ln-tuning and ``modules_to_save``
copies and the prompt encoder never mix with the frozen base; IA3's and VeRA's vectors and
BitFit's biases still do (they are not a leaf module's ``weight``).

Known limitations: the units here are ``layout``'s (each layer; embedding and head together as
the root, accelerate's ``TRANSFORMER_BASED_WRAP``). A QLoRA base runs under FSDP1 only with a
float ``bnb_4bit_quant_storage`` (``_validate_tensors_to_flatten`` refuses integer tensors): its
packed storage is then part of the flat parameter, and of the flat gradient, at its packed size.
"""

from __future__ import annotations

from ..recipe import Recipe
from .layout import Held, Stage

__all__ = ["flat_grad_holds", "has_leaf_units", "largest_grad_unit", "layer_flat_part",
           "mixes_frozen"]


_LEAF_WEIGHTS = (".lora_A", ".lora_B", ".lora_magnitude_vector", " (ln_tuning copy)",
                 " (modules_to_save copy)", "prompt_encoder.embedding.weight",
                 "adapter (adapter_params)")
"""Tensors ``peft.py`` names that are the ``weight`` of a leaf module (``nn.Linear`` ``lora_A``/
``lora_B``, DoRA's ``DoraLinearLayer``, the ln-tuning and ``modules_to_save`` deep copies, the
prompt/prefix ``PromptEmbedding``/``PrefixEncoder``), which PEFT's ``lambda_policy_fn`` or its
transformer classes wrap on their own. The generic ``adapter`` is counted with them: its module
structure is unknown, and apart is what PEFT's policy does for any adapter module."""


def _own_unit(h: Held, recipe: Recipe) -> bool:
    """``h`` is a unit of its own under the recipe's FSDP1 wrap policy."""
    return (h.trainable and str(recipe.engine.fsdp1_wrap) == "peft"
            and h.tensor.name.endswith(_LEAF_WEIGHTS))


def _units(stage: Stage, recipe: Recipe) -> list[tuple[Held, ...]]:
    """FSDP1 units of a stage: with one pipeline stage the embedding and head are the root;
    leaf modules the wrap policy wraps apart are one unit each."""
    u = list(stage.units)
    if recipe.parallelism.pp == 1 and len(u) >= 2:
        u = [u[0] + u[-1], *u[1:-1]]
    own = [(h,) for unit in u for h in unit if _own_unit(h, recipe)]
    return [t for t in (tuple(h for h in unit if not _own_unit(h, recipe)) for unit in u)
            if t] + own


def flat_grad_holds(stage: Stage, recipe: Recipe) -> list[Held]:
    """The tensors an FSDP1 flat gradient covers: every tensor of each unit that holds a
    trainable one (a quantized one at its packed size). For ``recipe`` other than FSDP1, the trainable tensors."""
    trainable = [h for h in stage.held if h.trainable]
    if str(recipe.engine_kind) != "fsdp1" or not stage.units:
        return trainable
    out: list[Held] = []
    for unit in _units(stage, recipe):
        if any(h.trainable for h in unit):
            out += list(unit)
    return out


def mixes_frozen(stage: Stage, recipe: Recipe) -> bool:
    """Whether an FSDP1 unit of ``stage`` holds both frozen and trainable tensors."""
    return str(recipe.engine_kind) == "fsdp1" and any(
        any(h.trainable for h in u) and not all(h.trainable for h in u)
        for u in _units(stage, recipe))


def largest_grad_unit(stage: Stage, recipe: Recipe) -> int:
    """Elements of the largest FSDP1 unit with a trainable tensor: its unsharded flat gradient,
    the reduce-scatter input of the backward."""
    return max((sum(h.numel for h in u) for u in _units(stage, recipe)
                if any(h.trainable for h in u)), default=0)


def has_leaf_units(unit: tuple[Held, ...], recipe: Recipe) -> bool:
    """Whether the wrap policy makes units of their own inside ``unit`` (PEFT's policy around
    trainable leaf modules): they run, and are prefetched, between the layer's own hooks."""
    return str(recipe.engine_kind) == "fsdp1" and any(_own_unit(h, recipe) for h in unit)


def layer_flat_part(unit: tuple[Held, ...], recipe: Recipe) -> tuple[Held, ...]:
    """The tensors of ``unit``'s own flat parameter: without the leaf modules the wrap policy
    makes units of their own."""
    return tuple(h for h in unit if not _own_unit(h, recipe))
