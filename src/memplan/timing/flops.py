"""FLOPs of one training token, from the model's real tensors (``ModelSpec``).

Legend: h = hidden size, V = vocab, s = sequence length, a = query heads, d_qk / d_v = head dims.

Forward FLOPs per token (multiply-add = 2 FLOPs):

- matmuls of a layer: ``2 x`` elements of every 2-D weight; routed experts count ``top_k`` of
  ``E`` (MoE), shared experts and routers fully; GQA/MQA/MLA come out of the real shapes;
- attention core: ``2 a d_qk ctx + 2 a d_v ctx`` (QK^T and AV), ctx = s, or the sliding window;
- logits: ``2 h V`` (tied or not).

Training: backward = 2 x forward where weights train (activation + weight gradients), 1 x for
frozen matmuls that still pass gradients down (LoRA base), 0 below the lowest trainable layer
(``freeze``); the attention core's backward is 2 x its forward. Recomputation adds the forward of
every layer (``full``) or of the attention core (``selective``, Korthikanti et al. 2022,
arXiv 2205.05198 §5).

Two counts: **model FLOPs** (PaLM, Chowdhery et al. 2022, App. B; torchtitan's MFU: no
recomputation, attention over the full s x s matrix, i.e. 6N + 12 L a d s for full training)
and **executed FLOPs** (recomputation included; causal SDPA/flash kernels skip the masked half
of the scores, FlashAttention-2, Dao 2023, §3.1.1; eager attention computes all of it).

**Known limitations**: T5's encoder and decoder are both charged ``seq_len`` tokens; a vision
tower (Gemma 3) is charged like a text layer per text token; embedding lookups, norms and
softmax are not FLOPs here (they are HBM time in ``step.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..model.spec import Component, Layer, ModelSpec
from ..recipe import Recipe

__all__ = ["TokenFlops", "token_flops", "layer_matmul_flops", "attention_core_flops"]

_NOT_MATMUL = (Component.NORM, Component.EMBEDDING)


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenFlops:
    """FLOPs per token of one training step, whole model (divide by tp x pp x cp per rank)."""

    model: float
    """Model FLOPs (PaLM convention), for MFU."""
    executed: float
    """FLOPs the GPUs execute (recomputation, causal skipping), for time."""
    matmul_forward: float
    """Forward matmul FLOPs (layers + logits)."""
    attention_forward: float
    """Forward attention-core FLOPs over the full s x s matrix."""


def layer_matmul_flops(layer: Layer) -> float:
    """Forward matmul FLOPs per token of one layer: 2 x the elements of each 2-D weight, routed
    experts counted ``top_k`` times (one expert's shape x top_k)."""
    top_k = layer.ffn.top_k if layer.ffn and layer.ffn.num_experts else 0
    total = 0.0
    for t in layer.tensors:
        if len(t.shape) != 2 or t.is_bias or t.component in _NOT_MATMUL:
            continue
        copies = min(top_k, t.experts) if t.experts > 1 else 1
        total += 2.0 * math.prod(t.shape) * copies
    return total


def attention_core_flops(layer: Layer, seq_len: int) -> float:
    """Forward FLOPs per token of QK^T and AV over the full context (window if sliding)."""
    a = layer.attention
    if a is None:
        return 0.0
    ctx = min(seq_len, a.sliding_window) if a.sliding_window else seq_len
    per = 2.0 * a.num_heads * (a.head_dim + a.v_head_dim) * ctx
    return per * (2 if layer.kind == "decoder-cross" else 1)


def _causal(layer: Layer) -> bool:
    return layer.kind != "encoder"


def token_flops(model: ModelSpec, recipe: Recipe) -> TokenFlops:
    """FLOPs per token of a training step of ``model`` under ``recipe`` (module docstring)."""
    n = model.num_layers
    first_trainable = n - recipe.method.freeze_trainable_layers if recipe.method.kind == "freeze" else 0
    base_trains = recipe.method.kind == "full"
    m_fwd = a_fwd = 0.0
    model_f = executed = 0.0
    for i, layer in enumerate(model.layers):
        m = layer_matmul_flops(layer)
        a = attention_core_flops(layer, recipe.batch.seq_len)
        a_exec = a * (0.5 if _causal(layer) and recipe.platform.attention != "eager" else 1.0)
        m_fwd += m
        a_fwd += a
        if i < first_trainable:          # frozen bottom layers: no backward at all
            model_f += m + a
            executed += m + a_exec
            continue
        w_grad = 1.0 if (base_trains or recipe.method.kind == "freeze") else 0.0
        model_f += m * (2 + w_grad) + 3 * a
        executed += m * (2 + w_grad) + 3 * a_exec
        if recipe.checkpointing.kind == "full":
            executed += m + a_exec
        elif recipe.checkpointing.kind == "selective":
            executed += a_exec
    head = 2.0 * model.hidden_size * model.vocab_size
    head_w = 1.0 if base_trains else 0.0  # freeze and LoRA leave the head frozen
    model_f += head * (2 + head_w)
    executed += head * (2 + head_w)
    return TokenFlops(model=model_f, executed=executed, matmul_forward=m_fwd + head,
                      attention_forward=a_fwd)
