"""Memory-bound copies FSDP2 (``fully_shard``; torchtitan) runs on the compute stream around
its collectives, per rank and step.

Source: ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` (torch 2.13, the venv's;
the same ops since torch 2.4, the version torchtitan's Dec 2024 H100 benchmarks ran on):

- **all-gather copy-out** (``foreach_all_gather_copy_out`` -> ``torch.ops.fsdp.
  split_with_sizes_copy``): the flat all-gather output (every rank's shard, ``param_dtype``) is
  copied into the unsharded parameters: each gathered element is read once and written once,
  ``2 x param bytes``. It runs in ``wait_for_unshard`` on the current (compute) stream, so it
  is GPU time on the critical path; once per all-gather: forward and, with
  ``reshard_after_forward``, again in the backward (``FSDPParamGroup.pre_backward``).
- **reduce-scatter copy-in** (``foreach_reduce`` -> ``foreach_reduce_scatter_copy_in`` ->
  ``torch.ops.fsdp.chunk_cat``): the unsharded gradients (compute dtype) are written into one
  flat ``reduce_dtype`` buffer, rank-chunked: read ``grad bytes``, write ``reduce bytes`` per
  element. It runs on the current stream before ``reduce_scatter_stream.wait_stream(
  current_stream)``, once per micro-batch (FSDP2 reduces every backward by default).
  torchtitan's ``mixed_precision_reduce`` defaults to ``float32`` (4 B written per element).

Left out: the all-gather copy-in (``all_gather_copy_in``: the fp32 shard cast to
``param_dtype`` and copied into the send buffer) runs on ``all_gather_copy_in_stream``, beside
the compute, and moves only ``1/n`` of the unit; the post-reduce view of the sharded gradient
is ``as_strided`` (no copy) when ``reduce_dtype`` is the parameter's dtype.

**Known limitations**: the gathered elements are the stage's trainable ones (frozen base
weights under LoRA are gathered too, as ``stage.py``'s DP gather also leaves out); the copies
are charged at the usable HBM rate like the other memory-bound kernels.
"""

from __future__ import annotations

__all__ = ["COPY_ENGINES", "fsdp2_copy_bytes"]

COPY_ENGINES = ("fsdp2", "torchtitan")
"""Engines that run ``fully_shard`` (FSDP1 gathers into its flat parameter in place: no
copy-out)."""


def fsdp2_copy_bytes(elements: float, *, gathers: float, reduces: float, param_bytes: float,
                     grad_bytes: float, reduce_bytes: float) -> float:
    """HBM bytes of FSDP2's copy-out and reduce-scatter copy-in for ``elements`` unsharded
    parameter elements on one rank: ``gathers x 2 x param_bytes + reduces x (grad_bytes +
    reduce_bytes)``, per element (module docstring)."""
    return elements * (gathers * 2 * param_bytes + reduces * (grad_bytes + reduce_bytes))
