"""A tiny autograd simulator: which tensors exist at each op of a training step.

A ``Graph`` is the forward pass of one pipeline stage written as ATen-level ops (``blocks.py``
writes them the way Hugging Face Transformers' modelling code and PyTorch's derivative formulas
run them). Each op declares the tensors it creates, the tensors autograd saves for its backward
(``tools/autograd/derivatives.yaml`` in PyTorch) and the inputs and parameters that receive a
gradient. ``simulate`` then replays the step exactly as the autograd engine would:

- forward: an op's outputs are allocated while its inputs are alive; a tensor is freed after its
  last forward use or hold (``Op.holds``) unless saved (or kept until the forward ends: autocast's
  weight cache, the model output);
- activation checkpointing: ops of a checkpointed group keep only the group's inputs; in the
  backward, the group's forward is re-run (saved tensors re-allocated) just before its backward;
  under a selective policy (``torch.utils.checkpoint.create_selective_checkpoint_contexts``)
  the outputs of ops marked ``cached`` are kept from the forward and handed back to the
  recompute instead of being recomputed; with a ``stash`` (DeepSpeed) the group keeps a copy of
  a fraction of its inputs in place of the inputs, re-materialised for the recompute;
- backward, ops in reverse: the gradient of each input is allocated (accumulated in place when a
  tensor feeds several ops), parameter gradients appear (16-bit first, then the fp32 copy under
  autocast), then the op's output gradients and the saved tensors nobody else needs are freed.

Bytes are exact for the ops declared; parameters and the batch are not tracked here (they are
model-state lines). Memory allocated inside a kernel and freed before it returns is not seen,
matching ``memplan.measure`` and ``torch.cuda.max_memory_allocated`` up to kernel scratch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["Tensor", "Op", "Graph", "Point", "simulate"]


@dataclass(eq=False, slots=True)
class Tensor:
    """One storage."""

    nbytes: int
    itemsize: int = 4
    """Bytes per element (4 fp32, 2 bf16/fp16, 8 int64)."""
    grad: bool = True
    """Requires grad (its gradient is computed in the backward)."""
    keep: bool = False
    """Held until the forward ends even when nothing saves it (autocast cache, model output)."""
    external: bool = False
    """Exists outside this graph (batch, rotary tables): never allocated or freed here."""
    held: bool = False
    """Kept on a custom Function's ``ctx``, not by ``save_for_backward``: autograd does not
    release it, so it lives as long as the graph (``FunctionCtx.save_for_backward`` docs)."""


@dataclass(eq=False, slots=True)
class Op:
    region: str
    """Moment label the op belongs to, e.g. ``layer 3``."""
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    saves: tuple[Tensor, ...]
    grad_inputs: tuple[Tensor, ...]
    """Inputs whose gradient this op's backward computes (allocated in the input's size)."""
    param_grads: tuple[tuple[int, int], ...] = ()
    """Per parameter: (bytes of its gradient as computed, bytes after a cast to the parameter's
    dtype or 0 when no cast)."""
    group: int = -1
    """Activation-checkpointing group (-1: none)."""
    kind: str = "ew"
    """What kernel runs it, for the step time (``traffic.py``): ``ew`` a memory-bound kernel
    (elementwise, norm, softmax, copy, reduction), ``mm`` a GEMM (timed by its roofline in
    ``timing/kernels.py``), ``attn`` a fused attention kernel, ``comm`` a collective."""
    cached: bool = False
    """In a group under a selective policy: the outputs are saved in the forward (``MUST_SAVE``)
    and reused by the recompute."""
    origin: str = ""
    """For ``compiled.py``: ``param`` a copy of a parameter (autocast's cast), ``rng`` a random
    op (dropout), ``gemm`` a GEMM timed as memory-bound (LoRA's rank-r matmuls), ``opaque`` a
    library kernel the compiler cannot fuse (bitsandbytes' dequantisation: a ctypes call in
    0.42.0, a ``torch.library`` op later); '' anything else."""
    bwd_temp: int = 0
    """Bytes the op's backward allocates and frees beside the input gradient (bitsandbytes'
    re-dequantised weight, ``Ctx.dequant``)."""
    holds: tuple[Tensor, ...] = ()
    """Tensors a Python frame holds unread at this op (``peft_ops.adapt``): freed after it."""


@dataclass(slots=True)
class Point:
    """Bytes at the largest instant of one region of one phase."""

    phase: str
    region: str
    saved: int = 0
    """Tensors kept for the backward (activations)."""
    temp: int = 0
    """Everything else this graph holds: forward intermediates, activation gradients."""
    grads: int = 0
    """Parameter gradients produced so far (as computed by this graph)."""

    @property
    def total(self) -> int:
        return self.saved + self.temp + self.grads


@dataclass
class Graph:
    """Ops in forward order; build with ``op``."""

    ops: list[Op] = field(default_factory=list)
    region: str = ""
    group: int = -1
    param_grad_bytes: int = 0
    """Total bytes of parameter gradients the graph produces (as computed)."""
    stash: float | None = None
    """DeepSpeed checkpointing: the fraction of each group input's bytes the group keeps on the
    device (1/tp partitioned, 0 on the host) instead of the input; None keeps the input."""
    save_attention: bool = True
    """Per-op policy: fused attention is in the save list (CUDA's flash / efficient kernels;
    CPU's flash kernel is not in torchtitan's list)."""
    accumulate: bool = False
    """Parameter gradients are added into an existing ``.grad`` (``activations.accumulates``):
    each computed gradient (and its cast) is a temporary at its op."""
    tied: tuple[Op, ...] = ()
    """(embedding op, head op) sharing one weight: accumulating, the head's gradient of it
    waits in autograd's input buffer until the embedding's arrives (a temporary between)."""
    _groups: int = 0
    _sac: bool = False
    _mm: int = 0

    @contextmanager
    def checkpoint(self, enabled: bool = True, per_op: bool = False) -> Iterator[None]:
        """Ops written inside form one activation-checkpointing group (nothing nested);
        ``per_op``: torchtitan's per-op policy decides what is kept (``op``'s ``save``)."""
        if not enabled:
            yield
            return
        self.group, self._groups = self._groups, self._groups + 1
        self._sac, self._mm = per_op, 0
        try:
            yield
        finally:
            self.group = -1
            self._sac = False

    def op(self, inputs: tuple[Tensor, ...] | list[Tensor], outputs: tuple[Tensor, ...] = (),
           saves: tuple[Tensor, ...] | list[Tensor] = (), grads: tuple[Tensor, ...] | None = None,
           params: tuple[tuple[int, int], ...] = (), kind: str = "ew", save: str = "",
           origin: str = "", bwd_temp: int = 0) -> None:
        """Append an op; ``kind``: its kernel for the step time (see ``Op.kind``); ``save``: its
        kind for a per-op policy (``mm``: counted, every second one recomputed; ``attention``: a
        fused attention kernel; ``never``: an ``mm`` forced to recompute and not counted; ''
        anything else, recomputed); ``origin``, ``bwd_temp``: see ``Op``."""
        ins = tuple([t for t in inputs if t is not None])
        g = tuple([t for t in (ins if grads is None else grads) if t is not None and t.grad])
        kept = tuple([t for t in saves if t is not None]) if saves else ()
        if ins and not params and not any([t.grad for t in ins]):
            kept = ()  # no input needs a gradient: autograd records no node, saves nothing
        cached = False
        if self._sac and self.group >= 0:
            if save == "mm":
                self._mm += 1
                cached = self._mm % 2 == 1  # "Saves output of all compute ops, except every
                # second mm" (torchtitan _apply_op_sac)
            elif save == "attention":
                cached = self.save_attention
        self.ops.append(Op(self.region, ins, tuple(outputs), kept, g, params, self.group, kind,
                           cached, origin, bwd_temp if g else 0))
        if params:
            self.param_grad_bytes += sum([b32 or b for b, b32 in params])


class _State:
    # Tensors are dict keys by identity (``Tensor`` is ``eq=False``: hashed by ``id``).
    def __init__(self) -> None:
        self.live: dict[Tensor, bool] = {}  # tensor -> saved (True) or temp (False)
        self.saved = self.temp = self.grads = 0
        self.points: dict[tuple[str, str], Point] = {}
        self.best: dict[tuple[str, str], int] = {}  # each point's total, kept beside it
        self.order: list[tuple[str, str]] = []

    def alloc(self, t: Tensor, kind: str) -> None:
        if t.external or t in self.live:
            return
        self.live[t] = saved = kind == "saved"
        if saved:
            self.saved += t.nbytes
        else:
            self.temp += t.nbytes

    def free(self, t: Tensor) -> None:
        saved = self.live.pop(t, None)
        if saved:
            self.saved -= t.nbytes
        elif saved is not None:
            self.temp -= t.nbytes

    def forward(self, ops: list[Op], phase: str, held: dict[Tensor, int], **kw: bool) -> None:
        _run_forward(ops, self, phase, held, **kw)  # lanes._LaneState: marks per lane

    def mark(self, phase: str, region: str, extra_temp: int = 0) -> None:
        key = (phase, region)
        if key not in self.best:
            self.points[key], self.best[key] = Point(phase, region), 0
            self.order.append(key)
        temp = self.temp + extra_temp
        total = self.saved + temp + self.grads
        if total > self.best[key]:
            p = self.points[key]
            p.saved, p.temp, p.grads = self.saved, temp, self.grads
            self.best[key] = total


def simulate(graph: Graph, st: _State | None = None) -> list[Point]:
    """Replay the forward and backward of ``graph``; one ``Point`` per (phase, region), in
    order, each at the region's largest instant. ``st``: a ``_State`` that records (events.py)."""
    ops = graph.ops
    st = _State() if st is None else st
    # Who saves a tensor, outside checkpointed groups (inside one, saves die with the forward,
    # except the outputs a selective policy caches).
    keepers: dict[Tensor, int] = {}
    get = keepers.get
    for op in ops:
        for t in op.saves if op.group < 0 else ():
            keepers[t] = get(t, 0) + 1
        for t in op.outputs if op.cached else ():
            keepers[t] = get(t, 0) + 1
    # Inputs of a checkpointed group are saved by the checkpoint itself.
    group_inputs: dict[int, list[Tensor]] = {}
    made_in: dict[Tensor, int] = {}
    for op in ops:
        for t in op.outputs:
            made_in[t] = op.group
    for op in ops:
        if op.group >= 0:
            for t in op.inputs:
                if made_in.get(t, -1) != op.group and not t.external:
                    lst = group_inputs.setdefault(op.group, [])
                    if t not in lst:
                        lst.append(t)
                        if graph.stash is None:
                            keepers[t] = get(t, 0) + 1
    stashes: set[Tensor] = set()
    if graph.stash is not None:
        ops = _with_stashes(ops, group_inputs, graph.stash, keepers, stashes)

    # -- forward ---------------------------------------------------------------------------
    st.forward(ops, "forward", keepers, hold_kept=True)
    for t in list(st.live):  # forward ends: autocast cache and outputs dropped
        if t.keep and not get(t):
            st.free(t)

    # -- backward --------------------------------------------------------------------------
    grad_of: dict[Tensor, Tensor] = {}
    remaining = dict(keepers)
    group_ops: dict[int, list[Op]] = {}
    for op in ops:
        if op.group >= 0:
            group_ops.setdefault(op.group, []).append(op)
    recomputed: set[int] = set()
    waiting: dict[Tensor, list[Tensor]] = {}  # gradients read by a fused chain, by its link
    held: Tensor | None = None  # a tied head's gradient (``Graph.tied``)
    last = ops[-1] if ops else None
    tied = graph.tied
    accumulate = graph.accumulate
    for op in reversed(ops):
        if op.group >= 0 and op.group not in recomputed:
            recomputed.add(op.group)
            if graph.stash is not None:  # DeepSpeed gathers / copies the full inputs back
                for t in group_inputs.get(op.group, []):
                    if t in stashes:
                        continue
                    st.alloc(t, "saved")
                    remaining[t] = remaining.get(t, 0) + 1
            _recompute(group_ops[op.group], st, remaining)
        flowing = op is last
        if not flowing:
            for t in op.outputs:
                if t in grad_of:
                    flowing = True
                    break
        cast = 0
        tied_head = accumulate and tied and op is tied[1]
        if flowing:
            extra = op.bwd_temp
            for t in op.grad_inputs:
                if t in grad_of:
                    extra += t.nbytes  # computed, then added in place into the buffer
                else:
                    g = Tensor(t.nbytes, t.itemsize)
                    grad_of[t] = g
                    st.alloc(g, "temp")
            for b, b32 in op.param_grads:
                if tied_head and b == max(p[0] for p in op.param_grads) and held is None:
                    held = Tensor(b32 or b)  # in the input buffer until the embedding's
                    st.alloc(held, "temp")
                    cast += b if b32 else 0  # the 16-bit gradient beside its fp32 copy
                    st.grads += b32 or b
                    continue
                extra += b if b32 or accumulate else 0
                # accumulating, the cast (a node of its own) runs after this op has freed its
                # saves: the 16-bit gradient and its fp32 copy, until AccumulateGrad adds it
                cast += b + b32 if b32 and accumulate else 0
                st.grads += b32 or b
            if held is not None and op is tied[0]:
                extra += held.nbytes  # the two summed out of place (measured: 3 copies live)
            st.mark("backward", op.region, extra)
        fused = None  # the first gradient a fused backward kernel's chain link reads
        for t in op.grad_inputs:
            if not t.nbytes and not t.external and t in grad_of:
                fused = grad_of[t]
                break
        for t in op.outputs:
            g = grad_of.pop(t, None)
            if g is not None:
                if fused is not None:  # read by a fused kernel (compiled.py) until its chain ends
                    waiting.setdefault(fused, []).append(g)
                elif waiting:
                    _release(g, st, waiting)
                else:
                    st.free(g)
        for t in op.saves:
            n = remaining.get(t)
            if n is not None:
                remaining[t] = n - 1
                if n <= 1 and not t.held:
                    st.free(t)
        if op.group >= 0 and op is group_ops[op.group][0]:
            for t in group_inputs.get(op.group, []):
                n = remaining[t] = remaining.get(t, 1) - 1
                if n <= 0:
                    st.free(t)
        if cast:
            st.mark("backward", op.region, cast)
        if held is not None and tied and op is tied[0]:
            st.free(held)
            held = None
    return [st.points[k] for k in st.order]


def _release(g: Tensor, st: _State, waiting: dict[Tensor, list[Tensor]]) -> None:
    """Free the gradient ``g`` and the gradients a fused backward kernel read to make it
    (a 0-byte link of a fused chain holds the chain's input gradients until its own end)."""
    st.free(g)
    for h in waiting.pop(g, ()):
        _release(h, st, waiting)


def _run_forward(ops: list[Op], st: _State, phase: str, held: dict[Tensor, int], *,
                 hold_kept: bool) -> None:
    """Run ``ops`` forward: allocate outputs, then free every tensor past its last use that
    nothing holds (``held``: pending saves; ``hold_kept``: also tensors marked ``keep``)."""
    # _State.alloc, .mark and .free inlined (the simulator's hot loop), with the same effect
    last_use: dict[Tensor, int] = {}
    for i, op in enumerate(ops):
        for t in op.inputs + op.holds:
            last_use[t] = i
    get, used = held.get, last_use.get
    live, points, best, order = st.live, st.points, st.best, st.order
    pop = live.pop
    saved, temp, grads = st.saved, st.temp, st.grads
    for i, op in enumerate(ops):
        for t in op.outputs:
            if not t.external and t not in live:
                if get(t):
                    live[t] = True
                    saved += t.nbytes
                else:
                    live[t] = False
                    temp += t.nbytes
        key = (phase, op.region)
        b = best.get(key)
        if b is None:
            points[key], best[key], b = Point(phase, op.region), 0, 0
            order.append(key)
        if saved + temp + grads > b:
            p = points[key]
            p.saved, p.temp, p.grads = saved, temp, grads
            best[key] = saved + temp + grads
        for ts in (op.inputs, op.outputs, op.holds):
            for t in ts:
                if used(t, -1) <= i and not (hold_kept and t.keep) and not get(t):
                    was = pop(t, None)
                    if was is not None:
                        if was:
                            saved -= t.nbytes
                        else:
                            temp -= t.nbytes
    st.saved, st.temp = saved, temp


def _with_stashes(ops: list[Op], group_inputs: dict[int, list[Tensor]], fraction: float,
                  keepers: dict[Tensor, int], stashes: set[Tensor]) -> list[Op]:
    """``ops`` with, before each group's first op, an op making the group's stash: ``fraction``
    of its inputs' bytes, held until the group's backward ends (listed with its inputs)."""
    out: list[Op] = []
    seen: set[int] = set()
    for op in ops:
        if op.group >= 0 and op.group not in seen:
            seen.add(op.group)
            ins = group_inputs.get(op.group, [])
            stash = Tensor(int(sum(t.nbytes for t in ins) * fraction), grad=False)
            if stash.nbytes:
                keepers[stash] = 1
                stashes.add(stash)
                ins.append(stash)
                out.append(Op(op.region, (), (stash,), (), ()))
        out.append(op)
    return out


def _recompute(ops: list[Op], st: _State, remaining: dict[Tensor, int]) -> None:
    """Re-run a checkpointed group's forward in the backward: its saves come back to life; the
    outputs a selective policy cached are handed back (the cache lets go of them)."""
    for op in ops:
        for t in op.saves:
            remaining[t] = remaining.get(t, 0) + 1
        for t in op.outputs if op.cached else ():
            remaining[t] = remaining.get(t, 0) - 1
    st.forward(ops, "backward", remaining, hold_kept=False)
