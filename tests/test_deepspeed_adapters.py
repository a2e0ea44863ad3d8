"""PEFT adapters under DeepSpeed (facts.adapter_dtypes): ZeRO-1/2 with a 16-bit config cast them
to that dtype with an fp32 master partition; ZeRO-3 on a ``zero.Init`` model keeps PEFT's fp32
adapters, with an fp32 master clone; every other engine keeps PEFT's fp32 and no master. An
``adapter_dtype`` DeepSpeed would cast is refused (exit 2). The real runs behind this are the
``deepspeed ... lora`` cases of validation/dist_nproc{2,4}.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memplan import Category, Recipe, estimate
from memplan.breakdown import Phase
from memplan.cli import app
from memplan.errors import ConfigError
from memplan.facts import dtypes

LLAMA = "meta-llama/Llama-3.1-8B"
ROOT = Path(__file__).resolve().parents[1]


def _lora(**kw) -> Recipe:
    return Recipe.of(method="lora", lora_rank=16, seq_len=512, gpus=4, **kw)


@pytest.mark.parametrize("kw,adapter,master", [
    ({"engine": "deepspeed", "zero": 1}, "bf16", True),
    ({"engine": "deepspeed", "zero": 2}, "bf16", True),
    ({"zero": 2}, "bf16", True),  # engine=auto with zero >= 1 is DeepSpeed
    ({"engine": "deepspeed", "zero": 2, "precision": "16-mixed"}, "fp16", True),
    ({"engine": "deepspeed", "zero": 3}, "fp32", True),  # zero.Init: no cast
    ({"engine": "deepspeed", "zero": 3, "zero3_init": False}, "bf16", True),  # own loop: cast
    ({"engine": "deepspeed", "zero": 2, "precision": "32-true"}, "fp32", False),  # no cast
    ({"engine": "fsdp2", "zero": 3}, "fp32", False),
    ({"engine": "ddp", "zero": 0}, "fp32", False),
    ({"engine": "deepspeed", "zero": 0}, "bf16", True),  # FP16_Optimizer: cast, fp32 master
    ({"engine": "deepspeed", "zero": 0, "precision": "32-true"}, "fp32", False),
])
def test_adapter_dtype_and_master_follow_the_engine(kw, adapter, master):
    d = dtypes(_lora(**kw))
    assert (d.adapter, d.adapter_master) == (adapter, master)


def test_zero2_adapters_are_16_bit_with_an_fp32_master_partition(llama8b, h100):
    r = _lora(engine="deepspeed", zero=2)
    b = estimate(llama8b, r, h100)
    n = b.model.trainable_params
    items = {i.name: i.bytes for i in b.ranks[0].items}
    assert items["LoRA adapters (bf16, cast by DeepSpeed; adapter_dtype=auto)"] == 2 * n
    assert items["fp32 master of the adapters"] == pytest.approx(4 * n / 4, abs=4)
    assert items["adamw states"] == pytest.approx(8 * n / 4, abs=4)
    # the all-gather after the step covers the optimizer's 16-bit groups: the adapters only
    step = [i for m in b.ranks[0].moments if m.phase is Phase.OPTIMIZER for i in m.items
            if i.name == "ZeRO all-gather bucket"]
    assert step and {i.bytes for i in step} == {2 * n}


def test_zero3_adapters_stay_fp32_under_zero_init_with_a_master_clone(llama8b, h100):
    b = estimate(llama8b, _lora(engine="deepspeed", zero=3), h100)
    n = b.model.trainable_params
    items = {i.name: i.bytes for i in b.ranks[0].items}
    assert items["LoRA adapters (fp32, PEFT's, kept under zero.Init; adapter_dtype=auto)"] \
        == pytest.approx(4 * n / 4, abs=4)
    assert items["fp32 master of the adapters"] == pytest.approx(4 * n / 4, abs=4)


def test_zero3_without_zero_init_casts_the_adapters_and_loads_the_whole_model(llama8b, h100):
    own = estimate(llama8b, _lora(engine="deepspeed", zero=3, zero3_init=False), h100)
    names = [i.name for i in own.ranks[0].items]
    assert "LoRA adapters (bf16, cast by DeepSpeed; adapter_dtype=auto)" in names
    init = estimate(llama8b, _lora(engine="deepspeed", zero=3), h100)
    load = [max(m.allocated_bytes for m in b.ranks[0].moments if m.label.startswith("load"))
            for b in (own, init)]
    assert load[0] > load[1] + 14 * 2**30  # the whole bf16 model (8B: ~15 GiB) at once


def test_other_engines_keep_peft_fp32_adapters_without_a_master(llama8b, h100):
    b = estimate(llama8b, _lora(engine="fsdp2", zero=3), h100)
    names = [i.name for i in b.ranks[0].items]
    assert "LoRA adapters (fp32)" in names
    assert "fp32 master of the adapters" not in names


def test_zero2_activations_hold_no_fp32_adapter_input_copies(llama8b, h100):
    """Without autocast (DeepSpeed) PEFT casts each adapter's input to the adapter dtype
    (peft ``lora/layer.py`` ``_cast_input_dtype``): the bf16 adapters of ZeRO-2 read the bf16
    input itself, the fp32 adapters ZeRO-3 keeps under zero.Init save an fp32 copy of it. ZeRO-3
    with bf16 adapters (allowed: nothing casts them) saves what ZeRO-2 saves and the frozen
    linears' inputs, which its F.linear keeps (Ctx.linear_saves_input)."""
    def saved(zero: int, **kw) -> int:
        b = estimate(llama8b, _lora(engine="deepspeed", zero=zero, **kw), h100)
        return b.ranks[0].categories_at_peak()[Category.ACTIVATIONS]
    assert saved(2) < saved(3, adapter_dtype="bf16") < saved(3)


@pytest.mark.parametrize("kw", [{"adapter_dtype": "fp32", "zero": 2},
                                {"adapter_dtype": "fp16", "zero": 1, "engine": "deepspeed"}])
def test_an_adapter_dtype_deepspeed_would_cast_is_refused(llama8b, h100, kw):
    with pytest.raises(ConfigError, match=r"adapter_dtype=fp\d+ with engine=deepspeed.*casts "
                       r"every parameter.*Leave adapter_dtype unset \(auto: bf16"):
        estimate(llama8b, _lora(**kw), h100)


def test_the_dtype_deepspeed_holds_may_be_given(llama8b, h100):
    given = estimate(llama8b, _lora(adapter_dtype="bf16", zero=2), h100)
    auto = estimate(llama8b, _lora(zero=2), h100)
    assert given.ranks[0].peak_allocated_bytes == auto.ranks[0].peak_allocated_bytes


def test_cli_refuses_fp32_adapters_under_zero2_with_exit_2():
    r = CliRunner().invoke(app, ["estimate", LLAMA, "--method", "lora", "--zero", "2",
                                 "--gpus", "4", "--adapter-dtype", "fp32"])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "adapter_dtype=fp32 with engine=deepspeed, zero=2" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("n", [2, 4])
def test_committed_deepspeed_lora_runs_are_within_5_percent(n):
    """The measured side: validation/dist_nproc{n}.json (scripts/validate_dist.py --nproc n)."""
    data = json.loads((ROOT / "validation" / f"dist_nproc{n}.json").read_text())
    cases = {c["name"]: c for c in data["cases"] if "lora" in c["name"]
             and c["engine"] == "deepspeed"}
    assert len(cases) == 4  # ZeRO-0, ZeRO-2, ZeRO-3 with and without zero.Init
    for c in cases.values():
        for x in c["ranks"]:
            assert abs(x["estimate_error_pct"]) <= 5.0, (c["name"], x)
