"""bitsandbytes' paged optimizers keep their states in CUDA managed memory (bitsandbytes
``functional.py`` ``get_paged``: ``cget_managed_ptr``, ``cudaMallocManaged``): on the GPU while
resident but outside torch's caching allocator. torch's counters never see them (golden rows
GT004/GT009/GT013, torchtune's PagedAdamW runs, were +92-173% while memplan counted them as
allocated); nvidia-smi does."""

from __future__ import annotations

from memplan import Category, Pool, Recipe, estimate, load_model
from memplan.hardware import get_device

H100 = get_device("H100-80GB")
LLAMA = load_model("meta-llama/Llama-3.2-1B")


def _worst(optimizer: str):
    return estimate(LLAMA, Recipe.of(optimizer=optimizer, precision="bf16-true"), H100).worst


def test_paged_states_leave_torchs_counters_but_not_the_device():
    plain, paged = _worst("adamw"), _worst("paged-adamw")
    states = [i for i in paged.outside if i.category is Category.OPTIMIZER]
    assert len(states) == 1 and states[0].pool is Pool.DEVICE
    # same bytes (2 bf16 states per parameter), moved out of the allocated peak
    assert paged.peak_allocated_bytes <= plain.peak_allocated_bytes - states[0].bytes * 0.99
    assert paged.device_total_bytes >= paged.peak_reserved_bytes + states[0].bytes


def test_offloaded_paged_states_stay_on_the_host():
    r = Recipe.of(optimizer="paged-adamw", zero=2, gpus=2, offload="optimizer")
    b = estimate(LLAMA, r, H100).worst
    assert not [i for i in b.outside if i.category is Category.OPTIMIZER
                and i.pool is Pool.DEVICE]
