"""Bytes, dtypes and their human-readable forms. Inside memplan every size is an ``int`` of bytes;
conversion to GiB/GB happens only here and in ``report``."""

from __future__ import annotations

KIB = 1024
MIB = 1024**2
GIB = 1024**3
GB = 10**9

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "tf32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "uint8": 1,
    "nf4": 0.5,
    "int4": 0.5,
}
"""Storage bytes per element. nf4/int4 pack two values per byte (bitsandbytes Params4bit)."""


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype`` (one of ``DTYPE_BYTES``)."""
    return DTYPE_BYTES[dtype]


def gib(n_bytes: int | float) -> float:
    """Bytes to GiB (2**30)."""
    return n_bytes / GIB


def fmt_bytes(n_bytes: int | float, digits: int = 2) -> str:
    """``12.34 GiB`` / ``512.0 MiB`` / ``0 B``: binary units, as torch and nvidia-smi count."""
    n = float(n_bytes)
    if n == 0:
        return "0 B"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", 1024**4), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{sign}{n / size:.{digits}f} {unit}"
    return f"{sign}{int(n)} B"


def fmt_count(n: int) -> str:
    """Parameter counts: ``8.03 B``, ``124.4 M``, ``4096``."""
    if n >= 10**9:
        return f"{n / 1e9:.2f} B"
    if n >= 10**6:
        return f"{n / 1e6:.1f} M"
    if n >= 10**4:
        return f"{n / 1e3:.1f} K"
    return str(n)
