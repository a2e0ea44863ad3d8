"""The points of a long stage of identical layers from three short simulations (for callers that
estimate many recipes: ``memplan plan``).

A stage of ``L`` identical layers replays the same ops ``L`` times: each layer adds the same
saved bytes in the forward, the same gradient bytes in the backward. So each point of the
simulation is affine in the layer counts: the points before and after the layers (embedding,
head, loss), and the first and last layer's, are ``v(L) = v(m) + (L - m) * d``; a middle layer
``j``'s are ``v(j, L) = v(1, m) + (j - 1) * b + (L - m) * c``. ``compose`` simulates the stage
with ``m``, ``m + 1`` and ``m + 2`` layers (``m = 3``), reads ``d``, ``b`` and ``c`` off them,
*checks* that all three short simulations obey the form, and only then writes the ``L``-layer
points; a check that fails returns None and the caller simulates the whole stage. The short
simulations are kept under keys without the stage's position, so every pipeline degree reuses
them (regions are relabelled).

A policy that treats the layers periodically (``full`` on every ``k``-th layer of the stage,
torchtitan's layer SAC) repeats a *unit* of ``k`` layers instead: the same form holds per unit
(``L = u k + r``: ``u`` units, then ``r`` layers that are never checkpointed), with the counts
in units and one ``d``, ``b``, ``c`` per layer of the unit; the short simulations have ``m``,
``m + 1`` and ``m + 2`` units plus the ``r`` layers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...model.spec import ModelSpec
from .graph import Point

__all__ = ["compose", "short_lengths", "signatures"]

M = 3
"""Layers of the smallest short simulation (first, one middle, last layer)."""

Vec = tuple[int, int, int]
Simulate = Callable[[int], tuple[list[Point], int]]
"""Points (layers labelled ``layer 0 .. n-1``) and gradient bytes of a stage of ``n`` layers."""


def signatures(spec: ModelSpec, memo: dict[Any, Any]) -> tuple[int, ...]:
    """Per layer, a small int equal for layers the graph builder cannot tell apart: same kind,
    attention, FFN, norm, attention-mask kind and tensors (names without their layer index)."""
    key = ("signatures",)
    if key not in memo:
        kinds = spec.traits.layer_types if spec.traits is not None else ()
        ids: dict[Any, int] = {}
        out = []
        for i, ly in enumerate(spec.layers):
            tensors = tuple(replace(t, name=re.sub(r"\d+", "#", t.name)) for t in ly.tensors)
            sig = (ly.kind, ly.attention, ly.ffn, ly.norm, tensors,
                   kinds[i] if i < len(kinds) else "full_attention")
            out.append(ids.setdefault(sig, len(ids)))
        memo[key] = tuple(out)
    return memo[key]  # type: ignore[no-any-return]


def _vec(p: Point) -> Vec:
    return (p.saved, p.temp, p.grads)


def _add(a: Vec, b: Vec, k: int = 1) -> Vec:
    return (a[0] + k * b[0], a[1] + k * b[1], a[2] + k * b[2])


def _sub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


Role = tuple[str, int, int]
"""(kind, unit index of a middle unit else 0, layer within the unit): kind ``first``, ``mid``,
``last`` (units), ``tail`` (the ``r`` layers after the units) or ``other:<region>``."""


def _role(region: str, units: int, period: int) -> Role:
    """The role of a region in a short simulation of ``units`` units of ``period`` layers
    (regions relabelled from ``layer 0``)."""
    if not region.startswith("layer "):
        return ("other:" + region, 0, 0)
    a, o = divmod(int(region[6:]), period)
    if a >= units:
        return ("tail", 0, o)
    if a == 0:
        return ("first", 0, o)
    if a == units - 1:
        return ("last", 0, o)
    return ("mid", a, o)


def _table(points: list[Point], units: int, period: int) -> list[tuple[str, Role, Vec]]:
    return [(p.phase, _role(p.region, units, period), _vec(p)) for p in points]


def _layer_block(units: int, period: int, tail: int, backward: bool) -> list[Role]:
    block = ([("first", 0, o) for o in range(period)]
             + [("mid", a, o) for a in range(1, units - 1) for o in range(period)]
             + [("last", 0, o) for o in range(period)] + [("tail", 0, o) for o in range(tail)])
    return block[::-1] if backward else block


def _split(roles: list[tuple[str, Role]], units: int, period: int, tail: int
           ) -> dict[str, tuple[list[Role], list[Role]]] | None:
    """Per phase, the non-layer roles before and after the layer block; None unless each phase
    holds exactly one block of the layers in simulation order."""
    out = {}
    for ph in ("forward", "backward"):
        mine = [role for p, role in roles if p == ph]
        idx = [i for i, role in enumerate(mine) if not role[0].startswith("other:")]
        if not idx or mine[idx[0]:idx[-1] + 1] != _layer_block(units, period, tail,
                                                                ph == "backward"):
            return None
        out[ph] = (mine[:idx[0]], mine[idx[-1] + 1:])
    if [p for p, _ in roles] != sorted((p for p, _ in roles), key=("forward",
                                                                   "backward").index):
        return None
    return out


def _layout(parts: dict[str, tuple[list[Role], list[Role]]], units: int, period: int,
            tail: int) -> list[tuple[str, Role]]:
    """(phase, role) in simulation order for ``units`` units."""
    out = []
    for ph in ("forward", "backward"):
        before, after = parts[ph]
        out += [(ph, r) for r in before]
        out += [(ph, r) for r in _layer_block(units, period, tail, ph == "backward")]
        out += [(ph, r) for r in after]
    return out


def short_lengths(length: int, period: int = 1) -> tuple[int, ...]:
    """The layer counts of the short simulations ``compose`` runs for a stage of ``length``
    layers (``()``: too short to compose). A caller compares their new layers with ``length``
    (the whole stage's simulation) to run the cheaper of the two: both give the same points."""
    units, tail = divmod(length, period)
    if units <= M + 2:
        return ()
    return tuple(u * period + tail for u in (M, M + 1, M + 2))


def compose(simulate: Simulate, start: int, length: int, period: int = 1
            ) -> tuple[list[Point], int] | None:
    """Points of layers ``start .. start + length - 1`` (identical, treated alike every
    ``period`` layers) from short simulations ``simulate(n)`` of ``n = u * period + r``
    layers, u = M, M+1, M+2 units and ``r = length % period``; None when the short
    simulations do not follow the affine form exactly (the caller then simulates the stage)."""
    units, tail = divmod(length, period)
    if units <= M + 2:
        return None
    runs = {u: simulate(u * period + tail) for u in (M, M + 1, M + 2)}
    tables = {u: _table(pts, u, period) for u, (pts, _) in runs.items()}
    parts = _split([(ph, role) for ph, role, _ in tables[M]], M, period, tail)
    if parts is None:
        return None
    for u, t in tables.items():
        if [(ph, role) for ph, role, _ in t] != _layout(parts, u, period, tail):
            return None
    grads = {u: g for u, (_, g) in runs.items()}
    if grads[M + 2] - grads[M + 1] != grads[M + 1] - grads[M]:
        return None
    # affine parameters, from M and M + 1; checked on all three
    by = {u: {(ph, role): v for ph, role, v in t} for u, t in tables.items()}
    slopes = {k: _sub(by[M + 1][k], v) for k, v in by[M].items() if k[1][0] != "mid"}
    mids = {(ph, o): (by[M][(ph, ("mid", 1, o))],
                      _sub(by[M + 1][(ph, ("mid", 2, o))], by[M + 1][(ph, ("mid", 1, o))]),
                      _sub(by[M + 1][(ph, ("mid", 1, o))], by[M][(ph, ("mid", 1, o))]))
            for ph in ("forward", "backward") for o in range(period)}

    def value(k: tuple[str, Role], u: int) -> Vec:
        ph, (kind, j, o) = k
        if kind == "mid":
            a, b, c = mids[(ph, o)]
            return _add(_add(a, b, j - 1), c, u - M)
        return _add(by[M][k], slopes[k], u - M)

    for u in (M, M + 1, M + 2):
        if any(value(k, u) != v for k, v in by[u].items()):
            return None
    out = []
    for k in _layout(parts, units, period, tail):
        ph, (kind, j, o) = k
        if kind == "first":
            region = f"layer {start + o}"
        elif kind == "last":
            region = f"layer {start + (units - 1) * period + o}"
        elif kind == "mid":
            region = f"layer {start + j * period + o}"
        elif kind == "tail":
            region = f"layer {start + units * period + o}"
        else:
            region = kind[len("other:"):]
        s, t, g = value(k, units)
        out.append(Point(ph, region, s, t, g))
    return out, grads[M] + (units - M) * (grads[M + 1] - grads[M])
