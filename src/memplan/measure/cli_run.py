"""``memplan measure -- CMD``: run CMD with a measuring session started in every Python process
it spawns (``autostart.py`` via ``_boot/sitecustomize.py``) and read back the report. No torch
in this process: the child imports it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MeasureError, ModelConfigError
from .aggregate import STEM
from .autostart import ENV_INTERVAL, ENV_NO_TENSORS, ENV_OUT
from .report import MeasureReport

__all__ = ["run_measured", "read_json", "child_env"]


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise ModelConfigError(f"cannot read {path}: {e.strerror}.") from None
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg}); expected "
                               "the output of `memplan estimate/trace --format json`.") from None


def child_env(out: Path, interval_s: float, track_tensors: bool) -> dict[str, str]:
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
    return env


def run_measured(cmd: list[str], out: Path, *, interval_s: float = 0.01,
                 track_tensors: bool = True) -> tuple[int, MeasureReport]:
    """Run ``cmd`` measured; return its exit code and the (aggregate) report.

    Raises:
        ConfigError: no command was given.
        MeasureError: the command could not start, or left no report (no Python process).
    """
    if not cmd:
        raise ConfigError(["no command to measure. Usage: memplan measure [OPTIONS] -- python "
                           "train.py ARGS (torchrun works too)."])
    if interval_s <= 0:
        raise ConfigError([f"--interval {interval_s} must be > 0 seconds."])
    out.mkdir(parents=True, exist_ok=True)
    report = out / f"{STEM}.json"
    report.unlink(missing_ok=True)
    try:
        code = subprocess.call(cmd, env=child_env(out, interval_s, track_tensors))
    except OSError as e:
        raise MeasureError(f"cannot run {cmd[0]!r}: {e.strerror}.") from None
    if not report.exists():
        raise MeasureError(f"{' '.join(cmd)} exited with {code} and wrote no report to {out}/. "
                           "Only Python processes are measured; check that the command runs "
                           "Python (python, torchrun, accelerate launch).")
    return code, MeasureReport.from_dict(read_json(report))
