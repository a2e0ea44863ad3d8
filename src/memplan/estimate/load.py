"""The load phase: what one rank's GPU holds while the model is built, loaded, sharded and
quantised, before the first step (``Step.INIT``, ``Phase.LOAD``).

Two moments per rank: the weights in place as they arrive (the rank's stored parameters, the
same lines the step holds), and the largest transient of the load on top of them, placed at the
end of the load (every other weight already there: an upper bound by at most one unit's shard).
The caching allocator keeps the blocks of that transient (nothing calls ``empty_cache``), so
``max_memory_reserved`` is at least this phase's peak for the rest of the run.

The transient is the largest of what applies (each function below cites the engine's source):

- quantisation on the GPU (``qlora``): ``quant_transient_bytes``;
- the engine's sharding at init, read with the host's load mode (``HostSetup.load``):
  ``engine_transient``. ``full``: every rank read the whole checkpoint on the CPU; ``rank0``:
  rank 0 did, the others are on meta and receive a broadcast (FSDP ``sync_module_states``,
  accelerate ``cpu_ram_efficient_loading``); ``meta``: meta-device init then ``to_empty`` /
  DeepSpeed ``zero.Init``; ``sharded``: each rank reads its own shard (DCP).

Known limitations: one transient per rank (the largest), not the allocator's block layout, so a
pool that fragments across many transients (reserved above allocated + 5 %) is not modelled; the
load of activations-free inference engines and of optimizer-state checkpoints (resume) is not.
"""

from __future__ import annotations

from ..breakdown import ALL_PHASES, Category, Item, Moment, Phase, Pool, Step
from ..facts import Dtypes
from ..recipe import Recipe
from ..units import dtype_bytes
from .layout import Stage
from .lines import Line

__all__ = ["load_moments", "quant_transient_bytes", "engine_transient",
           "TORCHAO_01_BYTES_PER_ELEMENT", "TORCHAO_CHUNK_ELEMENTS"]

TORCHAO_01_BYTES_PER_ELEMENT = 68
"""Peak of torchao 0.1's ``to_nf4`` per element of a bf16 weight, the weight included: the
input (2 B), ``scaled_blocks = blocks / scales`` (2 B), then in ``quantize_tensor_nearest``
``value.unsqueeze(-1) - nf4`` (16 bf16 = 32 B) and its ``.abs()`` (32 B) alive together
(torchao v0.1 ``torchao/dtypes/nf4tensor.py`` ``convert_to_norm_float_weight``; the PyPI wheel
torchao-0.1 is that tag, 2024-04-04). Measured on CPU: 68.078 B per element for 1024 x 4096
and 11008 x 4096 (``scripts/measure_load_transients.py``, validation/load_transients.json)."""

TORCHAO_CHUNK_ELEMENTS = 1024 ** 2
"""torchao >= 0.2 quantises in chunks of ``CHUNK_SIZE = 1024**2`` elements (pytorch/ao PR #196,
2024-05-01, "Note: Quantize in Chunks"): the 64 B-per-element temporaries of one chunk only."""

_QUANTIZED_ON_LOAD = ("nf4", "nf4-dq", "int8")
"""Quant kinds quantised from 16-bit weights while loading; ``gptq-int4`` checkpoints arrive
already packed (auto-gptq ``QuantLinear`` buffers are filled as stored)."""


def quant_transient_bytes(numel: int, recipe: Recipe) -> tuple[int, str]:
    """Temporaries of quantising one 16-bit weight of ``numel`` elements on the GPU.

    - ``bitsandbytes``: the weight is moved to the GPU in 16 bits, then
      ``bnb.functional.quantize_4bit`` (or ``int8_vectorwise_quant``) writes the packed result
      from a CUDA kernel (``Params4bit._quantize``: ``w = self.data.contiguous().to(device)``):
      one 2 B copy.
    - ``torchao`` (>= 0.2): the 2 B copy, ``scaled_blocks`` (2 B), the uint8 index buffer
      (1 B) and one chunk's 64 B temporaries (``TORCHAO_CHUNK_ELEMENTS``); measured on CPU at
      pytorch/ao 6081796bc: 5.08 B per element + 64 MiB (validation/load_transients.json).
    - ``torchao-0.1``: ``TORCHAO_01_BYTES_PER_ELEMENT`` for the whole weight at once.
    """
    q = str(recipe.method.quantizer)
    if q == "torchao-0.1":
        return (numel * TORCHAO_01_BYTES_PER_ELEMENT,
                f"torchao 0.1 to_nf4: {TORCHAO_01_BYTES_PER_ELEMENT} B x elements of the "
                "largest quantised weight (unchunked quantize_tensor_nearest)")
    if q == "torchao":
        return (numel * 5 + min(numel, TORCHAO_CHUNK_ELEMENTS) * 64,
                "torchao to_nf4: 5 B x elements + 64 B x one 2^20-element chunk "
                "(pytorch/ao #196)")
    return numel * 2, "bitsandbytes: the 16-bit weight on the GPU before quantize_4bit"


def engine_transient(stage: Stage, recipe: Recipe, dt: Dtypes, load: str) -> tuple[int, str]:
    """The largest allocation of the engine's own init beyond the rank's stored weights.

    - FSDP1 (``FullyShardedDataParallel``, any load mode): each unit is materialised
      (``param_init_fn`` / ``to_empty`` from meta, or moved by ``device_id``), broadcast
      (``sync_module_states``), flattened into a new ``FlatParameter`` (``torch.cat`` of the
      unit's parameters: a second copy) and sharded, one unit at a time, innermost first
      (torch ``distributed/fsdp/_init_utils.py`` ``_init_param_handle_from_module``,
      ``_flat_param.py`` ``flatten_tensors``): 2 x the largest unit, unsharded.
    - FSDP2 / torchtitan ``fully_shard``: ``full``: each block's parameters are moved to the
      GPU, then chunked into shards (``_fsdp_init.py`` ``_move_states_to_device``): 1 x the
      largest unit; ``rank0``: accelerate broadcasts the full state dict one tensor at a time
      into the shards (``fsdp2_load_full_state_dict``): the largest tensor; ``meta`` /
      ``sharded``: only shards are ever allocated (``to_empty``, DCP).
    - DeepSpeed ZeRO-3: ``zero.Init`` (transformers enters it whenever ZeRO-3 is configured,
      ``modeling_utils.py``) partitions each parameter as it is created; loading gathers one
      module's own parameters at a time (``integrations/deepspeed.py``
      ``_load_state_dict_into_zero3_model``, ``GatheredParameters``): the largest tensor.
      Without it (``Engine.zero3_init`` false) ``_configure_distributed_model`` runs
      ``self.module.to(self.device)`` on the whole cast module before the optimizer partitions
      it (DeepSpeed 0.19.8 ``engine.py``): the whole 16-bit model.
    - DeepSpeed ZeRO-1/2: the 16-bit parameters are flattened into one aligned buffer on the
      GPU when it has the memory (``stage_1_and_2.py`` ``flatten_on_accelerator``, 0.19.8),
      else on the CPU: one more copy of the rank's 16-bit parameters (the caller keeps it only
      when it fits the device).
    - DeepSpeed ZeRO-0 with a 16-bit config (``Recipe.deepspeed_16bit``): ``FP16_Optimizer``
      flattens clones of the trainable parameters (``runtime/fp16/fused_optimizer.py``
      ``__init__``, 0.19.8): the clones and the flat buffer beside the module's own.
    - DDP / no sharding: the whole model is on the GPU, which is what the step holds: nothing.
    """
    engine = recipe.engine_kind
    units = list(stage.unit_numels) or [stage.held_numel]
    largest_tensor = stage.largest_tensor_numel
    pb = dtype_bytes(dt.param)
    z = recipe.parallelism.zero
    if engine == "fsdp1" and z:
        return (2 * max(units) * pb, "FSDP1 init: the largest unit unsharded + its flattened "
                "copy (_init_utils.py, one unit at a time)")
    if engine in ("fsdp2", "torchtitan") and z:
        if load == "full":
            return max(units) * pb, "fully_shard: the largest unit moved to the GPU, then sharded"
        if load == "rank0":
            return (largest_tensor * pb, "accelerate fsdp2_load_full_state_dict: one full tensor "
                    "broadcast at a time")
        return 0, "meta / sharded init: only shards allocated"
    if engine == "deepspeed" and z == 3 and not recipe.engine.zero3_init:
        return (stage.held_numel * pb, "no zero.Init: the engine casts the whole model and "
                "moves it to the GPU before partitioning it (engine.py "
                "_configure_distributed_model: module.to(device))")
    if engine == "deepspeed" and z == 3:
        return (largest_tensor * pb, "zero.Init load: one module's parameters gathered "
                "(GatheredParameters)")
    if recipe.deepspeed_16bit:
        return (2 * stage.trainable_numel * pb, "FP16_Optimizer init (ZeRO-0): a clone of every "
                "trainable parameter and their flat copy beside the module's (fused_optimizer.py "
                "_flatten_dense_tensors([p.clone().detach() ...]))")
    if engine == "deepspeed" and z in (1, 2):
        flat = stage.trainable_numel * pb
        return flat, "ZeRO-1/2 init: 16-bit parameters flattened on the GPU (stage_1_and_2.py)"
    return 0, ""


def load_moments(stage: Stage, recipe: Recipe, dt: Dtypes, lines: list[Line], *, load: str,
                 capacity_bytes: int) -> tuple[Moment, ...]:
    """The load phase of one rank: the weights in place, then the largest transient on top
    (omitted when 0). ``capacity_bytes`` decides DeepSpeed ZeRO-1/2's GPU-or-CPU flatten."""
    weights = tuple(ln.item for ln in lines if ln.item.category == Category.PARAMS
                    and ln.item.pool == Pool.ALLOCATED and ln.phases == ALL_PHASES)
    out = [Moment(step=Step.INIT, phase=Phase.LOAD, label=f"load ({load}): weights in place",
                  items=weights)]
    best, why = engine_transient(stage, recipe, dt, load)
    if recipe.engine_kind == "deepspeed" and recipe.parallelism.zero in (1, 2) and (
            best + sum(i.bytes for i in weights) > capacity_bytes):
        best, why = 0, ""  # DeepSpeed flattens on the CPU instead
    if recipe.method.kind == "qlora" and str(recipe.method.quant) in _QUANTIZED_ON_LOAD:
        numel = max((h.numel for h in stage.held if h.quantized), default=0)
        q, qwhy = quant_transient_bytes(numel, recipe)
        if q > best:
            best, why = q, qwhy
    if best:
        tmp = Item(category=Category.TEMPORARY, name=f"largest load transient ({why.split(':')[0]})",
                   bytes=best, formula=why)
        out.append(Moment(step=Step.INIT, phase=Phase.LOAD,
                          label=f"load ({load}): largest transient", items=weights + (tmp,)))
    return tuple(out)
