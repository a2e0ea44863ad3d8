"""Qwen (1) (``model_type`` "qwen"): its ``QWenLMHeadModel`` ships as remote code on the Hub,
which memplan never runs (no ``trust_remote_code``). These tests rebuild its module tree with
plain ``nn.Linear`` / ``nn.Embedding`` shapes as ``modeling_qwen.py`` declares them
(``QWenAttention``: ``c_attn`` Linear(h, 3 x kv_channels x heads), ``c_proj`` Linear(kv_channels
x heads, h, bias=not no_bias); ``QWenMLP``: ``w1``, ``w2`` Linear(h, intermediate_size // 2),
``c_proj`` back; ``RMSNorm`` with one weight) and compare names and counts with memplan's
description, then check the estimate's LoRA count and the loss's shift copy."""

from __future__ import annotations

import pytest

from memplan import get_device, load_model
from memplan.estimate import estimate
from memplan.recipe import Recipe

torch = pytest.importorskip("torch")
nn = torch.nn

QWEN = ["Qwen/Qwen-1_8B", "Qwen/Qwen-7B", "Qwen/Qwen-14B", "Qwen/Qwen-72B"]


def _qwen_tree(c: dict) -> nn.Module:
    h, a = c["hidden_size"], c["num_attention_heads"]
    proj, f, bias = c["kv_channels"] * a, c["intermediate_size"] // 2, not c["no_bias"]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.Module()
            self.ln_1.weight = nn.Parameter(torch.empty(h))
            self.attn = nn.Module()
            self.attn.c_attn = nn.Linear(h, 3 * proj)
            self.attn.c_proj = nn.Linear(proj, h, bias=bias)
            self.ln_2 = nn.Module()
            self.ln_2.weight = nn.Parameter(torch.empty(h))
            self.mlp = nn.Module()
            self.mlp.w1 = nn.Linear(h, f, bias=bias)
            self.mlp.w2 = nn.Linear(h, f, bias=bias)
            self.mlp.c_proj = nn.Linear(f, h, bias=bias)

    m = nn.Module()
    m.transformer = nn.Module()
    m.transformer.wte = nn.Embedding(c["vocab_size"], h)
    m.transformer.h = nn.ModuleList(Block() for _ in range(c["num_hidden_layers"]))
    m.transformer.ln_f = nn.Module()
    m.transformer.ln_f.weight = nn.Parameter(torch.empty(h))
    m.lm_head = nn.Linear(h, c["vocab_size"], bias=False)
    return m


@pytest.mark.parametrize("model_id", QWEN)
def test_count_and_names_match_the_module_tree(model_id: str) -> None:
    spec = load_model(model_id)
    with torch.device("meta"):
        tree = _qwen_tree(spec.config)
    assert spec.num_params == sum(p.numel() for p in tree.parameters())
    layer0 = {n.removeprefix("transformer.h.0.") for n, _ in tree.named_parameters()
              if n.startswith("transformer.h.0.")}
    assert {t.name for t in spec.layers[0].tensors} == layer0


def test_lora_on_fused_c_attn_counts_one_adapter() -> None:
    """PEFT wraps ``c_attn`` once (r x h + 3h x r), not three q/k/v adapters."""
    spec = load_model("Qwen/Qwen-7B")
    r = Recipe.of(method="lora", lora_rank=64, precision="bf16-true")
    b = estimate(spec, r, get_device("A100-80GB"), search_micro_batch=False)
    h, f = 4096, 11008
    per_layer = 64 * ((h + 3 * h) + (h + h) + 2 * (h + f) + (f + h))
    assert b.model.trainable_params == 32 * per_layer == 143_130_624


def test_shift_copy_adds_one_logits_copy() -> None:
    """``lm_logits[..., :-1, :].contiguous()``: in fp32 (no upcast copy to hide it) the shifted
    copy is live next to the logits and ``log_softmax``'s output, one fp32 logits more in the
    forward's loss than the same graph without it. (Under 16-bit training the fp32 upcast
    frees the copy before ``log_softmax``, and the peak does not move.)"""
    from dataclasses import replace

    spec = load_model("Qwen/Qwen-1_8B")
    r = Recipe.of(precision="32-true", micro_batch=1, seq_len=1024)
    gpu = get_device("A100-80GB")
    with_copy = estimate(spec, r, gpu, search_micro_batch=False)
    without = estimate(replace(spec, traits=replace(spec.traits, shift_copy=False)), r, gpu,
                       search_micro_batch=False)
    fwd = lambda b: max(m.allocated_bytes for m in b.worst.moments  # noqa: E731
                        if m.phase == "forward" and m.label.endswith("loss"))
    # the copy-free graph's largest loss instant also holds the 4-byte loss scalar
    assert fwd(with_copy) - fwd(without) == 1024 * 151936 * 4 - 4


def test_modules_to_save_trains_copies_of_embedding_and_head() -> None:
    """PEFT ``modules_to_save=["wte", "lm_head"]`` (Qwen's finetune.py for base checkpoints):
    the trainable count grows by exactly the two copies, 2 x vocab x hidden."""
    spec = load_model("Qwen/Qwen-7B")
    gpu = get_device("A100-80GB")
    base = Recipe.of(method="lora", lora_rank=64, precision="bf16-true")
    saved = base.with_keys(modules_to_save="embed,lm_head")
    a = estimate(spec, base, gpu, search_micro_batch=False)
    b = estimate(spec, saved, gpu, search_micro_batch=False)
    assert b.model.trainable_params - a.model.trainable_params == 2 * 151936 * 4096
    assert b.worst.peak_allocated_bytes > a.worst.peak_allocated_bytes


@pytest.mark.parametrize("keys, needle", [
    (dict(method="full", modules_to_save="embed"), "applies to PEFT methods"),
    (dict(method="lora", modules_to_save="emb"), "Did you mean 'embed'"),
])
def test_modules_to_save_bad_input(keys: dict, needle: str) -> None:
    from memplan.errors import MemplanError

    with pytest.raises(MemplanError, match=needle):
        spec = load_model("Qwen/Qwen-1_8B")
        estimate(spec, Recipe.of(**keys), get_device("A100-80GB"), search_micro_batch=False)


def test_modules_to_save_lm_head_on_a_tied_model_is_refused() -> None:
    from memplan.errors import MemplanError

    spec = load_model("meta-llama/Llama-3.2-1B")
    with pytest.raises(MemplanError, match="ties its output layer"):
        estimate(spec, Recipe.of(method="lora", modules_to_save="lm_head"),
                 get_device("A100-80GB"), search_micro_batch=False)


def test_gptq_int4_storage_of_one_linear() -> None:
    """auto-gptq QuantLinear buffers for a 4096 -> 11008 linear, group size 128: qweight
    (4096 x 11008 / 2 B), qzeros (32 groups x 11008 / 2 B), fp16 scales (32 x 11008 x 2 B),
    int32 g_idx (4096 x 4 B)."""
    from memplan.estimate.states import quantized_bytes

    numel = 11008 * 4096
    want = numel // 2 + 32 * 11008 // 2 + 32 * 11008 * 2 + 4096 * 4
    assert quantized_bytes(numel, 11008, "gptq-int4") == want


def test_qlora_on_a_gptq_checkpoint_estimates() -> None:
    spec = load_model("Qwen/Qwen-7B-Chat-Int4")
    r = Recipe.of(method="qlora", quant="gptq-int4", lora_rank=64, precision="bf16-true")
    b = estimate(spec, r, get_device("A100-80GB"), search_micro_batch=False)
    line = next(i for m in b.worst.moments for i in m.items
                if i.name == "quantized base (gptq-int4)")
    assert 3.0e9 < line.bytes < 3.5e9  # ~6.5e9 linear elements x ~0.52 B
