"""The step's time axis (issue #19, "time on the timeline"): every moment of a training step
gets its time from the step-time estimate (``timing/schedule.py``)."""

from __future__ import annotations

import pytest

from memplan import Breakdown, get_device, load_model
from memplan.api import Machine, estimate_from_names, load_job
from memplan.breakdown import Phase, Step
from memplan.results import StagePhases
from memplan.system import stage_loads
from memplan.timing.kernels import kernel_seconds
from memplan.recipe import Recipe


def _estimate(model: str = "Qwen/Qwen2.5-0.5B", **kw) -> Breakdown:
    recipe, setup = load_job(None, {"gpus": 8, **kw}, {})
    return estimate_from_names(model, recipe, Machine(node="DGX-H100"), setup)


@pytest.mark.parametrize("kw", [{"grad_accum": 4}, {"pp": 2, "grad_accum": 4},
                                {"zero": 2, "offload": "optimizer"}])
def test_moments_run_forward_backward_then_tail_inside_the_step(kw):
    b = _estimate(**kw)
    t = b.time
    assert t is not None and len(t.stages) == len(b.ranks)
    for rank, p in zip(b.ranks, t.stages):
        assert 0.0 <= p.forward_start
        assert p.forward_start + p.forward_seconds + p.backward_seconds == pytest.approx(
            p.tail_start)
        assert p.tail_start <= t.step_seconds
        assert 0.0 < p.forward_seconds < p.backward_seconds  # backward: twice the GEMMs
        for step in (Step.FIRST, Step.STEADY):
            ms = [m for m in rank.moments if m.step is step]
            secs = [m.seconds for m in ms]
            assert all(s is not None for s in secs) and secs == sorted(secs)
            assert ms[-1].phase is Phase.OPTIMIZER and secs[-1] == pytest.approx(t.step_seconds)
            last_fwd = max(s for m, s in zip(ms, secs) if m.phase is Phase.FORWARD)
            assert last_fwd == pytest.approx(p.forward_start + p.forward_seconds)
        assert all(m.seconds is None for m in rank.moments if m.step is Step.INIT)


def test_offload_tail_holds_the_cpu_optimizer_step():
    b = _estimate(zero=2, offload="optimizer")
    t = b.time
    cpu = next(r for r in t.resources if r.name == "cpu")
    p = t.stages[0]
    assert t.step_seconds - p.tail_start >= cpu.seconds > 0


def test_time_axis_survives_json():
    b = _estimate(grad_accum=2)
    back = Breakdown.from_dict(b.to_dict())
    assert back.time.stages == b.time.stages
    assert [m.seconds for m in back.ranks[0].moments] == [m.seconds for m in b.ranks[0].moments]
    assert StagePhases.from_dict(b.time.stages[0].to_dict()) == b.time.stages[0]


def test_forward_share_of_the_kernels():
    """Full fine-tuning, eager attention, no recomputation: every forward GEMM has two backward
    GEMMs of its size (input and weight gradients) and the attention core likewise, so the
    forward is a third of the kernel time."""
    m, h100 = load_model("Qwen/Qwen2.5-0.5B"), get_device("H100-80GB")
    r = Recipe.of(attention="eager", checkpointing="none")
    kt = kernel_seconds(m, r, h100, layers=range(m.num_layers), head=True, linear_peak=989e12,
                        attention_peak=989e12, matmul_efficiency=0.7, hbm_bytes_per_s=3e12,
                        bytes_per_element=2)
    assert kt.forward_s == pytest.approx((kt.linear_s + kt.attention_s) / 3)
    lora = Recipe.of(method="lora", attention="eager", checkpointing="none")
    kl = kernel_seconds(m, lora, h100, layers=range(m.num_layers), head=True,
                        linear_peak=989e12, attention_peak=989e12, matmul_efficiency=0.7,
                        hbm_bytes_per_s=3e12, bytes_per_element=2)
    assert kl.forward_s > (kl.linear_s + kl.attention_s) / 3   # frozen weights: no weight grads


def test_recomputation_counts_with_the_backward():
    """Checkpointing runs the forward again inside the backward: the memory-bound bytes of the
    forward stay those of one pass, the total grows."""
    m = load_model("Qwen/Qwen2.5-0.5B")
    plain = stage_loads(m, Recipe.of(checkpointing="none"))[0].traffic
    ckpt = stage_loads(m, Recipe.of(checkpointing="full"))[0].traffic
    assert plain.eager_forward_bytes == pytest.approx(ckpt.eager_forward_bytes, rel=1e-9)
    assert ckpt.eager_bytes > plain.eager_bytes > plain.eager_forward_bytes > 0
    assert 0 < ckpt.fused_forward_bytes <= ckpt.fused_bytes
