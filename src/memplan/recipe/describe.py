"""A description of every recipe key (name, type, choices, default, help, bounds), read from the
parts' field types, defaults, metadata and docstrings. The CLI builds its flags from it and a web
form can be built from it; nothing about a field is written twice.
"""

from __future__ import annotations

import ast
import inspect
import re
import typing
from dataclasses import MISSING, dataclass, fields
from enum import StrEnum
from functools import cache
from typing import Any

from .check import field_key, field_types
from .parts import PARTS

__all__ = ["FieldInfo", "describe_fields", "describe_dataclass", "field_docs"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldInfo:
    """One key of a recipe (or of any documented dataclass)."""

    key: str
    """TOML key and CLI flag (``--`` + key with dashes)."""
    part: str
    """The part it belongs to (``parallelism``), or '' for a plain dataclass."""
    field: str
    """The field's name inside its part (``kind`` for the part's main field)."""
    type: str
    """``str`` (a choice), ``int``, ``float``, ``bool`` or ``list`` (comma-separated names)."""
    choices: tuple[str, ...]
    """Allowed values of a choice or list field; empty when free."""
    default: Any
    """Default as a plain value (enum members as strings, tuples as lists)."""
    help: str
    """The field's docstring, one paragraph, without reST markup."""
    minimum: float | None = None
    """Smallest allowed value of a number, when bounded."""
    maximum: float | None = None
    """Largest allowed value of a number, when bounded."""

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "part": self.part, "field": self.field, "type": self.type,
                "choices": list(self.choices), "default": self.default, "help": self.help,
                "minimum": self.minimum, "maximum": self.maximum}


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, from its source (PEP 257 attribute
    docstrings; they are not kept at run time)."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    body = node.body
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = _clean(nxt.value.value)
    return docs


def _clean(doc: str) -> str:
    return re.sub(r"\s+", " ", doc.replace("``", "")).strip()


def describe_dataclass(cls: type, part: str = "") -> tuple[FieldInfo, ...]:
    """``FieldInfo`` for each field of a documented dataclass."""
    hints, docs, out = field_types(cls), field_docs(cls), []
    for f in fields(cls):
        kind = hints[f.name]
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        choices: tuple[str, ...] = tuple(f.metadata.get("choices", ()))
        if isinstance(kind, type) and issubclass(kind, StrEnum):
            name, choices = "str", tuple(str(c) for c in kind)
        elif typing.get_origin(kind) is tuple:
            name = "list"
        else:
            name = kind.__name__
        out.append(FieldInfo(
            key=field_key(f), part=part, field=f.name, type=name, choices=choices,
            default=list(default) if isinstance(default, tuple) else (
                str(default) if isinstance(default, str) else default),
            help=docs.get(f.name, ""), minimum=f.metadata.get("min"),
            maximum=f.metadata.get("max")))
    return tuple(out)


@cache
def describe_fields() -> tuple[FieldInfo, ...]:
    """Every recipe key, part by part, in the order of the flat table."""
    from . import Recipe

    notes = tuple(i for i in describe_dataclass(Recipe) if i.key == "notes")
    return tuple(info for part, cls in PARTS.items()
                 for info in describe_dataclass(cls, part)) + notes
