"""The optimizer in backward (``optimizer_in_backward``, torchtune ``optimizer_in_bwd``)."""

from __future__ import annotations

import pytest

from memplan import Category, Recipe, estimate, load_model
from memplan.errors import ConfigError
from memplan.hardware import get_device

A100 = get_device("A100-80GB")
LLAMA7B = load_model("meta-llama/Llama-2-7b-hf")


def _peak(**kw: object):
    return estimate(LLAMA7B, Recipe.of(precision="bf16-true", micro_batch=1, seq_len=256,
                                       checkpointing="full", **kw), A100,
                    search_micro_batch=False).worst


def test_only_one_gradient_lives_so_the_peak_drops_by_almost_all_gradients():
    """Llama-2-7B bf16: 12.55 GiB of gradients; with the optimizer in backward at most the
    largest tensor's (the 32000 x 4096 embedding or head, 0.24 GiB) exists."""
    plain, oib = _peak(), _peak(optimizer_in_backward=True)
    grads = 6_738_415_616 * 2
    largest = 32000 * 4096 * 2
    assert plain.peak_allocated_bytes - oib.peak_allocated_bytes > 0.9 * (grads - largest)
    at_peak = max(oib.moments, key=lambda m: sum(i.bytes for i in m.items))
    assert sum(i.bytes for i in at_peak.items if i.category is Category.GRADIENTS) <= largest


@pytest.mark.parametrize("kw", [{"gpus": 2, "zero": 3}, {"grad_accum": 4}])
def test_refused_outside_one_device_without_accumulation(kw):
    with pytest.raises(ConfigError, match="optimizer_in_backward"):
        _peak(optimizer_in_backward=True, **kw)
