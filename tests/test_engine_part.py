"""The recipe's engine part (issue #14): ``auto`` is inferred as memplan modelled before the
part existed, named engines refuse what they cannot run, and the knobs round-trip."""

import pytest

from memplan.errors import ConfigError
from memplan.recipe import Engine, EngineKind, Recipe


@pytest.mark.parametrize(("zero", "want"), [(0, "ddp"), (1, "deepspeed"), (2, "deepspeed"),
                                            (3, "deepspeed")])
def test_auto_engine_is_inferred_from_zero_and_said_to_be_assumed(zero, want):
    r = Recipe.of(gpus=8, zero=zero)
    assert r.engine.kind == EngineKind.AUTO
    assert (r.engine_kind, r.engine_assumed) == (want, True)


def test_a_named_engine_is_not_assumed():
    r = Recipe.of(gpus=8, zero=3, engine="fsdp2")
    assert (r.engine_kind, r.engine_assumed) == ("fsdp2", False)


@pytest.mark.parametrize(("keys", "match"), [
    ({"engine": "ddp", "zero": 2}, "engine=ddp cannot run zero=2"),
    ({"engine": "fsdp2", "zero": 1}, "engine=fsdp2 cannot run zero=1"),
    ({"engine": "megatron", "zero": 3}, "engine=megatron cannot run zero=3"),
    ({"engine": "fsdp2", "zero": 3, "offload": "nvme"}, "cannot offload nvme"),
    ({"engine": "fsdp2", "zero": 3, "tp": 2}, "no built-in tensor"),
    ({"engine": "deepspeed", "zero": 3, "pp": 2}, "pipeline parallelism"),
])
def test_named_engines_refuse_what_they_cannot_run(keys, match):
    with pytest.raises(ConfigError, match=match):
        Recipe.of(gpus=8, **keys)


def test_engine_knobs_validate_and_round_trip():
    with pytest.raises(ConfigError, match="reduce_bucket_size=0"):
        Engine(reduce_bucket_size=0)
    with pytest.raises(ConfigError, match="engine='fsdp3'.*fsdp2"):
        Recipe.of(engine="fsdp3")
    r = Recipe.of(gpus=8, zero=3, engine="deepspeed", overlap_comm=True,
                  stage3_max_live_parameters=10**8)
    assert Recipe.from_dict(r.to_dict()) == r
