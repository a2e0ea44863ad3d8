"""The shipped, offline model catalog: ``memplan/catalog/models.toml`` indexes real HF
``config.json`` files under ``memplan/catalog/models/``, each row with the source it was
verified against."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["CatalogEntry", "catalog", "find"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CatalogEntry:
    id: str
    """Hugging Face repo id (or a paper name for models not on the Hub, e.g. ``gpt3-175b``)."""
    file: str
    """config.json file name under ``memplan/catalog/models/``."""
    source: str
    """Where the config was verified."""
    aliases: tuple[str, ...] = ()
    published_params: int | None = None
    """Total parameter count published by the authors, when one exists (golden test)."""
    published_params_source: str = ""
    notes: str = ""

    def config(self) -> dict[str, Any]:
        text = resources.files("memplan.catalog").joinpath("models", self.file).read_text()
        data: dict[str, Any] = json.loads(text)
        return data


@cache
def catalog() -> dict[str, CatalogEntry]:
    """All catalog entries by id (loaded once, on first use; nothing happens at import)."""
    raw = tomllib.loads(resources.files("memplan.catalog").joinpath("models.toml").read_text())
    out = {}
    for row in raw["model"]:
        entry = CatalogEntry(
            id=row["id"], file=row["file"], source=row["source"],
            aliases=tuple(row.get("aliases", ())), published_params=row.get("published_params"),
            published_params_source=row.get("published_params_source", ""),
            notes=row.get("notes", ""),
        )
        out[entry.id] = entry
    return out


def find(name: str) -> CatalogEntry | None:
    """The entry whose id or alias equals ``name`` (case-insensitive), else None."""
    key = name.lower()
    for entry in catalog().values():
        if entry.id.lower() == key or key in (a.lower() for a in entry.aliases):
            return entry
    return None
