"""The real-size case table a GPU session runs (validation/gpu_cases.toml, by
scripts/gpu_session.sh), and how a case table names its models. No GPU needed: the cases are
parsed and estimated here, so that a lent GPU's minutes are not spent on a table that breaks or
overflows."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from memplan import estimate, get_device, load_model
from memplan.errors import ConfigError
from memplan.results import AllocatorCounters
from memplan.validate import CaseResult, cases

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "validation" / "gpu_cases.toml"


def test_every_gpu_case_fits_an_h100_with_room():
    """Each case is a catalog model at its real size, estimated under 90 % of an H100-80GB's
    memory (the smaller of the GPUs a session may be lent), so the run measures, not OOMs."""
    device = get_device("H100-80GB")
    table = cases(device="cuda", table=TABLE)
    assert len(table) >= 5
    for case in table:
        assert not case.model.endswith(".json"), case.model  # a real size, not tiny/
        assert case.recipe.platform.device == "cuda"
        b = estimate(load_model(case.model), case.recipe, device, search_micro_batch=False)
        assert b.worst.device_total_bytes < 0.9 * device.capacity_bytes, case.name


def test_a_case_names_a_tiny_architecture_a_catalog_id_or_a_config(tmp_path):
    cfg = tmp_path / "m"
    cfg.mkdir()
    (cfg / "config.json").write_text("{}")
    table = tmp_path / "cases.toml"
    table.write_text("".join(
        f'[[case]]\nname = "{n}"\nmodel = "{m}"\n' for n, m in
        (("tiny", "llama"), ("catalog", "Qwen/Qwen2.5-0.5B"), ("folder", str(cfg)))))
    got = {c.name: c.model for c in cases(table=table)}
    assert got["tiny"].endswith("llama.json") and Path(got["tiny"]).is_file()
    assert got["catalog"] == "Qwen/Qwen2.5-0.5B" and got["folder"] == str(cfg)


def test_an_unknown_model_is_refused_with_close_names(tmp_path):
    table = tmp_path / "cases.toml"
    table.write_text('[[case]]\nname = "x"\nmodel = "Qwen/Qwen2.5-0.5"\n')
    with pytest.raises(ConfigError) as e:
        cases(table=table)
    msg = str(e.value)
    assert "model='Qwen/Qwen2.5-0.5'" in msg and "'Qwen/Qwen2.5-0.5B'" in msg
    r = subprocess.run([sys.executable, "-m", "memplan", "validate", "--cases", str(table)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "Qwen/Qwen2.5-0.5B" in r.stderr + r.stdout


def test_cuda_counters_are_reported_beside_the_estimate():
    """On CUDA the JSON sets the allocator's reserved peak and the memory in use after the steps
    beside the estimate's reserved peak and device total; elsewhere they are null."""
    case = cases(device="cuda", table=TABLE)[0]
    b = estimate(load_model(case.model), case.recipe, get_device("H100-80GB"),
                 search_micro_batch=False)
    keys = ("measured_max_memory_reserved_bytes", "estimated_peak_reserved_bytes",
            "measured_device_used_bytes", "estimated_device_total_bytes")
    assert all(CaseResult(case=case, measured=b, estimated=b).to_dict()[k] is None for k in keys)
    alloc = AllocatorCounters(max_memory_allocated=1, max_memory_reserved=2, active_bytes_peak=1,
                              device_used=3)
    measured = replace(b, device=replace(b.device, allocator=alloc))
    d = CaseResult(case=case, measured=measured, estimated=b).to_dict()
    assert [d[k] for k in keys] == [2, b.worst.peak_reserved_bytes, 3,
                                    b.worst.device_total_bytes]
    assert d["model"] == case.model
