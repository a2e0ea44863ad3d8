"""``transformers.TrainingArguments`` keyword arguments as JSON, with ``fsdp_config`` or an inline
``deepspeed`` config, and back. Use it as ``TrainingArguments(**json.load(f))``.

Keys: ``transformers.training_args.TrainingArguments`` (transformers 5.23): ``optim`` from
``OptimizerNames``; FSDP through ``fsdp=True`` + ``fsdp_config`` (``version``,
``reshard_after_forward``, ``cpu_offload``, ``activation_checkpointing``). JSON has no comments:
the header is printed by the CLI, not written into the file.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .common import ExportContext, Imported, leaves, load_json
from .deepspeed import ds_config, from_ds_config

if TYPE_CHECKING:
    from ..recipe import Recipe

__all__ = ["training_arguments", "export_text", "read_text"]

_OPTIM = {"adamw": "adamw_torch", "adam": "adamw_torch", "sgd": "sgd", "sgd-momentum": "sgd",
          "adafactor": "adafactor", "lion": "lion_32bit", "adamw-8bit": "adamw_bnb_8bit",
          "paged-adamw": "paged_adamw_32bit", "paged-adamw-8bit": "paged_adamw_8bit"}
"""memplan optimizer -> ``optim`` (adam and adamw keep the same states)."""
_FSDP1 = {0: "no_shard", 2: "shard_grad_op", 3: "full_shard"}


def _optim(recipe: Recipe) -> str:
    """``optim``: ``adamw_torch_fused`` (``AdamW(fused=True)``, trainer_optimizer.py
    ``_get_adamw_torch``) for a fused Adam/AdamW, ``adamw_torch`` (torch's own default path) for
    ``auto``; the foreach and for-loop paths have no name, so reading back gives ``auto``."""
    kind = str(recipe.optimizer.kind)
    if kind in ("adamw", "adam") and recipe.optimizer.impl == "fused":
        return "adamw_torch_fused"
    return _OPTIM[kind]


def training_arguments(recipe: Recipe) -> dict[str, Any]:
    kind, engine = str(recipe.precision.kind), str(recipe.engine_kind)
    args: dict[str, Any] = {
        "output_dir": "out",
        "per_device_train_batch_size": recipe.batch.micro_batch,
        "gradient_accumulation_steps": recipe.batch.grad_accum,
        "bf16": kind in ("bf16-mixed", "bf16-true"), "fp16": kind in ("16-mixed", "16-true"),
        "optim": _optim(recipe)}
    if recipe.optimizer.kind == "sgd-momentum":
        args["optim_args"] = "momentum=0.9"
    if recipe.platform.device == "cpu":
        args["use_cpu"] = True
    full_ckpt = recipe.checkpointing.kind == "full"
    if engine == "deepspeed":
        args["deepspeed"] = ds_config(recipe)
        args["gradient_checkpointing"] = full_ckpt
    elif engine in ("fsdp1", "fsdp2"):
        v2 = engine == "fsdp2"
        args["fsdp"] = True
        args["fsdp_config"] = {
            "version": 2 if v2 else 1,
            "reshard_after_forward": (recipe.engine.reshard_after_forward if v2
                                      else _FSDP1[recipe.parallelism.zero]),
            "cpu_offload": recipe.offload.kind == "params+optimizer",
            "activation_checkpointing": full_ckpt}
        if not v2:
            args["fsdp_config"]["use_orig_params"] = recipe.engine.use_orig_params
            args["fsdp_config"]["backward_prefetch"] = str(
                recipe.engine.fsdp1_backward_prefetch).replace("none", "no_prefetch")
    elif engine == "ddp":
        args["gradient_checkpointing"] = full_ckpt
    else:
        raise ConfigError([f"the HF Trainer cannot run engine={engine}: --to hf-trainer writes "
                           "DDP, FSDP or DeepSpeed arguments."])
    return args


def export_text(recipe: Recipe, ctx: ExportContext) -> str:
    return json.dumps(training_arguments(recipe), indent=2) + "\n"


_MODELLED = {"per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16",
             "optim", "optim_args", "use_cpu", "gradient_checkpointing", "fsdp",
             "fsdp_config.version", "fsdp_config.reshard_after_forward",
             "fsdp_config.cpu_offload", "fsdp_config.activation_checkpointing",
             "fsdp_config.use_orig_params", "fsdp_config.backward_prefetch"}
_NOT_MEMORY = {"output_dir"}


def read_text(text: str, where: str, hidden_size: int | None = None) -> Imported:
    args = load_json(text, where)
    keys: dict[str, Any] = {}
    resolved: list[str] = []
    if "per_device_train_batch_size" in args:
        keys["micro_batch"] = int(args["per_device_train_batch_size"])
    if "gradient_accumulation_steps" in args:
        keys["grad_accum"] = int(args["gradient_accumulation_steps"])
    keys["precision"] = ("bf16-mixed" if args.get("bf16") else "16-mixed" if args.get("fp16")
                         else "32-true")
    optim = str(args.get("optim", "adamw_torch"))
    by_name = {v: k for k, v in _OPTIM.items() if k not in ("adam", "sgd-momentum")}
    keys["optimizer"] = by_name.get(optim, "adamw")
    if optim == "sgd" and "momentum" in str(args.get("optim_args", "")):
        keys["optimizer"] = "sgd-momentum"
    if optim in ("adamw_torch_fused", "adamw_torch"):  # held by plan --from as given
        keys["optimizer_impl"] = "fused" if optim == "adamw_torch_fused" else "auto"
    elif optim not in by_name:
        resolved.append(f"optim={optim} is not one memplan models: adamw assumed")
    if args.get("use_cpu"):
        keys["device"] = "cpu"
    if args.get("gradient_checkpointing"):
        keys["checkpointing"] = "full"
    ignored = [k for k in leaves({k: v for k, v in args.items() if k != "deepspeed"})
               if k not in _MODELLED and k not in _NOT_MEMORY]
    ds = args.get("deepspeed")
    if ds is not None:
        if isinstance(ds, str):
            raise ConfigError([f"{where}: deepspeed={ds!r} names a file; read it with "
                               f"--from {ds} and pass the Trainer's batch as flags."])
        sub = from_ds_config(ds, hidden_size=hidden_size, target="hf-trainer")
        trainer_keys = dict(keys)
        keys = {**sub.keys, **trainer_keys}  # the Trainer's arguments fill DeepSpeed's "auto"
        resolved += [r.replace("takes --", "takes the Trainer's ") for r in sub.resolved]
        ignored += [f"deepspeed.{k}" for k in sub.ignored]
        if "gpus" not in keys:
            resolved.append("world size: not in TrainingArguments, --gpus applies")
    elif args.get("fsdp"):
        fs = args.get("fsdp_config") or {}
        v2 = int(fs.get("version", 2)) == 2
        keys["engine"] = "fsdp2" if v2 else "fsdp1"
        reshard = fs.get("reshard_after_forward", True if v2 else "full_shard")
        if v2:
            keys["zero"] = 3
            keys["reshard_after_forward"] = str(reshard).lower() == "true"
        else:
            keys["zero"] = {v: k for k, v in _FSDP1.items()}.get(str(reshard).lower(), 3)
            # training_args.py: fsdp_config.get("use_orig_params", "true"); the Trainer wraps a
            # PEFT model with PEFT's policy (update_fsdp_plugin_peft): fsdp1_wrap=peft
            keys["use_orig_params"] = str(fs.get("use_orig_params", "true")).lower() == "true"
            prefetch = str(fs.get("backward_prefetch", "no_prefetch")).lower()
            keys["fsdp1_backward_prefetch"] = prefetch.replace("no_prefetch", "none")
        if fs.get("cpu_offload"):
            keys["offload"] = "params+optimizer"
        if fs.get("activation_checkpointing"):
            keys["checkpointing"] = "full"
    else:
        keys["engine"] = "ddp"
    return Imported(target="hf-trainer", keys=keys, ignored=tuple(ignored),
                    resolved=tuple(resolved))
