"""Parameter counts written the way model names write them: ``7B``, ``500M``, ``1.5b``."""

from __future__ import annotations

import re

from ..errors import ConfigError

__all__ = ["parse_count"]

_SCALE = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_count(text: str, flag: str) -> int:
    """``7B`` -> 7_000_000_000 (decimal, as model cards count).

    Raises:
        ConfigError: not a number with an optional K/M/B/T suffix.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmbtKMBT]?)\s*", text)
    if not m:
        raise ConfigError([f"{flag} {text!r} is not a parameter count: write e.g. 7B, 1.5B, "
                           "or 500M (K, M, B, T: decimal)."])
    return int(float(m.group(1)) * _SCALE[m.group(2).lower()])
