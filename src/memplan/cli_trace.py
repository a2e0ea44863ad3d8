"""``memplan trace``: run the real model code for two training steps under fake tensors; split
from ``cli.py`` like ``cli_measure.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .cli_options import HW_HELP, MODEL_HELP, check_format, emit_json, fail, guard
from .cli_options import host_memory_bytes, need_torch, progress, quiet_transformers
from .cli_options import recipe_options

Opt = typer.Option


@recipe_options
def trace_command(
    model: Annotated[str, typer.Argument(help=MODEL_HELP)],
    gpu: Annotated[str, Opt(help="GPU name from `memplan gpus` (reported with --device cuda)."
                            )] = "H100-80GB",
    recipe: Annotated[Path | None, Opt(help="Recipe TOML or JSON with the same names "
                                            "(underscores); flags given here override it.")] = None,
    modules: Annotated[int, Opt(help="Rows of the per-module table at the peak (0: none).")] = 12,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
    hardware: Annotated[Path | None, Opt(help=HW_HELP["hardware"])] = None,
    gpu_memory: Annotated[str | None, Opt(help=HW_HELP["gpu_memory"])] = None,
    gpu_set: Annotated[list[str] | None, Opt(help=HW_HELP["gpu_set"])] = None,
    flags: dict[str, Any] | None = None,
) -> None:
    """Run the real model code for two training steps under fake tensors (no memory used) and
    count every storage: the same result as `estimate`, plus which module holds what. On a
    torch built without CUDA the default device=cuda traces with CPU kernels (and says so);
    give --device cuda to insist on CUDA kernels."""
    check_format(format)
    if modules < 0:
        fail(f"--modules={modules} must be a whole number >= 0 (rows of the per-module table; "
             "0 shows none).")
    flags = flags or {}

    def run() -> Any:
        from . import api
        from .custom_hardware import apply_hardware_options
        from .recipe.io import read_recipe_file

        need_torch("trace")
        name, _ = apply_hardware_options(gpu, hardware=hardware, gpu_memory=gpu_memory,
                                         gpu_set=gpu_set)
        job = api.load_recipe(recipe, flags)
        chosen = "device" in flags or (recipe is not None and "device" in read_recipe_file(recipe))
        with progress(f"tracing {model}: importing torch and transformers") as say:
            quiet_transformers()
            import torch  # noqa: F401  (the slow import, under the spinner)

            say(f"tracing {model}: two training steps under fake tensors")
            return api.trace_from_names(model, job, name or gpu, host_memory_bytes(),
                                        cpu_kernels_without_cuda=not chosen)

    result = guard(run, stdout_to_stderr=True)
    if format == "json":
        from .runtime.steps import module_table

        emit_json({**result.to_dict(), "modules_at_peak": module_table(result.worst.peak_moment)})
        return
    from rich.console import Console

    from .report import render_breakdown
    from .report.measured import by_category, render_modules

    console = Console()
    console.print(render_breakdown(by_category(result)))
    if modules:
        console.print(render_modules(result.worst.peak_moment, limit=modules))
