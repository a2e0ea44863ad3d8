"""``memplan plan``'s reuse changes no number (issue #13 item 2): more random candidates than
``test_plan.py`` draws, with a host setup whose load mode is not the default, and the peak the
planner reads without building the timeline (``estimate.rank_totals``) against the estimate's
own ranks."""

from __future__ import annotations

import random

import pytest

from memplan.api import Machine, estimate_from_names
from memplan.estimate import estimate, rank_totals
from memplan.errors import MemplanError
from memplan.hardware import get_device
from memplan.host import HostSetup
from memplan.model import load_model
from memplan.plan import Cluster, Evaluated, Evaluator, make_space
from memplan.recipe import Recipe


def _numbers(e: Evaluated) -> tuple[object, ...]:
    return (e.peak_bytes, e.capacity_bytes, e.worst_role, e.host_bytes, e.host_capacity_bytes,
            e.host_peak_moment, e.nvme_bytes, e.nvme_capacity_bytes, e.step_seconds,
            e.tokens_per_second, e.mfu, e.bottleneck)


@pytest.mark.parametrize("model,gpus,seq,load", [("meta-llama/Llama-3.2-1B", 16, 8192, "sharded"),
                                                 ("Qwen/Qwen2.5-0.5B", 8, 4096, "rank0"),
                                                 pytest.param("deepseek-ai/DeepSeek-V2-Lite", 8,
                                                              2048, "meta",
                                                              marks=pytest.mark.full),
                                                 ("mistralai/Mixtral-8x7B-v0.1", 8, 4096,
                                                  "sharded")])
def test_plan_equals_estimate_on_more_random_candidates(model: str, gpus: int, seq: int,
                                                        load: str) -> None:
    """60 candidates drawn at random after the memo has been warmed on 150 others: each
    equals a fresh ``estimate_from_names`` with the same host setup, fitting or not. The
    evaluator's fast path is what is compared: host RAM and NVMe from ``host_of`` and step
    time without a ``Breakdown``, flash sharing sdpa's simulations (not under DeepSeek's
    multi-head latent attention), periodic checkpointing composed per unit of layers, stages
    composed or simulated whole (whichever is cheaper given the memo), the two-layer traffic
    graph shared by stage lengths and positions, and the kernel times, FLOPs per token and
    per-token HBM bytes kept under the recipe fields they read (Mixtral: expert parallelism,
    expert TP and capacity in the kernel key)."""
    spec = load_model(model)
    setup = HostSetup(load=load)
    cluster = Cluster(gpu="H100-80GB", gpus=gpus, gpus_per_node=8, node="DGX-H100")
    space = make_space(spec, Recipe.of(seq_len=seq), cluster, frozenset({"seq_len"}), None)
    cands = list(space.recipes(spec))
    rng = random.Random(len(cands) + gpus)
    ev = Evaluator(spec, cluster, setup)
    for r in rng.sample(cands, 150):
        ev.evaluate(r)
    machine = Machine(gpu="H100-80GB", node="DGX-H100")
    checked = incomplete = 0
    for r in rng.sample(cands, 60):
        got = ev.evaluate(r)
        try:
            want = estimate_from_names(model, r, machine, setup, search_micro_batch=False)
        except MemplanError:
            assert got is None, r.to_dict()
            continue
        assert got is not None, r.to_dict()
        ref = Evaluated.of(r, want)
        if not got.complete:
            incomplete += 1
            assert not ref.gpu_fits
            assert _numbers(got)[:3] == _numbers(ref)[:3], r.to_dict()
            got = ev.evaluate(r, full=True)
            assert got is not None
        assert _numbers(got) == _numbers(ref), r.to_dict()
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.2-1B", "deepseek-ai/DeepSeek-V2-Lite",
                                   "google/gemma-2-2b"])
def test_rank_totals_equal_the_estimates_ranks(model: str) -> None:
    """Role and device total of every rank, for recipes across pipeline stages, interleaving,
    accumulation, checkpointing, ZeRO, offload and load modes, memo or none."""
    spec = load_model(model)
    device = get_device("H100-80GB")
    memo: dict[object, object] = {}
    rng = random.Random(7)
    seen = 0
    for _ in range(40):
        keys = dict(gpus=8, pp=rng.choice([1, 2, 4]), zero=rng.choice([0, 1, 2, 3]),
                    micro_batch=rng.choice([1, 2, 4]), grad_accum=rng.choice([1, 4]),
                    checkpointing=rng.choice(["none", "selective", "full"]),
                    offload=rng.choice(["none", "optimizer"]), seq_len=2048)
        if keys["pp"] > 1 and rng.random() < 0.5:
            keys["pp_virtual"] = 2
        load = rng.choice(["full", "sharded", "meta"])
        try:
            r = Recipe.of(**keys)
            b = estimate(spec, r, device, search_micro_batch=False, load=load)
        except MemplanError:
            continue
        want = [(rb.role, rb.device_total_bytes) for rb in b.ranks]
        assert rank_totals(spec, r, device, memo=memo, load=load) == want, keys
        assert rank_totals(spec, r, device, load=load) == want, keys
        seen += 1
    assert seen >= 15


def test_peak_allocated_is_the_largest_moment_on_random_lines() -> None:
    """``timeline.peak_allocated`` (one pass over the lines) equals the largest moment that
    ``moments`` builds, on random lines: lazy, growing (none, one, several), outside the
    allocated pool, in some phases only, and stepping lines (the optimizer in backward)."""
    from memplan.breakdown import ALL_PHASES, Category, Item, Phase, Pool
    from memplan.estimate.lines import Line
    from memplan.estimate.timeline import Instant, moments, peak_allocated, phased

    rng = random.Random(11)
    for _ in range(400):
        lines = []
        for j in range(rng.randint(0, 8)):
            phases = tuple(p for p in ALL_PHASES if rng.random() < 0.7) or ALL_PHASES
            lines.append(Line(Item(category=Category.GRADIENTS, name=f"l{j}",
                                   bytes=rng.randint(0, 10**6),
                                   pool=rng.choice([Pool.ALLOCATED] * 4 + [Pool.HOST])),
                              phases, lazy=rng.random() < 0.3, grows=rng.random() < 0.4,
                              stepping=rng.choice(["", "", "", "during", "after"])
                              if rng.random() < 0.2 else ""))
        instants = [Instant(rng.choice(ALL_PHASES[:2]) if rng.random() < 0.9 else Phase.OPTIMIZER,
                            f"i{k}", (Item(category=Category.ACTIVATIONS, name="a",
                                           bytes=rng.randint(0, 10**6)),),
                            progress=rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()]))
                    for k in range(rng.randint(0, 6))]
        want = max(m.allocated_bytes for m in moments(lines, instants))
        assert peak_allocated(lines, instants) == want
        # the backward frontier (what a memoised stage's Phased carries) gives the same peak
        assert peak_allocated(lines, instants, phases=phased(instants, front=True)) == want


@pytest.mark.parametrize("keys", [dict(pp=2, grad_accum=4, checkpointing="full"),
                                  dict(pp=4, pp_virtual=2, grad_accum=8),
                                  dict(grad_accum=2, checkpointing="selective", loss="chunked")])
def test_stage_instants_read_off_their_points(keys: dict[str, object]) -> None:
    """``StageInstants.phased`` (read off the simulated points, never building the instants)
    holds each instant's progress and own bytes as the built instants give them, and its
    backward frontier keeps every instant that no other dominates."""
    from memplan.breakdown import Phase
    from memplan.estimate import stage_parts
    from memplan.estimate.instants import StageInstants
    from memplan.estimate.timeline import phased

    spec = load_model("meta-llama/Llama-3.2-1B")
    r = Recipe.of(gpus=8, seq_len=2048, **keys)  # type: ignore[arg-type]
    for _, _, instants, *_ in stage_parts(spec, r, get_device("H100-80GB"), memo={}):
        assert isinstance(instants, StageInstants)
        fast, built = instants.phased(), phased(list(instants))
        assert fast.most == built.most
        for phase, marks in fast.by_phase.items():
            assert [(m.progress, m.items_bytes) for m in marks] == [
                (i.progress, i.items_bytes) for i in built.by_phase[phase]], phase
        bwd = [(m.progress, m.items_bytes) for m in fast.by_phase[Phase.BACKWARD]]
        front = {(m.progress, m.items_bytes) for m in fast.front or []}
        assert bwd and front <= set(bwd)
        for m in bwd:
            assert m in front or any(o != m and o[0] >= m[0] and o[1] >= m[1] for o in bwd)
