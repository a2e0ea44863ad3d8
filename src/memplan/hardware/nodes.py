"""Server-node catalog: ``nodes.toml`` rows (8-GPU servers, cloud instances, a workstation),
each with its source. Used by the host-RAM / NVMe / bandwidth planning (issue #5)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ..errors import Problems, UnknownName, did_you_mean
from . import Device, check_row, get_device, normalize_name

__all__ = ["Node", "nodes", "get_node", "add_nodes", "parse_nodes"]


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
    cpu_sockets: int | None = None
    memory_channels: int | None = None
    """DRAM channels populated, all sockets together."""
    memory_mt_per_s: int | None = None
    """DIMM transfer rate as the node runs it (MT/s)."""
    socket_link_gb_per_s: float | None = None
    """Inter-socket link (UPI / xGMI), all links together, one direction, vendor figure."""
    aliases: tuple[str, ...] = ()
    source: str = ""
    notes: str = ""
    extra: dict[str, Any] | None = None
    """Row keys without a field here (cpu_model, ...), kept as given."""

    @property
    def device(self) -> Device:
        return get_device(self.gpu)


_FIELDS = {"name": str, "gpu": str, "gpus": int, "host_ram_gib": (int, float), "cpu_cores": int,
           "pcie_gen": int, "nvlink_gb_per_s": (int, float), "network_gbit_per_gpu": (int, float),
           "nvme_tb": (int, float), "nvme_read_gb_per_s": (int, float),
           "nvme_write_gb_per_s": (int, float), "cpu_sockets": int, "memory_channels": int,
           "memory_mt_per_s": int, "socket_link_gb_per_s": (int, float), "aliases": list,
           "source": str, "notes": str}
"""Typed ``[[node]]`` keys; other keys (cpu_model, ...) are kept in ``Node.extra``."""
_REQUIRED = ("name", "gpu", "gpus", "source")


def parse_nodes(rows: Any, where: str) -> dict[str, Node]:
    """Validate ``[[node]]`` rows (all problems in one ``ConfigError``; the GPU must be in the
    device catalog, user devices included) and build them."""
    problems = Problems()
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        problems.add(f"{where}: 'node' must be an array of tables ([[node]] rows).")
        problems.raise_if_any()
    for row in rows:
        typed = {k: v for k, v in row.items() if k in _FIELDS}
        check_row({"name": row.get("name", "<no name>"), **typed}, _FIELDS, (), f"{where} node",
                  problems)
        for key in _REQUIRED:
            if key not in row:
                problems.add(f"{where} node {row.get('name', '<no name>')!r}: missing required "
                             f"key {key!r}. Fix: add it (required: {', '.join(_REQUIRED)}).")
        if isinstance(row.get("gpu"), str):
            try:
                get_device(row["gpu"])
            except UnknownName as e:
                problems.add(f"{where} node {row.get('name')!r}: gpu: {e}")
    problems.raise_if_any()
    out = {}
    for row in rows:
        known = {k: v for k, v in row.items() if k in _FIELDS}
        known["aliases"] = tuple(known.get("aliases", ()))
        out[row["name"]] = Node(**known, extra={k: v for k, v in row.items() if k not in _FIELDS})
    return out


@cache
def _builtin_nodes() -> dict[str, Node]:
    text = resources.files("memplan.hardware").joinpath("nodes.toml").read_text()
    return parse_nodes(tomllib.loads(text)["node"], "nodes.toml")


_USER_NODES: dict[str, Node] = {}


def nodes() -> dict[str, Node]:
    """Every node preset by name: the built-in table plus those added by ``add_nodes``."""
    return {**_builtin_nodes(), **_USER_NODES}


def add_nodes(new: dict[str, Node]) -> None:
    """Make user-described nodes visible to ``get_node`` for the rest of the process."""
    _USER_NODES.update(new)


def get_node(name: str) -> Node:
    """The node preset called ``name`` or one of its aliases; ``UnknownName`` with close matches."""
    key = normalize_name(name)
    for node in reversed(nodes().values()):
        if key == normalize_name(node.name) or key in (normalize_name(a) for a in node.aliases):
            return node
    names = list(nodes()) + [a for n in nodes().values() for a in n.aliases]
    raise UnknownName(f"node {name!r} is not in the catalog.{did_you_mean(name, names)} "
                      f"Known: {', '.join(nodes())}.")
