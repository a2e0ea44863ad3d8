"""GPU catalog: ``devices.toml`` rows (each with its source) and lookup by name.

An unknown name raises ``UnknownDevice`` with close matches; it never becomes another GPU.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ..errors import UnknownDevice, did_you_mean
from ..results import DeviceInfo
from ..units import GB, MIB

__all__ = ["Device", "devices", "get_device", "cpu_device"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Device:
    """One accelerator as torch sees it (one GCD for MI250X)."""

    name: str
    """Canonical name, e.g. ``H100-80GB``."""
    vendor: str
    arch: str
    memory_gb: float
    """Marketed capacity, decimal GB."""
    memory_total_mib: int | None = None
    """Total memory as nvidia-smi / ``get_device_properties().total_memory`` report it, MiB."""
    memory_torch_mib: int | None = None
    """``torch.cuda.get_device_properties().total_memory`` in MiB, where one was measured: what a
    process can really fill (0.35-0.75 GiB below nvidia-smi's total)."""
    hbm_gb_per_s: float | None = None
    tflops: dict[str, float] | None = None
    """Dense peak TFLOP/s per dtype (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``)."""
    interconnect: str = ""
    interconnect_gb_per_s: float | None = None
    pcie_gen: int | None = None
    compute_capability: str = ""
    aliases: tuple[str, ...] = ()
    source: str = ""
    notes: str = ""

    @property
    def capacity_bytes(self) -> int:
        """Bytes a process can fill: torch's ``total_memory`` when the catalog has a measurement,
        else the nvidia-smi total, else the marketed decimal GB."""
        if self.memory_torch_mib:
            return self.memory_torch_mib * MIB
        if self.memory_total_mib:
            return self.memory_total_mib * MIB
        return int(self.memory_gb * GB)

    @property
    def hopper_or_newer(self) -> bool:
        return self.arch in ("hopper", "blackwell")

    def info(self) -> DeviceInfo:
        """The result-side description of this device (``Breakdown.device``)."""
        return DeviceInfo(name=self.name, vendor=self.vendor, arch=self.arch,
                          memory_gb=self.memory_gb, capacity_bytes=self.capacity_bytes,
                          hbm_gb_per_s=self.hbm_gb_per_s, tflops=self.tflops or {},
                          interconnect=self.interconnect, source=self.source)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vendor": self.vendor,
            "arch": self.arch,
            "memory_gb": self.memory_gb,
            "capacity_bytes": self.capacity_bytes,
            "hbm_gb_per_s": self.hbm_gb_per_s,
            "tflops": self.tflops or {},
            "interconnect": self.interconnect,
            "source": self.source,
        }


def _row(d: dict[str, Any]) -> Device:
    tflops = {k.removeprefix("tflops_"): float(v) for k, v in d.items() if k.startswith("tflops_")}
    return Device(
        name=d["name"], vendor=d["vendor"], arch=d.get("arch", ""), memory_gb=d["memory_gb"],
        memory_total_mib=d.get("memory_total_mib"), memory_torch_mib=d.get("memory_torch_mib"),
        hbm_gb_per_s=d.get("hbm_gb_per_s"),
        tflops=tflops, interconnect=d.get("interconnect", ""),
        interconnect_gb_per_s=d.get("interconnect_gb_per_s"), pcie_gen=d.get("pcie_gen"),
        compute_capability=str(d.get("compute_capability", "")),
        aliases=tuple(d.get("aliases", ())), source=d.get("source", ""), notes=d.get("notes", ""),
    )


@cache
def devices() -> dict[str, Device]:
    """Every catalog device by canonical name (read on first use)."""
    text = resources.files("memplan.hardware").joinpath("devices.toml").read_text()
    return {row["name"]: _row(row) for row in tomllib.loads(text)["device"]}


def normalize_name(name: str) -> str:
    """Catalog-name matching key: case, spaces, '-', '_' and '.' do not matter."""
    return re.sub(r"[\s_\-.]", "", name.lower())


def get_device(name: str) -> Device:
    """The device named ``name`` or one of its aliases (case, spaces, '-' and '_' ignored).

    Raises:
        UnknownDevice: no such device; the message suggests close names.
    """
    key = normalize_name(name)
    for dev in devices().values():
        if key == normalize_name(dev.name) or key in (normalize_name(a) for a in dev.aliases):
            return dev
    names = list(devices()) + [a for d in devices().values() for a in d.aliases]
    raise UnknownDevice(
        f"GPU {name!r} is not in the catalog.{did_you_mean(name, names)} "
        f"Known: {', '.join(devices())}. `memplan gpus` lists them with their memory."
    )


def cpu_device(memory_bytes: int) -> Device:
    """A stand-in for ``--device cpu`` runs: capacity is the host's memory."""
    return Device(name="cpu", vendor="cpu", arch="cpu", memory_gb=memory_bytes / GB,
                  source="host memory (psutil or /proc/meminfo)")
