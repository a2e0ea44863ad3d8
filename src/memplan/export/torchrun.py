"""The ``torchrun`` launch command (a POSIX shell script) with the environment the plan needs,
and back.

Flags: ``torch.distributed.run`` (``--nnodes``, ``--nproc-per-node``, ``--node-rank``,
``--rdzv-backend``, ``--rdzv-endpoint``, and ``--numa-binding=node`` when the recipe's ``[host]``
table binds the ranks, ``numa_bound = true``: PyTorch >= 2.9, docs.pytorch.org elastic/numa).
The environment carries what the recipe says about the process:
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Under DeepSpeed the script passes
the ds_config (``memplan export --to deepspeed -o ds_config.json``) to the training script.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from ..errors import ModelConfigError
from .common import ExportContext, Imported, header_lines

if TYPE_CHECKING:
    from ..recipe import Recipe

__all__ = ["torchrun_argv", "export_text", "read_text"]


def torchrun_argv(recipe: Recipe, companion: str = "ds_config.json", *,
                  numa_bound: bool = False) -> list[str]:
    """``torchrun`` and its arguments (node rank and rendezvous come from the environment)."""
    par = recipe.parallelism
    per_node = min(par.gpus, par.local_gpus)
    nodes = max(1, -(-par.gpus // per_node))
    argv = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={per_node}"]
    if numa_bound:
        argv.append("--numa-binding=node")
    if nodes > 1:
        argv += ["--node-rank=${NODE_RANK}", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=${MASTER_ADDR}:${MASTER_PORT:-29500}"]
    argv.append("train.py")
    if str(recipe.engine_kind) == "deepspeed":
        argv += ["--deepspeed", companion]
    return argv


def export_text(recipe: Recipe, ctx: ExportContext) -> str:
    lines = ["#!/bin/sh"] + [f"# {line}" for line in header_lines("torchrun", ctx)]
    lines.append("# train.py is your training script; its own flags follow it")
    if recipe.platform.expandable_segments:
        lines.append("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    if ctx.numa_bound:
        lines.append("# --numa-binding=node binds each rank to its GPU's NUMA node (PyTorch >= 2.9)")
    argv = torchrun_argv(recipe, ctx.companion, numa_bound=ctx.numa_bound)
    # ${...} stays unquoted so the shell expands it
    lines.append(" ".join(a if "${" in a else shlex.quote(a) for a in argv) + ' "$@"')
    return "\n".join(lines) + "\n"


def read_text(text: str, where: str, hidden_size: int | None = None) -> Imported:
    keys: dict[str, Any] = {}
    ignored: list[str] = []
    resolved: list[str] = []
    command = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export PYTORCH_CUDA_ALLOC_CONF="):
            keys["expandable_segments"] = "expandable_segments:True" in line
        elif line.startswith("export "):
            ignored.append(line.split()[1].split("=")[0])
        elif "torchrun" in line.split(" ")[:1] or line.startswith("torchrun "):
            command = line
    if command is None:
        raise ModelConfigError(f"{where}: no `torchrun ...` line found.")
    argv = shlex.split(command.replace("${", "{"))
    flags: dict[str, str] = {}
    script_at = len(argv)
    for i, arg in enumerate(argv[1:], start=1):
        if not arg.startswith("--"):
            script_at = i
            break
        name, _, value = arg[2:].partition("=")
        flags[name.replace("_", "-")] = value
    nodes = int(flags.get("nnodes", "1").split(":")[-1])
    per_node = flags.get("nproc-per-node", "1")
    if not per_node.isdigit():
        raise ModelConfigError(f"{where}: --nproc-per-node={per_node} is not a number of "
                               "processes; memplan needs the GPU count.")
    keys["gpus"] = nodes * int(per_node)
    if nodes > 1 and int(per_node) != min(keys["gpus"], 8):  # 0 = memplan's min(gpus, 8)
        keys["gpus_per_node"] = int(per_node)
    known = {"nnodes", "nproc-per-node", "node-rank", "rdzv-backend", "rdzv-endpoint"}
    if "numa-binding" in flags:   # host placement, not a recipe key: said, not dropped
        known.add("numa-binding")
        resolved.append(f"--numa-binding={flags['numa-binding']}: ranks bound to their GPU's "
                        "NUMA node; give numa_bound = true in the recipe's [host] table")
    ignored += [f"--{k}" for k in flags if k not in known]
    rest = argv[script_at + 1:]
    if "--deepspeed" in rest:
        keys["engine"] = "deepspeed"
        i = rest.index("--deepspeed")
        if i + 1 < len(rest):
            resolved.append(f"--deepspeed {rest[i + 1]}: read it with --from as well for "
                            "ZeRO, batch and precision")
    return Imported(target="torchrun", keys=keys, ignored=tuple(ignored),
                    resolved=tuple(resolved))
