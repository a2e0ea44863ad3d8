"""The storage tracker: live tensor bytes at every ATen op, with an event log to replay.

A ``TorchDispatchMode`` sees the outputs of every ATen op (including ops run by the autograd
engine in the backward, by ``AccumulateGrad``, by autocast's casts and by the optimizer's
``zeros_like``/``torch.tensor`` calls). Each output's ``untyped_storage()`` is keyed by its
Python object (PyTorch preserves one Python object per storage for the storage's whole life),
so views and in-place results are never double counted, and a ``weakref`` finalizer on that
object logs the free at the moment the storage is released. Every allocation (+uid) and free
(-uid) is appended to an event log; the peak of the open step (``Window``) and of each of its
moments (``Segment``) is found online, and what was live at a peak is rebuilt afterwards by
replaying the log (``memplan.runtime.steps``), so categorising costs nothing per op.

The same tracker runs on real tensors (``memplan.measure``) and on fake ones
(``memplan.trace``). Step bookkeeping (opening and closing a step, categories) is in
``memplan.runtime.book``; the categories themselves are the ``StorageRecord`` flags.

Known limitations: see ``memplan.runtime.stepping``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from ..breakdown import Category, Phase

__all__ = ["Segment", "StorageRecord", "StorageTracker", "Window", "graph_task_id", "storages"]


@dataclass(slots=True)
class StorageRecord:
    """What is known about one storage (one allocation); flags decide its category."""

    nbytes: int
    """Size of the storage."""
    window: int | None
    """Index of the step it was allocated in; None outside a step."""
    phase: Phase | None
    """Phase it was allocated in; None outside a step."""
    recomputed: bool = False
    """Allocated in the backward with grad mode on (activation checkpointing's recompute)."""
    param: bool = False
    """A parameter or buffer of the model."""
    grad: bool = False
    """Ends up as a parameter's ``.grad``."""
    opt: bool = False
    """Held in ``optimizer.state``."""
    saved: bool = False
    """Seen by the ``saved_tensors_hooks`` pack hook."""
    fwd_survivor: bool = False
    """Allocated in the forward and still alive when the forward ends."""
    owner: str = ""
    """Module group that holds it (``memplan.runtime.labels``); "" if unknown."""

    def category(self) -> Category:
        """First match wins: params, gradients, optimizer, activations, temporary."""
        if self.param:
            return Category.PARAMS
        if self.grad:
            return Category.GRADIENTS
        if self.opt:
            return Category.OPTIMIZER
        if self.saved or self.fwd_survivor or self.recomputed:
            return Category.ACTIVATIONS
        return Category.TEMPORARY


@dataclass(slots=True)
class Segment:
    """A stretch of the step between two labelled instants (a moment of the timeline)."""

    label: str
    """Moment label, e.g. ``forward: model.layers.3``."""
    phase: Phase
    """Phase the stretch belongs to."""
    peak: int
    """Most live bytes so far within the stretch."""
    peak_idx: int
    """Event-log index at that peak."""
    start_idx: int
    """Event-log index where the stretch starts."""


@dataclass(slots=True)
class Window:
    """The open step: where it starts in the event log and its peaks so far."""

    step: int
    """Index of the step, 0-based."""
    start_idx: int
    """Event-log index where the step starts."""
    start_live: dict[int, int]
    """uid -> bytes of the storages alive when the step starts."""
    start_bytes: int
    """Live bytes when the step starts."""
    peak: int = -1
    """Most live bytes so far (-1 before the first phase)."""
    peak_idx: int = 0
    """Event-log index at the peak."""
    peak_phase: Phase = Phase.FORWARD
    """Phase of the peak."""
    phase_peaks: dict[Phase, int] = field(default_factory=dict)
    """Most live bytes so far per phase."""
    segments: list[Segment] = field(default_factory=list)
    """The step's moments so far."""


# Ops whose input is a tensor created outside the dispatcher a moment ago (``torch.tensor``).
_LIFT_OPS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in ("lift_fresh", "lift", "lift_fresh_copy")
    if hasattr(torch.ops.aten, name)
)


def graph_task_id() -> int:
    """Id of the autograd graph task running on this thread, -1 outside the backward engine."""
    get = getattr(torch._C, "_current_graph_task_id", None)
    return get() if get is not None else 0


def storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """The untyped storages behind ``t`` (several for wrapper subclasses, none if sparse)."""
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
        out: list[torch.UntypedStorage] = []
        for a in attrs:
            inner = getattr(t, a)
            if isinstance(inner, torch.Tensor):
                out.extend(storages(inner))
        return out
    try:
        return [t.untyped_storage()]
    except (RuntimeError, NotImplementedError, TypeError):
        return []


class StorageTracker(TorchDispatchMode):
    """Counts bytes of live untyped storages; logs every allocation (+uid) and free (-uid).

    ``before_op`` (optional) is called with ``(args, kwargs)`` before each op is counted: the
    session of ``memplan.measure.loop`` uses it to see the backward start and to register
    inputs made before the session.
    """

    def __init__(self, *, before_op: Callable[[Any, Any], None] | None = None,
                 real_only: bool = False) -> None:
        super().__init__()
        self.real_only = real_only
        """Skip storages on the ``meta`` device: they hold no memory (DeepSpeed keeps one
        per parameter, ``round_robin_bit16_meta``). Off for fake-tensor tracing, whose
        storages are all ``meta``."""
        self._uid_of: dict[int, int] = {}  # id(python storage object) -> uid of live allocation
        self._refs: dict[int, weakref.ref] = {}  # id(storage) -> weakref carrying the finalizer
        self.recs: dict[int, StorageRecord] = {}  # uid -> record (kept after the free, for replay)
        self.live: dict[int, int] = {}  # uid -> nbytes
        self.live_bytes = 0
        self.events: list[int] = []
        self._next_uid = 1
        self.phase: Phase | None = None
        self.window: Window | None = None
        self.owner = ""  # module group credited with new allocations (``memplan.runtime.labels``)
        self.times: list[float] | None = None  # perf_counter() of each event, when timing
        self._before_op = before_op

    def start_timing(self) -> None:
        """Record the time of every event from now on (for timelines; costs one float each)."""
        self.times = [time.perf_counter()] * len(self.events)

    # -- storage bookkeeping -------------------------------------------------------------
    def see(self, t: torch.Tensor) -> list[StorageRecord]:
        """The records of ``t``'s storages, registering those not seen yet as allocated now."""
        return [self._see_storage(st) for st in self._storages(t)]

    def _storages(self, t: torch.Tensor) -> list[torch.UntypedStorage]:
        out = storages(t)
        return [st for st in out if st.device.type != "meta"] if self.real_only else out

    def see_before_step(self, tensors: list[torch.Tensor]) -> None:
        """Register storages of ``tensors`` not seen yet as existing before the open step (made
        before the session, or outside the dispatcher): no step allocated them."""
        new = [st for t in tensors for st in self._storages(t) if id(st) not in self._uid_of]
        if not new:
            return
        phase, window = self.phase, self.window
        self.phase, self.window = None, None
        for st in new:
            self._see_storage(st)
        self.phase, self.window = phase, window

    def resized(self, st: torch.UntypedStorage) -> None:
        """``st`` was resized outside the dispatcher (``UntypedStorage.resize_``, as FSDP2 frees
        and re-allocates its all-gather buffers): a free and a new allocation, if it is known."""
        if id(st) in self._uid_of:
            self._see_storage(st)

    def _see_storage(self, st: torch.UntypedStorage) -> StorageRecord:
        sid = id(st)
        nbytes = st.nbytes()
        uid = self._uid_of.get(sid)
        if uid is not None:
            rec = self.recs[uid]
            if rec.nbytes == nbytes:
                return rec
            # Resized by an op (e.g. an ``out=`` argument): a free and a new allocation.
            self._free(uid)
            new = StorageRecord(
                nbytes=nbytes, window=rec.window, phase=rec.phase, recomputed=rec.recomputed,
                param=rec.param, grad=rec.grad, opt=rec.opt, saved=rec.saved,
                fwd_survivor=rec.fwd_survivor, owner=rec.owner,
            )
            return self._alloc(sid, new)
        rec = StorageRecord(
            nbytes=nbytes,
            window=self.window.step if self.window is not None else None,
            phase=self.phase,
            recomputed=self.phase == Phase.BACKWARD
            and torch.is_grad_enabled()
            and graph_task_id() >= 0,
            owner=self.owner,
        )
        self._refs[sid] = weakref.ref(st, partial(self._on_finalize, sid))
        return self._alloc(sid, rec)

    def _alloc(self, sid: int, rec: StorageRecord) -> StorageRecord:
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
        """Update the open step's, phase's and moment's peaks with the current live bytes."""
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

    def set_phase(self, phase: Phase | None) -> None:
        """Enter ``phase`` (None between steps); opens a moment named after it."""
        self.phase = phase
        if phase is not None:
            self.mark(str(phase))
        self.check_peak()

    def mark(self, label: str) -> None:
        """Start a new moment called ``label`` in the current phase (no-op outside a step)."""
        w, phase = self.window, self.phase
        if w is None or phase is None:
            return
        n = len(self.events)
        if w.segments and w.segments[-1].start_idx == n:
            w.segments.pop()  # nothing happened in the previous stretch: replace it
        w.segments.append(Segment(label, phase, self.live_bytes, n, n))

    def compact(self) -> None:
        """Forget the event log and the records of freed storages (between steps only), so a
        long session does not grow without bound."""
        assert self.window is None, "compact() inside a step"
        self.events.clear()
        if self.times is not None:
            self.times.clear()
        self.recs = {uid: self.recs[uid] for uid in self.live}

    def close(self) -> None:
        """Drop the weakrefs, and with them their finalizers: nothing fires into this later."""
        self._refs.clear()
        self._uid_of.clear()

    # -- hooks --------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if self._before_op is not None:
            self._before_op(args, kwargs)
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
        """``saved_tensors_hooks`` pack hook: what autograd saves is an activation."""
        for rec in self.see(t):
            rec.saved = True
        return t

    @staticmethod
    def unpack_hook(t: torch.Tensor) -> torch.Tensor:
        return t
