"""The ``memplan`` command line: thin adapters over the public API.

Every subcommand catches ``MemplanError``, prints ``Error: <message>`` and exits 2 for bad input
(1 for runtime failures); anything else is a bug and shows its traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .cli_options import FROM_HELP, HW_HELP, MODEL_HELP, host_option, recipe_options
from .cli_options import host_memory_bytes, need_torch, progress, quiet_transformers
from .cli_options import stderr_console
from .cli_options import check_format as _check_format, emit_json as _emit_json
from .cli_options import fail as _fail, guard as _guard

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Will this training run fit? Per-GPU memory of LLM training, before a GPU-hour is spent.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

Opt = typer.Option


def _version(value: bool) -> None:
    if value:
        import memplan  # the package's __version__ (pyproject's version)

        typer.echo(f"memplan {memplan.__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, Opt("--version", callback=_version, is_eager=True,
                                       help="Print memplan's version and exit.")] = False,
          ) -> None:
    """Will this training run fit? Per-GPU memory of LLM training, before a GPU-hour is spent."""


@app.command()
@recipe_options
def estimate(
    model: Annotated[str, typer.Argument(help=MODEL_HELP)],
    gpu: Annotated[str | None, Opt(help="GPU name from `memplan gpus`, e.g. H100-80GB. "
                                        "(default: the --node's GPU, else H100-80GB)")] = None,
    recipe: Annotated[Path | None, Opt(help="Recipe TOML or JSON with the same names "
                                            "(underscores); flags given here override it.")] = None,
    from_file: Annotated[Path | None, Opt("--from", help=FROM_HELP)] = None,
    node: Annotated[str | None, Opt(help="Node preset (nodes.toml), e.g. DGX-H100, p5.48xlarge: "
                                         "host RAM, NVMe, PCIe, NVLink, network, CPU cores.")] = None,
    host_ram: Annotated[str | None, Opt(help="Host RAM per node, e.g. 2TiB or 1900GiB "
                                             "(overrides --node).")] = None,
    nvme: Annotated[str | None, Opt(help="Local NVMe per node, e.g. 30.72TB (overrides "
                                         "--node).")] = None,
    pcie: Annotated[int | None, Opt(help="PCIe generation of the GPU links: 3, 4 or 5 "
                                         "(overrides --node).")] = None,
    load: Annotated[str | None, host_option("load")] = None,
    workers: Annotated[int | None, host_option("workers")] = None,
    prefetch: Annotated[int | None, host_option("prefetch")] = None,
    numa_bound: Annotated[bool | None, host_option("numa_bound")] = None,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
    quiet: Annotated[bool, Opt("--quiet", "-q", help="Print only the one-line verdict (GPU, "
                                                    "host RAM, NVMe, tokens/s).")] = False,
    calibration: Annotated[Path | None, Opt(help="Rates from `memplan calibrate --out`.")] = None,
    hardware: Annotated[Path | None, Opt(help=HW_HELP["hardware"])] = None,
    gpu_memory: Annotated[str | None, Opt(help=HW_HELP["gpu_memory"])] = None,
    gpu_set: Annotated[list[str] | None, Opt(help=HW_HELP["gpu_set"])] = None,
    allocator: Annotated[str, Opt(help="Caching-allocator slack: flat (5% of the peak, what "
                                        "`plan` uses) | replay (the simulated step replayed "
                                        "through PyTorch's allocator rules; slower).")] = "flat",
    flags: dict[str, Any] | None = None,
) -> None:
    """Estimate per-GPU memory, host RAM, NVMe and step time of one training configuration.
    More host knobs (dataset, checkpoint format, pinning) go in the recipe's host table ([host] in TOML)."""
    _check_format(format)
    if quiet and format == "json":
        _fail("--quiet prints one line of text, --format json a document: give one of them.")
    host_flags = {k: v for k, v in dict(load=load, workers=workers, prefetch=prefetch,
                                        numa_bound=numa_bound).items() if v is not None}

    def run() -> Any:
        from . import api
        from .custom_hardware import apply_hardware_options
        from .timing.calibration import load_calibration

        name, node_name = apply_hardware_options(gpu, hardware=hardware, gpu_memory=gpu_memory,
                                                 gpu_set=gpu_set, node=node)
        job, setup = api.load_job(recipe, flags, host_flags, engine_file=from_file, model=model)
        machine = api.Machine(gpu=name, node=node_name, host_ram=host_ram, nvme=nvme, pcie=pcie,
                              host_memory_bytes=host_memory_bytes())
        cal = load_calibration(calibration) if calibration else None
        return api.estimate_from_names(model, job, machine, setup, calibration=cal,
                                       allocator=allocator)

    _show(_guard(run), format, quiet)


def _show(result: Any, format: str, quiet: bool = False) -> None:
    if format == "json":
        _emit_json(result.to_dict())
    elif quiet:
        from .report.summary import summary_line

        typer.echo(summary_line(result))
    else:
        from rich.console import Console

        from .report import render_breakdown

        Console().print(render_breakdown(result))


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


@app.command()
def validate(
    device: Annotated[str, Opt(help="cpu | cuda.")] = "cpu",
    quick: Annotated[bool, Opt("--quick", help="The quick subset (CI).")] = False,
    cases: Annotated[Path | None, Opt(help="A cases TOML instead of the built-in matrix.")] = None,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
    nproc: Annotated[int, Opt(help="Ranks >= 2: the FSDP2/DeepSpeed cases, torchrun on gloo.")] = 1,
) -> None:
    """Run the accuracy matrix for real, trace and estimate each case, and compare. Exits 1
    when a case exceeds its bound (trace 1%, estimate 5% of the measured peak)."""
    _check_format(format)
    if nproc != 1:
        from .cli_validate_dist import validate_dist

        return validate_dist(nproc=nproc, quick=quick, cases=cases, format=format, device=device)
    from rich.console import Console
    from rich.progress import Progress

    def run() -> Any:
        need_torch("validate")
        with progress("validate: importing torch and transformers"):
            quiet_transformers()
            from .validate import cases as list_cases
            from .validate import validate as run_all

            total = len(list_cases(quick=quick, device=device, table=cases))
        with Progress(console=stderr_console(), transient=True) as bar:
            task = bar.add_task("validating", total=total)
            return run_all(device=device, quick=quick, table=cases,
                           on_case=lambda r: bar.update(task, advance=1,
                                                        description=r.case.name))

    report = _guard(run, stdout_to_stderr=True).to_dict()
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


@app.command()
def report(
    result: Annotated[Path, typer.Argument(help="A memplan JSON: estimate/trace --format json, "
                                                 "or memplan-measure.json.")],
    html: Annotated[Path, Opt("--html", help="Write a one-file HTML report here (opens "
                                            "offline, from file://).")],
    against: Annotated[Path | None, Opt(help="Another memplan JSON (e.g. a measurement): add "
                                             "the error per category.")] = None,
) -> None:
    """Write a one-file HTML report (charts, tables, host/NVMe/time) of a saved result."""
    from .report.html import write_report

    typer.echo(f"wrote {_guard(lambda: write_report(result, html, against=against))}")


@app.command()
def serve(
    host: Annotated[str, Opt(help="Address to bind (loopback unless you say otherwise).")
                    ] = "127.0.0.1",
    port: Annotated[int, Opt(help="TCP port.")] = 8765,
) -> None:
    """A local page to plan a run: every recipe control, live updates, charts, comparisons."""
    from .web import serve as run_server

    typer.echo(f"memplan: http://{host}:{port}/ (Ctrl+C stops it)")
    _guard(lambda: run_server(host=host, port=port))


from .cli_calibrate import calibrate_command  # noqa: E402  (issue #19)
from .cli_export import export_command  # noqa: E402  (issue #14)
from .cli_measure import measure_command  # noqa: E402  (issue #18)
from .cli_trace import trace_command  # noqa: E402  (issue #15)
app.command("calibrate")(calibrate_command)
app.command("export")(export_command)
app.command("trace")(trace_command)
app.command("measure", context_settings={"allow_extra_args": True,
                                         "ignore_unknown_options": True})(measure_command)
from .cli_plan import register as _register_plan; _register_plan(app)  # noqa: E402,E702  (issue #13)


def main() -> None:
    app()
