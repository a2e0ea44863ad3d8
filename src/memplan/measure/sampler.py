"""Host and device samples of a measured process: RSS, CUDA allocator, NVML, pinned memory."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Nvml", "Sampler", "host_total_bytes", "nvml_used_bytes", "rss_bytes", "tree_rss_bytes"]


_statm: tuple[int, int] | None = None
"""(pid, open descriptor of ``/proc/<pid>/statm``) of this process, reopened after a fork."""


def _own_rss() -> int | None:
    """This process's RSS from ``/proc/self/statm`` read with one ``pread`` on a descriptor kept
    open: about 6 us against about 100 us for ``psutil.Process().memory_info()`` on this machine
    (the sampler's main cost in a counters-only session); the same kernel number
    (``resident`` pages, ``man 5 proc``). None where there is no procfs."""
    global _statm
    pid = os.getpid()
    try:
        if _statm is None or _statm[0] != pid:
            _statm = (pid, os.open(f"/proc/{pid}/statm", os.O_RDONLY))
        return int(os.pread(_statm[1], 128, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, AttributeError, IndexError, ValueError):  # no procfs / pread (Windows)
        return None


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of ``pid`` (this process by default): ``/proc`` for this process,
    else psutil, else ``/proc``; 0 if none can tell."""
    if pid is None and (own := _own_rss()) is not None:
        return own
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss)
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - psutil.NoSuchProcess and friends: the process is gone
        return 0
    try:
        with open(f"/proc/{pid or 'self'}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def host_total_bytes() -> int:
    """Physical memory of this machine (``MemTotal``)."""
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Nvml:
    """Used memory of one GPU through NVML, or nothing when pynvml is absent."""

    def __init__(self, index: int):
        self.handle = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._pynvml = pynvml
        except Exception:  # noqa: BLE001 - absent library or driver: degrade to no NVML
            self.handle = None

    def used(self) -> int | None:
        if self.handle is None:
            return None
        return int(self._pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)


class Sampler:
    """Takes a sample (``take``) every ``interval_s`` on a daemon thread until ``stop``."""

    def __init__(self, take: Callable[[], dict[str, Any]], interval_s: float):
        self.take, self.interval_s = take, interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memplan-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def sample(self) -> dict[str, Any]:
        s = self.take()
        self.samples.append(s)
        return s

    def stop(self) -> None:
        """Stop the thread and take a last sample."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()


def tree_rss_bytes(pid: int) -> int:
    """RSS of ``pid`` and all its descendants (DataLoader workers, torchrun's ranks); 0 once
    the process is gone. Shared pages are counted once per process, like ``ps``."""
    try:
        import psutil
    except ImportError:
        return _tree_rss_proc(pid)
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += int(p.memory_info().rss)
        except psutil.Error:
            continue
    return total


def _tree_rss_proc(pid: int) -> int:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d))
    todo, total = [pid], 0
    while todo:
        p = todo.pop()
        total += rss_bytes(p)
        todo.extend(children.get(p, ()))
    return total


def nvml_used_bytes() -> int | None:
    """Memory in use on all GPUs together (NVML), or None without pynvml or a GPU."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        return sum(int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used)
                   for i in range(n))
    except Exception:  # noqa: BLE001 - absent library or driver: no GPU reading
        return None
