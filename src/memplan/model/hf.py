"""Hugging Face ``config.json`` -> ``ModelSpec``: the registry of architecture builders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import UnsupportedModel, did_you_mean
from . import classic, decoders
from ._build import Config
from .spec import ModelSpec, Tensor

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
    "deepseek_v2": decoders.deepseek,
    "deepseek_v3": decoders.deepseek,
    "gemma3": _gemma3_multimodal,
    "gpt2": classic.gpt2,
    "gpt_neox": classic.gpt_neox,
    "falcon": classic.falcon,
    "bert": classic.bert,
    "t5": classic.t5,
}
"""``model_type`` -> builder. Adding an architecture means adding one builder here."""


def from_hf_config(data: dict[str, Any], model_id: str, *, where: str = "config.json",
                   source: str = "") -> ModelSpec:
    """Describe a model from its HF ``config.json`` contents.

    Raises:
        UnsupportedModel: ``model_type`` has no builder; the message lists the supported ones.
        ModelConfigError: a key the builder needs is missing or malformed.
    """
    mt = data.get("model_type")
    if mt not in BUILDERS:
        raise UnsupportedModel(
            f"{where}: model_type {mt!r} is not supported yet. Supported: "
            f"{', '.join(sorted(BUILDERS))}.{did_you_mean(str(mt), BUILDERS)} "
            "For any other architecture pass a Python factory as MODEL "
            "('package.module:function' returning an nn.Module); memplan builds it on the meta device."
        )
    spec = BUILDERS[mt](Config(data, where), model_id)
    config = spec.config if spec.config is not None else dict(data)
    return replace(spec, source=source or where, config=config)
