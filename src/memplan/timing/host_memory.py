"""Host memory placement (issue #19): how a node's sockets, DRAM channels and inter-socket link
bound the offload transfers and the CPU optimizer step of the ranks it hosts.

Each socket is one NUMA domain with its own DRAM channels; a GPU hangs off one socket's PCIe root.
A transfer between a GPU and pinned host memory runs over the GPU's own PCIe link, is served by
the DRAM of the socket that holds the pages, and crosses the inter-socket link (Intel UPI, AMD
xGMI) when that socket is not the GPU's. The ranks of a node run their offload phases at the same
time, so a socket's DRAM and the link are shared:

- **DRAM**: the GPUs are split evenly over the sockets (the DGX/HGX layouts), the busiest
  socket hosting ``ceil(ranks / sockets)`` of them; its DRAM serves their local pages and its
  share of the other ranks' far pages (with every socket alike: ``ranks / sockets`` ranks'
  bytes, whether the pages are local or not), at ``dram_efficiency`` of its theoretical rate
  (channels x MT/s x 8 B);
- **inter-socket link**: a rank not bound to its GPU's socket has ``(sockets - 1) / sockets``
  of its pinned pages on a far socket (``remote_share``), so each direction of the link carries
  that share of one socket's ranks' bytes, at ``socket_link_efficiency`` of the vendor figure.

The CPU optimizer step reads and writes each element's fp32 states in its socket's DRAM
(``optimizer_bytes_per_param_gpu``: the same 32 B a fused Adam step moves on a GPU), so it is
bounded by the DRAM of the socket too. What is unknown (no channel or link figure in the node
preset) does not bound anything and is said so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..facts.constants import constant
from ..hardware.node_hardware import NodeHardware

__all__ = ["HostMemory", "host_memory", "remote_share"]


def remote_share(sockets: int, bound: bool) -> float:
    """Share of a rank's pinned host pages on a socket other than its GPU's.

    Bound (``torchrun --numa-binding=node``: "each worker process and its threads will be bound
    to all the CPUs on the NUMA node containing the GPU", docs.pytorch.org/docs/main/elastic/
    numa.html; ``numactl --cpunodebind/--membind``): none. Unbound, torchrun's default: "by
    default, Linux already allocates memory to the NUMA node local to the CPU which triggered
    the allocation" (pytorch/pytorch#160163), and nothing ties that CPU to the rank's GPU, so
    each socket is equally likely: ``(sockets - 1) / sockets`` of the pages are far.
    """
    if sockets <= 1 or bound:
        return 0.0
    return (sockets - 1) / sockets


@dataclass(frozen=True, slots=True)
class HostMemory:
    """What one node's host memory sustains for the ranks it hosts."""

    sockets: int
    """NUMA domains (1 when unknown: nothing crosses a link)."""
    dram: float | None
    """Usable DRAM bytes/s of one socket; None: unknown, not a bound."""
    link: float | None
    """Usable inter-socket bytes/s in one direction; None: unknown, not a bound."""
    remote: float
    """``remote_share`` of the ranks' pinned pages."""

    def transfer(self, per_rank: float, own: float, ranks: int) -> tuple[float, str]:
        """Seconds for ``ranks`` ranks of the node to move ``per_rank`` bytes each between GPU
        and pinned host memory at once, each at most at ``own`` bytes/s (its PCIe link), and
        which of the three sets it: ``pcie``, ``dram`` or ``socket link``.

        The busiest socket hosts ``ceil(ranks / sockets)`` of the GPUs. Its DRAM serves their
        local share and the far share of the other ranks (spread over the other sockets); its
        link to the others carries its ranks' far share."""
        home = -(-ranks // self.sockets)
        far = self.remote * per_rank
        times = {"pcie": per_rank / own}
        if self.dram:
            others = far * (ranks - home) / (self.sockets - 1) if self.sockets > 1 else 0.0
            times["dram"] = (home * (per_rank - far) + others) / self.dram
        if self.link and far:
            times["socket link"] = home * far / (self.sockets - 1) / self.link
        return _slowest(times)

    def optimizer(self, elements: float, compute_s: float, ranks: int) -> tuple[float, str]:
        """Seconds of the CPU optimizer step of ``ranks`` ranks with ``elements`` each: their
        cores' rate (``compute_s``) or their socket's DRAM, whichever is slower (``cores`` or
        ``dram``). A rank's threads take ``cores / ranks`` of the node's cores, so the states
        spread over the sockets as the threads do: ``ranks / sockets`` ranks' worth each."""
        times = {"cores": compute_s}
        if self.dram:
            per_socket = ranks / self.sockets * elements
            times["dram"] = per_socket * constant("optimizer_bytes_per_param_gpu") / self.dram
        return _slowest(times)


def _slowest(times: dict[str, float]) -> tuple[float, str]:
    name = max(times, key=times.__getitem__)
    return times[name], name


def host_memory(hw: NodeHardware, bound: bool) -> HostMemory:
    """The node's ``HostMemory`` from its preset (``NodeHardware``) and the ranks' binding."""
    sockets = hw.cpu_sockets or 1
    dram = (hw.dram_gb_per_s * 1e9 * constant("dram_efficiency") / sockets
            if hw.dram_gb_per_s else None)
    link = (hw.socket_link_gb_per_s * 1e9 * constant("socket_link_efficiency")
            if hw.socket_link_gb_per_s and sockets > 1 else None)
    return HostMemory(sockets=sockets, dram=dram, link=link, remote=remote_share(sockets, bound))
