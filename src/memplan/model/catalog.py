"""The shipped, offline model catalog: ``memplan/catalog/models.toml`` indexes real HF
``config.json`` files under ``memplan/catalog/models/``, each row with the source it was
verified against."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from ..errors import Problems, did_you_mean

__all__ = ["CatalogEntry", "catalog", "find", "search"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CatalogEntry:
    id: str
    """Hugging Face repo id (or a paper name for models not on the Hub, e.g. ``gpt3-175b``)."""
    file: str
    """config.json file name under ``memplan/catalog/models/`` (for a ``base`` row: the base's)."""
    source: str
    """Where the config was verified."""
    aliases: tuple[str, ...] = ()
    published_params: int | None = None
    """Total parameter count published by the authors, when one exists (golden test)."""
    published_params_source: str = ""
    notes: str = ""
    base: str = ""
    """Id of the catalog row whose config.json this one shares (an instruct / chat / distilled
    variant with the same architecture); empty for a row with its own file."""
    patch: dict[str, Any] = field(default_factory=dict)
    """config.json keys where this variant differs from ``base`` (e.g. an untied head)."""
    unset: tuple[str, ...] = ()
    """Keys of the base config that this variant's config.json sets to null (TOML has no null)."""

    def config(self) -> dict[str, Any]:
        text = resources.files("memplan.catalog").joinpath("models", self.file).read_text()
        data: dict[str, Any] = json.loads(text)
        return {**data, **self.patch, **dict.fromkeys(self.unset)}

    @property
    def family(self) -> str:
        """The ``model_type`` of the config (``llama``, ``qwen3_moe``...)."""
        return str(self.config().get("model_type", ""))


_KEYS = {"id", "file", "source", "aliases", "published_params", "published_params_source",
         "notes", "base", "patch", "unset"}


@cache
def catalog() -> dict[str, CatalogEntry]:
    """All catalog entries by id (loaded once, on first use; nothing happens at import).

    A row with ``base`` takes the base row's file; the table is checked when read (every
    problem at once): unknown keys, a row with both or neither of ``file`` / ``base``, a base
    that is not a row with its own file, duplicate ids."""
    raw = tomllib.loads(resources.files("memplan.catalog").joinpath("models.toml").read_text())
    rows = raw["model"]
    problems = Problems()
    files = {r["id"]: r.get("file") for r in rows if r.get("file")}
    seen: set[str] = set()
    for row in rows:
        rid = row.get("id", "<no id>")
        for key in set(row) - _KEYS:
            problems.add(f"models.toml {rid!r}: unknown key {key!r}.{did_you_mean(key, _KEYS)}")
        if not row.get("source"):
            problems.add(f"models.toml {rid!r}: missing 'source' (the HF repo of its config).")
        if bool(row.get("file")) == bool(row.get("base")):
            problems.add(f"models.toml {rid!r}: give exactly one of 'file' and 'base'.")
        elif row.get("base") and row["base"] not in files:
            problems.add(f"models.toml {rid!r}: base {row['base']!r} is not a row with its own "
                         f"file.{did_you_mean(row['base'], files)}")
        if rid.lower() in seen:
            problems.add(f"models.toml: {rid!r} appears twice.")
        seen.add(rid.lower())
    problems.raise_if_any()
    out = {}
    for row in rows:
        entry = CatalogEntry(
            id=row["id"], file=row.get("file") or files[row["base"]], source=row["source"],
            aliases=tuple(row.get("aliases", ())), published_params=row.get("published_params"),
            published_params_source=row.get("published_params_source", ""),
            notes=row.get("notes", ""), base=row.get("base", ""), patch=dict(row.get("patch", {})),
            unset=tuple(row.get("unset", ())),
        )
        out[entry.id] = entry
    return out


def _count(entry: CatalogEntry) -> int | None:
    from ..errors import MemplanError
    from .resolve import load_model

    try:
        return int(load_model(entry.id).num_params)
    except MemplanError:
        return entry.published_params or (
            catalog()[entry.base].published_params if entry.base else None)


def search(text: str = "", *, family: str | None = None, min_params: int | None = None,
           max_params: int | None = None,
           count: Callable[[CatalogEntry], int | None] | None = None) -> list[CatalogEntry]:
    """Catalog entries whose id or an alias contains every word of ``text`` (case-insensitive;
    ``-``, ``_``, ``.`` and spaces ignored), of ``family`` (``model_type`` prefix, e.g. ``qwen``
    matches qwen2 / qwen3 / qwen3_moe) and with ``count(entry)`` parameters in
    [``min_params``, ``max_params``] (default count: the structural count, else the published
    total, else the base's; entries without any count fail a size filter)."""
    def norm(s: str) -> str:
        return re.sub(r"[\s_\-.]", "", s.lower())

    count = count or _count
    words = [norm(w) for w in text.split() if norm(w)]
    out = []
    for entry in catalog().values():
        names = [norm(n) for n in (entry.id, *entry.aliases)]
        if not all(any(w in n for n in names) for w in words):
            continue
        if family and not norm(entry.family).startswith(norm(family)):
            continue
        if min_params is not None or max_params is not None:
            n = count(entry)
            if n is None or (min_params is not None and n < min_params) or (
                    max_params is not None and n > max_params):
                continue
        out.append(entry)
    return out


def find(name: str) -> CatalogEntry | None:
    """The entry whose id or alias equals ``name`` (case-insensitive), else None."""
    key = name.lower()
    for entry in catalog().values():
        if entry.id.lower() == key or key in (a.lower() for a in entry.aliases):
            return entry
    return None
