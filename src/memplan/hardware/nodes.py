"""Server-node catalog: ``nodes.toml`` rows (8-GPU servers, cloud instances, a workstation),
each with its source. Used by the host-RAM / NVMe / bandwidth planning (issue #5)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ..errors import UnknownName, did_you_mean
from . import Device, get_device, normalize_name

__all__ = ["Node", "nodes", "get_node"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Node:
    name: str
    gpu: str
    """Canonical GPU name from devices.toml."""
    gpus: int
    host_ram_gib: float | None = None
    cpu_cores: int | None = None
    pcie_gen: int | None = None
    nvlink_gb_per_s: float | None = None
    network_gbit_per_gpu: float | None = None
    nvme_tb: float | None = None
    nvme_read_gb_per_s: float | None = None
    nvme_write_gb_per_s: float | None = None
    aliases: tuple[str, ...] = ()
    source: str = ""
    notes: str = ""
    extra: dict[str, Any] | None = None
    """Row keys without a field here (cpu_model, sockets, channels...), kept as given."""

    @property
    def device(self) -> Device:
        return get_device(self.gpu)


_FIELDS = {"name", "gpu", "gpus", "host_ram_gib", "cpu_cores", "pcie_gen", "nvlink_gb_per_s",
           "network_gbit_per_gpu", "nvme_tb", "nvme_read_gb_per_s", "nvme_write_gb_per_s",
           "aliases", "source", "notes"}


@cache
def nodes() -> dict[str, Node]:
    text = resources.files("memplan.hardware").joinpath("nodes.toml").read_text()
    out = {}
    for row in tomllib.loads(text)["node"]:
        known = {k: v for k, v in row.items() if k in _FIELDS}
        known["aliases"] = tuple(known.get("aliases", ()))
        out[row["name"]] = Node(**known, extra={k: v for k, v in row.items() if k not in _FIELDS})
    return out


def get_node(name: str) -> Node:
    """The node preset called ``name`` or one of its aliases; ``UnknownName`` with close matches."""
    key = normalize_name(name)
    for node in nodes().values():
        if key == normalize_name(node.name) or key in (normalize_name(a) for a in node.aliases):
            return node
    names = list(nodes()) + [a for n in nodes().values() for a in n.aliases]
    raise UnknownName(f"node {name!r} is not in the catalog.{did_you_mean(name, names)} "
                      f"Known: {', '.join(nodes())}.")
