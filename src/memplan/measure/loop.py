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
    s.report                                    # MeasureReport: breakdown, counters, timeline

What it records:

- **Live tensor bytes** (``track_tensors``, default on): the storage tracker of ``memplan.runtime``
  runs over the whole loop. Steps and phases are inferred: a step opens at the first forward
  (a forward pre-hook on ``model``, or on any module when no model is given), the backward is
  any op the autograd engine runs, the optimizer phase is ``optimizer.step`` (step pre/post
  hooks; every optimizer when none is given), and the step closes when the step returns.
  Categories and moments are those of ``measure_step``; step 0 is ``first``, the last step
  ``steady``.
- **CUDA allocator** (model on a GPU): ``torch.cuda.memory_stats`` peaks, NVML's used memory
  (``pynvml``), and on an out-of-memory the allocator's snapshot (``cuda_oom.py``).
- **Host**: RSS of the process (psutil, else ``/proc``) and, on CUDA, pinned host memory
  (``torch.cuda.host_memory_stats``), sampled every ``interval_s`` by a thread, with the live
  tensor bytes and the allocator's current bytes: the ``timeline``.

Known limitations: the tracker costs a Python call per ATen op (a tiny model runs ~2-5x slower;
large GPU kernels hide it); the event log of the open step is kept (it is compacted between
steps); tensors created before the session are counted from their first use. torch.compile'd
code keeps running compiled (``runtime.compiled``: the tracker lets Dynamo through and Inductor's
buffers are allocated through the dispatcher while the session is open); code compiled before
the session started allocates past the tracker (the CUDA allocator's counters still see it).
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..breakdown import Breakdown, Phase
from ..results import AllocatorCounters, DeviceInfo, ModelInfo
from ..runtime.book import (
    close_step,
    end_forward,
    mark_grads,
    mark_optimizer_state,
    mark_params,
    open_step,
    step_measurement,
    tensors_of,
)
from ..runtime.labels import BATCH, OPTIMIZER, ROOT, ModuleLabeller
from ..runtime.steps import StepMeasurement, step_record
from ..runtime.compiled import CompiledTracker, allocations_seen
from ..runtime.tracker import Window, graph_task_id
from .assemble import assemble
from .cuda_oom import record_history, watch_cuda_oom
from .ending import parse_cuda_oom, signal_name
from .loop_seen import LoopWatch
from .tensor_timeline import timeline_points
from .report import Counters, MeasureReport
from .sampler import Nvml, Sampler, host_total_bytes, rss_bytes
from .stream import FLUSH_S, Stream, stream_path

__all__ = ["Session", "session", "REPORT_NAME"]

REPORT_NAME = "memplan-measure"
"""Stem of the files a session writes: ``<stem>.json`` and ``<stem>.png`` (``<stem>.rank<R>.*``
for each rank under torchrun, and the aggregate ``<stem>.json`` by rank 0)."""

_TIMELINE_POINTS = 400  # per step, enough for a plot

class Session:
    """Measures everything between ``__enter__`` and ``__exit__``; see the module docstring."""

    def __init__(self, *, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, out: str | Path | None = None,
                 interval_s: float = 0.01, track_tensors: bool = True, plot: bool = True,
                 flush_s: float = FLUSH_S):
        self.model, self.optimizer = model, optimizer
        self.flush_s, self.interval_s, self.plot = flush_s, interval_s, plot
        self.out = Path(out) if out is not None else None
        self.track_tensors = track_tensors
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.steps: list[StepMeasurement] = []
        self.tensor_timeline: list[tuple[float, dict[str, int]]] = []
        self.records: list[dict[str, Any]] = []
        """Everything recorded, as streamed to ``<out>/memplan-measure.rank<R>.<pid>.jsonl``."""
        self.stream: Stream | None = None
        self.parent_assembles = False
        """Set by ``autostart`` under ``memplan measure``: write this rank's JSON only; the
        parent writes the PNG and the aggregate."""
        self.counters: Counters | None = None
        self.breakdown: Breakdown | None = None
        self.report: MeasureReport | None = None
        self._stack = ExitStack()
        self._seen_modules: set[int] = set()
        self._owners: dict[int, str] = {}
        self.loop = LoopWatch()
        """The training loop seen (outputs kept, zero_grad, optimizer implementation)."""

    @property
    def samples(self) -> list[dict[str, Any]]:
        """The periodic samples so far (see ``MeasureReport.samples``)."""
        return self.sampler.samples

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
            self.nvml = Nvml(self.cuda_index)
            if watch_cuda_oom(lambda rec: self._record(rec, flush=True)):
                self._stack.callback(watch_cuda_oom, None)
            if self.track_tensors and (off := record_history()) is not None:
                self._stack.callback(off)
        # torch.compile'd code runs compiled under this tracker, its buffers seen
        # (``runtime.compiled``); a plain dispatch mode would make Dynamo run it eagerly
        self.tracker = CompiledTracker(before_op=self._before_op)
        self._stack.enter_context(allocations_seen())
        self.tracker.start_timing()
        self.labeller = None
        if self.model is not None:
            if self.track_tensors:  # module moments need the tracker; skip their hooks otherwise
                self.labeller = ModuleLabeller(self.model, self.tracker)
                self._owners = self.labeller.owner_of_tensor
                self._stack.callback(self.labeller.detach)
            mark_params(self.tracker, params + list(self.model.buffers()), self._owners)
            hooks = (self.model.register_forward_pre_hook(self._on_forward),
                     self.model.register_forward_hook(self._on_output))
        else:
            from torch.nn.modules.module import (
                register_module_forward_hook,
                register_module_forward_pre_hook,
            )

            hooks = (register_module_forward_pre_hook(self._on_forward),
                     register_module_forward_hook(self._on_output))
        for handle in hooks:
            self._stack.callback(handle.remove)
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
        if self.optimizer is not None:
            self.loop.watch(self.optimizer)
        self._stack.callback(self.loop.close)
        for handle in hs:
            self._stack.callback(handle.remove)
        if self.track_tensors:
            self._stack.enter_context(self.tracker)
            self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(
                self.tracker.pack_hook, self.tracker.unpack_hook))
            self._stack.callback(self.tracker.close)
        if self.out is not None:
            self.stream = Stream(stream_path(self.out, self.rank, os.getpid()),
                                 flush_s=self.flush_s)
        self._record({"kind": "start", "rank": self.rank, "world_size": self.world,
                      "pid": os.getpid(), "cuda": self.cuda, "model": self._model().to_dict(),
                      "device": self._device().to_dict()}, flush=True)
        self.sampler = Sampler(self._sample, self.interval_s)
        self.sampler.start()
        return self

    def _record(self, record: dict[str, Any], *, flush: bool = False) -> None:
        self.records.append(record)
        if self.stream is not None:
            self.stream.put(record, flush=flush)

    def record_exception(self, exc: BaseException) -> None:
        """Record the exception that is ending the process (CUDA OOM details included)."""
        self.sampler.sample()
        rec: dict[str, Any] = {"kind": "exception", "type": type(exc).__name__,
                               "message": str(exc).strip().split("\n")[0][:2000]}
        if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc):
            rec["cuda_oom"] = parse_cuda_oom(str(exc), self._allocator_now()).to_dict()
        self._record(rec, flush=True)

    def record_signal(self, signum: int) -> None:
        """Record that signal ``signum`` is ending the process, and flush."""
        self.sampler.sample()
        self._record({"kind": "signal", "signal": signal_name(signum)}, flush=True)

    def _phase_record(self) -> None:
        """Record and flush a phase change, so a kill leaves the phase it happened in."""
        w = self.tracker.window
        self._record({"kind": "phase", "t": time.perf_counter() - self.t0,
                      "step": w.step if w is not None else None,
                      "phase": str(self.tracker.phase)}, flush=True)

    def _allocator_now(self) -> dict[str, int] | None:
        if not self.cuda:
            return None
        return {"memory_allocated": torch.cuda.memory_allocated(self.cuda_index),
                "memory_reserved": torch.cuda.memory_reserved(self.cuda_index),
                "max_memory_allocated": torch.cuda.max_memory_allocated(self.cuda_index),
                "max_memory_reserved": torch.cuda.max_memory_reserved(self.cuda_index)}

    def __exit__(self, exc_type: Any = None, exc: BaseException | None = None,
                 tb: Any = None) -> None:
        if exc is not None:
            self.record_exception(exc)
        if self.tracker.window is not None:
            self._close_step(None)
        self.sampler.stop()
        self._stack.close()
        self.counters = self._counters()
        self._record({"kind": "loop", "loop": self.loop.record()})
        self._record({"kind": "end", "counters": self.counters.to_dict()}, flush=True)
        if self.stream is not None:
            self.stream.close()
        self.report = assemble(self.records)
        self.breakdown = self.report.breakdown
        if self.out is not None:
            self.write(self.out)

    # -- phases ------------------------------------------------------------------------
    def _before_op(self, args: Any, kwargs: Any) -> None:
        t = self.tracker
        if t.phase == Phase.FORWARD and graph_task_id() >= 0:
            end_forward(t)  # the autograd engine runs: the backward has begun
            self._phase_record()
            self.loop.on_backward(self._params())
        # An input never seen was made before the session (the batch, say), or outside the
        # dispatcher: it was not allocated by this step, whatever step first reads it.
        t.see_before_step(tensors_of((args, kwargs)))

    def _open_step(self) -> None:
        t = self.tracker
        t.compact()
        if self.track_tensors:  # counters only: no tensor is attributed, so none is marked
            mark_grads(t, self._params(), self._owners)
            if self.optimizer is not None:
                mark_optimizer_state(t, self.optimizer, self._owners)
        self.loop.on_step_open(self._params())
        open_step(t, len(self.steps))

    def _params(self) -> list[torch.Tensor]:
        if self.model is not None:
            return list(self.model.parameters())
        if self.optimizer is not None:
            return [p for g in self.optimizer.param_groups for p in g["params"]]
        return []

    def _on_forward(self, module: torch.nn.Module, args: Any) -> None:
        t = self.tracker
        if self.model is None and self.track_tensors and id(module) not in self._seen_modules:
            self._seen_modules.add(id(module))
            mark_params(t, list(module.parameters(recurse=False))
                        + list(module.buffers(recurse=False)), {})
        if graph_task_id() >= 0 or t.phase == Phase.FORWARD:
            return  # a recomputation inside the backward, or a submodule
        if t.window is None:
            self._open_step()
        t.set_phase(Phase.FORWARD)
        self._phase_record()
        t.owner = ROOT if self.labeller else ""
        self._root = module

    def _on_output(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if module is getattr(self, "_root", None) and graph_task_id() < 0:
            self.loop.on_output(output)

    def _on_step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        t = self.tracker
        if t.window is None:
            self._open_step()
        if self.track_tensors:
            mark_grads(t, [p for g in optimizer.param_groups for p in g["params"]], self._owners)
        t.set_phase(Phase.OPTIMIZER)
        self._phase_record()
        t.owner = OPTIMIZER if self.labeller else ""
        self.loop.on_step(optimizer)

    def _on_step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._close_step(optimizer)

    def _close_step(self, optimizer: Any) -> None:
        t = self.tracker
        if t.window is None:
            return
        if optimizer is not None and self.track_tensors:
            mark_optimizer_state(t, optimizer, self._owners)
            mark_grads(t, [p for g in optimizer.param_groups for p in g["params"]], self._owners)
        w = close_step(t)
        t.owner = BATCH if self.labeller else ""
        if w is None or w.peak < 0:
            return
        m = step_measurement(t, w)
        self.steps.append(m)
        self._record({"kind": "step", "step": step_record(m)}, flush=not self.track_tensors)
        if self.track_tensors:  # counters only: no tensor event, no timeline to walk
            n = len(self.tensor_timeline)
            self._timeline_of(w)
            self._record({"kind": "tensors", "points": [
                {"t": t, **c} for t, c in self.tensor_timeline[n:]]}, flush=True)

    def _timeline_of(self, w: Window) -> None:
        self.tensor_timeline += timeline_points(self.tracker, w, self.t0, _TIMELINE_POINTS)

    # -- sampling ----------------------------------------------------------------------
    def _sample(self) -> dict[str, Any]:
        t = self.tracker
        w = t.window
        s: dict[str, Any] = {"t": time.perf_counter() - self.t0, "rss_bytes": rss_bytes(),
                             "step": w.step if w is not None else None,
                             "phase": str(t.phase) if t.phase is not None else None,
                             "moment": _last_label(w)}
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
        self._record({"kind": "sample", "sample": s})
        return s

    def _counters(self) -> Counters:
        samples = self.samples
        c = Counters(peak_rss_bytes=max(s["rss_bytes"] for s in samples),
                     seconds=round(time.perf_counter() - self.t0, 3), steps=len(self.steps))
        if not self.cuda:
            return c
        stats = torch.cuda.memory_stats(self.cuda_index)
        nv = [s["nvml_used_bytes"] for s in samples if "nvml_used_bytes" in s]
        return replace(c, allocator=AllocatorCounters(
            max_memory_allocated=int(stats.get("allocated_bytes.all.peak", 0)),
            max_memory_reserved=int(stats.get("reserved_bytes.all.peak", 0)),
            active_bytes_peak=int(stats.get("active_bytes.all.peak", 0))),
            nvml_peak_used_bytes=max(nv) if nv else None,
            peak_pinned_bytes=max((s.get("pinned_bytes", 0) for s in samples), default=0))

    # -- results -----------------------------------------------------------------------
    def _model(self) -> ModelInfo:
        if self.model is None:
            return ModelInfo(id="(your training loop)", params=0, trainable_params=0, layers=0,
                             source="measured")
        ps = list(self.model.parameters())
        return ModelInfo(id=type(self.model).__name__, params=sum(p.numel() for p in ps),
                         trainable_params=sum(p.numel() for p in ps if p.requires_grad),
                         layers=0, source="measured")

    def _device(self) -> DeviceInfo:
        if self.cuda:
            props = torch.cuda.get_device_properties(self.cuda_index)
            return DeviceInfo(name=props.name, capacity_bytes=int(props.total_memory),
                              source="torch.cuda.get_device_properties")
        return DeviceInfo(name="cpu", capacity_bytes=host_total_bytes(), source="host memory")

    def write(self, out: str | Path) -> list[Path]:
        """Write the JSON report (and the PNG when matplotlib is installed) under ``out``;
        under torchrun each rank writes its own and rank 0 the aggregate."""
        from .aggregate import write_reports

        assert self.report is not None
        return write_reports(self.report, Path(out), plot=self.plot and not self.parent_assembles,
                             wait_for_ranks=not self.parent_assembles)


def _last_label(w: Window | None) -> str | None:
    """The open moment's label; read from the sampler thread while the step runs."""
    try:
        return w.segments[-1].label if w is not None else None
    except IndexError:  # the tracker is replacing the last segment right now
        return None


def session(**kwargs: Any) -> Session:
    """``with memplan.measure.session(model=..., optimizer=..., out=DIR) as s:``; ``Session``."""
    return Session(**kwargs)
