"""Warnings for recipes that run, but not as the user may think (issue #15): a sequence beyond
the model's context, a pipeline with too few micro-batches to fill it, kernels or dtypes the GPU
does not have. They go into the result's notes; nothing the user gave is changed."""

from __future__ import annotations

from ..hardware import Device
from ..model.spec import ModelSpec
from ..recipe import Recipe


def recipe_warnings(model: ModelSpec, recipe: Recipe, device: Device) -> tuple[str, ...]:
    out = []
    ctx = model.max_position_embeddings
    seq = recipe.batch.seq_len
    if isinstance(ctx, int) and ctx > 0 and seq > ctx:
        out.append(f"seq_len={seq:,} is beyond the model's context "
                   f"(max_position_embeddings={ctx:,}): memory is estimated, but the model was "
                   "not trained for it (RoPE scaling or a longer-context model is needed).")
    par = recipe.parallelism
    if par.pp > 1 and recipe.batch.grad_accum < par.pp:
        out.append(f"pp={par.pp} with grad_accum={recipe.batch.grad_accum} micro-batch(es) per "
                   "step: the pipeline never fills and most stages idle (bubble fraction "
                   f"(pp-1)/(m+pp-1) = {(par.pp - 1) / (recipe.batch.grad_accum + par.pp - 1):.0%})."
                   f" Use grad_accum >= {par.pp} (typically >= {4 * par.pp}).")
    if recipe.deepspeed_16bit:
        half = "bf16" if recipe.precision.kind == "bf16-mixed" else "fp16"
        out.append(f"engine=deepspeed at zero=0 with precision={recipe.precision.kind} is "
                   f"assumed to run as DeepSpeed >= 0.17.6 runs it: the whole model cast to "
                   f"{half} (PEFT's adapters too), FP16_Optimizer over FusedAdam with an fp32 "
                   "master of the trainable parameters on every rank, no autocast "
                   "(engine.py _do_optimizer_sanity_check -> _configure_fp16_optimizer); "
                   "DeepSpeed < 0.17.6 took BF16_Optimizer for bf16, with fp32 gradient "
                   "buffers, which is not modelled.")
    cc = _capability(device)
    if cc is not None and recipe.platform.device != "cpu":
        if cc < 8.0 and str(recipe.precision.kind).startswith("bf16"):
            out.append(f"precision={recipe.precision.kind} on {device.name} (compute "
                       f"capability {cc:g}): bf16 needs Ampere (8.0) or newer; use 16-mixed.")
        if cc < 8.0 and str(recipe.platform.attention) == "flash":
            out.append(f"attention=flash on {device.name} (compute capability {cc:g}): "
                       "FlashAttention 2 needs Ampere (8.0) or newer; use attention=sdpa.")
    return tuple(out)


def _capability(device: Device) -> float | None:
    try:
        return float(device.compute_capability)
    except (TypeError, ValueError):
        return None
