"""Layers of the LayerNorm decoders with rotary positions, as transformers 5.x writes them:
Phi-1/1.5/2 (``modeling_phi.py``), StableLM (``modeling_stablelm.py``), StarCoder2
(``modeling_starcoder2.py``) and Falcon (``modeling_falcon.py``).

What they share: ``nn.LayerNorm`` (``native_layer_norm`` saves input, mean and rstd), separate or
fused q/k/v projections with optional biases, rotary on the first ``rotary_dims`` of each head
(partial: the rotated slice is a new tensor, ``torch.cat`` with the untouched slice makes the
full q and k again), attention through the attention interface, and a residual that is either
sequential or parallel (attention and MLP read the same normalised input).
"""

from __future__ import annotations

from ...model.spec import Layer, ModelSpec
from ...model.traits import QkNorm, Traits
from .blocks import Blocks
from .graph import Tensor
from .peft_ops import prefix_kv

__all__ = ["gelu_new", "ln_decoder_layer"]


def gelu_new(b: Blocks, x: Tensor) -> Tensor:
    """GPT-2 / Phi ``NewGELUActivation`` in Python ops: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x +
    0.044715 * x**3)))``: pow saves x, tanh its output, the last mul both operands."""
    p3 = b.unary(x)
    inner = b.add(x, b.scale(p3))
    t = b.unary(b.scale(inner), saves_input=False, saves_output=True)
    one = b.scale(t)
    half = b.scale(x)
    return b.mul(half, one)


def _rotate(b: Blocks, x: Tensor, per_token: int, d: int, rotary: int) -> Tensor:
    """Rotary on the first ``rotary`` of ``d`` dims of each head of ``x`` (``per_token``
    elements per token): full rotary is ``apply_rotary_pos_emb`` on ``x``; partial rotary
    applies it to the slice (a view) and ``torch.cat``s the result with the rest into a new
    tensor (the slice's gradient and ``x``'s are computed in the backward)."""
    if rotary >= d:
        return b.rope(x)
    r = b.rope(b.view(x, rotary / d))
    return b.cat([r, x], per_token)


def _attention(b: Blocks, y: Tensor, layer: Layer, tr: Traits, h: int, *, tp: int,
               attention: str, mask: Tensor | None, selective: bool, fused: bool) -> Tensor:
    a = layer.attention
    assert a is not None
    heads, kv, d = max(1, a.num_heads // tp), max(1, a.num_kv_heads // tp), a.head_dim
    names = {t.name for t in layer.tensors}
    bias = any(n.endswith(("q_proj.bias", "query_key_value.bias")) for n in names)
    o_bias = any(n.endswith(("dense.bias", "o_proj.bias")) for n in names)
    math = False
    if fused:  # Falcon (FalconAttention._split_heads): one fused qkv linear; q is reshaped
        # into a copy; k and v are indexed copies, broadcast to every query head (flattened
        # copies) under the new decoder architecture, one shared head under multi-query
        qkv = b.linear(y, h, (heads + 2 * kv) * d, bias=bias, role=("q", "k", "v"))
        q = b.copy(b.view(qkv, heads / (heads + 2 * kv)), 1.0)
        share = kv / (heads + 2 * kv)
        k, v = (b.copy(b.view(qkv, share), 1.0) for _ in range(2))
        if kv > 1:  # new decoder architecture (grouped kv heads)
            k, v = b.copy(k, heads / kv), b.copy(v, heads / kv)
            kv = heads
        # CPU SDPA's fused kernel needs as many k/v heads as q heads: multi-query runs the
        # math path (scores materialised)
        math = kv < heads and b.c.cpu and attention != "eager"
    else:
        q = b.linear(y, h, heads * d, bias=bias, role=("q",))
        k = b.linear(y, h, kv * d, bias=bias, role=("k",))
        v = b.linear(y, h, kv * d, bias=bias, role=("v",))
    if tr.qk_norm is not QkNorm.NONE:  # LayerNorm over each head's dims
        q, k = b.layernorm(q, d), b.layernorm(k, d)
    q = _rotate(b, q, heads * d, d, tr.rotary_dims)
    k = _rotate(b, k, kv * d, d, tr.rotary_dims)
    if b.prefix is not None:  # prefix tuning: learned keys and values prepended per layer
        k, v = prefix_kv(b, k, v, heads, kv, d, sdpa=attention != "eager" and not math)
        kv = heads if attention != "eager" and not math else kv
    with b.g.checkpoint(selective):
        if math:  # the math kernel computes on scaled copies, k and v broadcast by matmul
            if b.c.amp:
                q, k, v = (b.cast(t, b.c.half) for t in (q, k, v))
            q, k = b.copy(q, 1.0), b.copy(k, 1.0)
            o = b.eager(q, k, v, heads, kv, mask=mask, autocast=False, upcast_input=False)
        elif attention == "eager":
            o = b.eager(q, k, v, heads, kv, dropout=tr.attention_dropout, mask=mask)
        else:
            o = b.sdpa(q, k, v, heads)
    return b.linear(o, heads * d, h, bias=o_bias, role=("o",))


def _mlp(b: Blocks, y: Tensor, layer: Layer, h: int, tp: int) -> Tensor:
    ffn = layer.ffn
    assert ffn is not None
    f = ffn.intermediate_size // tp
    names = {t.name for t in layer.tensors}
    if ffn.gated:  # StableLM: act(gate) * up
        gt = b.linear(y, h, f, role=("gate",))
        up = b.linear(y, h, f, role=("up",))
        return b.linear(b.mul(b.unary(gt), up), f, h, role=("down",))
    bias = any(n.endswith(("fc1.bias", "c_fc.bias", "dense_h_to_4h.bias")) for n in names)
    u = b.linear(y, h, f, bias=bias, role=("up",))
    act = gelu_new(b, u) if ffn.activation == "gelu_new" else b.unary(u)
    return b.linear(act, f, h, bias=bias, role=("down",))


def ln_decoder_layer(b: Blocks, x: Tensor, layer: Layer, spec: ModelSpec, *, tp: int,
                     attention: str, mask: Tensor | None, selective: bool) -> Tensor:
    """One block: LayerNorm, attention, MLP; parallel (Phi, Falcon, StableLM with
    ``use_parallel_residual``: ``x + attn(ln(x)) + mlp(ln(x))``, Falcon's new decoder
    architecture with a second LayerNorm for the MLP) or sequential (StarCoder2, StableLM);
    residual dropout on each sublayer's output."""
    tr = spec.traits
    assert tr is not None
    h, p = spec.hidden_size, tr.residual_dropout
    names = {t.name for t in layer.tensors}
    fused = any("query_key_value" in n for n in names)
    kw = dict(tp=tp, attention=attention, mask=mask, selective=selective, fused=fused)
    y = b.layernorm(x, h)
    att = b.dropout(_attention(b, y, layer, tr, h, **kw), p)
    if tr.parallel_residual:
        ym = b.layernorm(x, h) if any("ln_mlp" in n for n in names) else y
        m = b.dropout(_mlp(b, ym, layer, h, tp), p)
        if fused:  # Falcon: mlp_output += attention_output (in place), then + residual
            return b.add(x, b.add(m, att))
        return b.add(b.add(att, m), x) if spec.model_type == "phi" else b.add(b.add(x, att), m)
    r = b.add(x, att)
    return b.add(r, b.dropout(_mlp(b, b.layernorm(r, h), layer, h, tp), p))
