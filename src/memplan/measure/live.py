"""Exact live-tensor byte counts during real PyTorch training steps.

What it measures
----------------
``measure_step`` runs a few real training steps (zero_grad, forward, loss, backward,
optimizer step) and records, at every tensor allocation and free, the number of bytes held
by live tensor storages. For each step it reports the peak, the phase it occurred in, the
peak of every phase, the bytes per category at the moment of the overall peak, and the live
bytes at the start of the step and carried out of it. Numbers are *logical* storage bytes (``numel * itemsize``
summed over distinct storages), i.e. what a perfect allocator would hold: no CUDA caching
allocator rounding (512 B blocks), fragmentation, reserved-but-unused memory, CUDA context
or kernel workspaces. This is the quantity an analytic estimator such as memplan predicts
for ``torch.cuda.max_memory_allocated`` before allocator effects.

How
---
A ``TorchDispatchMode`` sees the outputs of every ATen op (including ops run by the autograd
engine in the backward, by ``AccumulateGrad``, by autocast's casts and by the optimizer's
``zeros_like``/``torch.tensor`` calls). Each output's ``untyped_storage()`` is keyed by its
Python object (PyTorch preserves one Python object per storage for the storage's whole life),
so views and in-place results are never double counted, and a ``weakref`` finalizer on that
object logs the free at the moment the storage is released. Storages alive before the step
(parameters, buffers, optimizer states, the batch) are registered up front. Every allocation
and free is appended to an event log; the peak is found online and the live set at the peak is
rebuilt afterwards by replaying the log, so categorising costs nothing per op.

Checked against hand-derived byte counts (``tests/test_measure_live.py``) and against the CPU
allocator's own alloc/free events from ``torch.profiler`` (``profile_memory=True``): on a tiny
Llama the step's peak-over-start agrees to within a few bytes of in-kernel scalar scratch.

``torch.distributed._tools.mem_tracker.MemTracker`` was evaluated first and not used: it
records only one overall peak (no per-phase peaks), labels every forward allocation
``ACT`` (live forward temporaries included) and every backward allocation ``TEMP`` until a
gradient hook re-labels it, so at the backward peak parameter gradients are reported as
``Temp``; everything allocated inside ``optimizer.step`` (e.g. AdamW's ``denom``) is
``Optstate``; and it refuses a second forward of the root module without
``reset_mod_stats``.

Categories (a storage gets one category for its whole life, decided at the end of the step,
first match wins):

- ``params``: parameters and module buffers of ``model``;
- ``gradients``: storages that end up as a parameter's ``.grad`` (including the interval
  between their computation in the backward and ``AccumulateGrad`` adopting them);
- ``optimizer``: tensors held in ``optimizer.state`` after ``optimizer.step`` (AdamW's
  ``exp_avg``, ``exp_avg_sq`` and the 4-byte ``step`` tensors);
- ``activations``: storages saved for backward (seen by a ``saved_tensors_hooks`` pack hook),
  storages allocated in the forward that are still alive when the forward ends (e.g. the
  returned loss, or autocast weight copies that are saved), and storages allocated during
  the backward while grad mode is enabled, i.e. activations recomputed by activation
  checkpointing (these are held by ``torch.utils.checkpoint``'s own hooks, so the pack hook
  does not see them; a short-lived intermediate of the recomputation is counted here too);
- ``temporary``: everything else: forward intermediates that die within the forward,
  gradients of activations, optimizer scratch (AdamW's ``sqrt``/``denom``), batch tensors
  that are not saved for backward (token ids usually are: ``embedding`` saves them; HF
  causal-LM labels are not, the loss saves a shifted copy).

Phases: ``forward`` (from after ``zero_grad`` through the forward and the loss, including
leaving autocast, which drops autocast's weight-cast cache, and dropping the model output),
``backward`` (``loss.backward()``) and ``optimizer-step`` (``optimizer.step()``). A phase's
peak includes the live bytes at its start.

Known limitations
-----------------
- Granularity is one ATen op: memory allocated and freed inside a kernel (CPU scratch, SDPA
  internals, cuBLAS workspaces) is invisible; the peak is taken after each op returns, with
  its inputs still alive, which is the true op-level high-water mark.
- Tensors created outside the dispatcher (``torch.from_numpy``, ``torch.frombuffer``,
  C++-wrapped Python scalars) are counted from the first op that reads them; unregistered
  tensors that existed before the step are also counted from first use, so in step 0 they
  can appear late. Steady-state numbers (step >= 1) know them from the start.
- ``UntypedStorage.resize_`` called directly (FSDP-style) is not intercepted; resizes done by
  ops (``out=``) are. Sparse and other storage-less tensors are ignored.
- Designed and tested on CPU. On CUDA the byte counts are still logical bytes (see above).
  Some kernels hold different things on CPU than on CUDA: CPU ``F.dropout`` is not fused and
  saves its scaled noise in the input dtype (CUDA's ``native_dropout`` saves a 1-byte bool
  mask); CPU SDPA with dropout falls back to the math path, which materialises and saves
  ``B*H*S*S`` tensors (in fp32 even for bf16 inputs) that CUDA's flash or memory-efficient
  kernels never create; CPU ``mse_loss`` returns a 0-d loss whose storage is the whole
  unreduced buffer.
- With non-reentrant activation checkpointing the split between ``activations`` and
  ``temporary`` for recomputed tensors is approximate (see categories); totals are exact.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

__all__ = ["CATEGORIES", "PHASES", "MomentMeasurement", "StepMeasurement", "measure_step"]

PHASES: tuple[str, ...] = ("forward", "backward", "optimizer-step")
"""Phase names, in order (the values of ``memplan.breakdown.Phase``)."""

CATEGORIES: tuple[str, ...] = ("params", "gradients", "optimizer", "activations", "temporary")
"""Category names (values of the matching ``memplan.breakdown.Category`` members)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MomentMeasurement:
    """The peak of one labelled stretch of a step."""

    label: str
    """E.g. ``forward: model.layers.3`` or ``optimizer-step``."""
    phase: str
    """One of ``PHASES``."""
    peak_bytes: int
    """Most live bytes within the stretch (including the level at its start)."""
    by_owner: dict[str, dict[str, int]]
    """At that peak: module group -> category -> bytes (non-zero entries only); sums to
    ``peak_bytes``. Groups: ``labels.py``; ``""`` for storages no group claims."""

    @property
    def at_peak(self) -> dict[str, int]:
        """Bytes per category (every one of ``CATEGORIES``)."""
        out = dict.fromkeys(CATEGORIES, 0)
        for cats in self.by_owner.values():
            for c, b in cats.items():
                out[c] += b
        return out


@dataclass(frozen=True)
class StepMeasurement:
    """Live tensor bytes of one measured training step (see the module docstring)."""

    step: int
    """Index of the step, 0-based; step 0 creates the optimizer states."""
    peak_bytes: int
    """Maximum live bytes during the step."""
    peak_phase: str
    """Phase in which ``peak_bytes`` was first reached: one of ``PHASES``."""
    phase_peaks: dict[str, int]
    """Maximum live bytes within each phase (including the level at the phase's start)."""
    at_peak: dict[str, int]
    """Bytes per category (``CATEGORIES``) at the moment of the overall peak; sums to
    ``peak_bytes``."""
    start_bytes: int
    """Live bytes when the step starts (after ``zero_grad``, before the forward)."""
    end_bytes: int
    """Live bytes carried into the next step: after ``optimizer.step`` and dropping the loss
    (parameters, buffers, gradients, optimizer states, the batch, anything leaked)."""
    moments: tuple[MomentMeasurement, ...] = ()
    """The step's timeline: one entry per labelled stretch (each phase, and with
    ``labels=True`` each module group's forward and backward), with what was live at its
    peak per module group and category. Not part of ``to_dict`` (see ``memplan.measure.result``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "phase_peaks": dict(self.phase_peaks),
            "at_peak": dict(self.at_peak),
            "start_bytes": self.start_bytes,
            "end_bytes": self.end_bytes,
        }


@dataclass(slots=True)
class _Rec:
    """What we know about one storage (one allocation)."""

    nbytes: int
    window: int | None  # step index it was allocated in, None if outside a step window
    phase: str | None  # phase it was allocated in
    recomputed: bool = False  # allocated in the backward with grad mode on
    param: bool = False
    grad: bool = False
    opt: bool = False
    saved: bool = False
    fwd_survivor: bool = False
    owner: str = ""  # module group that holds it (see ``labels.py``); "" if unknown

    def category(self) -> str:
        if self.param:
            return "params"
        if self.grad:
            return "gradients"
        if self.opt:
            return "optimizer"
        if self.saved or self.fwd_survivor or self.recomputed:
            return "activations"
        return "temporary"


@dataclass(slots=True)
class _Segment:
    """A stretch of the step between two labelled instants (a moment of the timeline)."""

    label: str
    phase: str
    peak: int
    peak_idx: int
    start_idx: int


@dataclass(slots=True)
class _Window:
    step: int
    start_idx: int
    start_live: dict[int, int]
    start_bytes: int
    peak: int = -1
    peak_idx: int = 0
    peak_phase: str = PHASES[0]
    phase_peaks: dict[str, int] = field(default_factory=dict)
    segments: list[_Segment] = field(default_factory=list)


# Ops whose input is a tensor created outside the dispatcher a moment ago (``torch.tensor``).
_LIFT_OPS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in ("lift_fresh", "lift", "lift_fresh_copy")
    if hasattr(torch.ops.aten, name)
)


def _graph_task_id() -> int:
    """Id of the autograd graph task running on this thread, -1 outside the backward engine."""
    get = getattr(torch._C, "_current_graph_task_id", None)
    return get() if get is not None else 0


def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """The untyped storages behind ``t`` (several for wrapper subclasses, none if sparse)."""
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
        out: list[torch.UntypedStorage] = []
        for a in attrs:
            inner = getattr(t, a)
            if isinstance(inner, torch.Tensor):
                out.extend(_storages(inner))
        return out
    try:
        return [t.untyped_storage()]
    except (RuntimeError, NotImplementedError, TypeError):
        return []


class _StorageTracker(TorchDispatchMode):
    """Counts bytes of live untyped storages; logs every allocation (+uid) and free (-uid)."""

    def __init__(self) -> None:
        super().__init__()
        self._uid_of: dict[int, int] = {}  # id(python storage object) -> uid of live allocation
        self._refs: dict[int, weakref.ref] = {}  # id(storage) -> weakref carrying the finalizer
        self.recs: dict[int, _Rec] = {}  # uid -> record (kept after the free, for replay)
        self.live: dict[int, int] = {}  # uid -> nbytes
        self.live_bytes = 0
        self.events: list[int] = []
        self._next_uid = 1
        self.phase: str | None = None
        self.window: _Window | None = None
        self.owner = ""  # module group credited with new allocations (``labels.py``)
        self.times: list[float] | None = None  # perf_counter() of each event, when timing

    def start_timing(self) -> None:
        """Record the time of every event from now on (for timelines; costs one float each)."""
        self.times = [time.perf_counter()] * len(self.events)

    # -- storage bookkeeping -------------------------------------------------------------
    def see(self, t: torch.Tensor) -> list[_Rec]:
        recs = []
        for st in _storages(t):
            recs.append(self._see_storage(st))
        return recs

    def _see_storage(self, st: torch.UntypedStorage) -> _Rec:
        sid = id(st)
        nbytes = st.nbytes()
        uid = self._uid_of.get(sid)
        if uid is not None:
            rec = self.recs[uid]
            if rec.nbytes == nbytes:
                return rec
            # Resized by an op (e.g. an ``out=`` argument): a free and a new allocation.
            self._free(uid)
            new = _Rec(
                nbytes, rec.window, rec.phase, rec.recomputed, rec.param, rec.grad, rec.opt,
                rec.saved, rec.fwd_survivor, rec.owner,
            )
            return self._alloc(sid, new)
        rec = _Rec(
            nbytes,
            self.window.step if self.window is not None else None,
            self.phase,
            recomputed=self.phase == "backward"
            and torch.is_grad_enabled()
            and _graph_task_id() >= 0,
            owner=self.owner,
        )
        self._refs[sid] = weakref.ref(st, partial(self._on_finalize, sid))
        return self._alloc(sid, rec)

    def _alloc(self, sid: int, rec: _Rec) -> _Rec:
        uid = self._next_uid
        self._next_uid += 1
        self._uid_of[sid] = uid
        self.recs[uid] = rec
        self.live[uid] = rec.nbytes
        self.live_bytes += rec.nbytes
        self.events.append(uid)
        if self.times is not None:
            self.times.append(time.perf_counter())
        self.check_peak()
        return rec

    def _free(self, uid: int) -> None:
        nbytes = self.live.pop(uid, None)
        if nbytes is not None:
            self.live_bytes -= nbytes
            self.events.append(-uid)
            if self.times is not None:
                self.times.append(time.perf_counter())

    def _on_finalize(self, sid: int, _ref: weakref.ref) -> None:
        # Runs when the storage's (preserved) Python object dies, i.e. when the storage is freed.
        self._refs.pop(sid, None)
        uid = self._uid_of.pop(sid, None)
        if uid is not None:
            self._free(uid)

    def check_peak(self) -> None:
        w, phase = self.window, self.phase
        if w is None or phase is None:
            return
        live = self.live_bytes
        if live > w.phase_peaks.get(phase, -1):
            w.phase_peaks[phase] = live
        if live > w.peak:
            w.peak = live
            w.peak_idx = len(self.events)
            w.peak_phase = phase
        seg = w.segments[-1] if w.segments else None
        if seg is not None and live > seg.peak:
            seg.peak = live
            seg.peak_idx = len(self.events)

    def set_phase(self, phase: str | None) -> None:
        """Enter ``phase`` (one of ``PHASES``, or None between steps); opens a moment."""
        self.phase = phase
        if phase is not None:
            self.mark(phase)
        self.check_peak()

    def mark(self, label: str) -> None:
        """Start a new moment called ``label`` in the current phase (no-op outside a step)."""
        w, phase = self.window, self.phase
        if w is None or phase is None:
            return
        n = len(self.events)
        if w.segments and w.segments[-1].start_idx == n:
            w.segments.pop()  # nothing happened in the previous stretch: replace it
        w.segments.append(_Segment(label, phase, self.live_bytes, n, n))

    def compact(self) -> None:
        """Forget the event log and the records of freed storages (between steps only), so a
        long session does not grow without bound."""
        assert self.window is None, "compact() inside a step"
        self.events.clear()
        if self.times is not None:
            self.times.clear()
        self.recs = {uid: self.recs[uid] for uid in self.live}

    def close(self) -> None:
        # Dropping the weakrefs drops their finalizers: nothing fires into this object later.
        self._refs.clear()
        self._uid_of.clear()

    # -- hooks --------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func not in _LIFT_OPS:
            # Inputs we have never seen were created outside the dispatcher (wrapped Python
            # scalars, from_numpy) or existed unregistered before: count them from now.
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):
                    self.see(t)
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.see(t)
        return out

    def pack_hook(self, t: torch.Tensor) -> torch.Tensor:
        for rec in self.see(t):
            rec.saved = True
        return t

    @staticmethod
    def unpack_hook(t: torch.Tensor) -> torch.Tensor:
        return t


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor)]


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = []
    for state in optimizer.state.values():
        if isinstance(state, Mapping):
            out.extend(_tensors(list(state.values())))
    return out


def _default_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


def _replay(w: _Window, tracker: _StorageTracker) -> dict[str, int]:
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


def _replay_moments(w: _Window, tracker: _StorageTracker) -> tuple[MomentMeasurement, ...]:
    """What was live at each segment's peak, per (owner, category), by one pass over the log."""
    live = set(w.start_live)
    counts: dict[tuple[str, str], int] = {}

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
        by_owner: dict[str, dict[str, int]] = {}
        for (owner, cat), b in counts.items():
            if b:
                by_owner.setdefault(owner, {})[cat] = b
        out.append(MomentMeasurement(label=seg.label, phase=seg.phase, peak_bytes=seg.peak,
                                     by_owner=by_owner))
    return tuple(out)


def _mark_params(tracker: Any, tensors: list[Any], owners: Mapping[int, str]) -> None:
    """Categorise parameters and buffers, crediting each to its module group."""
    for t in tensors:
        for rec in tracker.see(t):
            rec.param = True
            rec.owner = owners.get(id(t), rec.owner)


def _mark_grads(tracker: Any, params: list[Any], owners: Mapping[int, str] = {}) -> None:
    """Categorise every parameter's current ``.grad`` storage as a gradient."""
    for p in params:
        if p.grad is not None:
            for rec in tracker.see(p.grad):
                rec.grad = True
                rec.owner = owners.get(id(p), rec.owner)


def _mark_optimizer_state(tracker: Any, optimizer: Any, owners: Mapping[int, str] = {}) -> None:
    """Categorise every tensor held in ``optimizer.state`` as optimizer state."""
    for param, state in optimizer.state.items():
        if not isinstance(state, Mapping):
            continue
        for t in _tensors(list(state.values())):
            for rec in tracker.see(t):
                rec.opt = True
                rec.owner = owners.get(id(param), rec.owner)


def measure_step(
    model: torch.nn.Module,
    batch: dict,
    optimizer: torch.optim.Optimizer,
    *,
    autocast_dtype: torch.dtype | None = None,
    steps: int = 2,
    loss_fn: Callable[[torch.nn.Module, dict], torch.Tensor] | None = None,
    labels: bool = True,
) -> list[StepMeasurement]:
    """Run ``steps`` real training steps and count live tensor bytes in each.

    Each step is ``optimizer.zero_grad(set_to_none=True)``; ``loss = model(**batch).loss`` (or
    ``loss_fn(model, batch)``), under ``torch.autocast(<model device type>, dtype=autocast_dtype)``
    when given; ``loss.backward()``; ``optimizer.step()``. The model and optimizer are really
    updated. Returns one ``StepMeasurement`` per step; step 0 includes the creation of lazily
    initialised optimizer states, later steps are the steady state.

    With ``labels`` (the default), module hooks (``memplan.measure.labels``) split each phase
    into moments per module group (``forward: model.layers.3``...) and credit every storage to
    the group that holds it; the hooks allocate nothing, so the numbers are the same either way.
    """
    from .labels import BATCH, OPTIMIZER, ROOT, ModuleLabeller

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    loss_fn = loss_fn or _default_loss
    params = list(model.parameters())
    buffers = list(model.buffers())
    device_type = params[0].device.type if params else "cpu"

    tracker = _StorageTracker()
    labeller = ModuleLabeller(model, tracker) if labels else None
    owners = labeller.owner_of_tensor if labeller else {}
    results: list[StepMeasurement] = []
    try:
        with tracker, torch.autograd.graph.saved_tensors_hooks(
            tracker.pack_hook, tracker.unpack_hook
        ):
            for step in range(steps):
                tracker.set_phase(None)
                optimizer.zero_grad(set_to_none=True)

                # State alive before the step: known by now, or registered here.
                _mark_params(tracker, params + buffers, owners)
                _mark_grads(tracker, params, owners)
                _mark_optimizer_state(tracker, optimizer, owners)
                tracker.owner = BATCH if labeller else ""
                for t in _tensors(batch):
                    tracker.see(t)
                tracker.owner = ROOT if labeller else ""

                w = _Window(step, len(tracker.events), dict(tracker.live), tracker.live_bytes)
                tracker.window = w

                tracker.set_phase("forward")
                if autocast_dtype is not None:
                    with torch.autocast(device_type, dtype=autocast_dtype):
                        loss = loss_fn(model, batch)
                else:
                    loss = loss_fn(model, batch)
                for uid in list(tracker.live):
                    rec = tracker.recs[uid]
                    if rec.window == step and rec.phase == "forward":
                        rec.fwd_survivor = True

                tracker.set_phase("backward")
                loss.backward()
                _mark_grads(tracker, params, owners)

                tracker.set_phase("optimizer-step")
                tracker.owner = OPTIMIZER if labeller else ""
                optimizer.step()
                _mark_optimizer_state(tracker, optimizer, owners)
                _mark_grads(tracker, params, owners)

                tracker.set_phase(None)
                tracker.window = None
                del loss
                at_peak = _replay(w, tracker)
                moments = _replay_moments(w, tracker)
                results.append(
                    StepMeasurement(
                        step=step,
                        peak_bytes=w.peak,
                        peak_phase=w.peak_phase,
                        phase_peaks={p: w.phase_peaks[p] for p in PHASES},
                        at_peak=at_peak,
                        start_bytes=w.start_bytes,
                        end_bytes=tracker.live_bytes,
                        moments=moments,
                    )
                )
    finally:
        tracker.close()
        if labeller is not None:
            labeller.detach()
    return results
