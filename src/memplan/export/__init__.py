"""``memplan export``: a recipe written as each engine's own config, and ``--from``: those
configs read back into recipe keys. One module per target, registered in ``TARGETS``.

Reading what ``export`` wrote gives the recipe back, except the keys the format cannot express,
which ``Exported.not_carried`` lists (computed by reading the text back, so the list cannot
drift from the readers); with those passed as flags the round trip is exact.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ModelConfigError, did_you_mean
from . import accelerate, deepspeed, hf_trainer, lightning, megatron, torchrun, torchtitan
from .common import ExportContext, Exported, Imported

if TYPE_CHECKING:
    from ..recipe import Recipe

__all__ = ["TARGETS", "Target", "get_target", "export", "write", "read_engine_text", "read_engine_file",
           "detect_format", "ExportContext", "Exported", "Imported"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """One ``--to`` target."""

    name: str
    """The ``--to`` value."""
    write: Callable[[Any, ExportContext], str]
    """recipe, context -> the file's text."""
    read: Callable[..., Imported]
    """text, where, hidden_size -> recipe keys."""
    suffix: str
    """The file name's usual ending."""
    engine: str | None
    """The engine the target always runs (None: it follows ``recipe.engine``)."""


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target(name="deepspeed", write=deepspeed.export_text, read=deepspeed.read_text,
           suffix=".json", engine="deepspeed"),
    Target(name="accelerate", write=accelerate.export_text, read=accelerate.read_text,
           suffix=".yaml", engine=None),
    Target(name="hf-trainer", write=hf_trainer.export_text, read=hf_trainer.read_text,
           suffix=".json", engine=None),
    Target(name="torchtitan", write=torchtitan.export_text, read=torchtitan.read_text,
           suffix=".toml", engine="torchtitan"),
    Target(name="lightning", write=lightning.export_text, read=lightning.read_text,
           suffix=".json", engine=None),
    Target(name="megatron", write=megatron.export_text, read=megatron.read_text,
           suffix=".json", engine="megatron"),
    Target(name="torchrun", write=torchrun.export_text, read=torchrun.read_text,
           suffix=".sh", engine=None),
)}
"""``--to`` name -> target."""


def get_target(name: str) -> Target:
    """The ``--to`` target called ``name``; an unknown name raises ``ConfigError`` with close
    matches."""
    if name not in TARGETS:
        raise ConfigError([f"--to {name!r} is not a target; choose one of "
                           f"{', '.join(TARGETS)}.{did_you_mean(name, list(TARGETS))}"])
    return TARGETS[name]


def export(recipe: Recipe, target: str, ctx: ExportContext | None = None) -> Exported:
    """The recipe as ``target``'s config. A target that always runs one engine takes the recipe
    with that engine (refused, with the reason, when the engine cannot run it)."""
    from ..recipe import Recipe

    t, ctx = get_target(target), ctx or ExportContext()
    engine = t.engine or str(recipe.engine_kind)
    base = recipe.with_keys(engine=engine)
    text = t.write(base, ctx)
    hidden = ctx.model.hidden_size if ctx.model is not None else None
    back = t.read(text, f"<{target} export>", hidden_size=hidden).keys
    want, default = base.to_dict(), Recipe().to_dict()
    not_carried = {k: want[k] for k in want if k not in ("dp", "notes") and (
        (k in back and back[k] != want[k]) or (k not in back and want[k] != default[k]))}
    merged = Recipe.from_dict({**back, **not_carried})
    if merged != base:  # an internal invariant of the readers, not a user error
        raise AssertionError(f"{target}: reading the export back gave {merged}, not {base}")
    return Exported(target=target, text=text, not_carried=not_carried)


def write(recipe: Recipe, target: str, ctx: ExportContext | None = None) -> str:
    """The text of ``recipe`` exported to ``target`` (``export(...).text``): the library call the
    distributed validation configures its runs from."""
    return export(recipe, target, ctx).text


def detect_format(text: str, suffix: str) -> str | None:
    """The target a file's text is written in, or None for memplan's own recipe file."""
    if suffix in (".yaml", ".yml"):
        return "accelerate"
    if suffix == ".sh" or text.startswith("#!") or any(
            line.lstrip().startswith("torchrun ") for line in text.splitlines()):
        return "torchrun"
    if suffix == ".toml":
        head = {line.strip() for line in text.splitlines() if line.startswith("[")}
        return "torchtitan" if head & {"[training]", "[parallelism]"} else None
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict):
            return None
        if "TransformerConfig" in data:
            return "megatron"
        if "strategy" in data:
            return "lightning"
        if "per_device_train_batch_size" in data or "output_dir" in data:
            return "hf-trainer"
        if "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data:
            return "deepspeed"
    return None


def read_engine_text(text: str, target: str, where: str,
                     hidden_size: int | None = None) -> Imported:
    """Recipe keys from an engine config's text in format ``target``."""
    return get_target(target).read(text, where, hidden_size=hidden_size)


def read_engine_file(path: str | Path, fmt: str | None = None,
                     hidden_size: int | None = None) -> Imported | None:
    """Recipe keys from an engine config file (format detected unless ``fmt``), or None when the
    file is memplan's own recipe TOML/JSON."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ModelConfigError(f"cannot read {path}: {e.strerror}.") from None
    fmt = fmt or detect_format(text, path.suffix)
    return None if fmt is None else read_engine_text(text, fmt, str(path), hidden_size)
