"""``session``: measure a user's own training loop, in the same result type as the estimate.

::

    import memplan.measure
    with memplan.measure.session(model=model, optimizer=optimizer, out="runs/mem") as s:
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    s.breakdown.worst.peak_allocated_bytes      # also runs/mem/memplan-measure.{json,png}

What it records:

- **Live tensor bytes** (``track_tensors``, default on): the storage tracker of ``live.py``
  runs over the whole loop. Steps and phases are inferred: a step opens at the first forward
  (a forward pre-hook on ``model``, or on any module when no model is given), the backward is
  any op the autograd engine runs, the optimizer phase is ``optimizer.step`` (step pre/post
  hooks; every optimizer when none is given), and the step closes when the step returns.
  Categories and moments are those of ``measure_step``; step 0 is ``first``, the last step
  ``steady``.
- **CUDA allocator** (when the model is on a GPU): ``torch.cuda.memory_stats`` peaks of
  allocated / reserved / active bytes over the session, and the device's used memory from NVML
  (``pynvml``; skipped when absent).
- **Host**: RSS of the process (psutil, else ``/proc``) and, on CUDA, pinned host memory
  (``torch.cuda.host_memory_stats``), sampled every ``interval_s`` by a thread, with the live
  tensor bytes and the allocator's current bytes: the ``timeline``.

Known limitations: the tracker costs a Python call per ATen op (a tiny model runs ~2-5x slower;
large GPU kernels hide it); the event log of the open step is kept (it is compacted between
steps); tensors created before the session are counted from their first use; torch.compile'd
regions are seen as their ATen ops only when they run eagerly.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ..breakdown import Breakdown, Category, Item, Moment, Phase, Pool, RankBreakdown, Step
from ..results import DeviceInfo, ModelInfo
from .labels import BATCH, OPTIMIZER, ROOT, ModuleLabeller
from .live import (
    PHASES,
    StepMeasurement,
    _graph_task_id,
    _mark_grads,
    _mark_optimizer_state,
    _mark_params,
    _replay,
    _replay_moments,
    _storages,
    _StorageTracker,
    _Window,
)
from .result import moments_of

__all__ = ["Session", "session", "REPORT_NAME"]

REPORT_NAME = "memplan-measure"
"""Stem of the files a session writes: ``<stem>.json`` and ``<stem>.png`` (``<stem>.rank<R>.*``
for each rank under torchrun, and the aggregate ``<stem>.json`` by rank 0)."""

HOW = "measured: live storage bytes (memplan.measure.session)"
_TIMELINE_POINTS = 400  # per step, enough for a plot


def _rss_bytes() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            return 0


class _Nvml:
    """Used memory of one GPU through NVML, or nothing when pynvml is absent."""

    def __init__(self, index: int):
        self.handle = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._pynvml = pynvml
        except Exception:  # noqa: BLE001 - absent library or driver: degrade to no NVML
            self.handle = None

    def used(self) -> int | None:
        if self.handle is None:
            return None
        return int(self._pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)


class _AutoTracker(_StorageTracker):
    """The storage tracker, switching forward -> backward when the autograd engine runs."""

    def __init__(self, on_backward: Any):
        super().__init__()
        self._on_backward = on_backward

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if self.phase == "forward" and _graph_task_id() >= 0:
            self._on_backward()
        # An input never seen was made before the session (the batch, say), or outside the
        # dispatcher: it was not allocated by this step, whatever step first reads it.
        new = [st for t in tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor)
               for st in _storages(t) if id(st) not in self._uid_of]
        if new:
            phase, window = self.phase, self.window
            self.phase, self.window = None, None
            for st in new:
                self._see_storage(st)
            self.phase, self.window = phase, window
        return super().__torch_dispatch__(func, types, args, kwargs)


class Session:
    """Measures everything between ``__enter__`` and ``__exit__``; see the module docstring."""

    def __init__(self, *, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, out: str | Path | None = None,
                 interval_s: float = 0.01, track_tensors: bool = True, plot: bool = True):
        self.model, self.optimizer = model, optimizer
        self.out = Path(out) if out is not None else None
        self.interval_s = interval_s
        self.track_tensors = track_tensors
        self.plot = plot
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.steps: list[StepMeasurement] = []
        self.tensor_timeline: list[tuple[float, dict[str, int]]] = []
        self.samples: list[dict[str, Any]] = []
        self.counters: dict[str, Any] = {}
        self.breakdown: Breakdown | None = None
        self.report: dict[str, Any] | None = None
        self._stack = ExitStack()
        self._stop = threading.Event()
        self._seen_modules: set[int] = set()
        self._owners: dict[int, str] = {}

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> Session:
        self.t0 = time.perf_counter()
        params = list(self.model.parameters()) if self.model is not None else []
        dev = params[0].device if params else None
        self.cuda = (dev.type == "cuda") if dev is not None else torch.cuda.is_initialized()
        if self.cuda:
            self.cuda_index = ((dev.index or 0) if dev is not None
                               else torch.cuda.current_device())
            torch.cuda.reset_peak_memory_stats(self.cuda_index)
            self.nvml = _Nvml(self.cuda_index)
        self.tracker = _AutoTracker(self._enter_backward)
        self.tracker.start_timing()
        self.labeller = None
        if self.model is not None:
            self.labeller = ModuleLabeller(self.model, self.tracker)
            self._owners = self.labeller.owner_of_tensor
            self._stack.callback(self.labeller.detach)
            _mark_params(self.tracker, params + list(self.model.buffers()), self._owners)
            h = self.model.register_forward_pre_hook(self._on_forward)
        else:
            from torch.nn.modules.module import register_module_forward_pre_hook

            h = register_module_forward_pre_hook(self._on_forward)
        self._stack.callback(h.remove)
        if self.optimizer is not None:
            hs = (self.optimizer.register_step_pre_hook(self._on_step_pre),
                  self.optimizer.register_step_post_hook(self._on_step_post))
        else:
            from torch.optim.optimizer import (
                register_optimizer_step_post_hook,
                register_optimizer_step_pre_hook,
            )

            hs = (register_optimizer_step_pre_hook(self._on_step_pre),
                  register_optimizer_step_post_hook(self._on_step_post))
        for handle in hs:
            self._stack.callback(handle.remove)
        if self.track_tensors:
            self._stack.enter_context(self.tracker)
            self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(
                self.tracker.pack_hook, self.tracker.unpack_hook))
            self._stack.callback(self.tracker.close)
        self._thread = threading.Thread(target=self._sample_loop, name="memplan-sampler",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.tracker.window is not None:
            self._close_step(None)
        self._stop.set()
        self._thread.join()
        self._sample()
        self._stack.close()
        self._read_counters()
        self.breakdown = self._breakdown()
        self.report = self._report()
        if self.out is not None:
            self.write(self.out)

    # -- phases ------------------------------------------------------------------------
    def _open_step(self) -> None:
        t = self.tracker
        t.compact()
        _mark_grads(t, self._params(), self._owners)
        if self.optimizer is not None:
            _mark_optimizer_state(t, self.optimizer, self._owners)
        t.window = _Window(len(self.steps), len(t.events), dict(t.live), t.live_bytes)

    def _params(self) -> list[torch.Tensor]:
        if self.model is not None:
            return list(self.model.parameters())
        if self.optimizer is not None:
            return [p for g in self.optimizer.param_groups for p in g["params"]]
        return []

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        t = self.tracker
        if self.model is None and id(module) not in self._seen_modules:
            self._seen_modules.add(id(module))
            _mark_params(t, list(module.parameters(recurse=False))
                         + list(module.buffers(recurse=False)), {})
        if _graph_task_id() >= 0 or t.phase == "forward":
            return  # a recomputation inside the backward, or a submodule
        if t.window is None:
            self._open_step()
        t.set_phase("forward")
        t.owner = ROOT if self.labeller else ""

    def _enter_backward(self) -> None:
        t = self.tracker
        w = t.window
        if w is None:
            return
        for uid in list(t.live):
            rec = t.recs[uid]
            if rec.window == w.step and rec.phase == "forward":
                rec.fwd_survivor = True
        t.set_phase("backward")

    def _on_step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        t = self.tracker
        if t.window is None:
            self._open_step()
        _mark_grads(t, [p for g in optimizer.param_groups for p in g["params"]], self._owners)
        t.set_phase("optimizer-step")
        t.owner = OPTIMIZER if self.labeller else ""

    def _on_step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._close_step(optimizer)

    def _close_step(self, optimizer: Any) -> None:
        t = self.tracker
        w = t.window
        if w is None:
            return
        if optimizer is not None:
            _mark_optimizer_state(t, optimizer, self._owners)
            _mark_grads(t, [p for g in optimizer.param_groups for p in g["params"]], self._owners)
        t.set_phase(None)
        t.window = None
        t.owner = BATCH if self.labeller else ""
        if w.peak < 0:
            return
        self.steps.append(StepMeasurement(
            step=w.step, peak_bytes=w.peak, peak_phase=w.peak_phase,
            phase_peaks={p: w.phase_peaks[p] for p in PHASES if p in w.phase_peaks},
            at_peak=_replay(w, t), start_bytes=w.start_bytes, end_bytes=t.live_bytes,
            moments=_replay_moments(w, t)))
        self._timeline_of(w)

    def _timeline_of(self, w: _Window) -> None:
        """Bytes per category over the step in (up to) ``_TIMELINE_POINTS`` buckets of events,
        each represented by its highest point, so no spike (and not the peak) is lost."""
        t = self.tracker
        assert t.times is not None
        live: set[int] = set(w.start_live)
        cats = dict.fromkeys((str(c) for c in Category), 0)
        for uid in live:
            cats[t.recs[uid].category()] += t.recs[uid].nbytes
        total = sum(cats.values())
        n = len(t.events) - w.start_idx
        every = max(1, -(-n // _TIMELINE_POINTS))
        best: tuple[int, float, dict[str, int]] | None = None
        for k in range(w.start_idx, len(t.events)):
            ev = t.events[k]
            rec = t.recs.get(abs(ev))
            if rec is not None:
                if ev > 0 and ev not in live:
                    live.add(ev)
                    cats[rec.category()] += rec.nbytes
                    total += rec.nbytes
                elif ev < 0 and -ev in live:
                    live.discard(-ev)
                    cats[rec.category()] -= rec.nbytes
                    total -= rec.nbytes
            if best is None or total > best[0]:
                best = (total, t.times[k] - self.t0, dict(cats))
            if (k - w.start_idx + 1) % every == 0 or k + 1 == len(t.events):
                self.tensor_timeline.append((best[1], best[2]))
                best = None

    # -- sampling ----------------------------------------------------------------------
    def _sample(self) -> None:
        s: dict[str, Any] = {"t": time.perf_counter() - self.t0, "rss_bytes": _rss_bytes()}
        if self.track_tensors:
            s["live_tensor_bytes"] = self.tracker.live_bytes
        if self.cuda:
            s["cuda_allocated_bytes"] = torch.cuda.memory_allocated(self.cuda_index)
            s["cuda_reserved_bytes"] = torch.cuda.memory_reserved(self.cuda_index)
            used = self.nvml.used()
            if used is not None:
                s["nvml_used_bytes"] = used
            host = getattr(torch.cuda, "host_memory_stats", None)
            if host is not None:
                s["pinned_bytes"] = int(host().get("allocated_bytes.all.current", 0))
        self.samples.append(s)

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _read_counters(self) -> None:
        c: dict[str, Any] = {"peak_rss_bytes": max(s["rss_bytes"] for s in self.samples),
                             "seconds": round(time.perf_counter() - self.t0, 3),
                             "steps": len(self.steps)}
        if self.cuda:
            stats = torch.cuda.memory_stats(self.cuda_index)
            c["max_memory_allocated"] = int(stats.get("allocated_bytes.all.peak", 0))
            c["max_memory_reserved"] = int(stats.get("reserved_bytes.all.peak", 0))
            c["active_bytes.all.peak"] = int(stats.get("active_bytes.all.peak", 0))
            nv = [s["nvml_used_bytes"] for s in self.samples if "nvml_used_bytes" in s]
            c["nvml_peak_used_bytes"] = max(nv) if nv else None
            c["peak_pinned_bytes"] = max((s.get("pinned_bytes", 0) for s in self.samples),
                                         default=0)
        self.counters = c

    # -- results -----------------------------------------------------------------------
    def _device(self) -> DeviceInfo:
        if self.cuda:
            props = torch.cuda.get_device_properties(self.cuda_index)
            return DeviceInfo(name=props.name, capacity_bytes=int(props.total_memory),
                              source="torch.cuda.get_device_properties")
        try:
            import psutil

            total = int(psutil.virtual_memory().total)
        except ImportError:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return DeviceInfo(name="cpu", capacity_bytes=total, source="host memory")

    def _breakdown(self) -> Breakdown:
        notes: list[str] = []
        outside: tuple[Item, ...] = ()
        if self.steps:
            moments = moments_of(self.steps, HOW)
            unmodelled: tuple[Category, ...] = ()
        else:
            # No step seen with tensor tracking on: the allocator peak is all we know.
            peak = self.counters.get("max_memory_allocated", 0)
            moments = (Moment(step=Step.STEADY, phase=Phase.FORWARD, label="whole session",
                              items=(Item(category=Category.TEMPORARY,
                                          name="uncategorised (tensor tracking off)",
                                          bytes=peak, formula="torch.cuda.max_memory_allocated"),)),)
            unmodelled = tuple(c for c in Category if c != Category.TEMPORARY)
            notes.append("no training step was tracked: categories are unknown")
        if self.cuda:
            c = self.counters
            slack = max(0, c["max_memory_reserved"] - c["max_memory_allocated"])
            outside = (Item(category=Category.OVERHEAD, name="allocator slack", bytes=slack,
                            pool=Pool.RESERVED,
                            formula="max_memory_reserved - max_memory_allocated (measured)"),)
            if c.get("nvml_peak_used_bytes"):
                outside += (Item(category=Category.OVERHEAD, name="outside PyTorch (NVML)",
                                 bytes=max(0, c["nvml_peak_used_bytes"]
                                           - c["max_memory_reserved"]),
                                 pool=Pool.DEVICE, formula="NVML used - max_memory_reserved"),)
            notes.append(f"CUDA allocator: max_memory_allocated {c['max_memory_allocated']} B "
                         "(block rounding and kernel workspaces included, unlike the moments)")
        role = f"rank {self.rank}" if self.world > 1 else "every rank"
        rank = RankBreakdown(role=role, ranks=1, moments=moments, outside=outside,
                             unmodelled=unmodelled, notes=tuple(notes))
        model = ModelInfo(id="(your training loop)", params=0, trainable_params=0, layers=0,
                          source="measured")
        if self.model is not None:
            ps = list(self.model.parameters())
            model = replace(model, id=type(self.model).__name__,
                            params=sum(p.numel() for p in ps),
                            trainable_params=sum(p.numel() for p in ps if p.requires_grad))
        return Breakdown(source="measure", model=model, recipe={}, device=self._device(),
                         ranks=(rank,))

    def _report(self) -> dict[str, Any]:
        assert self.breakdown is not None
        return {**self.breakdown.to_dict(), "rank": self.rank, "world_size": self.world,
                "counters": self.counters,
                "timeline": {"samples": self.samples,
                             "tensors": [{"t": t, **c} for t, c in self.tensor_timeline]}}

    def write(self, out: str | Path) -> list[Path]:
        """Write the JSON report (and the PNG when matplotlib is installed) under ``out``;
        under torchrun each rank writes its own and rank 0 the aggregate."""
        from .aggregate import write_reports

        assert self.report is not None
        return write_reports(self.report, Path(out), plot=self.plot)


def session(**kwargs: Any) -> Session:
    """``with memplan.measure.session(model=..., optimizer=..., out=DIR) as s:``; see
    ``Session``."""
    return Session(**kwargs)
