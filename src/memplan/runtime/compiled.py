"""Measuring ``torch.compile``'d training steps: compile the model the way an engine does, and
let the storage tracker see what Inductor's generated code allocates.

Two obstacles, both in torch 2.13:

- Dynamo does not compile while a ``TorchDispatchMode`` is active (``_dynamo/convert_frame.py``:
  "non-infra torch dispatch mode present"): the step would silently run eager. A mode whose
  ``ignore_compile_internals()`` is True is let through, and sees the ops the compiled code
  dispatches at run time (``torch/utils/_python_dispatch.py``).
- Inductor's CPU wrapper allocates its buffers with ``torch._C._dynamo.guards._empty_strided_cpu``,
  a C++ fast path past the dispatcher. While compiling and measuring, that name points to a
  function calling ``torch.empty_strided`` (a dispatched op: the tracker sees each buffer and its
  free); the generated code binds the name when its module is loaded, so it is patched before
  the first compile. Kernels are unchanged; only the allocation call goes through Python.

``compile_model`` applies a scope of ``Recipe.platform.compile_scope``: ``blocks`` compiles each
layer of the model's layer stack and the loss (torchtune ``training.compile_model`` /
``compile_loss``; torchtitan ``apply_compile``), ``model`` the whole model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .tracker import StorageTracker

__all__ = ["CompiledTracker", "compile_model", "allocations_seen"]


class CompiledTracker(StorageTracker):
    """A ``StorageTracker`` that torch.compile runs under (``ignore_compile_internals``). The
    compiled backward of a checkpointed block calls higher-order operators
    (``run_and_save_rng_state``); they pass through the tracker like any op."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


@contextmanager
def allocations_seen() -> Iterator[None]:
    """Route Inductor's CPU and CUDA buffer allocations through the dispatcher (module
    docstring); code compiled while this is open allocates visibly for good."""
    guards = torch._C._dynamo.guards
    fast = {"_empty_strided_cpu": "cpu", "_empty_strided_cuda": "cuda"}
    saved = {name: getattr(guards, name) for name in fast if hasattr(guards, name)}

    def routed(device: str) -> Callable[..., torch.Tensor]:
        def empty_strided(size: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
            return torch.empty_strided(size, stride, dtype=dtype, device=device)
        return empty_strided

    for name in saved:
        setattr(guards, name, routed(fast[name]))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(guards, name, fn)


def compile_model(model: torch.nn.Module, scope: str, stack: str | None
                  ) -> Callable[[torch.nn.Module, dict], torch.Tensor] | None:
    """Compile ``model`` in place under ``scope``; returns the loss function the step must use
    (``blocks``: the causal-LM loss compiled on its own, outside the model), or None for the
    model's own ``.loss``. ``stack``: the layer stack's module path (``labels.layer_stack``)."""
    # a fresh Dynamo cache: each new model instance recompiles the same code objects, and past
    # ``recompile_limit`` (8) Dynamo falls back to eager without an error (validate runs many
    # models in one process)
    torch._dynamo.reset()
    if scope == "model":
        model.compile()
        return None
    if scope != "blocks":
        raise ValueError(f"compile_scope={scope!r} is not one of blocks, model")
    if not stack:
        raise ValueError("compile_scope='blocks' needs a model with a layer stack")
    for layer in model.get_submodule(stack):
        layer.compile()
    from transformers.loss.loss_utils import ForCausalLMLoss

    vocab = model.get_output_embeddings().weight.shape[0]
    loss = torch.compile(ForCausalLMLoss)

    def blocks_loss(m: torch.nn.Module, batch: dict) -> torch.Tensor:
        logits = m(input_ids=batch["input_ids"]).logits
        return loss(logits, batch["labels"], vocab_size=vocab)

    return blocks_loss
