"""Interleaved pipeline schedules and the cross-entropy options (issue #3, items 1 and 2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memplan import Category, Recipe, estimate, load_model
from memplan.breakdown import Phase, Step
from memplan.errors import ConfigError
from memplan.estimate import inflight_microbatches
from memplan.hardware import get_device

H100 = get_device("H100-80GB")
LLAMA8B = load_model("meta-llama/Llama-3.1-8B")


@pytest.mark.parametrize("pp,v", [(4, 2), (4, 4), (8, 3), (2, 5)])
def test_interleaved_first_stage_matches_korthikanti(pp, v):
    """Stage 0 of the interleaved schedule holds pp x (1 + (pp - 1) / (pp x v)) micro-batches
    (arXiv 2205.05198 §4.2.3), given enough micro-batches."""
    assert inflight_microbatches(pp, 0, v, 64) == pytest.approx(pp * (1 + (pp - 1) / (pp * v)))


def test_plain_1f1b_and_few_microbatches():
    assert [inflight_microbatches(4, s, 1, 8) for s in range(4)] == [4, 3, 2, 1]
    assert inflight_microbatches(4, 0, 1, 2) == 2  # only 2 micro-batches in the step
    assert inflight_microbatches(4, 0, 2, 1) == 1  # one micro-batch: 2 chunks, 1 micro-batch


def test_interleaving_costs_memory_and_saves_bubble():
    def run(v):
        return estimate(LLAMA8B, Recipe.of(gpus=4, pp=4, pp_virtual=v, grad_accum=8, seq_len=4096),
                        H100, search_micro_batch=False)
    plain, inter = run(1), run(2)
    assert inter.ranks[0].peak_allocated_bytes > plain.ranks[0].peak_allocated_bytes
    names = [i.name for i in inter.ranks[0].items]
    assert "4.5 more micro-batches in flight (interleaved 1F1B)" in names


def test_interleaving_needs_pipeline_and_whole_chunks():
    with pytest.raises(ConfigError, match="pp > 1"):
        Recipe.of(pp_virtual=2)
    with pytest.raises(ConfigError, match="pp x pp_virtual"):
        estimate(LLAMA8B, Recipe.of(gpus=4, pp=4, pp_virtual=3), H100)  # 32 layers, 12 chunks


def test_loss_options_order_and_fused_has_no_vocab_sized_tensor():
    """Llama-3.2-1B, 2 x 4096 tokens, vocab 128,256: one fp32 B x S x V tensor is 3.9 GiB.
    The fused loss keeps none, chunked keeps the fp32 log-probabilities, standard more."""
    spec = load_model("meta-llama/Llama-3.2-1B")
    peak = {loss: estimate(spec, Recipe.of(micro_batch=2, seq_len=4096, loss=loss), H100,
                           search_micro_batch=False).worst for loss in ("standard", "chunked",
                                                                          "fused")}
    assert (peak["fused"].peak_allocated_bytes < peak["chunked"].peak_allocated_bytes
            < peak["standard"].peak_allocated_bytes)
    vocab_tensor = 2 * 4096 * spec.vocab_size * 4
    assert (peak["standard"].peak_allocated_bytes - peak["fused"].peak_allocated_bytes
            > 2 * vocab_tensor)
    with pytest.raises(ConfigError, match="loss"):
        Recipe.of(loss="liger")


def _saved_per_layer(model: str, recipe: Recipe) -> int:
    rank = estimate(load_model(model), recipe, H100, search_micro_batch=False).ranks[0]
    fwd = [m.categories()[Category.ACTIVATIONS] for m in rank.moments
           if m.step is Step.STEADY and m.phase is Phase.FORWARD]
    return fwd[3] - fwd[2]  # what layer 1 adds to the saved activations


def test_sequence_parallel_saves_what_korthikanti_says():
    """Megatron sequence parallelism splits the replicated part of a GPT layer's activations
    (LayerNorm inputs, dropout masks, residuals: 10 sbh bytes in 16-bit) over the t TP ranks,
    so it saves sbh x 10 x (1 - 1/t) per layer (arXiv 2205.05198, Table 2: sbh(10 + 24/t) vs
    sbh x 34/t). GPT-2 XL, t = 5, s = 1024, b = 1, h = 1600: 8 sbh."""
    base = Recipe.of(gpus=5, tp=5, seq_len=1024, precision="bf16-true", attention="flash")
    plain = _saved_per_layer("openai-community/gpt2-xl", base)
    sp = _saved_per_layer("openai-community/gpt2-xl", base.with_keys(sequence_parallel=True))
    sbh = 1024 * 1600
    assert (plain - sp) / sbh == pytest.approx(10 * (1 - 1 / 5), rel=0.01)
    with pytest.raises(ConfigError, match="tp > 1"):
        Recipe.of(sequence_parallel=True)


def test_moe_capacity_factor_pads_expert_inputs():
    """Capacity 1.0 with balanced routing is the dropless size; 1.25 pads every expert to 25%
    more rows than its share, so the expert activations grow."""
    moe = load_model("Qwen/Qwen3-30B-A3B")

    def peak(cf):
        return estimate(moe, Recipe.of(gpus=8, ep=8, zero=1, seq_len=4096, moe_capacity_factor=cf),
                        H100, search_micro_batch=False).worst.peak_allocated_bytes
    assert peak(1.0) == peak(0.0) < peak(1.25)
    with pytest.raises(ConfigError, match="moe_capacity_factor"):
        Recipe.of(moe_capacity_factor=-1)


def test_litgpt_losses_keep_16_bit_log_probs():
    """litgpt's chunked cross-entropy (``chunked-head``, ``chunked-ce``) runs ``log_softmax`` on
    the bf16 logits: under bf16-true it saves 2 B per logit where the standard loss's
    ``logits.float()`` saves 4 B (and its fp32 copy is a temporary beside them). Llama-3.2-1B,
    2 x 4096 tokens: one bf16 B x S x V tensor is 1.96 GiB."""
    spec = load_model("meta-llama/Llama-3.2-1B")
    peak = {loss: estimate(spec, Recipe.of(micro_batch=2, seq_len=4096, loss=loss,
                                           precision="bf16-true", outputs="kept"), H100,
                           search_micro_batch=False).worst.peak_allocated_bytes
            for loss in ("standard", "chunked-head", "chunked-ce")}
    bf16_logits = 2 * 4096 * spec.vocab_size * 2
    assert peak["standard"] - peak["chunked-head"] > 1.5 * bf16_logits
    # chunked-ce makes the whole logits before chunking: between the two
    assert peak["chunked-head"] < peak["chunked-ce"] < peak["standard"]
    with pytest.raises(ConfigError, match="loss"):
        Recipe.of(loss="chunked-lm")
