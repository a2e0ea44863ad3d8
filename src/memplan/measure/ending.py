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

_UNIT = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
"""``format_size`` in ``c10/cuda/CUDACachingAllocator.cpp`` writes ``N bytes`` up to 1 KiB, then
``%.2f KiB|MiB|GiB``: a parsed size is exact below 1 KiB, else within 0.005 of its unit."""


def _bytes(num: str, unit: str) -> int:
    return int(float(num) * _UNIT[unit])


@dataclass(frozen=True, kw_only=True, slots=True)
class CudaOom:
    """What a CUDA out-of-memory exception said (``torch.OutOfMemoryError``'s message).

    The numbers are those of ``DeviceCachingAllocator::malloc`` in
    ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch), printed to two decimals (see
    ``_UNIT``); a field the message does not carry stays None.
    """

    message: str
    """The exception text, first line."""
    requested_bytes: int | None = None
    """``Tried to allocate X``: the request, rounded up by the allocator."""
    device_index: int | None = None
    """``GPU N``."""
    capacity_bytes: int | None = None
    """``GPU N has a total capacity of X`` (``X total capacity`` up to torch 2.0)."""
    free_bytes: int | None = None
    """``of which X is free``: ``cudaMemGetInfo``'s free memory after the allocator released its
    cache."""
    process_used_bytes: int | None = None
    """``this process has X memory in use`` (NVML, non-PyTorch memory included; torch >= 2.1
    built with NVML)."""
    allowed_bytes: int | None = None
    """``X allowed;``: the cap of ``torch.cuda.set_per_process_memory_fraction``."""
    allocated_bytes: int | None = None
    """``X is allocated by PyTorch`` (``X already allocated`` up to torch 2.0)."""
    private_pool_bytes: int | None = None
    """``with X allocated in private pools (e.g., CUDA Graphs)``."""
    reserved_bytes: int | None = None
    """Held by the caching allocator: allocated + reserved-but-unallocated (``X reserved in total
    by PyTorch`` up to torch 2.0)."""
    reserved_unallocated_bytes: int | None = None
    """``X is reserved by PyTorch but unallocated``: cached, free to PyTorch, not to this request
    unless a free block is large enough (fragmentation, in the allocator's words)."""
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


_SIZE = r"([\d.]+) (bytes|B|KiB|MiB|GiB|TiB)"
_FIELDS: dict[str, tuple[str, ...]] = {
    # torch >= 2.1 wording first, then torch <= 2.0 (``(GPU 0; X total capacity; ...)``).
    "requested_bytes": (rf"Tried to allocate {_SIZE}",),
    "capacity_bytes": (rf"total capaci?ty of {_SIZE}", rf"{_SIZE} total capacity"),  # 2.1: capacty
    "free_bytes": (rf"of which {_SIZE} is free", rf"{_SIZE} free;"),
    "process_used_bytes": (rf"this process has {_SIZE} memory in use",),
    "allowed_bytes": (rf"{_SIZE} allowed;",),
    "allocated_bytes": (rf"{_SIZE} is allocated by PyTorch", rf"{_SIZE} already allocated"),
    "private_pool_bytes": (rf"with {_SIZE} allocated in private pools",),
    "reserved_unallocated_bytes": (rf"{_SIZE} is reserved by PyTorch but unallocated",),
    "reserved_bytes": (rf"{_SIZE} reserved in total by PyTorch",),
}


def parse_cuda_oom(message: str, allocator: dict[str, int] | None = None) -> CudaOom:
    """The numbers in a CUDA (or HIP) OOM message, torch 1.x to 2.x wording; those not found
    stay None. Reserved is derived where the wording gives only its parts: torch >= 2.1 prints
    allocated (private pools included) and reserved-unallocated, torch <= 2.0 allocated and
    reserved in total."""
    found: dict[str, int | None] = {}
    for field, patterns in _FIELDS.items():
        m = next((m for p in patterns if (m := re.search(p, message)) is not None), None)
        found[field] = _bytes(m.group(1), m.group(2)) if m else None
    alloc, unalloc, reserved = (found["allocated_bytes"], found["reserved_unallocated_bytes"],
                                found["reserved_bytes"])
    if reserved is None and alloc is not None and unalloc is not None:
        found["reserved_bytes"] = alloc + unalloc
    elif unalloc is None and alloc is not None and reserved is not None:
        found["reserved_unallocated_bytes"] = max(reserved - alloc, 0)
    gpu = re.search(r"GPU (\d+)[ ;]", message)
    return CudaOom(message=message.strip().splitlines()[0] if message.strip() else "",
                   device_index=int(gpu.group(1)) if gpu else None, allocator=allocator,
                   **found)


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
        return f"CUDA out of memory: an allocation{_oom_detail(cuda_oom)} failed {where}" + (
            _fragmented(cuda_oom))
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


def _oom_detail(oom: CudaOom) -> str:
    """`` of 2.00 GiB with 75.00 GiB allocated and 1.20 GiB reserved-unallocated of 79.10 GiB
    (1.50 GiB free)``, as far as the message told."""
    out = f" of {fmt_bytes(oom.requested_bytes)}" if oom.requested_bytes else ""
    if oom.allocated_bytes is not None:
        out += f" with {fmt_bytes(oom.allocated_bytes)} allocated"
        if oom.reserved_unallocated_bytes is not None:
            out += f" and {fmt_bytes(oom.reserved_unallocated_bytes)} reserved-unallocated"
    if oom.capacity_bytes:
        out += f" of {fmt_bytes(oom.capacity_bytes)}"
        if oom.free_bytes is not None:
            out += f" ({fmt_bytes(oom.free_bytes)} free)"
    return out


def _fragmented(oom: CudaOom) -> str:
    """A fragmentation note when the allocator's cache held more free bytes than the request.
    Before raising, ``malloc`` has released every cached segment it could ("the only remaining
    'cached' memory is split from a larger block that is partially in-use",
    ``CUDACachingAllocator.cpp``), so those bytes are free pieces none of which fit the request;
    the snapshot's largest free block, when there is one, shows it. The advice is torch's own,
    from the same OOM message."""
    req, cached = oom.requested_bytes, oom.reserved_unallocated_bytes
    if not req or cached is None or cached < req:
        return ""
    largest = (oom.snapshot or {}).get("largest_free_block_bytes")
    block = (f", its largest free block {fmt_bytes(largest)}" if isinstance(largest, int)
             else "")
    return (f"; {fmt_bytes(cached)} was reserved but unallocated{block}: fragmentation "
            "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, torch's advice)")
