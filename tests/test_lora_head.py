"""LoRA on the output layer (``lora_targets`` ``lm_head``, issue #12)."""

from __future__ import annotations

import pytest

from memplan import Recipe, estimate, load_model
from memplan.errors import ConfigError
from memplan.hardware import get_device
from memplan.model.spec import LORA_TARGETS

A100 = get_device("A100-80GB")


def _adapter_bytes(model: str, targets: str, **kw: object) -> int:
    b = estimate(load_model(model), Recipe.of(method="lora", lora_rank=64, lora_targets=targets,
                                              **kw), A100, search_micro_batch=False)
    return sum(i.bytes for i in b.worst.items if i.name.startswith("LoRA adapters"))


def test_lm_head_adds_r_times_hidden_plus_vocab_adapter_parameters():
    """Llama-2-7B (h 4096, vocab 32000, untied): lm_head's A and B hold r x (4096 + 32000)
    fp32 elements next to the q,v adapters."""
    with_head = _adapter_bytes("meta-llama/Llama-2-7b-hf", "q,v,lm_head")
    without = _adapter_bytes("meta-llama/Llama-2-7b-hf", "q,v")
    assert with_head - without == 64 * (4096 + 32000) * 4


def test_all_linear_leaves_the_output_layer_out_as_peft_does():
    assert Recipe.of(method="lora", lora_targets="all-linear").method.lora_targets == LORA_TARGETS


def test_lm_head_on_a_tied_model_and_with_a_fused_loss_are_refused():
    with pytest.raises(ConfigError, match="lm_head do not exist"):
        estimate(load_model("meta-llama/Llama-3.2-1B"),
                 Recipe.of(method="lora", lora_targets="q,v,lm_head"), A100)
    with pytest.raises(ConfigError, match="not modelled"):
        estimate(load_model("meta-llama/Llama-2-7b-hf"),
                 Recipe.of(method="lora", lora_targets="q,v,lm_head", loss="fused"), A100)


def test_lm_head_adapters_train_with_gradients_and_adam_states():
    """The head's adapters are trainable parameters like the others: weight, gradient and
    AdamW's two states, 16 B per fp32 element, all on top of the q,v run's peak."""
    model = load_model("meta-llama/Llama-2-7b-hf")
    peak = {t: estimate(model, Recipe.of(method="lora", lora_rank=8, lora_targets=t,
                                         precision="bf16-true", micro_batch=2, seq_len=512),
                        A100, search_micro_batch=False).worst.peak_allocated_bytes
            for t in ("q,v", "q,v,lm_head")}
    assert peak["q,v,lm_head"] - peak["q,v"] >= 8 * (4096 + 32000) * 16
