"""When nothing fits: how far the cluster is from holding the run, and what would."""

from __future__ import annotations

from ..errors import ConfigError
from ..units import fmt_bytes
from . import PlanResult

__all__ = ["check_fits", "gpus_lower_bound"]

_SHOWN = ("engine", "zero", "offload", "tp", "pp", "cp", "ep", "micro_batch", "checkpointing",
          "loss")


def gpus_lower_bound(gpus: int, per_node: int, peak: int, capacity: int) -> int:
    """``ceil(gpus x peak / capacity)`` rounded up to whole nodes: the model-state share of the
    fullest GPU scaled down. A lower bound (activations and buffers do not shrink with more
    GPUs), used only to point at ``memplan size``."""
    need = -(-gpus * peak // max(1, capacity))
    if need > per_node:
        need = -(-need // per_node) * per_node
    return max(need, gpus + 1)


def check_fits(res: PlanResult) -> None:
    """Raise ``ConfigError`` when no candidate fits: the least-overflowing candidate, by how
    much each resource overflows, and what would fit."""
    if res.ranked:
        return
    # the rejected families' closest candidates are evaluated in full (host RAM, NVMe too)
    pool = [r.closest for r in res.rejected] or list(res.rows)
    closest = min(pool, key=lambda e: sum(n for _, n in e.overflows()))
    c = res.cluster
    d = closest.recipe.to_dict()
    what = ", ".join(f"{k}={d[k]}" for k in _SHOWN)
    over = "; ".join(f"{w} by {fmt_bytes(n)}" for w, n in closest.overflows())
    fix = []
    if not closest.gpu_fits:
        need = gpus_lower_bound(c.gpus, c.gpus_per_node, closest.peak_bytes,
                                closest.capacity_bytes)
        fix.append(f"at least {need} {c.gpu} GPUs by its GPU footprint (`memplan size` finds "
                   "the smallest that fits)")
    if not closest.host_fits and closest.host_bytes is not None:
        fix.append(f"{fmt_bytes(closest.host_bytes)} of host RAM per node (--host-ram)"
                   + (" or a lighter checkpoint load (its peak is while loading: --load "
                      "sharded or meta)" if closest.host_peak_moment == "load" else ""))
    if not closest.nvme_fits and closest.nvme_bytes is not None:
        fix.append(f"{fmt_bytes(closest.nvme_bytes)} of NVMe per node (--nvme)")
    raise ConfigError([
        f"{res.model_id} does not fit {c.describe()}: none of the {res.candidates_evaluated} "
        f"candidates fits. The closest ({what}) overflows {over}. It would need "
        f"{'; '.join(fix)}; or hold fewer keys fixed."])
