"""memplan.measure.session, `memplan measure -- CMD` and the timeline PNG (CPU paths, for real)."""

from __future__ import annotations

import ast
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import memplan.measure as mm  # noqa: E402
from memplan.breakdown import Breakdown, Step  # noqa: E402

SCRIPT = textwrap.dedent("""
    import torch, transformers
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   use_cache=False, max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (2, 32))
    batch = {"input_ids": ids, "labels": ids.clone()}  # as the tracer holds it
    for _ in range(3):
        loss = model(**batch).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    del loss
""")
TINY64 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
          "tie_word_embeddings": False}


def _tiny():
    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY64.items()
                                      if k not in ("model_type", "architectures")},
                                   use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 256, (2, 32))
    return model, {"input_ids": ids, "labels": ids.clone()}, torch.optim.AdamW(
        model.parameters(), lr=1e-3)


def _loop(model, batch, opt, steps=3):
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        del loss


@pytest.mark.parametrize("give_objects", [True, False], ids=["model+optimizer", "global hooks"])
def test_session_around_a_loop_equals_measure_step(tmp_path, give_objects):
    ref = mm.measure_step(*_tiny(), steps=3)
    model, batch, opt = _tiny()
    kw = {"model": model, "optimizer": opt} if give_objects else {}
    with mm.session(out=tmp_path, **kw) as s:
        _loop(model, batch, opt)
    assert len(s.steps) == 3
    for r, m in zip(ref, s.steps, strict=True):
        assert m.peak_bytes == r.peak_bytes
        assert m.phase_peaks == r.phase_peaks
        assert m.peak_phase == r.peak_phase
        # The batch is created before the session in both; a 4-byte scalar may land in
        # another category (first seen as an input inside the step).
        for c in r.at_peak:
            assert abs(m.at_peak[c] - r.at_peak[c]) <= 8, c
    b = s.breakdown
    assert b.source == "measure"
    assert b.worst.first_step_peak_allocated_bytes == ref[0].peak_bytes
    assert b.worst.steady_peak_allocated_bytes == ref[-1].peak_bytes
    saved = json.loads((tmp_path / "memplan-measure.json").read_text())
    assert Breakdown.from_dict(saved).worst.peak_allocated_bytes == ref[-1].peak_bytes
    assert saved["counters"]["peak_rss_bytes"] > 0
    assert saved["timeline"]["samples"] and saved["timeline"]["tensors"]


def _png_size_and_text(path: Path) -> tuple[tuple[int, int], dict[str, str]]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    size = struct.unpack(">II", data[16:24])
    texts, pos = {}, 8
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"tEXt":
            k, v = body.split(b"\0", 1)
            texts[k.decode()] = v.decode("latin-1")
        elif kind == b"zTXt":
            k, rest = body.split(b"\0", 1)
            texts[k.decode()] = zlib.decompress(rest[1:]).decode("latin-1")
        pos += 12 + n
    return size, texts


def test_timeline_png_has_the_right_size_and_the_peak_annotated(tmp_path):
    pytest.importorskip("matplotlib")
    from memplan.report.plot import SIZE_PX, timeline_figure

    model, batch, opt = _tiny()
    with mm.session(model=model, optimizer=opt, out=tmp_path) as s:
        _loop(model, batch, opt, steps=2)
    png = tmp_path / "memplan-measure.png"
    size, texts = _png_size_and_text(png)
    assert size == SIZE_PX
    peak = s.breakdown.worst
    assert texts["Description"] == f"peak {peak.peak_allocated_bytes} bytes at " \
                                   f"{peak.peak_moment.label}"
    fig = timeline_figure(s.report.to_dict())
    notes = [t.get_text() for t in fig.axes[0].texts]
    assert any(t.startswith("peak ") and peak.peak_moment.label in t for t in notes)


def _memplan(*args, **kw):
    return subprocess.run([sys.executable, "-m", "memplan", *args], capture_output=True,
                          text=True, **kw)


def test_cli_measure_runs_a_script_and_compares_with_a_trace(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY64))
    recipe = ["--device", "cpu", "--precision", "32-true", "--micro-batch", "2", "--seq-len", "32"]
    tr = _memplan("trace", str(cfg), *recipe, "--format", "json", check=True)
    (tmp_path / "trace.json").write_text(tr.stdout)
    out = tmp_path / "report"
    r = _memplan("measure", "--out", str(out), "--against", str(tmp_path / "trace.json"),
                 "--format", "json", "--", sys.executable, str(script))
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert (out / "memplan-measure.json").exists() and (out / "memplan-measure.png").exists()
    report = json.loads((out / "memplan-measure.json").read_text())
    traced = json.loads(tr.stdout)["gpu"]["peak_allocated_bytes"]
    # Same code on both sides (the script builds what the tracer builds): same peak.
    assert report["gpu"]["peak_allocated_bytes"] == traced
    rows = {row["what"]: row for row in res["comparison"]}
    assert rows["peak allocated"]["error_pct_of_peak"] == 0
    assert set(rows) >= {"params", "optimizer", "activations", "peak allocated"}
    table = _memplan("measure", "--out", str(out), "--against", str(tmp_path / "trace.json"),
                     "--", sys.executable, str(script))
    assert "measured vs trace" in table.stdout and "peak allocated" in table.stdout


def test_cli_measure_errors(tmp_path):
    r = _memplan("measure", "--out", str(tmp_path))
    assert r.returncode == 2 and "no command to measure" in r.stderr
    r = _memplan("measure", "--out", str(tmp_path), "--", "true")
    assert r.returncode == 1 and "wrote no report" in r.stderr and "Traceback" not in r.stderr


def test_each_rank_writes_a_report_and_rank0_the_aggregate(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    from memplan.measure.cli_run import child_env

    procs = []
    for rank in (1, 0):
        env = {**child_env(tmp_path, 0.01, True), "RANK": str(rank), "WORLD_SIZE": "2"}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env))
    assert all(p.wait(timeout=120) == 0 for p in procs)
    for rank in (0, 1):
        assert (tmp_path / f"memplan-measure.rank{rank}.json").exists()
    agg = json.loads((tmp_path / "memplan-measure.json").read_text())
    assert [r["role"] for r in agg["gpu"]["per_rank"]] == ["rank 0", "rank 1"]
    assert agg["ranks_missing"] == []
    assert agg["gpu"]["peak_allocated_bytes"] == max(
        r["peak_allocated_bytes"] for r in agg["gpu"]["per_rank"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
def test_session_reads_the_cuda_allocator(tmp_path):
    model, batch, opt = _tiny()
    model.cuda()
    batch = {k: v.cuda() for k, v in batch.items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with mm.session(model=model, optimizer=opt, out=tmp_path) as s:
        _loop(model, batch, opt)
    c = s.counters.to_dict()
    assert c["max_memory_allocated"] >= s.breakdown.worst.peak_allocated_bytes
    assert c["max_memory_reserved"] >= c["max_memory_allocated"]
    assert s.breakdown.worst.steady_peak_allocated_bytes > 0
    assert Step.STEADY in {m.step for m in s.breakdown.worst.moments}
    assert os.path.exists(tmp_path / "memplan-measure.json")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux procfs")
def test_own_rss_reads_procfs_like_psutil_and_follows_a_fork():
    """The sampler's cheap RSS (one pread on a kept descriptor) is psutil's number, grows with
    touched memory, and is this process's own after a fork (a DataLoader worker)."""
    psutil = pytest.importorskip("psutil")
    from memplan.measure.sampler import rss_bytes

    before = rss_bytes()
    block = bytearray(64 * 2**20)
    block[::4096] = b"\1" * len(block[::4096])  # touch every page
    grown = rss_bytes()
    assert abs(grown - psutil.Process().memory_info().rss) < 4 * 2**20
    assert grown - before >= 60 * 2**20
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child touches 64 MiB more: its own RSS, not the parent's
        more = bytearray(64 * 2**20)
        more[::4096] = b"\1" * len(more[::4096])
        os.write(w, str((rss_bytes(), psutil.Process().memory_info().rss)).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child, child_psutil = ast.literal_eval(os.read(r, 100).decode())
    assert abs(child - child_psutil) < 4 * 2**20
