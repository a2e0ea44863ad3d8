"""High-level entry points shared by the CLI and (later) the web layer: names in, results out."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from .breakdown import Breakdown
from .estimate import estimate
from .hardware import cpu_device, get_device
from .hardware.nodes import get_node
from .host import HostSetup, node_hardware, parse_size
from .system import with_host_and_time
from .model import catalog, load_model
from .recipe import Recipe

__all__ = ["estimate_from_names", "trace_from_names", "load_recipe", "load_host_setup",
           "catalog_rows"]


def load_recipe(recipe_file: str | Path | None = None,
                overrides: dict[str, Any] | None = None) -> Recipe:
    """A recipe from an optional TOML file with ``overrides`` (e.g. CLI flags) on top."""
    base: dict[str, Any] = {}
    if recipe_file is not None:
        base = Recipe.from_toml(recipe_file).to_dict()
        base.pop("dp")
    return Recipe.from_dict({**base, **(overrides or {})})


def load_host_setup(recipe_file: str | Path | None = None,
                    overrides: dict[str, Any] | None = None) -> HostSetup:
    """The ``[host]`` table of an optional recipe TOML with ``overrides`` on top (issue #5)."""
    base = HostSetup.from_toml(recipe_file).to_dict() if recipe_file is not None else {}
    return HostSetup.from_dict({**base, **(overrides or {})})


def estimate_from_names(model: str, gpu: str | None, *, recipe_file: str | Path | None = None,
                        overrides: dict[str, Any] | None = None,
                        host_memory_bytes: int = 0, node: str | None = None,
                        host_ram: str | int | None = None, nvme: str | int | None = None,
                        pcie: int | None = None,
                        host_overrides: dict[str, Any] | None = None) -> Breakdown:
    """Resolve names, validate everything, estimate GPU memory, host RAM, NVMe and step time.
    ``gpu`` None means the node's GPU (or H100-80GB without a node). Raises ``MemplanError``
    on bad input."""
    preset = get_node(node) if node else None
    recipe = load_recipe(recipe_file, overrides)
    if preset is not None and recipe.gpus_per_node == 0:
        recipe = replace(recipe, gpus_per_node=min(recipe.gpus, preset.gpus))
    setup = load_host_setup(recipe_file, host_overrides)
    if recipe.device == "cpu":
        return estimate(load_model(model), recipe, cpu_device(host_memory_bytes))
    device = get_device(gpu or (preset.gpu if preset else "H100-80GB"))
    hw = node_hardware(device, recipe.local_gpus, preset,
                       host_ram_bytes=parse_size(host_ram, "--host-ram") if host_ram else None,
                       nvme_bytes=parse_size(nvme, "--nvme") if nvme else None, pcie_gen=pcie)
    spec = load_model(model)
    return with_host_and_time(estimate(spec, recipe, device), spec, recipe, device, hw, setup)


def trace_from_names(model: str, gpu: str, *, recipe_file: str | Path | None = None,
                     overrides: dict[str, Any] | None = None,
                     host_memory_bytes: int = 0) -> Breakdown:
    """Like ``estimate_from_names`` but traced (``memplan.trace``; needs torch)."""
    from .trace import trace

    recipe = load_recipe(recipe_file, overrides)
    device = cpu_device(host_memory_bytes) if recipe.device == "cpu" else get_device(gpu)
    return trace(model, recipe, device)


def catalog_rows(search_text: str = "", *, family: str | None = None,
                 min_params: int | None = None, max_params: int | None = None
                 ) -> list[dict[str, Any]]:
    """One row per catalog model (optionally searched, see ``model.catalog.search``) with its
    structural parameter count. A family memplan cannot build yet stays listed, with
    ``estimable`` False and the reason, instead of failing the listing."""
    from .errors import MemplanError
    from .model.catalog import search

    rows = []
    for entry in search(search_text, family=family, min_params=min_params,
                        max_params=max_params):
        row: dict[str, Any] = {"id": entry.id, "aliases": list(entry.aliases),
                               "model_type": entry.family, "base": entry.base or None,
                               "published_params": entry.published_params,
                               "source": entry.source}
        try:
            spec = load_model(entry.id)
        except MemplanError as e:
            row.update(estimable=False, why=str(e), params=None, layers=None, hidden_size=None,
                       vocab_size=None)
        else:
            row.update(estimable=True, why="", params=spec.num_params, layers=spec.num_layers,
                       hidden_size=spec.hidden_size, vocab_size=spec.vocab_size)
        rows.append(row)
    return rows
