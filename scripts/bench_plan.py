"""Candidates per second of ``memplan plan``'s search (issue #13): not a timed test, a
benchmark to run on a quiet machine. Each search runs ``--repeat`` times in a fresh process
state (a new evaluator, so no memo is carried over); the best and the median are printed,
in wall time and in CPU time: this process's (``time.process_time``) plus that of the worker
processes it reaped (``RUSAGE_CHILDREN``), so with ``--jobs 2`` too the CPU column is the whole
search's. On a shared machine the wall time also counts other processes.

    PYTHONPATH=src python scripts/bench_plan.py [--repeat 3] [--only NAME] [--jobs 2]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from memplan.host import HostSetup
from memplan.model import load_model
from memplan.plan import Cluster, plan
from memplan.recipe import Recipe

SEARCHES = {
    "8B-1x8": ("meta-llama/Llama-3.1-8B", 1, 4096),
    "70B-2x8": ("meta-llama/Llama-3.1-70B", 2, 8192),
    "70B-16x8": ("meta-llama/Llama-3.1-70B", 16, 8192),
    "MoE-Mixtral-8x7B-1x8": ("mistralai/Mixtral-8x7B-v0.1", 1, 4096),
    "MoE-Mixtral-8x7B-2x8": ("mistralai/Mixtral-8x7B-v0.1", 2, 4096),
}
"""name -> (model, DGX-H100 nodes, sequence length); full fine-tuning, bf16-mixed, the
default global batch (one sequence per GPU), sharded checkpoint loading."""


def run(name: str, jobs: int) -> tuple[int, float, int, float]:
    model, nodes, seq = SEARCHES[name]
    spec = load_model(model)
    cluster = Cluster(gpu="H100-80GB", gpus=8 * nodes, gpus_per_node=8, node="DGX-H100")
    t0, c0 = time.perf_counter(), time.process_time() + _children_cpu()
    res = plan(spec, Recipe.of(seq_len=seq), cluster, fixed=frozenset({"seq_len"}),
               setup=HostSetup(load="sharded"), workers=jobs)
    return (res.candidates_evaluated, time.perf_counter() - t0, len(res.ranked),
            time.process_time() + _children_cpu() - c0)


def _children_cpu() -> float:
    """User + system CPU seconds of the child processes reaped so far (plan's workers)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=sorted(SEARCHES), action="append")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (plan --jobs)")
    args = ap.parse_args()
    print(f"{'search':24} {'candidates':>10} {'fit':>6} {'best s':>8} {'median s':>8} "
          f"{'best cand/s':>11} {'median cand/s':>13} {'best CPU s':>10} {'cand/CPU s':>10}")
    for name in args.only or SEARCHES:
        runs = [run(name, args.jobs) for _ in range(args.repeat)]
        n, fit = runs[0][0], runs[0][2]
        secs = [s for _, s, _, _ in runs]
        cpu = min(c for _, _, _, c in runs)
        best, med = min(secs), statistics.median(secs)
        print(f"{name:24} {n:>10} {fit:>6} {best:>8.1f} {med:>8.1f} {n / best:>11.0f} "
              f"{n / med:>13.0f} {cpu:>10.1f} {n / cpu:>10.0f}", flush=True)


if __name__ == "__main__":
    main()
