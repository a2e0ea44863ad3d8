"""Module groups of a model, and the hooks that turn them into moments of the step timeline.

A *group* is one block of the layer stack (the largest ``nn.ModuleList``, as in
``memplan.model.module``) or a sibling of the stack or of one of its ancestors: for a
transformers Llama, ``model.embed_tokens``, ``model.layers.0`` ... ``model.layers.N``,
``model.norm``, ``model.rotary_emb`` and ``lm_head``. Groups never nest.

``ModuleLabeller`` hooks each group so that the storage tracker (``memplan.runtime.tracker``)

- starts a moment ``forward: <group>`` when the group's forward starts, and ``forward: (model)``
  when it returns (code of the model outside every group: masks, the loss);
- starts a moment ``backward: <group>`` when the gradient of the group's output is computed,
  i.e. when autograd starts the group's backward (a tensor hook on its first output that
  requires grad); a forward re-run inside the backward (activation checkpointing) is labelled
  ``backward: <group> (recompute)``;
- credits every new storage to the running group (its *owner*); parameters, their gradients and
  optimizer states are credited to the group holding the parameter.

The hooks only read tensors and set labels: they allocate nothing, so measured bytes are the same
with or without them. Known limitation: the backward label of a group whose output does not
require grad (a frozen embedding under LoRA) is never set; its backward, if any, is reported
under the previous label.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ..breakdown import Phase

__all__ = ["ROOT", "BATCH", "OPTIMIZER", "layer_stack", "module_groups", "ModuleLabeller"]

ROOT = "(model)"
"""Owner of storages allocated by model code outside every group (masks, loss)."""
BATCH = "(batch)"
"""Owner of the batch's tensors."""
OPTIMIZER = "(optimizer)"
"""Owner of scratch the optimizer allocates and frees within its step."""


def layer_stack(model: torch.nn.Module) -> str | None:
    """Path of the ``nn.ModuleList`` with the most parameters (the layer stack), if any."""
    best, best_n = None, 0
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m):
            n = sum(p.numel() for p in m.parameters())
            if n > best_n:
                best, best_n = name, n
    return best


def module_groups(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's groups (see the module docstring), in registration order."""
    stack = layer_stack(model)
    if stack is None:
        return list(model.named_children())
    out: list[tuple[str, torch.nn.Module]] = []
    parts = stack.split(".")

    def walk(prefix: str, module: torch.nn.Module, depth: int) -> None:
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if depth < len(parts) and name == parts[depth]:
                if depth == len(parts) - 1:
                    out.extend((f"{path}.{i}", block) for i, block in child.named_children())
                else:
                    walk(path, child, depth + 1)
            else:
                out.append((path, child))

    walk("", model, 0)
    return out


class ModuleLabeller:
    """Hooks on the groups of ``model`` that label the tracker's moments and owners."""

    def __init__(self, model: torch.nn.Module, tracker: Any):
        self.tracker = tracker
        self.groups = module_groups(model)
        self.owner_of_tensor: dict[int, str] = {}
        """``id(parameter or buffer)`` -> group path (``ROOT`` for those of no group)."""
        for t in list(model.parameters()) + list(model.buffers()):
            self.owner_of_tensor[id(t)] = ROOT
        for path, module in self.groups:
            for t in list(module.parameters()) + list(module.buffers()):
                self.owner_of_tensor[id(t)] = path
        self._saved: list[str] = []
        self._handles = []
        for path, module in self.groups:
            self._handles.append(module.register_forward_pre_hook(self._pre(path)))
            self._handles.append(module.register_forward_hook(self._post(path)))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _in_backward(self) -> bool:
        return self.tracker.phase == Phase.BACKWARD

    def _pre(self, path: str):  # type: ignore[no-untyped-def]
        def hook(module: torch.nn.Module, args: Any) -> None:
            t = self.tracker
            if self._in_backward():
                t.owner = path
                t.mark(f"backward: {path} (recompute)")
                return
            self._saved.append(t.owner)
            t.owner = path
            t.mark(f"forward: {path}")

        return hook

    def _post(self, path: str):  # type: ignore[no-untyped-def]
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            t = self.tracker
            if self._in_backward():
                t.mark(f"backward: {path}")
                return
            t.owner = self._saved.pop() if self._saved else ROOT
            t.owner = t.owner or ROOT
            t.mark(f"forward: {t.owner}")
            if not torch.is_grad_enabled():
                return
            for x in tree_leaves(output):
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    x.register_hook(self._on_grad(path))
                    break

        return hook

    def _on_grad(self, path: str):  # type: ignore[no-untyped-def]
        def hook(grad: torch.Tensor) -> None:
            t = self.tracker
            t.owner = path
            t.mark(f"backward: {path}")

        return hook
