"""One pipeline stage's share of a step on one of its ranks: kernel, memory-bound, launch,
collective and offload seconds (issue #19). ``step.py`` runs this for every stage and lets the
slowest one set the step (``pipeline.py``).

Per stage and step (``m`` micro-batches; the stage's layers only, its own parameters):

- **compute**: ``kernels.kernel_seconds`` of the stage's layers (+ the output head on the last);
- **hbm**: the op graph's memory-bound bytes of the stage (``StageLoad.traffic``) x m, plus the
  GPU optimizer step over the stage's parameter partition;
- **TP**: 4 all-reduces of ``b s h`` per layer per micro-batch (+2 where the forward is
  recomputed: ``full``'s checkpointed layers, every layer under ``op``);
- **EP** (Megatron-Core ``MoEAlltoAllTokenDispatcher``, ``megatron/core/transformer/moe/
  token_dispatcher.py`` @0014f13): per MoE layer and pass an all-to-all over the ``ep`` group of
  the rank's ``b s/tp x top_k`` routed tokens (dispatch, and combine; across nodes at one NIC per
  GPU for the remote share, ``comms.alltoall_s``) and, with ``etp > 1``, an
  all-gather / reduce-scatter over the expert-TP group of ``etp`` times that; forward and
  backward (+ the recomputed forward as for TP). The EP group's stride is ``etp`` (expert rank
  order ``tp-ep-dp-pp`` with the expert TP innermost, ``parallel_state.initialize_model_parallel``);
- **PP**: one ``b s h`` send and receive per micro-batch each way;
- **CP** (PyTorch ring attention, ``ring.py``): the fp32 merges of the per-block outputs and
  gradients are memory-bound bytes on top of the op graph's;
- **FSDP2** (``fsdp2.py``): ``fully_shard``'s all-gather copy-out and reduce-scatter copy-in,
  memory-bound kernels on the compute stream, added to the stage's bytes;
- **DP** (``overlap.py``), **CP** collectives, offload, NVMe, CPU optimizer and data: as in ``step.py``'s
  docstring, over the stage's own trainable elements;
- **CP exposed** (``Parallelism.cp_comm_exposed``, Llama 3's all-gather CP, arXiv 2407.21783
  §3.3.2): the CP exchange joins the critical path and no longer slows the kernels beside it;
- **contention**: kernels that run beside an overlapped DP or CP collective run 18.9 % slower
  (``StageTime.contention``; Lee et al. 2025, arXiv 2507.03114).

**Known limitations**: the expert-DP collectives are labelled with the dense DP group's link;
contention is one average figure (the paper's range is up to 40 %), not a function of the
collective's SM count or message size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..facts.constants import constant
from ..hardware import Device
from ..hardware.node_hardware import NodeHardware
from ..model.spec import ModelSpec
from ..recipe import Recipe
from ..recipe.host import HostSetup
from ..recipe.memo import kept_by_key
from .comms import Link, allreduce_s, alltoall_s, gather_s, group_link
from .cpu_adam import cpu_adam_impl, cpu_adam_rate
from .fsdp2 import COPY_ENGINES, fsdp2_copy_bytes
from .host_memory import HostMemory
from .kernels import KernelTime, kernel_inputs, kernel_seconds
from .overlap import DpOverlap, dp_overlap
from .pipeline import StageLoad
from .recompute import layer_checkpointed
from .ring import RING_ENGINES, ring_merge_bytes

__all__ = ["Rates", "StageTime", "stage_time"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    """The rates every stage is timed at (sourced defaults or ``memplan calibrate``'s)."""

    linear_peak: float
    """FLOP/s the linear GEMMs are capped by (fp8: torchao's measured speedup over 16-bit)."""
    attention_peak: float
    """16-bit FLOP/s the attention kernels' efficiencies refer to."""
    matmul_efficiency: float
    """Fraction of ``linear_peak`` a whole-wave tile grid reaches (``gemm.base_matmul_efficiency``),
    or the calibrated / user-set figure."""
    gemm_sms: int | None
    """SMs for each GEMM shape's tile and wave quantisation (``gemm.py``); None where the
    efficiency was calibrated or set by the user (it already holds the real shapes)."""
    attention_override: tuple[float, float] | None
    """Measured attention (forward, backward) efficiency, or None."""
    hbm: float
    """Usable HBM bytes/s (0: unknown)."""
    bytes_per_element: float
    """Bytes per GEMM operand element (1 under fp8)."""
    act_bytes: float
    """Bytes per activation element (the compute dtype)."""
    param_bytes: float
    """Bytes per parameter element gathered by ZeRO-3 / FSDP."""
    grad_bytes: float
    """Bytes per gradient element reduced."""
    intra: Link
    """Intra-node link (NVLink, or PCIe)."""
    inter: Link
    """One GPU's NIC."""
    h2d: float | None
    """Host-to-device GB/s per GPU."""
    d2h: float | None
    """Device-to-host GB/s per GPU."""
    host: HostMemory
    """The node's sockets, DRAM and inter-socket link (``host_memory.py``)."""
    fused: bool
    """Elementwise chains run fused (``step.fused_kernels``)."""
    fallback_hbm_bytes: float = 0.0
    """Memory-bound bytes per step of the whole model on one rank, for stages without an op
    graph (per-hidden byte counts); shared by the stages in proportion to their layers."""


@dataclass(kw_only=True, slots=True)
class StageTime:
    """Seconds per step on one rank of one stage (busy time of each part)."""

    linear: float
    attention: float
    hbm: float
    """Memory-bound kernels, the GPU optimizer step included."""
    optimizer_hbm: float
    """Part of ``hbm`` that is the GPU optimizer step (after the pipeline flush)."""
    issue: float
    """CPU time to issue the stage's kernels."""
    kernels: float
    tp: float
    ep: float
    pp: float
    cp: float
    dp: DpOverlap
    links: dict[str, Link]
    """The link each group crosses: ``tp``, ``ep``, ``etp``, ``pp``, ``dp``, ``cp``."""
    cp_exposed: bool = False
    """The CP exchange is on the critical path (``Parallelism.cp_comm_exposed``)."""
    pcie_overlapped: float = 0.0
    pcie_serial: float = 0.0
    nvme_overlapped: float = 0.0
    nvme_optimizer: float = 0.0
    cpu: float = 0.0
    data: float = 0.0
    forward_busy: float = 0.0
    """Part of ``busy`` the forward passes run: their GEMM, attention and memory-bound kernels
    (the time axis of the step, ``schedule.py``)."""
    pcie_limits: tuple[str, ...] = ()
    """What sets the offload transfers' time, the longer phase first: ``pcie``, ``dram`` or
    ``socket link`` (``host_memory.HostMemory.transfer``)."""
    cpu_limit: str = "cores"
    """What sets the CPU optimizer's time: ``cores`` or ``dram``."""
    unknown: list[str] = field(default_factory=list)
    notes: tuple[str, ...] = ()

    @property
    def compute(self) -> float:
        return self.linear + self.attention

    @property
    def busy(self) -> float:
        """GPU kernel time: compute and memory-bound kernels run one after another."""
        return self.compute + self.hbm

    @property
    def launch(self) -> float:
        """Exposed launch time: where issuing the kernels outlasts running them (whole-step
        run-ahead, a lower bound)."""
        return max(0.0, self.issue - self.busy)

    @property
    def contention(self) -> float:
        """What overlapped collectives cost the kernels beside them: NCCL holds SMs and HBM
        bandwidth, so compute and memory-bound kernels run ``overlap_compute_slowdown`` slower
        while a DP / FSDP / ZeRO or CP collective is in flight (``rates.toml``: Lee et al.
        2025, arXiv 2507.03114); for ``min(overlapped collective time, busy time)``."""
        beside = self.dp.hidden + (0.0 if self.cp_exposed else self.cp)
        return constant("overlap_compute_slowdown") * min(beside, self.busy)

    @property
    def critical(self) -> float:
        """The stage's own critical path: kernels (slowed where collectives run beside them),
        exposed launches, TP/EP/PP collectives and the DP part its engine cannot overlap."""
        return (self.busy + self.contention + self.launch + self.tp + self.ep + self.pp
                + self.dp.serial + (self.cp if self.cp_exposed else 0.0))

    @property
    def pipelined(self) -> float:
        """The per-micro-batch work the pipeline schedule passes between stages (the critical
        path less what runs once per step: DP tail and optimizer)."""
        return self.critical - self.dp.serial - self.optimizer_hbm

    def overlapped(self) -> dict[str, float]:
        """Work that runs beside the critical path, by resource: only its excess is exposed."""
        over = {self.links["dp"].name: self.dp.hidden, "pcie": self.pcie_overlapped,
                "nvme": self.nvme_overlapped, "data": self.data}
        if not self.cp_exposed:
            over[self.links["cp"].name] = over.get(self.links["cp"].name, 0.0) + self.cp
        return over

    @property
    def own(self) -> float:
        """The stage's step without the pipeline bubble: its critical path or the largest
        overlapped stream, then the serial CPU optimizer / NVMe and ZeRO-Offload upload."""
        return (max([self.critical, *self.overlapped().values()])
                + max(self.cpu, self.nvme_optimizer) + self.pcie_serial)


HOST_OFFLOADS = ("optimizer", "params+optimizer", "nvme")
"""Offload kinds whose states live in host memory: PCIe transfers and a CPU optimizer step."""


def dp_calls(recipe: Recipe, elems: float, grad_bytes: float, layers: int, dp: int
             ) -> tuple[int, int]:
    """Collective calls per pass of the DP parameter gathers and of the gradient reductions
    over ``elems`` elements: each call pays the ring's latency (``comms.ring_latency_s``).

    - FSDP2 / torchtitan / FSDP1: one per wrapped unit, a transformer block (``fully_shard``
      and FSDP1's auto-wrap per block);
    - DeepSpeed: its buckets, ``reduce_bucket_size`` and ``allgather_bucket_size`` elements
      (ZeRO-3's gathers: ``stage3_prefetch_bucket_size``); a call never holds more, and
      ZeRO-3 also gathers module by module, so this is the least number of calls;
    - Megatron-Core: buckets of ``max(40000000, 1000000 x dp)`` elements with
      ``--overlap-grad-reduce`` ("larger DP sizes need larger buckets to ensure collectives do
      not become latency-bound", ``distributed_data_parallel_config.py``), one without;
    - DDP: ``bucket_cap_mb``'s 25 MiB buckets (``ddp_bucket_bytes``)."""
    if elems <= 0:
        return 1, 1
    kind, e = str(recipe.engine_kind), recipe.engine

    def buckets(size: float) -> int:
        return max(1, math.ceil(elems / size))

    if kind in ("fsdp1", "fsdp2", "torchtitan") and recipe.parallelism.zero == 3:
        return max(1, layers), max(1, layers)
    if kind == "deepspeed":
        gather = e.stage3_prefetch_bucket_size if recipe.parallelism.zero == 3 \
            else e.allgather_bucket_size
        return buckets(gather or e.allgather_bucket_size), buckets(e.reduce_bucket_size)
    if kind == "megatron":
        k = buckets(max(40_000_000, 1_000_000 * dp)) if e.overlap_comm else 1
        return k, k
    k = max(1, math.ceil(elems * grad_bytes / constant("ddp_bucket_bytes")))
    return k, k


def _recomputed(recipe: Recipe, layers: range, n: int) -> float:
    """Layers of the stage whose forward (and its collectives) runs again in the backward."""
    if recipe.checkpointing.kind == "op":
        return float(len(layers))
    return float(sum(layer_checkpointed(recipe, i, n) for i in layers))


def _kernels(model: ModelSpec, recipe: Recipe, device: Device, rates: Rates, layers: range,
             last: bool, memo: dict[object, object] | None) -> tuple[KernelTime, float]:
    """``kernel_seconds`` of the stage and its ``_recomputed`` layers; ``memo``: kept under
    what both read (``kernel_inputs``, the rates they are given, the device), so candidates
    that differ in sharding, offload, engine, accumulation or loss share them."""
    kw = dict(layers=layers, head=last, linear_peak=rates.linear_peak,
              attention_peak=rates.attention_peak, matmul_efficiency=rates.matmul_efficiency,
              hbm_bytes_per_s=rates.hbm, bytes_per_element=rates.bytes_per_element,
              attention_override=rates.attention_override, gemm_sms=rates.gemm_sms)
    key = ("kernel_seconds", device.name, device.arch, *kw.values(), *kernel_inputs(recipe))
    return kept_by_key(memo, key, lambda: (
        kernel_seconds(model, recipe, device, **kw),  # type: ignore[arg-type]
        _recomputed(recipe, layers, model.num_layers)))


def stage_time(model: ModelSpec, recipe: Recipe, device: Device, hw: NodeHardware,
               setup: HostSetup, rates: Rates, load: StageLoad, *, last: bool,
               memo: dict[object, object] | None = None) -> StageTime:
    """Seconds per step on one rank of the stage ``load`` (module docstring). ``memo``: a dict
    kept by a caller timing many recipes of this one ``model`` on this ``device``
    (``memplan plan``), for the kernel times."""
    par = recipe.parallelism
    tp, pp, cp, ep, etp = par.tp, par.pp, par.cp, par.ep, par.expert_tp
    local, m = par.local_gpus, recipe.batch.grad_accum
    tokens_seq = recipe.batch.micro_batch * recipe.batch.seq_len
    n_layers = len(load.layers)
    kt, again = _kernels(model, recipe, device, rates, load.layers, last, memo)
    part = load.trainable
    if par.zero >= 1:   # the optimizer partition: dense over DP, experts over expert-DP
        part = ((load.trainable - load.expert_trainable) / par.shard_degree
                + load.expert_trainable / par.expert_shard_degree)
    opt_bytes = (0.0 if recipe.offload.kind != "none"
                 else constant("optimizer_bytes_per_param_gpu") * part)
    fwd_bytes = 0.0
    if load.traffic is not None:
        tr = load.traffic
        pipe_bytes = (tr.fused_bytes if rates.fused else tr.eager_bytes) * m
        kernels = (tr.fused_kernels if rates.fused else tr.eager_kernels) * m
        fwd_bytes = (tr.fused_forward_bytes if rates.fused else tr.eager_forward_bytes) * m
    else:
        pipe_bytes = rates.fallback_hbm_bytes * n_layers / max(model.num_layers, 1)
        kernels = 0.0
    hbm = rates.hbm
    unknown: list[str] = []

    def t(x: float | None, what: str) -> float:
        if x is None:
            unknown.append(what)
            return 0.0
        return x

    intra, inter = rates.intra, rates.inter
    act = tokens_seq / cp * model.hidden_size * rates.act_bytes
    if cp > 1 and str(recipe.engine_kind) in RING_ENGINES:   # PyTorch ring attention's merges
        ring_f, ring_b = ring_merge_bytes(model, tokens_seq / cp, tp, cp)
        pipe_bytes += (ring_f * (n_layers + again) + ring_b * n_layers) * m
    if par.zero == 3 and str(recipe.engine_kind) in COPY_ENGINES:   # fully_shard's copies
        gathers = (2 if recipe.engine.reshard_after_forward else 1) * m
        pipe_bytes += fsdp2_copy_bytes(load.trainable, gathers=gathers, reduces=m,
                                       param_bytes=rates.act_bytes, grad_bytes=rates.act_bytes,
                                       reduce_bytes=rates.grad_bytes)
    links = {"tp": group_link(1, tp, local, intra, inter),
             "ep": group_link(etp, ep, local, intra, inter),
             "etp": group_link(1, etp, local, intra, inter),
             "pp": inter if par.gpus > local else intra}
    t_tp = t(allreduce_s(act, tp, links["tp"]), "TP link") * (4 * n_layers + 2 * again) * m
    moe = kept_by_key(memo, ("moe_layers", load.layers), lambda: [
        i for i in load.layers if (f := model.layers[i].ffn) and f.num_experts])
    t_ep = 0.0
    if moe:
        top_k = model.layers[moe[0]].ffn.top_k  # type: ignore[union-attr]
        routed = act / tp * top_k   # the rank's sequence-parallel shard, top_k copies
        per_node = min(ep, max(1, local // etp))   # EP ranks (stride etp) in one node
        per_pass = (t(alltoall_s(routed, ep, per_node, intra, inter), "EP link")
                    + t(gather_s(routed * etp, etp, links["etp"]), "EP link"))
        moe_again = again * len(moe) / max(n_layers, 1)
        t_ep = per_pass * (4 * len(moe) + 2 * moe_again) * m
    t_pp = t(gather_s(act, 2, links["pp"]), "PP link") * 2 * 2 * m if pp > 1 else 0.0
    # overlapped: DP / ZeRO / FSDP (dense over the DP group, routed experts over the
    # expert-DP group: Megatron-Core's expert rank order puts etp x ep inside it), CP
    n = par.shard_degree if par.zero else par.dp * cp
    n_exp = par.expert_shard_degree
    links["dp"] = group_link(tp, n, local, intra, inter)
    exp_link = group_link(etp * ep, n_exp, local, intra, inter)
    gb, pb = rates.grad_bytes, rates.param_bytes
    dp_gather = dp_reduce = 0.0
    for elems, g, link in ((load.trainable - load.expert_trainable, n, links["dp"]),
                           (load.expert_trainable, n_exp, exp_link)):
        gc, rc = dp_calls(recipe, elems, gb, n_layers, g)

        def calls(k: int, f: Callable[..., float | None], nbytes: float) -> float:
            return k * t(f(nbytes / k, g, link), "DP link")

        if par.zero == 3:
            dp_gather += 2 * calls(gc, gather_s, elems * pb) * m
            dp_reduce += calls(rc, gather_s, elems * gb) * m
        elif par.zero == 2:
            dp_reduce += calls(rc, gather_s, elems * gb) * m
            dp_gather += calls(gc, gather_s, elems * pb)
        else:
            dp_reduce += calls(rc, allreduce_s, elems * gb)
    dpo = dp_overlap(recipe, gather_s=dp_gather, reduce_s=dp_reduce,
                     grad_bytes=load.trainable * gb, layers=n_layers)
    kv = kept_by_key(memo, "kv_width", lambda: max(  # what ring attention passes on, per token
        (ly.attention.num_kv_heads * (ly.attention.head_dim + ly.attention.v_head_dim)
         for ly in model.layers if ly.attention), default=0))
    links["cp"] = group_link(tp, cp, local, intra, inter)
    cp_bytes = tokens_seq / cp * kv * rates.act_bytes / tp
    t_cp = t(gather_s(cp_bytes * cp, cp, links["cp"]), "CP link") * 3 * n_layers * m
    st = StageTime(linear=kt.linear_s * m, attention=kt.attention_s * m,
                   hbm=(pipe_bytes + opt_bytes) / hbm if hbm else 0.0,
                   optimizer_hbm=opt_bytes / hbm if hbm else 0.0,
                   issue=kernels * constant("kernel_launch_cpu_seconds"), kernels=kernels,
                   tp=t_tp, ep=t_ep, pp=t_pp, cp=t_cp, cp_exposed=par.cp_comm_exposed,
                   dp=dpo, links=links, unknown=unknown, notes=kt.notes,
                   forward_busy=kt.forward_s * m + (fwd_bytes / hbm if hbm else 0.0))
    _offload(st, recipe, hw, setup, rates, part)
    return st


def _offload(st: StageTime, recipe: Recipe, hw: NodeHardware, setup: HostSetup, rates: Rates,
             part: float) -> None:
    """Fill the offload, NVMe, CPU optimizer and data-loading seconds of ``st``."""
    par = recipe.parallelism
    local, m = par.local_gpus, recipe.batch.grad_accum
    h2d, d2h = rates.h2d, rates.d2h
    host = rates.host
    if recipe.offload.kind in HOST_OFFLOADS:
        if d2h is None or h2d is None:
            st.unknown.append("PCIe generation")
        else:
            out, out_limit = host.transfer(part * 2, d2h * 1e9, local)
            st.pcie_overlapped += out * m               # 16-bit gradient partition out
            if recipe.offload.kind == "optimizer":      # updated 16-bit params back
                back, back_limit = host.transfer(part * 2, h2d * 1e9, local)
                st.pcie_serial += back
            else:                                       # param shards in, forward + backward
                back, back_limit = host.transfer(2 * part * 2, h2d * 1e9, local)
                st.pcie_overlapped += back * m
            st.pcie_limits = tuple(dict.fromkeys(
                (back_limit, out_limit) if back >= out else (out_limit, back_limit)))
        if recipe.offload.kind == "nvme":
            read = hw.nvme_read_gb_per_s
            write = hw.nvme_write_gb_per_s or (read * constant("nvme_write_fraction")
                                               if read else None)
            if read and write:
                per_rank_r, per_rank_w = read / local * 1e9, write / local * 1e9
                st.nvme_optimizer = part * 16 / per_rank_r + part * 12 / per_rank_w
                st.nvme_overlapped = 2 * part * 2 / per_rank_r * m
            else:
                st.unknown.append("NVMe bandwidth")
        if hw.cpu_cores:
            cores_s = part / (hw.cpu_cores / local * cpu_adam_rate(cpu_adam_impl(recipe)))
            st.cpu, st.cpu_limit = host.optimizer(part, cores_s, local)
        else:
            st.unknown.append("CPU cores")
    if setup.tokenize:
        tokens = recipe.batch.micro_batch * recipe.batch.seq_len * m
        st.data = (local * tokens / (par.tp * par.pp * par.cp) * constant("text_bytes_per_token")
                   / constant("tokenizer_bytes_per_s_per_node"))
