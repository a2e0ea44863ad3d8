"""``memplan plan``: every number equals ``memplan estimate``'s for the candidate's recipe, the
CLI's tables/JSON/--save-best, and bad input (exit 2, no traceback)."""

from __future__ import annotations

import gc
import json
import random

import pytest
from typer.testing import CliRunner

from memplan.api import Machine, estimate_from_names, load_recipe
from memplan.cli import app
from memplan.model import load_model
from memplan.plan import Cluster, Evaluated, Evaluator, make_space, plan
from memplan.recipe import Recipe

runner = CliRunner()


def _numbers(e: Evaluated) -> tuple[object, ...]:
    return (e.peak_bytes, e.capacity_bytes, e.worst_role, e.host_bytes, e.host_capacity_bytes,
            e.nvme_bytes, e.nvme_capacity_bytes, e.step_seconds, e.tokens_per_second, e.mfu,
            e.bottleneck)


@pytest.mark.parametrize("model,gpus,seq", [("meta-llama/Llama-3.2-1B", 16, 4096),
                                            ("deepseek-ai/DeepSeek-V2-Lite", 8, 2048)])
def test_plan_numbers_equal_estimate_on_random_candidates(model: str, gpus: int, seq: int) -> None:
    """Candidates drawn at random from the search space, evaluated by the planner after it has
    warmed its memo on others, equal a fresh ``estimate_from_names`` (the path of
    ``memplan estimate``) of the same recipe, number for number."""
    spec = load_model(model)
    cluster = Cluster(gpu="H100-80GB", gpus=gpus, gpus_per_node=8, node="DGX-H100")
    space = make_space(spec, Recipe.of(seq_len=seq), cluster, frozenset({"seq_len"}), None)
    cands = list(space.recipes(spec))
    rng = random.Random(len(cands))
    ev = Evaluator(spec, cluster)
    for r in rng.sample(cands, 40):  # warm the memo with neighbours
        ev.evaluate(r)
    checked = 0
    for r in rng.sample(cands, 12):
        got = ev.evaluate(r)
        machine = Machine(gpu="H100-80GB", node="DGX-H100")
        want = estimate_from_names(model, r, machine, search_micro_batch=False)
        if got is None:
            continue
        ref = Evaluated.of(r, want)
        if got.complete:
            assert _numbers(got) == _numbers(ref), r.to_dict()
        else:  # GPU overflows: rejected on the GPU numbers alone, which are the same
            assert not ref.gpu_fits and not got.fits
            assert _numbers(got)[:3] == _numbers(ref)[:3], r.to_dict()
            full = ev.evaluate(r, full=True)
            assert full is not None and _numbers(full) == _numbers(ref), r.to_dict()
        checked += 1
    assert checked >= 8


def test_plan_ranks_fitting_fastest_first_and_pareto_is_nondominated() -> None:
    spec = load_model("meta-llama/Llama-3.2-1B")
    cluster = Cluster(gpu="H100-80GB", gpus=2, gpus_per_node=2)
    before = gc.get_threshold()
    res = plan(spec, Recipe.of(seq_len=2048), cluster, fixed=frozenset({"seq_len"}),
               global_batch=4)
    best = res.ranked
    assert best and all(e.fits for e in best)
    assert gc.get_threshold() == before  # the search's larger threshold is put back
    speeds = [e.tokens_per_second for e in best]
    assert speeds == sorted(speeds, reverse=True)
    front = res.pareto
    for e in front:
        assert not any(o.tokens_per_second > e.tokens_per_second
                       and o.headroom_bytes > e.headroom_bytes for o in best)
    assert all(e.recipe.global_batch == 4 for e in res.rows)


def test_cli_plan_json_and_save_best_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "best.toml"
    r = runner.invoke(app, ["plan", "meta-llama/Llama-3.2-1B", "--gpu", "H100-80GB", "--gpus",
                            "2", "--seq-len", "2048", "--zero", "3", "--format", "json",
                            "--save-best", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["candidates_evaluated"] > 10 and data["seconds"] > 0
    assert all(t["recipe"]["zero"] == 3 for t in data["top"])  # a given flag is held
    best = data["top"][0]
    r2 = runner.invoke(app, ["estimate", "meta-llama/Llama-3.2-1B", "--gpu", "H100-80GB",
                             "--recipe", str(out), "--format", "json"])
    assert r2.exit_code == 0, r2.output
    est = json.loads(r2.output)
    assert est["time"]["tokens_per_second"] == best["tokens_per_second"]
    assert load_recipe(out).to_dict() == {**best["recipe"], "notes": []}


@pytest.mark.parametrize("args,match", [
    (["meta-llama/Llama-3.1-70B", "--gpu", "H100-80GB", "--gpus", "1", "--offload", "none"],
     "does not fit"),
    (["meta-llama/Llama-3.2-1B", "--gpus", "2", "--global-batch", "3", "--micro-batch", "2"],
     "global batch"),
    (["meta-llama/Llama-3.2-1B", "--node", "DGX-H100", "--gpu", "A100-80GB"], "contradicts"),
    (["meta-llama/Llama-3.2-1B", "--gpus", "2", "--tp", "3"], "tp*pp*cp=3"),
    # offload given without zero (free: plan searches it); host RAM overflows while loading
    (["meta-llama/Llama-3.1-70B", "--node", "DGX-H100", "--nodes", "2", "--seq-len", "8192",
      "--checkpointing", "full", "--loss", "fused", "--attention", "flash", "--offload",
      "params+optimizer", "--engine", "torchtitan", "--tp", "8"], "--load sharded"),
    (["meta-llama/Llama-3.2-1B", "--gpus", "2", "--cp", "2", "--seq-len", "2047"],
     "candidate recipes applies"),
    (["meta-llama/Llama-3.2-1B", "--gpus", "2", "--jobs", "-1"], "--jobs -1 is negative"),
])
def test_cli_plan_bad_input_exits_2_without_traceback(args: list[str], match: str) -> None:
    r = runner.invoke(app, ["plan", *args])
    assert r.exit_code == 2, r.output
    assert match in r.output and "Traceback" not in r.output


def test_cli_size_smallest_cluster_and_speed_target() -> None:
    """Llama-3.2-1B full fine-tuning fits one H100; a target of 4x what one GPU reaches needs
    more GPUs, and every plan shown at that size reaches it."""
    r = runner.invoke(app, ["size", "meta-llama/Llama-3.2-1B", "--gpu", "H100-80GB",
                            "--seq-len", "2048", "--format", "json"])
    assert r.exit_code == 0, r.output
    one = json.loads(r.output)
    assert one["smallest"]["gpus"] == 1 and one["ram_rules"]
    speed = one["smallest"]["best"]["tokens_per_second"]
    r = runner.invoke(app, ["size", "meta-llama/Llama-3.2-1B", "--gpu", "H100-80GB",
                            "--seq-len", "2048", "--tokens-per-second", str(4 * speed),
                            "--format", "json"])
    assert r.exit_code == 0, r.output
    fast = json.loads(r.output)["for_speed"]
    assert fast["gpus"] > 1 and fast["best"]["tokens_per_second"] >= 4 * speed


@pytest.mark.parametrize("args,match", [
    (["meta-llama/Llama-3.2-1B", "--tokens", "1e9"], "go together"),
    (["meta-llama/Llama-3.2-1B", "--gpus", "8"], "drop --gpus"),
    (["meta-llama/Llama-3.1-70B", "--gpu", "H100-80GB", "--offload", "none", "--max-gpus", "4"],
     "does not fit"),
    (["meta-llama/Llama-3.2-1B", "--jobs", "-2"], "--jobs -2 is negative"),
])
def test_cli_size_bad_input_exits_2(args: list[str], match: str) -> None:
    r = runner.invoke(app, ["size", *args])
    assert r.exit_code == 2, r.output
    assert match in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("value,match", [("-3", "--jobs -3 is negative"),
                                         ("many", "MEMPLAN_JOBS")])
def test_jobs_default_from_the_environment(value: str, match: str) -> None:
    """MEMPLAN_JOBS sets --jobs' default for plan and size, and a bad value is refused as the
    flag's would be."""
    for command in ("plan", "size"):
        r = runner.invoke(app, [command, "meta-llama/Llama-3.2-1B", "--gpu", "H100-80GB"],
                          env={"MEMPLAN_JOBS": value})
        assert r.exit_code == 2, r.output
        assert match in r.output and "Traceback" not in r.output


def test_plan_in_two_processes_gives_the_same_rows() -> None:
    spec = load_model("meta-llama/Llama-3.2-1B")
    cluster = Cluster(gpu="H100-80GB", gpus=4, gpus_per_node=4)
    base = Recipe.of(seq_len=1024, loss="fused", checkpointing="full")
    kw = dict(fixed=frozenset({"seq_len", "loss", "checkpointing"}), global_batch=8)
    one = plan(spec, base, cluster, **kw)  # type: ignore[arg-type]
    two = plan(spec, base, cluster, workers=2, **kw)  # type: ignore[arg-type]
    assert one.candidates_evaluated == two.candidates_evaluated >= 500
    assert list(map(repr, one.rows)) == list(map(repr, two.rows))  # in the same order
    assert [repr(f) for f in one.rejected] == [repr(f) for f in two.rejected]
    drop = lambda d: {k: v for k, v in d.items() if k != "seconds"}  # noqa: E731
    assert drop(one.to_dict()) == drop(two.to_dict())


def test_plan_from_an_engine_file_holds_its_keys(tmp_path):
    """``plan --from ds_config.json``: ZeRO stage, micro-batch and accumulation the file sets
    are held; what it does not set (checkpointing, loss, attention) is searched."""
    import json

    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "train_batch_size": 64, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}}))
    r = runner.invoke(app, ["plan", "meta-llama/Llama-3.2-1B", "--node", "DGX-H100", "--nodes",
                            "1", "--seq-len", "2048", "--from", str(ds), "--format", "json",
                            "--top", "50"])
    assert r.exit_code == 0, r.output
    ranked = json.loads(r.output)["top"]
    assert ranked and all(p["recipe"]["zero"] == 2 and p["recipe"]["micro_batch"] == 4
                          and p["recipe"]["grad_accum"] == 2 for p in ranked)
    assert len({p["recipe"]["checkpointing"] for p in ranked}) > 1


def _plan_with_stderr(stderr_on_a_terminal: bool) -> tuple[str, str]:
    """``memplan plan`` of a search that takes over a second, its stderr a pseudo-terminal or a
    pipe; (stdout, stderr)."""
    import os
    import pty
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "memplan", "plan", "Qwen/Qwen2.5-0.5B", "--gpu", "H100-80GB",
           "--gpus", "2"]
    env = {**os.environ, "COLUMNS": "100"}
    if not stderr_on_a_terminal:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        return r.stdout, r.stderr
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    with p.stdout:
        out = p.stdout.read().decode()
    assert p.wait(timeout=600) == 0
    os.close(master)
    return out, b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_only():
    """Issue #13: a search over a second shows a progress bar on a terminal (stderr), and
    nothing off one; the plan itself goes to stdout either way."""
    out, err = _plan_with_stderr(True)
    assert "planning Qwen/Qwen2.5-0.5B" in err and "%" in err, err[-500:]
    assert "planning" not in out and "Qwen/Qwen2.5-0.5B" in out
    out, err = _plan_with_stderr(False)
    assert "planning" not in err and "Qwen/Qwen2.5-0.5B" in out


def test_torch_optim_candidates_step_fused_adamw_unless_held() -> None:
    """Unfixed, plan's DDP/FSDP/torchtitan candidates step AdamW with fused=True (no foreach
    copy: never more memory, never slower) and say so; DeepSpeed/Megatron keep their own Adam;
    a given --optimizer-impl is held."""
    spec = load_model("Qwen/Qwen2.5-0.5B")
    cluster = Cluster(gpu="H100-80GB", gpus=8, gpus_per_node=8)
    space = make_space(spec, Recipe.of(seq_len=1024), cluster, frozenset({"seq_len"}), None)
    impls: dict[str, set[str]] = {}
    for r in space.recipes(spec):
        impls.setdefault(str(r.engine.kind), set()).add(str(r.optimizer.impl))
    assert {e: impls[e] for e in ("ddp", "fsdp2", "torchtitan")} == {
        "ddp": {"fused"}, "fsdp2": {"fused"}, "torchtitan": {"fused"}}
    assert impls["deepspeed"] == impls["megatron"] == {"auto"}
    assert any("fused AdamW" in n for n in space.notes)
    held = make_space(spec, Recipe.of(seq_len=1024, optimizer_impl="foreach", engine="fsdp2",
                                      zero=3), cluster,
                      frozenset({"seq_len", "optimizer_impl", "engine", "zero"}), None)
    assert {str(r.optimizer.impl) for r in held.recipes(spec)} == {"foreach"}
    assert not any("fused AdamW" in n for n in held.notes)
    ds = make_space(spec, Recipe.of(seq_len=1024, engine="deepspeed", zero=2), cluster,
                    frozenset({"seq_len", "engine", "zero"}), None)
    assert not any("fused AdamW" in n for n in ds.notes)
    # the fused step is what estimate prints for that recipe: no foreach copy
    r = Recipe.of(seq_len=1024, gpus=8, zero=3, engine="fsdp2")
    fused = estimate_from_names("Qwen/Qwen2.5-0.5B", r.with_keys(optimizer_impl="fused"),
                                Machine(gpu="H100-80GB"))
    auto = estimate_from_names("Qwen/Qwen2.5-0.5B", r, Machine(gpu="H100-80GB"))
    names = {i.name for rank in auto.ranks for m in rank.moments for i in m.items}
    fused_names = {i.name for rank in fused.ranks for m in rank.moments for i in m.items}
    assert "foreach Adam sqrt(exp_avg_sq) copy" in names - fused_names
