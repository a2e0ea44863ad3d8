"""Memory-bound kernel time from the estimator's op graph, kernel launches, and the engines'
overlap rules (issue #19: the eager-kernel, launch and exposed-communication part)."""

from __future__ import annotations

import pytest

from memplan import Recipe, get_device, load_model
from memplan.estimate.activations import stage_traffic
from memplan.estimate.activations.blocks import Blocks, Ctx
from memplan.estimate.activations.families import stage_graph
from memplan.estimate.activations.graph import Graph
from memplan.estimate.activations.traffic import graph_traffic
from memplan.estimate.layout import layout
from memplan.facts import dtypes
from memplan.hardware.nodes import get_node
from memplan.host import HostSetup, node_hardware
from memplan.results import Traffic
from memplan.system import stage_loads
from memplan.timing import estimate_time
from memplan.timing.overlap import dp_overlap


def _time(model: str, **kw):
    m = load_model(model)
    r = Recipe.of(gpus_per_node=8, **kw)
    d = get_device("H100-80GB")
    hw = node_hardware(d, 8, get_node("DGX-H100"))
    return estimate_time(m, r, d, hw, HostSetup(), m.num_params, stages=stage_loads(m, r))


def _exposed(t, name: str) -> float:
    return sum(r.exposed_seconds for r in t.resources if r.name == name)


def test_rmsnorm_bytes_by_hand():
    """HF LlamaRMSNorm on 4 tokens x 8 (bf16 in, nothing trains): eager moves every op's
    inputs and outputs; fused reads x once and writes the output once, in one kernel."""
    g = Graph()
    b = Blocks(g, Ctx(batch=1, seq=4, act=2, half=2, amp=False, trained=False))
    x = b.new(4 * 8, 2, grad=False)
    g.op([], (x,), kind="comm")  # arrives from elsewhere
    b.rmsnorm(x, 8)
    t = sum(graph_traffic(g).values(), Traffic())
    # cast 64+128, pow 128+128, mean 128+16, +eps 16+16, rsqrt 16+16, x*r 128+16+128,
    # cast back 128+64, weight mul 64+64 (the weight is external to the graph)
    assert t.eager_bytes == 192 + 256 + 144 + 32 + 32 + 272 + 192 + 128
    assert t.fused_bytes == 64 + 64
    assert (t.eager_kernels, t.fused_kernels) == (9, 2)  # + the comm op's kernel


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.2-1B", "Qwen/Qwen3-30B-A3B"])
@pytest.mark.parametrize("ck", ["none", "selective", "full"])
def test_stage_traffic_from_two_layers_equals_the_whole_graph(model, ck):
    """The two-layer shortcut (identical layers) gives exactly the whole stage graph's sums."""
    m = load_model(model)
    r = Recipe.of(gpus=2, pp=2, seq_len=512, checkpointing=ck, engine="megatron")
    dt = dtypes(r)
    for st in layout(m, r):
        short = stage_traffic(m, st, r, dt, {})
        from memplan.estimate.activations import _graph_args
        ctx, args = _graph_args(m, st, r, dt)
        whole = sum(graph_traffic(stage_graph(m, st.layers, ctx, **args)).values(), Traffic())
        for f in ("eager_bytes", "fused_bytes", "eager_kernels", "fused_kernels"):
            assert getattr(short, f) == pytest.approx(getattr(whole, f), rel=1e-12), f


def test_recompute_and_fusion_move_the_bytes_the_right_way():
    m = load_model("meta-llama/Llama-3.1-8B")
    tr = {ck: stage_loads(m, Recipe.of(seq_len=2048, checkpointing=ck))[0].traffic
          for ck in ("none", "selective", "full")}
    assert tr["none"].eager_bytes < tr["full"].eager_bytes
    assert tr["none"].eager_kernels < tr["selective"].eager_kernels < tr["full"].eager_kernels
    for t in tr.values():
        assert t.fused_bytes < t.eager_bytes / 2
        assert t.fused_kernels < t.eager_kernels


def test_compile_shortens_the_memory_bound_time(monkeypatch):
    """The op graph's fused chains halve the memory-bound time; FSDP2's copy-out and
    reduce-scatter copy-in (``timing/fsdp2.py``, the same under compile) are left out here."""
    from memplan.timing import stage
    monkeypatch.setattr(stage, "fsdp2_copy_bytes", lambda *a, **k: 0.0)
    eager = _time("meta-llama/Llama-3.1-8B", gpus=8, zero=3, engine="fsdp2", seq_len=4096)
    comp = _time("meta-llama/Llama-3.1-8B", gpus=8, zero=3, engine="fsdp2", seq_len=4096,
                 compile=True)
    assert _exposed(comp, "hbm") < _exposed(eager, "hbm") / 2
    assert comp.step_seconds < eager.step_seconds


def test_small_steps_wait_for_kernel_launches():
    """A 0.5B model on 128 tokens runs its kernels faster than the CPU issues them; at 16k
    tokens the GPU work hides the launches."""
    small = _time("Qwen/Qwen2.5-0.5B", seq_len=128, micro_batch=1)
    big = _time("Qwen/Qwen2.5-0.5B", seq_len=16384, micro_batch=1)
    assert _exposed(small, "launch") > 0.3 * small.step_seconds
    assert _exposed(big, "launch") == 0
    launch = next(r for r in small.resources if r.name == "launch")
    assert launch.seconds == pytest.approx(stage_loads(
        load_model("Qwen/Qwen2.5-0.5B"), Recipe.of(seq_len=128))[0].traffic.eager_kernels * 5e-6)


@pytest.mark.parametrize("engine,zero,overlap,serial", [
    ("fsdp2", 3, False, (2.0 + 1.0) / 33),        # one unit's share of 32 layers + root
    ("deepspeed", 3, False, 2.0 / 33 + 1.0),      # prefetch; reduce-scatter serial
    ("deepspeed", 3, True, 2.0 / 33),
    ("deepspeed", 2, False, 3.0),                 # reduction and post-step gather serial
    ("deepspeed", 2, True, 2.0),
    ("megatron", 1, False, 3.0),
    ("megatron", 1, True, 2.0),
])
def test_overlap_rule_per_engine(engine, zero, overlap, serial):
    r = Recipe.of(gpus=8, zero=zero, engine=engine, overlap_comm=overlap)
    o = dp_overlap(r, gather_s=2.0, reduce_s=1.0, grad_bytes=1e9, layers=32)
    assert o.serial == pytest.approx(serial)
    assert o.hidden + o.serial == pytest.approx(3.0)


def test_ddp_last_bucket_is_serial():
    o = dp_overlap(Recipe.of(gpus=8, engine="ddp"), gather_s=0.0, reduce_s=1.0,
                   grad_bytes=100 * 2**20, layers=32)
    assert o.serial == pytest.approx(0.25)   # 25 MiB of 100 MiB


def test_overlap_comm_off_costs_step_time():
    kw = dict(gpus=16, zero=2, engine="deepspeed", seq_len=1024)
    off = _time("meta-llama/Llama-3.1-8B", **kw)
    on = _time("meta-llama/Llama-3.1-8B", overlap_comm=True, **kw)
    assert off.step_seconds > on.step_seconds
