"""Communication and transfer volumes per rank per step, and the links they cross.

Collective costs follow the ring algorithm's bus traffic (NCCL tests' busBW convention):
all-reduce moves ``2 (n-1)/n x bytes`` per rank, all-gather / reduce-scatter / all-to-all
``(n-1)/n x bytes``. Rank order is Megatron-Core's ``tp-cp-ep-dp-pp`` (tp innermost), so a
group stays inside a node when the product of its size and the degrees inside it fits the
node's GPUs. A group that spans nodes runs one NCCL channel per member GPU of a node, each
through that GPU's NIC, so its bus bandwidth is the NICs of its members in one node together
(capped by NVLink): nccl-tests all_reduce on 3 nodes of 8 A100 with 4 HDR NICs each measured
84.8 GB/s average, 96 peak, of the 100 GB/s of a node's NICs (NVIDIA/nccl-tests#119); 2 such
nodes 86 of 96 GB/s (NVIDIA/nccl#1048). A group with one member per node (DP across TP groups)
gets one GPU's NIC.

Volumes (16-bit activations/parameters, Megatron §3 of Narayanan et al. 2021 / ZeRO §7):

- DP (ZeRO 0/1): gradients all-reduced once per step (no_sync while accumulating);
- ZeRO-2: gradients reduce-scattered every micro-batch, parameters all-gathered once per step;
- ZeRO-3 / FSDP: parameters all-gathered in forward and again in backward, gradients
  reduce-scattered, every micro-batch (1.5x DP's volume, ZeRO paper §7.2.2);
- TP: 4 all-reduces of ``b s h`` per layer per micro-batch (2 forward, 2 backward; +2 with full
  recomputation); with sequence parallelism the same volume as reduce-scatter + all-gather;
- CP: ring attention passes the local K and V ``cp - 1`` times forward, twice that backward;
- EP: dispatch + combine all-to-all of ``b s top_k h`` per MoE layer, forward and backward
  (``alltoall_s``: across nodes each GPU's remote share leaves through its own NIC);
- PP: one ``b s h`` activation send per micro-batch per direction.

Every ring collective also pays NCCL's latency (``ring_latency_s``: its tuner's constants for
the ring algorithm and Simple protocol), once per call: a 16.8 MB TP all-reduce over 8
NVLink GPUs spends 56 us of latency next to 78 us of transfer. Not timed: all-to-all latency.
"""

from __future__ import annotations

from ..facts.constants import constant

__all__ = ["allreduce_s", "alltoall_s", "gather_s", "group_link", "ring_latency_s", "Link"]


class Link:
    """A link's name (``nvlink`` / ``network`` / ``pcie``), usable GB/s per GPU per direction
    (None = unknown), and what a ring's latency needs: ``per_node``, the group's members in
    one node when the link is the network (0: the whole group is in one node), and ``step_s``,
    the latency of one ring step inside a node (``ring_latency_s``)."""

    __slots__ = ("name", "gb_per_s", "per_node", "step_s")

    def __init__(self, name: str, gb_per_s: float | None, *, per_node: int = 0,
                 step_s: float = 0.0):
        self.name = name
        self.gb_per_s = gb_per_s
        self.per_node = per_node
        self.step_s = step_s


def ring_latency_s(n: int, link: Link, passes: int) -> float:
    """Latency of one ring collective over ``n`` ranks, NCCL's own model of it for the ring
    algorithm and the Simple protocol (NVIDIA/nccl@5067397 ``src/graph/tuning.cc``): a base
    latency plus one latency per step, ``passes x (n - 1)`` steps (2 for all-reduce, 1 for
    all-gather and reduce-scatter), of which ``passes x (nodes - 1)`` cross the network at
    the network's step latency and the rest run inside a node at ``link.step_s``. NCCL picks,
    per call, the algorithm and protocol with the least ``latency + bytes / bandwidth``, so
    the ring's latency is an upper bound on what it pays."""
    if n <= 1:
        return 0.0
    steps = passes * (n - 1)
    nodes = -(-n // link.per_node) if link.per_node else 1
    inter = passes * (nodes - 1)
    return 1e-6 * (constant("nccl_ring_base_latency_us") + inter * constant(
        "nccl_ring_net_step_us")) + (steps - inter) * link.step_s


def allreduce_s(nbytes: float, n: int, link: Link) -> float | None:
    """Ring all-reduce time: 2 (n-1)/n x bytes / bandwidth, plus the ring's latency (0 for
    n = 1, None if unknown)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    if not link.gb_per_s:
        return None
    return 2 * (n - 1) / n * nbytes / (link.gb_per_s * 1e9) + ring_latency_s(n, link, 2)


def gather_s(nbytes: float, n: int, link: Link) -> float | None:
    """All-gather / reduce-scatter time: (n-1)/n x bytes / bandwidth, plus the ring's latency
    (a point-to-point send, ``n = 2``, is timed alike)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    if not link.gb_per_s:
        return None
    return (n - 1) / n * nbytes / (link.gb_per_s * 1e9) + ring_latency_s(n, link, 1)


def alltoall_s(nbytes: float, n: int, per_node: int, intra: Link, inter: Link
               ) -> float | None:
    """All-to-all time of ``nbytes`` per rank over ``n`` ranks, ``per_node`` of them in each
    node: a rank keeps ``1/n`` of its data, sends ``(per_node - 1)/n`` over the intra-node link
    and ``(n - per_node)/n`` through the network, both at once (the slower sets the time).

    Unlike a ring all-gather, whose node-level traffic is shared data that the NICs of a node
    carry together (``group_link``), every destination of an all-to-all gets distinct data, so
    a node must send ``per_node`` x the per-rank remote share out of ``per_node`` NICs: each
    GPU's remote share at one NIC's rate (``inter``). Measured: DeepEP's internode dispatch
    on H800 with one CX7 400 Gb/s NIC per GPU (~50 GB/s) reaches 47-59 GB/s (dispatch) and
    51-62 GB/s (combine) "bottleneck bandwidth" per GPU for EP 16-64, 153-158 GB/s over NVLink
    within a node
    (deepseek-ai/DeepEP README @edbb1bc, "Normal kernels with NVLink and RDMA forwarding";
    its logical figures exceed 50 because DeepEP sends a token once per node and forwards it
    over NVLink, which Megatron's NCCL all-to-all does not)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    per_node = max(1, min(per_node, n))
    if per_node > 1 and not intra.gb_per_s:
        return None
    local = (per_node - 1) / n * nbytes / (intra.gb_per_s * 1e9) if per_node > 1 else 0.0
    if per_node == n:
        return local
    if not inter.gb_per_s:
        return None
    return max(local, (n - per_node) / n * nbytes / (inter.gb_per_s * 1e9))


def group_link(inner: int, size: int, local: int, intra: Link, inter: Link) -> Link:
    """The link a group of ``size`` ranks with stride ``inner`` crosses: intra-node when
    ``inner x size <= local`` GPUs per node, else the network at ``inter`` (one GPU's NIC) x
    the group's members per node, capped by the intra-node link (module docstring)."""
    if inner * size <= local:
        return intra
    if not inter.gb_per_s:
        return inter
    per_node = max(1, min(size, local // max(inner, 1)))
    bw = inter.gb_per_s * per_node
    # a ring across nodes: NCCL raises the intra-node step to its network overhead (tuning.cc)
    return Link("network", min(bw, intra.gb_per_s) if intra.gb_per_s else bw, per_node=per_node,
                step_s=max(intra.step_s, 1e-6 * constant("nccl_net_overhead_us")))
