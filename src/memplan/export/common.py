"""What every export target shares: the result types, the header, the precision names and a
small YAML writer (the core stays free of a YAML dependency; reading YAML needs PyYAML)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ..errors import ModelConfigError
from ..model.spec import ModelSpec

__all__ = ["Exported", "Imported", "ExportContext", "header_lines", "memplan_version",
           "yaml_text", "load_yaml", "load_json", "DS_PRECISION"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportContext:
    """What an exporter may need besides the recipe."""

    model: ModelSpec | None = None
    """The model (Megatron's config classes take its shape); None when not known."""
    planned_for: str = ""
    """One line naming the estimate the file was planned for (model, GPU, peak)."""
    companion: str = "ds_config.json"
    """The DeepSpeed config file a launcher or accelerate config points at."""
    numa_bound: bool = False
    """The recipe's ``[host] numa_bound``: a launcher binds each rank to its GPU's NUMA node."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Exported:
    """An engine config written from a recipe."""

    target: str
    """The ``--to`` target."""
    text: str
    """The file's text."""
    not_carried: dict[str, Any] = field(default_factory=dict)
    """Recipe keys (flat, with the recipe's values) the format cannot express: reading the file
    back gives their defaults, so pass them as flags with ``--from``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Imported:
    """Recipe keys read from an engine config."""

    target: str
    """The format it was read as."""
    keys: dict[str, Any]
    """Flat recipe keys; keys the file does not set are left to flags and defaults."""
    ignored: tuple[str, ...] = ()
    """Keys of the file memplan does not model (dotted paths), listed rather than dropped."""
    resolved: tuple[str, ...] = ()
    """``"auto"`` values and how each was resolved (as the engine resolves it)."""

    def notes(self, where: str) -> tuple[str, ...]:
        """Lines for the recipe's notes (shown under the estimate)."""
        out = [f"read from {where} as {self.target}"]
        out += [f"auto: {r}" for r in self.resolved]
        if self.ignored:
            out.append("not modelled by memplan (ignored): " + ", ".join(self.ignored))
        return tuple(out)


def memplan_version() -> str:
    try:
        return version("memplan")
    except PackageNotFoundError:  # running from a source tree without an install
        return "unknown"


def header_lines(target: str, ctx: ExportContext) -> list[str]:
    """The header comment's lines (without the comment marker)."""
    lines = [f"written by memplan {memplan_version()} (memplan export --to {target})"]
    if ctx.planned_for:
        lines.append(f"planned for: {ctx.planned_for}")
    return lines


DS_PRECISION: dict[str, tuple[bool, bool]] = {
    "32-true": (False, False), "16-mixed": (False, True), "bf16-mixed": (True, False),
    "16-true": (False, True), "bf16-true": (True, False), "fp8-mixed": (True, False)}
"""precision -> (bf16.enabled, fp16.enabled) in DeepSpeed (16-bit params, fp32 master)."""


def yaml_text(data: dict[str, Any], indent: int = 0) -> str:
    """Block YAML for nested dicts of scalars and lists (strings JSON-quoted, a YAML subset)."""
    out = []
    pad = "  " * indent
    for k, v in data.items():
        if isinstance(v, dict):
            out.append(f"{pad}{k}:")
            out.append(yaml_text(v, indent + 1).rstrip("\n"))
        else:
            out.append(f"{pad}{k}: {_scalar(v)}")
    return "\n".join(out) + "\n"


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    return json.dumps(str(v))


def load_yaml(text: str, where: str) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:
        raise ModelConfigError(f"reading {where} needs PyYAML: pip install pyyaml") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ModelConfigError(f"{where}: malformed YAML: {e}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{where}: expected a YAML mapping, got {type(data).__name__}.")
    return data


def load_json(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{where}: malformed JSON: {e}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{where}: expected a JSON object, got {type(data).__name__}.")
    return data


def leaves(data: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of every leaf of a nested dict."""
    out = []
    for k, v in data.items():
        path = f"{prefix}{k}"
        out += leaves(v, path + ".") if isinstance(v, dict) and v else [path]
    return out
