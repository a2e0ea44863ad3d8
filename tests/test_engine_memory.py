"""The engine part changes the model-state numbers (issue #11 item 1): FSDP keeps fp32 sharded
parameters and steps torch AdamW (foreach copy over the shard; torchtitan's fused AdamW has
none); DeepSpeed keeps 16-bit
parameters + an fp32 master and steps FusedAdam (no copy, an fp32 gradient partition)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memplan import Phase, Recipe, estimate


def _items(model, device, **kw) -> dict[str, int]:
    rank = estimate(model, Recipe.of(precision="bf16-mixed", gpus=8, zero=3, **kw),
                    device).ranks[0]
    seen = [m for p in (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER)
            for m in (rank.phase_moment(p),)]
    return {i.name: i.bytes for m in seen for i in m.items}


@pytest.mark.parametrize("engine", ["fsdp2", "fsdp1", "torchtitan"])
def test_fsdp_keeps_fp32_shards_and_the_foreach_copy(llama8b, h100, engine):
    fsdp = _items(llama8b, h100, engine=engine)
    ds = _items(llama8b, h100, engine="deepspeed")
    n = llama8b.num_params
    assert "fp32 master weights" in ds and "fp32 master weights" not in fsdp
    assert fsdp["trainable parameters (fp32)"] == pytest.approx(4 * n / 8, rel=0.01)
    assert ds["trainable parameters (bf16)"] == pytest.approx(2 * n / 8, rel=0.01)
    if engine == "torchtitan":  # its AdamW is built with fused=True unless told otherwise
        assert "foreach Adam sqrt(exp_avg_sq) copy" not in fsdp
        foreach = _items(llama8b, h100, engine=engine, optimizer_impl="foreach")
        assert foreach["foreach Adam sqrt(exp_avg_sq) copy"] == pytest.approx(4 * n / 8, rel=0.01)
    else:
        assert fsdp["foreach Adam sqrt(exp_avg_sq) copy"] == pytest.approx(4 * n / 8, rel=0.01)
    assert "foreach Adam sqrt(exp_avg_sq) copy" not in ds
    assert "fp32 gradient partition (optimizer step)" in ds
    assert "fp32 gradient partition (optimizer step)" not in fsdp


def test_auto_is_deepspeed_at_zero(llama8b, h100):
    assert _items(llama8b, h100) == _items(llama8b, h100, engine="deepspeed")


def test_deepspeed_bucket_knob_sizes_the_bucket(llama8b, h100):
    rank = estimate(llama8b, Recipe.of(precision="bf16-mixed", gpus=8, zero=2,
                                       engine="deepspeed", reduce_bucket_size=200_000_000),
                    h100).ranks[0]
    bucket = next(i for i in rank.phase_moment(Phase.BACKWARD).items
                  if i.name == "ZeRO reduce bucket")
    assert bucket.bytes == 200_000_000 * 2


@pytest.mark.parametrize("overlap", [False, True])
def test_deepspeed_reduce_bucket_is_allocated_whole(llama8b, h100, overlap):
    """setup_buckets allocates reduce_bucket_size elements even for a LoRA run's few million
    trainable elements, twice under overlap_comm (stage_1_and_2.py)."""
    rank = estimate(llama8b, Recipe.of(precision="bf16-mixed", gpus=8, zero=2, method="lora",
                                       engine="deepspeed", overlap_comm=overlap),
                    h100).ranks[0]
    bucket = next(i for i in rank.phase_moment(Phase.BACKWARD).items
                  if i.name == "ZeRO reduce bucket")
    assert bucket.bytes == (2 if overlap else 1) * 500_000_000 * 2


@pytest.mark.parametrize("zero", [1, 2])
def test_deepspeed_zero12_step_flattens_the_partition_before_the_cast(llama8b, h100, zero):
    """DeepSpeedZeroOptimizer.step makes the fp32 gradient as ``self.flatten(
    self.averaged_gradients[i]).to(fp32)`` (stage_1_and_2.py, v0.12.3 and 0.19.8): a 16-bit
    copy of the rank's gradient partition is alive beside the fp32 one, as ZeRO-3's sub_group."""
    rank = estimate(llama8b, Recipe.of(precision="bf16-mixed", gpus=8, zero=zero,
                                       engine="deepspeed"), h100).ranks[0]
    step = {i.name: i.bytes for i in rank.phase_moment(Phase.OPTIMIZER).items}
    n = llama8b.num_params
    copy = step["flattened bf16 gradients of the gradient partition (cast input)"]
    assert copy == pytest.approx(2 * n / 8, rel=0.01)
    assert step["fp32 gradient partition (optimizer step)"] == pytest.approx(2 * copy, rel=1e-6)
    backward = {i.name for i in rank.phase_moment(Phase.BACKWARD).items}
    assert not any("cast input" in name for name in backward)


def test_zero12_cast_copy_was_measured():
    """validation/zero12_cast_copy.json (scripts/measure_zero12_cast_copy.py, DeepSpeed 0.19.8 on
    CPU): each step's flatten makes a new bf16 storage of the whole partition, 2 B per element,
    the bytes the line above counts."""
    data = json.loads((Path(__file__).resolve().parents[1] / "validation"
                       / "zero12_cast_copy.json").read_text())
    assert {r["zero_stage"] for r in data["runs"]} == {1, 2}
    for run in data["runs"]:
        calls = run["flatten_calls_in_step"]
        assert len(calls) == run["steps"]
        assert all(c["new_storage"] and c["dtype"] == "bfloat16"
                   and c["bytes"] == 2 * run["partition_elements"] for c in calls)


def test_deepspeed_zero1_step_keeps_only_the_partitions_gradients(llama8b, h100):
    """ZeRO-1 holds every 16-bit gradient in the backward; its step frees those outside the
    rank's partition before the cast (stage_1_and_2.py ``free_grad_in_param_list(
    self.params_not_in_partition[i])``), so at the step it matches ZeRO-2, as the committed
    2- and 4-rank CPU runs measured (validation/dist_nproc{2,4}.json: the same optimizer-step
    peak for ZeRO-1 and ZeRO-2)."""
    def grads(zero, phase):
        rank = estimate(llama8b, Recipe.of(precision="bf16-mixed", gpus=8, zero=zero,
                                           engine="deepspeed", grad_accum=2), h100).ranks[0]
        return sum(i.bytes for i in rank.phase_moment(phase).items
                   if i.name.startswith("gradients"))
    n = llama8b.num_params
    assert grads(1, Phase.BACKWARD) == pytest.approx(2 * n, rel=0.01)
    assert grads(1, Phase.OPTIMIZER) == pytest.approx(2 * n / 8, rel=0.01)
    assert grads(1, Phase.OPTIMIZER) == grads(2, Phase.OPTIMIZER)
