"""DeepSpeed's ``ds_config`` JSON from a recipe, and back.

Keys and defaults: ``deepspeed.runtime.zero.config.DeepSpeedZeroConfig`` and
``deepspeed.runtime.config`` (DeepSpeed 0.19). JSON has no comments, and the HF and accelerate
integrations read the file with ``json.load``, so the header is not written into the file (the
CLI prints it on stderr). ``"auto"`` values are resolved as the HF Trainer resolves them
(``transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig``): batch and precision from the
training arguments (memplan's flags), ``reduce_bucket_size`` = hidden^2,
``stage3_prefetch_bucket_size`` = 0.9 hidden^2, ``stage3_param_persistence_threshold`` =
10 hidden.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .common import DS_PRECISION, ExportContext, Imported, leaves, load_json

if TYPE_CHECKING:
    from ..recipe import Recipe

__all__ = ["ds_config", "export_text", "read_text", "from_ds_config"]

_OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam", "lion": "Lion"}
"""memplan optimizer -> DeepSpeed ``optimizer.type`` (DeepSpeed builds these itself; the others
come from the training script)."""
_DEVICE = {"none": ("none", "none"), "optimizer": ("cpu", "none"),
           "params+optimizer": ("cpu", "cpu"), "nvme": ("nvme", "nvme")}
"""offload -> (offload_optimizer.device, offload_param.device)."""
NVME_PATH = "/local_nvme"
"""DeepSpeed's documented example path; edit it to the node's NVMe mount."""


def ds_config(recipe: Recipe) -> dict[str, Any]:
    """The ds_config dict DeepSpeed runs this recipe with."""
    b, par, e = recipe.batch, recipe.parallelism, recipe.engine
    bf16, fp16 = DS_PRECISION[str(recipe.precision.kind)]
    zero: dict[str, Any] = {
        "stage": par.zero, "reduce_bucket_size": e.reduce_bucket_size,
        "allgather_bucket_size": e.allgather_bucket_size, "overlap_comm": e.overlap_comm,
        "contiguous_gradients": e.contiguous_gradients, "sub_group_size": e.sub_group_size}
    if par.zero == 3:
        zero |= {"stage3_max_live_parameters": e.stage3_max_live_parameters,
                 "stage3_max_reuse_distance": e.stage3_max_reuse_distance,
                 "stage3_prefetch_bucket_size": e.stage3_prefetch_bucket_size,
                 "stage3_param_persistence_threshold": e.stage3_param_persistence_threshold}
    opt_dev, param_dev = _DEVICE[str(recipe.offload.kind)]
    if opt_dev != "none":
        zero["offload_optimizer"] = {"device": opt_dev, "pin_memory": e.offload_pin_memory}
        if opt_dev == "nvme":
            zero["offload_optimizer"]["nvme_path"] = NVME_PATH
    if param_dev != "none":
        zero["offload_param"] = {"device": param_dev, "pin_memory": e.offload_pin_memory,
                                 "buffer_count": e.offload_buffer_count}
        if param_dev == "nvme":
            zero["offload_param"]["nvme_path"] = NVME_PATH
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": b.micro_batch,
        "gradient_accumulation_steps": b.grad_accum,
        "train_batch_size": recipe.global_batch,
        "bf16": {"enabled": bf16}, "fp16": {"enabled": fp16},
        "zero_optimization": zero}
    if (bf16 or fp16) and recipe.precision.grad_dtype == "fp32":
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    if str(recipe.optimizer.kind) in _OPTIMIZERS:
        cfg["optimizer"] = {"type": _OPTIMIZERS[str(recipe.optimizer.kind)]}
    if recipe.checkpointing.kind == "full":
        # used by models that call deepspeed.checkpointing.checkpoint per layer (Megatron-DS)
        ck = recipe.checkpointing
        cfg["activation_checkpointing"] = {"partition_activations": ck.partition_activations,
                                           "cpu_checkpointing": ck.cpu_checkpointing}
    return cfg


def export_text(recipe: Recipe, ctx: ExportContext) -> str:
    return json.dumps(ds_config(recipe), indent=2) + "\n"


def read_text(text: str, where: str, hidden_size: int | None = None) -> Imported:
    return from_ds_config(load_json(text, where), hidden_size=hidden_size)


_MODELLED = {
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
    "bf16.enabled", "fp16.enabled", "data_types.grad_accum_dtype", "optimizer.type",
    "activation_checkpointing.partition_activations", "activation_checkpointing.cpu_checkpointing",
    "zero_optimization.stage", "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size", "zero_optimization.overlap_comm",
    "zero_optimization.contiguous_gradients", "zero_optimization.sub_group_size",
    "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.offload_optimizer.device", "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param.device", "zero_optimization.offload_param.pin_memory",
    "zero_optimization.offload_param.buffer_count"}
_ENGINE_KEYS = ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
                "contiguous_gradients", "sub_group_size", "stage3_max_live_parameters",
                "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
                "stage3_param_persistence_threshold")
_AUTO_BY_HIDDEN = {"reduce_bucket_size": (1.0, 2, "hidden_size^2"),
                   "stage3_prefetch_bucket_size": (0.9, 2, "0.9 x hidden_size^2"),
                   "stage3_param_persistence_threshold": (10.0, 1, "10 x hidden_size")}
_FLAG_OF = {"train_micro_batch_size_per_gpu": "micro_batch",
            "gradient_accumulation_steps": "grad_accum"}


def from_ds_config(cfg: dict[str, Any], *, hidden_size: int | None = None,
                   target: str = "deepspeed") -> Imported:
    """Recipe keys from a ds_config dict (see the module docstring for ``"auto"``)."""
    keys: dict[str, Any] = {"engine": "deepspeed"}
    resolved: list[str] = []
    for src, key in _FLAG_OF.items():
        if src in cfg:
            if cfg[src] == "auto":
                resolved.append(f"{src}=auto takes --{key.replace('_', '-')} (HF Trainer: "
                                f"from the training arguments)")
            else:
                keys[key] = cfg[src]
    tbs = cfg.get("train_batch_size")
    if tbs == "auto":
        resolved.append("train_batch_size=auto = world size x micro-batch x grad-accum "
                        "(HF Trainer)")
    elif tbs is not None and "micro_batch" in keys and "grad_accum" in keys:
        keys["gpus"] = max(1, int(tbs) // (keys["micro_batch"] * keys["grad_accum"]))
    bf16 = cfg.get("bf16", {}).get("enabled", False)
    fp16 = cfg.get("fp16", {}).get("enabled", False)
    if "auto" in (bf16, fp16):
        resolved.append("bf16/fp16.enabled=auto take --precision (HF Trainer: args.bf16/fp16)")
    else:
        keys["precision"] = "bf16-mixed" if bf16 else "16-mixed" if fp16 else "32-true"
        if cfg.get("data_types", {}).get("grad_accum_dtype") == "fp32" and (bf16 or fp16):
            keys["grad_dtype"] = "fp32"
    opt = cfg.get("optimizer", {}).get("type")
    if opt is not None:
        by_name = {v.lower(): k for k, v in _OPTIMIZERS.items()}
        keys["optimizer"] = by_name.get(str(opt).lower(), "adamw")
        if str(opt).lower() not in by_name:
            resolved.append(f"optimizer.type={opt} is not one memplan models: adamw assumed")
    if "activation_checkpointing" in cfg:
        keys["checkpointing"] = "full"
        for k in ("partition_activations", "cpu_checkpointing"):
            if cfg["activation_checkpointing"].get(k):
                keys[k] = True
    zero = cfg.get("zero_optimization", {})
    keys["zero"] = int(zero.get("stage", 0))
    for k in _ENGINE_KEYS:
        if k not in zero:
            continue
        if zero[k] == "auto":
            if k in _AUTO_BY_HIDDEN and hidden_size:
                factor, power, text = _AUTO_BY_HIDDEN[k]
                keys[k] = int(factor * hidden_size ** power)
                resolved.append(f"{k}=auto = {text} = {keys[k]:,} (HF Trainer)")
            else:
                resolved.append(f"{k}=auto: DeepSpeed's default kept (no model to size it)")
        else:
            keys[k] = zero[k]
    opt_dev = zero.get("offload_optimizer", {}).get("device", "none")
    param_dev = zero.get("offload_param", {}).get("device", "none")
    if param_dev == "nvme" or opt_dev == "nvme":
        keys["offload"] = "nvme"
    elif param_dev == "cpu":
        keys["offload"] = "params+optimizer"
    elif opt_dev == "cpu":
        keys["offload"] = "optimizer"
    else:
        keys["offload"] = "none"
    pin = zero.get("offload_param", zero.get("offload_optimizer", {})).get("pin_memory")
    if pin is not None:
        keys["offload_pin_memory"] = pin
    if "buffer_count" in zero.get("offload_param", {}):
        keys["offload_buffer_count"] = zero["offload_param"]["buffer_count"]
    ignored = tuple(k for k in leaves(cfg) if k not in _MODELLED)
    return Imported(target=target, keys=keys, ignored=ignored, resolved=tuple(resolved))
