"""Host RAM / NVMe arithmetic, FLOPs, validation and the CLI/JSON surface of issue #5."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from memplan import Breakdown, Recipe, estimate, get_device, load_model
from memplan.api import Machine, estimate_from_names, load_job
from memplan.cli import app
from memplan.errors import ConfigError, UnknownName
from memplan.host import HostSetup, parse_size
from memplan.host import categories as c
from memplan.facts.constants import constants
from memplan.units import GIB, MIB
from memplan.timing import token_flops


def test_every_constant_has_a_source_and_unit():
    assert len(constants()) >= 25
    for k in constants().values():
        assert k.source and k.unit, k.name


@pytest.mark.parametrize(("n", "rounded"), [
    (129 * MIB + 512 * 1024, 256 * MIB),   # pytorch/pytorch#150517: 129.5 MB pinned as 256 MB
    (8 * GIB + 1, 16 * GIB),               # pytorch/pytorch#95823: just over 8 GiB -> 16 GiB
    (4 * GIB, 4 * GIB), (0, 0)])
def test_pinned_power_of_two_rounding(n, rounded):
    assert c.pinned_bytes([n]) == rounded
    assert c.pinned_bytes([n], rounding=False) == n


def _plan(model: str, node: str | None = "DGX-H100", **kw):
    host_kw = kw.pop("host", {})
    recipe, setup = load_job(None, kw, host_kw)
    return estimate_from_names(model, recipe, Machine(node=node), setup)


def test_zero3_full_offload_matches_deepspeed_formula():
    """DeepSpeed estimate_zero3_model_states_mem_needs, offload param+optim with zero.Init:
    CPU per node = 18 B x P / nodes x 1.5 safety factor (facts §2.1); memplan reports the
    18 B/param without the factor, as its own line, + 2 B/param of the 16-bit flat gradient
    partition the formula leaves out (stage3.py grad_partitions_flat_buffer, on the host under
    offload_optimizer; measured by validate --nproc)."""
    b = _plan("meta-llama/Llama-3.1-8B", gpus=8, zero=3, offload="params+optimizer")
    P = b.model.params
    assert b.host.categories["offloaded states"] == pytest.approx(20 * P, rel=1e-6)
    # sub-groups of <= 1e9 elements rounded to powers of two: 4 fp32 kinds + 16-bit params and
    # gradients (next_pow2(4g) = 2 next_pow2(2g): the same as 5 fp32 kinds)
    per_rank = math.ceil(P / 8)                  # 1.004e9 elements: two sub-groups
    groups = [10**9, per_rank - 10**9]
    want = 8 * sum(4 * c.next_pow2(g * 4) + 2 * c.next_pow2(g * 2) for g in groups) - 20 * P
    assert b.host.categories["pinned rounding"] == pytest.approx(want, rel=1e-3)


def test_load_modes_order_and_peak_moment():
    full = _plan("meta-llama/Llama-3.1-70B", gpus=8, zero=3)
    meta = _plan("meta-llama/Llama-3.1-70B", gpus=8, zero=3, host={"load": "meta"})
    rank0 = _plan("meta-llama/Llama-3.1-70B", gpus=8, zero=3, host={"load": "rank0"})
    cat = "model loading ({})"
    assert full.host.categories[cat.format("full")] == 8 * rank0.host.categories[cat.format("rank0")]
    assert meta.host.categories[cat.format("meta")] < rank0.host.categories[cat.format("rank0")]
    assert full.host.peak_moment == "load" and full.host.fits is False   # 8 x 2 x 141 GB > 2 TiB
    assert meta.host.fits is True


def test_nvme_offload_counts_swap_files_and_buffers():
    b = _plan("meta-llama/Llama-3.1-70B", gpus=8, zero=3, offload="nvme")
    assert b.nvme.lines[0].name == "ZeRO-Infinity swap files"
    assert b.nvme.lines[0].bytes == pytest.approx(18 * b.model.params, rel=1e-6)
    assert "NVMe swap buffers (pinned)" in b.host.categories
    assert b.nvme.fits is True


def test_unknown_host_gives_no_verdict_and_custom_sizes_apply():
    b = _plan("meta-llama/Llama-3.1-8B", node=None, gpus=8)
    assert b.host.capacity_bytes is None and b.host.fits is None
    b = estimate_from_names("meta-llama/Llama-3.1-8B", Recipe.of(gpus=8),
                            Machine(gpu="H100-80GB", host_ram="512GiB", nvme="2TB", pcie=4))
    assert b.host.capacity_bytes == 512 * GIB and b.nvme.capacity_bytes == 2 * 10**12


def test_bad_host_input_is_reported_with_fixes():
    with pytest.raises(ConfigError, match="Did you mean 'rank0'"):
        HostSetup(load="rank-0")
    with pytest.raises(ConfigError, match="no unit|with a unit"):
        parse_size("2048", "--host-ram")
    with pytest.raises(ConfigError, match="has H100-80GB GPUs but the job uses A100-80GB"):
        estimate_from_names("meta-llama/Llama-3.1-8B", Recipe.of(),
                            Machine(gpu="A100-80GB", node="DGX-H100"))
    with pytest.raises(UnknownName, match="DGX-H100"):
        estimate_from_names("meta-llama/Llama-3.1-8B", Recipe.of(), Machine(node="DGX-H10"))
    with pytest.raises(ConfigError, match="needs dataset_bytes"):
        HostSetup(dataset="in-ram")


def test_model_flops_equal_torchtitan_formula():
    """torchtitan get_num_flop_per_token: 6 x (params - embedding) + 12 l h q t; memplan counts
    matmul weights only (norms are not FLOPs), a 1e-4 difference on Llama-3.1-8B. torchtitan
    counts the full s x s scores: memplan's ``model_noncausal``; ``model`` counts half of the
    causal attention (12 l h q t / 2)."""
    m = load_model("meta-llama/Llama-3.1-8B")
    seq = 8192
    f = token_flops(m, Recipe.of(seq_len=seq))
    emb = sum(t.numel for t in m.embedding)
    want = 6 * (m.num_params - emb) + 12 * 32 * 32 * 128 * seq
    assert f.model_noncausal == pytest.approx(want, rel=1e-4)
    assert f.model_noncausal - f.model == pytest.approx(6 * 32 * 32 * 128 * seq, rel=1e-9)


def test_moe_active_flops_and_recompute():
    """Qwen3-30B-A3B activates 3.3 B parameters per token (model card); full recompute adds one
    forward of the layers, selective one of the attention core (causal: half the scores)."""
    m = load_model("Qwen/Qwen3-30B-A3B")
    f = token_flops(m, Recipe.of(seq_len=4096))
    active = f.matmul_forward / 2 + sum(t.numel for t in m.embedding)
    assert active == pytest.approx(3.3e9, rel=0.05)
    full = token_flops(m, Recipe.of(seq_len=4096, checkpointing="full"))
    sel = token_flops(m, Recipe.of(seq_len=4096, checkpointing="selective"))
    head = 2 * m.hidden_size * m.vocab_size
    assert full.executed - f.executed == pytest.approx(
        f.matmul_forward - head + f.attention_forward / 2)
    assert sel.executed - f.executed == pytest.approx(f.attention_forward / 2)


def test_offload_moves_the_bottleneck_to_the_cpu():
    b = _plan("meta-llama/Llama-3.1-70B", gpus=8, zero=3, offload="params+optimizer",
              seq_len=4096, checkpointing="full", host={"load": "meta"})
    t = b.time
    assert t.bottleneck == "cpu" and 0.3 < t.gpu_idle_fraction < 0.9
    assert t.step_seconds == pytest.approx(sum(r.exposed_seconds for r in t.resources))
    no_offload = _plan("meta-llama/Llama-3.1-8B", gpus=8, zero=3, seq_len=4096).time
    assert no_offload.bottleneck == "compute" and no_offload.gpu_idle_fraction < 0.2


def test_json_round_trip_and_cli_keys():
    b = _plan("Qwen/Qwen2.5-0.5B", gpus=8, zero=2, offload="optimizer")
    d = b.to_dict()
    again = Breakdown.from_dict(json.loads(json.dumps(d)))
    assert again.to_dict() == d
    res = CliRunner().invoke(app, ["estimate", "Qwen/Qwen2.5-0.5B", "--node", "p4de.24xlarge",
                                   "--gpus", "8", "--zero", "2", "--load", "rank0",
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in ("per_node_peak_bytes", "categories", "peak_moment", "capacity_bytes", "fits"):
        assert key in out["host"]
    assert set(out["nvme"]) >= {"bytes", "capacity_bytes", "fits"}
    assert set(out["time"]) >= {"step_seconds", "tokens_per_second", "mfu", "bottleneck",
                                "gpu_idle_fraction"}
    assert out["gpu"]["name"] == "A100-80GB"           # the node's GPU


def test_cli_bad_load_exits_2_without_traceback():
    res = CliRunner().invoke(app, ["estimate", "Qwen/Qwen2.5-0.5B", "--load", "ful"])
    assert res.exit_code == 2
    assert "Did you mean 'full'" in res.output and "Traceback" not in res.output


def test_cpu_device_runs_have_no_host_plan():
    b = estimate(load_model("Qwen/Qwen2.5-0.5B"), Recipe.of(device="cpu"), get_device("H100-80GB"))
    assert b.host is None and "host" not in b.to_dict()
