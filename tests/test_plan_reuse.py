"""The shortcuts ``memplan plan`` takes per candidate (issue #13 item 3) give the numbers of the
full path bit for bit: the step time's numbers without its words (``timing.step.step_figures``),
memo entries kept by the identity of recipe parts (``recipe.memo.kept_by_parts``), the peak from
pre-summed groups of lines and pre-grouped instants (``timeline.line_sums`` / ``phased``), and
the searched keys read without the whole table (``Recipe.values``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memplan.breakdown import Phase
from memplan.estimate import stage_parts
from memplan.estimate.timeline import line_sums, moments, peak_allocated, phased
from memplan.hardware import get_device
from memplan.hardware.nodes import get_node
from memplan.host import HostSetup, node_hardware
from memplan.model import load_model
from memplan.plan import Cluster, make_space
from memplan.plan.space import SEARCHED
from memplan.recipe import Recipe
from memplan.recipe.memo import kept_by_parts
from memplan.system import stage_loads
from memplan.timing import estimate_time
from memplan.timing.step import step_figures

H100 = get_device("H100-80GB")
HW = node_hardware(H100, 8, get_node("DGX-H100"))

RECIPES = [
    dict(gpus=8, zero=3, micro_batch=2, checkpointing="full"),
    dict(gpus=8, zero=1, offload="optimizer", attention="flash", loss="fused"),
    dict(gpus=16, gpus_per_node=8, tp=2, pp=4, pp_virtual=2, grad_accum=8, engine="megatron",
         zero=1, sequence_parallel=True, checkpointing="selective"),
    dict(gpus=8, cp=2, zero=3, engine="torchtitan", checkpointing="op", compile=True),
    dict(gpus=8, zero=3, offload="nvme", grad_accum=4),
]


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.2-1B", "mistralai/Mixtral-8x7B-v0.1"])
@pytest.mark.parametrize("kw", RECIPES)
def test_step_figures_are_the_estimates_numbers(model: str, kw: dict[str, object]) -> None:
    """``step_figures`` (with a memo, asked twice: the second from kept rates and stage
    loads) equals the ``TimeEstimate`` of ``estimate_time`` without a memo, to the last bit:
    step time, tokens per second, MFU, bottleneck, model FLOPs per token, peak."""
    spec = load_model(model)
    r = Recipe.of(seq_len=4096, **kw)
    setup = HostSetup()
    t = estimate_time(spec, r, H100, HW, setup, spec.num_params, stages=stage_loads(spec, r))
    assert t is not None
    memo: dict[object, object] = {}
    for _ in range(2):
        f = step_figures(spec, r, H100, HW, setup, spec.num_params,
                         stages=stage_loads(spec, r, memo), memo=memo)
        assert f is not None
        assert (f.step_seconds, f.tokens_per_second, f.mfu, f.bottleneck,
                f.model_flops_per_token, f.peak_flops_per_gpu) == (
            t.step_seconds, t.tokens_per_second, t.mfu, t.bottleneck,
            t.model_flops_per_step / t.tokens_per_step, t.peak_flops_per_gpu)


def test_kept_by_parts_hits_only_the_same_parts() -> None:
    """The same part objects hit; equal parts that are other objects, or a part that differs,
    are made again (the key is their identity); nothing is kept when ``make`` raises."""
    memo: dict[object, object] = {}
    calls = []

    def make(v: object) -> object:
        calls.append(v)
        return ("made", v)

    a = Recipe.of(micro_batch=2)
    parts = (a.batch, a.precision)
    assert kept_by_parts(memo, "x", parts, lambda: make(1)) == ("made", 1)
    assert kept_by_parts(memo, "x", parts, lambda: make(2)) == ("made", 1)
    same = Recipe.of(micro_batch=2)
    assert same.batch is not a.batch
    assert kept_by_parts(memo, "x", (same.batch, same.precision), lambda: make(3)) == ("made", 3)
    b = Recipe.of(micro_batch=4)
    assert kept_by_parts(memo, "x", (b.batch, b.precision), lambda: make(4)) == ("made", 4)
    assert kept_by_parts(memo, "y", parts, lambda: make(5)) == ("made", 5)
    assert calls == [1, 3, 4, 5]

    def refuse() -> object:
        raise ValueError("refused")

    for _ in range(2):
        with pytest.raises(ValueError, match="refused"):
            kept_by_parts(memo, "z", parts, refuse)


@pytest.mark.parametrize("kw", [
    dict(gpus=8, zero=3), dict(gpus=8, zero=3, engine="fsdp2"), dict(gpus=1, grad_accum=2),
    dict(gpus=16, gpus_per_node=8, pp=4, grad_accum=8, engine="megatron", zero=1),
    dict(gpus=1, optimizer_in_backward=True), dict(gpus=1, method="lora", outputs="kept"),
])
def test_peak_from_groups_equals_the_whole_and_the_moments(kw: dict[str, object]) -> None:
    """``peak_allocated`` from ``stage_parts``' group sums and phased instants (with a memo,
    twice: the second from the kept sums) equals it from the lines and instants alone, and
    the largest moment ``moments`` builds; the groups make up the lines in order (the
    optimizer in backward takes the per-instant path either way)."""
    spec = load_model("meta-llama/Llama-3.2-1B")
    r = Recipe.of(seq_len=2048, **kw)
    memo: dict[object, object] = {}
    for _ in range(2):
        for stage, lines, instants, _init, _out, sums, ph in stage_parts(spec, r, H100,
                                                                           memo=memo):
            whole = peak_allocated(lines, instants)
            assert peak_allocated(lines, instants, sums, ph) == whole
            assert whole == max(m.allocated_bytes for m in moments(lines, instants))
            assert len(sums) == 3
            assert {p: [(i.progress, i.items_bytes) for i in mine]  # marks read off the points
                    for p, mine in ph.by_phase.items()} == {
                p: [(i.progress, i.items_bytes) for i in mine]
                for p, mine in phased(instants).by_phase.items()}
            one = line_sums(lines)
            assert one.stepping == any(s.stepping for s in sums)
            if not one.stepping:
                for step, per in one.sums.items():
                    assert per == {p: sum(s.sums[step][p] for s in sums) for p in per}
            assert ph.most[Phase.FORWARD] == max(
                [i.items_bytes for i in instants if i.phase == Phase.FORWARD], default=0)


def test_recipe_values_are_to_dicts() -> None:
    """``Recipe.values`` reads what ``to_dict`` writes (enums as ``str``, tuples as lists)."""
    spec = load_model("meta-llama/Llama-3.2-1B")
    cluster = Cluster(gpu="H100-80GB", gpus=8, gpus_per_node=8)
    space = make_space(spec, Recipe.of(seq_len=2048, method="lora"), cluster,
                       frozenset({"seq_len"}), None)
    keys = tuple(SEARCHED) + ("lora_targets", "precision", "compile")
    for r in list(space.recipes(spec))[::37]:
        d = r.to_dict()
        assert r.values(keys) == tuple(d[k] for k in keys)
        assert [type(v) for v in r.values(keys)] == [type(d[k]) for k in keys]


def test_space_shares_equal_parts() -> None:
    """The space's candidates hold one object per distinct part (what the identity memo
    keys rely on for their hits), and each equals the recipe built on its own."""
    spec = load_model("meta-llama/Llama-3.2-1B")
    cluster = Cluster(gpu="H100-80GB", gpus=8, gpus_per_node=8)
    space = make_space(spec, Recipe.of(seq_len=2048), cluster, frozenset({"seq_len"}), None)
    cands = list(space.recipes(spec))
    for part in ("batch", "platform", "loss", "offload", "engine", "checkpointing"):
        objs = {id(getattr(r, part)) for r in cands}
        assert len(objs) == len({getattr(r, part) for r in cands}), part
    r = cands[len(cands) // 2]
    alone = replace(space.base, parallelism=r.parallelism, offload=replace(r.offload),
                    engine=replace(r.engine), batch=replace(r.batch),
                    checkpointing=replace(r.checkpointing), platform=replace(r.platform),
                    loss=replace(r.loss))
    assert alone == r and alone.loss is not r.loss
