"""memplan's layers, enforced: every import between memplan's packages (function-local and
``TYPE_CHECKING`` ones included, read with ``ast``) must point down the declared order
(STYLE.md §3.2, "Dependency rule"). An arrow up or sideways fails, unless it is in
``ALLOWED``, which records today's known exceptions with the change that removes each; an
allowance that is no longer used fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "memplan"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "units"),
    ("results",),
    ("model", "hardware", "catalog"),
    ("recipe",),
    ("facts",),
    ("breakdown",),
    # the torch side's shared part: tracker, labels, workload builder, fake tensors
    ("runtime",),
    # the analytic models and the torch side's users, side by side; none imports another
    ("estimate", "host", "timing", "trace", "measure"),
    ("system", "custom_hardware", "generic"),  # generic: traced step of unknown families
    ("calibrate",),  # memplan calibrate's micro-benchmarks (torch), over timing's Calibration
    ("plan",),  # memplan plan / size: the search over recipes, on the estimator (issue #13)
    ("report", "export"),  # export: recipe -> engine configs and back
    ("validate",),  # validate --nproc configures its runs from export's files (issue #14 item 4)
    ("api", "cli_options"),
    ("web", "cli_calibrate", "cli_export", "cli_validate_dist", "cli_plan", "cli_measure", "cli_trace"),  # memplan serve: the page over api and report (issue #16)
    ("cli", "__init__"),
    ("__main__",),
)
"""Lowest first. A package may import its own modules and any package of a lower layer."""

ALLOWED: dict[tuple[str, str], str] = {
    ("trace", "estimate"): "trace/__init__.py adds the estimator's CUDA-context line "
                           "(estimate.overhead.overhead_items); move the constant to facts",
    ("measure", "report"): "measure/aggregate.py draws its PNG with report.plot (function-local, "
                           "also for session() without the CLI): move plotting to the CLI side",
}
"""(from, to) -> why it is still there and what removes it."""

NO_TORCH_AT_IMPORT = ("errors", "units", "results", "facts", "model", "hardware", "recipe",
                      "breakdown", "estimate", "host", "timing", "system", "report", "api",
                      "cli_options", "cli", "web", "custom_hardware", "cli_calibrate",
                      "export", "cli_export", "plan", "cli_plan", "cli_validate_dist", "cli_measure", "cli_trace")
"""Packages that must not import torch at module level (``memplan estimate`` starts fast)."""

MAX_LINES = 420
TOO_LONG_ALLOWED: dict[str, str] = {}


def _unit(path: Path) -> tuple[str, list[str]]:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    pkg = parts[:-1]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return (parts[1] if len(parts) > 1 else "__init__"), pkg


def _imports(path: Path) -> set[str]:
    """memplan packages that ``path`` imports anywhere in its body."""
    unit, pkg = _unit(path)
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = pkg[:len(pkg) - node.level + 1] if node.level else []
            mod = base + (node.module.split(".") if node.module else [])
            targets = [mod + [a.name] for a in node.names] if not node.module else [mod]
        elif isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names]
        else:
            continue
        out.update(t[1] for t in targets if t[0] == "memplan" and len(t) > 1 and t[1] != unit)
    return out


def _layer_of(unit: str) -> int:
    for i, names in enumerate(LAYERS):
        if unit in names:
            return i
    raise AssertionError(f"memplan.{unit} has no layer: add it to LAYERS in {__file__}")


def _edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        unit, _ = _unit(path)
        for target in _imports(path):
            edges.setdefault((unit, target), []).append(str(path.relative_to(SRC)))
    return edges


def test_every_arrow_points_down():
    bad = []
    for (src, dst), files in sorted(_edges().items()):
        if _layer_of(dst) >= _layer_of(src) and (src, dst) not in ALLOWED:
            way = "sideways" if _layer_of(dst) == _layer_of(src) else "up"
            bad.append(f"memplan.{src} -> memplan.{dst} goes {way} ({', '.join(files)})")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


NEVER: dict[tuple[str, str], str] = {
    (a, "runtime"): "the analytic side never uses the torch side" for a in ("estimate", "host",
                                                                             "timing")}
"""Downward arrows that are still wrong: the analytic models sit beside the torch side."""


def test_the_analytic_side_never_imports_the_torch_side():
    bad = {edge: files for edge, files in _edges().items() if edge in NEVER}
    assert not bad, bad


def test_allowances_are_still_needed():
    stale = sorted(set(ALLOWED) - set(_edges()))
    assert not stale, f"remove these from ALLOWED, the arrows are gone: {stale}"


def test_the_rule_catches_an_upward_import(tmp_path, monkeypatch):
    """The checker itself: a function-local import of cli from estimate is reported."""
    pkg = tmp_path / "memplan"
    (pkg / "estimate").mkdir(parents=True)
    (pkg / "estimate" / "x.py").write_text("def f():\n    from ..cli import app\n")
    monkeypatch.setattr(__import__(__name__), "SRC", pkg)
    assert _imports(pkg / "estimate" / "x.py") == {"cli"}


def _module_level_torch(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    for node in tree.body:  # module level only; `if TYPE_CHECKING:` blocks are not run
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        if any(n == "torch" or n.startswith("torch.") for n in names):
            return True
    return False


@pytest.mark.parametrize("unit", NO_TORCH_AT_IMPORT)
def test_core_does_not_import_torch_at_module_level(unit):
    files = [p for p in SRC.rglob("*.py") if _unit(p)[0] == unit]
    assert files
    assert not [str(p) for p in files if _module_level_torch(p)]


def test_modules_stay_short():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= set(TOO_LONG_ALLOWED), f"split these modules by noun: {long}"
