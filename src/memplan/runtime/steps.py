"""What one measured (or traced) training step is, and how steps become a ``Breakdown``.

``StepMeasurement`` and ``MomentMeasurement`` are what the storage tracker
(``memplan.runtime.tracker``) produces per step, whether it runs on real tensors (``measure``)
or fake ones (``trace``). ``to_breakdown`` turns them into the result type the estimator
returns: step 0 becomes the ``first`` step of the timeline, the last measured step the
``steady`` one, and every moment lists one ``Item`` per (module group, category) live at the
moment's peak, so the peak moment says which layer holds what; ``module_table`` pivots it.
Needs no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..breakdown import ALL_PHASES, Breakdown, Category, Item, Moment, Phase, RankBreakdown, Step
from ..results import DeviceInfo, ModelInfo

__all__ = ["ALL_GROUPS", "CATEGORIES", "PHASES", "MomentMeasurement", "StepMeasurement",
           "module_table", "moments_of", "step_from_record", "step_record", "to_breakdown"]

PHASES: tuple[Phase, ...] = ALL_PHASES
"""The phases of a step, in order."""

CATEGORIES: tuple[Category, ...] = (Category.PARAMS, Category.GRADIENTS, Category.OPTIMIZER,
                                    Category.ACTIVATIONS, Category.TEMPORARY)
"""The categories a storage can be given (communication buffers and overhead are never a
tensor storage the tracker sees)."""

ALL_GROUPS = "(all)"
"""Item name used when storages were not credited to module groups."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MomentMeasurement:
    """The peak of one labelled stretch of a step."""

    label: str
    """E.g. ``forward: model.layers.3`` or ``optimizer-step``."""
    phase: Phase
    """The phase the stretch belongs to."""
    peak_bytes: int
    """Most live bytes within the stretch (including the level at its start)."""
    by_owner: dict[str, dict[Category, int]]
    """At that peak: module group -> category -> bytes (non-zero entries only); sums to
    ``peak_bytes``. Groups: ``memplan.runtime.labels``; ``""`` for storages no group claims."""

    @property
    def at_peak(self) -> dict[Category, int]:
        """Bytes per category (every one of ``CATEGORIES``)."""
        out = dict.fromkeys(CATEGORIES, 0)
        for cats in self.by_owner.values():
            for c, b in cats.items():
                out[c] += b
        return out


@dataclass(frozen=True)
class StepMeasurement:
    """Live tensor bytes of one measured training step (see ``memplan.runtime.stepping``)."""

    step: int
    """Index of the step, 0-based; step 0 creates the optimizer states."""
    peak_bytes: int
    """Maximum live bytes during the step."""
    peak_phase: Phase
    """Phase in which ``peak_bytes`` was first reached."""
    phase_peaks: dict[Phase, int]
    """Maximum live bytes within each phase (including the level at the phase's start)."""
    at_peak: dict[Category, int]
    """Bytes per category (``CATEGORIES``) at the moment of the overall peak; sums to
    ``peak_bytes``."""
    start_bytes: int
    """Live bytes when the step starts (after ``zero_grad``, before the forward)."""
    end_bytes: int
    """Live bytes carried into the next step: after ``optimizer.step`` and dropping the loss
    (parameters, buffers, gradients, optimizer states, the batch, anything leaked)."""
    moments: tuple[MomentMeasurement, ...] = ()
    """The step's timeline: one entry per labelled stretch (each phase, and with module labels
    each module group's forward and backward), with what was live at its peak per module group
    and category. Not part of ``to_dict`` (``to_breakdown`` carries it)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "peak_bytes": self.peak_bytes,
            "peak_phase": str(self.peak_phase),
            "phase_peaks": {str(p): b for p, b in self.phase_peaks.items()},
            "at_peak": {str(c): b for c, b in self.at_peak.items()},
            "start_bytes": self.start_bytes,
            "end_bytes": self.end_bytes,
        }


def step_record(m: StepMeasurement) -> dict[str, Any]:
    """``m`` as plain JSON, moments included (what a measuring process streams per step)."""
    return {**m.to_dict(), "moments": [
        {"label": x.label, "phase": str(x.phase), "peak_bytes": x.peak_bytes,
         "by_owner": {o: {str(c): b for c, b in cats.items()} for o, cats in x.by_owner.items()}}
        for x in m.moments]}


def step_from_record(d: dict[str, Any]) -> StepMeasurement:
    """Inverse of ``step_record``."""
    return StepMeasurement(
        step=int(d["step"]), peak_bytes=int(d["peak_bytes"]), peak_phase=Phase(d["peak_phase"]),
        phase_peaks={Phase(p): int(b) for p, b in d["phase_peaks"].items()},
        at_peak={Category(c): int(b) for c, b in d["at_peak"].items()},
        start_bytes=int(d["start_bytes"]), end_bytes=int(d["end_bytes"]),
        moments=tuple(MomentMeasurement(
            label=x["label"], phase=Phase(x["phase"]), peak_bytes=int(x["peak_bytes"]),
            by_owner={o: {Category(c): int(b) for c, b in cats.items()}
                      for o, cats in x["by_owner"].items()}) for x in d.get("moments", ())))


def _moment(step: Step, m: MomentMeasurement, how: str) -> Moment:
    items = tuple(
        Item(category=Category(cat), name=owner or ALL_GROUPS, bytes=b, formula=how)
        for owner, cats in m.by_owner.items() for cat, b in cats.items() if b
    )
    return Moment(step=step, phase=Phase(m.phase), label=m.label, items=items)


def moments_of(steps: Sequence[StepMeasurement], how: str) -> tuple[Moment, ...]:
    """The timeline: step 0's moments as ``first``, the last step's as ``steady``."""
    if not steps:
        raise ValueError("no measured steps")
    out = [_moment(Step.FIRST, m, how) for m in steps[0].moments]
    if len(steps) > 1:
        out += [_moment(Step.STEADY, m, how) for m in steps[-1].moments]
    return tuple(out)


def to_breakdown(steps: Sequence[StepMeasurement], *, source: str, how: str,
                 model: ModelInfo, recipe: dict[str, Any], device: DeviceInfo,
                 role: str = "every rank", outside: tuple[Item, ...] = (),
                 unmodelled: tuple[Category, ...] = (), notes: tuple[str, ...] = ()) -> Breakdown:
    """One-role ``Breakdown`` of measured (or traced) steps; ``how`` fills each item's formula."""
    rank = RankBreakdown(role=role, ranks=1, moments=moments_of(steps, how), outside=outside,
                         unmodelled=unmodelled, notes=notes)
    return Breakdown(source=source, model=model, recipe=recipe, device=device, ranks=(rank,))


def module_table(moment: Moment) -> list[dict[str, Any]]:
    """Rows ``{"module", <category>: bytes..., "total"}`` of a moment, in timeline order of
    first appearance, for 'which layer holds what at the peak'."""
    rows: dict[str, dict[str, Any]] = {}
    for it in moment.items:
        row = rows.setdefault(it.name, {"module": it.name, **{str(c): 0 for c in Category}})
        row[str(it.category)] += it.bytes
    for row in rows.values():
        row["total"] = sum(row[str(c)] for c in Category)
    return list(rows.values())
