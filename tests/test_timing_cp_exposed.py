"""Llama 3's exposed CP all-gather (``Parallelism.cp_comm_exposed``; arXiv 2407.21783
§3.3.2): the CP exchange moves from beside the kernels to the critical path."""

from __future__ import annotations

import pytest

from memplan import Recipe, get_device, load_model
from memplan.facts.constants import constant
from memplan.hardware.nodes import get_node
from memplan.host import HostSetup, node_hardware
from memplan.system import stage_loads
from memplan.timing import estimate_time, stage

H100 = get_device("H100-80GB")
HW = node_hardware(H100, 8, get_node("DGX-H100"))
L8 = load_model("meta-llama/Llama-3.1-8B")


def _stage(monkeypatch, exposed: bool):
    seen = []
    real = stage.stage_time

    def spy(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]

    monkeypatch.setattr("memplan.timing.step.stage_time", spy)
    r = Recipe.of(gpus_per_node=8, gpus=16, zero=1, cp=2, seq_len=65536, micro_batch=1,
                  checkpointing="none", attention="flash", engine="megatron",
                  cp_comm_exposed=exposed)
    t = estimate_time(L8, r, H100, HW, HostSetup(), L8.num_params, stages=stage_loads(L8, r))
    return t, seen[0]


def test_exposed_cp_is_on_the_critical_path(monkeypatch):
    """The same step with the exchange exposed: critical path + the CP time, less the
    contention it caused beside the kernels; the CP link is no longer an overlapped stream."""
    t0, s0 = _stage(monkeypatch, False)
    t1, s1 = _stage(monkeypatch, True)
    assert s1.cp == s0.cp > 0
    slow = constant("overlap_compute_slowdown")
    assert s0.dp.hidden + s0.cp < s0.busy   # contention was charged on the whole CP time
    assert s1.critical == pytest.approx(s0.critical + s0.cp * (1 - slow), rel=1e-12)
    cp_link = s1.links["cp"].name
    assert s1.overlapped().get(cp_link, 0.0) == pytest.approx(
        s0.overlapped()[cp_link] - s0.cp, abs=1e-12)
    assert t1.step_seconds > t0.step_seconds
    exposed = next(x.exposed_seconds for x in t1.resources if x.name == cp_link)
    assert exposed >= s1.cp


def test_default_is_the_ring():
    assert Recipe.of(gpus=2, cp=2).parallelism.cp_comm_exposed is False
