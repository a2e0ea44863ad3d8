"""`memplan report RESULT.json --html OUT`: one self-contained file from any memplan JSON."""

import json
import re
from dataclasses import replace

import pytest
from typer.testing import CliRunner

pytest.importorskip("jinja2")

from memplan.api import Machine, estimate_from_names, load_recipe  # noqa: E402
from memplan.breakdown import Breakdown  # noqa: E402
from memplan.cli import app  # noqa: E402
from memplan.errors import ConfigError  # noqa: E402
from memplan.report.html import render_report  # noqa: E402
from memplan.units import fmt_bytes  # noqa: E402


@pytest.fixture(scope="module")
def estimate_json():
    return estimate_from_names("meta-llama/Llama-3.2-1B", load_recipe(None, {"micro_batch": 2}),
                               Machine(gpu="A100-80GB")).to_dict()


def _measured(d):
    """A 'measurement' of the same run: the estimate with its source changed and 10% more
    activations at every moment (enough to give the comparison non-zero errors)."""
    b = Breakdown.from_dict(d)
    m = json.loads(json.dumps(replace(b, source="measure", max_micro_batch=None, host=None,
                                      nvme=None, time=None).to_dict()))
    rank = m["gpu"]["per_rank"][0]
    for mo in rank["timeline"]:
        extra = mo["categories"].get("activations", 0) // 10
        mo["categories"]["activations"] = mo["categories"].get("activations", 0) + extra
        mo["allocated_bytes"] += extra
    return m


def _outside_refs(html):
    """Every URL the page would fetch (src/href/url()), other than fragments and data:."""
    refs = re.findall(r'(?:src|href)\s*=\s*["\']([^"\']+)', html) + re.findall(
        r"url\(([^)]+)\)", html)
    return [r for r in refs if not r.startswith(("#", "data:"))]


def test_report_is_one_offline_file_with_charts_numbers_and_data(estimate_json):
    html = render_report(estimate_json)
    assert _outside_refs(html) == []
    assert "<script src" not in html and "<link" not in html
    assert "@import" not in html  # URLs appear only as text (sources cited in the data)
    assert html.count('data-chart="category-bars"') == 1
    assert html.count('data-chart="timeline"') == 1
    peak = estimate_json["gpu"]["peak_allocated_bytes"]
    assert f'data-bytes="{peak}"' in html and fmt_bytes(peak) in html
    verdict = "yes" if estimate_json["gpu"]["fits"] else "no"
    assert f'data-fits="{verdict}"' in html
    for panel in ("host", "nvme", "time"):
        assert f'data-panel="{panel}"' in html
    data = re.search(r'<script type="application/json" id="memplan-data">(.*?)</script>', html,
                     re.S).group(1)
    assert json.loads(data) == estimate_json
    # every moment (per layer) is listed
    timeline = estimate_json["gpu"]["per_rank"][0]["timeline"]
    assert html.count('<tr data-moment=') == len(timeline)
    # with the time of each moment of a timed step (timing/schedule.py)
    last = timeline[-1]
    assert f'{last["seconds"]:.3g} s</td><td>{last["label"]}</td>' in html


def test_measurement_against_estimate_shows_error_per_category(estimate_json):
    measured = _measured(estimate_json)
    html = render_report(measured, against=estimate_json)
    rows = dict(re.findall(r'<tr data-what="([^"]+)">.*?<td class="num">([^<]+)</td></tr>', html))
    assert "activations" in rows and "peak allocated" in rows
    assert rows["params"] == "+0.00%"
    assert rows["activations"].startswith("-")  # the estimate is below the measurement
    # the same, given the other way round
    assert 'data-what="activations"' in render_report(estimate_json, against=measured)


def test_trace_modules_at_peak_are_listed(estimate_json):
    d = {**estimate_json, "source": "trace",
         "modules_at_peak": [{"module": "model.layers.0.mlp", "total": 123456789}]}
    html = render_report(d)
    assert "Owners at the peak" in html and "model.layers.0.mlp" in html


@pytest.mark.parametrize("bad, match", [
    ([1, 2], "expected a JSON object"),
    ({"source": "estimate"}, "missing model, recipe, gpu"),
    ({"source": "x", "model": {}, "recipe": {}, "gpu": {"per_rank": [{"role": "r"}]}},
     "malformed memplan result"),
])
def test_not_a_result_is_a_config_error(bad, match):
    with pytest.raises(ConfigError, match=match):
        render_report(bad)


def test_label_html_is_escaped(estimate_json):
    d = json.loads(json.dumps(estimate_json))
    d["model"]["id"] = "<img src=x onerror=alert(1)>"
    html = render_report(d)
    assert "<img src=x" not in html and "&lt;img src=x" in html


def test_cli_report_writes_the_file_and_reports_bad_input(tmp_path, estimate_json):
    src = tmp_path / "est.json"
    src.write_text(json.dumps(estimate_json))
    out = tmp_path / "r.html"
    runner = CliRunner()
    r = runner.invoke(app, ["report", str(src), "--html", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text().startswith("<!doctype html>")
    meas = tmp_path / "m.json"
    meas.write_text(json.dumps(_measured(estimate_json)))
    r = runner.invoke(app, ["report", str(meas), "--html", str(out), "--against", str(src)])
    assert r.exit_code == 0, r.output
    assert 'data-what="peak allocated"' in out.read_text()
    (tmp_path / "bad.json").write_text("{not json")
    for args, msg in ([str(tmp_path / "nope.json")], "cannot read"), (
            [str(tmp_path / "bad.json")], "is not JSON"):
        r = runner.invoke(app, ["report", *args, "--html", str(out)])
        assert r.exit_code == 2 and "Error:" in r.output and msg in " ".join(r.output.split())
