"""``Ctx``: the sizes and dtypes of one micro-batch on one rank, as the layer blocks read them
(``activations._context`` builds it from the model, the recipe and its dtypes)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...recipe import Recipe

__all__ = ["Ctx", "kept", "zero3_linear"]


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
    lora_dropout: float = 0.0
    """Dropout probability on each adapter's input (``Method.lora_dropout``; 0: identity)."""
    qkv_dropout_shared: bool = False
    """q, k and v adapters share one dropout of their input (``Method.lora_dropout_qkv_shared``)."""
    lora_targets: frozenset[str] = frozenset()
    """Roles of the linears that get adapters (``q``, ``k``, ``v``, ``o``, ``gate``, ``up``,
    ``down``)."""
    adapter: int = 4
    """Bytes per element of the adapter weights (PEFT keeps them in fp32 by default)."""
    loss: str = "standard"
    """Cross-entropy implementation (``Recipe.loss``)."""
    upcast_in_model: bool = False
    """The model returns fp32 logits (``Loss.logits_upcast = "model"``)."""
    upcast_in_loss: bool = True
    """The loss casts the logits to fp32 (``ForCausalLMLoss``: ``logits.float()``); False with
    ``Loss.logits_upcast = "none"``: only autocast upcasts (``log_softmax`` is an fp32 op)."""
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
    gptq: bool = False
    """The frozen block linears are auto-gptq ``QuantLinear``s (``Method.quant = gptq-int4``):
    each dequantises its weight to fp16 before the matmul (``quant_ops.py``)."""
    layer_weight_grads: bool = False
    """Every weight of the layers gets a gradient although the base is frozen: FSDP1's flat
    parameter of a unit mixing frozen and trainable tensors requires a gradient as a whole, so
    its frozen views do too (``estimate/fsdp1_flat.py``), and each linear and norm of a layer
    saves the input its weight gradient needs (``Blocks``, inside the layers: the root unit
    of embedding, final norm and head stays frozen as a whole)."""
    compile: str = ""
    """``torch.compile``'s regions (``recipe.CompileScope``: ``blocks``, ``model``); '' eager."""
    dequant: tuple[int, int] = (0, 0)
    """bitsandbytes 4-bit base (QLoRA): bytes per element of the weight ``dequantize_4bit``
    makes (``quant_state.dtype``, the dtype the weight was quantised from) and of its copy to
    the compute dtype (0 when the dtypes match: ``.to`` returns the tensor itself). bitsandbytes
    ``MatMul4Bit`` (``autograd/_functions.py``, 0.42.0 to 0.49.2 alike) runs
    ``F.linear(A, F.dequantize_4bit(B, quant_state).to(A.dtype).t())`` in the forward and
    ``grad_output @ F.dequantize_4bit(B, ctx.state).to(grad_output.dtype).t()`` in the backward:
    a whole 16-bit weight per quantised linear, freed after its matmul. (0, 0): no such base.
    Known deviation: bitsandbytes 0.50.0 (2026-07, PR #1949) runs the forward as a fused
    ``gemm_4bit`` (no dequantised weight); only its backward dequantises."""
    dequant_saves_input: bool = False
    """bitsandbytes before 0.43.2: ``MatMul4Bit`` keeps its input ``A`` for the backward
    (``ctx.tensors = (A, B)``) although only ``B`` is read there; removed by bitsandbytes PR
    #1270 (commit 9e753741, 2024-07-16, "fix QLoRA mem bug: delete useless buffered
    activation"), first released in 0.43.2."""
    linear_saves_input: bool = False
    """Every ``F.linear`` keeps its input for the backward whenever a gradient flows (frozen
    weights too): DeepSpeed ZeRO-3's ``zero.Init`` replaces ``torch.nn.functional.linear``
    with ``zero3_linear_wrap`` for the whole process (``zero_optimization.memory_efficient_linear``,
    default true, ``runtime/zero/config.py``; ``partition_parameters.py``
    ``_enable_mem_efficient_linear``), whose ``LinearFunctionForZeroStage3.setup_context`` runs
    ``ctx.save_for_backward(input, weight, bias)`` (``runtime/zero/linear.py``, DeepSpeed
    0.19.8). A plain ``F.linear`` with a frozen weight saves only the weight. Measured (torch
    2.13 CPU, tiny Llama, bf16 base, fp32 LoRA): +524,288 B saved for the forward, the
    inputs of the frozen linears that no other op saves."""
    quant_head: bool = False
    """The output head is a quantised linear too (Lightning's ``BitsandbytesPrecision``
    replaces every ``nn.Linear``; transformers keeps the output embedding in 16 bits)."""
    embeds_held: bool = False
    """Transformers' modelling code runs the model (not torchtitan, Megatron, torchtune or
    litgpt): ``inputs_embeds = self.embed_tokens(input_ids)`` stays referenced by the base
    model's ``forward`` until it returns after its final norm (transformers 5.23
    ``LlamaModel.forward``; measured on CPU: live at every layer with a frozen embedding),
    where the others rebind ``h = layer(h)`` and free it as the first layer returns."""

    _hash: int | None = field(default=None, init=False, repr=False, compare=False)
    """``__hash__``'s value once computed: a search's memo keys hash one context many times
    (forked workers share the hash seed; a context is never pickled)."""

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash(tuple([getattr(self, n) for n in _COMPARED]))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


_COMPARED = tuple(f.name for f in fields(Ctx) if f.compare)
"""The fields ``Ctx.__eq__`` compares, which its hash covers."""


def kept(memo: dict[object, object], ctx: Ctx) -> Ctx:
    """The context in ``memo`` equal to ``ctx`` (``ctx`` itself the first time): the memo's
    keys then hold one object per context, which a key's comparison takes by identity."""
    return memo.setdefault(("ctx", ctx), ctx)  # type: ignore[return-value]


def zero3_linear(recipe: Recipe) -> bool:
    """``Ctx.linear_saves_input``: DeepSpeed ZeRO-3, whose ``zero.Init`` (transformers enters it
    for ``from_pretrained`` under ZeRO-3; the engine's own conversion calls it with
    ``module=``, ``parameter_offload.py``) replaces ``F.linear`` (memory_efficient_linear is
    not a recipe knob: DeepSpeed's default, true)."""
    return str(recipe.engine_kind) == "deepspeed" and recipe.parallelism.zero == 3
