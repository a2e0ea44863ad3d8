"""Issue #12 item 3: new catalog GPUs and nodes, user hardware files (same validating loader as
the built-in tables) and one-field overrides from the command line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from memplan.cli import app
from memplan.custom_hardware import custom_gpu, load_hardware_file
from memplan.errors import ConfigError, UnknownDevice
from memplan.hardware import devices, get_device, parse_devices
from memplan.hardware.nodes import get_node
from memplan.units import GB

runner = CliRunner()


@pytest.fixture(autouse=True)
def _forget_user_hardware():
    """User rows live for the process (as in one CLI run); tests must not leak them."""
    import memplan.hardware as hw
    import memplan.hardware.nodes as nd

    yield
    hw._USER_DEVICES.clear()
    nd._USER_NODES.clear()

_GOOD = """
[[device]]
name = "LabGPU-96GB"
vendor = "nvidia"
arch = "hopper"
memory_gb = 96
hbm_gb_per_s = 3350
tflops_bf16 = 989
source = "our lab"

[[node]]
name = "lab-node"
gpu = "LabGPU-96GB"
gpus = 4
host_ram_gib = 512
source = "our lab"
"""


@pytest.mark.parametrize("name, memory_gb", [
    ("H100-96GB", 96), ("GH200", 96), ("GH200-144GB", 144), ("GB200", 186),
    ("MI325X", 256), ("A6000", 48), ("RTX 6000 Ada", 48), ("RTX PRO 6000", 96),
    ("H100-NVL", 94), ("L40S", 48), ("RTX 3090 Ti", 24), ("RTX 4080", 16), ("RTX 5090", 32),
])
def test_issue_12_gpus_are_in_the_catalog_with_a_source(name: str, memory_gb: int) -> None:
    dev = get_device(name)
    assert dev.memory_gb == memory_gb
    assert dev.source.strip()


def test_gh200_nodes_carry_the_grace_memory() -> None:
    node = get_node("gh200-node")
    assert node.device.name == "GH200-96GB" and node.host_ram_gib == 447
    assert get_node("gb200-tray").gpus == 4


def test_user_file_is_loaded_and_usable_by_name(tmp_path) -> None:
    path = tmp_path / "hw.toml"
    path.write_text(_GOOD)
    assert load_hardware_file(path) == (["LabGPU-96GB"], ["lab-node"])
    assert get_device("labgpu 96gb").capacity_bytes == 96 * GB
    assert get_node("lab-node").device.name == "LabGPU-96GB"


def test_user_rows_are_checked_like_builtin_rows_and_all_problems_reported(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[device]]\nname = "X"\nvendor = "nvidia"\nmemory_gb = -1\nhbm = 3\n'
                    'tflops_bf17 = 1\n')
    with pytest.raises(ConfigError) as err:
        load_hardware_file(path)
    text = str(err.value)
    assert "missing required key 'source'" in text
    assert "memory_gb=-1 must be > 0" in text
    assert "unknown key 'hbm'" in text and "Did you mean 'hbm_gb_per_s'" in text
    assert "tflops_bf17" in text
    assert len(err.value.problems) == 4
    assert "X" not in devices()


def test_power_limit_key_caps_a_user_gpu_and_is_type_checked(tmp_path) -> None:
    """A capped cluster is a catalog row with ``power_limit_w`` (torchtitan's 500 W H100s):
    it slows the GEMMs (``timing/gemm.py``); a string or a negative value is refused."""
    from memplan.timing.gemm import base_matmul_efficiency

    row = ('[[device]]\nname = "Capped-H100"\nvendor = "nvidia"\narch = "hopper"\n'
           'memory_gb = 96\ntflops_bf16 = 989.4\nsm_count = 132\ntdp_w = 700\n'
           'power_limit_w = {}\nsource = "our lab"\n')
    path = tmp_path / "cap.toml"
    path.write_text(row.format(500))
    load_hardware_file(path)
    capped = get_device("Capped-H100")
    assert capped.power_w == 500
    assert base_matmul_efficiency(capped) < base_matmul_efficiency(get_device("H100-80GB"))
    for bad in ('"500"', "-5"):
        path.write_text(row.format(bad).replace("Capped-H100", "Bad-H100"))
        with pytest.raises(ConfigError, match="power_limit_w"):
            load_hardware_file(path)


def test_node_naming_an_unknown_gpu_is_rejected(tmp_path) -> None:
    path = tmp_path / "n.toml"
    path.write_text('[[node]]\nname = "n"\ngpu = "H100-81GB"\ngpus = "8"\nsource = "s"\n')
    with pytest.raises(ConfigError, match=r"gpus='8' has the wrong type.*\n.*H100-81GB"):
        load_hardware_file(path)


def test_builtin_table_passes_its_own_loader_and_duplicates_fail() -> None:
    rows = [{"name": "A", "vendor": "v", "memory_gb": 1, "source": "s"}] * 2
    with pytest.raises(ConfigError, match="appears twice"):
        parse_devices(rows, "t.toml")
    assert len(devices()) >= 28


def test_gpu_memory_and_gpu_set_override_one_field() -> None:
    dev = custom_gpu("H100-80GB", gpu_memory="96GB", gpu_set=["hbm_gb_per_s=3900",
                                                               "tflops_bf16=900"])
    assert dev.capacity_bytes == 96 * GB  # the measured 80GB totals no longer win
    assert dev.hbm_gb_per_s == 3900 and dev.tflops["bf16"] == 900
    assert dev.tflops["fp8"] == get_device("H100-80GB").tflops["fp8"]
    assert get_device(dev.name) is dev
    with pytest.raises(ConfigError) as err:
        custom_gpu("H100-80GB", gpu_memory="96", gpu_set=["hbm=1", "pcie_gen=x", "nofield"])
    assert len(err.value.problems) == 4
    with pytest.raises(UnknownDevice):
        custom_gpu("H100-81GB", gpu_memory="96GB")


def test_cli_estimate_with_hardware_file_and_gpu_memory(tmp_path) -> None:
    path = tmp_path / "hw.toml"
    path.write_text(_GOOD)
    res = runner.invoke(app, ["estimate", "meta-llama/Llama-3.2-1B", "--hardware", str(path),
                              "--node", "lab-node", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert "LabGPU-96GB" in res.output
    res = runner.invoke(app, ["estimate", "meta-llama/Llama-3.2-1B", "--gpu", "A100-80GB",
                              "--gpu-memory", "40GB", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["gpu"]["capacity_bytes"] == 40 * GB
    res = runner.invoke(app, ["estimate", "meta-llama/Llama-3.2-1B", "--node", "DGX-A100-80GB",
                              "--gpu-memory", "70GB", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["gpu"]["name"] == "A100-80GB[memory=70GB]"
    res = runner.invoke(app, ["estimate", "meta-llama/Llama-3.2-1B", "--gpu-set", "hbm=1"])
    assert res.exit_code == 2 and "hbm_gb_per_s" in res.output
    assert "Traceback" not in res.output
