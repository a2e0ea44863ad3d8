"""The recipe as composed parts: validation, the flat TOML/JSON table, replacing one part, and
the field description the CLI (and later the web form) is generated from."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from memplan.api import load_job
from memplan.cli import app
from memplan.errors import ConfigError
from memplan.recipe import KEYS, PARTS, Parallelism, PrecisionKind, Recipe
from memplan.recipe.describe import describe_fields

VARIED = [
    {},
    {"precision": "bf16-true", "method": "lora", "lora_rank": 8, "lora_targets": "q,v",
     "adapter_dtype": "bf16", "notes": ["a", "b"]},
    {"method": "qlora", "quant": "nf4-dq", "optimizer": "paged-adamw-8bit"},
    {"gpus": 64, "tp": 8, "sequence_parallel": True, "pp": 4, "pp_virtual": 2, "zero": 1,
     "checkpointing": "full", "loss": "fused", "moe_capacity_factor": 1.25},
    {"gpus": 16, "zero": 3, "hybrid_shard": 8, "offload": "nvme", "expandable_segments": True,
     "grad_dtype": "fp32"},
]


@pytest.mark.parametrize("values", VARIED)
def test_flat_table_round_trips_through_dict_toml_and_json(values, tmp_path):
    r = Recipe.from_dict(values)
    assert Recipe.from_dict(r.to_dict()) == r
    assert Recipe.from_dict(tomllib.loads(r.to_toml())) == r
    assert Recipe.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    (tmp_path / "r.toml").write_text(r.to_toml())
    (tmp_path / "r.json").write_text(json.dumps(r.to_dict()))
    assert Recipe.from_file(tmp_path / "r.toml") == Recipe.from_file(tmp_path / "r.json") == r
    assert Recipe.from_file(tmp_path / "r.toml").notes == r.notes


def test_choices_are_enums_and_strings_compare_equal():
    r = Recipe.of(precision="bf16-true")
    assert r.precision.kind is PrecisionKind.BF16_TRUE and r.precision.kind == "bf16-true"


def test_replace_one_part_keeps_the_others_and_revalidates():
    r = Recipe.of(gpus=8, zero=3, method="lora", micro_batch=4)
    wide = replace(r, parallelism=replace(r.parallelism, tp=2))
    assert wide.parallelism.dp == 4 and wide.method is r.method and wide.batch is r.batch
    assert r.with_keys(tp=4).parallelism.tp == 4
    with pytest.raises(ConfigError, match="not divisible by tp"):
        replace(r, parallelism=replace(r.parallelism, tp=3))


def test_part_tables_are_accepted():
    r = Recipe.from_dict({"parallelism": {"gpus": 4, "tp": 2}, "method": {"kind": "lora"}})
    assert r == Recipe.of(gpus=4, tp=2, method="lora")


def test_every_problem_at_once_across_parts_with_close_matches():
    with pytest.raises(ConfigError) as e:
        Recipe.of(precison="bf16", tp=0, zero=5, optimizer="adamm", lora_targets="q,x",
                  sequence_parallel="yes")
    text = str(e.value)
    assert len(e.value.problems) == 6
    for fix in ("Did you mean 'precision'", "Did you mean 'adam'", "from 0 to 3", "tp=0",
                "'x' is not one of", "true or false"):
        assert fix in text


def test_flags_over_file_are_validated_once_after_merging(tmp_path):
    """A file that is only valid with the flags on top (hybrid_shard needs zero=3) loads."""
    path = tmp_path / "r.toml"
    path.write_text("hybrid_shard = 8\n[host]\nworkers = 4\n")
    recipe, setup = load_job(path, {"zero": 3, "gpus": 16}, {"prefetch": 3})
    assert recipe.parallelism.hybrid_shard == 8 and setup.workers == 4 and setup.prefetch == 3


def test_description_covers_every_key_with_help_and_default():
    infos = describe_fields()
    assert [i.key for i in infos] == [*KEYS, "notes"]
    assert len({i.key for i in infos}) == len(infos)
    for i in infos:
        assert i.help, i.key
        assert i.type in ("str", "int", "float", "bool", "list")
    by = {i.key: i for i in infos}
    assert by["zero"].minimum == 0 and by["zero"].maximum == 3
    assert by["precision"].choices[0] == "32-true" and by["precision"].default == "bf16-mixed"
    assert set(PARTS) == {i.part for i in infos} - {""}


def test_every_recipe_key_is_a_cli_flag_with_its_docstring():
    out = CliRunner().invoke(app, ["estimate", "--help"], env={"COLUMNS": "400"}).output
    for i in describe_fields():
        assert "--" + i.key.replace("_", "-") in out, i.key


def test_cli_flag_reaches_a_field_missing_before():
    r = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-3.2-1B", "--gpus", "16",
                                 "--zero", "3", "--hybrid-shard", "8", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["recipe"]["hybrid_shard"] == 8


def test_parallelism_derived_sizes():
    p = Parallelism(gpus=64, tp=4, pp=2, cp=2, ep=2, zero=1)
    assert (p.dp, p.shard_degree, p.expert_shard_degree) == (4, 8, 4)


def test_facts_table_has_a_row_per_optimizer_and_precision():
    """Every recipe choice has its facts row; the tracer's list is the rows with a torch class."""
    from memplan.facts import dtypes, optimizer_table
    from memplan.recipe import OPTIMIZERS, PRECISIONS
    from memplan.trace.workload import OPTIMIZERS as TRACEABLE

    assert set(optimizer_table()) == set(OPTIMIZERS)
    assert all(f.source for f in optimizer_table().values())
    assert {n for n, f in optimizer_table().items() if f.torch} == set(TRACEABLE)
    for p in PRECISIONS:
        for zero in (0, 3):
            d = dtypes(Recipe.of(precision=p, zero=zero))
            assert d.compute in ("fp32", "bf16", "fp16")
    assert dtypes(Recipe.of(precision="bf16-mixed")).master is None
    assert dtypes(Recipe.of(precision="bf16-mixed", zero=1)).master == "fp32"
