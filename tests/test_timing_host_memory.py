"""Host memory placement in the step time (issue #19): sockets, DRAM channels and the
inter-socket link bound the offload transfers and the CPU optimizer (``timing/host_memory.py``)."""

from __future__ import annotations

import json

import pytest

from memplan.api import Machine, estimate_from_names, load_job
from memplan.errors import ConfigError
from memplan.facts.constants import constant
from memplan.hardware.node_hardware import NodeHardware, dram_gb_per_s
from memplan.hardware import nodes as nodes_module
from memplan.hardware.nodes import get_node, parse_nodes
from memplan.host import HostSetup
from memplan.timing.cpu_adam import cpu_adam_impl, cpu_adam_rate
from memplan.timing.host_memory import HostMemory, host_memory, remote_share


def test_dram_rate_is_channels_times_transfers_times_eight_bytes():
    """AMD publishes 204.8 GB/s per socket for the EPYC 7742 (8 channels of DDR4-3200) and
    Intel 307.2 GB/s for 8 channels of DDR5-4800: the formula gives both."""
    assert dram_gb_per_s(8, 3200) == pytest.approx(204.8)
    assert dram_gb_per_s(8, 4800) == pytest.approx(307.2)


@pytest.mark.parametrize(("sockets", "bound", "share"),
                         [(1, False, 0.0), (2, True, 0.0), (2, False, 0.5), (4, False, 0.75)])
def test_remote_share(sockets, bound, share):
    assert remote_share(sockets, bound) == share


def test_transfer_takes_the_slowest_of_link_dram_and_socket_link():
    """8 ranks on 2 sockets move 10 GB each: 4 per socket, so a socket's DRAM serves 40 GB
    and each direction of the link carries half of it when unbound."""
    host = HostMemory(sockets=2, dram=100e9, link=50e9, remote=0.5)
    assert host.transfer(10e9, 20e9, 8) == pytest.approx((0.5, "pcie"))
    assert host.transfer(10e9, 200e9, 8) == pytest.approx((0.4, "dram"))
    narrow = HostMemory(sockets=2, dram=100e9, link=10e9, remote=0.5)
    assert narrow.transfer(10e9, 200e9, 8) == pytest.approx((2.0, "socket link"))
    bound = HostMemory(sockets=2, dram=100e9, link=10e9, remote=0.0)
    assert bound.transfer(10e9, 200e9, 8) == pytest.approx((0.4, "dram"))
    unknown = HostMemory(sockets=2, dram=None, link=None, remote=0.5)
    assert unknown.transfer(10e9, 200e9, 8) == pytest.approx((0.05, "pcie"))


def test_one_rank_uses_its_home_socket_or_both():
    """One GPU of a two-socket node: bound, its socket's DRAM serves all 10 GB; unbound, each
    socket serves half, and half crosses the link."""
    bound = HostMemory(sockets=2, dram=10e9, link=4e9, remote=0.0)
    assert bound.transfer(10e9, 200e9, 1) == pytest.approx((1.0, "dram"))
    free = HostMemory(sockets=2, dram=10e9, link=4e9, remote=0.5)
    assert free.transfer(10e9, 200e9, 1) == pytest.approx((1.25, "socket link"))
    assert HostMemory(sockets=2, dram=10e9, link=None, remote=0.5).transfer(
        10e9, 200e9, 1) == pytest.approx((0.5, "dram"))


def test_cpu_optimizer_is_bounded_by_its_sockets_dram():
    host = HostMemory(sockets=2, dram=100e9, link=None, remote=0.5)
    per_el = constant("optimizer_bytes_per_param_gpu")
    t, limit = host.optimizer(1e9, 0.1, 8)
    assert (t, limit) == pytest.approx((4 * 1e9 * per_el / 100e9, "dram"))
    assert host.optimizer(1e9, 10.0, 8) == (10.0, "cores")


def test_node_preset_gives_the_host_memory():
    hw = _hw("DGX-H100")
    host = host_memory(hw, bound=False)
    assert hw.cpu_sockets == 2 and host.sockets == 2 and host.remote == 0.5
    node = get_node("DGX-H100")
    assert hw.dram_gb_per_s == pytest.approx(
        node.memory_channels * node.memory_mt_per_s * 8 / 1000)
    assert host.dram == pytest.approx(hw.dram_gb_per_s * 1e9 / 2 * constant("dram_efficiency"))
    assert host.link == pytest.approx(
        node.socket_link_gb_per_s * 1e9 * constant("socket_link_efficiency"))
    assert host_memory(hw, bound=True).remote == 0.0
    lone = NodeHardware(name="custom", gpus=1)
    assert host_memory(lone, bound=False) == HostMemory(sockets=1, dram=None, link=None,
                                                        remote=0.0)


def _hw(node: str) -> NodeHardware:
    from memplan.hardware.node_hardware import node_hardware
    n = get_node(node)
    return node_hardware(n.device, n.gpus, n)


def _time(node: str, **host):
    recipe, setup = load_job(None, {"gpus": 8, "zero": 2, "offload": "optimizer"}, host)
    return estimate_from_names("meta-llama/Llama-3.1-8B", recipe, Machine(node=node), setup).time


def test_dgx_h100_offload_waits_for_the_sockets_dram():
    """ZeRO-Offload of an 8B model on one DGX H100: the CPU Adam step of 4 ranks per socket
    needs 4 x 1.0e9 x 32 B of DRAM traffic at 186 GB/s, more than its 14 cores per rank take;
    the 128 GB/s UPI figure never binds before the DRAM, so binding changes nothing here."""
    t = _time("DGX-H100")
    res = {r.name: r for r in t.resources}
    assert "set by the socket's DRAM" in res["cpu"].detail
    assert _time("DGX-H100", numa_bound=True).step_seconds == t.step_seconds


def test_unbound_ranks_wait_for_a_narrow_socket_link(monkeypatch):
    """The DGX H100 with a 20 GB/s socket link: unbound ranks send half their offload traffic
    across it, bound ranks none."""
    row = {"name": "narrow-link", "gpu": "H100-80GB", "gpus": 8, "cpu_cores": 112,
           "cpu_sockets": 2, "memory_channels": 16, "memory_mt_per_s": 4400,
           "socket_link_gb_per_s": 20, "pcie_gen": 5, "nvlink_gb_per_s": 900, "source": "test"}
    monkeypatch.setitem(nodes_module._USER_NODES, "narrow-link",
                        parse_nodes([row], "test")["narrow-link"])
    free, bound = _time("narrow-link"), _time("narrow-link", numa_bound=True)
    pcie = {r.name: r for r in free.resources}["pcie"]
    assert "inter-socket link (20 GB/s" in pcie.detail and "numa_bound" in pcie.detail
    assert free.step_seconds > bound.step_seconds
    assert "inter-socket" not in {r.name: r for r in bound.resources}["pcie"].detail


def test_a_node_without_channel_figures_says_so():
    t = _time("p4de.24xlarge")
    assert any("host DRAM bandwidth unknown" in n and "memory_mt_per_s" in n for n in t.notes)


def test_bad_values_are_reported():
    with pytest.raises(ConfigError, match="numa_bound"):
        HostSetup(numa_bound="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="memory_channels"):
        parse_nodes([{"name": "n", "gpu": "H100-80GB", "gpus": 8, "source": "s",
                      "memory_channels": 0}], "test")


def test_cli_flag_binds_the_ranks(tmp_path, monkeypatch):
    """``--numa-bound`` is the ``[host] numa_bound`` key as a flag: on a node whose socket link
    is narrow the unbound step is longer."""
    from typer.testing import CliRunner

    from memplan.cli import app

    # --hardware registers its node for the process: keep it out of later tests
    monkeypatch.setattr(nodes_module, "_USER_NODES", dict(nodes_module._USER_NODES))

    hw = tmp_path / "hw.toml"
    hw.write_text('[[node]]\nname = "one-link"\ngpu = "H100-80GB"\ngpus = 8\ncpu_cores = 112\n'
                  'cpu_sockets = 2\nmemory_channels = 16\nmemory_mt_per_s = 4400\n'
                  'socket_link_gb_per_s = 20\npcie_gen = 5\nnvlink_gb_per_s = 900\n'
                  'source = "test"\n')
    steps = []
    for flag in ("--no-numa-bound", "--numa-bound"):
        res = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-3.1-8B", "--hardware",
                                       str(hw), "--node", "one-link", "--gpus", "8", "--zero",
                                       "2", "--offload", "optimizer", flag, "--format", "json"])
        assert res.exit_code == 0, res.output
        steps.append(json.loads(res.output)["time"]["step_seconds"])
    assert steps[0] > steps[1]


def _cpu(engine: str, node: str = "p4de.24xlarge", **keys):
    recipe, setup = load_job(None, {"gpus": 8, "zero": 3, "offload": "params+optimizer",
                                    "engine": engine, **keys}, {})
    t = estimate_from_names("meta-llama/Llama-3.1-8B", recipe, Machine(node=node), setup).time
    return {r.name: r for r in t.resources}["cpu"]


@pytest.mark.parametrize(("engine", "keys", "impl"), [
    ("deepspeed", {}, "deepspeed"), ("fsdp2", {}, "for-loop"), ("fsdp1", {}, "for-loop"),
    ("megatron", {"zero": 1, "offload": "optimizer"}, "fused"),
    ("torchtitan", {}, "fused"), ("fsdp2", {"optimizer_impl": "fused"}, "fused"),
    ("torchtitan", {"optimizer_impl": "foreach"}, "foreach")])
def test_each_engine_steps_its_own_cpu_adam(engine, keys, impl):
    recipe, _ = load_job(None, {"gpus": 8, "zero": 3, "offload": "params+optimizer",
                                "engine": engine, **keys}, {})
    assert cpu_adam_impl(recipe) == impl
    assert cpu_adam_rate(impl) == constant("cpu_adam_elements_per_s_per_core") * (
        5 if impl in ("deepspeed", "fused") else 1)


def test_vectorised_cpu_adam_steps_five_times_faster_where_the_cores_bind():
    """p4de: 48 cores, DRAM unknown, so the cores set the CPU step. DeepSpeed's CPU Adam and
    torchtitan's fused AdamW take 1/5 of the for-loop's time (rates.toml
    cpu_adam_vectorised_speedup: DeepSpeed's '5X--7X', pytorch#123074's 5.1x)."""
    loop, ds, tt = _cpu("fsdp2"), _cpu("deepspeed"), _cpu("torchtitan")
    assert cpu_adam_rate("deepspeed") == 5 * cpu_adam_rate("for-loop") == cpu_adam_rate("fused")
    assert ds.seconds == pytest.approx(loop.seconds / 5, rel=1e-9)
    assert tt.seconds == pytest.approx(ds.seconds, rel=1e-9)
    assert "740 M elements/s per core: DeepSpeed's CPU Adam" in ds.detail
    assert "148 M elements/s per core: torch's for-loop AdamW" in loop.detail


def test_on_a_dgx_h100_the_dram_binds_either_implementation():
    """DGX H100: the sockets' DRAM (186 GB/s for 4 ranks) binds before 14 cores do, at the
    for-loop's rate already, so DeepSpeed's CPU Adam is no faster there."""
    loop, ds = _cpu("fsdp2", "DGX-H100"), _cpu("deepspeed", "DGX-H100")
    assert "set by the socket's DRAM" in ds.detail and "set by the socket's DRAM" in loop.detail
    assert ds.seconds == pytest.approx(loop.seconds, rel=1e-9)


def _notes(engine: str, node: str, **keys):
    recipe, setup = load_job(None, {"gpus": 8, "zero": 3, "offload": "params+optimizer",
                                    "engine": engine, **keys}, {})
    return estimate_from_names("meta-llama/Llama-3.1-8B", recipe, Machine(node=node),
                               setup).time.notes


def test_a_for_loop_cpu_step_that_waits_for_the_cores_points_to_fused():
    """The hint appears where it would help: torch's for-loop on the cores' limit, not where
    the step is already vectorised or the socket's DRAM binds."""
    hint = "--optimizer-impl fused"
    assert any(hint in n and "5x" in n for n in _notes("fsdp2", "p4de.24xlarge"))
    assert not any(hint in n for n in _notes("fsdp2", "p4de.24xlarge", optimizer_impl="fused"))
    assert not any(hint in n for n in _notes("deepspeed", "p4de.24xlarge"))
    assert not any(hint in n for n in _notes("fsdp2", "DGX-H100"))
