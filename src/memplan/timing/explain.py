"""The words of a step-time estimate: each resource's detail, the assumptions and the notes
(``step.estimate_time`` puts them beside the numbers of ``step.clock``; ``memplan plan``
reads the numbers only, ``step.step_figures``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..facts.constants import constant
from ..hardware import Device
from ..recipe import Recipe
from .calibration import Calibration
from .cpu_adam import CPU_ADAM_NAMES, SLOW_CPU_ADAM, cpu_adam_impl, cpu_adam_rate
from .fsdp2 import COPY_ENGINES
from .kernels import attention_efficiency
from .stage import HOST_OFFLOADS

if TYPE_CHECKING:
    from .step import Clock

__all__ = ["assumptions", "resource_details", "time_notes"]


def time_notes(c: Clock, recipe: Recipe, device: Device,
               cal: Calibration | None) -> tuple[str, ...]:
    """Caveats of the estimate: what was not timed or came from fallbacks, the stage that
    sets a pipeline's step, the calibration used."""
    notes: list[str] = []
    if any(s.traffic is None for s in c.stages):
        notes.append("memory-bound kernels from per-hidden byte counts (no op graph for this "
                     "model): launches not timed")
    if not c.rates.hbm:
        notes.append(f"{device.name} has no HBM bandwidth in the catalog: memory-bound kernels "
                     "not timed")
    times, j = c.times, c.j
    st = times[j]
    notes.extend(st.notes)
    if len({round(own, 12) for own in c.owns}) > 1:
        notes.append(f"pipeline stage times differ: stage {j} ({len(c.stages[j].layers)} layers"
                     + (", output layer" if j == len(c.stages) - 1 else "")
                     + f") sets the step at {c.owns[j]:.3g} s of its own work; the stages take "
                     + ", ".join(f"{own:.3g}" for own in c.owns) + " s")
    if cal is not None:
        notes.append(f"calibrated on {cal.torch_device} ({cal.model} shapes, torch "
                     f"{cal.torch_version}): GEMMs {cal.gemm_tflops:g} TFLOP/s")
    if recipe.offload.kind in HOST_OFFLOADS and c.rates.host.dram is None:
        notes.append("host DRAM bandwidth unknown (a --node preset or --hardware node with "
                     "memory_channels and memory_mt_per_s gives it): offload transfers and the CPU "
                     "optimizer not bounded by it")
    impl = cpu_adam_impl(recipe)
    if st.cpu and st.cpu_limit != "dram" and impl in SLOW_CPU_ADAM:
        notes.append(f"the CPU optimizer step runs {CPU_ADAM_NAMES[impl]} and waits for the "
                     "cores: --optimizer-impl fused (torch's fused CPU AdamW, torch >= 2.4; HF "
                     f"Trainer optim=adamw_torch_fused) steps "
                     f"{cpu_adam_rate('fused') / cpu_adam_rate(impl):g}x as many elements per "
                     "core")
    unknown = sorted({u for s in times for u in s.unknown})
    if unknown:
        notes.append("not timed (unknown): " + ", ".join(unknown) + "; give --node or --pcie")
    return tuple(notes)


def resource_details(c: Clock, recipe: Recipe, device: Device) -> dict[str, str]:
    """What each resource's time is, and the overlap rule it is exposed by."""
    st, rates = c.times[c.j], c.rates
    par = recipe.parallelism
    m, v, pp = recipe.batch.grad_accum, par.pp_virtual, par.pp
    eff = rates.matmul_efficiency
    att_f, att_b, _ = attention_efficiency(device, recipe.platform.attention, eff)
    if rates.attention_override is not None:
        att_f, att_b = rates.attention_override
    fused = rates.fused
    rule = st.dp.rule
    quant = f" x tile/wave quantisation on {rates.gemm_sms} SMs" if rates.gemm_sms else ""
    return {
        "compute": f"GEMMs {st.linear:.3g} s (rooflines at {eff:.0%} of "
                   f"{rates.linear_peak / 1e12:g} "
                   f"TFLOP/s {c.key}{quant}), attention {st.attention:.3g} s (fwd/bwd at "
                   f"{att_f:.0%}/{att_b:.0%} of {rates.attention_peak / 1e12:g} TFLOP/s)",
        "hbm": f"memory-bound kernels ({'fused chains' if fused else 'op by op, eager'}: norms, "
               "rotary, activations, casts, softmax, cross-entropy; bytes from the op graph)"
               + (", FSDP2 all-gather copy-out and reduce-scatter copy-in" if par.zero == 3
                  and str(recipe.engine_kind) in COPY_ENGINES else "")
               + f" and the GPU optimizer step at {constant('hbm_efficiency'):.0%} of "
               f"{device.hbm_gb_per_s} GB/s",
        "launch": f"{st.kernels:,.0f} kernel launches x "
                  f"{constant('kernel_launch_cpu_seconds') * 1e6:g} us of CPU each; exposed "
                  "where issuing outlasts the GPU work",
        "nvlink": f"intra-node collectives (TP/EP/PP on the critical path; DP: {rule}; CP "
                  "overlapped; overlapped ones slow the kernels beside them by "
                  f"{constant('overlap_compute_slowdown'):.1%})",
        "network": f"inter-node collectives (TP/EP/PP on the critical path; DP: {rule}; "
                   "CP overlapped; overlapped ones slow the kernels beside them by "
                   f"{constant('overlap_compute_slowdown'):.1%})",
        "pcie": "offload transfers (gradients out and parameter fetches overlapped; "
                "ZeRO-Offload parameter upload serial)" + _pcie_limit(c, recipe),
        "nvme": "ZeRO-Infinity swaps (optimizer swaps overlap the CPU step)",
        "cpu": "CPU optimizer step (serial: the GPU waits)" + _cpu_limit(c, recipe),
        "data": "on-the-fly tokenisation (overlapped via prefetch)",
        "pipeline bubble": "1F1B fill and drain: the other stages' work x 1/(micro-batches x "
                           f"pp_virtual) = 1/{m * v} (even stages: {pp - 1}/{m * v} of the "
                           "critical path)",
    }


def _dram(c: Clock, recipe: Recipe) -> str:
    host = c.rates.host
    return (f"{(host.dram or 0) / 1e9:.0f} GB/s usable per socket, {host.sockets} sockets for "
            f"{recipe.parallelism.local_gpus} ranks, {constant('dram_efficiency'):.0%} of "
            "channels x MT/s x 8 B")


def _cpu_limit(c: Clock, recipe: Recipe) -> str:
    """Which of the cores or the socket's DRAM the CPU optimizer step waits for
    (``host_memory.HostMemory.optimizer``); nothing without a CPU step."""
    st = c.times[c.j]
    if not st.cpu:
        return ""
    if st.cpu_limit == "dram":
        return f", set by the socket's DRAM ({_dram(c, recipe)})"
    impl = cpu_adam_impl(recipe)
    return (f", set by the cores ({cpu_adam_rate(impl) / 1e6:g} M elements/s per core: "
            f"{CPU_ADAM_NAMES[impl]})")


def _pcie_limit(c: Clock, recipe: Recipe) -> str:
    """Which of the GPU's link, its socket's DRAM or the inter-socket link the offload
    transfers wait for, the longer phase's first (``host_memory.HostMemory.transfer``)."""
    host, rates, limits = c.rates.host, c.rates, c.times[c.j].pcie_limits
    if not limits:   # no offload, or its PCIe generation is unknown
        return ""
    words = {"dram": f"the socket's DRAM ({_dram(c, recipe)})",
             "socket link": f"the inter-socket link ({(host.link or 0) / 1e9:.0f} GB/s usable per "
                            f"direction; unbound ranks keep {host.remote:.0%} of their pinned "
                            "pages on the far socket: bind them, numa_bound = true in the "
                            "recipe's host table, torchrun --numa-binding=node)",
             "pcie": f"the GPU's PCIe link ({rates.h2d:g} GB/s in, {rates.d2h:g} out)"}
    return ", set by " + " and ".join(words[k] for k in limits)


def assumptions(c: Clock, recipe: Recipe) -> tuple[str, ...]:
    """The efficiencies and overlap rules the estimate used."""
    rates = c.rates
    eff, fused, rule = rates.matmul_efficiency, rates.fused, c.times[c.j].dp.rule
    out = (
        f"GEMMs: roofline of each linear layer's shape at {eff:.0%} of the dense {c.key} peak "
        + ("(a whole-wave tile grid: the architecture's measured GEMM rate over its shape's "
           "quantisation, rates.toml), scaled by the shape's tile and wave quantisation (NVIDIA's "
           "Matrix Multiplication Background guide)" if rates.gemm_sms else
           "(measured, calibrated or set; applied to every shape as given)")
        + "; attention at the FlashAttention papers' "
        "fraction of the 16-bit peak (fp8 only on linear layers)",
        "compute and memory-bound kernels serial; memory-bound bytes "
        + ("of fused elementwise chains" if fused else "op by op (eager)")
        + " from the estimator's op graph; kernel launches exposed where the CPU is slower; "
        "TP/EP/PP comm on the critical path; DP comm by the engine's overlap rule ("
        + rule + "); CP comm, parameter fetches and data loading overlapped",
        "CPU optimizer step and ZeRO-Offload parameter upload serial after backward",
    )
    if recipe.parallelism.pp > 1:
        out += ("pipeline: each stage timed with its own layers (the output layer on "
                "the last); the slowest stage plus the others' fill and drain sets the "
                "step",)
    return out
