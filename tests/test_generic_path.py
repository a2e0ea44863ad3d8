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
