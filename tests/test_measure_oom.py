"""Issue #18 item 4, the CPU side: a CUDA out-of-memory is set beside the allocator's state
(torch's snapshot, summarized) and beside memplan's estimate of the same moment. The OOM is
simulated (torch.OutOfMemoryError raised with torch's own message); the observer that takes
the real snapshot runs only on CUDA (``measure/cuda_oom.py``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memplan.measure.assemble import ParentView, assemble
from memplan.measure.ending import CudaOom, RunEnd, diagnose, parse_cuda_oom
from memplan.measure.oom import beside_estimate, estimate_label, summarize_snapshot

SRC = Path(__file__).resolve().parents[1] / "src"
KIB, MIB, GIB = 2**10, 2**20, 2**30

# OutOfMemoryError messages, word for word as DeviceCachingAllocator::malloc in
# c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch) assembles them: torch >= 2.2 ("... has a
# total capacity of X of which X is free. <proc_info><allowed_info>Of the allocated memory X is
# allocated by PyTorch, <private_pool_msg>and X is reserved by PyTorch but unallocated. If
# reserved ..."; proc_info is NVML's "Including non-PyTorch memory, this process has X memory in
# use. " / "Process N has X memory in use. ", allowed_info "X allowed; ", private_pool_msg "with X
# allocated in private pools (e.g., CUDA Graphs), "); torch 2.1 (the same with "total capacty"
# and the max_split_size_mb advice); torch <= 2.0 ("(GPU 0; X total capacity; X already
# allocated; X free; <allowed_info>X reserved in total by PyTorch)"). Sizes are format_size's:
# "N bytes" up to 1 KiB, then two decimals of KiB / MiB / GiB.
ADVICE = (" If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
          "expandable_segments:True to avoid fragmentation.  See documentation for Memory "
          "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
MESSAGES = {
    "2.2+ nvml": (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 11.91 GiB "
        "of which 406.38 MiB is free. Including non-PyTorch memory, this process has 11.51 GiB "
        "memory in use. Of the allocated memory 11.18 GiB is allocated by PyTorch, and 219.44 MiB "
        "is reserved by PyTorch but unallocated." + ADVICE,
        dict(requested_bytes=2 * GIB, device_index=0, capacity_bytes=int(11.91 * GIB),
             free_bytes=int(406.38 * MIB), process_used_bytes=int(11.51 * GIB),
             allocated_bytes=int(11.18 * GIB), reserved_unallocated_bytes=int(219.44 * MIB),
             reserved_bytes=int(11.18 * GIB) + int(219.44 * MIB), allowed_bytes=None,
             private_pool_bytes=None)),
    "2.2+ fraction, graphs, other process": (
        "CUDA out of memory. Tried to allocate 512 bytes. GPU 3 has a total capacity of 79.10 GiB "
        "of which 0 bytes is free. Process 175080 has 1.46 GiB memory in use. Including "
        "non-PyTorch memory, this process has 77.26 GiB memory in use. 39.55 GiB allowed; Of the "
        "allocated memory 39.50 GiB is allocated by PyTorch, with 1.00 GiB allocated in private "
        "pools (e.g., CUDA Graphs), and 20.00 MiB is reserved by PyTorch but unallocated."
        + ADVICE,
        dict(requested_bytes=512, device_index=3, capacity_bytes=int(79.10 * GIB), free_bytes=0,
             process_used_bytes=int(77.26 * GIB), allowed_bytes=int(39.55 * GIB),
             allocated_bytes=int(39.50 * GIB), private_pool_bytes=GIB,
             reserved_unallocated_bytes=20 * MIB, reserved_bytes=int(39.50 * GIB) + 20 * MIB)),
    "2.1 capacty": (
        "CUDA out of memory. Tried to allocate 448.00 MiB. GPU 1 has a total capacty of 79.10 GiB "
        "of which 364.31 MiB is free. Process 175356 has 77.26 GiB memory in use. Of the "
        "allocated memory 72.12 GiB is allocated by PyTorch, and 3.78 GiB is reserved by PyTorch "
        "but unallocated. If reserved but unallocated memory is large try setting "
        "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
        "PYTORCH_CUDA_ALLOC_CONF",
        dict(requested_bytes=448 * MIB, device_index=1, capacity_bytes=int(79.10 * GIB),
             free_bytes=int(364.31 * MIB), process_used_bytes=None,
             allocated_bytes=int(72.12 * GIB), reserved_unallocated_bytes=int(3.78 * GIB),
             reserved_bytes=int(72.12 * GIB) + int(3.78 * GIB))),
    "<=2.0": (
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
        "14.56 GiB already allocated; 3.12 MiB free; 7.50 GiB allowed; 14.70 GiB reserved in "
        "total by PyTorch) If reserved memory is >> allocated memory try setting "
        "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
        "PYTORCH_CUDA_ALLOC_CONF",
        dict(requested_bytes=20 * MIB, device_index=0, capacity_bytes=int(15.78 * GIB),
             free_bytes=int(3.12 * MIB), allowed_bytes=int(7.5 * GIB),
             allocated_bytes=int(14.56 * GIB), reserved_bytes=int(14.70 * GIB),
             reserved_unallocated_bytes=int(14.70 * GIB) - int(14.56 * GIB))),
    "HIP (ROCm build)": (
        "HIP out of memory. Tried to allocate 704.00 GiB. GPU 0 has a total capacity of "
        "191.69 GiB of which 186.02 GiB is free. Of the allocated memory 4.89 GiB is allocated "
        "by PyTorch, and 2.25 MiB is reserved by PyTorch but unallocated." + ADVICE,
        dict(requested_bytes=704 * GIB, capacity_bytes=int(191.69 * GIB),
             free_bytes=int(186.02 * GIB), allocated_bytes=int(4.89 * GIB),
             reserved_unallocated_bytes=int(2.25 * MIB))),
}


@pytest.mark.parametrize("name", list(MESSAGES))
def test_oom_messages_of_every_torch_wording_are_parsed(name):
    message, want = MESSAGES[name]
    got = parse_cuda_oom(message)
    assert got.message == message  # one line
    assert {k: getattr(got, k) for k in want} == want


def test_an_oom_message_without_numbers_leaves_them_unknown():
    got = parse_cuda_oom("CUDA error: out of memory\nCUDA kernel errors might be reported ...")
    assert got.message == "CUDA error: out of memory"
    assert (got.requested_bytes, got.allocated_bytes, got.reserved_bytes) == (None, None, None)


def test_the_diagnosis_names_fragmentation_only_when_the_cache_held_the_request():
    def say(message, snapshot=None):
        oom = parse_cuda_oom(message)
        if snapshot is not None:
            oom = CudaOom(**{**oom.to_dict(), "snapshot": snapshot})
        return diagnose(how="exception", sig=None, exception="OutOfMemoryError", cuda_oom=oom,
                        last_rss=None, peak_rss=None, limit=None, limit_source="",
                        where="in step 2, backward")

    # 3.78 GiB cached, 448 MiB asked: the free pieces were all smaller than the request
    frag = say(MESSAGES["2.1 capacty"][0], {"largest_free_block_bytes": 300 * MIB})
    assert frag.startswith("CUDA out of memory: an allocation of 448.00 MiB with 72.12 GiB "
                           "allocated and 3.78 GiB reserved-unallocated of 79.10 GiB "
                           "(364.31 MiB free) failed in step 2, backward"), frag
    assert "its largest free block 300.00 MiB: fragmentation" in frag
    assert "expandable_segments:True" in frag
    # 219 MiB cached, 2 GiB asked: the device was full, not fragmented
    assert "fragmentation" not in say(MESSAGES["2.2+ nvml"][0])


def _snapshot() -> dict:
    """A two-segment snapshot in torch's documented format (torch/cuda/memory.py _snapshot)."""
    import memplan.runtime.tracker

    tracker = memplan.runtime.tracker.__file__
    frame = [{"filename": tracker, "line": 1, "name": "__torch_dispatch__"},
             {"filename": "/x/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
             {"filename": "/home/u/train.py", "line": 42, "name": "step"}]
    return {
        "segments": [
            {"total_size": 40 * MIB, "allocated_size": 30 * MIB, "active_size": 30 * MIB,
             "blocks": [{"size": 20 * MIB, "state": "active_allocated", "frames": frame},
                        {"size": 10 * MIB, "state": "active_allocated", "frames": []},
                        {"size": 10 * MIB, "state": "inactive", "frames": []}]},
            {"total_size": 20 * MIB, "allocated_size": 8 * MIB, "active_size": 8 * MIB,
             "blocks": [{"size": 8 * MIB, "state": "active_allocated"},
                        {"size": 12 * MIB, "state": "inactive"}]}],
        "device_traces": [[{"action": "alloc", "size": MIB},
                           {"action": "oom", "size": 16 * MIB, "device_free": 3 * MIB}]],
    }


def test_snapshot_summary_names_fragmentation_and_the_largest_blocks():
    s = summarize_snapshot(_snapshot())
    assert (s["segments"], s["reserved_bytes"], s["allocated_bytes"]) == (2, 60 * MIB, 38 * MIB)
    assert s["reserved_unallocated_bytes"] == 22 * MIB
    # a 16 MiB request failed with 22 MiB free in the pool: no free block was large enough
    assert s["largest_free_block_bytes"] == 12 * MIB
    assert [b["bytes"] for b in s["largest_live_blocks"]] == [20 * MIB, 10 * MIB, 8 * MIB]
    assert s["largest_live_blocks"][0]["allocated_by"] == "/home/u/train.py:42 step"
    assert s["oom_trace"] == {"requested_bytes": 16 * MIB, "device_free_bytes": 3 * MIB}


def test_snapshot_summary_keeps_the_failing_device_only():
    snap = _snapshot()
    for seg in snap["segments"]:
        seg["device"] = 0
    other = {"device": 1, "total_size": 80 * MIB, "allocated_size": 80 * MIB,
             "blocks": [{"size": 80 * MIB, "state": "active_allocated"}]}
    snap["segments"].append(other)
    snap["device_traces"].append([{"action": "oom", "size": 99, "device_free": 0}])
    snap["allocator_settings"] = {"expandable_segments": False}
    s0, s1 = summarize_snapshot(snap, device=0), summarize_snapshot(snap, device=1)
    assert (s0["reserved_bytes"], s0["free_blocks"]) == (60 * MIB, 2)
    assert s0["oom_trace"]["requested_bytes"] == 16 * MIB and s0["expandable_segments"] is False
    assert (s1["reserved_bytes"], s1["reserved_unallocated_bytes"]) == (80 * MIB, 0)
    assert s1["oom_trace"]["requested_bytes"] == 99
    assert summarize_snapshot(snap)["reserved_bytes"] == 140 * MIB


def test_the_oom_observer_records_the_snapshot_of_its_device(monkeypatch):
    """The callback torch's allocator calls, run on the CPU with ``_snapshot`` standing in for
    the allocator (the attachment itself needs CUDA: test_real_cuda_oom_under_measure)."""
    torch = pytest.importorskip("torch")
    from memplan.measure import cuda_oom

    snap = _snapshot()
    for seg in snap["segments"]:
        seg["device"] = 1
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda device=None: snap)
    got: list[dict] = []
    monkeypatch.setattr(cuda_oom, "_record", got.append)
    cuda_oom._observer(1, 16 * MIB, 80 * GIB, 3 * MIB)
    assert got[0]["kind"] == "oom_snapshot" and got[0]["device"] == 1
    assert (got[0]["requested_bytes"], got[0]["device_limit_bytes"]) == (16 * MIB, 80 * GIB)
    assert got[0]["summary"]["reserved_bytes"] == 60 * MIB
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda device=None: 1 / 0)
    cuda_oom._observer(1, MIB, 80 * GIB, 0)  # never raises into the allocator
    assert got[1]["summary"] == {"error": "ZeroDivisionError: division by zero"}


def test_an_oom_seen_only_by_the_observer_still_ends_the_report():
    """The rank died (SIGKILL) after torch's observer flushed the snapshot but before its
    exception reached the session: the ending is still a CUDA OOM, from the observer."""
    start = {"kind": "start", "rank": 0, "world_size": 1, "pid": 1, "cuda": True,
             "model": {"id": "m", "params": 0, "trainable_params": 0, "layers": 0,
                       "source": "measured"},
             "device": {"name": "H100", "capacity_bytes": 80 * GIB, "source": "test"}}
    sample = {"kind": "sample", "sample": {"t": 0.1, "rss_bytes": 1, "step": 2,
                                           "phase": "backward", "moment": None}}
    seen = {"kind": "oom_snapshot", "device": 0, "requested_bytes": 2 * GIB,
            "device_limit_bytes": 80 * GIB, "device_free_bytes": 100 * MIB,
            "summary": summarize_snapshot(_snapshot())}
    end = assemble([start, sample, seen], ParentView(exit_code=-9)).end
    assert end.how == "killed" and end.cuda_oom is not None
    assert end.cuda_oom.requested_bytes == 2 * GIB and end.cuda_oom.allocated_bytes == 38 * MIB
    assert end.cuda_oom.snapshot["largest_free_block_bytes"] == 12 * MIB
    assert end.diagnosis.startswith("CUDA out of memory: an allocation of 2.00 GiB")
    # a caught OOM (a batch-size search) in a run that then completed is no ending
    done = assemble([start, sample, seen, {"kind": "end", "counters": {
        "peak_rss_bytes": 1, "seconds": 1.0, "steps": 3}}], ParentView(exit_code=0)).end
    assert done.how == "completed" and done.cuda_oom is None


@pytest.mark.parametrize("measured, estimate", [
    ("forward: model.layers.3", "forward: layer 3"),
    ("backward: model.layers.0 (recompute)", "backward: layer 0"),
    ("forward: transformer.h.11", "forward: layer 11"),
    ("forward: (model)", "forward: loss"),
    ("backward: model.embed_tokens", "backward: embedding"),
    ("forward: lm_head", "forward: head"),
    ("forward", "forward"),
    ("forward: my_custom_block", None),
])
def test_measured_labels_map_to_estimate_labels(measured, estimate):
    assert estimate_label(measured) == estimate


def test_oom_beside_a_named_layer_of_the_estimate():
    from memplan import get_device, load_model
    from memplan.estimate import estimate
    from memplan.recipe import Recipe

    b = estimate(load_model("meta-llama/Llama-3.2-1B"), Recipe.of(micro_batch=2),
                 get_device("H100-80GB"), search_micro_batch=False)
    want = next(m for m in b.worst.moments
                if str(m.step) == "steady" and m.label == "backward: layer 7")
    oom = CudaOom(message="CUDA out of memory.", requested_bytes=2 * 2**30,
                  allocated_bytes=want.allocated_bytes)
    end = RunEnd(how="exception", cuda_oom=oom, last_step=3,
                 last_moment="backward: model.layers.7")
    got = beside_estimate(end, b)
    assert got is not None and got.estimated_bytes == want.allocated_bytes
    assert got.needed_bytes == want.allocated_bytes + 2 * 2**30 and got.error_pct < 0
    assert "backward: model.layers.7" in got.sentence() and "low there" in got.sentence()
    assert beside_estimate(RunEnd(how="completed"), b) is None


def test_measure_against_an_estimate_prints_the_oom_beside_it(tmp_path):
    pytest.importorskip("transformers")
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
           "vocab_size": 128, "max_position_embeddings": 64}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": str(SRC), "CONFIG": str(tmp_path / "config.json")}
    est = subprocess.run([sys.executable, "-m", "memplan", "estimate",
                          str(tmp_path / "config.json"), "--device", "cpu", "--precision",
                          "32-true", "--micro-batch", "2", "--seq-len", "32", "--format",
                          "json"], capture_output=True, text=True, env=env, timeout=300)
    assert est.returncode == 0, est.stderr
    (tmp_path / "est.json").write_text(est.stdout)
    script = Path(__file__).with_name("faults") / "oom_llama.py"
    r = subprocess.run([sys.executable, "-m", "memplan", "measure", "--out",
                        str(tmp_path / "out"), "--against", str(tmp_path / "est.json"), "--",
                        sys.executable, str(script)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "raised OutOfMemoryError" in r.stdout or "CUDA out of memory" in r.stdout, r.stdout
    assert "at the OOM (forward, steady step) memplan estimated" in r.stdout, r.stdout


def test_real_cuda_oom_under_measure(tmp_path):
    """The CUDA side: torch's observer takes the allocator snapshot of a real OOM and the report
    carries it beside the parsed message."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: the OOM observer and the allocator snapshot exist only "
                    "in a CUDA build of torch with a device")
    script = Path(__file__).with_name("faults") / "cuda_oom.py"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    r = subprocess.run([sys.executable, "-m", "memplan", "measure", "--out", str(tmp_path),
                        "--", sys.executable, str(script)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    end = json.loads((tmp_path / "memplan-measure.json").read_text())["end"]
    oom = end["cuda_oom"]
    total = torch.cuda.get_device_properties(0).total_memory
    assert oom["capacity_bytes"] == pytest.approx(total, rel=1e-3)
    assert oom["requested_bytes"] == pytest.approx(2 * total, rel=1e-3)  # rounded to 2 MiB
    snap = oom["snapshot"]
    assert snap is not None and "error" not in snap, snap
    assert snap["segments"] >= 1 and snap["reserved_bytes"] >= snap["allocated_bytes"] > 0
    assert oom["allocated_bytes"] == pytest.approx(snap["allocated_bytes"], abs=0.01 * 2**20)
    # tensor tracking turned the allocator's stacks on: the model's blocks name their lines
    assert any(b["allocated_by"] for b in snap["largest_live_blocks"]), snap
    assert end["last_step"] == 1 and end["last_phase"] == "forward"
