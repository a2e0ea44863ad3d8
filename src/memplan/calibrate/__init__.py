"""``memplan calibrate``: short micro-benchmarks on this machine's device, written as a
``Calibration`` (``timing/calibration.py``) that ``estimate --calibration FILE`` reads.

Torch is imported inside ``calibrate`` only. What is timed (each the median of ``repeats``
runs after one warm-up, synchronised on CUDA):

- **GEMMs of the model's real shapes**: every linear weight ``(o, i)`` of the first layer (a
  routed expert with ``tokens x top_k / E`` tokens) and the output head, fed ``tokens`` rows of
  ``dtype``; the rate is total FLOPs / total time (FLOP-weighted, as the step uses them);
- **attention**: ``scaled_dot_product_attention(is_causal=True)`` with the first layer's heads and
  head dim, forward and backward, FLOPs counted causally (``timing.flops``' convention);
- **HBM**: a device-to-device copy of ``copy_bytes`` (read + write counted);
- **host-device copies** (CUDA only): pinned ``copy_bytes`` each way;
- **collectives** (only under torchrun, ``WORLD_SIZE`` > 1): all-reduce of ``copy_bytes``,
  bus bandwidth ``2 (n-1)/n x bytes / s`` (nccl-tests' busBW convention).

On CPU the same code runs at small sizes (CI), so the file format and its reader are tested.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from ..model.spec import Component, ModelSpec
from ..timing.calibration import Calibration
from ..timing.flops import fused_backward_factor

__all__ = ["calibrate"]

_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _timed(fn: Any, repeats: int, sync: Any) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after one warm-up."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _gemm_shapes(model: ModelSpec, tokens: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of the first layer's linear GEMMs and the head, as ``timing.kernels`` prices
    them (experts: one GEMM per expert of ``tokens x top_k / E`` rows)."""
    layer = model.layers[0]
    shapes = []
    for t in layer.tensors:
        if len(t.shape) != 2 or t.is_bias or t.component in (Component.NORM, Component.EMBEDDING):
            continue
        o, i = t.shape
        if t.experts > 1 and layer.ffn is not None and layer.ffn.num_experts:
            m = max(1, tokens * layer.ffn.top_k // t.experts)
            shapes += [(m, i, o)] * t.experts
        else:
            shapes.append((tokens, i, o))
    shapes.append((tokens, model.hidden_size, model.vocab_size))
    return shapes


def calibrate(model: ModelSpec, gpu: str, *, device: str = "cuda", dtype: str = "bf16",
              tokens: int = 4096, seq_len: int = 4096, copy_bytes: int = 1 << 30,
              repeats: int = 5) -> Calibration:
    """Time GEMMs of ``model``'s shapes, attention, HBM, host copies and (under torchrun)
    all-reduce on ``device``; ``gpu`` names the catalog GPU the rates stand for."""
    import torch
    import torch.nn.functional as F

    dev = torch.device(device)
    tdt = getattr(torch, _TORCH_DTYPES[dtype])
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    flops = secs = 0.0
    for (m, k, n) in _gemm_shapes(model, tokens):
        a = torch.randn(m, k, device=dev, dtype=tdt)
        b = torch.randn(k, n, device=dev, dtype=tdt)
        secs += _timed(lambda a=a, b=b: a @ b, repeats, sync)
        flops += 2.0 * m * k * n

    att = model.layers[0].attention
    fwd_t = bwd_t = 0.0
    if att is not None:
        heads, d = att.num_heads, att.head_dim
        batch = max(1, tokens // seq_len)
        q, k_, v = (torch.randn(batch, heads, seq_len, d, device=dev, dtype=tdt,
                                requires_grad=True) for _ in range(3))
        f_fwd = 2.0 * batch * heads * seq_len * seq_len * 2 * d * 0.5   # QK^T + AV, causal half
        t_f = _timed(lambda: F.scaled_dot_product_attention(q, k_, v, is_causal=True),
                     repeats, sync)
        out = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
        grad = torch.randn_like(out)

        def fwd_bwd() -> None:
            o = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
            torch.autograd.grad(o, (q, k_, v), grad)

        t_fb = _timed(fwd_bwd, repeats, sync)
        fwd_t = f_fwd / t_f / 1e12
        # counted as the kernel time counts a fused backward (QK^T recomputed)
        bwd_t = fused_backward_factor(d, d) * f_fwd / max(t_fb - t_f, 1e-9) / 1e12

    n_el = copy_bytes // 2
    src = torch.empty(n_el, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    hbm = 2 * copy_bytes / _timed(lambda: dst.copy_(src), repeats, sync) / 1e9

    h2d = d2h = 0.0
    if cuda:
        host = torch.empty(n_el, dtype=torch.bfloat16, pin_memory=True)
        h2d = copy_bytes / _timed(lambda: src.copy_(host, non_blocking=True), repeats, sync) / 1e9
        d2h = copy_bytes / _timed(lambda: host.copy_(src, non_blocking=True), repeats, sync) / 1e9

    bus, world = 0.0, int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        buf = torch.empty(n_el, device=dev, dtype=torch.bfloat16 if cuda else torch.float32)
        nbytes = buf.numel() * buf.element_size()
        t = _timed(lambda: dist.all_reduce(buf), repeats, sync)
        bus = 2 * (world - 1) / world * nbytes / t / 1e9

    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    return Calibration(gpu=gpu, torch_device=name, model=model.id, dtype=dtype,
                       gemm_tflops=flops / secs / 1e12, attention_fwd_tflops=fwd_t,
                       attention_bwd_tflops=bwd_t, hbm_gb_per_s=hbm, h2d_gb_per_s=h2d,
                       d2h_gb_per_s=d2h, allreduce_bus_gb_per_s=bus, world_size=world,
                       torch_version=torch.__version__)
