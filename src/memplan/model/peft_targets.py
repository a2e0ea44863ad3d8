"""Which modules a PEFT method wraps, named as the model names them (the model layer's part of
``memplan.estimate.peft`` and ``memplan.runtime.peft_methods``, which both read it).

``target_modules`` turns memplan's roles (``q, k, v, o, gate, up, down``) into the module
paths PEFT matches by suffix (``self_attn.q_proj``, ``mlp.c_proj``, ``attn.c_attn``), from the
model's own linear weights, so every family's real linears are found (a fused projection answers
to each of its roles). IA3's and LN tuning's defaults are PEFT's own per-family tables.
"""

from __future__ import annotations

from collections.abc import Iterable

from .spec import Component, ModelSpec, Tensor

__all__ = ["target_modules", "ia3_roles", "ln_tuning_norm", "ln_tuning_leaves"]


def target_modules(spec: ModelSpec, roles: Iterable[str]) -> list[str]:
    """Module paths (inside a layer, or in the head) of the linear weights answering to
    ``roles``; routed experts are left out (transformers 5 stores them as 3-D parameters, not
    ``nn.Linear`` modules PEFT can wrap)."""
    wanted = set(roles)
    return sorted({t.name.removesuffix(".weight") for t in spec.tensors
                   if t.is_linear and t.experts == 1 and wanted & set(t.targets)})


_IA3: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "llama": (("k", "v", "down"), ("down",)), "mistral": (("k", "v", "down"), ("down",)),
    "mixtral": (("k", "v"), ()), "qwen2": (("q", "v", "down"), ("down",)),
    "qwen3": (("q", "v", "down"), ("down",)), "gemma": (("q", "v", "down"), ("down",)),
    "gemma2": (("q", "v", "down"), ("down",)), "gemma3_text": (("q", "v", "down"), ("down",)),
    "phi": (("q", "v", "down"), ("down",)), "gpt2": (("q", "k", "v", "down"), ("down",)),
    "gpt_neox": (("q", "k", "v", "down"), ("down",)),
    "falcon": (("q", "k", "v", "down"), ("down",)), "bert": (("k", "v", "down"), ("down",)),
}
"""PEFT 0.21.2 ``TRANSFORMERS_MODELS_TO_IA3_TARGET_MODULES_MAPPING`` and
``TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING`` (``peft/utils/constants.py``) as
roles; a fused qkv (``c_attn``, ``query_key_value``) answers to q, k and v. Mixtral's ``w2``
experts are 3-D parameters in transformers 5, so only k and v are adapted. Families PEFT does
not map get Llama's choice (memplan names the modules for PEFT)."""

_LN_TUNING: dict[str, tuple[str, ...]] = {
    "llama": ("input_layernorm", "post_attention_layernorm", "norm"),
    "mistral": ("input_layernorm", "post_attention_layernorm", "norm"),
    "qwen2": ("post_attention_layernorm",), "qwen3": ("post_attention_layernorm",),
    "gemma": ("input_layernorm", "post_attention_layernorm", "norm"),
    "phi": ("input_layernorm", "final_layernorm"), "gpt2": ("ln_1", "ln_2", "ln_f"),
    "falcon": ("input_layernorm", "post_attention_layernorm", "ln_f"),
}
"""PEFT 0.21.2 ``TRANSFORMERS_MODELS_TO_LNTUNING_TARGET_MODULES_MAPPING`` (leaf module names);
other families: every norm of the layers and the final norm except q/k norms (memplan's
choice)."""
_QK_NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "q_a_layernorm", "kv_a_layernorm")


def ia3_roles(model_type: str) -> tuple[frozenset[str], frozenset[str]]:
    """(adapted roles, feed-forward roles) of IA3 on ``model_type``."""
    t, ff = _IA3.get(model_type, _IA3["llama"])
    return frozenset(t), frozenset(ff)


def ln_tuning_norm(spec: ModelSpec, t: Tensor) -> bool:
    """Whether LN tuning makes a trainable copy of the norm holding ``t``."""
    if t.component is not Component.NORM:
        return False
    leaf = t.name.rsplit(".", 1)[0].split(".")[-1]
    wanted = _LN_TUNING.get(spec.model_type)
    return leaf in wanted if wanted is not None else leaf not in _QK_NORMS


def ln_tuning_leaves(model_type: str) -> frozenset[str]:
    """The norm leaf names LN tuning trains in ``model_type`` (PEFT's table); empty: every norm
    but the q/k norms."""
    return frozenset(_LN_TUNING.get(model_type, ()))
