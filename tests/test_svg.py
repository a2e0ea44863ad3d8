"""The SVG charts, parsed as XML: elements and values, not pixels."""

import xml.etree.ElementTree as ET

import pytest

from memplan.report.svg import CATEGORY_COLOURS, category_bars, timeline_area

NS = {"s": "http://www.w3.org/2000/svg"}


def _moment(label, step, **cats):
    return {"label": label, "step": step, "phase": "forward",
            "allocated_bytes": sum(cats.values()), "categories": cats}


MOMENTS = [
    _moment("forward: embedding", "first", params=100, activations=10),
    _moment("backward: loss", "first", params=100, activations=50, temporary=40),
    _moment("forward: embedding", "steady", params=100, optimizer=200, activations=10),
    _moment("backward: loss", "steady", params=100, optimizer=200, activations=50, temporary=40),
    _moment("optimizer-step", "steady", params=100, optimizer=200, gradients=50),
]


def test_bars_one_group_per_nonzero_category_with_fixed_colours_and_hover_values():
    root = ET.fromstring(category_bars([("estimate", {"params": 2 * 2**30, "gradients": 0,
                                                      "activations": 3 * 2**30})],
                                       formulas={"params": "elements x 2 B"}))
    groups = root.findall("s:g[@data-category]", NS)
    assert [g.get("data-category") for g in groups] == ["params", "activations"]
    assert [int(g.get("data-bytes")) for g in groups] == [2 * 2**30, 3 * 2**30]
    for g in groups:
        assert g.find("s:rect", NS).get("fill") == CATEGORY_COLOURS[g.get("data-category")]
    assert groups[0].find("s:title", NS).text.startswith("params: 2.00 GiB")
    assert "elements x 2 B" in groups[0].find("s:title", NS).text
    # the longest bar is the largest value
    widths = [float(g.find("s:rect", NS).get("width")) for g in groups]
    assert widths[1] > widths[0] > 0


def test_bars_compare_two_series_side_by_side_with_a_legend():
    root = ET.fromstring(category_bars([("estimate", {"params": 10, "overhead": 5}),
                                        ("measure", {"params": 12})]))
    groups = root.findall("s:g[@data-category]", NS)
    assert [(g.get("data-category"), g.get("data-series"), g.get("data-bytes")) for g in groups] \
        == [("params", "estimate", "10"), ("params", "measure", "12"),
            ("overhead", "estimate", "5"), ("overhead", "measure", "0")]
    assert [g.get("data-legend") for g in root.findall("s:g[@data-legend]", NS)] == [
        "estimate", "measure"]


def test_timeline_stacks_categories_and_marks_the_first_largest_moment():
    svg = timeline_area(MOMENTS, capacity_bytes=1000)
    root = ET.fromstring(svg)
    assert root.get("data-chart") == "timeline"
    polys = root.findall("s:polygon", NS)
    assert [p.get("data-category") for p in polys] == [
        "params", "gradients", "optimizer", "activations", "temporary"]
    assert {p.get("data-category"): int(p.get("data-max-bytes")) for p in polys}["optimizer"] \
        == 200
    peak = root.find("s:g[@data-peak]", NS)
    assert peak.get("data-peak") == "3" and peak.get("data-bytes") == "390"
    assert "backward: loss (steady step)" in peak.find("s:title", NS).text
    assert root.find("s:g[@data-capacity]", NS).get("data-capacity") == "1000"
    bands = root.findall("s:rect[@data-moment]", NS)
    assert [int(b.get("data-bytes")) for b in bands] == [m["allocated_bytes"] for m in MOMENTS]
    assert "optimizer 200 B" in bands[2].find("s:title", NS).text


def test_timeline_top_of_the_stack_follows_the_totals():
    """The last polygon's upper edge is the total: its y at the peak is the lowest y."""
    root = ET.fromstring(timeline_area(MOMENTS))
    top = root.findall("s:polygon", NS)[-1]
    pts = [tuple(map(float, p.split(","))) for p in top.get("points").split()]
    upper = pts[: 2 * len(MOMENTS)]
    ys = [y for _, y in upper[::2]]
    assert ys.index(min(ys)) == 3
    assert root.find("s:g[@data-capacity]", NS) is None


def test_labels_are_escaped():
    root = ET.fromstring(timeline_area([_moment("<script>&", "first", params=1)]))
    assert "<script>&" in root.find("s:g[@data-peak]/s:title", NS).text


def test_empty_timeline_is_an_error():
    with pytest.raises(ValueError, match="at least one moment"):
        timeline_area([])


def test_real_estimate_draws(tmp_path):
    from memplan.api import Machine, estimate_from_names, load_recipe

    d = estimate_from_names("meta-llama/Llama-3.2-1B", load_recipe(),
                            Machine(gpu="A100-80GB")).to_dict()
    rank = d["gpu"]["per_rank"][0]
    root = ET.fromstring(timeline_area(rank["timeline"], capacity_bytes=d["gpu"]["capacity_bytes"]))
    assert int(root.find("s:g[@data-peak]", NS).get("data-bytes")) == rank["peak_allocated_bytes"]
    bars = ET.fromstring(category_bars([("estimate", rank["categories"])]))
    assert sum(int(g.get("data-bytes")) for g in bars.findall("s:g[@data-category]", NS)) == sum(
        rank["categories"].values())
