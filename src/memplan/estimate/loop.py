"""What the user's training loop keeps alive around the step (``Recipe.loop``, issue #15).

The default is the HF Trainer's loop, which the rest of the estimator models: the loss is
taken from the model output and the output is dropped before the backward; ``zero_grad``
frees the gradients after the step. Two common loops keep more:

- **outputs kept** (the HF course and Accelerate examples: ``outputs = model(**batch); loss =
  outputs.loss; loss.backward(); optimizer.step()``): ``outputs.logits`` stays alive through
  the backward and the optimizer step, and, because Python rebinds ``outputs`` only after the
  next ``model(**batch)`` returns, through the whole next forward too (where the new logits
  join it);
- **bitsandbytes < 0.43.2 4-bit bases** (``Ctx.dequant_saves_input``): ``MatMul4Bit`` keeps
  each input on its ``ctx``, which lives as long as the graph, so with the outputs kept the
  inputs live through the optimizer step and the next forward (measured on CPU with 0.42.0's
  ``MatMul4Bit`` source: ``tests/test_bnb_dequant.py``);
- **zero_grad before the backward** (PyTorch's "Optimizing model parameters" tutorial:
  ``pred = model(X); loss = loss_fn(pred, y); optimizer.zero_grad(); loss.backward()``): the
  previous step's gradients are alive through the next forward.

``zero_grad(set_to_none=False)`` (torch 1.x's default) keeps the gradients allocated for good;
``model_states`` treats them as persistent.

With ``use_cache`` (a plain loop over a model whose config has ``use_cache: true``) the kept
outputs also hold ``past_key_values``: transformers' ``DynamicCache`` keeps each layer's keys and
values (``cache_utils.py``, ``DynamicLayer.update``: the ``torch.cat`` result the attention then
uses). Where the attention saves that very tensor (SDPA, or eager without a GQA repeat, in the
matmul dtype) the cache only keeps it past its use: through the rest of the backward, the
optimizer step and the next forward. Where it saves a copy instead (autocast casts the fp32
rotary key to 16-bit; eager GQA repeats K/V), the cache is extra from the forward on.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..breakdown import Category, Item, Phase
from ..model.spec import ModelSpec
from ..recipe import Recipe
from ..units import dtype_bytes
from ..facts import Dtypes
from .activations import held_bytes
from .layout import Stage
from .lines import Line

__all__ = ["loop_lines", "logits_bytes", "kv_cache_bytes"]


def logits_bytes(model: ModelSpec, recipe: Recipe, dt: Dtypes) -> int:
    """The model output's logits on one rank: micro_batch x seq_len / cp tokens x vocab / tp
    in the matmul output dtype (16-bit under autocast)."""
    par = recipe.parallelism
    tokens = recipe.batch.micro_batch * -(-recipe.batch.seq_len // par.cp)
    return tokens * (model.vocab_size // par.tp) * dtype_bytes(dt.compute)


def kv_cache_bytes(model: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes) -> tuple[int, int]:
    """``(shared, extra)``: bytes of ``past_key_values`` on one rank that are the tensors the
    attention saves, and that are copies it does not save. Per decoder layer: micro_batch x
    seq / cp tokens x kv_heads / tp x (head_dim + v_head_dim) elements; the key in fp32 when
    autocast meets rotary (HF ``apply_rotary_pos_emb`` multiplies the 16-bit key by fp32
    cos/sin), else in the matmul dtype; MLA caches every head's expanded key and value."""
    par = recipe.parallelism
    tokens = recipe.batch.micro_batch * -(-recipe.batch.seq_len // par.cp)
    half = dtype_bytes(dt.compute)
    amp = recipe.precision.kind.endswith("-mixed") and dtype_bytes(dt.param) == 4 and half < 4
    rotary = model.traits is not None and model.traits.rotary_dims > 0
    kb = 4 if amp and rotary else half
    shared = extra = 0
    for i in stage.layers:
        layer = model.layers[i]
        a = layer.attention
        if a is None or layer.kind != "decoder":
            continue
        kv = max(1, (a.num_heads if a.kind == "mla" else a.num_kv_heads) // par.tp)
        repeat = recipe.platform.attention == "eager" and a.kind != "mla" \
            and a.num_kv_heads != a.num_heads
        k, v = tokens * kv * a.head_dim * kb, tokens * kv * a.v_head_dim * half
        shared += (0 if repeat or kb != half else k) + (0 if repeat else v)
        extra += (k if repeat or kb != half else 0) + (v if repeat else 0)
    return shared, extra


def _cache_lines(model: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes) -> list[Line]:
    shared, extra = kv_cache_bytes(model, stage, recipe, dt)
    why = "outputs.past_key_values (use_cache): "
    out = [Line(Item(category=Category.ACTIVATIONS, name="kept outputs' past_key_values "
                     "(K/V kept past their use)", bytes=shared,
                     formula=why + "the K/V the attention saved stay alive as each layer's "
                     "backward ends (grows with the backward), and through the step"),
                (Phase.BACKWARD, Phase.OPTIMIZER), grows=True),
           Line(Item(category=Category.ACTIVATIONS, name="kept outputs' past_key_values "
                     "(copies the attention does not save)", bytes=extra,
                     formula=why + "fp32 rotary keys under autocast, un-repeated GQA K/V "
                     "under eager: alive from the forward on"),
                (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)),
           Line(Item(category=Category.ACTIVATIONS, name="previous step's past_key_values "
                     "(until the forward returns)", bytes=shared + extra,
                     formula=why + "rebound only after model(**batch) returns"),
                (Phase.FORWARD,), lazy=True)]
    return [ln for ln in out if ln.item.bytes]


def loop_lines(model: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes,
               states: Sequence[Line]) -> list[Line]:
    """The lines the loop adds to one stage; ``states`` are the stage's model-state lines
    (the gradients line is read from them)."""
    loop, out = recipe.loop, []
    last = stage.index == recipe.parallelism.pp - 1
    if loop.outputs == "kept" and last and recipe.loss.kind != "fused":
        n = logits_bytes(model, recipe, dt)
        out.append(Line(Item(
            category=Category.ACTIVATIONS, name="model outputs kept by the loop (logits)",
            bytes=n, formula="outputs = model(**batch) holds outputs.logits (tokens x vocab in "
            "the matmul dtype) through the backward and the optimizer step"),
            (Phase.BACKWARD, Phase.OPTIMIZER)))
        out.append(Line(Item(
            category=Category.ACTIVATIONS, name="previous step's outputs (until the forward "
            "returns)", bytes=n, formula="the name is rebound only after model(**batch) "
            "returns: the last step's logits live through this forward"),
            (Phase.FORWARD,), lazy=True))
    if loop.outputs == "kept" and last and recipe.parallelism.pp == 1 and (
            held := held_bytes(model, stage, recipe, dt)):
        why = ("bitsandbytes < 0.43.2 MatMul4Bit keeps each 4-bit linear's input on ctx "
               "(ctx.tensors = (A, B), removed by PR #1270); the kept outputs keep the graph, "
               "so they outlive the backward")
        out.append(Line(Item(
            category=Category.ACTIVATIONS, name="4-bit linears' inputs on the kept graph",
            bytes=held, formula=why), (Phase.OPTIMIZER,)))
        out.append(Line(Item(
            category=Category.ACTIVATIONS, name="previous step's 4-bit linears' inputs (until "
            "the forward returns)", bytes=held, formula=why + "; rebound only after "
            "model(...) returns"), (Phase.FORWARD,), lazy=True))
    if loop.outputs == "kept" and loop.use_cache and recipe.checkpointing.kind == "none" \
            and recipe.parallelism.pp == 1:
        out += _cache_lines(model, stage, recipe, dt)
    if loop.zero_grad == "before-backward" and loop.set_to_none:
        grads = [ln for ln in states if ln.item.category is Category.GRADIENTS
                 and Phase.BACKWARD in ln.phases and Phase.FORWARD not in ln.phases]
        for ln in grads:
            out.append(Line(Item(
                category=Category.GRADIENTS, name="previous step's gradients (zero_grad before "
                "the backward)", bytes=ln.item.bytes, pool=ln.item.pool,
                formula="optimizer.zero_grad() after the forward: the last step's gradients "
                "live through this forward"), (Phase.FORWARD,), lazy=True))
    return out
