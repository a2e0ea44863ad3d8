"""The torch side is cut in one place: ``runtime`` is shared, ``trace`` and ``measure`` use it and
never import each other, no private name crosses a package, no class extends another package's
class; and the measure report is a typed object that round-trips through JSON."""

import ast
import json
from pathlib import Path

import pytest

from memplan.breakdown import Breakdown, Category, Item, Moment, Phase, RankBreakdown, Step
from memplan.measure.report import Counters, MeasureReport
from memplan.results import AllocatorCounters, DeviceInfo, ModelInfo

SRC = Path(__file__).resolve().parents[1] / "src" / "memplan"
PACKAGES = ("runtime", "trace", "measure")


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) of every import in ``path``, function-local included."""
    pkg = ["memplan", *path.relative_to(SRC).parent.parts]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.append((mod, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def _modules(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


@pytest.mark.parametrize(("package", "forbidden"), [
    ("trace", ("memplan.measure",)),
    ("measure", ("memplan.trace",)),
    ("runtime", ("memplan.measure", "memplan.trace")),
])
def test_trace_and_measure_never_import_each_other(package, forbidden):
    bad = [(p.name, mod) for p in _modules(package) for mod, _ in _imports(p)
           if mod.startswith(forbidden)]
    assert bad == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_name_crosses_a_package(package):
    bad = []
    for p in _modules(package):
        for mod, names in _imports(p):
            other = mod.startswith("memplan.") and not mod.startswith(f"memplan.{package}")
            private = [n for n in names if n.startswith("_")]
            if other and private or any(part.startswith("_") and part != "__future__"
                                        for part in mod.split(".")[1:]) and other:
                bad.append((p.name, mod, private))
    assert bad == []


@pytest.mark.parametrize("package", ("trace", "measure"))
def test_no_class_extends_a_runtime_class(package):
    runtime_classes = {n.name for p in _modules("runtime")
                       for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)}
    bad = [(p.name, n.name) for p in _modules(package)
           for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ClassDef)
           for b in n.bases if ast.unparse(b).split(".")[-1] in runtime_classes]
    assert bad == []


def test_torch_side_modules_stay_small():
    sizes = {p.name: len(p.read_text().splitlines()) for pkg in PACKAGES for p in _modules(pkg)}
    assert max(sizes.values()) <= 400, sizes


def _report() -> MeasureReport:
    m = Moment(step=Step.FIRST, phase=Phase.BACKWARD, label="backward: model.layers.1",
               items=(Item(category=Category.PARAMS, name="model.layers.1", bytes=4096,
                           formula="measured"),
                      Item(category=Category.ACTIVATIONS, name="(model)", bytes=1000,
                           formula="measured")))
    b = Breakdown(source="measure", model=ModelInfo(id="Tiny", params=1024, trainable_params=1024,
                                                    layers=2, source="measured"), recipe={},
                  device=DeviceInfo(name="cpu", capacity_bytes=2**34, source="host memory"),
                  ranks=(RankBreakdown(role="every rank", ranks=1, moments=(m,)),))
    return MeasureReport(breakdown=b, rank=1, world_size=2,
                         counters=Counters(peak_rss_bytes=123, seconds=1.5, steps=2),
                         samples=({"t": 0.0, "rss_bytes": 120},),
                         tensors=({"t": 0.0, "params": 4096},))


def test_measure_report_round_trips_through_json():
    r = _report()
    d = json.loads(json.dumps(r.to_dict()))
    back = MeasureReport.from_dict(d)
    assert back.to_dict() == d
    assert (back.rank, back.world_size, back.counters) == (1, 2, r.counters)
    assert back.breakdown.worst.peak_allocated_bytes == 5096
    assert d["counters"] == {"peak_rss_bytes": 123, "seconds": 1.5, "steps": 2}


def test_aggregate_report_names_missing_ranks_and_round_trips():
    from memplan.measure.aggregate import aggregate

    agg = aggregate([_report()], world=3)
    d = json.loads(json.dumps(agg.to_dict()))
    assert d["ranks_missing"] == [0, 2] and set(d["counters"]) == {"rank1"}
    back = MeasureReport.from_dict(d)
    assert back.aggregate and back.ranks_missing == (0, 2) and back.peak_rss_bytes == 123
    assert back.to_dict() == d


def test_cuda_counters_keep_the_allocator_keys():
    c = Counters(peak_rss_bytes=1, seconds=0.5, steps=1, nvml_peak_used_bytes=None,
                 peak_pinned_bytes=0, allocator=AllocatorCounters(
                     max_memory_allocated=10, max_memory_reserved=20, active_bytes_peak=12))
    d = c.to_dict()
    assert d["active_bytes.all.peak"] == 12 and "nvml_peak_used_bytes" in d
    assert Counters.from_dict(d) == c
