"""Model-state formulas: bytes per element of parameters, gradients and optimizer states.

Every function is pure and states its source. Sharding (ZeRO/FSDP) and placement (offload) are
applied by ``estimate.model_states``; here a "byte count" is for the elements one rank holds.
"""

from __future__ import annotations

import math

from ..facts import optimizer_facts
from ..units import dtype_bytes
from .layout import Held

__all__ = [
    "quantized_bytes",
    "optimizer_state_bytes",
    "BNB_MIN_8BIT_SIZE",
    "BNB_BLOCK",
]

NF4_BLOCK = 64
"""QLoRA block size for weights (Dettmers et al. 2023, arXiv 2305.14314, §3 'Double Quantization')."""
NF4_DQ_BLOCK2 = 256
"""Second-level block size for the quantized absmax constants (same section)."""
GPTQ_GROUP = 128
"""GPTQ quantization group size of the common 4-bit checkpoints (``group_size: 128`` in the
``quantize_config.json`` of Qwen's -Int4 models and auto-gptq's examples)."""
BNB_MIN_8BIT_SIZE = 4096
"""bitsandbytes 8-bit optimizers keep tensors with fewer elements in 32-bit
(``min_8bit_size=4096``, bitsandbytes ``optim/optimizer.py``)."""
BNB_BLOCK = 256
"""Block size of bitsandbytes' block-wise 8-bit optimizer states (Dettmers et al. 2022,
arXiv 2110.02861, §2.1: blocks of 2048 in the paper; bitsandbytes kernels use 256 since 0.37)."""
BNB_QMAP_BYTES = 2 * 256 * 4
"""Two 256-entry fp32 quantization maps per 8-bit state pair (``qmap1``/``qmap2``)."""


def quantized_bytes(numel: int, out_features: int, quant: str) -> float:
    """Bytes of a frozen linear weight stored by bitsandbytes.

    - ``nf4``: 4 bits/element + one fp32 absmax per 64 elements = 4.5 bits.
    - ``nf4-dq``: 4 bits + int8 absmax per 64 + fp32 per 64*256 = 4.127 bits
      (QLoRA paper §3: "from 32/64 = 0.5 bits to 8/64 + 32/(64*256) = 0.127 bits per parameter").
    - ``int8`` (LLM.int8, Dettmers et al. 2022, arXiv 2208.07339): 1 byte/element + one fp32
      scale per output row (``Int8Params.SCB``).
    - ``gptq-int4`` (Frantar et al. 2023, arXiv 2210.17323; auto-gptq ``QuantLinear`` buffers,
      ``auto_gptq/nn_modules/qlinear``): ``qweight`` int32 packing 8 values (0.5 B/element),
      per group of ``GPTQ_GROUP`` input rows ``qzeros`` (4 bits per output) and fp16 ``scales``
      (2 B per output), and an int32 ``g_idx`` per input feature.
    """
    if quant == "nf4":
        return numel * 0.5 + math.ceil(numel / NF4_BLOCK) * 4
    if quant == "nf4-dq":
        blocks = math.ceil(numel / NF4_BLOCK)
        return numel * 0.5 + blocks * 1 + math.ceil(blocks / NF4_DQ_BLOCK2) * 4
    if quant == "int8":
        return numel * 1 + out_features * 4
    if quant == "gptq-int4":
        in_features = numel // max(1, out_features)
        groups = math.ceil(in_features / GPTQ_GROUP)
        return numel * 0.5 + groups * out_features * (0.5 + 2) + in_features * 4
    raise ValueError(f"not a quantized format: {quant}")


def _factored_elements(h: Held) -> int:
    """Adafactor's second-moment size: row + column factors for matrices, full for vectors
    (Shazeer & Stern 2018, arXiv 1804.04235, Alg. 4; HF ``Adafactor`` with ``beta1=None``)."""
    t = h.tensor
    if len(t.shape) < 2:
        return h.numel
    rows, cols = t.shape[0], math.prod(t.shape[1:])
    share = h.numel / t.numel if t.numel else 1.0  # fraction this rank holds (TP/EP split)
    return math.ceil(t.experts * (rows + cols) * share)


def optimizer_state_bytes(h: Held, optimizer: str, state_dtype: str) -> float:
    """Optimizer state bytes for one trainable tensor (master weights excluded).

    - adamw / adam / paged-adamw: exp_avg + exp_avg_sq = 2 states (Loshchilov & Hutter 2019;
      torch.optim.AdamW). Paged variants hold the same bytes in unified memory that the driver
      may evict to the host under pressure (bitsandbytes docs, 'Paged optimizers').
    - sgd: no state (momentum=0); sgd-momentum: 1 momentum buffer.
    - lion: 1 state, exp_avg (Chen et al. 2023, arXiv 2302.06675, Alg. 2).
    - adafactor: factored second moment, no first moment (Shazeer & Stern 2018).
    - adamw-8bit / paged-adamw-8bit: 2 uint8 states + fp32 absmax per 256-element block, +
      quantization maps; tensors under 4096 elements stay in fp32 (bitsandbytes).

    The number of states and their layout come from the optimizer table (``memplan.facts``).
    """
    facts = optimizer_facts(optimizer)
    n, k = h.numel, facts.states
    s = dtype_bytes(state_dtype)
    if facts.layout == "full":
        return k * n * s
    if facts.layout == "factored":
        return k * _factored_elements(h) * s
    if facts.layout == "blockwise-8bit":
        if h.tensor.numel < BNB_MIN_8BIT_SIZE:
            return k * n * 4
        return k * (n + math.ceil(n / BNB_BLOCK) * 4) + BNB_QMAP_BYTES
    raise AssertionError(f"facts.toml: unknown optimizer layout {facts.layout!r}")
