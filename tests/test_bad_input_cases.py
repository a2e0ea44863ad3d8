"""Issue #15, sections 2-3: one regression test per bad input a new user tried. Each must end in
exit 2 with a message naming the value and the rule (never a traceback), or, where the input is
legal but surprising, exit 0 with a note. All run in-process through the CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memplan.cli import app
from memplan.model.catalog import find

runner = CliRunner()
LLAMA = "meta-llama/Llama-3.1-8B"
MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"


def _run(*args: str):
    r = runner.invoke(app, list(args))
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"traceback for {args!r}") from r.exception
    return r


def _refused(*args: str, says: tuple[str, ...]):
    r = _run(*args)
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    for s in says:
        assert s in text, (s, text)
    return text


def _config(tmp_path: Path, base: str, **changes) -> str:
    data = {**find(base).config(), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


# ---- section 2: crashes -------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "1e308"])
def test_moe_capacity_factor_not_finite_or_huge(value):
    _refused("estimate", MIXTRAL, "--moe-capacity-factor", value,
             says=("moe_capacity_factor=", "from 0 to 1024",
                   "Fix: give --moe-capacity-factor (moe_capacity_factor in a recipe file) a value"))


@pytest.mark.parametrize("key,value,says", [
    ("num_attention_heads", 0, "num_attention_heads=0 is out of range"),
    ("intermediate_size", -14336, "intermediate_size=-14,336 is out of range"),
    ("hidden_size", -1, "hidden_size=-1 is out of range"),
])
def test_config_zero_or_negative_size_crash(tmp_path, key, value, says):
    _refused("estimate", _config(tmp_path, LLAMA, **{key: value}),
             says=(says, "Fix the value in the config.json"))


@pytest.mark.parametrize("value", [[], {"a": 1}, 3])
def test_config_activation_not_a_name(tmp_path, value):
    """Found by test_bad_input_properties: ``"hidden_act": []`` reached the layer signatures as
    an unhashable list and raised a TypeError."""
    _refused("estimate", _config(tmp_path, LLAMA, hidden_act=value),
             says=("'hidden_act' must name an activation function as a string",
                   "Fix the value in the config.json"))


def test_config_negative_hidden_under_trace(tmp_path):
    pytest.importorskip("torch")
    _refused("trace", _config(tmp_path, LLAMA, hidden_size=-1), "--device", "cpu",
             says=("hidden_size=-1 is out of range",))


def test_model_name_5000_characters():
    _refused("estimate", "x" * 5000, says=("5,000 characters long", "Fix:"))


def test_model_factory_that_needs_arguments():
    pytest.importorskip("torch")
    _refused("estimate", "json:loads", says=("loads() failed with TypeError", "no arguments"))


@pytest.mark.parametrize("name", [":", "a:", ":b", "1x:y", "a b:c"])
def test_model_argument_not_a_factory(name):
    _refused("estimate", name, says=("is not a model factory reference", "package.module:function"))


def test_measure_out_unwritable():
    _refused("measure", "--out", "/proc/forbidden", "--", "true",
             says=("--out '/proc/forbidden' cannot be created", "Fix:"))


def test_measure_missing_executable(tmp_path):
    _refused("measure", "--out", str(tmp_path), "--", "/nonexistent/cmd",
             says=("'/nonexistent/cmd' is not an executable file",))


# ---- section 3: nonsense accepted ---------------------------------------------------------

@pytest.mark.parametrize("key,value,says", [
    ("hidden_size", 1e30, "'hidden_size' must be a whole number"),
    ("num_hidden_layers", -3, "num_hidden_layers=-3 is out of range"),
    ("num_hidden_layers", 0, "num_hidden_layers=0 is out of range"),
    ("vocab_size", 0, "vocab_size=0 is out of range"),
    ("num_key_value_heads", 0, "num_key_value_heads=0 is out of range"),
    ("num_key_value_heads", 5, "num_key_value_heads=5 does not divide num_attention_heads=32"),
    ("hidden_size", 4097, "hidden_size=4,097 is not divisible by num_attention_heads=32"),
    ("hidden_size", True, "'hidden_size' must be a whole number"),
    ("vocab_size", "128256", "'vocab_size' must be a whole number"),
])
def test_config_absurd_sizes(tmp_path, key, value, says):
    _refused("estimate", _config(tmp_path, LLAMA, **{key: value}), says=(says,))


def test_moe_zero_experts(tmp_path):
    _refused("estimate", _config(tmp_path, MIXTRAL, num_local_experts=0),
             says=("num_local_experts=0 is out of range",))


def test_moe_top_k_above_experts(tmp_path):
    _refused("estimate", _config(tmp_path, MIXTRAL, num_experts_per_tok=20),
             says=("num_experts_per_tok=20 is more than the 8 experts",))


def test_lora_rank_absurd():
    _refused("estimate", LLAMA, "--method", "lora", "--lora-rank", "100000",
             says=("lora_rank=100000", "from 1 to 65536"))


@pytest.mark.parametrize("flag,value", [("--micro-batch", "1000000000"),
                                        ("--micro-batch", "100000000000000000000"),
                                        ("--seq-len", "10000000000000")])
def test_batch_and_sequence_absurd(flag, value):
    _refused("estimate", LLAMA, flag, value, says=(f"={value} must be a whole number from 1 to",))


def test_sequence_beyond_context_warns():
    r = _run("estimate", LLAMA, "--seq-len", "262144", "--format", "json")
    assert r.exit_code == 0
    notes = json.loads(r.output)["model"]["notes"]
    assert any("beyond the model's context" in n and "131,072" in n for n in notes), notes


def test_empty_gpu_is_not_h100():
    _refused("estimate", LLAMA, "--gpu", "", says=("GPU '' is not in the catalog",))


def test_gpus_not_whole_nodes():
    _refused("estimate", LLAMA, "--gpus", "8", "--gpus-per-node", "3",
             says=("gpus=8 is not a whole number of nodes of gpus_per_node=3", "gpus=6 or 9"))


@pytest.mark.parametrize("flags,says", [
    (("--attention", "flash"), "FlashAttention 2 needs Ampere"),
    (("--precision", "bf16-mixed"), "bf16 needs Ampere"),
])
def test_v100_cannot_run(flags, says):
    r = _run("estimate", "meta-llama/Llama-3.2-1B", "--gpu", "V100-32GB", *flags,
             "--format", "json")
    assert r.exit_code == 0
    assert any(says in n for n in json.loads(r.output)["model"]["notes"])


def test_trace_modules_negative():
    _refused("trace", "meta-llama/Llama-3.2-1B", "--modules", "-1",
             says=("--modules=-1 must be a whole number >= 0",))


@pytest.mark.parametrize("value", ["nan", "0", "-1", "inf"])
def test_measure_interval(tmp_path, value):
    _refused("measure", "--out", str(tmp_path), "--interval", value, "--", "true",
             says=(f"--interval={float(value)!r}", "above 0"))


def test_host_pin_memory_string(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[host]\npin_memory = "yes"\n')
    _refused("estimate", LLAMA, "--recipe", str(recipe),
             says=("host.pin_memory='yes' must be true or false",))


def test_measure_against_checked_before_running(tmp_path):
    bad = tmp_path / "notjson.json"
    bad.write_text("not json")
    marker = tmp_path / "ran"
    text = _refused("measure", "--out", str(tmp_path / "o"), "--against", str(bad), "--",
                    "touch", str(marker), says=("--against", "malformed JSON"))
    assert not marker.exists(), "the command ran before --against was checked"
    assert "notjson.json" in "".join(text.split())  # the console may wrap a long path


def test_measure_against_json_not_a_report(tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text('{"a": 1}')
    _refused("measure", "--out", str(tmp_path / "o"), "--against", str(bad), "--", "true",
             says=("not a memplan estimate/trace report",))


def test_measure_without_command(tmp_path):
    _refused("measure", "--out", str(tmp_path), says=("no command to measure",))


def test_no_subcommand():
    r = _run()
    assert r.exit_code == 2 and "Usage:" in r.output and "estimate" in r.output


def test_pipeline_with_one_micro_batch_warns():
    r = _run("estimate", LLAMA, "--gpus", "4", "--pp", "4", "--format", "json")
    assert r.exit_code == 0
    assert any("pipeline never fills" in n for n in json.loads(r.output)["model"]["notes"])


def test_every_catalog_model_passes_the_size_checks():
    from memplan.model.catalog import catalog
    from memplan.model.sanity import check_sizes

    for entry in catalog().values():
        check_sizes(entry.config(), entry.id)  # raises on a false alarm
