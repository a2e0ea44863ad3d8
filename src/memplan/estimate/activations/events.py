"""The autograd simulator's allocations and frees, in order, for the allocator replay
(``estimate/reserved.py``).

``graph.simulate`` keeps its tensors in ``_State.live`` and counts parameter gradients in
``_State.grads``; ``Recording`` is a ``_State`` whose ``live`` records each tensor entering and
leaving it, whose ``grads`` records each parameter gradient as one tensor, and whose ``mark``
records the bytes an op holds only while it runs (``extra_temp``: a gradient computed before
being added in place, a cast, a backward's scratch) as one tensor allocated and freed there.
The simulator itself is unchanged: a plain ``simulate`` keeps its plain dict and int.
"""

from __future__ import annotations

from .graph import Graph, Tensor, _State, simulate

__all__ = ["Event", "Recording", "record"]

Event = tuple[object, int, str]
"""(key, bytes, kind): bytes > 0 allocates the tensor ``key``, 0 frees it; kind ``grad`` for a
parameter gradient (kept until ``zero_grad``), '' otherwise."""


class _Live(dict):  # type: ignore[type-arg]
    """``_State.live`` (tensor -> saved) recording every tensor that enters or leaves."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__()
        self.events = events

    def __setitem__(self, t: Tensor, saved: bool) -> None:
        if t not in self and t.nbytes:
            self.events.append((id(t), t.nbytes, ""))
        dict.__setitem__(self, t, saved)

    def pop(self, t: Tensor, default: object = None) -> object:  # type: ignore[override]
        if t in self and t.nbytes:
            self.events.append((id(t), 0, ""))
        return dict.pop(self, t, default)


class Recording(_State):
    """A simulator state that records its allocations and frees in ``events``."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._grads = 0
        super().__init__()
        self.live = _Live(self.events)

    @property  # type: ignore[override]
    def grads(self) -> int:
        return self._grads

    @grads.setter
    def grads(self, value: int) -> None:
        if value > self._grads:  # one parameter's gradient (``simulate``: grads += b32 or b)
            self.events.append((("grad", len(self.events)), value - self._grads, "grad"))
        self._grads = value

    def mark(self, phase: str, region: str, extra_temp: int = 0) -> None:
        if extra_temp > 0:
            key = ("op scratch", len(self.events))
            self.events += [(key, extra_temp, ""), (key, 0, "")]
        super().mark(phase, region, extra_temp)


def record(graph: Graph) -> list[Event]:
    """``simulate(graph)``'s allocations and frees, in order."""
    st = Recording()
    simulate(graph, st)
    return st.events
