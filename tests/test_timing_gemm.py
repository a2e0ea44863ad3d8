"""GEMM efficiency by architecture and shape (``timing/gemm.py``): NVIDIA's tile and wave
quantisation, normalised so the measured shape keeps its measured efficiency."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from memplan.hardware import get_device
from memplan.timing.gemm import (TILES, base_matmul_efficiency, gemm_efficiency,
                                 measured_matmul_efficiency, power_limited_share,
                                 quantization, reference_quantization)
from memplan.timing.kernels import attention_efficiency, gemm_seconds


def _one_tile(m, n, sms, tm, tn):
    tiles = math.ceil(m / tm) * math.ceil(n / tn)
    return m * n / (tiles * tm * tn) * tiles / (math.ceil(tiles / sms) * sms)


def test_guide_wave_example_on_a100():
    """The guide's §3.2 example: 256 x 128 tiles on 108 SMs. 1792 fits 7 x 14 = 98 tiles in one
    wave; 1793 needs 8 x 15 = 120 tiles, two waves, and pays for partial edge tiles. The model
    takes the best of the guide's tiles, so it is at least the 256 x 128 figure."""
    assert _one_tile(1792, 1792, 108, 256, 128) == pytest.approx(98 / 108)
    assert _one_tile(1793, 1793, 108, 256, 128) == pytest.approx(
        1793 * 1793 / (120 * 256 * 128) * 120 / 216)
    for m in (1792, 1793, 4096, 777):
        assert quantization(m, m, 108) == pytest.approx(
            max(_one_tile(m, m, 108, a, b) for a, b in TILES))
    assert quantization(1793, 1793, 108) >= _one_tile(1793, 1793, 108, 256, 128)


def test_reference_shape_keeps_the_measured_efficiency():
    """Ampere was measured on the 8192 cube: that shape gets the measured 0.827 back."""
    a100 = get_device("A100-80GB")
    base = base_matmul_efficiency(a100)
    assert gemm_efficiency(base, 8192, 8192, 108) == pytest.approx(0.827)
    assert base == pytest.approx(0.827 / quantization(8192, 8192, 108))


def test_hopper_sustained_figure_is_a_whole_wave_grid():
    """Hopper's figure (node MSMF, 727 of 989) comes from a whole-wave shape search: a shape
    that fills whole waves of 128 x 256 tiles on 132 SMs gets it exactly, the 8192 cube a
    little less (2,048 tiles in 16 waves of 132 slots)."""
    h100 = get_device("H100-80GB")
    assert reference_quantization(h100) == 1.0
    base = base_matmul_efficiency(h100)
    assert base == pytest.approx(727 / 989, abs=5e-4)
    assert gemm_efficiency(base, 128 * 12, 256 * 11, 132) == pytest.approx(base)
    assert gemm_efficiency(base, 8192, 8192, 132) == pytest.approx(
        base * quantization(8192, 8192, 132))
    assert gemm_efficiency(base, 8192, 8192, 132) < base


def test_never_above_peak():
    """An SM count at which the 8192 cube quantises badly (q_ref < 0.81) would put a well-
    quantised shape above the peak without the cap."""
    sms = 16385                     # 64 x 64 tiles: 16,384 of them, one wave, 16,384/16,385
    assert quantization(8192, 8192, sms) < 1.0
    assert gemm_efficiency(0.999999 / quantization(8192, 8192, sms), 64 * sms, 64, sms) == 1.0


def test_unknown_sm_count_leaves_the_base():
    assert gemm_efficiency(0.81, 1793, 100, None) == 0.81


def test_better_orientation_is_taken():
    """A 128-row output fits 128 x 256 tiles exactly; 256 x 128 would waste half of each."""
    assert quantization(128, 256 * 132, 132) == pytest.approx(1.0)


def test_small_gemm_loses_to_waves_and_the_time_shows_it():
    """A 256 x 256 output is 16 tiles of 64 x 64 at best: 16 of an H100's 132 SMs work, so the
    GEMM takes 132/16 x longer than a whole-wave grid at the same efficiency (the roofline
    alone cannot see this)."""
    kw = dict(peak_flops=989.4e12, matmul_efficiency=0.81, hbm_bytes_per_s=0.0,
              bytes_per_element=2.0)
    flat = gemm_seconds(256, 8192, 256, **kw)
    quantised = gemm_seconds(256, 8192, 256, sm_count=132, **kw)
    assert quantised == pytest.approx(flat * 132 / 16)


@pytest.mark.parametrize(("gpu", "expected"), [("A100-80GB", 0.827), ("H100-80GB", 0.735),
                                               ("H200-141GB", 0.735), ("B200-180GB", 0.806)])
def test_measured_efficiency_by_architecture(gpu, expected):
    """Ampere has its own measurement (A100, 258 of 312 TFLOP/s), Hopper its sustained one
    (727 of 989); others use the H100 8192-cube burst figure (797.51 of 989.4)."""
    assert measured_matmul_efficiency(get_device(gpu)) == pytest.approx(expected)
    assert power_limited_share(get_device("H100-80GB")) == 1.0  # 700 W: the line is above 727


def test_power_line_gives_back_the_pcie_measurement():
    """The 350 W, 114-SM H100 PCIe is the line's other point: 492.84 TFLOP/s at 8192^2
    (zzc0721/torch-performance-test-data#95), 0.65 of its 756 datasheet peak."""
    d = get_device("H100-PCIe-80GB")
    assert base_matmul_efficiency(d) * 756 == pytest.approx(492.84, rel=1e-3)


def test_power_limit_below_tdp_slows_hopper_gemms_and_attention():
    """torchtitan's Grand Teton H100s run at 500 W (3.79 W per SM): between the two measured
    boards, so between their per-SM rates; attention loses the same share; above the TDP
    nothing is gained (share capped at 1)."""
    sxm = get_device("H100-80GB")
    capped = replace(sxm, power_limit_w=500)
    rate = base_matmul_efficiency(capped) * 989.4 / 132
    assert 4.323 < rate < 6.042
    assert power_limited_share(capped) == pytest.approx(rate / (0.735 * 989.4 / 132))
    full = attention_efficiency(sxm, "flash", 0.81)[0]
    assert attention_efficiency(capped, "flash", 0.81)[0] == pytest.approx(
        full * power_limited_share(capped))
    assert power_limited_share(replace(sxm, power_limit_w=1000)) == 1.0
    assert power_limited_share(get_device("A100-80GB")) == 1.0   # no Ampere measurement


def test_catalog_sm_counts():
    assert get_device("A100-80GB").sm_count == 108
    assert get_device("H100-80GB").sm_count == 132
    assert get_device("H100-PCIe-80GB").sm_count == 114
    assert get_device("L4-24GB").sm_count is None
