"""Independent harnesses for ``validate``: a case run the way its users run it, measured with a
counter memplan does not share.

memplan's own harness (``memplan.measure.real.measure_recipe``) builds the workload from the
recipe with memplan's assumptions and counts bytes with memplan's storage tracker, which the
tracer shares. Agreement there cannot reveal an assumption that real frameworks do not make.
The harnesses here build the run with the framework's own API and defaults, and measure it with
PyTorch's ``torch.distributed._tools.mem_tracker.MemTracker`` (live tensor bytes by storage,
CPU included):

=============  ==========================================================================
harness        the run
=============  ==========================================================================
``plain``      a PyTorch loop: ``torch.optim.AdamW`` (its default implementation),
               ``torch.autocast`` for ``*-mixed``, ``gradient_checkpointing_enable()``;
               ``optimizer_in_backward``: torchtune's per-parameter hooks (``_InBackward``)
``accelerate`` ``Accelerator(cpu=True, mixed_precision=...)``, ``prepare``,
               ``accelerator.backward``
``trainer``    ``transformers.Trainer`` with ``TrainingArguments(use_cpu=True, ...)``: its default
               optimizer (``adamw_torch_fused``) and gradient clipping (``max_grad_norm=1``)
``peft``       the plain loop on ``get_peft_model(model, LoraConfig(r, target_modules))``
               (``lm_head`` in the targets: the named linears plus ``"lm_head"``),
               every other ``LoraConfig`` field at PEFT's default; the other PEFT methods
               with their own config (``runtime.peft_methods.peft_config``); LoRA-FA with
               ``peft.optimizers.create_lorafa_optimizer``
               (``plain`` and ``peft`` with ``loss = "chunked-head" | "chunked-ce"``: litgpt's
               loss and loop, ``_litgpt``)
``torchtune``  torchtune 0.6.1's builders, ``CEWithChunkedOutputLoss`` and the step of its
               single-device recipes (``torchtune_harness.py``)
=============  ==========================================================================

The model is built the way a user builds it: ``AutoModelForCausalLM.from_config`` (fp32
weights; ``.to(bfloat16)`` only for ``*-true`` 16-bit precisions). Where that differs from a
memplan assumption (for example a PEFT base left in fp32 under autocast, where memplan's
``-mixed`` stores frozen weights in 16 bits), the case's ``note`` in ``cases.toml`` says so.

Known limitations: CPU only (MemTracker counts tensors, not the CUDA allocator's blocks);
two steps; MemTracker reports the peak of live tensor bytes, which on CPU is what
memplan's ``peak_allocated_bytes`` predicts.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import warnings
from typing import Any

from ..errors import ConfigError
from ..model.spec import LORA_HEAD, LORA_TARGETS
from ..recipe import Recipe

__all__ = ["HARNESSES", "FRAMEWORK_HARNESSES", "measure_with_harness"]

HARNESSES = ("memplan", "trainer", "peft", "accelerate", "plain", "torchtune")
"""Values of a case's ``harness`` field (``memplan``: memplan's own measure and trace)."""
FRAMEWORK_HARNESSES = ("trainer", "peft", "accelerate", "plain", "torchtune")
"""The harnesses that run a framework (every one but ``memplan``)."""

_STEPS = 2


def _k(recipe: Recipe) -> dict[str, Any]:
    """The recipe's flat keys (plain values)."""
    return recipe.to_dict()


def _model(config_path: str, recipe: Recipe, base_dtype: str):
    import torch
    import transformers

    with open(config_path) as f:
        cfg = json.load(f)
    config = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="sdpa" if _k(recipe)["attention"] == "sdpa" else "eager")
    if _k(recipe)["precision"] in ("bf16-true", "16-true"):
        model.to(torch.bfloat16 if _k(recipe)["precision"] == "bf16-true" else torch.float16)
    elif base_dtype:  # the user loads the base in 16 bits (from_pretrained(torch_dtype=...))
        model.to({"bf16": torch.bfloat16, "fp16": torch.float16}[base_dtype])
    if _k(recipe)["checkpointing"] == "full":
        model.gradient_checkpointing_enable()
    model.train()
    return model


def _autocast(recipe: Recipe):
    import contextlib

    import torch

    if _k(recipe)["precision"] in ("bf16-mixed", "16-mixed"):
        dtype = torch.bfloat16 if _k(recipe)["precision"] == "bf16-mixed" else torch.float16
        return torch.autocast("cpu", dtype=dtype)
    return contextlib.nullcontext()


def _batch(recipe: Recipe, vocab: int):
    import torch

    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (_k(recipe)["micro_batch"], _k(recipe)["seq_len"]))
    return {"input_ids": ids, "labels": ids.clone()}


def _peak(tracker: Any) -> int:
    snap = tracker.get_tracker_snapshot("peak")
    return int(sum(dev["Total"] for dev in snap.values()))


class _NoHook:
    """Stands in for a hook handle (``remove()`` does nothing)."""

    def remove(self) -> None:
        return None


def _tracker(model: Any, *external: Any) -> Any:
    """A MemTracker that knows the model and optimizer. MemTracker installs a gradient hook on
    every parameter a module forward touches, and ``register_hook`` refuses a frozen parameter
    (LoRA, freeze tuning). A frozen parameter never has a gradient, so we mark it as hooked:
    the bytes counted do not change."""
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    for p in model.parameters():
        if not p.requires_grad:
            mt._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
    mt.track_external(model, *external)
    return mt


def _litgpt(model: Any, kind: str) -> Any:
    """litgpt's forward and loss on a transformers model (``estimate/activations/litgpt_loss.py``
    cites the source), as a module whose ``forward(batch)`` returns ``(logits, loss)``: the
    decoder's last hidden state, ``lm_head`` on 128-token chunks (``chunked-head``) or whole
    (``chunked-ce``), then ``litgpt.utils.chunked_cross_entropy``. A module, so MemTracker sees
    the head's calls inside one root call (it refuses a root module called twice per step)."""
    import torch
    import torch.nn.functional as F

    class Litgpt(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, batch: dict[str, Any]) -> tuple[Any, Any]:
            base = model.get_base_model() if hasattr(model, "get_base_model") else model
            ids, targets = batch["input_ids"], batch["labels"][..., 1:]
            x = base.get_decoder()(input_ids=ids).last_hidden_state
            head = base.get_output_embeddings()
            if kind == "chunked-head":
                logits = [head(x_i) for x_i in x.split(128, dim=1)]
                logits[-1] = logits[-1][..., :-1, :]
                chunks = [lc.reshape(-1, lc.size(-1)) for lc in logits]
                tchunks = [tc.reshape(-1) for tc in targets.split(logits[0].size(1), dim=1)]
            else:
                logits = head(x)
                flat = logits[..., :-1, :].reshape(-1, logits.size(-1))
                chunks, tchunks = flat.split(128), targets.reshape(-1).split(128)
            parts = [F.cross_entropy(lc, tc, reduction="none") for lc, tc in zip(chunks, tchunks)]
            n = (targets != -100).sum()
            return logits, torch.cat(parts).sum() / n.maximum(torch.ones_like(n))

    return Litgpt()


class _InBackward:
    """torchtune's optimizer in backward (``training/_memory.py``: ``OptimizerInBackwardWrapper``
    and ``register_optim_in_bwd_hooks``): one ``AdamW`` per parameter, stepped and zeroed by the
    parameter's ``register_post_accumulate_grad_hook``; ``step``/``zero_grad`` do nothing."""

    def __init__(self, params: list[Any]) -> None:
        import torch

        self.optims = {p: torch.optim.AdamW([p], lr=1e-4) for p in params}

        def hook(p: Any) -> None:
            self.optims[p].step()
            self.optims[p].zero_grad()

        for p in params:
            p.register_post_accumulate_grad_hook(hook)

    def step(self) -> None:
        return None

    def zero_grad(self) -> None:
        return None


def _plain(model: Any, recipe: Recipe, opt: Any = None) -> int:
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    if _k(recipe)["optimizer_in_backward"]:
        opt = _InBackward(params)
    opt = opt if opt is not None else torch.optim.AdamW(params, lr=1e-4)
    batch = _batch(recipe, model.config.vocab_size)
    kind = _k(recipe)["loss"]
    litgpt = _litgpt(model, kind) if kind in ("chunked-head", "chunked-ce") else None
    external = list(opt.optims.values()) if isinstance(opt, _InBackward) else [opt]
    mt = _tracker(litgpt or model, *external)
    logits = None
    with mt:
        for _ in range(_STEPS):
            mt.reset_mod_stats()
            with _autocast(recipe):
                if litgpt is not None:  # litgpt's loop keeps `logits` bound
                    logits, loss = litgpt(batch)
                else:
                    loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    del logits
    return _peak(mt)


def _accelerate(model: Any, recipe: Recipe) -> int:
    import torch
    from accelerate import Accelerator

    from accelerate.state import AcceleratorState

    mixed = {"bf16-mixed": "bf16", "16-mixed": "fp16"}.get(_k(recipe)["precision"], "no")
    # A Trainer run earlier in the process leaves a global AcceleratorState with its own
    # precision; a fresh script would start without one.
    AcceleratorState._reset_state(reset_partial_state=True)
    acc = Accelerator(cpu=True, mixed_precision=mixed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model, opt = acc.prepare(model, opt)
    batch = _batch(recipe, model.config.vocab_size)
    mt = _tracker(model, opt)
    with mt:
        for _ in range(_STEPS):
            mt.reset_mod_stats()
            loss = model(**batch).loss
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
    return _peak(mt)


def _trainer(model: Any, recipe: Recipe) -> int:
    import transformers

    row = {k: v[0] for k, v in _batch(recipe, model.config.vocab_size).items()}
    data = [row] * (_k(recipe)["micro_batch"] * _STEPS)
    mt = _tracker(model)

    class _Reset(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN003
            mt.reset_mod_stats()

    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, use_cpu=True, per_device_train_batch_size=_k(recipe)["micro_batch"],
            max_steps=_STEPS, bf16=_k(recipe)["precision"] == "bf16-mixed",
            fp16=_k(recipe)["precision"] == "16-mixed", report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
            gradient_checkpointing=_k(recipe)["checkpointing"] == "full")
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                       callbacks=[_Reset()])
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # no printing
        with mt:
            trainer.train()
    return _peak(mt)


def _peft(model: Any, recipe: Recipe, config_path: str = "") -> int:
    import peft

    kind = _k(recipe)["method"]
    if kind not in ("lora", "qlora"):  # the other PEFT methods, with PEFT's own classes
        from ..model import load_model
        from ..runtime.peft_methods import peft_config

        with warnings.catch_warnings():  # LN tuning warns for every norm class it copies
            warnings.simplefilter("ignore", UserWarning)
            model = peft.get_peft_model(model, peft_config(recipe, load_model(config_path)))
        if kind != "lora-fa":
            return _plain(model, recipe)
        from peft.optimizers import create_lorafa_optimizer

        opt = create_lorafa_optimizer(model, r=_k(recipe)["lora_rank"],
                                      lora_alpha=_k(recipe)["lora_alpha"], lr=1e-4)
        return _plain(model, recipe, opt)
    # "all-linear" when the recipe adapts every projection; otherwise PEFT's own default for
    # the architecture (q_proj, v_proj for Llama and Qwen2), which the case must name.
    # With lm_head (LoRA on the output layer), the modules are named: the model's linears of
    # the other roles (memplan's names, PEFT matches by suffix) and "lm_head".
    roles = set(_k(recipe)["lora_targets"])
    every = roles == set(LORA_TARGETS)
    targets: Any = "all-linear" if every else None
    if LORA_HEAD in roles:
        from ..model import load_model
        from ..model.peft_targets import target_modules

        targets = target_modules(load_model(config_path), roles - {LORA_HEAD}) + [LORA_HEAD]
    model = peft.get_peft_model(model, peft.LoraConfig(
        r=_k(recipe)["lora_rank"], target_modules=targets,
        lora_dropout=recipe.method.lora_dropout))
    return _plain(model, recipe)


def measure_with_harness(harness: str, config_path: str, recipe: Recipe, *,
                         base_dtype: str = "") -> int:
    """Peak live tensor bytes of ``_STEPS`` training steps of ``recipe`` run by ``harness``,
    counted by PyTorch's MemTracker. ``base_dtype`` (``bf16``/``fp16``): the model is cast to it
    before the harness runs, as a user who loads a 16-bit checkpoint does; '' keeps the fp32 of
    ``from_config``."""
    if harness not in FRAMEWORK_HARNESSES:
        raise ConfigError([f"harness={harness!r} has no runner; implemented: "
                           f"{', '.join(FRAMEWORK_HARNESSES)}."])
    if _k(recipe)["device"] != "cpu":
        raise ConfigError([f"harness={harness!r} measures with MemTracker on CPU only."])
    if base_dtype not in ("", "bf16", "fp16"):
        raise ConfigError([f"base_dtype={base_dtype!r} is not one of bf16, fp16 (or empty)."])
    # frameworks may print (DeepSpeed, imported by the HF Trainer when installed, logs to
    # stdout): keep it off stdout, where `memplan validate --format json` writes its report
    with contextlib.redirect_stdout(sys.stderr):
        if harness == "torchtune":  # builds its own model from the config's sizes
            from .torchtune_harness import measure_torchtune

            return measure_torchtune(config_path, recipe, _STEPS)
        model = _model(config_path, recipe, base_dtype)
        if harness == "peft":
            return _peft(model, recipe, config_path)
        run = {"plain": _plain, "accelerate": _accelerate, "trainer": _trainer}[harness]
        return run(model, recipe)
