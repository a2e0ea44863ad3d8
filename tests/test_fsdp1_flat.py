"""FSDP1 flat gradients (issue #11 item 1): a unit mixing frozen and trainable parameters gets a
gradient of the whole unit (estimate/fsdp1_flat.py, from torch 2.13 _flat_param.py), checked
against validation/fsdp1_flat_grad.json (scripts/measure_fsdp1_flat_grad.py: a real FSDP1 run,
2 ranks, gloo, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memplan.breakdown import Category, Step
from memplan.estimate import estimate
from memplan.estimate.fsdp1_flat import flat_grad_holds, mixes_frozen
from memplan.estimate.layout import layout
from memplan.hardware import cpu_device
from memplan.model import load_model
from memplan.recipe import Recipe
from memplan.units import GIB

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "src/memplan/validate/tiny/llama.json"
MEASURED = json.loads((ROOT / "validation/fsdp1_flat_grad.json").read_text())


def _recipe(engine: str, method: str, gpus: int = 2) -> Recipe:
    return Recipe.from_dict({**MEASURED["recipe"], "engine": engine, "zero": 3, "gpus": gpus,
                             "device": "cpu", "method": method})


def _flat_grad_bytes(engine: str, method: str, gpus: int = 2) -> int:
    """Per-rank sharded flat-gradient bytes (fp32) by ``flat_grad_holds``."""
    r = _recipe(engine, method, gpus)
    stage = layout(load_model(str(TINY)), r)[0]
    return sum(h.numel for h in flat_grad_holds(stage, r)) * 4 // gpus


def _grad_bytes(engine: str, method: str, gpus: int = 2) -> int:
    """The estimate's gradient bytes at the optimizer step."""
    w = estimate(load_model(str(TINY)), _recipe(engine, method, gpus), cpu_device(16 * GIB)).worst
    m = next(m for m in w.moments if m.step == Step.STEADY and m.label == "optimizer-step")
    return sum(i.bytes for i in m.items if i.category == Category.GRADIENTS)


def test_lora_flat_gradient_matches_the_fsdp1_run():
    """Sharded gradient bytes per rank: the measured flat gradients (fp32) of every unit."""
    measured = sum(4 * (u["sharded_grad_numel"] or 0) for u in MEASURED["units"])
    assert MEASURED["world_size"] == 2 and measured == 721_920
    assert _flat_grad_bytes("fsdp1", "lora") == measured


def test_the_flat_gradient_covers_the_frozen_part():
    """FSDP1's flat gradient is the whole layer, 5.5x the adapters' gradients here; the
    all-frozen root unit (embedding, norm, lm_head) has none."""
    lora_only = 4 * MEASURED["trainable_numel"] // 2
    assert _flat_grad_bytes("fsdp2", "lora") == lora_only
    assert _flat_grad_bytes("fsdp1", "lora") > 5 * lora_only
    root = MEASURED["units"][0]
    assert not root["flat_requires_grad"] and root["sharded_grad_numel"] is None
    r = _recipe("fsdp1", "lora")
    assert mixes_frozen(layout(load_model(str(TINY)), r)[0], r)


def test_the_estimate_does_not_apply_it_yet():
    """Not wired into ``estimate``: whether adapters share a unit with the frozen base depends
    on the wrap policy (torchtune's lora_fsdp_wrap_policy and PEFT's fsdp_auto_wrap_policy wrap
    them apart), which no recipe field says yet. Applied to every FSDP1 LoRA row it moved the
    published GT140 (PEFT docs QLoRA + FSDP, use_orig_params false) from -18.7% to +21.8%."""
    assert _grad_bytes("fsdp1", "lora") == _grad_bytes("fsdp2", "lora") == \
        4 * MEASURED["trainable_numel"] // 2


@pytest.mark.parametrize("gpus", [2, 4])
def test_full_fine_tuning_is_unchanged(gpus):
    """Every unit trainable: the flat gradient is the trainable parameters."""
    assert _flat_grad_bytes("fsdp1", "full", gpus) == _grad_bytes("fsdp2", "full", gpus)
