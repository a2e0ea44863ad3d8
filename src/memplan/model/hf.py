"""Hugging Face ``config.json`` -> ``ModelSpec``: the registry of architecture builders."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from importlib import resources
from typing import Any

from ..errors import UnsupportedModel, did_you_mean
from . import classic, decoders, ln_decoders
from ._build import Config
from .sanity import check_sizes
from .spec import ModelSpec, Tensor
from .traits import traits_for

Builder = Callable[[Config, str], ModelSpec]


GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
}
"""transformers ``Gemma3TextConfig`` defaults that the Hub's Gemma 3 4B/12B/27B config.json files
rely on (they omit these keys)."""
SIGLIP_DEFAULTS = {"num_channels": 3}
"""transformers ``SiglipVisionConfig`` default the Gemma 3 vision_config omits."""


def _gemma3_multimodal(c: Config, model_id: str) -> ModelSpec:
    """Gemma 3 4B/12B/27B (``Gemma3ForConditionalGeneration``): text decoder + SigLIP tower +
    projector (``mm_input_projection_weight`` and ``mm_soft_emb_norm``). The vision tower and
    projector are placed with the embedding (pipeline stage 0)."""
    text = {**GEMMA3_TEXT_DEFAULTS, **c.sub("text_config").data, "model_type": "gemma3_text"}
    if c.get("tie_word_embeddings") is not None:
        text["tie_word_embeddings"] = c.get("tie_word_embeddings")
    spec = decoders.llama_like(Config(text, c.where + " [text_config]"), model_id)
    vision = Config({**SIGLIP_DEFAULTS, **c.sub("vision_config").data}, c.where + " [vision_config]")
    vh, th = vision.int("hidden_size"), spec.hidden_size
    from .spec import Component

    projector = [
        Tensor(name="multi_modal_projector.mm_input_projection_weight", shape=(vh, th),
               component=Component.VISION),
        Tensor(name="multi_modal_projector.mm_soft_emb_norm.weight", shape=(vh,),
               component=Component.VISION),
    ]
    return replace(spec, model_type="gemma3", config=text,
                   embedding=spec.embedding + tuple(classic.siglip_vision(vision) + projector))


BUILDERS: dict[str, Builder] = {
    **{mt: decoders.llama_like for mt in decoders._STYLES},
    "qwen": decoders.qwen1,  # Qwen (1): remote code on the Hub, described from its config
    "deepseek_v2": decoders.deepseek,
    "deepseek_v3": decoders.deepseek,
    "gemma3": _gemma3_multimodal,
    "gpt2": classic.gpt2,
    "gpt_neox": classic.gpt_neox,
    "falcon": classic.falcon,
    "phi": ln_decoders.phi,
    "stablelm": ln_decoders.stablelm,
    "starcoder2": ln_decoders.starcoder2,
    "bert": classic.bert,
    "t5": classic.t5,
    "mt5": classic.t5,  # mT5 / mT0: T5 v1.1's architecture (modeling_mt5.py copies T5)
}
"""``model_type`` -> builder. Adding an architecture means adding one builder here."""


@cache
def _class_defaults() -> dict[str, dict[str, Any]]:
    return tomllib.loads(resources.files(__package__).joinpath("hf_defaults.toml").read_text())


def layer_types(c: dict[str, Any]) -> list[str]:
    """Attention type of each layer (``full_attention`` / ``sliding_attention``) as transformers
    computes it when config.json has no ``layer_types`` (``__post_init__`` of each config class):
    Gemma 2 alternates sliding and full; Gemma 3 makes every ``sliding_window_pattern``-th
    layer full; Qwen2/Qwen3 slide from layer ``max_window_layers`` on when
    ``use_sliding_window``; all other families are full."""
    if c.get("layer_types"):
        return list(c["layer_types"])
    n, mt = int(c.get("num_hidden_layers") or 0), c.get("model_type")
    if mt == "gemma2":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if mt == "gemma3_text":
        k = int(c.get("sliding_window_pattern") or 6)
        return ["sliding_attention" if (i + 1) % k else "full_attention" for i in range(n)]
    if mt in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and c.get("use_sliding_window") and c.get("sliding_window"):
        first = int(c.get("max_window_layers") or 28)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return ["full_attention"] * n


def with_class_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` completed as transformers completes it: the config class's defaults for keys
    the file omits (``hf_defaults.toml``) and the computed ``layer_types``. Keys present in
    ``data`` are never changed."""
    mt = str(data.get("model_type"))
    out = {**_class_defaults().get(mt, {}), **data}
    if "num_hidden_layers" in out:
        out["layer_types"] = layer_types(out)
    return out


def from_hf_config(data: dict[str, Any], model_id: str, *, where: str = "config.json",
                   source: str = "") -> ModelSpec:
    """Describe a model from its HF ``config.json`` contents.

    Raises:
        UnsupportedModel: ``model_type`` has no builder; the message lists the supported ones.
        ModelConfigError: a key the builder needs is missing or malformed.
    """
    mt = data.get("model_type")
    if not isinstance(mt, str) or mt not in BUILDERS:
        raise UnsupportedModel(
            f"{where}: model_type {mt!r} is not supported yet. Supported: "
            f"{', '.join(sorted(BUILDERS))}.{did_you_mean(str(mt), BUILDERS)} "
            "For any other architecture pass a Python factory as MODEL "
            "('package.module:function' returning an nn.Module); memplan builds it on the meta device."
        )
    check_sizes(data, where)
    spec = BUILDERS[mt](Config(data, where), model_id)
    config = with_class_defaults(spec.config if spec.config is not None else dict(data))
    first = next((ly.attention for ly in spec.layers if ly.attention), None)
    names = {t.name for ly in spec.layers for t in ly.tensors}
    traits = traits_for(spec.model_type, config, first.head_dim if first else 0, names)
    return replace(spec, source=source or where, config=config, traits=traits)
