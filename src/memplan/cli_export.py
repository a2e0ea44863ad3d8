"""The ``memplan export`` subcommand (registered by ``cli.py``): a recipe written as an engine's
own config file (``memplan.export``), with the estimate it was planned for.

The file goes to standard output or ``-o FILE`` (written atomically). Everything that is not the
file goes to standard error: the estimate it was planned for (also in the file's header where the
format has comments), the recipe keys the format cannot carry, and how to read it back.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from .cli_options import FROM_HELP, guard, recipe_options

__all__ = ["export_command", "planned_for_line", "write_atomically"]

Opt = typer.Option


def planned_for_line(model: str, result: Any) -> str:
    """One line naming the estimate a file was planned for: model, GPU, peak, fit."""
    gib = 1 << 30
    worst = result.worst.device_total_bytes / gib
    cap = result.capacity_bytes / gib
    verdict = "fits" if result.fits else "does NOT fit"
    return (f"{model} on {result.device.name}: {worst:.1f} GiB peak per GPU of {cap:.1f} GiB "
            f"({verdict})")


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename, so
    that a reader never sees half a file."""
    from .errors import ConfigError

    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise ConfigError([f"-o {str(path)!r}: cannot write in {str(folder)!r} "
                           f"({e.strerror}); choose a writable folder."]) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError([f"-o {str(path)!r}: cannot write ({e.strerror})."]) from None


def _flag(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return f"--{key.replace('_', '-')}" if value else f"--no-{key.replace('_', '-')}"
    if isinstance(value, (tuple, list)):
        value = ",".join(map(str, value))
    return f"--{key.replace('_', '-')} {value}"


@recipe_options
def export_command(
    model: Annotated[str, typer.Argument(help="The model the file is planned for (HF id from "
                                              "the catalog, or a config.json): the header names "
                                              "its estimate; Megatron takes its shape.")],
    to: Annotated[str, Opt("--to", help="deepspeed | accelerate | hf-trainer | torchtitan | "
                                        "lightning | megatron | torchrun.")],
    out: Annotated[Path | None, Opt("-o", "--out", help="File to write (default: standard "
                                                        "output).")] = None,
    recipe: Annotated[Path | None, Opt(help="Recipe TOML or JSON (e.g. `plan --save-best`); "
                                            "flags given here override it.")] = None,
    from_file: Annotated[Path | None, Opt("--from", help=FROM_HELP)] = None,
    gpu: Annotated[str | None, Opt(help="GPU of the estimate named in the header (default: the "
                                        "--node's GPU, else H100-80GB).")] = None,
    node: Annotated[str | None, Opt(help="Node preset (nodes.toml), e.g. DGX-H100.")] = None,
    flags: dict[str, Any] | None = None,
) -> None:
    """Write the recipe as an engine's config file (ds_config, accelerate YAML, TrainingArguments
    JSON, torchtitan TOML, Lightning, Megatron-Core arguments, torchrun command)."""

    def run() -> str:
        from . import api
        from .export import ExportContext, export, get_target
        from .model import load_model

        get_target(to)  # an unknown --to fails here, naming the targets and close matches
        job, setup = api.load_job(recipe, flags, {}, engine_file=from_file, model=model)
        spec = load_model(model)
        target_engine = get_target(to).engine
        if target_engine is not None:
            job = job.with_keys(engine=target_engine)  # refused with the reason when it cannot
        result = api.estimate_from_names(spec, job, api.Machine(gpu=gpu, node=node), setup,
                                         search_micro_batch=False)
        planned = planned_for_line(model, result)
        done = export(job, to, ExportContext(model=spec, planned_for=planned,
                                             numa_bound=setup.numa_bound))
        if out is not None:
            write_atomically(out, done.text)
        err = sys.stderr.write
        err(f"# memplan export --to {to}: planned for {planned}\n")
        if done.not_carried:
            flags_text = " ".join(_flag(k, v) for k, v in done.not_carried.items())
            err(f"# {to} cannot express: {', '.join(done.not_carried)}; reading it back needs "
                f"them as flags: memplan estimate {model} --from FILE {flags_text}\n")
        else:
            err(f"# read back with: memplan estimate {model} --from FILE\n")
        if out is not None:
            err(f"# wrote {out}\n")
        return done.text

    text = guard(run)
    if out is None:
        sys.stdout.write(text)
