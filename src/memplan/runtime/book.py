"""Step bookkeeping over a ``StorageTracker``: opening and closing a step, categorising the state
that outlives it, and replaying the event log into a ``StepMeasurement``.

Both ``memplan.runtime.stepping.measure_step`` (which drives the step itself) and
``memplan.measure.loop.Session`` (which infers it from hooks on a user's loop) use these, so a
step is opened, split into phases and measured the same way in both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ..breakdown import Category, Phase
from .steps import CATEGORIES, PHASES, MomentMeasurement, StepMeasurement
from .tracker import StorageTracker, Window

__all__ = ["close_step", "end_forward", "mark_grads", "mark_optimizer_state", "mark_params",
           "open_step", "step_measurement", "tensors_of"]


def tensors_of(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a nested structure (dict, list, tuple...)."""
    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor)]


def mark_params(tracker: StorageTracker, tensors: list[torch.Tensor],
                owners: Mapping[int, str]) -> None:
    """Categorise parameters and buffers, crediting each to its module group."""
    for t in tensors:
        for rec in tracker.see(t):
            rec.param = True
            rec.owner = owners.get(id(t), rec.owner)


def mark_grads(tracker: StorageTracker, params: list[torch.Tensor],
               owners: Mapping[int, str] | None = None) -> None:
    """Categorise every parameter's current ``.grad`` storage as a gradient."""
    owners = owners or {}
    for p in params:
        if p.grad is not None:
            for rec in tracker.see(p.grad):
                rec.grad = True
                rec.owner = owners.get(id(p), rec.owner)


def mark_optimizer_state(tracker: StorageTracker, optimizer: Any,
                         owners: Mapping[int, str] | None = None) -> None:
    """Categorise every tensor held in ``optimizer.state`` as optimizer state."""
    owners = owners or {}
    for param, state in optimizer.state.items():
        if not isinstance(state, Mapping):
            continue
        for t in tensors_of(list(state.values())):
            for rec in tracker.see(t):
                rec.opt = True
                rec.owner = owners.get(id(param), rec.owner)


def open_step(tracker: StorageTracker, step: int) -> Window:
    """Open step ``step``: what is live now is its starting level."""
    w = Window(step, len(tracker.events), dict(tracker.live), tracker.live_bytes)
    tracker.window = w
    return w


def end_forward(tracker: StorageTracker) -> None:
    """The forward is over: what it allocated and is still alive is an activation; enter the
    backward."""
    w = tracker.window
    if w is None:
        return
    for uid in list(tracker.live):
        rec = tracker.recs[uid]
        if rec.window == w.step and rec.phase == Phase.FORWARD:
            rec.fwd_survivor = True
    tracker.set_phase(Phase.BACKWARD)


def close_step(tracker: StorageTracker) -> Window | None:
    """Close the open step (None if there is none); its window is kept for
    ``step_measurement``."""
    w = tracker.window
    tracker.set_phase(None)
    tracker.window = None
    return w


def _replay(w: Window, tracker: StorageTracker) -> dict[Category, int]:
    live = set(w.start_live)
    for ev in tracker.events[w.start_idx : w.peak_idx]:
        if ev > 0:
            live.add(ev)
        else:
            live.discard(-ev)
    cats = dict.fromkeys(CATEGORIES, 0)
    for uid in live:
        rec = tracker.recs[uid]
        cats[rec.category()] += rec.nbytes
    return cats


def _replay_moments(w: Window, tracker: StorageTracker) -> tuple[MomentMeasurement, ...]:
    """What was live at each segment's peak, per (owner, category), by one pass over the log."""
    live = set(w.start_live)
    counts: dict[tuple[str, Category], int] = {}

    def add(uid: int, sign: int) -> None:
        rec = tracker.recs[uid]
        key = (rec.owner, rec.category())
        counts[key] = counts.get(key, 0) + sign * rec.nbytes

    for uid in live:
        add(uid, 1)
    events, i, out = tracker.events, w.start_idx, []
    for seg in w.segments:
        while i < seg.peak_idx:
            ev = events[i]
            if ev > 0 and ev not in live:
                live.add(ev)
                add(ev, 1)
            elif ev < 0 and -ev in live:
                live.discard(-ev)
                add(-ev, -1)
            i += 1
        by_owner: dict[str, dict[Category, int]] = {}
        for (owner, cat), b in counts.items():
            if b:
                by_owner.setdefault(owner, {})[cat] = b
        out.append(MomentMeasurement(label=seg.label, phase=seg.phase, peak_bytes=seg.peak,
                                     by_owner=by_owner))
    return tuple(out)


def step_measurement(tracker: StorageTracker, w: Window) -> StepMeasurement:
    """The closed step ``w``, measured: peaks, categories at the peak, moments; ``end_bytes``
    is what is live now."""
    return StepMeasurement(
        step=w.step, peak_bytes=w.peak, peak_phase=w.peak_phase,
        phase_peaks={p: w.phase_peaks[p] for p in PHASES if p in w.phase_peaks},
        at_peak=_replay(w, tracker), start_bytes=w.start_bytes, end_bytes=tracker.live_bytes,
        moments=_replay_moments(w, tracker))
