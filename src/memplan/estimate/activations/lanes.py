"""One op graph for several micro-batch sizes at once (for callers that estimate many recipes:
``memplan plan``), exact by construction.

A graph builder (``families.py``, ``blocks.py``) given ``Ctx(batch=Lanes((1, 2, 4)))``
computes every size as a ``Lanes``: the tuple of the sizes the builder computes for each
micro-batch alone, operation by operation (``+``, ``*``, ``//``, ``max``, ``math.ceil``, ...
applied lane by lane, so each lane is bit for bit the builder's own integer or float). Where
the builder *decides* on a size (``if``, ``==``, ``<``, ``max`` of two sizes), the decision is
taken only when every lane decides alike; otherwise, or on any operation ``Lanes`` does not
define (``int()``, formatting, hashing), the build raises and the caller builds each
micro-batch alone. So a graph built with lanes is, lane by lane, the graph each micro-batch
builds: the same ops, the same tensors, each tensor's size its lane's.

``simulate_lanes`` then replays that one graph for every lane together: a size is packed into
one Python integer, ``FIELD`` bits per lane (sums and differences of packed integers are the
lanes' sums and differences while no lane is negative or overflows its field: every running
sum of the simulator is a sum of live sizes, at least 0). The simulator's only size-dependent
decisions are whether a tensor is empty (checked to be the same in every lane before packing)
and the largest instant of each region, which ``_LaneState`` takes lane by lane. The points of
lane ``j`` are ``graph.simulate``'s points of lane ``j``'s graph (``tests/test_plan_lanes.py``
compares them).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from .graph import Graph, Op, Point, Tensor, _State, simulate

__all__ = ["Lanes", "Split", "lane", "simulate_lanes", "to_float", "to_int"]


class Split(Exception):
    """The lanes would take different branches (or a size is used as a lanes value cannot be):
    build each micro-batch alone."""


def _lanewise(fn: Callable[[Any, Any], Any]) -> Callable[[Lanes, Any], Lanes]:
    def op(self: Lanes, other: Any) -> Lanes:
        if other.__class__ is Lanes:
            return Lanes(tuple(map(fn, self.v, other.v)))
        return Lanes(tuple([fn(a, other) for a in self.v]))
    return op


def _rlanewise(fn: Callable[[Any, Any], Any]) -> Callable[[Lanes, Any], Lanes]:
    def op(self: Lanes, other: Any) -> Lanes:
        return Lanes(tuple([fn(other, a) for a in self.v]))
    return op


def _decide(fn: Callable[[Any, Any], bool]) -> Callable[[Lanes, Any], bool]:
    def op(self: Lanes, other: Any) -> bool:
        vals = other.v if other.__class__ is Lanes else (other,) * len(self.v)
        got = {fn(a, b) for a, b in zip(self.v, vals)}
        if len(got) != 1:
            raise Split(f"lanes decide differently on {fn.__name__}")
        return got.pop()
    return op


class Lanes:
    """Per-lane values of one size (one lane per micro-batch)."""

    __slots__ = ("v",)
    __hash__ = None  # type: ignore[assignment]  # a size used as a key: build lane by lane

    def __init__(self, v: tuple[Any, ...]) -> None:
        self.v = v

    __add__ = _lanewise(operator.add)
    __radd__ = _rlanewise(operator.add)
    __sub__ = _lanewise(operator.sub)
    __rsub__ = _rlanewise(operator.sub)
    __mul__ = _lanewise(operator.mul)
    __rmul__ = _rlanewise(operator.mul)
    __floordiv__ = _lanewise(operator.floordiv)
    __rfloordiv__ = _rlanewise(operator.floordiv)
    __truediv__ = _lanewise(operator.truediv)
    __rtruediv__ = _rlanewise(operator.truediv)
    __mod__ = _lanewise(operator.mod)
    __lshift__ = _lanewise(operator.lshift)
    __rlshift__ = _rlanewise(operator.lshift)
    __eq__ = _decide(operator.eq)  # type: ignore[assignment]
    __ne__ = _decide(operator.ne)  # type: ignore[assignment]
    __lt__ = _decide(operator.lt)
    __le__ = _decide(operator.le)
    __gt__ = _decide(operator.gt)
    __ge__ = _decide(operator.ge)

    def __neg__(self) -> Lanes:
        return Lanes(tuple([-a for a in self.v]))

    def __ceil__(self) -> Lanes:
        return Lanes(tuple([math.ceil(a) for a in self.v]))

    def __floor__(self) -> Lanes:
        return Lanes(tuple([math.floor(a) for a in self.v]))

    def bit_length(self) -> Lanes:
        return Lanes(tuple([a.bit_length() for a in self.v]))

    def __bool__(self) -> bool:
        got = {bool(a) for a in self.v}
        if len(got) != 1:
            raise Split("lanes decide differently on truth")
        return got.pop()

    def __index__(self) -> int:
        raise Split("a size used as an index")

    def __int__(self) -> int:
        raise Split("int() of lanes (use to_int)")

    def __float__(self) -> float:
        raise Split("float() of lanes")

    def __format__(self, spec: str) -> str:
        raise Split("a size formatted into text")

    def __str__(self) -> str:
        raise Split("a size formatted into text")

    __repr__ = __str__


def to_int(x: Any) -> Any:
    """``int(x)``, lane by lane for ``Lanes`` (``Blocks.new``)."""
    if x.__class__ is Lanes:
        return Lanes(tuple([int(a) for a in x.v]))
    return int(x)


def to_float(x: Any) -> Any:
    """``float(x)``, lane by lane for ``Lanes`` (``traffic.py``)."""
    if x.__class__ is Lanes:
        return Lanes(tuple([float(a) for a in x.v]))
    return float(x)


def lane(x: Any, j: int) -> Any:
    """Lane ``j`` of ``x`` (a value that does not depend on the batch: ``x`` itself)."""
    return x.v[j] if x.__class__ is Lanes else x


FIELD = 96
"""Bits per lane of a packed size (2^96 bytes: no simulated sum comes near)."""


def _packer(k: int) -> Callable[[Any], int]:
    shifts = tuple(FIELD * j for j in range(k))
    ones = sum(1 << s for s in shifts)
    lshift = operator.lshift

    def pack(x: Any) -> int:
        if x.__class__ is Lanes:
            v = x.v
            if len(v) != k or min(v) < 0 or (0 in v and any(v)):
                raise Split("a size negative, or empty in some lanes only")
            return sum(map(lshift, v, shifts))  # a float lane: TypeError
        if x.__class__ is not int or x < 0:
            raise Split("a size that is not a non-negative integer")
        return x * ones
    return pack


def _lane_values(x: Any, k: int) -> tuple[int, ...]:
    return x.v if x.__class__ is Lanes else (x,) * k


def _pack_graph(graph: Graph, k: int) -> None:
    """Replace every size of ``graph`` (built with lanes) by its packed integer, in place."""
    if graph.stash is not None:  # a float fraction of the inputs' bytes: not additive
        raise Split("DeepSpeed stash")
    pack = _packer(k)
    seen: set[Tensor] = set()
    add = seen.add
    for op in graph.ops:
        for ts in (op.inputs, op.outputs, op.saves, op.grad_inputs, op.holds):
            for t in ts:
                if t not in seen:
                    add(t)
                    t.nbytes = pack(t.nbytes)
        if op.param_grads:
            pg = []
            for b, b32 in op.param_grads:
                if b.__class__ is Lanes or b32.__class__ is Lanes:  # compared with each other
                    raise Split("a parameter gradient that depends on the batch")
                pg.append((pack(b), pack(b32)))
            op.param_grads = tuple(pg)
        op.bwd_temp = pack(op.bwd_temp)


class _LaneState(_State):
    """``_State`` whose sizes are packed lanes; each region's largest instant is taken per
    lane (``_State.mark``'s rule: the first instant with the largest total)."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.mask = (1 << FIELD) - 1
        self.shifts = tuple(FIELD * j for j in range(k))
        self.high = sum(1 << (s + FIELD - 1) for s in self.shifts)
        """The top bit of every lane: a lane's value stays far below it (``FIELD``)."""
        self.ones = sum(1 << s for s in self.shifts)
        self.lane_best: dict[tuple[str, str], int] = {}
        """Each region's largest total so far, per lane, packed."""
        self.lane_at: dict[tuple[str, str], list[tuple[int, int, int]]] = {}

    def mark(self, phase: str, region: str, extra_temp: int = 0) -> None:
        key = (phase, region)
        best = self.lane_best.get(key)
        if best is None:
            best = self.lane_best[key] = 0
            self.lane_at[key] = [(0, 0, 0)] * self.k
            self.order.append(key)
            self.points[key] = None  # type: ignore[assignment]  # simulate's return: unused
        temp = self.temp + extra_temp
        total = self.saved + temp + self.grads
        # the lanes where total > best, all at once: with each lane's top bit set on the left,
        # subtracting best + 1 leaves that bit set exactly where no borrow crossed it, i.e.
        # where the lane's total is at least its best + 1 (every lane value is below the bit)
        above = ((total | self.high) - (best + self.ones)) & self.high
        if not above:
            return
        if above == self.high:  # every lane: the whole total is the new best
            self.lane_best[key] = total
            self.lane_at[key] = [(self.saved, temp, self.grads)] * self.k
            return
        mask, at = self.mask, self.lane_at[key]
        for j, s in enumerate(self.shifts):
            if above >> (s + FIELD - 1) & 1:
                best = best & ~(mask << s) | (total & (mask << s))
                at[j] = (self.saved, temp, self.grads)
        self.lane_best[key] = best

    def forward(self, ops: list[Op], phase: str, held: dict[Tensor, int], *,
                hold_kept: bool) -> None:
        """``graph._run_forward`` with ``mark`` per lane."""
        last_use: dict[Tensor, int] = {}
        for i, op in enumerate(ops):
            for t in op.inputs + op.holds:
                last_use[t] = i
        get, used = held.get, last_use.get
        live, pop = self.live, self.live.pop
        for i, op in enumerate(ops):
            for t in op.outputs:
                if not t.external and t not in live:
                    if get(t):
                        live[t] = True
                        self.saved += t.nbytes
                    else:
                        live[t] = False
                        self.temp += t.nbytes
            self.mark(phase, op.region)
            for ts in (op.inputs, op.outputs, op.holds):
                for t in ts:
                    if used(t, -1) <= i and not (hold_kept and t.keep) and not get(t):
                        was = pop(t, None)
                        if was is not None:
                            if was:
                                self.saved -= t.nbytes
                            else:
                                self.temp -= t.nbytes

    def lane_points(self, j: int) -> list[Point]:
        s, mask = self.shifts[j], self.mask
        out = []
        for key in self.order:
            saved, temp, grads = self.lane_at[key][j]
            out.append(Point(key[0], key[1], (saved >> s) & mask, (temp >> s) & mask,
                             (grads >> s) & mask))
        return out


def simulate_lanes(graph: Graph, k: int) -> list[tuple[list[Point], int]]:
    """Per lane, ``(simulate(g), g.param_grad_bytes)`` of that lane's graph, from ``graph``
    built with ``k`` lanes (its sizes are packed in place: the graph is spent).

    Raises:
        Split: the graph cannot be replayed in lanes (the caller simulates lane by lane).
    """
    grads = _lane_values(graph.param_grad_bytes, k)
    _pack_graph(graph, k)
    st = _LaneState(k)
    simulate(graph, st)
    return [(st.lane_points(j), grads[j]) for j in range(k)]

