"""``HostSetup``: how a job uses its hosts (model loading, data loading, checkpoints, pinned
memory) and the efficiency the clock assumes. Frozen, validated on construction.

It is read from the ``[host]`` table of a recipe TOML (the same file as the ``Recipe``), and the
CLI flags ``--load``, ``--workers`` and ``--prefetch`` override it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import ModelConfigError, Problems, did_you_mean
from .io import read_recipe_toml

__all__ = ["HostSetup", "LOAD_MODES", "DATASETS", "CHECKPOINTS"]

LOAD_MODES = ("full", "rank0", "sharded", "meta")
DATASETS = ("mmap", "in-ram", "python-objects")
CHECKPOINTS = ("sharded", "full-rank0", "full-all-ranks", "none")


@dataclass(frozen=True, kw_only=True, slots=True)
class HostSetup:
    """Host-side choices of a training job. Field names are the ``[host]`` TOML keys."""

    load: str = "full"
    """How ranks read the pretrained checkpoint: ``full`` (every local rank materialises the
    whole model on the CPU, the plain ``from_pretrained`` / ``load_state_dict`` path), ``rank0``
    (only rank 0 does, the others build on the meta device and receive a broadcast: FSDP
    ``sync_module_states`` / accelerate ``cpu_ram_efficient_loading``), ``sharded`` (each rank
    reads its own shard of a distributed checkpoint), ``meta`` (meta-device init, tensors
    streamed one unit at a time to the GPU: DeepSpeed ``zero.Init``, torchtitan)."""
    init_copy: bool = True
    """``full``/``rank0``/``sharded``: the module is first built with real (random) weights, then
    the state dict is loaded next to it: two copies at the peak (HF "big models" docs). False
    for ``low_cpu_mem_usage``/``assign=True`` loading (one copy)."""
    workers: int = 2
    """DataLoader ``num_workers`` per rank."""
    prefetch: int = 2
    """DataLoader ``prefetch_factor`` (torch default 2): batches in flight per worker."""
    pin_memory: bool = True
    """DataLoader ``pin_memory``: a pin thread copies each batch into pinned host memory."""
    dataset: str = "mmap"
    """``mmap`` (Arrow / Megatron .bin memory-mapped: page cache, not committed RAM),
    ``in-ram`` (numpy/tensor arrays in each rank's process, shared with forked workers),
    ``python-objects`` (lists/dicts of Python objects: copied into every worker by refcount
    writes, pytorch/pytorch#13246 - the worst case, once an epoch has touched everything)."""
    dataset_bytes: int = 0
    """Size of the dataset held in RAM per rank for ``in-ram`` / ``python-objects``, bytes."""
    tokenize: bool = False
    """Tokenise on the fly in the workers (raw text buffers and tokenizer throughput count)."""
    sample_bytes_per_token: int = 0
    """Bytes per token of one collated batch; 0 = 24 (input_ids, attention_mask, labels int64)."""
    checkpoint: str = "sharded"
    """How checkpoints are saved: ``sharded`` (torch.distributed.checkpoint / DeepSpeed per-rank
    files), ``full-rank0`` (FSDP FULL_STATE_DICT with offload_to_cpu + rank0_only),
    ``full-all-ranks`` (full state dict gathered on every rank: fairscale#844), ``none``."""
    async_save: bool = False
    """``sharded`` only: stage a CPU copy of the rank's shard and write it in the background
    (DCP ``async_save``)."""
    save_optimizer: bool = True
    """Checkpoints include optimizer states and fp32 master weights (resumable)."""
    keep_checkpoints: int = 1
    """Checkpoints kept on the node's local NVMe (0 when they go to shared storage)."""
    pinned: bool = True
    """Offloaded states live in pinned memory (DeepSpeed default since PR #8207, facts §2.2)."""
    numa_bound: bool = False
    """Each rank's threads, and so its pinned host memory, are bound to its GPU's NUMA node
    (``torchrun --numa-binding=node``, PyTorch >= 2.9; ``numactl --cpunodebind=N --membind=N``).
    False, torchrun's and accelerate's default: pages land on the socket the rank happened to run
    on, half of them on the far socket of a two-socket node, and their transfers cross the
    inter-socket link (``timing/host_memory.py``)."""
    pinned_rounding: bool = True
    """PyTorch rounds each pinned allocation to a power of two (pytorch/pytorch#95823); false
    with ``pinned_max_round_threshold_mb`` set."""
    matmul_efficiency: float = 0.0
    """Fraction of the GPU's dense peak that matmuls reach; 0 = the sourced default of the GPU's
    architecture and power (``timing.gemm.measured_matmul_efficiency``, ``facts/rates.toml``)."""

    def __post_init__(self) -> None:
        p = Problems()
        p.choice("load", self.load, LOAD_MODES)
        p.choice("dataset", self.dataset, DATASETS)
        p.choice("checkpoint", self.checkpoint, CHECKPOINTS)
        for name in ("workers", "dataset_bytes", "sample_bytes_per_token", "keep_checkpoints"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                p.add(f"host.{name}={value!r} must be a whole number >= 0.")
        p.positive("prefetch", self.prefetch)
        for name in ("init_copy", "pin_memory", "tokenize", "async_save", "save_optimizer",
                     "pinned", "pinned_rounding", "numa_bound"):
            if not isinstance(getattr(self, name), bool):
                p.add(f"host.{name}={getattr(self, name)!r} must be true or false (TOML "
                      f"booleans are unquoted: {name} = true).")
        if self.dataset in ("in-ram", "python-objects") and self.dataset_bytes == 0:
            p.add(f"host.dataset={self.dataset} needs dataset_bytes (the dataset's size in RAM "
                  "per rank, e.g. 20000000000), or use dataset=mmap.")
        if self.async_save and self.checkpoint != "sharded":
            p.add(f"host.async_save applies to checkpoint=sharded (DCP async_save); "
                  f"checkpoint={self.checkpoint} already gathers on the host. Drop async_save.")
        if not (isinstance(self.matmul_efficiency, (int, float))
                and 0 <= self.matmul_efficiency <= 1):
            p.add(f"host.matmul_efficiency={self.matmul_efficiency!r} must be a fraction in "
                  "(0, 1], or 0 for the sourced default of the GPU (facts/rates.toml).")
        p.raise_if_any()

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "[host]") -> HostSetup:
        """Build from plain values; unknown keys get close-match suggestions."""
        names = [f.name for f in fields(cls)]
        p = Problems()
        values = {}
        for key, value in data.items():
            name = key.replace("-", "_")
            if name not in names:
                p.add(f"{where}: unknown key {key!r}.{did_you_mean(name, names)}")
            else:
                values[name] = value
        p.raise_if_any()
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | Path) -> HostSetup:
        """The ``[host]`` table of a recipe TOML (defaults when the file has none)."""
        table = read_recipe_toml(path).get("host", {})
        if not isinstance(table, dict):
            raise ModelConfigError(f"{path}: 'host' must be a table ([host]), got {table!r}.")
        return cls.from_dict(table, where=f"{path} [host]")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
