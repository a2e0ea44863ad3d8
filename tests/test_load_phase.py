"""The load phase (``memplan.estimate.load``): moments before the first step, the largest
transient per engine / load mode / quantiser, and what the allocator keeps from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memplan import Recipe, estimate, get_device, load_model
from memplan.api import estimate_from_names
from memplan.breakdown import Phase, Step
from memplan.errors import ConfigError
from memplan.estimate.load import quant_transient_bytes
from memplan.host import HostSetup

MEASURED = Path(__file__).resolve().parents[1] / "validation" / "load_transients.json"
QLORA = dict(precision="bf16-true", method="qlora", quant="nf4-dq", lora_rank=8,
             lora_targets=("q", "k", "v", "o", "gate", "up", "down"), adapter_dtype="bf16",
             micro_batch=2, seq_len=512, checkpointing="full")


def _rank(recipe: Recipe, model: str = "meta-llama/Llama-2-7b-hf", load: str = "full"):
    return estimate(load_model(model), recipe, get_device("A100-80GB"),
                    search_micro_batch=False, load=load).worst


@pytest.mark.parametrize("run", json.loads(MEASURED.read_text())["runs"],
                         ids=lambda r: f"torchao-{r['torchao'][:3]}-{r['shape'][0]}")
def test_quant_transient_matches_the_cpu_measurement(run):
    """The formulas against ``scripts/measure_load_transients.py`` runs of torchao's own
    ``to_nf4`` (a counter that shares no code with memplan): within 2 %."""
    quantizer = "torchao-0.1" if run["torchao"] == "0.1" else "torchao"
    got, _ = quant_transient_bytes(run["numel"], Recipe.of(**QLORA, quantizer=quantizer))
    assert got == pytest.approx(run["peak_bytes"], rel=0.02)


def test_load_moments_come_first_and_do_not_move_a_plain_estimate():
    r = _rank(Recipe.of(precision="bf16-mixed"), "meta-llama/Llama-3.1-8B")
    assert [m.phase for m in r.moments[:1]] == [Phase.LOAD]
    assert r.moments[0].step == Step.INIT
    assert {m.step for m in r.moments[1:]} == {Step.FIRST, Step.STEADY}
    assert r.load_peak_allocated_bytes < r.steady_peak_allocated_bytes
    assert r.peak_moment.step != Step.INIT
    assert len([m for m in r.moments if m.step == Step.INIT]) == 1  # DDP: no transient


def test_torchao_01_quantisation_sets_the_peak_and_the_reserved_pool():
    """Llama-2-7B QLoRA as torchtune ran it in April 2024: the 11008 x 4096 MLP weight's 68 B
    per element (2.86 GiB) on top of the weights is above the whole training step."""
    old = _rank(Recipe.of(**QLORA, quantizer="torchao-0.1"))
    new = _rank(Recipe.of(**QLORA, quantizer="torchao"))
    bnb = _rank(Recipe.of(**QLORA))
    assert old.peak_moment.step == Step.INIT
    transient = old.peak_allocated_bytes - old.moments[0].allocated_bytes
    assert transient == 11008 * 4096 * 68
    assert old.peak_reserved_bytes > old.peak_allocated_bytes  # the slack is on the load peak
    for r in (new, bnb):  # chunked / CUDA-kernel quantisers stay below the step
        assert r.peak_moment.step != Step.INIT
        assert r.steady_peak_allocated_bytes == old.steady_peak_allocated_bytes


def test_fsdp1_holds_two_copies_of_the_largest_unit():
    r = _rank(Recipe.of(precision="bf16-true", zero=3, gpus=4, engine="fsdp1"))
    weights, top = (m.allocated_bytes for m in r.moments[:2])
    # Llama-2-7B: the largest unit is one decoder layer, 202,383,360 elements (bf16)
    assert top - weights == 2 * 2 * 202_383_360


@pytest.mark.parametrize("load,extra", [("full", 202_383_360 * 4), ("rank0", 131_072_000 * 4),
                                        ("meta", 0), ("sharded", 0)])
def test_fsdp2_transient_follows_the_load_mode(load, extra):
    """fp32 shards (FSDP2 keeps fp32 parameters): a whole layer moved before sharding, one
    embedding-sized tensor broadcast, or nothing on meta / sharded loads."""
    r = _rank(Recipe.of(precision="bf16-mixed", zero=3, gpus=4, engine="fsdp2"), load=load)
    init = [m for m in r.moments if m.step == Step.INIT]
    assert init[-1].allocated_bytes - init[0].allocated_bytes == extra


def test_deepspeed_zero3_gathers_one_module_zero2_flattens_when_it_fits():
    z3 = _rank(Recipe.of(precision="bf16-mixed", zero=3, gpus=8, engine="deepspeed"))
    init = [m for m in z3.moments if m.step == Step.INIT]
    assert init[-1].allocated_bytes - init[0].allocated_bytes == 131_072_000 * 2
    z2 = _rank(Recipe.of(precision="bf16-mixed", zero=2, gpus=8, engine="deepspeed"))
    init = [m for m in z2.moments if m.step == Step.INIT]
    assert init[-1].allocated_bytes == 2 * init[0].allocated_bytes  # a flat copy
    big = _rank(Recipe.of(precision="bf16-mixed", zero=2, gpus=8, engine="deepspeed"),
                "meta-llama/Llama-3.1-70B")  # 2 x 141 GB does not fit: flattened on the CPU
    assert len([m for m in big.moments if m.step == Step.INIT]) == 1


def test_the_host_load_mode_reaches_the_gpu_side():
    recipe = Recipe.of(precision="bf16-mixed", zero=3, gpus=8, engine="fsdp2")
    full = estimate_from_names("meta-llama/Llama-3.1-8B", recipe, setup=HostSetup(load="full"),
                               search_micro_batch=False)
    meta = estimate_from_names("meta-llama/Llama-3.1-8B", recipe, setup=HostSetup(load="meta"),
                               search_micro_batch=False)
    assert full.worst.load_peak_allocated_bytes > meta.worst.load_peak_allocated_bytes


def test_bad_load_mode_is_refused():
    with pytest.raises(ConfigError, match="load='disk' is not one of full, rank0, sharded, meta"):
        _rank(Recipe.of(), load="disk")
