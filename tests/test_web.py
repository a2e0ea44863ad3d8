"""`memplan serve` through Starlette's TestClient: every recipe control, live updates, URL state,
comparisons, and every kind of bad input (message in the page, never a 500)."""

import json
import re
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from memplan.recipe.describe import describe_fields  # noqa: E402
from memplan.web import create_app  # noqa: E402
from memplan.web.fields import recipe_fields  # noqa: E402
from memplan.web.state import MAX_CONFIG_BYTES, MAX_PINS  # noqa: E402

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "vocab_size": 1000, "max_position_embeddings": 512}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        yield c


def _error(html):
    m = re.search(r'data-error="1"><b>Error:</b> (.*?)</div>', html, re.S)
    return " ".join(m.group(1).split()) if m else None


def _kpi(html, key):
    return re.search(rf'data-k="{key}"[^>]*>([^<]+)<', html).group(1)


def test_page_has_a_control_for_every_recipe_field(client):
    r = client.get("/")
    assert r.status_code == 200
    names = set(re.findall(r'data-field="([a-z0-9_]+)"', r.text))
    assert {f.key for f in describe_fields()} - {"notes"} <= names
    assert {"model", "gpu", "node"} <= names
    # choices offered are the recipe's; numbers carry bounds
    assert re.search(r'<select name="precision".*?<option value="bf16-mixed" selected>', r.text,
                     re.S)
    assert re.search(r'name="micro_batch" data-field="micro_batch" value="1" min="1" max="65536"',
                     r.text)
    assert '<script src="/static/htmx.min.js">' in r.text
    assert "Content-Security-Policy" in r.headers and "hx-trigger" in r.text


def test_field_help_comes_from_the_recipe_docstrings():
    by_name = {s.name: s for s in recipe_fields()}
    assert "Tokens per sequence" in by_name["seq_len"].help
    assert by_name["zero"].minimum == 0 and by_name["zero"].maximum == 3
    assert by_name["loss"].choices == ("standard", "chunked", "fused", "chunked-head", "chunked-ce")


def test_live_update_returns_the_fragment_and_the_url(client):
    a = client.post("/result", data={"model": "meta-llama/Llama-3.2-1B", "micro_batch": "1"})
    b = client.post("/result", data={"model": "meta-llama/Llama-3.2-1B", "micro_batch": "8"})
    assert a.status_code == b.status_code == 200
    assert "<html" not in a.text  # a fragment
    assert _kpi(a.text, "peak_allocated") != _kpi(b.text, "peak_allocated")
    url = b.headers["HX-Replace-Url"]
    assert parse_qs(urlsplit(url).query) == {"model": ["meta-llama/Llama-3.2-1B"],
                                             "micro_batch": ["8"]}
    # the URL gives back the same page
    page = client.get(url)
    assert _kpi(page.text, "peak_allocated") == _kpi(b.text, "peak_allocated")
    assert 'name="micro_batch" data-field="micro_batch" value="8"' in page.text


def test_verdict_headroom_max_micro_batch_and_panels(client):
    r = client.get("/?model=meta-llama/Llama-3.1-8B&gpu=H100-80GB&node=DGX-H100&gpus=8&zero=3"
                   "&checkpointing=full")
    assert r.status_code == 200, _error(r.text)
    est = client.get("/api/estimate?model=meta-llama/Llama-3.1-8B&node=DGX-H100&gpus=8&zero=3"
                     "&checkpointing=full").json()
    assert 'data-fits="yes"' in r.text and est["gpu"]["fits"]
    # the largest micro-batch follows in a second request (its search costs several estimates)
    mmb_url = re.search(r'data-pending="1" hx-get="([^"]+)"', r.text).group(1)
    mmb = client.get(mmb_url.replace("&amp;", "&"))
    assert _kpi(mmb.text, "max_micro_batch") == str(est["gpu"]["max_micro_batch"])
    assert f'data-k="headroom" data-bytes="{est["gpu"]["headroom_bytes"]}"' in r.text
    for panel in ("host", "nvme", "time"):
        assert f'data-panel="{panel}"' in r.text
    assert r.text.count('data-chart="timeline"') == 1


def test_pin_compare_and_unpin(client):
    base = {"model": "meta-llama/Llama-3.2-1B"}
    r = client.post("/result", data={**base, "action": "pin"})
    pins = re.findall(r'<input type="hidden" name="pin" value="([^"]*)"', r.text)
    assert len(pins) == 1
    r = client.post("/result", data={**base, "micro_batch": "4", "pin": pins})
    assert 'data-compare="2"' in r.text and "micro_batch=4" in r.text
    cols = re.findall(r'data-col="(\d)" data-k="peak_allocated">([^<]+)<', r.text)
    assert cols[0][1] != cols[1][1]
    assert parse_qs(urlsplit(r.headers["HX-Replace-Url"]).query)["pin"] == pins
    assert r.text.count("data-series=") >= 2  # comparison bars, one series per recipe
    r = client.post("/result", data={**base, "micro_batch": "4", "pin": pins,
                                     "action": "unpin:0"})
    assert "data-compare" not in r.text and 'name="pin"' not in r.text


def test_too_many_pins(client):
    r = client.get("/?" + "&".join(f"pin=micro_batch%3D{k}" for k in range(1, MAX_PINS + 2)))
    assert r.status_code == 422 and "Remove one" in _error(r.text)


def test_pasted_and_uploaded_config(client):
    r = client.post("/result", data={"config_json": json.dumps(TINY), "model": "ignored"})
    assert r.status_code == 200 and "HX-Replace-Url" not in r.headers
    assert 'data-k="peak_allocated"' in r.text
    r2 = client.post("/result", data={"model": "x"},
                     files={"config_file": ("config.json", json.dumps(TINY).encode(),
                                            "application/json")})
    assert r2.status_code == 200
    assert _kpi(r.text, "peak_allocated") == _kpi(r2.text, "peak_allocated")


@pytest.mark.parametrize("url, message", [
    ("/?model=not-a-model", "is not in the catalog"),
    ("/?model=./secrets/config.json", "is not in the catalog"),  # no paths on the page
    ("/?model=os:system", "is not in the catalog"),  # no factories: no model code runs
    ("/?gpu=H1000", "H1000"),
    ("/?node=nonsense", "nonsense"),
    ("/?precision=fp4", "precision"),
    ("/?micro_batch=abc", "is not a whole number"),
    ("/?micro_batch=99999999", "is out of range"),
    ("/?moe_capacity_factor=nan", "is out of range"),
    ("/?gpus=8&tp=3", "not divisible by tp*pp*cp=3"),
    ("/?sequence_parallel=maybe", "must be true or false"),
    ("/?model=" + "a" * 300, "the page accepts up to 200"),
    ("/?host_ram=lots", "host"),
])
def test_bad_input_shows_the_cli_message(client, url, message):
    r = client.get(url)
    assert r.status_code == 422
    assert message in _error(r.text), _error(r.text)
    assert "Traceback" not in r.text
    frag = client.get(url.replace("/?", "/result?", 1))
    assert frag.status_code == 422 and message in _error(frag.text)


def test_messages_match_the_cli(client):
    from typer.testing import CliRunner

    from memplan.cli import app

    cli = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-3.2-1B", "--gpus", "8",
                                   "--tp", "3"])
    cli_msg = " ".join(cli.output.split("Error:", 1)[1].split())
    assert _error(client.get("/?model=meta-llama/Llama-3.2-1B&gpus=8&tp=3").text) == cli_msg


@pytest.mark.parametrize("config, message", [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"model_type": "nonsense-arch"}), "nonsense-arch"),
    (json.dumps({**TINY, "hidden_size": "wide"}), "config.json"),
    (json.dumps({**TINY, "num_attention_heads": 0}), "config.json"),
])
def test_malformed_configs(client, config, message):
    r = client.post("/result", data={"config_json": config})
    assert r.status_code == 422, r.text[:300]
    assert message in _error(r.text)


def test_huge_config_and_body_limits(client):
    big = json.dumps({**TINY, "pad": "x" * MAX_CONFIG_BYTES})
    r = client.post("/result", data={"config_json": big})
    assert r.status_code in (413, 422) and "accepts up to" in _error(r.text)
    r = client.post("/result", files={"config_file": ("config.json", big.encode(), "application/json")})
    assert r.status_code in (413, 422) and "accepts up to" in _error(r.text)
    r = client.post("/result", content=b"x" * (2 * MAX_CONFIG_BYTES),
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413 and "accepts up to" in _error(r.text)
    r = client.get("/?pin=" + "a" * 30000)
    assert r.status_code == 422 and "characters long" in _error(r.text)


def test_report_and_json_endpoints(client):
    r = client.get("/report?model=meta-llama/Llama-3.2-1B&micro_batch=2")
    assert r.status_code == 200 and r.text.startswith("<!doctype html>")
    assert 'id="memplan-data"' in r.text
    j = client.get("/api/estimate?model=meta-llama/Llama-3.2-1B&micro_batch=2")
    assert j.json()["recipe"]["micro_batch"] == 2
    bad = client.get("/api/estimate?model=nope")
    assert bad.status_code == 422 and "not in the catalog" in bad.json()["error"]
    assert client.get("/static/htmx.min.js").text.startswith("var htmx=")


def test_the_page_never_imports_torch():
    import subprocess
    import sys

    code = ("import sys\nfrom starlette.testclient import TestClient\n"
            "from memplan.web import create_app\nc = TestClient(create_app())\n"
            "assert c.get('/?model=meta-llama/Llama-3.2-1B').status_code == 200\n"
            "assert c.get('/report?model=meta-llama/Llama-3.2-1B').status_code == 200\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_serve_binds_loopback_by_default(monkeypatch):
    from typer.testing import CliRunner

    import memplan.web
    from memplan.cli import app

    seen = {}
    monkeypatch.setattr(memplan.web, "serve", lambda **kw: seen.update(kw))
    r = CliRunner().invoke(app, ["serve", "--port", "9999"])
    assert r.exit_code == 0, r.output
    assert seen == {"host": "127.0.0.1", "port": 9999}
    assert "http://127.0.0.1:9999/" in r.output


def test_every_default_is_inside_the_page_bounds():
    """A default outside its control's bounds makes the browser refuse the whole form."""
    from memplan.web.fields import recipe_fields

    for s in recipe_fields():
        if s.kind in ("int", "float"):
            assert s.minimum <= s.default <= s.maximum, s
