"""The rate of the host's Adam step under optimizer offload (issue #19): how many elements one
core updates per second with the implementation the engine steps (``recipe.engine.host_adam``:
DeepSpeed's CPU Adam, Megatron's fused torch AdamW, or torch.optim's fused, foreach or for-loop
path as the recipe resolves it).

The for-loop's rate is ``cpu_adam_elements_per_s_per_core`` (an FSDP2 CPU AdamW); DeepSpeed's
CPU Adam and torch's fused CPU AdamW run ``cpu_adam_vectorised_speedup`` times faster. torch's
foreach path is kept at the for-loop's rate: 1.4x it on this repository's 2-core machine, with
no server figure.
"""

from __future__ import annotations

from ..facts.constants import constant
from ..recipe import Recipe
from ..recipe.engine import host_adam

__all__ = ["cpu_adam_impl", "cpu_adam_rate", "CPU_ADAM_NAMES", "SLOW_CPU_ADAM"]

CPU_ADAM_NAMES = {
    "deepspeed": "DeepSpeed's CPU Adam",
    "fused": "torch's fused CPU AdamW",
    "foreach": "torch's foreach AdamW, counted at the for-loop's rate",
    "foreach-torch2.0": "torch's foreach AdamW, counted at the for-loop's rate",
    "for-loop": "torch's for-loop AdamW, its CPU default",
}
"""How the explanation names each implementation."""

_VECTORISED = ("deepspeed", "fused")

SLOW_CPU_ADAM = ("for-loop", "foreach", "foreach-torch2.0")
"""torch.optim paths stepped at the for-loop's rate: ``--optimizer-impl fused`` is faster."""


def cpu_adam_impl(recipe: Recipe) -> str:
    """The implementation that steps ``recipe``'s offloaded optimizer on the host: a key of
    ``CPU_ADAM_NAMES``."""
    return host_adam(recipe.engine_kind, recipe.optimizer_impl)


def cpu_adam_rate(impl: str) -> float:
    """Elements per second one physical core updates with ``impl``."""
    rate = constant("cpu_adam_elements_per_s_per_core")
    return rate * constant("cpu_adam_vectorised_speedup") if impl in _VECTORISED else rate
