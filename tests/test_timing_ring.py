"""PyTorch ring attention's fp32 merges for torchtitan CP (``timing/ring.py``): the bytes of
``_templated_ring_attention`` and its backward, counted by hand, and their place in the step."""

from __future__ import annotations

import pytest

from memplan import Recipe, get_device, load_model
from memplan.facts.constants import constant
from memplan.hardware.nodes import get_node
from memplan.host import HostSetup, node_hardware
from memplan.system import stage_loads
from memplan.timing import estimate_time
from memplan.timing import stage
from memplan.timing.ring import ring_merge_bytes

H100 = get_device("H100-80GB")
HW = node_hardware(H100, 8, get_node("DGX-H100"))
L8 = load_model("meta-llama/Llama-3.1-8B")


def test_bytes_by_hand():
    """Llama 3.1 8B (32 heads of 128, 8 KV heads), 32,768 local tokens, CP 4, no TP:
    E_q = 32768 x 4096, E_kv = 32768 x 1024; forward 12 + 38 x 3 = 126 B per E_q; backward
    10 + 40 = 50 B per E_q and 56 + 42 x 3 = 182 B per E_kv."""
    e_q, e_kv = 32768 * 4096, 32768 * 1024
    assert ring_merge_bytes(L8, 32768, 1, 4) == (126 * e_q, 50 * e_q + 182 * e_kv)
    f2, b2 = ring_merge_bytes(L8, 32768, 2, 4)
    assert (f2, b2) == (63 * e_q, 25 * e_q + 91 * e_kv)   # TP splits the heads


def test_no_cp_no_bytes():
    assert ring_merge_bytes(L8, 8192, 1, 1) == (0.0, 0.0)


def _hbm(cp: int) -> float:
    r = Recipe.of(gpus_per_node=8, gpus=8, zero=3, cp=cp, seq_len=131072, micro_batch=1,
                  checkpointing="full", attention="flash", engine="torchtitan")
    t = estimate_time(L8, r, H100, HW, HostSetup(), L8.num_params, stages=stage_loads(L8, r))
    return next(x.seconds for x in t.resources if x.name == "hbm")


def test_torchtitan_cp_pays_the_merges(monkeypatch):
    """torchtitan's CP 4 adds the merges (forward twice under full recompute, backward once,
    32 layers) at the usable HBM rate, over the same step without them."""
    f, b = ring_merge_bytes(L8, 131072 / 4, 1, 4)
    extra = (f * 2 + b) * 32 / (3350e9 * constant("hbm_efficiency"))
    with_merges = _hbm(4)
    monkeypatch.setattr(stage, "ring_merge_bytes", lambda *a: (0.0, 0.0))
    assert with_merges == pytest.approx(_hbm(4) + extra, rel=1e-9)
    assert extra > 0.3   # seconds: ~4 % of this step, not noise
