"""Memory-bound traffic of PyTorch's ring attention for context parallelism (torchtitan's CP:
``torch.distributed.tensor.experimental.context_parallel``), per layer and micro-batch on the
busiest rank of a CP group.

Source: ``torch/distributed/tensor/experimental/_context_parallel/_attention.py`` (torch 2.13,
``_templated_ring_attention`` / ``_backward``; the stored pytorch/pytorch 2025 version of
``experimental/_attention.py`` @0123248 has the same loop). torchtitan @9dec370 (the Dec 2024
H100 benchmarks) calls ``context_parallel`` with the default options: ``convert_to_f32 =
True``, ``enable_load_balance = True`` (each rank holds chunks ``r`` and ``2 cp - 1 - r``, so
every rank does the same attention FLOPs: no causal imbalance), ``rotate_method =
"allgather"`` (one K/V all-gather per call, overlapped with the first hop's kernel).

The loop runs ``cp`` SDPA kernels per layer and pass (one per K/V block) and merges them
outside the kernel, in fp32, with separate elementwise ops. Per element ``E_q`` of the rank's
attention output (tokens x heads x head dim) and ``E_kv`` of its K (or V):

- **forward** (``_SDPAMerger``): the first block's output is cast to fp32 (2 B read, 4 B
  written); each later hop casts (6 B), then ``out - block_out`` (12 B), ``x sigmoid(...)`` (8
  B) and ``out - ...`` (12 B): 38 B on the last CP rank, whose hops all use the full query
  (hops with ``i <= rank``); the result is cast back to 16 bits (6 B). Total ``E_q (12 + 38
  (cp - 1))``.
- **backward**: fp32 accumulators for dq, dk, dv are zero-filled (4 B each); every hop adds
  the block's 16-bit gradient into dq (read 4 + 2, write 4: 10 B) and dk, dv (the last rank's
  hops ``i >= 1`` update half of them in place, 5 B, then ``torch.cat`` the halves, 8 B: 13 B;
  hop 0 adds in full, 10 B) and concatenates dk, dv into the fp32 send buffer (8 B each); dq
  and the received dk, dv are cast back to 16 bits (6 B each). Total ``E_q (10 + 10 cp) +
  E_kv (56 + 42 (cp - 1))``.

The forward runs again in the backward where the layer is recomputed (``full`` checkpoint).

**Known limitations**: the last rank's traffic is charged (rank 0's half-query hops move
fewer bytes); the fp32 gradient blocks rotated between ranks (``dkv_rotater``) are not added
to the CP link time (they overlap the next hop's kernel); under ``torch.compile`` Inductor may
fuse some of these ops (charged as eager).
"""

from __future__ import annotations

from ..model.spec import ModelSpec

__all__ = ["RING_ENGINES", "ring_merge_bytes"]

RING_ENGINES = ("torchtitan", "fsdp2")
"""Engines whose CP is PyTorch's ``context_parallel`` (torchtitan's ``--context_parallel_
degree``; FSDP2 stacks use the same API). Megatron's CP is Transformer Engine's, not this."""


def ring_merge_bytes(model: ModelSpec, tokens: float, tp: int, cp: int) -> tuple[float, float]:
    """(forward, backward) bytes of the merges of one layer of ``model`` for ``tokens`` local
    tokens (micro-batch x sequence / cp) on one rank (module docstring); (0, 0) for ``cp`` 1."""
    if cp <= 1:
        return 0.0, 0.0
    att = next((ly.attention for ly in model.layers if ly.attention), None)
    if att is None:
        return 0.0, 0.0
    e_q = tokens * att.num_heads * att.v_head_dim / tp
    e_kv = tokens * att.num_kv_heads * att.head_dim / tp
    forward = e_q * (12 + 38 * (cp - 1))
    backward = e_q * (10 + 10 * cp) + e_kv * (56 + 42 * (cp - 1))
    return forward, backward
