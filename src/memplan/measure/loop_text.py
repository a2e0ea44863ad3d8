"""The loop a session saw (``loop_seen.LoopWatch.record``) as text, and the recipe flags that
would make an estimate assume the same loop. No torch."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..recipe import Recipe

__all__ = ["describe_loop", "loop_hints"]


def describe_loop(loop: dict[str, Any]) -> str:
    """One line: ``loop seen: outputs kept; zero_grad after-step (set_to_none=True); ...``."""
    parts = []
    if loop.get("outputs"):
        parts.append(f"outputs {loop['outputs']}")
    if loop.get("zero_grad"):
        stn = loop.get("set_to_none")
        parts.append(f"zero_grad {loop['zero_grad']}"
                     + ("" if stn is None else f" (set_to_none={stn})"))
    if (n := loop.get("forwards_per_step")) and n > 1:
        parts.append(f"{n} forwards per optimizer step (gradient accumulation)")
    if loop.get("optimizer"):
        parts.append(f"optimizer {loop['optimizer']}")
    return "loop seen: " + ("; ".join(parts) if parts else "no optimizer step")


def _impl(recipe: dict[str, Any]) -> str:
    """The recipe's optimizer_impl, ``auto`` resolved as the estimator does
    (``Recipe.optimizer_impl``); a dict that is no longer a valid recipe gives its value as is."""
    try:
        return Recipe.from_dict(recipe).optimizer_impl
    except ConfigError:
        return str(recipe.get("optimizer_impl", "auto"))


def loop_hints(loop: dict[str, Any], recipe: dict[str, Any]) -> list[str]:
    """Where the loop seen differs from the one ``recipe`` (an estimate's ``recipe`` dict)
    assumes: one line each, naming the flag that matches the run."""
    out = []
    outputs = str(loop.get("outputs") or "")
    if outputs and outputs.split(",")[0] != recipe.get("outputs", "dropped"):
        flag = "kept" if outputs.startswith("kept") else "dropped"
        out.append(f"the run's outputs were {outputs}; the estimate assumed "
                   f"{recipe.get('outputs', 'dropped')} (use --outputs {flag})")
    if "past_key_values" in outputs and not recipe.get("use_cache", False):
        out.append("the run's kept outputs held past_key_values (the model's config has "
                   "use_cache on; use --use-cache, or set model.config.use_cache = False)")
    zg = loop.get("zero_grad")
    if zg == "before-backward" and recipe.get("zero_grad", "after-step") != zg:
        out.append("the run called zero_grad before the backward (use --zero-grad "
                   "before-backward)")
    kept = zg == "none (gradients kept)" or loop.get("set_to_none") is False
    if kept and recipe.get("set_to_none", True):
        out.append("the run kept its gradients allocated across steps (zero_grad(set_to_none="
                   "False), or no zero_grad): use --no-set-to-none")
    seen = str(loop.get("optimizer") or "").split(" ", 1)
    if len(seen) == 2 and seen[1] in ("fused", "foreach", "for-loop") \
            and seen[1] != _impl(recipe):
        out.append(f"the run's optimizer stepped {seen[1]}; the estimate assumed {_impl(recipe)} "
                   f"(use --optimizer-impl {seen[1]})")
    n = loop.get("forwards_per_step")
    if n and n > 1 and int(recipe.get("grad_accum", 1)) != n:
        out.append(f"the run did {n} forwards per optimizer step; the estimate assumed "
                   f"grad_accum={recipe.get('grad_accum', 1)} (use --grad-accum {n})")
    return out
