"""Forward graphs of whole pipeline stages, per architecture family (transformers 5.x code)."""

from __future__ import annotations

import math

from dataclasses import replace
from typing import Any

from ...errors import UnsupportedModel
from ...model.spec import Layer, ModelSpec
from ...model.traits import GRAPHS, Graph, Mla, Norm, NormPlacement, QkNorm, Traits
from .blocks import Blocks, Ctx
from .graph import Graph as OpGraph
from .graph import Tensor
from . import litgpt_loss
from .compiled import compiled
from .ln_decoder import gelu_new, ln_decoder_layer
from .peft_ops import prefix_kv
from .policy import Policy
from .t5 import t5_graph
from ..peft import prefix_token_dim

__all__ = ["stage_graph"]


def _traits(spec: ModelSpec) -> Traits:
    """The architecture traits the builders set; a model without them is refused, never drawn
    as some other family's graph."""
    if spec.traits is None:
        raise UnsupportedModel(
            f"{spec.id} (model_type {spec.model_type!r}): memplan has no activation graph for "
            "this architecture: its ModelSpec carries no traits (layer graph, norm kind and "
            "placement, rotary dims, softcaps, attention variant, dropout, loss head). "
            f"Known families: {', '.join(sorted(GRAPHS))}. To add it, map its model_type to "
            "a graph in memplan/model/traits.py (GRAPHS, traits_for) and, if no existing "
            "graph matches its layer, write one in memplan/estimate/activations/families.py.")
    return spec.traits


def _llama_layer(b: Blocks, x: Tensor, layer: Layer, spec: ModelSpec, *, tp: int,
                 attention: str, mask: Tensor | None, selective: bool) -> Tensor:
    tr = _traits(spec)
    h = spec.hidden_size
    a = layer.attention
    ffn = layer.ffn
    assert a is not None and ffn is not None
    heads, kv = max(1, a.num_heads // tp), max(1, a.num_kv_heads // tp)
    d = a.head_dim
    gemma = tr.norm is Norm.RMS_GEMMA
    names = {t.name for t in layer.tensors}
    sandwich = tr.placement is NormPlacement.SANDWICH  # Gemma 2/3: 4 norms
    post_only = tr.placement is NormPlacement.POST

    y = x if post_only else b.rmsnorm(x, h, gemma=gemma, leaf="input_layernorm")
    if a.kind == "mla":
        assert tr.mla is not None
        return _llama_rest(b, x, _mla_attention(b, y, h, tr.mla, heads, attention=attention,
                                                dropout=tr.attention_dropout,
                                                mask=mask, selective=selective),
                           h, ffn, tp, gemma=gemma, sandwich=sandwich, post_only=post_only)
    fused_bias = any(n.endswith(("qkv_proj.bias", "c_attn.bias")) for n in names)
    # a fused qkv linear (Phi-3 qkv_proj, Qwen-1 c_attn) is drawn as three: the same bytes
    q = b.linear(y, h, heads * d, bias=fused_bias or any("q_proj.bias" in n for n in names),
                 role=("q",))
    k = b.linear(y, h, kv * d, bias=fused_bias or any("k_proj.bias" in n for n in names),
                 role=("k",))
    v = b.linear(y, h, kv * d, bias=fused_bias or any("v_proj.bias" in n for n in names),
                 role=("v",))
    if tr.qk_norm is not QkNorm.NONE:
        full = tr.qk_norm is QkNorm.FULL
        q = b.rmsnorm(q, heads * d if full else d, gemma=gemma, leaf="q_norm")
        k = b.rmsnorm(k, kv * d if full else d, gemma=gemma, leaf="k_norm")
    q, k = b.rope(q), b.rope(k)
    if b.prefix is not None:  # prefix tuning: the cache prepends the learned keys and values
        k, v = prefix_kv(b, k, v, heads, kv, d, sdpa=attention != "eager")
        kv = heads if attention != "eager" else kv
    softcap = tr.attn_softcap
    with b.g.checkpoint(selective):
        if attention == "eager" or softcap:
            o = b.eager(q, k, v, heads, kv, dropout=tr.attention_dropout,
                        softcap=softcap, mask=mask)
        else:
            o = b.sdpa(q, k, v, heads)
    o = b.linear(o, heads * d, h, role=("o",))
    b.frame_holds(y)  # the attention's forward(hidden_states) returns after its o_proj
    return _llama_rest(b, x, o, h, ffn, tp, gemma=gemma, sandwich=sandwich, post_only=post_only)


def _llama_rest(b: Blocks, x: Tensor, o: Tensor, h: int, ffn: Any, tp: int, *, gemma: bool,
                sandwich: bool, post_only: bool) -> Tensor:
    """A Llama-style layer after the attention output projection ``o``: (post-norm), residual,
    norm, MLP or MoE, (post-norm), residual."""
    if sandwich or post_only:
        o = b.rmsnorm(o, h, gemma=gemma, leaf="post_attention_layernorm")
    r = b.add(x, o)
    y = r if post_only else b.rmsnorm(
        r, h, gemma=gemma,
        leaf="pre_feedforward_layernorm" if sandwich else "post_attention_layernorm")
    f = ffn.intermediate_size // tp
    if ffn.num_experts:
        m = _moe(b, y, h, ffn, tp)
    else:
        gt = b.linear(y, h, f, role=("gate",))
        up = b.linear(y, h, f, role=("up",))
        act = b.unary(gt)  # silu / gelu_tanh save their input
        m = b.linear(b.mul(act, up), f, h, role=("down",))
        b.frame_holds(y)  # the MLP's forward(x) returns after its down_proj
    if sandwich or post_only:
        m = b.rmsnorm(m, h, gemma=gemma, leaf="post_feedforward_layernorm")
    return b.add(r, m)


def _mla_attention(b: Blocks, y: Tensor, h: int, mla: Mla, heads: int, *, attention: str,
                   dropout: float, mask: Tensor | None, selective: bool) -> Tensor:
    """DeepSeek-V2/V3 multi-head latent attention as transformers 5 writes it
    (``DeepseekV3Attention``): q through the ``q_lora_rank`` bottleneck (``q_a_proj``, norm,
    ``q_b_proj``) or ``q_proj``; ``kv_a_proj_with_mqa`` to the latent plus one shared rope key;
    latent norm; rope on the rope parts (views of q and of the latent output); ``cat`` of q;
    ``kv_b_proj`` to per-head k_nope and v (v stays a view of it); k assembled into a new tensor
    (``new_empty`` + ``copy_``); attention; output projection (returned)."""
    nope, rope, vd, kvr, qr = mla.nope, mla.rope, mla.v, mla.kv_rank, mla.q_rank
    dq = nope + rope
    if qr:
        q = b.linear(b.rmsnorm(b.linear(y, h, int(qr), role=("q",)), int(qr)), int(qr),
                     heads * dq, role=("q",))
    else:
        q = b.linear(y, h, heads * dq, role=("q",))
    ckv = b.linear(y, h, kvr + rope, role=("k", "v"))
    latent = b.rmsnorm(b.view(ckv, kvr / (kvr + rope)), kvr)
    q_rot = b.rope(b.view(q, rope / dq))
    k_rot = b.rope(b.view(ckv, rope / (kvr + rope)))
    q = b.cat([q, q_rot], heads * dq)
    kv = b.linear(latent, kvr, heads * (nope + vd), role=("k", "v"))
    k = b.cat([kv, k_rot], heads * dq)
    v = kv
    t = b.c.tokens
    with b.g.checkpoint(selective):
        math = attention == "sdpa" and b.c.cpu and vd != dq
        if math:  # CPU SDPA's fused kernel needs one head dim for q, k and v: the math path
            # runs on copies (scaled q, k, v), materialising the probabilities
            if b.c.amp:
                q, k, v = (b.cast(b.cast(x, b.c.half), 4) for x in (q, k, v))
            q, k = b.copy(q, 1.0), b.copy(k, 1.0)
            v = b.copy(b.view(kv, vd / (nope + vd)), 1.0)
            o = b.eager(q, k, v, heads, heads, mask=mask, autocast=False, upcast_input=False,
                        out_numel=t * heads * vd)
            if b.c.amp:
                o = b.cast(o, b.c.half)
        elif attention == "eager":
            o = b.eager(q, k, v, heads, heads, dropout=dropout, mask=mask,
                        out_numel=t * heads * vd)
        else:
            pad = attention == "flash" and vd != dq
            if pad:  # flash_attention_2 pads v to the q/k head dim, the output is sliced back
                v = b.copy(b.view(kv, vd / (nope + vd)), dq / vd)
            o = b.sdpa(q, k, v, heads, out_numel=t * heads * (dq if pad else vd))
            if pad:
                o = b.copy(o, vd / dq)
    return b.linear(o, heads * vd, h, role=("o",))


def _moe(b: Blocks, y: Tensor, h: int, ffn: Any, tp: int) -> Tensor:
    """Token-choice top-k MoE as in HF Mixtral/Qwen3-MoE: router logits (saved by softmax in
    fp32), top-k weights, each token's hidden state gathered per chosen expert (``index_select``
    copies, k per token), the expert MLPs on their tokens, weighted and scattered back.

    Under sequence parallelism (Megatron, whose MoE layer requires it with TP) each rank routes
    its own ``tokens / sp`` rows; after the expert-parallel all-to-all the expert-TP ranks
    all-gather their routed rows, so every expert-TP rank runs its ``ffn / etp`` slice of the
    experts on ``etp`` times the rows, and reduce-scatters the output (Megatron-Core
    ``moe/token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher.dispatch_postprocess``
    ``gather_from_sequence_parallel_region(..., group=self.tp_group)``, the expert TP group).
    Without it the TP ranks hold every row already and split the experts' ffn by tp."""
    c = b.c
    t, k, e = c.tokens // c.sp, max(1, ffn.top_k), ffn.num_experts  # local sequence shard
    f = ffn.intermediate_size // c.etp
    gather = c.etp if c.sp > 1 else 1
    logits = b.linear(y, h, e, tokens=t, always_recompute=True)
    probs = b.new(t * e, 4, logits.grad)
    b.g.op([logits], (probs,), [probs])
    topw = b.new(t * k, 4, probs.grad)
    b.g.op([probs], (topw,), [topw])
    routed = t * k  # dropless: every token once per chosen expert
    if c.capacity:  # padded to capacity: every expert processes ceil(cf x t x k / E) rows
        routed = math.ceil(c.capacity * t * k / e) * e
    xs = b.new(routed * h, y.itemsize, y.grad)
    b.g.op([y], (xs,))
    if gather > 1:  # all-gather over the expert TP group
        xg = b.new(routed * gather * h, y.itemsize, y.grad)
        b.g.op([xs], (xg,), kind="comm")
        xs, routed = xg, routed * gather
    gt = b.linear(xs, h, f, tokens=routed, role=("gate",))
    up = b.linear(xs, h, f, tokens=routed, role=("up",))
    act = b.unary(gt)
    out = b.linear(b.mul(act, up), f, h, tokens=routed, role=("down",))
    if gather > 1:  # reduce-scatter back to this rank's routed rows
        routed //= gather
        local = b.new(routed * h, out.itemsize, out.grad)
        b.g.op([out], (local,), kind="comm")
        out = local
    weighted = b.mul(out, topw)
    res = b.new(t * h, weighted.itemsize, weighted.grad)
    b.g.op([weighted], (res,))
    if ffn.shared_experts:
        fs = ffn.shared_intermediate_size // tp
        gt = b.linear(y, h, fs, role=("gate",))
        up = b.linear(y, h, fs, role=("up",))
        shared = b.linear(b.mul(b.unary(gt), up), fs, h, role=("down",))
        if ffn.shared_gate:  # Qwen2-MoE: sigmoid(shared_expert_gate(x)) * shared (sigmoid
            # saves its output, the mul both operands)
            gate = b.unary(b.linear(y, h, 1), saves_input=False, saves_output=True)
            shared = b.mul(gate, shared)
        res = b.add(res, shared)
    return res


def _qkv_attention(b: Blocks, y: Tensor, h: int, heads: int, d: int, *, attention: str,
                   dropout: float, mask: Tensor | None, rotary: int, neox: bool,
                   selective: bool) -> Tensor:
    """Multi-head attention of GPT-2 / GPT-NeoX / BERT: one fused qkv (or three) linear(s) with
    bias, optional partial rotary (NeoX: the first ``rotary`` dims of each head), attention,
    output copy for the output projection."""
    c = b.c
    if neox:  # one fused linear; v stays a view of it, so sdpa's saved v keeps all 3h alive
        qkv = b.linear(y, h, 3 * heads * d, bias=True, role=("q", "k", "v"))
        # partial rotary: rope on a copy of the first `rotary` dims, cat with the rest
        q, k = (b.copy(b.rope(b.copy(qkv, rotary / d / 3)), d / rotary) for _ in range(2))
        v = qkv
    else:
        q = b.linear(y, h, heads * d, bias=True, role=("q",))
        k = b.linear(y, h, heads * d, bias=True, role=("k",))
        v = b.linear(y, h, heads * d, bias=True, role=("v",))
    with b.g.checkpoint(selective):
        fused = attention in ("sdpa", "flash")
        if fused and not (dropout > 0 and c.cpu):
            o = b.sdpa(q, k, v, heads)
            o = b.copy(o, 1.0) if neox else o
        else:  # eager, or CPU sdpa with dropout: the math path materialises the scores
            math = fused and not neox
            low = c.half if c.amp else q.itemsize  # the dtype sdpa is called with
            if math:  # CPU math sdpa: autocast casts q, k, v to 16 bits; the math kernel
                # converts 16-bit q, k, v to fp32 "for accuracy" (attention.cpp,
                # _scaled_dot_product_attention_math; under autocast and 16-bit training alike)
                # and computes on copies (scaled q, k and v), output cast back
                if c.amp:
                    q, k, v = (b.cast(t, c.half) for t in (q, k, v))
                q, k, v = (b.cast(t, 4) for t in (q, k, v))
                q, k, v = (b.copy(t, 1.0) for t in (q, k, v))
            if neox:  # the strided view of the fused output is copied for the matmul
                v = b.copy(v, 1 / 3)
            # GPT-2 and BERT call softmax without dtype: its output keeps the scores' dtype
            # (bf16 under bf16-true, and under CPU autocast, whose fp32 list lacks softmax),
            # fp32 only for fp32 scores or under CUDA autocast (softmax is on its fp32 list;
            # torch/csrc/autograd autocast_mode.cpp). NeoX passes dtype=torch.float32.
            sm32 = neox or math or low == 4 or (c.amp and not c.cpu)
            o = b.eager(q, k, v, heads, heads, dropout=dropout, mask=mask, autocast=not math,
                        upcast_input=False, softmax_fp32=sm32)
            if math and low < 4:
                o = b.cast(o, low)
    return b.linear(o, heads * d, h, bias=True, role=("o",))


def _classic_layer(b: Blocks, x: Tensor, layer: Layer, spec: ModelSpec, *, tp: int,
                   attention: str, mask: Tensor | None, selective: bool) -> Tensor:
    """GPT-2 (pre-LN, Conv1D, gelu_new, dropout everywhere), GPT-NeoX (parallel residual,
    partial rotary, fused qkv), BERT (post-LN, dropout) as transformers writes them."""
    tr, h = _traits(spec), spec.hidden_size
    a, ffn = layer.attention, layer.ffn
    assert a is not None and ffn is not None
    heads, d, f = max(1, a.num_heads // tp), a.head_dim, ffn.intermediate_size // tp
    p_attn, p_res = tr.attention_dropout, tr.residual_dropout
    neox = tr.graph is Graph.GPT_NEOX
    kw = dict(attention=attention, dropout=p_attn, mask=mask,
              rotary=tr.rotary_dims if neox else 0, neox=neox, selective=selective)

    def mlp(y: Tensor) -> Tensor:
        u = b.linear(y, h, f, bias=True, role=("up",))
        act = gelu_new(b, u) if tr.graph is Graph.GPT2 else b.unary(u)
        return b.dropout(b.linear(act, f, h, bias=True, role=("down",)), p_res)

    if tr.placement is NormPlacement.POST_LN:  # BERT
        att = b.dropout(_qkv_attention(b, x, h, heads, d, **kw), p_res)
        r = b.layernorm(b.add(att, x), h)
        return b.layernorm(b.add(mlp(r), r), h)
    if tr.parallel_residual:
        att = b.dropout(_qkv_attention(b, b.layernorm(x, h), h, heads, d, **kw), p_res)
        m = mlp(b.layernorm(x, h))
        return b.add(b.add(m, att), x)
    att = b.dropout(_qkv_attention(b, b.layernorm(x, h), h, heads, d, **kw), p_res)
    r = b.add(att, x)
    return b.add(mlp(b.layernorm(r, h)), r)


def _input_side(b: Blocks, spec: ModelSpec, x: Tensor | None) -> Tensor:
    """What input-side PEFT methods do to the embedding output ``x``: prompt tuning
    (``x`` None: PEFT's ``PeftModelForCausalLM.forward`` embeds the tokens, casts the
    ``virtual_tokens x hidden`` prompt to their dtype and ``torch.cat``s it in front: the
    sequence is longer from here on), prefix tuning (the prompt encoder's ``virtual_tokens x
    layers x 2 x kv width`` output, in the adapter dtype, cast to the base dtype, prepended to
    every layer's keys and values: ``peft_ops.prefix_cat``), ``adapter`` (a trained tensor
    added to the embeddings: the gradient reaches them)."""
    c = b.c
    h = spec.hidden_size
    if c.prompt:
        seq = c.seq - c.prompt
        emb = b.new(c.batch * seq * h, c.act, grad=False)
        b.g.op([], (emb,))
        prompt = b.new(c.batch * c.prompt * h, c.adapter, grad=True)
        b.g.op([], (prompt,))
        return b.cat([b.cast(prompt, c.act), emb], h)
    if c.prefix:
        dim = prefix_token_dim(spec)
        p = b.new(c.batch * c.prefix * spec.num_layers * 2 * dim, c.adapter, grad=True)
        b.g.op([], (p,))
        b.prefix = b.cast(p, c.act)
    if c.input_grad:
        return b.add(x, b.new(h, c.act, grad=True))
    assert x is not None
    return x


def stage_graph(spec: ModelSpec, layers: range, ctx: Ctx, *, first: bool, last: bool,
                tp: int, attention: str, checkpointing: Policy,
                train_from: int | None = None) -> OpGraph:
    """The forward of one pipeline stage (layers ``layers``; embedding if ``first``; final norm,
    head and loss if ``last``) for one micro-batch on one rank, as ``torch.compile`` runs it
    under ``ctx.compile`` (``compiled.py``). ``train_from``: layers from this index on train
    even when ``ctx.trained`` is false (``method = freeze``)."""
    g = _eager_graph(spec, layers, ctx, first=first, last=last, tp=tp, attention=attention,
                     checkpointing=checkpointing, train_from=train_from)
    return compiled(g, ctx.compile) if ctx.compile else g


def _eager_graph(spec: ModelSpec, layers: range, ctx: Ctx, *, first: bool, last: bool,
                 tp: int, attention: str, checkpointing: Policy,
                 train_from: int | None = None) -> OpGraph:
    tr = _traits(spec)
    if tr.graph is Graph.T5:
        return t5_graph(spec, tr, ctx, attention=attention, checkpointing=checkpointing)
    g = OpGraph(stash=checkpointing.stash, save_attention=not ctx.cpu)
    b = Blocks(g, ctx)
    h, V = spec.hidden_size, spec.vocab_size
    if first:
        g.region = "embedding"
        emb = [b.embedding(h, V)] if not ctx.prompt else []
        x = _input_side(b, spec, emb[0] if emb else None)
        if tr.embedding_scale:
            x = b.scale(x)
        if tr.learned_positions:  # + learned positions (+ token types), dropout
            x = b.add(x, b.new(ctx.seq * h // ctx.sp, ctx.act, grad=ctx.trained))
            if tr.token_types:
                x = b.layernorm(b.add(x, b.new(ctx.tokens // ctx.sp * h, ctx.act,
                                               grad=ctx.trained)), h)
            x = b.dropout(x, tr.embedding_dropout)
    else:  # activations received from the previous stage
        x = b.new(ctx.tokens // ctx.sp * h, ctx.half if not ctx.amp else ctx.act, True)
        g.op([], (x,), kind="comm")  # received from the previous stage
    if tr.rotary_dims and any(ly.attention for ly in spec.layers):
        # rotary cos/sin tables (1 x S x rotary dims each), computed once per forward, saved by
        # every layer's rope muls until the backward ends
        d = tr.rotary_dims
        cos = b.new(ctx.seq * d, ctx.act if ctx.amp or ctx.act == 4 else ctx.half, grad=False)
        sin = b.new(ctx.seq * d, cos.itemsize, grad=False)
        g.op([], (cos, sin), [cos, sin])
    masks: dict[str, Tensor] = {}
    if attention == "eager" and tr.causal or tr.eager_mask:
        # eager: a B x 1 x S x S additive mask in the embedding dtype per type (layer_types)
        for kind in sorted(set(tr.layer_types or ["full_attention"])):
            masks[kind] = b.new(ctx.batch * ctx.seq * (ctx.seq + ctx.prefix), ctx.act,
                                grad=False)
            g.op([], (masks[kind],))
    kinds = tr.layer_types
    layer_fn = {Graph.DECODER: _llama_layer,
                Graph.LN_DECODER: ln_decoder_layer}.get(tr.graph, _classic_layer)
    for i in layers:
        g.region = f"layer {i}"
        mask = masks.get(kinds[i] if i < len(kinds) else "full_attention")
        if not ctx.trained and train_from is not None and i >= train_from:
            b.c = replace(ctx, trained=True, act=ctx.train_act)
        with g.checkpoint(checkpointing.layer_checkpointed(i - layers.start)
                          or checkpointing.per_op, per_op=checkpointing.per_op):
            x_in, x = x, layer_fn(b, x, spec.layers[i], spec, tp=tp, attention=attention,
                                  mask=mask, selective=checkpointing.selective)
            b.frame_holds(x_in)  # ``x = layer(x)``: the input is freed as the layer returns
        b.c = ctx
    if last:
        g.region = "head"
        if not tr.causal:  # BERT's MLM head: dense, gelu, LayerNorm, decoder
            x = b.layernorm(b.unary(b.linear(x, h, h, bias=True)), h)
        else:  # the base model's final norm; its forward returns after it
            x = b.layernorm(x, h) if tr.norm is Norm.LAYER else b.rmsnorm(
                x, h, gemma=tr.norm is Norm.RMS_GEMMA, leaf="norm")
            if first and ctx.embeds_held:
                b.frame_holds(*emb)
        head_trained = ctx.trained or ctx.head_trained
        if ctx.loss == "chunked-head" and tr.causal:
            g.region = "loss"
            litgpt_loss.chunked_head_loss(b, x, h, V // tp, trained=head_trained)
            return g
        if ctx.loss in ("chunked", "fused") and tr.causal:
            g.region = "loss"
            loss = b.chunked_lm_loss if ctx.loss == "chunked" else b.fused_lm_loss
            loss(x, h, V // tp, trained=head_trained)
            return g
        head_bias = not tr.causal or any(t.name == "lm_head.bias" for t in spec.head)
        out = b.linear(x, h, V // tp, trained=head_trained, bias=head_bias, role=("lm_head",))
        # torchtune returns self.output(h).float()
        logits = b.cast(out, 4) if ctx.upcast_in_model and tr.causal else out
        g.region = "loss"
        if ctx.loss == "chunked-ce" and tr.causal:
            litgpt_loss.chunked_ce_loss(b, logits, V // tp)
        else:
            b.causal_lm_loss(logits, V // tp, softcap=tr.final_softcap, shift=tr.causal,
                             shift_copy=tr.shift_copy)
        if spec.tied_embeddings and first:
            ends = [o for o in g.ops if o.param_grads and (
                o.region == "embedding" or out in o.outputs)]
            g.tied = (ends[0], ends[-1]) if len(ends) == 2 else ()
    return g
