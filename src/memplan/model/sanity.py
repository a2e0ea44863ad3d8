"""The one place a config.json's sizes are checked before any builder reads them.

Transformers rejects several of these itself; memplan must never turn a negative or zero size
into "-1,630,273 params ... fits" or a ZeroDivisionError (issue #15). Every message names the
file, the key, the value, the rule, and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ModelConfigError

# key -> (smallest, largest) accepted value. The upper bounds are far above every published
# model (the catalog's largest: hidden 18,432, 126 layers, vocab 262,144, 384 experts).
SIZES: dict[str, tuple[int, int]] = {
    "hidden_size": (1, 1 << 20), "n_embd": (1, 1 << 20), "d_model": (1, 1 << 20),
    "num_hidden_layers": (1, 100_000), "n_layer": (1, 100_000), "num_layers": (1, 100_000),
    "num_attention_heads": (1, 1 << 16), "n_head": (1, 1 << 16),
    "num_key_value_heads": (1, 1 << 16),
    "intermediate_size": (1, 1 << 24), "n_inner": (1, 1 << 24),
    "moe_intermediate_size": (1, 1 << 24),
    "vocab_size": (1, 1 << 24),
    "head_dim": (1, 1 << 16),
    "num_local_experts": (1, 1 << 16), "n_routed_experts": (1, 1 << 16),
    "num_experts_per_tok": (1, 1 << 16),
    "max_position_embeddings": (1, 1 << 40),
}
NAMES = ("hidden_act", "hidden_activation")
"""Keys whose value names a function (``"silu"``, ``"gelu_new"``): transformers looks them up in
``ACT2FN`` by that string, so anything but a string is a broken config."""
FIX = "Fix the value in the config.json (compare with the model's published config)."


def check_sizes(data: Mapping[str, Any], where: str) -> None:
    """Raise ``ModelConfigError`` for a size that is not a whole number in its range, or sizes
    that contradict each other (heads not dividing hidden, kv heads not dividing heads, top-k
    above the expert count). Nested ``text_config`` is checked too."""
    problems: list[str] = []
    _collect(data, where, problems)
    nested = data.get("text_config")
    if isinstance(nested, Mapping):
        _collect(nested, f"{where} [text_config]", problems)
    if problems:
        raise ModelConfigError(" ".join(problems[:4]) + " " + FIX)


def _collect(data: Mapping[str, Any], where: str, problems: list[str]) -> None:
    sizes: dict[str, int] = {}
    for key, (lo, hi) in SIZES.items():
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            problems.append(f"{where}: {key!r} must be a whole number from {lo:,} to {hi:,}, "
                            f"got {data.get(key)!r}.")
            continue
        if not lo <= value <= hi:
            problems.append(f"{where}: {key}={value:,} is out of range: it must be from "
                            f"{lo:,} to {hi:,}.")
            continue
        sizes[key] = value
    for key in NAMES:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            problems.append(f"{where}: {key!r} must name an activation function as a string "
                            f"(for example \"silu\"), got {value!r}.")
    hidden = sizes.get("hidden_size") or sizes.get("n_embd") or sizes.get("d_model")
    heads = sizes.get("num_attention_heads") or sizes.get("n_head")
    kv = sizes.get("num_key_value_heads")
    if hidden and heads and "head_dim" not in data and hidden % heads:
        problems.append(f"{where}: hidden_size={hidden:,} is not divisible by "
                        f"num_attention_heads={heads}; every head needs hidden/heads channels.")
    if heads and kv and heads % kv:
        problems.append(f"{where}: num_key_value_heads={kv} does not divide "
                        f"num_attention_heads={heads} (grouped-query attention shares each kv "
                        "head among heads/kv query heads).")
    experts = sizes.get("num_local_experts") or sizes.get("n_routed_experts")
    if experts is None and isinstance(data.get("num_experts"), int) and data["num_experts"] > 0:
        experts = data["num_experts"]
    top_k = sizes.get("num_experts_per_tok")
    if experts and top_k and top_k > experts:
        problems.append(f"{where}: num_experts_per_tok={top_k} is more than the {experts} "
                        "experts there are to route to.")
