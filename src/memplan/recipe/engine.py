"""The ``Engine`` part of a recipe: which training engine runs the job (DDP, FSDP2, FSDP1,
DeepSpeed, Megatron-Core, torchtitan) and the engine knobs its config files carry.

``kind = auto`` keeps memplan's behaviour from before the part existed: the engine is inferred,
``zero >= 1`` -> DeepSpeed, else DDP (``resolve_engine``), and the output says it was assumed.
The knobs' defaults are the engines' own defaults (DeepSpeed ``DeepSpeedZeroConfig``, torch
``fully_shard``), so a recipe that names none of them describes the run memplan estimated
before. ``memplan export`` writes them into the engine's config and ``--from`` reads them back.

Kept in its own module (issue #14) so that the engines' memory modelling (the "What each engine
really does with memory" issue) can extend it without touching the other parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from .check import check_part

if TYPE_CHECKING:
    from ..errors import Problems
    from .parts import Offload, Parallelism

__all__ = ["EngineKind", "Engine", "Fsdp1Prefetch", "Fsdp1Wrap", "resolve_engine",
           "engine_problems", "host_adam", "TORCH_OPTIM_ENGINES"]


class EngineKind(StrEnum):
    AUTO = "auto"
    DDP = "ddp"
    FSDP2 = "fsdp2"
    FSDP1 = "fsdp1"
    DEEPSPEED = "deepspeed"
    MEGATRON = "megatron"
    TORCHTITAN = "torchtitan"


class Fsdp1Wrap(StrEnum):
    """FSDP1's auto-wrap policy: which modules form one ``FlatParameter`` (a unit)."""

    PEFT = "peft"
    """Each transformer layer is a unit and so is each leaf module with a trainable ``weight``
    (a LoRA ``lora_A``/``lora_B``, DoRA's magnitude, an ln-tuning or ``modules_to_save`` copy,
    the prompt encoder): PEFT 0.21.2 ``utils/other.py`` ``fsdp_auto_wrap_policy``, which the HF
    Trainer installs for a PEFT model (transformers 5.23 ``distributed/fsdp.py``
    ``update_fsdp_plugin_peft``), and llama-recipes' ``fsdp_utils.fsdp_auto_wrap_policy``.
    Adapters never share a unit with the frozen base; with full fine-tuning it is ``layers``."""
    LAYERS = "layers"
    """Each transformer layer is a unit, adapters included (torch
    ``transformer_auto_wrap_policy``; accelerate's ``TRANSFORMER_BASED_WRAP`` in a script of
    your own): a LoRA layer's unit mixes frozen and trainable tensors, and its flat gradient
    covers the frozen ones (``estimate/fsdp1_flat.py``)."""


class Fsdp1Prefetch(StrEnum):
    """FSDP1 ``backward_prefetch`` (torch ``BackwardPrefetch``)."""

    NONE = "none"
    """No prefetch: accelerate 1.15's default (``NO_PREFETCH``) and the HF Trainer's
    (``training_args.py``: ``fsdp_config.get("backward_prefetch", "NO_PREFETCH")``)."""
    BACKWARD_PRE = "backward_pre"
    """At each unit's pre-backward, all-gather the unit that runs next in backward: two layers
    gathered at once (torch ``_runtime_utils.py`` ``_get_handle_to_prefetch``)."""
    BACKWARD_POST = "backward_post"
    """All-gather the next unit at the current one's post-backward, after it is resharded."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Engine:
    """The training engine and the knobs of its config file (defaults: the engine's own)."""

    kind: EngineKind = field(default=EngineKind.AUTO, metadata={"key": "engine"})
    """``ddp``, ``fsdp2`` (``fully_shard``), ``fsdp1`` (``FullyShardedDataParallel``),
    ``deepspeed``, ``megatron`` (Megatron-Core, distributed optimizer for zero=1),
    ``torchtitan``; ``auto``: DeepSpeed when zero >= 1, else DDP (said in the output)."""
    reduce_bucket_size: int = field(default=500_000_000, metadata={"min": 1})
    """DeepSpeed ``zero_optimization.reduce_bucket_size``, elements (default 5e8)."""
    allgather_bucket_size: int = field(default=500_000_000, metadata={"min": 1})
    """DeepSpeed ``zero_optimization.allgather_bucket_size``, elements (default 5e8)."""
    overlap_comm: bool = False
    """DeepSpeed ``overlap_comm``: reduce gradients while the backward runs (more buckets
    alive)."""
    contiguous_gradients: bool = True
    """DeepSpeed ``contiguous_gradients``: copy reduced gradients into one flat buffer."""
    stage3_max_live_parameters: int = field(default=1_000_000_000, metadata={"min": 0})
    """DeepSpeed ZeRO-3 ``stage3_max_live_parameters``: gathered parameters kept alive,
    elements (default 1e9)."""
    stage3_max_reuse_distance: int = field(default=1_000_000_000, metadata={"min": 0})
    """DeepSpeed ZeRO-3 ``stage3_max_reuse_distance``, elements (default 1e9): once the step
    trace is complete, a released module's parameters stay gathered when they are used again
    within this many elements of the modules that run next (``partitioned_param_coordinator.py``
    ``__params_to_release``)."""
    stage3_prefetch_bucket_size: int = field(default=50_000_000, metadata={"min": 0})
    """DeepSpeed ZeRO-3 ``stage3_prefetch_bucket_size``, elements (default 5e7)."""
    stage3_param_persistence_threshold: int = field(default=100_000, metadata={"min": 0})
    """DeepSpeed ZeRO-3: parameters smaller than this many elements stay gathered (default
    1e5)."""
    sub_group_size: int = field(default=1_000_000_000, metadata={"min": 1})
    """DeepSpeed ``sub_group_size``: optimizer step granularity under offload, elements
    (default 1e9)."""
    offload_pin_memory: bool = False
    """Offloaded states in pinned (page-locked) host memory (DeepSpeed ``pin_memory``)."""
    offload_buffer_count: int = field(default=5, metadata={"min": 1})
    """DeepSpeed ``offload_param.buffer_count``: parameter swap buffers for NVMe offload
    (default 5)."""
    reshard_after_forward: bool = True
    """FSDP: free gathered parameters after each unit's forward (``FULL_SHARD``); false keeps
    them to the backward (``SHARD_GRAD_OP``)."""

    zero3_init: bool = True
    """DeepSpeed ZeRO-3: the model is built under ``deepspeed.zero.Init`` (what transformers'
    ``from_pretrained`` does whenever ZeRO-3 is configured), which partitions each parameter
    as it is made, in the config's dtype; PEFT's adapters added afterwards keep their dtype.
    False: a script that builds the model itself and then calls ``deepspeed.initialize``: the
    engine casts every parameter, adapters included, to the 16-bit dtype, moves the whole
    module to the GPU and only then partitions it (``engine.py``
    ``_configure_distributed_model``, ``is_zero_init_model`` false; ``parameter_offload.py``
    ``Init(module=...)``, DeepSpeed 0.19.8). The ds_config cannot say which."""
    fsdp1_wrap: Fsdp1Wrap = Fsdp1Wrap.PEFT
    """FSDP1 auto-wrap policy: ``peft`` (PEFT's ``fsdp_auto_wrap_policy``: layers, adapters in
    units of their own; what the HF Trainer and llama-recipes use) or ``layers``
    (``transformer_auto_wrap_policy`` alone: adapters share their layer's unit, whose flat
    gradient then covers the frozen weights too)."""
    fsdp1_backward_prefetch: Fsdp1Prefetch = Fsdp1Prefetch.NONE
    """FSDP1 ``backward_prefetch``: ``none`` (accelerate's and the HF Trainer's default),
    ``backward_pre`` (one more layer gathered through the backward), ``backward_post``."""
    use_orig_params: bool = True
    """FSDP1 ``use_orig_params`` (the HF Trainer's default, ``training_args.py``). False: FSDP1
    refuses a unit that mixes frozen and trainable tensors (torch ``_flat_param.py``)."""

    def __post_init__(self) -> None:
        check_part(self)


def resolve_engine(engine: Engine, par: Parallelism) -> tuple[EngineKind, bool]:
    """The engine that runs the job and whether it was assumed (``auto``): DeepSpeed when the
    recipe shards with ZeRO (zero >= 1), else DDP, memplan's modelling before the part
    existed."""
    if engine.kind != EngineKind.AUTO:
        return engine.kind, False
    return (EngineKind.DEEPSPEED if par.zero >= 1 else EngineKind.DDP), True


_ZERO_OK: dict[EngineKind, tuple[int, ...]] = {
    EngineKind.DDP: (0,),
    EngineKind.FSDP1: (0, 2, 3),  # NO_SHARD, SHARD_GRAD_OP, FULL_SHARD
    EngineKind.FSDP2: (3,),  # fully_shard always shards parameters
    EngineKind.DEEPSPEED: (0, 1, 2, 3),
    EngineKind.MEGATRON: (0, 1),  # use_distributed_optimizer shards optimizer states only
    EngineKind.TORCHTITAN: (0, 3),  # dp_replicate (DDP) or dp_shard (FSDP2)
}
"""ZeRO stages each engine can express (its docs; torch FSDP ``ShardingStrategy``)."""

_OFFLOAD_OK: dict[EngineKind, tuple[str, ...]] = {
    EngineKind.DDP: ("none",),
    EngineKind.FSDP1: ("none", "params+optimizer"),  # CPUOffload(offload_params=True)
    EngineKind.FSDP2: ("none", "params+optimizer"),  # CPUOffloadPolicy
    EngineKind.DEEPSPEED: ("none", "optimizer", "params+optimizer", "nvme"),
    EngineKind.MEGATRON: ("none", "optimizer"),  # optimizer_cpu_offload
    EngineKind.TORCHTITAN: ("none", "params+optimizer"),  # training.enable_cpu_offload
}


TORCH_OPTIM_ENGINES = ("ddp", "fsdp1", "fsdp2", "torchtitan")
"""Engines that step the user's ``torch.optim`` optimizer (DeepSpeed and Megatron-Core build
their own fused Adam), so ``optimizer_impl`` chooses its path."""


def host_adam(engine: EngineKind | str, optimizer_impl: str) -> str:
    """The Adam that steps an offloaded optimizer on the host:

    - ``deepspeed``: DeepSpeedCPUAdam, its SIMD and OpenMP kernel (``runtime/engine.py``
      ``_configure_basic_optimizer`` builds it for a config optimizer of type Adam/AdamW once
      offload is on, and a client torch optimizer under offload is refused unless
      ``zero_force_ds_cpu_optimizer = false``; deepspeedai/DeepSpeed@edaa722);
    - ``fused`` for Megatron-Core: ``optimizer_cpu_offload`` builds a ``HybridDeviceOptimizer``
      whose CPU part is ``torch.optim.AdamW`` (imported as ``CPUAdam``) with ``fused=True``,
      "used to improve the performance of the cpu optimizer"
      (``megatron/core/optimizer/__init__.py``, NVIDIA/Megatron-LM@0044db1);
    - else torch.optim's path, ``optimizer_impl`` (``Recipe.optimizer_impl``: torchtitan's
      ``fused``; FSDP1/FSDP2 take torch's CPU default, the ``for-loop``)."""
    if str(engine) == "deepspeed":
        return "deepspeed"
    return "fused" if str(engine) == "megatron" else optimizer_impl


_MIXED_UNDER_PEFT = ("ia3", "vera", "bitfit")
"""Methods whose trainable tensors are not a leaf module's ``weight`` (IA3's ``ia3_l`` and
VeRA's ``vera_lambda_*`` are ``ParameterDict`` entries of the adapted layer, BitFit trains the
base biases), so PEFT's ``lambda_policy_fn`` leaves them in their layer's unit."""


def fsdp1_mixes(method: str, wrap: str) -> bool:
    """Whether FSDP1 units of a ``method`` run hold frozen and trainable tensors together under
    the auto-wrap policy ``wrap`` (``Fsdp1Wrap``)."""
    if method in ("full", "freeze"):
        return False  # every tensor of a layer trains, or none does
    return wrap == Fsdp1Wrap.LAYERS or method in _MIXED_UNDER_PEFT


def engine_problems(p: Problems, engine: Engine, par: Parallelism, offload: Offload,
                    method: str = "full") -> None:
    """Add a problem for each combination the named engine cannot run."""
    kind = engine.kind
    if kind == EngineKind.AUTO:
        return
    if kind == EngineKind.FSDP1 and not engine.use_orig_params \
            and fsdp1_mixes(method, engine.fsdp1_wrap):
        p.add(f"use_orig_params=false with method={method} and fsdp1_wrap={engine.fsdp1_wrap}: "
              "FSDP1 units would mix frozen and trainable tensors, which torch refuses "
              "('Must flatten tensors with uniform requires_grad when use_orig_params=False', "
              "_flat_param.py). Set use_orig_params=true"
              + (", or fsdp1_wrap=peft (adapters in units of their own)."
                 if method not in _MIXED_UNDER_PEFT else "."))
    stages = _ZERO_OK[kind]
    if par.zero not in stages:
        p.add(f"engine={kind} cannot run zero={par.zero}: it expresses zero in "
              f"{', '.join(map(str, stages))}. Change zero or use engine=deepspeed.")
    if str(offload.kind) not in _OFFLOAD_OK[kind]:
        p.add(f"engine={kind} cannot offload {offload.kind!s}: it offers "
              f"{', '.join(_OFFLOAD_OK[kind])}. Use engine=deepspeed for that offload.")
    if kind in (EngineKind.DDP, EngineKind.FSDP1, EngineKind.FSDP2, EngineKind.DEEPSPEED) \
            and (par.tp > 1 or par.pp > 1 or par.cp > 1 or par.ep > 1):
        if kind != EngineKind.DEEPSPEED or par.tp > 1 or par.cp > 1:
            p.add(f"engine={kind} has no built-in tensor/pipeline/context/expert parallelism "
                  f"(tp={par.tp}, pp={par.pp}, cp={par.cp}, ep={par.ep}); use engine=megatron "
                  "or engine=torchtitan.")
    if kind == EngineKind.DEEPSPEED and par.pp > 1 and par.zero >= 2:
        p.add(f"engine=deepspeed runs pipeline parallelism (pp={par.pp}) with zero 0 or 1 only "
              "(DeepSpeed's PipelineEngine); lower zero or use engine=megatron.")
