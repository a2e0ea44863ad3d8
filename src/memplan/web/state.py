"""What the page shows, as plain data: the model, GPU, node and recipe values, and the recipes
pinned for comparison. It round-trips through the URL's query string, so a plan can be shared.

Parsing checks sizes, kinds and bounds and reports every problem at once (``ConfigError``);
the recipe's own rules are checked by ``memplan`` when the estimate runs, with the same
messages as the CLI. The page never resolves a model by path, factory or Hub id: only catalog
names, or a config.json given in the request (nothing is fetched, no model code runs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs, urlencode

from ..errors import ConfigError
from .fields import FieldSpec, recipe_fields

__all__ = ["PageState", "parse_state", "MAX_CONFIG_BYTES", "MAX_PINS"]

MAX_CONFIG_BYTES = 256 * 1024
"""Largest config.json the page accepts (real ones are 1-10 KB)."""
MAX_PINS = 4
"""Recipes pinned for comparison beside the current one."""
MAX_TEXT = 200  # characters of a model, GPU or node name
MAX_PIN_CHARS = 4096
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B"
DEFAULT_GPU = "H100-80GB"
_PLACES = ("model", "gpu", "node", "host_ram", "nvme")


class Params(Protocol):
    """A multi-dict of strings (Starlette's ``QueryParams``, or ``Multi``)."""

    def getlist(self, key: str) -> list[Any]: ...

    def keys(self) -> Any: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class PageState:
    """One page: a model on a GPU (and optionally a node) with a recipe, plus pinned recipes."""

    model: str = DEFAULT_MODEL
    """Catalog id or alias (ignored when ``config_json`` is given)."""
    gpu: str = DEFAULT_GPU
    """GPU catalog name."""
    node: str = ""
    """Node preset ('' for none): host RAM, NVMe, links."""
    host_ram: str = ""
    """Host RAM per node, e.g. ``2TiB`` ('' for the node's)."""
    nvme: str = ""
    """NVMe per node, e.g. ``30TB`` ('' for the node's)."""
    recipe: tuple[tuple[str, Any], ...] = ()
    """Recipe values that differ from the defaults, typed, in form order."""
    pins: tuple[str, ...] = ()
    """Query strings of recipes pinned for comparison."""
    config_json: str = field(default="", repr=False)
    """A pasted or uploaded config.json (not kept in the URL: it can be large)."""

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(self.recipe)

    def query(self, *, with_pins: bool = True) -> str:
        """The URL query string of this state (defaults left out)."""
        pairs: list[tuple[str, str]] = []
        for name in _PLACES:
            value = getattr(self, name)
            if value and value != {"model": DEFAULT_MODEL, "gpu": DEFAULT_GPU}.get(name):
                pairs.append((name, value))
        for name, value in self.recipe:
            pairs.append((name, _text(value)))
        if with_pins:
            pairs += [("pin", p) for p in self.pins]
        return urlencode(pairs)

    def value(self, spec: FieldSpec) -> Any:
        """The control's current value (the default when not set)."""
        return self.overrides.get(spec.name, spec.default)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


class Multi:
    """A minimal multi-dict over ``parse_qs`` output (for pinned query strings)."""

    def __init__(self, data: Mapping[str, list[str]]):
        self._data = data

    def getlist(self, key: str) -> list[Any]:
        return list(self._data.get(key, []))

    def keys(self) -> Any:
        return self._data.keys()


def _convert(spec: FieldSpec, raw: str, problems: list[str]) -> Any:
    raw = raw.strip()
    if spec.kind == "bool":
        if raw.lower() in ("1", "on", "true", "yes"):
            return True
        if raw.lower() in ("", "0", "off", "false", "no"):
            return False
        problems.append(f"{spec.name}={raw!r} must be true or false.")
        return None
    if spec.kind in ("int", "float"):
        try:
            value: Any = int(raw) if spec.kind == "int" else float(raw)
        except ValueError:
            what = "a whole number" if spec.kind == "int" else "a number"
            problems.append(f"{spec.name}={raw!r} is not {what}.")
            return None
        if value != value or (spec.minimum is not None and value < spec.minimum) or (
                spec.maximum is not None and value > spec.maximum):
            problems.append(f"{spec.name}={raw} is out of range: the page accepts "
                            f"{_num(spec.minimum)} to {_num(spec.maximum)}.")
            return None
        return value
    if spec.kind == "choice":
        return raw  # the recipe names the valid choices (same message as the CLI)
    return tuple(t.strip() for t in raw.split(",") if t.strip())


def _one(params: Params, key: str, problems: list[str], limit: int = MAX_TEXT) -> str:
    values = [v for v in params.getlist(key) if isinstance(v, str)]
    value = values[-1].strip() if values else ""
    if len(value) > limit:
        problems.append(f"{key} is {len(value)} characters long; the page accepts up to {limit}.")
        return ""
    return value


def parse_state(params: Params, *, config_json: str = "", nested: bool = False) -> PageState:
    """The page state from request parameters; every problem at once as a ``ConfigError``.

    Empty values mean 'the default' (a cleared number box), so a half-typed form is not an
    error. Unknown parameters are ignored (htmx adds its own)."""
    problems: list[str] = []
    places = {name: _one(params, name, problems) for name in _PLACES}
    recipe: list[tuple[str, Any]] = []
    for spec in recipe_fields():
        raw = _one(params, spec.name, problems, limit=1000)
        if raw == "":
            continue
        value = _convert(spec, raw, problems)
        if value is not None and value != spec.default and _text(value) != _text(spec.default):
            recipe.append((spec.name, value))
    pins: list[str] = []
    if not nested:
        for p in params.getlist("pin"):
            if not isinstance(p, str) or not p.strip():
                continue
            if len(p) > MAX_PIN_CHARS:
                problems.append(f"a pinned recipe is {len(p)} characters; the page accepts up "
                                f"to {MAX_PIN_CHARS}.")
            elif p not in pins:
                pins.append(p)
        if len(pins) > MAX_PINS:
            problems.append(f"{len(pins)} recipes are pinned; the page compares up to "
                            f"{MAX_PINS} beside the current one. Remove one.")
    if len(config_json.encode()) > MAX_CONFIG_BYTES:
        problems.append(f"the config.json is {len(config_json.encode()) // 1024} KiB; the page "
                        f"accepts up to {MAX_CONFIG_BYTES // 1024} KiB.")
        config_json = ""
    if problems:
        raise ConfigError(problems)
    return PageState(model=places["model"] or DEFAULT_MODEL, gpu=places["gpu"] or DEFAULT_GPU,
                     node=places["node"], host_ram=places["host_ram"], nvme=places["nvme"],
                     recipe=tuple(recipe), pins=tuple(pins), config_json=config_json)


def parse_pin(query: str) -> PageState:
    """A pinned recipe's state from its query string."""
    return parse_state(Multi(parse_qs(query, keep_blank_values=True)), nested=True)


def config_from_text(text: str) -> dict[str, Any]:
    """A pasted/uploaded config.json as a dict; malformed JSON names the line and column."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError([f"config.json:{e.lineno}:{e.colno}: malformed JSON ({e.msg}). "
                           "Expected a Hugging Face config.json object."]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"config.json: expected a JSON object, got {type(data).__name__}."])
    return data


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f}" if float(x).is_integer() else f"{x:,}"
