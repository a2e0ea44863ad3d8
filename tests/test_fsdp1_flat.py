"""FSDP1 flat gradients (issue #11 item 1): a unit mixing frozen and trainable parameters gets a
gradient of the whole unit (estimate/fsdp1_flat.py, from torch 2.13 _flat_param.py), checked
against validation/fsdp1_flat_grad.json (scripts/measure_fsdp1_flat_grad.py: a real FSDP1 run,
2 ranks, gloo, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memplan.breakdown import Category, Step
from memplan.errors import ConfigError
from memplan.estimate import estimate
from memplan.export import export, get_target
from memplan.estimate.fsdp1_flat import flat_grad_holds, mixes_frozen
from memplan.estimate.layout import layout
from memplan.hardware import cpu_device
from memplan.model import load_model
from memplan.recipe import Recipe
from memplan.units import GIB

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "src/memplan/validate/tiny/llama.json"
MEASURED = json.loads((ROOT / "validation/fsdp1_flat_grad.json").read_text())


def _recipe(engine: str, method: str, gpus: int = 2, wrap: str = "layers") -> Recipe:
    return Recipe.from_dict({**MEASURED["recipe"], "engine": engine, "zero": 3, "gpus": gpus,
                             "device": "cpu", "method": method, "fsdp1_wrap": wrap})


def _flat_grad_bytes(engine: str, method: str, gpus: int = 2, wrap: str = "layers") -> int:
    """Per-rank sharded flat-gradient bytes (fp32) by ``flat_grad_holds``."""
    r = _recipe(engine, method, gpus, wrap)
    stage = layout(load_model(str(TINY)), r)[0]
    return sum(h.numel for h in flat_grad_holds(stage, r)) * 4 // gpus


def _grad_bytes(engine: str, method: str, gpus: int = 2, wrap: str = "layers") -> int:
    """The estimate's gradient bytes at the optimizer step."""
    w = estimate(load_model(str(TINY)), _recipe(engine, method, gpus, wrap),
                 cpu_device(16 * GIB)).worst
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


def test_the_estimate_applies_it_under_the_layers_policy():
    """fsdp1_wrap=layers (the measured run's transformer_auto_wrap_policy): the estimate's
    gradients are the measured flat gradients; fsdp1_wrap=peft (PEFT's fsdp_auto_wrap_policy,
    LoRA leaves in units of their own): the adapters' gradients only, as FSDP2's."""
    measured = sum(4 * (u["sharded_grad_numel"] or 0) for u in MEASURED["units"])
    assert _grad_bytes("fsdp1", "lora") == measured
    assert _grad_bytes("fsdp1", "lora", wrap="peft") == _grad_bytes("fsdp2", "lora") == \
        4 * MEASURED["trainable_numel"] // 2


@pytest.mark.parametrize(("method", "mixed"), [("lora", False), ("dora", False),
                                               ("ln-tuning", False), ("prompt-tuning", False),
                                               ("ia3", True), ("vera", True),
                                               ("full", False)])
def test_which_methods_mix_under_the_peft_policy(method, mixed):
    """PEFT's lambda_policy_fn wraps leaf modules with a trainable ``weight`` apart; IA3/VeRA
    vectors (ParameterDict entries of the adapted layer) stay in the layer. (BitFit too, but
    the tiny Llama has no bias to train.)"""
    r = _recipe("fsdp1", method, wrap="peft")
    assert mixes_frozen(layout(load_model(str(TINY)), r)[0], r) is mixed


@pytest.mark.parametrize("gpus", [2, 4])
def test_full_fine_tuning_is_unchanged(gpus):
    """Every unit trainable: the flat gradient is the trainable parameters."""
    assert _flat_grad_bytes("fsdp1", "full", gpus) == _grad_bytes("fsdp2", "full", gpus)


@pytest.mark.parametrize(("keys", "fix"), [
    ({"method": "lora", "fsdp1_wrap": "layers"}, "or fsdp1_wrap=peft"),
    ({"method": "ia3", "fsdp1_wrap": "peft"}, "Set use_orig_params=true."),
])
def test_use_orig_params_false_refuses_mixed_units(keys, fix):
    """torch refuses a flat parameter of mixed requires_grad without use_orig_params."""
    with pytest.raises(ConfigError, match="uniform requires_grad") as e:
        Recipe.from_dict({"engine": "fsdp1", "zero": 3, "gpus": 2, "use_orig_params": False,
                          **keys})
    assert fix in str(e.value)


@pytest.mark.parametrize("keys", [{"method": "lora"}, {"method": "full", "fsdp1_wrap": "layers"},
                                  {"method": "lora", "engine": "fsdp2"}])
def test_use_orig_params_false_runs_uniform_units(keys):
    Recipe.from_dict({"engine": "fsdp1", "zero": 3, "gpus": 2, "use_orig_params": False, **keys})


def test_bad_wrap_policy_names_the_choices():
    with pytest.raises(ConfigError, match="fsdp1_wrap='layer' is not one of peft, layers"):
        Recipe.from_dict({"engine": "fsdp1", "zero": 3, "gpus": 2, "fsdp1_wrap": "layer"})


@pytest.mark.parametrize("target", ["accelerate", "hf-trainer", "lightning"])
@pytest.mark.parametrize("orig", [True, False])
def test_use_orig_params_is_exported_and_read_back(target, orig):
    """Each FSDP1 config carries use_orig_params (accelerate ``fsdp_use_orig_params``, the HF
    Trainer's ``fsdp_config.use_orig_params``, Lightning's ``FSDPStrategy`` keyword)."""
    r = Recipe.from_dict({"engine": "fsdp1", "zero": 3, "gpus": 8, "use_orig_params": orig})
    done = export(r, target)
    assert "use_orig_params" in done.text and "use_orig_params" not in done.not_carried


@pytest.mark.parametrize("target", ["accelerate", "hf-trainer", "lightning"])
def test_the_layers_policy_is_reported_as_not_carried(target):
    """No FSDP1 config file names PEFT's or the plain transformer policy apart: the HF Trainer
    swaps in PEFT's for a PEFT model, accelerate's YAML says TRANSFORMER_BASED_WRAP either way,
    so fsdp1_wrap=layers is listed as not carried (memplan export says so on stderr)."""
    r = Recipe.from_dict({"engine": "fsdp1", "zero": 3, "gpus": 8, "method": "lora",
                          "fsdp1_wrap": "layers"})
    assert export(r, target).not_carried.get("fsdp1_wrap") == "layers"
    assert "fsdp1_wrap" not in export(r.with_keys(fsdp1_wrap="peft"), target).not_carried


def test_accelerate_import_says_what_it_assumed():
    text = export(Recipe.from_dict({"engine": "fsdp1", "zero": 3, "gpus": 8}), "accelerate").text
    imp = get_target("accelerate").read(text.replace("  fsdp_use_orig_params: true\n", ""), "x")
    assert "use_orig_params" not in imp.keys
    assert any("accelerate 1.15 defaults to false" in r for r in imp.resolved)
    assert any("--fsdp1-wrap layers" in r for r in imp.resolved)


@pytest.mark.parametrize("target", ["accelerate", "hf-trainer"])
@pytest.mark.parametrize("prefetch", ["none", "backward_pre", "backward_post"])
def test_backward_prefetch_is_exported_and_read_back(target, prefetch):
    """accelerate ``fsdp_backward_prefetch`` (NO_PREFETCH/BACKWARD_PRE/BACKWARD_POST), the HF
    Trainer's ``fsdp_config.backward_prefetch``."""
    r = Recipe.from_dict({"engine": "fsdp1", "zero": 3, "gpus": 8,
                          "fsdp1_backward_prefetch": prefetch})
    done = export(r, target)
    assert "fsdp1_backward_prefetch" not in done.not_carried
    assert get_target(target).read(done.text, "x").keys["fsdp1_backward_prefetch"] == prefetch


def test_backward_pre_gathers_one_more_block_in_the_backward():
    """BACKWARD_PRE: the last block beside the root from the loss on (torch
    _get_handle_to_prefetch); measured +590,848 B = one fp32 block on the tiny Llama
    (validation/dist_nproc2.json, 'fsdp1 fp32' vs 'fsdp1 fp32 backward_pre')."""
    def peak(prefetch: str) -> int:
        r = _recipe("fsdp1", "full").with_keys(fsdp1_backward_prefetch=prefetch)
        return estimate(load_model(str(TINY)), r, cpu_device(16 * GIB)).worst \
            .peak_allocated_bytes

    block = 147_712 * 4  # one tiny-Llama layer, fp32, unsharded
    assert peak("backward_pre") - peak("none") == block
    assert peak("backward_post") == peak("none")


@pytest.mark.parametrize(("keys", "fix"), [
    ({"method": "lora", "fsdp1_wrap": "layers"}, "or fsdp1_wrap=peft"),
    ({"method": "ia3"}, "Set adapter_dtype=bf16 (or frozen_dtype to match)."),
])
def test_a_flat_parameter_holds_one_dtype(keys, fix):
    """bf16-mixed keeps an FSDP1 LoRA base in bf16 (frozen_dtype auto) and PEFT's adapters in
    fp32: torch refuses to flatten them into one unit; memplan says so, with the fixes."""
    r = Recipe.from_dict({"engine": "fsdp1", "zero": 3, "gpus": 2, "device": "cpu",
                          "precision": "bf16-mixed", **keys})
    with pytest.raises(ConfigError, match="uniform dtype") as e:
        estimate(load_model(str(TINY)), r, cpu_device(16 * GIB))
    assert fix in str(e.value)
    for ok in ({"adapter_dtype": "bf16"}, {"frozen_dtype": "fp32"}):
        estimate(load_model(str(TINY)), r.with_keys(**ok), cpu_device(16 * GIB))


def test_the_frozen_weights_gradient_gemms_are_executed_not_model_flops():
    """fsdp1_wrap=layers computes a gradient for every frozen layer weight: one more pass over
    the layers' matmuls in the executed FLOPs (time, HFU); model FLOPs (MFU) unchanged."""
    from memplan.timing.flops import token_flops

    model = load_model(str(TINY))
    peft, layers = (token_flops(model, _recipe("fsdp1", "lora", wrap=w)) for w in ("peft", "layers"))
    head = 2 * model.hidden_size * model.vocab_size
    assert layers.model == peft.model
    assert layers.executed - peft.executed == pytest.approx(peft.matmul_forward - head)
