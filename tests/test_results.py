"""The typed identity of a result (ModelInfo, DeviceInfo, allocator counters) survives JSON."""

from __future__ import annotations

import json
from dataclasses import replace

from memplan import Breakdown, Recipe, estimate, get_device, load_model
from memplan.results import AllocatorCounters, DeviceInfo, ModelInfo


def test_measured_device_keeps_its_allocator_counters_through_json():
    b = estimate(load_model("openai-community/gpt2"), Recipe.of(), get_device("H100-80GB"),
                 search_micro_batch=False)
    alloc = AllocatorCounters(max_memory_allocated=123, max_memory_reserved=456,
                              active_bytes_peak=120)
    measured = replace(b, device=replace(b.device, allocator=alloc))
    again = Breakdown.from_dict(json.loads(json.dumps(measured.to_dict())))
    assert again.device == measured.device and again.device.allocator == alloc
    assert again.model == b.model and again.model.trainable_params == b.model.params


def test_partial_infos_leave_unknown_fields_out_of_the_json():
    m = ModelInfo(id="loop", params=10, trainable_params=5, layers=0, source="measured")
    d = DeviceInfo(name="cpu", capacity_bytes=1 << 30, source="host memory")
    assert set(m.to_dict()) == {"id", "params", "trainable_params", "layers", "source"}
    assert d.to_dict() == {"name": "cpu", "capacity_bytes": 1 << 30, "source": "host memory"}
    assert ModelInfo.from_dict(m.to_dict()) == m and DeviceInfo.from_dict(d.to_dict()) == d
