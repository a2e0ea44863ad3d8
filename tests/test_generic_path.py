"""Issue #12 item 1: the generic path for families memplan has no analytic graph for."""

from __future__ import annotations

import builtins
import json

import pytest

from memplan.api import estimate_from_names
from memplan.errors import ConfigError, UnsupportedModel
from memplan.recipe import Recipe
from memplan.validate import _tiny

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_unknown_family_is_traced_and_says_so():
    r = Recipe.of(precision="32-true", micro_batch=2, seq_len=64, device="cpu")
    b = estimate_from_names(_tiny("opt"), r)
    assert b.source == "trace" and any("path: generic" in n for n in b.model.notes)
    assert b.worst.peak_allocated_bytes > 0


def test_generic_path_refuses_parallel_layouts_with_the_fix():
    r = Recipe.of(micro_batch=1, seq_len=64, gpus=2, tp=2)
    with pytest.raises(ConfigError, match="traces one rank"):
        estimate_from_names(_tiny("opt"), r)


def test_without_transformers_the_analytic_refusal_stands(monkeypatch):
    real = builtins.__import__

    def no_transformers(name, *a, **k):
        if name == "transformers":
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(UnsupportedModel, match="not supported yet"):
        estimate_from_names(_tiny("opt"), Recipe.of(device="cpu", seq_len=64))


def test_a_model_type_transformers_does_not_know_is_refused(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "no-such-family", "hidden_size": 8}))
    with pytest.raises(UnsupportedModel, match="no-such-family"):
        estimate_from_names(str(cfg), Recipe.of(device="cpu", seq_len=64))


def test_gpu_recipe_on_a_cpu_only_torch_is_traced_with_cpu_kernels_and_says_so():
    import torch

    if torch.backends.cuda.is_built():
        pytest.skip("this torch has CUDA: the generic path traces CUDA kernels")
    b = estimate_from_names(_tiny("opt"), Recipe.of(micro_batch=1, seq_len=64))
    assert any("CPU kernels" in n for n in b.model.notes)
    assert b.device.name.startswith("H100")


# ---- the one-layer shortcut (memplan.trace.repeat) -------------------------------------------

def _deep(tmp_path, family: str, layers: int = 9) -> str:
    """The validate tiny config of ``family`` with ``layers`` decoder layers."""
    from pathlib import Path

    from memplan.trace.repeat import layer_key

    cfg = json.loads(Path(_tiny(family)).read_text())
    key, _ = layer_key(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, key: layers}))
    return str(path)


@pytest.mark.parametrize("family", ["opt", "bloom"])
@pytest.mark.parametrize("recipe", [
    dict(precision="32-true", attention="eager"),
    dict(precision="bf16-mixed", checkpointing="full"),
    dict(precision="32-true", method="lora", lora_rank=8, lora_targets=("q", "v")),
], ids=["fp32-eager", "bf16-ckpt-full", "lora"])
def test_one_layer_shortcut_equals_the_whole_trace(tmp_path, family, recipe):
    """5 layers traced, the middle one repeated to 9: every moment of both steps holds the same
    bytes per module group and category as the trace of all 9 layers."""
    from memplan.generic import generic_estimate
    from memplan.hardware import cpu_device
    from memplan.trace.repeat import _canonical

    model = _deep(tmp_path, family)
    r = Recipe.of(micro_batch=2, seq_len=64, device="cpu", **recipe)
    short = generic_estimate(model, family, r, cpu_device(0))
    whole = generic_estimate(model, family, r, cpu_device(0), whole=True)
    assert any("checked byte for byte" in n for n in short.model.notes)
    assert any("whole model traced" in n for n in whole.model.notes)
    assert _canonical(short) == _canonical(whole)
    assert (short.model.params, short.model.trainable_params, short.model.layers) == (
        whole.model.params, whole.model.trainable_params, 9)


def test_a_shortcut_that_fails_its_check_traces_the_whole_model(tmp_path, monkeypatch):
    from memplan.generic import generic_estimate
    from memplan.hardware import cpu_device
    from memplan.trace import repeat

    real = repeat.repeat_layers

    def off_by_one(b, stack, n):  # a rebuild that loses one byte of one moment
        got = real(b, stack, n)
        rank = got.ranks[0]
        m = rank.moments[-1]
        from dataclasses import replace

        items = (replace(m.items[0], bytes=m.items[0].bytes - 1),) + m.items[1:]
        return replace(got, ranks=(replace(rank, moments=rank.moments[:-1] + (
            replace(m, items=items),)),))

    monkeypatch.setattr(repeat, "repeat_layers", off_by_one)
    b = generic_estimate(_deep(tmp_path, "opt"), "opt",
                         Recipe.of(micro_batch=1, seq_len=32, device="cpu"), cpu_device(0))
    assert any("failed its check" in n for n in b.model.notes)
    assert b.model.layers == 9


def test_shortcut_is_not_used_where_layers_differ():
    from memplan.model import catalog
    from memplan.trace.repeat import layer_key

    assert layer_key(catalog()["bigscience/mt0-xxl"].config()) is None  # encoder-decoder
    assert layer_key({"model_type": "opt", "num_hidden_layers": 3, "hidden_size": 8,
                      "layer_types": ["full_attention", "sliding_attention",
                                                        "full_attention"]}) is None
    assert layer_key(catalog()["bigscience/bloomz-7b1"].config()) == ("n_layer", 30)
