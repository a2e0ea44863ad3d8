"""Issue #12 item 4: catalog variants, search and filters, families not yet estimable, and an
unknown Hub id failing at once without network."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from memplan.api import catalog_rows
from memplan.cli import app
from memplan.errors import ConfigError, UnknownModel
from memplan.model import catalog, load_model
from memplan.model.catalog import search
from memplan.model.sizes import parse_count

runner = CliRunner()


def test_variant_shares_its_base_config_with_patches() -> None:
    chat = catalog()["meta-llama/Llama-3.1-8B-Instruct"]
    assert chat.base == "meta-llama/Llama-3.1-8B" and chat.file == "meta-llama__Llama-3.1-8B.json"
    assert chat.config() == catalog()["meta-llama/Llama-3.1-8B"].config()
    distill = catalog()["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"].config()
    assert distill["tie_word_embeddings"] is False
    assert catalog()["Qwen/Qwen2.5-1.5B"].config()["tie_word_embeddings"] is True
    v02 = catalog()["mistralai/Mistral-7B-Instruct-v0.2"].config()
    assert v02["sliding_window"] is None and v02["rope_theta"] == 1e6


@pytest.mark.parametrize("text, family, lo, hi, expect, reject", [
    ("llama 3.1 instruct", None, None, None, "meta-llama/Llama-3.1-8B-Instruct",
     "meta-llama/Llama-3.1-8B"),
    ("", "qwen3", None, "2B", "Qwen/Qwen3-1.7B-Base", "Qwen/Qwen3-8B"),
    ("distill", None, "10B", "40B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B",
     "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"),
    ("SMOLLM2_135m", None, None, None, "HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen3-8B"),
])
def test_search_by_words_family_and_size(text, family, lo, hi, expect, reject) -> None:
    ids = [e.id for e in search(text, family=family,
                                min_params=parse_count(lo, "lo") if lo else None,
                                max_params=parse_count(hi, "hi") if hi else None)]
    assert expect in ids and reject not in ids


def test_parse_count() -> None:
    assert parse_count("7B", "x") == 7 * 10**9 and parse_count("500m", "x") == 5 * 10**8
    with pytest.raises(ConfigError, match="not a parameter count"):
        parse_count("7 GB", "--max-params")


def test_unbuildable_family_is_listed_not_estimable(monkeypatch) -> None:
    """Every catalog family has a builder since issue #12 item 1 (phi, starcoder2, qwen2_moe);
    a family without one (phi's builder removed here) is listed with the reason."""
    from memplan.model import hf

    rows = {r["id"]: r for r in catalog_rows("phi-2")}
    assert rows["microsoft/phi-2"]["estimable"] is True
    assert rows["microsoft/phi-2"]["params"] == 2779683840
    monkeypatch.delitem(hf.BUILDERS, "phi")
    rows = {r["id"]: r for r in catalog_rows("phi-2")}
    row = rows["microsoft/phi-2"]
    assert row["estimable"] is False and "'phi' is not supported yet" in row["why"]
    assert row["published_params"] == 2779683840


def test_cli_models_search_and_bad_size() -> None:
    res = runner.invoke(app, ["models", "--search", "gemma-3", "--max-params", "5B"])
    assert res.exit_code == 0 and "google/gemma-3-4b-it" in res.output
    assert "gemma-3-12b" not in res.output
    res = runner.invoke(app, ["models", "--family", "starcoder2", "--format", "json"])
    assert res.exit_code == 0
    assert [r["estimable"] for r in json.loads(res.output)] == [True] * 4  # issue #12 item 1
    res = runner.invoke(app, ["models", "--min-params", "lots"])
    assert res.exit_code == 2 and "not a parameter count" in res.output
    res = runner.invoke(app, ["models", "--search", "no-such-model-xyz"])
    assert res.exit_code == 2 and "no catalog model matches" in res.output


def test_unknown_hub_id_fails_fast_without_network(monkeypatch) -> None:
    """The conftest sets HF_HUB_OFFLINE; here it is unset and the endpoint is a closed local
    port, as on a machine without network: huggingface_hub alone retries for ~24 s."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-memplan-test")
    start = time.monotonic()
    with pytest.raises(UnknownModel) as err:
        load_model("someorg/Some-Model-7B")
    assert time.monotonic() - start < 10  # not huggingface_hub's ~24 s of retries
    text = str(err.value)
    assert "hf download someorg/Some-Model-7B config.json --local-dir Some-Model-7B" in text
    assert "Some-Model-7B/config.json" in text and "not reachable" in text
