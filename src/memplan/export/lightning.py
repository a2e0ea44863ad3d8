"""Lightning's strategy and ``Trainer`` arguments as JSON, and back::

    cfg = json.load(f)
    strategy = getattr(lightning.pytorch.strategies, cfg["strategy"])(**cfg["strategy_kwargs"])
    trainer = lightning.Trainer(strategy=strategy, **cfg["trainer"])

DeepSpeed runs through ``DeepSpeedStrategy(config=<ds_config>)`` so every DeepSpeed knob is
carried; FSDP2 (and tensor parallelism) through ``ModelParallelStrategy``, whose sharding the
LightningModule's ``configure_model`` applies; FSDP1 through ``FSDPStrategy``; DDP through
``DDPStrategy``. Lightning's precision names are memplan's. Keys: Lightning 2.6.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .common import ExportContext, Imported, leaves, load_json
from .deepspeed import ds_config, from_ds_config

if TYPE_CHECKING:
    from ..recipe import Recipe

__all__ = ["lightning_config", "export_text", "read_text"]

_FSDP1 = {0: "NO_SHARD", 2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}


def lightning_config(recipe: Recipe) -> dict[str, Any]:
    par, engine = recipe.parallelism, str(recipe.engine_kind)
    nodes = max(1, -(-par.gpus // par.local_gpus))
    trainer = {"accelerator": "cpu" if recipe.platform.device == "cpu" else "gpu",
               "devices": par.gpus // nodes, "num_nodes": nodes,
               "precision": str(recipe.precision.kind),
               "accumulate_grad_batches": recipe.batch.grad_accum}
    if engine == "deepspeed":
        cfg = ds_config(recipe)
        # Lightning sets the micro-batch from the dataloader and precision from the Trainer
        for key in ("bf16", "fp16"):
            cfg.pop(key)
        return {"strategy": "DeepSpeedStrategy", "strategy_kwargs": {"config": cfg},
                "trainer": trainer}
    if engine == "fsdp2":
        kwargs = {"data_parallel_size": par.dp, "tensor_parallel_size": par.tp}
        return {"strategy": "ModelParallelStrategy", "strategy_kwargs": kwargs,
                "trainer": trainer}
    if engine == "fsdp1":
        kwargs = {"sharding_strategy": _FSDP1[par.zero],
                  "cpu_offload": recipe.offload.kind == "params+optimizer",
                  "use_orig_params": recipe.engine.use_orig_params}
        return {"strategy": "FSDPStrategy", "strategy_kwargs": kwargs, "trainer": trainer}
    if engine == "ddp":
        return {"strategy": "DDPStrategy", "strategy_kwargs": {}, "trainer": trainer}
    raise ConfigError([f"Lightning has no strategy for engine={engine}: --to lightning writes "
                       "DDP, FSDP, ModelParallel (FSDP2 + TP) or DeepSpeed."])


def export_text(recipe: Recipe, ctx: ExportContext) -> str:
    return json.dumps(lightning_config(recipe), indent=2) + "\n"


_PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "fp8-mixed")


def read_text(text: str, where: str, hidden_size: int | None = None) -> Imported:
    cfg = load_json(text, where)
    strategy, kwargs = str(cfg.get("strategy", "")), dict(cfg.get("strategy_kwargs") or {})
    trainer = dict(cfg.get("trainer") or {})
    keys: dict[str, Any] = {}
    resolved: list[str] = []
    ignored: list[str] = []
    if strategy == "DeepSpeedStrategy":
        sub = from_ds_config(dict(kwargs.get("config") or {}), hidden_size=hidden_size,
                             target="lightning")
        keys |= {k: v for k, v in sub.keys.items() if k != "precision"}
        resolved += sub.resolved
        ignored += [f"strategy_kwargs.config.{k}" for k in sub.ignored
                    if k not in ("bf16.enabled", "fp16.enabled")]
        ignored += [f"strategy_kwargs.{k}" for k in kwargs if k != "config"]
    elif strategy == "ModelParallelStrategy":
        keys |= {"engine": "fsdp2", "zero": 3, "tp": int(kwargs.get("tensor_parallel_size", 1))}
    elif strategy == "FSDPStrategy":
        by_name = {v: k for k, v in _FSDP1.items()}
        keys |= {"engine": "fsdp1",
                 "zero": by_name.get(str(kwargs.get("sharding_strategy", "FULL_SHARD")), 3)}
        if kwargs.get("cpu_offload"):
            keys["offload"] = "params+optimizer"
        # FSDPStrategy passes it to FullyShardedDataParallel; Lightning 2.6 defaults it to true
        keys["use_orig_params"] = bool(kwargs.get("use_orig_params", True))
    elif strategy == "DDPStrategy":
        keys |= {"engine": "ddp", "zero": 0}
    else:
        raise ConfigError([f"{where}: strategy={strategy!r} is not one memplan reads: "
                           "DeepSpeedStrategy, ModelParallelStrategy, FSDPStrategy, "
                           "DDPStrategy."])
    devices, nodes = int(trainer.get("devices", 1)), int(trainer.get("num_nodes", 1))
    keys["gpus"] = devices * nodes
    if nodes > 1 and devices != min(keys["gpus"], 8):  # 0 = memplan's default, min(gpus, 8)
        keys["gpus_per_node"] = devices
    if str(trainer.get("precision")) in _PRECISIONS:
        keys["precision"] = str(trainer["precision"])
    if "accumulate_grad_batches" in trainer:
        keys["grad_accum"] = int(trainer["accumulate_grad_batches"])
    if trainer.get("accelerator") == "cpu":
        keys["device"] = "cpu"
    known = {"accelerator", "devices", "num_nodes", "precision", "accumulate_grad_batches"}
    ignored += [f"trainer.{k}" for k in leaves(trainer) if k not in known]
    return Imported(target="lightning", keys=keys, ignored=tuple(ignored),
                    resolved=tuple(resolved))
