"""Shared fixtures: small real models from the catalog, a fixed GPU."""

from __future__ import annotations

import os

import pytest

from memplan import get_device, load_model


os.environ.setdefault("MEMPLAN_JOBS", "1")
"""``plan`` and ``size`` search in one process here (their default is one worker per core): the
tests already run in two xdist workers, and forked searches would only add the memo work each
worker repeats. ``tests/test_plan.py`` runs the workers (``workers=2``) and compares the rows."""


@pytest.fixture(scope="session")
def llama8b():
    return load_model("meta-llama/Llama-3.1-8B")


@pytest.fixture(scope="session")
def h100():
    return get_device("H100-80GB")


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """Tests never reach the Hub: huggingface_hub honours HF_HUB_OFFLINE, and so does memplan."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def pytest_itemcollected(item):
    """``full`` tests (a matrix or a re-measurement) run only with MEMPLAN_FULL=1: CI keeps to its
    12 minutes, and the last full run's result is committed in validation/full_tests.md."""
    if "full" in item.keywords and not os.environ.get("MEMPLAN_FULL"):
        item.add_marker(pytest.mark.skip(
            reason="kept out of CI's time budget: MEMPLAN_FULL=1 runs it "
                   "(last result: validation/full_tests.md)"))


def _cache_typer_commands() -> None:
    """Build each Typer app's click command once per test process. ``typer.testing.CliRunner``
    rebuilds it from the functions' signatures on every ``invoke`` (about 60 ms for memplan's
    app: three quarters of an invocation that stops at a bad argument), and the tests invoke the
    CLI thousands of times. The command is the same object the real ``memplan`` builds once
    per process; the app is not changed after import."""
    import typer.testing

    build = getattr(typer.testing, "_get_command", None)
    if build is None:  # another typer layout: keep its own behaviour
        return
    built: dict[int, tuple[object, object]] = {}

    def cached(app):  # type: ignore[no-untyped-def]
        hit = built.get(id(app))
        if hit is None or hit[0] is not app:
            hit = built[id(app)] = (app, build(app))
        return hit[1]

    typer.testing._get_command = cached


_cache_typer_commands()

SHARED_FILES = {
    "tests/golden/test_memory_published.py": "golden comparison",
    "tests/test_underestimates.py": "golden comparison",
    "tests/test_accuracy_claims.py": "golden comparison",
    "tests/golden/test_throughput_published.py": "golden comparison",
    "tests/test_activation_accuracy.py": "golden comparison",
}
"""Test files that one xdist worker runs one after another: ``scripts/accuracy_claims.py`` (and
``scripts/underestimates.py``) check tables computed from the whole golden comparison
(``test_memory_published._predicted``, about 50 CPU s), the throughput rows
(``validate.throughput.evaluate``) and the CPU matrix (``test_activation_accuracy._estimate``),
each kept in the process, which another worker would compute again."""


def pytest_xdist_make_scheduler(config, log):  # type: ignore[no-untyped-def]
    """``--dist loadfile`` (CI's), with the files of ``SHARED_FILES`` sent as one unit."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SHARED_FILES.get(scope, scope)

    return SharedFiles(config, log)
