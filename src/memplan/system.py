"""The host side and the clock of a job (issue #5): attach host RAM, NVMe and step time to a
GPU ``Breakdown``. Pure: the GPU estimate comes in, a richer ``Breakdown`` goes out."""

from __future__ import annotations

from dataclasses import replace

from .breakdown import Breakdown
from .errors import UnsupportedModel
from .estimate.activations import stage_traffic
from .estimate.layout import layout
from .facts import dtypes
from .hardware import Device
from .host import HostSetup, NodeHardware, estimate_host
from .recipe.host import LOAD_MODES
from .recipe.memo import kept_by_parts
from .model.spec import ModelSpec
from .recipe import Recipe
from .timing import estimate_time
from .timing.calibration import Calibration
from .timing.pipeline import StageLoad
from .timing.schedule import timed

__all__ = ["with_host_and_time", "stage_loads"]


def stage_loads(model: ModelSpec, recipe: Recipe,
                memo: dict[object, object] | None = None) -> list[StageLoad] | None:
    """Per pipeline stage, what one of its ranks holds and moves: its layers, its trainable
    elements (after TP / EP splits, the embedding on the first stage and the output layer on the
    last) and the memory-bound bytes and kernel launches of one micro-batch, from the same op
    graph as the activation estimate; None for a model without an op graph."""
    if memo is None:
        return _stage_loads(model, recipe, None)
    # layout reads method and parallelism; stage_traffic the activation context's parts
    # (activations._context), the checkpointing and attention (_graph_args) and dtypes
    return kept_by_parts(memo, "stage_loads", (
        recipe.method, recipe.engine, recipe.parallelism, recipe.precision, recipe.batch,
        recipe.platform, recipe.loss, recipe.checkpointing), lambda: _stage_loads(
            model, recipe, memo))


def _stage_loads(model: ModelSpec, recipe: Recipe,
                 memo: dict[object, object] | None) -> list[StageLoad] | None:
    dt = dtypes(recipe)
    try:
        stages = layout(model, recipe, memo)
        return [StageLoad(layers=st.layers, trainable=float(st.trainable_numel),
                          expert_trainable=float(st.expert_trainable_numel),
                          traffic=stage_traffic(model, st, recipe, dt, memo))
                for st in stages]
    except UnsupportedModel:
        return None


def with_host_and_time(b: Breakdown, model: ModelSpec, recipe: Recipe, device: Device,
                       hw: NodeHardware, setup: HostSetup | None = None,
                       calibration: Calibration | None = None,
                       memo: dict[object, object] | None = None) -> Breakdown:
    """``b`` with ``host``, ``nvme`` and ``time`` filled in (``time`` stays None when the GPU
    has no dense peak for the compute dtype; nothing is added for ``device = cpu``).
    ``memo``: the estimator's memo for this model (``memplan plan``), reused for the op graph's
    traffic."""
    if recipe.platform.device == "cpu":
        return b
    setup = setup or HostSetup()
    host, nvme = estimate_host(b, model, recipe, hw, setup)
    if host.fits is False:
        # name the fix: the same job with each model-loading mode that needs less host RAM
        cheaper = sorted((peak, mode) for mode in LOAD_MODES if mode != setup.load
                         if (peak := estimate_host(b, model, recipe, hw, replace(
                             setup, load=mode))[0].per_node_peak_bytes) < host.per_node_peak_bytes)
        host = replace(host, other_loads=tuple((mode, peak) for peak, mode in cheaper))
    trainable = b.model.trainable_params
    time = estimate_time(model, recipe, device, hw, setup, trainable, calibration,
                         stage_loads(model, recipe, memo))
    ranks = b.ranks
    if time is not None and len(time.stages) == len(ranks):   # one rank per pipeline stage
        ranks = tuple(replace(r, moments=timed(r.moments, p, time.step_seconds))
                      for r, p in zip(ranks, time.stages))
    return replace(b, host=host, nvme=nvme, time=time, ranks=ranks)
