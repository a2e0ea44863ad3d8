"""``serving()``: the page in a background thread (port 0 picks a free port), stopped on exit.
For tests, notebooks and screenshot scripts: no child process is ever left behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["serving"]


@contextmanager
def serving(host: str = "127.0.0.1", port: int = 0, *, timeout_s: float = 20.0) -> Iterator[str]:
    """Run ``memplan serve``'s app with uvicorn in a thread; yields its base URL."""
    import uvicorn

    from . import create_app

    server = uvicorn.Server(uvicorn.Config(create_app(), host=host, port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="memplan-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("memplan serve did not start")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()
    try:
        yield f"http://{bound[0]}:{bound[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
