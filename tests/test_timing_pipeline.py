"""Step time of pipeline stages and MoE expert parallelism (issue #19, the two known defects):
each stage is timed with its own layers (uneven splits, the output layer on the last stage),
and expert GEMMs / all-to-all follow the expert TP size ``etp``, not ``tp``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memplan import Recipe, get_device, load_model
from memplan.hardware.nodes import get_node
from memplan.host import HostSetup, node_hardware
from memplan.system import stage_loads
from memplan.timing import estimate_time
from memplan.timing.comms import ring_latency_s
from memplan.timing.kernels import _layer_gemm_s
from memplan.timing.pipeline import pipeline_step
from memplan.timing.stage import stage_time
from memplan.timing.step import _rates

H100 = get_device("H100-80GB")
HW = node_hardware(H100, 8, get_node("DGX-H100"))


def _time(model: str, **kw):
    m = load_model(model)
    r = Recipe.of(gpus_per_node=8, **kw)
    return estimate_time(m, r, H100, HW, HostSetup(), m.num_params, stages=stage_loads(m, r))


def _res(t, name: str) -> float:
    return next((r.seconds for r in t.resources if r.name == name), 0.0)


def test_pipeline_step_by_hand():
    """Even stages: Narayanan et al. 2021 §2.2's (p - 1) / (m v) bubble; uneven: the slowest
    stage's own time plus the others' fill and drain."""
    assert pipeline_step([10.0] * 4, [8.0] * 4, 8) == (10 + 3 * 8 / 8, 0, 3.0)
    assert pipeline_step([10.0] * 4, [8.0] * 4, 8, 2)[0] == pytest.approx(10 + 3 * 8 / 16)
    step, slowest, bubble = pipeline_step([12.0, 7.0], [12.0, 7.0], 4)
    assert (step, slowest, bubble) == (12 + 7 / 4, 0, 7 / 4)
    assert pipeline_step([5.0], [5.0], 4) == (5.0, 0, 0.0)


PP = dict(gpus=2, pp=2, grad_accum=8, seq_len=4096, micro_batch=1, checkpointing="none")


def test_uneven_split_slows_the_step_by_the_moved_layers():
    """Llama-3.1-8B on 2 stages: moving 4 more layers onto the first stage (24/8 against
    20/12) adds exactly 4 layers' kernels to the stage that sets the step, and the step grows
    by that stage's extra work less what its shorter partner no longer adds to the bubble:
    between (1 - 1/m) x the extra compute and the extra compute + memory-bound time. Before
    the fix both splits timed 1/pp of the model and were equal."""
    a = _time("meta-llama/Llama-3.1-8B", pp_first_layers=20, pp_last_layers=12, **PP)
    b = _time("meta-llama/Llama-3.1-8B", pp_first_layers=24, pp_last_layers=8, **PP)
    assert _res(b, "compute") == pytest.approx(_res(a, "compute") * 24 / 20, rel=1e-9)
    d_compute = _res(b, "compute") - _res(a, "compute")
    d_busy = d_compute + _res(b, "hbm") - _res(a, "hbm")
    d_step = b.step_seconds - a.step_seconds
    assert d_compute * (1 - 1 / 8) <= d_step <= d_busy
    assert any("stage 0 (24 layers)" in n for n in b.notes)


def test_even_split_is_set_by_the_stage_with_the_head():
    """16/16: the last stage also runs the 128k-vocab output GEMMs, so it is the slower one;
    the bubble is the first stage's work / m (not the last stage's)."""
    t = _time("meta-llama/Llama-3.1-8B", **PP)
    assert any("stage 1 (16 layers, output layer)" in n for n in t.notes)
    first = _time("meta-llama/Llama-3.1-8B", pp_first_layers=16, pp_last_layers=16, **PP)
    assert first.step_seconds == pytest.approx(t.step_seconds)
    uneven = _time("meta-llama/Llama-3.1-8B", pp_first_layers=20, pp_last_layers=12, **PP)
    assert uneven.step_seconds > t.step_seconds


def _expert_shapes(par_kw: dict, tokens: float = 4096.0):
    m = load_model("Qwen/Qwen3-30B-A3B")
    layer = next(ly for ly in m.layers if ly.ffn and ly.ffn.num_experts)
    par = Recipe.of(**par_kw).parallelism
    shapes: list[tuple[float, float, float]] = []

    def gemm(a: float, k: float, n: float) -> float:
        shapes.append((a, k, n))
        return 2 * a * k * n
    flops = _layer_gemm_s(layer, tokens, par, gemm)
    experts = [(a, k, n) for a, k, n in shapes if a < tokens / par.tp * 0.99]
    return layer, experts, flops


def test_expert_gemms_split_by_etp_not_tp():
    """Megatron-Core's all-to-all dispatcher: a rank's experts see S/tp x top_k x ep x etp / E
    tokens with weights split over etp. etp = 1 under tp = 4: full-width experts on a quarter
    of the tokens; etp = tp: a quarter of the width on all of them. The FLOPs per rank are
    the same."""
    kw = dict(gpus=8, tp=4, ep=2, sequence_parallel=True)
    layer, e1, f1 = _expert_shapes({**kw, "etp": 1})
    _, e4, f4 = _expert_shapes({**kw, "etp": 4})
    ffn = layer.ffn
    k, n_exp, inter, h = ffn.top_k, ffn.num_experts, ffn.intermediate_size, 2048
    assert {round(a) for a, _, _ in e1} == {round(4096 / 4 * k * 2 / n_exp)}
    assert {round(a) for a, _, _ in e4} == {round(4096 / 4 * k * 2 * 4 / n_exp)}
    assert max(n for _, _, n in e1) == max(inter, h)          # unsplit expert weights
    assert max(n for _, _, n in e4) == max(inter / 4, h)      # gate/up split over etp = 4
    assert f1 == pytest.approx(f4)


def test_etp_changes_expert_time_and_comm(monkeypatch):
    """At a short sequence the expert GEMMs are weight-bandwidth bound: etp = 1 reads tp times
    the expert weights per rank, so compute is slower; etp = tp adds the expert-TP all-gather
    and reduce-scatter around the all-to-all, so EP traffic grows. (Without the SM count: the
    tile/wave quantisation of these small GEMMs, ``timing/gemm.py``, is a separate effect with
    its own tests; with it the compute ratio is 1.13 instead.)"""
    monkeypatch.setitem(globals(), "H100", replace(H100, sm_count=None))
    kw = dict(gpus=8, tp=4, ep=2, seq_len=512, micro_batch=1, sequence_parallel=True)
    one = _time("Qwen/Qwen3-30B-A3B", etp=1, **kw)
    four = _time("Qwen/Qwen3-30B-A3B", etp=4, **kw)
    assert _res(one, "compute") > 1.2 * _res(four, "compute")
    m = load_model("Qwen/Qwen3-30B-A3B")

    def ep_seconds(etp: int) -> float:
        r = Recipe.of(gpus_per_node=8, etp=etp, **kw)
        rates = _rates(m, r, H100, HW, HostSetup(), None, 989.4e12, "bf16")
        load = stage_loads(m, r)[0]
        return stage_time(m, r, H100, HW, HostSetup(), rates, load, last=True).ep
    # per MoE layer and pass: A2A of b s/tp k h over ep = 2, + AG/RS of 4x that over etp = 4
    # (a ring over 4 NVLink GPUs, with its latency; the all-to-all's latency is not timed)
    link = _rates(m, Recipe.of(gpus_per_node=8, etp=4, **kw), H100, HW, HostSetup(), None,
                  989.4e12, "bf16").intra
    a2a = 512 / 4 * m.layers[0].ffn.top_k * m.hidden_size * 2 * (1 / 2) / (link.gb_per_s * 1e9)
    ag = 512 / 4 * m.layers[0].ffn.top_k * m.hidden_size * 2 * 4 * (3 / 4) / (
        link.gb_per_s * 1e9) + ring_latency_s(4, link, 1)
    assert ep_seconds(4) / ep_seconds(1) == pytest.approx((a2a + ag) / a2a)


def test_overlapped_collectives_slow_the_kernels_beside_them(monkeypatch):
    """FSDP on 8 H100s: the prefetched all-gathers and reduce-scatters hide behind the
    compute, but the kernels beside them run 18.9 % slower (Lee et al. 2025): the step grows
    by 0.189 x the hidden collective time against a model without contention."""
    kw = dict(gpus=8, zero=3, engine="fsdp2", seq_len=4096)
    with_c = _time("meta-llama/Llama-3.1-8B", **kw)
    import memplan.timing.stage as stage
    real = stage.constant
    monkeypatch.setattr(stage, "constant",
                        lambda k: 0.0 if k == "overlap_compute_slowdown" else real(k))
    without = _time("meta-llama/Llama-3.1-8B", **kw)
    nv = {r.name: r for r in without.resources}["nvlink"]
    hidden = nv.seconds - nv.exposed_seconds
    assert 0 < hidden < _res(without, "compute")
    assert with_c.step_seconds - without.step_seconds == pytest.approx(0.189 * hidden, rel=1e-6)
