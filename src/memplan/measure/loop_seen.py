"""Which training loop a measured session saw, in the terms of ``Recipe.loop`` (issue #15).

``LoopWatch`` is fed by ``Session``'s hooks and decides, from what it can observe without
running an op:

- **outputs**: ``kept`` when a tensor the model returned (the logits; a 0-d loss does not count,
  every loop keeps that) is still alive when ``optimizer.step()`` begins, by a weak reference;
  the backward has freed the graph by then, so only the loop's own variables can hold it.
  ``past_key_values`` in a kept output is reported too (``use_cache``: the K/V of every layer
  stay alive with it);
- **zero_grad**: where the gradients disappear. A step that opens with no ``.grad`` had them
  freed after the last step (``after-step``, ``set_to_none=True``); gradients present when the
  step opens and gone when its backward begins were freed in between (``before-backward``);
  present at both moments means they survive the whole step: ``set_to_none=False`` (torch 1.x's
  default) or no ``zero_grad`` at all. A wrapped ``optimizer.zero_grad`` records the
  ``set_to_none`` it was given;
- **forwards per step**: more than one means gradient accumulation;
- **optimizer_impl**: the optimizer's class and how it steps: ``fused`` / ``foreach`` /
  ``for-loop`` as set in its param group, or torch's default for the device
  (``torch/optim/optimizer.py _default_to_fused_or_foreach``, torch 2.13: foreach when every
  parameter is on a foreach device (CUDA), else the for-loop; fused is never the default);
  DeepSpeed's optimizers (``FusedAdam``, ``DeepSpeedCPUAdam``) by their class.
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

import torch

from ..runtime.book import tensors_of

__all__ = ["LoopWatch", "optimizer_impl"]


def optimizer_impl(optimizer: Any) -> str:
    """``fused`` | ``foreach`` | ``for-loop`` | ``deepspeed <Class>``: how ``optimizer`` steps."""
    cls = type(optimizer)
    if cls.__module__.startswith("deepspeed"):
        return f"deepspeed {cls.__name__}"
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if group.get("fused"):
        return "fused"
    if "foreach" not in group:
        return "for-loop"  # no foreach path (LBFGS, third-party optimizers)
    if group["foreach"] is not None:
        return "foreach" if group["foreach"] else "for-loop"
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [p for g in optimizer.param_groups for p in g["params"]]
    _, foreach = _default_to_fused_or_foreach(params, bool(group.get("differentiable")))
    return "foreach" if foreach else "for-loop"


class LoopWatch:
    """Collects the loop's traces over a session (see the module docstring)."""

    def __init__(self) -> None:
        self._outputs: list[weakref.ref[torch.Tensor]] = []
        self._cache = False
        self._forwards = 0
        self._grads_at_open: bool | None = None
        self._steps = 0
        self.outputs: Counter[str] = Counter()
        self.zero_grad: Counter[str] = Counter()
        self.set_to_none: Counter[bool] = Counter()
        self.forwards: Counter[int] = Counter()
        self.optimizer = ""
        self._params: list[torch.Tensor] = []
        self._undo: dict[int, Any] = {}

    def on_step_open(self, params: list[torch.Tensor]) -> None:
        """A step opens (its first forward): are the last step's gradients still there?"""
        self._grads_at_open = (any(p.grad is not None for p in params or self._params)
                               if self._steps else None)

    def on_output(self, output: Any) -> None:
        """The model's forward returned ``output`` (held only weakly)."""
        self._forwards += 1
        self._outputs = [weakref.ref(t) for t in tensors_of(output) if t.dim() > 0]
        self._cache = getattr(output, "past_key_values", None) is not None

    def on_backward(self, params: list[torch.Tensor]) -> None:
        """The backward of the step's first forward begins."""
        if self._grads_at_open is None:
            return
        now = any(p.grad is not None for p in params or self._params)
        if not self._grads_at_open:
            self.zero_grad["after-step"] += 1
        else:
            self.zero_grad["none (gradients kept)" if now else "before-backward"] += 1
        self._grads_at_open = None

    def on_step(self, optimizer: Any) -> None:
        """``optimizer.step()`` begins."""
        kept = any(r() is not None for r in self._outputs)
        self.outputs[("kept, with past_key_values" if self._cache else "kept") if kept
                     else "dropped"] += 1
        self.forwards[self._forwards] += 1
        self._forwards = 0
        self._steps += 1
        self.optimizer = f"{type(optimizer).__name__} {optimizer_impl(optimizer)}"
        self._params = [p for g in optimizer.param_groups for p in g["params"]]
        self.watch(optimizer)

    def watch(self, optimizer: Any) -> None:
        """Wrap ``optimizer.zero_grad`` on the instance (once) to record ``set_to_none``;
        ``close`` undoes it."""
        if id(optimizer) in self._undo or "zero_grad" in vars(optimizer):
            return
        inner = optimizer.zero_grad

        def zero_grad(set_to_none: bool = True) -> None:
            self.set_to_none[bool(set_to_none)] += 1
            inner(set_to_none=set_to_none)

        optimizer.zero_grad = zero_grad
        self._undo[id(optimizer)] = lambda: vars(optimizer).pop("zero_grad", None)

    def close(self) -> None:
        """Give every watched optimizer its own ``zero_grad`` back."""
        for undo in self._undo.values():
            undo()
        self._undo.clear()

    def record(self) -> dict[str, Any]:
        """The loop seen, for the report: the most common value of each trait (and how many
        steps showed it)."""
        def top(c: Counter[Any]) -> Any:
            return c.most_common(1)[0][0] if c else None

        return {"outputs": top(self.outputs), "zero_grad": top(self.zero_grad),
                "set_to_none": top(self.set_to_none), "forwards_per_step": top(self.forwards),
                "optimizer": self.optimizer or None, "steps": self._steps}
