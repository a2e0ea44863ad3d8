"""FSDP2's copy-out and reduce-scatter copy-in (``timing/fsdp2.py``): the bytes of
``_fsdp_collectives.py``'s ``split_with_sizes_copy`` and ``chunk_cat``, counted by hand, and
their place in the step (memory-bound time on the compute stream)."""

from __future__ import annotations

import pytest

from memplan import Recipe, get_device, load_model
from memplan.facts.constants import constant
from memplan.hardware.nodes import get_node
from memplan.host import HostSetup, node_hardware
from memplan.system import stage_loads
from memplan.timing import estimate_time, stage
from memplan.timing.comms import Link, gather_s, ring_latency_s
from memplan.timing.fsdp2 import fsdp2_copy_bytes
from memplan.timing.step import _gathered_param_bytes

H100 = get_device("H100-80GB")
HW = node_hardware(H100, 8, get_node("DGX-H100"))
L8 = load_model("meta-llama/Llama-3.1-8B")


def test_bytes_by_hand():
    """1,000 elements, bf16 gathers forward and backward (2 x 2 x 2 B), one bf16 -> fp32
    reduce-scatter copy-in (2 + 4 B): 14 B per element; two micro-batches double it."""
    one = fsdp2_copy_bytes(1000, gathers=2, reduces=1, param_bytes=2, grad_bytes=2,
                           reduce_bytes=4)
    assert one == 14_000
    assert fsdp2_copy_bytes(1000, gathers=4, reduces=2, param_bytes=2, grad_bytes=2,
                            reduce_bytes=4) == 2 * one


def _hbm(engine: str, zero: int = 3, **kw) -> float:
    r = Recipe.of(gpus_per_node=8, gpus=8, zero=zero, seq_len=8192, micro_batch=2,
                  checkpointing="op", attention="flash", engine=engine, **kw)
    t = estimate_time(L8, r, H100, HW, HostSetup(), L8.num_params, stages=stage_loads(L8, r))
    return next(x.seconds for x in t.resources if x.name == "hbm")


@pytest.mark.parametrize("reshard, gathers", [(True, 2), (False, 1)])
def test_torchtitan_pays_the_copies(monkeypatch, reshard, gathers):
    """torchtitan (bf16 gathers, fp32 reduce: mixed_precision_reduce = float32) adds
    ``gathers x 4 + 6`` B per parameter at the usable HBM rate over the same step without."""
    per_elem = gathers * 4 + 6
    extra = L8.num_params * per_elem / (3350e9 * constant("hbm_efficiency"))
    with_copies = _hbm("torchtitan", reshard_after_forward=reshard)
    monkeypatch.setattr(stage, "fsdp2_copy_bytes", lambda *a, **k: 0.0)
    without = _hbm("torchtitan", reshard_after_forward=reshard)
    assert with_copies == pytest.approx(without + extra, rel=1e-9)
    assert extra > 0.025   # seconds: 1-3 % of this 8B step, not noise


def test_fsdp1_and_megatron_pay_none(monkeypatch):
    """FSDP1 gathers into its flat parameter in place and Megatron's distributed optimizer
    is not fully_shard: neither runs these copies."""
    for engine, zero in (("fsdp1", 3), ("megatron", 1)):
        before = _hbm(engine, zero)
        monkeypatch.setattr(stage, "fsdp2_copy_bytes", lambda *a, **k: 1e12)
        assert _hbm(engine, zero) == before
        monkeypatch.undo()


@pytest.mark.parametrize("engine, precision, expected", [
    ("torchtitan", "bf16-mixed", 2), ("fsdp2", "bf16-mixed", 2), ("fsdp1", "bf16-mixed", 2),
    ("fsdp2", "32-true", 4), ("deepspeed", "bf16-mixed", 2)])
def test_gathers_move_param_dtype(engine, precision, expected):
    """torch's FSDP casts the fp32 shard to ``param_dtype`` before the all-gather
    (``_fsdp_param.py`` ``all_gather_inputs``: ``_to_dtype_if_needed(sharded_param_data,
    self.param_dtype)``), so a bf16-mixed gather moves 2 B per element, not the 4 B of the
    stored fp32 shard; DeepSpeed gathers its bf16 copy; fp32 training gathers fp32."""
    r = Recipe.of(gpus_per_node=8, gpus=8, zero=3, precision=precision, engine=engine)
    assert _gathered_param_bytes(r) == expected


def test_torchtitan_gather_time_is_bf16():
    """The DP link's busy time of a torchtitan ZeRO-3 step falls when the gathers move 2 B,
    not 4 B, per element: two gathers + one fp32 reduce-scatter per step = 2 x 2 + 4 = 8 B
    per element against 2 x 4 + 4 = 12 B before (the reduce stays fp32:
    mixed_precision_reduce = float32)."""
    r = Recipe.of(gpus_per_node=8, gpus=8, zero=3, seq_len=8192, micro_batch=2,
                  checkpointing="op", attention="flash", engine="torchtitan")
    t = estimate_time(L8, r, H100, HW, HostSetup(), L8.num_params, stages=stage_loads(L8, r))
    nv = next(x.seconds for x in t.resources if x.name == "nvlink")
    link = Link("nvlink", HW.nvlink_gb_per_s / 2 * constant("nvlink_efficiency"),
                step_s=1e-6 * constant("nccl_ring_nvlink_step_us"))
    lat = ring_latency_s(8, link, 1)   # one per fully_shard unit (a block) and pass
    one = gather_s(L8.num_params, 8, link) - lat
    assert nv == pytest.approx(one * 8 + 3 * L8.num_layers * lat, rel=1e-6)
