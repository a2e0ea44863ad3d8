"""The recipe controls of the page, one per recipe key: name, kind, choices, default, help
and bounds.

A small adapter over ``memplan.recipe.describe.describe_fields()``, the one description of
every recipe key that also builds the CLI's flags: the form never lists a field itself. The
page adds an upper bound to every number (``UPPER``), so one request cannot ask for an absurd
amount of work.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

__all__ = ["FieldSpec", "recipe_fields", "UPPER"]

UPPER: dict[str, float] = {
    "micro_batch": 65536, "seq_len": 4_194_304, "grad_accum": 1_000_000, "gpus": 1_048_576,
    "gpus_per_node": 1024, "lora_rank": 65536, "lora_alpha": 1_000_000, "lora_dropout": 0.999,
    "tp": 4096, "pp": 4096,
    "pp_virtual": 1024, "cp": 4096, "ep": 4096, "hybrid_shard": 1_048_576, "zero": 3,
    "freeze_trainable_layers": 100_000, "virtual_tokens": 1_000_000,
    "adapter_params": 10**13, "moe_capacity_factor": 1000.0,
    # DeepSpeed's bucket and ZeRO-3 knobs count elements; their defaults are 1e5..1e9
    "reduce_bucket_size": 10**12, "allgather_bucket_size": 10**12,
    "stage3_max_live_parameters": 10**12, "stage3_max_reuse_distance": 10**12,
    "stage3_prefetch_bucket_size": 10**12,
    "stage3_param_persistence_threshold": 10**12, "sub_group_size": 10**12,
    "offload_buffer_count": 1024,
}
"""The page's upper bound per numeric field: far above any real run, low enough that a request
stays cheap (the recipe's own checks still apply below them)."""
_DEFAULT_UPPER = 1_000_000
_SKIP = {"notes"}  # free text carried into reports; not a control


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
    """Which box of the form the control sits in: the recipe part (``parallelism``)."""


def _from_description(described: Any) -> list[FieldSpec]:
    """``FieldSpec``s from ``FieldInfo``s (issue #10's one description of the recipe)."""
    out = []
    for d in described:
        name, default = d.key, d.default
        if name in _SKIP:
            continue
        kind = {"str": "choice" if d.choices else "list", "list": "list", "bool": "bool",
                "int": "int", "float": "float"}.get(d.type, "list")
        choices = tuple(d.choices) if kind == "choice" else ()
        if isinstance(default, (tuple, list)):
            default = ",".join(map(str, default))
        lo, hi = d.minimum, d.maximum
        if kind in ("int", "float"):
            hi = min(x for x in (hi, UPPER.get(name, _DEFAULT_UPPER)) if x is not None)
            lo = 0 if lo is None else lo
        out.append(FieldSpec(name=name, kind=kind, default=default, help=d.help or "",
                             choices=choices, minimum=lo, maximum=hi, group=d.part or "other"))
    return out


@cache
def recipe_fields() -> tuple[FieldSpec, ...]:
    """Every recipe control, part by part, in the order of the recipe's flat table."""
    from ..recipe.describe import describe_fields

    return tuple(_from_description(describe_fields()))
