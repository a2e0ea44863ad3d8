"""FLOPs of one training token, from the model's real tensors (``ModelSpec``).

Legend: h = hidden size, V = vocab, s = sequence length, a = query heads, d_qk / d_v = head dims.

Forward FLOPs per token (multiply-add = 2 FLOPs):

- matmuls of a layer: ``2 x`` elements of every 2-D weight; routed experts count ``top_k`` of
  ``E`` (MoE), shared experts and routers fully; GQA/MQA/MLA come out of the real shapes;
- attention core: ``2 a d_qk ctx + 2 a d_v ctx`` (QK^T and AV), ctx = s, or the sliding window;
- logits: ``2 h V`` (tied or not).

Training: backward = 2 x forward where weights train (activation + weight gradients), 1 x for
frozen matmuls that still pass gradients down (LoRA base; executed 2 x when FSDP1 flat units
mix frozen and trainable weights, ``frozen_weight_grads``), 0 below the lowest trainable layer
(``freeze``); the attention core's backward is 2 x its forward (2.5 x under a fused kernel,
which recomputes the scores: ``attention_backward_factor``). Recomputation adds the forward of
every layer (``full``) or of the attention core (``selective``, Korthikanti et al. 2022,
arXiv 2205.05198 §5), or what the per-op policy does not save (``op``; ``recompute.py``).

Three counts, one convention for causal attention (``_causal_share``: a causal layer's score
matrix has s(s+1)/2 useful entries of s^2, counted as 1/2, as FlashAttention-2 counts its causal
benchmarks, Dao 2023, arXiv 2307.08691 §4.1):

- **model FLOPs** (for MFU): PaLM App. B / Megatron (Narayanan et al. 2021, arXiv 2104.04473
  §5.1) without recomputation, attention included, causal layers at half the scores;
- **model FLOPs, non-causal** (``model_noncausal``): the same over the full s x s matrix, i.e.
  torchtitan's ``6N + 12 L a d s``, kept to compare with MFUs published that way;
- **executed FLOPs** (for HFU and time): model FLOPs + recomputation (PaLM App. B's hardware
  FLOPs), and the masked half of a causal layer's scores where the kernel computes it anyway
  (eager attention materialises s x s; SDPA/flash kernels skip masked tiles).

So executed >= model for every recipe (HFU >= MFU), and both are FLOPs a kernel must execute,
so MFU <= HFU <= the compute efficiency < 1 (``tests/test_timing_model.py`` checks it).

**Known limitations**: T5's encoder and decoder are both charged ``seq_len`` tokens; a vision
tower (Gemma 3) is charged like a text layer per text token; embedding lookups, norms and
softmax are not FLOPs here (they are HBM time in ``step.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..model.spec import Component, Layer, ModelSpec
from ..recipe import Recipe
from ..recipe.engine import fsdp1_mixes
from .recompute import attention_recomputed, recompute_matmul_share

__all__ = ["TokenFlops", "token_flops", "layer_matmul_flops", "attention_backward_factor",
           "attention_core_flops", "fused_backward_factor"]

_NOT_MATMUL = (Component.NORM, Component.EMBEDDING)


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenFlops:
    """FLOPs per token of one training step, whole model (divide by tp x pp x cp per rank)."""

    model: float
    """Model FLOPs (PaLM convention, causal attention at half the scores), for MFU."""
    model_noncausal: float
    """Model FLOPs over the full s x s score matrix (torchtitan's MFU convention)."""
    executed: float
    """FLOPs the GPUs execute (recomputation; eager attention's masked half), for HFU."""
    attention_executed: float
    """Part of ``executed`` in the attention core (QK^T, AV, forward + backward + recompute)."""
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


def attention_backward_factor(layer: Layer, attention: str) -> float:
    """Backward FLOPs of the attention core over its forward's. Eager attention keeps the
    probabilities and runs 2 x its forward (dS -> dQ, dK; dP, dV). A fused kernel (SDPA,
    FlashAttention) keeps only the log-sum-exp and computes the scores ``QK^T`` again in its
    backward: 5 matmuls against the forward's 2, "the backward pass of attn is 2.5 x fwd,
    since we recompute Q @ K.T" (tridao, Dao-AILab/flash-attention#1525; the FlashAttention
    benchmarks count backward FLOPs as 2.5 x forward, so their efficiencies refer to that
    count), i.e. 2 + the ``QK^T`` share of the forward, ``d_qk / (d_qk + d_v)``."""
    a = layer.attention
    if attention == "eager" or a is None:
        return 2.0
    return fused_backward_factor(a.head_dim, a.v_head_dim)


def fused_backward_factor(d_qk: float, d_v: float) -> float:
    """A fused attention kernel's backward FLOPs over its forward's, for head dims ``d_qk``
    (scores) and ``d_v`` (values): ``attention_backward_factor``'s count, 2.5 when equal."""
    return 2.0 + d_qk / (d_qk + d_v)


def _causal_share(layer: Layer) -> float:
    """Share of the s x s scores a causal layer needs: 1/2 (encoders: all of them)."""
    return 1.0 if layer.kind == "encoder" else 0.5


def frozen_weight_grads(recipe: Recipe) -> bool:
    """The backward computes weight gradients of frozen layer weights too: FSDP1 units that
    mix frozen and trainable tensors require a gradient as a whole (``estimate/fsdp1_flat.py``,
    torch 2.13 ``_flat_param.py``). Executed, not model, FLOPs: the work is discarded."""
    kind = str(recipe.method.kind)
    return (kind not in ("full", "freeze") and str(recipe.engine_kind) == "fsdp1"
            and fsdp1_mixes(kind, str(recipe.engine.fsdp1_wrap)))


def token_flops(model: ModelSpec, recipe: Recipe) -> TokenFlops:
    """FLOPs per token of a training step of ``model`` under ``recipe`` (module docstring)."""
    n = model.num_layers
    freeze = recipe.method.kind == "freeze"
    first_trainable = n - recipe.method.freeze_trainable_layers if freeze else 0
    base_trains = recipe.method.kind == "full"
    wasted = frozen_weight_grads(recipe)
    m_fwd = a_fwd = 0.0
    model_f = model_nc = executed = a_executed = 0.0
    for i, layer in enumerate(model.layers):
        m = layer_matmul_flops(layer)
        a = attention_core_flops(layer, recipe.batch.seq_len)
        a_model = a * _causal_share(layer)
        a_run = a if recipe.platform.attention == "eager" else a_model
        m_fwd += m
        a_fwd += a
        if i < first_trainable:          # frozen bottom layers: no backward at all
            model_f += m + a_model
            model_nc += m + a
            executed += m + a_run
            a_executed += a_run
            continue
        w_grad = 1.0 if (base_trains or recipe.method.kind == "freeze") else 0.0
        model_f += m * (2 + w_grad) + 3 * a_model
        model_nc += m * (2 + w_grad) + 3 * a
        passes = (1 + attention_backward_factor(layer, recipe.platform.attention)
                  + (1 if attention_recomputed(recipe, i, n) else 0))
        executed += m * (2 + max(w_grad, float(wasted))) + passes * a_run
        a_executed += passes * a_run
        executed += m * recompute_matmul_share(recipe, layer, i, n)
    head = 2.0 * model.hidden_size * model.vocab_size
    head_w = 1.0 if base_trains else 0.0  # freeze and LoRA leave the head frozen
    model_f += head * (2 + head_w)
    model_nc += head * (2 + head_w)
    executed += head * (2 + head_w)
    return TokenFlops(model=model_f, model_noncausal=model_nc, executed=executed,
                      attention_executed=a_executed, matmul_forward=m_fwd + head,
                      attention_forward=a_fwd)
