"""Fake-tensor setup for tracing: ``FakeTensorMode`` on a device, plus the one transformers
patch tracing needs (its data-dependent 'packed sequences?' check). torch required.

Known limitation: transformers checks whether ``position_ids`` describe packed sequences
(``masking_utils.find_packed_sequence_indices``) and, under fake tensors, assumes they might be
and builds a (B, 1, S, S) mask; ``fake_mode`` runs the check's tensor ops and answers 'not
packed', which is true of the workload's batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import TraceError

__all__ = ["fake_mode"]


@contextlib.contextmanager
def _not_packed() -> Iterator[None]:
    """Answer transformers' data-dependent 'are these packed sequences?' with 'no'."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    import torch

    def not_packed(position_ids: Any) -> None:
        # The same tensor ops as transformers 5.23's check (so the trace allocates what the
        # real run allocates), without reading the final boolean.
        # Same locals too: their lifetimes are part of what is measured.
        first_dummy_value = position_ids[:, :1] - 1
        position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
        packed_sequence_mask = (position_diff != 1).cumsum(-1)
        (packed_sequence_mask[:, -1] == 0).all()
        return None

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = not_packed
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


@contextlib.contextmanager
def fake_mode(device: str = "cpu") -> Iterator[Any]:
    """``FakeTensorMode`` for tracing on ``device`` (plus the transformers patch above).

    Raises:
        TraceError: ``device`` is ``cuda`` and this torch has no CUDA support built in (a fake
            CUDA tensor with autograd aborts the process in a CPU-only build).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    if device == "cuda" and not torch.backends.cuda.is_built():
        raise TraceError(
            f"device=cuda tracing needs a CUDA build of torch (this is {torch.__version__}, "
            "built without CUDA); a GPU is not needed. Install a CUDA wheel of torch, or leave "
            "--device out (`memplan trace` then traces with CPU kernels and notes it), or "
            "trace with device=cpu (CPU kernels: the math differs for SDPA and the optimizer)."
        )
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    try:
        with FakeTensorMode(allow_non_fake_inputs=False) as mode, _not_packed():
            yield mode
    except DynamicOutputShapeException as e:
        raise TraceError(
            f"the model calls {e.func} whose output size depends on tensor values (MoE "
            "routing: which tokens go to which expert). Fake tensors have no values, so "
            "this model cannot be traced. Use `memplan estimate` (it models top-k routing) "
            "or `memplan measure` on a real run."
        ) from None
