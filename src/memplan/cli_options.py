"""CLI flags generated from the recipe's description (``memplan.recipe.describe``): one flag per
recipe key, its help the field's docstring, its choices and default the field's own. Nothing is
written here about any single field.

Typer reads a command's options from its signature, so ``recipe_options`` gives the command a
signature with the generated flags in place of its ``flags`` parameter, and hands the command
the flags that were set, as a dict of recipe keys.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

import typer

from .errors import MemplanError
from .recipe.describe import FieldInfo, describe_dataclass, describe_fields

__all__ = ["recipe_options", "option_help", "host_option", "FROM_HELP", "MODEL_HELP", "HW_HELP",
           "progress", "need_torch", "quiet_transformers", "host_memory_bytes"]

_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool, "list": str}


def option_help(info: FieldInfo) -> str:
    """Help text of a flag: the docstring, the choices and the default (in parentheses:
    square brackets would be read as rich markup)."""
    text = info.help
    if info.choices and info.type == "str":
        text += f" Choices: {' | '.join(info.choices)}."
    default = info.default
    if isinstance(default, bool):
        default = "on" if default else "off"
    elif isinstance(default, list):
        default = ",".join(default) or "none"
    return f"{text} (default: {default})"


FROM_HELP = ("An engine's config read into the recipe (ds_config JSON, accelerate YAML, HF "
             "TrainingArguments JSON, torchtitan TOML, Lightning/Megatron JSON from `memplan "
             "export`, torchrun script); flags given here override it.")


MODEL_HELP = ("HF id from the catalog (see `memplan models`), a config.json / model dir, or "
              "package.module:function.")

HW_HELP = {
    "hardware": "TOML of extra [[device]] / [[node]] rows (the schema of the built-in "
                "devices.toml / nodes.toml), usable by name in --gpu / --node.",
    "gpu_memory": "Override the GPU's memory, e.g. 96GB or 94GiB (the rest of --gpu stays).",
    "gpu_set": "Override one field of --gpu, e.g. hbm_gb_per_s=3900 or tflops_bf16=989 "
               "(repeatable).",
}


def _parameter(info: FieldInfo, name: str | None = None) -> inspect.Parameter:
    kind = _TYPES[info.type]
    option = typer.Option(help=option_help(info))
    return inspect.Parameter(name or info.key, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[kind | None, option])


def host_option(key: str) -> Any:
    """A ``typer.Option`` for one ``HostSetup`` field, its help from the field's docstring."""
    from .recipe.host import HostSetup

    info = next(i for i in describe_dataclass(HostSetup, "host") if i.key == key)
    return typer.Option(help=option_help(info))


def recipe_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command one flag per recipe key; it receives them as ``flags`` (those set)."""
    sig = inspect.signature(fn, eval_str=True)
    infos = describe_fields()
    names = [i.key for i in infos]
    shared = [_parameter(i) for i in infos]
    own = [p for p in sig.parameters.values() if p.name != "flags"]
    cut = next((i for i, p in enumerate(own) if p.name == "recipe"), len(own))
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.default is not p.empty
              else p for p in own[:cut]] + shared + [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[cut:]]

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        flags = {n: kwargs.pop(n) for n in names if kwargs.get(n) is not None}
        for n in names:
            kwargs.pop(n, None)
        return fn(**kwargs, flags=flags)

    del wrapper.__wrapped__
    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


T = TypeVar("T")


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` as the CLI's error line on stderr and exit with ``code``."""
    from rich.console import Console
    from rich.markup import escape

    # the message is plain text: brackets in it ([[case]], [host]) are not rich markup
    Console(stderr=True).print(f"[bold red]Error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def guard(fn: Callable[[], T], *, stdout_to_stderr: bool = False) -> T:
    """Run ``fn``; a ``MemplanError`` becomes the CLI's error line and its exit code.

    ``stdout_to_stderr``: whatever ``fn`` prints goes to stderr, so that the command's own
    output (JSON) stays the only thing on stdout. For commands that import training frameworks:
    DeepSpeed's logger writes to stdout when it is imported (``deepspeed/utils/logging.py``
    ``StreamHandler(sys.stdout)``), and accelerate and transformers import it when installed."""
    import contextlib
    import sys

    try:
        if stdout_to_stderr:
            with contextlib.redirect_stdout(sys.stderr):
                return fn()
        return fn()
    except MemplanError as e:
        fail(str(e), e.exit_code)
        raise AssertionError("unreachable") from None


FORMATS = ("table", "json")
"""The ``--format`` choices of the commands that print a result."""


def check_format(fmt: str) -> None:
    """Exit 2 unless ``fmt`` is one of ``FORMATS``."""
    if fmt not in FORMATS:
        from .errors import did_you_mean

        fail(f"--format {fmt!r} is not one of {', '.join(FORMATS)}.{did_you_mean(fmt, FORMATS)}")


def emit_json(data: Any) -> None:
    """One JSON document on stdout (indented)."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def host_memory_bytes() -> int:
    """This machine's physical memory (0 when the OS does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def need_torch(what: str) -> None:
    """Raise the one-line install hint when torch or transformers is missing."""
    import importlib.util

    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise MemplanError(f"`memplan {what}` runs real model code and needs "
                           f"{' and '.join(missing)}: pip install 'memplan[hf]'.")


def quiet_transformers() -> None:
    """transformers logs config warnings and deprecation notices (``gradient_checkpointing_*``
    in 5.x) on stderr; the CLI shows only its own output."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass


def stderr_console() -> Any:
    """The console progress is drawn on (stderr; a test replaces it)."""
    from rich.console import Console

    return Console(stderr=True)


@contextlib.contextmanager
def progress(text: str) -> Iterator[Any]:
    """A spinner with ``text`` on stderr while a slow step runs (importing torch, tracing), only
    when stderr is a terminal: piped or captured output, and stdout's JSON, stay clean. Yields
    a function that changes the text (a no-op off a terminal)."""
    console = stderr_console()
    if not console.is_terminal:
        yield lambda _text: None
        return
    with console.status(text) as status:
        yield lambda new: status.update(new)
