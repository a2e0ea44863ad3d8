"""The accuracy figures of README.md and validation/ground_truth_gpu.md are the ones the tests
and ``memplan validate`` produce (scripts/accuracy_claims.py writes them between markers)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import accuracy_claims as claims  # noqa: E402

FIX = "run `PYTHONPATH=src python scripts/accuracy_claims.py` and commit the result"


@pytest.fixture(scope="module")
def figures():
    return claims.figures()


def test_committed_figures_are_what_the_tests_produce(figures):
    assert json.loads(claims.FIGURES.read_text()) == figures, FIX


def test_readme_accuracy_block_is_current(figures):
    assert claims.current(claims.README.read_text(), "readme") == claims.render_readme(figures), FIX


def test_readme_throughput_block_is_current(figures):
    assert claims.current(claims.README.read_text(), "throughput") == claims.render_throughput(
        figures), FIX


def test_ground_truth_page_is_current():
    assert claims.current(claims.GOLDEN_PAGE.read_text(), "golden") == claims.render_golden(), FIX


def test_out_of_sample_page_is_current():
    assert claims.OOS_PAGE.read_text() == claims.render_oos_page(), FIX


def test_a_changed_figure_makes_the_block_stale(figures):
    """The check can fail: one changed count gives a different block."""
    changed = json.loads(json.dumps(figures))
    changed["golden"]["all"]["pass"] += 1
    assert claims.render_readme(changed) != claims.render_readme(figures)
