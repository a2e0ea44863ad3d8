"""Expert tensor parallelism and MoE parallel folding (issue #11, item 1): ``etp``
(Megatron ``--expert-tensor-parallel-size``, 0 = tp) splits each expert's weights, the expert
groups fold over all tp x cp x dp ranks of a stage, and under sequence parallelism the
expert-TP ranks all-gather their routed rows (Megatron-Core ``token_dispatcher.py``
``dispatch_postprocess``)."""

from __future__ import annotations

import json

import pytest

from memplan import Recipe, estimate, load_model
from memplan.errors import ConfigError
from memplan.estimate.activations import _graph_args
from memplan.estimate.activations.families import stage_graph
from memplan.estimate.layout import layout
from memplan.export import export
from memplan.export.common import ExportContext
from memplan.export.megatron import read_text
from memplan.facts import dtypes
from memplan.hardware import get_device

QWEN3_30B = load_model("Qwen/Qwen3-30B-A3B")  # 128 experts, top-8, moe ffn 768, hidden 2048


def test_folding_lets_ep_use_the_tp_ranks():
    """Megatron-Bridge's recommended Qwen3-235B parallelism (TP 4, PP 16, CP 2, EP 8) on 256
    GPUs (dp 2): ep cannot divide dp x cp = 4; with etp = 1 the 8 expert ranks fold over
    tp x dp x cp = 16."""
    with pytest.raises(ConfigError, match="must divide the 16 ranks"):
        Recipe.of(gpus=256, tp=4, pp=16, cp=2, ep=8, sequence_parallel=True)
    par = Recipe.of(gpus=256, tp=4, pp=16, cp=2, ep=8, etp=1, sequence_parallel=True).parallelism
    assert par.expert_tp == 1 and par.expert_shard_degree == 2  # 16 / (8 x 1)


def test_etp_zero_is_tp_and_keeps_the_old_sharding():
    par = Recipe.of(gpus=64, tp=2, ep=4).parallelism
    assert par.expert_tp == 2 and par.expert_shard_degree == par.dp * par.cp // par.ep == 8
    assert Recipe.of(gpus=64, tp=2, ep=4, etp=1).parallelism.expert_shard_degree == 16


def _expert_numel(recipe: Recipe) -> int:
    return sum(h.numel for h in layout(QWEN3_30B, recipe)[0].held if h.expert)


def test_expert_weights_split_by_etp():
    by_tp = _expert_numel(Recipe.of(gpus=4, tp=2, ep=2))
    by_one = _expert_numel(Recipe.of(gpus=4, tp=2, ep=2, etp=1))
    assert by_one == 2 * by_tp


def _mm_outputs(recipe: Recipe) -> set[int]:
    st = layout(QWEN3_30B, recipe)[0]
    ctx, args = _graph_args(QWEN3_30B, st, recipe, dtypes(recipe))
    g = stage_graph(QWEN3_30B, range(1), ctx, **{**args, "first": True, "last": False})
    return {t.nbytes for op in g.ops if op.kind == "mm" for t in op.outputs}


def test_sequence_parallel_experts_run_on_the_gathered_rows():
    """tp = etp = 2 with sequence parallelism, 4096 tokens: each rank routes 2048 x 8 rows,
    the expert-TP pair all-gathers them, and each runs its 384-column half of the experts on
    all 32,768 rows (bf16). Before this, memplan ran them on the rank's own 16,384 rows."""
    r = Recipe.of(gpus=2, tp=2, sequence_parallel=True, seq_len=4096, precision="bf16-true")
    sizes = _mm_outputs(r)
    assert 4096 * 8 * 384 * 2 in sizes
    assert 2048 * 8 * 384 * 2 not in sizes
    # etp = 1: no gather, the whole 768-wide experts on the rank's own rows
    sizes1 = _mm_outputs(r.with_keys(etp=1))
    assert 2048 * 8 * 768 * 2 in sizes1


def test_exports_carry_etp():
    r = Recipe.of(gpus=16, tp=4, ep=4, etp=1, sequence_parallel=True, engine="megatron")
    text = export(r, "megatron", ExportContext(model=QWEN3_30B)).text
    assert json.loads(text)["TransformerConfig"]["expert_tensor_parallel_size"] == 1
    assert read_text(text, "x.json").keys["etp"] == 1
    tt = export(r.with_keys(engine="torchtitan"), "torchtitan").text
    assert "expert_tensor_parallel_degree = 1" in tt
    with pytest.raises(ConfigError, match="equal to tp"):
        export(r.with_keys(engine="torchtitan", etp=2), "torchtitan")


def test_qwen3_235b_megatron_recipe_estimates():
    r = Recipe.of(gpus=256, tp=4, pp=16, cp=2, ep=8, etp=1, sequence_parallel=True, zero=1,
                  engine="megatron", seq_len=4096, grad_accum=32, checkpointing="full",
                  pp_split_embedding=True, pp_split_loss=True)
    b = estimate(load_model("Qwen/Qwen3-235B-A22B"), r, get_device("H100-80GB"))
    assert len(b.ranks) == 16 and b.fits
