"""``memplan serve``: a local page to plan a training run (the ``web`` extra: Starlette,
uvicorn, Jinja2; htmx 2 is vendored under ``static/``). It imports only memplan's public
functions and never torch."""

from __future__ import annotations

from typing import Any

from ..errors import MemplanError

__all__ = ["create_app", "serve"]


def _need_web() -> None:
    import importlib.util

    missing = [m for m in ("starlette", "uvicorn", "jinja2", "multipart")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise MemplanError(f"`memplan serve` needs {', '.join(missing)}: "
                           "pip install 'memplan[web]'.")


def create_app() -> Any:
    """The ASGI app (see ``memplan.web.app``)."""
    _need_web()
    from .app import create_app as make

    return make()


def serve(*, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Run the page with uvicorn until interrupted (loopback only unless ``host`` says so)."""
    _need_web()
    import uvicorn

    uvicorn.run(create_app(), host=host, port=port, log_level="warning")
