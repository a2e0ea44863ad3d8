"""Uneven pipeline splits as Megatron-Core makes them (issue #11, item 1): the first/last stage
layer counts and the embedding / loss counted as layers (``transformer_block.py``
``get_num_layers_to_build``), their checks, their effect on each stage's memory, and the
Megatron export and import of the four settings."""

from __future__ import annotations

import json

import pytest

from memplan import Category, Recipe, estimate, load_model
from memplan.errors import ConfigError
from memplan.estimate.layout import stage_layers
from memplan.export import export
from memplan.export.common import ExportContext
from memplan.export.megatron import read_text
from memplan.hardware import get_device

H100 = get_device("H100-80GB")
LLAMA8B = load_model("meta-llama/Llama-3.1-8B")


def _counts(ranges: list[range]) -> list[int]:
    return [len(r) for r in ranges]


def test_first_and_last_counts_and_the_middle_shares_the_rest():
    assert _counts(stage_layers(32, 4, first=5, last=5)) == [5, 11, 11, 5]
    assert _counts(stage_layers(32, 4, first=5)) == [5, 9, 9, 9]
    assert _counts(stage_layers(32, 4, last=2)) == [10, 10, 10, 2]
    assert _counts(stage_layers(32, 2, first=12, last=20)) == [12, 20]  # no middle stage


def test_embedding_and_loss_counted_as_layers():
    """Qwen3-235B-A22B's Megatron-Bridge recipe (PP=16 with both options): 94 + 2 = 96 layers
    over 16 stages, 6 each, and the first and last stages build 5."""
    assert _counts(stage_layers(94, 16, embedding=True, loss=True)) == [5] + [6] * 14 + [5]
    assert _counts(stage_layers(31, 4, embedding=True)) == [7, 8, 8, 8]
    assert _counts(stage_layers(31, 4, loss=True)) == [8, 8, 8, 7]


def test_default_split_is_unchanged_and_every_layer_is_placed_once():
    assert _counts(stage_layers(30, 4)) == [8, 8, 7, 7]
    for kw in ({}, {"first": 5, "last": 5}, {"embedding": True, "loss": True}):
        ranges = stage_layers(94 if kw.get("embedding") else 32, 16 if kw.get("embedding")
                              else 4, **kw)
        flat = [i for r in ranges for i in r]
        assert flat == list(range(len(flat)))


@pytest.mark.parametrize("keys,says", [
    ({"pp_first_layers": 4}, "need pp > 1"),
    ({"pp": 4, "gpus": 4, "pp_first_layers": 4, "pp_split_loss": True}, "cannot be combined"),
])
def test_recipe_refuses_contradictions(keys, says):
    with pytest.raises(ConfigError, match=says):
        Recipe.of(**keys)


@pytest.mark.parametrize("keys,says", [
    ({"pp_first_layers": 6}, "left over layers must be divisible"),
    ({"pp_first_layers": 40}, "left over layers must be divisible"),
    ({"pp_split_embedding": True, "pp_split_loss": True}, "34 must divide by pp=4"),
    ({"pp_first_layers": 5, "pp_virtual": 2}, "must divide into pp_virtual chunks"),
])
def test_model_checks_refuse_what_megatron_asserts(keys, says):
    r = Recipe.of(gpus=8, pp=4, grad_accum=8, **keys)
    with pytest.raises(ConfigError, match=says):
        estimate(LLAMA8B, r, H100)


def _stage_params(b) -> list[int]:
    return [sum(i.bytes for i in rank.items if i.category is Category.PARAMS)
            for rank in b.ranks]


def test_each_stage_holds_its_own_layers():
    """The split moves whole layers between stages: the parameters summed over the stages are
    the same, the first stage (5 layers + embedding) holds less than under the even split, and
    the labels name the layers."""
    even = estimate(LLAMA8B, Recipe.of(gpus=8, pp=4, grad_accum=8), H100)
    uneven = estimate(LLAMA8B, Recipe.of(gpus=8, pp=4, grad_accum=8, pp_first_layers=5,
                                         pp_last_layers=5), H100)
    assert sum(_stage_params(even)) == sum(_stage_params(uneven))
    assert _stage_params(uneven)[0] < _stage_params(even)[0]
    assert _stage_params(uneven)[1] > _stage_params(even)[1]
    assert "layers 0-4" in uneven.ranks[0].role and "layers 5-15" in uneven.ranks[1].role


def test_megatron_export_and_import_carry_the_split():
    r = Recipe.of(gpus=8, pp=4, grad_accum=8, engine="megatron", pp_first_layers=5,
                  pp_last_layers=5)
    text = export(r, "megatron", ExportContext(model=LLAMA8B)).text
    tc = json.loads(text)["TransformerConfig"]
    assert tc["num_layers_in_first_pipeline_stage"] == 5
    assert tc["num_layers_in_last_pipeline_stage"] == 5
    keys = read_text(text, "x.json").keys
    assert (keys["pp_first_layers"], keys["pp_last_layers"]) == (5, 5)
    r2 = Recipe.of(gpus=8, pp=4, grad_accum=8, engine="megatron", pp_split_embedding=True,
                   pp_split_loss=True)
    keys = read_text(export(r2, "megatron", ExportContext(model=LLAMA8B)).text, "x.json").keys
    assert keys["pp_split_embedding"] and keys["pp_split_loss"]
