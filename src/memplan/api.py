"""High-level entry points shared by the CLI and (later) the web layer: names in, results out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .breakdown import Breakdown
from .estimate import estimate
from .hardware import cpu_device, get_device
from .model import catalog, load_model
from .recipe import Recipe

__all__ = ["estimate_from_names", "trace_from_names", "load_recipe", "catalog_rows"]


def load_recipe(recipe_file: str | Path | None = None,
                overrides: dict[str, Any] | None = None) -> Recipe:
    """A recipe from an optional TOML file with ``overrides`` (e.g. CLI flags) on top."""
    base: dict[str, Any] = {}
    if recipe_file is not None:
        base = Recipe.from_toml(recipe_file).to_dict()
        base.pop("dp")
    return Recipe.from_dict({**base, **(overrides or {})})


def estimate_from_names(model: str, gpu: str, *, recipe_file: str | Path | None = None,
                        overrides: dict[str, Any] | None = None,
                        host_memory_bytes: int = 0) -> Breakdown:
    """Resolve names, validate everything, estimate. Raises ``MemplanError`` on bad input."""
    recipe = load_recipe(recipe_file, overrides)
    device = cpu_device(host_memory_bytes) if recipe.device == "cpu" else get_device(gpu)
    return estimate(load_model(model), recipe, device)


def trace_from_names(model: str, gpu: str, *, recipe_file: str | Path | None = None,
                     overrides: dict[str, Any] | None = None,
                     host_memory_bytes: int = 0) -> Breakdown:
    """Like ``estimate_from_names`` but traced (``memplan.trace``; needs torch)."""
    from .trace import trace

    recipe = load_recipe(recipe_file, overrides)
    device = cpu_device(host_memory_bytes) if recipe.device == "cpu" else get_device(gpu)
    return trace(model, recipe, device)


def catalog_rows() -> list[dict[str, Any]]:
    """One row per catalog model with its structural parameter count."""
    rows = []
    for entry in catalog().values():
        spec = load_model(entry.id)
        rows.append({"id": entry.id, "aliases": list(entry.aliases), "model_type": spec.model_type,
                     "params": spec.num_params, "layers": spec.num_layers,
                     "hidden_size": spec.hidden_size, "vocab_size": spec.vocab_size,
                     "published_params": entry.published_params, "source": entry.source})
    return rows
