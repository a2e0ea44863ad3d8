"""A recipe applied to real model code: the module, its optimizer and a batch, ready to step.

The same builder serves ``trace`` (under ``FakeTensorMode``: no memory is used) and the real
runs of ``validate`` (real tensors), so the two execute identical code. What a recipe becomes:

====================  ==========================================================================
recipe                applied as
====================  ==========================================================================
precision             ``32-true``: fp32 weights; ``bf16-mixed``/``16-mixed``: fp32 weights and
                      ``torch.autocast(dtype=bf16/fp16)``; ``bf16-true``/``16-true``:
                      ``model.to(bf16/fp16)``
optimizer             ``torch.optim.AdamW`` / ``Adam`` / ``SGD`` (``sgd-momentum``: momentum 0.9) /
                      ``Adafactor``, over the trainable parameters, default (non-fused) kernels
method                ``lora``: PEFT ``get_peft_model`` with ``LoraConfig(r, lora_alpha,
                      target_modules, lora_dropout)``, adapters in ``adapter_dtype``;
                      ``freeze``: only the last ``freeze_trainable_layers`` blocks train.
                      Under ``-mixed`` the frozen weights are 16-bit and the trained ones fp32,
                      as after loading with ``torch_dtype=bfloat16`` (PEFT upcasts adapters,
                      LLaMA-Factory upcasts trainable parameters); ``frozen_dtype = "fp32"``
                      leaves them fp32
checkpointing         ``runtime/checkpointing.py``: ``full`` (every k-th / first N layers),
                      ``selective`` (the attention function checkpointed), ``op``
                      (torchtitan's per-op policy)
attention             transformers ``attn_implementation`` (``eager``, ``sdpa``; ``flash`` on
                      CUDA is SDPA, whose flash kernel keeps no S x S scores either)
micro_batch, seq_len  ``input_ids`` of shape (micro_batch, seq_len) and ``labels`` (a copy)
====================  ==========================================================================

Everything else must keep its single-rank default; ``check_traceable`` says why and how.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, ModelConfigError, Problems, TraceError
from ..model.resolve import check_name, find_config
from ..facts import dtypes, optimizer_facts
from ..recipe import Recipe
from ..results import ModelInfo
from ..model.peft_targets import target_modules
from .checkpointing import apply_checkpointing
from .factory import factory_model
from .peft_methods import PEFT_METHODS, apply_method

__all__ = ["Built", "Workload", "check_traceable", "build_model", "materialize", "build_workload",
           "OPTIMIZERS"]

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor")
"""Recipe optimizers with a ``torch.optim`` implementation (the ``torch`` column of
``facts/facts.toml``; the others need bitsandbytes or a third-party package)."""

_LR = 1e-4  # any value: memory does not depend on it
_TARGET_LEAVES = {
    "q": ("q_proj", "query", "wq", "query_key_value"),
    "k": ("k_proj", "key", "wk", "query_key_value"),
    "v": ("v_proj", "value", "wv", "query_key_value"),
    "o": ("o_proj", "out_proj", "wo", "dense"), "gate": ("gate_proj", "w1"),
    "up": ("up_proj", "w3", "fc1", "dense_h_to_4h"), "down": ("down_proj", "w2", "fc2",
                                                             "dense_4h_to_h"),
}
"""Leaf module names of each LoRA target (the names of ``memplan.model.module`` minus those
that are ambiguous, such as GPT-2's ``c_proj`` used by attention and MLP)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """Everything one training step needs."""

    model: Any
    """The ``nn.Module`` (wrapped by PEFT under LoRA), in train mode."""
    optimizer: Any
    """A ``torch.optim`` optimizer over the trainable parameters."""
    batch: dict[str, Any]
    """``input_ids`` and ``labels``."""
    autocast_dtype: Any
    """``torch.bfloat16`` / ``torch.float16`` under ``*-mixed``, else None."""
    loss_fn: Callable[[Any, dict[str, Any]], Any] | None
    """None for transformers models (``model(**batch).loss``)."""
    info: ModelInfo
    """``id``, ``params``, ``trainable_params``, ``layers``, ``source`` for the Breakdown."""
    notes: tuple[str, ...] = field(default=())
    """How the recipe was applied, where that is not obvious."""
    loop: dict[str, Any] = field(default_factory=dict)
    """``measure_step``'s loop arguments from ``Recipe.loop``."""


def check_traceable(recipe: Recipe) -> tuple[str, ...]:
    """Raise ``TraceError`` listing every recipe value a single-process run cannot apply;
    return notes about approximations."""
    p, notes = Problems(), []
    for name in ("gpus", "tp", "pp", "cp", "ep"):
        if getattr(recipe.parallelism, name) != 1:
            p.add(f"{name}={getattr(recipe.parallelism, name)}: trace and real runs execute one rank; "
                  f"use {name}=1 (and `memplan estimate` for parallel layouts).")
    if recipe.parallelism.zero:
        p.add(f"zero={recipe.parallelism.zero}: sharding needs a process group; trace uses zero=0.")
    if recipe.offload.kind != "none":
        p.add(f"offload={recipe.offload.kind}: offload needs DeepSpeed/FSDP; use offload=none.")
    if recipe.precision.kind == "fp8-mixed":
        p.add("precision=fp8-mixed needs Transformer Engine on a GPU; use bf16-mixed.")
    if not optimizer_facts(recipe.optimizer.kind).torch:
        p.add(f"optimizer={recipe.optimizer.kind} has no torch.optim implementation (bitsandbytes / "
              f"third party); use one of {', '.join(OPTIMIZERS)}.")
    if recipe.method.kind == "qlora":
        p.add("method=qlora needs bitsandbytes 4-bit kernels on CUDA; use method=lora.")
    if recipe.checkpointing.partition_activations or recipe.checkpointing.cpu_checkpointing:
        p.add("partition_activations / cpu_checkpointing are DeepSpeed's checkpoint API on a "
              "GPU with tensor parallelism; use `memplan estimate` for them.")
    if recipe.platform.attention == "flash":
        if recipe.platform.device == "cpu":
            p.add("attention=flash needs CUDA; with device=cpu use sdpa (its CPU flash kernel "
                  "keeps no S x S scores either).")
        else:
            notes.append("attention=flash traced as SDPA (its flash backend on CUDA).")
    if p:
        raise TraceError(str(ConfigError(p.items)))
    return tuple(notes)


def _torch_dtype(torch: Any, precision: str) -> tuple[Any, Any]:
    """(parameter dtype, autocast dtype) of a precision."""
    half = torch.float16 if precision.startswith("16") else torch.bfloat16
    if precision.endswith("-true") and precision != "32-true":
        return half, None
    if precision.endswith("-mixed"):
        return torch.float32, half
    return torch.float32, None


def _hf_model(config: dict[str, Any], recipe: Recipe, where: str) -> Any:
    import transformers

    data = {k: v for k, v in config.items() if k not in ("transformers_version", "_name_or_path")}
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ModelConfigError(f"{where}: config has no 'model_type'; supply the model's "
                               "complete config.json.")
    attn = "sdpa" if recipe.platform.attention == "flash" else str(recipe.platform.attention)
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as e:
        raise ModelConfigError(f"{where}: transformers cannot build a config for model_type "
                               f"{model_type!r} ({e}).") from None
    # the HF Trainer's default (TrainingArguments.use_cache=False), unless the loop says
    cfg.use_cache = recipe.loop.use_cache and recipe.checkpointing.kind == "none"
    archs = [a for a in (data.get("architectures") or []) if hasattr(transformers, a)]
    cls = getattr(transformers, archs[0]) if archs else None
    if cls is None:
        for auto in ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForSeq2SeqLM"):
            mapping = getattr(transformers, auto)._model_mapping
            if type(cfg) in mapping:
                cls = mapping[type(cfg)]
                break
    if cls is None:
        raise ModelConfigError(f"{where}: no transformers model class with a language-model "
                               f"head for model_type {model_type!r}.")
    cfg._attn_implementation = attn
    if hasattr(cfg, "_experts_implementation"):
        # MoE experts as the per-expert loop transformers calls "eager" (what the estimator
        # models); the default grouped_mm has no fp32 meta kernel, so FakeTensorMode cannot
        # trace it
        cfg._experts_implementation = "eager"
    return cls(cfg)


def _vocab(model: Any, torch: Any) -> int:
    cfg = getattr(model, "config", None)
    if getattr(cfg, "vocab_size", None):
        return int(cfg.vocab_size)
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            return int(m.num_embeddings)
    raise ModelConfigError("cannot find the vocabulary size (no config.vocab_size and no "
                           "nn.Embedding) to make token ids.")


def _generic_loss(model: Any, batch: dict[str, Any]) -> Any:
    """Next-token cross-entropy on a module that maps ids to logits (or has ``.logits``)."""
    import torch

    out = model(batch["input_ids"])
    if getattr(out, "loss", None) is not None:
        return out.loss
    logits = getattr(out, "logits", out)
    return torch.nn.functional.cross_entropy(logits.flatten(0, -2).float(),
                                             batch["labels"].flatten())


def _apply_lora(model: Any, recipe: Recipe, torch: Any, spec: Any = None) -> Any:
    """LoRA on the linears of ``lora_targets``: named from the model's own parameters when
    its config is known (``model.peft_targets.target_modules``: every family's real linears,
    T5's ``q``/``v`` included), else by leaf name (``_TARGET_LEAVES``, module factories)."""
    try:
        import peft
    except ImportError:
        raise TraceError("method=lora needs PEFT: pip install 'memplan[peft]'.") from None
    wanted = {leaf for t in recipe.method.lora_targets for leaf in _TARGET_LEAVES[t]}
    present = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear)}
    targets = (target_modules(spec, recipe.method.lora_targets) if spec is not None
               else sorted(wanted & present))
    if not targets:
        raise TraceError(f"lora_targets={','.join(recipe.method.lora_targets)} match no nn.Linear of "
                         f"this model (its linear layers: {', '.join(sorted(present)) or 'none'}).")
    cfg = peft.LoraConfig(r=recipe.method.lora_rank, lora_alpha=recipe.method.lora_alpha,
                          target_modules=targets, lora_dropout=recipe.method.lora_dropout)
    model = peft.get_peft_model(model, cfg)
    # PEFT upcasts adapters of 16-bit bases to fp32 (autocast_adapter_dtype); the recipe's
    # adapter_dtype says what the user keeps (auto: PEFT's, or the engine's: facts.dtypes).
    target = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        dtypes(recipe).adapter]
    for name, p in model.named_parameters():
        if "lora_" in name and p.dtype != target:
            p.data = p.data.to(target)
    return model


def _freeze(model: Any, keep: int) -> None:
    from .labels import layer_stack

    stack = layer_stack(model)
    if stack is None:
        raise TraceError("method=freeze needs a layer stack (an nn.ModuleList of blocks).")
    blocks = list(model.get_submodule(stack))
    for p in model.parameters():
        p.requires_grad_(False)
    for block in blocks[-keep:]:
        for p in block.parameters():
            p.requires_grad_(True)


_IMPL = {"auto": {}, "foreach": {"foreach": True}, "for-loop": {"foreach": False},
         "fused": {"fused": True}}
"""``Recipe.optimizer.impl`` as torch.optim keyword arguments (auto: torch's default)."""


def _optimizer(torch: Any, name: str, params: list[Any], impl: str = "auto") -> Any:
    if impl not in _IMPL:  # foreach-torch2.0: a path this torch no longer has
        raise TraceError(f"optimizer_impl={impl} is torch < 2.1's step; use optimizer_impl=foreach.")
    kw = _IMPL[impl]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=_LR, **kw)
    if name == "adam":
        return torch.optim.Adam(params, lr=_LR, **kw)
    if name == "sgd":
        return torch.optim.SGD(params, lr=_LR, **kw)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=_LR, momentum=0.9, **kw)
    return torch.optim.Adafactor(params, lr=1e-2, **{k: v for k, v in kw.items()
                                                      if k == "foreach"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Built:
    """A module with the recipe applied, before its batch and optimizer exist."""

    model: Any
    """The ``nn.Module`` (PEFT-wrapped under LoRA)."""
    model_ref: str
    """What the user named."""
    source: str
    """Where its config or code came from."""
    notes: tuple[str, ...]
    """From ``check_traceable``."""


def _spec(found: tuple[dict[str, Any], str] | None, model_ref: str) -> Any:
    """memplan's description of a config-built model (None for module factories and for
    families memplan has no builder for: the generic path)."""
    if found is None:
        return None
    from ..errors import UnsupportedModel
    from ..model.hf import from_hf_config

    try:
        return from_hf_config(found[0], model_ref, where=found[1])
    except UnsupportedModel:
        return None


def build_model(model_ref: str, recipe: Recipe, *, device: str, seed: int = 0) -> Built:
    """Build ``model_ref`` (catalog id, config.json or directory, ``module:function``) on
    ``device`` (``meta`` to trace) with the recipe's dtype, checkpointing and method applied.

    Raises:
        TraceError: the recipe cannot be applied (see ``check_traceable``).
        ModelConfigError / UnknownModel: the model cannot be built.
    """
    notes = check_traceable(recipe)
    import torch

    torch.manual_seed(seed)
    check_name(model_ref)
    found = find_config(model_ref)
    with torch.device(device):
        if found is not None:
            model = _hf_model(found[0], recipe, found[1])
            source = found[1]
        elif ":" in model_ref:
            model = factory_model(model_ref)
            source = f"module {model_ref}"
        else:
            from ..model import load_model

            load_model(model_ref)  # raises the helpful UnknownModel error
            raise AssertionError("unreachable")
        if not isinstance(model, torch.nn.Module):
            raise ModelConfigError(f"{model_ref}: built {type(model).__name__}, expected a "
                                   "torch.nn.Module.")
        dtype, _ = _torch_dtype(torch, recipe.precision.kind)
        if dtype != torch.float32:
            model.to(dtype)
        apply_checkpointing(model, recipe, model_ref, torch)
        if recipe.method.kind == "lora":
            model = _apply_lora(model, recipe, torch, _spec(found, model_ref))
        elif recipe.method.kind == "freeze":
            _freeze(model, recipe.method.freeze_trainable_layers)
        elif recipe.method.kind in PEFT_METHODS:
            if found is None:
                raise TraceError(f"method={recipe.method.kind} needs a transformers model "
                                 "(a config.json or catalog id), not a module factory.")
            spec = _spec(found, model_ref)
            if spec is None and recipe.method.kind not in ("prompt-tuning", "prefix-tuning",
                                                          "bitfit", "adapter"):
                raise TraceError(f"method={recipe.method.kind} names its modules from memplan's "
                                 f"description of the model, and model_type "
                                 f"{found[0].get('model_type')!r} has none; use lora, "
                                 "prompt-tuning, prefix-tuning, bitfit or adapter.")
            model = apply_method(model, recipe, spec, torch)
        _, autocast = _torch_dtype(torch, recipe.precision.kind)
        if (autocast is not None and recipe.method.kind != "full"
                and recipe.precision.frozen_dtype == "auto"):
            for name, p in model.named_parameters():
                # frozen adapter tensors (LoRA-FA's lora_A) keep the adapter dtype
                if not p.requires_grad and "lora_" not in name:
                    p.data = p.data.to(autocast)
    return Built(model=model, model_ref=model_ref, source=source, notes=notes)


def materialize(model: Any, device: str) -> None:
    """Replace the meta parameters and buffers of ``model`` by empty tensors on ``device`` (fake
    ones under ``FakeTensorMode``: ``Module.to`` cannot convert fake parameters, it swaps them),
    keeping tied tensors tied and ``requires_grad``."""
    import torch

    def empty(t: Any) -> Any:
        return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=device)

    new: dict[int, Any] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                if id(p) not in new:
                    new[id(p)] = torch.nn.Parameter(empty(p), requires_grad=p.requires_grad)
                module._parameters[name] = new[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                if id(b) not in new:
                    new[id(b)] = empty(b)
                module._buffers[name] = new[id(b)]
    tokens = getattr(model, "prompt_tokens", None)  # PEFT prompt learning keeps its token
    if isinstance(tokens, dict):  # indices in a plain dict, not as buffers
        for key, t in tokens.items():
            tokens[key] = torch.zeros(tuple(t.shape), dtype=t.dtype, device=device)


def build_workload(built: Built, recipe: Recipe) -> Workload:
    """The batch and optimizer for ``built`` (call under ``FakeTensorMode`` to trace)."""
    import torch

    model = built.model
    with torch.device(recipe.platform.device):
        model.train()
        ids = torch.randint(0, _vocab(model, torch), (recipe.batch.micro_batch, recipe.batch.seq_len))
        batch = {"input_ids": ids, "labels": ids.clone()}
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = _optimizer(torch, recipe.optimizer.kind, trainable,
                               str(recipe.optimizer.impl))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hf = type(base).__module__.startswith("transformers.")
    from .labels import layer_stack

    stack = layer_stack(model)
    info = ModelInfo(id=built.model_ref, params=sum(p.numel() for p in model.parameters()),
                     trainable_params=sum(p.numel() for p in trainable),
                     layers=len(model.get_submodule(stack)) if stack else 0,
                     source=built.source)
    _, autocast = _torch_dtype(torch, recipe.precision.kind)
    if recipe.loop.outputs == "kept" and not hf:
        raise TraceError("outputs=kept holds a transformers model output (outputs.loss, "
                         "outputs.logits); this model has none. Use outputs=dropped.")
    return Workload(model=model, optimizer=optimizer, batch=batch, autocast_dtype=autocast,
                    loss_fn=None if hf else _generic_loss, info=info, notes=built.notes,
                    loop=dict(outputs_kept=recipe.loop.outputs == "kept",
                              zero_grad_at=str(recipe.loop.zero_grad),
                              set_to_none=recipe.loop.set_to_none,
                              grad_accum=recipe.batch.grad_accum))
