"""``estimate_time``: one optimizer step's wall time, where it goes, MFU and GPU idle time.

Per rank and step (tokens per replica = micro_batch x seq_len x grad_accum, work split over
tp x pp x cp):

- **compute** = per-GEMM rooflines of the linear layers and the attention kernels at their
  published efficiency (``kernels.py``; fp8 only on linear layers);
- **hbm** = bytes of memory-bound kernels, read off the estimator's op graph
  (``estimate/activations/traffic.py``: op by op in eager, boundary tensors only when fused
  under ``compile`` or Megatron), plus the GPU optimizer step, / (HBM spec x 0.83);
- **launch** = kernels of the graph x 5 us of CPU each, exposed where issuing outlasts the GPU;
- **nvlink / network** = collectives (``comms.py``) over the link each group crosses;
- **pcie** = offload transfers (ZeRO-Offload: gradients out, parameters back: 2 B + 2 B per
  element of the partition, facts §3.6; ZeRO-3 CPU offload: parameter shards in for forward and
  backward every micro-batch) at the measured pinned rate of the PCIe generation (x 0.4 pageable);
- **nvme** = ZeRO-Infinity reads/writes per rank at the node's NVMe rate / local ranks;
- **cpu** = CPU optimizer: partition elements / (cores per rank x 148 M elements/s/core);
- **host memory** (``host_memory.py``): offload transfers and the CPU optimizer are also bounded
  by their socket's DRAM, shared by the socket's ranks, and transfers to pages on the far socket
  by the inter-socket link (unbound ranks: ``(sockets - 1) / sockets`` of their pages);
- **data** = on-the-fly tokenisation at 50 MB/s of text per node (pre-tokenised data: ~0).

Overlap rules (stated in every result): compute and HBM kernels run one after another on the
stream (their sum is GPU busy time); TP, EP and PP-p2p collectives sit on the critical path
(no comm/compute overlap for TP); DP/ZeRO/FSDP collectives by the engine's rule
(``overlap.py``: the serial part on the critical path, the rest overlapped), CP ring passes, ZeRO-3 parameter
fetches over PCIe, NVMe parameter reads and data loading overlap with the forward/backward and
only their excess over the critical path is exposed, and the kernels beside them run 18.9 %
slower (``stage.py``: NCCL contention); every pipeline stage is timed with its own layers and
the slowest one plus the others' fill and drain sets the step (``pipeline.py``: Narayanan et al.
2021 §2.2's bubble for even stages, ``/ pp_virtual`` when interleaved); after backward, the
CPU optimizer step (overlapped with its NVMe swaps) and the ZeRO-Offload parameter upload are
serial while the GPU waits.

**Known limitations**: one matmul efficiency for every GEMM shape (small hidden sizes and TP
shards are slower, so predictions are optimistic there); launches at the low end of the CPU
cost, with whole-step run-ahead (a lower bound); NCCL/compute contention as one average figure;
no contention between GPUs sharing a PCIe switch (their sockets' DRAM and link are shared).
FP8 linears run at ``min(fp8 peak, 16-bit peak x float8_linear_speedup)`` (torchao's H100
Float8Linear benchmark, 1.39x at a large shape, casts and scaling included; ``rates.toml``);
MFU stays against the FP8 peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..facts import dtypes
from ..hardware import Device
from ..facts.constants import constant
from ..hardware.node_hardware import NodeHardware
from ..recipe.host import HostSetup
from ..model.spec import ModelSpec
from ..recipe import Recipe
from ..units import dtype_bytes
from ..recipe.memo import kept_by_key, kept_by_parts
from ..recipe.stages import stages_of
from ..results import ResourceTime, TimeEstimate
from ..results.time import validation_band
from .calibration import Calibration
from .comms import Link
from .explain import assumptions, resource_details, time_notes
from .flops import TokenFlops, token_flops
from .gemm import base_matmul_efficiency
from .host_memory import host_memory
from .kernels import method_inputs
from .pipeline import StageLoad, pipeline_step
from .schedule import stage_phases
from .recompute import full_share, recompute_inputs
from .stage import Rates, StageTime, stage_time

__all__ = ["Clock", "StepFigures", "clock", "estimate_time", "pcie_gb_per_s", "peak_tflops",
           "step_figures"]


def peak_tflops(device: Device, recipe: Recipe) -> tuple[float | None, str]:
    """Dense peak TFLOP/s of the compute dtype (``fp8-mixed``: the fp8 rate for matmuls)."""
    dt = dtypes(recipe).compute
    key = "fp8" if recipe.precision.kind == "fp8-mixed" else dt
    rates = device.tflops or {}
    return rates.get(key), key


def pcie_gb_per_s(gen: int | None, pinned: bool) -> tuple[float | None, float | None]:
    """(host->device, device->host) GB/s per GPU for a PCIe generation: measured pinned rates
    (rates.toml), x 0.4 for pageable memory (DGX A100 bandwidthTest)."""
    if gen is None:
        return None, None
    if gen >= 5:
        h2d, d2h = constant("pcie_gen5_h2d_gb_per_s"), constant("pcie_gen5_d2h_gb_per_s")
    else:
        h2d = d2h = constant(f"pcie_gen{max(gen, 3)}_gb_per_s")
    f = 1.0 if pinned else constant("pageable_fraction")
    return h2d * f, d2h * f


def _hbm_bytes_per_token(model: ModelSpec, recipe: Recipe, tp: int) -> float:
    """Bytes of memory-bound kernels per token (whole model), forward x 3 (+ recompute)."""
    h = model.hidden_size
    fwd = 0.0
    for layer in model.layers:
        ffn = layer.ffn
        f = 0
        if ffn is not None:
            f = ffn.intermediate_size * (ffn.top_k if ffn.num_experts else 1)
            f += ffn.shared_intermediate_size * ffn.shared_experts
        per_ffn = constant("elementwise_bytes_per_ffn") if (ffn and ffn.gated) else 4.0
        fwd += constant("elementwise_bytes_per_hidden") * h + per_ffn * f
        if recipe.platform.attention == "eager" and layer.attention is not None:
            fwd += constant("eager_attention_bytes_per_score") * layer.attention.num_heads \
                * recipe.batch.seq_len / tp
    # pointwise ops run again under full (its checkpointed layers) and op (none is saved)
    passes = 3 + (1.0 if recipe.checkpointing.kind == "op" else
                  full_share(recipe, model.num_layers))
    ce = constant("cross_entropy_bytes_per_logit") * model.vocab_size
    return fwd * passes + ce


def _gathered_param_bytes(recipe: Recipe) -> float:
    """Bytes per parameter element a ZeRO-3 / FSDP all-gather moves. FSDP1, FSDP2 and
    torchtitan shard the fp32 parameters and cast the shard to ``param_dtype`` (the compute
    dtype) before gathering (torch ``_fully_shard/_fsdp_param.py`` ``all_gather_inputs``;
    FSDP1 ``MixedPrecision.param_dtype``), so the gather is 16-bit under mixed precision;
    DeepSpeed and Megatron gather their 16-bit parameter copy (``dtypes(recipe).param``)."""
    dt = dtypes(recipe)
    if str(recipe.engine_kind) in ("fsdp1", "fsdp2", "torchtitan"):
        return dtype_bytes(dt.compute)
    return dtype_bytes(dt.param)


def fused_kernels(recipe: Recipe) -> bool:
    """Elementwise chains run fused: under ``torch.compile`` (Inductor), or Megatron-Core
    (Transformer Engine / Apex fused norm, rotary, bias-activation and softmax kernels)."""
    return recipe.platform.compile or str(recipe.engine_kind) == "megatron"


def _rates(model: ModelSpec, recipe: Recipe, device: Device, hw: NodeHardware,
           setup: HostSetup, cal: Calibration | None, peak: float, key: str,
           memo: dict[object, object] | None = None) -> Rates:
    """The rates every stage is timed at: the catalog's and ``rates.toml``'s, or the
    calibration's where it measured them."""
    dt = dtypes(recipe)
    linear_peak = peak   # fp8: casts and amax eat part of the fp8 GEMM's 2x (rates.toml)
    bf16 = (device.tflops or {}).get(dt.compute) if key == "fp8" else None
    if bf16:
        linear_peak = min(peak, bf16 * 1e12 * constant("float8_linear_speedup"))
    cal_peak = (device.tflops or {}).get(cal.dtype) if cal else None
    cal_eff = cal.efficiency(cal.gemm_tflops, cal_peak) if cal else None
    hbm = (device.hbm_gb_per_s or 0) * 1e9 * constant("hbm_efficiency")
    if cal is not None and cal.hbm_gb_per_s:
        hbm = cal.hbm_gb_per_s * 1e9
    att_cal = None
    if cal is not None and cal.attention_fwd_tflops and cal.attention_bwd_tflops:
        att_cal = (cal.efficiency(cal.attention_fwd_tflops, cal_peak) or 1.0,
                   cal.efficiency(cal.attention_bwd_tflops, cal_peak) or 1.0)
    nv = hw.nvlink_gb_per_s
    h2d, d2h = pcie_gb_per_s(hw.pcie_gen, setup.pinned)
    if cal is not None and cal.h2d_gb_per_s and cal.d2h_gb_per_s:
        h2d, d2h = cal.h2d_gb_per_s, cal.d2h_gb_per_s
    intra = (Link("nvlink", nv / 2 * constant("nvlink_efficiency"),
                  step_s=1e-6 * constant("nccl_ring_nvlink_step_us")) if nv
             else Link("pcie", h2d, step_s=1e-6 * constant("nccl_ring_pcie_step_us")))
    if cal is not None and cal.allreduce_bus_gb_per_s and \
            cal.world_size <= recipe.parallelism.local_gpus:
        intra = Link(intra.name, cal.allreduce_bus_gb_per_s, step_s=intra.step_s)
    inter = Link("network", hw.network_gb_per_s * constant("network_efficiency")
                 if hw.network_gb_per_s else None)
    par = recipe.parallelism
    tokens_replica = recipe.batch.micro_batch * recipe.batch.seq_len * recipe.batch.grad_accum
    return Rates(linear_peak=linear_peak,
                 attention_peak=((device.tflops or {}).get(dt.compute) or peak / 1e12) * 1e12,
                 matmul_efficiency=cal_eff or setup.matmul_efficiency
                 or base_matmul_efficiency(device),
                 gemm_sms=None if (cal_eff or setup.matmul_efficiency) else device.sm_count,
                 attention_override=att_cal, hbm=hbm,
                 bytes_per_element=1.0 if key == "fp8" else dtype_bytes(dt.compute),
                 act_bytes=dtype_bytes(dt.compute), param_bytes=_gathered_param_bytes(recipe),
                 grad_bytes=dtype_bytes(dt.grad), intra=intra, inter=inter, h2d=h2d, d2h=d2h,
                 host=host_memory(hw, setup.numa_bound), fused=fused_kernels(recipe),
                 fallback_hbm_bytes=kept_by_key(memo, ("hbm_bytes_per_token", par.tp,
                                                       recipe.batch.seq_len,
                                                       *recompute_inputs(recipe)),
                                                lambda: _hbm_bytes_per_token(model, recipe, par.tp))
                 * tokens_replica / (par.tp * par.cp))


@dataclass(frozen=True, kw_only=True, slots=True)
class StepFigures:
    """The numbers ``memplan plan`` reads of a ``TimeEstimate``, computed as its fields and
    properties compute them (``estimate_time`` builds its result from the same ``Clock``)."""

    step_seconds: float
    tokens_per_second: float
    mfu: float
    bottleneck: str
    model_flops_per_token: float
    peak_flops_per_gpu: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Clock:
    """What ``estimate_time`` computes before it words it (``explain.py``)."""

    rates: Rates
    key: str
    """The peak's dtype key (``peak_tflops``)."""
    peak: float
    stages: list[StageLoad]
    times: list[StageTime]
    owns: list[float]
    """``times[i].own``, read once."""
    j: int
    """The stage that sets the step."""
    step: float
    bubble: float
    exposed: dict[str, float]
    busy_s: dict[str, float]
    fl: TokenFlops
    tokens_replica: int
    replicas: int

    @property
    def resource_names(self) -> list[str]:
        """The resources ``TimeEstimate.resources`` lists, in order: busy or exposed."""
        return [k for k in self.exposed if self.busy_s[k] or self.exposed[k]]


def clock(model: ModelSpec, recipe: Recipe, device: Device, hw: NodeHardware,
          setup: HostSetup, trainable: int, calibration: Calibration | None = None,
          stages: list[StageLoad] | None = None,
          memo: dict[object, object] | None = None) -> Clock | None:
    """The numbers of ``estimate_time`` (same arguments), without its words; None where it
    returns None."""
    peak_t, key = peak_tflops(device, recipe)
    if not peak_t or recipe.platform.device == "cpu":
        return None
    cal = calibration
    if cal is not None and cal.gpu != device.name:
        raise ConfigError([f"--calibration was measured for {cal.gpu}, the estimate is for "
                           f"{device.name}: rerun `memplan calibrate --gpu {device.name}` on "
                           "that GPU, or drop --calibration."])
    peak = peak_t * 1e12
    # _rates reads these parts (dtypes: precision, engine, parallelism, method; recompute_inputs:
    # checkpointing, attention; fused_kernels: compile) and the hardware; peak and key follow
    rates = (_rates(model, recipe, device, hw, setup, cal, peak, key, memo) if memo is None
             else kept_by_parts(memo, "rates", (
                 recipe.precision, recipe.engine, recipe.parallelism, recipe.method, recipe.batch,
                 recipe.checkpointing, recipe.platform, device, hw, setup, cal),
                 lambda: _rates(model, recipe, device, hw, setup, cal, peak, key, memo)))
    par = recipe.parallelism
    tp, pp, cp = par.tp, par.pp, par.cp
    m, v = recipe.batch.grad_accum, par.pp_virtual
    tokens_replica = recipe.batch.micro_batch * recipe.batch.seq_len * m
    split = tp * pp * cp
    fl = kept_by_key(memo, ("token_flops", recipe.batch.seq_len, *method_inputs(recipe),
                            *recompute_inputs(recipe)), lambda: token_flops(model, recipe))
    if stages is None:
        stages = [StageLoad(layers=r, trainable=trainable / (tp * pp))
                  for r in stages_of(model.num_layers, recipe)]
    times = [stage_time(model, recipe, device, hw, setup, rates, s, last=j == len(stages) - 1,
                        memo=memo) for j, s in enumerate(stages)]
    owns = [s.own for s in times]
    step, j, bubble = pipeline_step(owns, [s.pipelined for s in times], m, v)
    st = times[j]
    over = st.overlapped()
    fwd_bwd = max([st.critical, *over.values()])
    excess_name = max(over, key=lambda k: over[k])
    opt_serial = max(st.cpu, st.nvme_optimizer)
    exposed = {r: 0.0 for r in ("compute", "hbm", "launch", "nvlink", "network", "pcie", "nvme",
                                "cpu", "data", "pipeline bubble")}
    busy_s = dict.fromkeys(exposed, 0.0)
    exposed["compute"], exposed["hbm"], exposed["launch"] = st.compute, st.hbm, st.launch
    busy_s["compute"], busy_s["hbm"], busy_s["launch"] = st.compute, st.hbm, st.issue
    links = st.links
    for name, s in (("tp", st.tp), ("ep", st.ep), ("pp", st.pp), ("dp", st.dp.serial),
                    ("cp", st.cp if st.cp_exposed else 0.0)):
        exposed[links[name].name] += s
        busy_s[links[name].name] += s
    for name, s in over.items():
        busy_s[name] += s
    exposed[excess_name] += fwd_bwd - st.critical
    exposed[links["dp"].name] += st.contention   # kernels slowed by the collectives beside them
    exposed["pipeline bubble"] = busy_s["pipeline bubble"] = bubble
    exposed["cpu" if st.cpu >= st.nvme_optimizer else "nvme"] += opt_serial
    busy_s["cpu"] += st.cpu
    busy_s["nvme"] += st.nvme_optimizer
    exposed["pcie"] += st.pcie_serial
    busy_s["pcie"] += st.pcie_serial
    return Clock(rates=rates, key=key, peak=peak, stages=stages, times=times, owns=owns, j=j,
                 step=step, bubble=bubble, exposed=exposed, busy_s=busy_s, fl=fl,
                 tokens_replica=tokens_replica, replicas=par.gpus // split)


def step_figures(model: ModelSpec, recipe: Recipe, device: Device, hw: NodeHardware,
                 setup: HostSetup, trainable: int, calibration: Calibration | None = None,
                 stages: list[StageLoad] | None = None,
                 memo: dict[object, object] | None = None) -> StepFigures | None:
    """``estimate_time``'s step time, tokens per second, MFU, bottleneck, model FLOPs per
    token and peak (same arguments), as its ``TimeEstimate`` computes them, without its
    resources' words, assumptions and notes (``memplan plan``: one per candidate)."""
    c = clock(model, recipe, device, hw, setup, trainable, calibration, stages, memo)
    if c is None:
        return None
    tokens_per_step = c.tokens_replica * c.replicas
    model_flops = c.fl.model * c.tokens_replica * c.replicas
    gpus = recipe.parallelism.gpus
    return StepFigures(step_seconds=c.step, tokens_per_second=tokens_per_step / c.step,
                       mfu=model_flops / c.step / gpus / c.peak,
                       bottleneck=max(c.resource_names, key=c.exposed.__getitem__),
                       model_flops_per_token=model_flops / tokens_per_step,
                       peak_flops_per_gpu=c.peak)


def estimate_time(model: ModelSpec, recipe: Recipe, device: Device, hw: NodeHardware,
                  setup: HostSetup, trainable: int,
                  calibration: Calibration | None = None,
                  stages: list[StageLoad] | None = None,
                  memo: dict[object, object] | None = None) -> TimeEstimate | None:
    """Step time of ``recipe`` on ``device`` GPUs in ``hw`` nodes; None when the catalog has
    no dense peak for the compute dtype (the reason is the caller's to report). Rates measured
    by ``memplan calibrate`` (``calibration``) replace the sourced defaults they cover.
    ``stages``: one ``StageLoad`` per pipeline stage (its layers, one rank's trainable
    elements, and the op graph's memory-bound bytes and kernels of one micro-batch:
    ``system.stage_loads``); without it the layers split as ``recipe.stages.stages_of`` says,
    each rank holds ``trainable / (tp x pp)`` elements, the per-hidden byte counts of
    ``_hbm_bytes_per_token`` stand in for the op graph and launches are not timed. ``memo``: a
    dict kept by a caller timing many recipes of this one ``model`` on this ``device`` (``memplan
    plan``): FLOPs per token, per-token HBM bytes and kernel times are kept under the recipe
    fields they read (``recompute_inputs``, ``kernel_inputs``)."""
    c = clock(model, recipe, device, hw, setup, trainable, calibration, stages, memo)
    if c is None:
        return None
    par = recipe.parallelism
    details = resource_details(c, recipe, device)
    resources = tuple(ResourceTime(name=k, seconds=c.busy_s[k], exposed_seconds=c.exposed[k],
                                   detail=details[k]) for k in c.resource_names)
    n = c.tokens_replica * c.replicas
    return TimeEstimate(
        step_seconds=c.step, tokens_per_step=n, gpus=par.gpus,
        model_flops_per_step=c.fl.model * c.tokens_replica * c.replicas,
        executed_flops_per_step=c.fl.executed * c.tokens_replica * c.replicas,
        model_flops_noncausal_per_step=c.fl.model_noncausal * c.tokens_replica * c.replicas,
        error_min=validation_band()[0], error_max=validation_band()[1],
        peak_flops_per_gpu=c.peak, gpu_busy_seconds=c.times[c.j].busy, resources=resources,
        assumptions=assumptions(c, recipe),
        notes=time_notes(c, recipe, device, calibration), stages=stage_phases(c, recipe))
