"""``NodeHardware``: the host side of one node as the planner needs it, from a ``nodes.toml``
preset (``--node``), explicit values (``--host-ram``, ``--nvme``, ``--pcie``), or both (explicit
values win). Unknown stays ``None`` and is reported as unknown, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, Problems
from ..units import GB, GIB
from . import Device
from .nodes import Node

__all__ = ["NodeHardware", "dram_gb_per_s", "node_hardware", "parse_size", "PCIE_GENS"]

PCIE_GENS = (3, 4, 5)
"""PCIe generations with a measured host<->device bandwidth in ``facts/rates.toml``."""

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": GB, "tb": 10**12, "kib": 2**10,
          "mib": 2**20, "gib": GIB, "tib": 2**40}


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeHardware:
    """One node's host resources. Bandwidths are decimal GB/s."""

    name: str
    """Preset name, or ``custom`` / ``unspecified``."""
    gpus: int
    """GPUs (= training ranks) on the node."""
    host_ram_bytes: int | None = None
    """Installed host memory; None = unknown (no verdict)."""
    nvme_bytes: int | None = None
    """Local NVMe capacity for swap and checkpoints; None = unknown."""
    pcie_gen: int | None = None
    """PCIe generation of the GPU<->host link."""
    cpu_cores: int | None = None
    """Physical cores of the node (all sockets)."""
    nvlink_gb_per_s: float | None = None
    """GPU-to-GPU bandwidth per GPU, both directions together (vendor figure)."""
    network_gb_per_s: float | None = None
    """Inter-node bandwidth per GPU, one direction (line rate / 8)."""
    nvme_read_gb_per_s: float | None = None
    nvme_write_gb_per_s: float | None = None
    cpu_sockets: int | None = None
    """CPU sockets (NUMA domains of host memory); None = unknown."""
    dram_gb_per_s: float | None = None
    """Theoretical DRAM bandwidth of the whole node (channels x MT/s x 8 B); None = unknown."""
    socket_link_gb_per_s: float | None = None
    """Inter-socket link, one direction, vendor figure; None = unknown or one socket."""
    source: str = ""
    """Where the figures come from (the preset's source, or 'command line')."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "gpus": self.gpus, "host_ram_bytes": self.host_ram_bytes,
                "nvme_bytes": self.nvme_bytes, "pcie_gen": self.pcie_gen,
                "cpu_cores": self.cpu_cores, "nvlink_gb_per_s": self.nvlink_gb_per_s,
                "network_gb_per_s": self.network_gb_per_s,
                "nvme_read_gb_per_s": self.nvme_read_gb_per_s,
                "nvme_write_gb_per_s": self.nvme_write_gb_per_s,
                "cpu_sockets": self.cpu_sockets, "dram_gb_per_s": self.dram_gb_per_s,
                "socket_link_gb_per_s": self.socket_link_gb_per_s}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeHardware:
        return cls(**{k: d.get(k) for k in ("name", "gpus", "host_ram_bytes", "nvme_bytes",
                                            "pcie_gen", "cpu_cores", "nvlink_gb_per_s",
                                            "network_gb_per_s", "nvme_read_gb_per_s",
                                            "nvme_write_gb_per_s", "cpu_sockets",
                                            "dram_gb_per_s", "socket_link_gb_per_s")})


def parse_size(text: str | int, flag: str) -> int:
    """``2TiB`` / ``1900GiB`` / ``30.72TB`` / an int of bytes -> bytes.

    Raises:
        ConfigError: no unit, an unknown unit or not a number; the message shows valid forms.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ConfigError([f"{flag} {text!r} is not a size with a unit: write e.g. 2TiB, 2048GiB "
                           f"or 30.72TB (units: {', '.join(k.upper() if len(k) == 1 else k for k in _UNITS)}; "
                           "TB/GB are decimal, TiB/GiB binary)."])
    return int(float(m.group(1)) * _UNITS[unit])


def node_hardware(device: Device, gpus_per_node: int, node: Node | None = None, *,
                  host_ram_bytes: int | None = None, nvme_bytes: int | None = None,
                  pcie_gen: int | None = None) -> NodeHardware:
    """The node a job runs on: the preset (if any) with explicit values on top.

    Raises:
        ConfigError: the preset's GPU differs from ``device``, more ranks per node than the
            preset has GPUs, or an unsupported PCIe generation (all problems at once).
    """
    p = Problems()
    if node is not None and node.gpu != device.name:
        p.add(f"node {node.name} has {node.gpu} GPUs but the job uses {device.name}. Drop --gpu "
              f"(the node's GPU is used) or pick a node with {device.name}.")
    if node is not None and gpus_per_node > node.gpus:
        p.add(f"{gpus_per_node} ranks per node but node {node.name} has {node.gpus} GPUs. "
              f"Set gpus_per_node <= {node.gpus}.")
    if pcie_gen is not None and pcie_gen not in PCIE_GENS:
        p.add(f"--pcie {pcie_gen} has no measured bandwidth here; use one of "
              f"{', '.join(map(str, PCIE_GENS))}.")
    for flag, value in (("--host-ram", host_ram_bytes), ("--nvme", nvme_bytes)):
        if value is not None and value <= 0:
            p.add(f"{flag} must be a positive size, got {value} bytes.")
    p.raise_if_any()
    nvlink = device.interconnect_gb_per_s if device.interconnect.startswith("nvlink") else None
    if node is None:
        return NodeHardware(
            name="custom" if (host_ram_bytes or nvme_bytes or pcie_gen) else "unspecified",
            gpus=gpus_per_node, host_ram_bytes=host_ram_bytes, nvme_bytes=nvme_bytes,
            pcie_gen=pcie_gen or device.pcie_gen, nvlink_gb_per_s=nvlink,
            source="command line and the GPU catalog row" if host_ram_bytes or nvme_bytes
            else "GPU catalog row only (no --node)")
    read = node.nvme_read_gb_per_s
    write = node.nvme_write_gb_per_s
    return NodeHardware(
        name=node.name, gpus=node.gpus,
        host_ram_bytes=host_ram_bytes or (int(node.host_ram_gib * GIB) if node.host_ram_gib else None),
        nvme_bytes=nvme_bytes or (int(node.nvme_tb * 10**12) if node.nvme_tb else None),
        pcie_gen=pcie_gen or node.pcie_gen or device.pcie_gen, cpu_cores=node.cpu_cores,
        nvlink_gb_per_s=node.nvlink_gb_per_s or nvlink,
        network_gb_per_s=node.network_gbit_per_gpu / 8 if node.network_gbit_per_gpu else None,
        nvme_read_gb_per_s=read, nvme_write_gb_per_s=write, cpu_sockets=node.cpu_sockets,
        dram_gb_per_s=dram_gb_per_s(node.memory_channels, node.memory_mt_per_s)
        if node.memory_channels and node.memory_mt_per_s else None,
        socket_link_gb_per_s=node.socket_link_gb_per_s, source=node.source)


def dram_gb_per_s(channels: int, mt_per_s: int) -> float:
    """Theoretical DRAM bandwidth, decimal GB/s: channels x transfers per second x 8 B. A DDR4
    channel is 64 data bits wide (JEDEC JESD79-4), and so is a DDR5 DIMM's pair of 32-bit
    sub-channels (JESD79-5), so one transfer moves 8 B per channel."""
    return channels * mt_per_s * 8 / 1000
