"""``torch.compile``'s effect on the op graph: what Inductor's partitioner saves for the backward,
and which intermediates its fused kernels never write to memory.

AOTAutograd traces one compiled region (a transformer block under torchtune / torchtitan, the
whole model under ``model.compile()`` or the HF Trainer's ``torch_compile``) into a joint
forward-backward graph and splits it with ``min_cut_rematerialization_partition``
(torch 2.13, ``torch/_functorch/partitioners.py``, ``solve_min_cut``). Rebuilt here on the
simulator's ops, rule by rule:

- a tensor the backward reads (an op's eager ``saves``) must either be saved or be recomputed in
  the backward from saved tensors through recomputable ops;
- recomputable: memory-bound ops (``kind = "ew"``; the allowlist of pointwise, view, reduction
  and norm ops, ``ban_recompute_not_in_allowlist``). Never recomputed: GEMMs, attention kernels
  and collectives ("compute intensive op"), random ops (dropout), region inputs ("primal
  input"), a tensor a GEMM or attention kernel reads in the backward ("materialized in
  backward": it would have to be written to memory there anyway), and a reduction whose output
  is over 4x smaller than its inputs ("reduction op", ``ban_recompute_reductions``);
- cost of saving a tensor (``get_node_weight``): its bytes x 1.1^min(max(distance to the
  backward, 1), 100), doubled when every consumer would fuse it (not materialised anyway);
  parameters are free to save (``treat_parameters_as_free_to_save``), so the autocast copy of
  a weight is recomputed from it, unless a GEMM reads the copy in the backward (the input
  gradient of a linear): then the 16-bit copy is saved, as eager autocast keeps it;
- the saved set is the minimum cut between "cannot be recomputed" and "needed by the backward"
  (``nx.minimum_cut``; here ``_min_cut``, a max-flow of our own).

Fusion (Ansel et al. 2024, "PyTorch 2", ASPLOS, §4; Inductor's scheduler): an elementwise
tensor whose consumers are all elementwise ops of the same region, and that is neither saved nor
read outside the region, lives only in registers: zero bytes here, in the forward and (its
gradient) in the backward. Views and kernel scratch are not modelled, as in the eager graph.

Regions: ``blocks`` compiles each ``layer i`` and the loss on its own (torchtune
``compile: True``: ``training.compile_model`` per layer and ``compile_loss``; torchtitan
``[compile]`` ``components = ["model", "loss"]``: ``apply_compile`` per block), the embedding and
the output projection stay eager; ``model`` compiles the whole stage as one graph.
The heuristics ``ban_recompute_used_far_apart`` and ``ban_recompute_long_fusible_chains`` are not
modelled (chains of 100 elementwise ops do not occur in a block).
"""

from __future__ import annotations

from collections import deque

from .graph import Graph, Op, Tensor

__all__ = ["compiled"]

_INF = float("inf")


def _kernel(op: Op) -> bool:
    """A GEMM, attention kernel, collective or opaque library kernel: neither recomputed nor
    fused."""
    return op.kind != "ew" or op.origin in ("gemm", "opaque")


def _region_of(op: Op, scope: str) -> str | None:
    if scope == "model":
        return "model"
    if op.region.startswith("layer ") or op.region == "loss":
        return op.region
    return None


def compiled(g: Graph, scope: str) -> Graph:
    """``g`` as Inductor runs it under ``scope`` (see the module docstring); ops are rewritten in
    place: their ``saves`` become the partitioner's choice, fused intermediates 0 bytes."""
    _merge_casts(g, scope)
    regions: dict[str, list[Op]] = {}
    for op in g.ops:
        r = _region_of(op, scope)
        if r is not None:
            regions.setdefault(r, []).append(op)
            op.holds = ()  # no Python frame inside a compiled graph: freed at their last read
    consumers: dict[int, list[Op]] = {}
    for op in g.ops:
        for t in op.inputs:
            consumers.setdefault(id(t), []).append(op)
    final = {id(t) for t in g.ops[-1].outputs} if g.ops else set()
    for ops in regions.values():
        _partition(ops, consumers, final, set(map(id, ops)))
    return g


def _is_cast(op: Op) -> bool:
    return (op.kind == "ew" and len(op.inputs) == 1 and len(op.outputs) == 1 and not op.saves
            and not op.param_grads and not op.origin
            and op.outputs[0].itemsize != op.inputs[0].itemsize)


def _merge_casts(g: Graph, scope: str) -> None:
    """Common-subexpression elimination of dtype casts within a region (AOTAutograd's
    ``fx_graph_cse``): autocast casts a linear's input once per call, so q, k and v (gate and
    up) each make a 16-bit copy of one tensor in eager code; the compiled graph makes one."""
    first: dict[tuple[object, ...], Tensor] = {}
    alias: dict[int, Tensor] = {}
    kept: list[Op] = []

    def sub(ts: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        return tuple(alias.get(id(t), t) for t in ts)

    for op in g.ops:
        op.inputs, op.saves, op.grad_inputs = sub(op.inputs), sub(op.saves), sub(op.grad_inputs)
        op.holds = sub(op.holds)
        region = _region_of(op, scope)
        if region is not None and _is_cast(op):
            out = op.outputs[0]
            key = (region, id(op.inputs[0]), out.nbytes, out.itemsize, op.group)
            if key in first:
                alias[id(out)] = first[key]
                continue
            first[key] = out
        kept.append(op)
    g.ops[:] = kept


def _partition(ops: list[Op], consumers: dict[int, list[Op]], final: set[int],
               members: set[int]) -> None:
    producer: dict[int, Op] = {id(t): op for op in ops for t in op.outputs}
    tensors: dict[int, Tensor] = {}
    for op in ops:
        for t in op.inputs + op.outputs:
            tensors.setdefault(id(t), t)
    needed = {id(t) for op in ops for t in op.saves}
    read_by_kernel = {id(t) for op in ops if _kernel(op) for t in op.saves}

    def free(k: int) -> bool:  # an autocast weight copy no GEMM reads in the backward:
        p = producer.get(k)  # recomputed from its parameter, which is free to save
        return p is not None and p.origin == "param" and k not in read_by_kernel

    def fusible_uses(k: int) -> bool:
        return all(id(c) in members and not _kernel(c) for c in consumers.get(k, ()))

    def materialized(k: int) -> bool:
        p = producer.get(k)
        return p is None or _kernel(p) or not fusible_uses(k)

    dist = _distance_to_backward(ops, needed)
    # -- the flow network: node 0 source, 1 sink, 2i / 2i+1 tensor i in / out ----------------
    index = {k: i for i, k in enumerate(tensors)}
    net = _Net(2 + 2 * len(index))
    for k, i in index.items():
        t, p = tensors[k], producer.get(k)
        inn, out = 2 + 2 * i, 3 + 2 * i
        banned = (p is None or _kernel(p) or p.origin == "rng" or k in read_by_kernel
                  or 4 * t.nbytes < sum(x.nbytes for x in p.inputs))
        if free(k):
            banned = False
            net.add(0, inn, _INF)  # from its parameter, free to save and to recompute
            weight = 0.0
        else:
            weight = 0.0 if t.external else t.nbytes * 1.1 ** min(max(dist.get(k, 100), 1), 100)
            weight *= 1 if materialized(k) else 2
        if banned:
            net.add(0, inn, _INF)
        net.add(inn, out, weight)
        if k in needed:
            net.add(out, 1, _INF)
        if p is not None:
            for x in p.inputs:
                net.add(3 + 2 * index[id(x)], inn, _INF)
    source_side = net.min_cut_source_side()
    saved = {k for k, i in index.items()
             if 2 + 2 * i in source_side and 3 + 2 * i not in source_side}

    # -- rewrite: each op keeps the saved tensors its backward's inputs are rebuilt from, and so
    # does every op on the rebuilding path: the fused backward of the chain reads them until
    # the gradient has passed the whole chain (the loss: the logits live until their gradient
    # is written) ----------------------------------------------------------------------------
    cone: dict[int, tuple[frozenset[int], frozenset[Op]]] = {}

    def rebuilt_from(k: int) -> tuple[frozenset[int], frozenset[Op]]:
        if k in cone:
            return cone[k]
        p = producer.get(k)
        if k in saved or p is None:
            out: tuple[frozenset[int], frozenset[Op]] = (frozenset((k,)), frozenset())
        elif free(k):
            out = (frozenset(), frozenset())
        else:
            parts = [rebuilt_from(id(x)) for x in p.inputs]
            out = (frozenset().union(*(a for a, _ in parts)),
                   frozenset((p,)).union(*(b for _, b in parts)))
        cone[k] = out
        return out

    keeps: dict[int, set[int]] = {id(op): set() for op in ops}
    for op in ops:
        for t in op.saves:
            need, path = rebuilt_from(id(t))
            keeps[id(op)] |= need
            for q in path:
                keeps[id(q)] |= need
    # the compiled backward frees its saved inputs after their last use in its own order, which
    # need not follow the ops': measured (tiny Llama, bf16, checkpointed) every saved tensor of
    # a block was still live while its MLP's gradient kernel ran, so they are held to the end
    # of the region's backward (its first op)
    keeps[id(ops[0])] |= {k for q in ops for k in keeps[id(q)]}
    for op in ops:
        op.saves = tuple(tensors[k] for k in sorted(keeps[id(op)], key=list(tensors).index)
                         if not free(k))
    for k, t in tensors.items():
        p = producer.get(k)
        if p is None:
            continue
        if p.origin == "param":
            t.keep = False  # no autocast cache inside a graph: the copy dies after its GEMM
        elif (not _kernel(p) and k not in saved and k not in final and not t.keep
              and consumers.get(k) and fusible_uses(k)):
            t.nbytes = 0  # fused: computed in registers, forward and backward


def _distance_to_backward(ops: list[Op], needed: set[int]) -> dict[int, int]:
    """Per tensor: hops to the backward (``dist_from_bw``): 1 when the backward reads it,
    else one more than its nearest consumer's outputs."""
    dist: dict[int, int] = {k: 1 for k in needed}
    for op in reversed(ops):
        best = min((dist[id(t)] for t in op.outputs if id(t) in dist), default=None)
        if best is None:
            continue
        for x in op.inputs:
            if dist.get(id(x), 1 << 30) > best + 1:
                dist[id(x)] = best + 1
    return dist


class _Net:
    """A flow network for one minimum cut (Dinic's algorithm)."""

    def __init__(self, n: int) -> None:
        self.adj: list[list[int]] = [[] for _ in range(n)]
        self.to: list[int] = []
        self.cap: list[float] = []

    def add(self, a: int, b: int, cap: float) -> None:
        self.adj[a].append(len(self.to))
        self.to.append(b)
        self.cap.append(cap)
        self.adj[b].append(len(self.to))
        self.to.append(a)
        self.cap.append(0.0)

    def _levels(self) -> list[int] | None:
        level = [-1] * len(self.adj)
        level[0] = 0
        q = deque([0])
        while q:
            a = q.popleft()
            for e in self.adj[a]:
                if self.cap[e] > 0 and level[self.to[e]] < 0:
                    level[self.to[e]] = level[a] + 1
                    q.append(self.to[e])
        return level if level[1] >= 0 else None

    def _push(self, a: int, f: float, level: list[int], it: list[int]) -> float:
        if a == 1:
            return f
        while it[a] < len(self.adj[a]):
            e = self.adj[a][it[a]]
            b = self.to[e]
            if self.cap[e] > 0 and level[b] == level[a] + 1:
                got = self._push(b, min(f, self.cap[e]), level, it)
                if got > 0:
                    self.cap[e] -= got
                    self.cap[e ^ 1] += got
                    return got
            it[a] += 1
        return 0.0

    def min_cut_source_side(self) -> set[int]:
        """Nodes reachable from the source once the maximum flow is pushed."""
        while (level := self._levels()) is not None:
            it = [0] * len(self.adj)
            while (f := self._push(0, _INF, level, it)) > 0:
                if f == _INF:
                    raise ValueError("unbounded cut: a tensor the backward needs can be neither"
                                     " saved nor recomputed")
        seen = {0}
        q = deque([0])
        while q:
            a = q.popleft()
            for e in self.adj[a]:
                if self.cap[e] > 0 and self.to[e] not in seen:
                    seen.add(self.to[e])
                    q.append(self.to[e])
        return seen
