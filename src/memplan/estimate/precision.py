"""Which dtype each model state is stored in, per precision recipe.

| precision            | trainable params | grads      | optimizer states | fp32 master | frozen |
|----------------------|------------------|------------|------------------|-------------|--------|
| 32-true              | fp32             | fp32       | fp32             | -           | fp32   |
| 16/bf16-true         | 16-bit           | 16-bit     | 16-bit (1)       | -           | 16-bit |
| 16/bf16-mixed, ZeRO 0| fp32 (AMP)       | fp32       | fp32             | - (2)       | 16-bit |
| 16/bf16-mixed, ZeRO>=1| 16-bit          | 16-bit     | fp32             | fp32 (3)    | 16-bit |
| fp8-mixed            | bf16 (+fp8 cache)| 16-bit     | fp32             | fp32        | bf16   |

(1) torch optimizers allocate states with ``zeros_like(param)``.
(2) PyTorch AMP keeps fp32 parameters, which are the master copy; autocast makes transient
    16-bit copies for each matmul (counted with activations, not here).
(3) DeepSpeed / Megatron: 16-bit model + fp32 master in the optimizer (ZeRO paper, Rajbhandari
    et al. 2020, §3: "2Ψ + 2Ψ + KΨ" with K = 12 for mixed-precision Adam).
Both mixed conventions cost 16 bytes per trainable parameter with Adam; they differ only in
which category holds the bytes. ``grad_dtype = "fp32"`` gives fp32 gradient buffers for 16-bit
parameters (Megatron's ``main_grad``, 18 B/param with Adam).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..recipe import Recipe

__all__ = ["Dtypes", "dtypes"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Dtypes:
    param: str
    """Storage of trainable parameters on the GPU."""
    grad: str
    state: str
    """Optimizer moments."""
    master: str | None
    """Separate fp32 master copy, or None when the parameters are the master."""
    frozen: str
    """Storage of frozen (non-quantized) parameters."""
    compute: str
    """dtype of matmuls and activations."""


def _half(precision: str) -> str:
    return "fp16" if precision.startswith("16") else "bf16"


def dtypes(recipe: Recipe) -> Dtypes:
    """The dtype of every model state under ``recipe`` (see the module table)."""
    p = recipe.precision.kind
    if p == "32-true":
        d = Dtypes(param="fp32", grad="fp32", state="fp32", master=None, frozen="fp32",
                   compute="fp32")
    elif p.endswith("-true"):
        h = _half(p)
        d = Dtypes(param=h, grad=h, state=h, master=None, frozen=h, compute=h)
    elif p == "fp8-mixed" or recipe.parallelism.zero >= 1:
        h = _half(p)
        d = Dtypes(param=h, grad=h, state="fp32", master="fp32", frozen=h, compute=h)
    else:  # AMP
        h = _half(p)
        d = Dtypes(param="fp32", grad="fp32", state="fp32", master=None, frozen=h, compute=h)
    if recipe.precision.grad_dtype == "fp32":
        d = Dtypes(param=d.param, grad="fp32", state=d.state, master=d.master, frozen=d.frozen,
                   compute=d.compute)
    return d
