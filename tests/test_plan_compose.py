"""The estimator's memo (``estimate(memo=...)``, used by ``memplan plan``) changes no number:
stage points composed from short simulations (``estimate/activations/compose.py``) equal the
whole stage's simulation, point for point, across families, checkpointing, losses, kernels,
methods, tp and pipeline stages."""

from __future__ import annotations

import itertools

import pytest

from memplan.errors import ConfigError
from memplan.estimate import activations
from memplan.estimate.activations import stage_points
from memplan.estimate.layout import layout
from memplan.facts import dtypes
from memplan.model import load_model
from memplan.recipe import Recipe


def _rows(points: list) -> list[tuple]:  # type: ignore[type-arg]
    return [(p.phase, p.region, p.saved, p.temp, p.grads) for p in points]


@pytest.fixture
def always_compose(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose every stage the composition covers, even where simulating the whole stage is
    cheaper (``_compose_pays``), so the composition itself is what is compared."""
    monkeypatch.setattr(activations, "_compose_pays", lambda new, length: True)


def _memo_equals_whole(spec, r: Recipe, where: tuple) -> dict[object, object]:
    """Every stage of ``r``: the memoised (composed) points equal the whole simulation's; the
    memo, to see what was composed."""
    memo: dict[object, object] = {}
    for st in layout(spec, r):
        whole = stage_points(spec, st, r, dtypes(r))
        fast = stage_points(spec, st, r, dtypes(r), memo)
        assert _rows(fast[0]) == _rows(whole[0]) and fast[1] == whole[1], where
    return memo


@pytest.mark.usefixtures("always_compose")
@pytest.mark.parametrize("model", ["meta-llama/Llama-3.2-1B", "openai-community/gpt2",
                                   pytest.param("deepseek-ai/DeepSeek-V2-Lite", marks=pytest.mark.full),
                                   pytest.param("google/gemma-2-2b", marks=pytest.mark.full)])
def test_composed_stage_points_equal_the_whole_simulation(model: str) -> None:
    spec = load_model(model)
    composed = 0
    grid = itertools.product([1, 3], ["none", "selective", "full"], ["standard", "fused"],
                             ["sdpa", "eager"], ["full", "lora"], [1, 2])
    for pp, ck, loss, attn, method, tp in grid:
        try:
            r = Recipe.of(gpus=pp * tp, pp=pp, tp=tp, checkpointing=ck, loss=loss,
                          attention=attn, method=method, seq_len=256, micro_batch=2,
                          sequence_parallel=tp > 1 and ck == "none")
        except ConfigError:
            continue
        memo = _memo_equals_whole(spec, r, (pp, ck, loss))
        composed += sum(1 for k in memo if isinstance(k, tuple) and k[0] == "short")
    if model != "google/gemma-2-2b":  # alternating layer kinds: always the whole simulation
        assert composed > 0


@pytest.mark.usefixtures("always_compose")
@pytest.mark.parametrize("model", ["meta-llama/Llama-3.2-1B", "openai-community/gpt2",
                                   "deepseek-ai/DeepSeek-V2-Lite"])
def test_periodic_checkpointing_composes_and_equals_the_whole_simulation(model: str) -> None:
    """``full`` on every k-th layer (torchtitan layer SAC) is composed per unit of k layers
    (``compose(period=k)``), with a tail of ``L mod k`` layers: equal to the whole stage's
    simulation point for point, and composed (not the fallback) for stages long enough."""
    spec = load_model(model)
    periodic = 0
    for pp, every, method, tp, mb in itertools.product([1, 2], [2, 3, 4], ["full", "lora"],
                                                      [1, 2], [1, 2]):
        try:
            r = Recipe.of(gpus=pp * tp, pp=pp, tp=tp, checkpointing="full",
                          checkpoint_every=every, method=method, seq_len=128, micro_batch=mb)
        except ConfigError:
            continue
        memo = _memo_equals_whole(spec, r, (pp, every, tp))
        periodic += sum(1 for k in memo if isinstance(k, tuple) and k[0] == "short"
                        and k[-2].every == every)
    assert periodic > 0


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.2-1B", "microsoft/phi-2",
                                   "google-t5/t5-small", "google-bert/bert-base-uncased",
                                   "EleutherAI/gpt-neox-20b", "openai-community/gpt2",
                                   "google/gemma-2-2b", "mistralai/Mixtral-8x7B-v0.1"])
def test_flash_is_keyed_as_sdpa_only_where_the_graph_is_the_same(model: str) -> None:
    """``graph_attention`` keys ``flash`` as ``sdpa`` (the memo shares their simulations)
    for every graph family but multi-head latent attention: the graphs built with the raw
    ``flash`` and with the key simulate to the same points and move the same bytes, on CPU
    and CUDA kernels, with and without autocast, per-op and full checkpointing."""
    from memplan.estimate.activations import _graph_args, graph_attention
    from memplan.estimate.activations.families import stage_graph
    from memplan.estimate.activations.graph import simulate
    from memplan.estimate.activations.traffic import graph_traffic

    spec = load_model(model)
    assert graph_attention(spec, "flash") == "sdpa"
    for precision, ck, device, zero in itertools.product(["bf16-mixed", "bf16-true"],
                                                         ["none", "op", "full"],
                                                         ["cuda", "cpu"], [0, 3]):
        try:
            r = Recipe.of(gpus=2, zero=zero, precision=precision, checkpointing=ck,
                          attention="flash", device=device, seq_len=64, micro_batch=2)
        except ConfigError:
            continue
        st = layout(spec, r)[0]
        ctx, args = _graph_args(spec, st, r, dtypes(r))
        assert args["attention"] == "sdpa"
        layers = range(st.layers.start, min(st.layers.stop, st.layers.start + 3))
        raw = stage_graph(spec, layers, ctx,
                          **{**args, "attention": "flash"})  # type: ignore[arg-type]
        keyed = stage_graph(spec, layers, ctx, **args)  # type: ignore[arg-type]
        assert _rows(simulate(raw)) == _rows(simulate(keyed)), (precision, ck, device)
        assert graph_traffic(raw) == graph_traffic(keyed), (precision, ck, device)


def test_flash_keeps_its_own_key_under_multi_head_latent_attention() -> None:
    """MLA pads v for FlashAttention-2: its graph differs from SDPA's, so the key keeps it."""
    from memplan.estimate.activations import graph_attention

    assert graph_attention(load_model("deepseek-ai/DeepSeek-V2-Lite"), "flash") == "flash"


def test_the_cheaper_route_gives_the_same_points() -> None:
    """``_compose_pays``: a stage shorter than the short simulations it would need is simulated
    whole, unless those simulations are already kept (then it is composed from them); either
    route gives the same points, and both are taken here (8-layer stages of Llama-3.1-8B's
    pp=4 after the 16-layer ones of pp=2 kept the short simulations of the first and last
    stages; the middle stages' are never run)."""
    spec = load_model("meta-llama/Llama-3.1-8B")
    memo: dict[object, object] = {}
    for pp in (2, 4):
        r = Recipe.of(gpus=pp, pp=pp, seq_len=128, micro_batch=1, checkpointing="selective")
        for st in layout(spec, r):
            whole = stage_points(spec, st, r, dtypes(r))
            fast = stage_points(spec, st, r, dtypes(r), memo)
            assert _rows(fast[0]) == _rows(whole[0]) and fast[1] == whole[1], (pp, st.index)
    shorts = {(k[-6], k[-5]) for k in memo if isinstance(k, tuple) and k[0] == "short"}
    assert shorts == {(True, False), (False, True)}  # (first, last): no middle stage's


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B", "mistralai/Mixtral-8x7B-v0.1",
                                   "openai-community/gpt2"])
def test_traffic_shared_across_stage_lengths_equals_each_stages_own(model: str) -> None:
    """``stage_traffic`` with one memo across pipeline degrees (the two-layer graph kept per
    layer kind and context, read for every stage length and position) equals each stage's
    traffic computed without a memo, to the last bit."""
    from memplan.estimate.activations import stage_traffic

    spec = load_model(model)
    memo: dict[object, object] = {}
    for pp, ck in itertools.product([1, 2, 4], ["none", "full"]):
        r = Recipe.of(gpus=pp, pp=pp, seq_len=128, micro_batch=2, checkpointing=ck)
        for st in layout(spec, r):
            assert stage_traffic(spec, st, r, dtypes(r), memo) == \
                stage_traffic(spec, st, r, dtypes(r)), (pp, ck, st.index)
    assert any(isinstance(k, tuple) and k[0] == "two_layer_traffic" for k in memo)
