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
- **data** = on-the-fly tokenisation at 50 MB/s of text per node (pre-tokenised data: ~0).

Overlap rules (stated in every result): compute and HBM kernels run one after another on the
stream (their sum is GPU busy time); TP, EP and PP-p2p collectives sit on the critical path
(no comm/compute overlap for TP); DP/ZeRO/FSDP collectives by the engine's rule
(``overlap.py``: the serial part on the critical path, the rest overlapped), CP ring passes, ZeRO-3 parameter
fetches over PCIe, NVMe parameter reads and data loading overlap with the forward/backward and
only their excess over the critical path is exposed; the pipeline bubble is (pp - 1) / m of the
critical path (1F1B, Narayanan et al. 2021 §2.2; interleaving not modelled); after backward, the
CPU optimizer step (overlapped with its NVMe swaps) and the ZeRO-Offload parameter upload are
serial while the GPU waits.

**Known limitations**: one matmul efficiency for every GEMM shape (small hidden sizes and TP
shards are slower, so predictions are optimistic there); launches at the low end of the CPU
cost, with whole-step run-ahead (a lower bound); no SM contention between NCCL and compute; no
contention between GPUs sharing a PCIe switch or socket. FP8 linears run at
``min(fp8 peak, 16-bit peak x float8_linear_speedup)`` (torchao's H100 Float8Linear benchmark,
1.39x at a large shape, casts and scaling included; ``rates.toml``); MFU stays against the FP8
peak.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..facts import dtypes
from ..hardware import Device
from ..facts.constants import constant
from ..hardware.node_hardware import NodeHardware
from ..recipe.host import HostSetup
from ..model.spec import ModelSpec
from ..recipe import Recipe
from ..units import dtype_bytes
from .calibration import Calibration
from .comms import Link, allreduce_s, gather_s, group_link
from .flops import TokenFlops, token_flops
from .overlap import dp_overlap
from .recompute import full_share
from ..results import ResourceTime, TimeEstimate, Traffic
from ..results.time import validation_band
from .kernels import KernelTime, attention_efficiency, kernel_seconds

__all__ = ["estimate_time", "pcie_gb_per_s", "peak_tflops"]


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


def fused_kernels(recipe: Recipe) -> bool:
    """Elementwise chains run fused: under ``torch.compile`` (Inductor), or Megatron-Core
    (Transformer Engine / Apex fused norm, rotary, bias-activation and softmax kernels)."""
    return recipe.platform.compile or str(recipe.engine_kind) == "megatron"


def _flops(model: ModelSpec, recipe: Recipe, memo: dict[object, object] | None) -> TokenFlops:
    """``token_flops``; ``memo``: kept under what it reads (``flops.py`` and
    ``recompute.py``): the method, sequence length, attention kernel, checkpointing and pp."""
    if memo is None:
        return token_flops(model, recipe)
    key = ("token_flops", recipe.method, recipe.batch.seq_len, recipe.platform.attention,
           recipe.checkpointing, recipe.parallelism.pp)
    if key not in memo:
        memo[key] = token_flops(model, recipe)
    return memo[key]  # type: ignore[return-value]


def _kernels(model: ModelSpec, recipe: Recipe, device: Device,
             memo: dict[object, object] | None, **rates: Any) -> KernelTime:
    """``kernel_seconds``; ``memo``: kept under what it reads (``kernels.py`` and
    ``recompute.py``): the rates given, the device's name and architecture, the method,
    micro-batch, sequence length, tp, cp, pp, ep, attention kernel and checkpointing."""
    if memo is None:
        return kernel_seconds(model, recipe, device, **rates)
    par = recipe.parallelism
    key = ("kernel_seconds", device.name, device.arch, tuple(sorted(rates.items())),
           recipe.method, recipe.batch.micro_batch, recipe.batch.seq_len, par.tp, par.cp, par.pp,
           par.ep, recipe.platform.attention, recipe.checkpointing)
    if key not in memo:
        memo[key] = kernel_seconds(model, recipe, device, **rates)
    return memo[key]  # type: ignore[return-value]


def estimate_time(model: ModelSpec, recipe: Recipe, device: Device, hw: NodeHardware,
                  setup: HostSetup, trainable: int,
                  calibration: Calibration | None = None,
                  traffic: Traffic | None = None,
                  memo: dict[object, object] | None = None) -> TimeEstimate | None:
    """Step time of ``recipe`` on ``device`` GPUs in ``hw`` nodes; None when the catalog has
    no dense peak for the compute dtype (the reason is the caller's to report). Rates measured
    by ``memplan calibrate`` (``calibration``) replace the sourced defaults they cover.
    ``traffic``: memory-bound bytes and kernels of one micro-batch on one rank, from the
    estimator's op graph (``estimate.activations.stage_traffic``); without it the per-hidden
    byte counts of ``_hbm_bytes_per_token`` stand in and launches are not timed. ``memo``: the
    estimator's memo for this ``model`` (``memplan plan``): the FLOPs per token and the kernel
    times are kept under what they read (``_flops`` and ``_kernels``)."""
    peak_t, key = peak_tflops(device, recipe)
    if not peak_t or recipe.platform.device == "cpu":
        return None
    cal = calibration
    if cal is not None and cal.gpu != device.name:
        raise ConfigError([f"--calibration was measured for {cal.gpu}, the estimate is for "
                           f"{device.name}: rerun `memplan calibrate --gpu {device.name}` on "
                           "that GPU, or drop --calibration."])
    peak = peak_t * 1e12
    linear_peak = peak   # fp8: casts and amax eat part of the fp8 GEMM's 2x (rates.toml)
    bf16 = (device.tflops or {}).get(dtypes(recipe).compute) if key == "fp8" else None
    if bf16:
        linear_peak = min(peak, bf16 * 1e12 * constant("float8_linear_speedup"))
    cal_peak = (device.tflops or {}).get(cal.dtype) if cal else None
    cal_eff = cal.efficiency(cal.gemm_tflops, cal_peak) if cal else None
    eff = cal_eff or setup.matmul_efficiency or constant("matmul_efficiency")
    par = recipe.parallelism
    tp, pp, cp, ep = par.tp, par.pp, par.cp, par.ep
    local = par.local_gpus
    m = recipe.batch.grad_accum
    tokens_seq = recipe.batch.micro_batch * recipe.batch.seq_len
    tokens_replica = tokens_seq * m
    split = tp * pp * cp
    fl = _flops(model, recipe, memo)
    notes: list[str] = []
    hbm = (device.hbm_gb_per_s or 0) * 1e9 * constant("hbm_efficiency")
    if cal is not None and cal.hbm_gb_per_s:
        hbm = cal.hbm_gb_per_s * 1e9
    dt = dtypes(recipe)
    att_cal = None
    if cal is not None and cal.attention_fwd_tflops and cal.attention_bwd_tflops:
        att_cal = (cal.efficiency(cal.attention_fwd_tflops, cal_peak) or 1.0,
                   cal.efficiency(cal.attention_bwd_tflops, cal_peak) or 1.0)
    att_peak_t = (device.tflops or {}).get(dt.compute) or peak_t
    kt = _kernels(model, recipe, device, memo, linear_peak=linear_peak,
                  attention_peak=att_peak_t * 1e12,
                  matmul_efficiency=eff, hbm_bytes_per_s=hbm,
                  bytes_per_element=1.0 if key == "fp8" else dtype_bytes(dt.compute),
                  attention_override=att_cal)
    notes.extend(kt.notes)
    t_compute = (kt.linear_s + kt.attention_s) * m
    elems_rank = trainable / (tp * pp)
    part = elems_rank / (par.shard_degree if par.zero >= 1 else 1)
    opt_bytes = (0.0 if recipe.offload.kind != "none"
                 else constant("optimizer_bytes_per_param_gpu") * part)
    fused = fused_kernels(recipe)
    if traffic is not None:
        hbm_bytes = (traffic.fused_bytes if fused else traffic.eager_bytes) * m + opt_bytes
        kernels = (traffic.fused_kernels if fused else traffic.eager_kernels) * m
    else:
        hbm_bytes = _hbm_bytes_per_token(model, recipe, tp) * tokens_replica / split + opt_bytes
        kernels = 0.0
        notes.append("memory-bound kernels from per-hidden byte counts (no op graph for this "
                     "model): launches not timed")
    t_hbm = hbm_bytes / hbm if hbm else 0.0
    t_issue = kernels * constant("kernel_launch_cpu_seconds")
    if not hbm:
        notes.append(f"{device.name} has no HBM bandwidth in the catalog: memory-bound kernels "
                     "not timed")

    nv = hw.nvlink_gb_per_s
    h2d, d2h = pcie_gb_per_s(hw.pcie_gen, setup.pinned)
    if cal is not None and cal.h2d_gb_per_s and cal.d2h_gb_per_s:
        h2d, d2h = cal.h2d_gb_per_s, cal.d2h_gb_per_s
    intra = (Link("nvlink", nv / 2 * constant("nvlink_efficiency")) if nv
             else Link("pcie", h2d))
    if cal is not None and cal.allreduce_bus_gb_per_s and cal.world_size <= local:
        intra = Link(intra.name, cal.allreduce_bus_gb_per_s)
    inter = Link("network", hw.network_gb_per_s * constant("network_efficiency")
                 if hw.network_gb_per_s else None)
    act = tokens_seq / cp * model.hidden_size * dtype_bytes(dt.compute)
    layers_rank = model.num_layers / pp
    unknown: list[str] = []

    def t(x: float | None, what: str) -> float:
        if x is None:
            unknown.append(what)
            return 0.0
        return x

    # critical path: TP, EP, PP p2p
    tp_link = group_link(1, tp, local, intra, inter)
    tp_calls = 4 + 2 * (1.0 if recipe.checkpointing.kind == "op" else
                        full_share(recipe, model.num_layers))
    t_tp = t(allreduce_s(act, tp, tp_link), "TP link") * tp_calls * layers_rank * m
    moe = [ly for ly in model.layers if ly.ffn and ly.ffn.num_experts]
    top_k = moe[0].ffn.top_k if moe else 0  # type: ignore[union-attr]
    ep_link = group_link(tp, ep, local, intra, inter)
    t_ep = t(gather_s(act * top_k, ep, ep_link), "EP link") * 4 * len(moe) / pp * m
    pp_link = inter if recipe.parallelism.gpus > local else intra
    t_pp = t(gather_s(act, 2, pp_link), "PP link") * 2 * 2 * m if pp > 1 else 0.0
    # overlapped: DP / ZeRO / FSDP, CP
    gb = dtype_bytes(dt.grad)
    pb = dtype_bytes(dt.param)
    n = recipe.parallelism.shard_degree if recipe.parallelism.zero else recipe.parallelism.dp * cp
    dp_link = group_link(tp, n, local, intra, inter)
    dp_gather = 0.0
    if recipe.parallelism.zero == 3:
        dp_gather = 2 * t(gather_s(elems_rank * pb, n, dp_link), "DP link") * m
        dp_reduce = t(gather_s(elems_rank * gb, n, dp_link), "DP link") * m
    elif recipe.parallelism.zero == 2:
        dp_reduce = t(gather_s(elems_rank * gb, n, dp_link), "DP link") * m
        dp_gather = t(gather_s(elems_rank * pb, n, dp_link), "DP link")
    else:
        dp_reduce = t(allreduce_s(elems_rank * gb, n, dp_link), "DP link")
    dpo = dp_overlap(recipe, gather_s=dp_gather, reduce_s=dp_reduce,
                     grad_bytes=elems_rank * gb, layers=layers_rank)
    kv = max((ly.attention.num_kv_heads * (ly.attention.head_dim + ly.attention.v_head_dim)
              for ly in model.layers if ly.attention), default=0)
    cp_link = group_link(tp, cp, local, intra, inter)
    cp_bytes = tokens_seq / cp * kv * dtype_bytes(dt.compute) / tp
    t_cp = t(gather_s(cp_bytes * cp, cp, cp_link), "CP link") * 3 * layers_rank * m

    # offload over PCIe / NVMe, CPU optimizer
    pcie_ovl = pcie_serial = nvme_ovl = nvme_opt = cpu = 0.0
    if recipe.offload.kind in ("optimizer", "params+optimizer", "nvme"):
        if d2h is None:
            unknown.append("PCIe generation")
        else:
            pcie_ovl += part * 2 / (d2h * 1e9) * m          # 16-bit gradient partition out
            if recipe.offload.kind == "optimizer":
                pcie_serial += part * 2 / (h2d * 1e9)         # updated 16-bit params back
            else:
                pcie_ovl += 2 * part * 2 / (h2d * 1e9) * m  # param shards in, fwd and bwd
        if recipe.offload.kind == "nvme":
            read = hw.nvme_read_gb_per_s
            write = hw.nvme_write_gb_per_s or (read * constant("nvme_write_fraction")
                                               if read else None)
            if read and write:
                per_rank_r, per_rank_w = read / local * 1e9, write / local * 1e9
                nvme_opt = part * 16 / per_rank_r + part * 12 / per_rank_w
                nvme_ovl = 2 * part * 2 / per_rank_r * m
            else:
                unknown.append("NVMe bandwidth")
        if hw.cpu_cores:
            cores = hw.cpu_cores / local
            cpu = part / (cores * constant("cpu_adam_elements_per_s_per_core"))
        else:
            unknown.append("CPU cores")
    data = 0.0
    if setup.tokenize:
        data = (local * tokens_replica / split * constant("text_bytes_per_token")
                / constant("tokenizer_bytes_per_s_per_node"))

    busy = t_compute + t_hbm
    # the CPU issues kernels asynchronously: the GPU waits only when issuing takes longer
    # than running them (whole-step run-ahead: a lower bound on the launch-bound time)
    t_launch = max(0.0, t_issue - busy)
    critical = busy + t_launch + t_tp + t_ep + t_pp + dpo.serial
    over = {dp_link.name: dpo.hidden, "pcie": pcie_ovl, "nvme": nvme_ovl, "data": data}
    over[cp_link.name] = over.get(cp_link.name, 0.0) + t_cp
    fwd_bwd = max([critical, *over.values()])
    excess_name = max(over, key=lambda k: over[k])
    v = recipe.parallelism.pp_virtual
    bubble = (pp - 1) / (m * v) * critical if pp > 1 else 0.0  # Narayanan et al. 2021 §2.2
    opt_serial = max(cpu, nvme_opt)
    step = fwd_bwd + bubble + opt_serial + pcie_serial

    exposed = {r: 0.0 for r in ("compute", "hbm", "launch", "nvlink", "network", "pcie", "nvme",
                                "cpu", "data", "pipeline bubble")}
    busy_s = dict.fromkeys(exposed, 0.0)
    exposed["compute"], exposed["hbm"], exposed["launch"] = t_compute, t_hbm, t_launch
    busy_s["compute"], busy_s["hbm"], busy_s["launch"] = t_compute, t_hbm, t_issue
    for link, s in ((tp_link, t_tp), (ep_link, t_ep), (pp_link, t_pp), (dp_link, dpo.serial)):
        exposed[link.name] += s
        busy_s[link.name] += s
    for name, s in over.items():
        busy_s[name] += s
    exposed[excess_name] += fwd_bwd - critical
    exposed["pipeline bubble"] = busy_s["pipeline bubble"] = bubble
    exposed["cpu" if cpu >= nvme_opt else "nvme"] += opt_serial
    busy_s["cpu"] += cpu
    busy_s["nvme"] += nvme_opt
    exposed["pcie"] += pcie_serial
    busy_s["pcie"] += pcie_serial
    att_f, att_b, _ = attention_efficiency(device, recipe.platform.attention, eff)
    if att_cal is not None:
        att_f, att_b = att_cal
    if cal is not None:
        notes.append(f"calibrated on {cal.torch_device} ({cal.model} shapes, torch "
                     f"{cal.torch_version}): GEMMs {cal.gemm_tflops:g} TFLOP/s")
    details = {
        "compute": f"GEMMs {kt.linear_s * m:.3g} s (rooflines at {eff:.0%} of "
                   f"{linear_peak / 1e12:g} "
                   f"TFLOP/s {key}), attention {kt.attention_s * m:.3g} s (fwd/bwd at "
                   f"{att_f:.0%}/{att_b:.0%} of {att_peak_t:g} TFLOP/s)",
        "hbm": f"memory-bound kernels ({'fused chains' if fused else 'op by op, eager'}: norms, "
               "rotary, activations, casts, softmax, cross-entropy; bytes from the op graph) "
               f"and the GPU optimizer step at {constant('hbm_efficiency'):.0%} of "
               f"{device.hbm_gb_per_s} GB/s",
        "launch": f"{kernels:,.0f} kernel launches x "
                  f"{constant('kernel_launch_cpu_seconds') * 1e6:g} us of CPU each; exposed "
                  "where issuing outlasts the GPU work",
        "nvlink": f"intra-node collectives (TP/EP/PP on the critical path; DP: {dpo.rule}; CP "
                  "overlapped)",
        "network": f"inter-node collectives (TP/EP/PP on the critical path; DP: {dpo.rule}; "
                   "CP overlapped)",
        "pcie": "offload transfers (gradients out and parameter fetches overlapped; "
                "ZeRO-Offload parameter upload serial)",
        "nvme": "ZeRO-Infinity swaps (optimizer swaps overlap the CPU step)",
        "cpu": "CPU optimizer step (serial: the GPU waits)",
        "data": "on-the-fly tokenisation (overlapped via prefetch)",
        "pipeline bubble": f"(pp - 1) / (micro-batches x pp_virtual) = {pp - 1}/{m * v} of "
                           "the critical path",
    }
    resources = tuple(ResourceTime(name=k, seconds=busy_s[k], exposed_seconds=exposed[k],
                                   detail=details[k])
                      for k in exposed if busy_s[k] or exposed[k])
    if unknown:
        notes.append("not timed (unknown): " + ", ".join(sorted(set(unknown)))
                     + "; give --node or --pcie")
    assumptions = (
        f"GEMMs: roofline of each linear layer's shape, at most {eff:.0%} of the dense {key} "
        "peak (H100 GEMM measurement, rates.toml); attention at the FlashAttention papers' "
        "fraction of the 16-bit peak (fp8 only on linear layers)",
        "compute and memory-bound kernels serial; memory-bound bytes "
        + ("of fused elementwise chains" if fused else "op by op (eager)")
        + " from the estimator's op graph; kernel launches exposed where the CPU is slower; "
        "TP/EP/PP comm on the critical path; DP comm by the engine's overlap rule ("
        + dpo.rule + "); CP comm, parameter fetches and data loading overlapped",
        "CPU optimizer step and ZeRO-Offload parameter upload serial after backward",
    )
    replicas = recipe.parallelism.gpus // split
    return TimeEstimate(
        step_seconds=step, tokens_per_step=tokens_replica * replicas, gpus=recipe.parallelism.gpus,
        model_flops_per_step=fl.model * tokens_replica * replicas,
        executed_flops_per_step=fl.executed * tokens_replica * replicas,
        model_flops_noncausal_per_step=fl.model_noncausal * tokens_replica * replicas,
        error_min=validation_band()[0], error_max=validation_band()[1],
        peak_flops_per_gpu=peak, gpu_busy_seconds=busy, resources=resources,
        assumptions=assumptions, notes=tuple(notes))
