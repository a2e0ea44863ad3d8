"""Model descriptions: what the network's parameters are and how big each layer is."""

from .catalog import CatalogEntry, catalog
from .hf import from_hf_config
from .resolve import load_model
from .spec import LORA_TARGETS, Attention, Component, Ffn, Layer, ModelSpec, Split, Tensor

__all__ = [
    "LORA_TARGETS",
    "Attention",
    "CatalogEntry",
    "Component",
    "Ffn",
    "Layer",
    "ModelSpec",
    "Split",
    "Tensor",
    "catalog",
    "from_hf_config",
    "load_model",
]
