"""``memplan plan`` and ``memplan size`` (registered by ``cli.py``): the fastest configuration
that fits a cluster, and the smallest cluster that fits a run (issue #13)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from .cli_options import FROM_HELP, fail, guard, host_option, recipe_options

__all__ = ["register", "plan_command", "size_command"]

Opt = typer.Option
_MODEL_HELP = ("HF id from the catalog (see `memplan models`), a config.json / model dir, or "
               "package.module:function.")


_JOBS_HELP = ("Worker processes evaluating candidates: 0 = one per usable CPU core, 1 = this "
              "process only (searches over 500 candidates; fork only; the same plans either "
              "way). The environment variable MEMPLAN_JOBS sets the default.")


def _check_jobs(jobs: int) -> None:
    if jobs < 0:
        fail(f"--jobs {jobs} is negative: give a number of worker processes, or 0 for one per "
             "usable CPU core (the default).")


class _Bar:
    """A progress bar on stderr, shown only on a terminal and only once a search has run for
    a second."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.t0 = time.perf_counter()
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if not sys.stderr.isatty():
            return
        if self.bar is None:
            if time.perf_counter() - self.t0 < 1.0:
                return
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=total)
        self.bar.update(self.task, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def cluster_from_options(*, gpu: str | None, node: str | None, nodes: int | None,
                         flags: dict[str, Any], host_ram: str | None, nvme: str | None) -> Any:
    """``Cluster`` from ``--node NAME --nodes N`` or ``--gpu NAME --gpus N [--gpus-per-node
    K]``; pops ``gpus``/``gpus_per_node`` from the recipe flags."""
    from .errors import ConfigError
    from .hardware import get_device
    from .hardware.nodes import get_node
    from .plan import Cluster

    gpus = flags.pop("gpus", None)
    per_node = flags.pop("gpus_per_node", None)
    problems = []
    if node is not None:
        preset = get_node(node)
        if gpu is not None and get_device(gpu).name != preset.gpu:
            problems.append(f"--gpu {gpu} contradicts --node {preset.name}, whose GPUs are "
                            f"{preset.gpu}. Drop --gpu.")
        per_node = per_node or preset.gpus
        if gpus is not None and nodes is not None and gpus != nodes * per_node:
            problems.append(f"--gpus {gpus} contradicts --nodes {nodes} x {per_node} GPUs per "
                            "node. Give one of them.")
        gpus = gpus or (nodes or 1) * per_node
        name = preset.gpu
    else:
        if nodes is not None:
            problems.append("--nodes needs --node NAME (a preset from `memplan nodes`); with "
                            "--gpu give --gpus N and --gpus-per-node K.")
        name = get_device(gpu or "H100-80GB").name
        gpus = gpus or 1
        per_node = per_node or min(gpus, 8)
    if gpus % per_node and gpus > per_node:
        problems.append(f"--gpus {gpus} is not a whole number of nodes of {per_node} GPUs. "
                        f"Use a multiple of {per_node}.")
    if problems:
        raise ConfigError(problems)
    return Cluster(gpu=name, gpus=gpus, gpus_per_node=min(per_node, gpus), node=node,
                   host_ram=host_ram, nvme=nvme)


def _base(flags: dict[str, Any], recipe: Path | None, host: dict[str, Any], *,
          engine_file: Path | None = None, model: str | None = None,
          ) -> tuple[Any, frozenset[str]]:
    """The starting recipe and the keys held fixed: the flags, every key of ``--recipe`` and
    every key ``--from`` reads out of an engine's config."""
    from .api import load_job
    from .errors import ConfigError
    from .export import read_engine_file
    from .recipe import read_recipe_file

    fixed = set(flags)
    if recipe is not None:
        fixed |= {k for k in read_recipe_file(recipe) if k != "host"}
    if engine_file is not None:
        imported = read_engine_file(engine_file)
        keys = read_recipe_file(engine_file) if imported is None else imported.keys
        fixed |= {k for k in keys if k != "host"}
    host = {k: v for k, v in host.items() if v is not None}

    def job(extra: dict[str, Any]) -> Any:
        return load_job(recipe, {**flags, **extra}, host, engine_file=engine_file, model=model)

    try:
        return job({}), frozenset(fixed)
    except ConfigError as error:
        # the searched keys the user left free only need *some* valid value here (the space
        # sets each): e.g. --offload params+optimizer alone is refused with the default zero=0
        for fill in _FILLS:
            free = {k: v for k, v in fill.items() if k not in fixed}
            if free:
                try:
                    return job(free), frozenset(fixed)
                except ConfigError:
                    continue
        raise error


_FILLS = ({"zero": 3}, {"zero": 1}, {"zero": 3, "engine": "auto"}, {"zero": 1, "engine": "auto"},
          {"zero": 3, "engine": "torchtitan"}, {"zero": 1, "engine": "megatron"})
"""Values tried for searched keys the user left free when the defaults contradict the keys
given (the first valid one is only a starting point: plan searches those keys)."""


def recipe_toml(recipe: Any, setup: Any) -> str:
    """The recipe TOML ``--save-best`` writes: the recipe, and a ``[host]`` table when the
    host setup differs from the default (``estimate --recipe`` reads both)."""
    from .host import HostSetup

    text = recipe.to_toml()
    default = HostSetup().to_dict()
    changed = {k: v for k, v in setup.to_dict().items() if default.get(k) != v}
    if changed:
        import json as _json

        text += "\n[host]\n" + "".join(f"{k} = {_json.dumps(v)}\n" for k, v in changed.items())
    return text


def plan_command(
    model: Annotated[str, typer.Argument(help=_MODEL_HELP)],
    node: Annotated[str | None, Opt(help="Node preset (`memplan nodes`), e.g. DGX-H100; with "
                                         "--nodes N.")] = None,
    nodes: Annotated[int | None, Opt(help="Number of --node nodes.")] = None,
    gpu: Annotated[str | None, Opt(help="GPU name (`memplan gpus`), with --gpus N and "
                                        "--gpus-per-node K (default: the node's, else "
                                        "H100-80GB).")] = None,
    recipe: Annotated[Path | None, Opt(help="Recipe TOML/JSON: every key in it is held "
                                            "fixed, as are the flags given.")] = None,
    from_file: Annotated[Path | None, Opt("--from", help=FROM_HELP + " Every key it sets is "
                                          "held fixed.")] = None,
    host_ram: Annotated[str | None, Opt(help="Host RAM per node, e.g. 2TiB (overrides "
                                             "--node).")] = None,
    nvme: Annotated[str | None, Opt(help="Local NVMe per node, e.g. 30.72TB (overrides "
                                         "--node).")] = None,
    global_batch: Annotated[int | None, Opt(help="Sequences per optimizer step held across "
                                                 "candidates (default: the recipe's "
                                                 "micro-batch x accumulation when both are "
                                                 "given, else one per GPU).")] = None,
    load: Annotated[str | None, host_option("load")] = None,
    workers: Annotated[int | None, host_option("workers")] = None,
    prefetch: Annotated[int | None, host_option("prefetch")] = None,
    numa_bound: Annotated[bool | None, host_option("numa_bound")] = None,
    jobs: Annotated[int, Opt(help=_JOBS_HELP, envvar="MEMPLAN_JOBS")] = 0,
    top: Annotated[int, Opt(help="Plans in the ranked table.")] = 10,
    save_best: Annotated[Path | None, Opt(help="Write the best plan as a recipe TOML for "
                                               "`memplan estimate --recipe`.")] = None,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
    flags: dict[str, Any] | None = None,
) -> None:
    """The fastest configurations of MODEL that fit a cluster (--node NAME --nodes N, or --gpu G
    --gpus N): every ZeRO/FSDP sharding, tp/sp/pp/cp/ep degree, micro-batch x accumulation,
    checkpointing, attention kernel, loss and offload is estimated; the flags you give are
    held."""
    if format not in ("table", "json"):
        fail(f"--format {format!r} is not one of table, json.")
    _check_jobs(jobs)
    flags = dict(flags or {})

    def run() -> Any:
        from .model import load_model
        from .plan import plan
        from .plan.fit import check_fits
        from .plan.parallel import usable_cores

        cluster = cluster_from_options(gpu=gpu, node=node, nodes=nodes, flags=flags,
                                       host_ram=host_ram, nvme=nvme)
        (job, setup), fixed = _base({**flags, "gpus": cluster.gpus,
                                     "gpus_per_node": cluster.gpus_per_node}, recipe,
                                    dict(load=load, workers=workers, prefetch=prefetch,
                                         numa_bound=numa_bound),
                                    engine_file=from_file, model=model)
        fixed -= {"gpus", "gpus_per_node"}
        spec = load_model(model)
        bar = _Bar(f"planning {spec.id}")
        try:
            res = plan(spec, job, cluster, fixed=fixed, global_batch=global_batch, setup=setup,
                       progress=bar, workers=jobs or usable_cores())
        finally:
            bar.close()
        check_fits(res)
        return res, setup

    res, setup = guard(run)
    if save_best is not None:
        save_best.write_text(recipe_toml(res.ranked[0].recipe, setup))
    if format == "json":
        sys.stdout.write(json.dumps(res.to_dict(top), indent=2, default=str) + "\n")
        return
    from rich.console import Console

    from .report.plan import render_plan

    Console(width=None if sys.stdout.isatty() else 250).print(render_plan(res, top))
    if save_best is not None:
        Console().print(f"best plan written to {save_best}")


def size_command(
    model: Annotated[str, typer.Argument(help=_MODEL_HELP)],
    gpu: Annotated[str | None, Opt(help="GPU type to size in (default: the --node's, else "
                                        "H100-80GB).")] = None,
    node: Annotated[str | None, Opt(help="Node preset to size in whole nodes (its host RAM "
                                         "and NVMe are then limits).")] = None,
    recipe: Annotated[Path | None, Opt(help="Recipe TOML/JSON: every key in it is held "
                                            "fixed, as are the flags given.")] = None,
    from_file: Annotated[Path | None, Opt("--from", help=FROM_HELP + " Every key it sets is "
                                          "held fixed except the GPU count.")] = None,
    host_ram: Annotated[str | None, Opt(help="Host RAM per node, a limit (overrides "
                                             "--node).")] = None,
    nvme: Annotated[str | None, Opt(help="Local NVMe per node, a limit (overrides "
                                         "--node).")] = None,
    global_batch: Annotated[int | None, Opt(help="Sequences per optimizer step (default: one "
                                                 "per GPU).")] = None,
    tokens_per_second: Annotated[float | None, Opt(help="Throughput target, tokens/s: size "
                                                        "for speed too.")] = None,
    tokens: Annotated[float | None, Opt(help="Tokens to train, with --hours: the target is "
                                             "tokens / hours.")] = None,
    hours: Annotated[float | None, Opt(help="Deadline in hours, with --tokens.")] = None,
    max_gpus: Annotated[int, Opt(help="Largest cluster tried.")] = 2048,
    jobs: Annotated[int, Opt(help=_JOBS_HELP, envvar="MEMPLAN_JOBS")] = 0,
    load: Annotated[str | None, host_option("load")] = None,
    workers: Annotated[int | None, host_option("workers")] = None,
    prefetch: Annotated[int | None, host_option("prefetch")] = None,
    numa_bound: Annotated[bool | None, host_option("numa_bound")] = None,
    format: Annotated[str, Opt("--format", help="table | json.")] = "table",
    flags: dict[str, Any] | None = None,
) -> None:
    """The smallest number of GPUs of a type (or nodes of a preset) that fits MODEL's run, the
    host RAM and NVMe each node needs with its RAM:GPU-memory ratio beside the rules of thumb,
    and with --tokens-per-second or --tokens/--hours the cluster a deadline needs."""
    if format not in ("table", "json"):
        fail(f"--format {format!r} is not one of table, json.")
    _check_jobs(jobs)
    flags = dict(flags or {})

    def run() -> Any:
        from .errors import ConfigError
        from .hardware import get_device
        from .hardware.nodes import get_node
        from .model import load_model
        from .plan.parallel import usable_cores
        from .plan.size import size

        problems = []
        if (tokens is None) != (hours is None):
            problems.append("--tokens and --hours go together (the target is tokens / hours).")
        if tokens_per_second is not None and tokens is not None:
            problems.append("give --tokens-per-second or --tokens/--hours, not both.")
        if hours is not None and hours <= 0 or tokens is not None and tokens <= 0:
            problems.append("--tokens and --hours must be positive.")
        if "gpus" in flags:
            problems.append("size chooses the number of GPUs: drop --gpus (or use `memplan "
                            "plan` for a given cluster).")
        preset = get_node(node) if node else None
        name = get_device(gpu or (preset.gpu if preset else "H100-80GB")).name
        if preset is not None and name != preset.gpu:
            problems.append(f"--gpu {gpu} contradicts --node {preset.name}, whose GPUs are "
                            f"{preset.gpu}. Drop --gpu.")
        if problems:
            raise ConfigError(problems)
        per_node = flags.pop("gpus_per_node", None) or (preset.gpus if preset else 8)
        (job, setup), fixed = _base(flags, recipe,
                                    dict(load=load, workers=workers, prefetch=prefetch,
                                         numa_bound=numa_bound),
                                    engine_file=from_file, model=model)
        if "gpus" in fixed - set(flags):
            fixed -= {"gpus"}  # an engine file's world size is what size chooses
        target = tokens_per_second if tokens is None else tokens / (hours * 3600)  # type: ignore[operator]
        spec = load_model(model)
        bar = _Bar(f"sizing {spec.id}")
        try:
            return size(spec, job, gpu=name, gpus_per_node=per_node, node=node,
                        host_ram=host_ram, nvme=nvme, fixed=fixed, global_batch=global_batch,
                        setup=setup, target_tokens_per_second=target, max_gpus=max_gpus,
                        progress=bar, workers=jobs or usable_cores())
        finally:
            bar.close()

    res = guard(run)
    if format == "json":
        sys.stdout.write(json.dumps(res.to_dict(), indent=2, default=str) + "\n")
        return
    from rich.console import Console

    from .report.plan import render_size

    Console(width=None if sys.stdout.isatty() else 230).print(render_size(res))


def register(app: typer.Typer) -> None:
    """Add ``plan`` and ``size`` to the ``memplan`` app."""
    app.command("plan")(recipe_options(plan_command))
    app.command("size")(recipe_options(size_command))
