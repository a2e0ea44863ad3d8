"""How a measured run ended, and why where the evidence says so. Pure functions over what the
process streamed and what its parent saw (exit status, RSS from outside). No torch.

The OOM-killer rule: a process that died of SIGKILL while its resident memory (as sampled by
the parent, children included) was within ``OOM_NEAR`` of the memory limit that applies to it
(the cgroup's ``memory.max`` / ``memory.limit_in_bytes``, else ``MemTotal``) was most likely
killed by the kernel's OOM killer. Anything else that sends SIGKILL (a scheduler's hard kill
after its grace period, a user's ``kill -9``) leaves the RSS wherever it was, so far below the
limit the diagnosis says so instead.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..units import fmt_bytes

__all__ = ["CudaOom", "RunEnd", "diagnose", "memory_limit", "parse_cuda_oom", "OOM_NEAR"]

OOM_NEAR = 0.10
"""Fraction of the limit within which a SIGKILLed process counts as 'near' it. The parent samples
every interval, so the last sample can sit below the true peak by one interval's growth; and
the kernel kills when the whole cgroup (page cache included) reaches the limit."""

_UNIT = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _bytes(num: str, unit: str) -> int:
    return int(float(num) * _UNIT[unit])


@dataclass(frozen=True, kw_only=True, slots=True)
class CudaOom:
    """What a CUDA out-of-memory exception said (``torch.OutOfMemoryError``'s message)."""

    message: str
    """The exception text, first line."""
    requested_bytes: int | None = None
    """``Tried to allocate X``."""
    capacity_bytes: int | None = None
    """``GPU N has a total capacity of X``."""
    free_bytes: int | None = None
    """``of which X is free``."""
    allocated_bytes: int | None = None
    """``X is allocated by PyTorch``."""
    reserved_unallocated_bytes: int | None = None
    """``X is reserved by PyTorch but unallocated`` (fragmentation, in the allocator's words)."""
    allocator: dict[str, int] | None = None
    """``torch.cuda`` counters read when the exception was raised (CUDA only)."""
    snapshot: dict[str, Any] | None = None
    """The allocator's state when the request failed (``oom.summarize_snapshot`` of torch's OOM
    observer's snapshot; CUDA only)."""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CudaOom:
        return cls(**d)


def parse_cuda_oom(message: str, allocator: dict[str, int] | None = None) -> CudaOom:
    """The numbers in a CUDA OOM message (torch 2.x wording); those not found stay None."""
    size = r"([\d.]+) (B|KiB|MiB|GiB|TiB)"

    def find(pattern: str) -> int | None:
        m = re.search(pattern, message)
        return _bytes(m.group(1), m.group(2)) if m else None

    return CudaOom(
        message=message.strip().splitlines()[0] if message.strip() else "",
        requested_bytes=find(rf"Tried to allocate {size}"),
        capacity_bytes=find(rf"total capacity of {size}"),
        free_bytes=find(rf"of which {size} is free"),
        allocated_bytes=find(rf"{size} is allocated by PyTorch"),
        reserved_unallocated_bytes=find(rf"{size} is reserved by PyTorch but unallocated"),
        allocator=allocator)


def memory_limit(cgroup_root: Path = Path("/sys/fs/cgroup"),
                 meminfo: Path = Path("/proc/meminfo")) -> tuple[int | None, str]:
    """(bytes, where from): the cgroup's limit when one is set, else ``MemTotal``."""
    for f, name in ((cgroup_root / "memory.max", "cgroup memory.max"),
                    (cgroup_root / "memory" / "memory.limit_in_bytes",
                     "cgroup memory.limit_in_bytes")):
        try:
            raw = f.read_text().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 2**60:  # v1 writes ~2**63 for 'no limit'
            return int(raw), name
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024, "MemTotal"
    except OSError:
        pass
    return None, "unknown"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunEnd:
    """How a measured process (one rank) ended."""

    how: str
    """``completed``, ``exit`` (non-zero exit code), ``exception``, ``signal`` (a signal it
    reported), ``killed`` (died without a word: SIGKILL or the like) or ``unknown``."""
    exit_code: int | None = None
    """Exit status; None when only the parent of a launcher knows it."""
    signal: str | None = None
    """``SIGKILL``, ``SIGTERM``... when a signal ended it."""
    exception: str | None = None
    """``Type: message`` of the exception that ended it."""
    cuda_oom: CudaOom | None = None
    """The CUDA OOM details, when that was the exception."""
    last_step: int | None = None
    """Step being run at the last sample (0-based)."""
    last_phase: str | None = None
    """Phase at the last sample (None between steps)."""
    last_moment: str | None = None
    """Moment label at the last sample."""
    last_rss_bytes: int | None = None
    """Resident memory at the last sample (by the parent when it watched, children included)."""
    peak_rss_bytes: int | None = None
    """Highest resident memory seen."""
    memory_limit_bytes: int | None = None
    """The limit that applies (cgroup, else the node's RAM)."""
    memory_limit_source: str = "unknown"
    """Where ``memory_limit_bytes`` comes from."""
    gpu_used_peak_bytes: int | None = None
    """Highest GPU memory in use (NVML, all GPUs) seen by the parent; None without NVML."""
    diagnosis: str = ""
    """One sentence, where the evidence supports one."""
    report_errors: tuple[str, ...] = ()
    """Problems writing the record (a full disk): what is missing and why."""

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        d["cuda_oom"] = self.cuda_oom.to_dict() if self.cuda_oom else None
        d["report_errors"] = list(self.report_errors)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunEnd:
        kw = dict(d)
        kw["cuda_oom"] = CudaOom.from_dict(d["cuda_oom"]) if d.get("cuda_oom") else None
        kw["report_errors"] = tuple(d.get("report_errors", ()))
        return cls(**kw)


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def diagnose(*, how: str, sig: str | None, exception: str | None, cuda_oom: CudaOom | None,
             last_rss: int | None, peak_rss: int | None, limit: int | None,
             limit_source: str, where: str) -> str:
    """The diagnosis sentence of ``RunEnd`` (see the module docstring for the OOM rule)."""
    if cuda_oom is not None:
        req = f" of {fmt_bytes(cuda_oom.requested_bytes)}" if cuda_oom.requested_bytes else ""
        return f"CUDA out of memory: an allocation{req} failed {where}"
    if how == "completed":
        return "completed"
    if how in ("killed", "signal") and sig in (None, "SIGKILL"):
        rss = max(r for r in (last_rss, peak_rss, 0) if r is not None)
        if limit and rss >= (1 - OOM_NEAR) * limit:
            return (f"likely killed by the OOM killer: resident memory {fmt_bytes(rss)} reached "
                    f"{rss / limit:.0%} of the {limit_source} limit ({fmt_bytes(limit)}) {where}")
        if limit and rss:
            return (f"killed (SIGKILL or equivalent) {where}; resident memory {fmt_bytes(rss)} "
                    f"was {rss / limit:.0%} of the {limit_source} limit ({fmt_bytes(limit)}), so "
                    "not the host OOM killer by this evidence")
        return f"killed without a word (SIGKILL or equivalent) {where}"
    if how == "signal":
        return f"stopped by {sig} {where} (a scheduler's stop, or Ctrl-C)"
    if how == "exception":
        return f"raised {exception} {where}"
    return f"ended ({how}) {where}"
