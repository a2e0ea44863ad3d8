"""The recipe's PEFT methods applied to a real model, with PEFT's own classes (peft 0.21.2).

``peft_config`` builds the ``PeftConfig`` of a method (shared by memplan's workload and the
``peft`` harness of ``validate``); ``apply_method`` wraps the model:

=============  ================================================================================
method         applied as
=============  ================================================================================
dora           ``LoraConfig(r, lora_alpha, target_modules, lora_dropout, use_dora=True)``
lora-fa        ``LoraConfig(...)`` with every ``lora_A`` frozen, as
               ``peft.optimizers.create_lorafa_optimizer`` does (the recipe's optimizer then
               steps ``lora_B``; PEFT's ``LoraFAOptimizer`` is AdamW with B's gradient
               projected through A, r x r temporaries)
vera           ``VeraConfig(r, target_modules, vera_dropout)``
ia3            ``IA3Config(target_modules, feedforward_modules)``: PEFT's default modules of the
               family (``memplan.estimate.peft.ia3_roles``)
prompt-tuning  ``PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens)``
prefix-tuning  ``PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens)``
ln-tuning      ``LNTuningConfig(target_modules)`` (PEFT's default norms of the family)
bitfit         no PEFT class: every parameter frozen except the biases
adapter        every parameter frozen; one trainable tensor of ``adapter_params`` elements
               whose first ``hidden`` elements are added to the input embeddings (so the
               gradient flows through every layer, as for any input-side adapter)
=============  ================================================================================

Target modules come from the model's own parameter names (``model.peft_targets``), so a
fused projection (``c_attn``, ``query_key_value``) is adapted whole, as PEFT can only wrap
modules.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import TraceError
from ..facts import dtypes
from ..model.peft_targets import ia3_roles, ln_tuning_norm, target_modules
from ..model.spec import ModelSpec
from ..recipe import Recipe

__all__ = ["PEFT_METHODS", "peft_config", "apply_method"]

PEFT_METHODS = ("dora", "lora-fa", "vera", "ia3", "prompt-tuning", "prefix-tuning", "ln-tuning",
                "bitfit", "adapter")
"""Methods applied here (``lora`` keeps its own path in ``workload.py``)."""


def _norm_modules(spec: ModelSpec) -> list[str]:
    return sorted({t.name.rsplit(".", 1)[0].split(".")[-1] for t in spec.tensors
                   if ln_tuning_norm(spec, t)})


def peft_config(recipe: Recipe, spec: ModelSpec) -> Any:
    """PEFT's config object for ``recipe.method`` on ``spec``'s model."""
    import peft

    m = recipe.method
    kind = m.kind
    conv1d = spec.model_type == "gpt2"  # GPT-2's Conv1D stores weights (in, out)
    if kind in ("dora", "lora-fa", "lora"):
        return peft.LoraConfig(r=m.lora_rank, lora_alpha=m.lora_alpha,
                               lora_dropout=m.lora_dropout,
                               target_modules=target_modules(spec, m.lora_targets),
                               use_dora=kind == "dora", fan_in_fan_out=conv1d)
    if kind == "vera":
        return peft.VeraConfig(r=m.lora_rank, target_modules=target_modules(spec, m.lora_targets),
                               vera_dropout=m.lora_dropout, fan_in_fan_out=conv1d)
    if kind == "ia3":
        roles, ff = ia3_roles(spec.model_type)
        return peft.IA3Config(target_modules=target_modules(spec, roles),
                              feedforward_modules=target_modules(spec, ff), fan_in_fan_out=conv1d)
    if kind == "prompt-tuning":
        return peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=m.virtual_tokens)
    if kind == "prefix-tuning":
        return peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=m.virtual_tokens)
    if kind == "ln-tuning":
        return peft.LNTuningConfig(target_modules=_norm_modules(spec))
    raise TraceError(f"method={kind} has no PEFT config.")


def _adapter(model: Any, n: int, torch: Any) -> None:
    """A stand-in adapter of ``n`` trainable elements on the input side."""
    emb = model.get_input_embeddings()
    hidden = emb.embedding_dim
    param = torch.nn.Parameter(torch.zeros(max(n, hidden)))
    model.register_parameter("memplan_adapter", param)

    def hook(_module: Any, _inputs: Any, out: Any) -> Any:  # looked up at call time: the
        # tracer swaps parameters for fake ones
        return out + model.memplan_adapter[:hidden].to(out.dtype)

    emb.register_forward_hook(hook)


def apply_method(model: Any, recipe: Recipe, spec: ModelSpec, torch: Any) -> Any:
    """``model`` with ``recipe.method`` (one of ``PEFT_METHODS``) applied; the trained tensors
    of PEFT's modules in ``adapter_dtype`` (PEFT upcasts them to fp32 by default)."""
    kind = recipe.method.kind
    if kind in ("bitfit", "adapter"):
        for p in model.parameters():
            p.requires_grad_(False)
        if kind == "bitfit":
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.requires_grad_(True)
        else:
            _adapter(model, recipe.method.adapter_params, torch)
        return model
    try:
        import peft
    except ImportError:
        raise TraceError(f"method={kind} needs PEFT: pip install peft.") from None
    with warnings.catch_warnings():  # LN tuning: PEFT 0.21 warns "Unsupported layer type"
        # for every norm class it copies (LayerNorm included); the copy is what it documents
        warnings.simplefilter("ignore", UserWarning)
        model = peft.get_peft_model(model, peft_config(recipe, spec))
    if kind == "lora-fa":
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.requires_grad_(False)
    if kind != "ln-tuning":  # LN tuning's copies keep the norms' dtype (a 16-bit LayerNorm
        # weight with a 16-bit input), like BitFit's biases
        target = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
            dtypes(recipe).adapter]
        for name, p in model.named_parameters():
            if (p.requires_grad or (kind == "lora-fa" and "lora_A" in name)) \
                    and p.dtype != target:
                p.data = p.data.to(target)
    return model
