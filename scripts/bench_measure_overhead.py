"""Step time with and without `memplan.measure.session` (issue #18, item 6).

Three runs of the same CPU training loop: no session; a session with counters only
(``track_tensors=False``: RSS / allocator sampling thread, step hooks, the stream); a session
with live-tensor tracking (the storage tracker on every ATen op). Prints one JSON line per
model with the median step time of each (best of ``--rounds`` interleaved rounds) and the overhead in
% of the baseline.

    PYTHONPATH=src python scripts/bench_measure_overhead.py [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

import memplan.measure as mm


def _mlp(width: int, depth: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                   torch.nn.Linear(4 * width, width)]
    return torch.nn.Sequential(*layers)


CASES = {
    # Large matmuls: per-op Python cost is small against the kernels (the GPU-like case).
    "mlp 1024x4 (batch 256)": (lambda: _mlp(1024, 4), 256, 1024),
    # Tiny ops: the per-op cost of tracking dominates (the worst case).
    "mlp 64x8 (batch 8)": (lambda: _mlp(64, 8), 8, 64),
}


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
           n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def bench(name: str, steps: int, rounds: int) -> dict[str, object]:
    make, batch, width = CASES[name]
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width)
    _steps(model, opt, x, 3)  # warm-up: optimizer states, allocator
    out: dict[str, object] = {"model": name, "steps": steps, "rounds": rounds,
                              "threads": torch.get_num_threads()}
    medians: dict[str, float] = {}
    # Modes interleaved over rounds, best median kept: a shared machine's noise only adds time.
    for _ in range(rounds):
        for mode in ("baseline", "counters", "tensors"):
            with tempfile.TemporaryDirectory() as d:
                if mode == "baseline":
                    times = _steps(model, opt, x, steps)
                else:
                    with mm.session(model=model, optimizer=opt, out=d, plot=False,
                                    track_tensors=mode == "tensors"):
                        times = _steps(model, opt, x, steps)
            m = statistics.median(times[1:])  # step 0 of a session opens its stream
            medians[mode] = min(medians.get(mode, m), m)
    for mode in medians:
        out[f"{mode}_ms"] = round(medians[mode] * 1e3, 3)
    for mode in ("counters", "tensors"):
        out[f"{mode}_overhead_pct"] = round((medians[mode] / medians["baseline"] - 1) * 100, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    for name in CASES:
        print(json.dumps(bench(name, args.steps, args.rounds)))


if __name__ == "__main__":
    main()
