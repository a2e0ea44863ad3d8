"""``memplan calibrate`` end to end on CPU (small sizes), and ``estimate --calibration``."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from memplan.cli import app
from memplan.errors import ConfigError
from memplan.timing.calibration import Calibration, load_calibration

pytest.importorskip("torch")


def test_calibrate_on_cpu_writes_a_file_estimate_reads(tmp_path):
    out = tmp_path / "cal.toml"
    res = CliRunner().invoke(app, ["calibrate", "Qwen/Qwen2.5-0.5B", "--gpu", "H100-80GB",
                                   "--out", str(out), "--device", "cpu", "--dtype", "fp32",
                                   "--tokens", "32", "--seq-len", "32", "--copy-mib", "4",
                                   "--repeats", "1"])
    assert res.exit_code == 0, res.output
    cal = load_calibration(out)
    assert cal.torch_device == "cpu" and cal.gemm_tflops > 0 and cal.hbm_gb_per_s > 0
    assert cal.attention_fwd_tflops > 0 and cal.h2d_gb_per_s == 0   # no CUDA: not measured
    args = ["estimate", "Qwen/Qwen2.5-0.5B", "--gpu", "H100-80GB", "--format", "json"]
    plain = CliRunner().invoke(app, args)
    calibrated = CliRunner().invoke(app, [*args, "--calibration", str(out)])
    assert calibrated.exit_code == 0, calibrated.output
    import json

    t0 = json.loads(plain.output)["time"]
    t1 = json.loads(calibrated.output)["time"]
    # a CPU is ~1e4x slower than an H100: the calibrated step is much longer, MFU tiny
    assert t1["step_seconds"] > 100 * t0["step_seconds"]
    assert any("calibrated on cpu" in n for n in t1["notes"])


def test_calibration_for_another_gpu_is_refused(tmp_path):
    out = tmp_path / "cal.toml"
    out.write_text(Calibration(gpu="A100-80GB", torch_device="x", model="m",
                               gemm_tflops=250.0).to_toml())
    res = CliRunner().invoke(app, ["estimate", "Qwen/Qwen2.5-0.5B", "--gpu", "H100-80GB",
                                   "--calibration", str(out)])
    assert res.exit_code == 2 and "measured for A100-80GB" in res.output


def test_bad_calibration_files():
    with pytest.raises(ConfigError, match="must be a rate >= 0"):
        Calibration(gpu="H100-80GB", torch_device="x", model="m", gemm_tflops=1.0,
                    hbm_gb_per_s=-1.0)
    with pytest.raises(ConfigError, match="gemm_tflops must be > 0"):
        Calibration(gpu="H100-80GB", torch_device="x", model="m", gemm_tflops=0.0)
    with pytest.raises(ConfigError, match="cannot read it"):
        load_calibration("/nonexistent/cal.toml")


def test_calibrated_h100_rates_move_the_prediction(tmp_path):
    """Rates at the sourced defaults reproduce the uncalibrated step within 2 % (the
    uncalibrated GEMMs carry each shape's tile and wave quantisation, ``timing/gemm.py``; a
    calibrated rate was measured on the real shapes and is applied as it is); a slower GEMM
    rate slows it (the file really is read)."""
    from memplan import Recipe, get_device
    from memplan.api import Machine, estimate_from_names
    from memplan.timing.gemm import measured_matmul_efficiency

    default = measured_matmul_efficiency(get_device("H100-80GB"))  # Hopper's sustained 0.735
    recipe = Recipe.of(gpus=8, zero=3)
    machine = Machine(gpu="H100-80GB", node="DGX-H100")
    base = estimate_from_names("meta-llama/Llama-3.1-8B", recipe, machine).time
    same = tmp_path / "same.toml"
    same.write_text(Calibration(gpu="H100-80GB", torch_device="H100", model="m",
                                gemm_tflops=989.4 * default).to_toml())
    slow = tmp_path / "slow.toml"
    slow.write_text(Calibration(gpu="H100-80GB", torch_device="H100", model="m",
                                gemm_tflops=989.4 * 0.5).to_toml())
    t_same = estimate_from_names("meta-llama/Llama-3.1-8B", recipe, machine,
                                 calibration=load_calibration(same)).time
    t_slow = estimate_from_names("meta-llama/Llama-3.1-8B", recipe, machine,
                                 calibration=load_calibration(slow)).time
    assert t_same.step_seconds == pytest.approx(base.step_seconds, rel=0.02)
    assert t_same.step_seconds != base.step_seconds
    # GEMMs are about half of this step: 0.735 / 0.5 = 1.47x on them is well over 1.2x on it
    assert t_slow.step_seconds > 1.2 * t_same.step_seconds
