"""``Ctx``: the sizes and dtypes of one micro-batch on one rank, as the layer blocks read them
(``activations._context`` builds it from the model, the recipe and its dtypes)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Ctx"]


@dataclass(frozen=True, slots=True)
class Ctx:
    """Sizes and dtypes of one micro-batch on one rank."""

    batch: int
    seq: int
    act: int
    """Bytes per element of the model's own tensors (parameter dtype: 4 under fp32 and autocast)."""
    half: int
    """Bytes per element of matmul outputs (16-bit under autocast or 16-bit training)."""
    amp: bool
    """torch.autocast: fp32 parameters, 16-bit matmuls."""
    trained: bool = True
    """The base model trains (full fine-tuning): norms, linears and embeddings get gradients."""
    lora_rank: int = 0
    """LoRA rank (0: no adapters)."""
    lora_targets: frozenset[str] = frozenset()
    """Roles of the linears that get adapters (``q``, ``k``, ``v``, ``o``, ``gate``, ``up``,
    ``down``)."""
    adapter: int = 4
    """Bytes per element of the adapter weights (PEFT keeps them in fp32 by default)."""
    loss: str = "standard"
    """Cross-entropy implementation (``Recipe.loss``)."""
    upcast_in_model: bool = False
    """The model returns fp32 logits (``Loss.logits_upcast = "model"``)."""
    capacity: float = 0.0
    """MoE capacity factor (``Recipe.moe_capacity_factor``; 0 dropless)."""
    sp: int = 1
    """Sequence-parallel degree (the TP degree under Megatron sequence parallelism, else 1):
    the residual stream holds ``tokens / sp`` rows per rank."""
    etp: int = 1
    """Expert TP degree (``Parallelism.expert_tp``; ``families._moe`` says how it is used)."""
    train_act: int = 4
    """Bytes per element of trained parameters where they differ from frozen ones (``method =
    freeze`` under autocast: trained layers fp32, frozen ones 16-bit)."""
    cpu: bool = False
    """Kernels as on CPU (dropout saves its noise in the input dtype)."""
    method: str = ""
    """The adapter on the linears of ``lora_targets``: ``lora``, ``dora``, ``lora-fa``,
    ``vera``, ``ia3`` ('' none; ``peft_ops.py``)."""
    ia3_ff: frozenset[str] = frozenset()
    """IA3's feed-forward roles (the vector scales the linear's input)."""
    bias_trained: bool = False
    """The base's biases train while its weights are frozen (BitFit)."""
    norms_trained: bool = False
    """The norms' weights train while the rest is frozen (LN tuning's trainable copies)."""
    norm_leaves: frozenset[str] = frozenset()
    """LN tuning's trained norms (leaf names, PEFT's table); empty: all but q/k norms."""
    prefix: int = 0
    """Prefix tuning: key/value positions added to every attention (``virtual_tokens``)."""
    prompt: int = 0
    """Prompt tuning: virtual tokens in front of every sequence (included in ``seq``)."""
    input_grad: bool = False
    """A trained tensor is added to the embeddings (``method = adapter``)."""
    embed_trained: bool = False
    """The token embedding trains under a frozen-base method (PEFT ``modules_to_save``)."""
    head_trained: bool = False
    """The output layer trains under a frozen-base method (PEFT ``modules_to_save``)."""
    layer_weight_grads: bool = False
    """Every weight of the layers gets a gradient although the base is frozen: FSDP1's flat
    parameter of a unit mixing frozen and trainable tensors requires a gradient as a whole, so
    its frozen views do too (``estimate/fsdp1_flat.py``), and each linear and norm of a layer
    saves the input its weight gradient needs (``Blocks``, inside the layers: the root unit
    of embedding, final norm and head stays frozen as a whole)."""
    compile: str = ""
    """``torch.compile``'s regions (``recipe.CompileScope``: ``blocks``, ``model``); '' eager."""

    @property
    def tokens(self) -> int:
        return self.batch * self.seq
