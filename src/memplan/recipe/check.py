"""Field checks shared by every recipe part, driven by the field's type and metadata.

A value of the wrong type or out of its bounds is a problem naming the key, the rule and the
fix; a choice that is not a member of its ``StrEnum`` gets close matches. Strings are turned
into enum members and comma lists into tuples, so a part built from TOML, JSON or CLI strings
equals one built in Python.
"""

from __future__ import annotations

import math
import typing
from dataclasses import fields
from enum import StrEnum
from functools import cache
from typing import Any

from ..errors import Problems, did_you_mean

__all__ = ["check_part", "field_key", "field_types", "part_problems"]


@cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotation of each field of ``cls``."""
    return typing.get_type_hints(cls)


def field_key(f: Any) -> str:
    """A field's TOML key and CLI flag name (``metadata["key"]``, else its name)."""
    return str(f.metadata.get("key", f.name))


def part_problems(part: Any) -> list[str]:
    """Check and normalise every field of ``part`` in place; return the problems found."""
    p = Problems()
    hints = field_types(type(part))
    for f in fields(part):
        key = field_key(f)
        value = getattr(part, f.name)
        kind = hints[f.name]
        new = _check(p, key, kind, value, {**f.metadata, "default": f.default})
        if new is not value:
            object.__setattr__(part, f.name, new)
    return list(p.items)


def check_part(part: Any) -> None:
    """Raise one ``ConfigError`` listing every problem of ``part``."""
    p = Problems()
    for msg in part_problems(part):
        p.add(msg)
    p.raise_if_any()


def _check(p: Problems, key: str, kind: Any, value: Any, meta: Any) -> Any:
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        if isinstance(value, kind):
            return value
        choices = [str(c) for c in kind]
        if isinstance(value, str) and value in choices:
            return kind(value)
        p.choice(key, value, choices)
        return value
    if kind is bool:
        if not isinstance(value, bool):
            p.add(f"{key}={value!r} must be true or false.")
        return value
    if kind is int or kind is float:
        ok = isinstance(value, int) or (kind is float and isinstance(value, float))
        if not ok or isinstance(value, bool):
            what = "a whole number" if kind is int else "a number"
            p.add(f"{key}={value!r} must be {what}{_bounds_text(meta)}.{_fix(key, meta)}")
            return value
        if isinstance(value, float) and not math.isfinite(value):
            p.add(f"{key}={value!r} must be a finite number{_bounds_text(meta)}."
                  f"{_fix(key, meta)}")
            return value
        lo, hi, below = meta.get("min"), meta.get("max"), meta.get("below")
        if (lo is not None and value < lo) or (hi is not None and value > hi) or (
                below is not None and value >= below):
            what = "a whole number" if kind is int else "a number"
            p.add(f"{key}={value!r} must be {what}{_bounds_text(meta)}.{_fix(key, meta)}")
        return value
    if typing.get_origin(kind) is tuple:
        return _check_names(p, key, value, meta.get("choices"), may_be_empty=meta.get("empty", False),
                            every=meta.get("all"))
    raise AssertionError(f"recipe field {key} has an unsupported type {kind!r}")


def _fix(key: str, meta: Any) -> str:
    """' Fix: give --key (key in a recipe file) a value in range; the default is D.'"""
    default = meta.get("default")
    known = isinstance(default, (int, float)) and not isinstance(default, bool)
    return (f" Fix: give --{key.replace('_', '-')} ({key} in a recipe file) a value in that "
            "range" + (f"; the default is {default}." if known else "."))


def _bounds_text(meta: Any) -> str:
    lo, hi, below = meta.get("min"), meta.get("max"), meta.get("below")
    if lo is not None and below is not None:  # an open upper bound (a probability < 1)
        return f" >= {lo} and < {below}"
    if lo is not None and hi is not None:
        return f" from {lo} to {hi}"
    if lo is not None:
        return f" >= {lo}"
    return ""


def _check_names(p: Problems, key: str, value: Any, choices: tuple[str, ...] | None, *,
                 may_be_empty: bool = False, every: tuple[str, ...] | None = None) -> Any:
    """``value`` as a tuple of names from ``choices``; ``all-linear`` means ``every`` (default:
    every choice)."""
    if isinstance(value, str):
        value = tuple(v.strip() for v in value.split(",") if v.strip() and v.strip() != "none")
    elif isinstance(value, list):
        value = tuple(str(v) for v in value)
    elif not isinstance(value, tuple):
        p.add(f"{key}={value!r}: expected a list or a comma-separated string.")
        return value
    if choices is None:
        return value
    if value in (("all-linear",), ("all",)) and not may_be_empty:
        return tuple(every or choices)
    for t in value:
        if t not in choices:
            alt = "'none'" if may_be_empty else "'all-linear'"
            p.add(f"{key}: {t!r} is not one of {', '.join(choices)} (or {alt})."
                  f"{did_you_mean(t, choices)}")
    if not value and not may_be_empty:
        p.add(f"{key} is empty; name at least one of {','.join(choices)}.")
    return value
