"""Memo entries for callers that estimate many recipes of one model (``memplan plan``):
``kept_by_key``, under a key naming what the value is made from; ``kept_by_parts``, found by
the identity of the frozen recipe parts it was made from, without hashing or comparing their
fields (``plan`` asks for the same values with the same part objects many times: its space
shares equal parts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["kept_by_key", "kept_by_parts"]

T = TypeVar("T")


def kept_by_key(memo: dict[object, object] | None, key: object, make: Callable[[], T]) -> T:
    """``make()``, kept in ``memo`` under ``key``, which must name everything ``make`` reads
    besides what is fixed for the memo (its model, its device); without a memo, made anew."""
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]  # type: ignore[return-value]


def kept_by_parts(memo: dict[object, object], name: object, parts: tuple[object, ...],
                  make: Callable[[], T]) -> T:
    """``make()``, kept in ``memo`` under ``name`` and the identity of ``parts``. ``make`` must
    read nothing but ``parts`` (frozen: the same objects hold the same values) and what is
    fixed for the memo (its model, its device). The entry holds the parts, so their ids are
    not reused while it lives; a hit is taken only when its parts equal ``parts`` (the tuple
    comparison takes the same objects by identity, without comparing their fields)."""
    key = (name, *map(id, parts))
    got = memo.get(key)
    if got is not None and got[0] == parts:  # type: ignore[index]
        return got[1]  # type: ignore[index,no-any-return]
    value = make()
    memo[key] = (parts, value)
    return value
