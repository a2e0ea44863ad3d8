"""The ``memplan`` command line: thin adapters over the public API.

Every subcommand catches ``MemplanError``, prints ``Error: <message>`` and exits 2 for bad input
(1 for runtime failures); anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from .errors import MemplanError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Will this training run fit? Per-GPU memory of LLM training, before a GPU-hour is spent.",
    pretty_exceptions_enable=False,
)

T = TypeVar("T")
_FORMATS = ("table", "json")


def _fail(message: str, code: int = 2) -> None:
    from rich.console import Console
    from rich.markup import escape

    # the message is plain text: brackets in it ([[case]], [host]) are not rich markup
    Console(stderr=True).print(f"[bold red]Error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def _guard(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except MemplanError as e:
        _fail(str(e), e.exit_code)
        raise AssertionError("unreachable") from None


def _check_format(fmt: str) -> None:
    if fmt not in _FORMATS:
        from .errors import did_you_mean

        _fail(f"--format {fmt!r} is not one of {', '.join(_FORMATS)}.{did_you_mean(fmt, _FORMATS)}")


def _emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


Opt = typer.Option


_HW_HELP = {
    "hardware": "TOML of extra [[device]] / [[node]] rows (the schema of the built-in "
                "devices.toml / nodes.toml), usable by name in --gpu / --node.",
    "gpu_memory": "Override the GPU's memory, e.g. 96GB or 94GiB (the rest of --gpu stays).",
    "gpu_set": "Override one field of --gpu, e.g. hbm_gb_per_s=3900 or tflops_bf16=989 "
               "(repeatable).",
}
_MODEL_HELP = ("HF id from the catalog (see `memplan models`), a config.json / model dir, or "
               "package.module:function.")

_RECIPE_OPTIONS: list[tuple[str, type, str]] = [
    ("gpus", int, "Total GPUs in the job. [default: 1]"),
    ("gpus_per_node", int, "GPUs per node. [default: min(gpus, 8)]"),
    ("precision", str, "32-true | 16-mixed | bf16-mixed | 16-true | bf16-true | fp8-mixed. "
                       "[default: bf16-mixed]"),
    ("optimizer", str, "adamw | adam | sgd | sgd-momentum | adafactor | lion | adamw-8bit | "
                       "paged-adamw | paged-adamw-8bit. [default: adamw]"),
    ("method", str, "full | lora | qlora | freeze. [default: full]"),
    ("lora_rank", int, "LoRA rank r. [default: 16]"),
    ("lora_targets", str, "Comma list of q,k,v,o,gate,up,down or all-linear. "
                          "[default: all-linear]"),
    ("quant", str, "QLoRA base storage: none | nf4 | nf4-dq | int8. [default: none]"),
    ("micro_batch", int, "Sequences per GPU per step. [default: 1]"),
    ("seq_len", int, "Tokens per sequence. [default: 2048]"),
    ("grad_accum", int, "Gradient accumulation steps. [default: 1]"),
    ("checkpointing", str, "none | selective | full. [default: none]"),
    ("attention", str, "eager | sdpa | flash. [default: sdpa]"),
    ("loss", str, "Cross-entropy: standard | chunked (torchtune, 8 chunks) | fused (Liger, no "
                  "logits). [default: standard]"),
    ("zero", int, "ZeRO stage 0-3 (FSDP full shard = 3). [default: 0]"),
    ("tp", int, "Tensor-parallel degree. [default: 1]"),
    ("sequence_parallel", bool, "Megatron sequence parallelism (needs tp > 1): norms, dropout "
                                "and residuals split over the TP ranks. [default: off]"),
    ("pp", int, "Pipeline-parallel stages. [default: 1]"),
    ("pp_virtual", int, "Model chunks per pipeline rank; > 1 is the interleaved 1F1B schedule. "
                        "[default: 1]"),
    ("cp", int, "Context-parallel degree. [default: 1]"),
    ("ep", int, "Expert-parallel degree. [default: 1]"),
    ("moe_capacity_factor", float, "MoE capacity factor, inputs padded to it (0 = dropless). "
                                   "[default: 0]"),
    ("offload", str, "none | optimizer | params+optimizer | nvme. [default: none]"),
    ("device", str, "cuda | cpu (cpu: no CUDA overheads, to compare with CPU runs). "
                    "[default: cuda]"),
    ("expandable_segments", bool, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (little "
                                  "allocator fragmentation). [default: off]"),
]
"""The recipe flags shared by ``estimate`` and ``trace``: (name, type, help). Unset flags are
None and leave the recipe file's (or the default) value alone."""


def recipe_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command the recipe flags above; it receives them as ``flags`` (only those set).

    Typer reads a command's parameters from its signature, so the wrapper's signature is the
    command's own parameters with the shared ones in place of ``flags``.
    """
    import functools
    import inspect

    sig = inspect.signature(fn, eval_str=True)
    names = [n for n, _, _ in _RECIPE_OPTIONS]
    shared = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None,
                                annotation=Annotated[t | None, Opt(help=h)])
              for n, t, h in _RECIPE_OPTIONS]
    own = [p for p in sig.parameters.values() if p.name != "flags"]
    cut = next((i for i, p in enumerate(own) if p.name == "recipe"), len(own))
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.default is not p.empty
              else p for p in own[:cut]] + shared + [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[cut:]]

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        flags = {n: kwargs.pop(n) for n in names if kwargs.get(n) is not None}
        for n in names:
            kwargs.pop(n, None)
        return fn(**kwargs, flags=flags)

    del wrapper.__wrapped__
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


@app.command()
@recipe_options
def estimate(
    model: Annotated[str, typer.Argument(help=_MODEL_HELP)],
    gpu: Annotated[str | None, Opt(help="GPU name from `memplan gpus`, e.g. H100-80GB. "
                                        "[default: the --node's GPU, else H100-80GB]")] = None,
    recipe: Annotated[Path | None, Opt(help="Recipe TOML with the same names (underscores); "
                                            "flags given here override it.")] = None,
    node: Annotated[str | None, Opt(help="Node preset (nodes.toml), e.g. DGX-H100, p5.48xlarge: "
                                         "host RAM, NVMe, PCIe, NVLink, network, CPU cores.")] = None,
    host_ram: Annotated[str | None, Opt(help="Host RAM per node, e.g. 2TiB or 1900GiB "
                                             "(overrides --node).")] = None,
    nvme: Annotated[str | None, Opt(help="Local NVMe per node, e.g. 30.72TB (overrides "
                                         "--node).")] = None,
    pcie: Annotated[int | None, Opt(help="PCIe generation of the GPU links: 3, 4 or 5 "
                                         "(overrides --node).")] = None,
    load: Annotated[str | None, Opt(help="How ranks load the checkpoint: full | rank0 | sharded "
                                         "| meta. [default: full]")] = None,
    workers: Annotated[int | None, Opt(help="DataLoader workers per rank. [default: 2]")] = None,
    prefetch: Annotated[int | None, Opt(help="DataLoader prefetch_factor. [default: 2]")] = None,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
    hardware: Annotated[Path | None, Opt(help=_HW_HELP["hardware"])] = None,
    gpu_memory: Annotated[str | None, Opt(help=_HW_HELP["gpu_memory"])] = None,
    gpu_set: Annotated[list[str] | None, Opt(help=_HW_HELP["gpu_set"])] = None,
    flags: dict[str, Any] | None = None,
) -> None:
    """Estimate per-GPU memory, host RAM, NVMe and step time of one training configuration.
    More host knobs (dataset, checkpoint format, pinning) go in the recipe's [host] table."""
    _check_format(format)
    host_flags = {k: v for k, v in dict(load=load, workers=workers, prefetch=prefetch).items()
                  if v is not None}

    def run() -> Any:
        from . import api
        from .custom_hardware import apply_hardware_options

        name, node_name = apply_hardware_options(gpu, hardware=hardware, gpu_memory=gpu_memory,
                                                 gpu_set=gpu_set, node=node)
        return api.estimate_from_names(model, name, recipe_file=recipe, overrides=flags,
                                       host_memory_bytes=_host_memory_bytes(), node=node_name,
                                       host_ram=host_ram, nvme=nvme, pcie=pcie,
                                       host_overrides=host_flags)

    _show(_guard(run), format)


def _show(result: Any, format: str) -> None:
    if format == "json":
        _emit_json(result.to_dict())
    else:
        from rich.console import Console

        from .report import render_breakdown

        Console().print(render_breakdown(result))


def _quiet_transformers() -> None:
    """transformers logs config warnings and deprecation notices (``gradient_checkpointing_*``
    in 5.x) on stderr; the CLI shows only its own output."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass


@app.command()
@recipe_options
def trace(
    model: Annotated[str, typer.Argument(help=_MODEL_HELP)],
    gpu: Annotated[str, Opt(help="GPU name from `memplan gpus` (reported with --device cuda)."
                            )] = "H100-80GB",
    recipe: Annotated[Path | None, Opt(help="Recipe TOML with the same names (underscores); "
                                            "flags given here override it.")] = None,
    modules: Annotated[int, Opt(help="Rows of the per-module table at the peak (0: none).")] = 12,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
    hardware: Annotated[Path | None, Opt(help=_HW_HELP["hardware"])] = None,
    gpu_memory: Annotated[str | None, Opt(help=_HW_HELP["gpu_memory"])] = None,
    gpu_set: Annotated[list[str] | None, Opt(help=_HW_HELP["gpu_set"])] = None,
    flags: dict[str, Any] | None = None,
) -> None:
    """Run the real model code for two training steps under fake tensors (no memory used) and
    count every storage: the same result as `estimate`, plus which module holds what."""
    _check_format(format)

    def run() -> Any:
        from . import api

        _need_torch("trace")
        _quiet_transformers()
        from .custom_hardware import apply_hardware_options

        name, _ = apply_hardware_options(gpu, hardware=hardware, gpu_memory=gpu_memory,
                                         gpu_set=gpu_set)
        return api.trace_from_names(model, name or gpu, recipe_file=recipe, overrides=flags,
                                    host_memory_bytes=_host_memory_bytes())

    result = _guard(run)
    if format == "json":
        from .measure.result import module_table

        _emit_json({**result.to_dict(), "modules_at_peak": module_table(result.worst.peak_moment)})
        return
    from rich.console import Console

    from .report import render_breakdown
    from .report.measured import by_category, render_modules

    console = Console()
    console.print(render_breakdown(by_category(result)))
    if modules:
        console.print(render_modules(result.worst.peak_moment, limit=modules))


def _need_torch(what: str) -> None:
    import importlib.util

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        from .errors import MemplanError

        raise MemplanError(f"`memplan {what}` runs real model code and needs "
                           f"{' and '.join(missing)}: pip install 'memplan[hf]'.")


@app.command()
def models(
    search: Annotated[str, Opt(help="Words that must all appear in the id or an alias, e.g. "
                                    "'qwen instruct'.")] = "",
    family: Annotated[str | None, Opt(help="model_type prefix, e.g. llama, qwen, gemma3.")] = None,
    min_params: Annotated[str | None, Opt(help="Smallest size, e.g. 1B or 500M.")] = None,
    max_params: Annotated[str | None, Opt(help="Largest size, e.g. 10B.")] = None,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
) -> None:
    """List (or search) the offline model catalog with exact parameter counts."""
    _check_format(format)
    from . import api
    from .model.sizes import parse_count

    rows = _guard(lambda: api.catalog_rows(
        search, family=family,
        min_params=parse_count(min_params, "--min-params") if min_params else None,
        max_params=parse_count(max_params, "--max-params") if max_params else None))
    if not rows and format == "table":
        _fail(f"no catalog model matches search={search!r} family={family!r} "
              f"size=[{min_params or ''}, {max_params or ''}]. Fix: fewer words, or "
              "`memplan models` for the whole list.")
    if format == "json":
        _emit_json(rows)
    else:
        from rich.console import Console

        from .report import render_models

        Console().print(render_models(rows))


@app.command()
def gpus(format: Annotated[str, Opt("--format", help="table | json.")] = "table") -> None:
    """List the GPU catalog (memory, bandwidth, dense TFLOP/s, sources)."""
    _check_format(format)
    from .hardware import devices

    rows = [{**d.to_dict(), "aliases": list(d.aliases), "notes": d.notes}
            for d in _guard(lambda: list(devices().values()))]
    if format == "json":
        _emit_json(rows)
    else:
        from rich.console import Console

        from .report import render_devices

        Console().print(render_devices(rows))


@app.command()
def nodes(format: Annotated[str, Opt("--format", help="table | json.")] = "table") -> None:
    """List the node presets for --node (GPUs, host RAM, CPU, PCIe, NVMe, network, sources)."""
    _check_format(format)
    from dataclasses import asdict

    from .hardware.nodes import nodes as catalog

    rows = [{**asdict(n), "aliases": list(n.aliases)}
            for n in _guard(lambda: list(catalog().values()))]
    if format == "json":
        _emit_json(rows)
    else:
        from rich.console import Console

        from .report import render_nodes

        Console().print(render_nodes(rows))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def measure(
    ctx: typer.Context,
    out: Annotated[Path, Opt(help="Folder for the report (memplan-measure.json/.png).")] = Path(
        "memplan-measure"),
    against: Annotated[Path | None, Opt(help="A `memplan estimate/trace --format json` file: "
                                             "print the error per category.")] = None,
    interval: Annotated[float, Opt(help="Sampling interval of RSS / allocator, seconds.")] = 0.01,
    no_tensors: Annotated[bool, Opt("--no-tensors", help="Skip live-tensor tracking (faster; "
                                                         "no categories).")] = False,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
) -> None:
    """Run a command and measure it: `memplan measure -- python train.py ...`. The child (each
    rank under torchrun) writes a report in the estimate's JSON schema and a timeline PNG."""
    _check_format(format)
    cmd = list(ctx.args)

    def run() -> Any:
        from .measure.cli_run import run_measured

        return run_measured(cmd, out, interval_s=interval, track_tensors=not no_tensors)

    code, report = _guard(run)
    rows = None
    if against is not None:
        def compare() -> Any:
            from .breakdown import Breakdown
            from .measure.aggregate import compare as cmp
            from .measure.cli_run import read_json

            return cmp(Breakdown.from_dict(report), Breakdown.from_dict(read_json(against)))

        rows = _guard(compare)
    if format == "json":
        _emit_json({"report": str(out), "exit_code": code, "comparison": rows,
                    "peak_allocated_bytes": report["gpu"]["peak_allocated_bytes"]})
    else:
        from rich.console import Console

        from .units import fmt_bytes

        console = Console()
        rank = report["gpu"]["per_rank"][0]
        console.print(f"measured: peak {fmt_bytes(report['gpu']['peak_allocated_bytes'])} at "
                      f"{rank['peak_moment']} ({rank['peak_step']} step); host RSS peak "
                      f"{fmt_bytes(report['counters'].get('peak_rss_bytes', 0))}; report in {out}/")
        if rows is not None:
            from .report.measured import render_comparison

            console.print(render_comparison(rows, [k for k in rows[0] if k not in (
                "what", "measured", "error_pct_of_peak", "unmodelled")][0]))
    if code:
        raise typer.Exit(code)


@app.command()
def validate(
    device: Annotated[str, Opt(help="cpu | cuda.")] = "cpu",
    quick: Annotated[bool, Opt("--quick", help="The quick subset (CI).")] = False,
    cases: Annotated[Path | None, Opt(help="A cases TOML instead of the built-in matrix.")] = None,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
) -> None:
    """Run the accuracy matrix for real, trace and estimate each case, and compare. Exits 1
    when a case exceeds its bound (trace 1%, estimate 5% of the measured peak)."""
    _check_format(format)
    from rich.console import Console
    from rich.progress import Progress

    def run() -> Any:
        _need_torch("validate")
        _quiet_transformers()
        from .validate import cases as list_cases
        from .validate import validate as run_all

        total = len(list_cases(quick=quick, device=device, table=cases))
        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("validating", total=total)
            return run_all(device=device, quick=quick, table=cases,
                           on_case=lambda r: bar.update(task, advance=1,
                                                        description=r.case.name))

    report = _guard(run).to_dict()
    if format == "json":
        _emit_json(report)
    else:
        from .report.measured import render_validation

        console = Console()
        console.print(render_validation(report))

        def pct(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.2f}%"

        console.print(f"estimate |error|: max {pct(report['max_abs_error_pct'])}, median "
                      f"{pct(report['median_abs_error_pct'])}; trace |error|: max "
                      f"{pct(report['trace_max_abs_error_pct'])}; {len(report['cases'])} cases "
                      f"in {report['seconds']:.0f} s; {'PASSED' if report['passed'] else 'FAILED'}")
    if not report["passed"]:
        raise typer.Exit(1)


def main() -> None:
    app()
