"""``validate --nproc N``: per-rank validation on real distributed runs (issue #11 item 5).

Each case of ``dist_cases.toml`` (the tiny Llama with an engine recipe: FSDP2 or DeepSpeed) is
exported with memplan's own writer (``memplan.export``: ``--to accelerate`` for FSDP2,
``--to deepspeed`` for DeepSpeed), and ``torchrun --nproc-per-node N`` on the gloo backend on CPU
runs every case from that file (``memplan.validate.dist_worker``, all cases in one launch). Every
rank writes its live tensor bytes per step, phase and moment, storages de-duplicated. Each rank's
peak and per-phase peaks (the most over the first and the steady step) are compared with
memplan's estimate for the same recipe (``gpus`` = N, ``engine`` set), per rank.

Bound: ``BOUNDS["estimate"]`` (5% of the measured peak, per rank). Needs torch (and deepspeed
for the DeepSpeed cases); this module itself imports neither.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..breakdown import Breakdown, Phase, Step
from ..errors import ConfigError
from ..recipe import Recipe
from . import BOUNDS, _host_bytes, _tiny

__all__ = ["DistCase", "DistCaseResult", "DistReport", "RankResult", "dist_cases",
           "validate_distributed"]

EXPORT_TARGET = {"fsdp2": "accelerate", "fsdp1": "accelerate", "deepspeed": "deepspeed"}
"""Engine -> the ``memplan export`` target whose file configures the run."""
TIMEOUT_S = 900
"""Longest a torchrun launch may take before it is stopped."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DistCase:
    """One row of ``dist_cases.toml``, with ``gpus`` set to the number of ranks."""

    name: str
    """Short description, unique."""
    model: str
    """Path of the tiny config.json."""
    recipe: Recipe
    """The recipe (``gpus`` = ranks, ``engine`` named)."""
    quick: bool
    """Part of ``--quick``."""

    @property
    def target(self) -> str:
        """The export target that configures the run."""
        return EXPORT_TARGET[str(self.recipe.engine_kind)]


@dataclass(frozen=True, kw_only=True, slots=True)
class RankResult:
    """One rank of one case: measured and estimated peaks."""

    rank: int
    """The rank."""
    measured: Breakdown
    """Its measured steps (first and steady)."""
    estimated: Breakdown
    """memplan's estimate for the recipe (the worst rank role)."""
    adjust: int = 0
    """Bytes added to every estimated peak to compare like with like (offload cases: see
    ``_offload_adjust``)."""

    @staticmethod
    def _phases(b: Breakdown, adjust: int = 0) -> dict[str, int]:
        w, out = b.worst, {}
        for step in (Step.FIRST, Step.STEADY):
            for p, v in w.phase_peaks(step).items():
                out[str(p)] = max(out.get(str(p), 0), v + adjust)
        return out

    @property
    def estimated_peak(self) -> int:
        return self.estimated.worst.peak_allocated_bytes + self.adjust

    @property
    def error_pct(self) -> float:
        m = self.measured.worst.peak_allocated_bytes
        return (self.estimated_peak - m) / m * 100

    def to_dict(self) -> dict[str, Any]:
        mp, ep = self._phases(self.measured), self._phases(self.estimated, self.adjust)
        return {
            "rank": self.rank,
            "measured_peak_allocated_bytes": self.measured.worst.peak_allocated_bytes,
            "estimated_peak_allocated_bytes": self.estimated_peak,
            "estimate_adjusted_by_bytes": self.adjust,
            "estimate_error_pct": round(self.error_pct, 3),
            "measured_peak_moment": self.measured.worst.peak_moment.label,
            "measured_phase_peaks": mp,
            "estimated_phase_peaks": ep,
            "phase_error_pct": {p: round((ep[p] - v) / v * 100, 3) for p, v in mp.items()
                                if p in ep and v},
            "measured_categories_at_peak": {str(c): v for c, v in
                                            self.measured.worst.categories_at_peak().items() if v},
            "estimated_categories_at_peak": {str(c): v for c, v in
                                             self.estimated.worst.categories_at_peak().items()
                                             if v},
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class DistCaseResult:
    """Every rank of one case, or the error that stopped it."""

    case: DistCase
    """The case."""
    ranks: tuple[RankResult, ...] = ()
    """In rank order."""
    config_text: str = ""
    """The exported file the run was configured from."""
    overrides: tuple[str, ...] = ()
    """What the harness changed in that file to run on this machine."""
    seconds: float = 0.0
    """Wall time of the case on rank 0 (build, wrap, two steps)."""
    error: str = ""
    """Why the case did not complete ('' when it did)."""

    @property
    def max_abs_error_pct(self) -> float | None:
        return max((abs(r.error_pct) for r in self.ranks), default=None)

    @property
    def ok(self) -> bool:
        e = self.max_abs_error_pct
        return not self.error and e is not None and e <= BOUNDS["estimate"]

    def to_dict(self) -> dict[str, Any]:
        r = self.case.recipe.to_dict()
        return {
            "name": self.case.name, "engine": str(self.case.recipe.engine_kind),
            "nproc": self.case.recipe.parallelism.gpus, "configured_from": self.case.target,
            "recipe": {k: r[k] for k in ("engine", "zero", "gpus", "method", "precision",
                                         "optimizer", "checkpointing", "offload", "micro_batch",
                                         "seq_len", "fsdp1_wrap", "use_orig_params")},
            "config": self.config_text, "overrides": list(self.overrides),
            "ranks": [x.to_dict() for x in self.ranks],
            "max_abs_error_pct": self.max_abs_error_pct, "ok": self.ok,
            "seconds": round(self.seconds, 3), "error": self.error}


@dataclass(frozen=True, kw_only=True, slots=True)
class DistReport:
    """Every case of one ``validate --nproc N`` run."""

    nproc: int
    """Ranks per case."""
    quick: bool
    """Only the quick cases."""
    results: tuple[DistCaseResult, ...]
    """In table order."""
    seconds: float
    """Wall time of the launch, estimates included."""
    versions: dict[str, str] = field(default_factory=dict)
    """torch, deepspeed, python."""

    @property
    def passed(self) -> bool:
        return all(r.ok for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        errs = [e for r in self.results if (e := r.max_abs_error_pct) is not None]
        return {"device": "cpu", "backend": "gloo", "nproc": self.nproc, "quick": self.quick,
                "bounds_pct": {"estimate_per_rank": BOUNDS["estimate"]},
                "cases": [r.to_dict() for r in self.results],
                "max_abs_error_pct": max(errs, default=None), "passed": self.passed,
                "seconds": round(self.seconds, 2), "versions": self.versions}


def dist_cases(*, nproc: int, quick: bool = False,
               table: str | Path | None = None) -> list[DistCase]:
    """The cases of ``table`` (default: the shipped ``dist_cases.toml``) on ``nproc`` ranks."""
    if nproc < 2:
        raise ConfigError([f"--nproc {nproc}: a distributed validation needs at least 2 ranks; "
                           "use plain `memplan validate` for one process."])
    where = str(table) if table is not None else "dist_cases.toml"
    try:
        text = (Path(table).read_text() if table is not None
                else resources.files(__package__).joinpath("dist_cases.toml").read_text())
        rows = tomllib.loads(text).get("case")
    except OSError as e:
        raise ConfigError([f"cannot read the case table {where}: {e.strerror}."]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{where}: malformed TOML: {e}."]) from None
    if not isinstance(rows, list) or not rows:
        raise ConfigError([f"{where}: no [[case]] tables (see the shipped dist_cases.toml)."])
    out = []
    for row in rows:
        row = dict(row)
        name, model, is_quick = row.pop("name"), row.pop("model"), row.pop("quick", False)
        if quick and not is_quick:
            continue
        try:
            # offload needs a GPU to offload from: such a recipe is estimated for cuda and
            # compared on what the CPU run holds (``_estimate``)
            device = "cpu" if row.get("offload", "none") == "none" else "cuda"
            recipe = Recipe.from_dict({**row, "gpus": nproc, "device": device},
                                      where=f"case {name!r}")
        except ConfigError as e:
            raise ConfigError([f"{where}: {p}" for p in e.problems]) from None
        if str(recipe.engine_kind) not in EXPORT_TARGET:
            raise ConfigError([f"{where}: case {name!r}: engine={recipe.engine_kind} has no "
                               f"distributed harness; use one of {', '.join(EXPORT_TARGET)}."])
        out.append(DistCase(name=name, model=_tiny(model), recipe=recipe, quick=is_quick))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(cases: list[DistCase], nproc: int, work: Path) -> str:
    """Export each case's config into ``work`` and run them all in one torchrun launch; returns
    the launch's output tail ('' when it succeeded)."""
    from ..export import export

    plan = []
    for i, c in enumerate(cases):
        cfg = work / f"case{i}{'.json' if c.target == 'deepspeed' else '.yaml'}"
        cfg.write_text(export(c.recipe, c.target).text)
        plan.append({"name": c.name, "model": c.model, "recipe": c.recipe.to_dict(),
                     "config": str(cfg), "out": str(work / f"case{i}")})
    (work / "plan.json").write_text(json.dumps(plan, indent=1))
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           f"--master-port={_free_port()}", "-m", "memplan.validate.dist_worker",
           "--plan", str(work / "plan.json")]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                           check=False)
    except subprocess.TimeoutExpired:
        return f"torchrun did not finish within {TIMEOUT_S} s"
    return "" if p.returncode == 0 else (p.stdout + p.stderr)[-2000:]


def _collect(case: DistCase, i: int, nproc: int, work: Path, failure: str) -> DistCaseResult:
    from ..hardware import cpu_device
    from ..results import ModelInfo
    from ..runtime.steps import step_from_record, to_breakdown
    from ..units import GIB

    config_text = (work / f"case{i}{'.json' if case.target == 'deepspeed' else '.yaml'}")
    config = config_text.read_text() if config_text.exists() else ""
    records = []
    for r in range(nproc):
        f = work / f"case{i}.rank{r}.json"
        if not f.exists():
            return DistCaseResult(case=case, config_text=config,
                                  error=f"rank {r} wrote no result. {failure}".strip())
        records.append(json.loads(f.read_text()))
    errors = [f"rank {d['rank']}: {d['error']}" for d in records if "error" in d]
    if errors:
        return DistCaseResult(case=case, config_text=config, error="; ".join(errors))
    device = cpu_device(_host_bytes() or 16 * GIB)
    est, adjust = _estimate(case, device)
    info = ModelInfo(id=Path(case.model).stem, params=0, trainable_params=0, layers=0,
                     source=case.model)
    ranks = []
    for d in records:
        steps = [step_from_record(s) for s in d["steps"]]
        measured = to_breakdown(steps, source="measure", how=f"{d['engine']} rank {d['rank']}",
                                model=info, recipe=case.recipe.to_dict(),
                                device=device.info(), role=f"rank {d['rank']}")
        ranks.append(RankResult(rank=int(d["rank"]), measured=measured, estimated=est,
                                adjust=adjust))
    return DistCaseResult(case=case, ranks=tuple(ranks), config_text=config,
                          overrides=tuple(records[0]["overrides"]),
                          seconds=float(records[0]["seconds"]))


def _estimate(case: DistCase, device: Any) -> tuple[Breakdown, int]:
    """memplan's per-rank estimate, and the bytes to add to it so that it counts what the CPU
    run counts.

    Offload cases: a recipe with ``device=cpu`` has no offload (nothing to offload to), so the
    estimate is made for ``device=cuda``, where the offloaded states are outside the GPU
    (``Pool.HOST``) and the GPU peak carries CUDA-only allocations (cuBLAS workspaces,
    category ``overhead`` at the peak). On the CPU run both sides of the offload are tensors of
    the same process, so the comparison adds the host bytes and removes the CUDA-only ones.
    """
    from ..breakdown import Category, Pool
    from ..estimate import estimate
    from ..model import load_model

    model = load_model(case.model)
    if str(case.recipe.offload.kind) == "none":
        return estimate(model, case.recipe, device), 0
    est = estimate(model, case.recipe.with_keys(device="cuda"), device)
    w = est.worst
    return est, w.outside_bytes(Pool.HOST) - w.peak_moment.categories().get(Category.OVERHEAD, 0)


def _versions() -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    v = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "deepspeed"):
        try:
            v[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return v


def validate_distributed(*, nproc: int = 2, quick: bool = False,
                         table: str | Path | None = None, names: tuple[str, ...] = (),
                         on_case: Callable[[DistCaseResult], None] | None = None) -> DistReport:
    """Run the distributed cases (``names``: only those) on ``nproc`` ranks and compare."""
    cases = dist_cases(nproc=nproc, quick=quick, table=table)
    if names:
        unknown = sorted(set(names) - {c.name for c in cases})
        if unknown:
            raise ConfigError([f"no distributed case named {n!r}; the cases are: "
                               f"{', '.join(c.name for c in cases)}." for n in unknown])
        cases = [c for c in cases if c.name in names]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memplan-dist-") as tmp:
        work = Path(tmp)
        failure = _launch(cases, nproc, work)
        results = []
        for i, c in enumerate(cases):
            r = _collect(c, i, nproc, work, failure)
            results.append(r)
            if on_case is not None:
                on_case(r)
    return DistReport(nproc=nproc, quick=quick, results=tuple(results),
                      seconds=time.perf_counter() - t0, versions=_versions())
