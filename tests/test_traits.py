"""Architecture traits are set when the model is described; the activation graph reads them,
and refuses an architecture without them instead of drawing another family's graph."""

from __future__ import annotations

import pytest

from memplan import Recipe, estimate, get_device, load_model
from memplan.errors import UnsupportedModel
from memplan.model.traits import Graph, Norm, NormPlacement, QkNorm


@pytest.mark.parametrize("model,graph,norm,placement,qk", [
    ("meta-llama/Llama-3.2-1B", Graph.DECODER, Norm.RMS, NormPlacement.PRE, QkNorm.NONE),
    ("google/gemma-2-2b", Graph.DECODER, Norm.RMS_GEMMA, NormPlacement.SANDWICH, QkNorm.NONE),
    ("google/gemma-3-4b-pt", Graph.DECODER, Norm.RMS_GEMMA, NormPlacement.SANDWICH,
     QkNorm.HEAD),
    ("allenai/OLMo-2-1124-7B", Graph.DECODER, Norm.RMS, NormPlacement.POST, QkNorm.FULL),
    ("Qwen/Qwen3-8B", Graph.DECODER, Norm.RMS, NormPlacement.PRE, QkNorm.HEAD),
    ("openai-community/gpt2", Graph.GPT2, Norm.LAYER, NormPlacement.PRE, QkNorm.NONE),
    ("EleutherAI/gpt-neox-20b", Graph.GPT_NEOX, Norm.LAYER, NormPlacement.PRE, QkNorm.NONE),
    ("google-bert/bert-base-uncased", Graph.BERT, Norm.LAYER, NormPlacement.POST_LN,
     QkNorm.NONE),
])
def test_builders_set_the_traits(model, graph, norm, placement, qk):
    t = load_model(model).traits
    assert (t.graph, t.norm, t.placement, t.qk_norm) == (graph, norm, placement, qk)


def test_family_specific_traits():
    g2 = load_model("google/gemma-2-2b").traits
    assert g2.attn_softcap and g2.final_softcap and g2.embedding_scale
    assert not load_model("google/gemma-3-4b-pt").traits.attn_softcap
    neox = load_model("EleutherAI/gpt-neox-20b")
    assert neox.traits.parallel_residual
    assert neox.traits.rotary_dims == neox.layers[0].attention.head_dim // 4  # rotary_pct 0.25
    ds = load_model("deepseek-ai/DeepSeek-V3").traits
    assert ds.mla is not None and ds.rotary_dims == ds.mla.rope == 64
    bert = load_model("google-bert/bert-base-uncased").traits
    assert not bert.causal and bert.token_types and bert.rotary_dims == 0


@pytest.mark.parametrize("model", ["google-t5/t5-base"])
def test_an_architecture_without_a_graph_is_refused_with_the_fix(model):
    """Every catalog family has a graph since issue #12; a spec without traits (an
    architecture memplan does not know) is refused, never drawn as Llama."""
    from dataclasses import replace

    spec = replace(load_model(model), traits=None)
    with pytest.raises(UnsupportedModel, match="no activation graph.*model/traits.py"):
        estimate(spec, Recipe.of(), get_device("H100-80GB"))


@pytest.mark.parametrize("model,graph,rotary,parallel", [
    ("microsoft/phi-2", "ln_decoder", 32, True),  # head_dim 80 x partial_rotary_factor 0.4
    ("bigcode/starcoder2-3b", "ln_decoder", 128, False),
    ("tiiuae/falcon-7b", "ln_decoder", 64, True),
    ("tiiuae/falcon-40b", "ln_decoder", 64, True),
    ("Qwen/Qwen1.5-MoE-A2.7B", "decoder", 128, False),
])
def test_issue12_families_have_graphs(model, graph, rotary, parallel):
    """Issue #12 item 1: phi, starcoder2, falcon and qwen2_moe estimate with their own graph."""
    spec = load_model(model)
    assert spec.traits is not None and spec.traits.graph == graph
    assert spec.traits.rotary_dims == rotary and spec.traits.parallel_residual == parallel
    b = estimate(spec, Recipe.of(micro_batch=1, seq_len=512), get_device("H100-80GB"))
    assert b.worst.peak_allocated_bytes > 0
