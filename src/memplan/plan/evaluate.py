"""Evaluate candidate recipes on one cluster with the estimator itself, reusing work.

Every number comes from ``estimate`` + ``with_host_and_time``, the functions behind
``memplan estimate``: there is no second model. What makes a search fast is the ``memo`` the
estimator accepts: the op-level activation simulation of a pipeline stage (most of an
estimate's time) depends only on the stage's layers, the micro-batch shape and dtypes, tp/sp/cp,
the kernel, the loss and checkpointing, so the many candidates that differ in ZeRO stage,
offload, engine or hybrid sharding share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..breakdown import Breakdown, Item, Pool
from ..errors import MemplanError
from ..estimate import StageParts, estimate, rank_totals, stage_parts, trainable_params
from ..hardware import Device, get_device
from ..hardware.nodes import Node, get_node
from ..host import HostSetup, NodeHardware, node_hardware, parse_size
from ..host.plan import GpuSide, host_of
from ..model.spec import ModelSpec
from ..recipe import Recipe
from ..system import stage_loads, with_host_and_time
from ..timing.step import step_figures

__all__ = ["Cluster", "Evaluated", "Evaluator"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """The hardware a plan runs on."""

    gpu: str
    """GPU name (``memplan gpus``)."""
    gpus: int
    """GPUs in the job."""
    gpus_per_node: int
    """GPUs per node."""
    node: str | None = None
    """Node preset (``memplan nodes``): host RAM, NVMe, links."""
    host_ram: str | int | None = None
    """Host RAM per node overriding the preset (``2TiB`` or bytes)."""
    nvme: str | int | None = None
    """Local NVMe per node overriding the preset."""

    @property
    def nodes(self) -> int:
        """Nodes in the job."""
        return -(-self.gpus // self.gpus_per_node)

    def describe(self) -> str:
        where = f"{self.nodes} x {self.node}" if self.node else f"{self.nodes} node(s)"
        return f"{self.gpus} x {self.gpu} ({where}, {self.gpus_per_node} GPUs per node)"


@dataclass(frozen=True, kw_only=True, slots=True)
class Evaluated:
    """One candidate's numbers, each read from its ``Breakdown`` exactly as ``estimate``
    reports it."""

    recipe: Recipe
    """The candidate."""
    peak_bytes: int
    """GPU memory of the fullest rank at its peak (device total: reserved + outside torch)."""
    capacity_bytes: int
    """Usable memory of one GPU."""
    worst_role: str
    """Rank role with the largest footprint (``every rank``, ``pp stage 0 (...)``)."""
    host_bytes: int | None
    """Host RAM of the busiest node at its peak."""
    host_capacity_bytes: int | None
    """Host RAM per node (None: not given)."""
    host_peak_moment: str | None
    """When host RAM peaks (``load``, ``steady step``, ``checkpoint save``)."""
    nvme_bytes: int | None
    """Local NVMe of the busiest node."""
    nvme_capacity_bytes: int | None
    """NVMe per node (None: not given)."""
    gpu_memory_per_node_bytes: int
    """The node's GPU memory, for the RAM : GPU-memory ratio."""
    step_seconds: float | None
    """Step time (None: the GPU has no dense peak for the compute dtype)."""
    tokens_per_second: float | None
    """Job tokens per second."""
    mfu: float | None
    """Model FLOPs utilisation."""
    model_flops_per_token: float | None = None
    """Model FLOPs per trained token (PaLM convention, ``timing.flops``)."""
    peak_flops_per_gpu: float | None = None
    """Dense peak of the compute dtype, FLOP/s."""
    bottleneck: str | None
    """Resource with the largest exposed time."""
    complete: bool = True
    """Host RAM, NVMe and step time were estimated too (False: the GPU already overflows, so
    the candidate is rejected whatever they are; ``Evaluator.evaluate(full=True)`` fills
    them)."""

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.peak_bytes

    @property
    def gpu_fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    @property
    def host_fits(self) -> bool:
        return (self.host_capacity_bytes is None or self.host_bytes is None
                or self.host_bytes <= self.host_capacity_bytes)

    @property
    def nvme_fits(self) -> bool:
        return (self.nvme_capacity_bytes is None or self.nvme_bytes is None
                or self.nvme_bytes <= self.nvme_capacity_bytes)

    @property
    def fits(self) -> bool:
        return self.gpu_fits and self.host_fits and self.nvme_fits

    def overflows(self) -> list[tuple[str, int]]:
        """(what, bytes over) for each resource that does not fit."""
        out = []
        if not self.gpu_fits:
            out.append((f"GPU memory on {self.worst_role}", self.peak_bytes - self.capacity_bytes))
        if not self.host_fits:
            assert self.host_bytes is not None and self.host_capacity_bytes is not None
            out.append(("host RAM per node", self.host_bytes - self.host_capacity_bytes))
        if not self.nvme_fits:
            assert self.nvme_bytes is not None and self.nvme_capacity_bytes is not None
            out.append(("NVMe per node", self.nvme_bytes - self.nvme_capacity_bytes))
        return out

    @classmethod
    def of(cls, recipe: Recipe, b: Breakdown, totals: list[int] | None = None) -> Evaluated:
        """The numbers of ``b``; ``totals``: each rank's ``device_total_bytes`` when already
        computed (``Breakdown.worst`` is the first rank with the largest)."""
        t = b.time
        totals = totals if totals is not None else [r.device_total_bytes for r in b.ranks]
        i = max(range(len(totals)), key=totals.__getitem__)
        return cls(recipe=recipe, peak_bytes=totals[i],
                   capacity_bytes=b.capacity_bytes, worst_role=b.ranks[i].role,
                   host_bytes=b.host.per_node_peak_bytes if b.host else None,
                   host_capacity_bytes=b.host.capacity_bytes if b.host else None,
                   host_peak_moment=b.host.peak_moment if b.host else None,
                   nvme_bytes=b.nvme.bytes if b.nvme else None,
                   nvme_capacity_bytes=b.nvme.capacity_bytes if b.nvme else None,
                   gpu_memory_per_node_bytes=(b.host.gpu_memory_per_node_bytes if b.host
                                              else 0),
                   step_seconds=t.step_seconds if t else None,
                   tokens_per_second=t.tokens_per_second if t else None,
                   mfu=t.mfu if t else None, bottleneck=t.bottleneck if t else None,
                   model_flops_per_token=(t.model_flops_per_step / t.tokens_per_step
                                          if t else None),
                   peak_flops_per_gpu=t.peak_flops_per_gpu if t else None,
                   complete=b.host is not None or b.time is not None)

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": {k: v for k, v in self.recipe.to_dict().items() if k != "notes"},
                "fits": self.fits, "peak_bytes": self.peak_bytes,
                "capacity_bytes": self.capacity_bytes, "headroom_bytes": self.headroom_bytes,
                "worst_rank": self.worst_role, "host_bytes_per_node": self.host_bytes,
                "host_capacity_bytes": self.host_capacity_bytes,
                "host_peak_moment": self.host_peak_moment, "nvme_bytes": self.nvme_bytes,
                "nvme_capacity_bytes": self.nvme_capacity_bytes,
                "step_seconds": self.step_seconds, "tokens_per_second": self.tokens_per_second,
                "mfu": self.mfu, "bottleneck": self.bottleneck,
                "overflows": [{"what": w, "bytes": n} for w, n in self.overflows()]}


class Evaluator:
    """Estimates recipes of one model on one cluster; keeps the estimator's memo between
    calls (one per model: the memo's keys do not name the model)."""

    def __init__(self, spec: ModelSpec, cluster: Cluster, setup: HostSetup | None = None) -> None:
        self.spec = spec
        self.cluster = cluster
        self.setup = setup
        preset: Node | None = get_node(cluster.node) if cluster.node else None
        self.device: Device = get_device(cluster.gpu)
        self.hw: NodeHardware = node_hardware(
            self.device, cluster.gpus_per_node, preset,
            host_ram_bytes=parse_size(cluster.host_ram, "--host-ram") if cluster.host_ram else None,
            nvme_bytes=parse_size(cluster.nvme, "--nvme") if cluster.nvme else None)
        self.memo: dict[object, object] = {}
        self.evaluated = 0

    def breakdown(self, recipe: Recipe) -> Breakdown:
        """The estimate of one candidate: what ``memplan estimate`` prints, without the
        largest-micro-batch search."""
        b = estimate(self.spec, recipe, self.device, search_micro_batch=False, memo=self.memo,
                     load=self.setup.load if self.setup else "full")
        return with_host_and_time(b, self.spec, recipe, self.device, self.hw, self.setup,
                                  memo=self.memo)

    def evaluate(self, recipe: Recipe, *, full: bool = False) -> Evaluated | None:
        """The candidate's numbers; None when the estimator refuses the recipe for this model
        (a degree that does not divide it). Unless ``full``, a candidate whose GPU memory
        overflows is not given host RAM, NVMe and time (``Evaluated.complete`` False): its
        rejection and its GPU numbers are the same either way, and are read from
        ``rank_totals`` (the estimate's parts, without its moments)."""
        load = self.setup.load if self.setup else "full"
        try:
            parts = stage_parts(self.spec, recipe, self.device, memo=self.memo, load=load)
            totals = rank_totals(self.spec, recipe, self.device, load=load, parts=parts)
            peaks = [t for _, t in totals]
            worst = max(range(len(peaks)), key=peaks.__getitem__)
            overflows = peaks[worst] > self.device.capacity_bytes  # Breakdown.fits
            if overflows and not full:
                self.evaluated += 1
                return Evaluated(
                    recipe=recipe, peak_bytes=peaks[worst],
                    capacity_bytes=self.device.capacity_bytes, worst_role=totals[worst][0],
                    host_bytes=None, host_capacity_bytes=None, host_peak_moment=None,
                    nvme_bytes=None, nvme_capacity_bytes=None, gpu_memory_per_node_bytes=0,
                    step_seconds=None, tokens_per_second=None, mfu=None, bottleneck=None,
                    complete=False)
            out = self._complete(recipe, parts, totals[worst][0], peaks[worst])
        except MemplanError:
            return None
        self.evaluated += 1
        return out

    def _complete(self, recipe: Recipe, parts: tuple[StageParts, ...], worst_role: str,
                  peak: int) -> Evaluated:
        """Host RAM, NVMe and step time of a candidate, read as ``with_host_and_time`` reads
        them from ``estimate``'s ``Breakdown``, but from the stage parts the ``Breakdown`` is
        built of (its offloaded bytes are the parts' ``outside`` items) and without building it:
        ``host_of`` and ``estimate_time``'s numbers (``step_figures``) with the same
        arguments. The host estimate is kept
        under what ``host_of`` reads, so the candidates that differ only in checkpointing,
        kernel or loss share it."""
        spec, device = self.spec, self.device
        trainable = trainable_params(spec, recipe, self.memo)
        host = nvme = time = None
        if recipe.platform.device != "cpu":  # with_host_and_time adds nothing on CPU
            setup = self.setup or HostSetup()
            gpu = GpuSide(trainable_params=trainable,
                          host_bytes_per_rank=max(_off_gpu(p[4], Pool.HOST) for p in parts),
                          nvme_bytes_per_rank=max(_off_gpu(p[4], Pool.NVME) for p in parts),
                          capacity_bytes=device.capacity_bytes)
            key = ("host_of", gpu, recipe.parallelism, recipe.method, recipe.precision,
                   recipe.engine, recipe.optimizer, recipe.offload, recipe.batch.micro_batch,
                   recipe.batch.seq_len)
            if key not in self.memo:
                self.memo[key] = host_of(gpu, spec, recipe, self.hw, setup)
            host, nvme = self.memo[key]  # type: ignore[misc]
            time = step_figures(spec, recipe, device, self.hw, setup, trainable, None,
                                stage_loads(spec, recipe, self.memo), memo=self.memo)
        return Evaluated(
            recipe=recipe, peak_bytes=peak, capacity_bytes=device.capacity_bytes,
            worst_role=worst_role,
            host_bytes=host.per_node_peak_bytes if host else None,
            host_capacity_bytes=host.capacity_bytes if host else None,
            host_peak_moment=host.peak_moment if host else None,
            nvme_bytes=nvme.bytes if nvme else None,
            nvme_capacity_bytes=nvme.capacity_bytes if nvme else None,
            gpu_memory_per_node_bytes=host.gpu_memory_per_node_bytes if host else 0,
            step_seconds=time.step_seconds if time else None,
            tokens_per_second=time.tokens_per_second if time else None,
            mfu=time.mfu if time else None, bottleneck=time.bottleneck if time else None,
            model_flops_per_token=time.model_flops_per_token if time else None,
            peak_flops_per_gpu=time.peak_flops_per_gpu if time else None,
            complete=host is not None or time is not None)


def _off_gpu(outside: list[Item], pool: Pool) -> int:
    """``RankBreakdown.off_gpu_bytes``: the rank's items outside the allocator in ``pool``
    (the allocator slack ``estimate`` adds to them is reserved GPU memory, never here)."""
    return sum(i.bytes for i in outside if i.pool == pool)
