"""How close a CPU Adam step comes to the host's DRAM bandwidth (issue #19, host memory
placement): ``timing/host_memory.py`` bounds the CPU optimizer step by its socket's DRAM at
``optimizer_bytes_per_param_gpu`` (32 B) per element. This measures, on this machine, torch's
fused CPU AdamW over fp32 parameters (it reads parameter, gradient, m and v and writes
parameter, m and v: 28 B per element, no 16-bit copy) next to a STREAM-style TRIAD
(``a = b + s * c``: 12 B per element as STREAM counts it) on arrays far larger than the caches,
with 1 and with every thread, and the elements per second of each AdamW implementation a CPU
offload steps with (torch's for-loop, foreach and fused paths, DeepSpeed's CPU Adam). Writes
``validation/cpu_adam_bandwidth.json``.

The ratio ``Adam bytes/s / TRIAD bytes/s`` says which bound a CPU Adam step meets here: near 1,
the DRAM; well below, the cores. Not a timed test: run it on a quiet machine.

Usage: ``PYTHONPATH=src python scripts/measure_cpu_adam_bandwidth.py [--elements 50000000]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent.parent / "validation" / "cpu_adam_bandwidth.json"
ADAM_BYTES = 28
TRIAD_BYTES = 12


def _best(run, repeat: int) -> float:
    """Median seconds of ``repeat`` calls after one warm-up call."""
    run()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def triad_gb_per_s(n: int, repeat: int) -> float:
    b, c = torch.rand(n), torch.rand(n)
    a = torch.empty(n)
    return TRIAD_BYTES * n / _best(lambda: torch.add(b, c, alpha=3.0, out=a), repeat) / 1e9


def adam_gb_per_s(n: int, repeat: int, impl: str = "fused") -> float:
    """Bytes/s of one AdamW step over ``n`` fp32 elements, counted as ``ADAM_BYTES`` each:
    torch's ``for-loop`` (its CPU default), ``foreach`` or ``fused`` path, or ``deepspeed``'s
    ``DeepSpeedCPUAdam`` (ZeRO-Offload's CPU optimizer; built on first use, needs a C++
    compiler)."""
    p = torch.nn.Parameter(torch.rand(n))
    p.grad = torch.rand(n)
    if impl == "deepspeed":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        opt: torch.optim.Optimizer = DeepSpeedCPUAdam([p], lr=1e-4)
    else:
        kw = {"for-loop": {"foreach": False}, "foreach": {"foreach": True},
              "fused": {"fused": True}}[impl]
        opt = torch.optim.AdamW([p], lr=1e-4, **kw)
    return ADAM_BYTES * n / _best(opt.step, repeat) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=50_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--impls", nargs="+", default=["for-loop", "foreach", "fused", "deepspeed"],
                    help="AdamW implementations to time beside the fused one")
    args = ap.parse_args()
    rows = []
    for threads in sorted({1, torch.get_num_threads()}):
        torch.set_num_threads(threads)
        triad = triad_gb_per_s(args.elements, args.repeat)
        adam = adam_gb_per_s(args.elements, args.repeat)
        per_impl = {impl: round(adam_gb_per_s(args.elements, args.repeat, impl) * 1e9
                                / ADAM_BYTES / 1e6) for impl in args.impls}
        rows.append({"threads": threads, "triad_gb_per_s": round(triad, 2),
                     "adam_gb_per_s": round(adam, 2), "adam_over_triad": round(adam / triad, 3),
                     "adam_elements_per_s_per_thread": round(adam * 1e9 / ADAM_BYTES / threads),
                     "million_elements_per_s_by_impl": per_impl})
        print(f"  million elements/s, all {threads} thread(s): {per_impl}")
        print(f"{threads} thread(s): TRIAD {triad:.1f} GB/s, fused AdamW {adam:.1f} GB/s "
              f"({adam / triad:.2f} of TRIAD, {adam * 1e9 / ADAM_BYTES / threads / 1e6:.0f} M "
              "elements/s per thread)")
    out = {"what": "torch fused CPU AdamW (fp32, 28 B per element) against a TRIAD (12 B per "
                   "element) on this machine, and each AdamW implementation's elements/s",
           "command": "PYTHONPATH=src python scripts/measure_cpu_adam_bandwidth.py",
           "torch": torch.__version__, "cpus": os.cpu_count(), "elements": args.elements,
           "rows": rows}
    OUT.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
