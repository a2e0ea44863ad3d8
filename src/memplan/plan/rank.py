"""Order evaluated candidates: the fastest that fit, the Pareto front of headroom against
speed, and for each rejected family why it was rejected and the nearest change that fits."""

from __future__ import annotations

from dataclasses import dataclass, replace
from operator import ne
from typing import Any

from .evaluate import Evaluated
from .space import SEARCHED

__all__ = ["FAMILY_KEYS", "Rejected", "ranked", "pareto", "rejected_families"]

FAMILY_KEYS = ("engine", "zero", "hybrid_shard", "offload", "tp", "sequence_parallel", "pp",
               "pp_virtual", "cp", "ep")
"""A family: how the model and its states are split and where they live. Within a family
plan varies micro-batch, checkpointing, kernel and loss."""


def _speed(e: Evaluated) -> float:
    return e.tokens_per_second if e.tokens_per_second is not None else 0.0


def ranked(rows: list[Evaluated]) -> list[Evaluated]:
    """Candidates that fit (GPU, host RAM, NVMe), fastest first; ties: more headroom first."""
    return sorted((e for e in rows if e.fits), key=lambda e: (-_speed(e), -e.headroom_bytes))


def pareto(rows: list[Evaluated]) -> list[Evaluated]:
    """Fitting candidates no other fitting candidate beats on both headroom and speed, fastest
    first."""
    front: list[Evaluated] = []
    best_headroom = None
    for e in ranked(rows):  # speed descending: keep those with more headroom than all faster
        if best_headroom is None or e.headroom_bytes > best_headroom:
            front.append(e)
            best_headroom = e.headroom_bytes
    return front


def _distance(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
    """Keys in which ``a`` and ``b`` differ."""
    return sum(map(ne, a, b))


@dataclass(frozen=True, kw_only=True, slots=True)
class Rejected:
    """A family none of whose candidates fit."""

    family: dict[str, Any]
    """The family's keys (``FAMILY_KEYS``)."""
    closest: Evaluated
    """Its candidate that overflows least (summed over GPU, host RAM, NVMe)."""
    nearest_fit: Evaluated | None
    """The fitting candidate that differs from ``closest`` in the fewest recipe keys (the
    fastest of those); None when nothing fits."""
    candidates: int
    """How many of the family's candidates were evaluated."""

    def change(self) -> dict[str, tuple[Any, Any]]:
        """key -> (closest's value, nearest fit's value)."""
        if self.nearest_fit is None:
            return {}
        a, b = self.closest.recipe.to_dict(), self.nearest_fit.recipe.to_dict()
        return {k: (a[k], b[k]) for k in a if k not in ("notes", "dp") and a[k] != b[k]}

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "candidates": self.candidates,
                "overflows": [{"what": w, "bytes": n} for w, n in self.closest.overflows()],
                "closest": self.closest.to_dict(),
                "nearest_change": {k: {"from": v[0], "to": v[1]}
                                   for k, v in self.change().items()},
                "nearest_fit_tokens_per_second": (self.nearest_fit.tokens_per_second
                                                  if self.nearest_fit else None)}


def rejected_families(rows: list[Evaluated], explain: int = 50) -> list[Rejected]:
    """One entry per family with no fitting candidate, least overflowing first; the nearest
    fitting change is searched for the first ``explain`` of them (it compares with every
    fitting candidate)."""
    fams: dict[tuple[Any, ...], list[Evaluated]] = {}
    searched: dict[int, tuple[Any, ...]] = {}  # id(row) -> its SEARCHED values
    at = [SEARCHED.index(k) for k in FAMILY_KEYS]
    for e in rows:
        values = searched[id(e)] = e.recipe.values(SEARCHED)
        fams.setdefault(tuple([values[i] for i in at]), []).append(e)
    out = []
    for key, members in fams.items():
        if any(e.fits for e in members):
            continue
        closest = min(members, key=lambda e: sum(n for _, n in e.overflows()))
        out.append(Rejected(family=dict(zip(FAMILY_KEYS, key)), closest=closest,
                            nearest_fit=None, candidates=len(members)))
    out.sort(key=lambda r: sum(n for _, n in r.closest.overflows()))
    fitting = [(f, searched[id(f)]) for f in ranked(rows)]
    if not fitting:
        return out
    fit_values = {fd for _, fd in fitting}
    for i, r in enumerate(out[:explain]):
        out[i] = replace(r, nearest_fit=_nearest(searched[id(r.closest)], fitting, fit_values))
    return out


def _nearest(d: tuple[Any, ...], fitting: list[tuple[Evaluated, tuple[Any, ...]]],
             fit_values: set[tuple[Any, ...]]) -> Evaluated:
    """``min(fitting, key=(_distance to d, -speed))``: ``fitting`` is fastest first, so the
    first row at the least distance; the scan stops at a row no other can beat (distance 0,
    or 1 when ``d`` is not among the fitting rows' values)."""
    floor = 0 if d in fit_values else 1
    best, near = len(d) + 1, fitting[0][0]
    for f, fd in fitting:
        dist = _distance(d, fd)
        if dist < best:
            best, near = dist, f
            if dist == floor:
                break
    return near
