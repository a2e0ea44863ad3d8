"""litgpt's chunked cross-entropy (``Recipe.loss`` = ``chunked-head`` / ``chunked-ce``).

Written from litgpt's source (github Lightning-AI/litgpt @26857050f):

- ``litgpt/utils.py`` ``chunked_cross_entropy(logits, targets, chunk_size=128)``: for a list of
  logit chunks, each chunk is ``reshape(-1, V)``-ed and reduced by
  ``F.cross_entropy(..., reduction="none")``; otherwise the flattened logits are ``split`` into
  128-row chunks and reduced the same way; the per-token losses are ``cat``-ed and summed.
  ``cross_entropy`` on 16-bit logits runs ``log_softmax`` in their dtype (its saved output is
  16-bit: there is no ``.float()``); under autocast ``log_softmax`` runs in fp32.
- ``litgpt/model.py`` ``GPT.forward(..., lm_head_chunk_size)``: ``[lm_head(x_i) for x_i in
  x.split(lm_head_chunk_size, dim=1)]``.
- ``finetune/lora.py``: ``logits = model(input_ids, lm_head_chunk_size=128)``;
  ``logits[-1] = logits[-1][..., :-1, :]`` (``chunked-head``);
  ``finetune/full.py``: ``logits = model(input_ids)``; ``chunked_cross_entropy(logits[..., :-1,
  :], ...)`` (``chunked-ce``).

Both loops keep ``logits`` bound through the backward and the optimizer step (``Recipe.loop``
``outputs = "kept"``; ``estimate/loop.py`` adds that line).

Known deviations: the shifted targets' int64 copies (tokens x 8 bytes) are not counted.
"""

from __future__ import annotations

from . import peft_ops
from .blocks import Blocks
from .graph import Tensor

__all__ = ["CHUNK", "chunked_head_loss", "chunked_ce_loss"]

CHUNK = 128
"""litgpt's chunk: ``lm_head_chunk_size=128`` (finetune/lora.py) and ``chunk_size=128``
(``chunked_cross_entropy``'s default)."""


def _ce(b: Blocks, logits: Tensor) -> Tensor:
    """``F.cross_entropy(chunk, target, reduction="none")``: ``log_softmax`` saves its output (in
    the logits' dtype, fp32 under autocast); ``nll_loss`` makes one loss per row."""
    c = b.c
    lf = b.cast(logits, 4) if c.amp else logits
    n = lf.nbytes // lf.itemsize
    lsm = b.new(n, lf.itemsize)
    b.g.op([lf], (lsm,), [lsm])
    part = b.new(1, lf.itemsize)
    b.g.op([lsm], (part,), [])
    return part


def _sum(b: Blocks, parts: list[Tensor]) -> None:
    """``torch.cat(loss_chunks).sum() / n``: scalars for the memory count."""
    total = parts[0]
    for p in parts[1:]:
        total = b.add(total, p)


def chunked_head_loss(b: Blocks, x: Tensor, h: int, vocab: int, *, trained: bool) -> None:
    """litgpt ``finetune/lora.py``: the final hidden state split into 128-token chunks (views),
    each projected by ``lm_head`` (``mm`` saves the shared input when the head trains and the
    weight when the input needs a gradient; a LoRA adapter on ``lm_head`` adds its branch per
    chunk, ``peft_ops.adapt``) and held in the returned list; the last chunk is sliced by one
    position, which its ``reshape`` copies when the batch has more than one row; each chunk
    reduced by ``_ce``. The head weight's gradient is produced once (the last chunk's backward
    runs first). Deviation: under autocast a frozen head's weight is cast once here; autocast
    caches only trainable leaves, so each chunk casts (and saves) its own copy. A quantised head
    (``Ctx.quant_head``, litgpt's ``--quantize bnb.*``) is dequantised by every chunk, in the
    forward and again in its backward (``Blocks.dequant``)."""
    c = b.c
    xin = b.cast(x, c.half) if c.amp else x
    w, pg = b._weight(h * vocab, trained)
    quant = bool(c.dequant[0]) and c.quant_head and not trained
    adapted = not trained and bool(c.method) and "lm_head" in c.lora_targets
    n = -(-c.seq // CHUNK)
    parts = []
    for i in range(n):
        rows = c.batch * min(CHUNK, c.seq - i * CHUNK)
        bwd = 0
        if quant:
            w, bwd = b.dequant(h * vocab, xin.nbytes)
        # the list holds the chunk's logits: the base output itself, or the adapter's sum
        y = b.new(rows * vocab, c.half if c.amp else c.act, grad=trained or x.grad or adapted,
                  keep=not adapted)
        keeps_input = trained or (quant and c.dequant_saves_input and xin.grad)
        if keeps_input and not trained:  # on MatMul4Bit's ctx (``Ctx.dequant_saves_input``)
            xin.held = b.g.group < 0
        saves = ([xin] if keeps_input else []) + (
            [w] if w is not None and xin.grad and not quant else [])
        b.g.op([xin] + ([w] if w is not None else []), (y,), saves, grads=(xin,),
               params=pg if i == n - 1 else (), kind="mm", bwd_temp=bwd)
        if adapted:  # the adapter sees the chunk (a view of x): its casts are chunk-sized
            xc = Tensor(rows * h * x.itemsize, x.itemsize, x.grad, external=True)
            b.g.op([x], (xc,))
            y = peft_ops.adapt(b, xc, y, h, vocab, rows)
            y.keep = True
        if i == n - 1 and c.batch > 1:  # logits[-1][..., :-1, :].reshape(-1, V): a copy
            y = b.copy(y, (rows - c.batch) / rows)
        parts.append(_ce(b, y))
    _sum(b, parts)


def chunked_ce_loss(b: Blocks, logits: Tensor, vocab: int) -> None:
    """litgpt ``finetune/full.py``: the whole logits, sliced to ``seq - 1`` positions (a view; its
    ``reshape`` copies it when the batch has more than one row), ``split`` into 128-row chunks
    (views), each reduced by ``_ce``. In the backward ``SplitBackward`` waits for every chunk's
    gradient, then concatenates them, and ``SliceBackward`` writes a full-size gradient."""
    c = b.c
    logits.keep = True
    rows = c.batch * (c.seq - 1)
    if c.batch > 1:
        flat = b.copy(logits, rows / c.tokens)
    else:  # a view of the logits; its gradient is still a new tensor
        flat = Tensor(rows * vocab * logits.itemsize, logits.itemsize, logits.grad, external=True)
        b.g.op([logits], (flat,))
    n = -(-rows // CHUNK)
    chunks = tuple(Tensor(min(CHUNK, rows - i * CHUNK) * vocab * flat.itemsize, flat.itemsize,
                          flat.grad, external=True) for i in range(n))
    b.g.op([flat], chunks, grads=(flat,))  # split: views; its backward concatenates
    parts = [_ce(b, ch) for ch in chunks]
    b.g.op([flat], ())  # the chunks are views: the copy lives until the last one is reduced
    _sum(b, parts)
