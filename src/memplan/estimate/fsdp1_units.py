"""FSDP1 (``FullyShardedDataParallel``, ``FULL_SHARD``) per moment: which units are gathered,
and which unsharded unit gradients are alive, at each instant of the step (issue #11 items 1
and 5).

The generic ZeRO-3 line (``model_states._comm_items``: two units gathered and one unit of
unsharded gradients, all forward and backward) is not what FSDP1 does with accelerate's
defaults (accelerate 1.15 ``FullyShardedDataParallelPlugin``: ``forward_prefetch=False``,
``backward_prefetch=None`` for ``NO_PREFETCH``, ``limit_all_gathers=True``). From torch 2.13,
``torch/distributed/fsdp/``:

1. The root unit (every parameter no layer owns: embedding, final norm, lm_head) is never
   resharded after forward: ``_runtime_utils.py`` ``_post_forward_reshard``:
   ``free_unsharded_flat_param = not state._is_root and ...``. Its padded unsharded flat
   parameter stays from the root's pre-forward to its post-backward, which runs last (the
   embedding's gradient is the last one of the unit).
2. A layer unit is all-gathered in its pre-forward and freed in its post-forward
   (``FULL_SHARD``), all-gathered again in its pre-backward and freed in its post-backward
   (``_post_backward_reshard``). Without ``forward_prefetch``/``backward_prefetch`` no other
   unit is gathered ahead (``_prefetch_handle`` returns when the policy is ``None``), so one
   layer is gathered at a time, beside the root. ``limit_all_gathers`` only bounds in-flight
   all-gathers (at most two, ``_FreeEventQueue``), which without prefetching never exceed one.
   ``backward_prefetch = BACKWARD_PRE`` (``Engine.fsdp1_backward_prefetch``, PEFT's example
   FSDP configs) gathers the next block at each pre-backward: the last block from the loss on,
   block ``i - 1`` beside block ``i``. ``BACKWARD_POST`` gathers it after the current block is
   resharded, which adds nothing at these instants.
3. Gradients: in forward and backward the module parameters are autograd views of the
   unsharded flat parameter (``_flat_param.py`` ``_use_unsharded_views``), so each
   parameter's gradient waits, unsharded in ``param_dtype``, in the input buffer of the view's
   backward until the whole unit's flat gradient exists; the unit's post-backward hook
   (``_post_backward_hook`` -> ``_reduce_grad``) then reduce-scatters it into a new padded
   shard and drops it (``flat_param.grad = None``). The root's gradients (lm_head and norm
   first, the embedding last) therefore stay unsharded to the end of the backward. A unit that
   mixes frozen and trainable tensors (``fsdp1_flat.py``) gets a gradient for all of them.
   The views come from ``torch.split`` (``_get_unflat_views_unaligned``), whose backward
   concatenates the held gradients into the flat one: for that op the unit's gradients exist
   twice. At the last instant (the embedding, the root's end) nothing larger is alive, so it
   is counted there; inside a block the activation gradients are larger (not counted).

Measured on the tiny Llama (``memplan validate --nproc 2``, FSDP1 configured from memplan's
accelerate export, 2 ranks, gloo, CPU): see ``validation/dist_nproc2.json``.

Known limitations: ``forward_prefetch``, ``SHARD_GRAD_OP`` and CPU offload are not modelled
here (``fsdp1_per_moment`` is false for zero=2 and for offload; the recipe has no forward
prefetch knob).
Under mixed precision the low-precision shard (``_mp_shard``, one shard in ``param_dtype``)
exists only for the length of the all-gather; not counted. A block's flat-gradient
concatenation is not counted (see 3.): the estimate has one instant per block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..breakdown import Category, Phase
from ..facts import Dtypes
from ..recipe import Recipe
from ..units import dtype_bytes
from .fsdp1_flat import has_leaf_units, layer_flat_part, mixes_frozen
from .fsdp2_units import gathered_bytes, layer_region, unit_item, unit_sizes
from .layout import Held, Stage
from .timeline import Instant

__all__ = ["fsdp1_instants", "fsdp1_per_moment"]

_SRC = "torch 2.13 torch/distributed/fsdp/_runtime_utils.py"


def fsdp1_per_moment(recipe: Recipe) -> bool:
    """Whether ``fsdp1_instants`` models the gathered units of this recipe (and the generic
    two-unit line is left out): FSDP1 ``FULL_SHARD`` over more than one rank, one pipeline
    stage, the optimizer stepping after the backward, no CPU offload (``CPUOffload`` moves each
    sharded gradient to the host at its post-backward: not measured, the generic line stays)."""
    par = recipe.parallelism
    return (str(recipe.engine_kind) == "fsdp1" and par.zero == 3 and par.shard_degree > 1
            and par.pp == 1 and not recipe.optimizer.in_backward
            and str(recipe.offload.kind) == "none")


def _graded(unit: tuple[Held, ...], flat: bool) -> int:
    """Elements of ``unit`` that get a gradient: all of them when FSDP1's flat gradient covers
    a unit that mixes frozen and trainable tensors, else the trainable ones."""
    if flat and any(h.trainable for h in unit):
        return sum(h.numel for h in unit)
    return sum(h.numel for h in unit if h.trainable)


def fsdp1_instants(stage: Stage, recipe: Recipe, dt: Dtypes,
                   instants: Sequence[Instant], *, sharded_grads: bool) -> list[Instant]:
    """``instants`` with the FSDP1 unit items of each one added (module docstring).

    ``stage.units`` is (embedding, block 0 .. block L-1, head); the root unit is the embedding
    and the head together. ``sharded_grads``: the sharded gradients of the blocks already
    reduced are added per backward instant (the gradient line then starts at the optimizer
    step); False when that line holds them all step long (gradient accumulation). Formula per
    instant (G = gathered unit in ``param_dtype``, g = the
    elements that get a gradient x ``param_dtype`` bytes): forward G_root, + G_i in block i;
    backward (+ G_(last) at loss and head and G_(i-1) in block i under BACKWARD_PRE) loss G_root; head G_root + g_head; block i G_root + g_head + G_i + the part of
    g_i produced so far + s_(j>i); embedding G_root + 2 (g_head + g_emb) + s_all (s: g in the
    gradient dtype / shard degree).
    """
    cb = dtype_bytes(dt.compute)
    sb = dtype_bytes(dt.grad) / recipe.parallelism.shard_degree
    flat = mixes_frozen(stage, recipe)
    units = stage.units
    g_root, g_blk, t_blk, t_head, t_emb = unit_sizes(units, recipe, cb,
                                                     lambda u: _graded(u, flat))
    blocks = units[1:-1]
    total = t_head + t_emb + sum(t_blk)
    n = len(blocks)
    pre = str(recipe.engine.fsdp1_backward_prefetch) == "backward_pre"
    leaves = [has_leaf_units(u, recipe) for u in blocks]
    out = []
    for inst in instants:
        region, i = layer_region(inst.label)
        items = [unit_item(Category.COMMUNICATION, "FSDP1 root unit, gathered (embedding, norm, "
                           "head)", g_root, f"never resharded after forward ({_SRC} "
                           "_post_forward_reshard: not state._is_root)")]
        if i is not None and i < n:
            items.append(unit_item(Category.COMMUNICATION, f"FSDP1 block {i}, gathered",
                                   g_blk[i], f"{_SRC} _pre_forward_unshard / "
                                   "_pre_backward_hook; freed at its post-forward / "
                                   "post-backward"))
        # BACKWARD_PRE: each pre-backward gathers the unit whose forward ended just before
        # (_get_handle_to_prefetch, _ExecOrderData.get_handle_to_backward_prefetch: post-forward
        # index - 1); the root's pre-backward, at the loss, gathers the last block
        # block i - 1 is gathered inside block i's backward only when block i has no units of
        # its own: else the unit prefetched at block i's pre-backward is block i's last adapter
        # leaf, and block i - 1 comes with the first leaf's, at the end of block i (not counted)
        ahead = (None if inst.phase != Phase.BACKWARD or not pre else n - 1
                 if region in ("loss", "head") else i - 1
                 if i is not None and 0 < i < n and not leaves[i] else None)
        if ahead is not None and ahead >= 0:
            # the layer's own flat parameter: its adapter leaves are units of their own
            items.append(unit_item(Category.COMMUNICATION, f"FSDP1 block {ahead}, prefetched",
                                   gathered_bytes(layer_flat_part(blocks[ahead], recipe),
                                                  recipe, cb), f"{_SRC} _prefetch_handle (backward_prefetch "
                                   "= BACKWARD_PRE)"))
        grads: list[tuple[str, float]] = []
        if inst.phase == Phase.BACKWARD and region != "loss":
            done = inst.progress * total
            if t_head:
                grads.append(("root unit gradients (head), unsharded to the root's "
                              "post-backward", t_head * cb))
            if i is not None and i < n:
                part = min(max(done - t_head - sum(t_blk[i + 1:]), 0.0), t_blk[i])
                if part:
                    grads.append((f"block {i} gradients, unsharded, produced so far", part * cb))
            elif region == "embedding":
                if t_emb:
                    grads.append(("root unit gradients (embedding), unsharded", t_emb * cb))
                if t_head + t_emb:
                    # the split's backward concatenates its outputs' gradients into the flat
                    # gradient while they are still held: the unit twice, for one op
                    grads.append(("root unit flat gradient, assembled beside them",
                                  (t_head + t_emb) * cb))
            reduced = (sum(t_blk[i + 1:]) if i is not None else sum(t_blk)
                       if region == "embedding" else 0)
            if sharded_grads and reduced:
                items.append(unit_item(Category.GRADIENTS, "FSDP1 sharded gradients of the "
                                       "blocks reduced so far", reduced * sb,
                                       f"{_SRC} _reduce_grad / _accumulate_sharded_grad: "
                                       "a new padded shard per unit at its post-backward"))
        items += [unit_item(Category.COMMUNICATION, f"FSDP1 {name}", b,
                            f"{_SRC} _reduce_grad: the unit's flat gradient, unsharded in "
                            "param_dtype, until its post-backward reduce-scatter")
                  for name, b in grads]
        out.append(replace(inst, items=inst.items + tuple(items)))
    return out
