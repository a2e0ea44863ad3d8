"""Activation-checkpointing policies as the engines define them (issue #11 item 3): the
simulator's selective-policy and stash mechanics, the estimator's ordering of the policies, the
recipe's rules, plan, export round trips and the recompute share of the step-time model.
The policies against real CPU runs: the checkpointing cases of ``validate/cases.toml``."""

import math

import pytest

from memplan.errors import ConfigError
from memplan.estimate import estimate
from memplan.estimate.activations.graph import Graph, Tensor, simulate
from memplan.export import ExportContext, export, read_engine_text
from memplan.hardware import get_device
from memplan.model import load_model
from memplan.plan.space import Space
from memplan.recipe import Recipe
from memplan.timing.recompute import recompute_matmul_share

L8 = "meta-llama/Llama-3.1-8B"
MiB = 1 << 20


def _chain(per_op: bool) -> tuple[Graph, list[Tensor]]:
    """x -> mm -> a -> mm -> b -> relu -> c, one checkpoint group; every tensor 1 MiB."""
    g = Graph(region="input")
    x = Tensor(MiB)
    g.op([], (x,))
    outs = []
    g.region = "layer"
    with g.checkpoint(True, per_op=per_op):
        a = Tensor(MiB)
        g.op([x], (a,), [x], save="mm")
        b = Tensor(MiB)
        g.op([a], (b,), [a], save="mm")
        c = Tensor(MiB)
        g.op([b], (c,), [b])
        outs += [a, b, c]
    g.region = "after"
    end = Tensor(4)
    g.op([c], (end,), [c])
    return g, outs


def _after(points) -> int:
    """Saved bytes at the forward's last op (after the group)."""
    return next(p.saved for p in points if p.phase == "forward" and p.region == "after")


def test_per_op_policy_keeps_the_first_mm_output_not_the_second():
    """torchtitan: 'Saves output of all compute ops, except every second mm'. Forward end holds
    the group input x, the first mm's output a (cached) and c (saved by the op after the
    group): 3 MiB; the plain checkpoint holds x and c: 2 MiB."""
    fwd_end = {}
    for per_op in (False, True):
        g, _ = _chain(per_op)
        pts = simulate(g)
        fwd_end[per_op] = _after(pts)
    assert fwd_end[False] == 2 * MiB
    assert fwd_end[True] == 3 * MiB


def test_stash_replaces_group_inputs():
    """DeepSpeed partition: the checkpoint keeps a 1/tp copy of its input, not the input."""
    g, _ = _chain(False)
    g.stash = 0.5
    assert _after(simulate(g)) == MiB + MiB // 2
    g, _ = _chain(False)
    g.stash = 0.0
    assert _after(simulate(g)) == MiB


def _act(**keys) -> tuple[int, object]:
    """(the largest forward moment's allocated bytes, breakdown) of Llama-3.1-8B on 8 GPUs."""
    r = Recipe.of(**{"seq_len": 4096, "zero": 3, "gpus": 8, **keys})
    b = estimate(load_model(L8), r, get_device("H100-80GB"), search_micro_batch=False)
    fwd = max(m.allocated_bytes for m in b.worst.moments if m.label.startswith("forward"))
    return fwd, b


def test_policies_order_as_their_saves():
    """Forward-end memory: none > every second layer > op > full; first N layers between."""
    none, _ = _act(checkpointing="none")
    op, _ = _act(checkpointing="op")
    full, _ = _act(checkpointing="full")
    every2, _ = _act(checkpointing="full", checkpoint_every=2)
    first8, _ = _act(checkpointing="full", checkpoint_layers=8)
    assert none > first8 > every2 > op > full
    # every second layer saves half of what "full" saves less: the midpoint, within 2%
    assert every2 == pytest.approx((none + full) / 2, rel=0.02)


def test_deepspeed_partition_and_cpu_checkpointing_move_layer_inputs():
    """32 layer inputs of 4096 x 4096 bf16 (1 GiB): half stays under partition over tp=2
    (Megatron's distribute_saved_activations), none under DeepSpeed's cpu_checkpointing, whose
    bytes are a host item of the same size."""
    mega = dict(checkpointing="full", tp=2, gpus=2, zero=1, engine="megatron")
    full, _ = _act(**mega)
    part, _ = _act(**mega, partition_activations=True)
    assert full - part == 32 * 4096 * 4096 * 2 // 2
    ds = dict(checkpointing="full", gpus=8, zero=3, engine="deepspeed", precision="bf16-true")
    full, _ = _act(**ds)
    cpu, b = _act(**ds, cpu_checkpointing=True)
    inputs = 32 * 4096 * 4096 * 2
    assert full - cpu == inputs
    host = [i for i in b.worst.outside if "cpu_checkpointing" in i.name]
    assert [i.bytes for i in host] == [inputs]


@pytest.mark.parametrize("keys, match", [
    (dict(checkpointing="op", checkpoint_every=2), "need checkpointing=full"),
    (dict(checkpointing="selective", cpu_checkpointing=True), "need checkpointing=full"),
    (dict(checkpointing="full", checkpoint_every=2, checkpoint_layers=4), "set one"),
    (dict(checkpointing="full", cpu_checkpointing=True, engine="torchtitan", gpus=2, zero=3),
     "has no such option"),
    (dict(checkpointing="full", partition_activations=True), "set engine=megatron"),
    (dict(checkpointing="full", partition_activations=True, engine="megatron", gpus=2, tp=2,
          sequence_parallel=True), "already split"),
])
def test_recipe_refuses_policy_keys_that_do_not_apply(keys, match):
    with pytest.raises(ConfigError, match=match):
        Recipe.of(**keys)


def test_plan_searches_every_policy_and_holds_a_given_one():
    space = Space(base=Recipe.of(), gpus=8, gpus_per_node=8)
    got = {(str(c.kind), c.checkpoint_every) for c in space.checkpointings()}
    assert got == {("none", 1), ("selective", 1), ("op", 1), ("full", 1), ("full", 2)}
    base = Recipe.of(checkpointing="full", checkpoint_layers=4)
    held = Space(base=base, gpus=8, gpus_per_node=8, fixed=frozenset({"checkpoint_layers"}))
    assert held.checkpointings() == [base.checkpointing]


@pytest.mark.parametrize("target, keys", [
    ("torchtitan", dict(zero=3, gpus=8, checkpointing="op")),
    ("torchtitan", dict(zero=3, gpus=8, checkpointing="full", checkpoint_every=3)),
    ("megatron", dict(gpus=8, tp=2, checkpointing="full", checkpoint_layers=4,
                      partition_activations=True, engine="megatron")),
    ("deepspeed", dict(zero=1, gpus=8, checkpointing="full", partition_activations=True,
                       cpu_checkpointing=True)),
])
def test_export_round_trips_the_policy(target, keys):
    recipe = Recipe.of(**keys)
    text = export(recipe, target, ExportContext(model=load_model(L8))).text
    back = read_engine_text(text, target, "<test>", hidden_size=4096).keys
    for k in ("checkpointing", "checkpoint_every", "checkpoint_layers",
              "partition_activations", "cpu_checkpointing"):
        assert back.get(k, recipe.to_dict()[k] if k != "checkpointing" else None) \
            == recipe.to_dict()[k], k


def test_op_recomputes_every_second_mm_of_a_llama_layer():
    """q, k, v, o, gate, up, down (no biases): k, o and up are recomputed."""
    layer = load_model(L8).layers[0]
    h, kv, f = 4096, 1024, 14336
    again = h * kv + h * h + h * f
    total = h * h + 2 * h * kv + h * h + 3 * h * f
    r = Recipe.of(checkpointing="op")
    assert math.isclose(recompute_matmul_share(r, layer, 0, 32), again / total)


def test_torchtune_activation_offloading_is_cpu_checkpointing_on_a_single_gpu():
    """torchtune's enable_activation_offloading with checkpointing (engine ddp, one GPU): the
    layer inputs move to the host exactly as DeepSpeed's cpu_checkpointing moves them."""
    spec = load_model("meta-llama/Llama-3.2-1B")
    kw = dict(precision="bf16-true", micro_batch=2, seq_len=4096, checkpointing="full")
    full = estimate(spec, Recipe.of(**kw), get_device("A100-80GB"))
    off = estimate(spec, Recipe.of(cpu_checkpointing=True, **kw), get_device("A100-80GB"))
    inputs = spec.num_layers * 2 * 4096 * spec.hidden_size * 2
    assert full.worst.peak_allocated_bytes - off.worst.peak_allocated_bytes >= inputs * 0.9
    host = [i for i in off.worst.outside if "cpu_checkpointing" in i.name]
    assert sum(i.bytes for i in host) == inputs
