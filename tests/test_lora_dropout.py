"""``lora_dropout`` (issue #11): PEFT's ``lora_B(lora_A(dropout(x)))`` per adapted linear, and
litgpt's one dropout for q, k and v. The bytes it adds, counted from first principles, and the
inputs it refuses. Measured against PEFT on CPU by the ``peft lora dropout`` cases of
``memplan validate`` (src/memplan/validate/cases.toml)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from memplan.cli import app
from memplan.errors import ConfigError
from memplan.estimate import estimate
from memplan.hardware import get_device
from memplan.model import load_model
from memplan.recipe import Recipe

runner = CliRunner()
LLAMA = "meta-llama/Llama-2-7b-hf"  # 32 layers, hidden 4096
TOKENS, LAYERS, HIDDEN = 2 * 512, 32, 4096


def _peak(**kw) -> int:
    r = Recipe.from_dict({"method": "lora", "lora_targets": "q,v", "precision": "bf16-true",
                          "adapter_dtype": "bf16", "micro_batch": 2, "seq_len": 512, **kw})
    return estimate(load_model(LLAMA), r, get_device("H100-80GB")).worst.peak_allocated_bytes


def test_peft_dropout_adds_a_mask_and_an_input_per_adapted_linear():
    """bf16-true, bf16 adapters, q and v adapted, peak at the loss's backward (every saved
    tensor live). Without dropout ``lora_A`` saves the norm's output x itself (2 B, kept by
    nothing else: the frozen base matmul needs no input). With p > 0 each of q and v keeps its
    own CUDA ``native_dropout`` mask (1 B) and dropped input (2 B), and x is freed. In the first
    layer nothing upstream needs a gradient (frozen embedding and norm), so autograd records no
    dropout node there and its two masks are not kept."""
    n = TOKENS * HIDDEN * LAYERS
    first_layer_masks = 2 * TOKENS * HIDDEN
    assert _peak(lora_dropout=0.05) - _peak() == n * (2 * (1 + 2) - 2) - first_layer_masks


def test_litgpt_shared_qkv_dropout_keeps_one():
    """litgpt's ``LoRAQKVLinear``: one mask and one dropped input for q and v together."""
    n = TOKENS * HIDDEN * LAYERS
    first_layer_mask = TOKENS * HIDDEN
    assert _peak(lora_dropout=0.05, lora_dropout_qkv_shared=True) - _peak() == \
        n * (1 + 2 - 2) - first_layer_mask


def test_dropout_probability_does_not_change_bytes():
    assert _peak(lora_dropout=0.05) == _peak(lora_dropout=0.5)


def test_shared_flag_without_dropout_changes_nothing():
    assert _peak(lora_dropout_qkv_shared=True) == _peak()


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, "x", True])
def test_bad_probability_is_refused(bad):
    with pytest.raises(ConfigError, match="lora_dropout"):
        Recipe.from_dict({"method": "lora", "lora_dropout": bad})


@pytest.mark.parametrize("method", ["dora", "ia3", "full", "prompt-tuning"])
def test_methods_without_modelled_dropout_are_refused(method):
    with pytest.raises(ConfigError, match=f"lora_dropout=0.1 with method={method}"):
        Recipe.from_dict({"method": method, "lora_dropout": 0.1})


@pytest.mark.parametrize("method", ["lora", "qlora", "lora-fa", "vera"])
def test_dropout_methods_are_accepted(method):
    extra = {"quant": "nf4"} if method == "qlora" else {}
    assert Recipe.from_dict({"method": method, "lora_dropout": 0.1, **extra}).method.lora_dropout \
        == 0.1


def test_cli_exit_2_names_the_rule():
    res = runner.invoke(app, ["estimate", LLAMA, "--method", "lora", "--lora-dropout", "1"])
    assert res.exit_code == 2
    assert "must be a number >= 0.0 and < 1.0" in " ".join(res.output.split())
