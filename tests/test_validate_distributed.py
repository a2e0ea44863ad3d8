"""``memplan validate --nproc 2``: real torchrun runs (gloo, CPU), every rank's live tensor bytes
between steps against memplan's per-rank estimate, DeepSpeed configured from memplan's own
export. The full 6-case run is committed as validation/distributed_2rank.json (command in the
README); CI runs three cases (~20 s each)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("deepspeed", reason="pip install 'memplan[engines]'")

from memplan.validate_dist import BOUND_PCT, DIST_CASES, run_dist_case  # noqa: E402

pytestmark = pytest.mark.slow
CASES = {c.name: c for c in DIST_CASES}
ZERO3_SMALL_BUCKET = (
    "DeepSpeed ZeRO-3 holds ~558 KB more between steps than memplan's persistent items "
    "(-7.9% with a 1e6-element bucket; -0.06% at the default 5e8, where the bucket dominates): "
    "about the size of the gathered embedding and head of the tiny model, not verified")


@pytest.mark.parametrize("name", [
    "deepspeed-zero2-bf16",
    "fsdp2-bf16",
    pytest.param("deepspeed-zero3-bucket1e6",
                 marks=pytest.mark.xfail(strict=True, reason=ZERO3_SMALL_BUCKET)),
])
def test_every_rank_within_bound(name):
    r = run_dist_case(CASES[name], 2)
    assert r.error == "", r.error
    assert len(r.measured) == 2 and all(m > 0 for m in r.measured)
    assert all(abs(e) <= BOUND_PCT for e in r.errors_pct), r.to_dict()


def test_nproc_below_two_is_refused():
    from memplan.errors import ConfigError
    from memplan.validate_dist import validate_distributed

    with pytest.raises(ConfigError, match="at least 2 ranks"):
        validate_distributed(1)
