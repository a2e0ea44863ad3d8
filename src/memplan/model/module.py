"""``package.module:function`` -> ``ModelSpec``: build a user's ``nn.Module`` on the meta device
(no memory is used) and read its parameters. Needs torch; the rest of memplan does not.

The largest ``nn.ModuleList`` is taken as the stack of layers (for pipeline stages); parameters
registered before it form the embedding, after it the head. Components and LoRA target names are
inferred from module names (``q_proj``/``query`` -> ``q``...).

Known limitations: architecture numbers (hidden size, heads) are read from the module's ``config``
attribute when it has one (transformers models), otherwise left at 0, so only model-state memory
is estimated for arbitrary modules.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from ..errors import ModelConfigError, did_you_mean
from .spec import Component, Layer, ModelSpec, Split, Tensor

_TARGETS = {
    "q": ("q_proj", "query", "q", "wq"), "k": ("k_proj", "key", "k", "wk"),
    "v": ("v_proj", "value", "v", "wv"), "o": ("o_proj", "out_proj", "dense", "wo", "c_proj"),
    "gate": ("gate_proj", "w1", "wi_0"), "up": ("up_proj", "w3", "c_fc", "fc1", "wi_1", "wi"),
    "down": ("down_proj", "w2", "fc2"),
}
_COLUMN = {"q", "k", "v", "gate", "up"}


def _component(name: str) -> Component:
    n = name.lower()
    if re.search(r"embed|wte|wpe|word_embeddings", n) and "norm" not in n:
        return Component.EMBEDDING
    if re.search(r"norm|(^|\.)ln", n):
        return Component.NORM
    if "expert" in n:
        return Component.EXPERTS
    if re.search(r"lm_head|(^|\.)output\.weight$|(^|\.)head\.", n):
        return Component.HEAD
    if re.search(r"attn|attention", n):
        return Component.ATTENTION
    if re.search(r"mlp|ffn|feed_forward", n):
        return Component.MLP
    return Component.OTHER


def _describe(module: Any, torch: Any) -> list[Tensor]:
    out = []
    for mod_name, mod in module.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            leaf = mod_name.rsplit(".", 1)[-1]
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            targets = tuple(t for t, names in _TARGETS.items() if leaf in names)
            linear = isinstance(mod, torch.nn.Linear) and p_name == "weight"
            split = Split.REPLICATED
            if targets and (linear or p_name == "bias"):
                split = Split.COLUMN if targets[0] in _COLUMN else Split.ROW
            out.append(Tensor(name=full, shape=tuple(p.shape), component=_component(full),
                              split=split, targets=targets if linear else (), is_linear=linear,
                              is_bias=p_name == "bias"))
    return out


def spec_from_module(module: Any, model_id: str) -> ModelSpec:
    """Describe an already-built ``nn.Module`` (any device, meta included)."""
    import torch

    seen: set[int] = set()
    unique: list[Tensor] = []
    params_by_name = dict(module.named_parameters())  # shared tensors appear once
    for t in _describe(module, torch):
        p = params_by_name.get(t.name)
        if p is not None and id(p) not in seen:
            seen.add(id(p))
            unique.append(t)
    lists = [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.ModuleList)]
    stack_name, stack = max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()),
                            default=("", None))
    layers: list[Layer] = []
    embedding: list[Tensor] = []
    head: list[Tensor] = []
    if stack is not None and len(stack) > 0:
        by_layer: dict[int, list[Tensor]] = {}
        first_index = None
        for i, t in enumerate(unique):
            m = re.match(re.escape(stack_name) + r"\.(\d+)\.", t.name)
            if m:
                first_index = i if first_index is None else first_index
                by_layer.setdefault(int(m.group(1)), []).append(t)
            elif first_index is None:
                embedding.append(t)
            else:
                head.append(t)
        layers = [Layer(kind="decoder", tensors=tuple(by_layer[k])) for k in sorted(by_layer)]
    else:
        embedding = unique
    cfg = getattr(module, "config", None)
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    vocab = int(getattr(cfg, "vocab_size", 0) or 0)
    return ModelSpec(id=model_id, model_type="module", hidden_size=hidden, vocab_size=vocab,
                     embedding=tuple(embedding), layers=tuple(layers), head=tuple(head),
                     source=f"module {model_id} (built on the meta device)")


def check_factory_ref(ref: str) -> None:
    """Refuse a MODEL that looks like a factory but is not ``package.module:function``."""
    mod_name, _, fn_name = ref.partition(":")
    if not (mod_name and fn_name and all(part.isidentifier() for part in mod_name.split("."))
            and fn_name.isidentifier()):
        raise ModelConfigError(
            f"{ref[:80]!r} is not a model factory reference: it must be "
            "'package.module:function' (Python identifiers on both sides of one ':'). Fix: pass "
            "a catalog id, a Hub id (org/name), a path to a config.json, or e.g. "
            "'mypkg.models:build_model'.")


def from_factory(ref: str) -> ModelSpec:
    """Import ``package.module:function``, call it under the meta device, describe the result."""
    check_factory_ref(ref)
    mod_name, _, fn_name = ref.partition(":")
    try:
        import torch
    except ImportError:
        raise ModelConfigError(
            f"{ref}: building a model from Python code needs torch. Install it with "
            "`pip install 'memplan[hf]'` (CPU wheel: `pip install torch==2.13.0`)."
        ) from None
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ModelConfigError(
            f"{ref}: cannot import module {mod_name!r} ({e}). Fix: make sure it is on PYTHONPATH "
            "(run from its directory or `pip install -e` it)."
        ) from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        names = [n for n in dir(mod) if not n.startswith("_")]
        raise ModelConfigError(
            f"{ref}: module {mod_name!r} has no function {fn_name!r}.{did_you_mean(fn_name, names)}"
        )
    try:
        with torch.device("meta"):
            model = fn()
    except Exception as e:  # noqa: BLE001 - the user's factory: report it, never a traceback
        raise ModelConfigError(
            f"{ref}: calling {fn_name}() failed with {type(e).__name__}: {e}. Fix: MODEL's "
            "factory must take no arguments and return a torch.nn.Module."
        ) from None
    if not isinstance(model, torch.nn.Module):
        raise ModelConfigError(
            f"{ref}: {fn_name}() returned {type(model).__name__}, expected a torch.nn.Module."
        )
    return spec_from_module(model, ref)
