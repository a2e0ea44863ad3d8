"""Step measurements (``live.py``) -> ``Breakdown``, the result type the estimator returns.

Step 0 becomes the ``first`` step of the timeline, the last measured step the ``steady`` one.
Every moment lists one ``Item`` per (module group, category) live at the moment's peak, so the
peak moment says which layer holds what; ``module_table`` pivots it. Needs no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..breakdown import Breakdown, Category, Item, Moment, Phase, RankBreakdown, Step
from ..results import DeviceInfo, ModelInfo

__all__ = ["moments_of", "to_breakdown", "module_table", "ALL_GROUPS"]

ALL_GROUPS = "(all)"
"""Item name used when storages were not credited to module groups."""


class _MomentLike(Protocol):
    label: str
    phase: str
    peak_bytes: int
    by_owner: dict[str, dict[str, int]]


class _StepLike(Protocol):
    step: int
    moments: tuple[Any, ...]


def _moment(step: Step, m: _MomentLike, how: str) -> Moment:
    items = tuple(
        Item(category=Category(cat), name=owner or ALL_GROUPS, bytes=b, formula=how)
        for owner, cats in m.by_owner.items() for cat, b in cats.items() if b
    )
    return Moment(step=step, phase=Phase(m.phase), label=m.label, items=items)


def moments_of(steps: Sequence[_StepLike], how: str) -> tuple[Moment, ...]:
    """The timeline: step 0's moments as ``first``, the last step's as ``steady``."""
    if not steps:
        raise ValueError("no measured steps")
    out = [_moment(Step.FIRST, m, how) for m in steps[0].moments]
    if len(steps) > 1:
        out += [_moment(Step.STEADY, m, how) for m in steps[-1].moments]
    return tuple(out)


def to_breakdown(steps: Sequence[_StepLike], *, source: str, how: str, model: ModelInfo,
                 recipe: dict[str, Any], device: DeviceInfo, role: str = "every rank",
                 outside: tuple[Item, ...] = (), unmodelled: tuple[Category, ...] = (),
                 notes: tuple[str, ...] = ()) -> Breakdown:
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
