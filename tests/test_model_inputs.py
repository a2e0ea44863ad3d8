"""Every way to name a model: catalog id/alias, config.json, directory, HF cache, factory."""

from __future__ import annotations

import json

import pytest

from memplan import load_model
from memplan.errors import ModelConfigError, UnknownModel, UnsupportedModel
from memplan.model import catalog


def test_alias_and_case():
    assert load_model("gpt2").id == "openai-community/gpt2"
    assert load_model("META-LLAMA/llama-3.1-8b").num_params == 8_030_261_248


def test_local_config_file_and_dir(tmp_path):
    cfg = catalog()["Qwen/Qwen2.5-0.5B"].config()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    by_file = load_model(str(tmp_path / "config.json"))
    by_dir = load_model(str(tmp_path))
    assert by_file.num_params == by_dir.num_params == load_model("Qwen/Qwen2.5-0.5B").num_params


def test_malformed_config_names_file_and_line(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{\n  "model_type": "llama",\n  "hidden_size": ,\n}')
    with pytest.raises(ModelConfigError, match=r"config.json:3:\d+: malformed JSON"):
        load_model(str(f))


def test_missing_key_is_named(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ModelConfigError, match="expected key 'vocab_size' for model_type 'llama'"):
        load_model(str(f))


def test_unsupported_architecture_lists_supported(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "mamba2"}))
    with pytest.raises(UnsupportedModel, match="Supported: .*llama") as e:
        load_model(str(f))
    assert "module:function" in str(e.value)


def test_hf_cache_is_read_offline(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    cfg = dict(catalog()["meta-llama/Llama-3.2-1B"].config())
    (snap / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert load_model("acme/tiny-llama").num_params == load_model("meta-llama/Llama-3.2-1B").num_params


def test_offline_unknown_hub_id_explains_how_to_supply(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UnknownModel, match="config.json") as e:
        load_model("acme/not-cached")
    assert "huggingface-cli download" in str(e.value)


def test_module_factory_on_meta_device(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    (tmp_path / "mymodels.py").write_text(
        "import torch.nn as nn\n"
        "class Block(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.q_proj = nn.Linear(64, 64, bias=False)\n"
        "        self.up_proj = nn.Linear(64, 256)\n"
        "        self.norm = nn.LayerNorm(64)\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.embed = nn.Embedding(1000, 64)\n"
        "        self.layers = nn.ModuleList([Block() for _ in range(3)])\n"
        "        self.lm_head = nn.Linear(64, 1000, bias=False)\n"
        "def build():\n"
        "    return Net()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = load_model("mymodels:build")
    want = 1000 * 64 + 3 * (64 * 64 + 64 * 256 + 256 + 128) + 64 * 1000
    assert spec.num_params == want and spec.num_layers == 3
    assert spec.available_targets() == {"q", "up"}
    with pytest.raises(ModelConfigError, match="did you mean|Did you mean"):
        load_model("mymodels:biuld")
    del torch


def test_omitted_keys_get_transformers_class_defaults():
    """A minimal Gemma 2 config.json (as the validate suite ships) omits the softcaps and the
    layer types; transformers fills them in when it builds the model, so memplan must too.
    The expected values are transformers 5.23's Gemma2Config / Qwen2Config defaults."""
    from memplan.model.hf import with_class_defaults

    gemma = with_class_defaults({"model_type": "gemma2", "num_hidden_layers": 3})
    assert gemma["attn_logit_softcapping"] == 50.0
    assert gemma["final_logit_softcapping"] == 30.0
    assert gemma["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    # an explicit value, null included, is kept as the file says
    off = with_class_defaults({"model_type": "gemma2", "num_hidden_layers": 2,
                               "attn_logit_softcapping": None})
    assert off["attn_logit_softcapping"] is None
    qwen = with_class_defaults({"model_type": "qwen2", "num_hidden_layers": 4,
                                "use_sliding_window": True, "sliding_window": 64,
                                "max_window_layers": 2})
    assert qwen["layer_types"] == ["full_attention"] * 2 + ["sliding_attention"] * 2
    assert with_class_defaults({"model_type": "gpt2", "n_layer": 2})["attn_pdrop"] == 0.1


def test_freeze_trains_only_the_last_layers():
    """method=freeze (LLaMA-Factory's freeze tuning): the last freeze_trainable_layers blocks
    train; embedding, final norm and head stay frozen (no freeze_extra_modules)."""
    from memplan import Recipe
    from memplan.estimate.layout import layout

    spec = load_model("meta-llama/Llama-3.2-1B")
    held = layout(spec, Recipe.of(method="freeze", freeze_trainable_layers=2))[0].held
    trained = sum(h.numel for h in held if h.trainable)
    assert trained == sum(t.numel for ly in spec.layers[-2:] for t in ly.tensors)
