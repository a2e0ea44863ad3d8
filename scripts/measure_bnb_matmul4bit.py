"""Measure, on CPU, what bitsandbytes' 4-bit matmul (``bnb.matmul_4bit``, the training path
``MatMul4Bit``) allocates beside its input and output: the peak of live tensor bytes in the
forward and in the backward, per element of the weight.

The counter is independent of memplan: ``scripts/measure_load_transients.py``'s own
``TorchDispatchMode`` (each op output's storage counted once, freed when its storage dies), so
it checks ``Ctx.dequant`` (``memplan/estimate/activations/context.py``) rather than sharing
its derivation. The input, the packed weight and its ``quant_state`` are made before the count
starts (the packed weight's storage is marked as already there); the forward output and the
input gradient count. The run calls ``MatMul4Bit.apply`` as ``matmul_4bit`` does for a training
input on CUDA: on CPU ``matmul_4bit`` first sets ``quant_state.dtype = A.dtype`` (0.49.2,
``autograd/_functions.py``), which would hide the copy to the compute dtype.

bitsandbytes is not a memplan dependency; install the version to measure next to it, e.g.
bitsandbytes 0.49.2 (its CPU backend runs ``dequantize_4bit``; ``MatMul4Bit`` is the same
Python as 0.42.0 in the forward and backward, except that 0.42.0 also kept the input):

    pip install --no-deps --target /tmp/bnb bitsandbytes==0.49.2
    python scripts/measure_bnb_matmul4bit.py --bnb /tmp/bnb --quant-dtype fp16

Prints one JSON object per run: the shape, the dtypes, the forward and backward peaks above
the output / input gradient, and both per element of the weight.

``--kept SOURCE`` instead measures how long a chain's inner input lives: ``x -> MatMul4Bit ->
* 2 -> MatMul4Bit -> y`` with the caller dropping the inner tensor ``h``, live bytes after the
forward, after ``y.backward`` (``y`` still bound, as a loop that keeps its outputs does) and
after ``del y``; for the installed ``MatMul4Bit`` and for the class in ``SOURCE`` (a file with
bitsandbytes 0.42.0's ``class MatMul4Bit`` cut out of ``autograd/_functions.py``, run against
the installed ``functional``):

    git show 0.42.0:bitsandbytes/autograd/_functions.py > /tmp/f.py   # then keep the class
    python scripts/measure_bnb_matmul4bit.py --bnb /tmp/bnb --kept /tmp/matmul4bit_042.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from measure_load_transients import LiveBytes  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def run(bnb, rows: int, cols: int, tokens: int, quant_dtype: str) -> dict[str, object]:
    F = bnb.functional
    w = torch.randn(rows, cols, dtype=DTYPES[quant_dtype])
    q, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    del w
    x = torch.randn(tokens, cols, dtype=torch.bfloat16, requires_grad=True)
    matmul = bnb.autograd._functions.MatMul4Bit.apply
    packed = id(q.untyped_storage())
    fwd, bwd = LiveBytes(), LiveBytes()
    fwd.live[packed] = bwd.live[packed] = 0  # made before the count: not an allocation
    with fwd:
        y = matmul(x, q.t(), None, None, state)
    out_bytes = y.untyped_storage().nbytes()
    g = torch.ones_like(y)
    with bwd:
        y.backward(g)
    grad_bytes = x.grad.untyped_storage().nbytes()
    numel = rows * cols
    return {"bitsandbytes": bnb.__version__, "shape": [rows, cols], "numel": numel,
            "tokens": tokens, "quant_dtype": quant_dtype, "compute_dtype": "bf16",
            "forward_peak_bytes": fwd.peak, "forward_output_bytes": out_bytes,
            "forward_extra_per_element": round((fwd.peak - out_bytes) / numel, 3),
            "backward_peak_bytes": bwd.peak, "backward_grad_bytes": grad_bytes,
            "backward_extra_per_element": round((bwd.peak - grad_bytes) / numel, 3)}


def kept(bnb, apply, label: str, tokens: int = 64) -> dict[str, object]:
    """Live bytes of the chain described in the module docstring (x, the packed weights and
    their states made before the count)."""
    F = bnb.functional
    q1, s1 = F.quantize_4bit(torch.randn(1024, 512, dtype=torch.float16), quant_type="nf4")
    q2, s2 = F.quantize_4bit(torch.randn(256, 1024, dtype=torch.float16), quant_type="nf4")
    x = torch.randn(tokens, 512, dtype=torch.bfloat16, requires_grad=True)
    m = LiveBytes()
    for q in (q1, q2):
        m.live[id(q.untyped_storage())] = 0
    with m:
        h = apply(x, q1.t(), None, None, s1) * 2.0
        y = apply(h, q2.t(), None, None, s2)
        del h
        after_forward = m.now
        y.backward(torch.ones_like(y))
        after_backward = m.now
        del y
        after_del = m.now
    return {"matmul4bit": label, "tokens": tokens, "h_bytes": tokens * 1024 * 2,
            "y_bytes": tokens * 256 * 2, "x_grad_bytes": tokens * 512 * 2,
            "after_forward": after_forward, "after_backward_y_kept": after_backward,
            "after_del_y": after_del}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bnb", required=True, help="folder that holds the bitsandbytes package")
    ap.add_argument("--quant-dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument("--rows", type=int, default=11008)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kept", help="file with bitsandbytes 0.42.0's MatMul4Bit class")
    a = ap.parse_args()
    sys.path.insert(0, a.bnb)
    import bitsandbytes as bnb

    if not a.kept:
        print(json.dumps(run(bnb, a.rows, a.cols, a.tokens, a.quant_dtype)))
        return
    spec = importlib.util.spec_from_file_location("matmul4bit_old", a.kept)
    assert spec and spec.loader
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    for label, fn in ((bnb.__version__, bnb.autograd._functions.MatMul4Bit.apply),
                      ("0.42.0 source", old.MatMul4Bit.apply)):
        print(json.dumps(kept(bnb, fn, label)))


if __name__ == "__main__":
    main()
