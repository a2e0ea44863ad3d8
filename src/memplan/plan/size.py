"""``size``: the smallest cluster of one GPU type (or node preset) that fits a run, the host
RAM and NVMe each node then needs, and optionally the cluster a throughput target needs.

The ladder of cluster sizes is 1, 2, 4 ... GPUs up to one node, then whole nodes (2, 3, 4, 6,
8, 12, 16 ...). At each size a *fit probe* searches the candidates that hold the least memory
in each family (``probe_space``: full checkpointing, fused loss, flash attention, micro-batch
1, no virtual stages or hybrid sharding, unless the user fixed
them); the first size where one fits is then searched in full by ``plan``, so every number
reported comes from the estimator.

Known limitations: the probe assumes those choices never need more memory than the others
(they save activations or keep fewer buffers); a size where only another choice fits would
be passed over.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

from ..errors import ConfigError
from ..host import HostSetup
from ..model.spec import ModelSpec
from ..recipe import Recipe
from . import PlanResult, Progress, plan
from .evaluate import Cluster, Evaluated
from .space import layout_of

__all__ = ["SizeResult", "size", "ladder", "ram_rules"]

_PROBE = {"checkpointing": "full", "loss": "fused", "attention": "flash", "micro_batch": 1,
          "pp_virtual": 1, "hybrid_shard": 0}


@cache
def ram_rules() -> tuple[dict[str, Any], ...]:
    """RAM : GPU-memory ratios to compare with (``ram_rules.toml``, each with its source)."""
    text = resources.files("memplan.plan").joinpath("ram_rules.toml").read_text()
    return tuple(tomllib.loads(text)["rule"])


def ladder(per_node: int, max_gpus: int) -> Iterator[int]:
    """Cluster sizes tried, smallest first."""
    n = 1
    while n < per_node:
        yield n
        n *= 2
    nodes = sorted({2 ** i for i in range(20)} | {3 * 2 ** i for i in range(19)})
    for k in nodes:
        if k * per_node > max_gpus:
            return
        yield k * per_node


@dataclass(frozen=True, kw_only=True, slots=True)
class SizeResult:
    """The smallest cluster that fits, and the one a throughput target needs."""

    model_id: str
    """The model sized."""
    tried: tuple[tuple[int, int], ...]
    """(GPUs, fitting probe candidates) for each size probed."""
    fit: PlanResult
    """The full search at the smallest size that fits."""
    speed: PlanResult | None
    """The full search at the smallest size meeting ``target_tokens_per_second``."""
    target_tokens_per_second: float | None
    """Throughput asked for (from --tokens-per-second, or --tokens / --hours)."""
    seconds: float
    """Wall time of the sizing."""

    @staticmethod
    def needs(res: PlanResult) -> dict[str, Any]:
        """Host RAM and NVMe per node of the fastest fitting plan and the least any fitting plan
        needs, with the RAM : GPU-memory ratios."""
        best = res.ranked[0]
        least = min(res.ranked, key=lambda e: e.host_bytes or 0)
        gpu_mem = best.gpu_memory_per_node_bytes or 1
        return {"gpus": res.cluster.gpus, "nodes": res.cluster.nodes,
                "best": best, "least_host": least,
                "host_bytes_per_node": best.host_bytes,
                "nvme_bytes_per_node": best.nvme_bytes,
                "ram_to_gpu_ratio": (best.host_bytes or 0) / gpu_mem,
                "least_host_bytes_per_node": least.host_bytes,
                "least_ram_to_gpu_ratio": (least.host_bytes or 0) / gpu_mem,
                "gpu_memory_per_node_bytes": best.gpu_memory_per_node_bytes}

    def to_dict(self) -> dict[str, Any]:
        def part(res: PlanResult | None) -> dict[str, Any] | None:
            if res is None:
                return None
            n = self.needs(res)
            return {**{k: v for k, v in n.items() if k not in ("best", "least_host")},
                    "best": n["best"].to_dict(), "least_host": n["least_host"].to_dict(),
                    "candidates_evaluated": res.candidates_evaluated,
                    "seconds": round(res.seconds, 3)}
        return {"model": self.model_id, "gpu": self.fit.cluster.gpu,
                "gpus_per_node": self.fit.cluster.gpus_per_node, "node": self.fit.cluster.node,
                "tried": [{"gpus": g, "fitting_probe_candidates": f} for g, f in self.tried],
                "smallest": part(self.fit), "target_tokens_per_second":
                    self.target_tokens_per_second, "for_speed": part(self.speed),
                "ram_rules": list(ram_rules()), "seconds": round(self.seconds, 3)}


def _probe(spec: ModelSpec, base: Recipe, cluster: Cluster, fixed: frozenset[str],
           global_batch: int | None, setup: HostSetup | None, workers: int) -> list[Evaluated]:
    """Fitting candidates among the memory-frugal ones at this size (see module doc)."""
    frugal = {k: v for k, v in _PROBE.items() if k not in fixed}
    probe_base = base.with_keys(**frugal)
    try:
        res = plan(spec, probe_base, cluster, fixed=fixed | frozenset(frugal),
                   global_batch=global_batch, setup=setup, workers=workers)
    except ConfigError:
        return []
    return res.ranked


def _speed_floor(fit: PlanResult, target: float) -> int:
    """Fewest GPUs that could reach ``target`` tokens/s at 100 % MFU: ``target x model FLOPs
    per token / peak FLOP/s per GPU``. MFU cannot exceed 1, so smaller clusters are skipped
    without being searched (model FLOPs per token do not depend on the cluster)."""
    best = fit.ranked[0]
    if not best.model_flops_per_token or not best.peak_flops_per_gpu:
        return 1
    return int(target * best.model_flops_per_token // best.peak_flops_per_gpu)


def size(spec: ModelSpec, base: Recipe, *, gpu: str, gpus_per_node: int, node: str | None = None,
         host_ram: str | int | None = None, nvme: str | int | None = None,
         fixed: frozenset[str] = frozenset(), global_batch: int | None = None,
         setup: HostSetup | None = None, target_tokens_per_second: float | None = None,
         max_gpus: int = 2048, progress: Progress | None = None,
         workers: int = 1) -> SizeResult:
    """The smallest cluster that fits ``base`` (the user's keys ``fixed``), searched in full
    there (over the layouts the probe found fitting: engine, ZeRO, offload, tp, pp, cp, ep;
micro-batch, checkpointing, kernel, loss and virtual stages vary); with a target, also the
smallest whose best plan reaches it. ``workers``: processes per search (``plan``).

    Raises:
        ConfigError: nothing fits up to ``max_gpus`` GPUs, or the target is not reached.
    """
    t0 = time.perf_counter()
    tried: list[tuple[int, int]] = []
    fit_at = None
    sizes = list(ladder(gpus_per_node, max_gpus))
    for i, n in enumerate(sizes):
        cluster = Cluster(gpu=gpu, gpus=n, gpus_per_node=min(n, gpus_per_node), node=node,
                          host_ram=host_ram, nvme=nvme)
        ok = _probe(spec, base, cluster, fixed, global_batch, setup, workers)
        tried.append((n, len(ok)))
        if progress is not None:
            progress(i + 1, len(sizes))
        if ok:
            fit_at = cluster
            break
    if fit_at is None:
        raise ConfigError([f"{spec.id} does not fit on up to {max_gpus} {gpu} GPUs with the "
                           f"fixed keys {', '.join(sorted(fixed)) or '(none)'} (probed "
                           f"{', '.join(str(g) for g, _ in tried)} GPUs). Use a larger GPU, "
                           "allow offload, or relax the fixed keys."])
    fit = plan(spec, base, fit_at, fixed=fixed, global_batch=global_batch, setup=setup,
               only=frozenset(layout_of(e.recipe) for e in ok), workers=workers)
    speed = None
    if target_tokens_per_second is not None:
        res: PlanResult | None = fit
        floor = _speed_floor(fit, target_tokens_per_second)
        for n in [s for s in sizes if s >= fit_at.gpus and (s == fit_at.gpus or s >= floor)]:
            if n > fit_at.gpus:
                c = replace(fit_at, gpus=n, gpus_per_node=min(n, gpus_per_node))
                ok = _probe(spec, base, c, fixed, global_batch, setup, workers)
                res = plan(spec, base, c, fixed=fixed, global_batch=global_batch, setup=setup,
                           only=frozenset(layout_of(e.recipe) for e in ok),
                           workers=workers) if ok else None
            best = res.ranked[0] if res is not None and res.ranked else None
            if best is not None and (best.tokens_per_second or 0) >= target_tokens_per_second:
                speed = res
                break
        if speed is None:
            raise ConfigError([f"no cluster of up to {max_gpus} {gpu} GPUs reaches "
                               f"{target_tokens_per_second:,.0f} tokens/s for {spec.id}; "
                               "lower the target or lengthen the deadline."])
    return SizeResult(model_id=spec.id, tried=tuple(tried), fit=fit, speed=speed,
                      target_tokens_per_second=target_tokens_per_second,
                      seconds=time.perf_counter() - t0)

