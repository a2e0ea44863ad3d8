"""Shared fixtures: small real models from the catalog, a fixed GPU."""

from __future__ import annotations

import os

import pytest

from memplan import get_device, load_model


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


SHARED_FIGURES = {"test_memory_published.py", "test_throughput_published.py",
                  "test_underestimates.py", "test_accuracy_claims.py"}
"""Modules that read the same golden estimates (cached per process): one xdist worker runs them."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """``full`` tests (a matrix or a re-measurement) run only with MEMPLAN_FULL=1: CI keeps to its
    12 minutes, and the last full run's result is committed in validation/full_tests.md.
    Under ``pytest -n 2 --dist loadgroup`` (the README's test command) each module is one group,
    so its module fixtures run once, and the modules of ``SHARED_FIGURES`` share one."""
    skip = pytest.mark.skip(reason="kept out of CI's time budget: MEMPLAN_FULL=1 runs it "
                                   "(last result: validation/full_tests.md)")
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group(
            "golden-figures" if name in SHARED_FIGURES else str(item.path)))
        if "full" in item.keywords and not os.environ.get("MEMPLAN_FULL"):
            item.add_marker(skip)
