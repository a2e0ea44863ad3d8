"""Reading and writing recipe files: TOML or JSON, one flat table of keys (plus the optional
``[host]`` table that ``memplan.host.HostSetup`` reads). ``Recipe.from_dict`` of what
``to_toml`` / ``Recipe.to_dict`` write gives the same recipe back."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelConfigError

if TYPE_CHECKING:
    from . import Recipe

__all__ = ["read_recipe_file", "read_recipe_toml", "to_toml"]


def read_recipe_file(path: str | Path) -> dict[str, Any]:
    """The contents of a recipe file (``.json``, else TOML); unreadable or malformed files name
    the file, line and what was expected."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ModelConfigError(f"cannot read recipe {path}: {e.strerror}.") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{path}: malformed JSON: {e}. Expected an object of the "
                                   "recipe's keys.") from None
        if not isinstance(data, dict):
            raise ModelConfigError(f"{path}: a recipe JSON is an object of keys, got "
                                   f"{type(data).__name__}.")
        return data
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ModelConfigError(f"{path}: malformed TOML: {e}. Expected `key = value` lines "
                               "with the recipe's field names.") from None


read_recipe_toml = read_recipe_file
"""The same reader (the name ``HostSetup`` and older code use)."""


def to_toml(recipe: Recipe) -> str:
    """The recipe's flat table as TOML (derived ``dp`` left out)."""
    lines = []
    for key, value in recipe.to_dict().items():
        if key == "dp":
            continue
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise AssertionError(f"no TOML form for {v!r}")
