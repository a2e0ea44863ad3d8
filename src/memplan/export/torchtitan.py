"""torchtitan's job TOML (torchtitan 0.2.2 on PyPI, read by
``ConfigManager().parse_args(["--job.config_file", path])``), and back.

memplan supports torchtitan 0.2.x: 0.3.0 dropped the TOML for Python registry configs overridden
from its CLI. Sections and defaults: ``torchtitan/config/job_config.py`` of 0.2.2. torchtitan
always pairs tensor parallelism with sequence parallelism, trains in bf16 or fp32 (no fp16),
and sets the pipeline schedule and the model (``[model] name/flavor``) outside memplan's recipe.
"""

from __future__ import annotations

import json
import tomllib
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ModelConfigError
from .common import ExportContext, Imported, header_lines, leaves

if TYPE_CHECKING:
    from ..recipe import Recipe

__all__ = ["job_config", "export_text", "read_text"]

_DTYPES = {"32-true": ("float32", "float32"), "bf16-mixed": ("float32", "bfloat16"),
           "bf16-true": ("bfloat16", "bfloat16"), "fp8-mixed": ("float32", "bfloat16")}
"""precision -> (training.dtype, training.mixed_precision_param)."""


def job_config(recipe: Recipe) -> dict[str, dict[str, Any]]:
    par, b = recipe.parallelism, recipe.batch
    kind = str(recipe.precision.kind)
    if kind not in _DTYPES:
        raise ConfigError([f"torchtitan trains in bf16 or fp32, not precision={kind}: use "
                           "bf16-mixed, bf16-true, 32-true or fp8-mixed."])
    dtype, mp = _DTYPES[kind]
    shard = (par.hybrid_shard or par.dp) if par.zero == 3 else 1
    training: dict[str, Any] = {
        "local_batch_size": b.micro_batch, "global_batch_size": recipe.global_batch,
        "seq_len": b.seq_len, "dtype": dtype, "mixed_precision_param": mp,
        "mixed_precision_reduce": "float32",
        "enable_cpu_offload": recipe.offload.kind == "params+optimizer"}
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": par.dp // shard, "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": "always" if recipe.engine.reshard_after_forward
        else "never",
        "tensor_parallel_degree": par.tp, "pipeline_parallel_degree": par.pp,
        "context_parallel_degree": par.cp, "expert_parallel_degree": par.ep}
    if par.ep > 1:  # torchtitan's default is 1 (experts not TP-split); memplan's is tp
        if par.expert_tp not in (1, par.tp):
            raise ConfigError([f"etp={par.etp}: torchtitan supports expert tensor parallelism "
                               f"equal to tp ({par.tp}) or 1 (JobConfig.parallelism."
                               "expert_tensor_parallel_degree); use one of them or export to "
                               "megatron."])
        parallelism["expert_tensor_parallel_degree"] = par.expert_tp
    ck = recipe.checkpointing
    ac = {"mode": str(ck.kind)}
    if ck.kind in ("selective", "op"):  # torchtitan has no attention-only policy: its per-op
        ac = {"mode": "selective", "selective_ac_option": "op"}  # one is the nearest
    elif ck.kind == "full" and ck.checkpoint_every > 1:  # layer SAC, _apply_layer_sac
        ac = {"mode": "selective", "selective_ac_option": str(ck.checkpoint_every)}
    if ck.kind == "full" and ck.checkpoint_layers:
        raise ConfigError([f"checkpoint_layers={ck.checkpoint_layers}: torchtitan checkpoints "
                           "every layer or every k-th (selective_ac_option = k), not the first "
                           "N; use checkpoint_every or export to megatron."])
    cfg: dict[str, dict[str, Any]] = {"training": training, "parallelism": parallelism,
                                      "activation_checkpoint": ac}
    if recipe.optimizer.kind in ("adamw", "adam"):
        cfg["optimizer"] = {"name": "AdamW" if recipe.optimizer.kind == "adamw" else "Adam"}
        if recipe.optimizer.impl in _IMPLEMENTATIONS:  # auto: torchtitan's default, fused
            cfg["optimizer"]["implementation"] = str(recipe.optimizer.impl)
    if kind == "fp8-mixed":
        cfg["model"] = {"converters": ["float8"]}
    if recipe.platform.compile:  # apply_compile: each TransformerBlock, and the loss
        cfg["compile"] = {"enable": True, "components": ["model", "loss"]}
    return cfg


def export_text(recipe: Recipe, ctx: ExportContext) -> str:
    out = [f"# {line}" for line in header_lines("torchtitan", ctx)]
    out.append("# torchtitan 0.2.x job config; add [model] name/flavor for your model")
    for section, values in job_config(recipe).items():
        out += ["", f"[{section}]"]
        out += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(out) + "\n"


_IMPLEMENTATIONS = ("fused", "foreach", "for-loop")
"""``optimizer.implementation`` values memplan models (``fused_opt_states_bf16`` keeps bf16
Adam states: not modelled, listed as ignored)."""

_MODELLED = {"training.local_batch_size", "training.global_batch_size", "training.seq_len",
             "training.dtype", "training.mixed_precision_param", "training.enable_cpu_offload",
             "parallelism.data_parallel_replicate_degree",
             "parallelism.data_parallel_shard_degree", "parallelism.fsdp_reshard_after_forward",
             "parallelism.tensor_parallel_degree", "parallelism.pipeline_parallel_degree",
             "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree",
             "parallelism.expert_tensor_parallel_degree",
             "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option",
             "optimizer.name", "model.converters", "training.mixed_precision_reduce",
             "compile.enable", "compile.components"}


def read_text(text: str, where: str, hidden_size: int | None = None) -> Imported:
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ModelConfigError(f"{where}: malformed TOML: {e}") from None
    tr, par = cfg.get("training", {}), cfg.get("parallelism", {})
    keys: dict[str, Any] = {"engine": "torchtitan"}
    resolved: list[str] = []
    tp, pp = int(par.get("tensor_parallel_degree", 1)), int(par.get("pipeline_parallel_degree", 1))
    cp, ep = int(par.get("context_parallel_degree", 1)), int(par.get("expert_parallel_degree", 1))
    rep, shard = int(par.get("data_parallel_replicate_degree", 1)), int(
        par.get("data_parallel_shard_degree", -1))
    if shard == -1:
        resolved.append("data_parallel_shard_degree=-1 takes the GPUs left (torchtitan): "
                        "from --gpus")
        keys["zero"] = 3
    else:
        keys["gpus"] = rep * shard * tp * pp * cp
        keys["zero"] = 3 if shard > 1 else 0
        if shard > 1 and rep > 1:
            keys["hybrid_shard"] = shard
    keys |= {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "sequence_parallel": tp > 1}
    if ep > 1:  # torchtitan's default expert TP is 1 (JobConfig.parallelism)
        keys["etp"] = int(par.get("expert_tensor_parallel_degree", 1))
    if str(par.get("fsdp_reshard_after_forward", "default")) == "never":
        keys["reshard_after_forward"] = False
    mb = int(tr.get("local_batch_size", 8))
    keys["micro_batch"] = mb
    keys["seq_len"] = int(tr.get("seq_len", 2048))
    gbs = int(tr.get("global_batch_size", -1))
    if gbs > 0 and "gpus" in keys:
        keys["grad_accum"] = max(1, gbs // (mb * rep * max(shard, 1)))
    dtype, mp = str(tr.get("dtype", "float32")), str(tr.get("mixed_precision_param", "bfloat16"))
    fp8 = "float8" in cfg.get("model", {}).get("converters", [])
    keys["precision"] = ("fp8-mixed" if fp8 else "bf16-true" if dtype == "bfloat16"
                         else "bf16-mixed" if mp == "bfloat16" else "32-true")
    if tr.get("enable_cpu_offload"):
        keys["offload"] = "params+optimizer"
    ac = cfg.get("activation_checkpoint", {})
    mode = str(ac.get("mode", "selective"))  # torchtitan's defaults: selective, option "2"
    option = str(ac.get("selective_ac_option", "2"))
    keys["checkpointing"] = mode if mode in ("none", "full") else "none"
    if mode == "selective" and option == "op":
        keys["checkpointing"] = "op"
    elif mode == "selective" and option.isdigit():
        keys["checkpointing"] = "full"
        if int(option) > 1:
            keys["checkpoint_every"] = int(option)
    comp = cfg.get("compile", {})
    if comp.get("enable"):
        parts = sorted(set(comp.get("components", ["model", "loss"])))
        if parts != ["loss", "model"]:
            raise ConfigError([f"{where}: [compile] components = {parts}: memplan models "
                               "torch.compile of every TransformerBlock and the loss together "
                               "(compile_scope=blocks); compiling one without the other would "
                               "be estimated low. Use components = [\"model\", \"loss\"], or "
                               "disable compile (the eager estimate is the upper bound)."])
        keys["compile"] = True  # apply_compile: per TransformerBlock, compile_scope=blocks
    name = str(cfg.get("optimizer", {}).get("name", "AdamW"))
    keys["optimizer"] = "adam" if name == "Adam" else "adamw"
    impl = cfg.get("optimizer", {}).get("implementation")
    if impl in _IMPLEMENTATIONS:
        keys["optimizer_impl"] = impl
    ignored = tuple(k for k in leaves(cfg) if k not in _MODELLED
                    and (k != "optimizer.implementation" or impl not in _IMPLEMENTATIONS))
    return Imported(target="torchtitan", keys=keys, ignored=ignored, resolved=tuple(resolved))
