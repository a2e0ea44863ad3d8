"""One test per subcommand, the JSON contract, and the error paths users hit."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

from typer.testing import CliRunner

from memplan.cli import app

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args))


def test_estimate_table_main_job():
    r = _run("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100-80GB")
    assert r.exit_code == 0, r.output
    assert "meta-llama/Llama-3.1-8B" in r.output and "H100-80GB" in r.output
    assert "8,030,261,248" in r.output
    assert "does NOT fit" in r.output  # 16 B/param of Adam states alone is 120 GiB


def test_estimate_json_contract():
    r = _run("estimate", "meta-llama/Llama-3.1-8B", "--gpus", "8", "--zero", "3",
             "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["model"]["id"] == "meta-llama/Llama-3.1-8B"
    assert d["model"]["params"] == d["model"]["trainable_params"] == 8_030_261_248
    gpu = d["gpu"]
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes",
                "capacity_bytes", "fits"):
        assert key in gpu
    rank = gpu["per_rank"][0]
    assert set(rank["categories"]) == {"params", "gradients", "optimizer", "activations",
                                       "temporary", "communication", "overhead"}
    assert all(isinstance(v, int) for v in rank["categories"].values())
    for key in ("role", "peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes",
                "peak_phase", "peak_moment", "first_step_peak_allocated_bytes",
                "steady_peak_allocated_bytes", "timeline"):
        assert key in rank
    assert rank["peak_allocated_bytes"] == max(rank["first_step_peak_allocated_bytes"],
                                               rank["steady_peak_allocated_bytes"])
    assert rank["unmodelled"] == []
    assert rank["categories"]["activations"] > 0
    assert isinstance(gpu["max_micro_batch"], int)
    assert gpu["device_total_bytes"] == max(r["device_total_bytes"] for r in gpu["per_rank"])
    assert sum(rank["categories"].values()) == rank["device_total_bytes"]


def test_estimate_pipeline_stages_listed():
    r = _run("estimate", "meta-llama/Llama-3.1-70B", "--gpus", "16", "--pp", "4", "--tp", "4",
             "--precision", "bf16-true", "--format", "json")
    d = json.loads(r.output)
    roles = [x["role"] for x in d["gpu"]["per_rank"]]
    assert len(roles) == 4 and "embedding" in roles[0] and "head" in roles[-1]


def test_models_and_gpus_listings():
    m = _run("models", "--format", "json")
    assert m.exit_code == 0
    rows = json.loads(m.output)
    assert len(rows) >= 40
    assert {"meta-llama/Llama-3.1-405B", "deepseek-ai/DeepSeek-V3", "gpt3-175b"} <= {
        r["id"] for r in rows}
    g = _run("gpus", "--format", "json")
    names = {r["name"] for r in json.loads(g.output)}
    assert {"H100-80GB", "A100-40GB", "MI300X-192GB", "T4-16GB"} <= names
    assert _run("models").exit_code == 0 and _run("gpus").exit_code == 0


def test_unknown_gpu_suggests_close_match():
    r = _run("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100-80G")
    assert r.exit_code == 2
    assert "H100-80GB" in r.output and "Traceback" not in r.output


def test_unknown_model_suggests_and_explains():
    r = _run("estimate", "meta-llama/Llama-3.1-8b-typo")
    assert r.exit_code == 2
    assert "meta-llama/Llama-3.1-8B" in r.output and "config.json" in r.output


def test_every_problem_reported_at_once():
    r = _run("estimate", "meta-llama/Llama-3.1-8B", "--precision", "bf16-mix",
             "--optimizer", "adamw8bit", "--zero", "5", "--checkpointing", "fulll")
    assert r.exit_code == 2
    for fix in ("bf16-mixed", "adamw-8bit", "zero=5 must be a whole number from 0 to 3", "full"):
        assert fix in r.output


def test_impossible_combinations():
    r = _run("estimate", "meta-llama/Llama-3.1-8B", "--gpus", "8", "--tp", "3", "--pp", "1")
    assert r.exit_code == 2 and "not divisible by tp*pp*cp" in r.output
    r = _run("estimate", "meta-llama/Llama-3.1-8B", "--gpus", "6", "--tp", "3", "--ep", "2",
             "--pp", "1")
    out = r.output
    assert r.exit_code == 2 and "tp=3 does not divide the 32 attention heads" in out
    assert "no routed experts" in out
    r = _run("estimate", "openai-community/gpt2", "--pp", "13", "--gpus", "13")
    assert r.exit_code == 2 and "pp=13 is larger than the 12 layers" in r.output
    r = _run("estimate", "google-bert/bert-base-uncased", "--method", "lora",
             "--lora-targets", "gate")
    assert r.exit_code == 2 and "match no module" in r.output
    r = _run("estimate", "google-bert/bert-base-uncased", "--method", "lora",
             "--lora-targets", "gate,up")
    assert r.exit_code == 2 and "gate do not exist" in r.output and "up,down" in r.output


def test_bad_recipe_toml_names_line(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text('precision = "bf16-mixed"\nmicro_batch = \n')
    r = _run("estimate", "openai-community/gpt2", "--recipe", str(f))
    assert r.exit_code == 2 and "r.toml" in r.output and "line 2" in r.output


def test_recipe_toml_and_flag_override(tmp_path):
    f = tmp_path / "r.toml"
    f.write_text('precision = "bf16-true"\noptimizer = "sgd"\nmicro_batch = 4\n'
                 'lora_targets = ["q", "v"]\n')
    r = _run("estimate", "openai-community/gpt2", "--recipe", str(f), "--optimizer", "adamw",
             "--format", "json")
    rec = json.loads(r.output)["recipe"]
    assert (rec["precision"], rec["optimizer"], rec["micro_batch"]) == ("bf16-true", "adamw", 4)
    f.write_text('precison = "bf16-true"\n')
    r = _run("estimate", "openai-community/gpt2", "--recipe", str(f))
    assert r.exit_code == 2 and "unknown key 'precison'" in r.output and "precision" in r.output


def test_help_is_fast_and_torch_free():
    """CPU seconds, not wall time: CI runs two test workers on two cores beside other jobs."""
    code = ("import sys, time; t = time.process_time(); from memplan.cli import app; "
            "from typer.testing import CliRunner; CliRunner().invoke(app, ['estimate', '--help']); "
            "assert 'torch' not in sys.modules, 'torch imported on the help path'; "
            "print(time.process_time() - t)")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 3.0  # interpreter start included; the import itself is below:
    assert float(out.stdout.strip()) < 1.0


def test_estimate_does_not_import_torch():
    code = ("import sys; from memplan.api import estimate_from_names; "
            "from memplan import Recipe; "
            "estimate_from_names('Qwen/Qwen3-30B-A3B', Recipe.of(gpus=8, ep=8, zero=1)); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ambiguous_gpu_lists_the_sizes():
    r = _run("estimate", "gpt2", "--gpu", "A100")
    assert r.exit_code == 2
    assert "'A100-40GB'" in r.output and "'A100-80GB'" in r.output


def test_nodes_lists_the_presets_for_node():
    r = _run("nodes", "--format", "json")
    assert r.exit_code == 0
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["DGX-H100"]["gpus"] == 8 and rows["DGX-H100"]["host_ram_gib"] == 2048
    assert all(row["source"] for row in rows.values())
    assert "DGX-H100" in _run("nodes").stdout


def test_guard_keeps_library_prints_off_stdout(capsys):
    """Frameworks that print on import (DeepSpeed's logger writes to stdout) must not corrupt
    the JSON of trace and validate."""
    from memplan.cli_options import guard

    assert guard(lambda: print("library noise") or 7, stdout_to_stderr=True) == 7
    out, err = capsys.readouterr()
    assert out == "" and "library noise" in err


def test_version_prints_and_exits():
    from typer.testing import CliRunner

    from memplan import __version__
    from memplan.cli import app

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"memplan {__version__}"
