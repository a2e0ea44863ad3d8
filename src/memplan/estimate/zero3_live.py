"""DeepSpeed ZeRO-3: the 16-bit parameters gathered at each moment of a step, from the rules of
the parameter coordinator and the recipe's four ZeRO-3 knobs (issue #11 item 1).

DeepSpeed 0.19.8, ``deepspeed/runtime/zero/partitioned_param_coordinator.py``
(``PartitionedParameterCoordinator``) and ``parameter_offload.py``:

1. **Persistent parameters** (``ds_numel <= stage3_param_persistence_threshold``,
   ``mark_persistent_parameters``) are gathered once and never released
   (``__params_to_release`` skips ``ds_persist``): ``model_states`` counts them on their own line.
2. **Fetch.** A module's direct parameters are all-gathered at its pre-forward (and pre-backward)
   hook, ``fetch_sub_module``; every module with parameters is one *use* in the step's trace.
3. **Trace.** ``__trace_mode`` starts ``INVALID``; ``reset_step`` (the model's forward pre-hook)
   makes it ``RECORD`` at step 1 and ``COMPLETE`` at step 2. Until the trace is complete a
   module's parameters are released at its post-forward/post-backward (one module at a time);
   from the second step the two rules below apply.
4. **Reuse distance.** ``__params_to_release`` walks the uses after the current one, summing their
   ``ds_numel`` (persistent ones too), until ``stage3_max_reuse_distance`` elements; a parameter
   seen again before that stays gathered. In forward, module ``i``'s next use is its own backward,
   ``2 x`` (the elements of the modules after it) away: with the default 1e9 the last modules of
   the network stay gathered from their forward to their backward.
5. **Prefetch.** After each fetch, ``fetch_sub_module`` pops the parameter queue (every use in
   trace order) and all-gathers the not-yet-gathered ones until ``min(stage3_max_live_parameters
   - n_available, stage3_prefetch_bucket_size)`` elements are in flight; a parameter popped for a
   later use is not released before that use (``__most_recent_step_id_param_fetched_for``).
   ``stage3_max_live_parameters`` only bounds prefetch: a module's own fetch is never refused.
   Every fetch pops at least one more use, and what it pops stays gathered to that use, so the
   prefetch front runs ahead until ``max_live`` elements are live (Llama-8B with the defaults:
   about 1e9 elements, 2 GB in bf16, through the backward); on the tiny Llama a prefetch of
   40,000 elements gathers the whole model (validation/zero3_live.json).
6. **Released, still referenced.** A release (``free_param``, ``partition_parameters.py``) only
   drops ``param.data``; the all-gather's output buffer is also referenced by the collective's
   work object (``_all_gather_sequential``: ``param.data = param_buffer.narrow(...)``, the
   buffer handed to ``dist.allgather_fn(..., async_op=True)``), and the communication thread
   that ran the collective holds that object until it is scheduled again after signalling
   completion (torch ``ProcessGroupGloo::runLoop``: ``workInProgress_[i].reset()`` after
   ``AsyncWork::execute``). So the buffer released last can outlive its release by a thread
   switch: on 4 gloo ranks gathered buffers (``_all_gather_sequential``) and reduce-scatter
   inputs were freed by a gloo thread after the release in some steps, the latter up to the
   optimizer step (``validation/zero3_release.json``, ``scripts/measure_zero3_release.py``);
   ``deepspeed zero3 bf16 ckpt reuse 0`` had one 262,144 B tensor (the size of the head's
   gathered weight, the buffer released last before the loss) more at the loss on some ranks
   of some runs (README "validate --nproc"). Each moment therefore counts, on top of what is
   gathered, the bytes released by the use just before it (``Gathered.released``), the upper
   of the two states.
7. **Gradients.** ZeRO-3's 16-bit gradients are per parameter, not per unit: autograd writes a
   parameter's full ``.grad``, its hook (``stage3.py`` ``reduce_partition_and_remove_grads`` ->
   ``__add_grad_to_ipg_bucket``) copies it into the ``reduce_bucket_size`` bucket when it fits
   and keeps it until the bucket is reduced when it does not. A moment of the backward of a
   unit holds its largest parameter's gradient; the loss's backward holds none (no parameter
   has a gradient yet). Reducing a bucket (``__avg_scatter_grads`` ->
   ``runtime/comm/coalesced_collectives.py`` ``reduce_scatter_coalesced``) ``torch.cat``s the
   bucket's gradients, padded, into one flat input: a second bucket of
   ``min(reduce_bucket_size, trainable elements)`` while a unit's backward runs.

On one rank the "gathered" parameter is a view of its partition (``partition_parameters.py``
``_no_gather_coalesced`` -> ``NoGatherHandle``: ``param.ds_tensor.data.to(device)``, the same
device): no extra bytes, so this module is used only when the parameters are sharded.

Known limitations: a module's parameters are modelled as the tensors memplan lists (a Linear's
weight and bias as two uses), in the order of the model's layer list; full activation
checkpointing reruns a layer's forward uses right before its backward (``trace_order``); the
first step's one-module-at-a-time gathering is not separated from the steady step's (the larger
one is kept); a layer's instant holds the most gathered while any of its modules runs; MoE
experts are all taken as used (DeepSpeed's trace holds only the experts that got tokens, and a
different set in the next step invalidates the trace). Rule 6 counts one released buffer (the
most measured); gloo runs collectives on two threads by default, so two could be held, and
whether NCCL's work objects hold theirs as long on a GPU is not measured here.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from ..breakdown import Category, Item, Phase
from ..facts import Dtypes
from ..recipe import Recipe
from ..units import dtype_bytes
from .layout import Held, Stage
from .peft import LORA_LIKE
from .states import quantized_bytes
from .timeline import Instant

__all__ = ["Gathered", "Use", "live_gathered", "trace_order", "zero3_instants",
           "zero3_live_applies"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Use:
    """One module's parameters in the trace (a use in forward, another in backward)."""

    numel: int
    """``ds_numel``: elements, counted by the reuse walk and the prefetch budget."""
    nbytes: int
    """Bytes of the gathered tensor (16-bit, packed for a quantized base)."""
    persistent: bool = False
    """Always gathered (``ds_persist``): never fetched, released or prefetched."""


@dataclass(frozen=True, slots=True)
class Gathered:
    """Bytes of non-persistent gathered parameters through one step with a complete trace."""

    per_use: tuple[int, ...]
    """At each use (forward: modules 0..M-1, then backward: M-1..0), after its fetch and the
    prefetch it starts, before its release."""
    after_forward: int
    """Kept from the forward to the backward: gathered after the last forward release, before
    the first backward fetch (the loss and its backward run then)."""
    n_forward: int
    """Uses in the forward (the first ``n_forward`` of ``per_use``)."""
    released: tuple[int, ...] = ()
    """Bytes released at the end of each use (rule 6: still referenced by the collective's
    work object until the communication thread drops it)."""

    def held_before(self, use: int) -> int:
        """Bytes released by the use just before ``use`` (0 for the first)."""
        return self.released[use - 1] if 0 < use <= len(self.released) else 0

    @property
    def forward_peak(self) -> int:
        """Largest gathered bytes in forward."""
        return max(self.per_use[: self.n_forward], default=0)

    @property
    def backward_peak(self) -> int:
        """Largest gathered bytes in backward."""
        return max(self.per_use[self.n_forward:], default=0)


def trace_order(sizes: Sequence[int], recompute: Sequence[bool] = (),
                no_backward: frozenset[int] = frozenset()
                ) -> tuple[list[int], dict[tuple[int, bool], list[int]]]:
    """The step's uses of modules numbered in forward order, units of ``sizes`` modules each:
    every module forward, then backward in reverse (but the modules of ``no_backward``, which
    no gradient reaches), a unit with ``recompute[unit]`` (activation checkpointing) running
    its forward again right before its backward (its hooks fetch again: ``fetch_sub_module``
    in the recompute, ``in_checkpoint_recompute``). Returns the order and, per ``(unit,
    backward)``, the positions in it."""
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    order: list[int] = []
    where: dict[tuple[int, bool], list[int]] = {}
    for k, n in enumerate(sizes):
        where[(k, False)] = list(range(len(order), len(order) + n))
        order += range(starts[k], starts[k] + n)
    for k in reversed(range(len(sizes))):
        mods = list(range(starts[k], starts[k] + sizes[k]))
        again = mods if k < len(recompute) and recompute[k] else []
        back = [m for m in reversed(mods) if m not in no_backward]
        where[(k, True)] = list(range(len(order), len(order) + len(again) + len(back)))
        order += again + back
    return order, where


def live_gathered(mods: Sequence[Use], *, max_live: int, reuse: int, prefetch: int,
                  order: Sequence[int] = ()) -> Gathered:
    """Non-persistent gathered bytes through a step with a complete trace (module docstring,
    rules 2-5), modules given in forward order; ``order``: the uses (``trace_order``; default
    every module forward, then backward in reverse)."""
    uses = tuple(order) or tuple(range(len(mods))) + tuple(reversed(range(len(mods))))
    return _simulate(tuple(mods), uses, max_live, reuse, prefetch)


@lru_cache(maxsize=256)
def _simulate(mods: tuple[Use, ...], order: tuple[int, ...], max_live: int, reuse: int,
              prefetch: int) -> Gathered:
    """``live_gathered``'s loop, cached: a plan search asks for the same model and knobs with
    many batch shapes."""
    n = len(order)
    # the reuse walk of __params_to_release, in O(1): elements of the uses strictly between
    # t and the module's next use (persistent ones included); kept when below the distance
    walk = [0] * (n + 1)
    for t, m in enumerate(order):
        walk[t + 1] = walk[t] + mods[m].numel
    nxt, seen = [n] * n, {}
    for t in range(n - 1, -1, -1):
        nxt[t] = seen.get(order[t], n)
        seen[order[t]] = t
    gathered: set[int] = set()
    n_avail = live = after_forward = 0
    fetched_for = [-1] * len(mods)
    queue = deque(range(n))
    per_use: list[int] = []
    released: list[int] = []
    for t, m in enumerate(order):
        if t == len(mods):
            after_forward = live
        if not mods[m].persistent and m not in gathered:
            gathered.add(m)
            n_avail, live = n_avail + mods[m].numel, live + mods[m].nbytes
        if fetched_for[m] < t and queue:  # the current use leaves the queue
            queue.popleft()
        budget, inflight, this_round = min(max_live - n_avail, prefetch), 0, set()
        while prefetch > 0 and queue and inflight < budget:
            u = queue.popleft()
            p = order[u]
            fetched_for[p] = max(fetched_for[p], u)
            if not mods[p].persistent and p not in gathered and p not in this_round:
                this_round.add(p)
                inflight += mods[p].numel
        for p in this_round:
            gathered.add(p)
            n_avail, live = n_avail + mods[p].numel, live + mods[p].nbytes
        per_use.append(live)
        released.append(0)
        if mods[m].persistent or fetched_for[m] > t:
            continue
        if nxt[t] == n or walk[nxt[t]] - walk[t + 1] >= reuse:
            gathered.discard(m)
            n_avail, live = n_avail - mods[m].numel, live - mods[m].nbytes
            released[-1] = mods[m].nbytes
    return Gathered(per_use=tuple(per_use), after_forward=after_forward, n_forward=len(mods),
                    released=tuple(released))


def zero3_live_applies(recipe: Recipe) -> bool:
    """DeepSpeed ZeRO-3 with parameters sharded over more than one rank, one pipeline stage."""
    par = recipe.parallelism
    return (str(recipe.engine_kind) == "deepspeed" and par.zero == 3 and par.shard_degree > 1
            and par.pp == 1)


def _bytes(h: Held, recipe: Recipe, cb: float, ab: float) -> int:
    """Gathered bytes of ``h``: packed when quantized, the adapter dtype for a PEFT adapter
    (fp32 under ``zero.Init``, facts.adapter_dtypes: ``_all_gather`` allocates each buffer in
    the parameter's own dtype, ``partition_parameters.py`` ``param_buffer = torch.empty(...,
    dtype=param.dtype)``, DeepSpeed 0.19.8), else the compute dtype."""
    if h.quantized:
        return math.ceil(quantized_bytes(h.numel, h.tensor.shape[0], recipe.method.quant))
    return math.ceil(h.numel * (ab if h.adapter else cb))


def _recomputed(recipe: Recipe, n_layers: int) -> list[bool]:
    """Per unit (embedding, layers, head): whether full activation checkpointing reruns it."""
    ck = recipe.checkpointing
    if str(ck.kind) != "full":
        return []
    every, first = ck.checkpoint_every, ck.checkpoint_layers or n_layers
    return [False] + [(every == 1 or j % every == every - 1) and j < first
                      for j in range(n_layers)] + [False]


def _no_backward(stage: Stage, recipe: Recipe) -> frozenset[int]:
    """Modules (forward indices) whose backward hook never fires, so that their parameters
    are released after their forward (``__params_to_release`` finds no later use in the
    trace): DeepSpeed registers a module's pre-backward fetch on its outputs that require a
    gradient (``parameter_offload.py`` ``_register_deepspeed_module`` ->
    ``_pre_backward_module_hook``, 0.19.8). With a frozen base under a LoRA-like method (not
    prompt tuning, whose prompt joins the embeddings) that is a frozen embedding and the first
    layer's frozen q/k/v projections, whose input (the normed embeddings) needs no gradient
    (and that layer's input norm, persistent at the default threshold, not counted here).
    Measured: the ``deepspeed zero3 lora`` cases of validation/dist_nproc{2,4}.json held
    about 325 KB less at the loss than an estimate that kept them gathered to a backward use
    (the tiny Llama's bf16 embedding, 262,144 B, and first-layer q/k/v, 65,536 B)."""
    if str(recipe.method.kind) not in LORA_LIKE or len(stage.units) < 2:
        return frozenset()
    emb, first = stage.units[0], stage.units[1]
    if any(h.trainable for h in emb):
        return frozenset()
    qkv = [len(emb) + j for j, h in enumerate(first)
           if not h.trainable and not h.adapter and set(h.tensor.targets) & {"q", "k", "v"}]
    return frozenset(range(len(emb))) | frozenset(qkv)


def zero3_gathered(stage: Stage, recipe: Recipe, compute_dtype: str, adapter_dtype: str = ""
                   ) -> tuple[Gathered, dict[tuple[int, bool], list[int]]]:
    """``live_gathered`` over this stage's tensors (units in order, the embedding first), with
    the recipe's knobs and checkpointing; persistence as ``model_states`` counts it (quantized
    tensors never). Also the positions of each ``(unit, backward)`` in the trace."""
    e, cb = recipe.engine, dtype_bytes(compute_dtype)
    ab = dtype_bytes(adapter_dtype) if adapter_dtype else cb
    limit = e.stage3_param_persistence_threshold
    mods = [Use(numel=h.numel, nbytes=_bytes(h, recipe, cb, ab),
                persistent=not h.quantized and h.numel <= limit)
            for unit in stage.units for h in unit]
    sizes = [len(u) for u in stage.units]
    order, where = trace_order(sizes, _recomputed(recipe, len(sizes) - 2),
                               _no_backward(stage, recipe))
    return live_gathered(mods, max_live=e.stage3_max_live_parameters,
                         reuse=e.stage3_max_reuse_distance,
                         prefetch=e.stage3_prefetch_bucket_size, order=order), where


def zero3_instants(stage: Stage, recipe: Recipe, dt: Dtypes,
                   instants: Sequence[Instant]) -> list[Instant]:
    """``instants`` with DeepSpeed's gathered parameters and 16-bit gradients of each one added.

    ``stage.units`` is (embedding, layer 0 .. layer L-1, head); an instant of region ``layer i``
    holds the most gathered while that layer's modules run (its recompute included), each use
    with what the use before it released (rule 6), ``embedding`` the embedding's, any other
    forward region the head's; ``loss`` (forward and backward) holds what the forward kept
    (``Gathered.after_forward``) and what the head's forward released; any other backward
    region the head's. A backward instant of a unit also holds the 16-bit gradient of the
    unit's largest trainable parameter and the flat copy of a bucket being reduced (rule 7;
    ``reduce_scatter_coalesced`` skips the copy for a lone tensor that splits evenly, which
    this upper bound ignores)."""
    g, where = zero3_gathered(stage, recipe, dt.compute, dt.adapter)
    last = len(stage.units) - 1
    gb, ab = dtype_bytes(dt.grad), dtype_bytes(dt.adapter)
    # torch makes a gradient in its parameter's dtype: fp32 for fp32 adapters
    grad = [max((math.ceil(h.numel * (ab if h.adapter else gb)) for h in u
                 if h.trainable and not h.quantized), default=0) for u in stage.units]
    flat = math.ceil(min(recipe.engine.reduce_bucket_size, stage.trainable_numel) * gb)

    def most(unit: int, backward: bool) -> int:
        return max((g.per_use[k] + g.held_before(k) for k in where[(unit, backward)]),
                   default=0)

    out = []
    for inst in instants:
        region = inst.label.split(": ", 1)[-1]
        bwd = inst.phase == Phase.BACKWARD
        unit: int | None = last
        if region.startswith("layer ") and region[6:].isdigit() and int(region[6:]) + 1 < last:
            unit = int(region[6:]) + 1
        elif region == "embedding":
            unit = 0
        elif region == "loss":
            unit = None
        b = g.after_forward + g.held_before(g.n_forward) if unit is None else most(unit, bwd)
        items = [Item(category=Category.COMMUNICATION, name="ZeRO-3 gathered parameters",
                      bytes=b, formula=_formula(recipe))]
        if bwd and unit is not None and grad[unit]:
            items.append(Item(
                category=Category.COMMUNICATION, name="16-bit gradient before its reduce hook",
                bytes=grad[unit], formula="the unit's largest trainable parameter's full .grad in "
                f"the gradient dtype, {dt.grad} (DeepSpeed 0.19.8 stage3.py "
                "reduce_partition_and_remove_grads -> __add_grad_to_ipg_bucket)"))
            items.append(Item(
                category=Category.COMMUNICATION, name="flat copy of the bucket being reduced",
                bytes=flat, formula=f"min(reduce_bucket_size {recipe.engine.reduce_bucket_size:.3g}"
                f", trainable elements) x {dt.grad} (DeepSpeed 0.19.8 runtime/comm/"
                "coalesced_collectives.py reduce_scatter_coalesced: torch.cat of the padded "
                "partitions)"))
        out.append(replace(inst, items=inst.items + tuple(items)))
    return out


def _formula(recipe: Recipe) -> str:
    e = recipe.engine
    return ("the current module, those kept for reuse and those prefetched "
            f"(stage3_max_reuse_distance {e.stage3_max_reuse_distance:.3g}, "
            f"stage3_prefetch_bucket_size {e.stage3_prefetch_bucket_size:.3g}, "
            f"stage3_max_live_parameters {e.stage3_max_live_parameters:.3g}); DeepSpeed 0.19.8 "
            "partitioned_param_coordinator.py fetch_sub_module / __params_to_release, "
            "simulated over the step's trace, plus the buffer the use before released, still "
            "referenced by its all-gather's work object (estimate/zero3_live.py)")
