"""Issue #12 item 2: PEFT methods as recipe choices. memplan's trainable counts against PEFT's
own modules built on the meta device, and the bad inputs each method refuses."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from memplan.cli import app
from memplan.errors import ConfigError
from memplan.estimate import estimate
from memplan.hardware import get_device
from memplan.model import load_model
from memplan.recipe import Recipe
from memplan.validate import _tiny

METHODS = ("dora", "lora-fa", "vera", "ia3", "prompt-tuning", "prefix-tuning", "ln-tuning",
           "bitfit", "adapter")
runner = CliRunner()


def _recipe(method: str, **kw) -> Recipe:
    extra = {"adapter_params": 5000} if method == "adapter" else {}
    return Recipe.from_dict({"method": method, "precision": "32-true", "device": "cpu",
                             **extra, **kw})


@pytest.mark.parametrize("model", ["qwen2", "phi", "gpt2", "falcon", "starcoder2", "qwen2_moe"])
@pytest.mark.parametrize("method", METHODS)
def test_trainable_count_equals_peft(model, method):
    """The count of every method equals ``sum(p.numel() for p in trainable parameters)`` of the
    model PEFT (or, for BitFit and ``adapter``, memplan's runtime) builds."""
    pytest.importorskip("peft")
    from memplan.runtime.workload import build_model

    r = _recipe(method, lora_rank=8)
    built = build_model(_tiny(model), r, device="meta")
    real = sum(p.numel() for p in built.model.parameters() if p.requires_grad)
    from memplan.estimate import _trainable

    # counted by the layout even where the activation graph refuses the method (prefix
    # tuning on GPT-2 and Falcon)
    assert _trainable(load_model(_tiny(model)), r) == real


@pytest.mark.parametrize("method", METHODS)
def test_methods_estimate_a_catalog_model(method):
    r = _recipe(method, device="cuda", precision="bf16-mixed", seq_len=2048)
    b = estimate(load_model("Qwen/Qwen2.5-0.5B"), r, get_device("H100-80GB"))
    assert 0 < b.model.trainable_params < b.model.params / 10
    assert b.worst.peak_allocated_bytes > 0


def test_bitfit_without_biases_and_adapter_without_count_are_refused():
    with pytest.raises(ConfigError, match="has none"):
        estimate(load_model(_tiny("llama")), _recipe("bitfit"), get_device("H100-80GB"))
    with pytest.raises(ConfigError, match="adapter_params"):
        Recipe.from_dict({"method": "adapter"})


def test_prompt_tuning_lengthens_the_sequence_and_prefix_adds_keys():
    """More virtual tokens cost more activation memory."""
    spec, dev = load_model(_tiny("llama")), get_device("H100-80GB")
    peak = {}
    for method, n in (("prompt-tuning", 8), ("prompt-tuning", 64), ("prefix-tuning", 8),
                      ("prefix-tuning", 64)):
        peak[method, n] = estimate(spec, _recipe(method, virtual_tokens=n, seq_len=256),
                                   dev).worst.peak_allocated_bytes
    assert peak["prompt-tuning", 64] > peak["prompt-tuning", 8]
    assert peak["prefix-tuning", 64] > peak["prefix-tuning", 8]


def test_cli_flags_for_the_new_methods():
    res = runner.invoke(app, ["estimate", "Qwen/Qwen2.5-0.5B", "--gpu", "H100-80GB", "--method",
                              "prefix-tuning", "--virtual-tokens", "30"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["estimate", "Qwen/Qwen2.5-0.5B", "--gpu", "H100-80GB", "--method",
                              "adapter"])
    assert res.exit_code == 2 and "adapter_params" in res.output
