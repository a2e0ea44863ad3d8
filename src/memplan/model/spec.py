"""``ModelSpec``: a model described as its parameter tensors, grouped into embedding, layers and
head, plus the architecture numbers the activation formulas need.

Shape-suffix legend used in this package: h = hidden size, V = vocab, L = layers,
a = attention heads, k = key/value heads, d = head dim, f = FFN inner size, E = experts.

A ``Tensor`` records how tensor parallelism splits it (``Split``) and which LoRA target name
(``q, k, v, o, gate, up, down``) reaches it, so sharding and PEFT work from one description.
Counting is structural: the total is the sum of the tensors, and tests check it against
transformers models built on the meta device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .traits import Traits

__all__ = ["Component", "Split", "Tensor", "Attention", "Ffn", "Layer", "ModelSpec", "LORA_TARGETS",
           "LORA_HEAD", "is_head_weight"]

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""Canonical LoRA target names; fused projections (GPT-2 ``c_attn``, Phi-3 ``qkv_proj``) answer to
each of their parts, since PEFT can only wrap the whole module."""
LORA_HEAD = "lm_head"
"""LoRA on the untied output layer (torchtune ``apply_lora_to_output``, litgpt ``lora_head``,
PEFT ``target_modules=[..., "lm_head"]``); not part of ``all-linear``, which PEFT defines
without the output layer."""


class Component(StrEnum):
    """Which part of the network a tensor belongs to (for per-component counts)."""

    EMBEDDING = "embedding"
    ATTENTION = "attention"
    MLP = "mlp"
    EXPERTS = "experts"
    ROUTER = "router"
    NORM = "norm"
    HEAD = "head"
    VISION = "vision"
    OTHER = "other"


class Split(StrEnum):
    """How Megatron-style tensor parallelism divides a tensor over ``tp`` ranks."""

    COLUMN = "column"
    """Output dim split (q/k/v, gate/up; their biases too)."""
    ROW = "row"
    """Input dim split (o, down); a row-parallel bias is replicated, see ``Tensor.is_bias``."""
    VOCAB = "vocab"
    """Vocabulary dim split (embedding, lm_head)."""
    REPLICATED = "replicated"
    """Every TP rank holds all of it (norms, routers, position embeddings)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Tensor:
    """One parameter tensor (or, with ``experts`` > 1, one per expert of identical shape)."""

    name: str
    """Module path inside a layer / embedding / head, e.g. ``self_attn.q_proj.weight``."""
    shape: tuple[int, ...]
    """Shape of one copy; a linear weight is ``(out_features, in_features)``."""
    component: Component
    split: Split = Split.REPLICATED
    experts: int = 1
    """Number of routed experts holding a tensor of this shape (expert parallelism divides it)."""
    targets: tuple[str, ...] = ()
    """LoRA target names that wrap this linear weight (empty: not a LoRA target)."""
    is_linear: bool = False
    """A ``nn.Linear``-like weight: bitsandbytes quantizes it under QLoRA (lm_head excepted)."""
    is_bias: bool = False

    @property
    def numel(self) -> int:
        return self.experts * math.prod(self.shape)

    def numel_per_rank(self, tp: int = 1, ep: int = 1) -> int:
        """Elements one rank holds under TP degree ``tp`` and EP degree ``ep`` (ceil on uneven)."""
        experts = -(-self.experts // ep) if self.experts > 1 else 1
        per_expert = math.prod(self.shape)
        divides = self.split in (Split.COLUMN, Split.VOCAB) or (
            self.split is Split.ROW and not self.is_bias
        )
        if divides and tp > 1:
            per_expert = -(-per_expert // tp)
        return experts * per_expert



def is_head_weight(t: Tensor) -> bool:
    """``t`` is the weight of an untied output layer (the ``lm_head`` LoRA target)."""
    return t.component is Component.HEAD and t.split is Split.VOCAB and not t.is_bias \
        and len(t.shape) == 2

@dataclass(frozen=True, kw_only=True, slots=True)
class Attention:
    """Attention geometry of one layer."""

    kind: str
    """``mha``, ``gqa``, ``mqa`` or ``mla`` (DeepSeek multi-head latent attention)."""
    num_heads: int
    num_kv_heads: int
    head_dim: int
    """Query/key head dim (for MLA: nope + rope parts)."""
    v_head_dim: int
    sliding_window: int | None = None
    cross: bool = False
    """Encoder-decoder cross-attention (T5 decoder)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Ffn:
    """Feed-forward block of one layer: dense MLP or mixture of experts."""

    gated: bool
    """SwiGLU/GeGLU (gate, up, down) vs plain two-matrix MLP."""
    activation: str
    """``silu``, ``gelu``, ``gelu_tanh``, ``relu``..."""
    intermediate_size: int
    """Dense MLP inner size, or one expert's inner size for MoE."""
    num_experts: int = 0
    """Routed experts (0: dense)."""
    top_k: int = 0
    shared_experts: int = 0
    shared_intermediate_size: int = 0
    shared_gate: bool = False
    """The shared experts' output is scaled by ``sigmoid(linear(x, h -> 1))`` (Qwen2-MoE's
    ``shared_expert_gate``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Layer:
    """One transformer block."""

    kind: str
    """``decoder``, ``encoder`` or ``decoder-cross`` (self + cross attention)."""
    tensors: tuple[Tensor, ...]
    attention: Attention | None = None
    ffn: Ffn | None = None
    norm: str = "rmsnorm"
    """``rmsnorm`` or ``layernorm``."""

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """A model, as memplan needs it: tensors by place, and the architecture numbers."""

    id: str
    """Hugging Face id, file path or ``module:function`` it was built from."""
    model_type: str
    """HF ``model_type`` (``llama``, ``qwen3_moe``...) or ``module`` for user code."""
    hidden_size: int
    vocab_size: int
    embedding: tuple[Tensor, ...]
    """Tensors before the first layer (held by pipeline stage 0)."""
    layers: tuple[Layer, ...]
    """Transformer blocks in execution order (encoder blocks first for encoder-decoders)."""
    head: tuple[Tensor, ...]
    """Tensors after the last layer: final norm, lm head (held by the last pipeline stage)."""
    tied_embeddings: bool = False
    """The lm head shares the input embedding matrix (counted once; see ``head_tied_numel``)."""
    head_tied_numel: int = 0
    """Elements of the shared embedding/head matrix, held again by the last stage when pp > 1."""
    max_position_embeddings: int | None = None
    source: str = ""
    """Where the description came from (catalog row, file, HF cache, module)."""
    notes: tuple[str, ...] = field(default=())
    config: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """The HF config it was built from (text config for multimodal models); None for
    ``module:function`` models."""
    traits: Traits | None = field(default=None, compare=False, repr=False)
    """What the activation graph needs beyond the tensors (``model.traits``); None for an
    architecture memplan has no activation graph for."""

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return self.embedding + tuple(t for layer in self.layers for t in layer.tensors) + self.head

    @property
    def num_params(self) -> int:
        """Total parameters, shared tensors counted once (``sum(p.numel() for p in parameters())``)."""
        return sum(t.numel for t in self.tensors)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def params_by_component(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[str(t.component)] = out.get(str(t.component), 0) + t.numel
        return out

    @property
    def is_moe(self) -> bool:
        return any(t.experts > 1 for t in self.tensors)

    def available_targets(self) -> set[str]:
        """LoRA targets the model has: the linear roles, and ``lm_head`` when the output layer
        is a weight of its own (untied)."""
        out = {name for t in self.tensors for name in t.targets}
        return out | ({LORA_HEAD} if any(is_head_weight(t) for t in self.tensors) else set())

    def largest_layer_numel(self) -> int:
        """Elements of the biggest layer (ZeRO-3/FSDP gather unit); embedding/head count as units."""
        units = [layer.numel for layer in self.layers]
        units += [sum(t.numel for t in self.embedding), sum(t.numel for t in self.head)]
        return max(units)
