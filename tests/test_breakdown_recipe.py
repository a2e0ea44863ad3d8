"""The shared result type and the recipe's own validation."""

from __future__ import annotations

import json

import pytest

from memplan import Breakdown, Category, ConfigError, Phase, Recipe, Step, estimate
from memplan.estimate.layout import stage_layers
from memplan.model.spec import LORA_TARGETS


def test_breakdown_round_trips_through_json(llama8b, h100):
    b = estimate(llama8b, Recipe.of(gpus=8, zero=3, pp=2, method="lora"), h100)
    again = Breakdown.from_dict(json.loads(json.dumps(b.to_dict())))
    assert again.to_dict() == b.to_dict()


def test_peak_is_the_largest_moment_not_a_max_over_labels(llama8b, h100):
    rank = estimate(llama8b, Recipe.of(), h100).ranks[0]
    assert rank.peak_allocated_bytes == max(m.allocated_bytes for m in rank.moments)
    assert rank.peak_allocated_bytes == max(rank.first_step_peak_allocated_bytes,
                                            rank.steady_peak_allocated_bytes)
    steady = rank.phase_peaks(Step.STEADY)
    first = rank.phase_peaks(Step.FIRST)
    # torch creates AdamW states inside the first step: its forward holds less
    assert first[Phase.FORWARD] < steady[Phase.FORWARD]
    assert first[Phase.OPTIMIZER] == steady[Phase.OPTIMIZER]


def test_grad_accum_keeps_gradients_through_forward(llama8b, h100):
    without = estimate(llama8b, Recipe.of(), h100).ranks[0].phase_moment(Phase.FORWARD)
    kept = estimate(llama8b, Recipe.of(grad_accum=4), h100).ranks[0].phase_moment(Phase.FORWARD)
    assert kept.categories()[Category.GRADIENTS] > 0 == without.categories()[Category.GRADIENTS]


def test_all_linear_alias_and_comma_lists():
    assert Recipe.from_dict({"lora_targets": "all-linear"}).method.lora_targets == LORA_TARGETS
    assert Recipe.from_dict({"lora_targets": "q, v"}).method.lora_targets == ("q", "v")


@pytest.mark.parametrize("bad,fragment", [
    ({"method": "qlora"}, "needs a quantized base"),
    ({"quant": "nf4"}, "only applies to method=qlora"),
    ({"offload": "optimizer"}, "needs zero>=1"),
    ({"offload": "params+optimizer", "zero": 2}, "needs zero=3"),
    ({"hybrid_shard": 4, "gpus": 8}, "needs zero=3"),
    ({"hybrid_shard": 3, "gpus": 8, "zero": 3}, "must divide the data-parallel size"),
    ({"micro_batch": 0}, "micro_batch=0 must be a whole number from 1 to"),
    ({"device": "cpu", "offload": "optimizer", "zero": 1}, "no meaning with device=cpu"),
])
def test_recipe_rules(bad, fragment):
    with pytest.raises(ConfigError, match=fragment):
        Recipe.from_dict(bad)


def test_stage_layers_even_and_uneven():
    assert [len(r) for r in stage_layers(32, 4)] == [8, 8, 8, 8]
    assert [len(r) for r in stage_layers(30, 4)] == [8, 8, 7, 7]
    assert stage_layers(5, 2)[-1].stop == 5


def test_expert_parallel_divides_only_experts(h100):
    from memplan import load_model

    m = load_model("mistralai/Mixtral-8x7B-v0.1")
    one = estimate(m, Recipe.of(precision="bf16-true", optimizer="sgd", gpus=8), h100)
    ep8 = estimate(m, Recipe.of(precision="bf16-true", optimizer="sgd", gpus=8, ep=8), h100)
    experts = m.params_by_component()["experts"]
    p1 = one.ranks[0].categories_at_peak()["params"]
    p8 = ep8.ranks[0].categories_at_peak()["params"]
    assert p1 - p8 == 2 * experts * 7 // 8
