"""High-level entry points shared by the CLI and (later) the web layer: names in, results out."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .breakdown import Breakdown
from .estimate import check_allocator, estimate
from .hardware import cpu_device, get_device
from .hardware.nodes import get_node
from .host import HostSetup, node_hardware, parse_size
from .errors import UnsupportedModel
from .model import ModelSpec, catalog, load_model
from .model.resolve import find_config
from .recipe import Recipe, read_recipe_file
from .system import with_host_and_time
from .timing.calibration import Calibration

__all__ = ["Machine", "estimate_from_names", "trace_from_names", "load_recipe", "load_job",
           "catalog_rows"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Machine:
    """Where the job runs, by name: the GPU, an optional node preset and overrides of it."""

    gpu: str | None = None
    """GPU name from the catalog; None means the node's GPU, else H100-80GB."""
    node: str | None = None
    """Node preset (``nodes.toml``): host RAM, NVMe, PCIe, NVLink, network, CPU cores."""
    host_ram: str | int | None = None
    """Host RAM per node (``2TiB`` or bytes), overriding the preset."""
    nvme: str | int | None = None
    """Local NVMe per node, overriding the preset."""
    pcie: int | None = None
    """PCIe generation of the GPU links, overriding the preset."""
    host_memory_bytes: int = 0
    """RAM of this machine, the capacity of ``device = cpu`` runs."""


def load_recipe(recipe_file: str | Path | None = None,
                overrides: dict[str, Any] | None = None) -> Recipe:
    """A recipe from an optional TOML/JSON file with ``overrides`` (e.g. CLI flags) on top."""
    return load_job(recipe_file, overrides)[0]


def load_job(recipe_file: str | Path | None = None, overrides: dict[str, Any] | None = None,
             host_overrides: dict[str, Any] | None = None, *,
             engine_file: str | Path | None = None, model: str | None = None,
             ) -> tuple[Recipe, HostSetup]:
    """The recipe and its ``[host]`` table from one read of an optional file, each with its
    overrides on top, validated once after merging. ``engine_file`` (``--from``) is an engine's
    config (ds_config, accelerate YAML, TrainingArguments JSON, torchtitan TOML, Lightning or
    Megatron JSON, torchrun script) read into recipe keys between the recipe file and the
    overrides; what was read, resolved and ignored goes into the recipe's notes. ``model``
    sizes DeepSpeed's hidden-size "auto" values."""
    from .export import read_engine_file

    data = read_recipe_file(recipe_file) if recipe_file is not None else {}
    notes: tuple[str, ...] = ()
    if engine_file is not None:
        imported = read_engine_file(engine_file, hidden_size=_hidden_size(model))
        if imported is None:  # memplan's own recipe file given as --from
            data = {**data, **read_recipe_file(engine_file)}
        else:
            data = {**data, **imported.keys}
            notes = imported.notes(str(engine_file))
    table = data.pop("host", {})
    where = str(recipe_file or engine_file or "recipe")
    recipe = Recipe.from_dict({**data, **(overrides or {})}, where=where)
    if notes:
        recipe = replace(recipe, notes=recipe.notes + notes)
    if not isinstance(table, dict):
        from .errors import ModelConfigError

        raise ModelConfigError(f"{where}: 'host' must be a table ([host]), got {table!r}.")
    setup = HostSetup.from_dict({**table, **(host_overrides or {})}, where=f"{where} [host]")
    return recipe, setup


def _hidden_size(model: str | None) -> int | None:
    if model is None:
        return None
    from .errors import MemplanError

    try:
        return load_model(model).hidden_size
    except MemplanError:  # the estimate reports a bad MODEL itself
        return None


def estimate_from_names(model: str | ModelSpec, recipe: Recipe, machine: Machine | None = None,
                        setup: HostSetup | None = None, *,
                        calibration: Calibration | None = None,
                        search_micro_batch: bool = True,
                        allocator: str = "flat") -> Breakdown:
    """Resolve names, estimate GPU memory, host RAM, NVMe and step time (with the rates of a
    ``memplan calibrate`` file when ``calibration`` is given). Raises ``MemplanError`` on bad
    input. ``model`` may also be a ``ModelSpec`` already built (the web page's pasted
    config.json); ``search_micro_batch=False`` skips the largest-micro-batch search (several more
    estimates), leaving ``max_micro_batch`` None. ``allocator``: ``estimate.ALLOCATORS``, the
    caching allocator's slack as a flat fraction or replayed (the generic path is always flat)."""
    check_allocator(allocator)
    machine = machine or Machine()
    load = (setup or HostSetup()).load  # the GPU's load phase reads the host's load mode
    preset = get_node(machine.node) if machine.node else None
    if preset is not None and recipe.parallelism.gpus_per_node == 0:
        recipe = recipe.with_keys(gpus_per_node=min(recipe.parallelism.gpus, preset.gpus))
    try:
        spec = model if isinstance(model, ModelSpec) else load_model(model)
    except UnsupportedModel:
        found = find_config(model) if isinstance(model, str) else None
        mt = found[0].get("model_type") if found else None
        if not found or not _transformers_knows(str(mt)):
            raise
        from .generic import generic_estimate

        cpu = recipe.platform.device == "cpu"
        return generic_estimate(model, str(mt), recipe, cpu_device(machine.host_memory_bytes)
                                if cpu else get_device(machine.gpu or "H100-80GB"))
    if recipe.platform.device == "cpu":
        return estimate(spec, recipe, cpu_device(machine.host_memory_bytes),
                        search_micro_batch=search_micro_batch, load=load, allocator=allocator)
    device = get_device(machine.gpu if machine.gpu is not None
                        else (preset.gpu if preset else "H100-80GB"))
    hw = node_hardware(
        device, recipe.parallelism.local_gpus, preset,
        host_ram_bytes=parse_size(machine.host_ram, "--host-ram") if machine.host_ram else None,
        nvme_bytes=parse_size(machine.nvme, "--nvme") if machine.nvme else None,
        pcie_gen=machine.pcie)
    return with_host_and_time(estimate(spec, recipe, device, search_micro_batch=search_micro_batch,
                                       load=load, allocator=allocator),
                              spec, recipe, device, hw, setup, calibration)


def _transformers_knows(model_type: str) -> bool:
    """Whether the installed transformers has a config class for ``model_type`` (False without
    transformers: the analytic refusal then stands)."""
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return False
    return model_type in CONFIG_MAPPING


def trace_from_names(model: str, recipe: Recipe, gpu: str = "H100-80GB",
                     host_memory_bytes: int = 0, *,
                     cpu_kernels_without_cuda: bool = False) -> Breakdown:
    """Like ``estimate_from_names`` but traced (``memplan.trace``; needs torch).
    ``cpu_kernels_without_cuda``: on a torch built without CUDA, trace a ``device=cuda`` recipe
    with CPU kernels (noted in the result) instead of refusing it; still reported on ``gpu``."""
    from dataclasses import replace

    from . import trace as tracing

    note = None
    if cpu_kernels_without_cuda:
        recipe, note = tracing.cpu_kernels_without_cuda(recipe)
    on_cpu = recipe.platform.device == "cpu" and note is None
    b = tracing.trace(model, recipe, cpu_device(host_memory_bytes) if on_cpu else get_device(gpu))
    if note:
        b = replace(b, model=replace(b.model, notes=tuple(b.model.notes or ()) + (note,)))
    return b


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
