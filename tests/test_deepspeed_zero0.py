"""DeepSpeed at ZeRO stage 0 with a 16-bit config (Recipe.deepspeed_16bit): the module cast to
16 bits, FP16_Optimizer with an unsharded fp32 master built at init, the gradients flattened
for the all-reduce at the backward's end only, and the step's fp32 flat gradient; settings
DeepSpeed overrides or refuses are refused (exit 2). The real runs behind this are the
``deepspeed zero0`` cases of validation/dist_nproc{2,4}.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memplan import Recipe, estimate
from memplan.breakdown import Phase, Step
from memplan.cli import app
from memplan.errors import ConfigError
from memplan.facts import dtypes

ROOT = Path(__file__).resolve().parents[1]
LLAMA = "meta-llama/Llama-3.1-8B"


def _ds0(**kw) -> Recipe:
    return Recipe.of(engine="deepspeed", zero=0, gpus=4, seq_len=512, **kw)


@pytest.mark.parametrize("precision,param,master", [
    ("bf16-mixed", "bf16", "fp32"), ("16-mixed", "fp16", "fp32"), ("32-true", "fp32", None)])
def test_zero0_keeps_a_16_bit_model_beside_an_fp32_master(precision, param, master):
    d = dtypes(_ds0(precision=precision))
    assert (d.param, d.grad, d.master) == (param, param, master)
    assert dtypes(Recipe.of(engine="ddp", zero=0, precision=precision)).master is None


def test_zero0_full_states_are_whole_on_every_rank(llama8b, h100):
    b = estimate(llama8b, _ds0(), h100)
    n = b.model.trainable_params
    items = {i.name: i.bytes for i in b.ranks[0].items}
    assert items["trainable parameters (bf16)"] == 2 * n
    assert items["fp32 master weights"] == 4 * n
    assert items["adamw states"] == 8 * n
    assert "DDP gradient buckets" not in items
    assert any("0.17.6" in note for note in b.model.notes)


def test_zero0_step_flattens_fp32_gradient_copies(llama8b, h100):
    b = estimate(llama8b, _ds0(), h100)
    n = b.model.trainable_params
    step = {i.name: i.bytes for m in b.ranks[0].moments if m.phase is Phase.OPTIMIZER
            for i in m.items}
    assert step["fp32 flat gradients (optimizer step)"] == 4 * n
    assert step["fp32 copies of the 16-bit gradients (flatten input)"] == 4 * n


def test_zero0_all_reduce_bucket_only_at_the_backwards_end(llama8b, h100):
    b = estimate(llama8b, _ds0(method="lora", lora_rank=16), h100)
    for step in (Step.FIRST, Step.STEADY):
        backward = [m for m in b.ranks[0].moments if m.phase is Phase.BACKWARD
                    and m.step is step]
        holds = ["DeepSpeed all-reduce bucket (ZeRO-0)" in {i.name for i in m.items}
                 for m in backward]
        assert len(backward) > 2 and holds[-1] and not any(holds[:-1])


def test_zero0_lora_adapters_are_cast_with_an_unsharded_master(llama8b, h100):
    b = estimate(llama8b, _ds0(method="lora", lora_rank=16), h100)
    n = b.model.trainable_params
    items = {i.name: i.bytes for i in b.ranks[0].items}
    assert items["LoRA adapters (bf16, cast by DeepSpeed; adapter_dtype=auto)"] == 2 * n
    assert items["fp32 master of the adapters"] == 4 * n


@pytest.mark.parametrize("kw,needle", [
    ({"method": "lora", "adapter_dtype": "fp32"}, r"adapter_dtype=fp32 with engine=deepspeed"),
    ({"grad_dtype": "fp32"}, r"grad_dtype=fp32 with engine=deepspeed, zero=0.*unsupported mix"),
    ({"method": "lora", "frozen_dtype": "fp32"}, r"frozen_dtype=fp32 cannot hold"),
])
def test_settings_deepspeed_overrides_at_zero0_are_refused(llama8b, h100, kw, needle):
    with pytest.raises(ConfigError, match=needle):
        estimate(llama8b, _ds0(**kw), h100)


def test_cli_refuses_fp32_adapters_under_zero0_with_exit_2():
    r = CliRunner().invoke(app, ["estimate", LLAMA, "--method", "lora", "--engine", "deepspeed",
                                 "--zero", "0", "--adapter-dtype", "fp32"])
    assert r.exit_code == 2, r.output
    assert "adapter_dtype=fp32 with engine=deepspeed, zero=0" in " ".join(r.output.split())
    assert "Traceback" not in r.output


@pytest.mark.parametrize("n", [2, 4])
def test_committed_zero0_runs_are_within_5_percent(n):
    """The measured side: validation/dist_nproc{n}.json (scripts/validate_dist.py --nproc n
    --only 'deepspeed zero0 bf16' --only 'deepspeed zero0 lora bf16')."""
    data = json.loads((ROOT / "validation" / f"dist_nproc{n}.json").read_text())
    cases = [c for c in data["cases"] if c["name"].startswith("deepspeed zero0")]
    assert len(cases) == 2
    for c in cases:
        assert any("FP16_Optimizer" in o for o in c["overrides"])
        for x in c["ranks"]:
            assert abs(x["estimate_error_pct"]) <= 5.0, (c["name"], x)


def test_zero0_init_flattens_clones_of_the_trainable_parameters(llama8b, h100):
    b = estimate(llama8b, _ds0(), h100)
    n = b.model.trainable_params
    load = [i for m in b.ranks[0].moments if m.label.endswith("largest transient")
            for i in m.items if i.name.startswith("largest load transient")]
    assert [i.bytes for i in load] == [2 * 2 * n]  # clones + their flat copy, bf16
