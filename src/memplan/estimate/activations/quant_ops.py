"""What a quantised frozen linear adds to the forward, as ``Graph`` ops.

**GPTQ** (auto-gptq 0.4.2, ``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py``
``QuantLinear.forward``; the class ``dynamically_import_QuantLinear`` picks for 4-bit,
``desc_act = False`` checkpoints with ``disable_exllama=True``, as Qwen's ``finetune.py`` loads
its -Int4 models through ``GPTQConfig(bits=4, disable_exllama=True)``). With at least
``kernel_switch_threshold = 128`` rows in ``x`` the CUDA kernel is skipped and the weight is
dequantised in PyTorch ops:

- ``torch.bitwise_right_shift(qweight.unsqueeze(1).expand(-1, 8, -1), wf)``: an int32
  ``in x out`` tensor (4 B per weight), cast ``.to(torch.int8)`` (1 B);
- ``scales * (weight - zeros)``: an int8 difference (1 B), then the fp16 weight (2 B);
- ``torch.matmul(x.half(), weight)``: autograd saves the fp16 weight for ``x``'s gradient
  whenever ``x`` requires grad (LoRA and checkpointed layers: it does).

So the dequantised fp16 weights of every quantised linear of a layer are saved while the layer
is recorded (one layer at a time under full checkpointing: its recompute), and each dequant
peaks at 5 B per weight (int32 + int8). Below 128 rows (``x.shape[0] < 128``) the fused kernel
runs and nothing is added.

Known limitations: Qwen-1's fused ``c_attn`` is drawn as three q/k/v linears (``families.py``),
so its int32 transient is counted per third (the saved fp16 weight is the same). Under full
checkpointing the backward's recompute re-runs these ops (``graph._recompute`` replays every op
of the group), so the transient is seen there too, as in reentrant ``torch.utils.checkpoint``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .graph import Tensor

if TYPE_CHECKING:
    from .blocks import Blocks

__all__ = ["GPTQ_KERNEL_SWITCH_ROWS", "gptq_weight"]

GPTQ_KERNEL_SWITCH_ROWS = 128
"""``QuantLinear(kernel_switch_threshold=128)`` (auto-gptq 0.4.2 qlinear_cuda_old.py): inputs
with fewer rows use the CUDA matmul kernel, the others the PyTorch dequantisation."""


def gptq_weight(b: Blocks, numel: int) -> Tensor | None:
    """The fp16 weight ``QuantLinear.forward`` dequantises for one matmul (None: the kernel
    path, fewer than ``GPTQ_KERNEL_SWITCH_ROWS`` rows)."""
    if b.c.tokens < GPTQ_KERNEL_SWITCH_ROWS:
        return None
    shifted = b.new(numel, 4, grad=False)  # int32 bitwise_right_shift of the expanded qweight
    b.g.op([], (shifted,))
    unpacked = b.new(numel, 1, grad=False)  # .to(torch.int8)
    b.g.op([shifted], (unpacked,))
    diff = b.new(numel, 1, grad=False)  # weight - zeros (int8)
    b.g.op([unpacked], (diff,))
    weight = b.new(numel, 2, grad=False)  # scales * (...): fp16
    b.g.op([unpacked, diff], (weight,))
    return weight
