"""``validate``: memplan's built-in accuracy suite (torch, transformers and PEFT required).

Each case of ``cases.toml`` (a real architecture at a tiny size, ``tiny/*.json``, with a recipe)
names its ``harness``. A ``memplan`` case is run three ways and the peaks of allocated bytes
are compared:

- **measured**: two real training steps (``memplan.measure.real.measure_recipe``): exact live
  tensor bytes on CPU; on CUDA, ``torch.cuda.max_memory_allocated``;
- **traced**: the same code under ``FakeTensorMode`` (``memplan.trace.trace``);
- **estimated**: the analytical ``memplan.estimate.estimate`` on the model's config.

A framework case (``trainer``, ``peft``, ``accelerate``, ``plain``: ``harnesses.py``;
``torchtune``: ``torchtune_harness.py``) is run
the way its users run it and measured with PyTorch's own ``MemTracker``, a counter memplan's
estimator and tracer do not share; it has no trace. A case whose framework default differs
from a memplan assumption the estimator does not follow says why (``differs``) and is reported
outside the bound and the aggregates.

Bounds (``BOUNDS``): the trace must be within 1% of the measurement, the estimate within 5%.
The report lists every case, its errors per category, and the aggregate errors.
"""

from __future__ import annotations

import platform
import statistics
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..breakdown import Breakdown
from ..errors import ConfigError, did_you_mean
from ..recipe import Recipe
from .harnesses import HARNESSES

__all__ = ["BOUNDS", "Case", "CaseResult", "ValidationReport", "cases", "measured_peak", "run_case",
           "validate"]

BOUNDS = {"trace": 1.0, "estimate": 5.0}
"""Largest allowed |error| of the peak allocated bytes, in % of the measured peak (issue #4)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One row of ``cases.toml``."""

    name: str
    """Short description, unique."""
    model: str
    """Path of the tiny config.json."""
    recipe: Recipe
    """The recipe (``device`` set by the run)."""
    quick: bool
    """Part of ``--quick``."""
    harness: str = "memplan"
    """Who runs and measures it: ``memplan`` (memplan's measure and trace) or a framework
    harness of ``harnesses.HARNESSES`` (run with the framework's defaults, measured by
    PyTorch's MemTracker; no trace)."""
    base_dtype: str = ""
    """Framework harnesses: cast the model to ``bf16``/``fp16`` before training, as a user who
    loads a 16-bit checkpoint does ('' keeps fp32)."""
    differs: str = ""
    """Where the framework's default differs from memplan's assumption and the estimator does
    not follow it: why. The case is reported, but kept out of the bound and the aggregates."""
    no_trace: str = ""
    """Why the case cannot be traced under fake tensors ('' when it can): MoE routing has
    data-dependent shapes. Measured and estimated only."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseResult:
    """The three peaks of one case, or the error that stopped it."""

    case: Case
    """The case."""
    measured: Breakdown | None = None
    """Real run."""
    traced: Breakdown | None = None
    """Fake-tensor trace."""
    estimated: Breakdown | None = None
    """Analytical estimate."""
    seconds: float = 0.0
    """Wall time of the three."""
    error: str = ""
    """Why the case did not complete ('' when it did)."""
    harness_peak: int | None = None
    """Framework harnesses: MemTracker's peak of live tensor bytes (``measured`` is None)."""

    @property
    def measured_bytes(self) -> int | None:
        if self.harness_peak is not None:
            return self.harness_peak
        return None if self.measured is None else measured_peak(self.measured)

    def error_pct(self, which: str) -> float | None:
        """(``which``'s peak - measured peak) / measured peak x 100; ``which``: trace|estimate."""
        other = self.traced if which == "trace" else self.estimated
        m = self.measured_bytes
        if m is None or other is None:
            return None
        return (other.worst.peak_allocated_bytes - m) / m * 100

    @property
    def ok(self) -> bool:
        if self.error:
            return False
        if self.case.differs:
            return True
        return all(abs(self.error_pct(w) or 0.0) <= b for w, b in BOUNDS.items())

    def _cuda_counters(self) -> dict[str, int | None]:
        """On CUDA, the allocator's reserved peak and the GPU memory in use after the steps
        beside the estimate's ``peak_reserved_bytes`` and ``device_total_bytes`` (what the
        published rows' reserved and nvidia-smi counters compare with); None elsewhere. Not
        bounded: reported so that a GPU run measures the estimate's slack and overheads."""
        alloc = self.measured.device.allocator if self.measured is not None else None
        est = self.estimated.worst if self.estimated is not None else None
        return {"measured_max_memory_reserved_bytes": alloc.max_memory_reserved if alloc else None,
                "estimated_peak_reserved_bytes": est.peak_reserved_bytes if alloc and est else None,
                "measured_device_used_bytes": alloc.device_used if alloc else None,
                "estimated_device_total_bytes": est.device_total_bytes if alloc and est else None}

    def to_dict(self) -> dict[str, Any]:
        def peak(b: Breakdown | None) -> int | None:
            return None if b is None else b.worst.peak_allocated_bytes

        cats: dict[str, dict[str, int]] = {}
        for label, b in (("measured", self.measured), ("traced", self.traced),
                         ("estimated", self.estimated)):
            if b is not None:
                for c, v in b.worst.categories_at_peak().items():
                    cats.setdefault(str(c), {})[label] = v
        r = self.case.recipe
        return {
            "name": self.case.name,
            "harness": self.case.harness,
            "differs_from_framework": self.case.differs,
            "no_trace": self.case.no_trace,
            "model": (Path(self.case.model).stem if self.case.model.endswith(".json")
                      else self.case.model),
            "recipe": _recipe_keys(r),
            "measured_peak_allocated_bytes": self.measured_bytes,
            "traced_peak_allocated_bytes": peak(self.traced),
            "estimated_peak_allocated_bytes": peak(self.estimated),
            "trace_error_pct": self.error_pct("trace"),
            "estimate_error_pct": self.error_pct("estimate"),
            "measured_peak_moment": (self.measured.worst.peak_moment.label
                                     if self.measured else None),
            "categories_at_peak": cats,
            **self._cuda_counters(),
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
            "error": self.error,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationReport:
    """Every case of one ``validate`` run."""

    device: str
    """``cpu`` or ``cuda``."""
    quick: bool
    """Only the quick cases."""
    results: tuple[CaseResult, ...]
    """In table order."""
    seconds: float
    """Wall time of the run."""
    versions: dict[str, str] = field(default_factory=dict)
    """torch, transformers, peft, python (and the GPU and CUDA on ``cuda``)."""

    def _abs(self, which: str) -> list[float]:
        return [abs(e) for r in self.results
                if not r.case.differs and (e := r.error_pct(which)) is not None]

    def max_abs_error_pct(self, which: str = "estimate") -> float | None:
        vals = self._abs(which)
        return max(vals) if vals else None

    def median_abs_error_pct(self, which: str = "estimate") -> float | None:
        vals = self._abs(which)
        return statistics.median(vals) if vals else None

    @property
    def passed(self) -> bool:
        return all(r.ok for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "quick": self.quick,
            "bounds_pct": dict(BOUNDS),
            "cases": [r.to_dict() for r in self.results],
            "max_abs_error_pct": self.max_abs_error_pct("estimate"),
            "median_abs_error_pct": self.median_abs_error_pct("estimate"),
            "trace_max_abs_error_pct": self.max_abs_error_pct("trace"),
            "trace_median_abs_error_pct": self.median_abs_error_pct("trace"),
            "passed": self.passed,
            "seconds": round(self.seconds, 2),
            "versions": self.versions,
        }


def measured_peak(b: Breakdown) -> int:
    """The measured peak allocated bytes: the CUDA allocator's ``max_memory_allocated`` when the
    run recorded it (``DeviceInfo.allocator``), else the live-tensor peak."""
    alloc = b.device.allocator
    return alloc.max_memory_allocated if alloc is not None else b.worst.peak_allocated_bytes


def _tiny(name: str) -> str:
    return str(resources.files(__package__).joinpath("tiny", f"{name}.json"))


def _tiny_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__package__).joinpath("tiny").iterdir()
                  if p.name.endswith(".json"))


def _case_model(model: str, where: str, name: str) -> str:
    """The model a case runs: a tiny architecture of ``tiny/`` by its name (the shipped
    matrix), else a catalog id (``memplan models``) or a config.json file or folder, for a case
    table of real sizes (such as ``validation/gpu_cases.toml``). Never the Hub: validate runs
    offline."""
    from ..model.catalog import catalog, find

    if model in _tiny_names():
        return _tiny(model)
    path = Path(model).expanduser()
    if find(model) is not None or path.is_file() or (path / "config.json").is_file():
        return model
    ids = [e.id for e in catalog().values()]
    raise ConfigError([f"{where}: case {name!r}: model={model!r} is not a tiny architecture "
                       f"({', '.join(_tiny_names())}), a catalog id or a config.json path."
                       f"{did_you_mean(model, _tiny_names() + ids)} "
                       "List the catalog with `memplan models`."])


def cases(*, quick: bool = False, device: str = "cpu",
          table: str | Path | None = None) -> list[Case]:
    """The cases of ``table`` (default: the shipped ``cases.toml``)."""
    where = str(table) if table is not None else "cases.toml"
    try:
        text = (Path(table).read_text() if table is not None
                else resources.files(__package__).joinpath("cases.toml").read_text())
        rows = tomllib.loads(text).get("case")
    except OSError as e:
        raise ConfigError([f"cannot read the case table {where}: {e.strerror}."]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{where}: malformed TOML: {e}."]) from None
    if not isinstance(rows, list) or not rows:
        raise ConfigError([f"{where}: no [[case]] tables. Each case is a [[case]] table with "
                           "name, model and recipe fields (see the shipped cases.toml)."])
    out = []
    for row in rows:
        row = dict(row)
        name, model, is_quick = row.pop("name"), row.pop("model"), row.pop("quick", False)
        harness, base_dtype = row.pop("harness", "memplan"), row.pop("base_dtype", "")
        differs, no_trace = row.pop("differs", ""), row.pop("no_trace", "")
        if harness not in HARNESSES:
            raise ConfigError([f"{where}: case {name!r}: harness={harness!r} is not one of "
                               f"{', '.join(HARNESSES)}."])
        if (quick and not is_quick) or (harness != "memplan" and device != "cpu"):
            continue  # framework harnesses measure with MemTracker on CPU only
        try:
            recipe = Recipe.from_dict({**row, "device": device}, where=f"case {name!r}")
        except ConfigError as e:
            raise ConfigError([f"cases.toml: {p}" for p in e.problems]) from None
        out.append(Case(name=name, model=_case_model(model, where, name), recipe=recipe, quick=is_quick,
                        harness=harness, base_dtype=base_dtype, differs=differs,
                        no_trace=no_trace))
    return out


def _recipe_keys(r: Recipe) -> dict[str, Any]:
    """The case's recipe: the main keys, and every other key that is not at its default (so
    a loop or engine setting of the case is not lost from the JSON)."""
    main = ("precision", "optimizer", "method", "checkpointing", "attention", "micro_batch",
            "seq_len", "device")
    d, default = r.to_dict(), Recipe().to_dict()
    return {k: v for k, v in d.items() if k in main or (v != default.get(k) and k != "notes")}


def _versions(device: str) -> dict[str, str]:
    import torch
    import transformers

    v = {"torch": torch.__version__, "transformers": transformers.__version__,
         "python": platform.python_version(), "machine": platform.machine()}
    try:
        import peft

        v["peft"] = peft.__version__
    except ImportError:
        pass
    if device == "cuda" and torch.cuda.is_available():
        v["cuda"] = str(torch.version.cuda)
        v["gpu"] = torch.cuda.get_device_name(0)
    return v


def run_case(case: Case, device: Any) -> CaseResult:
    """Measure, trace and estimate one case (a failure is recorded, not raised)."""
    from ..estimate import estimate
    from ..measure.real import measure_recipe
    from ..model import load_model
    from ..trace import trace

    t0 = time.perf_counter()
    if case.harness != "memplan":
        return _run_framework_case(case, device, t0)
    try:
        measured = measure_recipe(case.model, case.recipe, device)
        traced = None if case.no_trace else trace(case.model, case.recipe, device)
        estimated = _estimate(case, device)
    except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
        return CaseResult(case=case, seconds=time.perf_counter() - t0,
                          error=f"{type(e).__name__}: {e}")
    return CaseResult(case=case, measured=measured, traced=traced, estimated=estimated,
                      seconds=time.perf_counter() - t0)


def _estimate(case: Case, device: Any) -> Breakdown:
    """The analytic estimate, or the generic path (``memplan.generic``) for a family memplan
    has no builder for, as ``memplan estimate`` does."""
    from ..errors import UnsupportedModel
    from ..estimate import estimate
    from ..model import load_model
    from ..model.resolve import find_config

    try:
        spec = load_model(case.model)
    except UnsupportedModel:
        from ..generic import generic_estimate

        found = find_config(case.model)
        if found is None:
            raise
        return generic_estimate(case.model, str(found[0].get("model_type")), case.recipe,
                                device)
    return estimate(spec, case.recipe, device)


def _run_framework_case(case: Case, device: Any, t0: float) -> CaseResult:
    """A framework harness measures (MemTracker); the estimate is the same as for memplan's."""
    from ..estimate import estimate
    from ..model import load_model
    from .harnesses import measure_with_harness

    try:
        peak = measure_with_harness(case.harness, case.model, case.recipe,
                                    base_dtype=case.base_dtype)
        estimated = _estimate(case, device)
    except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
        return CaseResult(case=case, seconds=time.perf_counter() - t0,
                          error=f"{type(e).__name__}: {e}")
    return CaseResult(case=case, harness_peak=peak, estimated=estimated,
                      seconds=time.perf_counter() - t0)


def validate(*, device: str = "cpu", quick: bool = False, table: str | Path | None = None,
             on_case: Callable[[CaseResult], None] | None = None) -> ValidationReport:
    """Run the matrix (``quick``: its quick subset) on ``device``; ``on_case`` is called after
    each case (progress)."""
    from ..hardware import cpu_device

    if device not in ("cpu", "cuda"):
        raise ConfigError([f"device={device!r} is not one of cpu, cuda."])
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(["device=cuda: no CUDA GPU is visible to torch "
                               f"({torch.__version__}). Use --device cpu."])
        props = torch.cuda.get_device_properties(0)
        from ..hardware import Device

        dev = Device(name=props.name, vendor="nvidia", arch="", memory_gb=props.total_memory / 1e9,
                     source="torch.cuda.get_device_properties(0)")
    else:
        from ..units import GIB

        dev = cpu_device(_host_bytes() or 16 * GIB)
    t0 = time.perf_counter()
    results = []
    for case in cases(quick=quick, device=device, table=table):
        r = run_case(case, dev)
        results.append(r)
        if on_case is not None:
            on_case(r)
    return ValidationReport(device=device, quick=quick, results=tuple(results),
                            seconds=time.perf_counter() - t0, versions=_versions(device))


def _host_bytes() -> int:
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0

