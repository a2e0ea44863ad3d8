"""Sourced constants for the host-RAM, NVMe and step-time models, read from TOML data files.

Every row of ``host.toml`` / ``rates.toml`` is ``[name] value = ..., unit = ..., source = ...``
(and optional ``notes``); ``constant(name)`` returns the value, ``Constant`` the whole row so
reports and tests can show where a number comes from.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

__all__ = ["Constant", "constants", "constant"]

_FILES = ("host.toml", "rates.toml")


@dataclass(frozen=True, kw_only=True, slots=True)
class Constant:
    """One sourced number."""

    name: str
    """Key in the data file, e.g. ``process_baseline_cuda_bytes``."""
    value: float
    """The number, in ``unit``."""
    unit: str
    """Unit of ``value`` (``bytes``, ``GB/s``, ``fraction``...)."""
    source: str
    """Where the number comes from (issue, paper table, file)."""
    notes: str = ""
    """Derivation, ranges and known deviations."""


@cache
def constants() -> dict[str, Constant]:
    """Every constant of both data files by name (read on first use)."""
    out: dict[str, Constant] = {}
    for name in _FILES:
        rows = tomllib.loads(resources.files(__package__).joinpath(name).read_text())
        for key, row in rows.items():
            out[key] = Constant(name=key, value=float(row["value"]), unit=row["unit"],
                                source=row["source"], notes=row.get("notes", ""))
    return out


def constant(name: str) -> float:
    """The value of constant ``name`` (a ``KeyError`` here is a bug, not user input)."""
    return constants()[name].value
