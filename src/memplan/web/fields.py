"""The recipe controls of the page, one per recipe field: name, kind, choices, default, help
and bounds.

An adapter: when ``memplan.recipe`` offers ``describe_fields()`` (the one description of every
recipe field that also builds the CLI options), the form is built from it. Until then the
fields come from the ``Recipe`` dataclass itself: its fields, defaults and field docstrings,
and the choice tuples of ``memplan.recipe``. Either way the page adds an upper bound to every
number (``UPPER``), so one request cannot ask for an absurd amount of work.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import MISSING, dataclass, fields
from functools import cache
from typing import Any

__all__ = ["FieldSpec", "recipe_fields", "UPPER"]

UPPER: dict[str, float] = {
    "micro_batch": 65536, "seq_len": 4_194_304, "grad_accum": 1_000_000, "gpus": 1_048_576,
    "gpus_per_node": 1024, "lora_rank": 65536, "lora_alpha": 1_000_000, "tp": 4096, "pp": 4096,
    "pp_virtual": 1024, "cp": 4096, "ep": 4096, "hybrid_shard": 1_048_576, "zero": 3,
    "freeze_trainable_layers": 100_000, "moe_capacity_factor": 1000.0,
}
"""The page's upper bound per numeric field: far above any real run, low enough that a request
stays cheap (the recipe's own checks still apply below them)."""
_DEFAULT_UPPER = 1_000_000
_SKIP = {"notes"}  # free text carried into reports; not a control
_GROUPS = (
    ("batch", ("micro_batch", "seq_len", "grad_accum")),
    ("precision and optimizer", ("precision", "optimizer", "grad_dtype")),
    ("method", ("method", "lora_rank", "lora_alpha", "lora_targets", "adapter_dtype", "quant",
                "freeze_trainable_layers")),
    ("memory savers", ("checkpointing", "attention", "loss", "offload", "expandable_segments")),
    ("parallelism", ("gpus", "gpus_per_node", "zero", "hybrid_shard", "tp", "sequence_parallel",
                     "pp", "pp_virtual", "cp", "ep", "moe_capacity_factor")),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldSpec:
    """One recipe control."""

    name: str
    """The recipe key (the CLI flag with underscores)."""
    kind: str
    """``choice``, ``bool``, ``int``, ``float`` or ``list`` (comma-separated names)."""
    default: Any
    """The recipe's default value."""
    help: str = ""
    """What the field means (its docstring), shown on hover."""
    choices: tuple[str, ...] = ()
    """Allowed values of a ``choice`` field."""
    minimum: float | None = None
    """Smallest allowed number (numbers only)."""
    maximum: float | None = None
    """Largest allowed number on the page (numbers only)."""
    group: str = "other"
    """Which box of the form the control sits in."""


def _group(name: str) -> str:
    return next((g for g, names in _GROUPS if name in names), "other")


def _docstrings(cls: type) -> dict[str, str]:
    """Field docstrings (the string literal after each annotated field) of a dataclass."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    out = {}
    for a, b in zip(body, body[1:]):
        if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)):
            out[a.target.id] = " ".join(b.value.value.replace("``", "").split())
    return out


def _from_dataclass() -> list[FieldSpec]:
    from .. import recipe as rmod

    choices = {"precision": rmod.PRECISIONS, "optimizer": rmod.OPTIMIZERS,
               "method": rmod.METHODS, "quant": rmod.QUANTS, "offload": rmod.OFFLOADS,
               "checkpointing": getattr(rmod, "CHECKPOINTING", ()),
               "attention": getattr(rmod, "ATTENTION", ()), "loss": getattr(rmod, "LOSSES", ()),
               "device": getattr(rmod, "DEVICES", ()),
               "adapter_dtype": getattr(rmod, "ADAPTER_DTYPES", ()),
               "grad_dtype": getattr(rmod, "GRAD_DTYPES", ())}
    lower0 = {"zero", "gpus_per_node", "hybrid_shard", "moe_capacity_factor", "lora_alpha"}
    docs = _docstrings(rmod.Recipe)
    out = []
    for f in fields(rmod.Recipe):
        if f.name in _SKIP:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        if choices.get(f.name):
            kind, extra = "choice", {"choices": tuple(choices[f.name])}
        elif isinstance(default, bool):
            kind, extra = "bool", {}
        elif isinstance(default, (int, float)):
            kind = "float" if isinstance(default, float) else "int"
            extra = {"minimum": 0 if f.name in lower0 else 1,
                     "maximum": UPPER.get(f.name, _DEFAULT_UPPER)}
        else:
            kind, extra = "list", {}
            if isinstance(default, tuple):
                default = ",".join(default)
        out.append(FieldSpec(name=f.name, kind=kind, default=default, help=docs.get(f.name, ""),
                             group=_group(f.name), **extra))
    return out


def _from_description(described: Any) -> list[FieldSpec]:
    """Fields from ``memplan.recipe.describe_fields()`` (issue #10's one description)."""
    out = []
    for d in described:
        get = d.get if isinstance(d, dict) else lambda k, default=None, d=d: getattr(d, k, default)
        name = get("name") or get("key")
        if name in _SKIP:
            continue
        choices = tuple(str(c) for c in (get("choices") or ()))
        default = get("default")
        if choices:
            kind = "choice"
        elif isinstance(default, bool):
            kind = "bool"
        elif isinstance(default, (int, float)):
            kind = "float" if isinstance(default, float) else "int"
        else:
            kind = "list"
            if isinstance(default, (tuple, list)):
                default = ",".join(map(str, default))
        lo, hi = get("minimum", get("min")), get("maximum", get("max"))
        if kind in ("int", "float"):
            hi = min(x for x in (hi, UPPER.get(name, _DEFAULT_UPPER)) if x is not None)
            lo = 0 if lo is None else lo
        out.append(FieldSpec(name=name, kind=kind, default=default, help=get("help") or "",
                             choices=choices, minimum=lo, maximum=hi, group=_group(name)))
    return out


@cache
def recipe_fields() -> tuple[FieldSpec, ...]:
    """Every recipe control, in form order (grouped as ``_GROUPS``)."""
    from .. import recipe as rmod

    describe = getattr(rmod, "describe_fields", None)
    specs = _from_description(describe()) if describe is not None else _from_dataclass()
    order = [n for _, names in _GROUPS for n in names]
    return tuple(sorted(specs, key=lambda s: order.index(s.name) if s.name in order
                        else len(order)))
