"""A recipe's activation-checkpointing policy applied to a real transformers model (real runs
and traces), the way each engine applies it (``estimate/activations/policy.py`` models them).

================================  ==============================================================
recipe                            applied as
================================  ==============================================================
``full``                          ``gradient_checkpointing_enable(use_reentrant=False)``: each
                                  decoder layer (``GradientCheckpointingLayer``) checkpointed
``full``, ``checkpoint_every=k``  the same, then ``gradient_checkpointing = False`` on every
                                  layer but k-1, 2k-1, ...: torchtitan's layer SAC
                                  (``_apply_layer_sac``) wraps the same blocks in the same
                                  non-reentrant checkpoint
``full``, ``checkpoint_layers=N`` only the first N layers keep ``gradient_checkpointing``
``selective``                     the model's attention function (``sdpa`` or the module's
                                  ``eager_attention_forward``) run inside a non-reentrant
                                  ``torch.utils.checkpoint``, registered as a transformers
                                  ``AttentionInterface``: Megatron's ``core_attn`` recompute
``op``                            every layer checkpointed with ``context_fn`` =
                                  ``create_selective_checkpoint_contexts`` of torchtitan
                                  0.2.0's ``_custom_policy`` (restated below: the ``torchtitan``
                                  package imports triton at import time, absent on CPU)
================================  ==============================================================
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any

from ..errors import TraceError
from ..recipe import Recipe

__all__ = ["apply_checkpointing", "OP_SAC_SAVE_LIST"]

OP_SAC_SAVE_LIST = ("aten.mm.default", "aten._scaled_dot_product_efficient_attention.default",
                    "aten._scaled_dot_product_flash_attention.default",
                    "_c10d_functional.reduce_scatter_tensor.default", "aten.max.default")
"""torchtitan 0.2.0 ``models/llama3/infra/parallelize.py`` ``_op_sac_save_list`` (less
``flex_attention``, a higher-order op transformers does not call here), as op names."""


def _ops(torch: Any) -> set[Any]:
    out = set()
    for name in OP_SAC_SAVE_LIST:
        ns, op, overload = name.split(".")
        out.add(getattr(getattr(getattr(torch.ops, ns), op), overload))
    return out


def _op_context_fn(torch: Any) -> Any:
    """torchtitan's ``selective_checkpointing_context_fn``: a fresh mm counter per checkpoint
    call; outputs of the save list are ``MUST_SAVE`` except every second ``mm``
    (``torchtitan/distributed/activation_checkpoint.py``, ``_get_custom_policy``)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = _ops(torch)
    mm = torch.ops.aten.mm.default

    def context_fn() -> Any:
        meta: dict[str, int] = defaultdict(int)

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func == mm:
                meta[key] += 1
            to_save = func in save and not (func == mm and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


def _layers(model: Any) -> list[Any]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def _selective_attention(model: Any, torch: Any) -> None:
    """Register the model's attention function wrapped in a checkpoint and switch to it."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    impl = model.config._attn_implementation
    if impl == "eager":
        attn = next((m for m in model.modules() if hasattr(m, "is_causal")), None)
        fn = getattr(sys.modules[type(attn).__module__], "eager_attention_forward", None) \
            if attn is not None else None
    else:
        fn = ALL_ATTENTION_FUNCTIONS.get(impl)
    if fn is None:
        raise TraceError(f"checkpointing=selective: no attention function found for "
                         f"attn_implementation={impl!r}; use sdpa or eager.")

    def checkpointed(module: Any, *args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(fn, module, *args, use_reentrant=False,
                                                 **kwargs)

    name = f"memplan_checkpointed_{impl}"
    AttentionInterface.register(name, checkpointed)
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = name


def apply_checkpointing(model: Any, recipe: Recipe, model_ref: str, torch: Any) -> None:
    """Apply ``recipe.checkpointing`` to ``model`` (a transformers model) in place."""
    c = recipe.checkpointing
    if c.kind == "none":
        return
    if c.partition_activations or c.cpu_checkpointing:
        raise TraceError("partition_activations / cpu_checkpointing are DeepSpeed's "
                         "checkpoint API on a GPU with tensor parallelism; a single-process "
                         "CPU run cannot show them. Use `memplan estimate`.")
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise TraceError(f"{model_ref}: checkpointing={c.kind} needs a transformers model "
                         "(gradient_checkpointing_enable); use checkpointing=none.")
    if c.kind == "selective":
        _selective_attention(model, torch)
        return
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if c.kind == "op":
        kwargs["context_fn"] = _op_context_fn(torch)
    enable(gradient_checkpointing_kwargs=kwargs)
    if c.kind == "full" and (c.checkpoint_every != 1 or c.checkpoint_layers):
        for j, layer in enumerate(_layers(model)):
            keep = j < c.checkpoint_layers if c.checkpoint_layers else \
                (j + 1) % c.checkpoint_every == 0
            layer.gradient_checkpointing = keep
