"""``Recipe``: how a model is trained, composed of frozen parts (``recipe.parts``): precision,
optimizer, fine-tuning method, batch shape, parallelism, checkpointing, offload, loss and
platform. Each part validates its own fields; the recipe checks the combinations. Every problem
is reported at once, with its fix.

A planner varies one part without touching the others::

    from dataclasses import replace
    wider = replace(recipe, parallelism=replace(recipe.parallelism, tp=8))

A recipe is also a flat table of keys (each field's CLI flag, with underscores): that is its
TOML and JSON form (``recipe.io``), and a part's table (``[parallelism]``) is accepted too.
The engine (``recipe.engine``: DDP / FSDP / DeepSpeed / Megatron / torchtitan and their config
knobs, ``recipe/engine.py``) is one such part; the training-loop parts of later issues join as
further fields of ``Recipe``, and appear in the flat table, the CLI and
``describe_fields`` by being added to ``PARTS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..errors import ConfigError, Problems, did_you_mean
from .check import field_key
from .engine import TORCH_OPTIM_ENGINES, Engine, EngineKind, engine_problems, resolve_engine
from .io import read_recipe_file, read_recipe_toml, to_toml
from .loop import Loop, Outputs, ZeroGradAt
from .parts import (
    PARTS,
    Attention,
    Batch,
    Checkpointing,
    CheckpointingKind,
    CompileScope,
    DeviceKind,
    GradDtype,
    FrozenDtype,
    Loss,
    LossKind,
    LogitsUpcast,
    Method,
    MethodKind,
    Offload,
    OffloadKind,
    Optimizer,
    OptimizerImpl,
    OptimizerKind,
    Parallelism,
    Platform,
    Precision,
    PrecisionKind,
    Quant,
    Quantizer,
)

__all__ = [
    "Recipe", "Precision", "Optimizer", "Method", "Batch", "Parallelism", "Checkpointing",
    "Offload", "Loss", "Platform", "PrecisionKind", "OptimizerKind", "MethodKind", "Quant", "Quantizer",
    "CheckpointingKind", "CompileScope", "Attention", "LossKind", "LogitsUpcast", "OffloadKind", "DeviceKind", "GradDtype", "FrozenDtype",
    "Loop", "Outputs", "ZeroGradAt", "OptimizerImpl", "PARTS", "KEYS", "PRECISIONS", "OPTIMIZERS", "METHODS", "QUANTS", "OFFLOADS",
    "read_recipe_toml", "read_recipe_file", "Engine", "EngineKind", "ENGINES",
]

PRECISIONS = tuple(str(c) for c in PrecisionKind)
OPTIMIZERS = tuple(str(c) for c in OptimizerKind)
METHODS = tuple(str(c) for c in MethodKind)
QUANTS = tuple(str(c) for c in Quant)
OFFLOADS = tuple(str(c) for c in OffloadKind)
ENGINES = tuple(str(c) for c in EngineKind)
DROPOUT_METHODS = ("lora", "qlora", "lora-fa", "vera")
"""Methods whose adapters take ``lora_dropout`` (PEFT ``LoraConfig.lora_dropout`` on LoRA,
QLoRA and LoRA-FA's LoRA model; ``VeraConfig.vera_dropout``)."""

KEYS: dict[str, tuple[str, str]] = {
    field_key(f): (part, f.name) for part, cls in PARTS.items() for f in fields(cls)}
"""Flat key -> (part attribute, field name), in table order."""
_DERIVED = ("dp",)


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """A training configuration: one frozen part per concern."""

    precision: Precision = field(default_factory=Precision)
    """Numeric formats of weights, compute and gradients."""
    optimizer: Optimizer = field(default_factory=Optimizer)
    """The optimizer."""
    method: Method = field(default_factory=Method)
    """What trains: full, LoRA, QLoRA, or the last layers."""
    batch: Batch = field(default_factory=Batch)
    """Micro-batch, sequence length and gradient accumulation."""
    parallelism: Parallelism = field(default_factory=Parallelism)
    """GPUs and how the job is split over them."""
    checkpointing: Checkpointing = field(default_factory=Checkpointing)
    """Activation checkpointing."""
    offload: Offload = field(default_factory=Offload)
    """Where model states go when not on the GPU."""
    loss: Loss = field(default_factory=Loss)
    """How the cross-entropy is computed."""
    platform: Platform = field(default_factory=Platform)
    """Device kind, attention kernel and allocator setting."""
    engine: Engine = field(default_factory=Engine)
    """The training engine (DDP, FSDP, DeepSpeed, Megatron, torchtitan) and its config knobs."""
    loop: Loop = field(default_factory=Loop)
    """The user's training loop: outputs kept or dropped, where zero_grad is called."""
    notes: tuple[str, ...] = field(default=(), compare=False)
    """Free-form remarks carried into the report."""

    def __post_init__(self) -> None:
        p = Problems()
        for name, cls in PARTS.items():
            if not isinstance(getattr(self, name), cls):
                p.add(f"recipe.{name} must be a {cls.__name__}, got {getattr(self, name)!r}.")
        if isinstance(self.notes, (list, str)):
            object.__setattr__(self, "notes", _as_notes(self.notes))
        p.raise_if_any()
        self._check_combinations(p)
        p.raise_if_any()

    def _check_combinations(self, p: Problems) -> None:
        m, par, off = self.method, self.parallelism, self.offload.kind
        if m.kind == "qlora" and m.quant == "none":
            p.add("method=qlora needs a quantized base: set quant to nf4, nf4-dq, int8 or gptq-int4 "
                  "(QLoRA's default is nf4-dq), or use method=lora.")
        if m.kind == "qlora" and m.quantizer == "lightning-bnb" and m.quant not in ("nf4",
                                                                              "nf4-dq"):
            p.add(f"quantizer=lightning-bnb with quant={m.quant} is not modelled: litgpt's "
                  "--quantize bnb.nf4 / bnb.nf4-dq run bitsandbytes' 4-bit MatMul4Bit (what "
                  "memplan counts); bnb.int8-training runs Linear8bitLt. Use quant=nf4 or "
                  "nf4-dq, or quantizer=bitsandbytes.")
        if m.kind == "adapter" and m.adapter_params < 1:
            p.add("method=adapter needs adapter_params > 0: the number of parameters your "
                  "adapter trains (e.g. --adapter-params 4194304). For a named PEFT method use "
                  "its own method (lora, dora, ia3, ...).")
        if m.lora_dropout > 0 and m.kind not in DROPOUT_METHODS:
            why = ("PEFT's DoRA with dropout recomputes the base output on the dropped input "
                   "(peft 0.21.2 lora/variants.py DoraLinearVariant.forward), which memplan "
                   "does not model" if m.kind == "dora" else "it has no adapter dropout")
            p.add(f"lora_dropout={m.lora_dropout} with method={m.kind}: {why}. Use "
                  f"lora_dropout=0, or one of {', '.join(DROPOUT_METHODS)}.")
        impl = self.optimizer.impl
        ds16 = self.deepspeed_16bit  # FP16_Optimizer over FusedAdam, like ZeRO-1/2 unsharded
        if impl != "auto" and (par.zero >= 1 or ds16) \
                and str(self.engine_kind) in ("deepspeed", "megatron"):
            p.add(f"optimizer_impl={impl} picks a torch.optim implementation, but "
                  f"{self.engine_kind} at zero={par.zero} steps its own fused Adam. Use "
                  "optimizer_impl=auto, or an engine that steps torch.optim "
                  f"({', '.join(TORCH_OPTIM_ENGINES)}).")
        prec = self.precision
        if prec.frozen_dtype == "fp32" and not str(prec.kind).endswith("-mixed"):
            why = ("its weights are fp32 already" if prec.kind == "32-true"
                   else "model.to(16-bit) casts every weight")
            p.add(f"frozen_dtype=fp32 keeps a frozen fp32 base under autocast, but "
                  f"precision={prec.kind} has no autocast ({why}). Use a -mixed precision or "
                  "frozen_dtype=auto.")
        elif (prec.frozen_dtype == "fp32" and (par.zero >= 1 or ds16)
              and str(self.engine_kind) in ("deepspeed", "megatron")):
            p.add(f"frozen_dtype=fp32 cannot hold under {self.engine_kind} with "
                  f"precision={prec.kind}: the engine casts every parameter to 16 bits "
                  "(DeepSpeed engine.py _configure_distributed_model; Megatron Float16Module). "
                  "Use frozen_dtype=auto, or engine=fsdp1/fsdp2, which keep the loaded dtype.")
        if ds16 and prec.grad_dtype == "fp32":
            p.add(f"grad_dtype=fp32 with engine=deepspeed, zero=0 and precision={prec.kind}: "
                  "DeepSpeed 0.19.8 refuses a 16-bit model with fp32 gradient accumulation "
                  "without ZeRO ('unsupported mix of model_dtype and grad_accum_dtype', "
                  "engine.py _do_optimizer_sanity_check). Use grad_dtype=auto, or zero=1 "
                  "(BF16_Optimizer keeps fp32 gradients).")
        if self.platform.compile and self.platform.compile_scope == "model":
            p.add("compile_scope=model (one graph for the whole model) is not modelled: measured "
                  "on CPU its peak is 6-10% above per-block compilation (tiny Llama, fp32 and "
                  "bf16-mixed). Seen in its graph: transformers builds the causal mask while "
                  "tracing (an S x S mask saved for every SDPA call, and k/v repeated for GQA), "
                  "and one backward graph frees saved tensors in its own order; not yet counted, "
                  "so an estimate would be low. Use compile_scope=blocks if you compile each "
                  "block (torchtune, torchtitan), or leave compile off: the eager estimate was "
                  "above every whole-model measurement.")
        if m.kind != "qlora" and m.quant != "none":
            p.add(f"quant={m.quant} only applies to method=qlora: quantized base weights are "
                  "frozen, so full/freeze training cannot update them. Use method=qlora or "
                  "quant=none.")
        gpn = par.gpus_per_node
        if gpn and par.gpus > gpn and par.gpus % gpn:
            p.add(f"gpus={par.gpus} is not a whole number of nodes of gpus_per_node={gpn}; "
                  f"memplan will not silently run {-(-par.gpus // gpn)} nodes. Use gpus="
                  f"{par.gpus // gpn * gpn} or {-(-par.gpus // gpn) * gpn}, or change "
                  "gpus_per_node.")
        model_parallel = par.tp * par.pp * par.cp
        if par.gpus % model_parallel:
            p.add(f"gpus={par.gpus} is not divisible by tp*pp*cp={model_parallel}; "
                  "data parallelism needs whole replicas. Change gpus or the parallel degrees.")
        elif (par.tp * par.dp * par.cp) % (par.ep * par.expert_tp):
            stage = par.tp * par.dp * par.cp
            p.add(f"ep x etp = {par.ep} x {par.expert_tp} must divide the {stage} ranks of a "
                  f"pipeline stage (tp x dp x cp = {par.tp} x {par.dp} x {par.cp}): "
                  "Megatron-Core folds the expert groups over them. Lower ep or etp (etp=1 "
                  "frees the tp ranks for ep), or add GPUs.")
        if par.hybrid_shard:
            if par.zero != 3:
                p.add("hybrid_shard needs zero=3 (FSDP HYBRID_SHARD shards parameters).")
            elif par.dp % par.hybrid_shard:
                p.add(f"hybrid_shard={par.hybrid_shard} must divide the data-parallel size "
                      f"dp={par.dp}.")
        if par.sequence_parallel and par.tp == 1:
            p.add("sequence_parallel needs tensor parallelism (tp > 1): it splits the sequence "
                  "over the TP ranks. Set tp or drop sequence_parallel.")
        uneven = par.pp_first_layers or par.pp_last_layers
        if (uneven or par.pp_split_embedding or par.pp_split_loss) and par.pp == 1:
            p.add("pp_first_layers, pp_last_layers, pp_split_embedding and pp_split_loss shape "
                  "the pipeline split and need pp > 1. Set pp or drop them.")
        elif uneven and (par.pp_split_embedding or par.pp_split_loss):
            p.add("pp_first_layers / pp_last_layers cannot be combined with pp_split_embedding "
                  "/ pp_split_loss (Megatron-Core get_num_layers_to_build: 'Does not support "
                  "standalone embedding stage and standalone loss stage with uneven pp'). Use "
                  "one way of shaping the split.")
        if par.pp_virtual > 1 and par.pp == 1:
            p.add(f"pp_virtual={par.pp_virtual} needs pipeline parallelism (pp > 1): the "
                  "interleaved schedule splits each pipeline rank's layers into chunks.")
        if off == "optimizer" and par.zero == 0:
            p.add("offload=optimizer needs zero>=1 (ZeRO-Offload partitions the optimizer "
                  "before moving it to the host). Set zero to 1, 2 or 3.")
        if off in ("params+optimizer", "nvme") and par.zero != 3:
            p.add(f"offload={off} needs zero=3 (only ZeRO-3/FSDP can keep parameters "
                  "off the GPU between uses).")
        if off != "none" and self.platform.device == "cpu":
            p.add("offload moves GPU memory to the host; it has no meaning with device=cpu.")
        if self.precision.kind == "fp8-mixed" and self.platform.device == "cpu":
            p.add("precision=fp8-mixed needs FP8 tensor cores (Hopper or newer); use "
                  "device=cuda.")
        ck = self.checkpointing
        if ck.cpu_checkpointing and self.engine_kind in ("megatron", "torchtitan"):
            p.add("cpu_checkpointing keeps the checkpointed layer inputs in host RAM (DeepSpeed "
                  "cpu_checkpointing, torchtune enable_activation_offloading); "
                  f"{self.engine_kind} has no such option. Use engine=deepspeed, ddp, fsdp1 or "
                  "fsdp2, or drop it.")
        if ck.partition_activations and self.engine_kind not in ("deepspeed", "megatron"):
            p.add("partition_activations is DeepSpeed's partition_activations / Megatron's "
                  f"distribute_saved_activations (engine {self.engine_kind}); set "
                  "engine=megatron (or deepspeed) or drop it.")
        if ck.partition_activations and par.sequence_parallel:
            p.add("partition_activations with sequence_parallel: Megatron refuses "
                  "distribute_saved_activations under sequence parallelism (the layer input is "
                  "already split); drop one.")
        engine_problems(p, self.engine, par, self.offload, str(m.kind))

    @property
    def engine_kind(self) -> EngineKind:
        """The engine that runs the job (``auto`` resolved: zero >= 1 -> deepspeed, else
        ddp); ``engine_assumed`` says whether it was inferred."""
        return resolve_engine(self.engine, self.parallelism)[0]

    @property
    def optimizer_impl(self) -> str:
        """``optimizer.impl`` with ``auto`` resolved for where the step runs (the host when the
        optimizer is offloaded): torchtitan's own default, ``fused`` (``optimizer.implementation
        = "fused"``, torchtitan/components/optimizer/optimizer.py @b5bcd76; torch's fused AdamW
        runs on CPU tensors since 2.4, pytorch/pytorch#123074); else torch's
        ``_default_to_fused_or_foreach``: ``foreach`` on CUDA tensors, the ``for-loop`` on CPU
        tensors. DeepSpeed's and Megatron's own Adam steps are not torch.optim's: callers
        test the engine first."""
        impl = str(self.optimizer.impl)
        if impl != "auto":
            return impl
        if str(self.engine_kind) == "torchtitan":
            return "fused"
        on_host = self.offload.kind != "none" or self.platform.device == "cpu"
        return "for-loop" if on_host else "foreach"

    @property
    def engine_assumed(self) -> bool:
        """True when ``engine = auto`` and ``engine_kind`` was inferred from zero."""
        return resolve_engine(self.engine, self.parallelism)[1]

    @property
    def deepspeed_16bit(self) -> bool:
        """DeepSpeed with a 16-bit config (``bf16``/``fp16`` enabled: a ``16-mixed`` or
        ``bf16-mixed`` recipe) at ZeRO stage 0, which keeps a 16-bit model beside an fp32 master
        like ZeRO-1/2, unsharded.

        DeepSpeed 0.19.8 (and the tip, deepspeedai/DeepSpeed@edaa722) ``runtime/engine.py``:
        ``_configure_distributed_model`` casts every floating parameter of the module to the
        config's dtype (``_cast_module_mixed_precision``: ``p.data = p.data.to(param_dtype)``,
        buffers kept); ``get_data_types`` gives gradient accumulation the model's dtype unless
        ``data_types.grad_accum_dtype`` is set; ``_do_optimizer_sanity_check`` then returns
        ``FP16`` / ``DDP_BFLOAT16`` at stage 0 (``model_dtype == grad_accum_dtype``), and
        ``_configure_fp16_optimizer`` wraps the basic optimizer in ``FP16_Optimizer`` (FusedAdam,
        what an ``optimizer.type`` of Adam/AdamW builds on a GPU) or ``FP16_UnfusedOptimizer``:
        both clone every trainable parameter to an fp32 master that the basic optimizer steps
        (``runtime/fp16/fused_optimizer.py`` ``FP16_Optimizer.__init__``: ``fp32_groups_flat``).
        Since v0.17.6 (PR #7515 "Enable non-ZeRO mode"); before it (v0.12.3 ``get_data_types``:
        bf16 without ZeRO -> fp32 gradient accumulation) a bf16 stage-0 run took
        ``BF16_Optimizer`` with fp32 gradient buffers (``runtime/bf16_optimizer.py``), which
        memplan does not model."""
        return (str(self.engine_kind) == "deepspeed" and self.parallelism.zero == 0
                and str(self.precision.kind) in ("bf16-mixed", "16-mixed"))

    # ---- derived values -------------------------------------------------------------------

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step over the job: micro_batch x grad_accum x dp."""
        return self.batch.micro_batch * self.batch.grad_accum * self.parallelism.dp

    # ---- the flat table (TOML / JSON / CLI) -------------------------------------------------

    @classmethod
    def of(cls, **values: Any) -> Recipe:
        """A recipe from flat keys: ``Recipe.of(tp=2, zero=3)``."""
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "recipe") -> Recipe:
        """Build from a flat table of keys (TOML, JSON, CLI) or part tables
        (``{"parallelism": {"tp": 2}}``); every problem is reported at once, unknown keys with
        close matches. Derived keys (``dp``) are accepted when they agree."""
        p = Problems()
        per_part: dict[str, dict[str, Any]] = {name: {} for name in PARTS}
        notes: Any = ()
        derived: dict[str, Any] = {}
        for key, value in data.items():
            name = key.replace("-", "_")
            if name in PARTS and isinstance(value, dict):
                for k, v in value.items():
                    _place(p, per_part, f"{where} [{name}]", k.replace("-", "_"), v, only=name)
            elif name == "notes":
                notes = value
            elif name in _DERIVED:
                derived[name] = value
            else:
                _place(p, per_part, where, name, value)
        parts: dict[str, Any] = {}
        for name, cls_ in PARTS.items():
            try:
                parts[name] = cls_(**per_part[name])
            except ConfigError as e:
                for msg in e.problems:
                    p.add(msg)
        p.raise_if_any()
        recipe = cls(**parts, notes=_as_notes(notes))
        if "dp" in derived and derived["dp"] != recipe.parallelism.dp:
            raise ConfigError([f"{where}: dp={derived['dp']!r} disagrees with gpus/(tp*pp*cp)"
                               f"={recipe.parallelism.dp}; dp is derived, drop it."])
        return recipe

    def with_keys(self, **values: Any) -> Recipe:
        """This recipe with some flat keys changed (``recipe.with_keys(tp=2, zero=3)``); only
        the parts those keys belong to are rebuilt."""
        per_part: dict[str, dict[str, Any]] = {}
        p = Problems()
        for key, value in values.items():
            hit = KEYS.get(key)
            if hit is None:
                p.add(f"unknown recipe key {key!r}.{did_you_mean(key, list(KEYS))}")
            else:
                per_part.setdefault(hit[0], {})[hit[1]] = value
        p.raise_if_any()
        return replace(self, **{part: replace(getattr(self, part), **kw)
                                for part, kw in per_part.items()})

    def to_dict(self) -> dict[str, Any]:
        """The flat table (plain values) plus the derived ``dp``; ``from_dict`` inverts it."""
        d: dict[str, Any] = {}
        for key, (part, name) in KEYS.items():
            d[key] = _plain(getattr(getattr(self, part), name))
        d["notes"] = list(self.notes)
        d["dp"] = self.parallelism.dp
        return d

    def values(self, keys: tuple[str, ...]) -> tuple[Any, ...]:
        """``tuple(self.to_dict()[k] for k in keys)`` for keys of the flat table (not
        ``notes`` or ``dp``), without building the rest of it (``memplan plan`` reads a few
        keys of every candidate)."""
        return tuple(_plain(getattr(getattr(self, KEYS[k][0]), KEYS[k][1])) for k in keys)

    @classmethod
    def from_file(cls, path: Any, overrides: dict[str, Any] | None = None) -> Recipe:
        """A recipe TOML or JSON file (its ``[host]`` table belongs to ``HostSetup``), with
        ``overrides`` (CLI flags) on top, validated once after merging."""
        data = read_recipe_file(path)
        data.pop("host", None)
        return cls.from_dict({**data, **(overrides or {})}, where=str(path))

    def to_toml(self) -> str:
        """The recipe as TOML text (flat keys; ``from_dict(tomllib.loads(...))`` inverts it)."""
        return to_toml(self)


def _plain(v: Any) -> Any:
    """A recipe value as ``to_dict`` writes it: tuples as lists, string enums as ``str``."""
    return list(v) if isinstance(v, tuple) else (str(v) if isinstance(v, str) else v)


def _place(p: Problems, per_part: dict[str, dict[str, Any]], where: str, name: str,
           value: Any, only: str | None = None) -> None:
    hit = KEYS.get(name)
    if hit is None and only is not None:  # a part table may also use the field's own name
        hit = next(((only, f.name) for f in fields(PARTS[only]) if f.name == name), None)
    if hit is None or (only is not None and hit[0] != only):
        names = list(KEYS) + ["notes"] if only is None else [
            k for k, (part, _) in KEYS.items() if part == only]
        p.add(f"{where}: unknown key {name!r}.{did_you_mean(name, names)}")
        return
    per_part[hit[0]][hit[1]] = value


def _as_notes(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    raise ConfigError([f"notes: expected a list or comma-separated string, got {value!r}"])
