"""The generic path's one-layer shortcut: trace a copy of the model with 5 decoder layers,
repeat its middle layer to the real depth, and check the repetition against a 6-layer trace.

Why 5: the first layer (where models build masks, ALiBi or position tensors) and the last (whose
output feeds the head) may differ from the others, and a layer's bytes at a moment depend on
where it stands relative to the running layer: the one just run or just about to run can hold
a transient (the gradient a layer's backward hands to the one below is credited to the layer
that made it). Layers 1-3 show the running middle layer with a middle neighbour on each side.
A step's timeline (``Breakdown`` moments, one per labelled stretch, each listing the bytes per
module group and category at its peak) is rebuilt for ``L`` layers from the 5-layer one:

- the stretches of layer t (``forward: <stack>.t`` up to the next layer's first stretch; the
  same in the backward, which runs downwards) are templates: layer 1's for new layer 1, layer
  3's for new layer L-2, layer 2's repeated for layers 2 .. L-3;
- in a repetition for new layer j, new layer l takes the template layer ``t + (l - j)``'s bytes
  at that moment when it is one of 1-3, else the bytes of a middle layer two or more away in
  the same phase and direction (done below / pending above in the forward, the reverse in the
  backward), read from the template stretch where such a layer exists;
- every other moment gives new layer 1 the bytes of layer 1, new layer L-2 those of layer 3 and
  the layers between those of layer 2; layer 4 becomes layer L-1; groups outside the stack are
  unchanged.

The check: the same rebuild from 5 to 6 layers must equal a real 6-layer trace byte for byte,
moment for moment (items compared as a multiset). Where it does not, or where the config lists
something per layer (``layer_types``), or is an encoder-decoder, the whole model is traced and
the Breakdown says so. Needs torch (it calls ``memplan.trace``).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..breakdown import Breakdown, Item, Moment, Phase, Step
from ..hardware import Device
from ..recipe import Recipe

__all__ = ["SMALL", "layer_key", "repeat_layers", "traced_by_layer"]

SMALL = 5
"""Layers of the traced copy: first, three middle layers (one running and its two
neighbours), last."""


def layer_key(config: dict[str, Any]) -> tuple[str, int] | None:
    """The config.json key holding the layer count and its value (transformers' own config
    class names it: BLOOM's ``n_layer``, OPT's ``num_hidden_layers``); None where the shortcut
    does not apply (encoder-decoder, per-layer lists, no layer count)."""
    from transformers import AutoConfig

    data = {k: v for k, v in config.items() if k not in ("transformers_version", "_name_or_path")}
    model_type = data.pop("model_type", None)
    if not model_type or data.get("is_encoder_decoder"):
        return None
    cfg = AutoConfig.for_model(model_type, **data)
    if getattr(cfg, "is_encoder_decoder", False):
        return None
    key = getattr(cfg, "attribute_map", {}).get("num_hidden_layers", "num_hidden_layers")
    n = config.get(key)
    if not isinstance(n, int):
        return None
    if any(isinstance(v, list) and len(v) == n for v in config.values()):
        return None  # layer_types and the like: the layers are not all the same
    return key, n


def _layer(name: str, stack: str) -> int | None:
    """Index of the stack block ``name`` is (``<stack>.<i>``), else None."""
    m = re.fullmatch(re.escape(stack) + r"\.(\d+)", name)
    return int(m.group(1)) if m else None


def _label_layer(label: str, stack: str) -> int | None:
    m = re.match(r"(?:forward|backward): " + re.escape(stack) + r"\.(\d+)(?: \(recompute\))?$",
                 label)
    return int(m.group(1)) if m else None


def _state(m: Moment, name: str) -> tuple[Item, ...]:
    return tuple(i for i in m.items if i.name == name)


def _first(ms: Sequence[Moment], phase: Phase, layer: int, stack: str) -> int | None:
    return next((k for k, m in enumerate(ms) if m.phase == phase
                 and _label_layer(m.label, stack) == layer), None)


def _step(ms: Sequence[Moment], stack: str, n: int) -> list[Moment] | None:
    """One step's moments of the ``SMALL``-layer trace rebuilt for ``n`` layers (None: the
    timeline lacks a middle layer's stretches)."""
    f = [_first(ms, Phase.FORWARD, i, stack) for i in range(SMALL)]
    b = [_first(ms, Phase.BACKWARD, i, stack) for i in range(SMALL)]
    if None in f or None in b or f != sorted(f) or b != sorted(b, reverse=True):
        return None
    last = SMALL - 1

    def at(layer: int, m: Moment) -> tuple[Item, ...]:
        return _state(m, f"{stack}.{layer}")

    # A middle layer two or more away from the running one, where no template layer is:
    # forward: below done (layer 1 while layer 3 runs), above pending (layer 3 while 1 runs);
    # backward: above done (layer 3 while 1 runs), below pending (layer 1 while 3 runs).
    far = {(Phase.FORWARD, -1): at(1, ms[f[3]]), (Phase.FORWARD, 1): at(3, ms[f[1]]),
           (Phase.BACKWARD, 1): at(3, ms[b[1]]), (Phase.BACKWARD, -1): at(1, ms[b[3]])}

    def build(m: Moment, states: dict[int, tuple[Item, ...]], j: int | None) -> Moment:
        middle = [replace(i, name=f"{stack}.{layer}")
                  for layer in range(1, n - 1) for i in states[layer]]
        mids = {f"{stack}.{i}" for i in range(1, last)}
        items: list[Item] = []
        for i in m.items:  # the middle layers where the template's were (else before the last)
            if (i.name in mids or i.name == f"{stack}.{last}") and middle:
                items += middle
                middle = []
            if i.name not in mids:
                items.append(i if i.name != f"{stack}.{last}"
                             else replace(i, name=f"{stack}.{n - 1}"))
        items += middle
        label = m.label
        src = _label_layer(label, stack)
        if src is not None and src > 0:
            new = j if j is not None else (n - 1 if src == last else None)
            if new is not None:
                label = label.replace(f"{stack}.{src}", f"{stack}.{new}", 1)
        return replace(m, label=label, items=tuple(items))

    def block(phase: Phase, t: int) -> tuple[int, int]:
        starts = f if phase == Phase.FORWARD else b
        nxt = t + 1 if phase == Phase.FORWARD else t - 1
        return starts[t], starts[nxt]  # type: ignore[return-value]

    spans = {}  # first moment -> (end, phase, template layer, new layers running it)
    for phase in (Phase.FORWARD, Phase.BACKWARD):
        for t, js in ((1, [1]), (2, list(range(2, n - 2))), (3, [n - 2])):
            if phase == Phase.BACKWARD:
                js = js[::-1]
            start, end = block(phase, t)
            spans[start] = (end, phase, t, js)
    out: list[Moment] = []
    k = 0
    while k < len(ms):
        if k in spans and (ms[k].phase == Phase.BACKWARD) == (spans[k][1] == Phase.BACKWARD):
            end, phase, t, js = spans[k]
            for j in js:
                for m in ms[k:end]:
                    states = {}
                    for layer in range(1, n - 1):
                        src = t + layer - j
                        if 1 <= src < last:
                            states[layer] = at(src, m)
                        elif t != 2:  # the template's own far layer (clamped)
                            states[layer] = at(min(max(src, 1), last - 1), m)
                        else:
                            states[layer] = far[(phase, 1 if src >= last else -1)]
                    out.append(build(m, states, j))
            k = end
            continue
        m = ms[k]
        states = {layer: at(1 if layer == 1 else last - 1 if layer == n - 2 else 2, m)
                  for layer in range(1, n - 1)}
        out.append(build(m, states, None))
        k += 1
    return out


def repeat_layers(b: Breakdown, stack: str, n: int) -> Breakdown | None:
    """``b`` (a trace of the ``SMALL``-layer copy) with its middle layer repeated to ``n``
    layers; None where its timeline has no stretch of the middle layer."""
    rank = b.ranks[0]
    moments: list[Moment] = []
    for step in (Step.FIRST, Step.STEADY):
        ms = [m for m in rank.moments if m.step == step]
        if not ms:
            continue
        got = _step(ms, stack, n)
        if got is None:
            return None
        moments += got
    return replace(b, ranks=(replace(rank, moments=tuple(moments)),))


def _trace_with(config: dict[str, Any], key: str, n: int, recipe: Recipe,
                device: Device) -> Breakdown:
    from ..trace import trace

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps({**config, key: n}))
        return trace(str(path), recipe, device)


def _stack(b: Breakdown) -> str | None:
    names = {i.name for m in b.ranks[0].moments for i in m.items}
    for name in sorted(names):
        m = re.fullmatch(r"(.+)\.1", name)
        if m and f"{m.group(1)}.0" in names and f"{m.group(1)}.2" in names:
            return m.group(1)
    return None


def _canonical(b: Breakdown) -> list[tuple[Any, ...]]:
    """The moments as comparable data (items as a sorted multiset: their order is the order
    in which the tracker first met each group, which carries no bytes)."""
    return [(m.step, m.phase, m.label, sorted((i.name, str(i.category), i.bytes, str(i.pool))
                                                  for i in m.items)) for m in b.ranks[0].moments]


def traced_by_layer(model_ref: str, config: dict[str, Any], recipe: Recipe,
                    device: Device) -> tuple[Breakdown | None, str]:
    """The one-layer shortcut for ``model_ref`` (``config``: its config.json), and a note on
    what was done. None (with the reason) where the shortcut does not apply or its check
    fails: the caller then traces the whole model."""
    found = layer_key(config)
    if found is None:
        return None, "one-layer shortcut not applicable (encoder-decoder or per-layer config)"
    key, n = found
    if n <= SMALL + 1:
        return None, f"{n} layers: traced whole"
    small = _trace_with(config, key, SMALL, recipe, device)
    stack = _stack(small)
    check = _trace_with(config, key, SMALL + 1, recipe, device)
    rebuilt = repeat_layers(small, stack, SMALL + 1) if stack else None
    if rebuilt is None or _canonical(rebuilt) != _canonical(check):
        return None, ("one-layer shortcut failed its check (3 layers repeated to 4 differ from "
                      "a 4-layer trace): traced whole")
    full = repeat_layers(small, stack, n)
    assert full is not None
    a, c = small.model, check.model  # parameters are affine in the layer count
    info = replace(a, id=model_ref, params=a.params + (n - SMALL) * (c.params - a.params),
                   trainable_params=a.trainable_params + (n - SMALL) * (
                       c.trainable_params - a.trainable_params), layers=n,
                   source=f"catalog or file: {model_ref}")
    return replace(full, model=info), (
        f"layer graph from a trace of {SMALL} layers (the middle one repeated to {n}; checked "
        f"byte for byte against a {SMALL + 1}-layer trace)")
