"""Kernel time of the forward/backward on one rank: per-GEMM rooflines and attention kernels.

Legend: T = tokens per rank per micro-batch (micro_batch x seq_len / cp), ``(o, i)`` a linear
weight's shape per rank (o or i divided by tp; experts by etp), E routed experts, k = top_k.

- **GEMMs** (``gemm_seconds``): each linear weight is one GEMM of ``T x i`` by ``i x o``; a
  routed expert's GEMM sees ``T / tp x k x ep x etp / E`` tokens (balanced routing; Megatron-
  Core's all-to-all dispatcher, ``_layer_gemm_s``), so MoE runs small GEMMs, not one large one. Time is the roofline (Williams, Waterman & Patterson 2009, CACM
  52(4)): ``max(2 T i o / (peak x matmul_efficiency), bytes / (HBM x hbm_efficiency))`` with
  bytes = both inputs + the output. Small or skinny GEMMs become bandwidth-bound below the peak.
  Backward runs two GEMMs of the same size (activation gradient, and weight gradient where the
  weight trains). Under ``fp8-mixed`` only these linear GEMMs run at the FP8 peak (Transformer
  Engine casts the inputs of ``Linear`` layers; attention stays in 16 bits).
- **Attention core** (``attention_seconds``): QK^T and AV FLOPs actually executed
  (``flops.attention_core_flops`` x causal share) at the kernel's published fraction of the
  16-bit peak, forward and backward separately (``rates.toml``: FlashAttention-2/3 papers).
  ``eager`` runs batched GEMMs at ``matmul_efficiency`` (its score traffic is HBM time in
  ``step.py``).

GEMM efficiency: the architecture's measured large-GEMM fraction, scaled by the shape's tile and
wave quantisation (``gemm.py``, NVIDIA's Matrix Multiplication Background guide).

**Known limitations**: backward GEMMs are timed at the forward shape's quantisation; attention
efficiency does not depend on sequence length or head dim (the papers' figures are for head dim
128, long sequences) nor on the kernel an engine picks (Transformer Engine's cuDNN attention on
Hopper is timed as FlashAttention-2); GPUs without a published attention benchmark (Blackwell,
Ada, AMD) use ``matmul_efficiency`` for attention, noted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hardware import Device
from ..facts.constants import constants
from ..model.spec import Component, Layer, ModelSpec, Split
from ..recipe import Recipe
from ..recipe.parallelism import Parallelism
from .flops import (_causal_share, attention_backward_factor, attention_core_flops,
                    frozen_weight_grads)
from .gemm import gemm_efficiency, power_limited_share
from .recompute import attention_recomputed, recompute_inputs, recompute_matmul_share

__all__ = ["KernelTime", "attention_efficiency", "gemm_seconds", "kernel_seconds",
           "kernel_inputs", "method_inputs"]

_NOT_MATMUL = (Component.NORM, Component.EMBEDDING)


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelTime:
    """Seconds of one micro-batch's forward + backward (+ recompute) on one rank."""

    linear_s: float
    """GEMMs of the linear layers and the output head."""
    attention_s: float
    """Attention core (QK^T, softmax, AV) kernels."""
    forward_s: float = 0.0
    """The part of ``linear_s + attention_s`` the forward runs (recomputation counts with the
    backward): where the step's time axis puts the forward (``schedule.py``)."""
    notes: tuple[str, ...] = ()
    """Fallbacks taken (no published kernel figure for this GPU)."""


def gemm_seconds(m: float, k: float, n: float, *, peak_flops: float, matmul_efficiency: float,
                 hbm_bytes_per_s: float, bytes_per_element: float,
                 sm_count: int | None = None) -> float:
    """Roofline time of an ``(m x k) @ (k x n)`` GEMM: the larger of its FLOPs at
    ``peak x efficiency`` and its operand + output bytes at the usable HBM bandwidth. With
    ``sm_count``, the efficiency is scaled by the ``m x n`` output's tile and wave quantisation
    relative to the measured shape's (``gemm.gemm_efficiency``)."""
    eff = gemm_efficiency(matmul_efficiency, m, n, sm_count)
    flops_s = 2.0 * m * k * n / (peak_flops * eff)
    if not hbm_bytes_per_s:
        return flops_s
    bytes_s = (m * k + k * n + m * n) * bytes_per_element / hbm_bytes_per_s
    return max(flops_s, bytes_s)


def attention_efficiency(device: Device, attention: str, matmul_efficiency: float
                         ) -> tuple[float, float, str | None]:
    """(forward, backward) fraction of the 16-bit peak the attention kernel reaches on
    ``device``, and a note when no published figure exists for its architecture. The
    FlashAttention papers' fractions were measured at the boards' full power: below it they
    shrink by the board's power-limited share, as the GEMMs' do (``gemm.power_limited_share``;
    ``matmul_efficiency`` already carries it)."""
    if attention == "eager":
        return matmul_efficiency, matmul_efficiency, None
    rows = constants()
    key = f"attention_efficiency_{device.arch}_fa2"
    if f"{key}_fwd" in rows:
        share = power_limited_share(device)
        return rows[f"{key}_fwd"].value * share, rows[f"{key}_bwd"].value * share, None
    return (matmul_efficiency, matmul_efficiency,
            f"no published FlashAttention benchmark for {device.arch} GPUs: attention timed at "
            f"the GEMM efficiency {matmul_efficiency:.0%} (optimistic)")


def _layer_gemm_s(layer: Layer, tokens: float, par: Parallelism, gemm) -> float:
    """Forward seconds of a layer's linear GEMMs on one rank of a ``tokens``-token micro-batch.

    Dense weights: column-parallel split their output, row-parallel their input over ``tp``
    (Megatron's ``ColumnParallelLinear`` / ``RowParallelLinear``); a replicated weight (router)
    runs on the rank's ``1/tp`` sequence shard. Routed experts follow Megatron-Core's all-to-all
    token dispatcher (``megatron/core/transformer/moe/token_dispatcher.py`` @0014f13,
    ``MoEAlltoAllTokenDispatcher``: permute -> A2A(EP) -> AG(expert TP) -> experts ->
    RS(expert TP) -> A2A(EP); its input is the sequence-parallel shard ``[S/TP, B, H]`` and its
    ``tp_group`` is the *expert* TP group): a rank holds ``E / ep`` experts, each split over
    ``etp`` ranks and fed ``tokens / tp x k x ep x etp / E`` tokens (balanced routing; x the
    capacity factor when inputs are padded to capacity). Per rank that is ``2 tokens k i o /
    tp`` FLOPs whatever ``etp`` is; ``etp`` changes the GEMMs' shape (taller, narrower) and the
    weight bytes each rank reads."""
    ffn = layer.ffn
    tp, ep, etp = par.tp, par.ep, par.expert_tp
    total = 0.0
    for t in layer.tensors:
        if len(t.shape) != 2 or t.is_bias or t.component in _NOT_MATMUL:
            continue
        o, i = t.shape
        if t.experts > 1 and ffn is not None and ffn.num_experts:
            m = tokens / tp * ffn.top_k * ep * etp / t.experts * (par.moe_capacity_factor or 1.0)
            total += t.experts / ep * _split_gemm(gemm, max(1.0, m), i, o, t.split, etp)
        else:
            total += _split_gemm(gemm, tokens, i, o, t.split, tp)
    return total


def _split_gemm(gemm, m: float, i: float, o: float, split: Split, n: int) -> float:
    """``gemm`` of an ``(o, i)`` weight on ``m`` tokens, split over ``n`` ranks by ``split``."""
    if split in (Split.COLUMN, Split.VOCAB):
        return gemm(m, i, o / n)
    if split is Split.ROW:
        return gemm(m, i / n, o)
    return gemm(m / n, i, o)


def kernel_inputs(recipe: Recipe) -> tuple[object, ...]:
    """Every recipe field ``kernel_seconds`` reads (its keyword arguments and the device
    aside): a memo key for a caller timing many recipes of one model (``memplan plan``)."""
    par = recipe.parallelism
    return (par.tp, par.cp, par.ep, par.expert_tp, par.moe_capacity_factor,
            recipe.batch.micro_batch, recipe.batch.seq_len, *method_inputs(recipe),
            *recompute_inputs(recipe))


def method_inputs(recipe: Recipe) -> tuple[object, ...]:
    """The method and the engine, whole: what decides which weights get gradients (more
    than ``method.kind``: an engine may compute frozen weights' gradients too), for the memo
    keys of ``kernel_seconds`` and ``flops.token_flops``."""
    return (recipe.method, recipe.engine, str(recipe.engine_kind))


def kernel_seconds(model: ModelSpec, recipe: Recipe, device: Device, *, layers: range,
                   head: bool, linear_peak: float, attention_peak: float,
                   matmul_efficiency: float, hbm_bytes_per_s: float, bytes_per_element: float,
                   attention_override: tuple[float, float] | None = None,
                   gemm_sms: int | None = None) -> KernelTime:
    """GEMM and attention time of one micro-batch (forward, backward, recompute) on one rank of
    the pipeline stage holding ``layers`` (and the output head when ``head``: the last stage).
    ``attention_override`` = measured (forward, backward) fractions of ``attention_peak``
    (``memplan calibrate``); ``gemm_sms``: SMs for the shape's quantisation (None: the
    efficiency applies to every shape as given)."""
    par = recipe.parallelism
    tp, cp = par.tp, par.cp
    tokens = recipe.batch.micro_batch * recipe.batch.seq_len / cp

    def gemm(m: float, k: float, n: float) -> float:
        return gemm_seconds(m, k, n, peak_flops=linear_peak, matmul_efficiency=matmul_efficiency,
                            hbm_bytes_per_s=hbm_bytes_per_s, bytes_per_element=bytes_per_element,
                            sm_count=gemm_sms)

    eff_f, eff_b, note = attention_efficiency(device, recipe.platform.attention, matmul_efficiency)
    if attention_override is not None:
        (eff_f, eff_b), note = attention_override, None
    n = model.num_layers
    first_trainable = n - recipe.method.freeze_trainable_layers if recipe.method.kind == "freeze" else 0
    w_grad = 1.0 if recipe.method.kind in ("full", "freeze") or frozen_weight_grads(recipe) \
        else 0.0
    lin = att = fwd = 0.0
    for i in layers:
        layer = model.layers[i]
        g = _layer_gemm_s(layer, tokens, par, gemm)
        a = attention_core_flops(layer, recipe.batch.seq_len) * tokens / tp
        if recipe.platform.attention != "eager":
            a *= _causal_share(layer)
        back = attention_backward_factor(layer, recipe.platform.attention)
        a_f, a_b = a / (attention_peak * eff_f), back * a / (attention_peak * eff_b)
        fwd += g + a_f
        if i < first_trainable:
            lin += g
            att += a_f
            continue
        lin += g * (2 + w_grad) + g * recompute_matmul_share(recipe, layer, i, n)
        att += a_f + a_b + (a_f if attention_recomputed(recipe, i, n) else 0.0)
    if head:
        h = gemm(tokens, model.hidden_size, model.vocab_size / tp)
        lin += h * (3 if recipe.method.kind == "full" else 2)
        fwd += h
    return KernelTime(linear_s=lin, attention_s=att, forward_s=fwd,
                      notes=(note,) if note else ())
