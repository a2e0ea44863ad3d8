"""A ``MeasureReport`` from what a measured process recorded: built in the process at a clean
exit (``build_report``), or from its stream file afterwards by the parent (``assemble``), which
also knows how the process ended. Both paths share ``build_report``. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..breakdown import Breakdown, Category, Item, Moment, Phase, Pool, RankBreakdown, Step
from ..results import DeviceInfo, ModelInfo
from ..runtime.steps import StepMeasurement, moments_of, step_from_record
from .ending import CudaOom, RunEnd, diagnose, memory_limit, signal_name
from .report import Counters, MeasureReport

__all__ = ["HOW", "ParentView", "assemble", "build_report"]

HOW = "measured: live storage bytes (memplan.measure.session)"


def build_report(*, rank: int, world: int, model: ModelInfo, device: DeviceInfo,
                 steps: Sequence[StepMeasurement], counters: Counters, cuda: bool,
                 samples: Sequence[dict[str, Any]] = (), tensors: Sequence[dict[str, Any]] = (),
                 end: RunEnd | None = None, loop: dict[str, Any] | None = None) -> MeasureReport:
    """The report of one rank (see ``MeasureReport``)."""
    notes: list[str] = []
    outside: tuple[Item, ...] = ()
    alloc = counters.allocator
    if steps:
        moments = moments_of(steps, HOW)
        unmodelled: tuple[Category, ...] = ()
    else:
        # No step closed with tensor tracking on: the allocator peak, or the live tensor bytes
        # sampled, is all we know.
        live = max((int(s.get("live_tensor_bytes", 0)) for s in samples), default=0)
        peak, how = ((alloc.max_memory_allocated, "torch.cuda.max_memory_allocated") if alloc
                     else (live, "highest sampled live tensor bytes"))
        moments = (Moment(step=Step.STEADY, phase=Phase.FORWARD, label="whole session",
                          items=(Item(category=Category.TEMPORARY,
                                      name="uncategorised (no step was completed or tracked)",
                                      bytes=peak, formula=how),)),)
        unmodelled = tuple(c for c in Category if c != Category.TEMPORARY)
        notes.append("no training step was completed with tensor tracking on: categories are "
                     "unknown")
    if cuda and alloc is not None:
        outside = (Item(category=Category.OVERHEAD, name="allocator slack",
                        bytes=max(0, alloc.max_memory_reserved - alloc.max_memory_allocated),
                        pool=Pool.RESERVED,
                        formula="max_memory_reserved - max_memory_allocated (measured)"),)
        if counters.nvml_peak_used_bytes:
            outside += (Item(category=Category.OVERHEAD, name="outside PyTorch (NVML)",
                             bytes=max(0, counters.nvml_peak_used_bytes
                                       - alloc.max_memory_reserved),
                             pool=Pool.DEVICE, formula="NVML used - max_memory_reserved"),)
        notes.append(f"CUDA allocator: max_memory_allocated {alloc.max_memory_allocated} B "
                     "(block rounding and kernel workspaces included, unlike the moments)")
    elif cuda:
        notes.append("CUDA allocator counters were lost with the process (it did not exit)")
    if end is not None and end.how != "completed":
        notes.append(f"run ended: {end.diagnosis}")
    role = f"rank {rank}" if world > 1 else "every rank"
    rb = RankBreakdown(role=role, ranks=1, moments=moments, outside=outside,
                       unmodelled=unmodelled, notes=tuple(notes))
    b = Breakdown(source="measure", model=model, recipe={}, device=device, ranks=(rb,))
    return MeasureReport(breakdown=b, rank=rank, world_size=world, counters=counters,
                         samples=tuple(samples), tensors=tuple(tensors), end=end,
                         loop=dict(loop or {}))


@dataclass(frozen=True, kw_only=True, slots=True)
class ParentView:
    """What the parent (``memplan measure``) saw of the process from outside."""

    exit_code: int | None
    """The process's exit status (negative: killed by that signal); None when the process is
    a rank under a launcher, whose own status the parent does not see."""
    last_rss_bytes: int | None = None
    """RSS of the process tree at the parent's last sample."""
    peak_rss_bytes: int | None = None
    """Highest RSS of the process tree the parent saw."""
    gpu_used_peak_bytes: int | None = None
    """Highest GPU memory in use (NVML) the parent saw."""


def _ending(records: list[dict[str, Any]], samples: list[dict[str, Any]],
            parent: ParentView | None, closed: bool) -> RunEnd:
    exc = next((r for r in reversed(records) if r["kind"] == "exception"), None)
    sig_rec = next((r for r in reversed(records) if r["kind"] == "signal"), None)
    code = parent.exit_code if parent else None
    sig = sig_rec["signal"] if sig_rec else None
    if exc is not None:
        how = "signal" if exc.get("type") == "KeyboardInterrupt" else "exception"
        sig = sig or ("SIGINT" if how == "signal" else None)
    elif sig_rec is not None:
        how = "signal"
    elif closed or code == 0:
        how = "completed" if not code else "exit"
    elif code is not None and code < 0:
        sig = signal_name(-code)
        how = "killed" if sig == "SIGKILL" else "signal"
    elif code is not None and code > 0 and parent is not None:
        how = "exit"
    else:
        how = "killed" if not closed else "unknown"
    # Where the run was: the last sample or phase change before the ending was recorded.
    stop = next((i for i, r in enumerate(records) if r["kind"] in ("exception", "signal")),
                len(records))
    before = [r["sample"] for r in records[:stop] if r["kind"] == "sample"]
    last = before[-1] if before else {}
    marks = [r for r in records[:stop] if r["kind"] == "phase"]
    if marks and float(marks[-1]["t"]) >= float(last.get("t", -1.0)):
        # The phase change was flushed after the last sample: the moment within is unknown.
        last = {**last, "step": marks[-1]["step"], "phase": marks[-1]["phase"], "moment": None}
    own_rss = [int(s["rss_bytes"]) for s in samples if "rss_bytes" in s]
    last_t = float(samples[-1]["t"]) if samples else 0.0
    last_rss = parent.last_rss_bytes if parent and parent.last_rss_bytes else (
        own_rss[-1] if own_rss else None)
    peak_rss = max([r for r in (parent.peak_rss_bytes if parent else None, *own_rss) if r],
                   default=None)
    limit, source = memory_limit()
    step, phase, moment = last.get("step"), last.get("phase"), last.get("moment")
    where = (f"in step {step}, {moment or phase}" if phase else
             "between steps" if step is not None else "before the first step")
    oom = CudaOom.from_dict(exc["cuda_oom"]) if exc and exc.get("cuda_oom") else None
    seen = next((r for r in reversed(records) if r["kind"] == "oom_snapshot"), None)
    if oom is not None and seen is not None:  # torch's OOM observer ran first (cuda_oom.py)
        oom = replace(oom, snapshot=seen["summary"])
    elif oom is None and seen is not None and how != "completed":
        oom = _observed_oom(seen)  # the OOM's exception never reached the session's exit
    errors = []
    if not closed and how in ("completed", "exit"):
        errors.append(f"the process record stops at t={last_t:.2f} s without its "
                      "closing record: a write failed (a full disk?) and later moments are lost")
    return RunEnd(
        how=how, exit_code=code, signal=sig,
        exception=f"{exc['type']}: {exc['message']}" if exc else None, cuda_oom=oom,
        last_step=step, last_phase=phase, last_moment=moment, last_rss_bytes=last_rss,
        peak_rss_bytes=peak_rss, memory_limit_bytes=limit, memory_limit_source=source,
        gpu_used_peak_bytes=parent.gpu_used_peak_bytes if parent else None,
        diagnosis=diagnose(how=how, sig=sig, exception=exc["type"] if exc else None,
                           cuda_oom=oom, last_rss=last_rss, peak_rss=peak_rss, limit=limit,
                           limit_source=source, where=where),
        report_errors=tuple(errors))


def _observed_oom(seen: dict[str, Any]) -> CudaOom:
    """A CUDA OOM known only from torch's observer (``cuda_oom.py``): the process died, or
    exited, before the exception reached the session (a launcher's ``sys.exit``, a hang
    killed by its scheduler, a rank torn down by its peers)."""
    summary = seen.get("summary") or {}
    return CudaOom(message="CUDA out of memory (seen by torch's OOM observer, device limit "
                           f"{seen.get('device_limit_bytes')} B; the exception itself was not "
                           "recorded)",
                   requested_bytes=seen.get("requested_bytes"), device_index=seen.get("device"),
                   free_bytes=seen.get("device_free_bytes"),
                   allocated_bytes=summary.get("allocated_bytes"),
                   reserved_bytes=summary.get("reserved_bytes"),
                   reserved_unallocated_bytes=summary.get("reserved_unallocated_bytes"),
                   snapshot=summary)


def assemble(records: list[dict[str, Any]], parent: ParentView | None = None) -> MeasureReport:
    """The report of one process from its stream records (``stream.py``)."""
    start = next(r for r in records if r["kind"] == "start")
    steps = [step_from_record(r["step"]) for r in records if r["kind"] == "step"]
    samples = [r["sample"] for r in records if r["kind"] == "sample"]
    tensors = [p for r in records if r["kind"] == "tensors" for p in r["points"]]
    end_rec = next((r for r in records if r["kind"] == "end"), None)
    if end_rec is not None:
        counters = Counters.from_dict(end_rec["counters"])
    else:
        counters = Counters(peak_rss_bytes=max((int(s["rss_bytes"]) for s in samples), default=0),
                            seconds=round(float(samples[-1]["t"]), 3) if samples else 0.0,
                            steps=len(steps))
    end = _ending(records, samples, parent, closed=end_rec is not None)
    return build_report(rank=int(start["rank"]), world=int(start["world_size"]),
                        model=ModelInfo.from_dict(start["model"]),
                        device=DeviceInfo.from_dict(start["device"]), steps=steps,
                        counters=counters, cuda=bool(start.get("cuda")), samples=samples,
                        tensors=tensors, end=end,
                        loop=next((r["loop"] for r in records if r["kind"] == "loop"), None))
