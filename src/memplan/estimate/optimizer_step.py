"""Memory that exists only inside ``optimizer.step()``: the optimizer's temporaries, and the
per-tensor step counters torch keeps on the host. ``optimizer_impl`` picks the path;
``auto`` is torch's default for the device, as below.

torch's Adam/AdamW pick an implementation by device (``_default_to_fused_or_foreach`` in
``torch/optim/optimizer.py``): on CUDA the *foreach* path, whose ``_multi_tensor_adam`` starts
with ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``, a full-size copy of the second
moments of every parameter in the group; on CPU the *single-tensor* path, which per parameter
allocates ``exp_avg_sq.sqrt()`` and ``/ bias_correction2_sqrt`` (two tensors of that parameter's
size) before ``addcdiv_``. DeepSpeed ZeRO steps with its fused Adam kernels (no temporaries;
``deepspeed/runtime/zero/stage3.py`` / ``stage_1_and_2.py`` build ``FusedAdam``), and so does
Megatron-Core (``megatron/core/optimizer/__init__.py`` ``_get_megatron_optimizer_based_on_param_groups``
uses TE/Apex ``FusedAdam``). FSDP1/FSDP2 step a plain ``torch.optim.AdamW`` over the local
shards (FSDP2: DTensor shards, which the foreach path accepts), so the foreach copy exists on
the shard: 1/N of it per rank. torchtitan builds its AdamW with ``fused=True`` unless told
otherwise (``Recipe.optimizer_impl``), which has no temporaries.
SGD updates in place; Lion (lion-pytorch) builds ``update`` from ``exp_avg.clone()`` and one
more temporary per parameter; Adafactor's factored update allocates about three
parameter-sized temporaries per tensor (``transformers.optimization.Adafactor``); the
bitsandbytes 8-bit/paged optimizers update in fused kernels.

With the optimizer in backward (``Optimizer.in_backward``, torchtune ``optimizer_in_bwd``) each
parameter has its own optimizer, stepped in its post-accumulate-grad hook, so the temporaries
are one tensor's: the largest non-embedding tensor's during the backward, the embedding's after
its op (the backward's last). Known deviation: they are counted at the whole moment of the op
that produced the gradient, while the hook runs once that op's other temporaries are freed
(validate: +0.2% to +3.6% on the tiny llama / gpt2 cases).
"""

from __future__ import annotations

from ..breakdown import Category, Item
from ..model.spec import Component
from ..facts import optimizer_facts
from ..recipe import Recipe
from ..units import dtype_bytes
from .layout import Stage
from ..facts import Dtypes

__all__ = ["optimizer_step_items", "FOREACH_DENOM_COPY"]

FOREACH_DENOM_COPY = ("adam", "adamw")
"""Optimizers whose torch < 2.1 foreach step made a second state-sized list: ``denom =
torch._foreach_add(exp_avg_sq_sqrt, eps)`` next to ``exp_avg_sq_sqrt`` (torch 2.0
``torch/optim/adam.py`` / ``adamw.py`` ``_multi_tensor_adam(w)``; "Foreach optimizers use higher
memory due to intermediates", pytorch/pytorch#97712; minimised to one intermediate by #104780
(Adam) and #104898 (AdamW), July 2023, first released in torch 2.1)."""

def optimizer_step_items(stage: Stage, recipe: Recipe, dt: Dtypes) -> list[Item]:
    trainable = stage.trainable
    if not trainable or recipe.offload.kind != "none":
        return []
    sb = dtype_bytes(dt.state if dt.state in ("fp32", "bf16", "fp16") else "fp32")
    opt = recipe.optimizer.kind
    facts = optimizer_facts(opt)
    out = []
    shard = recipe.parallelism.shard_degree if recipe.parallelism.zero >= 1 else 1
    fused_engine = str(recipe.engine_kind) in ("deepspeed", "megatron")
    impl = recipe.optimizer_impl  # auto: torchtitan's fused, else torch's default for the device
    if (recipe.parallelism.zero >= 1 or recipe.deepspeed_16bit) and facts.fused_under_zero \
            and fused_engine:
        pass  # DeepSpeed FusedAdam / cpu_adam (ZeRO-0: under FP16_Optimizer), Megatron TE
        # FusedAdam: no temporaries
    elif impl == "fused":
        pass  # torch's fused AdamW/Adam (_fused_adamw_ kernels) updates in place
    elif impl.startswith("foreach") and facts.foreach_copy and recipe.optimizer.in_backward:
        big = max(h.numel for h in trainable)
        out.append(Item(category=Category.TEMPORARY, name="foreach Adam sqrt(exp_avg_sq) copy "
                        "(one parameter)", bytes=int(big * sb),
                        formula="optimizer in backward: one optimizer per parameter, so the "
                        "foreach copy covers one tensor (the largest)"))
    elif impl.startswith("foreach") and facts.foreach_copy:
        # one list entry per state tensor, in its own dtype (torch allocates states like the
        # parameter: fp32 adapters beside bf16 modules_to_save give an fp32 and a bf16 group)
        adapter_sb = dtype_bytes("fp32" if dt.state == "fp32" else dt.adapter)
        n = sum(h.numel * (adapter_sb if h.adapter else sb) for h in trainable) // shard
        out.append(Item(category=Category.TEMPORARY, name="foreach Adam sqrt(exp_avg_sq) copy",
                        bytes=int(n),
                        formula="one state-sized copy of every trainable tensor "
                        "(torch/optim/adam.py _multi_tensor_adam: torch._foreach_sqrt)"))
        if impl == "foreach-torch2.0" and opt in FOREACH_DENOM_COPY:
            out.append(Item(category=Category.TEMPORARY, name="foreach Adam denom copy (torch < "
                            "2.1)", bytes=int(n),
                            formula="denom = torch._foreach_add(exp_avg_sq_sqrt, eps), live "
                            "beside exp_avg_sq_sqrt until _foreach_addcdiv_ (torch 2.0 "
                            "_multi_tensor_adam(w); pytorch#97712, gone in 2.1: #104898)"))
    elif facts.step_temporaries and recipe.optimizer.in_backward:
        k = facts.step_temporaries
        # the embedding's gradient completes last (its op is the backward's last): its step
        # runs after the backward, every other tensor's during it
        emb = [h.numel for h in trainable if h.tensor.component is Component.EMBEDDING]
        rest = [h.numel for h in trainable if h.tensor.component is not Component.EMBEDDING]
        for numel, when in ((max(rest, default=0), "during the backward"),
                            (max(emb, default=0), "after the backward")):
            if numel:
                out.append(Item(category=Category.TEMPORARY, name=f"{opt} per-tensor "
                                f"temporaries ({when})", bytes=int(k * numel * sb),
                                formula=f"{k} x the largest trainable tensor stepped "
                                f"{when} (optimizer in backward, single-tensor path)"))
    elif facts.step_temporaries:  # the for-loop (optimizers without a foreach path too)
        big = max(h.numel for h in trainable) // shard
        k = facts.step_temporaries
        out.append(Item(category=Category.TEMPORARY, name=f"{opt} per-tensor temporaries",
                        bytes=int(k * big * sb),
                        formula=f"{k} x the largest trainable tensor (single-tensor path: "
                        "sqrt(exp_avg_sq), then / bias_correction2_sqrt)"))
    if recipe.platform.device == "cpu" and facts.cpu_step_counters:
        out.append(Item(category=Category.OPTIMIZER, name="step counters",
                        bytes=4 * len(trainable),
                        formula="one fp32 scalar tensor 'step' per parameter (torch.optim.Adam; "
                        "kept on the host, so only counted with device=cpu)"))
    return out
