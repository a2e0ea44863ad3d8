"""Shared fixtures: small real models from the catalog, a fixed GPU."""

from __future__ import annotations

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
