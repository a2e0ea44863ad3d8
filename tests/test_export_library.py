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
