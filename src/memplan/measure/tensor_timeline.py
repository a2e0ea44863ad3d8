"""The tensor timeline of one measured step: bytes per category in buckets of tracker events,
each bucket represented by its highest point, so no spike (and not the peak) is lost."""

from __future__ import annotations

from ..breakdown import Category
from ..runtime.tracker import StorageTracker, Window

__all__ = ["timeline_points"]


def timeline_points(t: StorageTracker, w: Window, t0: float,
                    points: int) -> list[tuple[float, dict[str, int]]]:
    """(seconds since ``t0``, bytes per category) of step window ``w``, at most ``points``."""
    assert t.times is not None
    out: list[tuple[float, dict[str, int]]] = []
    live: set[int] = set(w.start_live)
    cats = dict.fromkeys((str(c) for c in Category), 0)
    for uid in live:
        cats[t.recs[uid].category()] += t.recs[uid].nbytes
    total = sum(cats.values())
    n = len(t.events) - w.start_idx
    every = max(1, -(-n // points))
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
            best = (total, t.times[k] - t0, dict(cats))
        if (k - w.start_idx + 1) % every == 0 or k + 1 == len(t.events):
            out.append((best[1], best[2]))
            best = None
    return out
