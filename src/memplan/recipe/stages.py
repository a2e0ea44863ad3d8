"""Which transformer layers each pipeline stage holds: one split, read by the memory side
(``estimate/layout.py``) and the step time (``timing/``), so both see the same stages."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import Recipe

__all__ = ["stage_layers", "stages_of"]


def stage_layers(num_layers: int, pp: int, *, first: int = 0, last: int = 0,
                 embedding: bool = False, loss: bool = False) -> list[range]:
    """The layers of each of ``pp`` stages, in order.

    - Default: as even as possible, earlier stages taking the remainder.
    - ``first`` / ``last`` (Megatron ``--decoder-first/last-pipeline-num-layers``): those
      stages hold that many, the others share the rest equally.
    - ``embedding`` / ``loss`` (``--account-for-embedding/loss-in-pipeline-split``): the split
      counts the embedding (output layer + loss) as one more layer, so every stage gets
      ``(layers + embedding + loss) / pp`` and the first (last) stage builds one fewer.

    Source: Megatron-Core ``megatron/core/transformer/transformer_block.py``
    ``get_num_layers_to_build``. ``estimate.checks`` refuses the splits Megatron asserts on
    (a remainder that does not divide); here a remainder goes to the earlier middle stages.
    """
    if pp == 1:
        return [range(num_layers)]
    if first or last:
        set_ = [first or None, *([None] * (pp - 2)), last or None]
        rest = num_layers - (first or 0) - (last or 0)
        free = sum(1 for x in set_ if x is None)
        base, extra = divmod(max(rest, 0), free) if free else (0, 0)
        counts = []
        for x in set_:
            if x is None:
                counts.append(base + (1 if extra > 0 else 0))
                extra -= 1
            else:
                counts.append(x)
    elif embedding or loss:
        per = (num_layers + embedding + loss) // pp
        counts = [per] * pp
        counts[0] -= embedding
        counts[-1] -= loss
        counts[pp // 2] += num_layers - sum(counts)  # 0 when (layers + e + l) divides by pp
    else:
        base, extra = divmod(num_layers, pp)
        counts = [base + (1 if s < extra else 0) for s in range(pp)]
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + max(n, 0)))
        start += max(n, 0)
    return out


def stages_of(num_layers: int, recipe: Recipe) -> list[range]:
    """``stage_layers`` under the recipe's pipeline settings."""
    par = recipe.parallelism
    return stage_layers(num_layers, par.pp, first=par.pp_first_layers, last=par.pp_last_layers,
                        embedding=par.pp_split_embedding, loss=par.pp_split_loss)
