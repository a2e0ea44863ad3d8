"""What the user's training loop keeps alive around the step (``Recipe.loop``, issue #15).

The default is the HF Trainer's loop, which the rest of the estimator models: the loss is
taken from the model output and the output is dropped before the backward; ``zero_grad``
frees the gradients after the step. Two common loops keep more:

- **outputs kept** (the HF course and Accelerate examples: ``outputs = model(**batch); loss =
  outputs.loss; loss.backward(); optimizer.step()``): ``outputs.logits`` stays alive through
  the backward and the optimizer step, and, because Python rebinds ``outputs`` only after the
  next ``model(**batch)`` returns, through the whole next forward too (where the new logits
  join it);
- **zero_grad before the backward** (PyTorch's "Optimizing model parameters" tutorial:
  ``pred = model(X); loss = loss_fn(pred, y); optimizer.zero_grad(); loss.backward()``): the
  previous step's gradients are alive through the next forward.

``zero_grad(set_to_none=False)`` (torch 1.x's default) keeps the gradients allocated for good;
``model_states`` treats them as persistent.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..breakdown import Category, Item, Phase
from ..model.spec import ModelSpec
from ..recipe import Recipe
from ..units import dtype_bytes
from ..facts import Dtypes
from .layout import Stage
from .lines import Line

__all__ = ["loop_lines", "logits_bytes"]


def logits_bytes(model: ModelSpec, recipe: Recipe, dt: Dtypes) -> int:
    """The model output's logits on one rank: micro_batch x seq_len / cp tokens x vocab / tp
    in the matmul output dtype (16-bit under autocast)."""
    par = recipe.parallelism
    tokens = recipe.batch.micro_batch * -(-recipe.batch.seq_len // par.cp)
    return tokens * (model.vocab_size // par.tp) * dtype_bytes(dt.compute)


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
