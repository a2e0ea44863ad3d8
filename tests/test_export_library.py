"""memplan.export as a library: what `memplan validate --nproc` (issue #14 item 4) configures its
distributed runs from."""

import pytest

from memplan.errors import ConfigError
from memplan.export import TARGETS, ExportContext, export, get_target, read_engine_text, write
from memplan.model import load_model
from memplan.recipe import Recipe


@pytest.mark.parametrize("target", list(TARGETS))
def test_write_is_the_exported_text_and_reads_back(target):
    recipe = Recipe.of(zero=1 if target != "torchtitan" else 0, gpus=4, micro_batch=2,
                       grad_accum=3)
    ctx = ExportContext(model=load_model("meta-llama/Llama-3.1-8B"))
    text = write(recipe, target, ctx)
    done = export(recipe, target, ctx)
    assert text == done.text
    keys = read_engine_text(text, target, "<test>", hidden_size=4096).keys
    engine = get_target(target).engine or str(recipe.engine_kind)
    assert Recipe.from_dict({**keys, **done.not_carried}) == recipe.with_keys(engine=engine)


def test_unknown_target_names_close_matches():
    with pytest.raises(ConfigError, match="Did you mean 'deepspeed'"):
        get_target("deepsped")


def test_estimate_table_shows_what_from_read_resolved_and_ignored(tmp_path):
    import json

    from typer.testing import CliRunner

    from memplan.cli import app

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
                                "gradient_clipping": 1.0}))
    r = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-3.2-1B", "--from", str(path),
                                 "--gpus", "4"], catch_exceptions=False, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert f"read from {path} as deepspeed" in r.stdout
    assert f"auto: reduce_bucket_size=auto = hidden_size^2 = {2048 ** 2:,}" in r.stdout
    assert "not modelled by memplan (ignored): gradient_clipping" in r.stdout


@pytest.mark.parametrize(("target", "engine", "impl", "written"), [
    ("hf-trainer", "fsdp2", "fused", '"optim": "adamw_torch_fused"'),
    ("hf-trainer", "fsdp2", "auto", '"optim": "adamw_torch"'),
    ("torchtitan", "torchtitan", "foreach", 'implementation = "foreach"'),
    ("torchtitan", "torchtitan", "fused", 'implementation = "fused"')])
def test_optimizer_impl_is_written_and_read_back(target, engine, impl, written):
    """HF Trainer's ``adamw_torch_fused`` and torchtitan's ``optimizer.implementation`` carry
    the torch.optim path; torchtitan's auto (its own default, fused) is left unwritten."""
    recipe = Recipe.of(gpus=8, zero=3, engine=engine, optimizer_impl=impl)
    out = export(recipe, target)
    assert written in out.text
    assert "optimizer_impl" not in out.not_carried
    back = read_engine_text(out.text, target, "test")
    assert back.keys.get("optimizer_impl", "auto") == impl
