"""The analytical estimator: ``estimate(model, recipe, device) -> Breakdown``.

Pure arithmetic on the ``ModelSpec``; never imports torch. Each category comes from a small
module (``model_states``, ``overhead``) whose functions state their formula and source.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from ..breakdown import Breakdown, Category, Item, Moment, Phase, Pool, RankBreakdown
from ..errors import ConfigError, did_you_mean
from ..hardware import Device
from ..model.spec import ModelSpec
from ..recipe import Checkpointing, Offload, Parallelism, Recipe
from ..recipe.engine import Engine
from ..recipe.host import LOAD_MODES
from ..results import ModelInfo
from .checks import check_compatible
from ..recipe.memo import kept_by_parts
from .layout import Stage, layout
from .model_states import model_state_items
from .overhead import fragmentation_item, nccl_items, overhead_items
from .activations import cpu_checkpoint_bytes, points_key, stage_events, stage_points
from .activations import accumulates
from .reserved import replayed_slack, slack_item, stream_covers
from .lines import Line
from .fsdp1_units import fsdp1_instants, fsdp1_per_moment
from .fsdp2_units import fsdp2_instants, fsdp2_per_moment
from .load import load_moments
from .loop import loop_lines
from .optimizer_step import optimizer_step_items
from .instants import StageInstants
from .timeline import Instant, LineSums, Phased, line_sums, moments, peak_allocated, phased
from .warnings import recipe_warnings
from .zero3_live import zero3_instants, zero3_live_applies
from ..facts import Dtypes, dtypes

__all__ = ["estimate", "rank_totals", "stage_parts", "StageParts", "trainable_params"]
T, U = TypeVar("T"), TypeVar("U")


def _role(stage: Stage, recipe: Recipe) -> str:
    if recipe.parallelism.pp == 1:
        return "every rank"
    what = []
    if stage.index == 0:
        what.append("embedding")
    if stage.index == recipe.parallelism.pp - 1:
        what.append("head")
    layers = f"layers {stage.layers.start}-{stage.layers.stop - 1}" if len(stage.layers) else "no layers"
    extra = f", {' + '.join(what)}" if what else ""
    return f"pp stage {stage.index} ({layers}{extra})"


def trainable_params(model: ModelSpec, recipe: Recipe,
                     memo: dict[object, object] | None = None) -> int:
    """Trainable parameters of the whole model (adapters for LoRA), counted once: the
    recipe on one GPU, without offload, engine or checkpointing (``Breakdown.model``'s
    ``trainable_params``). ``memo``: kept under every recipe part but those four, which the
    count (and the recipe checks the replacement runs) cannot read.

    Raises:
        ConfigError: the recipe on one GPU is refused (as ``estimate`` refuses it).
    """
    if memo is None:
        return _count_trainable(model, recipe, None)
    return kept_by_parts(memo, "trainable", (
        recipe.precision, recipe.optimizer, recipe.method, recipe.batch, recipe.loss,
        recipe.platform, recipe.loop), lambda: _count_trainable(model, recipe, memo))


def _count_trainable(model: ModelSpec, recipe: Recipe, memo: dict[object, object] | None) -> int:
    # engine reset too: a named engine may refuse zero=0 (fsdp2 only runs zero=3)
    whole = replace(recipe, parallelism=Parallelism(), offload=Offload(), engine=Engine(),
                    checkpointing=Checkpointing())
    return layout(model, whole, memo)[0].trainable_numel


_trainable = trainable_params


def _num_params(model: ModelSpec, memo: dict[object, object] | None) -> int:
    if memo is None:
        return model.num_params
    if "num_params" not in memo:
        memo["num_params"] = model.num_params
    return memo["num_params"]  # type: ignore[return-value]


def _by_component(model: ModelSpec, memo: dict[object, object] | None) -> dict[str, int]:
    if memo is None:
        return model.params_by_component()
    if "params_by_component" not in memo:
        memo["params_by_component"] = model.params_by_component()
    return dict(memo["params_by_component"])  # type: ignore[call-overload]


def _states(stage: Stage, recipe: Recipe, dt: Dtypes,
            memo: dict[object, object] | None) -> list[Line]:
    """``model_state_items`` of ``stage``; ``memo``: kept under what it reads (``grep
    recipe. estimate/model_states.py``; ``dt`` is ``dtypes(recipe)``, which reads precision,
    engine and parallelism): the stage (``layout``'s key: method, tp, ep, pp; and the stage's
    index), parallelism, offload, method, engine, precision, optimizer, loop, and of the batch
    only whether gradients accumulate (``grad_accum > 1``). Not checkpointing, loss, platform:
    the candidates that differ only there share the lines."""
    if memo is None:
        return model_state_items(stage, recipe, dt)
    key = ("model_state_items", stage.index, recipe.batch.grad_accum > 1, recipe.parallelism,
           recipe.offload, recipe.method, recipe.engine, recipe.precision, recipe.optimizer,
           recipe.loop)
    got = memo.get(key)
    if got is None:
        got = memo[key] = model_state_items(stage, recipe, dt)
    return got  # type: ignore[return-value]  # shared: read only


def _fixed_lines(stage: Stage, recipe: Recipe, device: Device, dt: Dtypes,
                 memo: dict[object, object] | None) -> list[Line]:
    """``overhead_items``, ``nccl_items`` and ``_step_lines`` of ``stage``, in that order;
    ``memo``: kept by what they read (``kept_by_parts``; ``dt``: precision, engine, parallelism;
    the memo's device): the stage's index (``layout``: method, parallelism), parallelism,
    offload, method, engine, precision, optimizer, platform, batch; not checkpointing, loss."""
    def make() -> list[Line]:
        return (overhead_items(device, recipe.platform.device == "cpu")
                + nccl_items(recipe, stage.index) + _step_lines(stage, recipe, dt))
    return make() if memo is None else kept_by_parts(memo, ("fixed_lines", stage.index), (
        recipe.parallelism, recipe.offload, recipe.method, recipe.engine, recipe.precision,
        recipe.optimizer, recipe.platform, recipe.batch), make)


def _step_lines(stage: Stage, recipe: Recipe, dt: Dtypes) -> list[Line]:
    # optimizer in backward: each parameter steps inside the backward
    oib = recipe.optimizer.in_backward
    when = (Phase.BACKWARD,) if oib else (Phase.OPTIMIZER,)
    out = [Line(i, when, stepping=("after" if "after the backward" in i.name else "during")
                if oib else "") if i.category == Category.TEMPORARY
           else Line(i, lazy=True) for i in optimizer_step_items(stage, recipe, dt)]
    tokens = recipe.batch.micro_batch * recipe.batch.seq_len
    out.append(Line(Item(category=Category.ACTIVATIONS, name="input batch (token ids + labels)",
                         bytes=2 * 8 * tokens, formula="2 int64 tensors of micro_batch x seq_len")))
    return out


def _instants(model: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes,
              memo: dict[object, object] | None = None) -> StageInstants:
    """The activation timeline of one micro-batch, plus the saved activations of the other
    micro-batches a pipeline stage holds in flight (1F1B: stage i holds pp - i); built when
    read (``instants.py``). ``memo``: kept under what it reads, the simulation's key
    (``points_key``) and the micro-batches in flight."""
    par = recipe.parallelism
    inflight = inflight_microbatches(par.pp, stage.index, par.pp_virtual,
                                     recipe.batch.grad_accum)
    if memo is None:
        return StageInstants(*stage_points(model, stage, recipe, dt), inflight,
                             par.pp_virtual > 1)
    key = ("instants", points_key(model, stage, recipe, dt, memo), inflight,
           par.pp_virtual > 1)
    got = memo.get(key)
    if got is None:
        got = memo[key] = StageInstants(*stage_points(model, stage, recipe, dt, memo),
                                        inflight, par.pp_virtual > 1)
    return got  # type: ignore[return-value]


def inflight_microbatches(pp: int, stage: int, virtual: int, microbatches: int) -> float:
    """Micro-batches whose activations pipeline rank ``stage`` holds at its peak, in units of
    the rank's whole layer stack.

    1F1B (Narayanan et al. 2021, §2.2): ``pp - stage`` (warm-up forwards plus the one in
    progress), at most the step's micro-batches. Interleaved, ``virtual`` chunks per rank
    (Megatron-Core ``schedules.py``, ``forward_backward_pipelining_with_interleaving``):
    ``(pp - stage - 1) * 2 + (virtual - 1) * pp`` warm-up chunk forwards plus one, each chunk
    ``1 / virtual`` of the rank's layers; for stage 0 this is ``pp * (1 + (pp - 1) / (pp *
    virtual))`` micro-batches, the factor of Korthikanti et al. 2022 (arXiv 2205.05198, §4.2.3).
    """
    if virtual <= 1:
        return float(min(pp - stage, microbatches))
    chunks = min((pp - stage - 1) * 2 + (virtual - 1) * pp + 1, microbatches * virtual)
    return chunks / virtual


def _stage_parts(model: ModelSpec, stage: Stage, recipe: Recipe, device: Device, dt: Dtypes,
                 memo: dict[object, object] | None, load: str
                 ) -> tuple[list[Line], Sequence[Instant], tuple[Moment, ...], list[Item],
                            tuple[LineSums, ...], Phased]:
    """What one rank of ``stage`` is made of: the phase-long lines, the activation instants,
    the load moments, the lines outside the allocated pool (before the allocator slack,
    which depends on the peak), the ``line_sums`` of the lines' groups (states, loop, fixed)
    and the instants ``phased`` (what the memo holds is summed and grouped once)."""
    states = _states(stage, recipe, dt, memo)
    loop = loop_lines(model, stage, recipe, dt, states)
    fixed = _fixed_lines(stage, recipe, device, dt, memo)
    lines = states + loop + fixed
    groups = (_once(memo, states, line_sums), line_sums(loop), _once(memo, fixed, line_sums))
    instants: Sequence[Instant]
    instants = shared = _instants(model, stage, recipe, dt, memo)
    persistent = any(ln.item.category == Category.GRADIENTS and Phase.FORWARD in ln.phases
                     for ln in states)
    if fsdp2_per_moment(recipe):
        instants = fsdp2_instants(stage, recipe, dt, instants, sharded_grads=not persistent)
    elif fsdp1_per_moment(recipe):
        instants = fsdp1_instants(stage, recipe, dt, instants, sharded_grads=not persistent)
    elif zero3_live_applies(recipe):
        instants = zero3_instants(stage, recipe, dt, instants)
    phases = _once(memo if instants is shared else None, instants, _phased)
    init = load_moments(stage, recipe, dt, lines, load=load, capacity_bytes=device.capacity_bytes)
    outside = [ln.item for ln in lines if ln.item.pool != Pool.ALLOCATED]
    par = recipe.parallelism
    host_ckpt = cpu_checkpoint_bytes(model, stage, recipe, dt, inflight_microbatches(
        par.pp, stage.index, par.pp_virtual, recipe.batch.grad_accum))
    if host_ckpt:
        outside.append(Item(category=Category.ACTIVATIONS, pool=Pool.HOST, bytes=host_ckpt,
                            name="checkpointed layer inputs (cpu_checkpointing: "
                            + ("DeepSpeed)" if str(recipe.engine_kind) == "deepspeed"
                               else "torchtune activation offloading)"),
                            formula="checkpointed layers x layer input (/ tp when "
                            "partitioned) x micro-batches in flight"))
    return lines, instants, init, outside, groups, phases


def _phased(instants: Sequence[Instant]) -> Phased:
    """``phased``; a stage's own instants read off their points, with the frontier."""
    return instants.phased() if isinstance(instants, StageInstants) else phased(instants)


def _once(memo: dict[object, object] | None, what: T, make: Callable[[T], U]) -> U:
    """``make(what)``, kept by the identity of ``what`` (an object the memo holds)."""
    return make(what) if memo is None else kept_by_parts(memo, make, (what,), lambda: make(what))


StageParts = tuple[Stage, list[Line], Sequence[Instant], tuple[Moment, ...], list[Item],
                   tuple[LineSums, ...], Phased]
"""A stage, and ``_stage_parts`` of one rank of it (read only: shared by the callers)."""


def stage_parts(model: ModelSpec, recipe: Recipe, device: Device, *,
                memo: dict[object, object] | None = None,
                load: str = "full") -> tuple[StageParts, ...]:
    """Each pipeline stage's parts, after ``estimate``'s own checks; ``estimate(parts=...)``
    and ``rank_totals(parts=...)`` of the same arguments build on them.

    Raises:
        ConfigError: as ``estimate`` (the same checks, run first).
    """
    check_compatible(model, recipe)
    _check_load(load)
    _trainable(model, recipe, memo)  # estimate's own refusals, if any, apply here too
    dt = dtypes(recipe)
    return tuple((stage, *_stage_parts(model, stage, recipe, device, dt, memo, load))
                 for stage in layout(model, recipe, memo))


ALLOCATORS = ("flat", "replay")
"""How the caching allocator's slack is estimated: ``flat``, a fraction of the peak
(``overhead.fragmentation_item``); ``replay``, the simulated step replayed through the
allocator's rules (``reserved.py``) where the stream covers the step (``stream_covers``), the
flat fraction elsewhere; slower: ``estimate`` and the golden comparison."""


def _slack(model: ModelSpec, stage: Stage, lines: list[Line], recipe: Recipe, peak: int,
           allocator: str) -> Item | None:
    """The allocator slack of one rank of ``stage`` with a ``peak`` allocated."""
    if allocator == "flat" or recipe.platform.device == "cpu" or not stream_covers(recipe):
        return fragmentation_item(peak, recipe)
    events = stage_events(model, stage, recipe, dtypes(recipe))
    return slack_item(replayed_slack(events, lines, recipe, accumulates(recipe)),
                      recipe.platform.expandable_segments)


def _ranks(model: ModelSpec, recipe: Recipe, device: Device,
           memo: dict[object, object] | None = None, load: str = "full",
           parts: tuple[StageParts, ...] | None = None,
           allocator: str = "flat") -> tuple[RankBreakdown, ...]:
    """One ``RankBreakdown`` per pipeline stage (the recipe is already checked): the load
    phase, then the first and the steady step."""
    if parts is None:
        dt = dtypes(recipe)
        parts = tuple((stage, *_stage_parts(model, stage, recipe, device, dt, memo, load))
                      for stage in layout(model, recipe, memo))
    ranks = []
    per_stage = recipe.parallelism.gpus // recipe.parallelism.pp
    for stage, lines, instants, init, outside, _, _ in parts:
        timeline = init + moments(lines, instants)
        slack = _slack(model, stage, lines, recipe, max(m.allocated_bytes for m in timeline),
                       allocator)
        ranks.append(RankBreakdown(role=_role(stage, recipe), ranks=per_stage,
                                   moments=timeline, outside=tuple(outside) + (
                                       (slack,) if slack is not None else ())))
    return tuple(ranks)


def rank_totals(model: ModelSpec, recipe: Recipe, device: Device, *,
                memo: dict[object, object] | None = None, load: str = "full",
                parts: tuple[StageParts, ...] | None = None,
                allocator: str = "flat") -> list[tuple[str, int]]:
    """(role, ``device_total_bytes``) of each rank of ``estimate(model, recipe, device,
    load=load).ranks``, in order, from the same parts without building the moments: the peak
    is ``timeline.peak_allocated`` (the largest moment's sum), the slack and the memory outside
    torch are added as ``RankBreakdown.device_total_bytes`` adds them. ``memplan plan`` rejects
    a candidate whose GPU overflows on these alone. ``parts``: ``stage_parts`` of the same
    arguments, when already built.

    Raises:
        ConfigError: as ``estimate`` (the same checks, run first).
    """
    check_allocator(allocator)
    if parts is None:
        parts = stage_parts(model, recipe, device, memo=memo, load=load)
    out = []
    for stage, lines, instants, init, outside, sums, ph in parts:
        peak = max(max(m.allocated_bytes for m in init), peak_allocated(lines, instants, sums, ph))
        slack = _slack(model, stage, lines, recipe, peak, allocator)
        beside = [*outside, slack] if slack is not None else outside
        out.append((_role(stage, recipe), peak + sum(
            i.bytes for i in beside if i.pool in (Pool.RESERVED, Pool.DEVICE))))
    return out


def estimate(model: ModelSpec, recipe: Recipe, device: Device, *,
             search_micro_batch: bool = True,
             memo: dict[object, object] | None = None, load: str = "full",
             parts: tuple[StageParts, ...] | None = None,
             allocator: str = "flat") -> Breakdown:
    """Estimate per-rank GPU memory of training ``model`` with ``recipe`` on ``device``: the
    step's timeline per rank role, its peak, and the largest micro-batch that fits.
    ``memo``: a dict kept by a caller estimating many recipes of this one ``model``
    (``memplan.plan``): the activation simulation is reused where its inputs repeat.
    ``load``: how ranks read the checkpoint (``HostSetup.load``: full, rank0, sharded, meta);
    with the engine and the quantiser it decides the load phase (``estimate/load.py``).
    ``parts``: ``stage_parts`` of these same arguments, when the caller already built them.
    ``allocator``: ``ALLOCATORS``, how the allocator's slack is estimated.

    Raises:
        ConfigError: the recipe cannot apply to this model (all problems listed).
    """
    check_compatible(model, recipe)
    _check_load(load)
    check_allocator(allocator)
    ranks = _ranks(model, recipe, device, memo, load, parts, allocator)
    mmb = (max_micro_batch(model, recipe, device, load=load, allocator=allocator)
           if search_micro_batch else None)
    return Breakdown(
        source="estimate",
        model=ModelInfo(id=model.id, model_type=model.model_type, params=_num_params(model, memo),
                        trainable_params=_trainable(model, recipe, memo),
                        params_by_component=_by_component(model, memo),
                        layers=model.num_layers, source=model.source,
                        notes=tuple(model.notes or ()) + recipe_warnings(model, recipe, device)),
        recipe=recipe.to_dict(),
        device=device.info(),
        ranks=ranks,
        max_micro_batch=mmb,
    )


def check_allocator(allocator: str) -> None:
    if allocator not in ALLOCATORS:
        raise ConfigError([f"allocator={allocator!r} is not one of {', '.join(ALLOCATORS)}: "
                           "choose how the caching allocator's slack is estimated."
                           + did_you_mean(allocator, ALLOCATORS)])


def _check_load(load: str) -> None:
    if load not in LOAD_MODES:
        raise ConfigError([f"load={load!r} is not one of {', '.join(LOAD_MODES)}: choose how "
                           "ranks read the checkpoint (host.load)."])


def _fits(model: ModelSpec, recipe: Recipe, device: Device, micro_batch: int,
          load: str = "full", allocator: str = "flat") -> bool:
    batch = replace(recipe.batch, micro_batch=micro_batch)
    ranks = _ranks(model, replace(recipe, batch=batch), device, load=load, allocator=allocator)
    return all(r.device_total_bytes <= device.capacity_bytes for r in ranks)


def max_micro_batch(model: ModelSpec, recipe: Recipe, device: Device, limit: int = 4096, *,
                    load: str = "full", allocator: str = "flat") -> int:
    """Largest micro-batch (everything else unchanged) whose every rank fits ``device``; 0 when
    not even 1 does. Doubling, then bisection: about 2 log2(answer) estimates."""
    if not _fits(model, recipe, device, 1, load, allocator):
        return 0
    lo = 1
    while lo < limit and _fits(model, recipe, device, min(2 * lo, limit), load, allocator):
        lo = min(2 * lo, limit)
    hi = min(2 * lo, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits(model, recipe, device, mid, load, allocator):
            lo = mid
        else:
            hi = mid
    return lo
