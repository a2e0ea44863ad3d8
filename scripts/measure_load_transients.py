"""Measure, on CPU, the temporaries of quantising one bf16 weight to NF4 with torchao's
``to_nf4``: the peak of live tensor bytes, the bf16 input included, per element of the weight.

The counter is independent of memplan (its own ``TorchDispatchMode``: each op output's storage
counted once, freed when its Python storage object dies), so it checks
``memplan.estimate.load``'s constants rather than sharing their derivation. Eager ops allocate
the same outputs on CPU as on CUDA; the caching allocator's rounding is not modelled.

torchao is not a memplan dependency; point ``--nf4`` at the ``nf4tensor.py`` of the version to
measure, e.g. torchao 0.1 (what torchtune pinned until May 2024):

    pip download torchao==0.1 --no-deps -d /tmp/ao && unzip -o /tmp/ao/*.whl -d /tmp/ao
    python scripts/measure_load_transients.py --nf4 /tmp/ao/torchao/dtypes/nf4tensor.py

Prints one JSON object: the shape, the peak bytes (input included) and bytes per element.

``--dequant`` instead measures the other direction, what ``linear_nf4`` runs in its forward and
backward (``weight.to(dtype)``): ``NF4Tensor.get_original_weight`` on an already quantised
weight, the peak of its temporaries and output per element of the weight.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """Live bytes of the storages created by ops run under it, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = 0
        self.peak = 0

    def _free(self, key: int, _ref: object) -> None:
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and type(t) is torch.Tensor:
                st = t.untyped_storage()
                key = id(st)
                if key not in self.live and st.nbytes():
                    self.live[key] = st.nbytes()
                    self.now += st.nbytes()
                    weakref.finalize(st, self._free, key, None)
        self.peak = max(self.peak, self.now)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nf4", required=True, help="path of torchao's dtypes/nf4tensor.py")
    ap.add_argument("--rows", type=int, default=11008)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--dequant", action="store_true",
                    help="measure get_original_weight (NF4 -> bf16) instead of to_nf4")
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("nf4tensor", a.nf4)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if a.dequant:
        q = mod.to_nf4(torch.randn(a.rows, a.cols, dtype=torch.bfloat16))
        m = LiveBytes()
        for t in (q.quantized_data, q.quantized_scalers, q.quantization_factor, q.scaler_mean,
                  q.nf4):
            m.live[id(t.untyped_storage())] = 0  # made before the count
        with m:
            w = q.get_original_weight()
        print(json.dumps({"nf4": a.nf4, "shape": [a.rows, a.cols], "numel": w.numel(),
                          "dequant_peak_bytes": m.peak,
                          "bytes_per_element": round(m.peak / w.numel(), 3),
                          "dtype": str(w.dtype)}))
        return
    with LiveBytes() as m:  # the input is made inside, so it counts from the start
        w = torch.randn(a.rows, a.cols, dtype=torch.bfloat16)
        q = mod.to_nf4(w)
    numel = w.numel()
    print(json.dumps({"nf4": a.nf4, "shape": [a.rows, a.cols], "numel": numel,
                      "peak_bytes": m.peak,
                      "bytes_per_element": round(m.peak / numel, 3),
                      "kept_bytes_with_input": m.now, "type": type(q).__name__}))


if __name__ == "__main__":
    main()
