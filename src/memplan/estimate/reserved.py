"""Reserved memory from the allocator replay: the caching allocator's slack
(``max_memory_reserved - max_memory_allocated``) of the simulated step.

The stream replayed through ``allocator.Allocator`` is what the estimator simulates tensor by
tensor, for ``STEPS`` micro-batches in a row, on one allocator (its cache carries over):

- each micro-batch's forward and backward, op by op (``activations.stage_events``): saved
  activations, intermediates, activation gradients, an op's scratch, and each parameter's
  gradient as the backward produces it;
- at the end of the first step, inside ``optimizer.step()``, the optimizer's states when torch
  creates them there (the lazy states line of ``model_states``): per parameter in forward
  order, ``states`` tensors (``facts`` optimizer table), the line's bytes shared out in
  proportion to the parameters' gradients;
- each step's temporaries (``optimizer_step``'s lines of the optimizer phase): a foreach
  copy (``torch._foreach_sqrt`` of every state) as one tensor per parameter, shared out as the
  states are, a single-tensor path's temporaries as one tensor; all freed when the step ends;
- ``zero_grad(set_to_none=True)`` frees the gradients after each step, unless they accumulate
  (``activations.accumulates``: grad_accum > 1 or set_to_none off), then they stay.

Not in the stream (allocated apart, so they add no slack here): parameters and other state
allocated before the step (their segments are sized to them, at most 2 MiB of rounding each),
ZeRO / FSDP gather buffers, DeepSpeed's flat buffers, pipeline micro-batches in flight, the
optimizer in backward's per-parameter steps. The replay does not release cache near a full
device (no capacity is passed): slack near the capacity is an upper bound.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..breakdown import Category, Item, Phase, Pool
from ..facts import optimizer_facts
from ..recipe import Recipe
from .activations import Event
from .allocator import Allocator, Block
from .lines import Line

__all__ = ["STEPS", "replay_steps", "replayed_slack", "lazy_state_bytes", "step_temporaries",
           "stream_covers", "slack_item"]

STEPS = 3
"""Micro-batches replayed: the first step (states created), then two that reuse its cache; the
third repeats the second's pattern (``test_reserved.py``: 6 reserve no more)."""


def stream_covers(recipe: Recipe) -> bool:
    """Whether the simulated stream holds the step's churn, so the replay applies: not when
    parameters are gathered and released module by module (ZeRO-3, FSDP of any sharding,
    torchtitan: their gather buffers are not tensors of the graph), nor under pipeline
    parallelism (the micro-batches in flight are not replayed). Elsewhere the flat fraction
    stays (``overhead.fragmentation_item``)."""
    par = recipe.parallelism
    return (par.zero < 3 and par.pp == 1
            and str(recipe.engine_kind) not in ("fsdp1", "fsdp2", "torchtitan"))


def lazy_state_bytes(lines: Sequence[Line]) -> int:
    """Bytes of optimizer states torch creates inside the first ``optimizer.step()``."""
    return sum(ln.item.bytes for ln in lines if ln.lazy and ln.item.pool == Pool.ALLOCATED
               and ln.item.category == Category.OPTIMIZER)


def step_temporaries(lines: Sequence[Line]) -> list[tuple[int, bool]]:
    """(bytes, one tensor per parameter) of each temporary of the optimizer step: the foreach
    copies per parameter (``optimizer_step.py`` names them), anything else as one tensor; the
    optimizer in backward's lines (``stepping``) are not replayed."""
    return [(ln.item.bytes, ln.item.name.startswith("foreach")) for ln in lines
            if ln.item.category == Category.TEMPORARY and ln.phases == (Phase.OPTIMIZER,)
            and not ln.stepping and ln.item.bytes]


def replay_steps(events: Sequence[Event], *, keep_grads: bool, state_bytes: int = 0,
                 states: int = 0, temporaries: Sequence[tuple[int, bool]] = (),
                 expandable: bool = False, steps: int = STEPS) -> Allocator:
    """Replay ``steps`` micro-batches of ``events`` (``activations.stage_events``) on one
    allocator; ``keep_grads``: gradients accumulate (allocated in the first micro-batch only,
    never freed); ``state_bytes`` shared out as ``states`` tensors per parameter at the end of
    the first step; ``temporaries`` (``step_temporaries``) allocated, then freed, in each
    step."""
    a = Allocator(expandable=expandable)
    grads: list[Block] = []
    sizes = [n for _, n, kind in events if kind == "grad"]
    total = sum(sizes)
    for step in range(steps):
        live: dict[object, Block] = {}
        for key, nbytes, kind in events:
            if kind == "grad":
                if not (keep_grads and step):
                    grads.append(a.malloc(nbytes))
            elif nbytes:
                if key not in live:
                    live[key] = a.malloc(nbytes)
            elif key in live:
                a.free(live.pop(key))
        for b in live.values():  # the loss and outputs, dropped when the step's frame ends
            a.free(b)
        if step == 0 and state_bytes and states and total:
            for g in reversed(sizes):  # parameters in forward order: the backward's reverse
                for _ in range(states):
                    a.malloc(max(1, round(state_bytes * g / total / states)))
        temps = []
        for nbytes, per_param in temporaries:
            if per_param and total:
                temps += [a.malloc(max(1, round(nbytes * g / total))) for g in reversed(sizes)]
            else:
                temps.append(a.malloc(nbytes))
        for b in temps:
            a.free(b)
        if not keep_grads:
            for b in grads:
                a.free(b)
            grads = []
    return a


def replayed_slack(events: Sequence[Event], lines: Sequence[Line], recipe: Recipe,
                   accumulate: bool) -> int:
    """``peak reserved - peak requested`` of ``replay_steps`` for this recipe: the bytes the
    caching allocator holds beyond the simulated tensors at its peak (>= 0)."""
    kind = str(recipe.optimizer.kind)
    a = replay_steps(events, keep_grads=accumulate, state_bytes=lazy_state_bytes(lines),
                     states=optimizer_facts(kind).states, temporaries=step_temporaries(lines),
                     expandable=recipe.platform.expandable_segments)
    return max(0, a.peak_reserved - a.peak_requested)


def slack_item(slack: int, expandable: bool) -> Item:
    """The replayed slack as the breakdown's allocator line."""
    return Item(category=Category.OVERHEAD, name="allocator slack (replayed" + (
        ", expandable segments)" if expandable else ")"), bytes=slack, pool=Pool.RESERVED,
        formula="reserved - allocated of the simulated step replayed through PyTorch's "
        "caching-allocator rules (estimate/allocator.py, estimate/reserved.py)")
