"""Bytes that memory-bound kernels move, and kernels launched, in one micro-batch of one stage.

Read off the same op graph the activation estimate simulates (``graph.py``, written by
``blocks.py`` / ``families.py``): every op's inputs, outputs, saved tensors and gradients have
their exact sizes there. Ops are ``ew`` (memory-bound: elementwise, norms, softmax, casts,
copies, reductions), ``mm`` (GEMMs), ``attn`` (fused attention) or ``comm`` (collectives);
GEMMs and attention are timed by their own rooflines (``timing/kernels.py``), so only ``ew``
ops' bytes are counted here. Every op's kernels are counted.

Two ways of running the same graph:

- **eager** (op by op, PyTorch without compilation; what Hugging Face models, FSDP, DeepSpeed
  and torchtitan without ``torch.compile`` run): an op's forward kernel reads its inputs and
  writes its outputs; its backward (``derivatives.yaml``) reads the output gradients and the
  saved tensors and writes one gradient per differentiable input (one kernel each) and its
  parameter gradients; a tensor that feeds k ops receives k gradients, summed by k - 1 adds
  (read 2, write 1). Ops of an activation-checkpointing group run their forward again in the
  backward.
- **fused** (elementwise chains fused into the GEMM boundaries: Inductor under
  ``torch.compile``, Ansel et al. 2024, "PyTorch 2", ASPLOS, §4: pointwise and reduction ops
  fused into one kernel per chain; Megatron-Core / Transformer Engine's fused norm, rotary,
  bias-activation and softmax kernels): a tensor is moved once where it crosses between
  memory-bound ops and a GEMM, attention kernel or collective, or is saved for the backward;
  intermediates inside a chain stay in registers. One kernel per connected chain per pass.

**Known limitations**: bytes only (no reduction or transcendental cost); kernel scratch and
cuBLAS workspace traffic are not counted; the fused rule is an idealisation (Inductor also
recomputes cheap ops instead of saving them; TE fuses norms into GEMM prologues), so real
fused runs move somewhat more; optimizer-step traffic is not in the graph (``timing/step.py``).
"""

from __future__ import annotations

from ...results.traffic import Traffic
from .graph import Graph, Op, Tensor
from .lanes import to_float

__all__ = ["Traffic", "graph_traffic"]


def _unique(ts: tuple[Tensor, ...] | list[Tensor]) -> list[Tensor]:
    # first occurrences in order (``Tensor`` is ``eq=False``: hashed by identity)
    return list(dict.fromkeys(ts))


def _runs_backward(op: Op) -> bool:
    return bool(op.grad_inputs or op.param_grads)


def _eager(op: Op, io: list[Tensor] | None = None, saves: list[Tensor] | None = None
           ) -> tuple[float, float, float, float]:
    """(forward bytes, forward kernels, backward bytes, backward kernels) of one op, eager;
    ``io``, ``saves``: ``_unique`` of its inputs + outputs and of its saves, when the caller
    has them."""
    fk = 1.0 if (op.inputs or op.outputs) else 0.0
    bk = 0.0
    if _runs_backward(op):
        bk = float(len(op.grad_inputs) + len(op.param_grads)) if op.kind == "mm" else \
            float(max(1, len(op.grad_inputs)) + (len(op.param_grads) if op.kind == "ew" else 0))
    if op.kind != "ew":
        return 0.0, fk, 0.0, bk
    fb = sum(t.nbytes for t in (io if io is not None else _unique(op.inputs + op.outputs)))
    bb = 0.0
    if _runs_backward(op):
        bb = (sum(t.nbytes for t in op.outputs if t.grad)
              + sum(t.nbytes for t in (saves if saves is not None else _unique(op.saves)))
              + sum(t.nbytes for t in op.grad_inputs) + sum(b for b, _ in op.param_grads))
    return to_float(fb), fk, bb, bk  # lane by lane in a lanes graph (lanes.py)


def _chains(ops: list[Op]) -> tuple[dict[int, int], int]:
    """Union-find of ``ew`` ops joined by a tensor one produces and another consumes:
    op index -> chain id, and the number of chains."""
    parent = list(range(len(ops)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    producer: dict[Tensor, int] = {}
    for i, op in enumerate(ops):
        if op.kind == "ew":
            for t in op.outputs:
                producer[t] = i
    for i, op in enumerate(ops):
        if op.kind != "ew":
            continue
        for t in op.inputs:
            j = producer.get(t)
            if j is not None:
                parent[find(i)] = find(j)
    roots = {i: find(i) for i, op in enumerate(ops) if op.kind == "ew"}
    return roots, len(set(roots.values()))


def graph_traffic(g: Graph) -> dict[str, Traffic]:
    """Traffic of ``g`` per region (``embedding``, ``layer i``, ``head``, ``loss``), forward,
    backward and the recompute of checkpointed groups (module docstring)."""
    ops = g.ops
    producer_kind: dict[Tensor, str] = {}
    consumers: dict[Tensor, list[str]] = {}
    saved: set[Tensor] = set()
    grad_uses: dict[Tensor, int] = {}
    for op in ops:
        for t in op.outputs:
            producer_kind[t] = op.kind
        for t in op.inputs:
            consumers.setdefault(t, []).append(op.kind)
        saved.update(op.saves)
        if _runs_backward(op):
            for t in op.grad_inputs:
                grad_uses[t] = grad_uses.get(t, 0) + 1

    def boundary(t: Tensor) -> bool:
        made = producer_kind.get(t)
        used = consumers.get(t, [])
        if made != "ew":                         # read by a chain from outside it
            return "ew" in used
        return t in saved or not used or any(k != "ew" for k in used)

    chain_of, _ = _chains(ops)
    out: dict[str, list[float]] = {}
    chain_seen: set[tuple[int, int]] = set()
    counted_fwd: set[Tensor] = set()
    counted_bwd: set[Tensor] = set()
    accumulated: set[Tensor] = set()
    for i, op in enumerate(ops):
        ew = op.kind == "ew"
        io = _unique(op.inputs + op.outputs) if ew else None
        saves = _unique(op.saves) if ew else None
        fb, fk, bb, bk = _eager(op, io, saves)
        passes = 2.0 if op.group >= 0 else 1.0    # checkpointed: forward again in backward
        eb, ek = fb * passes + bb, fk * passes + bk
        xb = xk = 0.0
        if ew:
            assert io is not None and saves is not None
            f_fused = 0.0
            for t in io:
                if t not in counted_fwd and boundary(t):
                    counted_fwd.add(t)
                    f_fused += t.nbytes
            b_fused = 0.0
            if _runs_backward(op):
                grads = [t for t in op.outputs if t.grad] + list(op.grad_inputs)
                for t in _unique(grads):
                    if t not in counted_bwd and boundary(t):
                        counted_bwd.add(t)
                        b_fused += t.nbytes
                b_fused += sum(t.nbytes for t in saves) \
                    + sum(b for b, _ in op.param_grads)
            new_chain = (chain_of[i], op.group) not in chain_seen
            chain_seen.add((chain_of[i], op.group))
            xb = f_fused * passes + b_fused
            xk = (passes + (1.0 if _runs_backward(op) else 0.0)) if new_chain else 0.0
        else:
            xk = ek
        if _runs_backward(op):
            for t in op.grad_inputs:
                if grad_uses.get(t, 0) > 1 and t not in accumulated:
                    accumulated.add(t)
                    extra = grad_uses[t] - 1
                    eb += 3.0 * t.nbytes * extra
                    ek += extra
        acc = out.setdefault(op.region, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
        acc[0] += eb
        acc[1] += xb
        acc[2] += ek
        acc[3] += xk
        acc[4] += fb
        acc[5] += f_fused if ew else 0.0
    return {r: Traffic(eager_bytes=v[0], fused_bytes=v[1], eager_kernels=v[2],
                       fused_kernels=v[3], eager_forward_bytes=v[4], fused_forward_bytes=v[5])
            for r, v in out.items()}
