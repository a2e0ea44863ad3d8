"""The allocator replay wired to the estimator (``estimate/reserved.py``,
``estimate/activations/events.py``): the recorded stream is the simulator's, the step loop
follows the hand-worked allocator rules, and ``estimate(allocator="replay")`` reports it."""

from __future__ import annotations

import pytest

from memplan import Recipe, get_device, load_model
from memplan.estimate import estimate, rank_totals
from memplan.estimate.activations import stage_events
from memplan.estimate.activations.events import record
from memplan.estimate.activations.graph import simulate
from memplan.estimate.layout import layout
from memplan.estimate.reserved import replay_steps, replayed_slack
from memplan.facts import dtypes
from memplan.units import MIB

MODEL = "Qwen/Qwen2.5-0.5B"


def _graph(recipe: Recipe):  # type: ignore[no-untyped-def]
    from memplan.estimate.activations import _whole_graph

    spec = load_model(MODEL)
    return _whole_graph(spec, layout(spec, recipe)[0], recipe, dtypes(recipe))


@pytest.mark.parametrize("keys", [dict(seq_len=256), dict(seq_len=256, checkpointing="full"),
                                  dict(seq_len=256, grad_accum=4)])
def test_recorded_stream_peaks_where_the_simulator_does(keys: dict[str, object]) -> None:
    """Recording changes no point, and the stream's running sum of live bytes peaks at the
    simulator's largest point (saved + temporaries + gradients)."""
    recipe = Recipe.of(**keys)
    plain = simulate(_graph(recipe))
    events = record(_graph(recipe))
    assert [(p.saved, p.temp, p.grads) for p in simulate(_graph(recipe))] == \
        [(p.saved, p.temp, p.grads) for p in plain]
    live = peak = 0
    sizes: dict[object, int] = {}
    for key, nbytes, _ in events:
        if nbytes:
            sizes[key] = nbytes
            live += nbytes
        else:
            live -= sizes.pop(key)
        peak = max(peak, live)
    assert peak == max(p.total for p in plain)


def test_step_loop_by_hand() -> None:
    """One 30 MiB activation and one 10 MiB gradient per step, Adam-like states of 2 x 10 MiB:
    step 1 opens segments of 30 and 10 MiB; the states are cut from the freed 30 MiB block
    (10 MiB left); step 2's activation fits no cached block (10 + 10 MiB free), so a third
    segment: 70 MiB reserved at a peak of 60 MiB requested (states 20 + activation 30 +
    gradient 10)."""
    events = [("a", 30 * MIB, ""), ("g", 10 * MIB, "grad"), ("a", 0, "")]
    a = replay_steps(events, keep_grads=False, state_bytes=20 * MIB, states=2)
    assert (a.peak_reserved, a.peak_requested) == (70 * MIB, 60 * MIB)
    kept = replay_steps(events, keep_grads=True)
    assert (kept.peak_reserved, kept.peak_requested) == (40 * MIB, 40 * MIB)
    # a 15 MiB foreach copy per step fits none of the 10 MiB holes: a new segment in step 1
    # (15 MiB rounded up to 2 MiB: 16 MiB; reused after), and step 2's activation still needs
    # its own: 30 + 10 + 16 + 30 MiB
    temps = replay_steps(events, keep_grads=False, state_bytes=20 * MIB, states=2,
                         temporaries=[(15 * MIB, True)])
    assert (temps.peak_reserved, temps.peak_requested) == (86 * MIB, 60 * MIB)


def test_estimate_reports_the_replayed_slack() -> None:
    """``estimate(allocator="replay")``: the allocator line is the replay's slack, the reserved
    peak is the allocated peak plus it, and ``rank_totals`` agrees with the ranks' totals."""
    spec, device = load_model(MODEL), get_device("H100-80GB")
    recipe = Recipe.of(seq_len=512, micro_batch=2)
    b = estimate(spec, recipe, device, search_micro_batch=False, allocator="replay")
    rank = b.ranks[0]
    (slack,) = [i for i in rank.outside if i.name.startswith("allocator slack (replayed")]
    stage = layout(spec, recipe)[0]
    from memplan.estimate import stage_parts

    lines = stage_parts(spec, recipe, device)[0][1]
    from memplan.estimate.activations import accumulates

    want = replayed_slack(stage_events(spec, stage, recipe, dtypes(recipe)), lines, recipe,
                          accumulates(recipe))
    assert slack.bytes == want > 0
    assert rank.peak_reserved_bytes == rank.peak_allocated_bytes + want
    totals = rank_totals(spec, recipe, device, allocator="replay")
    assert [t for _, t in totals] == [r.device_total_bytes for r in b.ranks]
    flat = estimate(spec, recipe, device, search_micro_batch=False)
    assert flat.ranks[0].peak_allocated_bytes == rank.peak_allocated_bytes


def test_expandable_segments_reach_the_replay() -> None:
    """``expandable_segments`` is replayed with its own rules (one growing segment per pool):
    the line says so and its bytes are the expandable replay's, not the plain one's."""
    spec, device = load_model(MODEL), get_device("H100-80GB")
    got = {}
    for exp in (False, True):
        recipe = Recipe.of(seq_len=512, micro_batch=2, expandable_segments=exp)
        rank = estimate(spec, recipe, device, search_micro_batch=False,
                        allocator="replay").ranks[0]
        (got[exp],) = [i for i in rank.outside if i.name.startswith("allocator slack")]
    assert got[True].name == "allocator slack (replayed, expandable segments)"
    assert got[False].name == "allocator slack (replayed)"
    assert got[True].bytes != got[False].bytes


@pytest.mark.parametrize("keys", [dict(gpus=2, zero=3), dict(gpus=2, pp=2)])
def test_flat_fraction_where_the_stream_misses_the_churn(keys: dict[str, object]) -> None:
    """ZeRO-3 (gather buffers) and pipeline parallelism (micro-batches in flight) are not in
    the simulated stream: ``allocator="replay"`` keeps the flat fraction there."""
    spec, device = load_model(MODEL), get_device("H100-80GB")
    recipe = Recipe.of(seq_len=512, **keys)
    replay = estimate(spec, recipe, device, search_micro_batch=False, allocator="replay")
    flat = estimate(spec, recipe, device, search_micro_batch=False)
    assert [r.device_total_bytes for r in replay.ranks] == [r.device_total_bytes
                                                             for r in flat.ranks]
    assert all(any(i.name == "allocator fragmentation" for i in r.outside) for r in replay.ranks)


@pytest.mark.parametrize("keys", [dict(seq_len=512, micro_batch=2),
                                  dict(seq_len=512, grad_accum=2)])
def test_three_micro_batches_reach_the_steady_state(keys: dict[str, object]) -> None:
    """``STEPS`` = 3 is enough: replaying 6 micro-batches reserves no more (the allocator's
    cache has settled after the first step's states and one steady step)."""
    from memplan.estimate import stage_parts
    from memplan.estimate.activations import accumulates
    from memplan.estimate.reserved import STEPS, lazy_state_bytes, step_temporaries

    spec, recipe = load_model(MODEL), Recipe.of(**keys)
    lines = stage_parts(spec, recipe, get_device("H100-80GB"))[0][1]
    events = stage_events(spec, layout(spec, recipe)[0], recipe, dtypes(recipe))
    peaks = [replay_steps(events, keep_grads=accumulates(recipe),
                          state_bytes=lazy_state_bytes(lines), states=2,
                          temporaries=step_temporaries(lines), steps=n).peak_reserved
             for n in (STEPS, 6)]
    assert peaks[0] == peaks[1]


def test_unknown_allocator_is_refused() -> None:
    """A misspelt ``allocator`` is a ``ConfigError`` naming the value and the choices."""
    from memplan.errors import ConfigError

    spec, device = load_model(MODEL), get_device("H100-80GB")
    with pytest.raises(ConfigError, match="allocator='replayed' is not one of flat, replay"):
        estimate(spec, Recipe.of(seq_len=256), device, search_micro_batch=False,
                 allocator="replayed")


def test_cli_allocator_option_prints_the_replayed_estimate() -> None:
    """``memplan estimate --allocator replay`` reports what ``estimate(allocator="replay")``
    gives (the device total), the default stays the flat fraction, and a misspelt
    value exits 2 with the close match and no traceback."""
    import json

    from typer.testing import CliRunner

    from memplan.cli import app

    spec, device = load_model(MODEL), get_device("A100-80GB")
    recipe = Recipe.of(seq_len=512)
    runner = CliRunner()
    totals = {}
    for allocator in ("flat", "replay"):
        out = runner.invoke(app, ["estimate", MODEL, "--gpu", "A100-80GB", "--seq-len", "512",
                                  "--allocator", allocator, "--format", "json"])
        assert out.exit_code == 0, out.output
        totals[allocator] = json.loads(out.output)["gpu"]["device_total_bytes"]
        want = estimate(spec, recipe, device, allocator=allocator)
        assert totals[allocator] == want.worst.device_total_bytes
    assert totals["flat"] != totals["replay"]
    bad = runner.invoke(app, ["estimate", MODEL, "--allocator", "replai"])
    assert bad.exit_code == 2
    assert "Did you mean 'replay'?" in bad.output and "Traceback" not in bad.output
