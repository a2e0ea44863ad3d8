"""memplan: will this training run fit, on every GPU, and why?

Public API::

    from memplan import estimate, load_model, Recipe, get_device
    b = estimate(load_model("meta-llama/Llama-3.1-8B"), Recipe.of(precision="bf16-mixed"),
                 get_device("H100-80GB"))
    b.worst.peak_allocated_bytes, b.fits
"""

from .api import estimate_from_names, load_recipe
from .breakdown import Breakdown, Category, Item, Moment, Phase, Pool, RankBreakdown, Step
from .errors import ConfigError, MemplanError, UnknownDevice, UnknownModel
from .estimate import estimate
from .hardware import Device, get_device
from .model import ModelSpec, load_model
from .recipe import Recipe

__version__ = "0.1.0"

__all__ = [
    "Breakdown",
    "Category",
    "ConfigError",
    "Device",
    "Item",
    "MemplanError",
    "ModelSpec",
    "Moment",
    "Phase",
    "Pool",
    "RankBreakdown",
    "Recipe",
    "Step",
    "UnknownDevice",
    "UnknownModel",
    "estimate",
    "estimate_from_names",
    "get_device",
    "load_model",
    "load_recipe",
]
