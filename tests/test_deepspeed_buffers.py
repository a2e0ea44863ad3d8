"""DeepSpeed buffers found live at the measured peaks of ``validate --nproc N`` (issue #11 item 5,
estimate/deepspeed_buffers.py): ZeRO-3's flat gradient partition, kept from init, and ZeRO-1/2
optimizer offload's 16-bit staging buffers; and the meta-device storages the distributed
harness no longer counts."""

from __future__ import annotations

import pytest

from memplan import Phase, Pool, Recipe, estimate
from memplan.estimate.deepspeed_buffers import (offload_bit16_param_buffer_bytes,
                                                offload_temp_grad_buffer_bytes,
                                                zero3_grad_partition_bytes)


def _items(model, device, phase=Phase.FORWARD, **kw):
    """The lines of ``phase``'s peak moment, and those off the GPU (host, NVMe)."""
    rank = estimate(model, Recipe.of(precision="bf16-mixed", gpus=8, **kw), device).ranks[0]
    return {i.name: i for i in rank.phase_moment(phase).items + rank.outside}


def test_zero3_gradient_partition_is_held_from_the_forward(llama8b, h100):
    items = _items(llama8b, h100, zero=3, engine="deepspeed")
    flat = items["ZeRO-3 gradient partition (bf16, flat)"]
    assert flat.bytes == zero3_grad_partition_bytes(-(-llama8b.num_params // 8), 2)
    assert flat.bytes == pytest.approx(2 * llama8b.num_params / 8, rel=1e-6)
    assert flat.pool == Pool.ALLOCATED
    # it replaces the gradients that grow in the backward: no second copy
    back = _items(llama8b, h100, Phase.BACKWARD, zero=3, engine="deepspeed")
    assert not any(n.startswith("gradients") for n in back)
    # FSDP2 has no such buffer
    assert "ZeRO-3 gradient partition (bf16, flat)" not in _items(llama8b, h100, zero=3,
                                                                   engine="fsdp2")


def test_zero3_gradient_partition_is_on_the_host_under_offload(llama8b, h100):
    items = _items(llama8b, h100, zero=3, engine="deepspeed", offload="optimizer")
    assert items["ZeRO-3 gradient partition (bf16, flat)"].pool == Pool.HOST


def test_zero2_offload_staging_buffers(llama8b, h100):
    items = _items(llama8b, h100, zero=2, engine="deepspeed", offload="optimizer")
    largest = max(t.numel for t in llama8b.tensors)  # the 128,256 x 4,096 embedding
    cpu, gpu = (items[f"offload gradient staging buffer ({w})"] for w in ("cpu", "gpu"))
    assert cpu.bytes == gpu.bytes == offload_temp_grad_buffer_bytes(largest, 2) == 2 * largest
    assert (cpu.pool, gpu.pool) == (Pool.HOST, Pool.ALLOCATED)
    bit16 = items["offload 16-bit parameter buffer (bf16)"]
    assert bit16.pool == Pool.HOST
    assert bit16.bytes == pytest.approx(2 * llama8b.num_params / 8, rel=1e-6)
    assert offload_bit16_param_buffer_bytes(10, 2) == 20
    # without offload none of them exists
    assert not any("offload" in n for n in _items(llama8b, h100, zero=2, engine="deepspeed"))


def test_the_harness_tracker_skips_meta_storages():
    torch = pytest.importorskip("torch")
    from memplan.runtime.tracker import StorageTracker

    for real_only, expect in ((True, 400), (False, 800)):
        tracker = StorageTracker(real_only=real_only)
        with tracker:
            a = torch.ones(100)
            m = torch.zeros_like(a, device="meta")  # what DeepSpeed keeps per parameter
            tracker.see(m)
            assert tracker.live_bytes == expect
        tracker.close()
