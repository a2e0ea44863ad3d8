"""MODEL given as ``package.module:function``: import it and call it (``trace``, ``measure``)."""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import ModelConfigError, did_you_mean

__all__ = ["factory_model"]


def factory_model(ref: str) -> Any:
    """The model a ``package.module:function`` MODEL builds; every failure is a
    ``ModelConfigError`` naming the fix (the user's code, never a traceback)."""
    from ..model.module import check_factory_ref

    check_factory_ref(ref)
    mod_name, _, fn_name = ref.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ModelConfigError(f"{ref}: cannot import module {mod_name!r} ({e}). Fix: put it "
                               "on PYTHONPATH.") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        names = [n for n in dir(mod) if not n.startswith("_")]
        raise ModelConfigError(f"{ref}: module {mod_name!r} has no function {fn_name!r}."
                               f"{did_you_mean(fn_name, names)}")
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the user's factory: report it, never a traceback
        raise ModelConfigError(f"{ref}: calling {fn_name}() failed with {type(e).__name__}: "
                               f"{e}. Fix: MODEL's factory must take no arguments and return a "
                               "torch.nn.Module.") from None
