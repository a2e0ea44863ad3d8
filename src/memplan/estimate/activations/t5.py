"""T5 / FLAN-T5 (``T5ForConditionalGeneration``, transformers 5.x ``modeling_t5.py``) as
``Graph`` ops: the encoder-decoder graph of one micro-batch (pipeline stage = whole model).

- **Inputs**: the encoder reads the batch's ``input_ids``; the decoder reads
  ``_shift_right(labels)`` (a new int64 tensor the decoder embedding keeps for its backward),
  so both stacks see ``seq_len`` tokens (memplan's workload uses the ids as labels).
- **Relative position bias**: the first block of each stack embeds the ``S x S`` bucket
  indices (kept by the embedding's backward) into a ``1 x H x S x S`` bias shared by every
  block of the stack; the cross-attention gets a zero bias (``1 x H x S x S``, query dtype).
- **Blocks**: ``T5LayerNorm`` (RMS, fp32 variance), attention with the bias added to the scores
  (eager: ``scores * 1.0 + bias (+ causal mask)``, softmax in the scores' dtype; SDPA: the
  bias is the float mask, and a mask that needs a gradient sends the CPU kernel to its math
  path), residual dropout; the FF block ``wo(dropout(act(wi(x))))`` or the gated
  ``act(wi_0(x)) * wi_1(x)`` (T5 v1.1 / FLAN-T5, ``gelu_new`` in Python ops), whose input is
  cast to ``wo``'s dtype first (a copy under autocast).
- **Head**: final norm, dropout, ``* d_model ** -0.5`` (tied embeddings: transformers 5 ties
  T5 always), ``lm_head``, ``CrossEntropyLoss`` on the unshifted labels.
"""

from __future__ import annotations

from ...model.spec import ModelSpec
from ...model.traits import Traits
from .blocks import Blocks, Ctx
from .graph import Graph as OpGraph
from .graph import Tensor
from .ln_decoder import gelu_new

__all__ = ["t5_graph"]


def _bias(b: Blocks, heads: int, buckets: int) -> Tensor:
    """``compute_bias``: bucket indices (int64, S x S, kept for the embedding's backward) and
    their embedding, a ``1 x H x S x S`` bias (trained with the model)."""
    c = b.c
    idx = b.new(c.seq * c.seq, 8, grad=False)
    b.g.op([], (idx,), [idx])
    bias = b.new(c.seq * c.seq * heads, c.act, grad=c.trained)
    b.g.op([idx], (bias,), [idx], params=((buckets * heads * c.act, 0),) if c.trained else ())
    return bias


def _attention(b: Blocks, xq: Tensor, xkv: Tensor, h: int, heads: int, d: int, bias: Tensor,
               *, attention: str, p: float) -> Tensor:
    c = b.c
    inner = heads * d
    q = b.linear(xq, h, inner, role=("q",))
    k = b.linear(xkv, h, inner, role=("k",))
    v = b.linear(xkv, h, inner, role=("v",))
    math = attention != "eager" and (bias.grad or (p > 0 and c.cpu))  # CPU SDPA with dropout: math
    if math:  # SDPA with a float mask that needs a gradient (or dropout): the CPU math
        # kernel converts 16-bit q, k, v to fp32 and computes on scaled copies (attention.cpp,
        # _scaled_dot_product_attention_math), the output cast back
        if c.amp:
            q, k, v = (b.cast(t, c.half) for t in (q, k, v))
        low = q.itemsize
        q, k, v = (b.cast(t, 4) for t in (q, k, v))
        q, k = b.copy(q, 1.0), b.copy(k, 1.0)
        o = b.eager(q, k, v, heads, heads, dropout=p, mask=bias, autocast=False,
                    upcast_input=False, softmax_fp32=False)
        o = b.cast(o, low)
    elif attention == "eager":
        o = b.eager(q, k, v, heads, heads, dropout=p, mask=bias, upcast_input=False,
                    softmax_fp32=False)
    else:  # zero bias without a gradient (cross-attention): the fused kernel with a mask
        o = b.sdpa(q, k, v, heads)
    return b.linear(o, inner, h, role=("o",))


def _ff(b: Blocks, x: Tensor, h: int, f: int, *, gated: bool, act: str, p: float) -> Tensor:
    c = b.c
    if gated:
        a = b.linear(x, h, f, role=("gate",))
        a = gelu_new(b, a) if act == "gelu_new" else b.unary(a)
        m = b.mul(a, b.linear(x, h, f, role=("up",)))
    else:
        m = b.unary(b.linear(x, h, f, role=("up",)), saves_input=False, saves_output=True)
    m = b.dropout(m, p)
    if c.amp and c.act == 4:  # hidden_states.to(self.wo.weight.dtype): an fp32 copy
        m = b.cast(m, 4)
    return b.dropout(b.linear(m, f, h, role=("down",)), p)


def t5_graph(spec: ModelSpec, tr: Traits, ctx: Ctx, *, attention: str,
             checkpointing: str) -> OpGraph:
    """The forward of T5 for one micro-batch on one rank (no pipeline or tensor split)."""
    g = OpGraph()
    b = Blocks(g, ctx)
    cfg = spec.config or {}
    h, V = spec.hidden_size, spec.vocab_size
    enc = [i for i, ly in enumerate(spec.layers) if ly.kind == "encoder"]
    dec = [i for i, ly in enumerate(spec.layers) if ly.kind != "encoder"]
    a0, f0 = spec.layers[0].attention, spec.layers[0].ffn
    assert a0 is not None and f0 is not None
    heads, d, f = a0.num_heads, a0.head_dim, f0.intermediate_size
    buckets = int(cfg.get("relative_attention_num_buckets") or 32)
    p = tr.residual_dropout
    act = str(cfg.get("dense_act_fn") or ("gelu_new" if f0.gated else "relu"))

    def block(x: Tensor, i: int, bias: Tensor, enc_out: Tensor | None,
              cross: Tensor | None) -> Tensor:
        g.region = f"layer {i}"
        with g.checkpoint(checkpointing == "full"):
            n = b.rmsnorm(x, h)
            x = b.add(x, b.dropout(_attention(b, n, n, h, heads, d, bias, attention=attention,
                                              p=p), p))
            if enc_out is not None and cross is not None:
                n = b.rmsnorm(x, h)
                x = b.add(x, b.dropout(_attention(b, n, enc_out, h, heads, d, cross,
                                                  attention=attention, p=p), p))
            return b.add(x, _ff(b, b.rmsnorm(x, h), h, f, gated=f0.gated, act=act, p=p))

    g.region = "embedding"
    x = b.dropout(b.embedding(h, V), p)
    bias = _bias(b, heads, buckets)
    for i in enc:
        x = block(x, i, bias, None, None)
    g.region = f"layer {enc[-1]}" if enc else "embedding"
    enc_out = b.dropout(b.rmsnorm(x, h), p)
    g.region = "embedding"
    ids = b.new(ctx.tokens, 8, grad=False)  # _shift_right(labels), kept by the embedding
    g.op([], (ids,), [ids])
    y = b.dropout(b.embedding(h, V), p)
    dbias = _bias(b, heads, buckets)
    if attention == "eager":  # the causal mask, materialised, added to the bias per layer
        mask = b.new(ctx.batch * ctx.seq * ctx.seq, ctx.act, grad=False)
        g.op([], (mask,))
        dbias = b.add(dbias, mask)
    # the zero bias requires a gradient under gradient checkpointing (T5Attention.forward)
    cross = b.new(ctx.seq * ctx.seq * heads, ctx.half if ctx.amp else ctx.act,
                  grad=checkpointing == "full")
    g.op([], (cross,))
    for i in dec:
        y = block(y, i, dbias, enc_out, cross)
    g.region = "head"
    y = b.dropout(b.rmsnorm(y, h), p)
    if spec.tied_embeddings or cfg.get("model_type") in ("t5", "mt5"):
        y = b.scale(y)  # sequence_output * d_model ** -0.5
    logits = b.linear(y, h, V, trained=ctx.trained)
    g.region = "loss"
    b.causal_lm_loss(logits, V, shift=False)
    return g
