"""The expert-parallel all-to-all (``timing/comms.alltoall_s``): inside a node the ring
formula over NVLink; across nodes each GPU's remote share leaves through its own NIC, because
every destination gets distinct data (DeepEP README @edbb1bc: 47-62 GB/s per GPU with one
~50 GB/s NIC each, internode EP 16-64)."""

from __future__ import annotations

import pytest

from memplan import Recipe, estimate, load_model
from memplan.hardware import get_device
from memplan.hardware.nodes import get_node
from memplan.host import HostSetup, node_hardware
from memplan.system import with_host_and_time
from memplan.timing.comms import Link, alltoall_s, gather_s, ring_latency_s

NV, NIC = Link("nvlink", 378.0), Link("network", 42.5)
B = 256e6


def test_inside_a_node_is_the_ring_formula():
    # the ring's bandwidth term; all-to-all latency is not timed
    assert alltoall_s(B, 8, 8, NV, NIC) == pytest.approx(gather_s(B, 8, NV)
                                                         - ring_latency_s(8, NV, 1))
    assert alltoall_s(B, 1, 1, NV, NIC) == 0.0


def test_across_nodes_the_remote_share_runs_at_one_nic():
    # 32 ranks, 8 per node: 24/32 of the data leaves the node, each GPU through its own NIC
    assert alltoall_s(B, 32, 8, NV, NIC) == pytest.approx(24 / 32 * B / 42.5e9)
    # one rank per node: everything but its own 1/n goes over the network
    assert alltoall_s(B, 4, 1, NV, NIC) == pytest.approx(3 / 4 * B / 42.5e9)
    # NICs as fast as NVLink: the larger (local) share sets the time
    fast = Link("network", 378.0)
    assert alltoall_s(B, 16, 12, NV, fast) == pytest.approx(11 / 16 * B / 378e9)


def test_unknown_network_is_unknown_only_when_crossed():
    assert alltoall_s(B, 16, 8, NV, Link("network", None)) is None
    assert alltoall_s(B, 8, 8, NV, Link("network", None)) is not None


def _network_seconds(ep: int) -> float:
    m, d = load_model("Qwen/Qwen3-30B-A3B"), get_device("H100-80GB")
    r = Recipe.of(gpus=16, gpus_per_node=8, ep=ep, zero=1, engine="megatron", seq_len=4096,
                  micro_batch=1, grad_accum=4, precision="bf16-mixed", attention="flash")
    hw = node_hardware(d, 8, get_node("DGX-H100"))
    t = with_host_and_time(estimate(m, r, d), m, r, d, hw, HostSetup()).time
    return {x.name: x.seconds for x in t.resources}.get("network", 0.0)


def test_qwen3_30b_ep16_over_two_dgx_h100_pays_the_nic():
    """EP 16 over 2 DGX-H100 (one 400 Gb/s NIC per GPU at 85 %): per MoE layer, micro-batch
    and pass (dispatch + combine, forward and backward: 4) half of the rank's 4096 x top-8
    routed bf16 rows cross the network; the step's network time is at least that."""
    per_pass = 4096 * 8 * 2048 * 2 * 8 / 16 / (50e9 * 0.85)
    floor = per_pass * 4 * 48 * 4
    assert _network_seconds(16) >= floor
    assert _network_seconds(16) < 1.2 * floor   # the DP gradient traffic is overlapped
