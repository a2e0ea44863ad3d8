"""GPU memory that is not model state or activations: the CUDA context, cuBLAS workspaces,
NCCL's buffers and the caching allocator's fragmentation.

Each constant states its source (../shared/facts/host-and-overheads.md §1). With
``device = cpu`` none of these exist.
"""

from __future__ import annotations

from ..breakdown import Category, Item, Pool
from ..hardware import Device
from ..recipe import Recipe
from ..units import KIB, MIB
from .lines import Line

__all__ = ["overhead_items", "nccl_items", "fragmentation_item", "CUDA_CONTEXT_BYTES",
           "cublas_workspace_bytes"]

CUDA_CONTEXT_BYTES = 400 * MIB
"""CUDA context with lazy module loading (CUDA >= 11.7, PyTorch >= 1.13): "around 400MB"
(ptrblck, pytorch/pytorch#109888); 287 MB measured when lazy loading became default
(pytorch/pytorch#86509). Lives outside PyTorch's allocator: nvidia-smi sees it, torch does not."""

CUBLAS_HANDLES = 2
"""cuBLAS handles that run GEMMs in a training step: the Python thread (forward, optimizer) and
autograd's device thread (backward). PyTorch keeps one workspace per (handle, stream)
(``CublasHandlePool.cpp``, ``cublas_handle_stream_to_workspace``)."""


def cublas_workspace_bytes(device: Device) -> int:
    """Default cuBLAS workspace per handle: 4096 KiB x 2 + 16 KiB x 8 = 8.125 MiB before Hopper,
    32 MiB on sm90 and newer (PyTorch ``parseChosenWorkspaceSize``); 32 MiB on ROCm (128 MiB
    on MI300-class gfx942). Allocated through the caching allocator, so torch counts it."""
    if device.vendor == "amd":
        return 128 * MIB if device.arch == "cdna3" else 32 * MIB
    if device.hopper_or_newer:
        return 32 * MIB
    return 4096 * KIB * 2 + 16 * KIB * 8


def overhead_items(device: Device, on_cpu: bool) -> list[Line]:
    if on_cpu:
        return []
    return [Line(it) for it in (
        Item(category=Category.OVERHEAD, name="CUDA context", bytes=CUDA_CONTEXT_BYTES,
             pool=Pool.DEVICE, formula="~400 MiB with lazy loading (pytorch/pytorch#109888)"),
        Item(category=Category.OVERHEAD, name="cuBLAS workspaces",
             bytes=CUBLAS_HANDLES * cublas_workspace_bytes(device),
             formula=f"{CUBLAS_HANDLES} handles x per-handle workspace (CublasHandlePool.cpp)"),
    )]


NCCL_RING_BYTES = {2: 544 * MIB, 3: 688 * MIB}
"""GPU memory NCCL allocates for one communicator after its first all-reduce, measured on 4
A100s with NVLink through PyTorch: 544 MB for a group of 2 ranks, 688 MB for 3 or more
(NVIDIA/nccl#964; "MB" read as nvidia-smi's MiB). Ring collectives keep 2 connections per channel whatever the group size, and
"beyond 2 nodes it should no longer increase" (sjeaugey, NVIDIA/nccl#986)."""

NCCL_P2P_CHANNELS = 32
"""Channels NCCL opens per peer for send/recv and all-to-all (8 x H100: "as many as 32
channels are created, per pair of GPUs", NVIDIA/nccl#1685)."""

NCCL_P2P_BUFFER_BYTES = 10 * MIB + 2 * MIB
"""Buffers per channel and peer for p2p: one of 10,485,760 B and one of 2,097,152 B
(``NCCL_DEBUG_SUBSYS=ALLOC`` in NVIDIA/nccl#1685)."""


def nccl_ring_bytes(ranks: int) -> int:
    """One collective communicator of ``ranks`` ranks (NVIDIA/nccl#964); 0 for one rank."""
    if ranks < 2:
        return 0
    return NCCL_RING_BYTES[min(ranks, 3)]


def nccl_p2p_bytes(peers: int) -> int:
    """Send/recv or all-to-all buffers to ``peers`` peers (NVIDIA/nccl#1685)."""
    return peers * NCCL_P2P_CHANNELS * NCCL_P2P_BUFFER_BYTES


def nccl_items(recipe: Recipe, stage: int) -> list[Line]:
    """NCCL's own GPU memory on a rank of pipeline ``stage``, one line per process group it
    communicates in: data parallel (DDP / ZeRO / FSDP), tensor, context parallel (collective
    rings), pipeline (send/recv to 1 or 2 neighbours) and expert parallel (all-to-all to every
    other rank of the group). Allocated by NCCL outside PyTorch's caching allocator, so
    nvidia-smi sees it and ``max_memory_allocated`` does not. NVLink SHARP (NVLS) buffers and
    ``NCCL_BUFFSIZE`` / channel overrides are not modelled."""
    if recipe.platform.device == "cpu" or recipe.parallelism.gpus < 2:
        return []
    out = []
    for name, size in (("data parallel", recipe.parallelism.dp), ("tensor parallel", recipe.parallelism.tp),
                       ("context parallel", recipe.parallelism.cp)):
        if size > 1:
            out.append(Item(category=Category.COMMUNICATION, name=f"NCCL buffers ({name}, "
                            f"{size} ranks)", bytes=nccl_ring_bytes(size), pool=Pool.DEVICE,
                            formula="measured per communicator after an all-reduce: 544 MB "
                            "(2 ranks) / 688 MB (>2) on A100 NVLink (NVIDIA/nccl#964)"))
    if recipe.parallelism.pp > 1:
        peers = 2 if 0 < stage < recipe.parallelism.pp - 1 else 1
        out.append(Item(category=Category.COMMUNICATION, name=f"NCCL buffers (pipeline, "
                        f"{peers} peer{'s' if peers > 1 else ''})", bytes=nccl_p2p_bytes(peers),
                        pool=Pool.DEVICE, formula=f"{peers} x 32 channels x (10 + 2) MiB "
                        "send/recv buffers (NVIDIA/nccl#1685)"))
    if recipe.parallelism.ep > 1:
        out.append(Item(category=Category.COMMUNICATION, name=f"NCCL buffers (expert all-to-all, "
                        f"{recipe.parallelism.ep} ranks)", bytes=nccl_p2p_bytes(recipe.parallelism.ep - 1),
                        pool=Pool.DEVICE, formula=f"{recipe.parallelism.ep - 1} peers x 32 channels x "
                        "(10 + 2) MiB (NVIDIA/nccl#1685: +3.3 GB after the first all-to-all "
                        "on 8 H100s)"))
    return [Line(it) for it in out]


FRAGMENTATION_FRACTION = 0.05
"""Reserved-but-unallocated memory of the caching allocator at the peak, as a fraction of peak
allocated, for static shapes without expandable segments: 2-5 % observed, e.g. 1.83 GiB next to
75.31 GiB allocated (vllm-project/compressed-tensors PR #587, which budgets 5 %). Runs with
varying shapes, MoE or offload churn reach 10-20 % (NovaSky-AI/SkyRL PR #1470: 15.5 GiB)."""

EXPANDABLE_PAGE_BYTES = 20 * MIB
"""With ``expandable_segments:True`` the large pool maps physical memory in 20 MiB pages, so at
most about one page per stream is mapped but unused (``CUDACachingAllocator.cpp``, Note
[Expandable Segments]; pytorch/pytorch#96995)."""


def fragmentation_item(peak_allocated: int, recipe: Recipe) -> Item | None:
    """Allocator slack at the peak: ``max_memory_reserved - max_memory_allocated``."""
    if recipe.platform.device == "cpu":
        return None
    if recipe.platform.expandable_segments:
        return Item(category=Category.OVERHEAD, name="allocator slack (expandable segments)",
                    bytes=EXPANDABLE_PAGE_BYTES, pool=Pool.RESERVED,
                    formula="about one unused 20 MiB page (Note [Expandable Segments])")
    return Item(category=Category.OVERHEAD, name="allocator fragmentation",
                bytes=int(peak_allocated * FRAGMENTATION_FRACTION), pool=Pool.RESERVED,
                formula="5 % of peak allocated, static shapes (compressed-tensors PR #587); "
                "expandable_segments removes most of it")
