"""``trace(model, recipe, device) -> Breakdown``: run the real model code for two training steps
under ``FakeTensorMode`` and count every storage, without using the memory (torch required).

The model is built from its config (catalog id, config.json, or a ``module:function``) inside
``FakeTensorMode``: parameters, activations, gradients and optimizer states are fake tensors with
shapes, dtypes and storages but no data. The recipe is applied by
``memplan.runtime.workload.build_workload`` (the same code that ``validate`` runs for real) and
two steps (first + steady) run through ``memplan.runtime.stepping.measure_step``, whose storage tracker
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

from typing import Any

from ..breakdown import Breakdown, Pool
from ..errors import TraceError
from ..hardware import Device
from ..recipe import Recipe
from ..runtime.fake import fake_mode
from ..runtime.workload import Workload, build_model, build_workload, check_traceable, materialize

__all__ = ["trace", "cpu_kernels_without_cuda"]

HOW = "traced: live storage bytes under FakeTensorMode"


def cpu_kernels_without_cuda(recipe: Recipe) -> tuple[Recipe, str | None]:
    """``recipe`` and no note where its kernels can be traced. On a torch built without CUDA, a
    ``device=cuda`` recipe cannot be (a fake CUDA tensor with autograd aborts such a build,
    ``runtime.fake.fake_mode``): the same recipe on CPU kernels (flash attention becomes SDPA,
    which is what a CPU run takes), and a note saying what that leaves out."""
    import torch

    if recipe.platform.device != "cuda" or torch.backends.cuda.is_built():
        return recipe, None
    cpu = recipe.with_keys(device="cpu", attention="sdpa" if recipe.platform.attention == "flash"
                           else recipe.platform.attention)
    return cpu, (f"traced with CPU kernels (torch {torch.__version__} has no CUDA build): "
                 "attention and optimizer temporaries follow the CPU kernels, and the CUDA "
                 "context, cuBLAS workspaces and allocator slack are not included; install a "
                 "CUDA wheel of torch (no GPU needed) for CUDA kernels")


def _steps(w: Workload, steps: int) -> list[Any]:
    from ..runtime.stepping import measure_step

    return measure_step(w.model, w.batch, w.optimizer, autocast_dtype=w.autocast_dtype,
                        loss_fn=w.loss_fn, steps=steps, **w.loop)


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
    from ..runtime.steps import to_breakdown

    check_traceable(recipe)
    if recipe.platform.compile:
        raise TraceError("compile=true: trace runs the model eagerly under fake tensors, where "
                         "torch.compile's partitioner and Inductor's fusion do not run, so it "
                         "would report the eager step. Use `memplan estimate --compile` (the "
                         "compiled graph, modelled) or measure a real run (`memplan measure`, "
                         "`memplan validate`).")
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
