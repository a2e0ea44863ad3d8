"""validation/underestimates.{md,json} (issue #11: the direction of every golden row) are what
``scripts/underestimates.py`` produces from the golden comparison today, and its ``grow`` rule
classifies a known sweep as the golden tests' diagnoses say."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import underestimates as under  # noqa: E402

FIX = "run `PYTHONPATH=src python scripts/underestimates.py` and commit the result"


@pytest.fixture(scope="module")
def figures():
    if not (ROOT / "tests" / "golden" / "data" / "published.csv").is_file():
        pytest.skip("golden data absent")
    return under.figures()


def test_committed_table_is_current(figures):
    assert json.loads(under.FIGURES.read_text()) == json.loads(json.dumps(figures)), FIX
    assert under.TABLE.read_text() == under.render(figures), FIX


def test_counts_add_up(figures):
    for key in ("all", "qwen", "other", "A", "B"):
        c = figures[key]
        assert c["low"] + c["inside"] + c["high"] == c["rows"]
    assert figures["qwen"]["rows"] + figures["other"]["rows"] == figures["all"]["rows"]
    assert sum(figures["low_by_term"].values()) == figures["all"]["low"]


def test_low_rows_have_a_gap_and_others_none(figures):
    for r in figures["rows"]:
        if r["error"] < 0:
            assert r["gap_gib"] > 0, r["id"]
        if r["error"] > 0:
            assert r["gap_gib"] == 0 and r["grow"] == "-", r["id"]
