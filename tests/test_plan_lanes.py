"""One graph for several micro-batches and sequences (``estimate/activations/lanes.py``, used by
``memplan plan``) changes no number: lane by lane, the points equal each shape's own simulation,
across families, checkpointing, losses, kernels, methods, tp and stages; a decision the lanes
would take differently is refused, never guessed."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from memplan.errors import ConfigError
from memplan.estimate.activations import LANE_SHAPES, _recipe_args, stage_points, stage_traffic
from memplan.estimate.activations.families import stage_graph
from memplan.estimate.activations.graph import simulate
from memplan.estimate.activations.lanes import Lanes, Split, simulate_lanes
from memplan.estimate.layout import layout
from memplan.facts import dtypes
from memplan.model import load_model
from memplan.recipe import Recipe

BATCHES = (1, 2, 3, 8)
SHAPES = ((1, 96), (2, 96), (3, 48), (8, 24))
"""(micro-batch, local sequence) lanes: the sequence varies too (cp degrees 1, 2, 4)."""


def _rows(points: list) -> list[tuple]:  # type: ignore[type-arg]
    return [(p.phase, p.region, p.saved, p.temp, p.grads) for p in points]


def _lanes_equal_each_batch(spec, r: Recipe, where: tuple) -> int:
    """Each stage of ``r`` (its first three layers): the lanes' points equal every batch's own
    simulation; how many stages ran in lanes (the others split)."""
    ran = 0
    for st in layout(spec, r):
        ctx, args, key = _recipe_args(spec, st, r, dtypes(r), {})
        layers = range(st.layers.start, min(st.layers.stop, st.layers.start + 3))
        own = []
        for b, q in SHAPES:
            g = stage_graph(spec, layers, replace(key[2], batch=b, seq=q), **args)
            own.append((_rows(simulate(g)), g.param_grad_bytes))
        try:
            g = stage_graph(spec, layers, replace(key[2], batch=Lanes(tuple(
                b for b, _ in SHAPES)), seq=Lanes(tuple(q for _, q in SHAPES))), **args)
            got = simulate_lanes(g, len(SHAPES))
        except Split:
            continue
        assert [(_rows(p), n) for p, n in got] == own, where
        ran += 1
    return ran


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.2-1B", "deepseek-ai/DeepSeek-V2-Lite",
                                   "openai-community/gpt2", "google/gemma-2-2b"])
def test_lanes_equal_each_micro_batch(model: str) -> None:
    spec = load_model(model)
    ran = 0
    grid = itertools.product([(1, "full", 1), (2, "lora", 2)], ["none", "selective", "full", "op"],
                             ["standard", "fused"], ["sdpa", "eager"])
    for (pp, method, tp), ck, loss, attn in grid:
        try:
            r = Recipe.of(gpus=pp * tp, pp=pp, tp=tp, checkpointing=ck, loss=loss,
                          attention=attn, method=method, seq_len=256,
                          sequence_parallel=tp > 1 and ck == "none")
        except ConfigError:
            continue
        ran += _lanes_equal_each_batch(spec, r, (pp, ck, loss, attn, method, tp))
    assert ran >= 16  # the lanes are taken, not only refused


def test_moe_capacity_rounds_per_lane() -> None:
    """Mixtral with a capacity factor: ``ceil(cf x t x k / E)`` rounds in each lane alone."""
    spec = load_model("mistralai/Mixtral-8x7B-v0.1")
    for cf, ep in ((0.0, 1), (1.25, 2), (1.0, 8)):
        r = Recipe.of(gpus=8, ep=ep, seq_len=100, moe_capacity_factor=cf)
        assert _lanes_equal_each_batch(spec, r, (cf, ep)) == 1


def test_stage_points_with_lane_batches_equal_the_plain_simulation() -> None:
    """Through ``stage_points``' memo (short simulations, or with pp 4 whole stages, run in lanes
    for ``LANE_SHAPES``): each shape's points equal the memo-free simulation."""
    spec = load_model("meta-llama/Llama-3.2-1B")
    shapes = tuple((b, 128 // cp) for b in (1, 2, 8) for cp in (1, 2))
    memo: dict[object, object] = {LANE_SHAPES: {1: shapes}}
    for pp, cp, b, ck in itertools.product([1, 4], [1, 2], [1, 2, 8], ["none", "full"]):
        r = Recipe.of(gpus=pp * cp, pp=pp, cp=cp, micro_batch=b, seq_len=128, checkpointing=ck)
        for st in layout(spec, r):
            whole = stage_points(spec, st, r, dtypes(r))
            fast = stage_points(spec, st, r, dtypes(r), memo)
            assert _rows(fast[0]) == _rows(whole[0]) and fast[1] == whole[1], (pp, b, ck)
    for kind in ("short", "stage_points"):
        ctxs = [k[3] if kind == "short" else k[2] for k in memo
                if isinstance(k, tuple) and k[0] == kind]
        assert {(c.batch, c.seq) for c in ctxs} == set(shapes)
    assert "lane_splits" not in memo


def test_lanes_compute_each_lane_and_refuse_split_decisions() -> None:
    x = Lanes((5, 9, 16))
    assert (-(-x // 4)).v == (2, 3, 4) and (x * 3 + 1).v == (16, 28, 49)
    assert math.ceil(x * 1.25 / 3).v == tuple(math.ceil(a * 1.25 / 3) for a in (5, 9, 16))
    assert (1 << (x - 1).bit_length()).v == (8, 16, 16)
    assert max(x, 2) is x and x > 4  # every lane agrees
    for decide in (lambda: x > 8, lambda: max(x, 8), lambda: min(x, 8), lambda: int(x),
                   lambda: f"{x}", lambda: x == 9, lambda: bool(x - 5)):
        with pytest.raises(Split):
            decide()
    with pytest.raises(TypeError):
        hash(x)


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.2-1B", "mistralai/Mixtral-8x7B-v0.1"])
def test_stage_traffic_with_lane_batches_equals_each_micro_batch(model: str) -> None:
    """The two-layer traffic graphs run in lanes: each micro-batch's traffic, bit for bit."""
    spec = load_model(model)
    memo: dict[object, object] = {LANE_SHAPES: {1: SHAPES, 2: SHAPES}}
    for (b, q), ck, tp in itertools.product(SHAPES, ["none", "selective"], [1, 2]):
        cp = 96 // q
        r = Recipe.of(gpus=tp * cp, tp=tp, cp=cp, micro_batch=b, seq_len=96, checkpointing=ck,
                      sequence_parallel=tp > 1)
        st = layout(spec, r)[0]
        assert stage_traffic(spec, st, r, dtypes(r), memo) == stage_traffic(
            spec, st, r, dtypes(r)), (b, ck, tp)
    twos = [k for k in memo if isinstance(k, tuple) and k[0] == "two_layer_traffic"]
    assert {(k[2].batch, k[2].seq) for k in twos} == set(SHAPES) and "lane_splits" not in memo
