"""Small constructors shared by the architecture builders: a linear layer, a norm, an embedding."""

from __future__ import annotations

from typing import Any

from ..errors import ModelConfigError
from .spec import Component, Split, Tensor

_MISSING = object()


class Config:
    """Read access to a config.json dict that names the file and key when something is missing."""

    def __init__(self, data: dict[str, Any], where: str):
        self.data = data
        self.where = where

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key, default)
        return default if value is None else value

    def req(self, *keys: str) -> Any:
        """The first of ``keys`` present (aliases across families), or a ModelConfigError."""
        for key in keys:
            if self.data.get(key) is not None:
                return self.data[key]
        raise ModelConfigError(
            f"{self.where}: expected key {' or '.join(repr(k) for k in keys)} "
            f"for model_type {self.data.get('model_type')!r}; the config does not have it. "
            "Supply the model's complete config.json."
        )

    def int(self, *keys: str, default: Any = _MISSING) -> int:
        if default is not _MISSING and not any(self.data.get(k) is not None for k in keys):
            return int(default)
        value = self.req(*keys)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ModelConfigError(
                f"{self.where}: {keys[0]!r} must be an integer, got {value!r}."
            )
        return value

    def sub(self, key: str) -> Config:
        return Config(self.req(key), f"{self.where} [{key}]")


def linear(
    name: str,
    out_features: int,
    in_features: int,
    *,
    component: Component,
    split: Split,
    bias: bool = False,
    targets: tuple[str, ...] = (),
    experts: int = 1,
) -> list[Tensor]:
    """``nn.Linear(in, out)``: weight (out, in) and optional bias (out)."""
    out = [
        Tensor(
            name=f"{name}.weight",
            shape=(out_features, in_features),
            component=component,
            split=split,
            experts=experts,
            targets=targets,
            is_linear=True,
        )
    ]
    if bias:
        out.append(
            Tensor(
                name=f"{name}.bias",
                shape=(out_features,),
                component=component,
                split=split,
                experts=experts,
                is_bias=True,
            )
        )
    return out


def norm(name: str, size: int, *, bias: bool = False) -> list[Tensor]:
    """RMSNorm (weight) or LayerNorm (weight + bias); replicated under TP."""
    out = [Tensor(name=f"{name}.weight", shape=(size,), component=Component.NORM)]
    if bias:
        out.append(Tensor(name=f"{name}.bias", shape=(size,), component=Component.NORM, is_bias=True))
    return out


def embedding(name: str, rows: int, dim: int, *, split: Split = Split.VOCAB) -> list[Tensor]:
    return [Tensor(name=f"{name}.weight", shape=(rows, dim), component=Component.EMBEDDING, split=split)]
