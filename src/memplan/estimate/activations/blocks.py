"""Building blocks of transformer layers as ``Graph`` ops, the way PyTorch runs them.

Each function mirrors one piece of Hugging Face Transformers' modelling code (transformers
5.x) and what PyTorch's autograd saves for it (``tools/autograd/derivatives.yaml``): e.g. ``mul``
saves the *other* operand for each operand that needs a gradient, ``silu``/``gelu`` save their
input, ``softmax`` its output, ``mm`` its input when the weight is trained and the weight when
the input needs a gradient. Under autocast (``amp``) every matmul input is cast to 16 bits by a
copy that the matmul saves; weights are cast once per forward and cached until autocast exits
(``cached_cast`` in ``aten/src/ATen/autocast_mode.cpp``: leaf tensors that require grad only).
"""

from __future__ import annotations

from . import peft_ops, quant_ops
from .context import Ctx
from .graph import Graph, Tensor
from .lanes import to_int

__all__ = ["Ctx", "Blocks"]


class Blocks:
    """Op writers over one ``Graph``; sizes in elements, dtypes in bytes per element."""

    def __init__(self, g: Graph, ctx: Ctx) -> None:
        self.g, self.c = g, ctx
        self.prefix: Tensor | None = None
        """Prefix tuning's learned keys and values of every layer (``families._input_side``)."""
        self.qkv_dropped: tuple[Tensor, Tensor, Tensor] | None = None
        """The last (input, dropped input) of a q/k/v adapter (``peft_ops``, shared dropout)."""

    def new(self, numel: int, itemsize: int, grad: bool = True, keep: bool = False) -> Tensor:
        return Tensor(to_int(numel) * itemsize, itemsize, grad, keep)

    def frame_holds(self, *ts: Tensor) -> None:
        """The module whose forward wrote the last op returns after it: until then its frame
        holds ``ts`` (its input, ``Module._call_impl``'s ``args``; Python frees a local when
        its frame ends), read or not (``Op.holds``)."""
        op = self.g.ops[-1]
        op.holds = op.holds + ts

    # -- elementwise -------------------------------------------------------------------------
    def cast(self, x: Tensor, itemsize: int) -> Tensor:
        """``x.to(dtype)``: a copy when the dtype changes (ToCopyBackward saves nothing)."""
        if x.itemsize == itemsize:
            return x
        y = self.new(x.nbytes // x.itemsize, itemsize, x.grad)
        self.g.op([x], (y,))
        return y

    def unary(self, x: Tensor, saves_input: bool = True, saves_output: bool = False) -> Tensor:
        """silu, gelu, tanh (saves output), pow (saves input), ..."""
        y = self.new(x.nbytes // x.itemsize, x.itemsize, x.grad)
        self.g.op([x], (y,), ([x] if saves_input and x.grad else []) + ([y] if saves_output else []))
        return y

    def scale(self, x: Tensor) -> Tensor:
        """Multiplication by a Python scalar: a new tensor, nothing saved."""
        y = self.new(x.nbytes // x.itemsize, x.itemsize, x.grad)
        self.g.op([x], (y,))
        return y

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        n = max(a.nbytes // a.itemsize, b.nbytes // b.itemsize)
        y = self.new(n, max(a.itemsize, b.itemsize), a.grad or b.grad)
        self.g.op([a, b], (y,))
        return y

    def mul(self, a: Tensor, b: Tensor, itemsize: int | None = None) -> Tensor:
        """``a * b``: saves ``b`` if ``a`` needs a gradient and ``a`` if ``b`` does."""
        n = max(a.nbytes // a.itemsize, b.nbytes // b.itemsize)
        y = self.new(n, itemsize or max(a.itemsize, b.itemsize), a.grad or b.grad)
        saves = ([b] if a.grad else []) + ([a] if b.grad else [])
        self.g.op([a, b], (y,), saves)
        return y

    def dropout(self, x: Tensor, p: float) -> Tensor:
        """Training-mode dropout: saves a 1-byte mask (CUDA's fused ``native_dropout``). On CPU
        the composite path (``input * noise``, MulBackward0) saves the scaled Bernoulli noise in
        the input's dtype, 16-bit too (measured, torch 2.13: bf16 input, bf16 noise; a 1-byte
        mask left BERT/GPT-2 16-bit eager runs up to 11% low out of sample). p = 0: identity."""
        if p <= 0:
            return x
        n = x.nbytes // x.itemsize
        # torch.compile decomposes dropout into ``rand < p`` (a bool mask) and a mul, on CPU too
        mask = self.new(n, x.itemsize if self.c.cpu and not self.c.compile else 1, grad=False)
        y = self.new(n, x.itemsize, x.grad)
        self.g.op([x], (mask, y), [mask], origin="rng")
        return y

    # -- parameters ----------------------------------------------------------------------------
    def _weight(self, numel: int, trained: bool, itemsize: int | None = None
                ) -> tuple[Tensor | None, tuple[tuple[int, int], ...]]:
        """The weight (``itemsize`` bytes per element, default the model's) as the matmul sees
        it, and the gradient it produces. Under autocast a weight stored in another dtype is
        copied to 16 bits (the copy is cached for the forward when the weight trains)."""
        c = self.c
        size = c.act if itemsize is None else itemsize
        if c.amp and size != c.half:
            w = self.new(numel, c.half, grad=trained, keep=trained)
            self.g.op([], (w,), origin="param")
            return w, ((numel * c.half, numel * size),) if trained else ()
        return None, ((numel * size, 0),) if trained else ()

    def dequant(self, numel: int, grad_bytes: int) -> tuple[Tensor, int]:
        """A bitsandbytes 4-bit weight as its matmul sees it (``Ctx.dequant``): made just before
        the forward matmul (the ``quant_state``-dtype tensor and its copy to the compute dtype
        alive together while the copy is made) and freed after it, nothing saved. The backward
        makes both again before the input gradient (``grad_bytes``) exists, and the copy stays
        through that matmul; returned: the backward's bytes beyond the input gradient, for
        ``Op.bwd_temp``. Measured on CPU (``scripts/measure_bnb_matmul4bit.py``,
        validation/bnb_matmul4bit.json): 4 B per element fp16 -> bf16, 2 B bf16 -> bf16."""
        q, cast = self.c.dequant
        dq = self.new(numel, q, grad=False)
        self.g.op([], (dq,), origin="opaque")
        if not cast:
            return dq, numel * q
        w = self.new(numel, cast, grad=False)
        self.g.op([dq], (w,), origin="opaque")
        return w, max(numel * (q + cast) - grad_bytes, numel * cast)

    def linear(self, x: Tensor, n_in: int, n_out: int, *, bias: bool = False,
               trained: bool | None = None, tokens: int | None = None,
               role: tuple[str, ...] = (), always_recompute: bool = False) -> Tensor:
        """``F.linear``: ``mm`` saves its input when the weight is trained, the (cast) weight when
        the input needs a gradient; the bias gradient is a sum (n_out elements). A frozen linear
        whose ``role`` is an adapter target gets PEFT's adapter path (``peft_ops.adapt``); a GPTQ
        base's block linears dequantise their weight first (``quant_ops.gptq_weight``); an
        ``mm`` to a per-op policy (``addmm`` with a bias; ``always_recompute``: never saved). A
        frozen linear of a bitsandbytes 4-bit base (``Ctx.dequant``; any ``role``, the head's
        only with ``Ctx.quant_head``) runs on its dequantised weight (``dequant``)."""
        c = self.c
        trained = c.trained if trained is None else trained
        t = tokens or c.tokens
        quant = bool(c.dequant[0]) and not trained and bool(role) and (
            role != ("lm_head",) or c.quant_head)
        adapted = not trained and bool(c.method) and bool(c.lora_targets.intersection(role))
        if adapted and c.ia3_ff.intersection(role):  # IA3 on a feed-forward linear's input
            x, adapted = peft_ops.ia3_input(self, x), False
        xin = self.cast(x, c.half) if c.amp else x
        w, pg = self._weight(n_in * n_out, trained)
        bwd = 0
        if quant:
            w, bwd = self.dequant(n_in * n_out, xin.nbytes)
        elif c.gptq and not trained and role and "lm_head" not in role:
            w = quant_ops.gptq_weight(self, n_in * n_out)  # auto-gptq's torch dequantisation
        if bias and trained:
            pg = pg + ((n_out * c.act, 0),)
        if bias and c.bias_trained and not trained:  # BitFit: the bias gradient is a sum
            pg = pg + ((n_out * c.train_act, 0),)
        mm_in = xin
        if c.sp > 1 and tokens is None and xin.nbytes // xin.itemsize * c.sp == t * n_in:
            # sequence parallel: all-gather the shard before the column-parallel matmul; the
            # shard is what is saved (Megatron re-gathers it in the backward)
            mm_in = self.new(t * n_in, xin.itemsize, xin.grad)
            self.g.op([xin], (mm_in,), kind="comm")
        y = self.new(t * n_out, c.half if c.amp else c.act,
                     grad=trained or x.grad or adapted or (bias and c.bias_trained))
        wgrad = trained or self._layer_weight_grad()
        keeps_input = wgrad or (xin.grad and (c.linear_saves_input or (
            quant and c.dequant_saves_input)))
        if keeps_input and not wgrad:  # on MatMul4Bit's ctx (``Ctx.dequant_saves_input``)
            xin.held = self.g.group < 0
        saves = ([xin] if keeps_input else []) + (
            [w] if (w is not None and xin.grad and not quant) else [])
        self.g.op([mm_in] + ([w] if w is not None else []), (y,), saves, grads=(mm_in,),
                  params=pg, kind="mm", save="never" if always_recompute else "" if bias else "mm",
                  bwd_temp=bwd)
        if adapted:
            y = peft_ops.adapt(self, x, y, n_in, n_out, t, bias=bias, role=role)
        if c.sp > 1 and tokens is None and role in (("o",), ("down",)):
            # row-parallel output reduce-scattered back to this rank's sequence shard
            rs = self.new(t // c.sp * n_out, y.itemsize, y.grad)
            self.g.op([y], (rs,), kind="comm")
            y = rs
        return y

    def _layer_weight_grad(self) -> bool:
        """A frozen weight of a layer gets a gradient all the same (``Ctx.layer_weight_grads``:
        FSDP1 flat parameters mixing frozen and trainable tensors, torch 2.13
        ``_flat_param.py`` ``_use_unsharded_views``)."""
        return self.c.layer_weight_grads and self.g.region.startswith("layer ")

    # -- norms ---------------------------------------------------------------------------------
    def _norm_trained(self, leaf: str) -> bool:
        c = self.c
        if c.trained or not c.norms_trained:  # LN tuning: peft_targets.ln_tuning_norm's rule
            return c.trained
        return leaf in c.norm_leaves if c.norm_leaves else leaf not in ("q_norm", "k_norm")

    def rmsnorm(self, x: Tensor, h: int, *, gemma: bool = False, leaf: str = "") -> Tensor:
        """HF ``LlamaRMSNorm``: upcast to fp32, ``pow``/``mean``/``rsqrt``, ``x * rsqrt``, cast
        back, ``weight *`` (Gemma: ``(1 + weight) *`` in fp32, then cast back). ``leaf``:
        the module's name (LN tuning)."""
        c = self.c
        trained, t = self._norm_trained(leaf), x.nbytes // x.itemsize // h  # rows
        in_size = x.itemsize
        xf = self.cast(x, 4)
        sq = self.new(t * h, 4, xf.grad)
        self.g.op([xf], (sq,), [xf])
        var = self.new(t, 4, xf.grad)
        self.g.op([sq], (var,))
        veps = self.new(t, 4, xf.grad)
        self.g.op([var], (veps,))
        r = self.new(t, 4, xf.grad)
        self.g.op([veps], (r,), [r])
        n = self.mul(xf, r)
        w = Tensor(0, 4, grad=trained, external=True)
        pg = ((h * 4, 0),) if trained else ()
        if gemma:
            # (1 + weight.float()) is a new h-element tensor; mul saves n for the weight grad
            out = self.new(t * h, 4, n.grad or trained)
            self.g.op([n, w], (out,), [n] if trained else [], grads=(n,), params=pg)
            return self.cast(out, in_size)
        nc = self.cast(n, in_size)
        w_size = c.train_act if trained and not c.trained else c.act
        wg = trained or self._layer_weight_grad()
        out = self.new(t * h, max(in_size, w_size), nc.grad or wg)
        self.g.op([nc, w], (out,), [nc] if wg else [], grads=(nc,), params=pg)
        return out

    def layernorm(self, x: Tensor, h: int) -> Tensor:
        """``native_layer_norm`` saves input, mean and rstd (fp32, one per row); autocast runs
        it in fp32."""
        c = self.c
        trained, t = c.trained or c.norms_trained, x.nbytes // x.itemsize // h  # rows
        xin = self.cast(x, 4) if c.amp else x
        stats = self.new(2 * t, 4, grad=False)
        out = self.new(t * h, xin.itemsize, xin.grad or trained)
        pg = ((2 * h * (4 if c.amp else c.act), 0),) if trained else ()
        self.g.op([xin], (out, stats), [xin, stats], grads=(xin,), params=pg)
        return out

    # -- embedding and loss ------------------------------------------------------------------------
    def embedding(self, h: int, vocab: int) -> Tensor:
        c = self.c
        trained = c.trained or c.embed_trained
        y = self.new(c.tokens // c.sp * h, c.act, grad=trained)
        self.g.op([], (y,), params=((vocab * h * c.act, 0),) if trained else ())
        return y

    # -- attention cores ---------------------------------------------------------------------------
    def rope(self, x: Tensor) -> Tensor:
        """HF ``apply_rotary_pos_emb``: ``x * cos + rotate_half(x) * sin``; the muls save the
        (shared, external) cos/sin tables; ``neg`` and ``cat`` make two short-lived copies.
        Under autocast ``x`` is 16-bit and cos/sin fp32, so the result is fp32."""
        n = x.nbytes // x.itemsize
        size = max(x.itemsize, self.c.act)
        a = self.new(n, size, x.grad)
        self.g.op([x], (a,))
        neg = self.new(n // 2, x.itemsize, x.grad)
        self.g.op([x], (neg,))
        rot = self.new(n, x.itemsize, x.grad)
        self.g.op([neg, x], (rot,))
        b = self.new(n, size, x.grad)
        self.g.op([rot], (b,))
        return self.add(a, b)

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, heads: int, out_numel: int | None = None
             ) -> Tensor:
        """Fused attention (CPU flash kernel, CUDA flash / memory-efficient): saves q, k, v,
        the output and the fp32 log-sum-exp (one per head and query). Autocast casts q, k, v
        to 16 bits first. ``out_numel``: output elements when the value head dim differs from
        the query's (MLA), else q's."""
        c = self.c
        if c.amp:
            q, k, v = (self.cast(t, c.half) for t in (q, k, v))
        n_out = out_numel or q.nbytes // q.itemsize
        out = self.new(n_out, q.itemsize, q.grad or k.grad or v.grad)
        lse = self.new(c.tokens * heads, 4, grad=False)
        self.g.op([q, k, v], (out, lse), [q, k, v, out, lse], kind="attn", save="attention")
        return out

    def eager(self, q: Tensor, k: Tensor, v: Tensor, heads: int, kv_heads: int, *,
              dropout: float = 0.0, softcap: bool = False, mask: Tensor | None = None,
              autocast: bool = True, upcast_input: bool = True,
              out_numel: int | None = None, softmax_fp32: bool = True) -> Tensor:
        """HF ``eager_attention_forward``: ``repeat_kv`` copies (GQA), ``q @ k^T`` (saves both),
        scaling, mask add, softmax in fp32 (saved) cast back, dropout, ``@ v`` (saves the
        probabilities and v), and a contiguous copy of the output for ``o_proj``."""
        c = self.c
        B, S = c.batch, c.seq
        if c.amp and autocast:
            q, k, v = (self.cast(t, c.half) for t in (q, k, v))
        if kv_heads < heads:
            k = self.copy(k, heads / kv_heads)
            v = self.copy(v, heads / kv_heads)
        size = q.itemsize
        scores = self.new(B * heads * S * (S + c.prefix), size, q.grad or k.grad)
        self.g.op([q, k], (scores,), [q, k], kind="mm")
        s = self.scale(scores)
        if softcap:  # Gemma 2: tanh(s / cap) * cap; tanh saves its output
            s = self.scale(s)
            s = self.unary(s, saves_input=False, saves_output=True)
            s = self.scale(s)
        if mask is not None:
            s = self.add(s, mask)
        if upcast_input:  # softmax(dtype=float32): an fp32 copy of the scores first
            s = self.cast(s, 4)
        # softmax(dtype=float32) (T5: softmax in the scores' dtype, ``softmax_fp32`` False)
        p = self.new(B * heads * S * (S + c.prefix), 4 if softmax_fp32 else s.itemsize, s.grad)
        self.g.op([s], (p,), [p])
        p = self.cast(p, size)
        p = self.dropout(p, dropout)
        out = self.new(out_numel or q.nbytes // q.itemsize, size, p.grad or v.grad)
        self.g.op([p, v], (out,), [p, v], kind="mm")
        return self.copy(out, 1.0)

    def cat(self, parts: list[Tensor], per_token: int) -> Tensor:
        """``torch.cat`` (or ``new_empty`` + ``copy_``) into a new tensor of ``per_token``
        elements per token; its backward slices the gradient and saves nothing."""
        size = max(t.itemsize for t in parts)
        y = self.new(self.c.tokens * per_token, size, any(t.grad for t in parts))
        self.g.op(parts, (y,))
        return y

    def view(self, x: Tensor, factor: float) -> Tensor:
        """A view of ``factor`` of ``x``'s elements (split, slice): no new storage. Ops that
        read it allocate outputs of the view's size; ``x`` must stay alive through another use
        (the simulator does not tie a view's lifetime to its base)."""
        return Tensor(to_int(x.nbytes * factor) // x.itemsize * x.itemsize, x.itemsize, x.grad,
                      external=True)

    def copy(self, x: Tensor, factor: float) -> Tensor:
        y = self.new(to_int(x.nbytes // x.itemsize * factor), x.itemsize, x.grad)
        self.g.op([x], (y,))
        return y

    # -- loss --------------------------------------------------------------------------------------
    def chunked_lm_loss(self, x: Tensor, h: int, vocab: int, *, trained: bool,
                        chunks: int = 8) -> None:
        """torchtune ``CEWithChunkedOutputLoss`` with the model's chunked output projection
        (``num_output_chunks = 8``): the final hidden state is split along the sequence (views),
        each chunk projected to the vocabulary (``mm`` saves the shared input; under autocast
        the weight is cast once, cached), upcast to fp32 and reduced by ``cross_entropy``
        (``log_softmax`` saves its fp32 output); the chunk losses are summed. The recipe drops
        the 16-bit chunk logits before the backward. The weight gradient is produced once, by
        the first chunk the backward reaches (the last one)."""
        c = self.c
        t = c.tokens
        tc = -(-t // chunks)
        xin = self.cast(x, c.half) if c.amp else x
        w, pg = self._weight(h * vocab, trained)
        labels = self.new(t, 8, grad=False)
        self.g.op([], (labels,), [labels])
        total: Tensor | None = None
        for i in range(chunks):
            y = self.new(tc * vocab, c.half if c.amp else c.act, grad=trained or x.grad,
                         keep=True)
            saves = ([xin] if trained else []) + ([w] if w is not None and xin.grad else [])
            self.g.op([xin] + ([w] if w is not None else []), (y,), saves, grads=(xin,),
                      params=pg if i == chunks - 1 else (), kind="mm")
            lsm = self.new(tc * vocab, 4)
            self.g.op([self.cast(y, 4)], (lsm,), [lsm])
            part = self.new(1, 4)
            self.g.op([lsm, labels], (part,), [])
            total = part if total is None else self.add(total, part)

    def fused_lm_loss(self, x: Tensor, h: int, vocab: int, *, trained: bool) -> None:
        """Liger-Kernel ``LigerFusedLinearCrossEntropyLoss`` (``fused_linear_cross_entropy.py``):
        the forward walks the tokens in chunks of ``next_pow2(ceil(BT / ceil(V / H)))``, makes
        each chunk's logits (input dtype) and their fp32 softmax gradient, writes the input
        gradient into a stored B x S x H buffer and accumulates the weight gradient into a
        stored V x H buffer; the backward only scales them. No B x S x V tensor exists."""
        c = self.c
        t = c.tokens
        xin = self.cast(x, c.half) if c.amp else x
        rows = -(-t // -(-vocab // h))  # ceil(BT / ceil(V / H))
        chunk = min(t, 1 << (rows - 1).bit_length())  # next power of two
        grad_in = self.new(t * h, xin.itemsize, grad=False)
        grad_w = self.new(vocab * h, c.act, grad=False) if trained else None
        stored = [grad_in] + ([grad_w] if grad_w is not None else [])
        self.g.op([xin], tuple(stored), stored)
        logits = self.new(chunk * vocab, xin.itemsize, grad=False)
        self.g.op([xin], (logits,), kind="mm")
        dlogits = self.new(chunk * vocab, 4, grad=False)
        self.g.op([logits], (dlogits,))
        loss = self.new(1, 4)
        self.g.op([xin, dlogits] + stored, (loss,), [],
                  params=((vocab * h * c.act, 0),) if trained else ())

    def causal_lm_loss(self, logits: Tensor, vocab: int, *, softcap: bool = False,
                       shift: bool = True, shift_copy: bool = False) -> None:
        """HF ``ForCausalLMLoss``: ``logits.float()``, a shifted int64 copy of the labels,
        ``cross_entropy`` = ``log_softmax`` (saves its fp32 output) + ``nll_loss`` (saves the
        target). The model output holding the logits is dropped before the backward (HF Trainer).
        ``shift_copy`` (Qwen-1's ``QWenLMHeadModel``): the shifted logits are first copied
        (``.contiguous()``, in the logits' dtype), then reduced as above."""
        c = self.c
        t = c.tokens
        if softcap:  # Gemma 2 final_logit_softcapping: logits / cap, tanh (saved), * cap
            logits = self.scale(logits)
            logits = self.unary(logits, saves_input=False, saves_output=True)
            logits = self.scale(logits)
        logits.keep = True
        # ForCausalLMLoss upcasts (logits.float()); BertForMaskedLM calls CrossEntropyLoss on
        # the raw logits, so only autocast (log_softmax runs in fp32) upcasts them; under
        # 16-bit training log_softmax saves a 16-bit output (measured: bert-mlm bf16-true was
        # +19 % with an fp32 loss, issue #17's out-of-sample matrix).
        if shift_copy:
            logits = self.copy(logits, 1.0)
        # Qwen-1's loss (logits_upcast = "none") has no .float(): fp32 only under autocast
        lf = self.cast(logits, 4) if (shift and c.upcast_in_loss) or c.amp else logits
        if shift:
            labels = self.new(t, 8, grad=False)
            self.g.op([], (labels,), [labels])
        else:  # masked LM: nll_loss saves a view of the batch's labels
            labels = Tensor(t * 8, 8, grad=False, external=True)
        lsm = self.new(t * vocab, lf.itemsize)
        self.g.op([lf], (lsm,), [lsm])
        loss = self.new(1, 4)
        self.g.op([lsm, labels], (loss,), [])
