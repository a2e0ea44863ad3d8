"""NCCL buffer lines and allocator fragmentation (issue #3, item 4): which counter each lands
in, how they scale with the process groups, and what expandable segments change."""

from __future__ import annotations

from memplan import Recipe, estimate, load_model
from memplan.breakdown import Pool
from memplan.estimate.overhead import (CUDA_CONTEXT_BYTES, EXPANDABLE_PAGE_BYTES, FRAGMENTATION_FRACTION,
                                       NCCL_P2P_BUFFER_BYTES, NCCL_RING_BYTES)
from memplan.hardware import cpu_device, get_device

MODEL = load_model("meta-llama/Llama-3.2-1B")
H100 = get_device("H100-80GB")


def _nccl(rank) -> dict[str, int]:
    return {i.name: i.bytes for i in rank.outside if i.name.startswith("NCCL")}


def test_one_gpu_has_no_nccl_and_counters_are_ordered():
    r = estimate(MODEL, Recipe.of(), H100, search_micro_batch=False).worst
    assert _nccl(r) == {}
    assert r.peak_allocated_bytes < r.peak_reserved_bytes < r.device_total_bytes


def test_one_ring_per_process_group_outside_the_allocator():
    r = estimate(MODEL, Recipe.of(gpus=16, tp=2), H100, search_micro_batch=False).worst
    assert _nccl(r) == {"NCCL buffers (data parallel, 8 ranks)": NCCL_RING_BYTES[3],
                        "NCCL buffers (tensor parallel, 2 ranks)": NCCL_RING_BYTES[2]}
    # nvidia-smi sees NCCL, max_memory_reserved does not
    nccl = sum(_nccl(r).values())
    assert r.device_total_bytes - r.peak_reserved_bytes == CUDA_CONTEXT_BYTES + nccl
    assert all(i.pool is Pool.DEVICE for i in r.outside if i.name.startswith("NCCL"))


def test_pipeline_ends_have_one_peer_middle_stages_two():
    b = estimate(MODEL, Recipe.of(gpus=4, pp=4), H100, search_micro_batch=False)
    peers = [sum(_nccl(r).values()) // (32 * NCCL_P2P_BUFFER_BYTES) for r in b.ranks]
    assert peers == [1, 2, 2, 1]


def test_expert_all_to_all_reaches_every_other_rank():
    moe = load_model("Qwen/Qwen3-30B-A3B")
    r = estimate(moe, Recipe.of(gpus=8, ep=8, zero=1), H100, search_micro_batch=False).ranks[0]
    assert _nccl(r)["NCCL buffers (expert all-to-all, 8 ranks)"] == 7 * 32 * NCCL_P2P_BUFFER_BYTES


def test_fragmentation_scales_with_the_peak_and_expandable_segments_remove_it():
    plain = estimate(MODEL, Recipe.of(micro_batch=2), H100, search_micro_batch=False).worst
    slack = plain.peak_reserved_bytes - plain.peak_allocated_bytes
    assert slack == int(plain.peak_allocated_bytes * FRAGMENTATION_FRACTION)
    exp = estimate(MODEL, Recipe.of(micro_batch=2, expandable_segments=True), H100,
                   search_micro_batch=False).worst
    assert exp.peak_allocated_bytes == plain.peak_allocated_bytes
    assert exp.peak_reserved_bytes - exp.peak_allocated_bytes == EXPANDABLE_PAGE_BYTES


def test_cpu_runs_have_no_gpu_overheads():
    r = estimate(MODEL, Recipe.of(device="cpu", gpus=1), cpu_device(24 << 30),
                 search_micro_batch=False).worst
    assert r.peak_reserved_bytes == r.peak_allocated_bytes == r.device_total_bytes
