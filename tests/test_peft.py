"""LoRA / QLoRA / freeze: trainable counts vs PEFT itself, and quantized-base bytes."""

from __future__ import annotations

import pytest

from memplan import Category, Recipe, estimate, load_model
from memplan.breakdown import Phase
from memplan.estimate.states import quantized_bytes
from memplan.model import catalog

_PEFT_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
               "up": "up_proj", "down": "down_proj"}


@pytest.mark.parametrize("model_id,targets,rank", [
    ("meta-llama/Llama-3.1-8B", ("q", "v"), 16),
    ("meta-llama/Llama-3.1-8B", ("q", "k", "v", "o", "gate", "up", "down"), 64),
    ("Qwen/Qwen2.5-0.5B", ("q", "k", "v", "o"), 8),
    ("google/gemma-2-2b", ("gate", "up", "down"), 32),
])
def test_lora_trainable_params_match_peft(model_id, targets, rank, h100):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoConfig, AutoModelForCausalLM

    data = dict(catalog()[model_id].config())
    cfg = AutoConfig.for_model(data.pop("model_type"), **data)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(cfg)
    lora = peft.get_peft_model(hf, peft.LoraConfig(
        r=rank, target_modules=[_PEFT_NAMES[t] for t in targets]))
    want = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    b = estimate(load_model(model_id),
                 Recipe.of(method="lora", lora_rank=rank, lora_targets=targets), h100)
    assert b.model.trainable_params == want


def test_qlora_nf4_dq_bits_per_param():
    """QLoRA §3: NF4 with double quantization stores 4 + 8/64 + 32/(64*256) bits per weight."""
    n = 4096 * 14336
    assert quantized_bytes(n, 4096, "nf4-dq") * 8 / n == pytest.approx(4 + 8 / 64 + 32 / 16384)
    assert quantized_bytes(n, 4096, "nf4") * 8 / n == pytest.approx(4.5)
    assert quantized_bytes(n, 4096, "int8") == n + 4096 * 4


def test_qlora_base_is_quantized_but_head_and_embedding_are_not(llama8b, h100):
    b = estimate(llama8b, Recipe.of(method="qlora", quant="nf4-dq", precision="bf16-true"), h100)
    items = {i.name: i.bytes for i in b.ranks[0].items}
    linear = sum(t.numel for t in llama8b.tensors if t.is_linear and t.component != "head")
    assert items["quantized base (nf4-dq)"] == pytest.approx(linear * 4.127 / 8, rel=1e-3)
    # embedding + lm_head + norms stay in bf16
    other = llama8b.num_params - linear
    assert items["frozen parameters (bf16)"] == 2 * other
    # only adapters have gradients and optimizer states; PEFT keeps adapters in fp32 by
    # default (autocast_adapter_dtype), and torch gives gradients and AdamW states that dtype.
    # (the gradients are all there once the backward is done: at the optimizer step)
    trainable = b.model.trainable_params
    rank = b.ranks[0]
    step = max((m for m in rank.moments if m.phase is Phase.OPTIMIZER),
               key=lambda m: m.allocated_bytes)
    assert step.categories()[Category.GRADIENTS] == 4 * trainable
    assert rank.categories_at_peak()[Category.OPTIMIZER] == 8 * trainable
