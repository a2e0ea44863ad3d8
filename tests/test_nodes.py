"""The node catalog is data with a source on every row and GPUs from the GPU catalog."""

from __future__ import annotations

import pytest

from memplan.errors import UnknownName
from memplan.hardware.nodes import get_node, nodes


def test_every_row_is_sourced_and_names_a_catalog_gpu():
    assert len(nodes()) >= 14
    for node in nodes().values():
        assert node.source, node.name
        assert node.device.name == node.gpu
        assert node.gpus >= 1


def test_lookup_and_close_matches():
    assert get_node("dgx-h100").gpu == "H100-80GB"
    with pytest.raises(UnknownName, match="DGX-H100"):
        get_node("DGX-H10")
