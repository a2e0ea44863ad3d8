"""FSDP2 (``fully_shard``) per moment: which units are gathered, and which unit gradients are
alive, at each instant of the step (issue #11 items 1 and 5).

The generic ZeRO-3 line (``model_states._comm_items``: two units gathered and one unit of
unsharded gradients, all forward and backward) misses what FSDP2 does with its *root* unit, the
``fully_shard(model)`` call that owns every parameter no block owns (embedding, final norm,
lm_head: accelerate's ``TRANSFORMER_BASED_WRAP`` and torchtitan-style wrapping alike). From
torch 2.13, ``torch/distributed/fsdp/_fully_shard/``:

1. The root is never resharded after forward: ``FSDPState._lazy_init`` (``_fsdp_state.py``)
   sets the root's ``post_forward_mesh_info = None`` ("for the root, do not reshard after
   forward since for training, the parameters would be freed and all-gathered immediately"),
   so ``FSDPParamGroup.reshard`` returns early in forward. Its parameters stay gathered from
   the root's pre-forward until its post-backward, which runs last
   (``_root_post_backward_final_callback``).
2. Forward, implicit prefetching: ``FSDPParamGroup.wait_for_unshard`` keeps each unit's
   all-gather output in ``comm_ctx.all_gather_state`` until the *next* unit's copy-out, and the
   root's ``_post_forward`` frees the last one. So while block ``i`` runs, its gathered
   parameters and its all-gather output (one more copy of the block) are alive; at the
   embedding the root's output is; at the head and loss the last block's is.
3. Backward prefetch: ``FSDPParamGroup._backward_prefetch`` all-gathers the unit that ran
   before (``post_forward_order[curr_index - 1]``) in each unit's pre-backward: the root's
   pre-backward (at the loss) gathers the last block, block ``i``'s gathers block ``i - 1``.
4. Gradients: autograd writes each unit's gradients unsharded, in ``param_dtype``; the unit's
   ``post_backward`` copies them into one reduce-scatter input (``reduce_dtype``, default
   ``param_dtype``; ``_fsdp_collectives.py`` ``foreach_reduce``) and frees them; that input is
   kept in ``comm_ctx.reduce_scatter_states`` until the next unit's ``post_backward``
   (``reduce_scatter_max_input_buffers = 1``). The root's gradients (lm_head and norm first,
   the embedding last) stay unsharded until the root's post-backward at the very end; the
   sharded (fp32) gradient of a block appears at its own post-backward.

Measured on the tiny Llama (``memplan validate --nproc 2``, FSDP2 hooks traced with the storage
tracker): these are the live bytes at every hook, to the byte. ``reshard_after_forward =
False`` (``SHARD_GRAD_OP``) keeps each block gathered from its forward to its post-backward.

Known limitations: the instant a unit's copy-out runs, the previous unit's all-gather output is
still referenced (``wait_for_unshard``'s local ``prev_all_gather_state``): one more unit for the
length of a copy, before the block's activations exist, so never the peak; not modelled.
Padding of each shard to the world size (``FSDPParam._init_sharded_param``) is not counted
(128 B on the tiny Llama).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..breakdown import Category, Item, Phase
from ..facts import Dtypes
from ..recipe import Recipe
from ..units import dtype_bytes
from .layout import Held, Stage
from .states import quantized_bytes
from .timeline import Instant

__all__ = ["fsdp2_instants", "fsdp2_per_moment", "gathered_bytes", "layer_region", "unit_item",
           "unit_sizes"]

_SRC = "torch 2.13 torch/distributed/fsdp/_fully_shard/"


def fsdp2_per_moment(recipe: Recipe) -> bool:
    """Whether ``fsdp2_instants`` models the gathered units of this recipe (and the generic
    two-unit line is left out): FSDP2 sharding over more than one rank, one pipeline stage, the
    optimizer stepping after the backward."""
    par = recipe.parallelism
    return (str(recipe.engine_kind) == "fsdp2" and par.zero == 3 and par.shard_degree > 1
            and par.pp == 1 and not recipe.optimizer.in_backward)


def gathered_bytes(unit: tuple[Held, ...], recipe: Recipe, cb: float) -> int:
    """Bytes of a unit all-gathered: ``param_dtype`` (packed 4/8-bit for a quantized base)."""
    return math.ceil(sum(quantized_bytes(h.numel, h.tensor.shape[0], recipe.method.quant)
                         if h.quantized else h.numel * cb for h in unit))


def _trained(unit: tuple[Held, ...]) -> int:
    return sum(h.numel for h in unit if h.trainable)


def unit_item(category: Category, name: str, nbytes: float, formula: str) -> Item:
    return Item(category=category, name=name, bytes=math.ceil(nbytes), formula=formula)


def unit_sizes(units: tuple[tuple[Held, ...], ...], recipe: Recipe, cb: float,
               graded: Callable[[tuple[Held, ...]], int]
               ) -> tuple[int, list[int], list[int], int, int]:
    """Of ``units`` = (embedding, block 0 .. block L-1, head): the root unit's gathered bytes
    (embedding and head together), each block's gathered bytes, and the elements that get a
    gradient (``graded``) of each block, of the head and of the embedding."""
    emb, head, blocks = units[0], units[-1], units[1:-1]
    g_blk = [gathered_bytes(u, recipe, cb) for u in blocks]
    return (gathered_bytes(emb + head, recipe, cb), g_blk, [graded(u) for u in blocks],
            graded(head), graded(emb))


def layer_region(label: str) -> tuple[str, int | None]:
    """An instant's region (``layer 3``, ``loss`` ...) and its layer index, if a layer."""
    region = label.split(": ", 1)[-1]
    return region, int(region[6:]) if region.startswith("layer ") else None


def fsdp2_instants(stage: Stage, recipe: Recipe, dt: Dtypes,
                   instants: Sequence[Instant], *, sharded_grads: bool) -> list[Instant]:
    """``instants`` with the FSDP2 unit items of each one added (module docstring).

    ``stage.units`` is (embedding, block 0 .. block L-1, head); the root unit is the embedding
    and the head together. ``sharded_grads``: the sharded gradients of the blocks already
    reduced are added per backward instant (the gradient line then starts at the optimizer
    step); False when that line holds them all step long (gradient accumulation).

    Formula per instant (G = gathered unit in ``param_dtype``, g = its trained elements x
    ``param_dtype`` bytes, s = x the sharded gradient's bytes / shard degree):
    forward embedding 2 G_root; forward block i G_root + 2 G_i; head, loss G_root + G_last;
    backward loss G_root + G_last; head + g_head; block i G_root + g_head + G_i + G_(i-1) +
    g_(i+1) (reduce-scatter input kept) + the part of g_i produced + sum s_(j>i); embedding
    G_root + g_head + g_emb + g_0 + sum s_j.
    """
    cb = dtype_bytes(dt.compute)
    sb = dtype_bytes(dt.grad) / recipe.parallelism.shard_degree
    units = stage.units
    g_root, g_blk, t_blk, t_head, t_emb = unit_sizes(units, recipe, cb, _trained)
    total = t_head + t_emb + sum(t_blk)
    keep = recipe.engine.reshard_after_forward
    n = len(g_blk)
    out = []
    for inst in instants:
        region, i = layer_region(inst.label)
        items = [unit_item(Category.COMMUNICATION, "FSDP2 root unit, gathered (embedding, norm, "
                       "head)", g_root, f"never resharded after forward ({_SRC}_fsdp_state.py "
                       "FSDPState._lazy_init: post_forward_mesh_info = None for the root)")]
        gathered: list[tuple[str, int]] = []
        if inst.phase == Phase.FORWARD:
            if region == "embedding":
                gathered.append(("root all-gather output, kept to the next copy-out", g_root))
            elif i is not None and i < n:
                gathered += [(f"block {i}, gathered", g_blk[i]),
                             (f"block {i} all-gather output, kept to the next copy-out",
                              g_blk[i])]
                if not keep:
                    gathered += [(f"block {j}, kept gathered (reshard_after_forward = false)",
                                  g_blk[j]) for j in range(i)]
            elif n:
                gathered.append((f"block {n - 1} all-gather output, freed by the root's "
                                 "post-forward", g_blk[-1]))
                if not keep:
                    gathered += [(f"block {j}, kept gathered (reshard_after_forward = false)",
                                  g_blk[j]) for j in range(n - 1)]
        else:
            done = inst.progress * total  # trained elements whose gradient exists
            # blocks gathered now: resharded at their post-backward; with reshard_after_forward
            # every block not yet through its backward, else this block and the prefetched one
            live = (range(n) if region in ("loss", "head") else range(i + 1) if i is not None
                    else range(0)) if not keep else (
                [n - 1] if region in ("loss", "head") and n else [i - 1, i]
                if i is not None and i > 0 else [i] if i is not None else [])
            for j in live:
                why = ("gathered" if j == i else "kept gathered (reshard_after_forward = false)"
                       if not keep else f"prefetched ({_SRC}_fsdp_param_group.py "
                       "_backward_prefetch)")
                gathered.append((f"block {j}, {why}", g_blk[j]))
            grads: list[tuple[str, float]] = []
            if region != "loss" and t_head:
                grads.append(("root unit gradients (head), unsharded to the root's "
                              "post-backward", t_head * cb))
            if i is not None and i < n:
                before = t_head + sum(t_blk[i + 1:])
                part = min(max(done - before, 0.0), t_blk[i])
                if part:
                    grads.append((f"block {i} gradients, unsharded, produced so far", part * cb))
                if i + 1 < n and t_blk[i + 1]:
                    grads.append((f"block {i + 1} reduce-scatter input, kept to the next "
                                  "post-backward", t_blk[i + 1] * cb))
            elif region == "embedding":
                if t_emb:
                    grads.append(("root unit gradients (embedding), unsharded", t_emb * cb))
                if n and t_blk[0]:
                    grads.append(("block 0 reduce-scatter input, kept to the root's "
                                  "post-backward", t_blk[0] * cb))
            if sharded_grads:
                reduced = (sum(t_blk[i + 1:]) if i is not None else sum(t_blk)
                           if region == "embedding" else 0)
                if reduced:
                    grads.append(("sharded gradients of the blocks reduced so far", reduced * sb))
            items += [unit_item(Category.GRADIENTS if "sharded gradients" in name
                            else Category.COMMUNICATION, f"FSDP2 {name}", b,
                            f"{_SRC}_fsdp_param_group.py post_backward / foreach_reduce: "
                            "unsharded in param_dtype, reduce-scatter input in reduce_dtype "
                            "(accelerate: = param_dtype)") for name, b in grads]
        items += [unit_item(Category.COMMUNICATION, f"FSDP2 {name}", b,
                        f"{_SRC}_fsdp_param_group.py unshard / wait_for_unshard: param_dtype")
                  for name, b in gathered]
        out.append(replace(inst, items=inst.items + tuple(items)))
    return out
