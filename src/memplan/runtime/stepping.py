"""Exact live-tensor byte counts during real PyTorch training steps.

What it measures
----------------
``measure_step`` runs a few real training steps (zero_grad, forward, loss, backward,
optimizer step) and records, at every tensor allocation and free, the number of bytes held
by live tensor storages. For each step it reports the peak, the phase it occurred in, the
peak of every phase, the bytes per category at the moment of the overall peak, and the live
bytes at the start of the step and carried out of it. Numbers are *logical* storage bytes (``numel * itemsize``
summed over distinct storages), i.e. what a perfect allocator would hold: no CUDA caching
allocator rounding (512 B blocks), fragmentation, reserved-but-unused memory, CUDA context
or kernel workspaces. This is the quantity an analytic estimator such as memplan predicts
for ``torch.cuda.max_memory_allocated`` before allocator effects.

How
---
The storage tracker of ``memplan.runtime.tracker``. ``measure_step`` runs on real tensors for
``memplan.measure`` and on fake ones for ``memplan.trace``. A
``TorchDispatchMode`` sees the outputs of every ATen op (including ops run by the autograd
engine in the backward, by ``AccumulateGrad``, by autocast's casts and by the optimizer's
``zeros_like``/``torch.tensor`` calls). Each output's ``untyped_storage()`` is keyed by its
Python object (PyTorch preserves one Python object per storage for the storage's whole life),
so views and in-place results are never double counted, and a ``weakref`` finalizer on that
object logs the free at the moment the storage is released. Storages alive before the step
(parameters, buffers, optimizer states, the batch) are registered up front. Every allocation
and free is appended to an event log; the peak is found online and the live set at the peak is
rebuilt afterwards by replaying the log, so categorising costs nothing per op.

Checked against hand-derived byte counts (``tests/test_measure_live.py``) and against the CPU
allocator's own alloc/free events from ``torch.profiler`` (``profile_memory=True``): on a tiny
Llama the step's peak-over-start agrees to within a few bytes of in-kernel scalar scratch.

``torch.distributed._tools.mem_tracker.MemTracker`` was evaluated first and not used: it
records only one overall peak (no per-phase peaks), labels every forward allocation
``ACT`` (live forward temporaries included) and every backward allocation ``TEMP`` until a
gradient hook re-labels it, so at the backward peak parameter gradients are reported as
``Temp``; everything allocated inside ``optimizer.step`` (e.g. AdamW's ``denom``) is
``Optstate``; and it refuses a second forward of the root module without
``reset_mod_stats``.

Categories (a storage gets one category for its whole life, decided at the end of the step,
first match wins):

- ``params``: parameters and module buffers of ``model``;
- ``gradients``: storages that end up as a parameter's ``.grad`` (including the interval
  between their computation in the backward and ``AccumulateGrad`` adopting them);
- ``optimizer``: tensors held in ``optimizer.state`` after ``optimizer.step`` (AdamW's
  ``exp_avg``, ``exp_avg_sq`` and the 4-byte ``step`` tensors);
- ``activations``: storages saved for backward (seen by a ``saved_tensors_hooks`` pack hook),
  storages allocated in the forward that are still alive when the forward ends (e.g. the
  returned loss, or autocast weight copies that are saved), and storages allocated during
  the backward while grad mode is enabled, i.e. activations recomputed by activation
  checkpointing (these are held by ``torch.utils.checkpoint``'s own hooks, so the pack hook
  does not see them; a short-lived intermediate of the recomputation is counted here too);
- ``temporary``: everything else: forward intermediates that die within the forward,
  gradients of activations, optimizer scratch (AdamW's ``sqrt``/``denom``), batch tensors
  that are not saved for backward (token ids usually are: ``embedding`` saves them; HF
  causal-LM labels are not, the loss saves a shifted copy).

Phases: ``forward`` (from after ``zero_grad`` through the forward and the loss, including
leaving autocast, which drops autocast's weight-cast cache, and dropping the model output),
``backward`` (``loss.backward()``) and ``optimizer-step`` (``optimizer.step()``). A phase's
peak includes the live bytes at its start.

Known limitations
-----------------
- Granularity is one ATen op: memory allocated and freed inside a kernel (CPU scratch, SDPA
  internals, cuBLAS workspaces) is invisible; the peak is taken after each op returns, with
  its inputs still alive, which is the true op-level high-water mark.
- Tensors created outside the dispatcher (``torch.from_numpy``, ``torch.frombuffer``,
  C++-wrapped Python scalars) are counted from the first op that reads them; unregistered
  tensors that existed before the step are also counted from first use, so in step 0 they
  can appear late. Steady-state numbers (step >= 1) know them from the start.
- ``UntypedStorage.resize_`` called directly (FSDP-style) is not intercepted; resizes done by
  ops (``out=``) are. Sparse and other storage-less tensors are ignored.
- Designed and tested on CPU. On CUDA the byte counts are still logical bytes (see above).
  Some kernels hold different things on CPU than on CUDA: CPU ``F.dropout`` is not fused and
  saves its scaled noise in the input dtype (CUDA's ``native_dropout`` saves a 1-byte bool
  mask); CPU SDPA with dropout falls back to the math path, which materialises and saves
  ``B*H*S*S`` tensors (in fp32 even for bf16 inputs) that CUDA's flash or memory-efficient
  kernels never create; CPU ``mse_loss`` returns a 0-d loss whose storage is the whole
  unreduced buffer.
- With non-reentrant activation checkpointing the split between ``activations`` and
  ``temporary`` for recomputed tensors is approximate (see categories); totals are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, nullcontext

import torch

from ..breakdown import Phase
from .book import (
    close_step,
    end_forward,
    mark_grads,
    mark_optimizer_state,
    mark_params,
    open_step,
    step_measurement,
    tensors_of,
)
from .labels import BATCH, OPTIMIZER, ROOT, ModuleLabeller
from .steps import CATEGORIES, PHASES, MomentMeasurement, StepMeasurement
from .tracker import StorageTracker

__all__ = ["CATEGORIES", "PHASES", "MomentMeasurement", "StepMeasurement", "measure_step"]


def _compiled_tracker(model: torch.nn.Module, batch: dict, optimizer: torch.optim.Optimizer,
                      loss_fn: Callable[[torch.nn.Module, dict], torch.Tensor],
                      autocast_dtype: torch.dtype | None, routing: ExitStack) -> StorageTracker:
    """Route Inductor's allocations through the dispatcher for as long as ``routing`` is open,
    run one untracked forward and backward of the compiled ``model`` (compilation happens here,
    outside the counted steps; the gradients are dropped again) and return the tracker the
    compiled code runs under (``memplan.runtime.compiled``)."""
    from .compiled import CompiledTracker, allocations_seen

    routing.enter_context(allocations_seen())
    with (torch.autocast(next(model.parameters()).device.type, dtype=autocast_dtype)
          if autocast_dtype is not None else nullcontext()):
        warm = loss_fn(model, batch)
    warm.backward()
    del warm
    optimizer.zero_grad(set_to_none=True)
    return CompiledTracker()


def _default_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    return model(**batch).loss


def measure_step(
    model: torch.nn.Module,
    batch: dict,
    optimizer: torch.optim.Optimizer,
    *,
    autocast_dtype: torch.dtype | None = None,
    steps: int = 2,
    loss_fn: Callable[[torch.nn.Module, dict], torch.Tensor] | None = None,
    labels: bool = True,
    outputs_kept: bool = False,
    zero_grad_at: str = "after-step",
    set_to_none: bool = True,
    grad_accum: int = 1,
    scale_in_place: bool = False,
    compile_scope: str = "",
) -> list[StepMeasurement]:
    """Run ``steps`` real training steps and count live tensor bytes in each.

    Each step is ``optimizer.zero_grad(set_to_none=True)``; ``loss = model(**batch).loss`` (or
    ``loss_fn(model, batch)``), under ``torch.autocast(<model device type>, dtype=autocast_dtype)``
    when given; ``loss.backward()``; ``optimizer.step()``. The model and optimizer are really
    updated. Returns one ``StepMeasurement`` per step; step 0 includes the creation of lazily
    initialised optimizer states, later steps are the steady state.

    With ``labels`` (the default), module hooks (``memplan.runtime.labels``) split each phase
    into moments per module group (``forward: model.layers.3``...) and credit every storage to
    the group that holds it; the hooks allocate nothing, so the numbers are the same either way.

    The loop variants of ``Recipe.loop``: ``outputs_kept`` holds ``outputs = model(**batch)``
    until the next forward returns (the loss is ``outputs.loss``; transformers models only);
    ``zero_grad_at="before-backward"`` calls ``zero_grad`` between the forward and the backward
    instead of before the forward; ``set_to_none=False`` zeroes the gradients in place.
    ``grad_accum`` micro-batches (forward and backward each, the loss divided by
    ``grad_accum``: ``loss = loss / grad_accum`` as Accelerate's and the HF course's loops
    write it, or ``loss.div_(grad_accum)`` with ``scale_in_place``) run before each
    ``optimizer.step()``.

    ``compile_scope`` (``blocks``, ``model``): the model is compiled first
    (``memplan.runtime.compiled``) and one forward and backward run untracked, so that
    compilation is done (gradients dropped again, no optimizer step); the steps are then counted
    by a tracker that lets Dynamo through, with Inductor's buffers allocated visibly.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if outputs_kept and loss_fn is not None:
        raise ValueError("outputs_kept needs the model's own output (.loss); got a loss_fn")
    if grad_accum < 1:
        raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
    if zero_grad_at not in ("after-step", "before-backward"):
        raise ValueError(f"zero_grad_at={zero_grad_at!r} is not after-step or before-backward")
    if compile_scope:
        from .compiled import compile_model
        from .labels import layer_stack

        loss_fn = compile_model(model, compile_scope, layer_stack(model)) or loss_fn
    loss_fn = loss_fn or _default_loss
    params = list(model.parameters())
    buffers = list(model.buffers())
    device_type = params[0].device.type if params else "cpu"

    routing = ExitStack()
    try:
        tracker = (_compiled_tracker(model, batch, optimizer, loss_fn, autocast_dtype, routing)
                   if compile_scope else StorageTracker())
    except BaseException:
        routing.close()
        raise
    labeller = ModuleLabeller(model, tracker) if labels else None
    owners = labeller.owner_of_tensor if labeller else {}
    results: list[StepMeasurement] = []
    outputs = None  # the loop's variable under outputs_kept
    try:
        with routing, tracker, torch.autograd.graph.saved_tensors_hooks(
            tracker.pack_hook, tracker.unpack_hook
        ):
            for step in range(steps):
                tracker.set_phase(None)
                if zero_grad_at == "after-step":  # after the last step = before this forward
                    optimizer.zero_grad(set_to_none=set_to_none)

                # State alive before the step: known by now, or registered here.
                mark_params(tracker, params + buffers, owners)
                mark_grads(tracker, params, owners)
                mark_optimizer_state(tracker, optimizer, owners)
                tracker.owner = BATCH if labeller else ""
                for t in tensors_of(batch):
                    tracker.see(t)
                tracker.owner = ROOT if labeller else ""

                open_step(tracker, step)
                for micro in range(grad_accum):
                    tracker.set_phase(Phase.FORWARD)
                    with (torch.autocast(device_type, dtype=autocast_dtype)
                          if autocast_dtype is not None else nullcontext()):
                        if outputs_kept:
                            outputs = model(**batch)  # the last outputs die only now
                            loss = outputs.loss
                        else:
                            loss = loss_fn(model, batch)
                    end_forward(tracker)
                    if zero_grad_at == "before-backward" and micro == 0:
                        optimizer.zero_grad(set_to_none=set_to_none)
                    if grad_accum > 1:
                        loss = loss.div_(grad_accum) if scale_in_place else loss / grad_accum
                    loss.backward()  # the last micro-batch's loss lives through the step
                    mark_grads(tracker, params, owners)

                tracker.set_phase(Phase.OPTIMIZER)
                tracker.owner = OPTIMIZER if labeller else ""
                optimizer.step()
                mark_optimizer_state(tracker, optimizer, owners)
                mark_grads(tracker, params, owners)

                w = close_step(tracker)
                assert w is not None
                del loss
                results.append(step_measurement(tracker, w))
    finally:
        del outputs
        tracker.close()
        if labeller is not None:
            labeller.detach()
    return results
