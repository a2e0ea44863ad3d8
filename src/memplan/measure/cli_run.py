"""``memplan measure -- CMD``: run CMD with a measuring session started in every Python process
it spawns (``autostart.py`` via ``_boot/sitecustomize.py``), watch it from outside, and write
the reports from what the processes streamed. No torch in this process: the child imports it.

The parent outlives the child: it samples the RSS of the whole process tree (and the GPUs'
memory through NVML when present) and, once the command has ended however it ended, assembles
each rank's report from its stream file (``assemble.py``), says how the run ended, and writes
every report atomically: per rank, the aggregate naming missing and failed ranks, the PNGs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MeasureError, ModelConfigError
from .aggregate import STEM, aggregate, report_paths, write_json, write_plot
from .assemble import ParentView, assemble
from .autostart import ENV_FLUSH, ENV_INTERVAL, ENV_NO_TENSORS, ENV_OUT, ENV_PARENT
from .report import MeasureReport
from .sampler import nvml_used_bytes, tree_rss_bytes
from .stream import FLUSH_S, read_stream

__all__ = ["run_measured", "read_json", "child_env", "reports_from_streams"]

_WATCH_S = 0.05  # the parent's sampling interval at the finest


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise ModelConfigError(f"cannot read {path}: {e.strerror}.") from None
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg}); expected "
                               "the output of `memplan estimate/trace --format json`.") from None


def child_env(out: Path, interval_s: float, track_tensors: bool,
              flush_s: float = FLUSH_S) -> dict[str, str]:
    """The environment of the measured command: our ``sitecustomize`` first on PYTHONPATH, and
    memplan itself importable."""
    boot = Path(__file__).with_name("_boot")
    pkg_root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    path = [str(boot), str(pkg_root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env[ENV_OUT] = str(out.resolve())
    env[ENV_INTERVAL] = str(interval_s)
    env[ENV_NO_TENSORS] = "0" if track_tensors else "1"
    env[ENV_FLUSH] = str(flush_s)
    return env


def _watch(proc: subprocess.Popen, interval_s: float) -> ParentView:
    last = peak = 0
    gpu: int | None = None
    interrupted = False
    while True:
        try:
            code = proc.poll()
            if code is not None:
                return ParentView(exit_code=code, last_rss_bytes=last or None,
                                  peak_rss_bytes=peak or None, gpu_used_peak_bytes=gpu)
            rss = tree_rss_bytes(proc.pid)
            if rss:
                last, peak = rss, max(peak, rss)
            used = nvml_used_bytes()
            if used is not None:
                gpu = max(gpu or 0, used)
            time.sleep(max(interval_s, _WATCH_S))
        except KeyboardInterrupt:
            # Ctrl-C reached the child too (same process group): let it end, then report.
            if interrupted:
                proc.kill()
            interrupted = True


def _pick(streams: list[Path]) -> dict[int, list[dict[str, Any]]]:
    """The records of each rank: per rank, the process that ran the most steps (a launcher or
    a spawned worker may have started a session too)."""
    runs = []
    for p in streams:
        recs = read_stream(p)
        start = next((r for r in recs if r.get("kind") == "start"), None)
        if start is not None:
            runs.append((start, recs))
    world = max((int(s["world_size"]) for s, _ in runs), default=1)
    best: dict[int, list[dict[str, Any]]] = {}
    for start, recs in runs:
        if int(start["world_size"]) != world:
            continue  # torchrun's own process, outside the ranks
        key = (sum(r["kind"] == "step" for r in recs), len(recs))
        rank = int(start["rank"])
        old = best.get(rank)
        if old is None or key > (sum(r["kind"] == "step" for r in old), len(old)):
            best[rank] = recs
    return best


def reports_from_streams(out: Path, parent: ParentView) -> tuple[int, list[MeasureReport]]:
    """(world size, one report per rank found) from the stream files in ``out``."""
    per_rank = _pick(sorted(out.glob(f"{STEM}.rank*.jsonl")))
    if not per_rank:
        return 1, []
    world = int(next(iter(per_rank.values()))[0]["world_size"])
    # Alone, the process is the command (or its only Python child): the parent's exit code and
    # RSS are its own. Under a launcher they are the launcher's, so a rank's ending comes from
    # its records alone.
    view = parent if world == 1 else ParentView(exit_code=None)
    return world, [assemble(recs, view) for _, recs in sorted(per_rank.items())]


def _write(out: Path, world: int, reports: list[MeasureReport]) -> MeasureReport:
    for rep in reports:
        data = rep.to_dict()
        json_path, png_path = report_paths(out, rep.rank, world)
        write_json(json_path, data)
        write_plot(data, png_path)
    if world == 1:
        return reports[0]
    agg = aggregate(reports, world)
    write_json(out / f"{STEM}.json", agg.to_dict())
    return agg


def run_measured(cmd: list[str], out: Path, *, interval_s: float = 0.01,
                 track_tensors: bool = True,
                 flush_s: float = FLUSH_S) -> tuple[int, MeasureReport]:
    """Run ``cmd`` measured; return its exit code and the (aggregate) report.

    Raises:
        ConfigError: no command was given.
        MeasureError: the command could not start, left no record (no Python process), or
            the report could not be written.
    """
    if not cmd:
        raise ConfigError(["no command to measure. Usage: memplan measure [OPTIONS] -- python "
                           "train.py ARGS (torchrun works too)."])
    if interval_s <= 0:
        raise ConfigError([f"--interval {interval_s} must be > 0 seconds."])
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{STEM}*"):  # a previous run's files would be read as this one's
        if old.suffix in (".json", ".jsonl", ".png"):
            old.unlink(missing_ok=True)
    env = {**child_env(out, interval_s, track_tensors, flush_s), ENV_PARENT: "1"}
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as e:
        raise MeasureError(f"cannot run {cmd[0]!r}: {e.strerror}.") from None
    parent = _watch(proc, interval_s)
    world, reports = reports_from_streams(out, parent)
    if not reports:
        raise MeasureError(f"{' '.join(cmd)} exited with {parent.exit_code} and wrote no report "
                           f"to {out}/. Only Python processes are measured; check that the "
                           "command runs Python (python, torchrun, accelerate launch).")
    try:
        return parent.exit_code or 0, _write(out, world, reports)
    except OSError as e:
        raise MeasureError(f"cannot write the report to {out}/: {e.strerror}. Free space there "
                           "or pass another --out.") from None
