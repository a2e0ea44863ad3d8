"""``accelerate launch --config_file`` YAML from a recipe (FSDP, DeepSpeed or DDP), and back.

Keys: ``accelerate.commands.config.config_args.ClusterConfig`` and the ``accelerate config``
questionnaire (accelerate 1.15). The DeepSpeed section is accelerate's inline form (stage,
offload devices, grad accumulation); bucket sizes and ZeRO-3 knobs need a ds_config file
(``memplan export --to deepspeed``), so they are reported as not carried when they differ from
DeepSpeed's defaults. Under FSDP the micro-batch and accumulation live in the training script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .common import ExportContext, Imported, header_lines, leaves, load_yaml, yaml_text

if TYPE_CHECKING:
    from ..recipe import Recipe

__all__ = ["accelerate_config", "export_text", "read_text"]

_MIXED = {"32-true": "no", "16-mixed": "fp16", "bf16-mixed": "bf16", "16-true": "no",
          "bf16-true": "no", "fp8-mixed": "fp8"}
"""precision -> ``mixed_precision`` (accelerate has no "true" 16-bit mode: the script loads the
model in that dtype)."""
_PRECISION = {"no": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed", "fp8": "fp8-mixed"}
_OFFLOAD_DS = {"none": ("none", "none"), "optimizer": ("cpu", "none"),
               "params+optimizer": ("cpu", "cpu"), "nvme": ("nvme", "nvme")}
_FSDP1_STRATEGY = {0: "NO_SHARD", 2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}
_PREFETCH = {"none": "NO_PREFETCH", "backward_pre": "BACKWARD_PRE",
             "backward_post": "BACKWARD_POST"}
"""fsdp1_backward_prefetch -> accelerate's ``fsdp_backward_prefetch``."""


def accelerate_config(recipe: Recipe) -> dict[str, Any]:
    par, engine = recipe.parallelism, str(recipe.engine_kind)
    nodes = max(1, -(-par.gpus // par.local_gpus))
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "debug": False,
        "distributed_type": "NO", "downcast_bf16": "no", "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": _MIXED[str(recipe.precision.kind)],
        "num_machines": nodes, "num_processes": par.gpus, "rdzv_backend": "static",
        "same_network": True, "tpu_env": [], "tpu_use_cluster": False, "tpu_use_sudo": False,
        "use_cpu": recipe.platform.device == "cpu"}
    if engine == "deepspeed":
        opt_dev, param_dev = _OFFLOAD_DS[str(recipe.offload.kind)]
        ds: dict[str, Any] = {
            "deepspeed_multinode_launcher": "standard",
            "gradient_accumulation_steps": recipe.batch.grad_accum,
            "offload_optimizer_device": opt_dev, "offload_param_device": param_dev,
            "zero3_init_flag": par.zero == 3, "zero_stage": par.zero}
        if param_dev == "nvme":
            ds["offload_param_nvme_path"] = ds["offload_optimizer_nvme_path"] = "/local_nvme"
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = ds
    elif engine in ("fsdp1", "fsdp2"):
        v2 = engine == "fsdp2"
        reshard: Any = recipe.engine.reshard_after_forward if v2 else _FSDP1_STRATEGY[par.zero]
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 2 if v2 else 1,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_activation_checkpointing": recipe.checkpointing.kind == "full",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": recipe.offload.kind == "params+optimizer",
            "fsdp_reshard_after_forward": reshard,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT"}
        if not v2:  # FSDP2 always uses the original parameters (accelerate warns if set)
            cfg["fsdp_config"]["fsdp_use_orig_params"] = recipe.engine.use_orig_params
            cfg["fsdp_config"]["fsdp_backward_prefetch"] = _PREFETCH[
                str(recipe.engine.fsdp1_backward_prefetch)]
    elif engine == "ddp":
        if par.gpus > 1:
            cfg["distributed_type"] = "MULTI_GPU"
    else:
        raise ConfigError([f"accelerate cannot launch engine={engine}: export --to accelerate "
                           "writes DDP, FSDP or DeepSpeed; use --to megatron or --to torchtitan."])
    return cfg


def export_text(recipe: Recipe, ctx: ExportContext) -> str:
    head = "".join(f"# {line}\n" for line in header_lines("accelerate", ctx))
    return head + yaml_text(accelerate_config(recipe))


_MODELLED = {"distributed_type", "mixed_precision", "num_processes", "num_machines", "use_cpu",
             "deepspeed_config.zero_stage", "deepspeed_config.gradient_accumulation_steps",
             "deepspeed_config.offload_optimizer_device", "deepspeed_config.offload_param_device",
             "fsdp_config.fsdp_version", "fsdp_config.fsdp_offload_params",
             "fsdp_config.fsdp_reshard_after_forward", "fsdp_config.fsdp_sharding_strategy",
             "fsdp_config.fsdp_activation_checkpointing", "fsdp_config.fsdp_use_orig_params",
             "fsdp_config.fsdp_backward_prefetch",
             "fsdp_config.fsdp_auto_wrap_policy"}
_LAUNCH_ONLY = {"compute_environment", "debug", "downcast_bf16", "machine_rank",
                "main_training_function", "rdzv_backend", "same_network", "tpu_env",
                "tpu_use_cluster", "tpu_use_sudo", "main_process_ip", "main_process_port"}
"""Launcher settings with no effect on memory: neither modelled nor worth listing."""


def _fsdp1_notes(fs: dict[str, Any], keys: dict[str, Any]) -> list[str]:
    """Read ``fsdp_use_orig_params`` into ``keys``; say what the YAML leaves to the script."""
    notes = []
    prefetch = str(fs.get("fsdp_backward_prefetch", "NO_PREFETCH")).upper()
    by_name = {v: k for k, v in _PREFETCH.items()}
    if prefetch in by_name:
        keys["fsdp1_backward_prefetch"] = by_name[prefetch]
    else:
        notes.append(f"fsdp_backward_prefetch={prefetch}: not one of {', '.join(by_name)}; "
                     "none assumed")
    if "fsdp_use_orig_params" in fs:
        keys["use_orig_params"] = bool(fs["fsdp_use_orig_params"])
    else:
        notes.append("fsdp_use_orig_params absent: accelerate 1.15 defaults to false, the HF "
                     "Trainer's fsdp_config to true; use_orig_params=true assumed")
    wrap = str(fs.get("fsdp_auto_wrap_policy", "NO_WRAP"))
    if wrap == "TRANSFORMER_BASED_WRAP":
        notes.append("fsdp_auto_wrap_policy=TRANSFORMER_BASED_WRAP: the HF Trainer replaces it "
                     "with PEFT's policy for a PEFT model (fsdp1_wrap=peft, assumed); a script "
                     "of your own wraps LoRA layers whole: add --fsdp1-wrap layers")
    else:
        notes.append(f"fsdp_auto_wrap_policy={wrap}: not modelled; memplan's FSDP1 units are "
                     "the transformer layers (TRANSFORMER_BASED_WRAP)")
    return notes


def read_text(text: str, where: str, hidden_size: int | None = None) -> Imported:
    cfg = load_yaml(text, where)
    keys: dict[str, Any] = {}
    resolved: list[str] = []
    if "num_processes" in cfg and int(cfg["num_processes"]) > 0:
        keys["gpus"] = int(cfg["num_processes"])
        machines = int(cfg.get("num_machines", 1) or 1)
        if machines > 1 and keys["gpus"] // machines != min(keys["gpus"], 8):
            keys["gpus_per_node"] = keys["gpus"] // machines
    mp = str(cfg.get("mixed_precision", "no"))
    keys["precision"] = _PRECISION.get(mp, "32-true")
    if cfg.get("use_cpu"):
        keys["device"] = "cpu"
    kind = str(cfg.get("distributed_type", "NO"))
    if kind == "DEEPSPEED":
        ds = cfg.get("deepspeed_config") or {}
        if "deepspeed_config_file" in ds:
            resolved.append(f"deepspeed_config_file={ds['deepspeed_config_file']}: read it "
                            "with --from as well (this reader takes the inline keys)")
        keys["engine"] = "deepspeed"
        keys["zero"] = int(ds.get("zero_stage", 2))
        ga = ds.get("gradient_accumulation_steps")
        if ga is not None and ga != "auto":
            keys["grad_accum"] = int(ga)
        opt_dev = str(ds.get("offload_optimizer_device", "none"))
        param_dev = str(ds.get("offload_param_device", "none"))
        keys["offload"] = ("nvme" if "nvme" in (opt_dev, param_dev) else "params+optimizer"
                           if param_dev == "cpu" else "optimizer" if opt_dev == "cpu"
                           else "none")
    elif kind == "FSDP":
        fs = cfg.get("fsdp_config") or {}
        v2 = int(fs.get("fsdp_version", 1)) == 2
        keys["engine"] = "fsdp2" if v2 else "fsdp1"
        reshard = fs.get("fsdp_reshard_after_forward", fs.get("fsdp_sharding_strategy",
                                                               True if v2 else "FULL_SHARD"))
        if v2:
            keys["zero"] = 3
            keys["reshard_after_forward"] = bool(reshard)
        else:
            by_name = {v: k for k, v in _FSDP1_STRATEGY.items()}
            keys["zero"] = by_name.get(str(reshard), 3)
        if fs.get("fsdp_offload_params"):
            keys["offload"] = "params+optimizer"
        if fs.get("fsdp_activation_checkpointing"):
            keys["checkpointing"] = "full"
        if not v2:
            resolved += _fsdp1_notes(fs, keys)
    elif kind in ("MULTI_GPU", "NO"):
        keys["engine"] = "ddp"
        keys["zero"] = 0
    else:
        raise ConfigError([f"{where}: distributed_type={kind} is not one memplan reads; "
                           "it reads NO, MULTI_GPU, FSDP and DEEPSPEED."])
    active = {"DEEPSPEED": "deepspeed_config", "FSDP": "fsdp_config"}.get(kind)
    inactive = {"deepspeed_config", "fsdp_config"} - {active}
    ignored = tuple(k for k in leaves(cfg) if k not in _MODELLED and k not in _LAUNCH_ONLY
                    and k.split(".")[0] not in inactive)
    return Imported(target="accelerate", keys=keys, ignored=ignored, resolved=tuple(resolved))
