"""GPU memory that is not model state or activations: the CUDA context and cuBLAS workspaces.

Each constant states its source (../shared/facts/host-and-overheads.md §1). With
``device = cpu`` none of these exist.
"""

from __future__ import annotations

from ..breakdown import Category, Item, Pool
from ..hardware import Device
from ..units import KIB, MIB
from .lines import Line

__all__ = ["overhead_items", "CUDA_CONTEXT_BYTES", "cublas_workspace_bytes"]

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
