"""Step time with and without `memplan.measure.session` (issue #18, item 6).

Three runs of the same CPU training loop: no session; a session with counters only
(``track_tensors=False``: RSS / allocator sampling thread, step hooks, the stream); a session
with live-tensor tracking (the storage tracker on every ATen op). Each round runs the three
(rotated order) and takes each one's median step, in wall time and in process CPU time; the
overhead of a round is its session's median against its own baseline. Prints one JSON line
per model: the median over rounds of each step time, and of each overhead with its min, max
and interquartile range.

    PYTHONPATH=src python scripts/bench_measure_overhead.py [--steps 20] [--rounds 5]
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
           n: int) -> list[tuple[float, float]]:
    """(wall, process CPU) seconds of each of ``n`` steps; process CPU counts every thread of
    this process (torch's and the sampler's) and not the time spent waiting for a core, so
    other processes on a shared machine disturb it far less than the wall time."""
    times = []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times


MODES = ("baseline", "counters", "tensors")


def _round(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int,
           order: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) step of each mode, run in ``order``."""
    out = {}
    for mode in order:
        with tempfile.TemporaryDirectory() as d:
            if mode == "baseline":
                times = _steps(model, opt, x, steps)
            else:
                with mm.session(model=model, optimizer=opt, out=d, plot=False,
                                track_tensors=mode == "tensors"):
                    times = _steps(model, opt, x, steps)
        times = times[1:]  # step 0 of a session opens its stream
        out[mode] = (statistics.median(t[0] for t in times),
                     statistics.median(t[1] for t in times))
    return out


def bench(name: str, steps: int, rounds: int) -> dict[str, object]:
    make, batch, width = CASES[name]
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width)
    _steps(model, opt, x, 3)  # warm-up: optimizer states, allocator
    out: dict[str, object] = {"model": name, "steps": steps, "rounds": rounds,
                              "threads": torch.get_num_threads()}
    # The modes run in a rotated order each round, and each session is compared with the
    # baseline of its own round: drift of a shared machine's load cancels in the ratio.
    per_round = [_round(model, opt, x, steps, MODES[i % 3:] + MODES[:i % 3])
                 for i in range(rounds)]
    for k, clock in enumerate(("wall", "cpu")):
        for mode in MODES:
            out[f"{mode}_{clock}_ms"] = round(
                statistics.median(r[mode][k] for r in per_round) * 1e3, 3)
        for mode in ("counters", "tensors"):
            pct = sorted((r[mode][k] / r["baseline"][k] - 1) * 100 for r in per_round)
            out[f"{mode}_{clock}_overhead_pct"] = {
                "median": round(statistics.median(pct), 1), "min": round(pct[0], 1),
                "max": round(pct[-1], 1),
                "iqr": ([round(q, 1) for q in
                         statistics.quantiles(pct, n=4, method="inclusive")[::2]]
                        if len(pct) > 1 else None)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: a straggler thread on a shared machine "
                         "does not decide the step time)")
    ap.add_argument("--case", choices=list(CASES), action="append",
                    help="run only this case (repeatable)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.case or CASES:
        print(json.dumps(bench(name, args.steps, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
