"""Golden checks of the model-state part against published weights-only measurements
(../shared/ground-truth/published.csv, reliability A). Peaks with activations come with issue #3.

Tolerances follow each row's counter: a ``reserved`` or nvidia-smi reading sits at or slightly
above the allocated bytes we predict (allocator slack), so we check
``predicted <= measured <= predicted * (1 + tol)``.
"""

from __future__ import annotations

import pytest

from memplan import Category, Pool, Recipe, estimate, get_device, load_model
from memplan.units import GIB, MIB


def _params(model_id: str, recipe: Recipe, gpu: str) -> int:
    b = estimate(load_model(model_id), recipe, get_device(gpu))
    return sum(i.bytes for i in b.ranks[0].items
               if i.category is Category.PARAMS and i.pool is Pool.ALLOCATED)


def test_gt038_llama2_7b_lora_weights_after_init():
    """GT038: torchtune README @c69fba18b, llama2/7B_lora_single_device, bf16 weights + LoRA
    (r=8 on q,v, bf16 adapters), reserved after model init = 13.98 GB = 13.02 GiB."""
    got = _params("meta-llama/Llama-2-7b-hf",
                  Recipe.of(method="lora", lora_rank=8, lora_targets=("q", "v"),
                            adapter_dtype="bf16", precision="bf16-true"), "A100-80GB")
    measured = 13.02 * GIB
    assert got <= measured <= got * 1.05  # 3.6 % of allocator slack here


def test_gt120_bert_large_fp32_weights_plus_context():
    """GT120: HF Transformers performance doc, bert-large fp32 after loading, pynvml used
    memory 2631 MiB = context (GT119, same V100/CUDA 11.2 setup: 1343 MiB) + weights.
    The doc's model has a 2-label classification head instead of the MLM head we describe:
    335,143,938 vs 335,174,458 parameters (0.01 %)."""
    got = _params("bert-large-uncased", Recipe.of(precision="32-true"), "V100-16GB") + 1343 * MIB
    assert got == pytest.approx(2631 * MIB, rel=0.01)


def _load_reserved(recipe: Recipe) -> float:
    """Predicted ``max_memory_reserved`` after model init: the load phase's peak + slack."""
    r = estimate(load_model("meta-llama/Llama-2-7b-hf"), recipe, get_device("A100-80GB"),
                 search_micro_batch=False).worst
    return r.load_peak_allocated_bytes * 1.05 / GIB  # overhead.FRAGMENTATION_FRACTION


def test_gt038_lora_reserved_after_init_is_the_load_phase():
    """GT038 read through the load phase: reserved after init 13.98 GB = 13.02 GiB (torchtune
    qlora tutorial @0914d5cfb logs peak allocated 13.96 GB at init). Two-sided, 5 %."""
    got = _load_reserved(Recipe.of(method="lora", lora_rank=8, lora_targets=("q", "v"),
                                   adapter_dtype="bf16", precision="bf16-true"))
    assert got == pytest.approx(13.02, rel=0.05)


def test_gt039_qlora_reserved_after_init_is_a_listed_miss():
    """GT039: torchtune qlora tutorial @0914d5cfb (torchao==0.1), QLoRA 7B reserved after model
    init 9.13 GB = 8.50 GiB; the tolerance is two-sided, 10 % (README caveat 9).

    A miss, not an xfail: its cause is not measured (issue #17: an xfail needs a measured
    cause). The load phase holds the weights (3.64 GiB) and torchao 0.1's to_nf4 of the largest
    weight (2.86 GiB, 68 B per element measured on CPU): 6.82 GiB predicted, -19.8%. The
    1.7 GiB left is reserved, not allocated; the allocator's block splitting across the 224
    quantisations is a candidate that needs a GPU to measure. The row is reported as a miss in
    validation/ground_truth_gpu.md (its skip reason there). This test fails when the row
    starts to pass, so that the miss is taken off the list."""
    got = _load_reserved(Recipe.of(
        method="qlora", quant="nf4-dq", quantizer="torchao-0.1", lora_rank=8,
        lora_targets=("q", "k", "v", "o", "gate", "up", "down"), adapter_dtype="bf16",
        precision="bf16-true"))
    assert got != pytest.approx(8.50, rel=0.10), "GT039 now passes: make this a plain check"
