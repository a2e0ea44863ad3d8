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

from memplan.measure.ending import CudaOom, RunEnd
from memplan.measure.oom import beside_estimate, estimate_label, summarize_snapshot

SRC = Path(__file__).resolve().parents[1] / "src"
MIB = 2**20


def _snapshot() -> dict:
    """A two-segment snapshot in torch's documented format (torch/cuda/memory.py _snapshot)."""
    frame = [{"filename": "/x/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
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
