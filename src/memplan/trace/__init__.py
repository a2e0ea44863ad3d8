"""``trace(model, recipe, device) -> Breakdown``: run the real model code for two training steps
under ``FakeTensorMode`` and count every storage, without using the memory (torch required).

The model is built from its config (catalog id, config.json, or a ``module:function``) inside
``FakeTensorMode``: parameters, activations, gradients and optimizer states are fake tensors with
shapes, dtypes and storages but no data. The recipe is applied by
``memplan.trace.workload.build_workload`` (the same code that ``validate`` runs for real) and
two steps (first + steady) run through ``memplan.measure.measure_step``, whose storage tracker
and module labels work unchanged on fake storages. A 70B model traces on a laptop.

Kernel choices are those of ``recipe.platform.device``: with ``cpu`` the CPU kernels (the ones a real CPU
run takes, so trace and a real CPU run agree exactly; ``tests/test_trace.py``); with ``cuda``
fake CUDA tensors, so CUDA-only choices apply (SDPA's flash / memory-efficient kernels, the
``foreach`` optimizer). Fake CUDA tensors need a CUDA build of torch, not a GPU.

Known limitations
-----------------
- Data-dependent Python branches cannot read fake values. transformers checks whether
  ``position_ids`` describe packed sequences (``masking_utils.find_packed_sequence_indices``)
  and, under fake tensors, assumes they might be and builds a (B, 1, S, S) mask; the tracer
  runs the check's tensor ops and answers 'not packed', which is true of its batch. Other models' data-dependent
  branches (MoE routing counts, vision towers) may take their 'tracing' path.
- Like ``measure_step``: logical storage bytes, no allocator rounding, fragmentation or slack,
  no memory allocated and freed inside a kernel (cuBLAS / SDPA workspaces), no CUDA context.
- One rank: no process group, ZeRO, TP/PP or offload (``check_traceable``).
- Autocast's weight-cast cache behaves differently on fake tensors in one case seen so far:
  BERT's MLM-head bias under ``bf16-mixed`` (a 2 KiB bf16 copy, 0.007% of that case's peak).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..breakdown import Breakdown, Pool
from ..errors import TraceError
from ..hardware import Device
from ..recipe import Recipe
from .workload import Workload, build_model, build_workload, check_traceable, materialize

__all__ = ["trace", "fake_mode", "check_traceable", "build_model", "build_workload", "Workload"]

HOW = "traced: live storage bytes under FakeTensorMode"


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
            "built without CUDA); a GPU is not needed. Install a CUDA wheel of torch, or "
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


def _steps(w: Workload, steps: int) -> list[Any]:
    from ..measure import measure_step

    return measure_step(w.model, w.batch, w.optimizer, autocast_dtype=w.autocast_dtype,
                        loss_fn=w.loss_fn, steps=steps)


def trace(model: str, recipe: Recipe, device: Device, *, steps: int = 2) -> Breakdown:
    """Trace ``steps`` training steps of ``model`` with ``recipe`` under fake tensors.

    Args:
        model: catalog id, config.json / model directory, or ``package.module:function``.
        recipe: the training recipe; ``recipe.platform.device`` picks CPU or CUDA kernels.
        device: the device row reported with the result (``cpu_device`` or a GPU).
        steps: steps to run (2: the first step and the steady state).

    Raises:
        TraceError: the recipe needs more than one process, or kernels torch lacks.
    """
    from ..estimate.overhead import overhead_items
    from ..measure.result import to_breakdown

    check_traceable(recipe)
    if recipe.optimizer.kind == "adafactor":
        raise TraceError("optimizer=adafactor: torch.optim.Adafactor reads a tensor's value "
                         "(.item()) in its step, which fake tensors cannot give; trace with "
                         "adamw, adam, sgd or sgd-momentum (a real run supports adafactor).")
    built = build_model(model, recipe, device="meta")
    with fake_mode(recipe.platform.device):
        materialize(built.model, recipe.platform.device)
        w = build_workload(built, recipe)
        measured = _steps(w, steps)
    outside: tuple = ()
    notes = list(w.notes)
    if recipe.platform.device == "cuda":
        outside = tuple(ln.item for ln in overhead_items(device, on_cpu=False)
                        if ln.item.pool == Pool.DEVICE)
        notes.append("CUDA: allocator slack and cuBLAS/kernel workspaces are not traced; "
                     "the CUDA context line is the estimator's constant.")
    return to_breakdown(measured, source="trace", how=HOW, model=w.info,
                        recipe=recipe.to_dict(), device=device.info(), outside=outside,
                        notes=tuple(notes))
