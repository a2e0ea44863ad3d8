"""From a page state to a result: a thin adapter over ``memplan.api.estimate_from_names``.

Models come only from the catalog or from a config.json in the request: a name that is not in
the catalog is an error here (the CLI would also try a path, a ``module:function`` factory and
the Hub, none of which a page served to a browser should do).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock
from typing import Any

from ..errors import ConfigError, MemplanError, UnknownModel, did_you_mean
from .state import PageState, config_from_text, parse_pin

__all__ = ["Outcome", "evaluate", "evaluate_all", "choices"]

_CACHE_SIZE = 64
_cache: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
_lock = Lock()


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """One column of the page: a recipe and its result, or the message saying why not."""

    state: PageState
    """What was asked."""
    result: dict[str, Any] | None = None
    """``Breakdown.to_dict()`` of the estimate; None on error."""
    error: str = ""
    """The ``MemplanError`` message (the same text as the CLI's ``Error:`` line)."""


def _model(state: PageState) -> Any:
    from ..model.catalog import catalog, find
    from ..model.hf import from_hf_config

    if state.config_json.strip():
        data = config_from_text(state.config_json)
        name = str(data.get("_name_or_path") or "pasted config.json")[:200]
        try:
            return from_hf_config(data, name, where="config.json", source="config.json given "
                                  "on the page")
        except MemplanError:
            raise
        except Exception as e:  # noqa: BLE001 - a malformed config is input, not a bug here
            raise ConfigError([f"config.json cannot be described: {type(e).__name__}: {e}. "
                               "Check its architecture keys (hidden_size, num_hidden_layers, "
                               "num_attention_heads, vocab_size...)."]) from None
    entry = find(state.model)
    if entry is None:
        ids = list(catalog()) + [a for e in catalog().values() for a in e.aliases]
        raise UnknownModel(f"model {state.model!r} is not in the catalog.{did_you_mean(state.model, ids)}"
                           " Fix: pick a catalog model (the list offers them) or paste or "
                           "upload its config.json.")
    return entry.id


def _estimate(state: PageState, search: bool) -> dict[str, Any]:
    from ..api import Machine, estimate_from_names, load_job

    model = _model(state)
    recipe, setup = load_job(None, state.overrides)
    machine = Machine(gpu=state.gpu, node=state.node or None, host_ram=state.host_ram or None,
                      nvme=state.nvme or None)
    try:
        b = estimate_from_names(model, recipe, machine, setup, search_micro_batch=search)
    except MemplanError:
        raise
    except (ArithmeticError, ValueError, KeyError, TypeError) as e:
        if not state.config_json:
            raise
        raise ConfigError([f"config.json: the estimate failed on this configuration "
                           f"({type(e).__name__}: {e}); check its sizes."]) from None
    return b.to_dict()


def evaluate(state: PageState, *, search: bool = True) -> Outcome:
    """The estimate of ``state`` (cached by its query and config), or its error message.

    ``search=False`` skips the largest-micro-batch search (about 85% of a 70B estimate's
    time): the live update shows everything else at once and fetches that number in a second
    request (``max_micro_batch``)."""
    key = (state.query(with_pins=False), state.config_json)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and (not search or hit["gpu"]["max_micro_batch"] is not None):
            _cache.move_to_end(key)
            return Outcome(state=state, result=hit)
    try:
        result = _estimate(state, search)
    except MemplanError as e:
        return Outcome(state=state, error=str(e))
    with _lock:
        _cache[key] = result
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return Outcome(state=state, result=result)


def evaluate_all(state: PageState) -> list[Outcome]:
    """The current recipe, then each pinned one (a pin that no longer parses shows its
    error in its column)."""
    out = [evaluate(state, search=bool(state.config_json))]
    for q in state.pins:
        try:
            pinned = parse_pin(q)
        except MemplanError as e:
            out.append(Outcome(state=PageState(), error=str(e)))
            continue
        out.append(evaluate(pinned))
    return out


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def choices() -> dict[str, list[str]]:
    """Names for the autocomplete lists: catalog models (ids and aliases), GPUs, nodes."""
    from ..hardware import devices
    from ..hardware.nodes import nodes
    from ..model.catalog import catalog

    return {"models": sorted(list(catalog()) + [a for e in catalog().values()
                                                 for a in e.aliases]),
            "gpus": sorted(devices()), "nodes": sorted(nodes())}
