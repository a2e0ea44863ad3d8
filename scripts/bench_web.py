"""Benchmark of `memplan serve` for the README (issue #16).

1. Live update of a catalog 70B recipe: N distinct recipes (no cache hit), one after the other,
   as htmx posts them; server time from the Server-Timing header, client time around the call.
   Then the follow-up request the page makes for the largest micro-batch (its search).
2. Load check: 200 requests from 8 concurrent clients on loopback (six recipes of a 1B model).

Run: PYTHONPATH=src python scripts/bench_web.py [N]
"""

from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from memplan.web.thread import serving

MODEL_70B = "meta-llama/Llama-3.1-70B"
RECIPE_70B = {"gpus": "64", "zero": "3", "checkpointing": "full", "seq_len": "4096",
              "node": "DGX-H100"}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def server_ms(r: httpx.Response) -> float:
    return float(r.headers["server-timing"].split("dur=")[1])


def main(n: int = 40) -> None:
    with serving() as url, httpx.Client(base_url=url, timeout=60) as c:
        c.post("/result", data={"model": MODEL_70B, **RECIPE_70B})  # warm-up (imports, catalog)
        srv, cli, mmb, size = [], [], [], 0
        for k in range(1, n + 1):  # micro_batch 1..n: every request a new recipe (cache miss)
            t0 = time.perf_counter()
            r = c.post("/result", data={"model": MODEL_70B, **RECIPE_70B, "micro_batch": str(k)})
            cli.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text[:300]
            srv.append(server_ms(r))
            size = len(r.content)
            m = c.get("/max-micro-batch", params={"model": MODEL_70B, **RECIPE_70B,
                                                  "micro_batch": str(k)})
            assert m.status_code == 200 and "data-k" in m.text, m.text
            mmb.append(server_ms(m))
        hits = [server_ms(c.post("/result", data={"model": MODEL_70B, **RECIPE_70B,
                                                   "micro_batch": "1"})) for _ in range(20)]
        print(f"70B live update ({MODEL_70B}, {RECIPE_70B}, micro_batch 1..{n}, no cache hit): "
              f"server p50 {statistics.median(srv):.1f} ms, p90 {pct(srv, 0.9):.1f} ms, max "
              f"{max(srv):.1f} ms; client p50 {statistics.median(cli):.1f} ms; fragment "
              f"{size / 1024:.0f} KiB")
        print(f"70B max micro-batch, the follow-up request: server p50 "
              f"{statistics.median(mmb):.1f} ms, p90 {pct(mmb, 0.9):.1f} ms")
        print(f"70B live update, same recipe again (cache hit): server p50 "
              f"{statistics.median(hits):.1f} ms")

        def one(k: int) -> tuple[int, float]:  # noqa: E306
            with httpx.Client(base_url=url, timeout=60) as cc:
                r = cc.post("/result", data={"model": "meta-llama/Llama-3.2-1B",
                                             "micro_batch": str(1 + k % 6)})
            return r.status_code, server_ms(r)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            res = list(pool.map(one, range(200)))
        wall = time.perf_counter() - t0
        durs = [d for _, d in res]
        print(f"load: 200 requests from 8 clients, {sum(s == 200 for s, _ in res)} answered 200 "
              f"in {wall:.2f} s; server p50 {statistics.median(durs):.1f} ms, p99 "
              f"{pct(durs, 0.99):.1f} ms")


def cpu_time(n: int = 40) -> None:
    """CPU seconds of the process per live update (in-process TestClient): unlike wall-clock
    server time, this barely moves when other jobs share the cores."""
    from starlette.testclient import TestClient

    from memplan.web import create_app

    with TestClient(create_app()) as c:
        c.post("/result", data={"model": MODEL_70B, **RECIPE_70B})
        cpu = []
        for k in range(101, 101 + n):
            t0 = time.process_time()
            r = c.post("/result", data={"model": MODEL_70B, **RECIPE_70B, "micro_batch": str(k)})
            cpu.append((time.process_time() - t0) * 1000)
            assert r.status_code == 200
    print(f"70B live update, CPU time of the process (no cache hit): p50 "
          f"{statistics.median(cpu):.1f} ms, p90 {pct(cpu, 0.9):.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
    cpu_time()
