"""Activation and temporary memory of one micro-batch, moment by moment.

``stage_points`` writes the stage's forward as ops (``families.py`` from ``blocks.py``) and
replays forward and backward with the autograd simulator (``graph.py``). The result is one
``Point`` per region (embedding, each layer, head, loss) and phase, at the region's largest
instant: saved activations, temporaries, and the parameter gradients produced so far.
"""

from __future__ import annotations

from ...model.spec import ModelSpec
from ...recipe import Recipe
from ...units import dtype_bytes
from ..layout import Stage
from ...facts import Dtypes
from .blocks import Ctx
from .families import stage_graph
from .graph import Point, simulate

__all__ = ["Point", "stage_points"]


def _context(recipe: Recipe, dt: Dtypes) -> Ctx:
    """Sizes and dtypes of one micro-batch on one rank (context parallelism splits the
    sequence)."""
    full = recipe.method.kind == "full"
    act = dtype_bytes(dt.param if full else dt.frozen)
    half = dtype_bytes(dt.compute)
    lora = recipe.method.kind in ("lora", "qlora")
    # torch.autocast: mixed precision with fp32 parameters (ZeRO >= 1 / fp8 keep a 16-bit model)
    amp = recipe.precision.kind.endswith("-mixed") and dtype_bytes(dt.param) == 4 and half < 4
    par = recipe.parallelism
    return Ctx(batch=recipe.batch.micro_batch, seq=-(-recipe.batch.seq_len // par.cp),
               act=int(act), half=int(half), amp=amp,
               trained=full, cpu=recipe.platform.device == "cpu",
               lora_rank=recipe.method.lora_rank if lora else 0,
               lora_targets=frozenset(recipe.method.lora_targets) if lora else frozenset(),
               adapter=int(dtype_bytes(recipe.method.adapter_dtype)),
               train_act=int(dtype_bytes(dt.param)), loss=recipe.loss.kind,
               sp=par.tp if par.sequence_parallel else 1,
               capacity=float(par.moe_capacity_factor))


def stage_points(spec: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes,
                 memo: dict[object, object] | None = None) -> tuple[list[Point], int]:
    """Points of one micro-batch through ``stage``; and the parameter-gradient bytes the
    simulated graph produces in total (to scale the gradient lines by progress).

    ``memo``: a dict the caller keeps for one ``spec`` (``memplan.plan`` evaluating many
    recipes of one model); results are stored under exactly the arguments the graph is built
    from, so a hit returns what the simulation would (the points are shared: read only)."""
    ctx = _context(recipe, dt)
    args = dict(first=stage.index == 0, last=stage.index == recipe.parallelism.pp - 1,
                tp=recipe.parallelism.tp, attention=str(recipe.platform.attention),
                checkpointing=str(recipe.checkpointing.kind),
                train_from=(spec.num_layers - recipe.method.freeze_trainable_layers
                            if recipe.method.kind == "freeze" else None))
    key = ("stage_points", stage.layers, ctx, *args.values())
    if memo is not None and key in memo:
        return memo[key]  # type: ignore[return-value]
    g = stage_graph(spec, stage.layers, ctx, **args)  # type: ignore[arg-type]
    out = simulate(g), g.param_grad_bytes
    if memo is not None:
        memo[key] = out
    return out
