"""``Traffic``: memory-bound bytes and kernel launches of one micro-batch on one rank, the
estimator's op graph summed (``estimate/activations/traffic.py``) for the step time
(``timing/step.py``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Traffic"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Traffic:
    """Memory-bound bytes and kernel launches of forward + backward (+ recompute)."""

    eager_bytes: float = 0.0
    """Bytes memory-bound kernels read and write, op by op."""
    fused_bytes: float = 0.0
    """The same with elementwise chains fused (boundary tensors only)."""
    eager_kernels: float = 0.0
    """Kernels launched op by op (GEMMs, attention and collectives included)."""
    fused_kernels: float = 0.0
    """Kernels launched with one kernel per elementwise chain."""
    eager_forward_bytes: float = 0.0
    """The part of ``eager_bytes`` the forward moves (a checkpointed group's recompute counts
    with the backward): where the step's time axis puts the forward (``timing/schedule.py``)."""
    fused_forward_bytes: float = 0.0
    """The same part of ``fused_bytes``."""

    def __add__(self, o: Traffic) -> Traffic:
        return Traffic(eager_bytes=self.eager_bytes + o.eager_bytes,
                       fused_bytes=self.fused_bytes + o.fused_bytes,
                       eager_kernels=self.eager_kernels + o.eager_kernels,
                       fused_kernels=self.fused_kernels + o.fused_kernels,
                       eager_forward_bytes=self.eager_forward_bytes + o.eager_forward_bytes,
                       fused_forward_bytes=self.fused_forward_bytes + o.fused_forward_bytes)

    def scaled(self, k: float) -> Traffic:
        return Traffic(eager_bytes=self.eager_bytes * k, fused_bytes=self.fused_bytes * k,
                       eager_kernels=self.eager_kernels * k, fused_kernels=self.fused_kernels * k,
                       eager_forward_bytes=self.eager_forward_bytes * k,
                       fused_forward_bytes=self.fused_forward_bytes * k)
