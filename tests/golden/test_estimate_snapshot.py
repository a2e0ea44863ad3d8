"""The JSON of ``memplan estimate`` for 40 varied cases equals the committed snapshot exactly.

The snapshot (``tests/golden/data/estimate_snapshot.json``) was captured by
``scripts/estimate_snapshot.py`` before the recipe/result refactor of issue #10; a refactor
must leave every number, label and key unchanged. A deliberate change of output rewrites the
snapshot with that script and names the change in its commit message.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("estimate_snapshot",
                                               ROOT / "scripts/estimate_snapshot.py")
snap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snap)

EXPECTED = json.loads(snap.SNAPSHOT.read_text())


def test_snapshot_covers_the_issue_matrix():
    """>= 30 cases; five families, every precision, every ZeRO stage, each parallelism."""
    assert len(EXPECTED) >= 30 and set(EXPECTED) == set(snap.CASES)
    recipes = [c["json"]["recipe"] for c in EXPECTED.values()]
    assert {r["precision"] for r in recipes} == {"32-true", "16-mixed", "bf16-mixed", "16-true",
                                                 "bf16-true", "fp8-mixed"}
    assert {r["zero"] for r in recipes} == {0, 1, 2, 3}
    assert {r["method"] for r in recipes} == {"full", "lora", "qlora", "freeze"}
    for knob in ("tp", "pp", "cp", "ep", "pp_virtual"):
        assert any(r[knob] > 1 for r in recipes), knob
    assert any(r["sequence_parallel"] for r in recipes)
    assert {r["offload"] for r in recipes} == {"none", "optimizer", "params+optimizer", "nvme"}
    assert sum("time" in c["json"] and "host" in c["json"] for c in EXPECTED.values()) >= 30


@pytest.mark.parametrize("name", sorted(snap.CASES))
def test_estimate_json_unchanged(name):
    assert snap.CASES[name] == EXPECTED[name]["args"], "case arguments changed: re-capture"
    got = snap.run_case(snap.CASES[name])
    want = EXPECTED[name]["json"]
    for key in sorted(set(got) | set(want)):
        assert got.get(key) == want.get(key), f"{name}: '{key}' differs from the snapshot"
