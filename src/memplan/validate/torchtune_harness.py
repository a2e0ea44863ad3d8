"""``validate``'s ``torchtune`` harness: a case run by torchtune's own model builders, loss and
the training step of its single-device recipes, measured with PyTorch's MemTracker.

Reproduced from torchtune 0.6.1 (the PyPI wheel, whose ``recipes/`` it ships):

- the model: ``torchtune.models.{llama3,qwen2}._component_builders.{llama3,qwen2}`` (or
  ``lora_llama3``/``lora_qwen2``) sized from the case's tiny HF config, built under
  ``training.set_default_dtype(dtype)`` as ``_setup_model`` does (``dtype: bf16`` or ``fp32``;
  torchtune's single-device recipes have no autocast and refuse fp16); LoRA adapters are made
  trainable with ``set_trainable_params(model, get_adapter_params(model))``;
- activation checkpointing: ``training.set_activation_checkpointing(model,
  auto_wrap_policy={modules.TransformerSelfAttentionLayer})``;
- the loss: ``CEWithChunkedOutputLoss`` with ``model.set_num_output_chunks(8)`` (every
  shipped config) for ``loss = "chunked"``, else ``torch.nn.CrossEntropyLoss``;
- the optimizer: ``torch.optim.AdamW(model.parameters(), fused=True, weight_decay=0.01)``, as
  the ``*_lora_single_device.yaml`` configs (the full single-device configs default to
  bitsandbytes ``PagedAdamW8bit`` with ``optimizer_in_bwd``, which needs CUDA);
- the step: ``recipes/{full,lora}_finetune_single_device.py`` ``_loss_step`` and ``train``:
  labels shifted with ``hstack`` onto the ignore-index column, the model's logits deleted
  before ``backward`` of ``loss * num_tokens``, ``training.scale_grads(model, 1 / num_tokens)``,
  ``step``, ``zero_grad(set_to_none=True)``.

Left out: the tokenizer, data set and checkpointer (random token ids, random init), the LR
scheduler (no tensors), ``optimizer_in_bwd``, activation offloading, ``compile``.

The run happens in a child interpreter: torchtune 0.6.1 imports ``torchao`` APIs that torchao
0.16 removed (``int4_weight_only``), while PEFT 0.21 refuses any torchao older than 0.16 once it
can find one. torchtune and its torchao therefore live in their own folder
(``$MEMPLAN_TORCHTUNE_PATH``, else ``<venv>/torchtune-site``, where ``.ci/run`` installs them with
``pip install --no-deps --target``), put on the child's ``sys.path`` only.

Known limitations: llama and qwen2 configs only (the families with a torchtune builder among
the tiny configs); ``bf16-true`` and ``32-true``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..recipe import Recipe

__all__ = ["TORCHTUNE_VERSION", "measure_torchtune", "torchtune_path"]

TORCHTUNE_VERSION = "0.6.1"
"""The torchtune release whose recipes this harness follows."""

_TARGETS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "output_proj"}
"""memplan's LoRA target letters -> torchtune's ``lora_attn_modules`` names."""


def _check(cfg: dict[str, Any], k: dict[str, Any]) -> None:
    problems = []
    if cfg.get("model_type") not in ("llama", "qwen2"):
        problems.append(f"harness=torchtune builds llama and qwen2 only, not "
                        f"model_type={cfg.get('model_type')!r}.")
    if k["precision"] not in ("bf16-true", "32-true"):
        problems.append(f"harness=torchtune: precision={k['precision']!r}; torchtune's "
                        "single-device recipes train in dtype bf16 or fp32 (bf16-true, 32-true).")
    if k["method"] not in ("full", "lora"):
        problems.append(f"harness=torchtune: method={k['method']!r}; use full or lora.")
    mlp = {"gate", "up", "down"} & set(k["lora_targets"])
    if k["method"] == "lora" and mlp and mlp != {"gate", "up", "down"}:
        problems.append("harness=torchtune: apply_lora_to_mlp adapts gate, up and down together; "
                        "name all three in lora_targets or none.")
    if k["attention"] != "sdpa" or k["optimizer"] != "adamw":
        problems.append("harness=torchtune: attention=sdpa and optimizer=adamw are what its "
                        "recipes run (MultiHeadAttention calls scaled_dot_product_attention).")
    if problems:
        raise ConfigError(problems)


def _build(cfg: dict[str, Any], k: dict[str, Any]) -> Any:
    from torchtune.models.llama3._component_builders import llama3, lora_llama3
    from torchtune.models.qwen2._component_builders import lora_qwen2, qwen2

    qwen = cfg["model_type"] == "qwen2"
    sizes = dict(vocab_size=cfg["vocab_size"], num_layers=cfg["num_hidden_layers"],
                 num_heads=cfg["num_attention_heads"],
                 num_kv_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                 embed_dim=cfg["hidden_size"], intermediate_dim=cfg["intermediate_size"],
                 max_seq_len=max(cfg.get("max_position_embeddings", 0), k["seq_len"]))
    if qwen:
        sizes["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    if k["method"] == "full":
        return (qwen2 if qwen else llama3)(**sizes)
    targets = [_TARGETS[t] for t in k["lora_targets"] if t in _TARGETS]
    return (lora_qwen2 if qwen else lora_llama3)(
        targets, apply_lora_to_mlp="gate" in k["lora_targets"], apply_lora_to_output=False,
        lora_rank=k["lora_rank"], lora_alpha=float(k["lora_alpha"]),
        lora_dropout=float(k["lora_dropout"]), **sizes)


_INSTALL = (f"pip install --no-deps --target <venv>/torchtune-site torchtune=={TORCHTUNE_VERSION} "
            "torchao==0.11.0 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 sentencepiece==0.2.3 "
            "tiktoken==0.14.0 blobfile==3.3.0")


def torchtune_path() -> str | None:
    """The folder that holds torchtune for the child (``''``: torchtune is importable as
    installed), or None where there is none."""
    import importlib.util

    for where in (os.environ.get("MEMPLAN_TORCHTUNE_PATH", ""),
                  str(Path(sys.prefix) / "torchtune-site")):
        if where and (Path(where) / "torchtune").is_dir():
            return where
    return "" if importlib.util.find_spec("torchtune") is not None else None


def measure_torchtune(config_path: str, recipe: Recipe, steps: int) -> int:
    """Peak live tensor bytes of ``steps`` torchtune single-device recipe steps of ``recipe`` on
    the model of ``config_path``, run in a child interpreter that sees ``torchtune_path()``."""
    with open(config_path) as f:
        _check(json.load(f), recipe.to_dict())
    where = torchtune_path()
    if where is None:
        raise ConfigError([f"harness=torchtune needs torchtune {TORCHTUNE_VERSION}; install it "
                           f"with {_INSTALL} (or set MEMPLAN_TORCHTUNE_PATH to that folder)."])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (*sys.path, where) if p)  # the parent's memplan and packages, then torchtune's
    run = subprocess.run(
        [sys.executable, "-m", __name__, config_path, json.dumps(recipe.to_dict()), str(steps)],
        env=env, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"the torchtune run failed: {run.stderr.strip()[-2000:]}")
    return int(run.stdout.strip().splitlines()[-1])


def _measure(config_path: str, recipe: Recipe, steps: int) -> int:
    """The run itself (in the child)."""
    from .harnesses import _peak, _tracker

    try:
        import torch
        from torchtune import modules, training
        from torchtune.modules.loss import CEWithChunkedOutputLoss
        from torchtune.modules.peft import get_adapter_params, set_trainable_params
    except ImportError as e:
        raise ConfigError([f"harness=torchtune needs torchtune {TORCHTUNE_VERSION} ({e}); "
                           f"install it with pip install --no-deps torchtune=={TORCHTUNE_VERSION}"
                           " torchao==0.11.0 omegaconf sentencepiece tiktoken blobfile."]) from None
    with open(config_path) as f:
        cfg = json.load(f)
    k = recipe.to_dict()
    _check(cfg, k)
    torch.manual_seed(0)
    with training.set_default_dtype(torch.bfloat16 if k["precision"] == "bf16-true"
                                    else torch.float32):
        model = _build(cfg, k)
    if k["method"] == "lora":
        set_trainable_params(model, get_adapter_params(model))
    if k["checkpointing"] == "full":
        training.set_activation_checkpointing(
            model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    ignore = -100
    if k["loss"] == "chunked":
        loss_fn = CEWithChunkedOutputLoss(ignore_index=ignore)
        model.set_num_output_chunks(loss_fn.num_output_chunks)
    else:
        loss_fn = torch.nn.CrossEntropyLoss(ignore_index=ignore)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=True)
    b, s = k["micro_batch"], k["seq_len"]
    ignore_labels_cache = torch.full((b, 1), ignore)
    torch.manual_seed(1)
    tokens = torch.randint(0, cfg["vocab_size"], (b, s))
    model.train()
    mt = _tracker(model, opt)
    with mt, warnings.catch_warnings():
        # torchtune's RMSNorm passes an fp32 input with a bf16 weight to F.rms_norm, which warns
        # that it takes the composite (unfused) path: that path is what the run measures
        warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
        opt.zero_grad()
        for _ in range(steps):
            mt.reset_mod_stats()
            batch = {"tokens": tokens.clone(), "labels": tokens.clone()}
            num_tokens = (batch["labels"] != ignore).sum()
            # recipes/*_single_device.py _loss_step
            labels = batch.pop("labels")
            logits = model(**batch)
            labels = torch.hstack((labels[..., 1:], ignore_labels_cache[: labels.shape[0]]))
            if not isinstance(logits, list):
                labels = labels.reshape(-1)
                logits = logits.reshape(-1, logits.size(-1))
            loss = loss_fn(logits, labels)
            del logits
            # train(): gradient_accumulation_steps = 1
            current_loss = loss * num_tokens
            del loss
            current_loss.backward()
            training.scale_grads(model, 1 / num_tokens)
            opt.step()
            opt.zero_grad(set_to_none=True)
            del current_loss
    return _peak(mt)


if __name__ == "__main__":  # the child: config path, recipe JSON, steps -> the peak on stdout
    import contextlib

    _cfg, _recipe, _steps = sys.argv[1:4]
    with contextlib.redirect_stdout(sys.stderr):
        _peak_bytes = _measure(_cfg, Recipe.from_dict(json.loads(_recipe)), int(_steps))
    print(_peak_bytes)
