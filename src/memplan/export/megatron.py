"""The arguments of Megatron-Core's config classes as JSON, and back::

    cfg = json.load(f)
    tc = TransformerConfig(**with_dtypes(cfg["TransformerConfig"]))
    oc = OptimizerConfig(**with_dtypes(cfg["OptimizerConfig"]))
    ddp = DistributedDataParallelConfig(**cfg["DistributedDataParallelConfig"])

Fields named in ``"dtype_fields"`` hold torch dtype names (``getattr(torch, name)``). The model's
shape comes from MODEL (Megatron builds it from these fields); ``"training"`` holds the batch
arguments of ``megatron/training/arguments.py`` (``--micro-batch-size``...), which the
megatron-core wheel does not ship. Keys: megatron-core 0.16.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .common import ExportContext, Imported, leaves, load_json

if TYPE_CHECKING:
    from ..model.spec import ModelSpec
    from ..recipe import Recipe

__all__ = ["megatron_config", "export_text", "read_text"]

_DTYPE_FIELDS = ("params_dtype", "pipeline_dtype")


def _shape(model: ModelSpec) -> dict[str, Any]:
    layer = next((x for x in model.layers if x.attention is not None and x.ffn is not None),
                 None)
    if layer is None or layer.attention is None or layer.ffn is None:
        raise ConfigError([f"{model.id}: Megatron's TransformerConfig needs attention and an "
                           "MLP in every layer; memplan found neither."])
    att, ffn = layer.attention, layer.ffn
    shape: dict[str, Any] = {
        "num_layers": len(model.layers), "hidden_size": model.hidden_size,
        "num_attention_heads": att.num_heads, "num_query_groups": att.num_kv_heads,
        "kv_channels": att.head_dim, "ffn_hidden_size": ffn.intermediate_size,
        "gated_linear_unit": ffn.gated}
    if ffn.num_experts:
        shape |= {"num_moe_experts": ffn.num_experts, "moe_router_topk": ffn.top_k}
    return shape


def megatron_config(recipe: Recipe, model: ModelSpec | None) -> dict[str, Any]:
    if model is None:
        raise ConfigError(["--to megatron needs MODEL: Megatron's TransformerConfig takes the "
                           "model's shape (layers, hidden size, heads)."])
    par, kind = recipe.parallelism, str(recipe.precision.kind)
    if str(recipe.engine_kind) not in ("megatron", "ddp", "deepspeed") or par.zero > 1:
        raise ConfigError([f"Megatron-Core shards optimizer states only (zero 0 or 1), not "
                           f"zero={par.zero} / engine={recipe.engine_kind}."])
    bf16 = kind in ("bf16-mixed", "bf16-true", "fp8-mixed")
    fp16 = kind in ("16-mixed", "16-true")
    dtype = "bfloat16" if bf16 else "float16" if fp16 else "float32"
    tc: dict[str, Any] = _shape(model) | {
        "tensor_model_parallel_size": par.tp, "pipeline_model_parallel_size": par.pp,
        "context_parallel_size": par.cp, "expert_model_parallel_size": par.ep,
        "sequence_parallel": par.sequence_parallel, "bf16": bf16, "fp16": fp16,
        "params_dtype": dtype}
    if par.pp > 1:
        tc["pipeline_dtype"] = dtype
    if par.pp_virtual > 1:
        tc["virtual_pipeline_model_parallel_size"] = par.pp_virtual
    if par.etp:
        tc["expert_tensor_parallel_size"] = par.etp
    if par.pp_first_layers:
        tc["num_layers_in_first_pipeline_stage"] = par.pp_first_layers
    if par.pp_last_layers:
        tc["num_layers_in_last_pipeline_stage"] = par.pp_last_layers
    if par.pp_split_embedding:
        tc["account_for_embedding_in_pipeline_split"] = True
    if par.pp_split_loss:
        tc["account_for_loss_in_pipeline_split"] = True
    ck = recipe.checkpointing
    if ck.kind == "full" and ck.checkpoint_every > 1:
        raise ConfigError([f"checkpoint_every={ck.checkpoint_every}: Megatron recomputes "
                           "uniform groups or the first N layers of a stage "
                           "(recompute_method block), not every k-th; use checkpoint_layers."])
    if ck.kind == "full" and ck.checkpoint_layers:
        tc |= {"recompute_granularity": "full", "recompute_method": "block",
               "recompute_num_layers": ck.checkpoint_layers}
    elif ck.kind == "full":
        tc |= {"recompute_granularity": "full", "recompute_method": "uniform",
               "recompute_num_layers": 1}
    if ck.partition_activations:
        tc["distribute_saved_activations"] = True
    elif recipe.checkpointing.kind == "selective":
        tc["recompute_granularity"] = "selective"
    if kind == "fp8-mixed":
        tc["fp8"] = "hybrid"
    if par.moe_capacity_factor and "num_moe_experts" in tc:
        tc |= {"moe_expert_capacity_factor": par.moe_capacity_factor,
               "moe_pad_expert_input_to_capacity": True}
    opt = {"adamw": "adam", "adam": "adam", "sgd": "sgd", "sgd-momentum": "sgd"}.get(
        str(recipe.optimizer.kind))
    if opt is None:
        raise ConfigError([f"Megatron-Core's OptimizerConfig offers adam and sgd, not "
                           f"optimizer={recipe.optimizer.kind}."])
    oc: dict[str, Any] = {"optimizer": opt, "bf16": bf16, "fp16": fp16, "params_dtype": dtype,
                          "use_distributed_optimizer": par.zero == 1}
    if recipe.offload.kind == "optimizer":
        oc |= {"optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0}
    ddp = {"grad_reduce_in_fp32": recipe.precision.grad_dtype == "fp32",
           "use_distributed_optimizer": par.zero == 1,
           "overlap_grad_reduce": recipe.engine.overlap_comm}
    training = {"world_size": par.gpus, "micro_batch_size": recipe.batch.micro_batch,
                "global_batch_size": recipe.global_batch, "seq_length": recipe.batch.seq_len}
    return {"TransformerConfig": tc, "OptimizerConfig": oc, "DistributedDataParallelConfig": ddp,
            "training": training, "dtype_fields": list(_DTYPE_FIELDS)}


def export_text(recipe: Recipe, ctx: ExportContext) -> str:
    return json.dumps(megatron_config(recipe, ctx.model), indent=2) + "\n"


_SHAPE = {"num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
          "ffn_hidden_size", "gated_linear_unit", "num_moe_experts", "moe_router_topk"}


def read_text(text: str, where: str, hidden_size: int | None = None) -> Imported:
    cfg = load_json(text, where)
    tc, oc = dict(cfg.get("TransformerConfig") or {}), dict(cfg.get("OptimizerConfig") or {})
    ddp, tr = dict(cfg.get("DistributedDataParallelConfig") or {}), dict(cfg.get("training")
                                                                        or {})
    keys: dict[str, Any] = {"engine": "megatron"}
    keys |= {"tp": int(tc.get("tensor_model_parallel_size", 1)),
             "pp": int(tc.get("pipeline_model_parallel_size", 1)),
             "cp": int(tc.get("context_parallel_size", 1)),
             "ep": int(tc.get("expert_model_parallel_size", 1)),
             "sequence_parallel": bool(tc.get("sequence_parallel", False)),
             "pp_virtual": int(tc.get("virtual_pipeline_model_parallel_size") or 1),
             "pp_first_layers": int(tc.get("num_layers_in_first_pipeline_stage") or 0),
             "pp_last_layers": int(tc.get("num_layers_in_last_pipeline_stage") or 0),
             "pp_split_embedding": bool(tc.get("account_for_embedding_in_pipeline_split")),
             "pp_split_loss": bool(tc.get("account_for_loss_in_pipeline_split")),
             "etp": int(tc.get("expert_tensor_parallel_size") or 0)}
    bf16, fp16 = bool(tc.get("bf16", oc.get("bf16"))), bool(tc.get("fp16", oc.get("fp16")))
    keys["precision"] = ("fp8-mixed" if tc.get("fp8") else "bf16-mixed" if bf16
                         else "16-mixed" if fp16 else "32-true")
    if ddp.get("grad_reduce_in_fp32") and (bf16 or fp16):
        keys["grad_dtype"] = "fp32"
    gran = tc.get("recompute_granularity")
    keys["checkpointing"] = str(gran) if gran in ("full", "selective") else "none"
    if gran == "full" and tc.get("distribute_saved_activations"):
        keys["partition_activations"] = True
    if gran == "full" and tc.get("recompute_method") == "block":
        keys["checkpoint_layers"] = int(tc.get("recompute_num_layers") or 0)
    if tc.get("moe_pad_expert_input_to_capacity") and tc.get("moe_expert_capacity_factor"):
        keys["moe_capacity_factor"] = float(tc["moe_expert_capacity_factor"])
    keys["optimizer"] = "sgd" if oc.get("optimizer") == "sgd" else "adamw"
    keys["zero"] = 1 if oc.get("use_distributed_optimizer") else 0
    if oc.get("optimizer_cpu_offload"):
        keys["offload"] = "optimizer"
    keys["overlap_comm"] = bool(ddp.get("overlap_grad_reduce", False))
    if "world_size" in tr:
        keys["gpus"] = int(tr["world_size"])
    if "micro_batch_size" in tr:
        keys["micro_batch"] = int(tr["micro_batch_size"])
    if "seq_length" in tr:
        keys["seq_len"] = int(tr["seq_length"])
    model_parallel = keys["tp"] * keys["pp"] * keys["cp"]
    if {"global_batch_size", "world_size", "micro_batch_size"} <= set(tr):
        dp = max(1, int(tr["world_size"]) // model_parallel)
        keys["grad_accum"] = max(1, int(tr["global_batch_size"]) // (keys["micro_batch"] * dp))
    modelled = {f"TransformerConfig.{k}" for k in (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
        "expert_model_parallel_size", "sequence_parallel", "virtual_pipeline_model_parallel_size",
        "bf16", "fp16", "fp8", "params_dtype", "pipeline_dtype", "recompute_granularity",
        "recompute_method", "recompute_num_layers", "moe_expert_capacity_factor",
        "moe_pad_expert_input_to_capacity", "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage", "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split", "expert_tensor_parallel_size")} | {f"TransformerConfig.{k}" for k in _SHAPE} | {
        f"OptimizerConfig.{k}" for k in ("optimizer", "bf16", "fp16", "params_dtype",
                                          "use_distributed_optimizer", "optimizer_cpu_offload",
                                          "optimizer_offload_fraction")} | {
        f"DistributedDataParallelConfig.{k}" for k in ("grad_reduce_in_fp32",
                                                       "use_distributed_optimizer",
                                                       "overlap_grad_reduce")} | {
        f"training.{k}" for k in ("world_size", "micro_batch_size", "global_batch_size",
                                  "seq_length")} | {"dtype_fields"}
    ignored = tuple(k for k in leaves(cfg) if k not in modelled)
    resolved = ("the model's shape (TransformerConfig num_layers, hidden_size, heads...) comes "
                "from MODEL, not from this file",)
    return Imported(target="megatron", keys=keys, ignored=ignored, resolved=resolved)
