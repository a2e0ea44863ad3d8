"""What PEFT's adapter modules add to a frozen linear's forward, as ``Graph`` ops (PEFT 0.21.2):

- **LoRA** (``lora/layer.py`` ``Linear.forward``): ``x`` cast to the adapter dtype, ``lora_A``
  (saves that input), ``lora_B`` (saves the r-wide intermediate), ``* scaling``, added to the
  base output, cast back;
- **LoRA-FA** (``optimizers/lorafa.py``): the same with ``lora_A`` frozen, so its matmul saves
  no input: only the r-wide intermediate is kept;
- **DoRA** (``lora/dora.py`` ``DoraLinearLayer.forward``): the LoRA branch, plus the weight norm
  of ``W + s B A`` (detached; its ``in x in`` identity, ``in x out`` product and ``out x in``
  sums are forward temporaries) and ``(m / ||W + s BA|| - 1) * base + m / ||.|| * lora * s``:
  the two muls save the base output and the LoRA output (both ``tokens x out``);
- **VeRA** (``vera/layer.py``): ``lambda_b * (B (lambda_d * (A x)))`` with frozen shared A and
  B: saves ``A x`` (r wide) and ``B (...)`` (``tokens x out``) for the lambdas' gradients;
- **IA3** (``ia3/layer.py``): ``base(x) * l`` (saves the base output) or, on feed-forward
  targets, ``base(x.to(l.dtype) * l)`` (saves the cast input).

Under autocast every adapter matmul runs in 16 bits on cast copies (``blocks.py``).

With ``lora_dropout`` / ``vera_dropout`` p > 0 (``Ctx.lora_dropout``), the adapter input goes
through ``nn.Dropout`` after its cast to the adapter dtype (``lora_B(lora_A(dropout(x)))``,
``F.linear(dropout(x), sliced_A)``). PEFT builds one ``nn.Dropout`` per adapted linear
(``LoraLayer.update_layer``), so q, k and v each keep their own mask, and a trained ``lora_A``
keeps its own dropped input; with p = 0 the module is ``nn.Identity`` and adds nothing. litgpt's
fused ``LoRAQKVLinear`` drops the attention input once for q, k and v (``Ctx.qkv_dropout_shared``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .graph import Tensor

if TYPE_CHECKING:
    from .blocks import Blocks

__all__ = ["adapt", "ia3_input", "prefix_kv"]

_QKV = frozenset({"q", "k", "v"})


def _mm(b: Blocks, x: Tensor, n_in: int, n_out: int, t: int, *, trained: bool) -> Tensor:
    """An adapter matmul ``x @ W.T`` (W: ``n_out x n_in`` in the adapter dtype, trained or a
    frozen buffer); under autocast on 16-bit copies."""
    c = b.c
    xin = b.cast(x, c.half) if c.amp else x
    w, pg = b._weight(n_in * n_out, trained, c.adapter)
    out = b.new(t * n_out, c.half if c.amp else c.adapter, trained or xin.grad)
    keeps = trained or (c.linear_saves_input and xin.grad)  # ZeRO-3's linear (Ctx)
    saves = ([xin] if keeps else []) + ([w] if w is not None and xin.grad else [])
    # a rank-r GEMM: memory-bound (timed by its bytes, ``kind = "ew"``), but a GEMM to the
    # compiler (``origin = "gemm"``: never recomputed, never fused)
    b.g.op([xin] + ([w] if w is not None else []), (out,), saves, grads=(xin,), params=pg,
           origin="gemm")
    return out


def _dropped(b: Blocks, x: Tensor, role: tuple[str, ...]) -> tuple[Tensor, Tensor]:
    """``dropout(x.to(adapter dtype))`` and ``x.to(adapter dtype)``; with a shared q/k/v
    dropout, the ones made for the same input by the layer's previous q/k/v adapter."""
    c = b.c
    shared = c.qkv_dropout_shared and c.lora_dropout > 0 and bool(role) and _QKV.issuperset(role)
    if shared and b.qkv_dropped is not None and b.qkv_dropped[0] is x:
        return b.qkv_dropped[1], b.qkv_dropped[2]
    xc = b.cast(x, c.adapter)
    xd = b.dropout(xc, c.lora_dropout)
    if shared:
        b.qkv_dropped = (x, xd, xc)
    return xd, xc


def _lora_branch(b: Blocks, x: Tensor, n_in: int, n_out: int, t: int, *,
                 frozen_a: bool = False, role: tuple[str, ...] = ()) -> tuple[Tensor, Tensor]:
    """``lora_B(lora_A(dropout(x)))`` with ``x`` cast to the adapter dtype first; and that
    cast (held by ``adapt``)."""
    r = b.c.lora_rank
    xa, xc = _dropped(b, x, role)
    mid = _mm(b, xa, n_in, r, t, trained=not frozen_a)
    return _mm(b, mid, r, n_out, t, trained=True), xc


def adapt(b: Blocks, x: Tensor, y: Tensor, n_in: int, n_out: int, t: int, *,
          bias: bool = False, role: tuple[str, ...] = ()) -> Tensor:
    """The output of an adapted frozen linear (input ``x``, base output ``y``; ``bias``: the
    base linear has one; ``role``: its roles, for a shared q/k/v dropout).

    The adapted linear's ``forward`` returns after the last op written here: until then its
    frame holds its input ``x`` and the copy ``x = self._cast_input_dtype(x,
    lora_A.weight.dtype)`` rebinds ``x`` to (PEFT 0.21.2 ``lora/layer.py`` ``Linear.forward``,
    ``vera/layer.py``), though under autocast the adapter's matmul reads a 16-bit copy of it
    (``Blocks.frame_holds``). Measured (torch 2.13 CPU, tiny llama, bf16 base, fp32 LoRA, bf16
    autocast): ``down_proj``'s input and its fp32 copy are freed after ``result + ...``."""
    c, kind = b.c, b.c.method
    if kind == "ia3":
        # (result * l).to(result dtype): promoted to the vector's dtype, saves the base output
        scaled = b.mul(y, b.new(n_out, c.adapter, True), itemsize=max(y.itemsize, c.adapter))
        out = b.cast(scaled, y.itemsize)
        b.frame_holds(x)
        return out
    if kind == "vera":
        r = c.lora_rank
        xa, xc = _dropped(b, x, role)
        u = _mm(b, xa, n_in, r, t, trained=False)
        d = b.mul(u, b.new(r, c.adapter, True), itemsize=max(u.itemsize, c.adapter))
        w = _mm(b, d, r, n_out, t, trained=False)
        bw = b.mul(w, b.new(n_out, c.adapter, True), itemsize=max(w.itemsize, c.adapter))
        out = b.cast(b.add(y, bw), y.itemsize)
        b.frame_holds(x, xc)
        return out
    if kind == "dora":
        return _dora(b, x, y, n_in, n_out, t, bias=bias)
    lora, xc = _lora_branch(b, x, n_in, n_out, t, frozen_a=kind == "lora-fa", role=role)
    out = b.cast(b.add(y, b.scale(lora)), y.itemsize)
    b.frame_holds(x, xc)
    return out


def _dora(b: Blocks, x: Tensor, y: Tensor, n_in: int, n_out: int, t: int, *,
          bias: bool) -> Tensor:
    c = b.c
    # weight norm of W + s * B A, detached: forward temporaries only (identity, A(I), the
    # product, W cast to the adapter dtype, the scaled product and the sum)
    tmp = b.new(n_in * n_in + n_in * c.lora_rank + 4 * n_in * n_out, c.adapter, grad=False)
    b.g.op([], (tmp,))
    lora, xc = _lora_branch(b, x, n_in, n_out, t)
    m = b.new(n_out, c.adapter, True)  # magnitude / weight_norm, (1, out)
    size = max(y.itemsize, c.adapter)
    base = b.scale(y) if bias else y  # base_result - bias: a new tensor
    part1 = b.mul(b.scale(m), base, itemsize=size)  # (m - 1) * base_result: saves it
    part2 = b.scale(b.mul(m, lora, itemsize=size))  # m * lora_result * s: saves the LoRA output
    out = b.cast(b.add(y, b.add(part1, part2)), y.itemsize)
    b.frame_holds(x, xc)
    return out


def ia3_input(b: Blocks, x: Tensor) -> Tensor:
    """IA3 on a feed-forward target: ``(x.to(l.dtype) * l).to(previous dtype)``; the mul saves
    the cast input (for the vector's gradient)."""
    c = b.c
    xf = b.cast(x, c.adapter)
    n = xf.nbytes // xf.itemsize
    y = b.mul(xf, b.new(n // c.tokens if c.tokens else 1, c.adapter, True))
    return b.cast(y, x.itemsize)


def _prefix_cat(b: Blocks, prefix: Tensor, x: Tensor, per_token: int) -> Tensor:
    """The cache's ``torch.cat([prefix, x], dim=-2)`` of one layer's keys (or values):
    ``virtual_tokens`` more positions, in the promoted dtype; its backward slices the gradient
    into the prefix embedding's output."""
    c = b.c
    size = max(prefix.itemsize, x.itemsize)
    y = b.new(c.batch * (c.seq + c.prefix) * per_token, size, True)
    b.g.op([prefix, x], (y,))
    return y


def prefix_kv(b: Blocks, k: Tensor, v: Tensor, heads: int, kv: int, d: int, *,
              sdpa: bool) -> tuple[Tensor, Tensor]:
    """Keys and values of one layer under prefix tuning. With a past, queries and keys differ
    in length, so transformers passes SDPA an explicit mask: ``sdpa_attention_forward`` then
    repeats grouped k/v heads (``repeat_kv`` copies, what SDPA saves) and SDPA converts the
    boolean mask into a float one in the query dtype (``convert_boolean_attn_mask``), saved per
    layer (measured: one B x 1 x S x (S + virtual) tensor per layer)."""
    assert b.prefix is not None
    c = b.c
    k, v = (_prefix_cat(b, b.prefix, t, kv * d) for t in (k, v))
    if not sdpa:
        return k, v
    if kv < heads:
        k, v = b.copy(k, heads / kv), b.copy(v, heads / kv)
    mask = b.new(c.batch * c.seq * (c.seq + c.prefix), c.half if c.amp else k.itemsize,
                 grad=False)
    b.g.op([k], (mask,), [mask])  # lives with SDPA's saved tensors
    return k, v
