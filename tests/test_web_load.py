"""A small load check on loopback: 200 requests from 8 concurrent clients, every answer right,
bounded in count and time. p50/p99 of the server's own time (``Server-Timing``) are printed
with ``-s``; scripts/bench_web.py reports them for the README."""

import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from memplan.api import estimate_from_names, load_recipe  # noqa: E402
from memplan.web.thread import serving  # noqa: E402

pytestmark = pytest.mark.slow
REQUESTS, CLIENTS, WALL_LIMIT_S = 200, 8, 120
BATCHES = (1, 2, 3, 4, 6, 8)


def test_200_requests_from_8_clients():
    model = "meta-llama/Llama-3.2-1B"
    expected = {mb: estimate_from_names(model, load_recipe(None, {"micro_batch": mb}))
                .worst.peak_allocated_bytes for mb in BATCHES}
    with serving() as url:
        def one(k):
            mb = BATCHES[k % len(BATCHES)]
            with httpx.Client(base_url=url, timeout=30) as c:
                r = c.post("/result", data={"model": model, "micro_batch": str(mb)})
            got = re.search(r'data-k="peak_allocated" data-bytes="(\d+)"', r.text)
            dur = float(r.headers["server-timing"].split("dur=")[1])
            return r.status_code, mb, int(got.group(1)) if got else None, dur

        t0 = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(one, range(REQUESTS)))
        wall = time.perf_counter() - t0
    assert len(results) == REQUESTS
    assert all(s == 200 and b == expected[mb] for s, mb, b, _ in results)
    durs = sorted(d for *_, d in results)
    p50, p99 = statistics.median(durs), durs[int(0.99 * (len(durs) - 1))]
    print(f"\n{REQUESTS} requests, {CLIENTS} clients: wall {wall:.2f} s, server p50 "
          f"{p50:.1f} ms, p99 {p99:.1f} ms")
    assert wall < WALL_LIMIT_S
