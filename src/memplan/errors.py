"""memplan's exception tree. Every error a user can cause is a ``MemplanError``.

::

    MemplanError                 base; the CLI prints it and exits 2 (usage) or 1 (runtime)
    ├── ConfigError              bad recipe values or impossible combinations (exit 2)
    ├── UnknownName              a model / GPU / choice that is not in a catalog (exit 2)
    │   ├── UnknownDevice
    │   └── UnknownModel
    ├── ModelConfigError         a config.json / TOML / module that cannot be read (exit 2)
    ├── UnsupportedModel         an architecture memplan cannot describe yet (exit 2)
    ├── TraceError               a recipe the tracer / real-run harness cannot apply (exit 2)
    └── MeasureError             a measured run that failed or left no report (exit 1)

A message names the value, the rule and the fix. ``ConfigError`` carries every problem
found at once, so a user fixes a recipe in one round trip (torchtune's habit).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

__all__ = [
    "MemplanError",
    "ConfigError",
    "UnknownName",
    "UnknownDevice",
    "UnknownModel",
    "ModelConfigError",
    "UnsupportedModel",
    "TraceError",
    "MeasureError",
    "close_matches",
    "Problems",
]


class MemplanError(Exception):
    """Base of every error memplan raises on purpose."""

    exit_code: int = 2


class ConfigError(MemplanError):
    """One or more recipe values are invalid; ``problems`` lists each with its fix."""

    def __init__(self, problems: Sequence[str]):
        self.problems = tuple(problems)
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(text)


class UnknownName(MemplanError):
    """A name that is not in a catalog; the message suggests close matches."""


class UnknownDevice(UnknownName):
    """A GPU name not in the hardware catalog. Never silently replaced by another GPU."""


class UnknownModel(UnknownName):
    """A model id that is neither in the catalog, nor a local file, nor in the HF cache."""


class ModelConfigError(MemplanError):
    """A config file (config.json, recipe TOML) or model factory that cannot be read."""


class UnsupportedModel(MemplanError):
    """An architecture (``model_type``) memplan has no description for."""


class TraceError(MemplanError):
    """A recipe or model that ``trace`` (or a real run built by it) cannot apply, e.g. a
    multi-rank layout or an optimizer that needs bitsandbytes; the message says what works."""


class MeasureError(MemplanError):
    """A measured run failed, or left no report to read."""

    exit_code = 1


def close_matches(value: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` entries of ``choices`` that look like ``value`` (case-insensitive): names that
    contain it first (``A100`` -> ``A100-40GB``), then spelling neighbours (difflib)."""
    choices = list(dict.fromkeys(choices))
    key = value.lower()
    contains = [c for c in choices if key and key in c.lower()]
    lowered = {c.lower(): c for c in choices}
    similar = [lowered[h] for h in difflib.get_close_matches(key, list(lowered), n=n, cutoff=0.5)]
    return list(dict.fromkeys(contains + similar))[:n]


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """`` Did you mean 'x' or 'y'?`` or an empty string when nothing is close."""
    hits = close_matches(value, choices)
    if not hits:
        return ""
    return " Did you mean " + " or ".join(repr(h) for h in hits) + "?"


class Problems:
    """Collects problems so that all of them are reported in one ``ConfigError``."""

    def __init__(self) -> None:
        self._items: list[str] = []

    def add(self, message: str) -> None:
        self._items.append(message)

    def choice(self, field: str, value: object, choices: Sequence[str]) -> None:
        """Record a problem if ``value`` is not one of ``choices``."""
        if value not in choices:
            self.add(
                f"{field}={value!r} is not one of {', '.join(choices)}."
                + did_you_mean(str(value), choices)
            )

    def positive(self, field: str, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            self.add(f"{field}={value!r} must be a whole number >= 1.")

    def __bool__(self) -> bool:
        return bool(self._items)

    @property
    def items(self) -> tuple[str, ...]:
        return tuple(self._items)

    def raise_if_any(self) -> None:
        if self._items:
            raise ConfigError(self._items)
