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
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...model.spec import ModelSpec
from .graph import Point

__all__ = ["compose", "signatures"]

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


def _role(region: str, start: int, n: int) -> tuple[str, int] | None:
    """(role, middle index) of a region in a short simulation of layers start..start+n-1."""
    if not region.startswith("layer "):
        return ("other:" + region, 0)
    j = int(region[6:]) - start
    if j == 0:
        return ("first", 0)
    if j == n - 1:
        return ("last", 0)
    return ("mid", j)


def _table(points: list[Point], start: int, n: int) -> list[tuple[str, str, int, Vec]]:
    out = []
    for p in points:
        r = _role(p.region, start, n)
        assert r is not None
        out.append((p.phase, r[0], r[1], _vec(p)))
    return out


def _layer_block(n: int, backward: bool) -> list[tuple[str, int]]:
    block = [("first", 0)] + [("mid", j) for j in range(1, n - 1)] + [("last", 0)]
    return block[::-1] if backward else block


def _split(roles: list[tuple[str, str, int]], n: int
           ) -> dict[str, tuple[list[str], list[str]]] | None:
    """Per phase, the non-layer roles before and after the layer block; None unless each phase
    holds exactly one block of the ``n`` layers in simulation order."""
    out = {}
    for ph in ("forward", "backward"):
        mine = [(role, j) for p, role, j in roles if p == ph]
        idx = [i for i, (role, _) in enumerate(mine) if not role.startswith("other:")]
        if not idx or mine[idx[0]:idx[-1] + 1] != _layer_block(n, ph == "backward"):
            return None
        out[ph] = ([r for r, _ in mine[:idx[0]]], [r for r, _ in mine[idx[-1] + 1:]])
    if [p for p, _, _ in roles] != sorted((p for p, _, _ in roles), key=("forward",
                                                                          "backward").index):
        return None
    return out


def _layout(parts: dict[str, tuple[list[str], list[str]]], n: int) -> list[tuple[str, str, int]]:
    """(phase, role, middle index) in simulation order for ``n`` layers."""
    out = []
    for ph in ("forward", "backward"):
        before, after = parts[ph]
        out += [(ph, r, 0) for r in before]
        out += [(ph, r, j) for r, j in _layer_block(n, ph == "backward")]
        out += [(ph, r, 0) for r in after]
    return out


def compose(simulate: Simulate, start: int, length: int) -> tuple[list[Point], int] | None:
    """Points of layers ``start .. start + length - 1`` (identical) from short simulations
    ``simulate(n)``, n = M, M+1, M+2; None when the short simulations do not follow the
    affine form exactly (the caller then simulates the stage)."""
    if length <= M + 2:
        return None
    runs = {n: simulate(n) for n in (M, M + 1, M + 2)}
    tables = {n: _table(pts, 0, n) for n, (pts, _) in runs.items()}
    parts = _split([(ph, role, j) for ph, role, j, _ in tables[M]], M)
    if parts is None:
        return None
    for n, t in tables.items():
        if [(ph, role, j) for ph, role, j, _ in t] != _layout(parts, n):
            return None
    grads = {n: g for n, (_, g) in runs.items()}
    if grads[M + 2] - grads[M + 1] != grads[M + 1] - grads[M]:
        return None
    # affine parameters, from M and M + 1; checked on all three
    by = {n: {(ph, role, j): v for ph, role, j, v in t} for n, t in tables.items()}
    slopes = {k: _sub(by[M + 1][k], v) for k, v in by[M].items() if k[1] != "mid"}
    mids = {ph: (by[M][(ph, "mid", 1)],
                 _sub(by[M + 1][(ph, "mid", 2)], by[M + 1][(ph, "mid", 1)]),
                 _sub(by[M + 1][(ph, "mid", 1)], by[M][(ph, "mid", 1)]))
            for ph in ("forward", "backward")}

    def value(k: tuple[str, str, int], n: int) -> Vec:
        ph, role, j = k
        if role == "mid":
            a, b, c = mids[ph]
            return _add(_add(a, b, j - 1), c, n - M)
        return _add(by[M][(ph, role, 0)], slopes[(ph, role, 0)], n - M)

    for n in (M, M + 1, M + 2):
        if any(value(k, n) != v for k, v in by[n].items()):
            return None
    out = []
    for k in _layout(parts, length):
        ph, role, j = k
        if role == "first":
            region = f"layer {start}"
        elif role == "last":
            region = f"layer {start + length - 1}"
        elif role == "mid":
            region = f"layer {start + j}"
        else:
            region = role[len("other:"):]
        s, t, g = value(k, length)
        out.append(Point(ph, region, s, t, g))
    return out, grads[M] + (length - M) * (grads[M + 1] - grads[M])
