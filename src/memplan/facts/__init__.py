"""Training facts shared by every consumer (estimate, host, timing, trace), read from one data
file (``facts.toml``, a source on each row): the dtype of each model state per precision, and
the optimizer table (states, their layout, step temporaries per implementation).

| precision            | trainable params | grads      | optimizer states | fp32 master | frozen |
|----------------------|------------------|------------|------------------|-------------|--------|
| 32-true              | fp32             | fp32       | fp32             | -           | fp32   |
| 16/bf16-true         | 16-bit           | 16-bit     | 16-bit           | -           | 16-bit |
| 16/bf16-mixed, ZeRO 0| fp32 (AMP)       | fp32       | fp32             | -           | 16-bit |
| 16/bf16-mixed, ZeRO>=1| 16-bit          | 16-bit     | fp32             | fp32        | 16-bit |
| fp8-mixed            | bf16 (+fp8 cache)| 16-bit     | fp32             | fp32        | bf16   |

DeepSpeed at ZeRO 0 takes the ZeRO>=1 row, unsharded (``Recipe.deepspeed_16bit``). Both mixed
conventions cost 16 bytes per trainable parameter with Adam; they differ only in
which category holds the bytes. ``grad_dtype = "fp32"`` gives fp32 gradient buffers for 16-bit
parameters (Megatron's ``main_grad``, 18 B/param with Adam). PEFT adapters are held as the
engine leaves them (``adapter_dtypes``: fp32 from PEFT, 16-bit with an fp32 master where
DeepSpeed ZeRO-0/1/2 casts the module).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

from ..errors import ConfigError, did_you_mean
from ..recipe import Recipe

__all__ = ["Dtypes", "dtypes", "adapter_dtypes", "state_dtypes", "OptimizerFacts",
           "optimizer_facts", "optimizer_table"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Dtypes:
    """The dtype of each model state under one recipe."""

    param: str
    """Storage of trainable parameters on the GPU."""
    grad: str
    """Gradients."""
    state: str
    """Optimizer moments."""
    master: str | None
    """Separate fp32 master copy, or None when the parameters are the master."""
    frozen: str
    """Storage of frozen (non-quantized) parameters."""
    compute: str
    """dtype of matmuls and activations."""
    adapter: str = "fp32"
    """Storage of PEFT adapter weights (``Method.adapter_dtype`` with ``auto`` resolved for
    the engine: ``adapter_dtypes``)."""
    adapter_master: bool = False
    """The trainable adapters get a separate fp32 master copy (DeepSpeed's ZeRO optimizer)."""
    adapter_by: str = ""
    """Who set ``adapter`` when the engine, not PEFT's default, did (said beside the adapters
    when ``adapter_dtype = auto``): empty, or e.g. ``cast by DeepSpeed``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerFacts:
    """One row of the optimizer table."""

    name: str
    """The recipe's optimizer name."""
    states: int
    """Optimizer states per trainable tensor."""
    layout: str
    """``full`` (each the tensor's size), ``factored`` (Adafactor), ``blockwise-8bit``."""
    step_temporaries: int
    """Parameter-sized temporaries alive at once per tensor in the single-tensor step."""
    foreach_copy: bool
    """The CUDA foreach step copies every state once (``torch._foreach_sqrt``)."""
    fused_under_zero: bool
    """DeepSpeed ZeRO steps it with fused kernels (no temporaries)."""
    cpu_step_counters: bool
    """torch keeps one fp32 ``step`` tensor per parameter."""
    torch: str
    """The ``torch.optim`` class a traced or real run uses; '' when torch has none."""
    source: str
    """Where the row comes from."""

    @property
    def full_states(self) -> int:
        """States of the tensor's full size (a factored state is ~0 of it)."""
        return 0 if self.layout == "factored" else self.states


@cache
def _table() -> dict[str, Any]:
    return tomllib.loads(resources.files(__package__).joinpath("facts.toml").read_text())


@cache
def optimizer_table() -> dict[str, OptimizerFacts]:
    """Every optimizer row, by name."""
    return {row["name"]: OptimizerFacts(**row) for row in _table()["optimizer"]}


def optimizer_facts(name: str) -> OptimizerFacts:
    """The row of optimizer ``name``; an unknown name lists the close ones."""
    table = optimizer_table()
    if name not in table:
        raise ConfigError([f"optimizer={name!r} has no row in facts.toml."
                           f"{did_you_mean(name, table)}"])
    return table[name]


@cache
def _dtype_rows() -> dict[tuple[str, str], Dtypes]:
    return {(r["precision"], r["zero"]): Dtypes(
        param=r["param"], grad=r["grad"], state=r["state"], master=r["master"] or None,
        frozen=r["frozen"], compute=r["compute"]) for r in _table()["dtypes"]}


_TORCH_SHARDED = ("fsdp1", "fsdp2", "torchtitan")
"""Engines that shard the model's own (fp32) parameters and cast in their all-gather, so they
keep the ``zero = "0"`` (PyTorch AMP) dtypes at every stage: FSDP2 ``MixedPrecisionPolicy``
casts the sharded parameter to ``param_dtype`` for the all-gather only and the sharded gradient
back to the parameter's dtype (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
``FSDPParam.init_dtype_attrs``, ``_fsdp_collectives.py`` ``foreach_reduce``); FSDP1 does the
same on its ``FlatParameter`` (``_flat_param.py`` ``_use_low_precision_shard``). No separate
fp32 master copy exists."""


def dtypes(recipe: Recipe) -> Dtypes:
    """The dtype of every model state under ``recipe`` (see the module table).

    Sharding engines built on torch (FSDP1, FSDP2, torchtitan) keep the sharded parameters in
    fp32 and cast only the all-gathered copy to ``param_dtype``: the fp32 shard is the master,
    as under plain AMP, so they take the ``zero = "0"`` rows (torch ``fully_shard`` /
    ``MixedPrecisionPolicy`` docs; measured by ``memplan validate --nproc 2``: a rank holds
    its fp32 shard and AdamW states, no 16-bit copy and no separate master). DeepSpeed and
    Megatron keep 16-bit parameters beside an fp32 master (the ``"1+"`` rows), and so does
    DeepSpeed at ZeRO-0 with a 16-bit config (``Recipe.deepspeed_16bit``)."""
    p, rows = str(recipe.precision.kind), _dtype_rows()
    torch_sharding = str(recipe.engine_kind) in _TORCH_SHARDED
    zero = "1+" if (recipe.parallelism.zero >= 1 and not torch_sharding) \
        or recipe.deepspeed_16bit else "0"
    d = rows.get((p, "any")) or rows[(p, zero)]
    if recipe.precision.grad_dtype == "fp32":
        d = replace(d, grad="fp32")
    if recipe.precision.frozen_dtype == "fp32":
        d = replace(d, frozen="fp32")
    adapter, master, by = adapter_dtypes(recipe, d)
    return replace(d, adapter=adapter, adapter_master=master, adapter_by=by)


def adapter_dtypes(recipe: Recipe, d: Dtypes) -> tuple[str, bool, str]:
    """The storage dtype of PEFT adapters, whether the optimizer keeps an fp32 master of
    them, and who decided (``Dtypes.adapter_by``), under the recipe's engine and the
    model-state dtypes ``d``.

    - Every engine but DeepSpeed steps the adapters as PEFT leaves them: ``adapter_dtype``,
      ``auto`` = fp32 (PEFT ``autocast_adapter_dtype=True`` upcasts 16-bit adapters, peft
      0.21.2 ``tuners/tuners_utils.py``), no master.
    - DeepSpeed with a 16-bit config (the ``"1+"`` rows: 16-bit parameters beside an fp32
      master; ZeRO-0 too, ``Recipe.deepspeed_16bit``) casts every floating parameter of the module
      to that dtype when it wraps it
      (``engine.py`` ``_configure_distributed_model``: v0.12.3 ``self.module.bfloat16()`` /
      ``.half()``; 0.19.8 ``_cast_module_mixed_precision``, ``p.data = p.data.to(
      param_dtype)``), PEFT's fp32 adapters included, and its optimizer then keeps an fp32
      clone of the trainable ones (``stage_1_and_2.py`` ``single_partition_of_fp32_groups``,
      ``stage3.py`` ``_create_fp32_partitions``; at ZeRO-0 ``FP16_Optimizer``'s
      ``fp32_groups_flat``, whole on every rank).
    - ZeRO-3 is modelled with ``zero.Init`` unless ``Engine.zero3_init`` is false (then it
      casts as at ZeRO-1/2: ``is_zero_init_model`` is false): the engine skips the
      cast for a model whose parameters already carry ``ds_id`` (``is_zero_init_model``), so
      adapters added by PEFT after ``from_pretrained`` keep their dtype and are partitioned as
      they are (``_convert_to_zero_parameters``: ``param.data.to(device)``, no dtype). Their
      fp32 master is a clone too: DeepSpeed 0.19.8 would reuse an fp32 sub-group as its own
      master (``stage3.py`` ``_create_fp32_partitions``, PR #7651), but only when
      ``tensor.device == self.device``, and ``self.device`` is the accelerator's device *name*,
      a string (``current_device_name()``: ``'cuda:0'``, ``'cpu'``), which a ``torch.device``
      never equals (torch 2.13), so the clone is made (measured: separate storages).

    Measured on CPU with DeepSpeed 0.19.8 and peft 0.21.2 (``validation/dist_nproc2.json``,
    the ``lora`` cases): ZeRO-2 adapters bf16, ZeRO-3 under ``zero.Init`` fp32 adapters, each
    with an fp32 master partition of its own."""
    given = str(recipe.method.adapter_dtype)
    peft = "fp32" if given == "auto" else given
    if str(recipe.engine_kind) != "deepspeed" or d.param not in ("bf16", "fp16") \
            or (recipe.parallelism.zero == 0 and not recipe.deepspeed_16bit):
        return peft, False, ""
    master = d.master is not None
    if recipe.parallelism.zero < 3 or not recipe.engine.zero3_init:
        return d.param, master, "cast by DeepSpeed"
    return peft, master, "PEFT's, kept under zero.Init"


def state_dtypes(recipe: Recipe) -> Dtypes:
    """The dtypes of the stored model states (parameters, gradients, master) under the
    recipe's engine: FSDP1/FSDP2/torchtitan keep the model's fp32 parameters sharded, with
    fp32 sharded gradients and no master copy, at every ZeRO stage (``_TORCH_SHARDED``).
    The compute dtype, and so the activations, are ``dtypes(recipe)``'s: the gathered
    parameters are ``param_dtype`` (bf16) as with DeepSpeed's 16-bit model."""
    d = dtypes(recipe)
    if str(recipe.engine_kind) not in _TORCH_SHARDED or recipe.parallelism.zero == 0:
        return d
    amp = _dtype_rows().get((str(recipe.precision.kind), "0"))
    if amp is None:  # a precision with one row for every stage ("any")
        return d
    grad = "fp32" if recipe.precision.grad_dtype == "fp32" else amp.grad
    return replace(d, param=amp.param, grad=grad, state=amp.state, master=amp.master)
