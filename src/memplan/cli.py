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

    Console(stderr=True).print(f"[bold red]Error:[/] {message}", highlight=False)
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


@app.command()
def estimate(
    model: Annotated[str, typer.Argument(help="HF id from the catalog (see `memplan models`), a "
                                              "config.json / model dir, or package.module:function.")],
    gpu: Annotated[str | None, Opt(help="GPU name from `memplan gpus`, e.g. H100-80GB. "
                                        "[default: the --node's GPU, else H100-80GB]")] = None,
    gpus: Annotated[int | None, Opt(help="Total GPUs in the job. [default: 1]")] = None,
    gpus_per_node: Annotated[int | None, Opt(help="GPUs per node. [default: min(gpus, 8)]")] = None,
    precision: Annotated[str | None, Opt(help="32-true | 16-mixed | bf16-mixed | 16-true | "
                                              "bf16-true | fp8-mixed. [default: bf16-mixed]")] = None,
    optimizer: Annotated[str | None, Opt(help="adamw | adam | sgd | sgd-momentum | adafactor | lion "
                                              "| adamw-8bit | paged-adamw | paged-adamw-8bit. "
                                              "[default: adamw]")] = None,
    method: Annotated[str | None, Opt(help="full | lora | qlora | freeze. [default: full]")] = None,
    lora_rank: Annotated[int | None, Opt(help="LoRA rank r. [default: 16]")] = None,
    lora_targets: Annotated[str | None, Opt(help="Comma list of q,k,v,o,gate,up,down or "
                                                 "all-linear. [default: all-linear]")] = None,
    quant: Annotated[str | None, Opt(help="QLoRA base storage: none | nf4 | nf4-dq | int8. "
                                          "[default: none]")] = None,
    micro_batch: Annotated[int | None, Opt(help="Sequences per GPU per step. [default: 1]")] = None,
    seq_len: Annotated[int | None, Opt(help="Tokens per sequence. [default: 2048]")] = None,
    grad_accum: Annotated[int | None, Opt(help="Gradient accumulation steps. [default: 1]")] = None,
    checkpointing: Annotated[str | None, Opt(help="none | selective | full. [default: none]")] = None,
    attention: Annotated[str | None, Opt(help="eager | sdpa | flash. [default: sdpa]")] = None,
    zero: Annotated[int | None, Opt(help="ZeRO stage 0-3 (FSDP full shard = 3). [default: 0]")] = None,
    tp: Annotated[int | None, Opt(help="Tensor-parallel degree. [default: 1]")] = None,
    pp: Annotated[int | None, Opt(help="Pipeline-parallel stages. [default: 1]")] = None,
    cp: Annotated[int | None, Opt(help="Context-parallel degree. [default: 1]")] = None,
    ep: Annotated[int | None, Opt(help="Expert-parallel degree. [default: 1]")] = None,
    offload: Annotated[str | None, Opt(help="none | optimizer | params+optimizer | nvme. "
                                            "[default: none]")] = None,
    device: Annotated[str | None, Opt(help="cuda | cpu (cpu: no CUDA overheads, to compare with "
                                           "CPU runs). [default: cuda]")] = None,
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
) -> None:
    """Estimate per-GPU memory, host RAM, NVMe and step time of one training configuration.
    More host knobs (dataset, checkpoint format, pinning) go in the recipe's [host] table."""
    _check_format(format)
    flags = {k: v for k, v in dict(
        gpus=gpus, gpus_per_node=gpus_per_node, precision=precision, optimizer=optimizer,
        method=method, lora_rank=lora_rank, lora_targets=lora_targets, quant=quant,
        micro_batch=micro_batch, seq_len=seq_len, grad_accum=grad_accum,
        checkpointing=checkpointing, attention=attention, zero=zero, tp=tp, pp=pp, cp=cp, ep=ep,
        offload=offload, device=device).items() if v is not None}
    host_flags = {k: v for k, v in dict(load=load, workers=workers, prefetch=prefetch).items()
                  if v is not None}

    def run() -> Any:
        from . import api

        return api.estimate_from_names(model, gpu, recipe_file=recipe, overrides=flags,
                                       host_memory_bytes=_host_memory_bytes(), node=node,
                                       host_ram=host_ram, nvme=nvme, pcie=pcie,
                                       host_overrides=host_flags)

    result = _guard(run)
    if format == "json":
        _emit_json(result.to_dict())
    else:
        from rich.console import Console

        from .report import render_breakdown

        Console().print(render_breakdown(result))


@app.command()
def models(format: Annotated[str, Opt("--format", help="table | json.")] = "table") -> None:
    """List the offline model catalog with exact parameter counts."""
    _check_format(format)
    from . import api

    rows = _guard(api.catalog_rows)
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


def main() -> None:
    app()
