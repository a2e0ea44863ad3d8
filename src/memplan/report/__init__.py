"""Turn a ``Breakdown`` into text. Formatting only: nothing here computes memory."""

from .table import render_breakdown, render_devices, render_models, render_nodes

__all__ = ["render_breakdown", "render_devices", "render_models", "render_nodes"]
