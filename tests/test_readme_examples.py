"""The README's `$ memplan ...` examples show current output (``scripts/readme_examples.py``):
every number in an example's output must be in what the command prints today. CI re-runs the
quick examples (verdict lines, errors, exports, listings); the plans, sizes and full estimate
tables run under MEMPLAN_FULL=1 (about ten minutes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import readme_examples as rx  # noqa: E402

FIX = ("re-run the command and paste its output into the README "
       "(`PYTHONPATH=src python scripts/readme_examples.py` lists them all)")


def _report(results) -> str:
    return "\n".join(f"README:{ex.line}: {ex.command}\n  stale: {', '.join(stale)}"
                     for ex, stale in results if stale)


def test_quick_readme_examples_are_current():
    chosen = [ex for ex in rx.examples(rx.README.read_text()) if ex.quick]
    assert len(chosen) >= 10
    results = rx.check(chosen)
    assert all(stale is not None for _, stale in results)
    assert not any(stale for _, stale in results), f"{_report(results)}\n{FIX}"


@pytest.mark.full
def test_every_readme_example_is_current():
    results = rx.check(rx.examples(rx.README.read_text()))
    assert not any(stale for _, stale in results), f"{_report(results)}\n{FIX}"


def test_a_stale_number_is_found_and_search_seconds_are_not():
    text = "\n".join([
        "```", "$ cat lab.toml", "[x]", "$ memplan --version", "memplan 0.1.0",
        "$ memplan estimate gpt2 --quiet", "gpt2 on 1x H100-80GB: 12,345 tokens/s",
        "$ memplan plan gpt2 --gpus 8 --from hf_ds.json",
        "gpt2 on 8 x H100. 4230 candidates evaluated in 7.52 s, 1812 fit.", "```"])
    version, est, plan = rx.examples(text)
    assert version.files == est.files == (("lab.toml", "[x]\n"),)
    assert version.quick and est.quick and not plan.quick   # hf_ds.json is not shown
    assert plan.inputs == ["hf_ds.json"]
    assert rx.stale_numbers(version, "memplan 0.1.0\n") == []
    assert rx.stale_numbers(est, "gpt2 on 1x H100-80GB: 12,346 tokens/s") == ["12,345"]
    assert rx.stale_numbers(plan, "4230 candidates evaluated in 9.9 s, 1812 fit.") == []
    assert rx.stale_numbers(plan, "4230 candidates evaluated in 7.52 s, 1813 fit.") == ["1812"]
