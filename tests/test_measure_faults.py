"""Fault injection (issue #18): a measured run that dies still leaves a report that parses, holds
every step closed before the last flush, and says how the run ended. Each case runs
`memplan measure -- python tests/faults/train.py` for real with a tiny model on the CPU."""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).with_name("faults") / "train.py"
SRC = Path(__file__).resolve().parents[1] / "src"


def _measure(tmp_path, fault, *, at_step=2, at_phase="forward", cmd=None, timeout=180):
    out = tmp_path / "out"
    env = {**os.environ, "FAULT": fault, "AT_STEP": str(at_step), "AT_PHASE": at_phase,
           "PYTHONPATH": str(SRC)}
    r = subprocess.run([sys.executable, "-m", "memplan", "measure", "--out", str(out),
                        "--format", "json", "--", *(cmd or [sys.executable, str(SCRIPT)])],
                       capture_output=True, text=True, env=env, timeout=timeout)
    # The user's program may print its own traceback; memplan never adds one.
    assert f"{os.sep}memplan{os.sep}" not in r.stderr, r.stderr
    report = json.loads((out / "memplan-measure.json").read_text())
    return r, report, out


def _steps_closed(report):
    """Steps whose moments are in the report: 'first' is step 0, 'steady' the last closed."""
    return {m["step"] for m in report["gpu"]["per_rank"][0]["timeline"]}


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.full)])
def test_sigkill_at_a_random_point_of_the_step(tmp_path, seed):
    rng = random.Random(seed)
    step, phase = rng.randint(1, 3), rng.choice(["forward", "backward", "optimizer"])
    r, report, _ = _measure(tmp_path, "sigkill", at_step=step, at_phase=phase)
    end = report["end"]
    assert r.returncode != 0
    assert (end["how"], end["signal"], end["exit_code"]) == ("killed", "SIGKILL", -9)
    assert end["last_step"] == step
    assert end["last_phase"] == {"optimizer": "optimizer-step"}.get(phase, phase)
    assert report["counters"]["steps"] == step  # every step closed before the kill
    assert _steps_closed(report) == ({"first", "steady"} if step > 1 else {"first"})
    assert "killed" in end["diagnosis"] and end["memory_limit_bytes"] > 0


def test_sigterm_is_recorded(tmp_path):
    r, report, _ = _measure(tmp_path, "sigterm", at_phase="backward")
    end = report["end"]
    assert (end["how"], end["signal"], end["exit_code"]) == ("signal", "SIGTERM", -15)
    assert end["last_step"] == 2 and end["last_phase"] == "backward"
    assert report["counters"]["steps"] == 2


def test_keyboard_interrupt(tmp_path):
    r, report, _ = _measure(tmp_path, "keyboard")
    end = report["end"]
    assert end["how"] == "signal" and end["signal"] == "SIGINT"
    assert end["exception"].startswith("KeyboardInterrupt")
    # The process exited through Python: the interrupted step is closed with what it had.
    assert report["counters"]["steps"] == 3


def test_exception_in_the_forward(tmp_path):
    r, report, _ = _measure(tmp_path, "exception")
    end = report["end"]
    assert r.returncode == 1 and end["how"] == "exception" and end["exit_code"] == 1
    assert end["exception"] == "RuntimeError: boom in the forward"
    assert end["last_step"] == 2 and end["last_phase"] == "forward"
    assert "raised RuntimeError" in end["diagnosis"]
    assert report["counters"]["steps"] == 3 and _steps_closed(report) == {"first", "steady"}


def test_simulated_cuda_oom_is_parsed(tmp_path):
    _, report, _ = _measure(tmp_path, "oom")
    oom = report["end"]["cuda_oom"]
    gib = 2**30
    assert oom["requested_bytes"] == 2 * gib
    assert oom["capacity_bytes"] == int(79.10 * gib) and oom["free_bytes"] == int(1.5 * gib)
    assert oom["allocated_bytes"] == 75 * gib
    assert oom["reserved_unallocated_bytes"] == int(1.2 * gib)
    assert report["end"]["diagnosis"].startswith("CUDA out of memory")


def test_child_with_dataloader_workers_dies(tmp_path):
    r, report, _ = _measure(tmp_path, "workers")
    end = report["end"]
    assert end["how"] == "killed" and end["signal"] == "SIGKILL"
    assert report["counters"]["steps"] == 2
    # The parent saw the whole tree (main process + 2 workers), more than the main alone.
    assert end["peak_rss_bytes"] >= report["counters"]["peak_rss_bytes"]


def test_full_disk_on_the_report_dir(tmp_path):
    r, report, out = _measure(tmp_path, "enospc")
    end = report["end"]
    assert r.returncode == 0  # the training itself was not disturbed
    assert end["how"] == "completed" and end["report_errors"]
    assert "write failed" in end["report_errors"][0]
    assert report["counters"]["steps"] >= 2 - 1  # what was flushed before the disk filled
    assert not list(out.glob(".*.tmp*"))  # no half-written temporary files left


def test_diagnosis_of_the_oom_killer():
    from memplan.measure.ending import diagnose

    near = diagnose(how="killed", sig="SIGKILL", exception=None, cuda_oom=None,
                    last_rss=95, peak_rss=97, limit=100, limit_source="cgroup memory.max",
                    where="in step 3, backward")
    far = diagnose(how="killed", sig="SIGKILL", exception=None, cuda_oom=None,
                   last_rss=20, peak_rss=20, limit=100, limit_source="MemTotal", where="x")
    assert near.startswith("likely killed by the OOM killer") and "cgroup memory.max" in near
    assert "not the host OOM killer" in far


def test_memory_limit_prefers_the_cgroup(tmp_path):
    from memplan.measure.ending import memory_limit

    (tmp_path / "memory.max").write_text("1073741824\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384 kB\n")
    assert memory_limit(tmp_path, meminfo) == (2**30, "cgroup memory.max")
    (tmp_path / "memory.max").write_text("max\n")
    assert memory_limit(tmp_path, meminfo) == (16384 * 1024, "MemTotal")


def test_torchrun_two_ranks_one_killed(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(SCRIPT.with_name("ddp.py"))]
    r, agg, out = _measure(tmp_path, "none", cmd=cmd)
    assert r.returncode != 0
    assert agg["world_size"] == 2 and agg["ranks_missing"] == []
    assert 1 in agg["ranks_failed"]
    assert agg["ends"]["rank1"]["how"] == "killed"
    assert agg["ends"]["rank1"]["last_step"] == 2
    assert agg["ends"]["rank1"]["last_phase"] == "forward"
    # The surviving rank's report is whole and says torchrun stopped it.
    rank0 = json.loads((out / "memplan-measure.rank0.json").read_text())
    assert rank0["counters"]["steps"] >= 2 and rank0["end"]["how"] != "completed"
    assert json.loads((out / "memplan-measure.rank1.json").read_text())["counters"]["steps"] == 2
    assert [x["role"] for x in agg["gpu"]["per_rank"]] == ["rank 0", "rank 1"]
