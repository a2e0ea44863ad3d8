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

from ..errors import Problems, UnknownDevice, did_you_mean
from ..results import DeviceInfo
from ..units import GB, MIB

__all__ = ["Device", "devices", "get_device", "cpu_device", "add_devices", "parse_devices"]


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
    sm_count: int | None = None
    """Streaming multiprocessors (the GEMM's wave size, ``timing/gemm.py``); None = unknown."""
    tdp_w: float | None = None
    """The board's rated power (TDP), W; None = unknown."""
    power_limit_w: float | None = None
    """The power limit the GPUs run at (``nvidia-smi -pl``), W, where it is below the TDP (e.g.
    torchtitan's Grand Teton H100s at 500 W); None = the TDP. ``timing/gemm.py`` sustains
    less GEMM throughput per SM below about 5.3 W per SM (``power_limited_share``)."""
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
    def power_w(self) -> float | None:
        """The power the board may draw: the set limit, else the TDP; None = unknown."""
        return self.power_limit_w or self.tdp_w

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


_DEVICE_KEYS = {
    "name": str, "vendor": str, "arch": str, "memory_gb": (int, float),
    "memory_total_mib": int, "memory_torch_mib": int, "memory_total_source": str,
    "hbm_gb_per_s": (int, float), "interconnect": str, "interconnect_gb_per_s": (int, float),
    "pcie_gen": int, "pcie_lanes": int, "tdp_w": (int, float), "compute_capability": (str, float),
    "sm_count": int, "power_limit_w": (int, float),
    "aliases": list, "source": str, "notes": str,
}
"""Every key a ``[[device]]`` row may have, with its TOML type; ``tflops_<dtype>`` keys are
numbers too. Built-in and user tables (``--hardware FILE``) go through the same check."""
_DEVICE_REQUIRED = ("name", "vendor", "memory_gb", "source")
_TFLOPS_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")


def check_row(row: dict[str, Any], keys: dict[str, Any], required: tuple[str, ...],
              where: str, problems: Problems, *, tflops: bool = False) -> None:
    """Record in ``problems`` every missing, unknown or mistyped key of one table row."""
    label = f"{where} {row.get('name', '<no name>')!r}"
    for key in required:
        if key not in row:
            problems.add(f"{label}: missing required key {key!r}. Fix: add it (required: "
                         f"{', '.join(required)}).")
    for key, value in row.items():
        if tflops and key.startswith("tflops_"):
            if key.removeprefix("tflops_") not in _TFLOPS_DTYPES:
                problems.add(f"{label}: unknown key {key!r}; tflops dtypes are "
                             f"{', '.join(_TFLOPS_DTYPES)}.")
            want: Any = (int, float)
        elif key not in keys:
            problems.add(f"{label}: unknown key {key!r}.{did_you_mean(key, keys)} Known keys: "
                         f"{', '.join(keys)}.")
            continue
        else:
            want = keys[key]
        if not isinstance(value, want) or isinstance(value, bool):
            problems.add(f"{label}: {key}={value!r} has the wrong type; expected "
                         f"{_type_names(want)}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            problems.add(f"{label}: {key}={value!r} must be > 0.")


def _type_names(want: Any) -> str:
    kinds = want if isinstance(want, tuple) else (want,)
    return " or ".join({"str": "a string", "int": "an integer", "float": "a number",
                        "list": "a list"}[k.__name__] for k in kinds)


def _row(d: dict[str, Any]) -> Device:
    tflops = {k.removeprefix("tflops_"): float(v) for k, v in d.items() if k.startswith("tflops_")}
    return Device(
        name=d["name"], vendor=d["vendor"], arch=d.get("arch", ""), memory_gb=d["memory_gb"],
        memory_total_mib=d.get("memory_total_mib"), memory_torch_mib=d.get("memory_torch_mib"),
        hbm_gb_per_s=d.get("hbm_gb_per_s"),
        tflops=tflops, interconnect=d.get("interconnect", ""),
        interconnect_gb_per_s=d.get("interconnect_gb_per_s"), pcie_gen=d.get("pcie_gen"),
        compute_capability=str(d.get("compute_capability", "")), sm_count=d.get("sm_count"),
        tdp_w=d.get("tdp_w"), power_limit_w=d.get("power_limit_w"),
        aliases=tuple(d.get("aliases", ())), source=d.get("source", ""), notes=d.get("notes", ""),
    )


def parse_devices(rows: Any, where: str) -> dict[str, Device]:
    """Validate ``[[device]]`` rows (all problems in one ``ConfigError``) and build them."""
    problems = Problems()
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        problems.add(f"{where}: 'device' must be an array of tables ([[device]] rows).")
        problems.raise_if_any()
    seen: set[str] = set()
    for row in rows:
        check_row(row, _DEVICE_KEYS, _DEVICE_REQUIRED, f"{where} device", problems, tflops=True)
        key = normalize_name(str(row.get("name", "")))
        if key in seen:
            problems.add(f"{where}: device {row.get('name')!r} appears twice. Fix: keep one row.")
        seen.add(key)
    problems.raise_if_any()
    return {row["name"]: _row(row) for row in rows}


@cache
def _builtin_devices() -> dict[str, Device]:
    text = resources.files("memplan.hardware").joinpath("devices.toml").read_text()
    return parse_devices(tomllib.loads(text)["device"], "devices.toml")


_USER_DEVICES: dict[str, Device] = {}
"""Devices added at run time (``--hardware FILE``, ``--gpu-memory``); see ``add_devices``."""


def devices() -> dict[str, Device]:
    """Every catalog device by canonical name (built-in table read on first use), plus those
    added by ``add_devices`` (a user row replaces a built-in one of the same name)."""
    return {**_builtin_devices(), **_USER_DEVICES}


def add_devices(new: dict[str, Device]) -> None:
    """Make user-described devices visible to ``get_device`` for the rest of the process."""
    _USER_DEVICES.update(new)


def normalize_name(name: str) -> str:
    """Catalog-name matching key: case, spaces, '-', '_' and '.' do not matter."""
    return re.sub(r"[\s_\-.]", "", name.lower())


def get_device(name: str) -> Device:
    """The device named ``name`` or one of its aliases (case, spaces, '-' and '_' ignored).

    Raises:
        UnknownDevice: no such device; the message suggests close names.
    """
    key = normalize_name(name)
    for dev in reversed(devices().values()):
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
